//! Prometheus metrics of the node agent and the CSI controller (the operator has its own,
//! `lvms_operator::metrics`): what the garbage collectors find and remove and, on the node agent, how
//! full each device class is under TopoLVM's names ([`StorageMetrics`]), served as OpenMetrics text on
//! `/metrics`, with `/healthz`.

use std::sync::{Arc, atomic::AtomicU64};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use lvms_engine::backend::Usage;
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// The labels of a class's numbers, as TopoLVM's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub device_class: String,
    pub node: String,
}

type Gauges = Family<ClassLabels, Gauge<f64, AtomicU64>>;

/// How full each device class is on this node, under the names TopoLVM and LVMS export (so their
/// dashboards and alerts work unchanged): `topolvm_volumegroup_size_bytes`,
/// `topolvm_volumegroup_available_bytes`, `topolvm_thinpool_size_bytes`,
/// `topolvm_thinpool_data_percent`, `topolvm_thinpool_metadata_percent` and
/// `topolvm_thinpool_overprovisioned_available`, each labelled `device_class` and `node`; and, for
/// RAID classes (thick, or a thin pool over RAID), lvms-rs's own `lvms_raid_health`,
/// `lvms_raid_degraded_members` and `lvms_raid_min_sync_percent` ([`RaidNumbers`]).
#[derive(Debug, Clone, Default)]
pub struct StorageMetrics {
    vg_size: Gauges,
    vg_available: Gauges,
    pool_size: Gauges,
    pool_data_percent: Gauges,
    pool_metadata_percent: Gauges,
    pool_overprovisioned_available: Gauges,
    raid_health: Gauges,
    raid_degraded_members: Gauges,
    raid_min_sync_percent: Gauges,
}

/// A RAID class's health on this node, over its RAID volumes (a thin pool's data and metadata
/// among them) and its LVM physical volumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RaidNumbers {
    /// 0 healthy, 1 degraded (a member missing, or not in sync), 2 failed.
    pub health: u8,
    /// LVM physical volumes missing.
    pub degraded_members: u32,
    /// The lowest sync percentage of its RAID volumes.
    pub min_sync_percent: f64,
}

impl StorageMetrics {
    fn register(&self, registry: &mut Registry) {
        for (name, help, family) in [
            (
                "topolvm_volumegroup_size_bytes",
                "Size of the device class's LVM volume group in bytes",
                &self.vg_size,
            ),
            (
                "topolvm_volumegroup_available_bytes",
                "Free bytes of the device class's LVM volume group",
                &self.vg_available,
            ),
            (
                "topolvm_thinpool_size_bytes",
                "Data size of the device class's thin pool in bytes",
                &self.pool_size,
            ),
            (
                "topolvm_thinpool_data_percent",
                "Data space used in the device class's thin pool, percent",
                &self.pool_data_percent,
            ),
            (
                "topolvm_thinpool_metadata_percent",
                "Metadata space used in the device class's thin pool, percent",
                &self.pool_metadata_percent,
            ),
            (
                "topolvm_thinpool_overprovisioned_available",
                "Bytes new thin volumes of the device class may still take (overprovisioned, capped by \
                 the pool's free space)",
                &self.pool_overprovisioned_available,
            ),
            (
                "lvms_raid_health",
                "Health of the device class's RAID volumes and RAID thin pool: 0 healthy, 1 degraded, \
                 2 failed",
                &self.raid_health,
            ),
            (
                "lvms_raid_degraded_members",
                "LVM physical volumes missing from the RAID device class's volume group",
                &self.raid_degraded_members,
            ),
            (
                "lvms_raid_min_sync_percent",
                "Lowest sync percentage of the RAID device class's RAID volumes (its thin pool's data \
                 and metadata included)",
                &self.raid_min_sync_percent,
            ),
        ] {
            registry.register(name, help, family.clone());
        }
    }

    fn all(&self) -> [&Gauges; 9] {
        [
            &self.vg_size,
            &self.vg_available,
            &self.pool_size,
            &self.pool_data_percent,
            &self.pool_metadata_percent,
            &self.pool_overprovisioned_available,
            &self.raid_health,
            &self.raid_degraded_members,
            &self.raid_min_sync_percent,
        ]
    }

