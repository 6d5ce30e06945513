//! Taking over what LVMS left on a real cluster (issue 34, ADR 0032), in two steps that
//! `cargo xtask installed` runs around `kubectl apply`:
//!
//! 1. [`lvms_left_this_cluster`], before lvms-rs is installed, builds on the second node the state
//!    an LVMS install leaves when its operator is uninstalled and its objects kept, exactly as
//!    LVMS's and TopoLVM's sources make it (`../shared/research/topolvm-lvms-formats.md`, each
//!    field's source file in ADR 0032): the `LVMCluster` with its finalizer, the `LVMVolumeGroup`
//!    and node status with theirs, the Node's `topolvm.io/node` finalizer, the StorageClass,
//!    VolumeSnapshotClass and `topolvm.io` CSIDriver LVMS renders, the volume group `vg1` tagged
//!    `lvms` with LVMS's thin pool, and one volume as TopoLVM provisions it (the LV named after its
//!    `LogicalVolume`'s UID, an xfs filesystem holding a file, the PersistentVolume the
//!    external-provisioner writes, its claim bound) and one VolumeSnapshot of it as the snapshot
//!    controller and TopoLVM make it. A stand-in for LVMS's node plugin listens on
//!    its socket (`plugins/topolvm.io/node/csi-topolvm.sock`): it is still running.
//! 2. [`an_lvms_install_is_taken_over_in_place`], after the install, checks the takeover: the
//!    cluster becomes Ready on the same volume group and pool (same UUIDs), nothing is taken over
//!    while the old plugin listens, then the volume is, in place; a Pod reads the old file, the
//!    claim grows, a snapshot of it restores and so does the one LVMS made before the switch, a new
//!    claim is made beside it, capacity counts both,
//!    every `LogicalVolume` names an LV TopoLVM's node would find (the way back), and deleting the
//!    claims and the `LVMCluster` removes everything, the old volume and LVMS's finalizers too.
//!
//! lvmd.yaml is not written: the node's `/etc` is the host's, shared over 9p, and lvms-rs never
//! reads it.

use std::{collections::BTreeMap, time::Instant};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSIDriver, StorageClass},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
};
use lvms_api::{
    LOGICAL_VOLUME_FINALIZER, LVMCLUSTER_FINALIZER, LVMCluster, LVMVolumeGroup,
    LVMVolumeGroupNodeStatus, NODE_FINALIZER, NODE_STATUS_FINALIZER, TOPOLOGY_NODE_KEY,
    node_cleanup_finalizer, topolvm::LogicalVolume,
};
use serde_json::{Value, json};

mod csi_driver_lvm;
mod topolvm;

use super::{
    DRIVER, INSTALL_NS, SLOW, SecondNode, delete_pod, env, node_pod_ready, pod, since_apply,
    wait_log, wait_running,
};
use crate::{
    stack::{self, Vm},
    support::{self, consistently, eventually},
};

/// LVMS's defaults: the device class (and volume group) `vg1`, its pool `thin-pool-1`.
const CLASS: &str = "vg1";
const POOL: &str = "thin-pool-1";
const CLUSTER: &str = "lvmcluster";
/// LVMS's StorageClass and VolumeSnapshotClass for the class.
const STORAGE_CLASS: &str = "lvms-vg1";
/// The namespace of the old claim (and the ConfigMap that carries what step 1 made to step 2).
const NS: &str = "lvms-takeover";
const OLD_CLAIM: &str = "old-data";
const STATE: &str = "lvms-left";
/// LVMS's node plugin socket, as the node sees it, and the stand-in's pid file.
const OLD_SOCKET: &str = "/var/lib/kubelet/plugins/topolvm.io/node/csi-topolvm.sock";
const OLD_PID: &str = "/run/lvms-takeover-old-plugin.pid";
const GIB: u64 = 1 << 30;

/// LVMS's owned-by labels on what it renders (lvm-operator `internal/controllers/labels/managed.go`).
fn owned_by(cluster: &LVMCluster) -> Value {
    json!({
        "owned-by.topolvm.io/name": CLUSTER,
        "owned-by.topolvm.io/namespace": INSTALL_NS,
        "owned-by.topolvm.io/uid": cluster.uid().unwrap(),
        "owned-by.topolvm.io/group": "lvm.topolvm.io",
        "owned-by.topolvm.io/version": "v1alpha1",
        "owned-by.topolvm.io/kind": "LVMCluster",
    })
}

