use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use serde_json::{Value, json};

use super::*;

const SAN: &str = "san";
const DRIVER: &str = "topolvm.io";

fn cluster(watchdog: &str) -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": "lvms"},
        "spec": {"storage": {"deviceClasses": [
            {"name": "local", "default": true},
            {"name": SAN, "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-1"]},
             "sharedConfig": {"watchdog": watchdog}},
        ]}}
    }))
    .unwrap()
}

fn node(name: &str, ready: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": ready}]}
    }))
    .unwrap()
}

/// Node `name`'s status of the shared class: its host id, and the ids its sanlock sees live and
/// dead.
fn status(name: &str, host_id: i32, live: &[i32], dead: &[i32]) -> LVMVolumeGroupNodeStatus {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": name, "namespace": "lvms"},
        "spec": {"nodeStatus": [
            {"name": "local", "status": "Ready"},
            {"name": SAN, "status": "Ready",
             "shared": {"lockspace": "Joined", "hostId": host_id,
                        "liveHostIds": live, "deadHostIds": dead}},
        ]}
    }))
    .unwrap()
}

/// Node `name`'s status, fenced from the shared class by the hook (its lockspace gone).
fn fenced_status(name: &str, host_id: i32) -> LVMVolumeGroupNodeStatus {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": name, "namespace": "lvms"},
        "spec": {"nodeStatus": [
            {"name": SAN, "status": "Failed",
             "shared": {"lockspace": "NotJoined", "hostId": host_id,
                        "fencing": {"watchdog": "Armed", "killHook": true, "fenced": true}}},
        ]}
    }))
    .unwrap()
}

fn labelled(mut node: Node, value: &str) -> Node {
    // (kubelet's label from NodeGetInfo)
    node.metadata
        .labels
        .get_or_insert_default()
        .insert(lvms_api::shared_topology_key(SAN), value.into());
    node
}

/// n1 (host id 1) dead in the shared class, as n2 sees it, fenced.
fn n1_dead(cause: Cause) -> Death {
    Death {
        node: "n1".into(),
        class: SAN.into(),
        host_id: 1,
        seen_by: "n2".into(),
        fenced: true,
        cause,
    }
}

fn deaths(nodes: &[Node], statuses: &[LVMVolumeGroupNodeStatus], watchdog: &str) -> Vec<Death> {
    dead_nodes(nodes, statuses, &shared_policies(&[cluster(watchdog)]))
}

#[test]
fn a_not_ready_node_whose_lease_another_node_counts_dead_is_dead_and_fenced() {
    let nodes = [node("n1", "Unknown"), node("n2", "True")];
    let statuses = [status("n1", 1, &[1, 2], &[]), status("n2", 2, &[2], &[1])];
    assert_eq!(
        deaths(&nodes, &statuses, "Required"),
        [n1_dead(Cause::NotReady)]
    );
    // Without fencing it is still found, and only reported.
    let d = deaths(&nodes, &statuses, "Disabled");
    assert_eq!(d.len(), 1);
    assert!(!d[0].fenced);
}

#[test]
fn no_death_while_the_node_is_ready_or_its_lease_is_renewed_or_only_silent() {
    // Ready: whatever sanlock says, its kubelet runs.
    let statuses = [status("n1", 1, &[], &[]), status("n2", 2, &[2], &[1])];
    assert!(
        deaths(
            &[node("n1", "True"), node("n2", "True")],
            &statuses,
            "Required"
        )
        .is_empty()
    );
    // Not Ready, but its lease is renewed (a kubelet or network problem, not a dead host).
    let renewed = [status("n1", 1, &[1, 2], &[]), status("n2", 2, &[1, 2], &[])];
    let nodes = [node("n1", "False"), node("n2", "True")];
    assert!(deaths(&nodes, &renewed, "Required").is_empty());
    // One node counts it dead, another Ready one still sees it renewing: not dead.
    let split = [
        status("n1", 1, &[], &[]),
        status("n2", 2, &[2], &[1]),
        status("n3", 3, &[1, 3], &[]),
    ];
    let three = [
        node("n1", "Unknown"),
        node("n2", "True"),
        node("n3", "True"),
    ];
    assert!(deaths(&three, &split, "Required").is_empty());
}

