//! Prometheus metrics of the node agent and the CSI controller (the operator has its own,
//! `lvms_operator::metrics`): what the garbage collectors find and remove, served as OpenMetrics text
//! on `/metrics`, with `/healthz`.

use std::sync::Arc;

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

/// The garbage collector's numbers.
#[derive(Debug)]
pub struct GcMetrics {
    registry: Registry,
    /// Orphans found by the last sweep.
    pub orphans: Gauge,
    /// Orphans removed after their safety window.
    pub removed: Counter,
}

impl GcMetrics {
    /// Metrics named `lvms_<what>_…`: `what` is `orphaned_volumes` for the node agent (LVs no
    /// LogicalVolume names), `unclaimed_logical_volumes` for the controller.
    pub fn new(what: &str) -> Self {
        let mut registry = Registry::default();
        let orphans = Gauge::default();
        let removed = Counter::default();
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
        Self {
            registry,
            orphans,
            removed,
        }
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
}
