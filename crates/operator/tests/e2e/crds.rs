//! The generated CRDs on a real API server: installed, Established, bounds and CEL rules enforced.

use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroup};
use serde_json::json;

use crate::support::{self, TestNamespace, api_error};

fn cluster(ns: &str) -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": ns},
        "spec": {"storage": {"deviceClasses": [{
            "name": "vg1",
            "default": true,
            "fstype": "xfs",
            "deviceSelector": {"paths": ["/dev/sdb"]},
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10},
            "storageClassOptions": {"reclaimPolicy": "Delete"}
        }]}}
    }))
    .unwrap()
}

#[tokio::test]
async fn crds_install_and_the_api_server_enforces_bounds_and_immutability() {
    if !support::enabled("crds_install_and_the_api_server_enforces_bounds_and_immutability") {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let ns =
        TestNamespace::create(&client, &format!("lvms-e2e-crd-{}", support::suffix()), &[]).await;
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns.name);

    // Bounds from the schema: sizePercent is 10..=100.
    let mut bad = cluster(&ns.name);
    if let Some(tp) = bad.spec.storage.device_classes[0].thin_pool_config.as_mut() {
        tp.size_percent = Some(5);
    }
    let (code, message) = api_error(clusters.create(&PostParams::default(), &bad).await);
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("sizePercent"), "{message}");

    let created = clusters
        .create(&PostParams::default(), &cluster(&ns.name))
        .await
        .expect("a valid LVMCluster is stored");
    // Defaults from the schema are filled in.
    let class = &created.spec.storage.device_classes[0];
    assert_eq!(
        class
            .thin_pool_config
            .as_ref()
            .and_then(|t| t.chunk_size_calculation_policy)
            .map(|p| p.as_str()),
        Some("Static"),
        "{created:?}"
    );

    let merge = |patch: serde_json::Value| {
        let clusters = clusters.clone();
        async move {
            clusters
                .patch(
                    "my-lvmcluster",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
        }
    };
    let class_patch = |fields: serde_json::Value| {
        let mut class = json!({
            "name": "vg1",
            "default": true,
            "fstype": "xfs",
            "deviceSelector": {"paths": ["/dev/sdb"]},
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10},
            "storageClassOptions": {"reclaimPolicy": "Delete"}
        });
        if let (Some(class), Some(fields)) = (class.as_object_mut(), fields.as_object()) {
            for (k, v) in fields {
                class.insert(k.clone(), v.clone());
            }
        }
        json!({"spec": {"storage": {"deviceClasses": [class]}}})
    };

    // CEL: fstype, reclaimPolicy and raidConfig cannot change.
    let (code, message) = api_error(merge(class_patch(json!({"fstype": "ext4"}))).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("fstype is immutable once set"),
        "{message}"
    );

    let (code, message) = api_error(
        merge(class_patch(
            json!({"storageClassOptions": {"reclaimPolicy": "Retain"}}),
        ))
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("storageClassOptions.reclaimPolicy is immutable"),
        "{message}"
    );

    let (code, message) = api_error(
        merge(class_patch(
            json!({"raidConfig": {"type": "raid1", "mirrors": 1}}),
        ))
        .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(message.contains("raidConfig is immutable"), "{message}");

    // What may change does.
    let updated = merge(class_patch(json!({
        "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 20}
    })))
    .await
    .expect("overprovisionRatio may change");
    assert_eq!(
        updated.spec.storage.device_classes[0]
            .thin_pool_config
            .as_ref()
            .map(|t| t.overprovision_ratio),
        Some(20)
    );

    // LVMVolumeGroup: RAID and a thin pool together are a RAID thin pool (ADR 0031); the API
    // server keeps both.
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns.name);
    let vg: LVMVolumeGroup = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMVolumeGroup",
        "metadata": {"name": "vg1", "namespace": ns.name},
        "spec": {
            "deviceSelector": {"paths": ["/dev/sdb", "/dev/sdc"]},
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10},
            "raidConfig": {"type": "raid1", "mirrors": 1}
        }
    }))
    .unwrap();
    let made = vgs
        .create(&PostParams::default(), &vg)
        .await
        .expect("a RAID thin pool is admitted");
    assert_eq!(
        made.spec.raid_config.as_ref().map(|r| r.raid_type),
        Some(lvms_api::RaidType::Raid1)
    );
    assert!(made.spec.thin_pool_config.is_some());

    let _ = clusters
        .delete("my-lvmcluster", &DeleteParams::default())
        .await;
    ns.delete().await;
}

#[tokio::test]
async fn logical_volumes_are_selected_by_node_name_on_the_server() {
    if !support::enabled("logical_volumes_are_selected_by_node_name_on_the_server") {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let lvs = Api::<lvms_api::topolvm::LogicalVolume>::all(client.clone());
    let suffix = support::suffix();
    let (node_a, node_b) = (format!("e2e-a-{suffix}"), format!("e2e-b-{suffix}"));
    let mut names = Vec::new();
    for node in [&node_a, &node_b] {
        let name = format!("lvms-e2e-{node}");
        let lv: lvms_api::topolvm::LogicalVolume = serde_json::from_value(json!({
            "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
            "metadata": {"name": name},
            "spec": {"name": name, "nodeName": node, "size": "1Gi"}
        }))
        .unwrap();
        lvs.create(&PostParams::default(), &lv)
            .await
            .expect("a LogicalVolume is stored");
        names.push(name);
    }
    // What each node agent lists and watches (`lv_reconciler::node_selector`).
    let selected = lvs
        .list(
            &kube::api::ListParams::default()
                .fields(&lvms_node::lv_reconciler::node_selector(&node_a)),
        )
        .await
        .expect("spec.nodeName is a selectable field of the CRD");
    let got: Vec<String> = selected
        .items
        .iter()
        .map(|lv| lv.spec.node_name.clone())
        .collect();
    assert_eq!(got, std::slice::from_ref(&node_a));
    for name in names {
        let _ = lvs.delete(&name, &DeleteParams::default()).await;
    }
}
