//! What the host looks like, as observed: block devices, LVM physical volumes, volume groups and logical
//! volumes. The `host` crate fills these from `lsblk`, `blkid` and `lvm` JSON reports; everything in `core`
//! reasons about them without touching the machine.

use serde::{Deserialize, Serialize};

/// The kind of a block device, from lsblk's `TYPE` column.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Disk,
    Part,
    Lvm,
    Loop,
    Rom,
    Crypt,
    Mpath,
    Raid,
    /// Any other lsblk type (`dm`, `md`, `raid1`, …), kept verbatim.
    Other(String),
}

impl DeviceKind {
    /// Maps lsblk's `TYPE` value.
    pub fn from_lsblk(value: &str) -> Self {
        match value {
            "disk" => Self::Disk,
            "part" => Self::Part,
            "lvm" => Self::Lvm,
            "loop" => Self::Loop,
            "rom" => Self::Rom,
            "crypt" => Self::Crypt,
            "mpath" => Self::Mpath,
            v if v.starts_with("raid") => Self::Raid,
            other => Self::Other(other.to_owned()),
        }
    }
}

/// One block device as lsblk reports it, enriched by the host layer with the facts lsblk does not give
/// reliably (by-id links, a low-level signature probe, a loop device's backing file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockDevice {
    /// Kernel name as lsblk shows it (`vdb`, `vdb1`, `vg1-lv1`).
    pub name: String,
    /// Internal kernel name (`vdb`, `dm-3`).
    pub kname: String,
    /// Device node path (`/dev/vdb`, `/dev/mapper/vg1-lv1`).
    pub path: String,
    pub kind: DeviceKind,
    /// Size in bytes.
    pub size: u64,
    pub read_only: bool,
    /// lsblk's `STATE` (`running`, `suspended`, `live`, …) where the kernel reports one.
    pub state: Option<String>,
    /// GPT partition label.
    pub partlabel: Option<String>,
    /// A filesystem or other signature (`ext4`, `xfs`, `LVM2_member`, `dos`, `gpt`, `swap`, …): lsblk's
    /// `FSTYPE`, or when that is empty the host's low-level probe (`blkid -p`), so a signature is found
    /// even without udev.
    pub fstype: Option<String>,
    pub rotational: bool,
    pub serial: Option<String>,
    pub model: Option<String>,
    /// Where the device is mounted, if anywhere.
    pub mountpoints: Vec<String>,
    /// `/dev/disk/by-id/*` links that resolve to this device.
    pub by_id: Vec<String>,
    /// For a loop device, the file behind it.
    pub loop_backing_file: Option<String>,
    /// Partitions, device-mapper targets and other holders stacked on this device.
    pub children: Vec<BlockDevice>,
}

/// An LVM physical volume (always written out: "LVM physical volume", never "PV").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalVolume {
    /// Device path (`/dev/vdb`).
    pub name: String,
    /// The volume group it belongs to; `None` for an orphan physical volume.
    pub vg_name: Option<String>,
    pub uuid: String,
    /// Size in bytes.
    pub size: u64,
    /// Free bytes.
    pub free: u64,
    /// Raw `pv_attr`.
    pub attr: String,
}

/// An LVM volume group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeGroup {
    pub name: String,
    pub uuid: String,
    /// Size in bytes.
    pub size: u64,
    /// Free bytes.
    pub free: u64,
    /// Extent size in bytes.
    pub extent_size: u64,
    pub extent_count: u64,
    pub free_count: u64,
    pub pv_count: u64,
    pub lv_count: u64,
    pub tags: Vec<String>,
    /// Raw `vg_attr`.
    pub attr: String,
    /// Free bytes in the VG's metadata area (the smallest over its physical volumes).
    pub mda_free: u64,
    pub mda_size: u64,
}

/// An LVM logical volume, including thin pools, thin volumes, snapshots and hidden sub-volumes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogicalVolume {
    pub name: String,
    pub vg_name: String,
    pub uuid: String,
    /// Size in bytes (virtual size for thin volumes).
    pub size: u64,
    /// Raw `lv_attr` (10 characters); decode with [`crate::lvattr::LvAttr::parse`].
    pub attr: String,
    /// Segment type (`linear`, `striped`, `thin-pool`, `thin`, `raid1`, `mirror`, …).
    pub segtype: String,
    /// For a thin volume, its pool.
    pub pool_lv: Option<String>,
    /// For a snapshot, its origin.
    pub origin: Option<String>,
    /// Thin pool or thin volume data usage in percent.
    pub data_percent: Option<f64>,
    /// Thin pool metadata usage in percent.
    pub metadata_percent: Option<f64>,
    /// Thin pool metadata size in bytes.
    pub metadata_size: Option<u64>,
    /// RAID / mirror synchronisation in percent.
    pub sync_percent: Option<f64>,
    pub tags: Vec<String>,
    /// `/dev/<vg>/<lv>` where LVM reports one (active, visible volumes).
    pub path: Option<String>,
    /// `/dev/mapper/<vg>-<lv>`.
    pub dm_path: Option<String>,
    pub stripes: Option<u64>,
    pub stripe_size: Option<u64>,
}
