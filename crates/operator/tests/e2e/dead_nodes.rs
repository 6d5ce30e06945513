//! Death detection on the real API server (ADR 0029): the node-removal controller, in this process,
//! frees the pods of a node that is not Ready once another node's status says sanlock counts its
//! lease dead, and hands its shared volumes over; it touches nothing before.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::{
        core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
        events::v1::Event,
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use lvms_operator::{
    controller::node_removal::{self, DeathPolicy},
    metrics::Metrics,
};
use serde_json::json;

use crate::support::{self, TestNamespace, WAIT, consistently, eventually};

/// The shared class of the first test; each test has its own (the e2e suite runs them beside the
/// shared-stack test, whose node joins a class `san`, and the handover picks any Ready node with a
/// class's label).
const SAN: &str = "deadsan";

async fn set_ready(client: &Client, node: &str, ready: &str) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    Api::<Node>::all(client.clone())
        .patch_status(
            node,
            &PatchParams::apply("lvms-e2e-kubelet").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": node},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "E2E",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}]},
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("Node {node} Ready={ready}: {e}"));
}

fn node_status(
    ns: &str,
    node: &str,
    host_id: i32,
    live: &[i32],
    dead: &[i32],
) -> serde_json::Value {
    class_statuses(ns, node, &[(SAN, host_id, live, dead)])
}

/// A node's status with one joined shared class per `(class, host id, live ids, dead ids)`.
fn class_statuses(
    ns: &str,
    node: &str,
    classes: &[(&str, i32, &[i32], &[i32])],
) -> serde_json::Value {
    let classes: Vec<_> = classes
        .iter()
        .map(|(class, host_id, live, dead)| {
            json!({"name": class, "status": "Ready",
                   "shared": {"lockspace": "Joined", "hostId": host_id,
                              "liveHostIds": live, "deadHostIds": dead}})
        })
        .collect();
    json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": node, "namespace": ns},
        "spec": {"nodeStatus": classes},
    })
}

fn has_out_of_service_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == "node.kubernetes.io/out-of-service"
                    && t.value.as_deref() == Some("nodeshutdown")
                    && t.effect == "NoExecute"
            })
        })
}

/// A `LogicalVolume` of `class` on `node`.
async fn logical_volume(client: &Client, name: &str, node: &str, class: &str) {
    let lv: LogicalVolume = serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": node, "size": "1Gi", "deviceClass": class},
    }))
    .unwrap();
    Api::<LogicalVolume>::all(client.clone())
        .create(&PostParams::default(), &lv)
        .await
        .unwrap();
}

/// Creates `cluster` in `ns`; the API of the node statuses there.
async fn create_cluster(
    client: &Client,
    ns: &str,
    cluster: &LVMCluster,
) -> Api<LVMVolumeGroupNodeStatus> {
    Api::<LVMCluster>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), cluster)
        .await
        .unwrap();
    Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns)
}

/// A bound claim `name` in `ns` on a PersistentVolume of `driver` with handle `handle`.
async fn bound_claim(client: &Client, ns: &str, name: &str, driver: &str, handle: &str) {
    let pv_name = format!("{ns}-{name}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                 "csi": {"driver": driver, "volumeHandle": handle}},
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                 "resources": {"requests": {"storage": "1Gi"}}, "volumeName": pv_name},
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
}

