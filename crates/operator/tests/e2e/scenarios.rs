//! The provisioning story on the [`stack`](crate::stack): real control plane, real sidecars, the
//! node agent on real LVM in the VM. Each scenario asserts on what the API server and the disk show.

use std::time::Instant;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use serde_json::json;

use crate::{
    stack::{self, DEVICE, DRIVER, NAMESPACE, NODE, SLOW, Stack},
    support::{self, TestNamespace, eventually},
};

/// The LVMCluster of the scenarios.
const CLUSTER: &str = "lvmcluster";
/// Its one device class, thin.
pub const CLASS: &str = "vg1";
pub const POOL: &str = "thin-pool-1";
pub const STORAGE_CLASS: &str = "lvms-vg1";

/// Creates the scenarios' LVMCluster (through the webhook) unless it exists, and waits until it
/// is Ready: the agent in the VM has built the volume group and its thin pool.
pub async fn ready_cluster(client: &Client, stack: &Stack) -> LVMCluster {
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), NAMESPACE);
    if clusters.get_opt(CLUSTER).await.unwrap().is_none() {
        let cluster: LVMCluster = serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
            "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
            "spec": {"storage": {"deviceClasses": [{
                "name": CLASS, "default": true, "fstype": "xfs",
                "deviceSelector": {"paths": [DEVICE]},
                "thinPoolConfig": {"name": POOL, "sizePercent": 90, "overprovisionRatio": 10}
            }]}}
        }))
        .unwrap();
        clusters
            .create(&PostParams::default(), &cluster)
            .await
            .unwrap_or_else(|e| panic!("creating the LVMCluster: {e}"));
    }
    let log = stack.agent_log().await;
    eventually("the LVMCluster is Ready", SLOW, || {
        let clusters = clusters.clone();
        let log = log.clone();
        async move {
            let c = clusters.get(CLUSTER).await.map_err(|e| e.to_string())?;
            match &c.status {
                Some(s) if s.ready => Ok(c),
                other => Err(format!("{other:?}; the agent's log began:\n{log}")),
            }
        }
    })
    .await
}

/// A scenario's start: a client, the LVMCluster Ready, a namespace of its own.
pub async fn scenario(stack: &Stack, prefix: &str) -> (Client, TestNamespace) {
    let client = support::client().await;
    ready_cluster(&client, stack).await;
    let ns = TestNamespace::create(&client, &format!("{prefix}-{}", support::suffix()), &[]).await;
    (client, ns)
}

#[tokio::test]
async fn stack_an_lvmcluster_renders_its_objects_and_the_agent_builds_the_volume_group() {
    let Some(guard) = stack::stack(
        "stack_an_lvmcluster_renders_its_objects_and_the_agent_builds_the_volume_group",
    )
    .await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let client = support::client().await;
    let started = Instant::now();
    let cluster = ready_cluster(&client, stack).await;
    println!(
        "the LVMCluster was Ready {:.0} s after it was asked for",
        started.elapsed().as_secs_f64()
    );

    // What the operator rendered.
    Api::<LVMVolumeGroup>::namespaced(client.clone(), NAMESPACE)
        .get(CLASS)
        .await
        .unwrap_or_else(|e| panic!("the LVMVolumeGroup {CLASS}: {e}"));
    let sc = Api::<StorageClass>::all(client.clone())
        .get(STORAGE_CLASS)
        .await
        .unwrap();
    assert_eq!(sc.provisioner, DRIVER);
    assert_eq!(
        sc.volume_binding_mode.as_deref(),
        Some("WaitForFirstConsumer")
    );
    let driver = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .unwrap();
    assert_eq!(driver.spec.storage_capacity, Some(true), "{driver:?}");
    let snapshot_classes = stack::resource(
        &client,
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshotClass",
    )
    .await;
    Api::<DynamicObject>::all_with(client.clone(), &snapshot_classes)
        .get(STORAGE_CLASS)
        .await
        .unwrap_or_else(|e| panic!("the VolumeSnapshotClass {STORAGE_CLASS}: {e}"));
    let daemon_sets = Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(daemon_sets.items.len(), 1, "one node DaemonSet");

    // The node's status and the disk agree.
    let status = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), NAMESPACE)
        .get(NODE)
        .await
        .unwrap();
    let entry = status
        .spec
        .lvm_vg_status
        .iter()
        .find(|s| s.name == CLASS)
        .unwrap_or_else(|| panic!("no {CLASS} in {status:?}"));
    // The disk the LVMCluster names, as the node reports it (its kernel name: vda under qemu,
    // ubda under user-mode Linux).
    let disk = stack.vm.ok(&format!("readlink -f {DEVICE}")).await;
    assert!(
        entry
            .devices
            .iter()
            .any(|d| d == disk.trim() || d == DEVICE),
        "{entry:?} names neither {DEVICE} nor {disk}"
    );
    assert!(stack.vm.lvs(CLASS).await.contains(&POOL.to_owned()));
    let state = cluster.status.as_ref().and_then(|s| s.state);
    assert_eq!(format!("{state:?}"), "Some(Ready)", "{:?}", cluster.status);
}

