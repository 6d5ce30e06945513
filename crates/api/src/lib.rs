//! Kubernetes API of lvms-rs: the custom resources and the names (finalizers, labels, annotations,
//! parameter keys) that the operator, the node agent and the CSI driver share.
//!
//! The types follow OpenShift LVMS (`lvm.topolvm.io/v1alpha1`) and TopoLVM (`topolvm.io/v1`) field for
//! field, so manifests written for LVMS deserialise unchanged and objects written by us are read by the
//! same tools. CRDs are generated from these types ([`crd`]); `deploy/crds/` holds the checked-in copies.
//!
//! Pure data: serde, schemars and kube's derive only; no client, no async. [`selector`] holds
//! Kubernetes' node selection rules, which the operator and the node agent both apply.
#![forbid(unsafe_code)]

pub mod crd;
pub mod lvm;
pub mod selector;
pub mod topolvm;

pub use lvm::*;
pub use topolvm::{LogicalVolume, LogicalVolumeSpec, LogicalVolumeStatus};

/// API group of `LVMCluster`, `LVMVolumeGroup` and `LVMVolumeGroupNodeStatus`.
pub const LVM_GROUP: &str = "lvm.topolvm.io";
/// API version of the [`LVM_GROUP`] kinds (a historical name: the API is treated as stable).
pub const LVM_VERSION: &str = "v1alpha1";
/// API group of `LogicalVolume` (TopoLVM's controller-to-node contract).
pub const TOPOLVM_GROUP: &str = "topolvm.io";
/// API version of `LogicalVolume`.
pub const TOPOLVM_VERSION: &str = "v1";

// ---------------------------------------------------------------------------------------------
// Finalizers
// ---------------------------------------------------------------------------------------------

/// On the `LVMCluster`: held while PVCs use our StorageClasses or Retain-policy PVs of ours remain.
pub const LVMCLUSTER_FINALIZER: &str = "lvmcluster.topolvm.io";
/// Prefix of the per-node cleanup finalizer the node agent puts on each `LVMVolumeGroup`; the node
/// name follows. Only the node agent of that node (or the node-removal controller, for a node that
/// no longer exists) removes it.
pub const NODE_CLEANUP_FINALIZER_PREFIX: &str = "cleanup.vgmanager.node.topolvm.io/";
/// On each `LVMVolumeGroupNodeStatus`: keeps it while its node still cleans up.
pub const NODE_STATUS_FINALIZER: &str = "delete-protection.lvm.openshift.io";
/// On each `LogicalVolume`: the node agent removes it once the LV is gone from disk.
pub const LOGICAL_VOLUME_FINALIZER: &str = "topolvm.io/logicalvolume";
/// TopoLVM's finalizer on `Node` objects (cleans up PVCs of a deleted node).
pub const NODE_FINALIZER: &str = "topolvm.io/node";

/// The per-node cleanup finalizer of `node` (`cleanup.vgmanager.node.topolvm.io/<node>`).
pub fn node_cleanup_finalizer(node: &str) -> String {
    format!("{NODE_CLEANUP_FINALIZER_PREFIX}{node}")
}

/// The node a per-node cleanup finalizer belongs to, or `None` for any other finalizer.
pub fn node_of_cleanup_finalizer(finalizer: &str) -> Option<&str> {
    finalizer
        .strip_prefix(NODE_CLEANUP_FINALIZER_PREFIX)
        .filter(|node| !node.is_empty())
}

// ---------------------------------------------------------------------------------------------
// Capacity
// ---------------------------------------------------------------------------------------------

/// Where the class `class` of a node sits among the `capacity.<driver>/…` annotations when it is
/// the node's default class (TopoLVM's name).
pub const DEFAULT_CLASS_CAPACITY_KEY: &str = "00default";

/// The Node annotation in which the node agent publishes the bytes a new volume of device class
/// `class` may take on that node (TopoLVM's `capacity.<driver>/<class>`; the default class is also
/// published under [`DEFAULT_CLASS_CAPACITY_KEY`]). The CSI controller answers `GetCapacity` from it.
pub fn capacity_annotation(driver: &str, class: &str) -> String {
    format!("capacity.{driver}/{class}")
}

