//! The garbage collector's pure part: which volumes are orphans, for how long they have been, and which
//! of them may go.
//!
//! - On a node: an LV of ours (a `csi-…` volume or `snap-…` snapshot) that no `LogicalVolume` names (a
//!   controller that crashed after the agent made it, an object deleted by force). Volumes of shared
//!   classes ([`by_kind`]) are judged against every node's `LogicalVolume`s (any joined node may have
//!   made them), and are only ever reported, never removed ([`removable`]): every joined node sees
//!   them, so every joined node reports the same orphan, and a removal on one node's word could take
//!   a volume another node has staged from under it (LVM's lock would refuse, but report-only does not
//!   depend on that).
//! - In the cluster: a `LogicalVolume` of a volume (not a snapshot: those belong to
//!   `VolumeSnapshotContent`s) that no `PersistentVolume` refers to (a provisioner that gave up, a PV
//!   deleted by hand with the Retain policy).
//!
//! - Inline ephemeral volumes (ADR 0021; `lvms.ephemeral` LVs, which no `LogicalVolume` names) are
//!   judged apart ([`ephemeral_candidates`]): one is never removed while its LV is open (mounted), nor
//!   while its pod (by namespace and name, compared by uid) exists; once neither holds it is removed
//!   after a grace period ([`EPHEMERAL_GRACE`], or the safety window when one is configured). This is
//!   what cleans up after a node restart between publish and unpublish that kubelet never finished.
//!
//! An orphan is reported every sweep with how long it has been one. It is deleted only when a safety
//! window is configured (`None`: report only, the default) and it has been an orphan for that long in this
//! process's memory, and never while a PersistentVolume refers to it. A volume that stops being an orphan
//! starts over.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

/// One orphan found by a sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub id: String,
    /// How long it has been an orphan (as seen by this process).
    pub age: Duration,
}

/// What a sweep found and what may go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sweep {
    /// Every orphan, sorted by id.
    pub orphans: Vec<Orphan>,
    /// The orphans to delete now.
    pub delete: Vec<String>,
    /// Inline ephemeral volumes whose pod is gone and which nothing has open (with how long).
    pub ephemeral_orphans: Vec<Orphan>,
    /// The inline ephemeral volumes to delete now (their grace period has passed).
    pub ephemeral_delete: Vec<String>,
}

/// How long an inline ephemeral volume whose pod is gone and which is not mounted is kept before the
/// collector removes it, unless `--gc-delete-after` sets a window (which then applies).
pub const EPHEMERAL_GRACE: Duration = Duration::from_secs(300);

/// An inline ephemeral volume's LV as the collector judges it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EphemeralLv {
    pub id: String,
    /// Its device is open (mounted): never removed.
    pub open: bool,
    /// The uid of the pod it was made for (empty when unknown: never removed).
    pub pod_uid: String,
}

/// The inline ephemeral volumes that may be removed once the grace period has passed: not open, made
/// for a known pod, and that pod gone (`alive`: the uids of the pods that exist now).
pub fn ephemeral_candidates(lvs: &[EphemeralLv], alive: &BTreeSet<String>) -> BTreeSet<String> {
    lvs.iter()
        .filter(|lv| !lv.open && !lv.pod_uid.is_empty() && !alive.contains(&lv.pod_uid))
        .map(|lv| lv.id.clone())
        .collect()
}

/// Remembers since when each orphan has been one.
#[derive(Debug, Default)]
pub struct Tracker {
    first_seen: BTreeMap<String, Duration>,
}

impl Tracker {
    /// One sweep at `now` (any monotonic clock): `candidates` are the volumes that look orphaned now,
    /// `referenced` the ids a PersistentVolume refers to (never deleted), `window` the safety window.
    pub fn sweep(
        &mut self,
        now: Duration,
        candidates: &BTreeSet<String>,
        referenced: &BTreeSet<String>,
        window: Option<Duration>,
    ) -> Sweep {
        self.first_seen.retain(|id, _| candidates.contains(id));
        let mut sweep = Sweep::default();
        for id in candidates {
            let since = *self.first_seen.entry(id.clone()).or_insert(now);
            let age = now.saturating_sub(since);
            sweep.orphans.push(Orphan {
                id: id.clone(),
                age,
            });
            if window.is_some_and(|w| age >= w) && !referenced.contains(id) {
                sweep.delete.push(id.clone());
            }
        }
        sweep
    }
}