fn owner_ref(cluster: &LVMCluster) -> Value {
    json!([{
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster", "name": CLUSTER,
        "uid": cluster.uid().unwrap(), "controller": true, "blockOwnerDeletion": true,
    }])
}

async fn create<K>(api: &Api<K>, obj: Value) -> K
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let what = format!("{} {}", obj["kind"], obj["metadata"]["name"]);
    let obj: K = serde_json::from_value(obj).unwrap_or_else(|e| panic!("{what}: {e}"));
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {what}: {e}"))
}

/// One `lvm … -o <field>` value in the node's guest.
async fn lvm_field(vm: &Vm, cmd: &str) -> String {
    vm.ok(&format!("lvm {cmd} 2>/dev/null"))
        .await
        .trim()
        .to_owned()
}

/// Binds claim `name` to the PersistentVolume `pv` as the PV controller does after
/// external-provisioner made it, and waits until it is Bound.
async fn bind(pvcs: &Api<PersistentVolumeClaim>, name: &str, pv: &str) {
    pvcs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({
            "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes",
                                         "pv.kubernetes.io/bound-by-controller": "yes"}},
            "spec": {"volumeName": pv},
        })),
    )
    .await
    .unwrap();
    eventually(&format!("claim {name} is Bound"), SLOW, || async move {
        let c = pvcs.get(name).await.map_err(|e| e.to_string())?;
        let phase = c.status.and_then(|s| s.phase);
        (phase.as_deref() == Some("Bound"))
            .then_some(())
            .ok_or_else(|| format!("{phase:?}"))
    })
    .await;
}

/// A stand-in for another driver's node plugin on the node: something accepts connections on
/// `socket` until the process in `pid_file` is killed.
async fn old_plugin_listens(vm: &Vm, socket: &str, pid_file: &str) {
    vm.ok(&format!(
        "mkdir -p $(dirname {socket}) && rm -f {socket} && \
         setsid python3 -c 'import socket,time; s=socket.socket(socket.AF_UNIX); \
         s.bind(\"{socket}\"); s.listen(8); \
         [c.close() for c in iter(lambda: s.accept()[0], None)]' \
         >/dev/null 2>&1 </dev/null & echo $! > {pid_file}; \
         for i in $(seq 50); do [ -S {socket} ] && exit 0; sleep 0.1; done; exit 1"
    ))
    .await;
}

/// Step 1 of a takeover on node 2, where `cargo xtask installed` runs it: the second node and a
/// client, with the namespace `ns` created; `None` (and said) when run elsewhere or not enabled.
async fn step_one(test: &str, ns: &str) -> Option<(SecondNode, kube::Client)> {
    if !support::enabled(test) {
        return None;
    }
    let Some(env) = env() else {
        eprintln!("{test}: skipped (run by `cargo xtask installed`)");
        return None;
    };
    let second = env.node2.expect("the second node (LVMS_E2E_NODE2)");
    let client = support::client().await;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
    )
    .await;
    Some((second, client))
}

/// A 1 GiB claim `(namespace, name)` of `storage_class` as the scheduler and PV controller leave it
/// for `driver`'s external-provisioner, the node chosen.
fn claim_being_provisioned(
    driver: &str,
    (ns, name): (&str, &str),
    storage_class: &str,
    node: &str,
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "annotations": {
            "volume.kubernetes.io/storage-provisioner": driver,
            "volume.beta.kubernetes.io/storage-provisioner": driver,
            "volume.kubernetes.io/selected-node": node}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": storage_class,
                 "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
    })
}

/// A volume TopoLVM provisioned, as [`Provisioned::by_topolvm`] builds it.
struct Provisioned {
    /// The PersistentVolume's name, also its `LogicalVolume`'s: `pvc-<claim uid>`.
    pv: String,
    /// The volume id: the `LogicalVolume`'s UID, the LV's name, the PV's handle.
    id: String,
}

