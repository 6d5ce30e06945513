//! The objects an `LVMCluster` stands for, rendered from its spec.
//!
//! [`render`] returns the complete desired state; the reconciler server-side applies every object
//! (field manager [`OPERATOR_FIELD_MANAGER`]) and deletes what it rendered before but no longer does.
//! Every object carries the `app.kubernetes.io/*` labels. Namespaced objects (`LVMVolumeGroup`s, the
//! `DaemonSet`) live in the operator's namespace, which must be the cluster's, and have a controller
//! owner reference to the `LVMCluster`. Cluster-scoped objects (`StorageClass`, `VolumeSnapshotClass`,
//! `CSIDriver`) cannot have a namespaced owner: they carry the `owned-by.topolvm.io/*` labels instead,
//! as LVMS does, so the operator can find and delete them.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, DaemonSetSpec},
        core::v1::{
            Affinity, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
            HostPathVolumeSource, NodeAffinity, NodeSelector, NodeSelectorTerm,
            ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
            SecurityContext, Volume, VolumeMount,
        },
        storage::v1::{CSIDriver, CSIDriverSpec, StorageClass},
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use lvms_api::{
    AdoptFrom, CSI_DRIVER_LVM_TYPE_PARAMETER, CSI_DRIVER_LVM_TYPES, DEFAULT_DRIVER_NAME,
    DEFAULT_SNAPSHOT_CLASS_ANNOTATION, DEFAULT_STORAGE_CLASS_ANNOTATION, DESCRIPTION_ANNOTATION,
    DEVICE_CLASS_PARAMETER, DeviceClass, FSTYPE_PARAMETER, LABEL_APP_COMPONENT,
    LABEL_APP_MANAGED_BY, LABEL_APP_NAME, LABEL_APP_PART_OF, LABEL_OWNED_BY_GROUP,
    LABEL_OWNED_BY_KIND, LABEL_OWNED_BY_NAME, LABEL_OWNED_BY_NAMESPACE, LABEL_OWNED_BY_UID,
    LABEL_OWNED_BY_VERSION, LVM_GROUP, LVM_VERSION, LVMCluster, LVMVolumeGroup, LVMVolumeGroupSpec,
    OPERATOR_FIELD_MANAGER, StorageClassOptions, VOLUME_MODE_PARAMETER,
    csi_driver_lvm_storage_class_name, is_reserved_storage_class_label, storage_class_name,
};
use lvms_core::{config::CSI_DRIVER_LVM_DRIVER_NAME, webhook::is_dns1123_subdomain};
use serde::{Deserialize, Serialize, Serializer};

// ---------------------------------------------------------------------------------------------
// Names and defaults
// ---------------------------------------------------------------------------------------------

/// Kind of the owner of everything rendered here.
pub const LVMCLUSTER_KIND: &str = "LVMCluster";
/// `app.kubernetes.io/managed-by` of every rendered object (LVMS's value).
pub const MANAGED_BY: &str = OPERATOR_FIELD_MANAGER;
/// `app.kubernetes.io/part-of` of every rendered object (LVMS's value).
pub const PART_OF: &str = "lvms-provisioner";
/// `app.kubernetes.io/name` of the rendered objects other than the node `DaemonSet`.
pub const APP_NAME: &str = "lvms";
/// Name of the node `DaemonSet`, of its service account and of its main container; also its
/// `app.kubernetes.io/name` and `component` (LVMS's values: a DaemonSet's selector is immutable, so
/// keeping them lets the operator take over a `vg-manager` DaemonSet LVMS created).
pub const NODE_DAEMON_SET: &str = "vg-manager";
/// Service account of the node `DaemonSet`'s pods.
pub const NODE_SERVICE_ACCOUNT: &str = "vg-manager";
/// `app.kubernetes.io/component` of `LVMVolumeGroup`s.
pub const COMPONENT_VOLUME_GROUP: &str = "volume-group";
/// `app.kubernetes.io/component` of `StorageClass`es.
pub const COMPONENT_STORAGE_CLASS: &str = "storage-class";
/// `app.kubernetes.io/component` of `VolumeSnapshotClass`es.
pub const COMPONENT_SNAPSHOT_CLASS: &str = "volume-snapshot-class";
/// `app.kubernetes.io/component` of the `CSIDriver`.
pub const COMPONENT_CSI_DRIVER: &str = "csi-driver";
/// The `description` annotation on rendered StorageClasses (LVMS's text).
pub const STORAGE_CLASS_DESCRIPTION: &str = "Provides RWO and RWOP Filesystem & Block volumes";

/// Default image of the `node-driver-registrar` sidecar.
pub const DEFAULT_NODE_DRIVER_REGISTRAR_IMAGE: &str =
    "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0";
/// Default image of the `csi-provisioner` sidecar the node pods run for csi-driver-lvm's volumes
/// (ADR 0033).
pub const DEFAULT_CSI_PROVISIONER_IMAGE: &str =
    "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0";
/// Default image of the `csi-resizer` sidecar the node pods run for csi-driver-lvm's volumes.
pub const DEFAULT_CSI_RESIZER_IMAGE: &str = "registry.k8s.io/sig-storage/csi-resizer:v2.2.1";
/// Where the socket directory of csi-driver-lvm's volumes is mounted in the node pod.
pub const CSI_DRIVER_LVM_SOCKET_DIR: &str = "/csi-driver-lvm";
/// csi-driver-lvm's Helm chart's default `storageClassStub`: its node plugin listens in
/// `<kubelet>/plugins/<stub>/csi.sock`.
pub const CSI_DRIVER_LVM_STUB: &str = lvms_api::CSI_DRIVER_LVM_STORAGE_CLASS_STUB;
/// Default image of the `livenessprobe` sidecar.
pub const DEFAULT_LIVENESSPROBE_IMAGE: &str = "registry.k8s.io/sig-storage/livenessprobe:v2.19.0";
/// Default kubelet root directory.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// Default priority class of the node pods: they hold node-local storage every consumer pod needs.
/// Where node agents install the fence hook of shared classes (ADR 0028).
pub const DEFAULT_FENCE_HOOK_DIR: &str = lvms_core::shared::hook::DEFAULT_DIR;
pub const DEFAULT_NODE_PRIORITY_CLASS: &str = "system-node-critical";