/// The Node annotation in which the node agent publishes, for each thick device class, what its
/// volume group has free on each LVM physical volume (lvms-rs's own, beside TopoLVM's
/// [`capacity_annotation`]): a JSON object from class name to `{"extentSize": <bytes>,
/// "freeExtents": [<largest first>]}`. The CSI controller computes the capacity of striped,
/// mirror and RAID layouts from it.
pub fn free_space_annotation(driver: &str) -> String {
    format!("lvms.{driver}/free-space")
}

/// The Node annotation in which the node agent publishes where it serves the SnapshotMetadata
/// service (`host:port`, mutual TLS); the CSI controller forwards changed-block requests there
/// (ADR 0039).
pub fn snapshot_metadata_annotation(driver: &str) -> String {
    format!("lvms.{driver}/snapshot-metadata")
}

/// The name the CSI controller checks in a node agent's changed-block tracking certificate (one of
/// its DNS names).
pub const SNAPSHOT_METADATA_SERVER_NAME: &str = "lvms-snapshot-metadata-node";

// ---------------------------------------------------------------------------------------------
// Labels
// ---------------------------------------------------------------------------------------------

/// `app.kubernetes.io/name`.
pub const LABEL_APP_NAME: &str = "app.kubernetes.io/name";
/// `app.kubernetes.io/component`.
pub const LABEL_APP_COMPONENT: &str = "app.kubernetes.io/component";
/// `app.kubernetes.io/part-of`.
pub const LABEL_APP_PART_OF: &str = "app.kubernetes.io/part-of";
/// `app.kubernetes.io/managed-by`.
pub const LABEL_APP_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// Prefix (without the slash) of the labels that record which object owns a cluster-scoped or
/// cross-namespace object, since owner references cannot.
pub const OWNED_BY_PREFIX: &str = "owned-by.topolvm.io";
/// Owner's name.
pub const LABEL_OWNED_BY_NAME: &str = "owned-by.topolvm.io/name";
/// Owner's namespace.
pub const LABEL_OWNED_BY_NAMESPACE: &str = "owned-by.topolvm.io/namespace";
/// Owner's UID.
pub const LABEL_OWNED_BY_UID: &str = "owned-by.topolvm.io/uid";
/// Owner's API group.
pub const LABEL_OWNED_BY_GROUP: &str = "owned-by.topolvm.io/group";
/// Owner's API version.
pub const LABEL_OWNED_BY_VERSION: &str = "owned-by.topolvm.io/version";
/// Owner's kind.
pub const LABEL_OWNED_BY_KIND: &str = "owned-by.topolvm.io/kind";

/// Label keys `storageClassOptions.additionalLabels` may not set (besides any key under
/// [`OWNED_BY_PREFIX`]`/`): the operator owns them.
pub const RESERVED_STORAGE_CLASS_LABELS: [&str; 4] = [
    LABEL_APP_MANAGED_BY,
    LABEL_APP_PART_OF,
    LABEL_APP_NAME,
    LABEL_APP_COMPONENT,
];

/// Whether `key` is a label key the operator owns on the StorageClasses it renders.
pub fn is_reserved_storage_class_label(key: &str) -> bool {
    RESERVED_STORAGE_CLASS_LABELS.contains(&key)
        || key
            .strip_prefix(OWNED_BY_PREFIX)
            .is_some_and(|rest| rest.starts_with('/'))
}

// ---------------------------------------------------------------------------------------------
// Annotations
// ---------------------------------------------------------------------------------------------

/// Marks the cluster's default StorageClass.
pub const DEFAULT_STORAGE_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// Marks the default VolumeSnapshotClass of a driver.
pub const DEFAULT_SNAPSHOT_CLASS_ANNOTATION: &str =
    "snapshot.storage.kubernetes.io/is-default-class";
