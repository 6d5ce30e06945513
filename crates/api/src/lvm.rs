//! `lvm.topolvm.io/v1alpha1`: `LVMCluster`, `LVMVolumeGroup`, `LVMVolumeGroupNodeStatus`.
//!
//! JSON names, enums, bounds and schema defaults follow OpenShift LVMS's Go API. Go's `omitempty` is
//! mirrored with `skip_serializing_if`, so a manifest read and written back keeps its shape. Fields
//! the API server defaults are `Option`s here (the server fills them in); the `*_or_default`
//! accessors give the effective value.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{NodeSelector, Toleration},
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::Condition},
};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Declares a string enum whose JSON values are given explicitly, with `as_str` and `Display`.
macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $value:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $value)] $variant ),+
        }

        impl $name {
            /// Every value, in schema order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The JSON value.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $value),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// Most device classes one `LVMCluster` may declare. LVMS has no limit; the bound keeps the
/// per-class CEL rules within the API server's cost budget (see ADR 0003).
pub const MAX_DEVICE_CLASSES: u32 = 64;
/// Most entries in `storageClassOptions.additionalParameters` and `.additionalLabels`.
pub const MAX_STORAGE_CLASS_MAP_ENTRIES: u32 = 16;
/// Default `thinPoolConfig.sizePercent`.
pub const DEFAULT_SIZE_PERCENT: i32 = 90;
/// Chunk size used with the `Static` policy when `chunkSize` is not given.
pub const DEFAULT_CHUNK_SIZE: &str = "128Ki";
/// Smallest `chunkSize` lvm2 accepts.
pub const MIN_CHUNK_SIZE: &str = "64Ki";
/// Largest `chunkSize` lvm2 accepts.
pub const MAX_CHUNK_SIZE: &str = "1Gi";
/// Metadata size used with the `Static` policy when `metadataSize` is not given.
pub const DEFAULT_METADATA_SIZE: &str = "1Gi";
/// Smallest `metadataSize` lvm2 accepts.
pub const MIN_METADATA_SIZE: &str = "2Mi";
/// Largest `metadataSize` lvm2 accepts.
pub const MAX_METADATA_SIZE: &str = "16Gi";
/// `sharedConfig.ioTimeoutSeconds` when unset: sanlock's own default I/O timeout.
pub const DEFAULT_IO_TIMEOUT_SECONDS: i32 = 10;
/// Smallest `sharedConfig.ioTimeoutSeconds`.
pub const MIN_IO_TIMEOUT_SECONDS: i32 = 5;
/// Largest `sharedConfig.ioTimeoutSeconds`.
pub const MAX_IO_TIMEOUT_SECONDS: i32 = 60;
/// How long after sanlock stops petting the watchdog for a lockspace the watchdog resets the
/// machine: wdmd's fire timeout (sanlock's `DEFAULT_WATCHDOG_FIRE_TIMEOUT`, `timeouts.h`).
pub const SANLOCK_WATCHDOG_FIRE_SECONDS: i32 = 60;
/// Condition type: the operator's own objects (StorageClasses, DaemonSet, ...) are reconciled.
pub const CONDITION_RESOURCES_AVAILABLE: &str = "ResourcesAvailable";
/// Condition type: every selected node reports every volume group ready.
pub const CONDITION_VOLUME_GROUPS_READY: &str = "VolumeGroupsReady";

fn is_false(b: &bool) -> bool {
    !*b
}

// ---------------------------------------------------------------------------------------------
// LVMCluster
// ---------------------------------------------------------------------------------------------

/// The user-facing configuration of LVM storage: one per cluster, in the operator's namespace.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "lvm.topolvm.io",
    version = "v1alpha1",
    kind = "LVMCluster",
    plural = "lvmclusters",
    namespaced,
    status = "LVMClusterStatus",
    derive = "PartialEq",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.state"),
    doc = "LVMCluster is the Schema for the lvmclusters API"
)]
#[serde(rename_all = "camelCase")]
pub struct LVMClusterSpec {
    /// Tolerations of the node agent's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The device classes.
    #[serde(default)]
    pub storage: Storage,
}

/// The device classes of an `LVMCluster`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// One LVM volume group (with optional thin pool or RAID layout) per node and class, and one
    /// StorageClass `lvms-<name>` each. Keyed by name, so per-class immutability rules can compare
    /// a class with its previous version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = MAX_DEVICE_CLASSES),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub device_classes: Vec<DeviceClass>,
}

impl Storage {
    /// Every StorageClass rendered for the cluster's device classes, class by class
    /// ([`DeviceClass::storage_class_names`]).
    pub fn storage_class_names(&self) -> impl Iterator<Item = String> + '_ {
        self.device_classes
            .iter()
            .flat_map(DeviceClass::storage_class_names)
    }
}