/// Where the CSI plugin directory is mounted in the node pod's containers.
pub const CSI_SOCKET_DIR: &str = "/csi";
/// File name of the node plugin's CSI socket inside the plugin directory.
pub const CSI_SOCKET_NAME: &str = "csi.sock";
/// Port of the node agent's `/metrics` (`lvms node --metrics-port`'s default).
pub const NODE_METRICS_PORT: i32 = 8081;
/// Port of the `livenessprobe` sidecar's `/healthz` (TopoLVM's).
pub const HEALTHZ_PORT: i32 = 9808;
/// Port of the `node-driver-registrar` sidecar's `/healthz` (TopoLVM's).
pub const REGISTRAR_HEALTHZ_PORT: i32 = 9809;

/// Environment variable giving the node agent its node's name (from `spec.nodeName`).
pub const ENV_NODE_NAME: &str = "NODE_NAME";
/// Environment variable giving the node agent its namespace (from `metadata.namespace`).
pub const ENV_NAMESPACE: &str = "NAMESPACE";
/// Environment variable giving the node agent the CSI endpoint to serve.
pub const ENV_CSI_ENDPOINT: &str = "CSI_ENDPOINT";
/// Environment variable giving the node agent the CSI driver name.
pub const ENV_CSI_DRIVER_NAME: &str = "CSI_DRIVER_NAME";
/// Where the node agent serves csi-driver-lvm's volumes (set only when a class adopts its group).
pub const ENV_CSI_DRIVER_LVM_ENDPOINT: &str = "LVMS_CSI_DRIVER_LVM_ENDPOINT";
/// csi-driver-lvm's own node plugin socket, which the node agent checks before taking over.
pub const ENV_CSI_DRIVER_LVM_OLD_SOCKET: &str = "LVMS_CSI_DRIVER_LVM_OLD_SOCKET";
/// The node agent's fence hook directory (empty: none), from [`RenderConfig::fence_hook_dir`].
pub const ENV_FENCE_HOOK_DIR: &str = "LVMS_FENCE_HOOK_DIR";
/// The node agent's changed-block tracking certificate directory (ADR 0039).
pub const ENV_SNAPSHOT_METADATA_CERT_DIR: &str = "LVMS_SNAPSHOT_METADATA_CERT_DIR";
/// The node pod's IP: where the CSI controller reaches its changed-block tracking.
pub const ENV_POD_IP: &str = "POD_IP";
/// Where the node agent mounts the changed-block tracking Secret.
pub const SNAPSHOT_METADATA_CERT_DIR: &str = "/etc/lvms/snapshot-metadata-cert";

/// API group of `VolumeSnapshotClass`.
pub const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
/// API version of `VolumeSnapshotClass`.
pub const SNAPSHOT_VERSION: &str = "v1";
/// `apiVersion` of `VolumeSnapshotClass`.
pub const SNAPSHOT_API_VERSION: &str = "snapshot.storage.k8s.io/v1";
/// Kind of `VolumeSnapshotClass`.
pub const SNAPSHOT_CLASS_KIND: &str = "VolumeSnapshotClass";
/// Plural of `VolumeSnapshotClass`.
pub const SNAPSHOT_CLASS_PLURAL: &str = "volumesnapshotclasses";

// ---------------------------------------------------------------------------------------------
// Input and output
// ---------------------------------------------------------------------------------------------

/// Operator configuration and the few observations of the cluster rendering depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderConfig {
    /// The operator's namespace; namespaced objects go here, and the `LVMCluster` must be in it.
    pub namespace: String,
    /// CSI driver name: the `CSIDriver`'s name and every StorageClass's provisioner
    /// (default [`DEFAULT_DRIVER_NAME`]).
    pub driver_name: String,
    /// Image of the node agent (`lvms`).
    pub image: String,
    /// Command of the node agent's container (default `["lvms", "node"]`).
    pub node_command: Vec<String>,
    /// Image of the `node-driver-registrar` sidecar; configurable for mirrors and air-gapped
    /// clusters (default [`DEFAULT_NODE_DRIVER_REGISTRAR_IMAGE`]).
    pub node_driver_registrar_image: String,
    /// Image of the `livenessprobe` sidecar; configurable (default [`DEFAULT_LIVENESSPROBE_IMAGE`]).
    pub livenessprobe_image: String,
    /// Images of the `csi-provisioner` and `csi-resizer` sidecars the node pods run when a class
    /// adopts csi-driver-lvm (defaults [`DEFAULT_CSI_PROVISIONER_IMAGE`],
    /// [`DEFAULT_CSI_RESIZER_IMAGE`]).
    pub csi_provisioner_image: String,
    pub csi_resizer_image: String,
    /// Kubelet root directory on the nodes (default [`DEFAULT_KUBELET_DIR`]; k0s and microk8s use
    /// others).
    pub kubelet_dir: String,
    /// Priority class of the node pods (default [`DEFAULT_NODE_PRIORITY_CLASS`]).
    pub priority_class_name: String,
    /// Observed: whether the cluster serves `snapshot.storage.k8s.io/v1` `VolumeSnapshotClass`.
    /// Without it no snapshot classes are rendered (and nothing fails).
    pub snapshot_api_available: bool,
    /// Observed: a StorageClass not rendered from this `LVMCluster` that is already the cluster's
    /// default. When set, the default device class's StorageClass is not annotated as default, so
    /// the cluster never has two defaults (LVMS does the same).
    pub existing_default_storage_class: Option<String>,
    /// The host directory where node agents install the fence hook of shared classes (ADR 0028;
    /// default [`DEFAULT_FENCE_HOOK_DIR`]); `None`: they install nothing and the admin does it by
    /// hand.
    pub fence_hook_dir: Option<String>,
    /// Changed-block tracking (ADR 0039): the Secret the node agents serve it with (mounted, its
    /// directory in `LVMS_SNAPSHOT_METADATA_CERT_DIR`, their address `POD_IP`); `None`: not
    /// served.
    pub snapshot_metadata_secret: Option<String>,
}

