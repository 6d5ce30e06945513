//! Decoding of LVM's `lv_attr` (10 characters) and `vg_attr` (6 characters) report fields, as documented in
//! `man lvs` / `man vgs` and emitted by lvm2's `lv_attr_dup_with_info_and_seg_status`.
//!
//! Decoding is strict: an unknown character is an error rather than a silent guess, so a parser feeding the
//! wrong column (or a new lvm2 letter) shows up instead of being reported as healthy.

use serde::{Deserialize, Serialize};

/// Why an attribute string could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    #[error("{field} {attr:?} has {len} characters: LVM reports exactly {expected}")]
    WrongLength {
        field: &'static str,
        attr: String,
        len: usize,
        expected: usize,
    },
    #[error("{field} {attr:?}: unknown {meaning} character {ch:?} at position {position}")]
    UnknownChar {
        field: &'static str,
        attr: String,
        /// 1-based, as `man lvs` counts.
        position: usize,
        meaning: &'static str,
        ch: char,
    },
}

/// Character 1 of `lv_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VolumeType {
    /// `C`
    Cache,
    /// `m`
    Mirrored,
    /// `M`
    MirroredWithoutInitialSync,
    /// `o`
    Origin,
    /// `O`
    OriginWithMergingSnapshot,
    /// `r`
    Raid,
    /// `R`
    RaidWithoutInitialSync,
    /// `s`
    Snapshot,
    /// `S`
    MergingSnapshot,
    /// `p`
    PvMove,
    /// `v`
    Virtual,
    /// `i`
    MirrorOrRaidImage,
    /// `I`
    MirrorOrRaidImageOutOfSync,
    /// `l`
    MirrorLog,
    /// `c`
    UnderConversion,
    /// `V`
    ThinVolume,
    /// `t`
    ThinPool,
    /// `T`
    ThinPoolData,
    /// `d`
    VdoPool,
    /// `D`
    VdoPoolData,
    /// `e`: RAID or pool metadata, or the pool metadata spare.
    Metadata,
    /// `-`
    Plain,
}

/// Character 2 of `lv_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Permissions {
    /// `w`
    Writeable,
    /// `r`
    ReadOnly,
    /// `R`: a volume whose metadata is writeable, activated read-only.
    ReadOnlyActivation,
    /// `-`: neither (pvmove volumes).
    None,
}

/// Character 3 of `lv_attr`, character 5 of `vg_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AllocationPolicy {
    /// `a`
    Anywhere,
    /// `c`
    Contiguous,
    /// `i`
    Inherited,
    /// `l`
    Cling,
    /// `t`
    ClingByTags,
    /// `n`
    Normal,
}

impl AllocationPolicy {
    fn from_char(c: char) -> Option<Self> {
        Some(match c {
            'a' => Self::Anywhere,
            'c' => Self::Contiguous,
            'i' => Self::Inherited,
            'l' => Self::Cling,
            't' => Self::ClingByTags,
            'n' => Self::Normal,
            _ => return None,
        })
    }
}

/// Character 5 of `lv_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LvState {
    /// `a`
    Active,
    /// `h`: a historical (removed) volume kept in metadata.
    Historical,
    /// `s`
    Suspended,
    /// `I`
    InvalidSnapshot,
    /// `S`
    InvalidSuspendedSnapshot,
    /// `m`
    SnapshotMergeFailed,
    /// `M`
    SuspendedSnapshotMergeFailed,
    /// `d`
    MappedWithoutTables,
    /// `i`
    MappedWithInactiveTable,
    /// `c`
    CheckNeeded,
    /// `C`
    SuspendedCheckNeeded,
    /// `X`
    Unknown,
    /// `-`
    Inactive,
}

/// Character 7 of `lv_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TargetType {
    /// `C`
    Cache,
    /// `d`
    Vdo,
    /// `m`
    Mirror,
    /// `r`
    Raid,
    /// `s`
    Snapshot,
    /// `t`
    Thin,
    /// `u`
    Unknown,
    /// `v`
    Virtual,
    /// `-`
    Linear,
}

