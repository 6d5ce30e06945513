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
//! - `eviction_claim_deletions_total`: claims the eviction controller deleted;
//! - `shared_volume_handovers_total`: volumes of shared classes handed from a gone node to another.
//! - `dead_node_pod_deletions_total`: pods deleted from nodes dead in a fenced shared class
//!   (ADR 0029);
//! - `leader`: 1 while this replica leads (runs the controllers), 0 while it stands by.
//!
//! From the nodes' reports of shared classes (`LVMVolumeGroupNodeStatus`), prefixed `lvms_` like
//! the node agents' metrics, one series per shared class and node that reports it:
//! - `shared_lockspace_joined{device_class, node}`: 1 while the node reports the class's lockspace
//!   `Joined`, else 0;
//! - `shared_lease_renewal_failures{device_class, node}`: 1 while the node's last lease renewal failed,
//!   else 0 (only when it reports fencing);
//! - `shared_fencing_armed{device_class, node}`: 1 when the node's watchdog is armed (`Armed` or
//!   `Softdog`) and the kill hook configured, else 0; not exported for a class whose
//!   `sharedConfig.watchdog` is `Disabled`, nor for a node that does not report fencing.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    sync::{
        Arc, Mutex,
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
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus, LockspaceState, WatchdogPolicy};
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct SharedLabels {
    device_class: String,
    node: String,
}

/// One node's report of one shared class, as the `lvms_shared_*` gauges show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedSeries {
    /// The shared class.
    pub device_class: String,
    /// The node that reports it.
    pub node: String,
    /// Its lockspace is `Joined`.
    pub joined: bool,
    /// 1 while the node's last renewal failed, when the node reports fencing.
    pub lease_renewal_failures: Option<i64>,
    /// Whether fencing is armed, when the node reports fencing and the class requires it.
    pub fencing_armed: Option<bool>,
}