impl RenderConfig {
    /// The defaults, with the operator's namespace and the node agent's image.
    pub fn new(namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            driver_name: DEFAULT_DRIVER_NAME.to_owned(),
            image: image.into(),
            node_command: vec!["lvms".to_owned(), "node".to_owned()],
            node_driver_registrar_image: DEFAULT_NODE_DRIVER_REGISTRAR_IMAGE.to_owned(),
            livenessprobe_image: DEFAULT_LIVENESSPROBE_IMAGE.to_owned(),
            csi_provisioner_image: DEFAULT_CSI_PROVISIONER_IMAGE.to_owned(),
            csi_resizer_image: DEFAULT_CSI_RESIZER_IMAGE.to_owned(),
            kubelet_dir: DEFAULT_KUBELET_DIR.to_owned(),
            priority_class_name: DEFAULT_NODE_PRIORITY_CLASS.to_owned(),
            snapshot_api_available: false,
            existing_default_storage_class: None,
            fence_hook_dir: Some(DEFAULT_FENCE_HOOK_DIR.to_owned()),
            snapshot_metadata_secret: None,
        }
    }

    fn validate(&self) -> Result<(), RenderError> {
        let bad =
            |field: &'static str, problem: String| Err(RenderError::Config { field, problem });
        if self.namespace.is_empty() {
            return bad(
                "namespace",
                "is empty: set it to the namespace the operator runs in".into(),
            );
        }
        if !is_dns1123_subdomain(&self.driver_name) || self.driver_name.len() > 63 {
            return bad(
                "driver_name",
                format!(
                    "{:?} is not a CSI driver name: use at most 63 lowercase letters, digits, '-' and '.', \
                     starting and ending with a letter or digit (default {DEFAULT_DRIVER_NAME})",
                    self.driver_name
                ),
            );
        }
        for (field, image) in [
            ("image", &self.image),
            (
                "node_driver_registrar_image",
                &self.node_driver_registrar_image,
            ),
            ("livenessprobe_image", &self.livenessprobe_image),
            ("csi_provisioner_image", &self.csi_provisioner_image),
            ("csi_resizer_image", &self.csi_resizer_image),
        ] {
            if image.trim().is_empty() {
                return bad(field, "is empty: set the container image to run".into());
            }
        }
        if self.node_command.is_empty() {
            return bad(
                "node_command",
                "is empty: set the node agent's command, e.g. [\"lvms\", \"node\"]".into(),
            );
        }
        if !self.kubelet_dir.starts_with('/') || self.kubelet_dir.trim_end_matches('/').is_empty() {
            return bad(
                "kubelet_dir",
                format!(
                    "{:?} is not an absolute directory below /: use the kubelet's --root-dir \
                     (default {DEFAULT_KUBELET_DIR})",
                    self.kubelet_dir
                ),
            );
        }
        if let Some(dir) = &self.fence_hook_dir
            && !lvms_core::shared::hook::is_valid_dir(dir)
        {
            return bad(
                "fence_hook_dir",
                format!(
                    "{dir:?} is not an absolute directory without blanks: use \
                     {DEFAULT_FENCE_HOOK_DIR}, or leave it empty to install the fence hook by hand"
                ),
            );
        }
        if self.priority_class_name.is_empty() {
            return bad(
                "priority_class_name",
                format!("is empty: use {DEFAULT_NODE_PRIORITY_CLASS} or another priority class"),
            );
        }
        Ok(())
    }

    fn kubelet_dir(&self) -> &str {
        self.kubelet_dir.trim_end_matches('/')
    }

    /// Host directory of the node plugin's socket: `<kubelet>/plugins/<driver>/`.
    pub fn plugin_dir(&self) -> String {
        format!("{}/plugins/{}/", self.kubelet_dir(), self.driver_name)
    }

    /// Host directory kubelet watches for plugin registration sockets.
    pub fn registration_dir(&self) -> String {
        format!("{}/plugins_registry/", self.kubelet_dir())
    }

    /// Host directory of the socket serving csi-driver-lvm's volumes (ADR 0033).
    pub fn csi_driver_lvm_plugin_dir(&self) -> String {
        format!(
            "{}/plugins/{CSI_DRIVER_LVM_DRIVER_NAME}",
            self.kubelet_dir()
        )
    }

    /// Host path of csi-driver-lvm's own node plugin socket (its chart's default stub).
    pub fn csi_driver_lvm_old_socket(&self) -> String {
        format!(
            "{}/plugins/{CSI_DRIVER_LVM_STUB}/{CSI_SOCKET_NAME}",
            self.kubelet_dir()
        )
    }

    /// Host path of the node plugin's CSI socket, as kubelet must dial it.
    pub fn kubelet_registration_path(&self) -> String {
        format!("{}{CSI_SOCKET_NAME}", self.plugin_dir())
    }
}

/// Everything an `LVMCluster` stands for, in device-class order.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// One per device class, named after it.
    pub volume_groups: Vec<LVMVolumeGroup>,
    /// One per device class, `lvms-<class>`, each followed by csi-driver-lvm's three
    /// (`csi-driver-lvm-linear|striped|mirror`) for a class with `csiDriverLVMStorageClasses`.
    pub storage_classes: Vec<StorageClass>,
    /// One per thin device class, `lvms-<class>`; none without the snapshot API.
    pub snapshot_classes: Vec<VolumeSnapshotClass>,
    /// The CSI driver object.
    pub csi_driver: CSIDriver,
    /// csi-driver-lvm's, when a class adopts its group: its volumes are served under its name
    /// (ADR 0033).
    pub csi_driver_lvm: Option<CSIDriver>,
    /// The node agent (`vg-manager`).
    pub daemon_set: DaemonSet,
}

