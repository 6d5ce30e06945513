//! The operator's Prometheus metrics and its plain HTTP endpoints: `/metrics` (OpenMetrics text),
//! `/healthz` (the process serves) and `/readyz` (the controller's cache is synced and the webhook
//! listens).
//!
//! Metric names, all prefixed `lvms_operator_`:
//! - `reconciles_total{controller, result}`: reconciles by controller (`lvmcluster`,
//!   `node-removal`, `eviction`: only pods of a StatefulSet that are being evicted or are
//!   unschedulable count) and result (`success`, `error`);
//! - `reconcile_duration_seconds{controller}`: how long they took;
//! - `lvmcluster_ready{namespace, name}`: 1 while the LVMCluster's status says ready, else 0;
//! - `lvmcluster_state{namespace, name, state}`: 1 for the LVMCluster's current state, 0 for the
//!   others;
//! - `webhook_requests_total{operation, result}`: admission reviews by operation (`validate`,
//!   `mutate`) and result (`allowed`, `denied`, `error`);
//! - `node_cleanups_total`: nodes that no longer exist whose objects and finalizers were released;
//! - `eviction_claim_deletions_total`: claims the eviction controller deleted.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// The states an `LVMCluster` can report, for `lvmcluster_state`.
pub const CLUSTER_STATES: [&str; 5] = ["Progressing", "Ready", "Failed", "Degraded", "Unknown"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    namespace: String,
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterStateLabels {
    namespace: String,
    name: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WebhookLabels {
    operation: String,
    result: String,
}

fn duration_histogram() -> Histogram {
    // 5 ms .. ~20 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 13))
}

/// The operator's metrics; cheap to clone and share.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    cluster_ready: Family<ClusterLabels, Gauge>,
    cluster_state: Family<ClusterStateLabels, Gauge>,
    webhook_requests: Family<WebhookLabels, Counter>,
    node_cleanups: Counter,
    eviction_claim_deletions: Counter,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric registered and nothing observed.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("lvms_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller and result",
            reconciles.clone(),
        );
        let reconcile_duration =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                duration_histogram,
            );
        registry.register(
            "reconcile_duration_seconds",
            "How long reconciles took",
            reconcile_duration.clone(),
        );
        let cluster_ready = Family::<ClusterLabels, Gauge>::default();
        registry.register(
            "lvmcluster_ready",
            "1 while the LVMCluster's status says ready",
            cluster_ready.clone(),
        );
        let cluster_state = Family::<ClusterStateLabels, Gauge>::default();
        registry.register(
            "lvmcluster_state",
            "1 for the LVMCluster's current state, 0 for the others",
            cluster_state.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission reviews by operation and result",
            webhook_requests.clone(),
        );
        let node_cleanups = Counter::default();
        registry.register(
            "node_cleanups",
            "Nodes that no longer exist whose node status and cleanup finalizers were released",
            node_cleanups.clone(),
        );
        let eviction_claim_deletions = Counter::default();
        registry.register(
            "eviction_claim_deletions",
            "StatefulSet claims the eviction controller deleted because their node was gone, out of \
             service or cordoned",
            eviction_claim_deletions.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_duration,
            cluster_ready,
            cluster_state,
            webhook_requests,
            node_cleanups,
            eviction_claim_deletions,
        }
    }

    /// Counts one reconcile of `controller` that took `took`.
    pub fn reconciled(&self, controller: &str, ok: bool, took: Duration) {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result: if ok { "success" } else { "error" }.to_owned(),
            })
            .inc();
        self.reconcile_duration
            .get_or_create(&ControllerLabels {
                controller: controller.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records the state an `LVMCluster`'s status reports.
    pub fn cluster_status(&self, namespace: &str, name: &str, ready: bool, state: &str) {
        self.cluster_ready
            .get_or_create(&ClusterLabels {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            })
            .set(i64::from(ready));
        for s in CLUSTER_STATES {
            self.cluster_state
                .get_or_create(&ClusterStateLabels {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    state: s.to_owned(),
                })
                .set(i64::from(s == state));
        }
    }

    /// Forgets a deleted `LVMCluster`'s series.
    pub fn cluster_deleted(&self, namespace: &str, name: &str) {
        self.cluster_ready.remove(&ClusterLabels {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
        for s in CLUSTER_STATES {
            self.cluster_state.remove(&ClusterStateLabels {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                state: s.to_owned(),
            });
        }
    }

    /// Counts one admission review; `result` is `allowed`, `denied` or `error`.
    pub fn webhook_request(&self, operation: &str, result: &str) {
        self.webhook_requests
            .get_or_create(&WebhookLabels {
                operation: operation.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// Counts nodes whose leftovers were released.
    pub fn node_cleanups(&self, nodes: u64) {
        self.node_cleanups.inc_by(nodes);
    }

    /// Counts one claim the eviction controller deleted.
    pub fn eviction_claim_deleted(&self) {
        self.eviction_claim_deletions.inc();
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Whether the operator is ready: set once every part it waits for reported in.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    controller: Arc<AtomicBool>,
    webhook: Arc<AtomicBool>,
}

impl Readiness {
    /// Readiness for a process whose webhook is served elsewhere (or not at all).
    pub fn without_webhook() -> Self {
        let r = Self::default();
        r.webhook_listening();
        r
    }

    /// The controller's cache has synced.
    pub fn controller_synced(&self) {
        self.controller.store(true, Ordering::Release);
    }

    /// The webhook listens.
    pub fn webhook_listening(&self) {
        self.webhook.store(true, Ordering::Release);
    }

    /// What is still awaited, in words; empty when ready.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        let mut waiting = Vec::new();
        if !self.controller.load(Ordering::Acquire) {
            waiting.push("the LVMCluster cache to sync");
        }
        if !self.webhook.load(Ordering::Acquire) {
            waiting.push("the admission webhook to listen");
        }
        waiting
    }
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

/// `/metrics`, `/healthz` and `/readyz` (503 naming what is awaited until ready).
pub fn router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(HttpState { metrics, readiness })
}

/// Serves [`router`] on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, readiness))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn serve_metrics(State(state): State<HttpState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
        .into_response()
}

async fn ready(State(state): State<HttpState>) -> Response {
    let waiting = state.readiness.waiting_for();
    if waiting.is_empty() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: waiting for {}\n", waiting.join(" and ")),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use http::Request;
    use tower::ServiceExt;

    use super::*;

    async fn get(router: Router, path: &str) -> (StatusCode, String) {
        let res = router
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = res.status();
        let body = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_names_what_it_waits_for_until_both_parts_report() {
        let readiness = Readiness::default();
        let router = router(Arc::new(Metrics::new()), readiness.clone());
        let (code, body) = get(router.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("the LVMCluster cache to sync"), "{body}");
        assert!(body.contains("the admission webhook to listen"), "{body}");

        readiness.controller_synced();
        let (code, body) = get(router.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("cache"), "{body}");

        readiness.webhook_listening();
        assert_eq!(
            get(router.clone(), "/readyz").await,
            (StatusCode::OK, "ok".to_owned())
        );
        assert_eq!(
            get(router, "/healthz").await,
            (StatusCode::OK, "ok".to_owned())
        );
    }

    #[tokio::test]
    async fn metrics_endpoint_exposes_what_was_recorded() {
        let metrics = Arc::new(Metrics::new());
        metrics.reconciled("lvmcluster", true, Duration::from_millis(20));
        metrics.reconciled("lvmcluster", false, Duration::from_millis(20));
        metrics.reconciled("lvmcluster", false, Duration::from_millis(20));
        metrics.cluster_status("lvms-system", "my-lvmcluster", false, "Degraded");
        metrics.webhook_request("validate", "denied");
        metrics.node_cleanups(2);
        metrics.eviction_claim_deleted();
        let (code, body) = get(
            router(metrics.clone(), Readiness::without_webhook()),
            "/metrics",
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        for line in [
            r#"lvms_operator_reconciles_total{controller="lvmcluster",result="success"} 1"#,
            r#"lvms_operator_reconciles_total{controller="lvmcluster",result="error"} 2"#,
            r#"lvms_operator_reconcile_duration_seconds_count{controller="lvmcluster"} 3"#,
            r#"lvms_operator_lvmcluster_ready{namespace="lvms-system",name="my-lvmcluster"} 0"#,
            r#"lvms_operator_lvmcluster_state{namespace="lvms-system",name="my-lvmcluster",state="Degraded"} 1"#,
            r#"lvms_operator_lvmcluster_state{namespace="lvms-system",name="my-lvmcluster",state="Ready"} 0"#,
            r#"lvms_operator_webhook_requests_total{operation="validate",result="denied"} 1"#,
            "lvms_operator_node_cleanups_total 2",
            "lvms_operator_eviction_claim_deletions_total 1",
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing {line:?} in\n{body}"
            );
        }

        metrics.cluster_deleted("lvms-system", "my-lvmcluster");
        let body = metrics.encode();
        assert!(!body.contains("my-lvmcluster"), "{body}");
    }
}
