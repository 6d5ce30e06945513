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

/// csi-driver-lvm's CSI driver name (its Helm value `lvm.driverName`), under which the node agent
/// serves its existing volumes for classes with `adopt: csi-driver-lvm` (ADR 0033).
pub const CSI_DRIVER_LVM_DRIVER_NAME: &str = "lvm.csi.metal-stack.io";

/// csi-driver-lvm's topology key: its PersistentVolumes' node affinity names the node under it
/// (csi-driver-lvm `pkg/server/node.go`).
pub const CSI_DRIVER_LVM_TOPOLOGY_KEY: &str = "topology.lvm.csi/node";

/// csi-driver-lvm's default volume group name (its Helm value `lvm.vgName`).
pub const CSI_DRIVER_LVM_VG_NAME: &str = "csi-lvm";

/// Another driver whose existing volume group a device class takes over (ADRs 0023, 0032).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Adopt {
    /// metal-stack csi-driver-lvm: a volume group tagged [`CSI_DRIVER_LVM_VG_TAG`].
    #[serde(rename = "csi-driver-lvm")]
    CsiDriverLvm,
    /// TopoLVM's lvmd: a volume group the admin made for an lvmd device class, which carries no
    /// tag (lvmd never tags it). Any such group named like the class, unless another driver's tag
    /// marks it.
    #[serde(rename = "topolvm")]
    TopoLvm,
}

impl Adopt {
    /// Why the group with `tags` is not this driver's, or `None` when it is adopted.
    pub fn refuses(self, tags: &[String]) -> Option<String> {
        let has = |tag: &str| tags.iter().any(|t| t == tag);
        match self {
            Adopt::CsiDriverLvm if !has(CSI_DRIVER_LVM_VG_TAG) => Some(format!(
                "it lacks the {CSI_DRIVER_LVM_VG_TAG:?} tag csi-driver-lvm puts on its groups"
            )),
            Adopt::TopoLvm if has(CSI_DRIVER_LVM_VG_TAG) => Some(format!(
                "it carries csi-driver-lvm's tag {CSI_DRIVER_LVM_VG_TAG:?}: use adopt: \
                 csi-driver-lvm"
            )),
            _ => None,
        }
    }

    /// Where the group's name comes from, for the class to be named after it.
    pub const fn group_name_hint(self) -> &'static str {
        match self {
            Adopt::CsiDriverLvm => "csi-driver-lvm's lvm.vgName, default csi-lvm",
            Adopt::TopoLvm => {
                "lvmd.yaml's device class name; where its volume-group differs, rename the group \
                 after the class (vgrename <volume-group> <class>) once TopoLVM's node plugin is \
                 stopped"
            }
        }
    }

    /// The value as written in a configuration.
    pub const fn as_str(self) -> &'static str {
        match self {
            Adopt::CsiDriverLvm => "csi-driver-lvm",
            Adopt::TopoLvm => "topolvm",
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

/// One device class, the model every role uses: a volume group (named after the class) on this node's
/// disks or on LUNs several nodes see ([`Access`]), with an optional thin pool or RAID layout.
///
/// The standalone config file deserializes into it (through [`wire::DeviceClassFile`], which keeps
/// LVMS's field names); an `LVMVolumeGroup` converts into it once, in [`crate::from_api`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "wire::DeviceClassFile", into = "wire::DeviceClassFile")]
pub struct DeviceClassConfig {
    /// Device class name; also the volume group's name.
    pub name: String,
    pub device_selector: DeviceSelector,
    pub thin_pool_config: Option<ThinPoolConfig>,
    pub raid_config: Option<RaidConfig>,
    pub default: bool,
    /// The filesystem of a blank volume whose request names none; the driver's default when absent.
    pub fstype: Option<Fstype>,
    /// Without device paths: whether disks attached later are added (`Dynamic`) or only those found
    /// when the volume group is made (`Static`). No effect when paths are listed.
    pub device_discovery_policy: DiscoveryPolicy,
    /// Where the volume group lives; a shared class carries its settings.
    pub access: Access,
    /// Take over the volume group of this class's name that another driver made (tagged as that
    /// driver tags it) instead of creating one: it is tagged ours, and nothing on its devices is
    /// wiped or created. Its logical volumes stay, reported as foreign (ADR 0023).
    pub adopt: Option<Adopt>,
}

/// Where a device class's volume group lives. The shared settings exist only on the shared variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Access {
    /// On this node's own disks (`deviceAccessPolicy: nodeLocal`, the default).
    #[default]
    NodeLocal,
    /// On LUNs several nodes see, under lvmlockd and sanlock (`deviceAccessPolicy: shared`).
    Shared(SharedConfig),
}

