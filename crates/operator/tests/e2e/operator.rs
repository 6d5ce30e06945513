//! The LVMCluster controller, in this process, against the real API server: rendering, status
//! aggregation from hand-written node statuses, and the deletion flow.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{PersistentVolume, PersistentVolumeClaim},
    events::v1::Event,
    storage::v1::{CSIDriver, StorageClass},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCLUSTER_FINALIZER, LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus};
use lvms_operator::{
    RenderConfig,
    metrics::{Metrics, Readiness},
};
use serde_json::json;

use crate::support::{self, TestNamespace, WAIT, consistently, eventually};

async fn get_or_none<K>(api: &Api<K>, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.map_err(|e| e.to_string())
}

async fn cluster_status(clusters: &Api<LVMCluster>) -> Result<LVMCluster, String> {
    clusters
        .get("my-lvmcluster")
        .await
        .map_err(|e| e.to_string())
}

async fn write_node_status(client: &Client, ns: &str, node: &str, classes: &[(&str, &str, &str)]) {
    let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": node, "namespace": ns},
        "spec": {"nodeStatus": classes.iter().map(|(class, state, reason)| json!({
            "name": class,
            "status": state,
            "reason": reason,
            "devices": ["/dev/sdb"],
            "deviceDiscoveryPolicy": "RuntimeStatic",
        })).collect::<Vec<_>>()},
    }))
    .unwrap();
    Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns)
        .patch(
            node,
            &PatchParams::apply(support::MANAGER).force(),
            &Patch::Apply(&status),
        )
        .await
        .unwrap_or_else(|e| panic!("writing the node status of {node}: {e}"));
}