/// Why an `LVMCluster` cannot be rendered. Each message names the field and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// The cluster has no name.
    #[error(
        "the LVMCluster has no metadata.name: render the object as read from the API server, not a bare spec"
    )]
    MissingName,
    /// The cluster has no UID (owner references and owned-by labels need it).
    #[error(
        "LVMCluster {name} has no metadata.uid: owner references need it; render the object as read from the API server, not a manifest"
    )]
    MissingUid {
        /// Cluster name.
        name: String,
    },
    /// The cluster is not in the operator's namespace.
    #[error(
        "LVMCluster {name} is in namespace {found:?} but the operator runs in {expected:?}: owner references cannot cross namespaces; create the LVMCluster in {expected:?}"
    )]
    WrongNamespace {
        /// Cluster name.
        name: String,
        /// The cluster's namespace (`None`: unset).
        found: Option<String>,
        /// The operator's namespace.
        expected: String,
    },
    /// No device class at all.
    #[error("spec.storage.deviceClasses is empty: add at least one device class")]
    NoDeviceClasses,
    /// A device class name used twice.
    #[error(
        "spec.storage.deviceClasses[{index}].name {name:?} is used by an earlier device class too: give every device class its own name"
    )]
    DuplicateDeviceClass {
        /// Index of the second occurrence.
        index: usize,
        /// The name.
        name: String,
    },
    /// A device class without a name.
    #[error("spec.storage.deviceClasses[{index}].name is empty: name the device class")]
    UnnamedDeviceClass {
        /// Index of the class.
        index: usize,
    },
    /// A node selector without terms selects no node.
    #[error(
        "spec.storage.deviceClasses[{index}].nodeSelector (device class {name:?}) has no nodeSelectorTerms, so it selects no node: remove nodeSelector to use every node, or add a term"
    )]
    EmptyNodeSelector {
        /// Index of the class.
        index: usize,
        /// Name of the class.
        name: String,
    },
    /// A [`RenderConfig`] field is unusable.
    #[error("operator configuration {field} {problem}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// A `snapshot.storage.k8s.io/v1` `VolumeSnapshotClass` (k8s-openapi has no type for it: it is a
/// CRD of the external snapshotter). Serialises with its `apiVersion` and `kind`, and implements
/// k8s-openapi's `Resource` and `Metadata`, so a typed client can apply it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    /// Name and labels.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// CSI driver that takes the snapshots.
    pub driver: String,
    /// `Delete` or `Retain`: what happens to the snapshot content when the snapshot goes.
    pub deletion_policy: String,
    /// Driver parameters.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
}

impl Serialize for VolumeSnapshotClass {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            driver: &'a str,
            deletion_policy: &'a str,
            #[serde(skip_serializing_if = "BTreeMap::is_empty")]
            parameters: &'a BTreeMap<String, String>,
        }
        Wire {
            api_version: SNAPSHOT_API_VERSION,
            kind: SNAPSHOT_CLASS_KIND,
            metadata: &self.metadata,
            driver: &self.driver,
            deletion_policy: &self.deletion_policy,
            parameters: &self.parameters,
        }
        .serialize(serializer)
    }
}

impl k8s_openapi::Resource for VolumeSnapshotClass {
    const API_VERSION: &'static str = SNAPSHOT_API_VERSION;
    const GROUP: &'static str = SNAPSHOT_GROUP;
    const KIND: &'static str = SNAPSHOT_CLASS_KIND;
    const VERSION: &'static str = SNAPSHOT_VERSION;
    const URL_PATH_SEGMENT: &'static str = SNAPSHOT_CLASS_PLURAL;
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::ListableResource for VolumeSnapshotClass {
    const LIST_KIND: &'static str = "VolumeSnapshotClassList";
}

impl k8s_openapi::Metadata for VolumeSnapshotClass {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

// ---------------------------------------------------------------------------------------------
// Ownership
// ---------------------------------------------------------------------------------------------

/// The identity of a rendered object's owner, checked once.
struct Owner<'a> {
    name: &'a str,
    namespace: &'a str,
    uid: &'a str,
}

impl<'a> Owner<'a> {
    fn of(cluster: &'a LVMCluster, namespace: &str) -> Result<Self, RenderError> {
        let meta = &cluster.metadata;
        let name = meta
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(RenderError::MissingName)?;
        let uid = meta
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| RenderError::MissingUid { name: name.into() })?;
        match meta.namespace.as_deref() {
            Some(ns) if ns == namespace => Ok(Self {
                name,
                namespace: ns,
                uid,
            }),
            found => Err(RenderError::WrongNamespace {
                name: name.into(),
                found: found.map(str::to_owned),
                expected: namespace.into(),
            }),
        }
    }

    fn reference(&self) -> OwnerReference {
        OwnerReference {
            api_version: format!("{LVM_GROUP}/{LVM_VERSION}"),
            kind: LVMCLUSTER_KIND.into(),
            name: self.name.into(),
            uid: self.uid.into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_OWNED_BY_NAME.into(), self.name.into()),
            (LABEL_OWNED_BY_NAMESPACE.into(), self.namespace.into()),
            (LABEL_OWNED_BY_UID.into(), self.uid.into()),
            (LABEL_OWNED_BY_GROUP.into(), LVM_GROUP.into()),
            (LABEL_OWNED_BY_VERSION.into(), LVM_VERSION.into()),
            (LABEL_OWNED_BY_KIND.into(), LVMCLUSTER_KIND.into()),
        ])
    }

    /// Metadata of a namespaced object: operator namespace, owner reference, `labels`.
    fn namespaced_meta(&self, name: String, labels: BTreeMap<String, String>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.into()),
            labels: Some(labels),
            owner_references: Some(vec![self.reference()]),
            ..ObjectMeta::default()
        }
    }

    /// Metadata of a cluster-scoped object: `labels` plus the owned-by labels.
    fn cluster_meta(&self, name: String, mut labels: BTreeMap<String, String>) -> ObjectMeta {
        labels.extend(self.labels());
        ObjectMeta {
            name: Some(name),
            labels: Some(labels),
            ..ObjectMeta::default()
        }
    }
}

/// The controller owner reference every namespaced object rendered from `cluster` carries.
pub fn owner_reference(
    cluster: &LVMCluster,
    cfg: &RenderConfig,
) -> Result<OwnerReference, RenderError> {
    Ok(Owner::of(cluster, &cfg.namespace)?.reference())
}

/// The `owned-by.topolvm.io/*` labels every cluster-scoped object rendered from `cluster` carries;
/// the reconciler lists StorageClasses and VolumeSnapshotClasses with them to find stale ones.
pub fn owned_by_labels(
    cluster: &LVMCluster,
    cfg: &RenderConfig,
) -> Result<BTreeMap<String, String>, RenderError> {
    Ok(Owner::of(cluster, &cfg.namespace)?.labels())
}

