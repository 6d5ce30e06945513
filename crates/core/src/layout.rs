//! How a thick volume lays out its extents, and the largest volume of each layout a volume group can
//! still make.
//!
//! One [`Layout`] serves every place that names a layout: the StorageClass parameters (lvms-rs's
//! `lvms.topolvm.io/lv-type` and csi-driver-lvm's `type`/`integrity`), the `LogicalVolume`'s
//! `spec.layout`, a class's `raidConfig` and the `lvcreate` arguments.
//!
//! # Capacity per layout
//! [`Layout::max_size`] answers from the free extents of each LVM physical volume of the group
//! ([`FreeSpace`]), the way lvm2's default (`normal`) allocation places a volume:
//! - linear: every free extent, anywhere;
//! - striped over `n` devices: `n` stripes of equal length on `n` different devices, so `n` times
//!   the free extents of the `n`-th emptiest device;
//! - RAID (mirror, raid1, raid4/5/6, raid10): `images` sub-volumes on different devices, each with
//!   one extent of RAID metadata (`_rmeta`) beside its data and, with dm-integrity, its integrity
//!   metadata (`_imeta`, 4 MiB per started 500 MiB of data, lvm2's rule, in whole extents). The
//!   volume holds `data_stripes` times one image's data.
//!
//! Each image is counted on one device (the `images`-th largest free space): lvm2 could spread an
//! image over several devices and so make a little more in unbalanced groups, but what is reported
//! can always be made. A layout that needs more devices than the group has can make nothing.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use lvms_api::topolvm::{LayoutType, VolumeLayout};
use serde::{Deserialize, Serialize};

use crate::{
    config::{RaidConfig, RaidType},
    size::{ByteSize, MIB},
};

/// How a thick volume lays out its extents (thin volumes have no choice).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// Linear (the default).
    #[default]
    Linear,
    /// Striped over `stripes` devices; `None`: over every LVM physical volume of the group
    /// (csi-driver-lvm's `type: striped`).
    Striped {
        stripes: Option<u32>,
        stripe_size: Option<u64>,
    },
    /// raid1 with `mirrors` extra copies (lvm2's `raid1`; the legacy `mirror` segment type, which
    /// needs a log device and dmeventd, is never used).
    Mirror {
        mirrors: u32,
        /// Skip the initial synchronisation of the copies (`--nosync`): the volume starts with
        /// copies that differ until each block is written once.
        nosync: bool,
        /// dm-integrity under each copy (`--raidintegrity y`): checksums that let RAID repair a
        /// silently corrupted block from another copy.
        integrity: bool,
    },
    /// A RAID level.
    Raid {
        level: RaidType,
        mirrors: Option<u32>,
        stripes: Option<u32>,
        stripe_size: Option<u64>,
        nosync: bool,
        integrity: bool,
    },
}

/// What a volume group has free on each of its LVM physical volumes: what the largest volume of
/// every layout is computed from. Published by the node agent, per thick class, so that the CSI
/// controller can answer `GetCapacity` for any layout.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FreeSpace {
    /// The group's extent size in bytes.
    pub extent_size: u64,
    /// Free extents of each LVM physical volume of the group, largest first.
    pub free_extents: Vec<u64>,
}

impl FreeSpace {
    /// Free space from the free bytes of each physical volume.
    pub fn new(extent_size: u64, free_bytes: impl IntoIterator<Item = u64>) -> Self {
        let mut free_extents: Vec<u64> = free_bytes
            .into_iter()
            .map(|b| b.checked_div(extent_size).unwrap_or(0))
            .collect();
        free_extents.sort_unstable_by(|a, b| b.cmp(a));
        Self {
            extent_size,
            free_extents,
        }
    }

    /// How many LVM physical volumes the group has.
    pub fn devices(&self) -> u64 {
        self.free_extents.len() as u64
    }
}

/// The extents of dm-integrity metadata lvm2 allocates for an image of `data` extents
/// (`_lv_size_bytes_to_integrity_meta_bytes`): 4 MiB for each started 500 MiB, plus room for the
/// journals that lvm2 2.03.2x adds (4 MiB up to 512 MiB of data, 8 MiB up to 1 GiB, 32 MiB up to
/// 4 GiB, 64 MiB beyond), rounded up to whole extents. Older lvm2 asks for less, so the answer is
/// never short on either.
pub fn integrity_metadata_extents(data: u64, extent_size: u64) -> u64 {
    if extent_size == 0 {
        return 0;
    }
    let data_bytes = data.saturating_mul(extent_size);
    let journals = match data_bytes {
        b if b <= 512 * MIB => 4 * MIB,
        b if b <= 1024 * MIB => 8 * MIB,
        b if b <= 4096 * MIB => 32 * MIB,
        _ => 64 * MIB,
    };
    let bytes = (data_bytes / (500 * MIB) + 1)
        .saturating_mul(4 * MIB)
        .saturating_add(journals);
    bytes.div_ceil(extent_size)
}