#[tokio::test]
async fn stack_a_wait_for_first_consumer_claim_is_bound_where_the_scheduler_put_its_pod() {
    let Some(guard) = stack::stack(
        "stack_a_wait_for_first_consumer_claim_is_bound_where_the_scheduler_put_its_pod",
    )
    .await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let client = support::client().await;
    ready_cluster(&client, stack).await;

    // external-provisioner publishes the class's capacity on the node from GetCapacity.
    let capacities = Api::<CSIStorageCapacity>::namespaced(client.clone(), NAMESPACE);
    eventually("a CSIStorageCapacity for the node", SLOW, || {
        let capacities = capacities.clone();
        async move {
            let list = capacities
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|c| {
                    c.storage_class_name == STORAGE_CLASS
                        && c.capacity.as_ref().is_some_and(|q| q.0 != "0")
                        && c.node_topology.as_ref().is_some_and(|t| {
                            t.match_labels
                                .as_ref()
                                .is_some_and(|l| l.values().any(|v| v == NODE))
                        })
                })
                .cloned()
                .ok_or_else(|| format!("{:?}", list.items))
        }
    })
    .await;

    let ns = TestNamespace::create(
        &client,
        &format!("lvms-e2e-wffc-{}", support::suffix()),
        &[],
    )
    .await;
    let before = stack.vm.lvs(CLASS).await;
    let started = Instant::now();
    let (pvcs, pods) = claim_with_consumer(&client, &ns.name, STORAGE_CLASS, "1Gi").await;

    let volume = eventually("the claim is Bound", SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.map_err(|e| e.to_string())?;
            let status = c.status.clone().unwrap_or_default();
            match (status.phase.as_deref(), c.spec.and_then(|s| s.volume_name)) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                other => Err(format!("{other:?} {:?}", c.metadata.annotations)),
            }
        }
    })
    .await;
    println!(
        "PVC to Bound: {:.1} s on the real control plane",
        started.elapsed().as_secs_f64()
    );
    // The scheduler binds the pod once its volume is bound (PreBind).
    consumer_on_node(&pods).await;

    // The PersistentVolume lives on that node, and its handle names the LV in the VM.
    let (handle, terms) = pv_handle_and_terms(&client, &volume).await;
    assert!(
        terms
            .iter()
            .any(|t| t.match_expressions.iter().flatten().any(|e| e
                .values
                .iter()
                .flatten()
                .any(|v| v == NODE))),
        "{terms:?}"
    );
    let lv = Api::<LogicalVolume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap_or_else(|e| panic!("LogicalVolume {handle}: {e}"));
    assert_eq!(lv.spec.node_name, NODE);
    let after = stack.vm.lvs(CLASS).await;
    let made: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(made, vec![&handle], "lvs in the VM shows the one new LV");

    // Deleting the pod and the claim (reclaim policy Delete) removes the LV. The pod goes at once
    // (grace 0), as kubelet would confirm it: there is none to do it here.
    pods.delete("consumer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    ns.delete().await;
    eventually("the LV is gone from the VM", SLOW, || {
        let vm = stack.vm.clone();
        let handle = handle.clone();
        let lvs = Api::<LogicalVolume>::all(client.clone());
        async move {
            let names = vm.lvs(CLASS).await;
            let object = lvs.get_opt(&handle).await.map_err(|e| e.to_string())?;
            if names.contains(&handle) || object.is_some() {
                Err(format!(
                    "lvs: {names:?}, LogicalVolume: {:?}",
                    object.map(|o| o.name_any())
                ))
            } else {
                Ok(())
            }
        }
    })
    .await;
}

