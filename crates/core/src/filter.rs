//! Which block devices may become LVM physical volumes of a device class.
//!
//! Every rule runs on every device and every rejection is collected, so a user sees all that is wrong with
//! a device at once. The rules are conservative: a device is used only when nothing suggests it holds data
//! or belongs to something else (the boot disk, another volume group, the kubelet's block volumes, our own
//! logical volumes).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{
    config::VG_OWNER_TAG,
    model::{BlockDevice, DeviceKind, LogicalVolume, PhysicalVolume, VolumeGroup},
    size::{ByteSize, GIB},
};

/// Devices smaller than this are never used. Smaller devices are nearly always firmware, config drives or
/// leftovers rather than storage; 1 GiB is 256 default (4 MiB) extents, room for a physical volume's
/// metadata area and a useful amount of data.
pub const MIN_DEVICE_SIZE: u64 = GIB;

/// The kubelet's state directory. Loop devices backed by files below it are the kubelet's block-mode
/// volumes (LVMS #776) and are never used.
pub const KUBELET_DIR: &str = "/var/lib/kubelet";

/// The signature LVM writes on a physical volume.
pub const LVM_SIGNATURE: &str = "LVM2_member";

/// Words that mark a partition as firmware or boot territory when found in its GPT label (any case).
pub const RESERVED_PARTITION_LABEL_WORDS: [&str; 3] = ["bios", "boot", "reserved"];

/// A mounted device in the tree of a rejected device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub device: String,
    pub mountpoint: String,
}

/// Why a device cannot be used. The serialised `code` is stable and machine-readable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "code",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum ExclusionReason {
    ReadOnly,
    Suspended,
    Rom,
    LvmType,
    /// Partitions or holders stacked on the device. `partitions_only` when the children are partitions
    /// with nothing stacked on them.
    HasChildren {
        children: Vec<String>,
        partitions_only: bool,
    },
    InvalidPartitionLabel {
        label: String,
    },
    FilesystemSignature {
        signature: String,
    },
    KubeletLoopDevice {
        backing_file: String,
    },
    DeviceMapper,
    Mounted {
        mounts: Vec<Mount>,
    },
    /// An LVM physical volume of a volume group that is not this class's. `lvms_owned` when that group
    /// carries our ownership tag, i.e. belongs to another device class.
    PhysicalVolumeInOtherVg {
        vg: String,
        lvms_owned: bool,
    },
    TooSmall {
        size: u64,
        minimum: u64,
    },
    /// `forceWipeDevicesAndDestroyAllData` wiped this device once already; it holds a signature again
    /// and is not wiped a second time.
    WipedOnce,
    /// A partition whose disk `pattern` (of `devicePatterns`) matches as well: a pattern that matches
    /// a disk was written for disks, and the partitions of a disk in use (the boot disk's spare
    /// partition) are never taken that way.
    PartitionOfMatchedDisk {
        disk: String,
        pattern: String,
    },
}