/// The `app.kubernetes.io/*` labels.
pub fn app_labels(name: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_APP_NAME.into(), name.into()),
        (LABEL_APP_COMPONENT.into(), component.into()),
        (LABEL_APP_PART_OF.into(), PART_OF.into()),
        (LABEL_APP_MANAGED_BY.into(), MANAGED_BY.into()),
    ])
}

// ---------------------------------------------------------------------------------------------
// render
// ---------------------------------------------------------------------------------------------

/// Renders every object `cluster` stands for. Pure: the same cluster and config give the same
/// objects, so applying them is idempotent.
pub fn render(cluster: &LVMCluster, cfg: &RenderConfig) -> Result<Rendered, RenderError> {
    cfg.validate()?;
    let owner = Owner::of(cluster, &cfg.namespace)?;
    let classes = &cluster.spec.storage.device_classes;
    check_device_classes(classes)?;

    let volume_groups = classes
        .iter()
        .map(|class| volume_group(&owner, class))
        .collect();
    let storage_classes = classes
        .iter()
        .flat_map(|class| {
            let own = storage_class(&owner, cfg, class);
            let compat = if class.csi_driver_lvm_storage_classes {
                csi_driver_lvm_storage_classes(&own)
            } else {
                Vec::new()
            };
            std::iter::once(own).chain(compat)
        })
        .collect();
    let snapshot_classes = if cfg.snapshot_api_available {
        classes
            .iter()
            .filter(|class| class.thin_pool_config.is_some())
            .map(|class| snapshot_class(&owner, cfg, class))
            .collect()
    } else {
        Vec::new()
    };
    Ok(Rendered {
        volume_groups,
        storage_classes,
        snapshot_classes,
        csi_driver: csi_driver(&owner, cfg),
        csi_driver_lvm: adopts_csi_driver_lvm(classes).then(|| csi_driver_lvm(&owner)),
        daemon_set: daemon_set(&owner, cfg, cluster),
    })
}

fn check_device_classes(classes: &[DeviceClass]) -> Result<(), RenderError> {
    if classes.is_empty() {
        return Err(RenderError::NoDeviceClasses);
    }
    let mut seen = BTreeSet::new();
    for (index, class) in classes.iter().enumerate() {
        if class.name.is_empty() {
            return Err(RenderError::UnnamedDeviceClass { index });
        }
        if !seen.insert(class.name.as_str()) {
            return Err(RenderError::DuplicateDeviceClass {
                index,
                name: class.name.clone(),
            });
        }
        if class
            .node_selector
            .as_ref()
            .is_some_and(|s| s.node_selector_terms.is_empty())
        {
            return Err(RenderError::EmptyNodeSelector {
                index,
                name: class.name.clone(),
            });
        }
    }
    Ok(())
}

fn volume_group(owner: &Owner<'_>, class: &DeviceClass) -> LVMVolumeGroup {
    LVMVolumeGroup {
        metadata: owner.namespaced_meta(
            class.name.clone(),
            app_labels(APP_NAME, COMPONENT_VOLUME_GROUP),
        ),
        spec: LVMVolumeGroupSpec {
            device_discovery_policy: class.device_discovery_policy,
            device_selector: class.device_selector.clone(),
            node_selector: class.node_selector.clone(),
            thin_pool_config: class.thin_pool_config.clone(),
            raid_config: class.raid_config.clone(),
            default: class.default,
            device_access_policy: class.device_access_policy,
            shared_config: class.shared_config.clone(),
            adopt: class.adopt,
        },
        status: None,
    }
}

fn storage_class(owner: &Owner<'_>, cfg: &RenderConfig, class: &DeviceClass) -> StorageClass {
    let options = class.storage_class_options.clone().unwrap_or_default();
    let StorageClassOptions {
        additional_parameters,
        additional_labels,
        ..
    } = &options;

    // The user's extras first, then ours: a reserved key (which the webhook rejects anyway) can
    // never override what the driver and the operator rely on.
    let mut labels: BTreeMap<String, String> = additional_labels
        .iter()
        .filter(|(key, _)| !is_reserved_storage_class_label(key))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.extend(app_labels(APP_NAME, COMPONENT_STORAGE_CLASS));
    let mut parameters = additional_parameters.clone();
    parameters.insert(DEVICE_CLASS_PARAMETER.into(), class.name.clone());
    parameters.insert(
        FSTYPE_PARAMETER.into(),
        class.fstype_or_default().as_str().into(),
    );
    if class.is_shared() {
        parameters.insert(
            VOLUME_MODE_PARAMETER.into(),
            class
                .shared_config_or_default()
                .volume_mode_or_default()
                .parameter_value()
                .into(),
        );
    }

    let mut annotations = BTreeMap::from([(
        DESCRIPTION_ANNOTATION.to_owned(),
        STORAGE_CLASS_DESCRIPTION.to_owned(),
    )]);
    if class.default && cfg.existing_default_storage_class.is_none() {
        annotations.insert(DEFAULT_STORAGE_CLASS_ANNOTATION.into(), "true".into());
    }
    let mut metadata = owner.cluster_meta(storage_class_name(&class.name), labels);
    metadata.annotations = Some(annotations);

    StorageClass {
        metadata,
        provisioner: cfg.driver_name.clone(),
        parameters: Some(parameters),
        reclaim_policy: Some(options.reclaim_policy_or_default().as_str().into()),
        volume_binding_mode: Some(options.volume_binding_mode_or_default().as_str().into()),
        allow_volume_expansion: Some(true),
        allowed_topologies: None,
        mount_options: None,
    }
}

/// csi-driver-lvm's three StorageClasses (ADR 0022): copies of a class's own StorageClass `own`
/// under csi-driver-lvm's names, with its `type` parameter. Never the cluster default: the class's
/// own StorageClass is the one `default: true` marks.
fn csi_driver_lvm_storage_classes(own: &StorageClass) -> Vec<StorageClass> {
    CSI_DRIVER_LVM_TYPES
        .iter()
        .map(|ty| {
            let mut sc = own.clone();
            sc.metadata.name = Some(csi_driver_lvm_storage_class_name(ty));
            if let Some(annotations) = &mut sc.metadata.annotations {
                annotations.remove(DEFAULT_STORAGE_CLASS_ANNOTATION);
            }
            sc.parameters
                .get_or_insert_with(BTreeMap::new)
                .insert(CSI_DRIVER_LVM_TYPE_PARAMETER.into(), (*ty).into());
            sc
        })
        .collect()
}