/// Claim `data` of `size` on `storage_class` and the pod `consumer` that mounts it, in namespace
/// `ns`; their APIs.
pub async fn claim_with_consumer(
    client: &Client,
    ns: &str,
    storage_class: &str,
    size: &str,
) -> (Api<PersistentVolumeClaim>, Api<Pod>) {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                 "resources": {"requests": {"storage": size}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "consumer"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                 "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    (pvcs, pods)
}

/// Waits until the scheduler has put the pod `consumer` on the VM's node.
pub async fn consumer_on_node(pods: &Api<Pod>) {
    eventually("the scheduler binds the pod to the node", SLOW, || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("consumer").await.map_err(|e| e.to_string())?;
            match pod.spec.and_then(|s| s.node_name) {
                Some(node) if node == NODE => Ok(()),
                other => Err(format!("{other:?} {:?}", pod.status.map(|s| s.conditions))),
            }
        }
    })
    .await;
}

/// The volume handle of PersistentVolume `volume` and its required node-affinity terms.
pub async fn pv_handle_and_terms(client: &Client, volume: &str) -> (String, Vec<NodeSelectorTerm>) {
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(volume)
        .await
        .unwrap();
    let spec = pv.spec.unwrap();
    let handle = spec.csi.as_ref().unwrap().volume_handle.clone();
    let terms = spec
        .node_affinity
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    (handle, terms)
}

/// A claim of `size` on the scenarios' class in `ns`, optionally from a data source, and a pod
/// that uses it (so WaitForFirstConsumer binds it); returns the bound PersistentVolume's name.
pub async fn bound_claim(
    client: &Client,
    ns: &str,
    name: &str,
    size: &str,
    source: Option<serde_json::Value>,
) -> String {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                          "resources": {"requests": {"storage": size}}});
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc).await.unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                 "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]}
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    eventually(&format!("the claim {name} is Bound"), SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get(name).await.map_err(|e| e.to_string())?;
            let status = c.status.clone().unwrap_or_default();
            match (status.phase.as_deref(), c.spec.and_then(|s| s.volume_name)) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                other => Err(format!("{other:?} {:?}", c.metadata.annotations)),
            }
        }
    })
    .await
}

/// The volume handle (the LV's name) of a PersistentVolume.
pub async fn handle_of(client: &Client, pv: &str) -> String {
    Api::<PersistentVolume>::all(client.clone())
        .get(pv)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.csi)
        .unwrap()
        .volume_handle
}

/// The size of `vg/lv` in the VM, in bytes.
async fn lv_size(stack: &Stack, lv: &str) -> u64 {
    let out = stack
        .vm
        .ok(&format!(
            "lvm lvs --reportformat json --units b --nosuffix -o lv_size {CLASS}/{lv} 2>/dev/null"
        ))
        .await;
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    report["report"][0]["lv"][0]["lv_size"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no size in {out}"))
}

/// Takes VolumeSnapshot `name` of claim `claim` in `ns` on the scenarios' class and waits until it
/// is ReadyToUse; the namespace's VolumeSnapshots and the snapshot's handle (its LV's name).
pub async fn ready_snapshot(
    client: &Client,
    ns: &str,
    name: &str,
    claim: &str,
) -> (Api<DynamicObject>, String) {
    let snapshots = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &stack::resource(client, "snapshot.storage.k8s.io", "v1", "VolumeSnapshot").await,
    );
    let snapshot: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"volumeSnapshotClassName": STORAGE_CLASS,
                 "source": {"persistentVolumeClaimName": claim}},
    }))
    .unwrap();
    snapshots
        .create(&PostParams::default(), &snapshot)
        .await
        .unwrap_or_else(|e| panic!("creating the VolumeSnapshot: {e}"));
    let handle = eventually(
        &format!("the VolumeSnapshot {name} is ReadyToUse"),
        SLOW,
        || {
            let snapshots = snapshots.clone();
            let client = client.clone();
            async move {
                let s = snapshots.get(name).await.map_err(|e| e.to_string())?;
                if s.data["status"]["readyToUse"] != true {
                    return Err(format!("{}", s.data["status"]));
                }
                let content = s.data["status"]["boundVolumeSnapshotContentName"]
                    .as_str()
                    .ok_or("no content")?
                    .to_owned();
                let contents = Api::<DynamicObject>::all_with(
                    client.clone(),
                    &stack::resource(
                        &client,
                        "snapshot.storage.k8s.io",
                        "v1",
                        "VolumeSnapshotContent",
                    )
                    .await,
                );
                let c = contents.get(&content).await.map_err(|e| e.to_string())?;
                c.data["status"]["snapshotHandle"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("{}", c.data["status"]))
            }
        },
    )
    .await;
    (snapshots, handle)
}

