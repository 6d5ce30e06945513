//! The shared-class alert rules in `deploy/monitoring/prometheus-rules-shared.yaml` parse as PromQL,
//! use only metrics the operator exports (read from its `/metrics` text), and say how bad they are
//! and what to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus};
use lvms_operator::metrics::{Metrics, shared_series};
use promql_parser::parser::{self, Expr};
use serde_json::{Value, json};

fn rules() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/monitoring/prometheus-rules-shared.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every metric family the operator exports once a shared class is reported, from its text.
fn exported() -> BTreeSet<String> {
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": "lvms"},
        "spec": {"storage": {"deviceClasses": [{"name": "san", "deviceAccessPolicy": "shared",
            "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]}}]}}
    }))
    .unwrap();
    let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": "n1", "namespace": "lvms"},
        "spec": {"nodeStatus": [{"name": "san", "shared": {"lockspace": "Joined",
            "fencing": {"watchdog": "Armed", "killHook": true, "leaseRenewalFailures": 1}}}]}
    }))
    .unwrap();
    let metrics = Metrics::new();
    metrics.shared_status("lvms", "c", &shared_series(&cluster, &[status]));
    let mut names = BTreeSet::new();
    for line in metrics.encode().lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            names.insert(name.to_owned());
            if kind == "counter" {
                names.insert(format!("{name}_total"));
            }
        }
    }
    names
}

/// The metric names an expression selects.
fn selected(expr: &Expr, out: &mut BTreeSet<String>) {
    match expr {
        Expr::VectorSelector(v) => out.extend(v.name.clone()),
        Expr::MatrixSelector(m) => out.extend(m.vs.name.clone()),
        Expr::Binary(b) => {
            selected(&b.lhs, out);
            selected(&b.rhs, out);
        }
        Expr::Paren(p) => selected(&p.expr, out),
        Expr::Unary(u) => selected(&u.expr, out),
        Expr::Aggregate(a) => selected(&a.expr, out),
        Expr::Subquery(s) => selected(&s.expr, out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| selected(a, out)),
        _ => {}
    }
}

#[test]
fn every_shared_alert_parses_uses_exported_metrics_and_says_what_to_do() {
    let exported = exported();
    let rules = rules();
    assert_eq!(rules["kind"], "PrometheusRule");
    let mut alerts = BTreeSet::new();
    for group in rules["spec"]["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().unwrap();
            let ast = parser::parse(expr).unwrap_or_else(|e| panic!("{name}: {e}\n{expr}"));
            let mut used = BTreeSet::new();
            selected(&ast, &mut used);
            assert!(!used.is_empty(), "{name} selects nothing");
            for metric in &used {
                assert!(
                    exported.contains(metric),
                    "{name} uses {metric}, which the operator does not export: {exported:?}"
                );
            }
            assert!(
                matches!(
                    rule["labels"]["severity"].as_str(),
                    Some("warning" | "critical")
                ),
                "{name}: severity"
            );
            assert!(rule["for"].as_str().is_some(), "{name}: for");
            for key in ["summary", "description"] {
                assert!(
                    rule["annotations"][key]
                        .as_str()
                        .is_some_and(|s| s.len() > 20),
                    "{name}: {key}"
                );
            }
            alerts.insert(name.to_owned());
        }
    }
    assert_eq!(
        alerts,
        BTreeSet::from(
            [
                "LVMSSharedFencingNotArmed",
                "LVMSSharedLeaseRenewalFailures",
                "LVMSSharedLockspaceLost"
            ]
            .map(str::to_owned)
        )
    );
    let lost = &rules["spec"]["groups"][0]["rules"][0];
    assert_eq!(lost["alert"], "LVMSSharedLockspaceLost");
    assert_eq!(lost["for"], "2m");
    assert_eq!(lost["labels"]["severity"], "critical");
    let description = lost["annotations"]["description"].as_str().unwrap();
    assert!(
        description.contains("sanlock client status") && description.contains("LUN"),
        "{description}"
    );
}