impl DeviceClassConfig {
    /// A node-local, linear class named `name` that discovers its disks: the start of a class
    /// built in code (tests, benchmarks).
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            device_selector: DeviceSelector::default(),
            thin_pool_config: None,
            raid_config: None,
            default: false,
            fstype: None,
            device_discovery_policy: DiscoveryPolicy::default(),
            access: Access::NodeLocal,
            adopt: None,
        }
    }

    /// The class with thin pool `pool`, overprovisioned up to `ratio` times.
    pub fn with_thin_pool(mut self, pool: &str, ratio: u32) -> Self {
        self.thin_pool_config = Some(ThinPoolConfig {
            name: pool.to_owned(),
            size_percent: default_size_percent(),
            overprovision_ratio: ratio,
            chunk_size_calculation_policy: CalculationPolicy::default(),
            chunk_size: None,
            metadata_size_calculation_policy: CalculationPolicy::default(),
            metadata_size: None,
        });
        self
    }

    /// The class made shared, with `shared` settings.
    pub fn with_shared(mut self, shared: SharedConfig) -> Self {
        self.access = Access::Shared(shared);
        self
    }

    /// The class marked as the default one.
    pub fn as_default(mut self) -> Self {
        self.default = true;
        self
    }

    /// Whether the class is a shared-LUN class.
    pub fn is_shared(&self) -> bool {
        self.shared().is_some()
    }

    /// A shared class's settings; `None` for a class on this node's own disks.
    pub fn shared(&self) -> Option<&SharedConfig> {
        match &self.access {
            Access::NodeLocal => None,
            Access::Shared(s) => Some(s),
        }
    }

    /// The thin pool volumes are made in; `None` for a thick class.
    pub fn thin_pool(&self) -> Option<&str> {
        self.thin_pool_config.as_ref().map(|t| t.name.as_str())
    }

    /// Thin classes: how far the pool may be overprovisioned (virtual size ÷ pool size); 1 otherwise.
    pub fn overprovision_ratio(&self) -> u32 {
        self.thin_pool_config
            .as_ref()
            .map_or(1, |t| t.overprovision_ratio)
    }

    /// Thick classes: the layout of a volume whose request names none (linear, or the RAID layout
    /// of the class's `raidConfig`). Thin volumes have none (linear): a thin class's `raidConfig`
    /// is its pool's layout (ADR 0031).
    pub fn layout(&self) -> crate::layout::Layout {
        match (&self.thin_pool_config, &self.raid_config) {
            (None, Some(raid)) => crate::layout::Layout::of_raid_config(raid),
            _ => crate::layout::Layout::Linear,
        }
    }

    /// The class as a volume of volume mode `mode` sees it: a shared class with the request's mode
    /// in place of its `sharedConfig.volumeMode`; other classes, or no mode, unchanged.
    pub fn with_volume_mode(&self, mode: Option<SharedVolumeMode>) -> Self {
        let mut out = self.clone();
        if let (Access::Shared(shared), Some(mode)) = (&mut out.access, mode) {
            shared.volume_mode = mode;
        }
        out
    }

    /// Whether the class's volumes are thin (a thin pool, or a shared class in thin mode), so that
    /// they can be snapshotted and cloned.
    pub fn makes_thin(&self) -> bool {
        self.thin_pool_config.is_some()
            || self
                .shared()
                .is_some_and(|s| s.volume_mode == SharedVolumeMode::Thin)
    }

    /// Whether volumes of the class can be active on several nodes at once (shared linear): the
    /// only ones that may be staged MULTI_NODE_* (block only).
    pub fn multi_node(&self) -> bool {
        self.shared()
            .is_some_and(|s| s.volume_mode == SharedVolumeMode::Linear)
            && self.thin_pool_config.is_none()
    }
}

/// The config file's form of a device class: LVMS's field names, with `deviceAccessPolicy` and
/// `sharedConfig` beside each other. Converted to [`DeviceClassConfig`] on reading, where a
/// `sharedConfig` on a node-local class is refused.
mod wire {
    use serde::{Deserialize, Serialize};

    use super::{
        Access, Adopt, DeviceClassConfig, DeviceSelector, DiscoveryPolicy, Fstype, RaidConfig,
        SharedConfig, ThinPoolConfig,
    };

    #[derive(Debug, Clone, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    pub struct DeviceClassFile {
        name: String,
        #[serde(default)]
        device_selector: DeviceSelector,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thin_pool_config: Option<ThinPoolConfig>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raid_config: Option<RaidConfig>,
        #[serde(default)]
        default: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fstype: Option<Fstype>,
        #[serde(default)]
        device_discovery_policy: DiscoveryPolicy,
        /// `nodeLocal` (the default; `local` is accepted too) or `shared`.
        #[serde(default, skip_serializing_if = "AccessPolicy::is_node_local")]
        device_access_policy: AccessPolicy,
        /// Settings of a shared class (defaults when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shared_config: Option<SharedConfig>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        adopt: Option<Adopt>,
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
    enum AccessPolicy {
        #[default]
        #[serde(rename = "nodeLocal", alias = "local")]
        NodeLocal,
        #[serde(rename = "shared")]
        Shared,
    }

    impl AccessPolicy {
        fn is_node_local(&self) -> bool {
            *self == Self::NodeLocal
        }
    }

    impl TryFrom<DeviceClassFile> for DeviceClassConfig {
        type Error = String;