/// The `lvms_shared_*` series of `cluster`: every node's report of each of its shared classes,
/// in class then node order.
pub fn shared_series(
    cluster: &LVMCluster,
    node_statuses: &[LVMVolumeGroupNodeStatus],
) -> Vec<SharedSeries> {
    let mut series = Vec::new();
    for class in cluster
        .spec
        .storage
        .device_classes
        .iter()
        .filter(|c| c.is_shared())
    {
        let required =
            class.shared_config_or_default().watchdog_or_default() == WatchdogPolicy::Required;
        let mut nodes = BTreeMap::new();
        for status in node_statuses {
            let node = status.metadata.name.as_deref().unwrap_or_default();
            let shared = status
                .spec
                .lvm_vg_status
                .iter()
                .find(|vg| vg.name == class.name)
                .and_then(|vg| vg.shared.as_ref());
            if node.is_empty() || nodes.contains_key(node) {
                continue;
            }
            if let Some(shared) = shared {
                let fencing = shared.fencing.as_ref();
                nodes.insert(
                    node.to_owned(),
                    SharedSeries {
                        device_class: class.name.clone(),
                        node: node.to_owned(),
                        joined: shared.lockspace == LockspaceState::Joined,
                        lease_renewal_failures: fencing.map(|f| f.lease_renewal_failures),
                        fencing_armed: fencing
                            .filter(|_| required)
                            .map(|f| f.watchdog.is_armed() && f.kill_hook),
                    },
                );
            }
        }
        series.extend(nodes.into_values());
    }
    series
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
    shared_volume_handovers: Counter,
    dead_node_pod_deletions: Counter,
    leader: Gauge,
    shared_joined: Family<SharedLabels, Gauge>,
    shared_renewal_failures: Family<SharedLabels, Gauge>,
    shared_fencing_armed: Family<SharedLabels, Gauge>,
    /// Per `LVMCluster` (namespace, name), the shared series last set, so that those of nodes and
    /// classes no longer reported are removed.
    shared_set: Mutex<BTreeMap<(String, String), BTreeSet<SharedLabels>>>,
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
        let mut registry = Registry::default();
        let operator = registry.sub_registry_with_prefix("lvms_operator");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        operator.register(
            "reconciles",
            "Reconciles by controller and result",
            reconciles.clone(),
        );
        let reconcile_duration =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                duration_histogram,
            );
        operator.register(
            "reconcile_duration_seconds",
            "How long reconciles took",
            reconcile_duration.clone(),
        );
        let cluster_ready = Family::<ClusterLabels, Gauge>::default();
        operator.register(
            "lvmcluster_ready",
            "1 while the LVMCluster's status says ready",
            cluster_ready.clone(),
        );
        let cluster_state = Family::<ClusterStateLabels, Gauge>::default();
        operator.register(
            "lvmcluster_state",
            "1 for the LVMCluster's current state, 0 for the others",
            cluster_state.clone(),
        );
        let webhook_requests = Family::<WebhookLabels, Counter>::default();
        operator.register(
            "webhook_requests",
            "Admission reviews by operation and result",
            webhook_requests.clone(),
        );
        let node_cleanups = Counter::default();
        operator.register(
            "node_cleanups",
            "Nodes that no longer exist whose node status and cleanup finalizers were released",
            node_cleanups.clone(),
        );
        let shared_volume_handovers = Counter::default();
        operator.register(
            "shared_volume_handovers",
            "LogicalVolumes of shared device classes handed from a node that is gone or out of \
             service to another node of the class",
            shared_volume_handovers.clone(),
        );
        let dead_node_pod_deletions = Counter::default();
        operator.register(
            "dead_node_pod_deletions",
            "Pods deleted from nodes that are not Ready and whose sanlock lease another node counts \
             dead in a shared class with fencing armed, so they run elsewhere",
            dead_node_pod_deletions.clone(),
        );
        let eviction_claim_deletions = Counter::default();
        operator.register(
            "eviction_claim_deletions",
            "StatefulSet claims the eviction controller deleted because their node was gone, out of \
             service or cordoned",
            eviction_claim_deletions.clone(),
        );
        let leader = Gauge::default();
        operator.register(
            "leader",
            "1 while this replica leads (runs the controllers), 0 while it stands by",
            leader.clone(),
        );
        let shared = registry.sub_registry_with_prefix("lvms");
        let shared_joined = Family::<SharedLabels, Gauge>::default();
        shared.register(
            "shared_lockspace_joined",
            "1 while the node reports the shared class's lockspace Joined",
            shared_joined.clone(),
        );
        let shared_renewal_failures = Family::<SharedLabels, Gauge>::default();
        shared.register(
            "shared_lease_renewal_failures",
            "1 while the node's last lease renewal in the shared class's lockspace failed, else 0",
            shared_renewal_failures.clone(),
        );
        let shared_fencing_armed = Family::<SharedLabels, Gauge>::default();
        shared.register(
            "shared_fencing_armed",
            "1 when the node's watchdog is armed and the kill hook configured for the shared class",
            shared_fencing_armed.clone(),
        );
        Self {
            leader,
            registry,
            reconciles,
            reconcile_duration,
            cluster_ready,
            cluster_state,
            webhook_requests,
            node_cleanups,
            shared_volume_handovers,
            dead_node_pod_deletions,
            eviction_claim_deletions,
            shared_joined,
            shared_renewal_failures,
            shared_fencing_armed,
            shared_set: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sets the `lvms_shared_*` gauges of the `LVMCluster` `namespace/name` to `series` and
    /// removes those it set before that `series` no longer has.
    pub fn shared_status(&self, namespace: &str, name: &str, series: &[SharedSeries]) {
        let mut now = BTreeSet::new();
        for s in series {
            let labels = SharedLabels {
                device_class: s.device_class.clone(),
                node: s.node.clone(),
            };
            self.shared_joined
                .get_or_create(&labels)
                .set(i64::from(s.joined));
            match s.lease_renewal_failures {
                Some(n) => {
                    self.shared_renewal_failures.get_or_create(&labels).set(n);
                }
                None => {
                    self.shared_renewal_failures.remove(&labels);
                }
            }
            match s.fencing_armed {
                Some(armed) => {
                    self.shared_fencing_armed
                        .get_or_create(&labels)
                        .set(i64::from(armed));
                }
                None => {
                    self.shared_fencing_armed.remove(&labels);
                }
            }
            now.insert(labels);
        }
        let before = self
            .shared_set
            .lock()
            .map(|mut set| set.insert((namespace.to_owned(), name.to_owned()), now.clone()))
            .ok()
            .flatten()
            .unwrap_or_default();
        for gone in before.difference(&now) {
            self.remove_shared(gone);
        }
    }

    fn remove_shared(&self, labels: &SharedLabels) {
        self.shared_joined.remove(labels);
        self.shared_renewal_failures.remove(labels);
        self.shared_fencing_armed.remove(labels);
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
        let shared = self
            .shared_set
            .lock()
            .map(|mut set| set.remove(&(namespace.to_owned(), name.to_owned())))
            .ok()
            .flatten()
            .unwrap_or_default();
        for labels in &shared {
            self.remove_shared(labels);
        }
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

    /// This replica leads (or stands by).
    pub fn leading(&self, yes: bool) {
        self.leader.set(i64::from(yes));
    }

    /// Counts nodes whose leftovers were released.
    pub fn node_cleanups(&self, nodes: u64) {
        self.node_cleanups.inc_by(nodes);
    }

    /// Counts volumes handed to another node of their shared class.
    pub fn shared_volume_handovers(&self, volumes: u64) {
        self.shared_volume_handovers.inc_by(volumes);
    }

    /// Counts pods deleted from nodes dead in a fenced shared class.
    pub fn dead_node_pod_deletions(&self, pods: u64) {
        self.dead_node_pod_deletions.inc_by(pods);
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
    standing_by: Arc<AtomicBool>,
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

    /// This replica stands by (another leads, [`lvms_k8s::leader`]) or not: a standby runs no
    /// controller, so it is ready once its webhook listens.
    pub fn standing_by(&self, yes: bool) {
        self.standing_by.store(yes, Ordering::Release);
    }

    /// The webhook listens.
    pub fn webhook_listening(&self) {
        self.webhook.store(true, Ordering::Release);
    }

    /// What is still awaited, in words; empty when ready.
    pub fn waiting_for(&self) -> Vec<&'static str> {
        let mut waiting = Vec::new();
        if !self.controller.load(Ordering::Acquire) && !self.standing_by.load(Ordering::Acquire) {
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
    async fn a_standby_is_ready_once_its_webhook_listens_and_a_new_leader_once_its_cache_synced() {
        let readiness = Readiness::default();
        let router = router(Arc::new(Metrics::new()), readiness.clone());
        readiness.standing_by(true);
        let (code, body) = get(router.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("cache"), "{body}");
        readiness.webhook_listening();
        assert_eq!(get(router.clone(), "/readyz").await.0, StatusCode::OK);
        // Leading: the controller's cache is awaited again.
        readiness.standing_by(false);
        let (code, body) = get(router.clone(), "/readyz").await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("the LVMCluster cache to sync"), "{body}");
        readiness.controller_synced();
        assert_eq!(get(router, "/readyz").await.0, StatusCode::OK);
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
        metrics.leading(true);
        metrics.shared_volume_handovers(3);
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
            "lvms_operator_leader 1",
            "lvms_operator_shared_volume_handovers_total 3",
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

    fn shared_cluster(watchdog: Option<WatchdogPolicy>) -> LVMCluster {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
            "metadata": {"name": "c", "namespace": "lvms"},
            "spec": {"storage": {"deviceClasses": [
                {"name": "san", "deviceAccessPolicy": "shared",
                 "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
                 "sharedConfig": {"watchdog": watchdog}},
                {"name": "local", "deviceSelector": {"paths": ["/dev/sdb"]}}
            ]}}
        }))
        .unwrap()
    }

    fn node_status(node: &str, vgs: serde_json::Value) -> LVMVolumeGroupNodeStatus {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": "lvms"},
            "spec": {"nodeStatus": vgs}
        }))
        .unwrap()
    }

    fn statuses() -> Vec<LVMVolumeGroupNodeStatus> {
        let fencing = |watchdog: &str, hook: bool, failures: i64| {
            serde_json::json!({"watchdog": watchdog, "killHook": hook,
                               "leaseRenewalFailures": failures})
        };
        vec![
            node_status(
                "n2",
                serde_json::json!([{"name": "san", "shared": {"lockspace": "Joining",
                    "fencing": fencing("Missing", true, 0)}}]),
            ),
            node_status(
                "n1",
                serde_json::json!([
                    {"name": "san", "shared": {"lockspace": "Joined",
                     "fencing": fencing("Softdog", true, 3)}},
                    {"name": "local", "shared": {"lockspace": "Joined"}}
                ]),
            ),
            node_status(
                "n3",
                serde_json::json!([{"name": "san", "shared": {"lockspace": "Joined",
                    "fencing": fencing("Armed", false, 0)}}]),
            ),
            // An older node agent: no fencing.
            node_status(
                "n4",
                serde_json::json!([{"name": "san", "shared": {"lockspace": "Joined"}}]),
            ),
            // Reports the class without a shared sub-status: no series.
            node_status("n5", serde_json::json!([{"name": "san"}])),
        ]
    }

    fn series(
        node: &str,
        joined: bool,
        failures: Option<i64>,
        armed: Option<bool>,
    ) -> SharedSeries {
        SharedSeries {
            device_class: "san".into(),
            node: node.into(),
            joined,
            lease_renewal_failures: failures,
            fencing_armed: armed,
        }
    }

    #[test]
    fn shared_series_are_every_nodes_report_of_each_shared_class_in_node_order() {
        assert_eq!(
            shared_series(&shared_cluster(None), &statuses()),
            [
                series("n1", true, Some(3), Some(true)),
                series("n2", false, Some(0), Some(false)),
                series("n3", true, Some(0), Some(false)),
                series("n4", true, None, None),
            ]
        );
    }

    #[test]
    fn fencing_armed_is_not_exported_when_the_admin_disabled_fencing() {
        let all = shared_series(&shared_cluster(Some(WatchdogPolicy::Disabled)), &statuses());
        assert!(all.iter().all(|s| s.fencing_armed.is_none()), "{all:?}");
        assert_eq!(all[0].lease_renewal_failures, Some(3));
    }

    #[test]
    fn shared_gauges_are_exported_and_those_no_longer_reported_removed() {
        let metrics = Metrics::new();
        let all = shared_series(&shared_cluster(None), &statuses());
        metrics.shared_status("lvms", "c", &all);
        let body = metrics.encode();
        for line in [
            r#"lvms_shared_lockspace_joined{device_class="san",node="n1"} 1"#,
            r#"lvms_shared_lockspace_joined{device_class="san",node="n2"} 0"#,
            r#"lvms_shared_lease_renewal_failures{device_class="san",node="n1"} 3"#,
            r#"lvms_shared_fencing_armed{device_class="san",node="n1"} 1"#,
            r#"lvms_shared_fencing_armed{device_class="san",node="n2"} 0"#,
            r#"lvms_shared_fencing_armed{device_class="san",node="n3"} 0"#,
            r#"lvms_shared_lockspace_joined{device_class="san",node="n4"} 1"#,
        ] {
            assert!(
                body.lines().any(|l| l == line),
                "missing {line:?} in\n{body}"
            );
        }
        assert!(
            !body.contains(r#"lvms_shared_fencing_armed{device_class="san",node="n4"}"#),
            "{body}"
        );
        assert!(!body.contains(r#"node="n5""#), "{body}");
        assert!(!body.contains(r#"device_class="local""#), "{body}");

        // n2 is gone and n1 stops reporting fencing.
        metrics.shared_status(
            "lvms",
            "c",
            &[series("n1", true, None, None), all[2].clone()],
        );
        let body = metrics.encode();
        assert!(!body.contains(r#"node="n2""#), "{body}");
        assert!(
            !body.contains(r#"lvms_shared_lease_renewal_failures{device_class="san",node="n1"}"#),
            "{body}"
        );
        assert!(
            body.contains(r#"lvms_shared_lockspace_joined{device_class="san",node="n3"} 1"#),
            "{body}"
        );

        metrics.cluster_deleted("lvms", "c");
        assert!(
            !metrics.encode().contains("lvms_shared_"),
            "the cluster's series go with it"
        );
    }
}
