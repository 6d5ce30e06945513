//! An installed lvms-rs (operator, CSI sidecars and node agents from `deploy/` or the Helm chart) on
//! nodes with a spare disk: an `LVMCluster` becomes Ready and a PersistentVolumeClaim
//! (WaitForFirstConsumer) becomes Bound through external-provisioner, the CSI controller and a node
//! agent. Runs only with `LVMS_E2E=1` and `LVMS_E2E_DEVICE` naming the disk on the nodes (its data is
//! destroyed only if it is empty: lvms-rs never wipes without `forceWipeDevicesAndDestroyAllData`);
//! `LVMS_E2E_INSTALL_NAMESPACE` is where lvms-rs runs (default `lvms-system`, which must hold no other
//! `LVMCluster`) and `LVMS_E2E_POD_IMAGE` the consumer pod's image (default pause). A control plane
//! without kubelets cannot run it: it is skipped unless `LVMS_E2E_DEVICE` is set.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use lvms_api::{LVMCluster, topolvm::LogicalVolume};
use serde_json::json;

use crate::support::{self, TestNamespace, eventually};

/// Building a volume group and thin pool, and pulling images, take longer than API round trips.
const SLOW: Duration = Duration::from_secs(600);

#[tokio::test]
#[ignore = "needs lvms-rs installed on a cluster with kubelets: LVMS_E2E=1 LVMS_E2E_DEVICE=… -- --ignored"]
async fn an_installed_lvms_takes_an_lvmcluster_to_ready_and_binds_a_pvc() {
    const TEST: &str = "an_installed_lvms_takes_an_lvmcluster_to_ready_and_binds_a_pvc";
    if !support::enabled(TEST) {
        return;
    }
    let Ok(device) = std::env::var("LVMS_E2E_DEVICE") else {
        eprintln!("{TEST}: skipped (set LVMS_E2E_DEVICE to a spare disk on nodes running lvms-rs)");
        return;
    };
    let install_ns =
        std::env::var("LVMS_E2E_INSTALL_NAMESPACE").unwrap_or_else(|_| "lvms-system".to_owned());
    let image = std::env::var("LVMS_E2E_POD_IMAGE")
        .unwrap_or_else(|_| "registry.k8s.io/pause:3.10".to_owned());
    let client = support::client().await;
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &install_ns);
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "lvms-e2e", "namespace": install_ns,
                     "labels": {support::E2E_LABEL: "true"}},
        "spec": {"storage": {"deviceClasses": [{
            "name": "e2e", "default": true, "fstype": "xfs",
            "deviceSelector": {"paths": [device]},
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}
        }]}}
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap_or_else(|e| panic!("creating LVMCluster lvms-e2e in {install_ns}: {e}"));
    eventually("the LVMCluster is Ready", SLOW, || {
        let clusters = clusters.clone();
        async move {
            let c = clusters.get("lvms-e2e").await.map_err(|e| e.to_string())?;
            match &c.status {
                Some(s) if s.ready => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    let ns =
        TestNamespace::create(&client, &format!("lvms-e2e-pvc-{}", support::suffix()), &[]).await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "lvms-e2e",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    // WaitForFirstConsumer: nothing happens until a pod uses the claim.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "consumer"},
        "spec": {"containers": [{"name": "c", "image": image,
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    let volume = eventually("the claim is Bound", SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.map_err(|e| e.to_string())?;
            let status = c.status.unwrap_or_default();
            match (status.phase.as_deref(), c.spec.and_then(|s| s.volume_name)) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    // The PersistentVolume's handle is a LogicalVolume a node agent answered.
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    let lv = Api::<LogicalVolume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap_or_else(|e| panic!("LogicalVolume {handle}: {e}"));
    assert_eq!(
        lv.status.as_ref().map(|s| s.volume_id.as_str()),
        Some(handle.as_str()),
        "{lv:?}"
    );

    // Deleting the claim removes the PersistentVolume (reclaim policy Delete) and the LogicalVolume.
    ns.delete().await;
    eventually("the LogicalVolume is gone", SLOW, || {
        let lvs = Api::<LogicalVolume>::all(client.clone());
        let handle = handle.clone();
        async move {
            match lvs.get_opt(&handle).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(lv) => Err(format!("{:?}", lv.metadata.deletion_timestamp)),
            }
        }
    })
    .await;
    clusters
        .delete("lvms-e2e", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the LVMCluster is gone", SLOW, || {
        let clusters = clusters.clone();
        async move {
            match clusters
                .get_opt("lvms-e2e")
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(c) => Err(format!("{:?}", c.status)),
            }
        }
    })
    .await;
}
