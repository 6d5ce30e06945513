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
    volumes: Vec<lvms_engine::backend::Volume>,
    classes: &[lvms_engine::backend::ClassInfo],
) -> (Vec<String>, Vec<String>) {
    let shared: BTreeSet<&str> = classes
        .iter()
        .filter(|c| c.shared.is_some())
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

/// The volume handles of `driver`'s PersistentVolumes.
pub async fn pv_handles(client: &kube::Client, driver: &str) -> Result<BTreeSet<String>, String> {
    use k8s_openapi::api::core::v1::PersistentVolume;
    let pvs = kube::Api::<PersistentVolume>::all(client.clone())
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| format!("list PersistentVolumes: {e}"))?;
    Ok(pvs
        .items
        .into_iter()
        .filter_map(|pv| pv.spec?.csi)
        .filter(|csi| csi.driver == driver)
        .map(|csi| csi.volume_handle)
        .collect())
}

/// Publishes a Warning event about `reference` (logged when the API refuses it).
pub async fn warn_event(
    recorder: &kube::runtime::events::Recorder,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    reason: &str,
    note: String,
) {
    use kube::runtime::events::{Event, EventType};
    let ev = Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(note),
        action: "GarbageCollect".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, reference).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}

/// The node agent's collector: LVs of ours on this node that no `LogicalVolume` names.
pub struct NodeCollector<B> {
    client: kube::Client,
    node: String,
    driver: String,
    backend: tokio::sync::watch::Receiver<Option<std::sync::Arc<B>>>,
    window: Option<Duration>,
    tracker: Tracker,
    ephemeral: Tracker,
    started: tokio::time::Instant,
    recorder: kube::runtime::events::Recorder,
    metrics: std::sync::Arc<crate::metrics::GcMetrics>,
}