/// The ids of `volumes`: (those of this node's own disks' classes, those of the shared classes
/// among `classes`) (see the module documentation).
pub fn by_kind(
    volumes: Vec<crate::backend::Volume>,
    classes: &[crate::backend::DeviceClassConfig],
) -> (Vec<String>, Vec<String>) {
    let shared: BTreeSet<&str> = classes
        .iter()
        .filter(|c| c.shared().is_some())
        .map(|c| c.name.as_str())
        .collect();
    let (shared, local): (Vec<_>, Vec<_>) = volumes
        .into_iter()
        .partition(|v| shared.contains(v.class.as_str()));
    (
        local.into_iter().map(|v| v.id).collect(),
        shared.into_iter().map(|v| v.id).collect(),
    )
}

/// The due orphans a node may remove: none of a shared class's.
pub fn removable(due: Vec<String>, shared: &BTreeSet<String>) -> Vec<String> {
    due.into_iter().filter(|id| !shared.contains(id)).collect()
}

/// LVs of ours on a node that no `LogicalVolume` names: `on_disk` are the node's volume and snapshot ids,
/// `named` the names of the node's `LogicalVolume` objects and the ids in their `status.volumeID`.
pub fn orphaned_lvs(on_disk: &[String], named: &BTreeSet<String>) -> BTreeSet<String> {
    on_disk
        .iter()
        .filter(|id| !named.contains(*id))
        .cloned()
        .collect()
}

/// Volume `LogicalVolume`s no PersistentVolume refers to: `objects` are (volume id, is a snapshot, being
/// deleted), `referenced` the PVs' volume handles.
pub fn unclaimed_objects(
    objects: &[(String, bool, bool)],
    referenced: &BTreeSet<String>,
) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|(id, snapshot, deleting)| !snapshot && !deleting && !referenced.contains(id))
        .map(|(id, _, _)| id.clone())
        .collect()
}