impl Layout {
    /// The layout of a class's `raidConfig` (always synchronised, without integrity).
    pub fn of_raid_config(raid: &RaidConfig) -> Self {
        Self::Raid {
            level: raid.raid_type,
            mirrors: raid.mirrors,
            stripes: raid.stripes,
            stripe_size: raid.stripe_size.map(|s| s.0),
            nosync: false,
            integrity: false,
        }
    }

    /// The layout as a `LogicalVolume`'s `spec.layout` carries it.
    pub fn to_api(&self) -> VolumeLayout {
        let raid = |level| match level {
            RaidType::Raid1 => LayoutType::Raid1,
            RaidType::Raid4 => LayoutType::Raid4,
            RaidType::Raid5 => LayoutType::Raid5,
            RaidType::Raid6 => LayoutType::Raid6,
            RaidType::Raid10 => LayoutType::Raid10,
        };
        let quantity = |s: Option<u64>| s.map(|s| Quantity(ByteSize(s).to_string()));
        match *self {
            Self::Linear => VolumeLayout::default(),
            Self::Striped {
                stripes,
                stripe_size,
            } => VolumeLayout {
                layout_type: LayoutType::Striped,
                stripes,
                stripe_size: quantity(stripe_size),
                ..VolumeLayout::default()
            },
            Self::Mirror {
                mirrors,
                nosync,
                integrity,
            } => VolumeLayout {
                layout_type: LayoutType::Mirror,
                mirrors: Some(mirrors),
                nosync,
                integrity,
                ..VolumeLayout::default()
            },
            Self::Raid {
                level,
                mirrors,
                stripes,
                stripe_size,
                nosync,
                integrity,
            } => VolumeLayout {
                layout_type: raid(level),
                stripes,
                stripe_size: quantity(stripe_size),
                mirrors,
                nosync,
                integrity,
            },
        }
    }

    /// Reads a `LogicalVolume`'s `spec.layout`; the error names the field and the fix.
    pub fn from_api(api: &VolumeLayout) -> Result<Self, String> {
        let stripe_size = api
            .stripe_size
            .as_ref()
            .map(|q| {
                q.0.parse::<ByteSize>()
                    .ok()
                    .map(|b| b.0)
                    .filter(|b| b.is_power_of_two() && *b >= 4096)
                    .ok_or_else(|| {
                        format!(
                            "spec.layout.stripeSize {:?} is not a power of two of at least 4Ki",
                            q.0
                        )
                    })
            })
            .transpose()?;
        let positive = |field: &str, v: Option<u32>| match v {
            Some(0) => Err(format!("spec.layout.{field} must be at least 1")),
            other => Ok(other),
        };
        let (stripes, mirrors) = (
            positive("stripes", api.stripes)?,
            positive("mirrors", api.mirrors)?,
        );
        let only = |what: &str, set: bool| {
            if set {
                Err(format!(
                    "spec.layout.{what} does not apply to a {:?} volume: remove it",
                    api.layout_type
                ))
            } else {
                Ok(())
            }
        };
        let raid = |level| Self::Raid {
            level,
            mirrors,
            stripes,
            stripe_size,
            nosync: api.nosync,
            integrity: api.integrity,
        };
        Ok(match api.layout_type {
            LayoutType::Linear => {
                only("stripes", stripes.is_some())?;
                only("stripeSize", stripe_size.is_some())?;
                only("mirrors", mirrors.is_some())?;
                only("nosync", api.nosync)?;
                only("integrity", api.integrity)?;
                Self::Linear
            }
            LayoutType::Striped => {
                only("mirrors", mirrors.is_some())?;
                only("nosync", api.nosync)?;
                only("integrity", api.integrity)?;
                Self::Striped {
                    stripes,
                    stripe_size,
                }
            }
            LayoutType::Mirror => {
                only("stripes", stripes.is_some())?;
                only("stripeSize", stripe_size.is_some())?;
                Self::Mirror {
                    mirrors: mirrors.unwrap_or(1),
                    nosync: api.nosync,
                    integrity: api.integrity,
                }
            }
            LayoutType::Raid1 => raid(RaidType::Raid1),
            LayoutType::Raid4 => raid(RaidType::Raid4),
            LayoutType::Raid5 => raid(RaidType::Raid5),
            LayoutType::Raid6 => raid(RaidType::Raid6),
            LayoutType::Raid10 => raid(RaidType::Raid10),
        })
    }