        fn try_from(f: DeviceClassFile) -> Result<Self, String> {
            let access = match (f.device_access_policy, f.shared_config) {
                (AccessPolicy::NodeLocal, Some(_)) => {
                    return Err(format!(
                        "device class {:?}: sharedConfig applies only to shared device classes: \
                         set deviceAccessPolicy: shared or remove sharedConfig",
                        f.name
                    ));
                }
                (AccessPolicy::NodeLocal, None) => Access::NodeLocal,
                (AccessPolicy::Shared, shared) => Access::Shared(shared.unwrap_or_default()),
            };
            Ok(DeviceClassConfig {
                name: f.name,
                device_selector: f.device_selector,
                thin_pool_config: f.thin_pool_config,
                raid_config: f.raid_config,
                default: f.default,
                fstype: f.fstype,
                device_discovery_policy: f.device_discovery_policy,
                access,
                adopt: f.adopt,
            })
        }
    }

    impl From<DeviceClassConfig> for DeviceClassFile {
        fn from(c: DeviceClassConfig) -> Self {
            let (device_access_policy, shared_config) = match c.access {
                Access::NodeLocal => (AccessPolicy::NodeLocal, None),
                Access::Shared(s) => (AccessPolicy::Shared, Some(s)),
            };
            Self {
                name: c.name,
                device_selector: c.device_selector,
                thin_pool_config: c.thin_pool_config,
                raid_config: c.raid_config,
                default: c.default,
                fstype: c.fstype,
                device_discovery_policy: c.device_discovery_policy,
                device_access_policy,
                shared_config,
                adopt: c.adopt,
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn class(yaml: &str) -> Result<DeviceClassConfig, String> {
        serde_norway::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn a_shared_class_reads_into_the_shared_variant_and_writes_back_the_same_fields() {
        let c = class("name: san\ndeviceAccessPolicy: shared\nsharedConfig:\n  volumeMode: Thin\n")
            .unwrap();
        assert_eq!(
            c.access,
            Access::Shared(SharedConfig {
                volume_mode: SharedVolumeMode::Thin,
                ..SharedConfig::default()
            })
        );
        assert!(c.makes_thin() && !c.multi_node());
        let back = serde_json::to_value(&c).unwrap();
        assert_eq!(back["deviceAccessPolicy"], "shared");
        assert_eq!(back["sharedConfig"]["volumeMode"], "Thin");
        assert_eq!(class(&serde_json::to_string(&back).unwrap()).unwrap(), c);
    }

    #[test]
    fn a_shared_class_without_settings_gets_the_defaults() {
        let c = class("name: san\ndeviceAccessPolicy: shared\n").unwrap();
        assert_eq!(c.shared(), Some(&SharedConfig::default()));
        assert!(c.multi_node());
    }

    #[test]
    fn a_node_local_class_has_no_shared_settings_and_writes_no_policy() {
        for yaml in ["name: vg1\n", "name: vg1\ndeviceAccessPolicy: local\n"] {
            let c = class(yaml).unwrap();
            assert_eq!(c.access, Access::NodeLocal, "{yaml}");
            let back = serde_json::to_value(&c).unwrap();
            assert!(back.get("deviceAccessPolicy").is_none(), "{back}");
            assert!(back.get("sharedConfig").is_none(), "{back}");
        }
    }

    #[test]
    fn shared_settings_on_a_node_local_class_are_refused_naming_the_field_and_the_fix() {
        let err = class("name: vg1\nsharedConfig:\n  volumeMode: Thin\n").unwrap_err();
        assert!(err.contains("sharedConfig"), "{err}");
        assert!(
            err.contains("set deviceAccessPolicy: shared or remove sharedConfig"),
            "{err}"
        );
    }

    #[test]
    fn the_class_answers_for_its_pool_ratio_and_layout() {
        let thin = DeviceClassConfig::named("vg1").with_thin_pool("pool", 5);
        assert_eq!(
            (thin.thin_pool(), thin.overprovision_ratio()),
            (Some("pool"), 5)
        );
        let thick = DeviceClassConfig::named("vg2");
        assert_eq!((thick.thin_pool(), thick.overprovision_ratio()), (None, 1));
        assert_eq!(thick.layout(), crate::layout::Layout::Linear);
        let raid = Some(RaidConfig {
            raid_type: RaidType::Raid1,
            mirrors: None,
            stripes: None,
            stripe_size: None,
        });
        let raid_thick = DeviceClassConfig {
            raid_config: raid.clone(),
            ..thick.clone()
        };
        assert_eq!(raid_thick.layout().name(), "raid1");
        // A RAID thin class's volumes are thin: the RAID layout is the pool's.
        let raid_thin = DeviceClassConfig {
            raid_config: raid,
            ..thin.clone()
        };
        assert_eq!(raid_thin.layout(), crate::layout::Layout::Linear);
        let shared = thick.with_shared(SharedConfig::default());
        let as_thin = shared.with_volume_mode(Some(SharedVolumeMode::Thin));
        assert!(!shared.makes_thin() && as_thin.makes_thin());
    }
}