#[test]
fn a_witness_must_be_ready_and_another_node() {
    // The only node that counts n1 dead is itself not Ready: its status may be stale.
    let statuses = [status("n1", 1, &[], &[]), status("n2", 2, &[2], &[1])];
    let nodes = [node("n1", "Unknown"), node("n2", "Unknown")];
    assert!(deaths(&nodes, &statuses, "Required").is_empty());
    // A node's own status never testifies about itself.
    let own = [status("n1", 1, &[], &[1])];
    assert!(deaths(&[node("n1", "Unknown")], &own, "Required").is_empty());
}

fn claim(ns: &str, name: &str, pv: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"volumeName": pv}
    }))
    .unwrap()
}

fn pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {"csi": {"driver": driver, "volumeHandle": handle}}
    }))
    .unwrap()
}

fn lv(name: &str, class: &str) -> LogicalVolume {
    serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": "n1", "size": "1Gi", "deviceClass": class}
    }))
    .unwrap()
}

fn pod(name: &str, volumes: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "app"},
        "spec": {"nodeName": "n1", "containers": [{"name": "c"}], "volumes": volumes}
    }))
    .unwrap()
}

#[test]
fn a_pod_is_released_only_when_every_persistent_volume_is_a_dead_classs_volume() {
    let claims = [
        claim("app", "data", "pv-san"),
        claim("app", "logs", "pv-san2"),
        claim("app", "local", "pv-local"),
        claim("app", "nfs", "pv-nfs"),
        claim("app", "web-0-scratch", "pv-eph"),
    ];
    let pvs = [
        pv("pv-san", DRIVER, "lv-san"),
        pv("pv-san2", DRIVER, "lv-san2"),
        pv("pv-local", DRIVER, "lv-local"),
        pv("pv-nfs", "nfs.csi.k8s.io", "share"),
        pv("pv-eph", DRIVER, "lv-eph"),
    ];
    // `lv-local` has no class: the default, node-local one.
    let lvs = [
        lv("lv-san", SAN),
        lv("lv-san2", SAN),
        lv("lv-local", ""),
        lv("lv-eph", SAN),
    ];
    let volumes = Volumes::new(DRIVER, &claims, &pvs, &lvs, Some("local"));
    let dead: BTreeSet<String> = [SAN.to_owned()].into();
    let fate = |volumes_json: Value| pod_fate(&pod("web-0", volumes_json), &dead, &volumes);

    let shared_only = json!([
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "l", "persistentVolumeClaim": {"claimName": "logs"}},
        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
        {"name": "cfg", "configMap": {"name": "x"}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "token", "projected": {"sources": []}},
    ]);
    assert_eq!(fate(shared_only), Some(Fate::Release));

    let with_nfs = json!([
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "n", "persistentVolumeClaim": {"claimName": "nfs"}},
    ]);
    assert_eq!(
        fate(with_nfs),
        Some(Fate::WaitsForAdmin(vec!["nfs".into()]))
    );
    let with_local_and_inline = json!([
        {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
        {"name": "x", "persistentVolumeClaim": {"claimName": "local"}},
        {"name": "i", "csi": {"driver": DRIVER}},
        {"name": "u", "persistentVolumeClaim": {"claimName": "unbound"}},
    ]);
    assert_eq!(
        fate(with_local_and_inline),
        Some(Fate::WaitsForAdmin(vec![
            "local".into(),
            "i".into(),
            "unbound".into()
        ]))
    );
    // No volume of the dead class: not the operator's to touch.
    assert_eq!(
        fate(json!([{"name": "x", "persistentVolumeClaim": {"claimName": "local"}}])),
        None
    );
    assert_eq!(fate(json!([{"name": "tmp", "emptyDir": {}}])), None);
    // Another class died, not this one.
    let other: BTreeSet<String> = ["other".to_owned()].into();
    assert_eq!(
        pod_fate(
            &pod(
                "web-0",
                json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}])
            ),
            &other,
            &volumes
        ),
        None
    );
}