impl Provisioned {
    /// One claim `(namespace, claim, StorageClass, deviceClass)` provisioned as TopoLVM does it
    /// (topolvm internal/driver/controller.go CreateVolume, internal/controller/
    /// logicalvolume_controller.go createLV, ADR 0032's table): its `LogicalVolume`, the LV that
    /// `lvcreate(id)` makes in lvmd's group `vg`, named after the object's UID, xfs holding
    /// `token` in `file`, the status, the PersistentVolume external-provisioner writes, and the
    /// claim bound.
    async fn by_topolvm(
        client: &kube::Client,
        (vm, node, vg): (&Vm, &str, &str),
        (ns, claim_name, storage_class, device_class): (&str, &str, &str, &str),
        lvcreate: impl Fn(&str) -> String,
        token: &str,
    ) -> Self {
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
        let claim = create(
            &pvcs,
            claim_being_provisioned(DRIVER, (ns, claim_name), storage_class, node),
        )
        .await;
        let pv = format!("pvc-{}", claim.uid().unwrap());
        let lvs = Api::<LogicalVolume>::all(client.clone());
        let lv = create(
            &lvs,
            json!({
                "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                "metadata": {"name": pv, "finalizers": [LOGICAL_VOLUME_FINALIZER],
                             "labels": {"app.kubernetes.io/created-by": "topolvm-controller"}},
                "spec": {"name": pv, "nodeName": node, "size": "1Gi",
                         "deviceClass": device_class},
            }),
        )
        .await;
        let id = lv.uid().unwrap();
        let mnt = format!("/run/takeover-{id}");
        vm.ok(&format!(
            "set -e; {} >/dev/null; mkfs.xfs -q -f /dev/{vg}/{id}; mkdir -p {mnt}; \
             mount /dev/{vg}/{id} {mnt}; echo {token} > {mnt}/file; chmod 2777 {mnt}; \
             umount {mnt}; rmdir {mnt}",
            lvcreate(&id)
        ))
        .await;
        lvs.patch_status(
            &pv,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"volumeID": id, "currentSize": "1Gi"}})),
        )
        .await
        .unwrap();
        create(
            &Api::<PersistentVolume>::all(client.clone()),
            json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv,
                             "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER,
                                 "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                                 "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
                             "labels": {"kubernetes.io/hostname": node},
                             "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
                "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                         "persistentVolumeReclaimPolicy": "Delete",
                         "storageClassName": storage_class, "volumeMode": "Filesystem",
                         "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                      "namespace": ns, "name": claim_name,
                                      "uid": claim.uid().unwrap()},
                         "csi": {"driver": DRIVER, "volumeHandle": id, "fsType": "xfs",
                                 "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity":
                                                      "1764979200000-4242-topolvm.io"}},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                             "key": TOPOLOGY_NODE_KEY, "operator": "In", "values": [node]}]}]}}},
            }),
        )
        .await;
        bind(&pvcs, claim_name, &pv).await;
        Self { pv, id }
    }
}