impl ExclusionReason {
    /// The stable camelCase code (`readOnly`, `hasChildren`, …).
    pub fn code(&self) -> &'static str {
        match self {
            Self::ReadOnly => "readOnly",
            Self::Suspended => "suspended",
            Self::Rom => "rom",
            Self::LvmType => "lvmType",
            Self::HasChildren { .. } => "hasChildren",
            Self::InvalidPartitionLabel { .. } => "invalidPartitionLabel",
            Self::FilesystemSignature { .. } => "filesystemSignature",
            Self::KubeletLoopDevice { .. } => "kubeletLoopDevice",
            Self::DeviceMapper => "deviceMapper",
            Self::Mounted { .. } => "mounted",
            Self::PhysicalVolumeInOtherVg { .. } => "physicalVolumeInOtherVg",
            Self::TooSmall { .. } => "tooSmall",
            Self::WipedOnce => "wipedOnce",
            Self::PartitionOfMatchedDisk { .. } => "partitionOfMatchedDisk",
        }
    }

    /// Whether `forceWipeDevicesAndDestroyAllData` overrides this reason: only leftover data (a
    /// signature, bare partitions, membership of a foreign volume group) is waived, never a device that
    /// is in use, read-only, or not a disk.
    pub fn waivable_by_force_wipe(&self) -> bool {
        match self {
            Self::FilesystemSignature { .. } => true,
            Self::HasChildren {
                partitions_only, ..
            } => *partitions_only,
            Self::PhysicalVolumeInOtherVg { lvms_owned, .. } => !lvms_owned,
            Self::ReadOnly
            | Self::Suspended
            | Self::Rom
            | Self::LvmType
            | Self::InvalidPartitionLabel { .. }
            | Self::KubeletLoopDevice { .. }
            | Self::DeviceMapper
            | Self::Mounted { .. }
            | Self::TooSmall { .. }
            | Self::WipedOnce
            | Self::PartitionOfMatchedDisk { .. } => false,
        }
    }

    /// A sentence naming the device, the problem and the fix.
    pub fn message(&self, device: &str) -> String {
        const FORCE: &str =
            "set deviceSelector.forceWipeDevicesAndDestroyAllData: true to destroy it";
        match self {
            Self::ReadOnly => format!(
                "{device} is read-only: make it writable (write-protect switch, hypervisor or SAN \
                 attachment) or remove it from the device class"
            ),
            Self::Suspended => format!(
                "{device} is suspended (device-mapper I/O is frozen): resume it with dmsetup resume or \
                 remove it from the device class"
            ),
            Self::Rom => format!(
                "{device} is a ROM (optical) device and cannot hold an LVM physical volume: remove it from \
                 the device class"
            ),
            Self::LvmType => format!(
                "{device} is an LVM logical volume: volume groups are not stacked on logical volumes; \
                 choose a disk or partition"
            ),
            Self::HasChildren {
                children,
                partitions_only: true,
            } => format!(
                "{device} has partitions ({}): use a partition instead, delete them, or {FORCE}",
                children.join(", ")
            ),
            Self::HasChildren { children, .. } => format!(
                "{device} is in use by {}: release those devices (deactivate, close or stop them) or \
                 choose another device",
                children.join(", ")
            ),
            Self::InvalidPartitionLabel { label } => format!(
                "{device} has partition label {label:?}: partitions labelled bios, boot or reserved are \
                 never used; choose another partition"
            ),
            Self::FilesystemSignature { signature } => format!(
                "{device} carries an existing signature ({signature}) and may hold data: wipe it \
                 yourself (wipefs --all) or {FORCE}"
            ),
            Self::KubeletLoopDevice { backing_file } => format!(
                "{device} is a kubelet loop device backed by {backing_file} (a block-mode persistent \
                 volume): it is never used; remove it from the device class"
            ),
            Self::DeviceMapper => format!(
                "{device} is a device-mapper device (LVM, dm-crypt, or multipath found by a pattern): \
                 choose the disk beneath it, name a multipath device by its path in \
                 deviceSelector.paths, or remove it from the device class"
            ),
            Self::Mounted { mounts } => {
                let list: Vec<String> = mounts
                    .iter()
                    .map(|m| format!("{} on {}", m.device, m.mountpoint))
                    .collect();
                format!(
                    "{device} is mounted ({}): unmount it and remove it from /etc/fstab, or choose \
                     another device",
                    list.join(", ")
                )
            }
            Self::PhysicalVolumeInOtherVg {
                vg,
                lvms_owned: true,
            } => format!(
                "{device} is an LVM physical volume of volume group {vg}, which belongs to another lvms \
                 device class: a device serves one device class only; remove it from this one"
            ),
            Self::PhysicalVolumeInOtherVg { vg, .. } => format!(
                "{device} is an LVM physical volume of volume group {vg}: remove it from {vg} (vgreduce, \
                 pvremove) or {FORCE}"
            ),
            Self::WipedOnce => format!(
                "{device} was wiped once for this device class by forceWipeDevicesAndDestroyAllData and \
                 holds data again: lvms-rs never wipes a device twice; wipe it yourself (wipefs --all) if \
                 its data may go, or remove it from the device class"
            ),
            Self::PartitionOfMatchedDisk { disk, pattern } => format!(
                "{device} is a partition of {disk}, which devicePatterns {pattern} matches too: a \
                 pattern that matches a disk takes none of its partitions; name the partition by a \
                 pattern of its own (such as {device}) or list it under deviceSelector.paths"
            ),
            Self::TooSmall { size, minimum } => format!(
                "{device} is {} bytes ({}), smaller than the {} minimum: choose a larger device",
                size,
                ByteSize(*size),
                ByteSize(*minimum)
            ),
        }
    }
}

/// What the filter decides for one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// Already an LVM physical volume of one of our volume groups. Not an exclusion: nothing to do.
    Member { vg: String },
    /// May be used. `waived` lists the reasons force-wipe overrides; when non-empty the device must be
    /// wiped first.
    Usable { waived: Vec<ExclusionReason> },
    /// Cannot be used; every reason found, including waivable ones.
    Excluded { reasons: Vec<ExclusionReason> },
}

