use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use lvms_api::{DeviceClass, LVMClusterSpec, LVMVolumeGroupSpec, Storage};

use super::*;

fn cluster(deleting: bool, finalizers: &[&str]) -> LVMCluster {
    let mut c = LVMCluster::new(
        "my-lvmcluster",
        LVMClusterSpec {
            tolerations: Vec::new(),
            storage: Storage {
                device_classes: ["vg1", "vg2"]
                    .into_iter()
                    .map(|name| DeviceClass {
                        name: name.into(),
                        ..DeviceClass::default()
                    })
                    .collect(),
            },
        },
    );
    c.metadata.finalizers =
        (!finalizers.is_empty()).then(|| finalizers.iter().map(|f| (*f).to_owned()).collect());
    if deleting {
        c.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    }
    c
}

fn deleting() -> LVMCluster {
    cluster(true, &[LVMCLUSTER_FINALIZER])
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

// ---------------------------------------------------------------------------------------------
// cluster_deletion
// ---------------------------------------------------------------------------------------------

#[test]
fn a_live_cluster_without_the_finalizer_gets_it() {
    assert_eq!(
        cluster_deletion(&cluster(false, &[]), 0, 0, &[]),
        DeletionPlan::AddFinalizer
    );
    assert_eq!(
        cluster_deletion(&cluster(false, &["someone.else/x"]), 5, 0, &[]),
        DeletionPlan::AddFinalizer
    );
}

#[test]
fn a_live_cluster_with_the_finalizer_needs_nothing() {
    assert_eq!(
        cluster_deletion(
            &cluster(false, &[LVMCLUSTER_FINALIZER]),
            3,
            1,
            &strings(&["n1"])
        ),
        DeletionPlan::Nothing
    );
}

#[test]
fn a_deleted_cluster_without_our_finalizer_needs_nothing() {
    assert_eq!(
        cluster_deletion(&cluster(true, &["someone.else/x"]), 3, 0, &[]),
        DeletionPlan::Nothing
    );
}

#[test]
fn pvcs_using_our_storage_classes_block_deletion() {
    assert_eq!(
        cluster_deletion(&deleting(), 2, 0, &[]),
        DeletionPlan::Block {
            reason: "deleting LVMCluster my-lvmcluster waits: 2 PersistentVolumeClaims still use \
                     the StorageClasses lvms-vg1, lvms-vg2: delete them (and the pods using them) first"
                .into()
        }
    );
    let DeletionPlan::Block { reason } = cluster_deletion(&deleting(), 1, 0, &[]) else {
        panic!("not blocked");
    };
    assert!(
        reason.contains("1 PersistentVolumeClaim still uses the StorageClasses lvms-vg1, lvms-vg2: delete it (and the pods using it)"),
        "{reason}"
    );
}

#[test]
fn retained_pvs_block_deletion() {
    assert_eq!(
        cluster_deletion(&deleting(), 0, 1, &[]),
        DeletionPlan::Block {
            reason: "deleting LVMCluster my-lvmcluster waits: 1 PersistentVolume with reclaim \
                     policy Retain remains, and its data is in the volume groups: delete it once \
                     the data is no longer needed"
                .into()
        }
    );
}

#[test]
fn pvcs_and_retained_pvs_are_both_named() {
    let DeletionPlan::Block { reason } = cluster_deletion(&deleting(), 3, 4, &[]) else {
        panic!("not blocked");
    };
    assert!(reason.contains("3 PersistentVolumeClaims"), "{reason}");
    assert!(
        reason.contains("4 PersistentVolumes with reclaim policy Retain remain, and their data is"),
        "{reason}"
    );
}

#[test]
fn storage_in_use_blocks_before_any_node_cleanup_starts() {
    // Node cleanup wipes volume groups: it must not even start while data is in use.
    assert!(matches!(
        cluster_deletion(
            &deleting(),
            1,
            0,
            &strings(&["cleanup.vgmanager.node.topolvm.io/n1"])
        ),
        DeletionPlan::Block { .. }
    ));
}

#[test]
fn pending_node_finalizers_mean_waiting_for_node_cleanup() {
    let plan = cluster_deletion(
        &deleting(),
        0,
        0,
        &strings(&[
            "cleanup.vgmanager.node.topolvm.io/worker-2",
            "cleanup.vgmanager.node.topolvm.io/worker-1",
            "cleanup.vgmanager.node.topolvm.io/worker-2",
            "worker-3",
        ]),
    );
    let DeletionPlan::WaitForNodeCleanup { nodes, reason } = plan else {
        panic!("expected to wait, got {plan:?}");
    };
    assert_eq!(nodes, ["worker-1", "worker-2", "worker-3"]);
    assert!(
        reason.contains("vg-manager pods on nodes worker-1, worker-2, worker-3"),
        "{reason}"
    );
    assert!(reason.contains("node-removal controller"), "{reason}");
}

#[test]
fn one_pending_node_is_named_in_the_singular() {
    let DeletionPlan::WaitForNodeCleanup { reason, .. } = cluster_deletion(
        &deleting(),
        0,
        0,
        &strings(&["cleanup.vgmanager.node.topolvm.io/n1"]),
    ) else {
        panic!("expected to wait");
    };
    assert!(reason.contains("on node n1 to remove"), "{reason}");
}

#[test]
fn nothing_left_removes_the_finalizer() {
    assert_eq!(
        cluster_deletion(&deleting(), 0, 0, &[]),
        DeletionPlan::RemoveFinalizer
    );
    // Neither a bare prefix nor an empty entry names a node.
    assert_eq!(
        cluster_deletion(
            &deleting(),
            0,
            0,
            &strings(&["cleanup.vgmanager.node.topolvm.io/", ""])
        ),
        DeletionPlan::RemoveFinalizer
    );
}

// ---------------------------------------------------------------------------------------------
// node_removal
// ---------------------------------------------------------------------------------------------

fn volume_group(name: &str, finalizers: &[&str]) -> LVMVolumeGroup {
    LVMVolumeGroup {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("openshift-lvm-storage".into()),
            finalizers: Some(strings(finalizers)),
            ..ObjectMeta::default()
        },
        spec: LVMVolumeGroupSpec::default(),
        status: None,
    }
}