#[tokio::test]
#[ignore = "step 1 of the takeover: run by `cargo xtask installed` before it installs lvms-rs"]
async fn lvms_left_this_cluster() {
    let Some((second, client)) = step_one("lvms_left_this_cluster", NS).await else {
        return;
    };
    let (node, vm) = (second.node.as_str(), &second.vm);
    // LVMS's CRDs stay installed when its operator is uninstalled; lvms-rs's are the same ones.
    support::install_crds(&client).await;
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": INSTALL_NS}}),
    )
    .await;

    // The volume group and thin pool as LVMS's vg-manager makes them (ADR 0032's table).
    let kname = vm
        .ok(&format!("readlink -f {}", second.device))
        .await
        .trim()
        .to_owned();
    vm.ok(&format!(
        "lvm vgcreate {CLASS} --addtag @lvms {kname} && \
         lvm lvcreate -l 90%FREE -Z y -T -c 131072b {CLASS}/{POOL}"
    ))
    .await;

    // The LVMCluster, and what LVMS's operator and vg-manager made from it.
    let node_selector = json!({"nodeSelectorTerms": [{"matchExpressions": [{
        "key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]});
    let thin = json!({"name": POOL, "sizePercent": 90, "overprovisionRatio": 10});
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), INSTALL_NS);
    let cluster = create(
        &clusters,
        json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
            "metadata": {"name": CLUSTER, "namespace": INSTALL_NS,
                         "finalizers": [LVMCLUSTER_FINALIZER]},
            "spec": {"storage": {"deviceClasses": [{
                "name": CLASS, "default": true, "fstype": "xfs",
                "deviceSelector": {"paths": [second.device]},
                "nodeSelector": node_selector, "thinPoolConfig": thin,
            }]}}
        }),
    )
    .await;
    create(
        &Api::<LVMVolumeGroup>::namespaced(client.clone(), INSTALL_NS),
        json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
            "metadata": {"name": CLASS, "namespace": INSTALL_NS,
                         "ownerReferences": owner_ref(&cluster),
                         "finalizers": [node_cleanup_finalizer(node)]},
            "spec": {"default": true, "deviceSelector": {"paths": [second.device]},
                     "nodeSelector": node_selector, "thinPoolConfig": thin},
        }),
    )
    .await;
    create(
        &Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), INSTALL_NS),
        json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": INSTALL_NS,
                         "ownerReferences": owner_ref(&cluster),
                         "finalizers": [NODE_STATUS_FINALIZER]},
            "spec": {"nodeStatus": [{"name": CLASS, "status": "Ready", "devices": [kname],
                                     "deviceDiscoveryPolicy": "Preconfigured"}]},
        }),
    )
    .await;
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {
                "finalizers": [NODE_FINALIZER],
                "annotations": {"capacity.topolvm.io/00default": "1", "capacity.topolvm.io/vg1": "1"},
            }})),
        )
        .await
        .unwrap();
    let sc = json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": STORAGE_CLASS, "labels": owned_by(&cluster),
                     "annotations": {"description": "Provides RWO and RWOP Filesystem & Block volumes"}},
        "provisioner": DRIVER, "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer", "allowVolumeExpansion": true,
        "parameters": {"topolvm.io/device-class": CLASS, "csi.storage.k8s.io/fstype": "xfs"},
    });
    create(&Api::<StorageClass>::all(client.clone()), sc).await;
    let vsc = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": STORAGE_CLASS, "labels": owned_by(&cluster)},
        "driver": DRIVER, "deletionPolicy": "Delete",
    });
    let vscs = Api::<DynamicObject>::all_with(
        client.clone(),
        &stack::resource(
            &client,
            "snapshot.storage.k8s.io",
            "v1",
            "VolumeSnapshotClass",
        )
        .await,
    );
    vscs.create(
        &PostParams::default(),
        &serde_json::from_value(vsc).unwrap(),
    )
    .await
    .unwrap();
    create(
        &Api::<CSIDriver>::all(client.clone()),
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER, "labels": owned_by(&cluster)},
            "spec": {"attachRequired": false, "podInfoOnMount": true, "storageCapacity": true,
                     "volumeLifecycleModes": ["Persistent"]},
        }),
    )
    .await;

    // One claim, provisioned as TopoLVM does it in LVMS's thin pool.
    let token = format!("lvms-wrote-{}", support::suffix());
    let old = Provisioned::by_topolvm(
        &client,
        (vm, node, CLASS),
        (NS, OLD_CLAIM, STORAGE_CLASS, CLASS),
        |id| format!("lvm lvcreate -T {CLASS}/{POOL} -n {id} -V {GIB}b -W y -y"),
        &token,
    )
    .await;
    let (pv_name, id) = (old.pv, old.id);
    let snapshot_id = snapshot_as_topolvm_makes_it(&client, vm, node, &pv_name, &id).await;

    // LVMS's node plugin is still running: something accepts connections on its socket.
    old_plugin_listens(vm, OLD_SOCKET, OLD_PID).await;

    // What step 2 compares against.
    let vg_uuid = lvm_field(vm, &format!("vgs --noheadings -o vg_uuid {CLASS}")).await;
    let pool_uuid = lvm_field(vm, &format!("lvs --noheadings -o lv_uuid {CLASS}/{POOL}")).await;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE, "namespace": NS},
            "data": {"vgUUID": vg_uuid, "poolUUID": pool_uuid, "volumeID": id,
                     "snapshotID": snapshot_id, "token": token, "pv": pv_name},
        }),
    )
    .await;
    println!("installed-takeover: LVMS's state built on {node}: volume {id} in {CLASS}/{POOL}");
}

/// Waits until the volume group `vg` is gone from `device`: no group of that name, no PV label.
async fn group_removed(vm: &Vm, vg: &str, device: &str) {
    eventually(
        &format!("the volume group {vg} is removed from {device}"),
        SLOW,
        || async {
            let (code, out) = vm
                .sh(&format!("lvm vgs {vg} 2>&1; blkid -p {device} 2>&1"))
                .await;
            (!out.contains("LVM2_member") && out.contains("not found"))
                .then_some(())
                .ok_or_else(|| format!("exit {code}: {out}"))
        },
    )
    .await;
}