/// What the filter needs besides the device itself.
#[derive(Debug, Clone, Default)]
pub struct FilterContext<'a> {
    pub pvs: &'a [PhysicalVolume],
    pub vgs: &'a [VolumeGroup],
    /// Logical volumes of every volume group, to recognise them as devices.
    pub lvs: &'a [LogicalVolume],
    /// Names of the volume groups that are ours for this evaluation (the class's own volume group).
    pub own_vgs: BTreeSet<&'a str>,
    /// `forceWipeDevicesAndDestroyAllData`.
    pub force_wipe: bool,
    /// Canonical paths force-wipe already wiped once: never wiped again.
    pub wiped: BTreeSet<&'a str>,
    /// The device is named by path in the class's selector (`paths`, `optionalPaths`): a multipath
    /// device (lsblk type `mpath`: the map multipathd makes of a SAN LUN's paths, whose components
    /// LVM then ignores) may be used. Found by a pattern or by discovery it never is.
    pub named: bool,
}

fn dev_kname_path(device: &BlockDevice) -> String {
    format!("/dev/{}", device.kname)
}

/// The LVM physical volume on `device`, matched by path, `/dev/<kname>` or a by-id link.
pub fn physical_volume_of<'a>(
    device: &BlockDevice,
    pvs: &'a [PhysicalVolume],
) -> Option<&'a PhysicalVolume> {
    let kpath = dev_kname_path(device);
    pvs.iter()
        .find(|pv| pv.name == device.path || pv.name == kpath || device.by_id.contains(&pv.name))
}

/// Finds a device anywhere in the tree by its canonical path (`/dev/vdb`, `/dev/vdb1`, `/dev/dm-3`),
/// comparing with each device's path and `/dev/<kname>`.
pub fn find_device<'a>(devices: &'a [BlockDevice], path: &str) -> Option<&'a BlockDevice> {
    devices.iter().find_map(|d| {
        if d.path == path || dev_kname_path(d) == path {
            Some(d)
        } else {
            find_device(&d.children, path)
        }
    })
}

fn collect_mounts(device: &BlockDevice, out: &mut Vec<Mount>) {
    for mp in device.mountpoints.iter().filter(|m| !m.is_empty()) {
        out.push(Mount {
            device: device.path.clone(),
            mountpoint: mp.clone(),
        });
    }
    for child in &device.children {
        collect_mounts(child, out);
    }
}