/// A device class: which devices on which nodes form the volume group, and how volumes are carved.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "has(self.raidConfig) == has(oldSelf.raidConfig) && (!has(self.raidConfig) || self.raidConfig == oldSelf.raidConfig)"
).message("raidConfig is immutable: it cannot be added to, changed on or removed from an existing device class").field_path(".raidConfig"))]
#[x_kube(validation = Rule::new(
    "(has(self.storageClassOptions) && has(self.storageClassOptions.reclaimPolicy) ? self.storageClassOptions.reclaimPolicy : 'Delete') == (has(oldSelf.storageClassOptions) && has(oldSelf.storageClassOptions.reclaimPolicy) ? oldSelf.storageClassOptions.reclaimPolicy : 'Delete')"
).message("storageClassOptions.reclaimPolicy is immutable once set (unset means Delete): StorageClasses cannot change it; delete and recreate the LVMCluster to change it").field_path(".storageClassOptions.reclaimPolicy"))]
#[x_kube(validation = Rule::new(
    "(has(self.storageClassOptions) && has(self.storageClassOptions.volumeBindingMode) ? self.storageClassOptions.volumeBindingMode : 'WaitForFirstConsumer') == (has(oldSelf.storageClassOptions) && has(oldSelf.storageClassOptions.volumeBindingMode) ? oldSelf.storageClassOptions.volumeBindingMode : 'WaitForFirstConsumer')"
).message("storageClassOptions.volumeBindingMode is immutable once set (unset means WaitForFirstConsumer): StorageClasses cannot change it; delete and recreate the LVMCluster to change it").field_path(".storageClassOptions.volumeBindingMode"))]
#[x_kube(validation = Rule::new(
    "has(oldSelf.storageClassOptions) && has(oldSelf.storageClassOptions.additionalParameters) && size(oldSelf.storageClassOptions.additionalParameters) > 0 ? (has(self.storageClassOptions) && has(self.storageClassOptions.additionalParameters) && self.storageClassOptions.additionalParameters == oldSelf.storageClassOptions.additionalParameters) : (!has(self.storageClassOptions) || !has(self.storageClassOptions.additionalParameters) || size(self.storageClassOptions.additionalParameters) == 0)"
).message("storageClassOptions.additionalParameters is immutable once set: StorageClass parameters cannot change; delete and recreate the LVMCluster to change them").field_path(".storageClassOptions.additionalParameters"))]
#[x_kube(validation = Rule::new(
    "(has(self.deviceAccessPolicy) && self.deviceAccessPolicy == 'shared') == (has(oldSelf.deviceAccessPolicy) && oldSelf.deviceAccessPolicy == 'shared')"
).message("deviceAccessPolicy cannot change between shared and nodeLocal (unset and local mean nodeLocal) on an existing device class, whose volume group is already made one way: restore it, or remove the device class and add a new one under another name").field_path(".deviceAccessPolicy"))]
#[x_kube(validation = Rule::new(
    "(has(self.sharedConfig) && has(self.sharedConfig.ioTimeoutSeconds) ? self.sharedConfig.ioTimeoutSeconds : 10) == (has(oldSelf.sharedConfig) && has(oldSelf.sharedConfig.ioTimeoutSeconds) ? oldSelf.sharedConfig.ioTimeoutSeconds : 10)"
).message("sharedConfig.ioTimeoutSeconds is immutable (unset means 10): it is fixed when the sanlock lockspace is made; restore it, or remove the device class and add a new one under another name").field_path(".sharedConfig.ioTimeoutSeconds"))]
#[x_kube(validation = Rule::new(
    "(has(self.sharedConfig) && has(self.sharedConfig.volumeMode) ? self.sharedConfig.volumeMode : 'Linear') == (has(oldSelf.sharedConfig) && has(oldSelf.sharedConfig.volumeMode) ? oldSelf.sharedConfig.volumeMode : 'Linear')"
).message("sharedConfig.volumeMode is immutable (unset means Linear): it is a StorageClass parameter, and StorageClasses cannot change; restore it, or delete and recreate the LVMCluster to change it").field_path(".sharedConfig.volumeMode"))]
pub struct DeviceClass {
    /// Name of the device class, of its volume group and (prefixed with `lvms-`) of its
    /// StorageClass. A DNS label.
    #[schemars(
        length(min = 1, max = 245),
        pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The devices that form the volume group, and whether to wipe them first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceSelector>,
    /// The nodes to create the volume group on; all schedulable nodes when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// A thin pool in the volume group; volumes are thick when absent. With `raidConfig`, the
    /// pool's data takes that RAID layout and its metadata is raid1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin_pool_config: Option<ThinPoolConfig>,
    /// LVM RAID layout of every volume of this class, or with `thinPoolConfig` of the thin pool's
    /// data (its metadata is raid1 with as many copies as the layout survives lost devices);
    /// immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_config: Option<RaidConfig>,
    /// Whether this class's StorageClass is the cluster default. At most one class may be.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    /// Filesystem of Filesystem-mode volumes: `xfs` (default) or `ext4`. Immutable.
    #[serde(rename = "fstype", default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "xfs"))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("fstype is immutable once set"))]
    pub filesystem_type: Option<DeviceFilesystemType>,
    /// How devices are found when no paths are given: `Static` (once, when the volume group is
    /// created) or `Dynamic` (continuously). Ignored when paths are given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_discovery_policy: Option<DeviceDiscoveryPolicy>,
    /// Overrides for the StorageClass rendered for this class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_options: Option<StorageClassOptions>,
    /// `nodeLocal` (default; `local` is accepted as the same): each selected node has its own
    /// volume group on its own devices. `shared`: one volume group on SAN LUNs that every selected
    /// node sees, under lvmlockd and sanlock (tech preview). Cannot change between the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_access_policy: Option<DeviceAccessPolicy>,
    /// Settings of a `shared` class; only allowed there. An lvms-rs extension: the enhancement
    /// that names `deviceAccessPolicy` has no such field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_config: Option<SharedConfig>,
    /// Also render csi-driver-lvm's three StorageClasses, `csi-driver-lvm-linear`,
    /// `csi-driver-lvm-striped` and `csi-driver-lvm-mirror`: copies of this class's StorageClass
    /// with csi-driver-lvm's `type` parameter, so manifests written for csi-driver-lvm bind
    /// unchanged (an lvms-rs extension, ADR 0022). At most one class may set it; only on a thick,
    /// node-local class without `raidConfig`. Turning it off deletes the three StorageClasses.
    #[serde(
        rename = "csiDriverLVMStorageClasses",
        default,
        skip_serializing_if = "is_false"
    )]
    pub csi_driver_lvm_storage_classes: bool,
    /// Take over the volume group another driver made on each node instead of creating one
    /// (an lvms-rs extension, ADR 0023). `csi-driver-lvm`: the group named like this class (name
    /// the class `csi-lvm`, csi-driver-lvm's default `vgName`) must carry csi-driver-lvm's tag
    /// `vg.metal-stack.io/csi-lvm-driver`; the node agent adds lvms-rs's tag and wipes or creates
    /// nothing. Its volumes stay and are reported as foreign, never removed. `topolvm`: the group
    /// named like this class (lvmd.yaml's `volume-group`), which lvmd leaves untagged, unless
    /// another driver's tag marks it; TopoLVM's volumes are then taken over by their
    /// `LogicalVolume`s (ADR 0032). Node-local classes only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptFrom>,
}