fn snapshot_class(
    owner: &Owner<'_>,
    cfg: &RenderConfig,
    class: &DeviceClass,
) -> VolumeSnapshotClass {
    let mut metadata = owner.cluster_meta(
        storage_class_name(&class.name),
        app_labels(APP_NAME, COMPONENT_SNAPSHOT_CLASS),
    );
    // The snapshot controller picks the driver's default class for a VolumeSnapshot that names
    // none; TopoLVM snapshot classes carry no parameters, so the default class's is as good as any.
    if class.default {
        metadata.annotations = Some(BTreeMap::from([(
            DEFAULT_SNAPSHOT_CLASS_ANNOTATION.to_owned(),
            "true".to_owned(),
        )]));
    }
    VolumeSnapshotClass {
        metadata,
        driver: cfg.driver_name.clone(),
        deletion_policy: "Delete".into(),
        parameters: BTreeMap::new(),
    }
}

fn csi_driver(owner: &Owner<'_>, cfg: &RenderConfig) -> CSIDriver {
    CSIDriver {
        metadata: owner.cluster_meta(
            cfg.driver_name.clone(),
            app_labels(APP_NAME, COMPONENT_CSI_DRIVER),
        ),
        spec: CSIDriverSpec {
            // No ControllerPublish: skip the attach round trip (TopoLVM, LVMS).
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            // CSIStorageCapacity objects steer the scheduler to nodes with room.
            storage_capacity: Some(true),
            // Ephemeral: CSI inline volumes in a pod spec, which csi-driver-lvm users rely on
            // (ADR 0021); the node makes the LV at NodePublishVolume.
            volume_lifecycle_modes: Some(vec!["Persistent".into(), "Ephemeral".into()]),
            // TopoLVM leaves the default, ReadWriteOnceWithFSType, under which kubelet applies a
            // pod's fsGroup only to ReadWriteOnce volumes, not ReadWriteOncePod ones. Our volumes
            // are node-local with one writer node, so applying it always is right.
            fs_group_policy: Some("File".into()),
            ..CSIDriverSpec::default()
        },
    }
}

/// Whether a class adopts csi-driver-lvm's group, so its volumes are served under its name.
pub fn adopts_csi_driver_lvm(classes: &[DeviceClass]) -> bool {
    classes
        .iter()
        .any(|c| c.adopt == Some(AdoptFrom::CsiDriverLvm))
}

/// The `CSIDriver` of csi-driver-lvm's volumes served by lvms-rs: csi-driver-lvm's own settings
/// (its chart's `templates/common.yaml`: no attach, pod info on mount) without what lvms-rs does
/// not offer under that name (inline volumes, capacity objects).
fn csi_driver_lvm(owner: &Owner<'_>) -> CSIDriver {
    CSIDriver {
        metadata: owner.cluster_meta(
            CSI_DRIVER_LVM_DRIVER_NAME.to_owned(),
            app_labels(APP_NAME, COMPONENT_CSI_DRIVER),
        ),
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            storage_capacity: Some(false),
            volume_lifecycle_modes: Some(vec!["Persistent".into()]),
            ..CSIDriverSpec::default()
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The node DaemonSet
// ---------------------------------------------------------------------------------------------

/// The node affinity of the node pods: the union of the device classes' node selectors, or `None`
/// (every node) if any class has none. Identical terms appear once, in first-seen order.
/// A selector without terms selects no node; [`render`] refuses such a class before it gets here.
pub fn node_selector_union(classes: &[DeviceClass]) -> Option<NodeSelector> {
    let mut terms: Vec<NodeSelectorTerm> = Vec::new();
    for class in classes {
        let selector = class.node_selector.as_ref()?;
        for term in &selector.node_selector_terms {
            if !terms.contains(term) {
                terms.push(term.clone());
            }
        }
    }
    (!terms.is_empty()).then_some(NodeSelector {
        node_selector_terms: terms,
    })
}

struct HostVolume {
    name: &'static str,
    host_path: String,
    type_: Option<&'static str>,
}

fn host_volumes(cfg: &RenderConfig, csi_driver_lvm: bool) -> Vec<HostVolume> {
    let v = |name, host_path: &str, type_| HostVolume {
        name,
        host_path: host_path.to_owned(),
        type_,
    };
    let mut volumes = vec![
        // kubelet creates it; a missing one means a wrong kubelet_dir, which should fail loudly.
        v(
            "registration-dir",
            &cfg.registration_dir(),
            Some("Directory"),
        ),
        v("plugin-dir", &cfg.plugin_dir(), Some("DirectoryOrCreate")),
        v("kubelet-dir", cfg.kubelet_dir(), Some("Directory")),
        v("device-dir", "/dev", Some("Directory")),
        // lvm2's run and lock directories: shared with the host so lvm commands on the host and
        // in the pod see each other's locks.
        // `/run/lvm` also holds lvmlockd's socket (`lvmlockd.socket`), through which lvm and
        // lvmlockctl in the pod reach the host's lvmlockd for shared classes (ADR 0016).
        v("run-lvm", "/run/lvm", Some("DirectoryOrCreate")),
        v("run-lock-lvm", "/run/lock/lvm", Some("DirectoryOrCreate")),
        // The host's sanlock daemon's socket (`sanlock.sock`), for `sanlock client status` (shared
        // classes, ADR 0016). Created when absent so nodes without sanlock start the pod too;
        // sanlock makes its socket in the directory and leaves the directory when it stops (no
        // RuntimeDirectory= in its unit), so a daemon started or restarted later shows in the pod.
        v("run-sanlock", "/run/sanlock", Some("DirectoryOrCreate")),
        // wdmd's socket: whether the watchdog daemon runs, for the fencing check (ADR 0024).
        v("run-wdmd", "/run/wdmd", Some("DirectoryOrCreate")),
        // The fence hook's records (`fenced-<vg>`), which it writes on the host.
        v("run-lvms", "/run/lvms", Some("DirectoryOrCreate")),
        // The host's LVM configuration (filters, devices file) and its metadata backups and
        // archives: lvm in the pod behaves as lvm on the host (ADR 0010). The shared classes'
        // devices files (`/etc/lvm/devices/lvms-<class>.devices`) are in it.
        v("etc-lvm", "/etc/lvm", Some("DirectoryOrCreate")),
        // The udev database (lsblk, blkid, lvm's udev checks) and sysfs.
        v("run-udev", "/run/udev", None),
        v("sys", "/sys", None),
    ];
    // The fence hook's binary, at the same path as on the host: lvmlockctl runs it there
    // (ADR 0028).
    if let Some(dir) = &cfg.fence_hook_dir {
        volumes.push(v("fence-hook", dir, Some("DirectoryOrCreate")));
    }
    // The socket serving csi-driver-lvm's volumes (ADR 0033).
    if csi_driver_lvm {
        volumes.push(v(
            "csi-driver-lvm-plugin-dir",
            &cfg.csi_driver_lvm_plugin_dir(),
            Some("DirectoryOrCreate"),
        ));
    }
    volumes
}

fn mount(name: &str, path: &str, propagation: Option<&str>) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        mount_propagation: propagation.map(str::to_owned),
        ..VolumeMount::default()
    }
}

