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

const SAN: &str = "san";

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
    json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": node, "namespace": ns},
        "spec": {"nodeStatus": [{"name": SAN, "status": "Ready",
            "shared": {"lockspace": "Joined", "hostId": host_id,
                       "liveHostIds": live, "deadHostIds": dead}}]},
    })
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
    Api::<LVMCluster>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), &ns.name);
    // Before: node "alive" sees "dead" silent, not yet dead.
    for s in [
        node_status(&ns.name, &dead, 1, &[1, 2], &[]),
        node_status(&ns.name, &alive, 2, &[1, 2], &[]),
    ] {
        let s: LVMVolumeGroupNodeStatus = serde_json::from_value(s).unwrap();
        statuses.create(&PostParams::default(), &s).await.unwrap();
    }

    let lv_name = format!("lvms-e2e-{sfx}-lv");
    let lv: LogicalVolume = serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": lv_name},
        "spec": {"name": lv_name, "nodeName": dead, "size": "1Gi", "deviceClass": SAN},
    }))
    .unwrap();
    let lvs = Api::<LogicalVolume>::all(client.clone());
    lvs.create(&PostParams::default(), &lv).await.unwrap();
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
        !node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"),
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