fn is_under(path: &str, dir: &str) -> bool {
    path.strip_prefix(dir)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Every reason `device` cannot be used, ignoring force-wipe and membership of our own volume groups.
pub fn exclusion_reasons(device: &BlockDevice, ctx: &FilterContext<'_>) -> Vec<ExclusionReason> {
    let mut reasons = Vec::new();

    if device.read_only {
        reasons.push(ExclusionReason::ReadOnly);
    }
    if device
        .state
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("suspended"))
    {
        reasons.push(ExclusionReason::Suspended);
    }
    if device.kind == DeviceKind::Rom {
        reasons.push(ExclusionReason::Rom);
    }
    if device.kind == DeviceKind::Lvm {
        reasons.push(ExclusionReason::LvmType);
    }
    if !device.children.is_empty() {
        let partitions_only = device
            .children
            .iter()
            .all(|c| c.kind == DeviceKind::Part && c.children.is_empty());
        reasons.push(ExclusionReason::HasChildren {
            children: device.children.iter().map(|c| c.path.clone()).collect(),
            partitions_only,
        });
    }
    if let Some(label) = device.partlabel.as_deref() {
        let lower = label.to_ascii_lowercase();
        if RESERVED_PARTITION_LABEL_WORDS
            .iter()
            .any(|w| lower.contains(w))
        {
            reasons.push(ExclusionReason::InvalidPartitionLabel {
                label: label.to_owned(),
            });
        }
    }

    let pv = physical_volume_of(device, ctx.pvs);
    let signature = device.fstype.as_deref().filter(|s| !s.is_empty());
    match (pv, signature) {
        (Some(pv), _) => {
            if let Some(vg) = pv.vg_name.as_deref().filter(|vg| !vg.is_empty())
                && !ctx.own_vgs.contains(vg)
            {
                let lvms_owned = ctx
                    .vgs
                    .iter()
                    .any(|g| g.name == vg && g.tags.iter().any(|t| t == VG_OWNER_TAG));
                reasons.push(ExclusionReason::PhysicalVolumeInOtherVg {
                    vg: vg.to_owned(),
                    lvms_owned,
                });
            }
            // An orphan physical volume (no volume group) is usable as is.
        }
        (None, Some(sig)) => reasons.push(ExclusionReason::FilesystemSignature {
            signature: sig.to_owned(),
        }),
        (None, None) => {}
    }

    if device.kind == DeviceKind::Loop
        && let Some(file) = device
            .loop_backing_file
            .as_deref()
            .filter(|f| is_under(f, KUBELET_DIR))
    {
        reasons.push(ExclusionReason::KubeletLoopDevice {
            backing_file: file.to_owned(),
        });
    }

    let kpath = dev_kname_path(device);
    let is_lv = ctx.lvs.iter().any(|lv| {
        [lv.path.as_deref(), lv.dm_path.as_deref()]
            .into_iter()
            .flatten()
            .any(|p| p == device.path || p == kpath)
    });
    let named_multipath = ctx.named && device.kind == DeviceKind::Mpath && !is_lv;
    if !named_multipath
        && (device.kname.starts_with("dm-")
            || matches!(
                device.kind,
                DeviceKind::Lvm | DeviceKind::Crypt | DeviceKind::Mpath
            )
            || device.path.starts_with("/dev/mapper/")
            || is_lv)
    {
        reasons.push(ExclusionReason::DeviceMapper);
    }

    let mut mounts = Vec::new();
    collect_mounts(device, &mut mounts);
    if !mounts.is_empty() {
        reasons.push(ExclusionReason::Mounted { mounts });
    }

    if device.size < MIN_DEVICE_SIZE {
        reasons.push(ExclusionReason::TooSmall {
            size: device.size,
            minimum: MIN_DEVICE_SIZE,
        });
    }
    reasons
}

/// Whether force-wipe wiped `device` before (recorded by canonical path: `/dev/<kname>` or its path).
fn wiped_before(device: &BlockDevice, ctx: &FilterContext<'_>) -> bool {
    ctx.wiped.contains(dev_kname_path(device).as_str()) || ctx.wiped.contains(device.path.as_str())
}

