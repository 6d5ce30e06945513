//! The node-removal controller, in this process: deleting a Node releases what its agent left.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMVolumeGroup, LVMVolumeGroupNodeStatus, NODE_STATUS_FINALIZER};
use lvms_operator::metrics::Metrics;
use serde_json::json;

use crate::support::{self, TestNamespace, WAIT, eventually};

#[tokio::test]
async fn deleting_a_node_releases_its_node_status_and_cleanup_finalizers() {
    if !support::enabled("deleting_a_node_releases_its_node_status_and_cleanup_finalizers") {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-nr-{sfx}"), &[]).await;
    let (gone, stays) = (
        format!("lvms-e2e-{sfx}-gone"),
        format!("lvms-e2e-{sfx}-stays"),
    );
    support::create_node(&client, &gone, &[]).await;
    support::create_node(&client, &stays, &[]).await;

    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), &ns.name);
    for node in [&gone, &stays] {
        let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1",
            "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": ns.name, "finalizers": [NODE_STATUS_FINALIZER]},
            "spec": {"nodeStatus": [{"name": "vg1", "status": "Ready"}]},
        }))
        .unwrap();
        statuses
            .create(&PostParams::default(), &status)
            .await
            .unwrap();
    }
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns.name);
    let finalizer = |node: &str| format!("cleanup.vgmanager.node.topolvm.io/{node}");
    let vg: LVMVolumeGroup = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMVolumeGroup",
        "metadata": {"name": "vg1", "namespace": ns.name,
                     "finalizers": [finalizer(&gone), finalizer(&stays)]},
        "spec": {"deviceSelector": {"paths": ["/dev/sdb"]}},
    }))
    .unwrap();
    vgs.create(&PostParams::default(), &vg).await.unwrap();

    let (stop, stopped) = support::stop_signal();
    let metrics = Arc::new(Metrics::new());
    let controller = tokio::spawn(lvms_operator::controller::node_removal::run(
        client.clone(),
        ns.name.clone(),
        metrics.clone(),
        lvms_operator::controller::node_removal::DeathPolicy {
            driver: lvms_api::DEFAULT_DRIVER_NAME.to_owned(),
            out_of_service_taint: false,
        },
        stopped(),
    ));
    // The first pass (or the first few: Node changes trigger them too) sees both nodes and
    // leaves everything alone.
    eventually("the first pass", WAIT, || async {
        let text = metrics.encode();
        text.lines()
            .any(|l| {
                l.starts_with(
                    "lvms_operator_reconciles_total{controller=\"node-removal\",result=\"success\"} ",
                )
            })
            .then_some(())
            .ok_or(text)
    })
    .await;
    assert_eq!(
        vgs.get("vg1").await.unwrap().finalizers(),
        [finalizer(&gone), finalizer(&stays)]
    );

    support::delete_node(&client, &gone).await;
    // The watch triggers a pass long before the periodic one.
    eventually(
        "the gone node's status deleted",
        Duration::from_secs(30),
        || async {
            match statuses.get_opt(&gone).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(s) => Err(format!("{:?}", s.metadata.finalizers)),
            }
        },
    )
    .await;
    assert_eq!(
        vgs.get("vg1").await.unwrap().finalizers(),
        [finalizer(&stays)]
    );
    let kept = statuses.get(&stays).await.unwrap();
    assert_eq!(kept.finalizers(), [NODE_STATUS_FINALIZER]);
    eventually("the release is counted", WAIT, || async {
        let text = metrics.encode();
        text.contains("lvms_operator_node_cleanups_total 1")
            .then_some(())
            .ok_or(text)
    })
    .await;

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    for name in [&stays] {
        let _ = statuses
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    let _ = vgs
        .patch(
            "vg1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = vgs.delete("vg1", &DeleteParams::default()).await;
    support::delete_node(&client, &stays).await;
    ns.delete().await;
}
