//! The benchmark on the [`stack`](crate::stack) (`cargo xtask e2e --bench`: a release build of
//! lvms, output shown). It prints, measured in one run on one VM:
//!
//! - PVC-to-Bound time on the real control plane ÷ CreateVolume time of `lvms standalone` on
//!   another disk of the same VM (target ≤ 1.3×);
//! - API requests per idle minute of each component, from the API server's audit log (target for
//!   the node agent: ≤ 1 write);
//! - the node agent's and the operator's resident memory with 500 volumes (targets 15 and 20 MiB).
//!
//! It asserts only that the measurements could be taken; the numbers are for people to read.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use lvms_api::topolvm::LogicalVolume;
use serde_json::{Value, json};

use crate::{
    scenarios::{CLASS, scenario},
    stack::{self, NODE, SLOW, Stack},
    support::{self, eventually},
};

/// Claims timed one after another on each side.
const ROUNDS: usize = 10;
/// Volumes for the memory figures.
const VOLUMES: usize = 500;
/// The standalone driver's disk and files in the VM.
const STANDALONE_DISK: &str = "/dev/disk/by-id/virtio-e2e1";
const STANDALONE_DIR: &str = "/run/lvms-bench";

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::test]
async fn bench_provisioning_idle_requests_and_memory_on_the_real_control_plane() {
    if std::env::var("LVMS_E2E_BENCH").is_err() {
        eprintln!("the benchmark runs with `cargo xtask e2e --bench`");
        return;
    }
    let Some(guard) =
        stack::stack("bench_provisioning_idle_requests_and_memory_on_the_real_control_plane").await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-bench").await;

    idle_requests().await;
    let bound = pvc_to_bound(&client, &ns.name).await;
    let (create, probe) = standalone_create_volume(stack).await;
    println!(
        "bench: PVC-to-Bound on the real control plane, median of {ROUNDS}: {bound:.2} s \
         (WaitForFirstConsumer: a Pod, the scheduler, external-provisioner, CreateVolume over a \
         LogicalVolume, the agent in the VM)"
    );
    println!(
        "bench: standalone CreateVolume in the same VM, median of {ROUNDS}: {create:.2} s, of \
         which {probe:.2} s is starting the `lvms csi` client (median Probe)"
    );
    println!(
        "bench: ratio PVC-to-Bound ÷ standalone CreateVolume: {:.2}× (client start subtracted: \
         {:.2}×; target ≤ 1.3×)",
        bound / create,
        bound / (create - probe).max(0.001)
    );
    memory_with_volumes(stack, &client).await;
    ns.delete().await;
}

/// One audit event, as the API server writes it (`Metadata` level, `ResponseComplete` stage).
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

/// Per (service account, user agent): requests, writes, and the writes by verb and resource.
type Counts = BTreeMap<(String, String), (u64, u64, BTreeMap<String, u64>)>;

/// The requests of one idle minute (the LVMCluster Ready, no claim changing), per component.
async fn idle_requests() {
    let log = std::path::PathBuf::from(
        std::env::var("LVMS_E2E_AUDIT_LOG").expect("LVMS_E2E_AUDIT_LOG (set by cargo xtask e2e)"),
    );
    // Let what the LVMCluster's creation started settle.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let start = std::fs::metadata(&log).unwrap().len();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let text = std::fs::read(&log).unwrap();
    let minute = String::from_utf8_lossy(&text[usize::try_from(start).unwrap()..]).into_owned();
    let mut counts = Counts::new();
    for (user, agent, verb, resource) in minute.lines().filter_map(audit_line) {
        if !user.starts_with("system:serviceaccount:lvms-system:") {
            continue;
        }
        let entry = counts
            .entry((
                user.trim_start_matches("system:serviceaccount:").to_owned(),
                agent,
            ))
            .or_default();
        entry.0 += 1;
        if matches!(verb.as_str(), "create" | "update" | "patch" | "delete") {
            entry.1 += 1;
            *entry.2.entry(format!("{verb} {resource}")).or_default() += 1;
        }
    }
    println!("bench: API requests in one idle minute (lvms-system's service accounts):");
    for ((user, agent), (all, writes, what)) in &counts {
        println!("bench:   {user} ({agent}): {all} requests, {writes} writes {what:?}");
    }
    let agent = counts
        .iter()
        .filter(|((user, _), _)| user.ends_with(":vg-manager"))
        .map(|(_, (all, writes, _))| (*all, *writes))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    println!(
        "bench: the node agent (vg-manager) per idle minute: {} requests, {} writes (target ≤ 1 write)",
        agent.0, agent.1
    );
}

/// PVC-to-Bound, one claim (and its Pod) after another; the median in seconds.
async fn pvc_to_bound(client: &Client, ns: &str) -> f64 {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let mut times = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("b{i:02}");
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "lvms-vg1",
                     "resources": {"requests": {"storage": "64Mi"}}}
        }))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]}
        }))
        .unwrap();
        let started = Instant::now();
        pvcs.create(&PostParams::default(), &pvc).await.unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        loop {
            let c = pvcs.get(&name).await.unwrap();
            if c.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                break;
            }
            assert!(started.elapsed() < SLOW, "the claim {name} was not Bound");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        times.push(started.elapsed().as_secs_f64());
    }
    println!("bench: PVC-to-Bound times (s): {times:.2?}");
    for i in 0..ROUNDS {
        let name = format!("b{i:02}");
        let _ = pods
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await;
        let _ = pvcs.delete(&name, &DeleteParams::default()).await;
    }
    median(times)
}

