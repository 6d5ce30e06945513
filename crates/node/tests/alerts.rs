//! The alert rules in `deploy/monitoring/prometheus-rules.yaml` parse as PromQL and use only metrics
//! the node agent and the CSI controller export (read from their `/metrics` text), and every alert
//! says how bad it is and what to do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use lvms_engine::backend::{PoolUsage, Usage};
use lvms_k8s::metrics::{GcMetrics, RaidNumbers, StorageMetrics};
use promql_parser::parser::{self, Expr};
use serde_json::Value;

fn rules() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/monitoring/prometheus-rules.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_norway::from_str(&text).unwrap()
}

/// Every metric family the two processes export, from their OpenMetrics text.
fn exported() -> BTreeSet<String> {
    let storage = StorageMetrics::default();
    let node = GcMetrics::with_storage("orphaned_volumes", Some(&storage));
    storage.record(
        "n",
        "thin",
        &Usage {
            vg_size: 1,
            vg_free: 1,
            pool: Some(PoolUsage {
                size: 1,
                data_percent: Some(1.0),
                metadata_percent: Some(1.0),
                overprovisioned_available: 1,
            }),
        },
    );
    storage.record_raid(
        "n",
        "raid-thin",
        Some(RaidNumbers {
            health: 1,
            degraded_members: 1,
            min_sync_percent: 100.0,
        }),
    );
    let controller = GcMetrics::new("unclaimed_logical_volumes");
    let mut names = BTreeSet::new();
    for text in [node.encode(), controller.encode()] {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                names.insert(name.to_owned());
                if kind == "counter" {
                    names.insert(format!("{name}_total"));
                }
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
fn every_alert_parses_uses_exported_metrics_and_says_what_to_do() {
    let exported = exported();
    for name in [
        "topolvm_volumegroup_size_bytes",
        "topolvm_volumegroup_available_bytes",
        "topolvm_thinpool_size_bytes",
        "topolvm_thinpool_data_percent",
        "topolvm_thinpool_metadata_percent",
        "topolvm_thinpool_overprovisioned_available",
        "lvms_orphaned_volumes",
        "lvms_unclaimed_logical_volumes",
        "lvms_raid_health",
        "lvms_raid_degraded_members",
        "lvms_raid_min_sync_percent",
    ] {
        assert!(exported.contains(name), "{name} not exported: {exported:?}");
    }
    let rules = rules();
    assert_eq!(rules["kind"], "PrometheusRule");
    let mut alerts = Vec::new();
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
                    "{name} uses {metric}, which nothing exports"
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
            alerts.push(name.to_owned());
        }
    }
    // LVMS's alert names, so existing routes keep matching.
    for lvms in [
        "VolumeGroupUsageAtThresholdNearFull",
        "VolumeGroupUsageAtThresholdCritical",
        "ThinPoolDataUsageAtThresholdNearFull",
        "ThinPoolDataUsageAtThresholdCritical",
        "ThinPoolMetaDataUsageAtThresholdNearFull",
        "ThinPoolMetaDataUsageAtThresholdCritical",
    ] {
        assert!(alerts.iter().any(|a| a == lvms), "{lvms} missing");
    }
}