impl DeviceClass {
    /// Every StorageClass rendered for this class: `lvms-<name>`, then csi-driver-lvm's three
    /// names when [`DeviceClass::csi_driver_lvm_storage_classes`] is set.
    pub fn storage_class_names(&self) -> Vec<String> {
        let mut names = vec![crate::storage_class_name(&self.name)];
        if self.csi_driver_lvm_storage_classes {
            names.extend(
                crate::CSI_DRIVER_LVM_TYPES
                    .iter()
                    .map(|t| crate::csi_driver_lvm_storage_class_name(t)),
            );
        }
        names
    }

    /// The effective filesystem type (`xfs` when unset).
    pub fn fstype_or_default(&self) -> DeviceFilesystemType {
        self.filesystem_type.unwrap_or_default()
    }

    /// The effective access policy (`nodeLocal` when unset; `local` reads as `nodeLocal`).
    pub fn access_policy_or_default(&self) -> DeviceAccessPolicy {
        match self.device_access_policy {
            Some(DeviceAccessPolicy::Shared) => DeviceAccessPolicy::Shared,
            Some(DeviceAccessPolicy::NodeLocal | DeviceAccessPolicy::Local) | None => {
                DeviceAccessPolicy::NodeLocal
            }
        }
    }

    /// Whether the class is `shared`: one volume group on LUNs many nodes see.
    pub fn is_shared(&self) -> bool {
        self.device_access_policy
            .is_some_and(DeviceAccessPolicy::is_shared)
    }

    /// The effective shared settings (every default when `sharedConfig` is unset).
    pub fn shared_config_or_default(&self) -> SharedConfig {
        self.shared_config.clone().unwrap_or_default()
    }

    /// The explicit device paths (required and optional), in order.
    pub fn all_paths(&self) -> impl Iterator<Item = &str> {
        self.device_selector
            .iter()
            .flat_map(|s| s.paths.iter().chain(s.optional_paths.iter()))
            .map(String::as_str)
    }
}

/// The devices of a volume group.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSelector {
    /// Devices that must exist and be usable (`/dev/...`, symlinks such as `/dev/disk/by-id/...`
    /// allowed and preferred); the class fails on a node without them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// Devices used when present and usable, skipped otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub optional_paths: Vec<String>,
    /// Devices selected by glob pattern, as csi-driver-lvm's `devicePattern` (an lvms-rs extension):
    /// Go `filepath.Glob` syntax (`*`, `?`, `[0-9]`, `[^a]`), absolute under `/dev/`, matched against
    /// each device's kernel name path, device node and `/dev/disk/by-id` links; an item may be a
    /// comma-separated list, such as `/dev/nvme[0-9]n[0-9],/dev/sd[b-d]`. Matched devices are used
    /// when they pass the safety filters (a formatted, partitioned, mounted or read-only device is
    /// excluded and reported with the pattern) and are never wiped; under `deviceDiscoveryPolicy:
    /// Dynamic` devices that match later are added too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub device_patterns: Vec<String>,
    /// Wipe filesystem and partition signatures on the selected devices before use. Destroys data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force_wipe_devices_and_destroy_all_data: Option<bool>,
}

/// Settings of a `shared` device class (an lvms-rs extension).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedConfig {
    /// Default volume mode of the class's StorageClass: `Linear` (default) volumes can be active on
    /// several nodes at once (raw block, multi-node access); `Thin` volumes each get their own thin
    /// pool, active on one node at a time, and can be snapshotted and cloned. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<SharedVolumeMode>,
    /// Whether a new linear volume is zeroed before first use: `Full` (default) so that no
    /// volume shows data of a volume deleted before it, or `UnsafeFast` (not zeroed; only where
    /// every tenant of the LUN is trusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe_policy: Option<WipePolicy>,
    /// sanlock I/O timeout in seconds (5-60; 10 when unset). A node that loses the LUN is
    /// considered dead after about 8 times this plus 60 seconds. Fixed when the lockspace is made,
    /// so immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_IO_TIMEOUT_SECONDS, max = MAX_IO_TIMEOUT_SECONDS))]
    pub io_timeout_seconds: Option<i32>,
    /// Fencing of a node that loses its leases: `Required` (default) means the class is Ready on
    /// a node only when sanlock's watchdog (wdmd on `/dev/watchdog`) is armed there and
    /// lvmlockd's kill hook (`lvmlockctl_kill_command`) runs lvms-rs's fence hook; `softdog`
    /// counts as armed but is reported as a warning. `Disabled`: the admin opts out of fencing; a
    /// node that loses its leases may then keep writing to volumes another node takes over, and
    /// the status says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watchdog: Option<WatchdogPolicy>,
}

impl SharedConfig {
    /// The effective volume mode (`Linear` when unset).
    pub fn volume_mode_or_default(&self) -> SharedVolumeMode {
        self.volume_mode.unwrap_or_default()
    }

    /// The effective wipe policy (`Full` when unset).
    pub fn wipe_policy_or_default(&self) -> WipePolicy {
        self.wipe_policy.unwrap_or_default()
    }

    /// The effective sanlock I/O timeout ([`DEFAULT_IO_TIMEOUT_SECONDS`] when unset).
    pub fn io_timeout_seconds_or_default(&self) -> i32 {
        self.io_timeout_seconds
            .unwrap_or(DEFAULT_IO_TIMEOUT_SECONDS)
    }

    /// The effective fencing policy (`Required` when unset).
    pub fn watchdog_or_default(&self) -> WatchdogPolicy {
        self.watchdog.unwrap_or_default()
    }

    /// How long a node's lease renewals may fail before its sanlock gives the lockspace up (runs
    /// the kill hook and stops petting the watchdog): 8 × the I/O timeout, sanlock's
    /// `id_renewal_fail_seconds` (`timeouts.h`; renewals are tried every 2 × the I/O timeout).
    pub fn renewal_fail_seconds(&self) -> i32 {
        8 * self.io_timeout_seconds_or_default()
    }

