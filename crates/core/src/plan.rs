//! The plan for one device class on one node: which devices to prepare and which volume group and thin
//! pool to create or grow, computed from an observation of the host.
//!
//! The engine loops observe → plan → execute → observe until a plan has no actions. Each plan emits only
//! what the current observation determines: the volume group first, the thin pool (whose size depends on
//! the group's size) in the next round. A plan never shrinks anything and never touches a volume group
//! that does not carry our tag. When a required device is unusable the plan fails with no actions at all,
//! so a class is never half-built.
//!
//! A class with neither `paths` nor `optionalPaths` discovers its devices, as LVMS does without a
//! `deviceSelector`: every whole disk (lsblk type `disk`, not `zram`, `nbd`, `ram` or floppy) that the
//! filter finds usable without a wipe, except devices other classes list ([`Observed::claimed`]).
//! Partitions are never discovered (list them). Under [`DiscoveryPolicy::Static`] discovery happens
//! only until the volume group exists; afterwards the class keeps its member disks and adds none, so a
//! disk attached later stays untouched. Under `Dynamic` every plan adds the free disks found.
//!
//! `devicePatterns` (csi-driver-lvm's `devicePattern`, ADR 0019) select devices by glob: every device
//! of the tree, of any kind (a pattern may name partitions), one of whose names — `/dev/<kname>`, its
//! device node, its `/dev/disk/by-id` links — a pattern matches, except devices other classes list or
//! match ([`Observed::claimed`]). Each is reported with the pattern that matched it and taken like an
//! optional path, after the same safety filter; matched devices are never wiped. The discovery policy
//! applies to them as to discovered disks: under `Static` only the devices found when the volume
//! group is made, under `Dynamic` also later ones. Patterns combine with `paths` and
//! `optionalPaths`; a member that no pattern matches any more stays in the group and is reported.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{
    config::{
        CSI_DRIVER_LVM_VG_TAG, CalculationPolicy, DeviceClassConfig, DiscoveryPolicy, RaidConfig,
        RaidType, ThinPoolConfig, VG_OWNER_TAG,
    },
    filter::{self, ExclusionReason, FilterContext, Verdict, find_device, physical_volume_of},
    glob::{self, Pattern},
    layout::{FreeSpace, Layout},
    lvattr::{LvAttr, VgAttr},
    model::{BlockDevice, LogicalVolume, PhysicalVolume, VolumeGroup},
    names::validate_lvm_name,
    pool_fit,
    size::{ByteSize, GIB, KIB, MIB, round_down_to_extent, round_up_to_extent},
};

/// Size of the metadata area written on each new LVM physical volume (`pvcreate --metadatasize`).
/// LVM's default area (1020 KiB) caps a volume group near 1,700 logical volumes at ~290 bytes of volume
/// group metadata each; a node must hold at least 2,000 thin volumes per class, and 4 MiB leaves room for
/// several times that.
pub const PV_METADATA_SIZE: u64 = 4 * MIB;

/// Thin pool chunk size under the Static policy when none is configured.
pub const DEFAULT_CHUNK_SIZE: u64 = 128 * KIB;

/// Thin pool metadata size under the Static policy when none is configured. At ~4 KiB of pool metadata
/// per thin volume this holds far more volumes than the volume group metadata allows.
pub const DEFAULT_METADATA_SIZE: u64 = GIB;

/// The least thin pool metadata the Host policy gives a new pool. A thin volume costs ~4 KiB of pool
/// metadata, so LVM's own choice for a small pool (64 bytes per 64 KiB chunk, at least 2 MiB: 4 MiB for a
/// 4 GiB pool) holds fewer than the 2,000 thin volumes a node must hold per class; 16 MiB holds ~4,000.
/// Pools whose LVM choice is larger keep it.
pub const MIN_HOST_METADATA_SIZE: u64 = 16 * MIB;

/// lvm2's smallest thin pool metadata size: a smaller `--poolmetadatasize` is raised to it.
pub const MIN_METADATA_SIZE: u64 = 2 * MIB;

/// lvm2's smallest thin pool chunk size; every chunk size is a multiple of it.
pub const MIN_CHUNK_SIZE: u64 = 64 * KIB;
/// lvm2's largest thin pool chunk size.
pub const MAX_CHUNK_SIZE: u64 = GIB;

/// What the host looks like, as the engine observed it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// lsblk's tree, top-level devices first.
    pub devices: Vec<BlockDevice>,
    pub pvs: Vec<PhysicalVolume>,
    pub vgs: Vec<VolumeGroup>,
    pub lvs: Vec<LogicalVolume>,
    /// Each configured path (symlinks included) mapped to its canonical device path, or `None` when it
    /// does not exist. A configured path absent from this map counts as missing.
    pub resolved: BTreeMap<String, Option<String>>,
    /// Canonical paths this class has wiped on this node before (`forceWipeDevicesAndDestroyAllData`
    /// wipes a device once; the node agent keeps the record). Empty where nothing keeps one.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub wiped: BTreeSet<String>,
    /// Canonical paths of the devices other device classes on this node list: never discovered.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub claimed: BTreeSet<String>,
}

/// Kernel name prefixes of `disk`-type devices discovery never takes: compressed RAM, network block
/// devices, RAM disks and floppies.
pub const NEVER_DISCOVERED: [&str; 4] = ["zram", "nbd", "ram", "fd"];

/// Whether `class` names no device paths (it discovers its disks, or matches them by pattern).
fn lists_no_paths(class: &DeviceClassConfig) -> bool {
    class.device_selector.paths.is_empty() && class.device_selector.optional_paths.is_empty()
}

/// Whether `class` discovers its devices (lists neither paths nor patterns).
pub fn discovers(class: &DeviceClassConfig) -> bool {
    lists_no_paths(class) && class.device_selector.device_patterns.is_empty()
}

/// Whether `class` takes devices it does not list by path (it discovers them or matches them by
/// pattern): it must know what the other classes claim.
pub fn takes_unlisted(class: &DeviceClassConfig) -> bool {
    discovers(class) || !class.device_selector.device_patterns.is_empty()
}

/// The patterns of `class`'s `devicePatterns` that compile (the others fail the class).
fn patterns(class: &DeviceClassConfig) -> Vec<Pattern> {
    patterns_of(&class.device_selector.device_patterns)
}

fn patterns_of(items: &[String]) -> Vec<Pattern> {
    items
        .iter()
        .filter_map(|item| glob::parse_device_patterns(item).ok())
        .flatten()
        .collect()
}