#[tokio::test]
async fn operator_renders_aggregates_status_and_deletes_only_when_storage_is_free() {
    if !support::enabled("operator_renders_aggregates_status_and_deletes_only_when_storage_is_free")
    {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-op-{sfx}"), &[]).await;
    let pool_label = ("lvms-e2e/pool", sfx.as_str());
    let (node_a, node_b) = (format!("lvms-e2e-{sfx}-a"), format!("lvms-e2e-{sfx}-b"));
    support::create_node(&client, &node_a, &[pool_label]).await;
    support::create_node(&client, &node_b, &[pool_label]).await;
    let (thin, thick) = (format!("t{sfx}"), format!("k{sfx}"));
    let driver = format!("{sfx}.e2e.topolvm.io");

    let mut cfg = RenderConfig::new(ns.name.clone(), "ghcr.io/lvms-rs/lvms:e2e");
    cfg.driver_name = driver.clone();
    let (stop, stopped) = support::stop_signal();
    let readiness = Readiness::default();
    let controller = tokio::spawn(lvms_operator::controller::run(
        client.clone(),
        cfg,
        Arc::new(Metrics::new()),
        readiness.clone(),
        stopped(),
    ));

    let selector = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "lvms-e2e/pool", "operator": "In", "values": [sfx]}
    ]}]});
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": ns.name},
        "spec": {
            // Nodes without a kubelet get the node lifecycle controller's taints.
            "tolerations": [{"operator": "Exists"}],
            "storage": {"deviceClasses": [
                {"name": thin, "default": true, "fstype": "ext4", "nodeSelector": selector,
                 "deviceSelector": {"paths": ["/dev/sdb"]},
                 "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}},
                {"name": thick, "nodeSelector": selector,
                 "deviceSelector": {"paths": ["/dev/sdc"]}}
            ]}
        }
    }))
    .unwrap();
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns.name);
    let created = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("creating the LVMCluster");
    let uid = created.uid().unwrap();

    // Finalizer, then the rendered objects.
    eventually("the LVMCluster finalizer", WAIT, || async {
        let c = cluster_status(&clusters).await?;
        c.finalizers()
            .iter()
            .any(|f| f == LVMCLUSTER_FINALIZER)
            .then_some(())
            .ok_or(format!("{:?}", c.metadata.finalizers))
    })
    .await;
    eventually("the controller's cache is synced", WAIT, || async {
        readiness
            .waiting_for()
            .iter()
            .all(|w| !w.contains("cache"))
            .then_some(())
            .ok_or_else(|| format!("{:?}", readiness.waiting_for()))
    })
    .await;

    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns.name);
    for class in [&thin, &thick] {
        let vg = eventually(&format!("LVMVolumeGroup {class}"), WAIT, || async {
            get_or_none(&vgs, class).await?.ok_or("missing".to_owned())
        })
        .await;
        let owner = &vg.owner_references()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("LVMCluster", "my-lvmcluster", uid.as_str())
        );
        assert_eq!(owner.controller, Some(true));
        assert!(vg.spec.node_selector.is_some(), "{vg:?}");
    }
    assert!(
        vgs.get(&thin)
            .await
            .unwrap()
            .spec
            .thin_pool_config
            .is_some(),
        "the thin class keeps its pool"
    );

    let scs = Api::<StorageClass>::all(client.clone());
    let sc = eventually("StorageClass of the thin class", WAIT, || async {
        get_or_none(&scs, &format!("lvms-{thin}"))
            .await?
            .ok_or("missing".to_owned())
    })
    .await;
    assert_eq!(sc.provisioner, driver);
    let params = sc.parameters.clone().unwrap_or_default();
    assert_eq!(
        params.get("topolvm.io/device-class"),
        Some(&thin),
        "{params:?}"
    );
    assert_eq!(
        params.get("csi.storage.k8s.io/fstype").map(String::as_str),
        Some("ext4")
    );
    assert_eq!(
        sc.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(sc.allow_volume_expansion, Some(true));
    let thick_sc = eventually("StorageClass of the thick class", WAIT, || async {
        get_or_none(&scs, &format!("lvms-{thick}"))
            .await?
            .ok_or("missing".to_owned())
    })
    .await;
    assert_eq!(
        thick_sc
            .parameters
            .unwrap_or_default()
            .get("csi.storage.k8s.io/fstype")
            .map(String::as_str),
        Some("xfs"),
        "fstype defaults to xfs"
    );

    let drivers = Api::<CSIDriver>::all(client.clone());
    let csi = eventually("the CSIDriver", WAIT, || async {
        get_or_none(&drivers, &driver)
            .await?
            .ok_or("missing".to_owned())
    })
    .await;
    assert_eq!(csi.spec.attach_required, Some(false));
    assert_eq!(csi.spec.pod_info_on_mount, Some(true));
    assert_eq!(csi.spec.storage_capacity, Some(true));

    let daemon_sets = Api::<DaemonSet>::namespaced(client.clone(), &ns.name);
    let ds = eventually("the vg-manager DaemonSet", WAIT, || async {
        get_or_none(&daemon_sets, "vg-manager")
            .await?
            .ok_or("missing".to_owned())
    })
    .await;
    let pod = ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let affinity = serde_json::to_value(&pod.affinity).unwrap();
    assert!(
        affinity.to_string().contains("lvms-e2e/pool"),
        "the DaemonSet follows the classes' node selectors: {affinity}"
    );
    assert!(
        pod.tolerations
            .iter()
            .flatten()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "{:?}",
        pod.tolerations
    );

    // Status: both nodes selected, nobody reported yet.
    let c = eventually("status Progressing", WAIT, || async {
        let c = cluster_status(&clusters).await?;
        match c.status.as_ref().and_then(|s| s.state) {
            Some(s) if s.as_str() == "Progressing" => Ok(c),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(!c.status.as_ref().unwrap().ready);

    // Every node reports every class Ready.
    for node in [&node_a, &node_b] {
        write_node_status(
            &client,
            &ns.name,
            node,
            &[(&thin, "Ready", ""), (&thick, "Ready", "")],
        )
        .await;
    }
    let c = eventually("status Ready", WAIT, || async {
        let c = cluster_status(&clusters).await?;
        let s = c.status.clone().unwrap_or_default();
        (s.ready && s.state.map(|s| s.as_str()) == Some("Ready"))
            .then_some(c)
            .ok_or(format!("{s:?}"))
    })
    .await;
    let status = c.status.unwrap();
    let classes: Vec<&str> = status
        .device_class_statuses
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(classes, [thin.as_str(), thick.as_str()]);
    for d in &status.device_class_statuses {
        let nodes: Vec<&str> = d.node_status.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(nodes, [node_a.as_str(), node_b.as_str()], "{d:?}");
    }
    for cond in ["ResourcesAvailable", "VolumeGroupsReady"] {
        assert!(
            status
                .conditions
                .iter()
                .any(|c| c.type_ == cond && c.status == "True"),
            "{cond}: {:?}",
            status.conditions
        );
    }

    // One node fails one class: the cluster says which.
    write_node_status(
        &client,
        &ns.name,
        &node_b,
        &[(&thin, "Failed", "no usable device"), (&thick, "Ready", "")],
    )
    .await;
    eventually("status Failed with the node's reason", WAIT, || async {
        let c = cluster_status(&clusters).await?;
        let s = c.status.unwrap_or_default();
        let text = serde_json::to_string(&s).unwrap();
        (!s.ready
            && s.state.map(|s| s.as_str()) == Some("Failed")
            && text.contains("no usable device"))
        .then_some(())
        .ok_or(text)
    })
    .await;

    // Deletion. The node agent of node A holds a cleanup finalizer on the thin class.
    let agent_finalizer = format!("cleanup.vgmanager.node.topolvm.io/{node_a}");
    vgs.patch(
        &thin,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [agent_finalizer]}})),
    )
    .await
    .unwrap();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": ns.name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": format!("lvms-{thin}"),
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let pv_name = format!("lvms-e2e-{sfx}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {support::E2E_LABEL: "true"}},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "csi": {"driver": driver, "volumeHandle": format!("e2e-{sfx}")}},
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();

    clusters
        .delete("my-lvmcluster", &DeleteParams::default())
        .await
        .unwrap();
    let events = Api::<Event>::namespaced(client.clone(), &ns.name);
    let note = eventually("a DeletionBlocked event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|e| e.reason.as_deref() == Some("DeletionBlocked"))
            .and_then(|e| e.note.clone())
            .ok_or(format!("{} events", list.items.len()))
    })
    .await;
    assert!(note.contains("PersistentVolumeClaim"), "{note}");
    assert!(note.contains("Retain"), "{note}");
    consistently(
        "storage stays while blocked",
        Duration::from_secs(5),
        || async {
            let vg = get_or_none(&vgs, &thin).await?.ok_or("VG gone")?;
            if vg.metadata.deletion_timestamp.is_some() {
                return Err("the LVMVolumeGroup is being deleted".into());
            }
            get_or_none(&scs, &format!("lvms-{thin}"))
                .await?
                .ok_or("StorageClass gone")?;
            Ok(())
        },
    )
    .await;

    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    eventually("the PVC is gone", WAIT, || async {
        match get_or_none(&pvcs, "data").await? {
            None => Ok(()),
            Some(p) => Err(format!("{:?}", p.metadata.finalizers)),
        }
    })
    .await;
    consistently(
        "the Retain PV still blocks the deletion",
        Duration::from_secs(12),
        || async {
            let vg = get_or_none(&vgs, &thin).await?.ok_or("VG gone")?;
            vg.metadata
                .deletion_timestamp
                .is_none()
                .then_some(())
                .ok_or("the LVMVolumeGroup is being deleted".into())
        },
    )
    .await;

    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    // Storage goes; the cluster waits for node A's agent.
    eventually("StorageClasses deleted", WAIT, || async {
        match get_or_none(&scs, &format!("lvms-{thin}")).await? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;
    let vg = eventually("the thin LVMVolumeGroup being deleted", WAIT, || async {
        let vg = get_or_none(&vgs, &thin).await?.ok_or("gone too early")?;
        vg.metadata
            .deletion_timestamp
            .is_some()
            .then_some(vg)
            .ok_or("not being deleted".into())
    })
    .await;
    assert!(vg.finalizers().contains(&agent_finalizer));
    consistently(
        "the LVMCluster waits for node cleanup",
        Duration::from_secs(5),
        || async {
            let c = get_or_none(&clusters, "my-lvmcluster")
                .await?
                .ok_or("the LVMCluster is gone")?;
            c.finalizers()
                .iter()
                .any(|f| f == LVMCLUSTER_FINALIZER)
                .then_some(())
                .ok_or("finalizer removed".into())
        },
    )
    .await;

    // Node A's agent finishes: the rest goes.
    vgs.patch(
        &thin,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("the LVMCluster is gone", WAIT, || async {
        match get_or_none(&clusters, "my-lvmcluster").await? {
            None => Ok(()),
            Some(c) => Err(format!("{:?}", c.metadata.finalizers)),
        }
    })
    .await;
    assert!(get_or_none(&drivers, &driver).await.unwrap().is_none());
    assert!(
        get_or_none(&daemon_sets, "vg-manager")
            .await
            .unwrap()
            .is_none()
    );

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    support::delete_node(&client, &node_a).await;
    support::delete_node(&client, &node_b).await;
    ns.delete().await;
}
