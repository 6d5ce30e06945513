//! A device class as the node engine takes it: the same field names LVMS users write in an `LVMCluster`
//! device class, so the node agent can later fill it straight from an `LVMVolumeGroup`.

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// The ownership tag put on every volume group lvms-rs creates. LVMS tags its volume groups the same way,
/// so volume groups made by LVMS are recognised as ours after a migration.
pub const VG_OWNER_TAG: &str = "lvms";

/// The tag metal-stack csi-driver-lvm puts on the volume group it creates (`csi-lvm` by default).
pub const CSI_DRIVER_LVM_VG_TAG: &str = "vg.metal-stack.io/csi-lvm-driver";

/// The tag metal-stack csi-driver-lvm puts on each logical volume it creates.
pub const CSI_DRIVER_LVM_LV_TAG: &str = "lv.metal-stack.io/csi-lvm-driver";

/// csi-driver-lvm's default volume group name (its Helm value `lvm.vgName`).
pub const CSI_DRIVER_LVM_VG_NAME: &str = "csi-lvm";

/// Another driver whose existing volume group a device class takes over (ADR 0023).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Adopt {
    /// metal-stack csi-driver-lvm: a volume group tagged [`CSI_DRIVER_LVM_VG_TAG`].
    #[serde(rename = "csi-driver-lvm")]
    CsiDriverLvm,
}

impl Adopt {
    /// The tag the other driver's volume group must carry to be adopted.
    pub const fn vg_tag(self) -> &'static str {
        match self {
            Adopt::CsiDriverLvm => CSI_DRIVER_LVM_VG_TAG,
        }
    }

    /// The value as written in a configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Adopt::CsiDriverLvm => "csi-driver-lvm",
        }
    }
}

/// The node engine's configuration: one or more device classes for this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    pub device_classes: Vec<DeviceClassConfig>,
    /// This node's part in shared device classes (standalone mode; the node agent gets the same from
    /// the API). Required when a class is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<SharedNodeConfig>,
}

/// What a node needs to take part in shared device classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedNodeConfig {
    /// This node's sanlock host id, 1–2000, unique among every node that sees the LUNs.
    pub host_id: u16,
    /// Whether this node may create a shared volume group that does not exist yet. Exactly one node
    /// should (on Kubernetes a Lease picks it): LVM does not protect the first `vgcreate --shared`.
    #[serde(default)]
    pub create_volume_groups: bool,
}

impl NodeConfig {
    /// What the classes other than `class` select (which `class` never discovers or matches).
    pub fn claims_of_others(&self, class: &str) -> Claims {
        Claims::of(
            self.device_classes
                .iter()
                .filter(|c| c.name != class)
                .map(|c| &c.device_selector),
        )
    }
}

/// The devices other device classes on a node select, by path or by pattern: a class that discovers
/// its devices or matches them by pattern never takes them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claims {
    /// Paths as configured (`paths` and `optionalPaths`).
    pub paths: Vec<String>,
    /// `devicePatterns` items as configured.
    pub patterns: Vec<String>,
}

impl Claims {
    /// The claims of `selectors`.
    pub fn of<'a>(selectors: impl IntoIterator<Item = &'a DeviceSelector>) -> Self {
        let mut out = Self::default();
        for s in selectors {
            out.paths
                .extend(s.paths.iter().chain(&s.optional_paths).cloned());
            out.patterns.extend(s.device_patterns.iter().cloned());
        }
        out
    }
}

/// One device class: a volume group (named after the class) with an optional thin pool or RAID layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceClassConfig {
    /// Device class name; also the volume group's name.
    pub name: String,
    #[serde(default)]
    pub device_selector: DeviceSelector,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin_pool_config: Option<ThinPoolConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raid_config: Option<RaidConfig>,
    #[serde(default)]
    pub default: bool,
    /// The filesystem of a blank volume whose request names none; the driver's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fstype: Option<Fstype>,
    /// Without device paths: whether disks attached later are added (`Dynamic`) or only those found
    /// when the volume group is made (`Static`). No effect when paths are listed.
    #[serde(default)]
    pub device_discovery_policy: DiscoveryPolicy,
    /// `nodeLocal` (the default; `local` is accepted too) or `shared`: one volume group on LUNs that
    /// several nodes see, under lvmlockd and sanlock.
    #[serde(default, skip_serializing_if = "AccessPolicy::is_node_local")]
    pub device_access_policy: AccessPolicy,
    /// Settings of a shared class (defaults when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_config: Option<SharedConfig>,
    /// Take over the volume group of this class's name that another driver made (tagged as that
    /// driver tags it) instead of creating one: it is tagged ours, and nothing on its devices is
    /// wiped or created. Its logical volumes stay, reported as foreign (ADR 0023).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopt: Option<Adopt>,
}

impl DeviceClassConfig {
    /// Whether the class is a shared-LUN class.
    pub fn is_shared(&self) -> bool {
        self.device_access_policy == AccessPolicy::Shared
    }