/// One device of the tree, with its canonical path (`/dev/<kname>`) and its parent's.
struct Flat<'a> {
    canonical: String,
    device: &'a BlockDevice,
    parent: Option<String>,
}

/// Every device in `devices`' trees, each once (the first place it is found), parents first.
fn flatten(devices: &[BlockDevice]) -> Vec<Flat<'_>> {
    fn walk<'a>(
        devices: &'a [BlockDevice],
        parent: Option<&str>,
        seen: &mut BTreeSet<String>,
        out: &mut Vec<Flat<'a>>,
    ) {
        for d in devices {
            let canonical = format!("/dev/{}", d.kname);
            if seen.insert(canonical.clone()) {
                out.push(Flat {
                    canonical: canonical.clone(),
                    device: d,
                    parent: parent.map(str::to_owned),
                });
            }
            walk(&d.children, Some(&canonical), seen, out);
        }
    }
    let mut out = Vec::new();
    walk(devices, None, &mut BTreeSet::new(), &mut out);
    out
}

/// The first of `patterns` that matches one of `device`'s names, and that name.
fn matching<'p>(device: &BlockDevice, patterns: &'p [Pattern]) -> Option<(&'p Pattern, String)> {
    let kname = format!("/dev/{}", device.kname);
    let names: Vec<&str> = [kname.as_str(), device.path.as_str()]
        .into_iter()
        .chain(device.by_id.iter().map(String::as_str))
        .collect();
    patterns.iter().find_map(|p| {
        names
            .iter()
            .find(|n| p.matches(n))
            .map(|n| (p, (*n).to_owned()))
    })
}

/// Canonical paths of the devices `patterns` (`devicePatterns` items) match: what another class's
/// patterns claim.
pub fn matched_by(devices: &[BlockDevice], patterns: &[String]) -> BTreeSet<String> {
    let patterns = patterns_of(patterns);
    flatten(devices)
        .into_iter()
        .filter(|f| matching(f.device, &patterns).is_some())
        .map(|f| f.canonical)
        .collect()
}

/// What became of one configured path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum DeviceVerdict {
    /// Already an LVM physical volume of this class's volume group.
    Member,
    /// Will be added; when `waived` is not empty, after a wipe.
    Usable {
        waived: Vec<ExclusionReason>,
    },
    Excluded {
        reasons: Vec<ExclusionReason>,
    },
    /// An LVM physical volume of this class's group that the configuration no longer lists, which
    /// still holds logical volume data: kept, and `reason` says what to do.
    Retained {
        reason: String,
    },
    /// The path does not exist or names no block device.
    Missing,
}

impl From<Verdict> for DeviceVerdict {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Member { .. } => Self::Member,
            Verdict::Usable { waived } => Self::Usable { waived },
            Verdict::Excluded { reasons } => Self::Excluded { reasons },
        }
    }
}

impl DeviceVerdict {
    /// Member or usable.
    pub fn is_selected(&self) -> bool {
        matches!(self, Self::Member | Self::Usable { .. })
    }
}

/// One configured path and its verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReport {
    /// The path as configured.
    pub path: String,
    pub canonical_path: Option<String>,
    /// From `optionalPaths` (and not also in `paths`), discovered, or matched by a pattern.
    pub optional: bool,
    /// The `devicePatterns` pattern that selected the device (its name that matched is `path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub verdict: DeviceVerdict,
}

impl DeviceReport {
    /// `path`, with the pattern that matched it: how messages name the device.
    pub fn subject(&self) -> String {
        match &self.pattern {
            Some(p) => format!("{} (matched by devicePatterns {p})", self.path),
            None => self.path.clone(),
        }
    }

    /// [`Self::subject`], with the canonical path when it differs from `path`.
    pub fn display_name(&self) -> String {
        match &self.canonical_path {
            Some(c) if *c != self.path => match &self.pattern {
                Some(p) => format!("{} ({c}, matched by devicePatterns {p})", self.path),
                None => format!("{} ({c})", self.path),
            },
            _ => self.subject(),
        }
    }

    /// Every problem of the device in one line; empty for a member or a usable device.
    pub fn problems(&self) -> String {
        let name = self.display_name();
        match &self.verdict {
            DeviceVerdict::Excluded { reasons } => reasons
                .iter()
                .map(|r| r.message(&name))
                .collect::<Vec<_>>()
                .join("; "),
            DeviceVerdict::Missing => format!(
                "{name} does not exist on this node: attach the device or correct the path \
                 (by-id links differ between nodes)"
            ),
            DeviceVerdict::Retained { reason } => reason.clone(),
            DeviceVerdict::Member | DeviceVerdict::Usable { .. } => String::new(),
        }
    }
}

/// One step for the executor. Paths are canonical device paths; sizes are bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "action",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Action {
    /// Remove every signature from the device and its partitions (`wipefs --all`), destroying its data.
    WipeDevice {
        path: String,
    },
    CreatePhysicalVolume {
        path: String,
        metadata_size: u64,
    },
    CreateVolumeGroup {
        name: String,
        pvs: Vec<String>,
        tags: Vec<String>,
    },
    ExtendVolumeGroup {
        name: String,
        pvs: Vec<String>,
    },
    /// `None` sizes are left to LVM. `zero`: zero newly provisioned blocks. With `raid`, the pool's
    /// data is a RAID LV of that layout and its metadata a raid1 LV ([`PoolRaid`]), made first and
    /// joined into the pool (`lvconvert --type thin-pool --poolmetadata`); `metadata_size` is then
    /// always given.
    CreateThinPool {
        vg: String,
        name: String,
        data_size: u64,
        chunk_size: Option<u64>,
        metadata_size: Option<u64>,
        zero: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        raid: Option<PoolRaid>,
    },
    /// Grow the pool's data to `data_size` bytes in total.
    ExtendThinPool {
        vg: String,
        name: String,
        data_size: u64,
    },
    /// Take unused LVM physical volumes out of the group (`vgreduce`).
    ReduceVolumeGroup {
        name: String,
        pvs: Vec<String>,
    },
    /// Remove the LVM label of a physical volume that belongs to no group (`pvremove`).
    RemovePhysicalVolume {
        path: String,
    },
    /// Take over another driver's volume group by adding our tag (`vgchange --addtag`); nothing
    /// else on it changes (`adopt`, ADR 0023).
    AdoptVolumeGroup {
        name: String,
        tag: String,
    },
}