    /// How long after a node's last lease renewal other nodes may take its leases (sanlock's
    /// `host_dead_seconds`, `timeouts.h`): [`Self::renewal_fail_seconds`] plus the watchdog's
    /// [`SANLOCK_WATCHDOG_FIRE_SECONDS`], by when the node has either let go or been reset.
    /// 140 s at the default 10 s I/O timeout. The failover budget.
    pub fn host_dead_seconds(&self) -> i32 {
        self.renewal_fail_seconds() + SANLOCK_WATCHDOG_FIRE_SECONDS
    }
}

/// A thin pool inside the volume group.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ThinPoolConfig {
    /// Name of the thin pool LV.
    pub name: String,
    /// Share of the volume group for the thin pool, in percent (10-100, default 90). The rest
    /// leaves room to grow the pool's metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 100), extend("default" = DEFAULT_SIZE_PERCENT))]
    pub size_percent: Option<i32>,
    /// How many times the pool's size may be provisioned in thin volumes (1-100; 1 disables
    /// overprovisioning).
    #[schemars(range(min = 1, max = 100))]
    pub overprovision_ratio: i32,
    /// `Static` (default): chunk size from `chunkSize` (default 128Ki). `Host`: lvm2 decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Static"))]
    pub chunk_size_calculation_policy: Option<ChunkSizeCalculationPolicy>,
    /// Thin pool chunk size with the `Static` policy, 64Ki-1Gi.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<Quantity>,
    /// Pool metadata size with the `Static` policy, 2Mi-16Gi (default 1Gi); may only grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_size: Option<Quantity>,
    /// `Host` (default): lvm2 sizes the metadata. `Static`: `metadataSize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "Host"))]
    pub metadata_size_calculation_policy: Option<MetadataSizePolicy>,
}

impl ThinPoolConfig {
    /// The effective `sizePercent`.
    pub fn size_percent_or_default(&self) -> i32 {
        self.size_percent.unwrap_or(DEFAULT_SIZE_PERCENT)
    }

    /// The effective chunk size policy (`Static` when unset).
    pub fn chunk_size_policy_or_default(&self) -> ChunkSizeCalculationPolicy {
        self.chunk_size_calculation_policy.unwrap_or_default()
    }

    /// The effective metadata size policy (`Host` when unset).
    pub fn metadata_size_policy_or_default(&self) -> MetadataSizePolicy {
        self.metadata_size_calculation_policy.unwrap_or_default()
    }
}

/// LVM RAID layout of the volumes of a device class.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RaidConfig {
    /// RAID level.
    #[serde(rename = "type")]
    pub raid_type: RaidType,
    /// Additional copies of the data (raid1 and raid10 only; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub mirrors: Option<i32>,
    /// Data stripes (raid4, raid5, raid6, raid10; defaults 2, 2, 3, 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 2))]
    pub stripes: Option<i32>,
    /// Stripe size, a power of two (not for raid1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_size: Option<Quantity>,
}

/// Overrides for the StorageClass rendered for a device class.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageClassOptions {
    /// `Delete` (default) or `Retain`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
    /// `WaitForFirstConsumer` (default) or `Immediate`. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_binding_mode: Option<VolumeBindingMode>,
    /// Extra StorageClass parameters (at most 16; not the device class or fstype keys). Immutable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_STORAGE_CLASS_MAP_ENTRIES))]
    pub additional_parameters: BTreeMap<String, String>,
    /// Extra StorageClass labels (at most 16; not the operator's own keys). May change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = MAX_STORAGE_CLASS_MAP_ENTRIES))]
    pub additional_labels: BTreeMap<String, String>,
}

impl StorageClassOptions {
    /// The effective reclaim policy (`Delete` when unset).
    pub fn reclaim_policy_or_default(&self) -> ReclaimPolicy {
        self.reclaim_policy.unwrap_or_default()
    }

    /// The effective binding mode (`WaitForFirstConsumer` when unset).
    pub fn volume_binding_mode_or_default(&self) -> VolumeBindingMode {
        self.volume_binding_mode.unwrap_or_default()
    }
}

string_enum! {
    /// Filesystem of Filesystem-mode volumes.
    #[derive(Default)]
    pub enum DeviceFilesystemType {
        #[default]
        Xfs = "xfs",
        Ext4 = "ext4",
    }
}

string_enum! {
    /// Whether a device class's volume group is per node or shared by many nodes: `nodeLocal`
    /// (the default when unset; `local` means the same), or `shared` (one volume group on LUNs
    /// every selected node sees, under lvmlockd and sanlock; tech preview). Cannot change between
    /// shared and nodeLocal.
    pub enum DeviceAccessPolicy {
        /// One volume group per node, on that node's devices (the meaning of unset).
        NodeLocal = "nodeLocal",
        /// The enhancement's alternate spelling of `nodeLocal`; means the same.
        Local = "local",
        /// One volume group on LUNs every selected node sees, under lvmlockd and sanlock.
        Shared = "shared",
    }
}

impl DeviceAccessPolicy {
    /// Whether this is `shared`.
    pub const fn is_shared(self) -> bool {
        matches!(self, DeviceAccessPolicy::Shared)
    }
}

string_enum! {
    /// Another driver whose existing volume group a device class takes over (ADR 0023).
    pub enum AdoptFrom {
        /// metal-stack csi-driver-lvm: a volume group tagged `vg.metal-stack.io/csi-lvm-driver`.
        CsiDriverLvm = "csi-driver-lvm",
        /// TopoLVM's lvmd: the untagged volume group of an lvmd device class (ADR 0032).
        TopoLvm = "topolvm",
    }
}

string_enum! {
    /// Default volume mode of a shared class's StorageClass: `Linear` (default; may be active on
    /// several nodes, raw block) or `Thin` (a thin pool per volume, active on one node at a time).
    /// Immutable.
    #[derive(Default)]
    pub enum SharedVolumeMode {
        /// Linear LVs in the shared volume group; may be active on several nodes (block only).
        #[default]
        Linear = "Linear",
        /// One thin pool per volume, active on one node at a time.
        Thin = "Thin",
    }
}