/// `lvms standalone` on the VM's second disk, thin like the LVMCluster's class; the medians of
/// CreateVolume and of Probe through `lvms csi`, in seconds.
async fn standalone_create_volume(stack: &Stack) -> (f64, f64) {
    let lvms = std::env::var("LVMS_E2E_LVMS").unwrap();
    let config = format!(
        "deviceClasses:\n  - name: bench\n    default: true\n    fstype: xfs\n    deviceSelector:\n      \
         paths: [{STANDALONE_DISK}]\n    thinPoolConfig:\n      name: pool\n      sizePercent: 90\n      \
         overprovisionRatio: 10\n      metadataSizeCalculationPolicy: Host\n"
    );
    let (code, out) = stack
        .vm
        .sh_with(
            &format!("mkdir -p {STANDALONE_DIR} && cat > {STANDALONE_DIR}/config.yaml"),
            &config,
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let sock = format!("{STANDALONE_DIR}/csi.sock");
    stack
        .vm
        .ok(&format!(
            "setsid {lvms} standalone --config {STANDALONE_DIR}/config.yaml --endpoint {sock} \
             --node-id bench > {STANDALONE_DIR}/standalone.log 2>&1 < /dev/null &"
        ))
        .await;
    stack
        .vm
        .ok(&format!(
            "i=0; until {lvms} csi --endpoint {sock} probe >/dev/null 2>&1; do i=$((i+1)); \
             [ $i -gt 300 ] && tail -n 30 {STANDALONE_DIR}/standalone.log && exit 1; sleep 1; done"
        ))
        .await;
    // Each call timed in the VM, in nanoseconds.
    let timed = |rpc: &str| {
        format!(
            "for i in $(seq 1 {ROUNDS}); do s=$(date +%s%N); {lvms} csi --endpoint {sock} {rpc} \
             >/dev/null || exit 1; e=$(date +%s%N); echo $((e - s)); done"
        )
    };
    let parse = |out: String| -> Vec<f64> {
        out.lines()
            .filter_map(|l| l.trim().parse::<f64>().ok())
            .map(|ns| ns / 1e9)
            .collect()
    };
    let creates = parse(
        stack
            .vm
            .ok(&timed("create-volume --name bench-$i --size 64Mi"))
            .await,
    );
    let probes = parse(stack.vm.ok(&timed("probe")).await);
    assert_eq!(creates.len(), ROUNDS, "{creates:?}");
    println!("bench: standalone CreateVolume times (s): {creates:.2?}");
    stack
        .vm
        .sh(&format!(
            "pkill -f '[ ]standalone --config {STANDALONE_DIR}'"
        ))
        .await;
    (median(creates), median(probes))
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status`, in MiB.
fn rss(status: &str) -> (f64, f64) {
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// 500 volumes (LogicalVolume objects the agent makes LVs for), then the resident memory of the
/// agent in the VM and of the operator and the CSI controller here.
async fn memory_with_volumes(stack: &Stack, client: &Client) {
    let agent_status = || async {
        stack
            .vm
            .ok("cat /proc/$(pgrep -f '[ ]node --metrics-port 8081' | head -n1)/status")
            .await
    };
    let (rss_now, hwm) = rss(&agent_status().await);
    println!("bench: node agent before the volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB");
    let objects = Api::<LogicalVolume>::all(client.clone());
    let sfx = support::suffix();
    let started = Instant::now();
    for chunk in (0..VOLUMES).collect::<Vec<_>>().chunks(25) {
        let creations = chunk.iter().map(|i| {
            let objects = objects.clone();
            let name = format!("bench-{sfx}-{i:03}");
            async move {
                let object: LogicalVolume = serde_json::from_value(json!({
                    "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                    "metadata": {"name": name},
                    "spec": {"name": name, "nodeName": NODE, "deviceClass": CLASS, "size": "16Mi"},
                }))
                .unwrap();
                objects
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap();
            }
        });
        futures::future::join_all(creations).await;
    }
    let made = eventually(
        "the agent makes every LV",
        Duration::from_secs(3600),
        || async {
            let list = objects
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let made = list
                .items
                .iter()
                .filter(|o| o.spec.name.starts_with(&format!("bench-{sfx}-")))
                .filter(|o| o.status.as_ref().is_some_and(|s| !s.volume_id.is_empty()))
                .count();
            if made == VOLUMES {
                Ok(made)
            } else {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Err(format!("{made} of {VOLUMES}"))
            }
        },
    )
    .await;
    let lvs = stack.vm.lvs(CLASS).await.len();
    println!(
        "bench: {made} LogicalVolumes made in {:.0} s; {lvs} LVs in {CLASS}",
        started.elapsed().as_secs_f64()
    );
    // A sweep of every periodic loop (capacity every 10 s, status) with all of them present.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (rss_now, hwm) = rss(&agent_status().await);
    println!(
        "bench: node agent with {VOLUMES} volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB (target 15 MiB)"
    );
    for (name, target) in [("operator", "20 MiB"), ("csi-controller", "no target")] {
        let pid = stack.pid(name).unwrap_or_else(|| panic!("{name} runs"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let (rss_now, hwm) = rss(&status);
        println!(
            "bench: {name} with {VOLUMES} volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB ({target})"
        );
    }
}