/// The RAID layout of a thin pool's two sub-volumes (ADR 0031): the data takes the class's
/// `raidConfig`; the metadata is raid1 with as many extra copies as the data level survives lost
/// devices ([`metadata_mirrors`]), so the pool survives what its data survives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRaid {
    pub data: RaidConfig,
    pub metadata_mirrors: u32,
}

impl PoolRaid {
    pub fn of(raid: &RaidConfig) -> Self {
        Self {
            data: raid.clone(),
            metadata_mirrors: metadata_mirrors(raid),
        }
    }
}

/// The name of the raid1 LV a RAID thin pool's metadata is made as before it joins the pool
/// (`<pool>_meta`; after `lvconvert` it is the pool's hidden `[<pool>_tmeta]`).
pub fn pool_metadata_lv(pool: &str) -> String {
    format!("{pool}_meta")
}

/// How many devices a RAID level may lose with no data lost, for certain: raid1 and raid10 their
/// `mirrors` (default 1; raid10 loses more only when they fall in different mirror sets), raid4 and
/// raid5 one, raid6 two. A RAID thin pool's metadata is raid1 with this many extra copies.
pub fn metadata_mirrors(raid: &RaidConfig) -> u32 {
    match raid.raid_type {
        RaidType::Raid1 | RaidType::Raid10 => raid.mirrors.unwrap_or(1).max(1),
        RaidType::Raid4 | RaidType::Raid5 => 1,
        RaidType::Raid6 => 2,
    }
}

/// Where the class stands after this plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum ClassState {
    /// Nothing left to do.
    Ready,
    /// The plan has actions.
    Progressing,
    /// A RAID class whose volume group lost LVM physical volumes: its RAID volumes go on with
    /// fewer images and the class still serves them, but nothing is built or grown until the disks
    /// are replaced and the volumes repaired (`reason` says how).
    Degraded { reason: String },
    /// Nothing can be done until the configuration or the host changes.
    Failed { reason: String },
}

impl ClassState {
    /// Whether the class serves volumes: `Ready`, or `Degraded` (RAID on fewer images).
    pub fn serves(&self) -> bool {
        matches!(self, Self::Ready | Self::Degraded { .. })
    }
}

/// The outcome of [`plan_device_class`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassPlan {
    /// One report per configured path, `paths` first, in configuration order.
    pub devices: Vec<DeviceReport>,
    pub actions: Vec<Action>,
    pub state: ClassState,
}

/// The fewest devices a RAID layout needs: raid1 `mirrors + 1` (mirrors default 1); raid4/5
/// `stripes + 1` (default 2); raid6 `stripes + 2` (default 3); raid10 `stripes × (mirrors + 1)`
/// (stripes default and minimum 2, mirrors default 1).
pub fn raid_min_devices(raid: &RaidConfig) -> u64 {
    let mirrors = u64::from(raid.mirrors.unwrap_or(1));
    let stripes = raid.stripes.map(u64::from);
    match raid.raid_type {
        RaidType::Raid1 => mirrors + 1,
        RaidType::Raid4 | RaidType::Raid5 => stripes.unwrap_or(2) + 1,
        RaidType::Raid6 => stripes.unwrap_or(3) + 2,
        RaidType::Raid10 => stripes.unwrap_or(2).max(2) * (mirrors + 1),
    }
}

/// An upper estimate of the metadata size LVM picks for a thin pool of `data_size` bytes when none is
/// given: 64 bytes per chunk, at least 2 MiB. With an LVM-chosen chunk size (`None`) LVM doubles the
/// chunk until the metadata fits 128 MiB; with a fixed chunk it is capped at LVM's 16 GiB maximum.
pub fn thin_pool_metadata_estimate(data_size: u64, chunk_size: Option<u64>) -> u64 {
    let (chunk, max) = match chunk_size {
        None => (MIN_CHUNK_SIZE, 128 * MIB),
        Some(c) => (c.max(1), 16 * GIB),
    };
    (data_size / chunk).saturating_mul(64).clamp(2 * MIB, max)
}

fn is_thin_pool(lv: &LogicalVolume) -> bool {
    lv.segtype == "thin-pool" || LvAttr::parse(&lv.attr).is_ok_and(|a| a.is_thin_pool())
}

fn size(bytes: u64) -> ByteSize {
    ByteSize(bytes)
}

/// A selected device: a report that is member or usable, deduplicated by canonical path.
struct Selected<'a> {
    canonical: String,
    device: &'a BlockDevice,
    member: bool,
    waived: bool,
    has_pv: bool,
}

/// The logical volumes in the class's volume group that are not ours (they lack [`VG_OWNER_TAG`]),
/// by name: an adopted group's volumes (csi-driver-lvm's `pvc-…`, ADR 0023) or volumes made by
/// hand. The class's thin pool is ours though untagged (and so, on the way to it, the RAID data and
/// metadata LVs a RAID pool is made of). Nothing of lvms-rs ever removes them: the
/// driver and the garbage collector only see logical volumes tagged ours.
pub fn foreign_volumes(class: &DeviceClassConfig, observed: &Observed) -> Vec<String> {
    let pool = class.thin_pool_config.as_ref().map(|tp| tp.name.as_str());
    // A RAID pool's metadata before it joins the pool (ADR 0031).
    let pool_meta = pool
        .filter(|_| class.raid_config.is_some())
        .map(pool_metadata_lv);
    let mut names: Vec<String> = observed
        .lvs
        .iter()
        .filter(|lv| lv.vg_name == class.name)
        // Hidden sub-volumes (`[pool_tdata]`, `[lvol0_pmspare]`) belong to a visible one.
        .filter(|lv| !lv.name.starts_with('['))
        .filter(|lv| Some(lv.name.as_str()) != pool)
        .filter(|lv| pool_meta.as_deref() != Some(lv.name.as_str()))
        .filter(|lv| !lv.tags.iter().any(|t| t == VG_OWNER_TAG))
        .map(|lv| lv.name.clone())
        .collect();
    names.sort();
    names
}