fn healthz_probe(port: &str) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String(port.into()),
            ..HTTPGetAction::default()
        }),
        failure_threshold: Some(3),
        initial_delay_seconds: Some(10),
        timeout_seconds: Some(3),
        period_seconds: Some(60),
        ..Probe::default()
    }
}

fn env_from_field(name: &str, field_path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: field_path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        value: None,
    }
}

fn env_value(name: &str, value: String) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value),
        value_from: None,
    }
}

/// Requests of `cpu` and `memory`, and a `memory_limit` (no CPU limit: throttling an agent mid-LVM
/// command helps nobody).
fn resources(cpu: &str, memory: &str, memory_limit: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(memory.to_owned())),
        ])),
        limits: Some(BTreeMap::from([(
            "memory".to_owned(),
            Quantity(memory_limit.to_owned()),
        )])),
        ..ResourceRequirements::default()
    }
}

/// The node agent's: 19.7 MiB resident with no volume and 34.9 MiB with 500 (release build, `cargo
/// xtask e2e --bench`; the installed test's debug build 45.3 MiB, 131.5 MiB at its peak in the
/// shared scenario, CI run 26), so 48Mi requested. Its LVM, mkfs and mount children count against
/// its limit: 256Mi leaves them room.
fn node_agent_resources() -> ResourceRequirements {
    resources("10m", "48Mi", "256Mi")
}

/// node-driver-registrar's and livenessprobe's: 18.4 to 19.6 MiB resident on the installed test's
/// nodes (CI run 26).
fn sidecar_resources() -> ResourceRequirements {
    resources("10m", "32Mi", "128Mi")
}

/// csi-driver-lvm's provisioner and resizer: as the operator pod's (`deploy/base/operator.yaml`),
/// 48.8 to 55.9 MiB resident there.
fn controller_sidecar_resources() -> ResourceRequirements {
    resources("10m", "64Mi", "256Mi")
}