impl<B: lvms_engine::backend::Backend> NodeCollector<B> {
    pub fn new(
        client: kube::Client,
        node: impl Into<String>,
        driver: impl Into<String>,
        backend: tokio::sync::watch::Receiver<Option<std::sync::Arc<B>>>,
        window: Option<Duration>,
    ) -> Self {
        let recorder = kube::runtime::events::Recorder::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "lvms-node".into(),
                instance: None,
            },
        );
        Self {
            client,
            node: node.into(),
            driver: driver.into(),
            backend,
            window,
            tracker: Tracker::default(),
            ephemeral: Tracker::default(),
            started: tokio::time::Instant::now(),
            recorder,
            metrics: std::sync::Arc::new(crate::metrics::GcMetrics::new("orphaned_volumes")),
        }
    }

    /// Counts into `metrics` (`lvms_orphaned_volumes`, `…_removed_total`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::GcMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// One sweep: reports every orphaned LV (an event on the Node when first seen) and deletes those due.
    pub async fn sweep_once(&mut self) -> Result<Sweep, String> {
        use kube::{Resource, ResourceExt};
        use lvms_api::topolvm::LogicalVolume;

        let backend = self.backend.borrow().clone();
        let Some(backend) = backend else {
            return Ok(Sweep::default());
        };
        // Disk first: an LV made after this read has its object already.
        let (ephemeral, persistent): (Vec<_>, Vec<_>) = backend
            .list()
            .await
            .map_err(|e| format!("list volumes: {e}"))?
            .into_iter()
            .partition(|v| v.ephemeral.is_some());
        let (on_disk, shared_on_disk) = by_kind(persistent, &backend.classes());
        let api = kube::Api::<LogicalVolume>::all(self.client.clone());
        // A shared class's volumes are any node's: every object counts (one list, only when there
        // are such volumes); this node's own otherwise.
        let params = if shared_on_disk.is_empty() {
            kube::api::ListParams::default()
                .fields(&crate::lv_reconciler::node_selector(&self.node))
        } else {
            kube::api::ListParams::default()
        };
        let objects = api
            .list(&params)
            .await
            .map_err(|e| format!("list LogicalVolumes: {e}"))?;
        let names = |lv: &LogicalVolume| {
            let mut n = vec![lv.name_any(), crate::logical_volume::lv_name(lv)];
            if let Some(s) = &lv.status {
                n.push(s.volume_id.clone());
            }
            n
        };
        let named: BTreeSet<String> = objects
            .items
            .iter()
            .filter(|lv| lv.spec.node_name == self.node)
            .flat_map(names)
            .collect();
        let named_anywhere: BTreeSet<String> = objects.items.iter().flat_map(names).collect();
        let shared_orphans = orphaned_lvs(&shared_on_disk, &named_anywhere);
        let mut orphaned = orphaned_lvs(&on_disk, &named);
        orphaned.extend(shared_orphans.iter().cloned());
        let referenced = pv_handles(&self.client, &self.driver).await?;
        let now = self.started.elapsed();
        let mut sweep = self.tracker.sweep(now, &orphaned, &referenced, self.window);
        sweep.delete = removable(std::mem::take(&mut sweep.delete), &shared_orphans);
        let node_ref = k8s_openapi::api::core::v1::Node {
            metadata: kube::api::ObjectMeta {
                name: Some(self.node.clone()),
                ..Default::default()
            },
            ..Default::default()
        }
        .object_ref(&());
        for o in &sweep.orphans {
            tracing::warn!(volume_id = %o.id, age_secs = o.age.as_secs(), "LV of ours with no LogicalVolume");
            if o.age.is_zero() {
                warn_event(
                    &self.recorder,
                    &node_ref,
                    "OrphanedVolume",
                    format!(
                        "logical volume {} on node {} has no LogicalVolume object{}",
                        o.id,
                        self.node,
                        match self.window {
                            _ if shared_orphans.contains(&o.id) => {
                                "; it belongs to a shared class, whose orphans are only reported: \
                                 remove it with lvremove on a node that joined the class if nothing \
                                 uses it"
                                    .to_owned()
                            }
                            Some(w) => format!(
                                "; it is removed after {} s unless one appears",
                                w.as_secs()
                            ),
                            None => "; remove it with lvremove if nothing uses it".to_owned(),
                        }
                    ),
                )
                .await;
            }
        }
        self.metrics
            .orphans
            .set(i64::try_from(sweep.orphans.len()).unwrap_or(i64::MAX));
        self.remove(
            &*backend,
            &sweep.delete,
            "orphaned",
            "removing an orphaned LV after the safety window",
        )
        .await?;
        let (orphans, delete) = self.sweep_ephemeral(&*backend, ephemeral, now).await?;
        sweep.ephemeral_orphans = orphans;
        sweep.ephemeral_delete = delete;
        Ok(sweep)
    }

    /// The inline ephemeral volumes: which pods still exist, then [`ephemeral_candidates`] through
    /// their own [`Tracker`] with the grace period; the due ones are removed.
    async fn sweep_ephemeral(
        &mut self,
        backend: &B,
        volumes: Vec<lvms_engine::backend::Volume>,
        now: Duration,
    ) -> Result<(Vec<Orphan>, Vec<String>), String> {
        use k8s_openapi::api::core::v1::Pod;
        let mut lvs = Vec::new();
        let mut alive = BTreeSet::new();
        for v in volumes {
            let owner = v.ephemeral.unwrap_or_default();
            if !v.open && !owner.pod_uid.is_empty() {
                let api = kube::Api::<Pod>::namespaced(self.client.clone(), &owner.pod_namespace);
                match api.get_opt(&owner.pod_name).await {
                    Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(&owner.pod_uid) => {
                        alive.insert(owner.pod_uid.clone());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        // Unknown: kept, as if the pod were there.
                        tracing::warn!(volume_id = %v.id, error = %e, "could not read the pod of an ephemeral volume");
                        alive.insert(owner.pod_uid.clone());
                    }
                }
            }
            lvs.push(EphemeralLv {
                id: v.id,
                open: v.open,
                pod_uid: owner.pod_uid,
            });
        }
        let candidates = ephemeral_candidates(&lvs, &alive);
        let grace = self.window.unwrap_or(EPHEMERAL_GRACE);
        let s = self
            .ephemeral
            .sweep(now, &candidates, &BTreeSet::new(), Some(grace));
        for o in &s.orphans {
            tracing::info!(volume_id = %o.id, age_secs = o.age.as_secs(), grace_secs = grace.as_secs(), "inline ephemeral volume whose pod is gone");
        }
        self.remove(
            backend,
            &s.delete,
            "ephemeral",
            "removing an inline ephemeral volume whose pod is gone",
        )
        .await?;
        Ok((s.orphans, s.delete))
    }

    /// Removes the LVs `ids` (orphans past their window), each logged with `why` and counted.
    async fn remove(
        &self,
        backend: &B,
        ids: &[String],
        what: &str,
        why: &str,
    ) -> Result<(), String> {
        for id in ids {
            tracing::warn!(volume_id = %id, "{why}");
            backend
                .delete(id)
                .await
                .map_err(|e| format!("remove {what} {id}: {e}"))?;
            self.metrics.removed.inc();
        }
        Ok(())
    }

    /// Sweeps every `period` ([`PERIOD`] by default).
    pub async fn run(mut self, period: Duration) {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = self.sweep_once().await {
                tracing::warn!(error = %e, "garbage collection sweep failed");
            }
        }
    }
}

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
        use lvms_engine::backend::{ClassInfo, Layout, Volume};
        let class = |name: &str, shared: bool| ClassInfo {
            name: name.into(),
            thin_pool: None,
            overprovision_ratio: 1,
            default: false,
            layout: Layout::Linear,
            fstype: None,
            shared: shared.then(lvms_core::config::SharedConfig::default),
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

    mod collector {
        #![allow(clippy::unwrap_used)]

        use std::sync::Arc;

        use lvms_engine::{
            backend::{Backend, NewVolume},
            ids,
        };
        use lvms_testkit::{fake_api::FakeApi, fake_backend::FakeBackend};
        use serde_json::json;

        use super::super::*;

        async fn volume(backend: &FakeBackend, name: &str) -> String {
            made(backend, name, None).await
        }

        /// A 1 GiB thin volume named `name`, inline ephemeral when `ephemeral` names its owner.
        async fn made(
            backend: &FakeBackend,
            name: &str,
            ephemeral: Option<ids::EphemeralOwner>,
        ) -> String {
            backend
                .create_volume(&NewVolume {
                    name: name.into(),
                    class: "thin".into(),
                    size: 1 << 30,
                    lv_type: None,
                    volume_mode: None,
                    source: None,
                    ephemeral,
                })
                .await
                .unwrap()
                .id
        }

        /// Node `node-a`'s collector over `backend`, deleting after `window`.
        fn collector(
            api: &FakeApi,
            backend: &Arc<FakeBackend>,
            window: Option<Duration>,
        ) -> NodeCollector<FakeBackend> {
            let (_tx, rx) = tokio::sync::watch::channel(Some(backend.clone()));
            NodeCollector::new(api.client("default"), "node-a", "topolvm.io", rx, window)
        }

        async fn world() -> (FakeApi, Arc<FakeBackend>, [String; 3]) {
            let api = FakeApi::new();
            let backend = Arc::new(FakeBackend::new());
            let owned = volume(&backend, "owned").await;
            let orphan = volume(&backend, "orphan").await;
            let claimed = volume(&backend, "claimed").await;
            api.insert(
                &format!("/apis/topolvm.io/v1/logicalvolumes/{owned}"),
                json!({"metadata": {"name": owned},
                       "spec": {"name": "owned", "nodeName": "node-a", "size": "1Gi"}}),
            );
            api.insert(
                "/api/v1/persistentvolumes/pv-claimed",
                json!({"metadata": {"name": "pv-claimed"},
                       "spec": {"csi": {"driver": "topolvm.io", "volumeHandle": claimed}}}),
            );
            (api, backend, [owned, orphan, claimed])
        }

        #[tokio::test]
        async fn by_default_orphans_are_reported_once_with_an_event_and_kept() {
            let (api, backend, [_, orphan, claimed]) = world().await;
            let mut c = collector(&api, &backend, None);
            let s = c.sweep_once().await.unwrap();
            let mut want = vec![orphan.clone(), claimed.clone()];
            want.sort();
            assert_eq!(
                s.orphans.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
                want
            );
            assert!(s.delete.is_empty());
            let events: Vec<_> = api
                .requests()
                .into_iter()
                .filter(|r| r.path.contains("/events"))
                .collect();
            assert_eq!(events.len(), 2, "one event per new orphan");
            assert_eq!(events[0].body["reason"], "OrphanedVolume");
            assert_eq!(events[0].body["regarding"]["kind"], "Node");
            api.clear_requests();
            c.sweep_once().await.unwrap();
            assert!(
                !api.requests().iter().any(|r| r.path.contains("/events")),
                "no new event for a known orphan"
            );
            assert_eq!(backend.state.lock().unwrap().volumes.len(), 3);
        }

        #[tokio::test]
        async fn a_shared_volume_is_judged_by_every_nodes_objects_and_only_reported() {
            let api = FakeApi::new();
            let backend = Arc::new(
                FakeBackend::new().with_shared("thin", lvms_core::config::SharedVolumeMode::Thin),
            );
            let elsewhere = volume(&backend, "elsewhere").await;
            let orphan = volume(&backend, "orphan").await;
            // Made for node-b's LogicalVolume: not this node's object, still not an orphan.
            api.insert(
                &format!("/apis/topolvm.io/v1/logicalvolumes/{elsewhere}"),
                json!({"metadata": {"name": elsewhere},
                       "spec": {"name": "elsewhere", "nodeName": "node-b", "size": "1Gi"}}),
            );
            let mut c = collector(&api, &backend, Some(Duration::ZERO));
            let s = c.sweep_once().await.unwrap();
            assert_eq!(
                s.orphans.iter().map(|o| o.id.clone()).collect::<Vec<_>>(),
                std::slice::from_ref(&orphan)
            );
            assert!(s.delete.is_empty(), "a shared orphan is never removed");
            assert_eq!(backend.state.lock().unwrap().volumes.len(), 2);
            let events: Vec<_> = api
                .requests()
                .into_iter()
                .filter(|r| r.path.contains("/events"))
                .collect();
            assert_eq!(events.len(), 1);
            let note = events[0].body["note"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            assert!(
                note.contains(&orphan) && note.contains("shared class"),
                "{note}"
            );
        }

        async fn ephemeral(backend: &FakeBackend, name: &str, pod: &str) -> String {
            let owner = ids::EphemeralOwner {
                pod_uid: format!("uid-{pod}"),
                pod_namespace: "default".into(),
                pod_name: pod.into(),
            };
            made(backend, name, Some(owner)).await
        }

        #[tokio::test]
        async fn ephemeral_volumes_are_no_orphans_and_go_only_when_unmounted_and_their_pod_is_gone()
        {
            let api = FakeApi::new();
            let backend = Arc::new(FakeBackend::new());
            let alive = ephemeral(&backend, "csi-1", "alive").await;
            let gone = ephemeral(&backend, "csi-2", "gone").await;
            let mounted = ephemeral(&backend, "csi-3", "gone-too").await;
            let replaced = ephemeral(&backend, "csi-4", "replaced").await;
            backend
                .state
                .lock()
                .unwrap()
                .volumes
                .get_mut(&mounted)
                .unwrap()
                .open = true;
            api.insert(
                "/api/v1/namespaces/default/pods/alive",
                json!({"metadata": {"name": "alive", "namespace": "default", "uid": "uid-alive"}}),
            );
            // A pod of the same name but another uid: the volume's pod is gone.
            api.insert(
                "/api/v1/namespaces/default/pods/replaced",
                json!({"metadata": {"name": "replaced", "namespace": "default", "uid": "uid-new"}}),
            );
            let mut c = collector(&api, &backend, None);
            let s = c.sweep_once().await.unwrap();
            assert!(s.orphans.is_empty(), "no LogicalVolume orphans: {s:?}");
            assert!(s.ephemeral_delete.is_empty(), "within the grace period");
            let mut want = vec![gone.clone(), replaced.clone()];
            want.sort();
            assert_eq!(
                s.ephemeral_orphans
                    .iter()
                    .map(|o| o.id.clone())
                    .collect::<Vec<_>>(),
                want
            );
            let mut c = collector(&api, &backend, Some(Duration::ZERO));
            let s = c.sweep_once().await.unwrap();
            assert_eq!(s.ephemeral_delete, want);
            let mut left: Vec<String> = backend
                .state
                .lock()
                .unwrap()
                .volumes
                .keys()
                .cloned()
                .collect();
            left.sort();
            let mut kept = vec![alive, mounted];
            kept.sort();
            assert_eq!(left, kept);
        }

        #[tokio::test]
        async fn with_a_window_an_unreferenced_orphan_goes_and_a_claimed_one_stays() {
            let (api, backend, [owned, orphan, claimed]) = world().await;
            let c = collector(&api, &backend, Some(Duration::ZERO));
            let metrics = std::sync::Arc::new(crate::metrics::GcMetrics::new("orphaned_volumes"));
            let mut c = c.with_metrics(metrics.clone());
            let s = c.sweep_once().await.unwrap();
            assert_eq!(s.delete, std::slice::from_ref(&orphan));
            assert_eq!(metrics.orphans.get(), 2);
            assert_eq!(metrics.removed.get(), 1);
            let left: Vec<String> = backend
                .state
                .lock()
                .unwrap()
                .volumes
                .keys()
                .cloned()
                .collect();
            let mut want = vec![owned, claimed];
            want.sort();
            assert_eq!(left, want);
            assert_eq!(ids::volume_lv_name("orphan"), orphan);
        }
    }
}