/// Plans device class `class` against `observed`. Pure: the same inputs give the same plan.
pub fn plan_device_class(class: &DeviceClassConfig, observed: &Observed) -> ClassPlan {
    let vg = observed.vgs.iter().find(|v| v.name == class.name);
    let ours = vg.is_some_and(|v| v.tags.iter().any(|t| t == VG_OWNER_TAG));
    let ctx = FilterContext {
        pvs: &observed.pvs,
        vgs: &observed.vgs,
        lvs: &observed.lvs,
        own_vgs: if ours {
            BTreeSet::from([class.name.as_str()])
        } else {
            BTreeSet::new()
        },
        force_wipe: class
            .device_selector
            .force_wipe_devices_and_destroy_all_data,
        wiped: observed.wiped.iter().map(String::as_str).collect(),
        named: false,
    };
    let devices = report_devices(class, observed, &ctx);
    let failed = |devices: Vec<DeviceReport>, reason: String| ClassPlan {
        devices,
        actions: Vec::new(),
        state: ClassState::Failed { reason },
    };

    if let Err(reason) = check_config(class) {
        return failed(devices, reason);
    }
    // A group already ours (adopted before, or made by us) goes on as usual, `adopt` or not.
    let foreign_vg = vg.filter(|_| !ours);
    match (foreign_vg, class.adopt) {
        (Some(vg), Some(adopt)) => {
            let Some(why) = adopt.refuses(&vg.tags) else {
                return ClassPlan {
                    devices,
                    actions: vec![Action::AdoptVolumeGroup {
                        name: vg.name.clone(),
                        tag: VG_OWNER_TAG.to_owned(),
                    }],
                    state: ClassState::Progressing,
                };
            };
            return failed(
                devices,
                format!(
                    "volume group {} exists but was not made by {adopt}: {} (it has {}), so \
                     adopt: {adopt} does not take it and lvms-rs never touches it; check that \
                     this is the group meant, or rename the device class",
                    vg.name,
                    why,
                    if vg.tags.is_empty() {
                        "no tags".to_owned()
                    } else {
                        format!("tags {}", vg.tags.join(", "))
                    },
                    adopt = adopt.as_str(),
                ),
            );
        }
        (Some(vg), None) => {
            let hint = if vg.tags.iter().any(|t| t == CSI_DRIVER_LVM_VG_TAG) {
                format!(
                    "; it was made by csi-driver-lvm ({CSI_DRIVER_LVM_VG_TAG}): set adopt: \
                     csi-driver-lvm on device class {} to take it over without wiping it",
                    class.name
                )
            } else if vg.tags.is_empty() {
                format!(
                    "; if TopoLVM's lvmd uses it, set adopt: topolvm on device class {} to take it \
                     over without wiping it",
                    class.name
                )
            } else {
                String::new()
            };
            return failed(
                devices,
                format!(
                    "volume group {} exists and is not ours: it lacks the {VG_OWNER_TAG:?} tag, so \
                     lvms-rs never touches it; rename the device class, or adopt the group with \
                     vgchange --addtag {VG_OWNER_TAG} {}{hint}",
                    vg.name, vg.name
                ),
            );
        }
        (None, Some(adopt)) if vg.is_none() => {
            return failed(
                devices,
                format!(
                    "device class {} has adopt: {adopt}, but this node has no volume group {} to \
                     adopt, and adopting never creates one: name the device class after the \
                     group {adopt} uses ({}), or, for a node without one, remove adopt (a group \
                     already adopted stays ours without it)",
                    class.name,
                    class.name,
                    adopt.group_name_hint(),
                    adopt = adopt.as_str(),
                ),
            );
        }
        (None, _) => {}
    }

    if let Some(vg) = vg
        && VgAttr::parse(&vg.attr).is_ok_and(|a| a.is_partial())
    {
        // Checked before the devices: a lost disk is a required path missing, and leaves fewer
        // usable devices than RAID needs.
        return match &class.raid_config {
            Some(_) => ClassPlan {
                state: ClassState::Degraded {
                    reason: degraded_reason(class, vg, observed, &devices),
                },
                devices,
                actions: Vec::new(),
            },
            None => failed(
                devices,
                format!(
                    "volume group {} is missing LVM physical volumes (partial): reattach or replace \
                     the device, then run vgreduce --removemissing {}",
                    vg.name, vg.name
                ),
            ),
        };
    }
    let unusable_required: Vec<String> = devices
        .iter()
        .filter(|d| !d.optional && !d.verdict.is_selected())
        .map(DeviceReport::problems)
        .collect();
    if !unusable_required.is_empty() {
        return failed(
            devices,
            format!(
                "device class {} cannot use its required devices (deviceSelector.paths): {}",
                class.name,
                unusable_required.join("; ")
            ),
        );
    }

    let selected = select(&devices, observed, &ctx);
    if selected.is_empty() && discovers(class) {
        let problems: Vec<String> = devices.iter().map(DeviceReport::problems).collect();
        return failed(
            devices,
            format!(
                "device class {} lists no device paths, so it uses the node's free disks, and found \
                 none{}{}: attach an empty disk, or list devices in deviceSelector.paths",
                class.name,
                if problems.is_empty() { "" } else { ": " },
                problems.join("; ")
            ),
        );
    }
    if selected.is_empty() {
        let problems: Vec<String> = devices
            .iter()
            .map(DeviceReport::problems)
            .filter(|p| !p.is_empty())
            .collect();
        let sel = &class.device_selector;
        let what = match (
            sel.optional_paths.is_empty(),
            sel.device_patterns.is_empty(),
        ) {
            (false, true) => "none of deviceSelector.optionalPaths can be used".to_owned(),
            (true, false) => format!(
                "no device that deviceSelector.devicePatterns ({}) matches can be used",
                sel.device_patterns.join(", ")
            ),
            _ => format!(
                "none of deviceSelector.optionalPaths, and no device that deviceSelector.devicePatterns \
                 ({}) matches, can be used",
                sel.device_patterns.join(", ")
            ),
        };
        return failed(
            devices,
            format!(
                "device class {} has no usable device: {what}{}{}",
                class.name,
                if problems.is_empty() {
                    ": nothing matched on this node"
                } else {
                    ": "
                },
                problems.join("; ")
            ),
        );
    }
    if let Err(reason) = check_overlap(&selected) {
        return failed(devices, reason);
    }
    if let Some(raid) = &class.raid_config {
        let need = raid_min_devices(raid);
        let have = selected.len() as u64;
        if have < need {
            return failed(
                devices,
                format!(
                    "device class {} uses {} with {need} devices at least, but only {have} usable: \
                     add devices or lower raidConfig.mirrors / raidConfig.stripes",
                    class.name,
                    raid.raid_type.as_lvm()
                ),
            );
        }
    }

    if let (Some(vg), Some(tp)) = (vg, &class.thin_pool_config) {
        // Checked before growing the group, so a name conflict stops the class before any change.
        if let Err(reason) = existing_pool(vg, tp, class.raid_config.is_some(), &observed.lvs) {
            return failed(devices, reason);
        }
    }

    let mut devices = devices;
    // Discovered and pattern-matched members stay: only a path taken out of the list leaves.
    let removed = match vg {
        Some(vg) if !lists_no_paths(class) && class.device_selector.device_patterns.is_empty() => {
            removed_members(vg, &selected, observed)
        }
        _ => Vec::new(),
    };
    let mut reduce = Vec::new();
    for pv in removed {
        let used = pv.size.saturating_sub(pv.free);
        if used == 0 {
            reduce.push(pv.name.clone());
        } else {
            devices.push(DeviceReport {
                path: pv.name.clone(),
                canonical_path: Some(pv.name.clone()),
                optional: true,
                pattern: None,
                verdict: DeviceVerdict::Retained {
                    reason: format!(
                        "{} is no longer listed in deviceSelector but holds {} of logical volume data \
                         in volume group {}: lvms-rs does not move data; move it with pvmove {} (then \
                         it is removed from the group), or list the device again",
                        pv.name,
                        size(used),
                        class.name,
                        pv.name
                    ),
                },
            });
        }
    }

    let mut actions = Vec::new();
    let to_add: Vec<&Selected<'_>> = selected.iter().filter(|s| !s.member).collect();
    for s in to_add.iter().filter(|s| s.waived) {
        actions.push(Action::WipeDevice {
            path: s.canonical.clone(),
        });
    }
    for s in to_add.iter().filter(|s| s.waived || !s.has_pv) {
        actions.push(Action::CreatePhysicalVolume {
            path: s.canonical.clone(),
            metadata_size: PV_METADATA_SIZE,
        });
    }
    let new_pvs: Vec<String> = to_add.iter().map(|s| s.canonical.clone()).collect();
    match vg {
        None => actions.push(Action::CreateVolumeGroup {
            name: class.name.clone(),
            pvs: new_pvs,
            tags: vec![VG_OWNER_TAG.to_owned()],
        }),
        Some(_) if !new_pvs.is_empty() => actions.push(Action::ExtendVolumeGroup {
            name: class.name.clone(),
            pvs: new_pvs,
        }),
        // The pool is planned once the group has its final devices: growing it now could take
        // extents on a device about to leave.
        Some(_) if !reduce.is_empty() => {}
        Some(vg) => {
            if let Some(tp) = &class.thin_pool_config {
                match plan_thin_pool(
                    vg,
                    tp,
                    class.raid_config.as_ref(),
                    &observed.lvs,
                    &observed.pvs,
                ) {
                    Ok(Some(action)) => actions.push(action),
                    Ok(None) => {}
                    Err(reason) => return failed(devices, reason),
                }
            }
        }
    }

    if !reduce.is_empty() {
        actions.push(Action::ReduceVolumeGroup {
            name: class.name.clone(),
            pvs: reduce.clone(),
        });
        actions.extend(
            reduce
                .into_iter()
                .map(|path| Action::RemovePhysicalVolume { path }),
        );
    }

    let state = if actions.is_empty() {
        ClassState::Ready
    } else {
        ClassState::Progressing
    };
    ClassPlan {
        devices,
        actions,
        state,
    }
}