/// Decides whether `device` may become (or already is) an LVM physical volume of our volume group.
pub fn evaluate(device: &BlockDevice, ctx: &FilterContext<'_>) -> Verdict {
    if let Some(vg) = physical_volume_of(device, ctx.pvs)
        .and_then(|pv| pv.vg_name.as_deref())
        .filter(|vg| ctx.own_vgs.contains(vg))
    {
        return Verdict::Member { vg: vg.to_owned() };
    }
    let mut reasons = exclusion_reasons(device, ctx);
    let waivable = reasons.iter().all(ExclusionReason::waivable_by_force_wipe);
    if reasons.is_empty() {
        Verdict::Usable { waived: Vec::new() }
    } else if ctx.force_wipe && waivable && !wiped_before(device, ctx) {
        Verdict::Usable { waived: reasons }
    } else {
        if ctx.force_wipe && waivable {
            reasons.push(ExclusionReason::WipedOnce);
        }
        Verdict::Excluded { reasons }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::size::MIB;

    pub(crate) fn disk(name: &str, size: u64) -> BlockDevice {
        BlockDevice {
            name: name.into(),
            kname: name.into(),
            path: format!("/dev/{name}"),
            kind: DeviceKind::Disk,
            size,
            read_only: false,
            state: Some("running".into()),
            partlabel: None,
            fstype: None,
            rotational: false,
            serial: None,
            model: None,
            mountpoints: vec![],
            by_id: vec![],
            loop_backing_file: None,
            children: vec![],
        }
    }

    pub(crate) fn part(name: &str, size: u64) -> BlockDevice {
        BlockDevice {
            kind: DeviceKind::Part,
            ..disk(name, size)
        }
    }

    pub(crate) fn pv(path: &str, vg: Option<&str>) -> PhysicalVolume {
        PhysicalVolume {
            name: path.into(),
            vg_name: vg.map(Into::into),
            uuid: format!("uuid-{path}"),
            size: 10 * GIB,
            free: 10 * GIB,
            attr: "a--".into(),
        }
    }

    pub(crate) fn vg(name: &str, tags: &[&str]) -> VolumeGroup {
        VolumeGroup {
            name: name.into(),
            uuid: format!("uuid-{name}"),
            size: 10 * GIB,
            free: 10 * GIB,
            extent_size: 4 * MIB,
            extent_count: 2560,
            free_count: 2560,
            pv_count: 1,
            lv_count: 0,
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            attr: "wz--n-".into(),
            mda_free: 0,
            mda_size: 0,
        }
    }

    fn dm_lv(name: &str, kname: &str) -> BlockDevice {
        BlockDevice {
            kname: kname.into(),
            path: format!("/dev/mapper/{name}"),
            kind: DeviceKind::Lvm,
            ..disk(name, 5 * GIB)
        }
    }

    fn codes(device: &BlockDevice, ctx: &FilterContext<'_>) -> Vec<&'static str> {
        exclusion_reasons(device, ctx)
            .iter()
            .map(ExclusionReason::code)
            .collect()
    }

    #[test]
    fn clean_disk_is_usable() {
        let d = disk("vdb", 10 * GIB);
        assert_eq!(
            evaluate(&d, &FilterContext::default()),
            Verdict::Usable { waived: vec![] }
        );
    }

    #[test]
    fn read_only_disk_is_excluded_even_with_force_wipe() {
        let d = BlockDevice {
            read_only: true,
            ..disk("vdb", 10 * GIB)
        };
        let ctx = FilterContext {
            force_wipe: true,
            ..Default::default()
        };
        assert_eq!(
            evaluate(&d, &ctx),
            Verdict::Excluded {
                reasons: vec![ExclusionReason::ReadOnly]
            }
        );
    }

    #[test]
    fn suspended_device_is_excluded_in_any_case() {
        let d = BlockDevice {
            state: Some("SUSPENDED".into()),
            ..disk("vdb", 10 * GIB)
        };
        assert_eq!(codes(&d, &FilterContext::default()), ["suspended"]);
    }

    #[test]
    fn rom_is_excluded() {
        let d = BlockDevice {
            kind: DeviceKind::Rom,
            ..disk("sr0", 10 * GIB)
        };
        assert_eq!(codes(&d, &FilterContext::default()), ["rom"]);
    }

    #[test]
    fn logical_volume_is_lvm_type_and_device_mapper() {
        let d = dm_lv("vg1-lv1", "dm-3");
        assert_eq!(
            codes(&d, &FilterContext::default()),
            ["lvmType", "deviceMapper"]
        );
    }

    #[test]
    fn a_multipath_device_named_by_path_is_usable_and_no_other_device_mapper_device_is() {
        let mpath = BlockDevice {
            kname: "dm-5".into(),
            path: "/dev/mapper/mpatha".into(),
            kind: DeviceKind::Mpath,
            ..disk("mpatha", 10 * GIB)
        };
        let named = FilterContext {
            named: true,
            ..FilterContext::default()
        };
        assert_eq!(evaluate(&mpath, &named), Verdict::Usable { waived: vec![] });
        // Found by a pattern (not named), it is refused as before.
        assert_eq!(codes(&mpath, &FilterContext::default()), ["deviceMapper"]);
        // Named, a map of another kind is still refused.
        for kind in [
            DeviceKind::Crypt,
            DeviceKind::Lvm,
            DeviceKind::Other("dm".into()),
        ] {
            let d = BlockDevice {
                kind: kind.clone(),
                ..mpath.clone()
            };
            assert!(
                codes(&d, &named).contains(&"deviceMapper"),
                "{kind:?}: {:?}",
                codes(&d, &named)
            );
        }
        // Named, a multipath device keeps every other check: one that holds a filesystem is refused.
        let used = BlockDevice {
            fstype: Some("xfs".into()),
            ..mpath
        };
        assert_eq!(codes(&used, &named), ["filesystemSignature"]);
    }

    #[test]
    fn crypt_multipath_and_bare_dm_devices_are_device_mapper() {
        for kind in [DeviceKind::Crypt, DeviceKind::Mpath] {
            let d = BlockDevice {
                kind,
                ..disk("x", 10 * GIB)
            };
            assert_eq!(codes(&d, &FilterContext::default()), ["deviceMapper"]);
        }
        let d = BlockDevice {
            kname: "dm-7".into(),
            kind: DeviceKind::Other("dm".into()),
            ..disk("thing", 10 * GIB)
        };
        assert_eq!(codes(&d, &FilterContext::default()), ["deviceMapper"]);
    }

    #[test]
    fn our_own_logical_volume_is_recognised_by_its_path() {
        // Even if lsblk reported it oddly, a device whose path is an LV's path is never used.
        let d = BlockDevice {
            kname: "weird".into(),
            path: "/dev/vg1/pvc-1".into(),
            ..disk("weird", 10 * GIB)
        };
        let lv = LogicalVolume {
            name: "pvc-1".into(),
            vg_name: "vg1".into(),
            uuid: "u".into(),
            size: GIB,
            attr: "Vwi-aotz--".into(),
            segtype: "thin".into(),
            pool_lv: Some("pool".into()),
            origin: None,
            data_percent: None,
            metadata_percent: None,
            metadata_size: None,
            sync_percent: None,
            tags: vec![],
            path: Some("/dev/vg1/pvc-1".into()),
            dm_path: Some("/dev/mapper/vg1-pvc--1".into()),
            stripes: None,
            stripe_size: None,
        };
        let lvs = [lv];
        let ctx = FilterContext {
            lvs: &lvs,
            ..Default::default()
        };
        assert_eq!(codes(&d, &ctx), ["deviceMapper"]);
    }

    #[test]
    fn partitioned_disk_has_children_waivable_only_when_bare_partitions() {
        let mut d = disk("vdb", 10 * GIB);
        d.fstype = Some("gpt".into());
        d.children = vec![part("vdb1", 5 * GIB), part("vdb2", 5 * GIB)];
        let reasons = exclusion_reasons(&d, &FilterContext::default());
        assert_eq!(
            reasons,
            vec![
                ExclusionReason::HasChildren {
                    children: vec!["/dev/vdb1".into(), "/dev/vdb2".into()],
                    partitions_only: true
                },
                ExclusionReason::FilesystemSignature {
                    signature: "gpt".into()
                },
            ]
        );
        assert!(reasons.iter().all(ExclusionReason::waivable_by_force_wipe));

        // A partition holding an active LV makes the disk busy: not waivable.
        d.children[0].children = vec![dm_lv("other-lv", "dm-1")];
        let reasons = exclusion_reasons(&d, &FilterContext::default());
        assert!(matches!(
            reasons[0],
            ExclusionReason::HasChildren {
                partitions_only: false,
                ..
            }
        ));
        assert!(!reasons[0].waivable_by_force_wipe());
    }

    #[test]
    fn partition_labels_bios_boot_reserved_are_excluded_case_insensitively() {
        for label in [
            "BIOS boot partition",
            "EFI-BOOT",
            "Microsoft reserved",
            "bios_grub",
        ] {
            let mut p = part("vdb1", 10 * GIB);
            p.partlabel = Some(label.into());
            assert_eq!(
                codes(&p, &FilterContext::default()),
                ["invalidPartitionLabel"],
                "{label}"
            );
        }
        let mut p = part("vdb1", 10 * GIB);
        p.partlabel = Some("data".into());
        assert!(codes(&p, &FilterContext::default()).is_empty());
    }

    #[test]
    fn ext4_disk_has_a_filesystem_signature_waived_only_by_force() {
        let mut d = disk("vdc", 10 * GIB);
        d.fstype = Some("ext4".into());
        let reasons = vec![ExclusionReason::FilesystemSignature {
            signature: "ext4".into(),
        }];
        assert_eq!(
            evaluate(&d, &FilterContext::default()),
            Verdict::Excluded {
                reasons: reasons.clone()
            }
        );
        let force = FilterContext {
            force_wipe: true,
            ..Default::default()
        };
        assert_eq!(evaluate(&d, &force), Verdict::Usable { waived: reasons });
    }

    #[test]
    fn orphan_physical_volume_is_usable_without_wipe() {
        let mut d = disk("vdb", 10 * GIB);
        d.fstype = Some(LVM_SIGNATURE.into());
        let pvs = [pv("/dev/vdb", None)];
        let ctx = FilterContext {
            pvs: &pvs,
            ..Default::default()
        };
        assert_eq!(evaluate(&d, &ctx), Verdict::Usable { waived: vec![] });
    }

    #[test]
    fn physical_volume_of_our_vg_is_a_member_not_an_exclusion() {
        let mut d = disk("vdb", 10 * GIB);
        d.fstype = Some(LVM_SIGNATURE.into());
        // Our thin volumes are mounted by pods: still a member.
        let mut child = dm_lv("vg1-lv", "dm-0");
        child.mountpoints = vec!["/var/lib/kubelet/pods/x/mount".into()];
        d.children = vec![child];
        let pvs = [pv("/dev/vdb", Some("vg1"))];
        let ctx = FilterContext {
            pvs: &pvs,
            own_vgs: ["vg1"].into(),
            ..Default::default()
        };
        assert_eq!(evaluate(&d, &ctx), Verdict::Member { vg: "vg1".into() });
    }

    #[test]
    fn physical_volume_is_matched_by_kname_or_by_id() {
        let mut d = disk("vdb", 10 * GIB);
        d.path = "/dev/disk/odd".into();
        let pvs = [pv("/dev/vdb", Some("vg1"))];
        assert!(physical_volume_of(&d, &pvs).is_some());
        let mut d = disk("sdz", 10 * GIB);
        d.by_id = vec!["/dev/disk/by-id/wwn-1".into()];
        let pvs = [pv("/dev/disk/by-id/wwn-1", None)];
        assert!(physical_volume_of(&d, &pvs).is_some());
    }

    #[test]
    fn physical_volume_of_a_foreign_vg_is_excluded_and_waivable() {
        let mut d = disk("vdd", 10 * GIB);
        d.fstype = Some(LVM_SIGNATURE.into());
        let pvs = [pv("/dev/vdd", Some("data"))];
        let vgs = [vg("data", &[])];
        let ctx = FilterContext {
            pvs: &pvs,
            vgs: &vgs,
            own_vgs: ["vg1"].into(),
            ..Default::default()
        };
        let reason = ExclusionReason::PhysicalVolumeInOtherVg {
            vg: "data".into(),
            lvms_owned: false,
        };
        assert_eq!(
            evaluate(&d, &ctx),
            Verdict::Excluded {
                reasons: vec![reason.clone()]
            }
        );
        assert!(reason.waivable_by_force_wipe());
        assert!(reason.message("/dev/vdd").contains("vgreduce"));
    }

    #[test]
    fn physical_volume_of_another_lvms_class_is_never_waived() {
        let mut d = disk("vdd", 10 * GIB);
        d.fstype = Some(LVM_SIGNATURE.into());
        let pvs = [pv("/dev/vdd", Some("fast"))];
        let vgs = [vg("fast", &[VG_OWNER_TAG])];
        let ctx = FilterContext {
            pvs: &pvs,
            vgs: &vgs,
            own_vgs: ["slow"].into(),
            force_wipe: true,
            ..Default::default()
        };
        let Verdict::Excluded { reasons } = evaluate(&d, &ctx) else {
            panic!("must be excluded")
        };
        assert_eq!(
            reasons,
            vec![ExclusionReason::PhysicalVolumeInOtherVg {
                vg: "fast".into(),
                lvms_owned: true
            }]
        );
    }

    #[test]
    fn lvm_signature_that_lvm_does_not_report_is_a_signature() {
        let mut d = disk("vde", 10 * GIB);
        d.fstype = Some(LVM_SIGNATURE.into());
        assert_eq!(
            exclusion_reasons(&d, &FilterContext::default()),
            vec![ExclusionReason::FilesystemSignature {
                signature: LVM_SIGNATURE.into()
            }]
        );
    }

    #[test]
    fn kubelet_block_volume_loop_device_is_never_used() {
        let d = BlockDevice {
            kind: DeviceKind::Loop,
            loop_backing_file: Some(
                "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-1/dev/abc".into(),
            ),
            ..disk("loop3", 10 * GIB)
        };
        let ctx = FilterContext {
            force_wipe: true,
            ..Default::default()
        };
        assert_eq!(codes(&d, &ctx), ["kubeletLoopDevice"]);
        assert!(matches!(evaluate(&d, &ctx), Verdict::Excluded { .. }));
    }

    #[test]
    fn other_loop_devices_are_usable() {
        for file in ["/var/tmp/disk.img", "/var/lib/kubeletx/a.img"] {
            let d = BlockDevice {
                kind: DeviceKind::Loop,
                loop_backing_file: Some(file.into()),
                ..disk("loop0", 10 * GIB)
            };
            assert!(codes(&d, &FilterContext::default()).is_empty(), "{file}");
        }
    }

    #[test]
    fn mounted_disk_or_mounted_partition_is_excluded() {
        let mut d = disk("vda", 10 * GIB);
        d.mountpoints = vec!["/".into()];
        assert_eq!(codes(&d, &FilterContext::default()), ["mounted"]);

        let mut d = disk("vda", 10 * GIB);
        let mut p = part("vda1", 5 * GIB);
        p.mountpoints = vec!["/boot".into(), String::new()];
        d.children = vec![p];
        let reasons = exclusion_reasons(&d, &FilterContext::default());
        assert_eq!(
            reasons[1],
            ExclusionReason::Mounted {
                mounts: vec![Mount {
                    device: "/dev/vda1".into(),
                    mountpoint: "/boot".into()
                }]
            }
        );
        let force = FilterContext {
            force_wipe: true,
            ..Default::default()
        };
        assert!(
            matches!(evaluate(&d, &force), Verdict::Excluded { .. }),
            "mounted partitions are never waived"
        );
    }

    #[test]
    fn too_small_device_is_excluded_and_exactly_minimum_is_fine() {
        assert_eq!(
            codes(&disk("vdb", MIN_DEVICE_SIZE - 1), &FilterContext::default()),
            ["tooSmall"]
        );
        assert!(codes(&disk("vdb", MIN_DEVICE_SIZE), &FilterContext::default()).is_empty());
    }

    #[test]
    fn every_reason_is_collected_not_only_the_first() {
        let mut d = disk("sr0", 1);
        d.read_only = true;
        d.kind = DeviceKind::Rom;
        d.fstype = Some("iso9660".into());
        d.mountpoints = vec!["/media/cd".into()];
        assert_eq!(
            codes(&d, &FilterContext::default()),
            [
                "readOnly",
                "rom",
                "filesystemSignature",
                "mounted",
                "tooSmall"
            ]
        );
    }

    #[test]
    fn codes_are_stable_camel_case_and_serialised_as_code() {
        let r = ExclusionReason::PhysicalVolumeInOtherVg {
            vg: "x".into(),
            lvms_owned: false,
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["code"], "physicalVolumeInOtherVg");
        assert_eq!(json["lvmsOwned"], false);
        let r = ExclusionReason::HasChildren {
            children: vec![],
            partitions_only: true,
        };
        assert_eq!(serde_json::to_value(&r).unwrap()["code"], r.code());
        assert_eq!(ExclusionReason::ReadOnly.code(), "readOnly");
    }

    #[test]
    fn messages_name_the_device_and_a_fix() {
        let all = [
            ExclusionReason::ReadOnly,
            ExclusionReason::Suspended,
            ExclusionReason::Rom,
            ExclusionReason::LvmType,
            ExclusionReason::HasChildren {
                children: vec!["/dev/x1".into()],
                partitions_only: true,
            },
            ExclusionReason::HasChildren {
                children: vec!["/dev/dm-1".into()],
                partitions_only: false,
            },
            ExclusionReason::InvalidPartitionLabel {
                label: "boot".into(),
            },
            ExclusionReason::FilesystemSignature {
                signature: "xfs".into(),
            },
            ExclusionReason::KubeletLoopDevice {
                backing_file: "/var/lib/kubelet/plugins/f".into(),
            },
            ExclusionReason::DeviceMapper,
            ExclusionReason::Mounted { mounts: vec![] },
            ExclusionReason::PhysicalVolumeInOtherVg {
                vg: "v".into(),
                lvms_owned: true,
            },
            ExclusionReason::TooSmall {
                size: 1,
                minimum: GIB,
            },
        ];
        for r in &all {
            let m = r.message("/dev/x");
            assert!(m.starts_with("/dev/x "), "{m}");
            assert!(m.contains(':'), "{m}");
            let waivable = r.waivable_by_force_wipe();
            assert_eq!(
                m.contains("forceWipeDevicesAndDestroyAllData"),
                waivable,
                "{m}"
            );
        }
    }

    #[test]
    fn find_device_walks_disks_partitions_and_holders() {
        let mut d = disk("vdb", 10 * GIB);
        let mut p = part("vdb1", 5 * GIB);
        p.children = vec![dm_lv("vg-lv", "dm-2")];
        d.children = vec![p];
        let devices = vec![disk("vda", 10 * GIB), d];
        assert_eq!(find_device(&devices, "/dev/vdb").unwrap().name, "vdb");
        assert_eq!(find_device(&devices, "/dev/vdb1").unwrap().name, "vdb1");
        assert_eq!(find_device(&devices, "/dev/dm-2").unwrap().name, "vg-lv");
        assert_eq!(
            find_device(&devices, "/dev/mapper/vg-lv").unwrap().kname,
            "dm-2"
        );
        assert!(find_device(&devices, "/dev/vdz").is_none());
    }
}