/// Free-text description annotation LVMS puts on its StorageClasses.
pub const DESCRIPTION_ANNOTATION: &str = "description";
/// Prefix of the node annotations TopoLVM publishes free capacity under, one per device class
/// (`capacity.topolvm.io/<class>`).
pub const CAPACITY_ANNOTATION_PREFIX: &str = "capacity.topolvm.io/";
/// PVC annotation TopoLVM sets when a resize was requested.
pub const RESIZE_REQUESTED_AT_ANNOTATION: &str = "topolvm.io/resize-requested-at";
/// On a StatefulSet's pod or on one of its claims: `"true"` lets the operator's eviction controller
/// (`lvms operator --eviction-controller`) delete the claim when the pod is evicted from, or cannot be
/// scheduled because of, a node that is gone or cordoned, so the StatefulSet makes a new claim on
/// another node. The data on the old node is lost.
pub const EVICTION_ALLOWED_ANNOTATION: &str = "lvms.topolvm.io/is-eviction-allowed";
/// metal-stack csi-driver-lvm's name for [`EVICTION_ALLOWED_ANNOTATION`], accepted the same way.
pub const CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION: &str =
    "metal-stack.io/csi-driver-lvm.is-eviction-allowed";
/// Every annotation that opts a claim in to the eviction controller.
pub const EVICTION_ALLOWED_ANNOTATIONS: [&str; 2] = [
    EVICTION_ALLOWED_ANNOTATION,
    CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION,
];

// ---------------------------------------------------------------------------------------------
// CSI driver, topology and StorageClass parameters
// ---------------------------------------------------------------------------------------------

/// Default CSI driver name (the StorageClass provisioner), as in TopoLVM and LVMS.
pub const DEFAULT_DRIVER_NAME: &str = "topolvm.io";
/// Topology key the driver reports per node; PVs get node affinity on it.
pub const TOPOLOGY_NODE_KEY: &str = "topology.topolvm.io/node";
/// StorageClass parameter naming the device class a volume is carved from.
pub const DEVICE_CLASS_PARAMETER: &str = "topolvm.io/device-class";
/// StorageClass parameter naming an lvcreate option class (TopoLVM).
pub const LVCREATE_OPTION_CLASS_PARAMETER: &str = "topolvm.io/lvcreate-option-class";
/// Standard CSI StorageClass parameter for the filesystem type.
pub const FSTYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// StorageClass parameter of a shared class's StorageClass: the default volume mode of its
/// volumes, `linear` or `thin` (from `sharedConfig.volumeMode`, see
/// [`SharedVolumeMode::parameter_value`]).
pub const VOLUME_MODE_PARAMETER: &str = "lvms.topolvm.io/volume-mode";
/// StorageClass parameters `storageClassOptions.additionalParameters` may not set.
pub const RESERVED_STORAGE_CLASS_PARAMETERS: [&str; 3] = [
    DEVICE_CLASS_PARAMETER,
    FSTYPE_PARAMETER,
    VOLUME_MODE_PARAMETER,
];
/// Prefix of the CSI topology keys of shared classes (see [`shared_topology_key`]).
pub const SHARED_TOPOLOGY_PREFIX: &str = "shared.lvms.topolvm.io/";

/// The CSI topology key of the shared device class `class` (`shared.lvms.topolvm.io/<class>`),
/// with the value `"true"` on the nodes that joined its lockspace; PVs of the class get node
/// affinity on it. The class name is the key's name part, so a shared class's name has at most 63
/// characters.
pub fn shared_topology_key(class: &str) -> String {
    format!("{SHARED_TOPOLOGY_PREFIX}{class}")
}

// ---------------------------------------------------------------------------------------------
// sanlock host ids
// ---------------------------------------------------------------------------------------------

/// The ConfigMap, in the operator's namespace, that records each node's sanlock host id: data
/// `<node>: "<id>"`. Host ids are unique among the nodes of the cluster and kept while the node's
/// lease may still be alive.
pub const SANLOCK_HOST_IDS_CONFIGMAP: &str = "lvms-sanlock-host-ids";
/// Annotation on [`SANLOCK_HOST_IDS_CONFIGMAP`]: when each node whose Node object is gone, but
/// whose host id is still kept, was first seen gone, as a JSON object `{"<node>": "<RFC 3339>"}`
/// (one annotation rather than one per node: a key's name part holds at most 63 characters, a
/// node name up to 253). The id is released once sanlock counts the host dead (ADR 0017).
pub const SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION: &str = "lvms.topolvm.io/nodes-gone-since";
/// Smallest sanlock host id.
pub const MIN_SANLOCK_HOST_ID: i32 = 1;
/// Largest sanlock host id (sanlock's limit; a 4k-sector LUN with `sanlock_align_size=2` allows
/// only 500).
pub const MAX_SANLOCK_HOST_ID: i32 = 2000;