#[tokio::test]
async fn stack_a_claim_grows_is_snapshotted_restored_and_cloned_and_its_lvs_go_with_it() {
    let Some(guard) = stack::stack(
        "stack_a_claim_grows_is_snapshotted_restored_and_cloned_and_its_lvs_go_with_it",
    )
    .await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-life").await;
    let before = stack.vm.lvs(CLASS).await;
    const GIB: u64 = 1 << 30;

    // Expansion: external-resizer calls ControllerExpandVolume, the agent grows the LV.
    let pv = bound_claim(&client, &ns.name, "data", "1Gi", None).await;
    let data = handle_of(&client, &pv).await;
    assert_eq!(lv_size(stack, &data).await, GIB);
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    pvcs.patch(
        "data",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    )
    .await
    .unwrap();
    eventually("the PersistentVolume grows to 2Gi", SLOW, || {
        let pvs = Api::<PersistentVolume>::all(client.clone());
        let pv = pv.clone();
        async move {
            let spec = pvs.get(&pv).await.map_err(|e| e.to_string())?.spec;
            let capacity = spec.and_then(|s| s.capacity).unwrap_or_default();
            match capacity.get("storage").map(|q| q.0.as_str()) {
                Some("2Gi") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(
        lv_size(stack, &data).await,
        2 * GIB,
        "lvs shows the grown LV"
    );

    // A VolumeSnapshot becomes ReadyToUse through snapshot-controller and csi-snapshotter.
    let (snapshots, snapshot_handle) = ready_snapshot(&client, &ns.name, "snap", "data").await;
    assert!(
        stack.vm.lvs(CLASS).await.contains(&snapshot_handle),
        "the snapshot is an LV in the VM"
    );

    // A claim restored from the snapshot, and a clone of the claim.
    let restored = bound_claim(
        &client,
        &ns.name,
        "restored",
        "2Gi",
        Some(
            json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                    "name": "snap"}),
        ),
    )
    .await;
    let cloned = bound_claim(
        &client,
        &ns.name,
        "cloned",
        "2Gi",
        Some(json!({"kind": "PersistentVolumeClaim", "name": "data"})),
    )
    .await;
    let (restored, cloned) = (
        handle_of(&client, &restored).await,
        handle_of(&client, &cloned).await,
    );
    let lvs = stack.vm.lvs(CLASS).await;
    for lv in [&data, &snapshot_handle, &restored, &cloned] {
        assert!(lvs.contains(lv), "{lv} in {lvs:?}");
    }

    // Deleting pods (at once: no kubelet confirms), claims and the snapshot removes every LV.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for name in ["data", "restored", "cloned"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    snapshots
        .delete("snap", &DeleteParams::default())
        .await
        .unwrap();
    for name in ["restored", "cloned", "data"] {
        pvcs.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("every LV of the scenario is gone from the VM", SLOW, || {
        let vm = stack.vm.clone();
        let before = before.clone();
        async move {
            let now = vm.lvs(CLASS).await;
            (now == before)
                .then_some(())
                .ok_or_else(|| format!("before: {before:?}, now: {now:?}"))
        }
    })
    .await;
    ns.delete().await;
}

#[tokio::test]
async fn stack_deleting_the_lvmcluster_waits_for_a_retained_volume_then_the_node_wipes_its_group() {
    let Some(guard) = stack::stack(
        "stack_deleting_the_lvmcluster_waits_for_a_retained_volume_then_the_node_wipes_its_group",
    )
    .await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-del").await;

    // A volume whose PersistentVolume is kept (Retain) after its claim goes.
    let pv_name = bound_claim(&client, &ns.name, "kept", "1Gi", None).await;
    let handle = handle_of(&client, &pv_name).await;
    let pvs = Api::<PersistentVolume>::all(client.clone());
    pvs.patch(
        &pv_name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
    )
    .await
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete("kept", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name)
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the retained PersistentVolume is Released", SLOW, || {
        let pvs = pvs.clone();
        let pv_name = pv_name.clone();
        async move {
            let pv = pvs.get(&pv_name).await.map_err(|e| e.to_string())?;
            let phase = pv.status.and_then(|s| s.phase);
            (phase.as_deref() == Some("Released"))
                .then_some(())
                .ok_or(format!("{phase:?}"))
        }
    })
    .await;

    // Deleting the LVMCluster: its finalizer holds while the retained volume's data is on the node.
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), NAMESPACE);
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    support::consistently(
        "the LVMCluster, its group and the retained LV stay",
        std::time::Duration::from_secs(15),
        || {
            let clusters = clusters.clone();
            let vm = stack.vm.clone();
            let handle = handle.clone();
            async move {
                let c = clusters.get_opt(CLUSTER).await.map_err(|e| e.to_string())?;
                if c.is_none() {
                    return Err("the LVMCluster is gone".into());
                }
                let lvs = vm.lvs(CLASS).await;
                lvs.contains(&handle)
                    .then_some(())
                    .ok_or(format!("lvs: {lvs:?}"))
            }
        },
    )
    .await;
    let held = clusters.get(CLUSTER).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());

    // Released by its owner: the PersistentVolume and its LogicalVolume are deleted by hand, as
    // the operator's event says.
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    Api::<LogicalVolume>::all(client.clone())
        .delete(&handle, &DeleteParams::default())
        .await
        .unwrap();
    support::wait_cluster_gone(&clusters, CLUSTER, SLOW).await;

    // The node cleaned up: no volume group, no LVM label on the disk, no object left.
    let (code, out) = stack
        .vm
        .sh(&format!("lvm vgs {CLASS} 2>&1; blkid -p {DEVICE}"))
        .await;
    assert_ne!(code, 0, "{out}");
    assert!(
        !out.contains("LVM2_member"),
        "the disk keeps an LVM label: {out}"
    );
    assert!(
        Api::<LVMVolumeGroup>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), NAMESPACE)
            .get_opt(NODE)
            .await
            .unwrap()
            .is_none(),
        "the node's status object is gone"
    );
    assert!(
        Api::<StorageClass>::all(client.clone())
            .get_opt(STORAGE_CLASS)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    ns.delete().await;
}