    /// Its name in messages and StorageClass parameters: `linear`, `striped`, `mirror`, `raid5`, ….
    pub fn name(&self) -> &'static str {
        match self {
            Self::Linear => "linear",
            Self::Striped { .. } => "striped",
            Self::Mirror { .. } => "mirror",
            Self::Raid { level, .. } => level.as_lvm(),
        }
    }

    /// Whether each image carries RAID metadata (every layout but linear and striped).
    fn is_raid(&self) -> bool {
        matches!(self, Self::Mirror { .. } | Self::Raid { .. })
    }

    fn integrity(&self) -> bool {
        matches!(
            self,
            Self::Mirror {
                integrity: true,
                ..
            } | Self::Raid {
                integrity: true,
                ..
            }
        )
    }

    /// The layout with a striped volume's stripe count settled: `None` becomes one stripe per
    /// LVM physical volume of the group (`devices`), and at least two: a volume "striped" over
    /// one device would be linear, which was not asked for.
    pub fn resolved(self, devices: u64) -> Self {
        match self {
            Self::Striped {
                stripes: None,
                stripe_size,
            } => Self::Striped {
                stripes: Some(u32::try_from(devices.max(2)).unwrap_or(u32::MAX)),
                stripe_size,
            },
            other => other,
        }
    }

    /// `(images, data_stripes)`: how many sub-volumes on different devices the layout needs, and
    /// how many of them hold distinct data (the volume is that many times one image's data).
    /// `devices` settles a striped volume's stripe count when it is not given. `None` for linear.
    pub fn images(&self, devices: u64) -> Option<(u64, u64)> {
        let n = |v: Option<u32>, default: u64| v.map_or(default, u64::from);
        match *self {
            Self::Linear => None,
            Self::Striped { stripes, .. } => {
                let s = n(stripes, devices.max(2));
                Some((s, s))
            }
            Self::Mirror { mirrors, .. } => Some((u64::from(mirrors) + 1, 1)),
            Self::Raid {
                level,
                mirrors,
                stripes,
                ..
            } => Some(match level {
                RaidType::Raid1 => (n(mirrors, 1) + 1, 1),
                RaidType::Raid4 | RaidType::Raid5 => (n(stripes, 2) + 1, n(stripes, 2)),
                RaidType::Raid6 => (n(stripes, 3) + 2, n(stripes, 3)),
                RaidType::Raid10 => {
                    let s = n(stripes, 2).max(2);
                    (s * (n(mirrors, 1) + 1), s)
                }
            }),
        }
    }

    /// How many LVM physical volumes the layout needs at least (1 for linear).
    pub fn devices_needed(&self, devices: u64) -> u64 {
        self.images(devices).map_or(1, |(images, _)| images.max(1))
    }

    /// The largest volume of this layout `free` can make, in bytes (0 when the group has fewer
    /// devices than the layout needs). See the [module documentation](self).
    pub fn max_size(&self, free: &FreeSpace) -> u64 {
        let extent = free.extent_size;
        let Some((images, data_stripes)) = self.images(free.devices()) else {
            return free.free_extents.iter().sum::<u64>().saturating_mul(extent);
        };
        if images == 0 || images > free.devices() {
            return 0;
        }
        // The free extents of the `images`-th emptiest device: every image fits on one device.
        let per_device = usize::try_from(images - 1)
            .ok()
            .and_then(|i| free.free_extents.get(i))
            .copied()
            .unwrap_or(0);
        let meta = u64::from(self.is_raid());
        let mut data = per_device.saturating_sub(meta);
        if self.integrity() {
            // The metadata grows with the data (about 4/500 of it): start near the answer, then
            // settle on the largest data whose image still fits.
            let fits = |d: u64| {
                d.saturating_add(meta)
                    .saturating_add(integrity_metadata_extents(d, extent))
                    <= per_device
            };
            data = u64::try_from(u128::from(data) * 500 / 504).unwrap_or(u64::MAX);
            while data > 0 && !fits(data) {
                data -= 1;
            }
            while fits(data + 1) {
                data += 1;
            }
        }
        data.saturating_mul(data_stripes).saturating_mul(extent)
    }
}

#[cfg(test)]
mod tests;