#[test]
fn the_waiting_message_names_the_node_the_witness_and_the_fix() {
    let m = waits_message(&n1_dead(Cause::NotReady), &["nfs".into()]);
    for part in [
        "node n1",
        "on n2",
        "host id 1",
        "class san",
        "nfs",
        "out-of-service",
    ] {
        assert!(m.contains(part), "{part}: {m}");
    }
}

#[test]
fn a_ready_node_the_hook_fenced_is_dead_once_another_node_counts_its_lease_dead() {
    let nodes = [node("n1", "True"), node("n2", "True")];
    // Fenced, but its lease is not dead yet for n2: nothing.
    let early = [fenced_status("n1", 1), status("n2", 2, &[1, 2], &[])];
    assert!(deaths(&nodes, &early, "Required").is_empty());
    let dead = [fenced_status("n1", 1), status("n2", 2, &[2], &[1])];
    assert_eq!(deaths(&nodes, &dead, "Required"), [n1_dead(Cause::Fenced)]);
    // Not fenced by its own account: Ready, so not dead, whatever the witness says.
    let unfenced = [status("n1", 1, &[], &[]), status("n2", 2, &[2], &[1])];
    assert!(deaths(&nodes, &unfenced, "Required").is_empty());
    // Its own status is not a witness of its death.
    assert!(deaths(&nodes[..1], &[fenced_status("n1", 1)], "Required").is_empty());
}

#[test]
fn the_topology_label_goes_while_the_node_is_fenced_and_only_that_label_comes_back() {
    let policies = shared_policies(&[cluster("Required")]);
    let change = |fence| LabelChange {
        node: "n1".into(),
        class: SAN.into(),
        fence,
    };
    let nodes = [
        labelled(node("n1", "True"), "true"),
        labelled(node("n2", "True"), "true"),
    ];
    let statuses = [fenced_status("n1", 1), status("n2", 2, &[2], &[1])];
    assert_eq!(
        topology_labels(&nodes, &statuses, &policies),
        [change(true)]
    );
    // Taken (the annotation says so): nothing more while fenced; joined again: given back.
    let mut taken = node("n1", "True");
    taken
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(fenced_annotation(SAN), "true".into());
    let taken = [taken, labelled(node("n2", "True"), "true")];
    assert!(topology_labels(&taken, &statuses, &policies).is_empty());
    let rejoined = [status("n1", 1, &[1, 2], &[]), status("n2", 2, &[1, 2], &[])];
    assert_eq!(
        topology_labels(&taken, &rejoined, &policies),
        [change(false)]
    );
    // No longer fenced but not joined yet (its lockspace starting): not yet.
    let mut starting = fenced_status("n1", 1);
    let shared = starting.spec.lvm_vg_status[0].shared.as_mut().unwrap();
    shared.fencing = None;
    assert!(topology_labels(&taken, &[starting], &policies).is_empty());
    // A label the operator did not take is never added: kubelet sets it at registration, and a
    // node that left the class has it taken away by its agent, whatever a stale status says.
    let bare = [node("n1", "True")];
    assert!(topology_labels(&bare, &rejoined, &policies).is_empty());
    // A class that is not shared (or not in any LVMCluster) is never touched.
    assert!(topology_labels(&nodes, &statuses, &BTreeMap::new()).is_empty());
}

#[test]
fn a_fenced_live_nodes_waiting_pod_is_told_to_delete_it_not_to_taint_the_node() {
    let m = waits_message(&n1_dead(Cause::Fenced), &["nfs".into()]);
    for part in [
        "node n1",
        "fence hook",
        "on n2",
        "host id 1",
        "nfs",
        "delete the pod",
    ] {
        assert!(m.contains(part), "{part}: {m}");
    }
    assert!(!m.contains("out-of-service"), "{m}");
}
