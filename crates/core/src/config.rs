//! A device class as the node engine takes it: the same field names LVMS users write in an `LVMCluster`
//! device class, so the node agent can later fill it straight from an `LVMVolumeGroup`.

use serde::{Deserialize, Serialize};

use crate::size::ByteSize;

/// The ownership tag put on every volume group lvms-rs creates. LVMS tags its volume groups the same way,
/// so volume groups made by LVMS are recognised as ours after a migration.
pub const VG_OWNER_TAG: &str = "lvms";

/// The node engine's configuration: one or more device classes for this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConfig {
    pub device_classes: Vec<DeviceClassConfig>,
}

impl NodeConfig {
    /// The device paths the classes other than `class` list (which `class`, when it lists none,
    /// never discovers).
    pub fn paths_of_others(&self, class: &str) -> Vec<String> {
        self.device_classes
            .iter()
            .filter(|c| c.name != class)
            .flat_map(|c| {
                c.device_selector
                    .paths
                    .iter()
                    .chain(&c.device_selector.optional_paths)
            })
            .cloned()
            .collect()
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