    /// The shared settings in effect (defaults when absent).
    pub fn shared_or_default(&self) -> SharedConfig {
        self.shared_config.unwrap_or_default()
    }
}

/// Whether a class's volume group is on one node's disks or on LUNs many nodes see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AccessPolicy {
    #[default]
    #[serde(rename = "nodeLocal", alias = "local")]
    NodeLocal,
    #[serde(rename = "shared")]
    Shared,
}

impl AccessPolicy {
    pub fn is_node_local(&self) -> bool {
        *self == Self::NodeLocal
    }
}

/// How a shared class makes volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum SharedVolumeMode {
    /// Linear volumes, created inactive and activated where they are staged.
    #[default]
    Linear,
    /// One thin pool per volume, active on one node at a time.
    Thin,
}

/// Whether new linear volumes of a shared class are zeroed before first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum WipePolicy {
    /// Zero the whole volume (a shared LUN holds earlier tenants' data).
    #[default]
    Full,
    /// Hand the volume out as LVM allocated it: fast, may expose old data.
    UnsafeFast,
}

/// sanlock's default I/O timeout in seconds.
pub const DEFAULT_IO_TIMEOUT_SECONDS: u16 = 10;

/// Settings of a shared device class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SharedConfig {
    #[serde(default)]
    pub volume_mode: SharedVolumeMode,
    #[serde(default)]
    pub wipe_policy: WipePolicy,
    /// sanlock's I/O timeout for the class's lockspace, 5–60 s.
    #[serde(default = "default_io_timeout")]
    pub io_timeout_seconds: u16,
    /// `Required` (default): the class is ready only where fencing is armed (watchdog and the
    /// `lvms fence` kill hook); `Disabled`: the admin opted out.
    #[serde(default)]
    pub watchdog: WatchdogPolicy,
}

impl Default for SharedConfig {
    fn default() -> Self {
        Self {
            volume_mode: SharedVolumeMode::default(),
            wipe_policy: WipePolicy::default(),
            io_timeout_seconds: DEFAULT_IO_TIMEOUT_SECONDS,
            watchdog: WatchdogPolicy::default(),
        }
    }
}

fn default_io_timeout() -> u16 {
    DEFAULT_IO_TIMEOUT_SECONDS
}

/// How a device class without device paths finds its disks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum DiscoveryPolicy {
    /// The free disks found when the volume group is made; later disks are left alone.
    #[default]
    Static,
    /// Every free disk, also those attached later.
    Dynamic,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceSelector {
    /// Devices that must all be usable (`/dev/...`, symlinks such as `/dev/disk/by-id/...` allowed).
    /// With neither `paths` nor `optionalPaths` the class discovers the node's free whole disks (see
    /// [`crate::plan`]).
    #[serde(default)]
    pub paths: Vec<String>,
    /// Devices of which at least one must be usable.
    #[serde(default)]
    pub optional_paths: Vec<String>,
    /// Glob patterns (Go `filepath.Glob` syntax, as csi-driver-lvm's `devicePattern`; an item may be
    /// a comma-separated list) that select devices by any of their names: `/dev/<kernel name>`, the
    /// device node and its `/dev/disk/by-id` links. Matched devices are optional, pass every safety
    /// filter and are never wiped; under `Static` discovery only the ones found when the volume
    /// group is made are taken (see [`crate::plan`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_patterns: Vec<String>,
    /// Wipe every signature from the selected devices before use. Destroys their data.
    #[serde(default)]
    pub force_wipe_devices_and_destroy_all_data: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CalculationPolicy {
    /// Let LVM compute the value from the host's devices.
    Host,
    /// Use the configured (or default) value.
    #[default]
    Static,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ThinPoolConfig {
    pub name: String,
    /// Percentage of the volume group's free space given to the pool (10–100).
    #[serde(default = "default_size_percent")]
    pub size_percent: u8,
    /// How many times the pool's size may be promised to thin volumes (1–100).
    pub overprovision_ratio: u32,
    #[serde(default)]
    pub chunk_size_calculation_policy: CalculationPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<ByteSize>,
    #[serde(default)]
    pub metadata_size_calculation_policy: CalculationPolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata_size: Option<ByteSize>,
}

fn default_size_percent() -> u8 {
    90
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RaidType {
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

impl RaidType {
    /// The LVM segment type (`--type`).
    pub fn as_lvm(self) -> &'static str {
        match self {
            Self::Raid1 => "raid1",
            Self::Raid4 => "raid4",
            Self::Raid5 => "raid5",
            Self::Raid6 => "raid6",
            Self::Raid10 => "raid10",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RaidConfig {
    #[serde(rename = "type")]
    pub raid_type: RaidType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirrors: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_size: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fstype {
    #[default]
    Xfs,
    Ext4,
}

/// Whether a shared class needs armed fencing (`sharedConfig.watchdog`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum WatchdogPolicy {
    /// Fencing must be armed for the class to be Ready.
    #[default]
    Required,
    /// The admin opted out.
    Disabled,
}