fn pod(name: &str, node: &str, claims: &[&str]) -> Pod {
    let volumes: Vec<_> = claims
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"name": format!("v{i}"), "persistentVolumeClaim": {"claimName": c}}))
        .chain([json!({"name": "tmp", "emptyDir": {}})])
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}],
                 "volumes": volumes},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_node_whose_lease_another_node_counts_dead_has_its_shared_pods_and_volumes_freed() {
    const TEST: &str =
        "a_node_whose_lease_another_node_counts_dead_has_its_shared_pods_and_volumes_freed";
    if !support::enabled(TEST) {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-dead-{sfx}"), &[]).await;
    let app = TestNamespace::create(&client, &format!("lvms-e2e-dead-app-{sfx}"), &[]).await;
    let (dead, alive) = (
        format!("lvms-e2e-{sfx}-dead"),
        format!("lvms-e2e-{sfx}-alive"),
    );
    let joined = lvms_api::shared_topology_key(SAN);
    for n in [&dead, &alive] {
        support::create_node(&client, n, &[(joined.as_str(), "true")]).await;
    }
    set_ready(&client, &alive, "True").await;
    set_ready(&client, &dead, "Unknown").await;

    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": ns.name},
        "spec": {"storage": {"deviceClasses": [
            {"name": "local", "default": true, "thinPoolConfig": {"name": "tp", "sizePercent": 90,
                                                                  "overprovisionRatio": 10}},
            {"name": SAN, "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
             "sharedConfig": {"watchdog": "Required"}},
        ]}},
    }))
    .unwrap();
    let statuses = create_cluster(&client, &ns.name, &cluster).await;
    // Before: node "alive" sees "dead" silent, not yet dead.
    for s in [
        node_status(&ns.name, &dead, 1, &[1, 2], &[]),
        node_status(&ns.name, &alive, 2, &[1, 2], &[]),
    ] {
        let s: LVMVolumeGroupNodeStatus = serde_json::from_value(s).unwrap();
        statuses.create(&PostParams::default(), &s).await.unwrap();
    }

    let lv_name = format!("lvms-e2e-{sfx}-lv");
    logical_volume(&client, &lv_name, &dead, SAN).await;
    let lvs = Api::<LogicalVolume>::all(client.clone());
    bound_claim(
        &client,
        &app.name,
        "data",
        lvms_api::DEFAULT_DRIVER_NAME,
        &lv_name,
    )
    .await;
    bound_claim(&client, &app.name, "nfs", "nfs.csi.k8s.io", "share-1").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &app.name);
    for p in [
        pod("released", &dead, &["data"]),
        pod("waits", &dead, &["data", "nfs"]),
        pod("untouched", &dead, &[]),
        pod("elsewhere", &alive, &["data"]),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }

    let (stop, stopped) = support::stop_signal();
    let metrics = Arc::new(Metrics::new());
    let controller = tokio::spawn(node_removal::run(
        client.clone(),
        ns.name.clone(),
        metrics.clone(),
        DeathPolicy {
            driver: lvms_api::DEFAULT_DRIVER_NAME.to_owned(),
            out_of_service_taint: false,
        },
        stopped(),
    ));
    // Not Ready, but its lease is not dead yet: nothing moves.
    let count = |pods: Api<Pod>| async move {
        pods.list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .map_err(|e| e.to_string())
    };
    consistently(
        "nothing is released while the lease lives",
        Duration::from_secs(8),
        || async {
            match count(pods.clone()).await? {
                4 => Ok(()),
                n => Err(format!("{n} pods")),
            }
        },
    )
    .await;
    assert_eq!(lvs.get(&lv_name).await.unwrap().spec.node_name, dead);

    // sanlock on "alive" counts host 1 dead: the status change triggers a pass at once (the
    // periodic one is 60 s away).
    let counted = std::time::Instant::now();
    statuses
        .patch(
            &alive,
            &PatchParams::apply("lvms-e2e").force(),
            &Patch::Apply(node_status(&ns.name, &alive, 2, &[2], &[1])),
        )
        .await
        .unwrap();
    eventually(
        "the dead node's shared-only pod is deleted",
        Duration::from_secs(30),
        || async {
            match pods.get_opt("released").await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            }
        },
    )
    .await;
    println!(
        "dead nodes: pod deleted {:.1} s after the death was reported",
        counted.elapsed().as_secs_f64()
    );
    eventually("the volume is handed to the live node", WAIT, || async {
        let lv = lvs.get(&lv_name).await.map_err(|e| e.to_string())?;
        (lv.spec.node_name == alive)
            .then_some(())
            .ok_or(lv.spec.node_name)
    })
    .await;
    for name in ["waits", "untouched", "elsewhere"] {
        assert!(pods.get_opt(name).await.unwrap().is_some(), "{name} stays");
    }
    let events = Api::<Event>::namespaced(client.clone(), &app.name);
    let waiting = eventually("the waiting pod's Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("WaitingForAdmin")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("waits")
            })
            .ok_or_else(|| "no WaitingForAdmin event".to_owned())
    })
    .await;
    let note = waiting.note.unwrap_or_default();
    assert!(note.contains("nfs") && note.contains(&dead), "{note}");
    let node = Api::<Node>::all(client.clone()).get(&dead).await.unwrap();
    assert!(
        !has_out_of_service_taint(&node),
        "no out-of-service taint unless opted in"
    );

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    let _ = lvs.delete(&lv_name, &DeleteParams::default()).await;
    for claim in ["data", "nfs"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{}-{claim}", app.name), &DeleteParams::default())
            .await;
    }
    for n in [&dead, &alive] {
        support::delete_node(&client, n).await;
    }
    app.delete().await;
    ns.delete().await;
}