/// The VolumeSnapshot LVMS made of the old claim.
const OLD_SNAPSHOT: &str = "old-snap-by-lvms";

/// A VolumeSnapshot of the old claim as it stands after the snapshot controller and TopoLVM made
/// it (ADR 0032's table; `../shared/research/topolvm-lvms-formats.md` §7): the `VolumeSnapshot`,
/// its content `snapcontent-<VolumeSnapshot uid>` with the status the snapshotter sidecar wrote
/// (`snapshotHandle` = the snapshot's volume id, ready), the `LogicalVolume`
/// `snapshot-<VolumeSnapshot uid>` with `source` the claim's object and `accessType: ro`, and its
/// LV a thin snapshot named after that object's UID (`lvcreate -s -k n`, then `lvchange -p r`).
/// The snapshot controller runs here; nothing answers for `topolvm.io`, so nothing but this writes
/// the content's status. Returns the snapshot's volume id.
async fn snapshot_as_topolvm_makes_it(
    client: &kube::Client,
    vm: &Vm,
    node: &str,
    source: &str,
    source_id: &str,
) -> String {
    let resource = |kind: &'static str| async move {
        stack::resource(client, "snapshot.storage.k8s.io", "v1", kind).await
    };
    let snapshots = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NS,
        &resource("VolumeSnapshot").await,
    );
    let contents =
        Api::<DynamicObject>::all_with(client.clone(), &resource("VolumeSnapshotContent").await);
    let snapshot = snapshots
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": OLD_SNAPSHOT, "namespace": NS},
                "spec": {"volumeSnapshotClassName": STORAGE_CLASS,
                         "source": {"persistentVolumeClaimName": OLD_CLAIM}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let vs_uid = snapshot.uid().unwrap();
    let content_name = format!("snapcontent-{vs_uid}");
    // The snapshot controller makes this same content from the VolumeSnapshot; whichever is
    // first, the other finds it there.
    let content = json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": {"name": content_name},
        "spec": {"deletionPolicy": "Delete", "driver": DRIVER,
                 "source": {"volumeHandle": source_id}, "sourceVolumeMode": "Filesystem",
                 "volumeSnapshotClassName": STORAGE_CLASS,
                 "volumeSnapshotRef": {"apiVersion": "snapshot.storage.k8s.io/v1",
                                       "kind": "VolumeSnapshot", "name": OLD_SNAPSHOT,
                                       "namespace": NS, "uid": vs_uid}},
    });
    match contents
        .create(
            &PostParams::default(),
            &serde_json::from_value(content).unwrap(),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating VolumeSnapshotContent {content_name}: {e}"),
    }
    let lvs = Api::<LogicalVolume>::all(client.clone());
    let name = format!("snapshot-{vs_uid}");
    let lv = create(
        &lvs,
        json!({
            "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
            "metadata": {"name": name, "finalizers": [LOGICAL_VOLUME_FINALIZER],
                         "labels": {"app.kubernetes.io/created-by": "topolvm-controller"}},
            "spec": {"name": name, "nodeName": node, "size": "1Gi", "deviceClass": CLASS,
                     "source": source, "accessType": "ro"},
        }),
    )
    .await;
    let id = lv.uid().unwrap();
    vm.ok(&format!(
        "lvm lvcreate -q -y -s -k n -n {id} {CLASS}/{source_id} >/dev/null && \
         lvm lvchange -q -p r {CLASS}/{id}"
    ))
    .await;
    lvs.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"volumeID": id, "currentSize": "1Gi"}})),
    )
    .await
    .unwrap();
    let created_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        * 1_000_000_000;
    contents
        .patch_status(
            &content_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"snapshotHandle": id, "readyToUse": true,
                                            "restoreSize": GIB, "creationTime": created_ns}})),
        )
        .await
        .unwrap();
    eventually(
        "the snapshot controller binds LVMS's VolumeSnapshot, ready",
        SLOW,
        || {
            let snapshots = snapshots.clone();
            async move {
                let s = snapshots
                    .get(OLD_SNAPSHOT)
                    .await
                    .map_err(|e| e.to_string())?;
                (s.data["status"]["readyToUse"] == true)
                    .then_some(())
                    .ok_or_else(|| s.data["status"].to_string())
            }
        },
    )
    .await;
    id
}

