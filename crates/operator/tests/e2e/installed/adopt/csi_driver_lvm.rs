//! csi-driver-lvm's PersistentVolumes served in place under its driver name (issue 34, ADR 0033),
//! in the two steps `cargo xtask installed` runs around `kubectl apply`:
//!
//! 1. [`left_this_cluster`], before lvms-rs is installed, builds on the second node's second disk
//!    what a metal-stack csi-driver-lvm install leaves once `helm uninstall` removed its DaemonSet,
//!    CSIDriver and StorageClasses, exactly as its sources make it (ADR 0033's table): the volume
//!    group `csi-lvm` tagged `vg.metal-stack.io/csi-lvm-driver`, one volume (the LV named after its
//!    PersistentVolume, tagged `lv.metal-stack.io/csi-lvm-driver`, ext4 holding a file), the
//!    PersistentVolume its node-deployed external-provisioner wrote and the claim bound to it, and
//!    the Node's `topology.lvm.csi/node` label. A stand-in listens on csi-driver-lvm's node plugin
//!    socket (`plugins/csi-driver-lvm/csi.sock`): its DaemonSet still runs there.
//! 2. [`a_volume_is_served_in_place_under_its_name`], after the install (and after LVMS's takeover
//!    test removed its `LVMCluster`), creates the `LVMCluster` a csi-driver-lvm user writes (the
//!    class named like the group, `adopt: csi-driver-lvm`, csi-driver-lvm's StorageClass names) and
//!    checks: the node registers `lvm.csi.metal-stack.io`; nothing is taken over while the stand-in
//!    listens; then a Pod reads the old file through lvms-rs, the claim grows under it, a new claim
//!    on `csi-driver-lvm-linear` gets an lvms-rs volume in the same group, deleting the old claim
//!    removes its LV, and deleting the `LVMCluster` removes csi-driver-lvm's CSIDriver lvms-rs made.
//!    The same `LVMCluster` holds the class of a plain TopoLVM install taken over on the node's
//!    third disk (`adopt: topolvm`, [`super::topolvm`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::{CSIDriver, CSINode},
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use lvms_api::LVMCluster;
use serde_json::json;

use super::{
    bind, claim_being_provisioned, create, group_removed, lvm_field, old_plugin_listens, step_one,
    topolvm,
};
use crate::{
    installed::{
        INSTALL_NS, SLOW, delete_pod, env, node_pod_ready, pod, since_apply, wait_log, wait_running,
    },
    stack::Vm,
    support::{self, consistently, eventually},
};

/// csi-driver-lvm's defaults: its volume group (`lvm.vgName`), driver name, topology key, node
/// plugin socket (`kubeletPath`/plugins/`storageClassStub`/csi.sock) and linear StorageClass.
const VG: &str = "csi-lvm";
const DRIVER: &str = "lvm.csi.metal-stack.io";
const TOPOLOGY_KEY: &str = "topology.lvm.csi/node";
const OLD_SOCKET: &str = "/var/lib/kubelet/plugins/csi-driver-lvm/csi.sock";
const LINEAR: &str = "csi-driver-lvm-linear";
const OLD_PID: &str = "/run/csi-driver-lvm-takeover.pid";
const NS: &str = "csi-lvm-takeover";
const OLD_CLAIM: &str = "old-data";
const STATE: &str = "csi-driver-lvm-left";
const CLUSTER: &str = "csi-lvm-cluster";
const GIB: u64 = 1 << 30;

