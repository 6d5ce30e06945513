//! From the names a CO gives to the LVM names and tags on disk, and back. Everything the driver knows
//! about a volume is on disk, so a restart finds every volume again:
//!
//! - the LV name is `csi-` (volumes) or `snap-` (snapshots) followed by 26 base32 characters of the
//!   sha256 of the CO's name (130 bits): deterministic, so a retried `CreateVolume` finds the LV a
//!   crashed attempt left, and a valid LVM name whatever the CO's name holds;
//! - the volume (or snapshot) id is the LV name: at most 31 bytes, unique on the node;
//! - tags record the rest: [`OWNER_TAG`] (ours), [`NAME_TAG_PREFIX`] + the hex of the CO's name,
//!   [`SOURCE_TAG_PREFIX`] + the content source, [`SNAPSHOT_TAG`], and [`CREATED_TAG_PREFIX`] + the
//!   creation time in seconds since the epoch.

use sha2::{Digest, Sha256};

/// Tag on every LV the driver creates (the same tag marks its volume groups).
pub const OWNER_TAG: &str = lvms_core::config::VG_OWNER_TAG;
/// Prefix of the tag carrying the CO's name, hex-encoded (tags allow only `[A-Za-z0-9_+.-/=!:&#]`).
pub const NAME_TAG_PREFIX: &str = "lvms.name=";
/// Prefix of the tag carrying the content source: `vol:<id>` or `snap:<id>`.
pub const SOURCE_TAG_PREFIX: &str = "lvms.src=";
/// Tag on a shared class's linear LV that has not been zeroed yet (`wipePolicy: Full`): the first
/// stage zeroes it, then removes the tag; a crash in between resumes from [`WIPED_TO_TAG_PREFIX`].
pub const UNWIPED_TAG: &str = "lvms.unwiped";
/// Prefix of the tag recording how many bytes from its start an [`UNWIPED_TAG`] LV has been zeroed
/// (and flushed): the next stage after a crash zeroes from there.
pub const WIPED_TO_TAG_PREFIX: &str = "lvms.wiped-to=";
/// Tag on snapshot LVs.
pub const SNAPSHOT_TAG: &str = "lvms.snapshot";
/// Prefix of the tag carrying the creation time (seconds since the Unix epoch).
pub const CREATED_TAG_PREFIX: &str = "lvms.created=";
/// Prefix of the tag carrying the size a restore or clone was asked for, in bytes: a retry after a crash
/// between the thin snapshot and its `lvextend` finishes the extend instead of refusing the smaller LV.
pub const REQUESTED_TAG_PREFIX: &str = "lvms.size=";
/// Tag on an inline ephemeral volume's LV (made by `NodePublishVolume`, removed by
/// `NodeUnpublishVolume` or the node's collector once its pod is gone; ADR 0021).
pub const EPHEMERAL_TAG: &str = "lvms.ephemeral";
/// Prefix of the tag carrying the uid of the pod an ephemeral volume was made for.
pub const POD_UID_TAG_PREFIX: &str = "lvms.pod-uid=";
/// Prefix of the tag carrying that pod's namespace.
pub const POD_NAMESPACE_TAG_PREFIX: &str = "lvms.pod-ns=";
/// Prefix of the tag carrying that pod's name.
pub const POD_NAME_TAG_PREFIX: &str = "lvms.pod-name=";
/// The longest value a pod tag keeps (a pod name is at most 253 bytes; LVM allows 1024 per tag).
const MAX_TAG_VALUE_BYTES: usize = 253;
/// Prefix of volume LV names.
pub const VOLUME_PREFIX: &str = "csi-";
/// Prefix of snapshot LV names.
pub const SNAPSHOT_PREFIX: &str = "snap-";
/// The longest name, id or parameter a CO may send (the CSI spec's limit for CO-provided strings).
pub const MAX_STRING_BYTES: usize = 128;

const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// 26 lowercase base32 characters of the sha256 of `name` (130 bits).
fn digest(name: &str) -> String {
    let hash = Sha256::digest(name.as_bytes());
    let mut out = String::with_capacity(26);
    let (mut acc, mut bits) = (0u32, 0u32);
    for byte in hash.iter() {
        acc = (acc << 8) | u32::from(*byte);
        bits += 8;
        while bits >= 5 && out.len() < 26 {
            bits -= 5;
            out.push(char::from(BASE32[((acc >> bits) & 31) as usize]));
        }
        acc &= (1 << bits) - 1;
        if out.len() == 26 {
            break;
        }
    }
    out
}

