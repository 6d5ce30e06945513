//! The controller's collector: volume `LogicalVolume`s that no PersistentVolume of this driver refers
//! to (see [`lvms_engine::gc`] for the rules). It reports each with a Warning event on the object when
//! first seen, and deletes the object (its node agent then removes the LV) once the safety window, when
//! one is configured, has passed.
//!
//! Of the CSI controller's replicas only the holder of [`LEADER_LEASE`] collects
//! ([`lvms_k8s::leader`]): two would each report (and count) every unclaimed volume.

use std::{sync::Arc, time::Duration};

use kube::{Api, Resource, ResourceExt, api::DeleteParams};
use lvms_api::topolvm::LogicalVolume;
use lvms_engine::gc::{Sweep, Tracker, unclaimed_objects};
use lvms_engine::ids;
use lvms_k8s::{
    gc::{pv_handles, warn_event},
    metrics::GcMetrics,
};

use crate::view::View;

/// The Lease whose holder, of the CSI controller's replicas, runs the collector.
pub const LEADER_LEASE: &str = "lvms-csi-controller";

pub struct ControllerCollector {
    view: Arc<View>,
    api: Api<LogicalVolume>,
    window: Option<Duration>,
    tracker: Tracker,
    started: tokio::time::Instant,
    recorder: kube::runtime::events::Recorder,
    metrics: Arc<GcMetrics>,
}

impl ControllerCollector {
    pub fn new(view: Arc<View>, api: Api<LogicalVolume>, window: Option<Duration>) -> Self {
        let recorder =
            lvms_k8s::reconciler::recorder(api.clone().into_client(), "lvms-csi-controller");
        Self {
            view,
            api,
            window,
            tracker: Tracker::default(),
            started: tokio::time::Instant::now(),
            recorder,
            metrics: Arc::new(GcMetrics::new("unclaimed_logical_volumes")),
        }
    }

    /// Counts into `metrics` (`lvms_unclaimed_logical_volumes`, `…_removed_total`).
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<GcMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// One sweep over the view's `LogicalVolume`s; its time goes to
    /// `lvms_unclaimed_logical_volumes_sweep_seconds`.
    pub async fn sweep_once(&mut self) -> Result<Sweep, String> {
        let metrics = self.metrics.clone();
        metrics.time_sweep(self.sweep()).await
    }

    async fn sweep(&mut self) -> Result<Sweep, String> {
        let client = self.api.clone().into_client();
        // PVs first: a volume provisioned after this read is younger than any window.
        let referenced = pv_handles(&client, &self.view.driver).await?;
        // By volume id, which PVs hold: an object TopoLVM or LVMS made is named `pvc-…` and its
        // id is its `status.volumeID` (ADR 0032); lvms-rs's objects are named after their ids.
        let mut names = std::collections::BTreeMap::new();
        let objects: Vec<(String, bool, bool)> = self
            .view
            .logical_volumes
            .state()
            .iter()
            .filter_map(|lv| {
                let id = lv.status.as_ref()?.volume_id.clone();
                if id.is_empty() {
                    return None;
                }
                names.insert(id.clone(), lv.name_any());
                Some((
                    id.clone(),
                    ids::is_snapshot_id(&id) || lv.spec.access_type == "ro",
                    lv.metadata.deletion_timestamp.is_some(),
                ))
            })
            .collect();
        let sweep = self.tracker.sweep(
            self.started.elapsed(),
            &unclaimed_objects(&objects, &referenced),
            &referenced,
            self.window,
        );
        for o in &sweep.orphans {
            tracing::warn!(logical_volume = %o.id, age_secs = o.age.as_secs(), "LogicalVolume without a PersistentVolume");
            if o.age.is_zero()
                && let Some(lv) = names.get(&o.id).and_then(|name| self.view.named(name))
            {
                warn_event(
                    &self.recorder,
                    &lv.object_ref(&()),
                    "OrphanedLogicalVolume",
                    format!(
                        "no PersistentVolume of driver {} refers to volume {}{}",
                        self.view.driver,
                        o.id,
                        match self.window {
                            Some(w) => format!(
                                "; it is deleted after {} s unless one appears",
                                w.as_secs()
                            ),
                            None =>
                                "; delete the LogicalVolume if nothing will claim it".to_owned(),
                        }
                    ),
                )
                .await;
            }
        }
        self.metrics
            .orphans
            .set(i64::try_from(sweep.orphans.len()).unwrap_or(i64::MAX));
        for id in &sweep.delete {
            let name = names.get(id).map_or(id.as_str(), String::as_str);
            tracing::warn!(logical_volume = %name, volume_id = %id, "deleting an unclaimed LogicalVolume after the safety window");
            match self.api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {
                    self.metrics.removed.inc();
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(format!("delete LogicalVolume {name}: {e}")),
            }
        }
        Ok(sweep)
    }

    /// Sweeps every `period` ([`lvms_engine::gc::PERIOD`] by default).
    pub async fn run(mut self, period: Duration) {
        loop {
            tokio::time::sleep(period).await;
            if let Err(e) = self.sweep_once().await {
                tracing::warn!(error = %e, "garbage collection sweep failed");
            }
        }
    }
}
