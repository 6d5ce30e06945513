//! The one conversion from the API's device class (an `LVMVolumeGroup`'s spec, which the operator
//! renders from an `LVMCluster`'s device class) to the engine's [`DeviceClassConfig`]; the standalone
//! driver's config file deserializes into [`DeviceClassConfig`] directly.

use lvms_api::{
    ChunkSizeCalculationPolicy, DeviceDiscoveryPolicy, LVMVolumeGroup, MetadataSizePolicy,
};

use crate::{
    config::{
        Access, Adopt, CalculationPolicy, DEFAULT_IO_TIMEOUT_SECONDS, DeviceClassConfig,
        DeviceSelector, DiscoveryPolicy, RaidConfig, RaidType, SharedConfig, SharedVolumeMode,
        ThinPoolConfig, WipePolicy,
    },
    shared::fencing,
    size::ByteSize,
};

/// A size field (a Quantity's text) in bytes, or why not, naming the field.
fn quantity(field: &str, text: &str) -> Result<ByteSize, String> {
    text.parse::<ByteSize>()
        .map_err(|e| format!("{field}: {e}"))
}

fn positive(field: &str, n: i32) -> Result<u32, String> {
    u32::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{field} is {n}: give a positive number"))
}

/// The node engine's configuration for `vg` (the class is named after the object), or why there is
/// none, naming the field.
pub fn device_class_config(vg: &LVMVolumeGroup) -> Result<DeviceClassConfig, String> {
    let spec = &vg.spec;
    let selector = spec.device_selector.clone().unwrap_or_default();
    let thin_pool_config = match &spec.thin_pool_config {
        None => None,
        Some(tp) => {
            let size_percent = u8::try_from(tp.size_percent_or_default()).map_err(|_| {
                "thinPoolConfig.sizePercent: give a percentage from 10 to 100".to_owned()
            })?;
            let chunk_size_calculation_policy = match tp.chunk_size_policy_or_default() {
                ChunkSizeCalculationPolicy::Host => CalculationPolicy::Host,
                ChunkSizeCalculationPolicy::Static => CalculationPolicy::Static,
            };
            let chunk_size = match (&tp.chunk_size, chunk_size_calculation_policy) {
                (Some(q), _) => Some(quantity("thinPoolConfig.chunkSize", &q.0)?),
                (None, CalculationPolicy::Static) => Some(quantity(
                    "thinPoolConfig.chunkSize",
                    lvms_api::DEFAULT_CHUNK_SIZE,
                )?),
                (None, CalculationPolicy::Host) => None,
            };
            let metadata_size_calculation_policy = match tp.metadata_size_policy_or_default() {
                MetadataSizePolicy::Host => CalculationPolicy::Host,
                MetadataSizePolicy::Static => CalculationPolicy::Static,
            };
            Some(ThinPoolConfig {
                name: tp.name.clone(),
                size_percent,
                overprovision_ratio: positive(
                    "thinPoolConfig.overprovisionRatio",
                    tp.overprovision_ratio,
                )?,
                chunk_size_calculation_policy,
                chunk_size,
                metadata_size_calculation_policy,
                metadata_size: tp
                    .metadata_size
                    .as_ref()
                    .map(|q| quantity("thinPoolConfig.metadataSize", &q.0))
                    .transpose()?,
            })
        }
    };
    let raid_config = match &spec.raid_config {
        None => None,
        Some(r) => Some(RaidConfig {
            raid_type: match r.raid_type {
                lvms_api::RaidType::Raid1 => RaidType::Raid1,
                lvms_api::RaidType::Raid4 => RaidType::Raid4,
                lvms_api::RaidType::Raid5 => RaidType::Raid5,
                lvms_api::RaidType::Raid6 => RaidType::Raid6,
                lvms_api::RaidType::Raid10 => RaidType::Raid10,
            },
            mirrors: r
                .mirrors
                .map(|m| positive("raidConfig.mirrors", m))
                .transpose()?,
            stripes: r
                .stripes
                .map(|s| positive("raidConfig.stripes", s))
                .transpose()?,
            stripe_size: r
                .stripe_size
                .as_ref()
                .map(|q| quantity("raidConfig.stripeSize", &q.0))
                .transpose()?,
        }),
    };
    Ok(DeviceClassConfig {
        name: vg.metadata.name.clone().unwrap_or_default(),
        device_selector: DeviceSelector {
            paths: selector.paths,
            optional_paths: selector.optional_paths,
            device_patterns: selector.device_patterns,
            force_wipe_devices_and_destroy_all_data: selector
                .force_wipe_devices_and_destroy_all_data
                .unwrap_or(false),
        },
        thin_pool_config,
        raid_config,
        default: spec.default,
        // The filesystem is the StorageClass's business (it reaches the node in the capability); the
        // engine does not use it.
        fstype: None,
        device_discovery_policy: match spec.device_discovery_policy {
            Some(DeviceDiscoveryPolicy::Dynamic) => DiscoveryPolicy::Dynamic,
            Some(DeviceDiscoveryPolicy::Static) | None => DiscoveryPolicy::Static,
        },
        access: if spec.is_shared() {
            let c = spec.shared_config.clone().unwrap_or_default();
            Access::Shared(SharedConfig {
                volume_mode: c.volume_mode_or_default().into(),
                wipe_policy: match c.wipe_policy_or_default() {
                    lvms_api::WipePolicy::Full => WipePolicy::Full,
                    lvms_api::WipePolicy::UnsafeFast => WipePolicy::UnsafeFast,
                },
                io_timeout_seconds: u16::try_from(c.io_timeout_seconds_or_default())
                    .unwrap_or(DEFAULT_IO_TIMEOUT_SECONDS),
                watchdog: if c.watchdog_or_default() == lvms_api::WatchdogPolicy::Disabled {
                    fencing::Policy::Disabled
                } else {
                    fencing::Policy::Required
                },
            })
        } else {
            Access::NodeLocal
        },
        adopt: spec.adopt.map(|a| match a {
            lvms_api::AdoptFrom::CsiDriverLvm => Adopt::CsiDriverLvm,
            lvms_api::AdoptFrom::TopoLvm => Adopt::TopoLvm,
        }),
    })
}

impl From<lvms_api::SharedVolumeMode> for SharedVolumeMode {
    fn from(mode: lvms_api::SharedVolumeMode) -> Self {
        match mode {
            lvms_api::SharedVolumeMode::Linear => Self::Linear,
            lvms_api::SharedVolumeMode::Thin => Self::Thin,
        }
    }
}

impl From<SharedVolumeMode> for lvms_api::SharedVolumeMode {
    fn from(mode: SharedVolumeMode) -> Self {
        match mode {
            SharedVolumeMode::Linear => Self::Linear,
            SharedVolumeMode::Thin => Self::Thin,
        }
    }
}