/// The LV name (and volume id) for the volume the CO calls `name`.
pub fn volume_lv_name(name: &str) -> String {
    format!("{VOLUME_PREFIX}{}", digest(name))
}

/// The LV name (and snapshot id) for the snapshot the CO calls `name`.
pub fn snapshot_lv_name(name: &str) -> String {
    format!("{SNAPSHOT_PREFIX}{}", digest(name))
}

/// Whether `id` has the shape of a volume id this driver hands out.
pub fn is_volume_id(id: &str) -> bool {
    id.strip_prefix(VOLUME_PREFIX).is_some_and(is_digest)
}

/// Whether `id` has the shape of a snapshot id this driver hands out.
pub fn is_snapshot_id(id: &str) -> bool {
    id.strip_prefix(SNAPSHOT_PREFIX).is_some_and(is_digest)
}

/// Whether `id` has the shape of the volume ids TopoLVM and LVMS hand out: the `LogicalVolume`'s
/// UID, a lowercase UUID, which is also the LV's name (topolvm
/// `internal/controller/logicalvolume_controller.go`, ADR 0032). Volumes and snapshots alike.
pub fn is_topolvm_id(id: &str) -> bool {
    let groups: Vec<&str> = id.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| {
            g.len() == n
                && g.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Whether `id` has the shape of the volume ids metal-stack csi-driver-lvm hands out: the name
/// external-provisioner gives `CreateVolume`, `pvc-` and the claim's UID, which is also the LV's
/// name in its volume group (csi-driver-lvm `pkg/server/controller.go`, ADR 0033).
pub fn is_csi_driver_lvm_id(id: &str) -> bool {
    id.strip_prefix("pvc-").is_some_and(is_topolvm_id)
}

/// Whether `id` is a volume id another driver hands out that lvms-rs serves once it is taken over
/// (tagged ours), never before: TopoLVM's and LVMS's ([`is_topolvm_id`]) or csi-driver-lvm's
/// ([`is_csi_driver_lvm_id`]).
pub fn is_taken_over_id(id: &str) -> bool {
    is_topolvm_id(id) || is_csi_driver_lvm_id(id)
}

fn is_digest(s: &str) -> bool {
    s.len() == 26 && s.bytes().all(|b| BASE32.contains(&b))
}

/// The tag recording the CO's `name`.
pub fn name_tag(name: &str) -> String {
    let mut tag = String::with_capacity(NAME_TAG_PREFIX.len() + 2 * name.len());
    tag.push_str(NAME_TAG_PREFIX);
    for b in name.as_bytes() {
        tag.push_str(&format!("{b:02x}"));
    }
    tag
}

/// The CO's name recorded in `tags`, if any.
pub fn name_from_tags(tags: &[String]) -> Option<String> {
    let hex = tags.iter().find_map(|t| t.strip_prefix(NAME_TAG_PREFIX))?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Where a volume's content came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Restored from the snapshot with this id.
    Snapshot(String),
    /// Cloned from the volume with this id.
    Volume(String),
}

impl Source {
    /// The tag recording this source.
    pub fn tag(&self) -> String {
        match self {
            Self::Snapshot(id) => format!("{SOURCE_TAG_PREFIX}snap:{id}"),
            Self::Volume(id) => format!("{SOURCE_TAG_PREFIX}vol:{id}"),
        }
    }

    /// The source recorded in `tags`, if any.
    pub fn from_tags(tags: &[String]) -> Option<Self> {
        let value = tags
            .iter()
            .find_map(|t| t.strip_prefix(SOURCE_TAG_PREFIX))?;
        if let Some(id) = value.strip_prefix("snap:") {
            Some(Self::Snapshot(id.to_owned()))
        } else {
            value
                .strip_prefix("vol:")
                .map(|id| Self::Volume(id.to_owned()))
        }
    }

    /// The id of the source volume or snapshot.
    pub fn id(&self) -> &str {
        match self {
            Self::Snapshot(id) | Self::Volume(id) => id,
        }
    }
}

/// The tag recording a creation time.
pub fn created_tag(unix_seconds: u64) -> String {
    format!("{CREATED_TAG_PREFIX}{unix_seconds}")
}

/// The tag recording the size a restore or clone was asked for.
pub fn requested_tag(bytes: u64) -> String {
    format!("{REQUESTED_TAG_PREFIX}{bytes}")
}

/// The requested size recorded in `tags`, if any.
pub fn requested_from_tags(tags: &[String]) -> Option<u64> {
    tags.iter()
        .find_map(|t| t.strip_prefix(REQUESTED_TAG_PREFIX))
        .and_then(|s| s.parse().ok())
}

/// The tag recording that the first `bytes` of a volume are zeroed.
pub fn wiped_to_tag(bytes: u64) -> String {
    format!("{WIPED_TO_TAG_PREFIX}{bytes}")
}

/// How far the zeroing recorded in `tags` got: the largest [`WIPED_TO_TAG_PREFIX`] value, since a
/// crash between adding a new record and removing the old one leaves both. Unreadable records
/// count for nothing.
pub fn wiped_to_from_tags(tags: &[String]) -> Option<u64> {
    tags.iter()
        .filter_map(|t| t.strip_prefix(WIPED_TO_TAG_PREFIX))
        .filter_map(|s| s.parse().ok())
        .max()
}

/// The creation time recorded in `tags`, if any.
pub fn created_from_tags(tags: &[String]) -> Option<u64> {
    tags.iter()
        .find_map(|t| t.strip_prefix(CREATED_TAG_PREFIX))
        .and_then(|s| s.parse().ok())
}

/// The pod an inline ephemeral volume was made for, as kubelet names it in the volume context
/// (`csi.storage.k8s.io/pod.uid`, `.namespace`, `.name`) and as its tags record it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EphemeralOwner {
    pub pod_uid: String,
    pub pod_namespace: String,
    pub pod_name: String,
}

/// `value` with every character an LVM tag cannot carry (`[A-Za-z0-9_+.-/=!:&#]` only) replaced by
/// `_`, cut to [`MAX_TAG_VALUE_BYTES`]. Kubernetes uids, namespaces and pod names never need it; a
/// CO outside Kubernetes might send anything.
pub fn sanitize_tag_value(value: &str) -> String {
    value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_+.-/=!:&#".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(MAX_TAG_VALUE_BYTES)
        .collect()
}

impl EphemeralOwner {
    /// The tags of an ephemeral volume made for this pod: [`EPHEMERAL_TAG`] and the pod's (sanitized)
    /// uid, namespace and name; empty values are left out.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = vec![EPHEMERAL_TAG.to_owned()];
        for (prefix, value) in [
            (POD_UID_TAG_PREFIX, &self.pod_uid),
            (POD_NAMESPACE_TAG_PREFIX, &self.pod_namespace),
            (POD_NAME_TAG_PREFIX, &self.pod_name),
        ] {
            if !value.is_empty() {
                tags.push(format!("{prefix}{}", sanitize_tag_value(value)));
            }
        }
        tags
    }

    /// The owner recorded in `tags` when they mark an ephemeral volume.
    pub fn from_tags(tags: &[String]) -> Option<Self> {
        if !tags.iter().any(|t| t == EPHEMERAL_TAG) {
            return None;
        }
        let get = |prefix: &str| {
            tags.iter()
                .find_map(|t| t.strip_prefix(prefix))
                .unwrap_or_default()
                .to_owned()
        };
        Some(Self {
            pod_uid: get(POD_UID_TAG_PREFIX),
            pod_namespace: get(POD_NAMESPACE_TAG_PREFIX),
            pod_name: get(POD_NAME_TAG_PREFIX),
        })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn taken_over_ids_are_lowercase_uuids_and_never_ours() {
        let uid = "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
        assert!(is_taken_over_id(uid));
        lvms_host::validate::lvm_name(uid).unwrap();
        for not in [
            "",
            "6F1C2A4E-1B7D-4C1E-9A55-0E1F2D3C4B5A",
            "6f1c2a4e1b7d4c1e9a550e1f2d3c4b5a",
            "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5",
            "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a-x",
            "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4g5a",
        ] {
            assert!(!is_taken_over_id(not), "{not}");
        }
        for ours in [volume_lv_name("pvc-1"), snapshot_lv_name("s")] {
            assert!(!is_taken_over_id(&ours));
        }
        assert!(!is_volume_id(uid) && !is_snapshot_id(uid));
    }

    #[test]
    fn csi_driver_lvm_ids_are_pvc_and_a_uuid_and_never_topolvm_or_ours() {
        let id = "pvc-6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
        assert!(is_csi_driver_lvm_id(id) && is_taken_over_id(id));
        assert!(!is_topolvm_id(id));
        lvms_host::validate::lvm_name(id).unwrap();
        for not in [
            "pvc-",
            "pvc-11111111",
            "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a",
            "snapshot-6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a",
            "PVC-6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a",
        ] {
            assert!(!is_csi_driver_lvm_id(not), "{not}");
        }
        assert!(!is_csi_driver_lvm_id(&volume_lv_name("pvc-1")));
    }

    #[test]
    fn ephemeral_owner_round_trips_through_valid_tags() {
        let owner = EphemeralOwner {
            pod_uid: "0b1c5b1e-8f0e-4a57-a3a5-7d0e6a3f7c11".into(),
            pod_namespace: "default".into(),
            pod_name: "web-0".into(),
        };
        let tags = owner.tags();
        assert_eq!(tags[0], EPHEMERAL_TAG);
        for t in &tags {
            lvms_host::validate::lvm_tag(t).unwrap();
        }
        assert_eq!(EphemeralOwner::from_tags(&tags), Some(owner));
        assert_eq!(EphemeralOwner::from_tags(&[OWNER_TAG.to_owned()]), None);
    }

    #[test]
    fn pod_tag_values_are_sanitized_to_what_lvm_allows() {
        let owner = EphemeralOwner {
            pod_uid: "a b;c".into(),
            pod_namespace: "é".into(),
            pod_name: "x".repeat(400),
        };
        let tags = owner.tags();
        for t in &tags {
            lvms_host::validate::lvm_tag(t).unwrap();
        }
        assert_eq!(tags[1], "lvms.pod-uid=a_b_c");
        assert_eq!(tags[2], "lvms.pod-ns=_");
        assert_eq!(
            tags[3].len(),
            POD_NAME_TAG_PREFIX.len() + MAX_TAG_VALUE_BYTES
        );
    }

    #[test]
    fn lv_names_are_deterministic_valid_lvm_names_that_fit_an_id() {
        let a = volume_lv_name("pvc-0b1c5b1e-8f0e-4a57-a3a5-7d0e6a3f7c11");
        assert_eq!(
            a,
            volume_lv_name("pvc-0b1c5b1e-8f0e-4a57-a3a5-7d0e6a3f7c11")
        );
        assert_ne!(a, volume_lv_name("pvc-other"));
        assert_eq!(a.len(), 30);
        assert!(is_volume_id(&a) && !is_snapshot_id(&a));
        lvms_core::names::validate_lvm_name(&a).unwrap();
        let s = snapshot_lv_name("snapshot-1");
        assert!(is_snapshot_id(&s) && !is_volume_id(&s));
        lvms_core::names::validate_lvm_name(&s).unwrap();
    }

    #[test]
    fn hostile_names_never_reach_the_lv_name() {
        for name in [
            "../../etc",
            "a b;rm -rf /",
            "--force",
            "vg/lv",
            "\u{0}",
            "é",
        ] {
            let lv = volume_lv_name(name);
            lvms_core::names::validate_lvm_name(&lv).unwrap();
            assert!(!lv.contains(name), "{lv}");
        }
    }

    #[test]
    fn ids_of_other_shapes_are_not_ours() {
        for id in [
            "",
            "csi-",
            "csi-ABCDEFGHIJKLMNOPQRSTUVWXYZ",
            "csi-abc",
            "vol-aaaaaaaaaaaaaaaaaaaaaaaaaa",
            "csi-aaaaaaaaaaaaaaaaaaaaaaaaa1",
        ] {
            assert!(!is_volume_id(id), "{id}");
        }
    }

    #[test]
    fn source_round_trips_through_its_tag() {
        for s in [
            Source::Snapshot("snap-x".into()),
            Source::Volume("csi-y".into()),
        ] {
            assert_eq!(Source::from_tags(&["lvms".into(), s.tag()]), Some(s));
        }
        assert_eq!(Source::from_tags(&["lvms".into()]), None);
    }

    #[test]
    fn the_furthest_readable_wiped_to_record_counts() {
        let tags = |t: &[&str]| t.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(wiped_to_from_tags(&tags(&["lvms", "lvms.unwiped"])), None);
        assert_eq!(
            wiped_to_from_tags(&[wiped_to_tag(1 << 30), "lvms".into()]),
            Some(1 << 30)
        );
        // A crash between adding the new record and removing the old one leaves both.
        assert_eq!(
            wiped_to_from_tags(&[wiped_to_tag(1 << 30), wiped_to_tag(2 << 30)]),
            Some(2 << 30)
        );
        assert_eq!(
            wiped_to_from_tags(&tags(&["lvms.wiped-to=x", "lvms.wiped-to=-1"])),
            None
        );
        lvms_host::validate::lvm_tag(&wiped_to_tag(u64::MAX)).unwrap();
    }

    proptest! {
        #[test]
        fn name_round_trips_through_its_tag(name in ".{0,128}") {
            let tag = name_tag(&name);
            prop_assert!(tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"_+.-/=!:&#".contains(&b)));
            prop_assert_eq!(name_from_tags(&[created_tag(1), tag]), Some(name));
        }
    }
}