#[tokio::test]
#[ignore = "step 1 of csi-driver-lvm's takeover: run by `cargo xtask installed` before it installs lvms-rs"]
async fn left_this_cluster() {
    let Some((second, client)) = step_one("left_this_cluster", NS).await else {
        return;
    };
    let device = second
        .csi_lvm_device
        .clone()
        .expect("node 2's second disk (LVMS_E2E_CSI_LVM_DEVICE)");
    let (node, vm) = (second.node.as_str(), &second.vm);

    // The volume group as csi-driver-lvm's CreateVG makes it (pkg/lvm/lvm.go).
    let kname = vm
        .ok(&format!("readlink -f {device}"))
        .await
        .trim()
        .to_owned();
    vm.ok(&format!(
        "lvm vgcreate {VG} {kname} --addtag vg.metal-stack.io/csi-lvm-driver"
    ))
    .await;

    // One claim, provisioned as csi-driver-lvm does it: CreateVolume named `pvc-<claim uid>` by
    // external-provisioner, that name as the LV's and as the volume id (pkg/server/controller.go),
    // formatted ext4 at its first publish (MountLV's default), the PersistentVolume
    // external-provisioner wrote from the response, and the claim bound to it.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS);
    let claim = create(
        &pvcs,
        claim_being_provisioned(DRIVER, (NS, OLD_CLAIM), LINEAR, node),
    )
    .await;
    let uid = claim.metadata.uid.clone().unwrap();
    let pv = format!("pvc-{uid}");
    let token = format!("csi-driver-lvm-wrote-{}", support::suffix());
    vm.ok(&format!(
        "set -e; lvm lvcreate -v --yes -n {pv} -W y -L {GIB}b \
           --addtag lv.metal-stack.io/csi-lvm-driver {VG} >/dev/null 2>&1; \
         mkfs.ext4 -q -F /dev/{VG}/{pv}; mkdir -p /run/csi-lvm-takeover; \
         mount /dev/{VG}/{pv} /run/csi-lvm-takeover; echo {token} > /run/csi-lvm-takeover/file; \
         umount /run/csi-lvm-takeover"
    ))
    .await;
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv,
                         "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER,
                             "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                             "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
                         "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]},
            "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                     "persistentVolumeReclaimPolicy": "Delete", "storageClassName": LINEAR,
                     "volumeMode": "Filesystem",
                     "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                  "namespace": NS, "name": OLD_CLAIM, "uid": uid},
                     "csi": {"driver": DRIVER, "volumeHandle": pv,
                             "volumeAttributes": {"type": "linear",
                                 "RequiredBytes": GIB.to_string(),
                                 "storage.kubernetes.io/csiProvisionerIdentity":
                                     format!("1764979200000-4242-{DRIVER}")}},
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                         "key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}}},
        }),
    )
    .await;
    // Kubelet labelled the Node with the topology csi-driver-lvm's NodeGetInfo answered.
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {TOPOLOGY_KEY: node}}})),
        )
        .await
        .unwrap();
    bind(&pvcs, OLD_CLAIM, &pv).await;

    // csi-driver-lvm's DaemonSet still runs on the node: something answers on its socket.
    old_plugin_listens(vm, OLD_SOCKET, OLD_PID).await;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE, "namespace": NS},
            "data": {"token": token, "pv": pv},
        }),
    )
    .await;
    println!("installed-csi-driver-lvm: csi-driver-lvm's state built on {node}: volume {VG}/{pv}");
}

