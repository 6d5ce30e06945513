//! The node agent's garbage collector: LVs of ours on this node that no `LogicalVolume` names, judged
//! by the rules of [`lvms_engine::gc`], reported with [`lvms_k8s::gc`]'s events and removed through
//! the engine.

use std::{collections::BTreeSet, time::Duration};

use lvms_engine::gc::{
    EPHEMERAL_GRACE, EphemeralLv, Orphan, Sweep, Tracker, by_kind, ephemeral_candidates,
    orphaned_lvs, removable,
};
use lvms_k8s::gc::{pv_handles, warn_event};

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
    metrics: std::sync::Arc<lvms_k8s::metrics::GcMetrics>,
}

impl<B: lvms_engine::backend::Backend> NodeCollector<B> {
    pub fn new(
        client: kube::Client,
        node: impl Into<String>,
        driver: impl Into<String>,
        backend: tokio::sync::watch::Receiver<Option<std::sync::Arc<B>>>,
        window: Option<Duration>,
    ) -> Self {
        let recorder = lvms_k8s::reconciler::recorder(client.clone(), "lvms-node");
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
            metrics: std::sync::Arc::new(lvms_k8s::metrics::GcMetrics::new("orphaned_volumes")),
        }
    }

    /// Counts into `metrics` (`lvms_orphaned_volumes`, `…_removed_total`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: std::sync::Arc<lvms_k8s::metrics::GcMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// One sweep: reports every orphaned LV (an event on the Node when first seen) and deletes those
    /// due; its time goes to `lvms_orphaned_volumes_sweep_seconds`.
    pub async fn sweep_once(&mut self) -> Result<Sweep, String> {
        let metrics = self.metrics.clone();
        metrics.time_sweep(self.sweep()).await
    }

    async fn sweep(&mut self) -> Result<Sweep, String> {
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
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use lvms_engine::{
        backend::{Backend, NewVolume},
        ids,
    };
    use lvms_testkit::{fake_api::FakeApi, fake_backend::FakeBackend};
    use serde_json::json;

    use super::*;

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
    async fn ephemeral_volumes_are_no_orphans_and_go_only_when_unmounted_and_their_pod_is_gone() {
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
        let metrics = std::sync::Arc::new(lvms_k8s::metrics::GcMetrics::new("orphaned_volumes"));
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