/// Why a RAID class is degraded, naming what is lost and the repair, in the order lvm2 needs it.
fn degraded_reason(
    class: &DeviceClassConfig,
    vg: &VolumeGroup,
    observed: &Observed,
    devices: &[DeviceReport],
) -> String {
    let missing: Vec<&str> = observed
        .pvs
        .iter()
        .filter(|pv| pv.vg_name.as_deref() == Some(vg.name.as_str()) && pv.attr.contains('m'))
        .map(|pv| pv.uuid.as_str())
        .collect();
    // The configured devices that are not (or no longer readable as) members: the lost disks.
    let sel = &class.device_selector;
    let lost: Vec<String> = devices
        .iter()
        .filter(|d| !matches!(d.verdict, DeviceVerdict::Member))
        .filter(|d| sel.paths.contains(&d.path) || sel.optional_paths.contains(&d.path))
        .map(|d| d.path.clone())
        .collect();
    let volumes = match &class.thin_pool_config {
        Some(tp) => format!("{0}/{1}_tdata and {0}/{1}_tmeta", vg.name, tp.name),
        None => format!("each RAID volume of {} (lvs -a {})", vg.name, vg.name),
    };
    format!(
        "volume group {vg_name} is missing {n} of its LVM physical volumes (uuid {uuids}){lost}: its RAID \
         volumes run on the remaining images and are still served, and nothing is built or grown \
         until it is repaired. Reattach the disk and run lvchange --refresh {vg_name}; or replace it: \
         pvcreate the new disk, vgextend {vg_name} with it, lvconvert --repair {volumes}, then \
         vgreduce --removemissing {vg_name}. lvms-rs removes and wipes nothing of it",
        vg_name = vg.name,
        n = missing.len().max(1),
        uuids = if missing.is_empty() {
            "unknown".to_owned()
        } else {
            missing.join(", ")
        },
        lost = if lost.is_empty() {
            String::new()
        } else {
            format!(
                "; configured but not readable as members: {}",
                lost.join(", ")
            )
        },
    )
}

fn report_devices(
    class: &DeviceClassConfig,
    observed: &Observed,
    ctx: &FilterContext<'_>,
) -> Vec<DeviceReport> {
    if discovers(class) {
        return discover_devices(class, observed, ctx);
    }
    let sel = &class.device_selector;
    let named = FilterContext {
        named: true,
        ..ctx.clone()
    };
    let mut seen = BTreeSet::new();
    let mut reports: Vec<DeviceReport> = sel
        .paths
        .iter()
        .map(|p| (p, false))
        .chain(sel.optional_paths.iter().map(|p| (p, true)))
        .filter(|(p, _)| seen.insert(p.as_str()))
        .map(|(path, optional)| {
            let canonical_path = observed.resolved.get(path).cloned().flatten();
            let verdict = match canonical_path
                .as_deref()
                .and_then(|c| find_device(&observed.devices, c))
            {
                Some(device) => filter::evaluate(device, &named).into(),
                None => DeviceVerdict::Missing,
            };
            DeviceReport {
                path: path.clone(),
                canonical_path,
                optional,
                pattern: None,
                verdict,
            }
        })
        .collect();
    if !sel.device_patterns.is_empty() {
        let listed: BTreeSet<String> = reports
            .iter()
            .filter_map(|r| r.canonical_path.clone())
            .collect();
        reports.extend(match_devices(class, observed, ctx, &listed));
    }
    reports
}