    /// Sets `class`'s RAID numbers; `None` (not a RAID class, or no volume group yet) removes them.
    pub fn record_raid(&self, node: &str, class: &str, raid: Option<RaidNumbers>) {
        let labels = ClassLabels {
            device_class: class.to_owned(),
            node: node.to_owned(),
        };
        for (family, value) in [
            (&self.raid_health, raid.map(|r| f64::from(r.health))),
            (
                &self.raid_degraded_members,
                raid.map(|r| f64::from(r.degraded_members)),
            ),
            (
                &self.raid_min_sync_percent,
                raid.map(|r| r.min_sync_percent),
            ),
        ] {
            match value {
                Some(v) => {
                    family.get_or_create(&labels).set(v);
                }
                None => {
                    family.remove(&labels);
                }
            }
        }
    }

    /// Sets `class`'s numbers from `usage`; numbers it lacks (no pool, an inactive pool's
    /// percentages) are removed rather than left stale.
    pub fn record(&self, node: &str, class: &str, usage: &Usage) {
        let labels = ClassLabels {
            device_class: class.to_owned(),
            node: node.to_owned(),
        };
        let set = |family: &Gauges, value: Option<f64>| match value {
            Some(v) => {
                family.get_or_create(&labels).set(v);
            }
            None => {
                family.remove(&labels);
            }
        };
        // Bytes as f64: exact below 2^53 (8 PiB).
        set(&self.vg_size, Some(usage.vg_size as f64));
        set(&self.vg_available, Some(usage.vg_free as f64));
        let pool = usage.pool.as_ref();
        set(&self.pool_size, pool.map(|p| p.size as f64));
        set(&self.pool_data_percent, pool.and_then(|p| p.data_percent));
        set(
            &self.pool_metadata_percent,
            pool.and_then(|p| p.metadata_percent),
        );
        set(
            &self.pool_overprovisioned_available,
            pool.map(|p| p.overprovisioned_available as f64),
        );
    }

    /// Removes every number of `class` (no longer served here).
    pub fn forget(&self, node: &str, class: &str) {
        let labels = ClassLabels {
            device_class: class.to_owned(),
            node: node.to_owned(),
        };
        for family in self.all() {
            family.remove(&labels);
        }
    }
}

/// The garbage collector's numbers.
#[derive(Debug)]
pub struct GcMetrics {
    registry: Registry,
    /// Orphans found by the last sweep.
    pub orphans: Gauge,
    /// Orphans removed after their safety window.
    pub removed: Counter,
    /// What the last sweep took, in seconds.
    pub sweep_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
}

impl GcMetrics {
    /// Metrics named `lvms_<what>_…`: `what` is `orphaned_volumes` for the node agent (LVs no
    /// LogicalVolume names), `unclaimed_logical_volumes` for the controller.
    pub fn new(what: &str) -> Self {
        Self::with_storage(what, None)
    }