/// How often the collectors sweep unless told otherwise (`--gc-period`).
pub const PERIOD: Duration = Duration::from_secs(300);

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| (*s).to_owned()).collect()
    }

    const MIN: Duration = Duration::from_secs(60);

    #[test]
    fn orphans_are_reported_with_their_age_and_deleted_only_after_the_window() {
        let mut t = Tracker::default();
        let none = set(&[]);
        let s = t.sweep(Duration::ZERO, &set(&["a", "b"]), &none, Some(10 * MIN));
        assert_eq!(s.orphans.len(), 2);
        assert!(s.orphans.iter().all(|o| o.age == Duration::ZERO));
        assert!(s.delete.is_empty());

        // b is claimed again meanwhile: it starts over when it is an orphan once more.
        let s = t.sweep(5 * MIN, &set(&["a"]), &none, Some(10 * MIN));
        assert_eq!(
            s.orphans,
            [Orphan {
                id: "a".into(),
                age: 5 * MIN
            }]
        );
        let s = t.sweep(10 * MIN, &set(&["a", "b"]), &none, Some(10 * MIN));
        assert_eq!(s.delete, ["a"]);
        assert_eq!(
            s.orphans[1].age,
            Duration::ZERO,
            "b was seen again at 10 min"
        );
    }

    #[test]
    fn without_a_window_nothing_is_deleted_and_a_referenced_volume_never_is() {
        let mut t = Tracker::default();
        t.sweep(Duration::ZERO, &set(&["a", "b"]), &set(&[]), None);
        let s = t.sweep(1000 * MIN, &set(&["a", "b"]), &set(&[]), None);
        assert_eq!(s.orphans.len(), 2);
        assert!(s.delete.is_empty(), "report only");
        let s = t.sweep(1000 * MIN, &set(&["a", "b"]), &set(&["b"]), Some(MIN));
        assert_eq!(s.delete, ["a"], "a PV refers to b");
    }

    #[test]
    fn an_ephemeral_volume_goes_only_unmounted_with_its_pod_gone_past_the_grace() {
        let lv = |id: &str, open: bool, uid: &str| EphemeralLv {
            id: id.into(),
            open,
            pod_uid: uid.into(),
        };
        let lvs = [
            lv("csi-mounted", true, "gone-1"),
            lv("csi-alive", false, "alive"),
            lv("csi-gone", false, "gone-2"),
            lv("csi-unknown-pod", false, ""),
        ];
        let alive = set(&["alive"]);
        let candidates = ephemeral_candidates(&lvs, &alive);
        assert_eq!(
            candidates,
            set(&["csi-gone"]),
            "mounted: kept; pod alive: kept; no pod recorded: kept"
        );
        let mut t = Tracker::default();
        let none = set(&[]);
        let s = t.sweep(Duration::ZERO, &candidates, &none, Some(EPHEMERAL_GRACE));
        assert!(s.delete.is_empty(), "pod gone, within the grace: kept");
        let s = t.sweep(4 * MIN, &candidates, &none, Some(EPHEMERAL_GRACE));
        assert!(s.delete.is_empty(), "pod gone, within the grace: kept");
        let s = t.sweep(5 * MIN, &candidates, &none, Some(EPHEMERAL_GRACE));
        assert_eq!(s.delete, ["csi-gone"], "pod gone past the grace: removed");
        // Mounted again meanwhile (a pod with the same volume came back): the clock starts over.
        let mut t = Tracker::default();
        t.sweep(Duration::ZERO, &candidates, &none, Some(EPHEMERAL_GRACE));
        t.sweep(MIN, &set(&[]), &none, Some(EPHEMERAL_GRACE));
        let s = t.sweep(6 * MIN, &candidates, &none, Some(EPHEMERAL_GRACE));
        assert!(s.delete.is_empty());
    }

    #[test]
    fn what_counts_as_an_orphan() {
        let on_disk = ["csi-a".to_owned(), "csi-b".to_owned(), "snap-c".to_owned()];
        assert_eq!(
            orphaned_lvs(&on_disk, &set(&["csi-a", "snap-c"])),
            set(&["csi-b"])
        );
        let objects = [
            ("csi-a".to_owned(), false, false),
            ("csi-b".to_owned(), false, false),
            ("snap-c".to_owned(), true, false),
            ("csi-d".to_owned(), false, true),
        ];
        assert_eq!(
            unclaimed_objects(&objects, &set(&["csi-a"])),
            set(&["csi-b"]),
            "snapshots and objects being deleted are not orphans"
        );
    }

    #[test]
    fn volumes_of_shared_classes_are_told_apart_and_never_removed() {
        use crate::backend::{DeviceClassConfig, Volume};
        let class = |name: &str, shared: bool| {
            let class = DeviceClassConfig::named(name);
            if shared {
                class.with_shared(lvms_core::config::SharedConfig::default())
            } else {
                class
            }
        };
        let volume = |id: &str, class: &str| Volume {
            id: id.into(),
            class: class.into(),
            size: 1 << 30,
            name: None,
            source: None,
            snapshot: false,
            thin: false,
            created: None,
            requested: None,
            health: lvms_core::lvattr::LvHealth::Ok,
            device: String::new(),
            ephemeral: None,
            open: false,
        };
        assert_eq!(
            by_kind(
                vec![volume("csi-a", "local"), volume("csi-b", "san")],
                &[class("local", false), class("san", true)]
            ),
            (vec!["csi-a".to_owned()], vec!["csi-b".to_owned()])
        );
        assert_eq!(
            removable(vec!["csi-a".into(), "csi-b".into()], &set(&["csi-b"])),
            ["csi-a"]
        );
    }
}