/// The devices `class`'s patterns select (see the [module documentation](self)), each as an
/// optional device under the name that matched, then the group's members no pattern matches.
/// `listed`: canonical paths the class lists by path (reported as such).
fn match_devices(
    class: &DeviceClassConfig,
    observed: &Observed,
    ctx: &FilterContext<'_>,
    listed: &BTreeSet<String>,
) -> Vec<DeviceReport> {
    // Matched devices are never wiped.
    let ctx = FilterContext {
        force_wipe: false,
        ..ctx.clone()
    };
    let patterns = patterns(class);
    let vg_exists = observed.vgs.iter().any(|v| v.name == class.name);
    let only_members = vg_exists && class.device_discovery_policy == DiscoveryPolicy::Static;
    let mut out = Vec::new();
    let mut unmatched_members = Vec::new();
    // Matched devices by canonical path, with the pattern: a partition of a matched disk is not
    // taken.
    let mut matched: BTreeMap<String, String> = BTreeMap::new();
    for Flat {
        canonical,
        device: d,
        parent,
    } in flatten(&observed.devices)
    {
        let found = matching(d, &patterns);
        if let Some((pattern, _)) = &found {
            matched.insert(canonical.clone(), pattern.as_str().to_owned());
        }
        if listed.contains(&canonical)
            || observed.claimed.contains(&canonical)
            || observed.claimed.contains(&d.path)
        {
            continue;
        }
        let mut verdict: DeviceVerdict = filter::evaluate(d, &ctx).into();
        if d.kind == crate::model::DeviceKind::Part
            && verdict != DeviceVerdict::Member
            && let Some((disk, pattern)) = parent
                .as_ref()
                .and_then(|p| matched.get(p).map(|pattern| (p, pattern)))
        {
            let reason = ExclusionReason::PartitionOfMatchedDisk {
                disk: disk.clone(),
                pattern: pattern.clone(),
            };
            verdict = match verdict {
                DeviceVerdict::Excluded { mut reasons } => {
                    reasons.push(reason);
                    DeviceVerdict::Excluded { reasons }
                }
                _ => DeviceVerdict::Excluded {
                    reasons: vec![reason],
                },
            };
        }
        let Some((pattern, name)) = found else {
            if verdict == DeviceVerdict::Member {
                unmatched_members.push(DeviceReport {
                    path: canonical.clone(),
                    canonical_path: Some(canonical),
                    optional: true,
                    pattern: None,
                    verdict,
                });
            }
            continue;
        };
        if only_members && verdict != DeviceVerdict::Member {
            continue;
        }
        out.push(DeviceReport {
            path: name,
            canonical_path: Some(canonical),
            optional: true,
            pattern: Some(pattern.as_str().to_owned()),
            verdict,
        });
    }
    out.extend(unmatched_members);
    out
}

/// The devices a class without paths considers (see the [module documentation](self)), each as an
/// optional device under its `/dev/<kname>` path.
fn discover_devices(
    class: &DeviceClassConfig,
    observed: &Observed,
    ctx: &FilterContext<'_>,
) -> Vec<DeviceReport> {
    // Discovered devices are never wiped.
    let ctx = FilterContext {
        force_wipe: false,
        ..ctx.clone()
    };
    let vg_exists = observed.vgs.iter().any(|v| v.name == class.name);
    let only_members = vg_exists && class.device_discovery_policy == DiscoveryPolicy::Static;
    observed
        .devices
        .iter()
        .filter(|d| d.kind == crate::model::DeviceKind::Disk)
        .filter(|d| !NEVER_DISCOVERED.iter().any(|p| d.kname.starts_with(p)))
        .filter_map(|d| {
            let path = format!("/dev/{}", d.kname);
            if observed.claimed.contains(&path) || observed.claimed.contains(&d.path) {
                return None;
            }
            let verdict: DeviceVerdict = filter::evaluate(d, &ctx).into();
            if only_members && verdict != DeviceVerdict::Member {
                return None;
            }
            Some(DeviceReport {
                path: path.clone(),
                canonical_path: Some(path),
                optional: true,
                pattern: None,
                verdict,
            })
        })
        .collect()
}

fn select<'a>(
    devices: &[DeviceReport],
    observed: &'a Observed,
    ctx: &FilterContext<'_>,
) -> Vec<Selected<'a>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for report in devices {
        let Some(canonical) = report.canonical_path.as_deref() else {
            continue;
        };
        let Some(device) = find_device(&observed.devices, canonical) else {
            continue;
        };
        let (member, waived) = match &report.verdict {
            DeviceVerdict::Member => (true, false),
            DeviceVerdict::Usable { waived } => (false, !waived.is_empty()),
            DeviceVerdict::Excluded { .. }
            | DeviceVerdict::Missing
            | DeviceVerdict::Retained { .. } => continue,
        };
        if !seen.insert(canonical) {
            continue;
        }
        out.push(Selected {
            canonical: canonical.to_owned(),
            device,
            member,
            waived,
            has_pv: physical_volume_of(device, ctx.pvs).is_some(),
        });
    }
    out
}

/// The LVM physical volumes of `vg` that no configured device is (a missing one is left to the
/// partial-group check).
fn removed_members<'a>(
    vg: &VolumeGroup,
    selected: &[Selected<'_>],
    observed: &'a Observed,
) -> Vec<&'a PhysicalVolume> {
    let kept: BTreeSet<&str> = selected
        .iter()
        .filter(|s| s.member)
        .filter_map(|s| physical_volume_of(s.device, &observed.pvs))
        .map(|pv| pv.name.as_str())
        .collect();
    observed
        .pvs
        .iter()
        .filter(|pv| pv.vg_name.as_deref() == Some(vg.name.as_str()))
        .filter(|pv| !pv.attr.contains('m') && !kept.contains(pv.name.as_str()))
        .collect()
}