    /// [`GcMetrics::new`], also serving `storage`'s numbers.
    pub fn with_storage(what: &str, storage: Option<&StorageMetrics>) -> Self {
        let mut registry = Registry::default();
        if let Some(s) = storage {
            s.register(&mut registry);
        }
        let orphans = Gauge::default();
        let removed = Counter::default();
        let sweep_seconds = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            format!("lvms_{what}"),
            "Found by the garbage collector's last sweep",
            orphans.clone(),
        );
        registry.register(
            format!("lvms_{what}_removed"),
            "Removed by the garbage collector after the safety window",
            removed.clone(),
        );
        registry.register(
            format!("lvms_{what}_sweep_seconds"),
            "What the garbage collector's last sweep took",
            sweep_seconds.clone(),
        );
        Self {
            registry,
            orphans,
            removed,
            sweep_seconds,
        }
    }

    /// Runs `sweep`, and sets `sweep_seconds` to what it took.
    pub async fn time_sweep<T>(&self, sweep: impl std::future::Future<Output = T>) -> T {
        let started = std::time::Instant::now();
        let out = sweep.await;
        self.sweep_seconds.set(started.elapsed().as_secs_f64());
        out
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `/metrics` and `/healthz`.
pub fn router(metrics: Arc<GcMetrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<GcMetrics>>| async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
                    .into_response()
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(metrics)
}

/// Serves [`router`] on `listener` until the process ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<GcMetrics>,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics)).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use axum::body::Body;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let m = Arc::new(GcMetrics::new("orphaned_volumes"));
        m.orphans.set(3);
        m.removed.inc();
        let res = router(m)
            .oneshot(
                axum::http::Request::get("/metrics")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("lvms_orphaned_volumes 3"), "{text}");
        assert!(
            text.contains("lvms_orphaned_volumes_removed_total 1"),
            "{text}"
        );
    }

    #[test]
    fn class_usage_is_exported_under_topolvm_names_and_forgotten_with_the_class() {
        let storage = StorageMetrics::default();
        let m = GcMetrics::with_storage("orphaned_volumes", Some(&storage));
        let thin = Usage {
            vg_size: 10 << 30,
            vg_free: 1 << 30,
            pool: Some(lvms_engine::backend::PoolUsage {
                size: 8 << 30,
                data_percent: Some(42.5),
                metadata_percent: None,
                overprovisioned_available: 70 << 30,
            }),
        };
        storage.record("node-a", "thin", &thin);
        storage.record(
            "node-a",
            "thick",
            &Usage {
                vg_size: 4 << 30,
                vg_free: 3 << 30,
                pool: None,
            },
        );
        let text = m.encode();
        let l = |class: &str| format!("{{device_class=\"{class}\",node=\"node-a\"}}");
        for line in [
            format!("topolvm_volumegroup_size_bytes{} 10737418240.0", l("thin")),
            format!(
                "topolvm_volumegroup_available_bytes{} 1073741824.0",
                l("thin")
            ),
            format!("topolvm_thinpool_size_bytes{} 8589934592.0", l("thin")),
            format!("topolvm_thinpool_data_percent{} 42.5", l("thin")),
            format!(
                "topolvm_thinpool_overprovisioned_available{} 75161927680.0",
                l("thin")
            ),
            format!(
                "topolvm_volumegroup_available_bytes{} 3221225472.0",
                l("thick")
            ),
        ] {
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        assert!(
            !text.contains(&format!("topolvm_thinpool_metadata_percent{}", l("thin"))),
            "{text}"
        );
        assert!(
            !text.contains(&format!("topolvm_thinpool_size_bytes{}", l("thick"))),
            "{text}"
        );

        storage.forget("node-a", "thin");
        let text = m.encode();
        assert!(!text.contains("device_class=\"thin\""), "{text}");
        assert!(text.contains("device_class=\"thick\""), "{text}");
    }

    #[test]
    fn raid_health_is_exported_per_class_and_removed_with_none_or_the_class() {
        let storage = StorageMetrics::default();
        let m = GcMetrics::with_storage("orphaned_volumes", Some(&storage));
        let degraded = RaidNumbers {
            health: 1,
            degraded_members: 1,
            min_sync_percent: 37.5,
        };
        storage.record_raid("node-a", "raid-thin", Some(degraded));
        storage.record_raid("node-a", "mirror", Some(degraded));
        let text = m.encode();
        let l = |class: &str| format!("{{device_class=\"{class}\",node=\"node-a\"}}");
        for line in [
            format!("lvms_raid_health{} 1.0", l("raid-thin")),
            format!("lvms_raid_degraded_members{} 1.0", l("raid-thin")),
            format!("lvms_raid_min_sync_percent{} 37.5", l("raid-thin")),
        ] {
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        storage.record_raid("node-a", "raid-thin", None);
        storage.forget("node-a", "mirror");
        let text = m.encode();
        assert!(!text.contains("device_class=\"raid-thin\""), "{text}");
        assert!(!text.contains("device_class=\"mirror\""), "{text}");
    }
}