impl SharedVolumeMode {
    /// The value of the StorageClass parameter [`crate::VOLUME_MODE_PARAMETER`].
    pub const fn parameter_value(self) -> &'static str {
        match self {
            SharedVolumeMode::Linear => "linear",
            SharedVolumeMode::Thin => "thin",
        }
    }
}

string_enum! {
    /// Whether a new linear volume of a shared class is zeroed before first use: `Full` (default)
    /// or `UnsafeFast` (not zeroed; a new volume may show a previous tenant's data).
    #[derive(Default)]
    pub enum WipePolicy {
        /// Zeroed, so no volume shows data of one deleted before it.
        #[default]
        Full = "Full",
        /// Not zeroed: fast, but a new volume may show a previous tenant's data.
        UnsafeFast = "UnsafeFast",
    }
}

string_enum! {
    /// Fencing policy of a shared class (`sharedConfig.watchdog`): `Required` (default) or
    /// `Disabled`.
    #[derive(Default)]
    pub enum WatchdogPolicy {
        /// Ready on a node only when sanlock's watchdog is armed and the kill hook configured there.
        #[default]
        Required = "Required",
        /// The admin opted out of fencing: a node that loses its leases may keep writing.
        Disabled = "Disabled",
    }
}

string_enum! {
    /// The watchdog that resets a node whose sanlock lost its leases, as the node sees it.
    pub enum WatchdogState {
        /// A hardware watchdog on `/dev/watchdog`, petted by wdmd for sanlock.
        Armed = "Armed",
        /// The kernel's `softdog`: armed, but a hung kernel may not fire it (a warning).
        Softdog = "Softdog",
        /// No working watchdog (no device, wdmd not running, or sanlock runs without it).
        Missing = "Missing",
        /// Not checked: the class's `sharedConfig.watchdog` is `Disabled`.
        Disabled = "Disabled",
    }
}

impl WatchdogState {
    /// Whether the watchdog would reset the node (`Armed` or `Softdog`).
    pub const fn is_armed(self) -> bool {
        matches!(self, WatchdogState::Armed | WatchdogState::Softdog)
    }
}

string_enum! {
    /// Whether a node takes part in a shared volume group's sanlock lockspace: `Joined`,
    /// `Joining` or `NotJoined`.
    #[derive(Default)]
    pub enum LockspaceState {
        /// Joined: the node may activate the volume group's LVs.
        Joined = "Joined",
        /// `vgchange --lock-start` is under way (may take minutes after an unclean shutdown).
        Joining = "Joining",
        /// Not joined; `reason` says why.
        #[default]
        NotJoined = "NotJoined",
    }
}

string_enum! {
    /// How the thin pool's chunk size is chosen.
    #[derive(Default)]
    pub enum ChunkSizeCalculationPolicy {
        /// lvm2's own setting on the node.
        Host = "Host",
        /// `chunkSize`, or 128Ki.
        #[default]
        Static = "Static",
    }
}

string_enum! {
    /// How the thin pool's metadata size is chosen.
    #[derive(Default)]
    pub enum MetadataSizePolicy {
        /// lvm2's defaults.
        #[default]
        Host = "Host",
        /// `metadataSize`, or 1Gi.
        Static = "Static",
    }
}

string_enum! {
    /// How devices are discovered when a device class names no paths.
    pub enum DeviceDiscoveryPolicy {
        /// Devices found when the volume group is created; later devices are ignored.
        Static = "Static",
        /// Devices are discovered and added continuously.
        Dynamic = "Dynamic",
    }
}

string_enum! {
    /// The discovery policy in effect for a volume group on a node.
    #[derive(Default)]
    pub enum DeviceDiscoveryPolicyStatus {
        /// Explicit paths; the policy does not apply.
        Preconfigured = "Preconfigured",
        /// No paths, `Dynamic`.
        RuntimeDynamic = "RuntimeDynamic",
        /// No paths, `Static`.
        #[default]
        RuntimeStatic = "RuntimeStatic",
    }
}

string_enum! {
    /// LVM RAID level.
    pub enum RaidType {
        Raid1 = "raid1",
        Raid4 = "raid4",
        Raid5 = "raid5",
        Raid6 = "raid6",
        Raid10 = "raid10",
    }
}

string_enum! {
    /// StorageClass reclaim policy.
    #[derive(Default)]
    pub enum ReclaimPolicy {
        #[default]
        Delete = "Delete",
        Retain = "Retain",
    }
}

string_enum! {
    /// StorageClass volume binding mode.
    #[derive(Default)]
    pub enum VolumeBindingMode {
        #[default]
        WaitForFirstConsumer = "WaitForFirstConsumer",
        Immediate = "Immediate",
    }
}

string_enum! {
    /// State of an `LVMCluster`.
    pub enum LVMStateType {
        Progressing = "Progressing",
        Ready = "Ready",
        Failed = "Failed",
        Degraded = "Degraded",
        Unknown = "Unknown",
    }
}

string_enum! {
    /// State of one volume group on one node.
    pub enum VGStatusType {
        Progressing = "Progressing",
        Ready = "Ready",
        Failed = "Failed",
        Degraded = "Degraded",
    }
}

string_enum! {
    /// Health of the RAID volumes of one volume group on one node.
    pub enum RaidHealth {
        /// Every member present and in sync.
        Healthy = "Healthy",
        /// Members missing or out of sync; data still available.
        Degraded = "Degraded",
        /// More members lost than the level tolerates.
        Failed = "Failed",
    }
}

/// Observed state of an `LVMCluster`, aggregated from the nodes' `LVMVolumeGroupNodeStatus`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LVMClusterStatus {
    /// Whether every selected node reports every device class ready.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ready: bool,
    /// Overall state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<LVMStateType>,
    /// `ResourcesAvailable` and `VolumeGroupsReady`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Per device class, per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_class_statuses: Vec<DeviceClassStatus>,
}