/// The Lease, in the operator's namespace, that picks the one node which runs `vgcreate --shared`
/// for the shared device class `class` (`lvms-shared-create-<class>`): the node agent that holds
/// it creates the volume group; the others wait for the group and then join.
pub fn shared_creator_lease_name(class: &str) -> String {
    format!("lvms-shared-create-{class}")
}

/// StorageClasses and VolumeSnapshotClasses are named `lvms-<device class>`.
pub const STORAGE_CLASS_PREFIX: &str = "lvms-";

/// Name of the StorageClass (and VolumeSnapshotClass) of a device class.
pub fn storage_class_name(device_class: &str) -> String {
    format!("{STORAGE_CLASS_PREFIX}{device_class}")
}

/// csi-driver-lvm's default `storageClassStub`: its StorageClasses are `<stub>-<type>`.
pub const CSI_DRIVER_LVM_STORAGE_CLASS_STUB: &str = "csi-driver-lvm";

/// csi-driver-lvm's StorageClass parameter naming a volume's layout.
pub const CSI_DRIVER_LVM_TYPE_PARAMETER: &str = "type";

/// csi-driver-lvm's layouts, one StorageClass each.
pub const CSI_DRIVER_LVM_TYPES: [&str; 3] = ["linear", "striped", "mirror"];

/// Name of csi-driver-lvm's StorageClass for layout `ty` (`csi-driver-lvm-linear`, ...), which a
/// device class with `csiDriverLVMStorageClasses: true` renders (ADR 0022).
pub fn csi_driver_lvm_storage_class_name(ty: &str) -> String {
    format!("{CSI_DRIVER_LVM_STORAGE_CLASS_STUB}-{ty}")
}

/// Field manager of the operator's server-side applies.
pub const OPERATOR_FIELD_MANAGER: &str = "lvms-operator";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_finalizer_round_trips_the_node_name() {
        let f = node_cleanup_finalizer("worker-1");
        assert_eq!(f, "cleanup.vgmanager.node.topolvm.io/worker-1");
        assert_eq!(node_of_cleanup_finalizer(&f), Some("worker-1"));
    }

    #[test]
    fn other_finalizers_have_no_node() {
        assert_eq!(node_of_cleanup_finalizer(LVMCLUSTER_FINALIZER), None);
        assert_eq!(
            node_of_cleanup_finalizer(NODE_CLEANUP_FINALIZER_PREFIX),
            None
        );
    }

    #[test]
    fn reserved_labels_cover_app_keys_and_owned_by_prefix() {
        for key in RESERVED_STORAGE_CLASS_LABELS {
            assert!(is_reserved_storage_class_label(key), "{key}");
        }
        assert!(is_reserved_storage_class_label(LABEL_OWNED_BY_UID));
        assert!(is_reserved_storage_class_label(
            "owned-by.topolvm.io/anything"
        ));
        assert!(!is_reserved_storage_class_label(
            "owned-by.topolvm.iox/name"
        ));
        assert!(!is_reserved_storage_class_label("team"));
        assert!(!is_reserved_storage_class_label(
            "app.kubernetes.io/instance"
        ));
    }

    #[test]
    fn shared_topology_key_names_the_class() {
        assert_eq!(shared_topology_key("san"), "shared.lvms.topolvm.io/san");
        assert!(shared_topology_key("san").starts_with(SHARED_TOPOLOGY_PREFIX));
    }

    #[test]
    fn volume_mode_parameter_is_reserved() {
        assert!(RESERVED_STORAGE_CLASS_PARAMETERS.contains(&VOLUME_MODE_PARAMETER));
    }

    #[test]
    fn storage_class_is_named_after_the_device_class() {
        assert_eq!(storage_class_name("vg1"), "lvms-vg1");
    }
}