/// The LVs of `vg` as `name → (size in bytes, pool, tags)`.
async fn lv_table(vm: &Vm) -> BTreeMap<String, (u64, String, String)> {
    let out = vm
        .ok(&format!(
            "lvm lvs --noheadings --units b --nosuffix --separator '|' \
             -o lv_name,lv_size,pool_lv,lv_tags {CLASS} 2>/dev/null"
        ))
        .await;
    out.lines()
        .filter_map(|l| {
            let mut f = l.trim().split('|');
            let name = f.next()?.to_owned();
            let size = f.next()?.parse().ok()?;
            Some((name, (size, f.next()?.to_owned(), f.next()?.to_owned())))
        })
        .collect()
}

fn claim(name: &str, size: &str, source: Option<Value>) -> Value {
    let mut spec = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": STORAGE_CLASS,
                          "resources": {"requests": {"storage": size}}});
    if let Some(source) = source {
        spec["dataSource"] = source;
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

async fn bound(pvcs: &Api<PersistentVolumeClaim>, name: &str) -> String {
    eventually(&format!("claim {name} is Bound"), SLOW, || async move {
        let c = pvcs.get(name).await.map_err(|e| e.to_string())?;
        match (
            c.status.and_then(|s| s.phase).as_deref(),
            c.spec.and_then(|s| s.volume_name),
        ) {
            (Some("Bound"), Some(pv)) => Ok(pv),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

#[tokio::test]
#[ignore = "step 2 of the takeover: run by `cargo xtask installed` after it installs lvms-rs"]
async fn an_lvms_install_is_taken_over_in_place() {
    const TEST: &str = "an_lvms_install_is_taken_over_in_place";
    if !support::enabled(TEST) {
        return;
    }
    let Some(env) = env() else {
        eprintln!("{TEST}: skipped (run by `cargo xtask installed`)");
        return;
    };
    let started = Instant::now();
    let second = env
        .node2
        .as_ref()
        .expect("the second node (LVMS_E2E_NODE2)");
    let (node, vm) = (second.node.as_str(), &second.vm);
    let client = support::client().await;
    let state = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(STATE)
        .await
        .unwrap_or_else(|e| {
            panic!("ConfigMap {NS}/{STATE}: {e} (step 1, `lvms_left_this_cluster`, did not run)")
        })
        .data
        .unwrap_or_default();
    let id = state["volumeID"].clone();

    // The LVMCluster LVMS left becomes Ready under lvms-rs, on the same volume group and pool.
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), INSTALL_NS);
    support::wait_cluster_ready(&clusters, CLUSTER, SLOW).await;
    println!(
        "installed-takeover: LVMS's LVMCluster Ready {} s after kubectl apply",
        since_apply(&env)
    );
    node_pod_ready(&client, &env.install_image, node).await;
    assert_eq!(
        lvm_field(vm, &format!("vgs --noheadings -o vg_uuid {CLASS}")).await,
        state["vgUUID"],
        "the volume group LVMS made is kept"
    );
    assert_eq!(
        lvm_field(vm, &format!("lvs --noheadings -o lv_uuid {CLASS}/{POOL}")).await,
        state["poolUUID"],
        "the thin pool LVMS made is kept"
    );
    // The CSIDriver LVMS made lacked the Ephemeral mode, an immutable field: it was replaced.
    let driver = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .unwrap();
    assert_eq!(
        driver.spec.volume_lifecycle_modes,
        Some(vec!["Persistent".to_owned(), "Ephemeral".to_owned()]),
        "{driver:?}"
    );

    // Not while LVMS's node plugin still answers on its socket.
    consistently(
        "the old volume is left alone while the old plugin listens",
        std::time::Duration::from_secs(20),
        || async {
            let tags = lv_table(vm).await.get(&id).map(|t| t.2.clone());
            match tags.as_deref() {
                Some("") => Ok(()),
                other => Err(format!("LV {id} tags: {other:?}")),
            }
        },
    )
    .await;
    vm.ok(&format!("kill $(cat {OLD_PID})")).await;
    let gone = Instant::now();
    eventually("the old volume is taken over", SLOW, || async {
        let tags = lv_table(vm).await.get(&id).map(|t| t.2.clone());
        match tags.as_deref() {
            Some(t) if t.split(',').any(|t| t == "lvms") => Ok(()),
            other => Err(format!("LV {id} tags: {other:?}")),
        }
    })
    .await;
    println!(
        "installed-takeover: every old volume taken over {:.0} s after the old plugin stopped \
         ({} s after kubectl apply)",
        gone.elapsed().as_secs_f64(),
        since_apply(&env)
    );
    let lvs = Api::<LogicalVolume>::all(client.clone());
    let old = lvs.get(&state["pv"]).await.unwrap();
    assert_eq!(
        old.status.unwrap_or_default().volume_id,
        id,
        "status.volumeID kept"
    );

    // A Pod reads what LVMS's volume held; the claim grows under it.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS);
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    let run = |name: &str, script: &str, claim: &str| {
        pod(name, &env.image, script, json!({"claim": claim}), node)
    };
    pods.create(
        &PostParams::default(),
        &run(
            "old-reader",
            "cat /data/file; while :; do df -kP /data | tail -n 1; sleep 3; done",
            OLD_CLAIM,
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, "old-reader").await;
    let read = wait_log(&pods, "old-reader", "the old file", |l| {
        l.starts_with("lvms-wrote-").then(|| l.to_owned())
    })
    .await;
    assert_eq!(read, state["token"], "the file LVMS's volume held");
    pvcs.patch(
        OLD_CLAIM,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    )
    .await
    .unwrap();
    let df_kib = |l: &str| -> Option<u64> { l.split_whitespace().nth(1)?.parse().ok() };
    let grown = wait_log(&pods, "old-reader", "the old volume grew", |l| {
        df_kib(l).filter(|k| *k > 1_800_000)
    })
    .await;
    println!("installed-takeover: the old volume's filesystem grew to {grown} KiB in its Pod");
    delete_pod(&pods, "old-reader").await;

    // A snapshot of it restores; a new claim is made beside it.
    let snapshots = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        NS,
        &stack::resource(&client, "snapshot.storage.k8s.io", "v1", "VolumeSnapshot").await,
    );
    snapshots
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "metadata": {"name": "old-snap", "namespace": NS},
                "spec": {"volumeSnapshotClassName": STORAGE_CLASS,
                         "source": {"persistentVolumeClaimName": OLD_CLAIM}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually("the snapshot of the old volume is ReadyToUse", SLOW, || {
        let snapshots = snapshots.clone();
        async move {
            let s = snapshots.get("old-snap").await.map_err(|e| e.to_string())?;
            (s.data["status"]["readyToUse"] == true)
                .then_some(())
                .ok_or_else(|| s.data["status"].to_string())
        }
    })
    .await;
    let pvc = |v: Value| -> PersistentVolumeClaim { serde_json::from_value(v).unwrap() };
    let from_snapshot = json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot",
                               "name": "old-snap"});
    pvcs.create(
        &PostParams::default(),
        &pvc(claim("restored", "2Gi", Some(from_snapshot))),
    )
    .await
    .unwrap();
    // And so does the snapshot LVMS made before the switch.
    let from_old_snapshot = json!({"apiGroup": "snapshot.storage.k8s.io",
                                   "kind": "VolumeSnapshot", "name": OLD_SNAPSHOT});
    pvcs.create(
        &PostParams::default(),
        &pvc(claim("restored-lvms-snap", "1Gi", Some(from_old_snapshot))),
    )
    .await
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc(claim("new-data", "1Gi", None)))
        .await
        .unwrap();
    for (reader, claim) in [
        ("restored-reader", "restored"),
        ("lvms-snap-reader", "restored-lvms-snap"),
    ] {
        pods.create(
            &PostParams::default(),
            &run(reader, "cat /data/file; sleep 3600", claim),
        )
        .await
        .unwrap();
    }
    pods.create(
        &PostParams::default(),
        &run(
            "new-writer",
            "echo new > /data/f && echo \"wrote $(cat /data/f)\"; sleep 3600",
            "new-data",
        ),
    )
    .await
    .unwrap();
    let read = wait_log(&pods, "restored-reader", "the restored file", |l| {
        l.starts_with("lvms-wrote-").then(|| l.to_owned())
    })
    .await;
    assert_eq!(
        read, state["token"],
        "the restored snapshot of the old volume"
    );
    let read = wait_log(
        &pods,
        "lvms-snap-reader",
        "the file in LVMS's snapshot",
        |l| l.starts_with("lvms-wrote-").then(|| l.to_owned()),
    )
    .await;
    assert_eq!(read, state["token"], "the snapshot LVMS made, restored");
    let snapshot_lv = lv_table(vm).await.get(&state["snapshotID"]).cloned();
    assert!(
        snapshot_lv
            .as_ref()
            .is_some_and(|t| t.2.split(',').any(|t| t == "lvms")),
        "LVMS's snapshot LV {} was taken over in place: {snapshot_lv:?}",
        state["snapshotID"]
    );
    wait_log(&pods, "new-writer", "the new volume was written", |l| {
        (l == "wrote new").then_some(())
    })
    .await;
    let new_pv = bound(&pvcs, "new-data").await;
    let new_id = Api::<PersistentVolume>::all(client.clone())
        .get(&new_pv)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.csi)
        .unwrap()
        .volume_handle;
    assert!(
        new_id.starts_with("csi-"),
        "a volume lvms-rs made: {new_id}"
    );

    // Capacity counts the old volume with the new ones: the class's capacity on the Node is
    // `10 × pool − Σ the pool's thin volumes`, read from LVM in the same pass.
    eventually("the Node's capacity counts every volume", SLOW, || async {
        let table = lv_table(vm).await;
        let pool = table.get(POOL).map(|t| t.0).ok_or("no pool")?;
        let used: u64 = table
            .iter()
            .filter(|(_, t)| t.1 == POOL)
            .map(|(_, t)| t.0)
            .sum();
        let want = (10 * pool).saturating_sub(used);
        let n = Api::<Node>::all(client.clone())
            .get(node)
            .await
            .map_err(|e| e.to_string())?;
        let got = n.annotations().get("capacity.topolvm.io/vg1").cloned();
        (got.as_deref() == Some(want.to_string().as_str()) && table.contains_key(&id))
            .then_some(())
            .ok_or_else(|| format!("annotation {got:?}, want {want} from {table:?}"))
    })
    .await;

    // The way back: every LogicalVolume of the class names, by `status.volumeID`, a thin volume of
    // the class's pool in the volume group `spec.deviceClass` names, which is how TopoLVM's node
    // finds a volume (topolvm `internal/driver/node.go`, `internal/lvmd/vgservice.go` GetLVList).
    let table = lv_table(vm).await;
    let ours: Vec<LogicalVolume> = lvs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|lv| lv.spec.node_name == node && lv.spec.device_class == CLASS)
        .collect();
    assert_eq!(
        ours.len(),
        6,
        "old, LVMS's snapshot and its restore, snapshot, restored, new: {ours:?}"
    );
    for lv in &ours {
        let status = lv.status.clone().unwrap_or_default();
        assert_eq!(lv.spec.device_class, CLASS, "{}", lv.name_any());
        let entry = table.get(&status.volume_id);
        assert_eq!(
            entry.map(|t| t.1.as_str()),
            Some(POOL),
            "{}: volumeID {} in {table:?}",
            lv.name_any(),
            status.volume_id
        );
    }

    // Deleting the claims deletes every volume, the old one too; deleting the LVMCluster then
    // releases LVMS's finalizers and leaves the disk as lvms-rs leaves its own.
    for p in ["restored-reader", "lvms-snap-reader", "new-writer"] {
        delete_pod(&pods, p).await;
    }
    Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the class's LogicalVolumes are gone", SLOW, || async {
        let left: Vec<String> = lvs
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .filter(|lv| lv.spec.node_name == node && lv.spec.device_class == CLASS)
            .map(ResourceExt::name_any)
            .collect();
        left.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{left:?}"))
    })
    .await;
    let table = lv_table(vm).await;
    assert!(!table.contains_key(&id), "the old LV is removed: {table:?}");
    assert!(
        !table.contains_key(&state["snapshotID"]),
        "LVMS's snapshot LV is removed with its VolumeSnapshot: {table:?}"
    );
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    support::wait_cluster_gone(&clusters, CLUSTER, SLOW).await;
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), INSTALL_NS);
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), INSTALL_NS);
    eventually(
        "LVMS's LVMVolumeGroup and node status are gone",
        SLOW,
        || async {
            let vg = vgs.get_opt(CLASS).await.map_err(|e| e.to_string())?;
            let st = statuses.get_opt(node).await.map_err(|e| e.to_string())?;
            (vg.is_none() && st.is_none())
                .then_some(())
                .ok_or_else(|| format!("{vg:?} {st:?}"))
        },
    )
    .await;
    group_removed(vm, CLASS, &second.device).await;
    println!(
        "installed-takeover: scenario done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