fn check_overlap(selected: &[Selected<'_>]) -> Result<(), String> {
    for a in selected {
        for b in selected {
            if a.canonical != b.canonical
                && find_device(std::slice::from_ref(a.device), &b.canonical).is_some()
            {
                return Err(format!(
                    "{} and {} are both configured, but {} is part of {}: configure one of them",
                    a.canonical, b.canonical, b.canonical, a.canonical
                ));
            }
        }
    }
    Ok(())
}

fn check_config(class: &DeviceClassConfig) -> Result<(), String> {
    validate_lvm_name(&class.name)
        .map_err(|e| format!("device class name is not a valid volume group name: {e}"))?;
    for item in &class.device_selector.device_patterns {
        glob::parse_device_patterns(item)
            .map_err(|e| format!("deviceSelector.devicePatterns: {e}"))?;
    }
    if lists_no_paths(class)
        && class
            .device_selector
            .force_wipe_devices_and_destroy_all_data
    {
        return Err(format!(
            "device class {} sets deviceSelector.forceWipeDevicesAndDestroyAllData without device \
             paths: discovered and pattern-matched disks are never wiped; list the devices to wipe in \
             deviceSelector.paths",
            class.name
        ));
    }
    if let Some(tp) = &class.thin_pool_config {
        validate_lvm_name(&tp.name)
            .map_err(|e| format!("thinPoolConfig.name is not a valid LVM name: {e}"))?;
        if !(10..=100).contains(&tp.size_percent) {
            return Err(format!(
                "thinPoolConfig.sizePercent is {}: give a percentage from 10 to 100",
                tp.size_percent
            ));
        }
        match (tp.chunk_size_calculation_policy, tp.chunk_size) {
            (CalculationPolicy::Host, Some(_)) => {
                return Err(
                    "thinPoolConfig.chunkSize is set but chunkSizeCalculationPolicy is Host: \
                            remove chunkSize or set the policy to Static"
                        .to_owned(),
                );
            }
            (CalculationPolicy::Static, Some(ByteSize(c)))
                if !(MIN_CHUNK_SIZE..=MAX_CHUNK_SIZE).contains(&c) || c % MIN_CHUNK_SIZE != 0 =>
            {
                return Err(format!(
                    "thinPoolConfig.chunkSize {} is invalid: LVM needs a multiple of {} from {} to {}",
                    size(c),
                    size(MIN_CHUNK_SIZE),
                    size(MIN_CHUNK_SIZE),
                    size(MAX_CHUNK_SIZE)
                ));
            }
            _ => {}
        }
        if tp.metadata_size_calculation_policy == CalculationPolicy::Host
            && tp.metadata_size.is_some()
        {
            return Err(
                "thinPoolConfig.metadataSize is set but metadataSizeCalculationPolicy is Host: \
                        remove metadataSize or set the policy to Static"
                    .to_owned(),
            );
        }
        if tp.metadata_size == Some(ByteSize(0)) {
            return Err("thinPoolConfig.metadataSize is 0: give a size such as 1Gi".to_owned());
        }
    }
    Ok(())
}

/// The pool's target data size: `sizePercent` of the volume group's size, in whole extents; over
/// RAID, of what the group holds in that layout (`data stripes ÷ images` of it: half for a raid1
/// with one extra copy, two thirds for a raid5 of two stripes).
fn pool_target(vg: &VolumeGroup, tp: &ThinPoolConfig, raid: Option<&Layout>) -> u64 {
    let pct = u128::from(tp.size_percent.min(100));
    let (images, stripes) = raid
        .and_then(|l| l.images(0))
        .map_or((1, 1), |(i, s)| (u128::from(i.max(1)), u128::from(s)));
    let bytes =
        u64::try_from(u128::from(vg.size) * pct * stripes / 100 / images).unwrap_or(vg.size);
    round_down_to_extent(bytes, vg.extent_size).unwrap_or(0)
}

/// What of the class's thin pool exists.
enum Pool<'a> {
    Absent,
    Made(&'a LogicalVolume),
    /// A RAID class's pool half made: its RAID data LV exists under the pool's name but is not a
    /// pool yet (the node stopped between the steps of [`Action::CreateThinPool`]).
    Joining(&'a LogicalVolume),
}

/// The class's thin pool as far as it exists; an error when a logical volume of that name is not
/// a thin pool (nor, for a RAID class, the pool's RAID data on its way to one).
fn existing_pool<'a>(
    vg: &VolumeGroup,
    tp: &ThinPoolConfig,
    raid: bool,
    lvs: &'a [LogicalVolume],
) -> Result<Pool<'a>, String> {
    match lvs
        .iter()
        .find(|lv| lv.vg_name == vg.name && lv.name == tp.name)
    {
        None => Ok(Pool::Absent),
        Some(lv) if is_thin_pool(lv) => Ok(Pool::Made(lv)),
        Some(lv) if raid && lv.segtype.starts_with("raid") => Ok(Pool::Joining(lv)),
        Some(lv) => Err(format!(
            "logical volume {}/{} exists and is not a thin pool (segment type {}): choose another \
             thinPoolConfig.name or remove the volume",
            vg.name, tp.name, lv.segtype
        )),
    }
}