/// Character 9 of `lv_attr`, as LVM reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum HealthFlag {
    /// `-`
    None,
    /// `p`: one or more physical volumes of the volume are missing.
    Partial,
    /// `r`: a RAID device had a transient failure.
    RefreshNeeded,
    /// `m`: RAID scrubbing found mismatches.
    Mismatches,
    /// `w`: a RAID image marked write-mostly.
    WriteMostly,
    /// `s`: RAID reshaping.
    Reshaping,
    /// `R`: a sub-volume freed by reshaping, to be removed.
    RemoveAfterReshape,
    /// `X`
    Unknown,
    /// `F`: thin pool, thin volume or cache failed.
    Failed,
    /// `D`: thin pool out of data space.
    OutOfDataSpace,
    /// `M`: thin pool or cache metadata read-only.
    MetadataReadOnly,
    /// `E`: dm-writecache reported an error.
    WritecacheError,
}

/// A decoded `lv_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LvAttr {
    pub volume_type: VolumeType,
    pub permissions: Permissions,
    pub allocation: AllocationPolicy,
    /// The allocation character was upper case: allocation is locked (during pvmove).
    pub allocation_locked: bool,
    pub fixed_minor: bool,
    pub state: LvState,
    /// Whether the device is open; `None` when LVM reports `X` (unknown).
    pub open: Option<bool>,
    pub target_type: TargetType,
    /// Newly allocated data blocks are zeroed (thin pools and their volumes).
    pub zero: bool,
    pub health_flag: HealthFlag,
    /// The activation-skip flag (`k`): thin snapshots carry it.
    pub skip_activation: bool,
}

/// The health of a logical volume summarised for a CSI `VolumeCondition` or a status condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LvHealth {
    Ok,
    Partial,
    RefreshNeeded,
    Mismatches,
    Failed,
    OutOfDataSpace,
    MetadataReadOnly,
    /// The thin pool (or cache) carries the needs-check flag.
    CheckNeeded,
    Suspended,
    Unknown,
}

impl LvHealth {
    /// Anything but [`LvHealth::Ok`].
    pub fn is_abnormal(self) -> bool {
        self != Self::Ok
    }

    /// A one-line explanation with the usual fix.
    pub fn message(self) -> &'static str {
        match self {
            Self::Ok => "volume is healthy",
            Self::Partial => {
                "volume is partial: one of its LVM physical volumes is missing (a RAID volume, or a thin \
                 volume on a RAID pool, still serves from its other images); reattach the disk and run \
                 lvchange --refresh, or replace it: vgextend the group with a new disk, lvconvert \
                 --repair each RAID LV (of a thin pool: <pool>_tdata and <pool>_tmeta, never the pool \
                 itself), then vgreduce --removemissing"
            }
            Self::RefreshNeeded => {
                "a RAID device of the volume had a transient failure: run lvchange --refresh once the device \
                 is back, or replace it with lvconvert --repair"
            }
            Self::Mismatches => {
                "RAID scrubbing found mismatches between the volume's images: run lvchange --syncaction repair"
            }
            Self::Failed => {
                "volume has failed: its device-mapper target reported an error; check the kernel log (dmesg) \
                 and repair it with lvconvert --repair"
            }
            Self::OutOfDataSpace => {
                "thin pool is out of data space: writes to thin volumes block or fail; extend the pool \
                 (add a device to the device class) or free space by deleting volumes and snapshots"
            }
            Self::MetadataReadOnly => {
                "thin pool metadata is read-only (metadata space exhausted or damaged): extend it with \
                 lvextend --poolmetadatasize, or repair it with lvconvert --repair"
            }
            Self::CheckNeeded => {
                "thin pool needs a metadata check: deactivate the pool and run lvconvert --repair"
            }
            Self::Suspended => {
                "volume is suspended: I/O to it is blocked until it is resumed (dmsetup resume), usually after \
                 an interrupted LVM command"
            }
            Self::Unknown => {
                "volume's device-mapper state is unknown or inconsistent: check lvs and dmsetup info on the node"
            }
        }
    }
}

fn check_len(field: &'static str, attr: &str, expected: usize) -> Result<Vec<char>, AttrError> {
    let chars: Vec<char> = attr.chars().collect();
    if chars.len() != expected {
        return Err(AttrError::WrongLength {
            field,
            attr: attr.to_owned(),
            len: chars.len(),
            expected,
        });
    }
    Ok(chars)
}