/// Observed state of one device class across nodes.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassStatus {
    /// Device class name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// One entry per node the class is selected on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_status: Vec<NodeStatus>,
    /// For a shared class: the nodes that joined its lockspace (node status `lockspace: Joined`),
    /// sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joined_nodes: Vec<String>,
    /// For a shared class: its sanlock timing and fencing policy, from its `sharedConfig`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_timing: Option<SharedTiming>,
}

/// A shared class's sanlock timing (sanlock's `timeouts.h` arithmetic) and fencing policy.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedTiming {
    /// The lockspace's sanlock I/O timeout, in seconds.
    pub io_timeout_seconds: i32,
    /// How long a node's lease renewals may fail before its sanlock gives the lockspace up and
    /// fences the node (8 × the I/O timeout).
    pub renewal_fail_seconds: i32,
    /// The failover budget: how long after a node stops renewing its leases before another node
    /// may activate its volumes (8 × the I/O timeout + 60 s for the watchdog).
    pub host_dead_seconds: i32,
    /// The class's fencing policy.
    #[serde(default)]
    pub watchdog: WatchdogPolicy,
}

impl SharedTiming {
    /// The timing of a class with this `sharedConfig`.
    pub fn of(config: &SharedConfig) -> Self {
        Self {
            io_timeout_seconds: config.io_timeout_seconds_or_default(),
            renewal_fail_seconds: config.renewal_fail_seconds(),
            host_dead_seconds: config.host_dead_seconds(),
            watchdog: config.watchdog_or_default(),
        }
    }

    /// The timing sanlock keeps for a class with this `sharedConfig` whose nodes report io
    /// timeouts `kept` (what sanlock on each runs the lockspace with): the longest one, since a
    /// dead node's leases are freed by its own; the configured one while no node reports.
    pub fn kept(config: &SharedConfig, kept: impl IntoIterator<Item = i32>) -> Self {
        let Some(io) = kept.into_iter().filter(|t| *t > 0).max() else {
            return Self::of(config);
        };
        Self::of(&SharedConfig {
            io_timeout_seconds: Some(io),
            ..config.clone()
        })
    }
}

/// Observed state of one device class's volume group on one node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Node name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The volume group's state, as the node reports it.
    #[serde(flatten)]
    pub vg_status: VGStatus,
}

// ---------------------------------------------------------------------------------------------
// LVMVolumeGroup
// ---------------------------------------------------------------------------------------------

/// One device class as the node agents see it; created by the operator, owned by the
/// `LVMCluster`, one per class.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "lvm.topolvm.io",
    version = "v1alpha1",
    kind = "LVMVolumeGroup",
    plural = "lvmvolumegroups",
    namespaced,
    status = "LVMVolumeGroupStatus",
    derive = "PartialEq",
    doc = "LVMVolumeGroup is the Schema for the lvmvolumegroups API"
)]
#[serde(rename_all = "camelCase")]
pub struct LVMVolumeGroupSpec {
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_discovery_policy: Option<DeviceDiscoveryPolicy>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_selector: Option<DeviceSelector>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin_pool_config: Option<ThinPoolConfig>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_config: Option<RaidConfig>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "is_false")]
    pub default: bool,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_access_policy: Option<DeviceAccessPolicy>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_config: Option<SharedConfig>,
    /// As in the device class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<AdoptFrom>,
}

impl LVMVolumeGroupSpec {
    /// Whether the volume group is `shared`.
    pub fn is_shared(&self) -> bool {
        self.device_access_policy
            .is_some_and(DeviceAccessPolicy::is_shared)
    }
}

/// Status of an `LVMVolumeGroup` (empty: nodes report in `LVMVolumeGroupNodeStatus`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct LVMVolumeGroupStatus {}

// ---------------------------------------------------------------------------------------------
// LVMVolumeGroupNodeStatus
// ---------------------------------------------------------------------------------------------

/// What one node reports about its volume groups; named after the node. As in LVMS the data is
/// under `spec`.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "lvm.topolvm.io",
    version = "v1alpha1",
    kind = "LVMVolumeGroupNodeStatus",
    plural = "lvmvolumegroupnodestatuses",
    namespaced,
    status = "LVMVolumeGroupNodeStatusStatus",
    derive = "PartialEq",
    doc = "LVMVolumeGroupNodeStatus is the Schema for the lvmvolumegroupnodestatuses API"
)]
#[serde(rename_all = "camelCase")]
pub struct LVMVolumeGroupNodeStatusSpec {
    /// One entry per volume group (device class) on the node.
    #[serde(rename = "nodeStatus", default, skip_serializing_if = "Vec::is_empty")]
    pub lvm_vg_status: Vec<VGStatus>,
}

/// Status of an `LVMVolumeGroupNodeStatus` (empty; the data is under `spec`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct LVMVolumeGroupNodeStatusStatus {}

/// State of one volume group on one node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VGStatus {
    /// Volume group (device class) name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// State.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VGStatusType>,
    /// Why the state is not `Ready`, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Devices in the volume group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// Devices the selector matched but that were not used, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<ExcludedDevice>,
    /// The discovery policy in effect (`RuntimeStatic` when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "RuntimeStatic"))]
    pub device_discovery_policy: Option<DeviceDiscoveryPolicyStatus>,
    /// Health of the RAID volumes, for RAID classes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_status: Option<RaidStatus>,
    /// Devices `forceWipeDevicesAndDestroyAllData` wiped on this node (recorded before each wipe). A
    /// device listed here is never wiped again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub wiped_devices: Vec<String>,
    /// Logical volumes in the volume group that lvms-rs did not make (not tagged ours), by name:
    /// an adopted csi-driver-lvm group's `pvc-…` volumes. Never removed by lvms-rs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_volumes: Vec<String>,
    /// For a shared class: whether this node sees the LUNs and takes part in the lockspace.
    // Boxed to keep `VGStatus` small for node-local classes, which have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<Box<SharedVGStatus>>,
}