fn daemon_set(owner: &Owner<'_>, cfg: &RenderConfig, cluster: &LVMCluster) -> DaemonSet {
    let labels = app_labels(NODE_DAEMON_SET, NODE_DAEMON_SET);
    let socket = format!("{CSI_SOCKET_DIR}/{CSI_SOCKET_NAME}");
    let adopts = adopts_csi_driver_lvm(&cluster.spec.storage.device_classes);

    let mut node = Container {
        name: NODE_DAEMON_SET.into(),
        image: Some(cfg.image.clone()),
        command: Some(cfg.node_command.clone()),
        env: Some(vec![
            env_from_field(ENV_NODE_NAME, "spec.nodeName"),
            env_from_field(ENV_NAMESPACE, "metadata.namespace"),
            env_value(ENV_CSI_ENDPOINT, format!("unix://{socket}")),
            env_value(ENV_CSI_DRIVER_NAME, cfg.driver_name.clone()),
            env_value(
                ENV_FENCE_HOOK_DIR,
                cfg.fence_hook_dir.clone().unwrap_or_default(),
            ),
        ]),
        // LVM and mounts need root and the host's devices; Bidirectional propagation (mounts made
        // here must reach kubelet) requires a privileged container.
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            ..SecurityContext::default()
        }),
        // Served by the livenessprobe sidecar, which checks the CSI socket (TopoLVM's layout).
        ports: Some(vec![
            ContainerPort {
                name: Some("healthz".into()),
                container_port: HEALTHZ_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            // `lvms node`'s /metrics (its garbage collector's numbers).
            ContainerPort {
                name: Some("metrics".into()),
                container_port: NODE_METRICS_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        liveness_probe: Some(healthz_probe("healthz")),
        resources: Some(node_agent_resources()),
        volume_mounts: Some(
            vec![
                mount("plugin-dir", CSI_SOCKET_DIR, None),
                // At the host's path: kubelet hands NodeStage/NodePublish host paths.
                mount("kubelet-dir", cfg.kubelet_dir(), Some("Bidirectional")),
                mount("device-dir", "/dev", Some("HostToContainer")),
                mount("run-lvm", "/run/lvm", None),
                mount("run-lock-lvm", "/run/lock/lvm", None),
                mount("run-sanlock", "/run/sanlock", None),
                mount("run-wdmd", "/run/wdmd", None),
                mount("run-lvms", "/run/lvms", None),
                mount("etc-lvm", "/etc/lvm", None),
                mount("run-udev", "/run/udev", Some("HostToContainer")),
                mount("sys", "/sys", Some("HostToContainer")),
            ]
            .into_iter()
            .chain(
                cfg.fence_hook_dir
                    .as_deref()
                    .map(|d| mount("fence-hook", d, None)),
            )
            .collect(),
        ),
        ..Container::default()
    };

    if cfg.snapshot_metadata_secret.is_some() {
        let env = node.env.get_or_insert_with(Vec::new);
        env.push(env_value(
            ENV_SNAPSHOT_METADATA_CERT_DIR,
            SNAPSHOT_METADATA_CERT_DIR.to_owned(),
        ));
        env.push(env_from_field(ENV_POD_IP, "status.podIP"));
        node.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                read_only: Some(true),
                ..mount("snapshot-metadata-cert", SNAPSHOT_METADATA_CERT_DIR, None)
            });
    }

    if adopts {
        let endpoint = format!("unix://{CSI_DRIVER_LVM_SOCKET_DIR}/{CSI_SOCKET_NAME}");
        let env = node.env.get_or_insert_with(Vec::new);
        env.push(env_value(ENV_CSI_DRIVER_LVM_ENDPOINT, endpoint));
        env.push(env_value(
            ENV_CSI_DRIVER_LVM_OLD_SOCKET,
            cfg.csi_driver_lvm_old_socket(),
        ));
        node.volume_mounts.get_or_insert_with(Vec::new).push(mount(
            "csi-driver-lvm-plugin-dir",
            CSI_DRIVER_LVM_SOCKET_DIR,
            None,
        ));
    }

    let registrar = Container {
        name: "node-driver-registrar".into(),
        image: Some(cfg.node_driver_registrar_image.clone()),
        args: Some(vec![
            format!("--csi-address={socket}"),
            format!(
                "--kubelet-registration-path={}",
                cfg.kubelet_registration_path()
            ),
            format!("--http-endpoint=:{REGISTRAR_HEALTHZ_PORT}"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("healthz-reg".into()),
            container_port: REGISTRAR_HEALTHZ_PORT,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(healthz_probe("healthz-reg")),
        resources: Some(sidecar_resources()),
        volume_mounts: Some(vec![
            mount("plugin-dir", CSI_SOCKET_DIR, None),
            mount("registration-dir", "/registration", None),
        ]),
        ..Container::default()
    };

    let liveness = Container {
        name: "livenessprobe".into(),
        image: Some(cfg.livenessprobe_image.clone()),
        args: Some(vec![
            format!("--csi-address={socket}"),
            format!("--http-endpoint=:{HEALTHZ_PORT}"),
        ]),
        resources: Some(sidecar_resources()),
        volume_mounts: Some(vec![mount("plugin-dir", CSI_SOCKET_DIR, None)]),
        ..Container::default()
    };

    let mut containers = vec![node, registrar, liveness];
    if adopts {
        containers.extend(csi_driver_lvm_sidecars(cfg).into_iter().map(|c| {
            let resources = if c.name.ends_with("registrar") {
                sidecar_resources()
            } else {
                controller_sidecar_resources()
            };
            Container {
                resources: Some(resources),
                ..c
            }
        }));
    }

    let volumes = host_volumes(cfg, adopts)
        .into_iter()
        .map(|v| Volume {
            name: v.name.into(),
            host_path: Some(HostPathVolumeSource {
                path: v.host_path,
                type_: v.type_.map(str::to_owned),
            }),
            ..Volume::default()
        })
        .chain(cfg.snapshot_metadata_secret.as_ref().map(|secret| Volume {
            name: "snapshot-metadata-cert".into(),
            // Optional: the operator makes it at start, kubelet brings it in once it is there.
            secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                secret_name: Some(secret.clone()),
                optional: Some(true),
                ..Default::default()
            }),
            ..Volume::default()
        }))
        .collect();

    let tolerations = &cluster.spec.tolerations;
    let affinity =
        node_selector_union(&cluster.spec.storage.device_classes).map(|selector| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(selector),
                preferred_during_scheduling_ignored_during_execution: None,
            }),
            ..Affinity::default()
        });

    DaemonSet {
        metadata: owner.namespaced_meta(NODE_DAEMON_SET.into(), labels.clone()),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(labels.clone()),
                match_expressions: None,
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NODE_SERVICE_ACCOUNT.into()),
                    priority_class_name: Some(cfg.priority_class_name.clone()),
                    tolerations: (!tolerations.is_empty()).then(|| tolerations.clone()),
                    affinity,
                    containers,
                    volumes: Some(volumes),
                    // lvm waits for the host's udev through System V semaphores (udev_sync): the
                    // cookies must live in the host's IPC namespace (ADR 0010).
                    host_ipc: Some(true),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        status: None,
    }
}

/// The sidecars of csi-driver-lvm's volumes, on their own socket, as csi-driver-lvm's chart runs
/// them (its `templates/daemonset.yaml`): a registrar for its driver name, a provisioner per node
/// (`--node-deployment`: it deletes this node's volumes), and a resizer (leader-elected: it only
/// marks a claim grown, kubelet's NodeExpandVolume then grows the LV on its node).
fn csi_driver_lvm_sidecars(cfg: &RenderConfig) -> Vec<Container> {
    let socket = format!("{CSI_DRIVER_LVM_SOCKET_DIR}/{CSI_SOCKET_NAME}");
    let socket_dir = || mount("csi-driver-lvm-plugin-dir", CSI_DRIVER_LVM_SOCKET_DIR, None);
    vec![
        Container {
            name: "csi-driver-lvm-registrar".into(),
            image: Some(cfg.node_driver_registrar_image.clone()),
            args: Some(vec![
                format!("--csi-address={socket}"),
                format!(
                    "--kubelet-registration-path={}/{CSI_SOCKET_NAME}",
                    cfg.csi_driver_lvm_plugin_dir()
                ),
            ]),
            volume_mounts: Some(vec![
                socket_dir(),
                mount("registration-dir", "/registration", None),
            ]),
            ..Container::default()
        },
        Container {
            name: "csi-driver-lvm-provisioner".into(),
            image: Some(cfg.csi_provisioner_image.clone()),
            args: Some(vec![
                format!("--csi-address={socket}"),
                "--node-deployment".into(),
                "--strict-topology".into(),
            ]),
            env: Some(vec![env_from_field(ENV_NODE_NAME, "spec.nodeName")]),
            volume_mounts: Some(vec![socket_dir()]),
            ..Container::default()
        },
        Container {
            name: "csi-driver-lvm-resizer".into(),
            image: Some(cfg.csi_resizer_image.clone()),
            args: Some(vec![
                format!("--csi-address={socket}"),
                "--leader-election".into(),
                format!("--leader-election-namespace=$({ENV_NAMESPACE})"),
            ]),
            env: Some(vec![env_from_field(ENV_NAMESPACE, "metadata.namespace")]),
            volume_mounts: Some(vec![socket_dir()]),
            ..Container::default()
        },
    ]
}

#[cfg(test)]
mod tests;