fn unknown(
    field: &'static str,
    attr: &str,
    index: usize,
    meaning: &'static str,
    ch: char,
) -> AttrError {
    AttrError::UnknownChar {
        field,
        attr: attr.to_owned(),
        position: index + 1,
        meaning,
        ch,
    }
}

impl LvAttr {
    /// Decodes a 10-character `lv_attr`.
    pub fn parse(attr: &str) -> Result<Self, AttrError> {
        const F: &str = "lv_attr";
        let c = check_len(F, attr, 10)?;
        let bad = |i: usize, meaning: &'static str| unknown(F, attr, i, meaning, c[i]);

        let volume_type = match c[0] {
            'C' => VolumeType::Cache,
            'm' => VolumeType::Mirrored,
            'M' => VolumeType::MirroredWithoutInitialSync,
            'o' => VolumeType::Origin,
            'O' => VolumeType::OriginWithMergingSnapshot,
            'r' => VolumeType::Raid,
            'R' => VolumeType::RaidWithoutInitialSync,
            's' => VolumeType::Snapshot,
            'S' => VolumeType::MergingSnapshot,
            'p' => VolumeType::PvMove,
            'v' => VolumeType::Virtual,
            'i' => VolumeType::MirrorOrRaidImage,
            'I' => VolumeType::MirrorOrRaidImageOutOfSync,
            'l' => VolumeType::MirrorLog,
            'c' => VolumeType::UnderConversion,
            'V' => VolumeType::ThinVolume,
            't' => VolumeType::ThinPool,
            'T' => VolumeType::ThinPoolData,
            'd' => VolumeType::VdoPool,
            'D' => VolumeType::VdoPoolData,
            'e' => VolumeType::Metadata,
            '-' => VolumeType::Plain,
            _ => return Err(bad(0, "volume type")),
        };
        let permissions = match c[1] {
            'w' => Permissions::Writeable,
            'r' => Permissions::ReadOnly,
            'R' => Permissions::ReadOnlyActivation,
            '-' => Permissions::None,
            _ => return Err(bad(1, "permissions")),
        };
        let allocation = AllocationPolicy::from_char(c[2].to_ascii_lowercase())
            .ok_or_else(|| bad(2, "allocation policy"))?;
        let allocation_locked = c[2].is_ascii_uppercase();
        let fixed_minor = match c[3] {
            'm' => true,
            '-' => false,
            _ => return Err(bad(3, "fixed minor")),
        };
        let state = match c[4] {
            'a' => LvState::Active,
            'h' => LvState::Historical,
            's' => LvState::Suspended,
            'I' => LvState::InvalidSnapshot,
            'S' => LvState::InvalidSuspendedSnapshot,
            'm' => LvState::SnapshotMergeFailed,
            'M' => LvState::SuspendedSnapshotMergeFailed,
            'd' => LvState::MappedWithoutTables,
            'i' => LvState::MappedWithInactiveTable,
            'c' => LvState::CheckNeeded,
            'C' => LvState::SuspendedCheckNeeded,
            'X' => LvState::Unknown,
            '-' => LvState::Inactive,
            _ => return Err(bad(4, "state")),
        };
        let open = match c[5] {
            'o' => Some(true),
            '-' => Some(false),
            'X' => None,
            _ => return Err(bad(5, "device open")),
        };
        let target_type = match c[6] {
            'C' => TargetType::Cache,
            'd' => TargetType::Vdo,
            'm' => TargetType::Mirror,
            'r' => TargetType::Raid,
            's' => TargetType::Snapshot,
            't' => TargetType::Thin,
            'u' => TargetType::Unknown,
            'v' => TargetType::Virtual,
            '-' => TargetType::Linear,
            _ => return Err(bad(6, "target type")),
        };
        let zero = match c[7] {
            'z' => true,
            '-' => false,
            _ => return Err(bad(7, "zero")),
        };
        let health_flag = match c[8] {
            '-' => HealthFlag::None,
            'p' => HealthFlag::Partial,
            'r' => HealthFlag::RefreshNeeded,
            'm' => HealthFlag::Mismatches,
            'w' => HealthFlag::WriteMostly,
            's' => HealthFlag::Reshaping,
            'R' => HealthFlag::RemoveAfterReshape,
            'X' => HealthFlag::Unknown,
            'F' => HealthFlag::Failed,
            'D' => HealthFlag::OutOfDataSpace,
            'M' => HealthFlag::MetadataReadOnly,
            'E' => HealthFlag::WritecacheError,
            _ => return Err(bad(8, "health")),
        };
        let skip_activation = match c[9] {
            'k' => true,
            '-' => false,
            _ => return Err(bad(9, "skip activation")),
        };
        Ok(Self {
            volume_type,
            permissions,
            allocation,
            allocation_locked,
            fixed_minor,
            state,
            open,
            target_type,
            zero,
            health_flag,
            skip_activation,
        })
    }