/// One node's view of a shared volume group.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedVGStatus {
    /// Whether this node sees every device of the class.
    #[serde(default, skip_serializing_if = "is_false")]
    pub devices_visible: bool,
    /// Whether this node joined the volume group's sanlock lockspace.
    #[serde(default)]
    pub lockspace: LockspaceState,
    /// This node's sanlock host id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<i32>,
    /// The lockspace's sanlock I/O timeout, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_timeout_seconds: Option<i32>,
    /// Why the lockspace is not joined, in words, with the fix.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Whether this node is fenced when it loses its leases (watchdog and kill hook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingStatus>,
    /// Host ids this node's sanlock sees renewing their delta lease in the class's lockspace,
    /// sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub live_host_ids: Vec<i32>,
    /// Host ids this node's sanlock counts dead in the class's lockspace (no renewal for the
    /// host-dead time, not left cleanly), sorted: the operator's evidence that a node that is not
    /// Ready has stopped writing to the class (ADR 0029).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dead_host_ids: Vec<i32>,
}

/// One node's fencing of a shared class: what stops it writing once it has lost its leases.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FencingStatus {
    /// The watchdog that resets the node if it keeps its leases' volumes active after losing them.
    pub watchdog: WatchdogState,
    /// Whether lvmlockd's `lvmlockctl_kill_command` runs lvms-rs's fence hook, which stops the
    /// class's volumes on this node before the watchdog would have to reset it.
    #[serde(default)]
    pub kill_hook: bool,
    /// 1 while this node's last lease renewal in the class's lockspace failed (or sanlock gave the
    /// lockspace up), else 0.
    #[serde(default)]
    pub lease_renewal_failures: i64,
    /// Why fencing is not armed, with the fix, or a warning (softdog); empty when all is well.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The fence hook stopped this node's volumes of the class (it lost its leases, for example
    /// its path to the LUN): it serves none of them until it joins again by itself, once nothing
    /// of the class is open on it and the LUN can be read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fenced: bool,
}

/// A device the selector matched but that was not used.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ExcludedDevice {
    /// Device path.
    pub name: String,
    /// Why it was not used, in words.
    pub reasons: Vec<String>,
}

/// Health of the RAID volumes of one volume group on one node.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RaidStatus {
    /// Worst health over the volume group's RAID LVs.
    pub status: RaidHealth,
    /// LVM physical volumes in the volume group.
    #[serde(default)]
    pub member_count: i32,
    /// LVM physical volumes missing or failed.
    #[serde(default)]
    pub degraded_member_count: i32,
    /// Lowest sync percentage over the RAID LVs (100 when all are in sync).
    #[serde(default)]
    pub min_sync_percent: f64,
    /// Per RAID LV.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lv_health: Vec<RaidLvHealth>,
}