#[tokio::test]
async fn a_fenced_live_node_loses_its_shared_pods_and_label_the_taint_needs_the_opt_in_and_no_fencing_only_reports()
 {
    const TEST: &str = "a_fenced_live_node_loses_its_shared_pods_and_label_the_taint_needs_the_opt_in_and_no_fencing_only_reports";
    if !support::enabled(TEST) {
        return;
    }
    const BARE: &str = "barefence";
    const SAN: &str = "cutsan";
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-taint-{sfx}"), &[]).await;
    let app = TestNamespace::create(&client, &format!("lvms-e2e-taint-app-{sfx}"), &[]).await;
    // "fenced" is dead in a class under `watchdog: Required`, "unfenced" in one under `Disabled`;
    // "cut" is Ready but lost its path to the LUN, and the fence hook fenced it; "alive" sees all
    // three dead.
    let [fenced, unfenced, cut, alive] =
        ["fenced", "unfenced", "cut", "alive"].map(|n| format!("lvms-e2e-{sfx}-{n}"));
    let joined = lvms_api::shared_topology_key(SAN);
    for n in [&fenced, &unfenced] {
        support::create_node(&client, n, &[]).await;
    }
    // kubelet's label on the nodes joined to the class.
    for n in [&cut, &alive] {
        support::create_node(&client, n, &[(joined.as_str(), "true")]).await;
    }
    set_ready(&client, &alive, "True").await;
    set_ready(&client, &cut, "True").await;
    set_ready(&client, &fenced, "Unknown").await;
    set_ready(&client, &unfenced, "False").await;
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": ns.name},
        "spec": {"storage": {"deviceClasses": [
            {"name": SAN, "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
             "sharedConfig": {"watchdog": "Required"}},
            {"name": BARE, "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x2"]},
             "sharedConfig": {"watchdog": "Disabled"}},
        ]}},
    }))
    .unwrap();
    let statuses = create_cluster(&client, &ns.name, &cluster).await;
    let mut cut_status = class_statuses(&ns.name, &cut, &[(SAN, 4, &[], &[])]);
    cut_status["spec"]["nodeStatus"][0]["status"] = json!("Failed");
    cut_status["spec"]["nodeStatus"][0]["shared"]["lockspace"] = json!("NotJoined");
    cut_status["spec"]["nodeStatus"][0]["shared"]["fencing"] =
        json!({"watchdog": "Armed", "killHook": true, "fenced": true});
    for s in [
        class_statuses(&ns.name, &fenced, &[(SAN, 1, &[1, 3], &[])]),
        class_statuses(&ns.name, &unfenced, &[(BARE, 2, &[2, 3], &[])]),
        cut_status,
        class_statuses(
            &ns.name,
            &alive,
            &[(SAN, 3, &[3], &[1, 4]), (BARE, 3, &[3], &[2])],
        ),
    ] {
        let s: LVMVolumeGroupNodeStatus = serde_json::from_value(s).unwrap();
        statuses.create(&PostParams::default(), &s).await.unwrap();
    }
    let [san_lv, bare_lv, cut_lv] = ["san", "bare", "cut"].map(|v| format!("lvms-e2e-{sfx}-{v}"));
    logical_volume(&client, &san_lv, &fenced, SAN).await;
    logical_volume(&client, &bare_lv, &unfenced, BARE).await;
    logical_volume(&client, &cut_lv, &cut, SAN).await;
    let driver = lvms_api::DEFAULT_DRIVER_NAME;
    bound_claim(&client, &app.name, "san", driver, &san_lv).await;
    bound_claim(&client, &app.name, "bare", driver, &bare_lv).await;
    bound_claim(&client, &app.name, "cut", driver, &cut_lv).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &app.name);
    for p in [
        pod("on-fenced", &fenced, &["san"]),
        pod("on-unfenced", &unfenced, &["bare"]),
        pod("on-cut", &cut, &["cut"]),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }

    let (stop, stopped) = support::stop_signal();
    let controller = tokio::spawn(node_removal::run(
        client.clone(),
        ns.name.clone(),
        Arc::new(Metrics::new()),
        DeathPolicy {
            driver: driver.to_owned(),
            out_of_service_taint: true,
        },
        stopped(),
    ));
    let nodes = Api::<Node>::all(client.clone());
    eventually(
        "the fenced dead node is tainted out of service",
        WAIT,
        || async {
            let n = nodes.get(&fenced).await.map_err(|e| e.to_string())?;
            has_out_of_service_taint(&n)
                .then_some(())
                .ok_or_else(|| format!("{:?}", n.spec.and_then(|s| s.taints)))
        },
    )
    .await;
    let events = Api::<Event>::all(client.clone());
    let note = eventually("the unfenced dead node is reported", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("SharedNodeDeadNotFenced")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                        == Some(unfenced.as_str())
            })
            .and_then(|e| e.note)
            .ok_or_else(|| "no SharedNodeDeadNotFenced event".to_owned())
    })
    .await;
    assert!(note.contains(BARE) && note.contains("Disabled"), "{note}");
    eventually("the fenced node's volume is handed over", WAIT, || async {
        let lv = Api::<LogicalVolume>::all(client.clone())
            .get(&san_lv)
            .await
            .map_err(|e| e.to_string())?;
        (lv.spec.node_name == alive)
            .then_some(())
            .ok_or(lv.spec.node_name)
    })
    .await;
    // The Ready node the hook fenced: its pod is deleted and its volume handed over, it loses the
    // class's topology label (no new pod of the class lands there), and it is never tainted out
    // of service, opted in or not: it is alive.
    eventually(
        "the fenced live node's pod is released and its label removed",
        WAIT,
        || async {
            let lv = Api::<LogicalVolume>::all(client.clone())
                .get(&cut_lv)
                .await
                .map_err(|e| e.to_string())?;
            let pod = pods.get_opt("on-cut").await.map_err(|e| e.to_string())?;
            let n = nodes.get(&cut).await.map_err(|e| e.to_string())?;
            let label = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&joined))
                .cloned();
            match (lv.spec.node_name == alive, pod.is_none(), label) {
                (true, true, None) => Ok(()),
                other => Err(format!("(handed over, pod gone, label) = {other:?}")),
            }
        },
    )
    .await;
    assert!(!has_out_of_service_taint(&nodes.get(&cut).await.unwrap()));
    // Its path back and nothing open, it joins again: the label comes back.
    statuses
        .patch(
            &cut,
            &PatchParams::apply("lvms-e2e").force(),
            &Patch::Apply(class_statuses(&ns.name, &cut, &[(SAN, 4, &[3, 4], &[])])),
        )
        .await
        .unwrap();
    eventually(
        "the rejoined node has the class's label again",
        WAIT,
        || async {
            let n = nodes.get(&cut).await.map_err(|e| e.to_string())?;
            let label = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(&joined))
                .cloned();
            (label.as_deref() == Some("true"))
                .then_some(())
                .ok_or(format!("{label:?}"))
        },
    )
    .await;
    // Without fencing nothing is released: no taint, the pod and the volume stay.
    consistently(
        "the unfenced node keeps its pod, volume and taints",
        Duration::from_secs(6),
        || async {
            let n = nodes.get(&unfenced).await.map_err(|e| e.to_string())?;
            let lv = Api::<LogicalVolume>::all(client.clone())
                .get(&bare_lv)
                .await
                .map_err(|e| e.to_string())?;
            let pod = pods
                .get_opt("on-unfenced")
                .await
                .map_err(|e| e.to_string())?;
            match (
                has_out_of_service_taint(&n),
                lv.spec.node_name == unfenced,
                pod.is_some(),
            ) {
                (false, true, true) => Ok(()),
                other => Err(format!("(tainted, volume kept, pod kept) = {other:?}")),
            }
        },
    )
    .await;

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    for lv in [&san_lv, &bare_lv, &cut_lv] {
        let _ = Api::<LogicalVolume>::all(client.clone())
            .delete(lv, &DeleteParams::default())
            .await;
    }
    for claim in ["san", "bare", "cut"] {
        let _ = Api::<PersistentVolume>::all(client.clone())
            .delete(&format!("{}-{claim}", app.name), &DeleteParams::default())
            .await;
    }
    for n in [&fenced, &unfenced, &cut, &alive] {
        support::delete_node(&client, n).await;
    }
    app.delete().await;
    ns.delete().await;
}