fn key(name: &str) -> ObjectKey {
    ObjectKey {
        namespace: Some("openshift-lvm-storage".into()),
        name: name.into(),
    }
}

fn existing(nodes: &[&str]) -> BTreeSet<String> {
    nodes.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn a_gone_node_loses_its_status_and_its_finalizers() {
    let vgs = [
        volume_group(
            "vg2",
            &[
                "cleanup.vgmanager.node.topolvm.io/gone",
                "cleanup.vgmanager.node.topolvm.io/alive",
            ],
        ),
        volume_group("vg1", &["cleanup.vgmanager.node.topolvm.io/gone"]),
    ];
    assert_eq!(
        node_removal(&existing(&["alive"]), &strings(&["alive", "gone"]), &vgs),
        vec![NodeCleanup {
            node: "gone".into(),
            delete_node_status: true,
            volume_groups: vec![key("vg1"), key("vg2")],
            finalizer: "cleanup.vgmanager.node.topolvm.io/gone".into(),
        }]
    );
}

#[test]
fn existing_nodes_are_never_touched() {
    let vgs = [volume_group(
        "vg1",
        &[
            "cleanup.vgmanager.node.topolvm.io/a",
            "cleanup.vgmanager.node.topolvm.io/b",
        ],
    )];
    assert!(node_removal(&existing(&["a", "b"]), &strings(&["a", "b"]), &vgs).is_empty());
}

#[test]
fn status_only_and_finalizer_only_nodes_are_cleaned_separately_and_sorted() {
    let vgs = [volume_group(
        "vg1",
        &[
            "cleanup.vgmanager.node.topolvm.io/z-finalizer-only",
            LVMCLUSTER_FINALIZER,
        ],
    )];
    let cleanups = node_removal(&existing(&[]), &strings(&["a-status-only"]), &vgs);
    assert_eq!(
        cleanups,
        vec![
            NodeCleanup {
                node: "a-status-only".into(),
                delete_node_status: true,
                volume_groups: vec![],
                finalizer: "cleanup.vgmanager.node.topolvm.io/a-status-only".into(),
            },
            NodeCleanup {
                node: "z-finalizer-only".into(),
                delete_node_status: false,
                volume_groups: vec![key("vg1")],
                finalizer: "cleanup.vgmanager.node.topolvm.io/z-finalizer-only".into(),
            },
        ]
    );
}

#[test]
fn other_finalizers_are_ignored_and_duplicates_collapse() {
    let vgs = [volume_group(
        "vg1",
        &[
            "kubernetes.io/something",
            "cleanup.vgmanager.node.topolvm.io/",
            "cleanup.vgmanager.node.topolvm.io/gone",
            "cleanup.vgmanager.node.topolvm.io/gone",
        ],
    )];
    let cleanups = node_removal(&existing(&["alive"]), &[], &vgs);
    assert_eq!(cleanups.len(), 1);
    assert_eq!(cleanups[0].volume_groups, [key("vg1")]);
    assert!(!cleanups[0].delete_node_status);
}

#[test]
fn nothing_to_clean_gives_nothing() {
    assert!(node_removal(&existing(&["a"]), &[], &[]).is_empty());
    assert!(node_removal(&existing(&[]), &strings(&[""]), &[]).is_empty());
}