/// The thin pool's action: create it with as much data as lvm2 can place beside its metadata and spare
/// (see [`pool_fit`]; over RAID, [`raid_pool_cap`]), up to `sizePercent`; or grow it towards
/// `sizePercent`.
fn plan_thin_pool(
    vg: &VolumeGroup,
    tp: &ThinPoolConfig,
    raid: Option<&RaidConfig>,
    lvs: &[LogicalVolume],
    pvs: &[PhysicalVolume],
) -> Result<Option<Action>, String> {
    let extent = vg.extent_size;
    if extent == 0 {
        return Err(format!(
            "volume group {} reports an extent size of 0: the LVM report is inconsistent",
            vg.name
        ));
    }
    let layout = raid.map(Layout::of_raid_config);
    let free = vg.free_count.saturating_mul(extent);
    let target = pool_target(vg, tp, layout.as_ref());
    let mut pv_free: Vec<u64> = pvs
        .iter()
        .filter(|pv| pv.vg_name.as_deref() == Some(vg.name.as_str()) && pv.attr.starts_with('a'))
        .map(|pv| pv.free / extent)
        .collect();
    if pv_free.is_empty() {
        pv_free.push(vg.free_count);
    }

    let joining = match existing_pool(vg, tp, raid.is_some(), lvs)? {
        Pool::Made(lv) => {
            // Grow towards the target as far as free space allows; never shrink. Over RAID every
            // image grows on its own device.
            let room = match &layout {
                Some(l) => l.max_size(&FreeSpace::new(extent, pv_free.iter().map(|f| f * extent))),
                None => free,
            };
            let reachable = target.min(lv.size.saturating_add(room));
            let reachable = round_down_to_extent(reachable, extent).unwrap_or(0);
            if reachable >= lv.size.saturating_add(extent) {
                return Ok(Some(Action::ExtendThinPool {
                    vg: vg.name.clone(),
                    name: tp.name.clone(),
                    data_size: reachable,
                }));
            }
            return Ok(None);
        }
        Pool::Joining(lv) => Some(lv),
        Pool::Absent => None,
    };

    if target < extent {
        return Err(format!(
            "thinPoolConfig.sizePercent {}% of volume group {} ({}{}) is less than one extent ({}): \
             raise sizePercent or add devices",
            tp.size_percent,
            vg.name,
            size(vg.size),
            layout
                .as_ref()
                .map(|l| format!(", as {}", l.name()))
                .unwrap_or_default(),
            size(extent)
        ));
    }
    let chunk_size = match tp.chunk_size_calculation_policy {
        CalculationPolicy::Static => Some(tp.chunk_size.map_or(DEFAULT_CHUNK_SIZE, |c| c.0)),
        CalculationPolicy::Host => None,
    };
    let metadata_size = match tp.metadata_size_calculation_policy {
        CalculationPolicy::Static => Some(tp.metadata_size.map_or(DEFAULT_METADATA_SIZE, |m| m.0)),
        CalculationPolicy::Host => {
            let floor = round_up_to_extent(MIN_HOST_METADATA_SIZE, extent).unwrap_or(u64::MAX);
            (thin_pool_metadata_estimate(target, chunk_size) < floor).then_some(floor)
        }
    };
    let metadata = metadata_size.unwrap_or_else(|| thin_pool_metadata_estimate(target, chunk_size));
    // lvm2 raises a smaller metadata size to its minimum and rounds it up to whole extents.
    let metadata = round_up_to_extent(metadata.max(MIN_METADATA_SIZE), extent).unwrap_or(u64::MAX);
    let meta_extents = metadata / extent;
    // lvm2 keeps one pool metadata spare per group, as large as the largest pool metadata, and makes or
    // grows it with the pool.
    let spare_extents = meta_extents.saturating_sub(
        lvs.iter()
            .filter(|lv| lv.vg_name == vg.name && is_thin_pool(lv))
            .filter_map(|lv| lv.metadata_size)
            .max()
            .map_or(0, |m| m.div_ceil(extent)),
    );
    if let (Some(raid), Some(layout)) = (raid, &layout) {
        let data_size = match joining {
            // The data is made: only the metadata (if not made yet) and the join are left.
            Some(lv) => lv.size,
            None => {
                let cap = raid_pool_cap(layout, extent, &pv_free, meta_extents, spare_extents);
                let data_size = target.min(cap);
                if data_size < extent {
                    return Err(format!(
                        "thin pool {} does not fit volume group {} as {}: each of the {} devices \
                         it needs must hold an image of the pool's data, beside a raid1 image of \
                         its metadata ({}) and room for the pool metadata spare ({}); the group has \
                         {} free ({}): add devices, or lower thinPoolConfig.metadataSize",
                        tp.name,
                        vg.name,
                        layout.name(),
                        layout.devices_needed(pv_free.len() as u64),
                        size(metadata),
                        size(spare_extents * extent),
                        size(free),
                        per_pv_free(&pv_free, extent),
                    ));
                }
                data_size
            }
        };
        return Ok(Some(Action::CreateThinPool {
            vg: vg.name.clone(),
            name: tp.name.clone(),
            data_size,
            chunk_size,
            metadata_size: Some(metadata),
            zero: true,
            raid: Some(PoolRaid::of(raid)),
        }));
    }
    let fit = pool_fit::max_data_extents(&pv_free, meta_extents, spare_extents)
        .map(|cap| cap.min(vg.free_count.saturating_sub(meta_extents + spare_extents)))
        .filter(|cap| *cap > 0);
    let Some(cap) = fit else {
        let (what, fix) = match metadata_size {
            Some(_) => (
                "thinPoolConfig.metadataSize",
                "lower thinPoolConfig.metadataSize, or add devices",
            ),
            None => ("LVM's choice", "add devices"),
        };
        return Err(format!(
            "thin pool {} does not fit volume group {}: {} of data was requested \
             (thinPoolConfig.sizePercent {}%), and LVM needs the pool's metadata ({}, {what}) and its pool \
             metadata spare ({}) each whole on one LVM physical volume, beside at least one extent ({}) \
             of data; the group has {} free ({}): {fix}",
            tp.name,
            vg.name,
            size(target),
            tp.size_percent,
            size(metadata),
            size(spare_extents * extent),
            size(extent),
            size(free),
            per_pv_free(&pv_free, extent),
        ));
    };
    let data_size = target.min(cap * extent);
    if let Some(chunk) = chunk_size.filter(|c| data_size < *c) {
        return Err(format!(
            "thin pool {} would get {} of data, less than one thinPoolConfig.chunkSize ({}): lower \
             chunkSize or add devices",
            tp.name,
            size(data_size),
            size(chunk)
        ));
    }
    Ok(Some(Action::CreateThinPool {
        vg: vg.name.clone(),
        name: tp.name.clone(),
        data_size,
        chunk_size,
        metadata_size,
        zero: true,
        raid: None,
    }))
}

/// `"1 GiB on its one LVM physical volume"`, `"1 GiB + 2 GiB on its 2 LVM physical volumes"`.
fn per_pv_free(pv_free: &[u64], extent: u64) -> String {
    let per_pv: Vec<String> = pv_free
        .iter()
        .map(|f| size(f.saturating_mul(extent)).to_string())
        .collect();
    match per_pv.as_slice() {
        [one] => format!("{one} on its one LVM physical volume"),
        many => format!(
            "{} on its {} LVM physical volumes",
            many.join(" + "),
            many.len()
        ),
    }
}

/// The most data, in bytes, a new thin pool over RAID `layout` can get on physical volumes with
/// `pv_free` free extents each, beside a raid1 metadata LV of `metadata` extents per image and a
/// pool metadata spare of `spare` extents (linear, on one device lvm2 picks). Every device is
/// assumed to hold a metadata image, its one-extent RAID metadata (`_rmeta`) and the spare: lvm2
/// decides where they go, and what is planned must be placeable wherever it puts them. The data's
/// own images are counted by [`Layout::max_size`] (one `_rmeta` extent each).
fn raid_pool_cap(layout: &Layout, extent: u64, pv_free: &[u64], metadata: u64, spare: u64) -> u64 {
    let reserve = metadata + 1 + spare;
    layout.max_size(&FreeSpace::new(
        extent,
        pv_free
            .iter()
            .map(|f| f.saturating_sub(reserve).saturating_mul(extent)),
    ))
}

#[cfg(test)]
mod tests;
