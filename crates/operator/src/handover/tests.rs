use k8s_openapi::api::core::v1::Node;
use lvms_api::{LVMCluster, topolvm::LogicalVolume};
use serde_json::{Value, json};

use super::*;
use crate::eviction::OUT_OF_SERVICE_TAINT;

const SAN: &str = "san";

fn cluster() -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": "lvms"},
        "spec": {"storage": {"deviceClasses": [
            {"name": "local", "default": true},
            {"name": SAN, "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-1"]}},
        ]}}
    }))
    .unwrap()
}

/// A node; `joined`: labelled as a node of the shared class; `ready`: its Ready condition.
fn node(name: &str, joined: bool, ready: &str, taints: Value) -> Node {
    let labels = if joined {
        json!({ lvms_api::shared_topology_key(SAN): "true" })
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]}
    }))
    .unwrap()
}

fn up(name: &str) -> Node {
    node(name, true, "True", json!([]))
}

fn out_of_service(name: &str, ready: &str) -> Node {
    node(
        name,
        true,
        ready,
        json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]),
    )
}

fn volume(name: &str, class: &str, node: &str) -> LogicalVolume {
    serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": node, "size": "1Gi", "deviceClass": class}
    }))
    .unwrap()
}

fn plan_for(volumes: &[LogicalVolume], nodes: &[Node]) -> Plan {
    let (shared, default) = shared_classes(&[cluster()]);
    plan(
        volumes,
        &shared,
        default.as_deref(),
        nodes,
        &BTreeSet::new(),
    )
}

fn moves(p: &Plan) -> Vec<(&str, &str, &str)> {
    p.moves
        .iter()
        .map(|m| (m.volume.as_str(), m.from.as_str(), m.to.as_str()))
        .collect()
}

#[test]
fn shared_classes_and_the_default_come_from_the_clusters() {
    let (shared, default) = shared_classes(&[cluster()]);
    assert_eq!(shared.into_iter().collect::<Vec<_>>(), [SAN]);
    assert_eq!(default.as_deref(), Some("local"));
}

#[test]
fn a_deleted_nodes_shared_volumes_move_to_a_ready_node_of_the_class() {
    let p = plan_for(&[volume("csi-a", SAN, "gone")], &[up("n2")]);
    assert_eq!(moves(&p), [("csi-a", "gone", "n2")]);
    assert_eq!(p.moves[0].why, Why::State(NodeState::Gone));
    assert_eq!(p.moves[0].class, SAN);
    assert!(p.stuck.is_empty());
}

#[test]
fn a_not_ready_node_tainted_out_of_service_gives_up_its_shared_volumes() {
    let p = plan_for(
        &[volume("csi-a", SAN, "n1")],
        &[out_of_service("n1", "Unknown"), up("n2")],
    );
    assert_eq!(moves(&p), [("csi-a", "n1", "n2")]);
    assert_eq!(p.moves[0].why, Why::State(NodeState::OutOfService));
}

#[test]
fn a_node_dead_in_the_class_gives_up_its_volumes_of_that_class_only() {
    let (shared, default) = shared_classes(&[cluster()]);
    let n1 = node("n1", true, "Unknown", json!([]));
    let volumes = [volume("csi-a", SAN, "n1"), volume("csi-b", "local", "n1")];
    let dead: BTreeSet<(String, String)> = [("n1".to_owned(), SAN.to_owned())].into();
    let p = plan(
        &volumes,
        &shared,
        default.as_deref(),
        &[n1.clone(), up("n2")],
        &dead,
    );
    assert_eq!(moves(&p), [("csi-a", "n1", "n2")]);
    assert_eq!(p.moves[0].why, Why::LeaseDead);
    // Dead in another class: nothing of this one moves.
    let elsewhere: BTreeSet<(String, String)> = [("n1".to_owned(), "other".to_owned())].into();
    let p = plan(
        &volumes,
        &shared,
        default.as_deref(),
        &[n1, up("n2")],
        &elsewhere,
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn a_node_that_may_still_serve_keeps_its_volumes() {
    for (what, n1) in [
        (
            "not Ready, no taint",
            node("n1", true, "Unknown", json!([])),
        ),
        ("Ready, tainted", out_of_service("n1", "True")),
        (
            "cordoned",
            node(
                "n1",
                true,
                "True",
                json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
            ),
        ),
    ] {
        let mut n1 = n1;
        if what == "cordoned" {
            n1.spec.as_mut().unwrap().unschedulable = Some(true);
        }
        let p = plan_for(&[volume("csi-a", SAN, "n1")], &[n1, up("n2")]);
        assert_eq!(p, Plan::default(), "{what}");
    }
}

#[test]
fn local_volumes_never_move() {
    let p = plan_for(
        &[
            volume("csi-a", "local", "gone"),
            volume("csi-b", "", "gone"),
        ],
        &[up("n2")],
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn an_empty_class_is_the_default_one_which_may_be_shared() {
    let shared: BTreeSet<String> = [SAN.to_owned()].into();
    let p = plan(
        &[volume("csi-a", "", "gone")],
        &shared,
        Some(SAN),
        &[up("n2")],
        &BTreeSet::new(),
    );
    assert_eq!(moves(&p), [("csi-a", "gone", "n2")]);
    let p = plan(
        &[volume("csi-a", "", "gone")],
        &shared,
        None,
        &[up("n2")],
        &BTreeSet::new(),
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn the_new_node_joined_the_class_is_ready_and_in_service() {
    let candidates = [
        node("a-not-joined", false, "True", json!([])),
        node("b-not-ready", true, "False", json!([])),
        out_of_service("c-out", "False"),
        out_of_service("c-out-but-ready", "True"),
    ];
    let p = plan_for(&[volume("csi-a", SAN, "gone")], &candidates);
    assert!(p.moves.is_empty());
    assert_eq!(
        p.stuck,
        [Stuck {
            volume: "csi-a".into(),
            class: SAN.into(),
            from: "gone".into()
        }]
    );
    let mut with_one = candidates.to_vec();
    with_one.push(up("d-up"));
    let p = plan_for(&[volume("csi-a", SAN, "gone")], &with_one);
    assert_eq!(moves(&p), [("csi-a", "gone", "d-up")]);
}

#[test]
fn a_node_being_deleted_takes_nothing() {
    let mut leaving = up("n2");
    leaving.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    let p = plan_for(&[volume("csi-a", SAN, "gone")], &[leaving]);
    assert!(p.moves.is_empty() && p.stuck.len() == 1, "{p:?}");
}

#[test]
fn moves_spread_over_the_least_loaded_nodes() {
    let volumes = [
        volume("csi-a", SAN, "gone"),
        volume("csi-b", SAN, "gone"),
        volume("csi-c", SAN, "gone"),
        volume("csi-held", SAN, "n2"),
    ];
    let p = plan_for(&volumes, &[up("n2"), up("n3")]);
    assert_eq!(
        moves(&p),
        [
            ("csi-a", "gone", "n3"),
            ("csi-b", "gone", "n2"),
            ("csi-c", "gone", "n3"),
        ]
    );
}