    /// Summarises the health flag and the state. A failure reported by the health flag wins over the
    /// state; an unknown health flag is reported only when the state says nothing worse.
    pub fn health(&self) -> LvHealth {
        let from_flag = match self.health_flag {
            HealthFlag::Failed | HealthFlag::WritecacheError => Some(LvHealth::Failed),
            HealthFlag::OutOfDataSpace => Some(LvHealth::OutOfDataSpace),
            HealthFlag::MetadataReadOnly => Some(LvHealth::MetadataReadOnly),
            HealthFlag::Partial => Some(LvHealth::Partial),
            HealthFlag::RefreshNeeded => Some(LvHealth::RefreshNeeded),
            HealthFlag::Mismatches => Some(LvHealth::Mismatches),
            HealthFlag::Unknown
            | HealthFlag::None
            | HealthFlag::WriteMostly
            | HealthFlag::Reshaping
            | HealthFlag::RemoveAfterReshape => None,
        };
        if let Some(h) = from_flag {
            return h;
        }
        let from_state = match self.state {
            LvState::InvalidSnapshot
            | LvState::InvalidSuspendedSnapshot
            | LvState::SnapshotMergeFailed
            | LvState::SuspendedSnapshotMergeFailed => Some(LvHealth::Failed),
            LvState::Suspended => Some(LvHealth::Suspended),
            LvState::SuspendedCheckNeeded => Some(LvHealth::Suspended),
            LvState::CheckNeeded => Some(LvHealth::CheckNeeded),
            LvState::Unknown | LvState::MappedWithoutTables | LvState::MappedWithInactiveTable => {
                Some(LvHealth::Unknown)
            }
            LvState::Active | LvState::Historical | LvState::Inactive => None,
        };
        match (from_state, self.health_flag) {
            (Some(h), _) => h,
            (None, HealthFlag::Unknown) => LvHealth::Unknown,
            (None, _) => LvHealth::Ok,
        }
    }

    pub fn is_thin_pool(&self) -> bool {
        self.volume_type == VolumeType::ThinPool
    }

    /// A thin volume, including one that is the origin of a snapshot or is merging.
    pub fn is_thin_volume(&self) -> bool {
        match self.volume_type {
            VolumeType::ThinVolume => true,
            VolumeType::Origin
            | VolumeType::OriginWithMergingSnapshot
            | VolumeType::MergingSnapshot => self.target_type == TargetType::Thin,
            _ => false,
        }
    }

    /// The device is mapped with a live table (active, possibly suspended or flagged).
    pub fn is_active(&self) -> bool {
        matches!(
            self.state,
            LvState::Active
                | LvState::Suspended
                | LvState::InvalidSnapshot
                | LvState::InvalidSuspendedSnapshot
                | LvState::SnapshotMergeFailed
                | LvState::SuspendedSnapshotMergeFailed
                | LvState::CheckNeeded
                | LvState::SuspendedCheckNeeded
        )
    }

    pub fn is_open(&self) -> bool {
        self.open == Some(true)
    }

    pub fn skip_activation(&self) -> bool {
        self.skip_activation
    }
}

/// Character 6 of `vg_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum VgSharing {
    /// `-`
    Local,
    /// `c`: clvmd (lvm2 < 2.03).
    Clustered,
    /// `s`: lvmlockd.
    Shared,
}