/// The tags of LV `lv` in csi-driver-lvm's group (`None`: no such LV).
async fn tags(vm: &Vm, lv: &str) -> Option<Vec<String>> {
    let (code, out) = vm
        .sh(&format!(
            "lvm lvs --noheadings -o lv_tags {VG}/{lv} 2>/dev/null"
        ))
        .await;
    (code == 0).then(|| {
        out.trim()
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

#[tokio::test]
#[ignore = "step 2 of csi-driver-lvm's takeover: run by `cargo xtask installed` after it installs lvms-rs"]
async fn a_volume_is_served_in_place_under_its_name() {
    const TEST: &str = "a_volume_is_served_in_place_under_its_name";
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
    let device = second.csi_lvm_device.clone().unwrap();
    let topolvm_device = second
        .topolvm_device
        .clone()
        .expect("node 2's third disk (LVMS_E2E_TOPOLVM_DEVICE)");
    let (node, vm) = (second.node.as_str(), &second.vm);
    let client = support::client().await;
    let state = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(STATE)
        .await
        .unwrap_or_else(|e| {
            panic!("ConfigMap {NS}/{STATE}: {e} (step 1, `left_this_cluster`, did not run)")
        })
        .data
        .unwrap_or_default();
    let pv = state["pv"].clone();
    let vg_uuid = lvm_field(vm, &format!("vgs --noheadings -o vg_uuid {VG}")).await;
    let topolvm_vg_uuid = topolvm::rename_group(vm).await;

    // The LVMCluster a csi-driver-lvm user writes (docs/migration-from-csi-driver-lvm.md), with
    // the class a TopoLVM user writes beside it (docs/migration-from-lvms.md).
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), INSTALL_NS);
    let created = Instant::now();
    create(
        &clusters,
        json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
            "metadata": {"name": CLUSTER, "namespace": INSTALL_NS},
            "spec": {"storage": {"deviceClasses": [{
                "name": VG, "default": true, "adopt": "csi-driver-lvm",
                "csiDriverLVMStorageClasses": true,
                "deviceSelector": {"paths": [device]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]},
            }, topolvm::class(&topolvm_device, node)]}}
        }),
    )
    .await;
    support::wait_cluster_ready(&clusters, CLUSTER, SLOW).await;
    node_pod_ready(&client, &env.install_image, node).await;
    assert_eq!(
        lvm_field(vm, &format!("vgs --noheadings -o vg_uuid {VG}")).await,
        vg_uuid,
        "csi-driver-lvm's group is adopted, not made anew"
    );
    let driver = Api::<CSIDriver>::all(client.clone())
        .get(DRIVER)
        .await
        .unwrap();
    assert_eq!(driver.spec.attach_required, Some(false), "{driver:?}");
    // Kubelet registered the driver under csi-driver-lvm's name and topology key.
    eventually(
        "the node registers lvm.csi.metal-stack.io",
        SLOW,
        || async {
            let csinode = Api::<CSINode>::all(client.clone())
                .get(node)
                .await
                .map_err(|e| e.to_string())?;
            csinode
                .spec
                .drivers
                .iter()
                .find(|d| d.name == DRIVER)
                .filter(|d| d.topology_keys.as_deref() == Some(&[TOPOLOGY_KEY.to_owned()][..]))
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", csinode.spec.drivers))
        },
    )
    .await;
    println!(
        "installed-csi-driver-lvm: {DRIVER} registered on {node} {:.0} s after the LVMCluster was \
         created ({} s after kubectl apply)",
        created.elapsed().as_secs_f64(),
        since_apply(&env)
    );

    topolvm::served_in_place(&env, vm, node, &topolvm_vg_uuid).await;

    // A Pod on the old claim: not served while csi-driver-lvm's plugin answers.
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
    consistently(
        "the old volume is left alone while csi-driver-lvm's plugin listens",
        Duration::from_secs(20),
        || async {
            match tags(vm, &pv).await {
                Some(t) if !t.iter().any(|t| t == "lvms") => Ok(()),
                other => Err(format!("LV {pv} tags: {other:?}")),
            }
        },
    )
    .await;
    vm.ok(&format!("kill $(cat {OLD_PID})")).await;
    let gone = Instant::now();
    eventually("the old volume is taken over", SLOW, || async {
        match tags(vm, &pv).await {
            Some(t) if t.iter().any(|t| t == "lvms") => Ok(()),
            other => Err(format!("LV {pv} tags: {other:?}")),
        }
    })
    .await;
    wait_running(&pods, "old-reader").await;
    let read = wait_log(&pods, "old-reader", "the old file", |l| {
        l.starts_with("csi-driver-lvm-wrote-").then(|| l.to_owned())
    })
    .await;
    assert_eq!(
        read, state["token"],
        "the file csi-driver-lvm's volume held"
    );
    println!(
        "installed-csi-driver-lvm: the old volume taken over and read {:.0} s after the old \
         plugin stopped ({:.0} s after the LVMCluster was created)",
        gone.elapsed().as_secs_f64(),
        created.elapsed().as_secs_f64()
    );

    // The claim grows under the Pod: csi-resizer marks it, NodeExpandVolume grows LV and ext4.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NS);
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
    assert_eq!(
        lvm_field(
            vm,
            &format!("lvs --noheadings --units b --nosuffix -o lv_size {VG}/{pv}")
        )
        .await,
        (2 * GIB).to_string()
    );
    println!("installed-csi-driver-lvm: the old volume's ext4 grew to {grown} KiB in its Pod");

    // A new claim on csi-driver-lvm's StorageClass name is an lvms-rs volume in the same group.
    let new_claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "new-data", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": LINEAR,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &new_claim)
        .await
        .unwrap();
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
    wait_log(&pods, "new-writer", "the new volume was written", |l| {
        (l == "wrote new").then_some(())
    })
    .await;
    let new_pv = pvcs
        .get("new-data")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .unwrap();
    let csi = Api::<PersistentVolume>::all(client.clone())
        .get(&new_pv)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.csi)
        .unwrap();
    assert_eq!(csi.driver, lvms_api::DEFAULT_DRIVER_NAME);
    assert!(
        tags(vm, &csi.volume_handle).await.is_some(),
        "the new volume {} is in {VG}",
        csi.volume_handle
    );

    // Deleting the old claim deletes its LV (DeleteVolume through the node's provisioner).
    for p in ["old-reader", "new-writer"] {
        delete_pod(&pods, p).await;
    }
    pvcs.delete(OLD_CLAIM, &DeleteParams::default())
        .await
        .unwrap();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    eventually("the old volume and its LV are gone", SLOW, || async {
        let left = pvs.get_opt(&pv).await.map_err(|e| e.to_string())?;
        match (left, tags(vm, &pv).await) {
            (None, None) => Ok(()),
            (pv, lv) => Err(format!(
                "PersistentVolume {:?}, LV tags {lv:?}",
                pv.map(|p| p.status)
            )),
        }
    })
    .await;
    Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the new volume's LV is gone", SLOW, || async {
        match tags(vm, &csi.volume_handle).await {
            None => Ok(()),
            Some(t) => Err(format!("{t:?}")),
        }
    })
    .await;

    // Deleting the LVMCluster removes the CSIDriver it made and the (now empty) group.
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    support::wait_cluster_gone(&clusters, CLUSTER, SLOW).await;
    eventually(
        "csi-driver-lvm's CSIDriver lvms-rs made is gone",
        SLOW,
        || async {
            match Api::<CSIDriver>::all(client.clone())
                .get_opt(DRIVER)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(d) => Err(format!("{:?}", d.metadata.labels)),
            }
        },
    )
    .await;
    group_removed(vm, VG, &device).await;
    group_removed(vm, topolvm::CLASS, &topolvm_device).await;
    println!(
        "installed-csi-driver-lvm: scenario done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
