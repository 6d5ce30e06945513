//! A plain TopoLVM install taken over with `adopt: topolvm` (issue 34, ADR 0032,
//! `docs/migration-from-lvms.md` "From TopoLVM"), on node 2's third disk:
//!
//! 1. [`left_this_cluster`], before lvms-rs is installed, builds what TopoLVM's Helm chart with its
//!    default values leaves once its release's objects (but the CRDs) are deleted: lvmd's device
//!    class `ssd` on the volume group `myvg1` the user made (untagged: lvmd never tags a group),
//!    thick, and one volume as TopoLVM provisions it from the chart's StorageClass
//!    `topolvm-provisioner` with `topolvm.io/device-class: ssd` (`deviceClass: ssd`: this cluster
//!    also holds what LVMS left, whose default class would take `""`), as
//!    [`Provisioned::by_topolvm`] builds it, its LV thick (`lvcreate -n <uid> -L <bytes>b -W y -y
//!    myvg1`).
//! 2. The csi-driver-lvm scenario's `LVMCluster` (`csi_driver_lvm::a_volume_is_served_in_place_under_its_name`)
//!    also holds this class: before it is created, [`rename_group`] renames the group after the
//!    class as the guide says; once it is Ready, [`served_in_place`] checks that the group was
//!    adopted (same UUID, our tag added), that a Pod reads the old file through lvms-rs, and that
//!    deleting the claim removes the volume; after the `LVMCluster` is deleted, the group is gone
//!    from the disk as lvms-rs removes its own.

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::{
    Api,
    api::{DeleteParams, PostParams},
};
use serde_json::{Value, json};

use super::{Provisioned, create, lvm_field, step_one};
use crate::{
    installed::{Env, SLOW, delete_pod, pod, wait_log, wait_running},
    stack::Vm,
    support::{self, eventually},
};

/// TopoLVM's chart defaults (`charts/topolvm/values.yaml`): lvmd's device class and its group,
/// and the StorageClass.
pub(super) const CLASS: &str = "ssd";
const LVMD_VG: &str = "myvg1";
const STORAGE_CLASS: &str = "topolvm-provisioner";
const NS: &str = "topolvm-takeover";
const OLD_CLAIM: &str = "old-data";
const STATE: &str = "topolvm-left";
const GIB: u64 = 1 << 30;

#[tokio::test]
#[ignore = "step 1 of TopoLVM's takeover: run by `cargo xtask installed` before it installs lvms-rs"]
async fn left_this_cluster() {
    let Some((second, client)) = step_one("left_this_cluster", NS).await else {
        return;
    };
    let device = second
        .topolvm_device
        .clone()
        .expect("node 2's third disk (LVMS_E2E_TOPOLVM_DEVICE)");
    let (node, vm) = (second.node.as_str(), &second.vm);
    // The group a TopoLVM user makes for lvmd (TopoLVM's docs/getting-started: `vgcreate`).
    vm.ok(&format!(
        "lvm vgcreate {LVMD_VG} $(readlink -f {device}) >/dev/null"
    ))
    .await;

    // One claim as TopoLVM provisions it from its chart's StorageClass, thick
    // (internal/lvmd/command/lvm.go VolumeGroup.CreateVolume).
    let token = format!("topolvm-wrote-{}", support::suffix());
    let id = Provisioned::by_topolvm(
        &client,
        (vm, node, LVMD_VG),
        (NS, OLD_CLAIM, STORAGE_CLASS, CLASS),
        |id| format!("lvm lvcreate -n {id} -L {GIB}b -W y -y {LVMD_VG}"),
        &token,
    )
    .await
    .id;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), NS),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE, "namespace": NS},
            "data": {"token": token, "volumeID": id},
        }),
    )
    .await;
    println!("installed-topolvm: TopoLVM's state built on {node}: volume {LVMD_VG}/{id}");
}

/// The guide's step for a class whose lvmd group has another name: `vgrename myvg1 ssd` on the
/// node. Returns the group's UUID.
pub(super) async fn rename_group(vm: &Vm) -> String {
    vm.ok(&format!("lvm vgrename {LVMD_VG} {CLASS} >/dev/null"))
        .await;
    lvm_field(vm, &format!("vgs --noheadings -o vg_uuid {CLASS}")).await
}

/// The class a TopoLVM user writes from lvmd's configuration: named like the (renamed) group,
/// thick.
pub(super) fn class(device: &str, node: &str) -> Value {
    json!({
        "name": CLASS, "adopt": "topolvm",
        "deviceSelector": {"paths": [device]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{
            "key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]},
    })
}

/// The tags of the LV `lv` of the class's group (`None`: no such LV).
async fn lv_tags(vm: &Vm, lv: &str) -> Option<String> {
    let (code, out) = vm
        .sh(&format!(
            "lvm lvs --noheadings -o lv_tags {CLASS}/{lv} 2>/dev/null"
        ))
        .await;
    (code == 0).then(|| out.trim().to_owned())
}

/// With the class Ready: the group adopted in place, the old volume read in a Pod, then deleted
/// with its claim.
pub(super) async fn served_in_place(env: &Env, vm: &Vm, node: &str, vg_uuid: &str) {
    let client = support::client().await;
    let state = Api::<ConfigMap>::namespaced(client.clone(), NS)
        .get(STATE)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "ConfigMap {NS}/{STATE}: {e} (step 1, `topolvm::left_this_cluster`, did not run)"
            )
        })
        .data
        .unwrap_or_default();
    let id = state["volumeID"].clone();
    let vg = lvm_field(vm, &format!("vgs --noheadings -o vg_uuid,vg_tags {CLASS}")).await;
    assert_eq!(
        vg.split_whitespace().collect::<Vec<_>>(),
        [vg_uuid, "lvms"],
        "lvmd's group is adopted in place, only our tag added"
    );
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod(
            "old-reader",
            &env.image,
            "cat /data/file; sleep 3600",
            json!({"claim": OLD_CLAIM}),
            node,
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, "old-reader").await;
    let read = wait_log(&pods, "old-reader", "the old file", |l| {
        l.starts_with("topolvm-wrote-").then(|| l.to_owned())
    })
    .await;
    assert_eq!(read, state["token"], "the file TopoLVM's volume held");
    let tags = lv_tags(vm, &id).await.unwrap_or_default();
    assert!(
        tags.split(',').any(|t| t == "lvms"),
        "TopoLVM's LV {id} taken over: tags {tags:?}"
    );
    println!("installed-topolvm: TopoLVM's volume {id} read through lvms-rs in class {CLASS}");

    delete_pod(&pods, "old-reader").await;
    Api::<Namespace>::all(client.clone())
        .delete(NS, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "TopoLVM's volume is deleted with its claim",
        SLOW,
        || async {
            match lv_tags(vm, &id).await {
                None => Ok(()),
                Some(t) => Err(format!("LV {id} still there, tags {t:?}")),
            }
        },
    )
    .await;
}