/// A decoded `vg_attr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VgAttr {
    pub writeable: bool,
    pub resizeable: bool,
    pub exported: bool,
    /// One or more physical volumes of the group are missing.
    pub partial: bool,
    pub allocation: AllocationPolicy,
    pub sharing: VgSharing,
}

impl VgAttr {
    /// Decodes a 6-character `vg_attr`.
    pub fn parse(attr: &str) -> Result<Self, AttrError> {
        const F: &str = "vg_attr";
        let c = check_len(F, attr, 6)?;
        let bad = |i: usize, meaning: &'static str| unknown(F, attr, i, meaning, c[i]);
        let flag = |i: usize, set: char, meaning: &'static str| match c[i] {
            '-' => Ok(false),
            x if x == set => Ok(true),
            _ => Err(bad(i, meaning)),
        };
        let writeable = match c[0] {
            'w' => true,
            'r' => false,
            _ => return Err(bad(0, "permissions")),
        };
        let resizeable = flag(1, 'z', "resizeable")?;
        let exported = flag(2, 'x', "exported")?;
        let partial = flag(3, 'p', "partial")?;
        let allocation =
            AllocationPolicy::from_char(c[4]).ok_or_else(|| bad(4, "allocation policy"))?;
        let sharing = match c[5] {
            '-' => VgSharing::Local,
            'c' => VgSharing::Clustered,
            's' => VgSharing::Shared,
            _ => return Err(bad(5, "clustered/shared")),
        };
        Ok(Self {
            writeable,
            resizeable,
            exported,
            partial,
            allocation,
            sharing,
        })
    }

    pub fn is_partial(&self) -> bool {
        self.partial
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn lv(attr: &str) -> LvAttr {
        LvAttr::parse(attr).unwrap()
    }

    #[test]
    fn active_thin_pool_with_zeroing_decodes_every_field() {
        let a = lv("twi-aotz--");
        assert_eq!(a.volume_type, VolumeType::ThinPool);
        assert_eq!(a.permissions, Permissions::Writeable);
        assert_eq!(a.allocation, AllocationPolicy::Inherited);
        assert!(!a.allocation_locked);
        assert!(!a.fixed_minor);
        assert_eq!(a.state, LvState::Active);
        assert_eq!(a.open, Some(true));
        assert_eq!(a.target_type, TargetType::Thin);
        assert!(a.zero);
        assert_eq!(a.health_flag, HealthFlag::None);
        assert!(!a.skip_activation());
        assert!(a.is_thin_pool() && !a.is_thin_volume());
        assert!(a.is_active() && a.is_open());
        assert_eq!(a.health(), LvHealth::Ok);
        assert!(!a.health().is_abnormal());
    }

    #[test]
    fn thin_snapshot_with_activation_skip_is_inactive_thin_volume() {
        let a = lv("Vri---tz-k");
        assert!(a.is_thin_volume());
        assert!(!a.is_thin_pool());
        assert_eq!(a.permissions, Permissions::ReadOnly);
        assert!(a.skip_activation());
        assert!(!a.is_active());
        assert!(!a.is_open());
        assert_eq!(a.health(), LvHealth::Ok);
    }

    #[test]
    fn thin_volume_that_is_a_snapshot_origin_is_still_a_thin_volume() {
        assert!(lv("owi-a-tz--").is_thin_volume());
        assert!(lv("Owi-a-tz--").is_thin_volume());
        assert!(!lv("owi-a-s---").is_thin_volume(), "thick origin");
    }

    #[test]
    fn thin_pool_out_of_data_space_is_unhealthy() {
        let h = lv("twi-aotzD-").health();
        assert_eq!(h, LvHealth::OutOfDataSpace);
        assert!(h.is_abnormal());
        assert!(h.message().contains("out of data space"));
        assert!(h.message().contains("extend the pool"));
    }

    #[test]
    fn thin_pool_with_read_only_metadata_is_unhealthy() {
        let h = lv("twi-aotzM-").health();
        assert_eq!(h, LvHealth::MetadataReadOnly);
        assert!(h.message().contains("--poolmetadatasize"));
    }

    #[test]
    fn failed_thin_volume_and_writecache_error_are_failed() {
        assert_eq!(lv("Vwi-aotzF-").health(), LvHealth::Failed);
        assert_eq!(lv("Cwi-aoC-E-").health(), LvHealth::Failed);
    }

    #[test]
    fn raid_health_flags_map_to_their_conditions() {
        assert_eq!(lv("rwi-a-r-p-").health(), LvHealth::Partial);
        assert_eq!(lv("rwi-a-r-r-").health(), LvHealth::RefreshNeeded);
        assert_eq!(lv("rwi-a-r-m-").health(), LvHealth::Mismatches);
        assert_eq!(
            lv("iwi-aor-w-").health(),
            LvHealth::Ok,
            "write-mostly is a setting"
        );
        assert_eq!(
            lv("rwi-a-r-s-").health(),
            LvHealth::Ok,
            "reshaping is progress"
        );
        assert_eq!(
            lv("Rwi-a-r---").volume_type,
            VolumeType::RaidWithoutInitialSync
        );
        assert_eq!(
            lv("Iwi-aor---").volume_type,
            VolumeType::MirrorOrRaidImageOutOfSync
        );
    }

    #[test]
    fn suspended_states_are_reported_as_suspended() {
        for attr in ["-wi-so----", "twi-CotzF-", "twi-Cotz--"] {
            let h = lv(attr).health();
            if attr.contains('F') {
                assert_eq!(h, LvHealth::Failed, "{attr}: the health flag wins");
            } else {
                assert_eq!(h, LvHealth::Suspended, "{attr}");
            }
        }
        assert!(lv("-wi-so----").is_active());
    }

    #[test]
    fn thin_pool_check_needed_is_abnormal() {
        let h = lv("twi-cotz--").health();
        assert_eq!(h, LvHealth::CheckNeeded);
        assert!(h.is_abnormal());
    }

    #[test]
    fn invalid_or_failed_merge_snapshots_are_failed() {
        assert_eq!(lv("swi-I-s---").health(), LvHealth::Failed);
        assert_eq!(lv("swi-S-s---").health(), LvHealth::Failed);
        assert_eq!(lv("Swi-m-s---").health(), LvHealth::Failed);
        assert_eq!(lv("Swi-M-s---").health(), LvHealth::Failed);
    }

    #[test]
    fn unknown_state_or_health_is_unknown() {
        assert_eq!(lv("-wi-XX--X-").health(), LvHealth::Unknown);
        assert_eq!(lv("-wi-d-----").health(), LvHealth::Unknown);
        assert_eq!(lv("-wi-i-----").health(), LvHealth::Unknown);
        assert_eq!(lv("-wi-XX----").open, None);
        assert_eq!(lv("twi-a-tzX-").health(), LvHealth::Unknown);
    }

    #[test]
    fn plain_inactive_volume_is_ok_and_not_active() {
        let a = lv("-wi-------");
        assert_eq!(a.volume_type, VolumeType::Plain);
        assert_eq!(a.target_type, TargetType::Linear);
        assert!(!a.is_active());
        assert_eq!(a.health(), LvHealth::Ok);
    }

    #[test]
    fn locked_allocation_fixed_minor_and_read_only_activation_decode() {
        let a = lv("-RCmao----");
        assert_eq!(a.permissions, Permissions::ReadOnlyActivation);
        assert_eq!(a.allocation, AllocationPolicy::Contiguous);
        assert!(a.allocation_locked);
        assert!(a.fixed_minor);
        assert_eq!(a.state, LvState::Active);
        assert_eq!(lv("p-C-aom---").permissions, Permissions::None);
    }

    #[test]
    fn every_volume_type_letter_decodes() {
        for (c, t) in [
            ('C', VolumeType::Cache),
            ('m', VolumeType::Mirrored),
            ('M', VolumeType::MirroredWithoutInitialSync),
            ('p', VolumeType::PvMove),
            ('v', VolumeType::Virtual),
            ('l', VolumeType::MirrorLog),
            ('c', VolumeType::UnderConversion),
            ('T', VolumeType::ThinPoolData),
            ('d', VolumeType::VdoPool),
            ('D', VolumeType::VdoPoolData),
            ('e', VolumeType::Metadata),
            ('s', VolumeType::Snapshot),
            ('S', VolumeType::MergingSnapshot),
        ] {
            assert_eq!(lv(&format!("{c}wi-a-----")).volume_type, t, "{c}");
        }
    }

    #[test]
    fn wrong_length_is_an_error_naming_the_field() {
        let e = LvAttr::parse("twi-aotz-").unwrap_err();
        assert!(matches!(
            e,
            AttrError::WrongLength {
                len: 9,
                expected: 10,
                ..
            }
        ));
        assert!(e.to_string().contains("lv_attr"));
        assert!(LvAttr::parse("").is_err());
        assert!(LvAttr::parse("twi-aotz--x").is_err());
    }

    #[test]
    fn unknown_letter_is_an_error_with_its_position() {
        let e = LvAttr::parse("twi-aotzQ-").unwrap_err();
        assert_eq!(
            e,
            AttrError::UnknownChar {
                field: "lv_attr",
                attr: "twi-aotzQ-".into(),
                position: 9,
                meaning: "health",
                ch: 'Q',
            }
        );
        assert!(LvAttr::parse("Zwi-a-----").is_err());
        assert!(LvAttr::parse("-wi-a----K").is_err());
    }

    #[test]
    fn every_health_message_names_a_fix_or_state() {
        for h in [
            LvHealth::Partial,
            LvHealth::RefreshNeeded,
            LvHealth::Mismatches,
            LvHealth::Failed,
            LvHealth::OutOfDataSpace,
            LvHealth::MetadataReadOnly,
            LvHealth::CheckNeeded,
            LvHealth::Suspended,
            LvHealth::Unknown,
        ] {
            assert!(h.is_abnormal());
            assert!(
                h.message().contains(':'),
                "{h:?} message lacks an explanation"
            );
        }
    }

    #[test]
    fn vg_attr_decodes_a_normal_local_group() {
        let v = VgAttr::parse("wz--n-").unwrap();
        assert!(v.writeable && v.resizeable && !v.exported && !v.is_partial());
        assert_eq!(v.allocation, AllocationPolicy::Normal);
        assert_eq!(v.sharing, VgSharing::Local);
    }

    #[test]
    fn vg_attr_partial_exported_shared_read_only() {
        let v = VgAttr::parse("r-xpcs").unwrap();
        assert!(!v.writeable && !v.resizeable && v.exported && v.is_partial());
        assert_eq!(v.allocation, AllocationPolicy::Contiguous);
        assert_eq!(v.sharing, VgSharing::Shared);
        assert_eq!(
            VgAttr::parse("wz--nc").unwrap().sharing,
            VgSharing::Clustered
        );
    }

    #[test]
    fn vg_attr_rejects_lv_attr_and_garbage() {
        assert!(matches!(
            VgAttr::parse("twi-aotz--"),
            Err(AttrError::WrongLength {
                field: "vg_attr",
                ..
            })
        ));
        assert!(matches!(
            VgAttr::parse("wz-qn-"),
            Err(AttrError::UnknownChar { position: 4, .. })
        ));
    }

    proptest! {
        #[test]
        fn parse_never_panics(s in "\\PC{0,12}") {
            let _ = LvAttr::parse(&s);
            let _ = VgAttr::parse(&s);
        }

        #[test]
        fn any_valid_lv_attr_parses_and_health_is_consistent(
            t in "[CmMoOrRsSpviIlcVtTdDe-]",
            p in "[wrR-]",
            a in "[acilntACILNT]",
            m in "[m-]",
            st in "[ahsISmMdicCX-]",
            o in "[oX-]",
            tt in "[Cdmrstuv-]",
            z in "[z-]",
            h in "[-prmwsRXFDME]",
            k in "[k-]",
        ) {
            let attr = format!("{t}{p}{a}{m}{st}{o}{tt}{z}{h}{k}");
            let parsed = LvAttr::parse(&attr).unwrap();
            let health = parsed.health();
            prop_assert_eq!(health.is_abnormal(), health != LvHealth::Ok);
            if matches!(h.as_str(), "F" | "E") {
                prop_assert_eq!(health, LvHealth::Failed);
            }
            if h == "-" && st == "a" {
                prop_assert_eq!(health, LvHealth::Ok);
            }
        }
    }
}