/// Health of one RAID LV.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RaidLvHealth {
    /// LV name.
    pub name: String,
    /// Segment type as lvm2 reports it (`raid1`, `raid5`, ...).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub raid_type: String,
    /// Sync percentage.
    #[serde(default)]
    pub sync_percent: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_str<T: Serialize>(v: T) -> String {
        serde_json::to_value(v)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    #[test]
    fn string_enums_serialise_to_their_as_str_value() {
        for v in RaidType::ALL {
            assert_eq!(json_str(v), v.as_str());
        }
        for v in DeviceFilesystemType::ALL {
            assert_eq!(json_str(v), v.to_string());
        }
        assert_eq!(RaidType::Raid10.as_str(), "raid10");
        assert_eq!(
            VolumeBindingMode::WaitForFirstConsumer.as_str(),
            "WaitForFirstConsumer"
        );
    }

    #[test]
    fn defaults_are_the_lvms_defaults() {
        assert_eq!(DeviceFilesystemType::default(), DeviceFilesystemType::Xfs);
        assert_eq!(
            ChunkSizeCalculationPolicy::default(),
            ChunkSizeCalculationPolicy::Static
        );
        assert_eq!(MetadataSizePolicy::default(), MetadataSizePolicy::Host);
        assert_eq!(ReclaimPolicy::default(), ReclaimPolicy::Delete);
        assert_eq!(
            VolumeBindingMode::default(),
            VolumeBindingMode::WaitForFirstConsumer
        );
        let pool = ThinPoolConfig::default();
        assert_eq!(pool.size_percent_or_default(), 90);
        let options = StorageClassOptions::default();
        assert_eq!(options.reclaim_policy_or_default(), ReclaimPolicy::Delete);
    }

    #[test]
    fn empty_fields_are_omitted_like_go_omitempty() {
        let class = DeviceClass {
            name: "vg1".into(),
            ..DeviceClass::default()
        };
        assert_eq!(
            serde_json::to_value(&class).ok(),
            Some(serde_json::json!({"name": "vg1"}))
        );
        let status = LVMClusterStatus::default();
        assert_eq!(
            serde_json::to_value(&status).ok(),
            Some(serde_json::json!({}))
        );
    }

    #[test]
    fn node_status_flattens_the_volume_group_status() {
        let status = NodeStatus {
            node: "n1".into(),
            vg_status: VGStatus {
                name: "vg1".into(),
                status: Some(VGStatusType::Ready),
                devices: vec!["/dev/vdb".into()],
                ..VGStatus::default()
            },
        };
        assert_eq!(
            serde_json::to_value(&status).ok(),
            Some(
                serde_json::json!({"node": "n1", "name": "vg1", "status": "Ready", "devices": ["/dev/vdb"]})
            )
        );
    }

    #[test]
    fn unset_and_local_access_policies_mean_node_local() {
        let mut class = DeviceClass::default();
        assert!(!class.is_shared());
        assert_eq!(
            class.access_policy_or_default(),
            DeviceAccessPolicy::NodeLocal
        );
        class.device_access_policy = Some(DeviceAccessPolicy::Local);
        assert!(!class.is_shared());
        assert_eq!(
            class.access_policy_or_default(),
            DeviceAccessPolicy::NodeLocal
        );
        class.device_access_policy = Some(DeviceAccessPolicy::Shared);
        assert!(class.is_shared());
        assert_eq!(class.access_policy_or_default(), DeviceAccessPolicy::Shared);
        let values: Vec<&str> = DeviceAccessPolicy::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(values, ["nodeLocal", "local", "shared"]);
    }

    #[test]
    fn shared_config_defaults_are_linear_full_and_ten_seconds() {
        let config = DeviceClass::default().shared_config_or_default();
        assert_eq!(config.volume_mode_or_default(), SharedVolumeMode::Linear);
        assert_eq!(config.wipe_policy_or_default(), WipePolicy::Full);
        assert_eq!(
            config.io_timeout_seconds_or_default(),
            DEFAULT_IO_TIMEOUT_SECONDS
        );
        assert_eq!(DEFAULT_IO_TIMEOUT_SECONDS, 10);
        assert_eq!(SharedVolumeMode::Linear.parameter_value(), "linear");
        assert_eq!(SharedVolumeMode::Thin.parameter_value(), "thin");
    }

    #[test]
    fn shared_class_reads_its_json_names() {
        let class: DeviceClass = serde_json::from_value(serde_json::json!({
            "name": "san",
            "deviceAccessPolicy": "shared",
            "sharedConfig": {"volumeMode": "Thin", "wipePolicy": "UnsafeFast", "ioTimeoutSeconds": 20},
        }))
        .unwrap_or_default();
        assert!(class.is_shared());
        let config = class.shared_config_or_default();
        assert_eq!(config.volume_mode_or_default(), SharedVolumeMode::Thin);
        assert_eq!(config.wipe_policy_or_default(), WipePolicy::UnsafeFast);
        assert_eq!(config.io_timeout_seconds_or_default(), 20);
    }

    #[test]
    fn shared_node_status_omits_what_is_unset() {
        let vg = VGStatus {
            name: "san".into(),
            shared: Some(Box::default()),
            ..VGStatus::default()
        };
        assert_eq!(
            serde_json::to_value(&vg).ok(),
            Some(serde_json::json!({"name": "san", "shared": {"lockspace": "NotJoined"}}))
        );
        let joined = SharedVGStatus {
            devices_visible: true,
            lockspace: LockspaceState::Joined,
            host_id: Some(7),
            io_timeout_seconds: Some(10),
            reason: String::new(),
            ..SharedVGStatus::default()
        };
        assert_eq!(
            serde_json::to_value(&joined).ok(),
            Some(
                serde_json::json!({"devicesVisible": true, "lockspace": "Joined", "hostId": 7,
                "ioTimeoutSeconds": 10})
            )
        );
    }

    #[test]
    fn host_dead_seconds_follow_sanlock_timeouts() {
        let config = |n| SharedConfig {
            io_timeout_seconds: Some(n),
            ..SharedConfig::default()
        };
        assert_eq!(SharedConfig::default().host_dead_seconds(), 140);
        assert_eq!(SharedConfig::default().renewal_fail_seconds(), 80);
        assert_eq!(config(10).host_dead_seconds(), 140);
        assert_eq!(config(5).host_dead_seconds(), 100);
        assert_eq!(config(5).renewal_fail_seconds(), 40);
        assert_eq!(config(60).host_dead_seconds(), 540);
        assert_eq!(config(60).renewal_fail_seconds(), 480);
    }

    #[test]
    fn watchdog_policy_defaults_to_required() {
        assert_eq!(
            SharedConfig::default().watchdog_or_default(),
            WatchdogPolicy::Required
        );
        let config: SharedConfig =
            serde_json::from_value(serde_json::json!({"watchdog": "Disabled"})).unwrap_or_default();
        assert_eq!(config.watchdog_or_default(), WatchdogPolicy::Disabled);
        let values: Vec<&str> = WatchdogState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(values, ["Armed", "Softdog", "Missing", "Disabled"]);
        assert!(WatchdogState::Softdog.is_armed());
        assert!(!WatchdogState::Missing.is_armed());
    }

    #[test]
    fn shared_timing_of_a_class_reads_its_config() {
        let config = SharedConfig {
            io_timeout_seconds: Some(20),
            watchdog: Some(WatchdogPolicy::Disabled),
            ..SharedConfig::default()
        };
        assert_eq!(
            serde_json::to_value(SharedTiming::of(&config)).ok(),
            Some(
                serde_json::json!({"ioTimeoutSeconds": 20, "renewalFailSeconds": 160,
                "hostDeadSeconds": 220, "watchdog": "Disabled"})
            )
        );
    }

    #[test]
    fn shared_node_status_without_fencing_still_reads() {
        let old: SharedVGStatus =
            serde_json::from_value(serde_json::json!({"lockspace": "Joined", "hostId": 2}))
                .unwrap_or_default();
        assert_eq!(old.fencing, None);
        assert!(old.live_host_ids.is_empty());
        let new = SharedVGStatus {
            lockspace: LockspaceState::Joined,
            fencing: Some(FencingStatus {
                watchdog: WatchdogState::Softdog,
                kill_hook: true,
                lease_renewal_failures: 2,
                message: String::new(),
                fenced: false,
            }),
            live_host_ids: vec![1, 2],
            dead_host_ids: vec![3],
            ..SharedVGStatus::default()
        };
        assert_eq!(
            serde_json::to_value(&new).ok(),
            Some(
                serde_json::json!({"lockspace": "Joined", "liveHostIds": [1, 2], "deadHostIds": [3],
                "fencing": {"watchdog": "Softdog", "killHook": true, "leaseRenewalFailures": 2}})
            )
        );
    }

    #[test]
    fn all_paths_lists_required_then_optional_paths() {
        let class = DeviceClass {
            name: "vg1".into(),
            device_selector: Some(DeviceSelector {
                paths: vec!["/dev/a".into()],
                optional_paths: vec!["/dev/b".into()],
                device_patterns: vec![],
                force_wipe_devices_and_destroy_all_data: None,
            }),
            ..DeviceClass::default()
        };
        assert_eq!(class.all_paths().collect::<Vec<_>>(), ["/dev/a", "/dev/b"]);
    }
}