/// How many claims the crash scenario makes.
const BATCH: usize = 50;

/// The claims of `ns` that are Bound, and those that are not (yet).
async fn bound_claims(client: &Client, ns: &str) -> (Vec<String>, Vec<String>) {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let (bound, pending): (Vec<_>, Vec<_>) = pvcs
        .items
        .iter()
        .partition(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"));
    (
        bound.iter().map(|c| c.name_any()).collect(),
        pending.iter().map(|c| c.name_any()).collect(),
    )
}

#[tokio::test]
async fn stack_killing_each_lvms_process_mid_batch_loses_and_duplicates_no_volume() {
    let Some(mut guard) =
        stack::stack("stack_killing_each_lvms_process_mid_batch_loses_and_duplicates_no_volume")
            .await
    else {
        return;
    };
    let stack = guard.as_mut().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-kill").await;
    let before = stack.vm.lvs(CLASS).await;
    let objects = Api::<LogicalVolume>::all(client.clone());
    let objects_before: Vec<String> = objects
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .collect();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let started = Instant::now();
    for i in 0..BATCH {
        let name = format!("c{i:02}");
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                     "resources": {"requests": {"storage": "64Mi"}}}
        }))
        .unwrap();
        pvcs.create(&PostParams::default(), &pvc).await.unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]}
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    // Each lvms process dies (SIGKILL) once while the claims are being provisioned.
    for (at, victim) in [(10, "csi-controller"), (20, "node agent"), (30, "operator")] {
        eventually(&format!("{at} claims Bound"), SLOW, || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                let (bound, _) = bound_claims(&client, &ns).await;
                (bound.len() >= at)
                    .then_some(())
                    .ok_or(bound.len().to_string())
            }
        })
        .await;
        println!("killing the {victim} with {at} of {BATCH} claims Bound");
        if victim == "node agent" {
            stack.kill_agent().await;
            stack.start_agent().await;
        } else {
            stack.kill_and_restart(victim);
        }
    }
    eventually(&format!("all {BATCH} claims Bound"), SLOW, || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            let (bound, pending) = bound_claims(&client, &ns).await;
            pending
                .is_empty()
                .then_some(())
                .ok_or(format!("{} Bound, waiting for {pending:?}", bound.len()))
        }
    })
    .await;
    println!(
        "{BATCH} claims Bound in {:.0} s with three processes killed",
        started.elapsed().as_secs_f64()
    );

    // Half of them go, with the agent and the CSI controller killed while they do.
    for i in 0..BATCH / 2 {
        let name = format!("c{i:02}");
        pods.delete(&name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        pvcs.delete(&name, &DeleteParams::default()).await.unwrap();
        if i == 5 {
            stack.kill_agent().await;
            stack.start_agent().await;
        }
        if i == 15 {
            stack.kill_and_restart("csi-controller");
        }
    }
    let kept: Vec<String> = (BATCH / 2..BATCH).map(|i| format!("c{i:02}")).collect();
    let expected_lvs = eventually("the deleted claims' volumes are gone", SLOW, || {
        let client = client.clone();
        let ns = ns.name.clone();
        let kept = kept.clone();
        async move {
            let (bound, pending) = bound_claims(&client, &ns).await;
            if bound != kept || !pending.is_empty() {
                return Err(format!("bound {bound:?}, pending {pending:?}"));
            }
            let pvs = Api::<PersistentVolume>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let handles: Vec<String> = pvs
                .items
                .iter()
                .filter(|pv| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .and_then(|c| c.namespace.as_deref())
                        == Some(ns.as_str())
                })
                .filter_map(|pv| {
                    pv.spec
                        .as_ref()?
                        .csi
                        .as_ref()
                        .map(|c| c.volume_handle.clone())
                })
                .collect();
            (handles.len() == kept.len())
                .then_some(handles)
                .ok_or_else(|| format!("{} PersistentVolumes left", pvs.items.len()))
        }
    })
    .await;
    // The disk holds exactly the kept claims' LVs besides what was there before: none lost, none
    // twice, no orphan; and one LogicalVolume each.
    let mut expected = expected_lvs;
    expected.sort();
    eventually("lvs in the VM shows exactly the kept volumes", SLOW, || {
        let vm = stack.vm.clone();
        let expected = expected.clone();
        let before = before.clone();
        async move {
            let new: Vec<String> = vm
                .lvs(CLASS)
                .await
                .into_iter()
                .filter(|n| !before.contains(n))
                .collect();
            (new == expected)
                .then_some(())
                .ok_or_else(|| format!("expected {expected:?}, new LVs {new:?}"))
        }
    })
    .await;
    let mut new_objects: Vec<String> = objects
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.name_any())
        .filter(|n| !objects_before.contains(n))
        .collect();
    new_objects.sort();
    assert_eq!(new_objects, expected, "one LogicalVolume per kept claim");

    // The rest goes too.
    for name in &kept {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        pvcs.delete(name, &DeleteParams::default()).await.unwrap();
    }
    eventually("every volume of the batch is gone", SLOW, || {
        let vm = stack.vm.clone();
        let before = before.clone();
        async move {
            let left: Vec<String> = vm
                .lvs(CLASS)
                .await
                .into_iter()
                .filter(|n| !before.contains(n))
                .collect();
            left.is_empty()
                .then_some(())
                .ok_or_else(|| format!("left: {left:?}"))
        }
    })
    .await;
    ns.delete().await;
}
