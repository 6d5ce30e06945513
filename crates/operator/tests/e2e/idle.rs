//! An idle minute on the [`stack`](crate::stack): with the LVMCluster Ready and nothing changing,
//! lvms-rs's processes (the operator, the CSI controller, the node agent; told apart by their user
//! agents, `lvms-<role>/<version>`) write nothing to the API server but their leader Leases'
//! renewals, while the operator's periodic reconcile runs (issue 39). The API server's audit log
//! is the witness. [`window`] and [`print`] also serve the benchmark.

use std::{collections::BTreeMap, time::Duration};

use serde_json::Value;

use crate::{
    scenarios::scenario,
    stack::{self, Stack},
};

/// One audit event, as the API server writes it (`Metadata` level, `ResponseComplete` stage):
/// user, user agent (its product name), verb, resource.
fn audit_line(line: &str) -> Option<(String, String, String, String)> {
    let v: Value = serde_json::from_str(line).ok()?;
    if v["stage"] != "ResponseComplete" {
        return None;
    }
    let user = v["user"]["username"].as_str()?.to_owned();
    let agent = v["userAgent"]
        .as_str()
        .unwrap_or_default()
        .split(['/', ' '])
        .next()
        .unwrap_or_default()
        .to_owned();
    let verb = v["verb"].as_str()?.to_owned();
    let resource = v["objectRef"]["resource"]
        .as_str()
        .unwrap_or("-")
        .to_owned();
    Some((user, agent, verb, resource))
}

/// One component's requests in a window: all of them, and the writes by `verb resource`.
#[derive(Debug, Default)]
pub struct Requests {
    pub all: u64,
    pub writes: BTreeMap<String, u64>,
}

impl Requests {
    /// Writes other than leader-election Lease renewals.
    pub fn writes_but_leases(&self) -> BTreeMap<&str, u64> {
        self.writes
            .iter()
            .filter(|(what, _)| !what.ends_with(" leases"))
            .map(|(what, n)| (what.as_str(), *n))
            .collect()
    }
}

/// Per (user, user agent); a ServiceAccount's user is `system:serviceaccount:<ns>:<name>`.
pub type Window = BTreeMap<(String, String), Requests>;

/// The ServiceAccounts of lvms-system, by name.
const INSTALL_ACCOUNTS: &str = "system:serviceaccount:lvms-system:";

fn audit_log() -> std::path::PathBuf {
    std::path::PathBuf::from(
        std::env::var("LVMS_E2E_AUDIT_LOG").expect("LVMS_E2E_AUDIT_LOG (set by cargo xtask e2e)"),
    )
}

/// Every request the API server answers in the next `duration`, per user and user agent.
pub async fn window(duration: Duration) -> Window {
    let start = std::fs::metadata(audit_log()).unwrap().len();
    tokio::time::sleep(duration).await;
    count(start)
}

/// Every request in the audit log so far.
fn everything() -> Window {
    count(0)
}

/// The requests in the audit log from byte `start` on.
fn count(start: u64) -> Window {
    let text = std::fs::read(audit_log()).unwrap();
    let tail = String::from_utf8_lossy(&text[usize::try_from(start).unwrap()..]).into_owned();
    let mut counts = Window::new();
    for (user, agent, verb, resource) in tail.lines().filter_map(audit_line) {
        let entry = counts.entry((user, agent)).or_default();
        entry.all += 1;
        if matches!(verb.as_str(), "create" | "update" | "patch" | "delete") {
            *entry
                .writes
                .entry(format!("{verb} {resource}"))
                .or_default() += 1;
        }
    }
    counts
}

/// Only lvms-system's ServiceAccounts, by name.
pub fn installed(window: Window) -> Window {
    window
        .into_iter()
        .filter_map(|((user, agent), r)| {
            Some(((user.strip_prefix(INSTALL_ACCOUNTS)?.to_owned(), agent), r))
        })
        .collect()
}

/// Prints `window`, one line per component.
pub fn print(window: &Window, what: &str) {
    println!("{what}: API requests:");
    for ((account, agent), r) in window {
        let writes: u64 = r.writes.values().sum();
        println!(
            "{what}:   {account} ({agent}): {} requests, {writes} writes {:?}",
            r.all, r.writes
        );
    }
}

/// The LVMCluster reconciles the operator has counted (`/metrics`).
async fn reconciles(stack: &Stack) -> u64 {
    let out = tokio::process::Command::new("curl")
        .args([
            "-s",
            &format!("http://127.0.0.1:{}/metrics", stack.operator_metrics),
        ])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("lvms_operator_reconciles_total{controller=\"lvmcluster\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn stack_an_idle_minute_has_no_write_from_lvms_rs_but_its_lease_renewals() {
    let Some(guard) =
        stack::stack("stack_an_idle_minute_has_no_write_from_lvms_rs_but_its_lease_renewals").await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let (_client, ns) = scenario(stack, "lvms-e2e-idle").await;
    // Let what the scenario's start set going settle.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let before = reconciles(stack).await;
    // Longer than the operator's periodic reconcile (every 60 s).
    let idle = installed(window(Duration::from_secs(65)).await);
    let after = reconciles(stack).await;
    print(&idle, "idle (lvms-system's ServiceAccounts)");
    assert!(
        after > before,
        "the operator reconciled in the window ({before} then {after} reconciles), so the \
         window shows what a reconcile over unchanged objects writes"
    );
    let ours: Vec<_> = idle
        .iter()
        .filter(|((_, agent), _)| agent.starts_with("lvms-"))
        .collect();
    // The operator and the CSI controller renew Leases, so they show in any minute; the node agent
    // may make none at all (its watches end only when the API server closes them), so its name is
    // looked for since the audit log began.
    for role in ["lvms-operator", "lvms-csi-controller"] {
        assert!(
            ours.iter().any(|((_, agent), _)| agent == role),
            "no request from {role} in a minute: is its user agent set? ({:?})",
            idle.keys().collect::<Vec<_>>()
        );
    }
    let all = installed(everything());
    assert!(
        all.keys()
            .any(|(account, agent)| account == "vg-manager" && agent == "lvms-node"),
        "the node agent's requests carry no user agent lvms-node: {:?}",
        all.keys().collect::<Vec<_>>()
    );
    let writes: Vec<_> = ours
        .iter()
        .map(|(who, r)| (who, r.writes_but_leases()))
        .filter(|(_, w)| !w.is_empty())
        .collect();
    assert!(
        writes.is_empty(),
        "lvms-rs wrote in an idle minute: {writes:?}"
    );
    ns.delete().await;
}
