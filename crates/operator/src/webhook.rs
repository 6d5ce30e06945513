//! The `LVMCluster` admission webhook's HTTP layer: `admission.k8s.io/v1` AdmissionReview in,
//! AdmissionReview out, over HTTPS. The rules themselves are pure functions in
//! [`lvms_core::webhook`]; this module decodes the request, gathers the [`Context`] (the operator's
//! namespace and the LVMClusters that already exist) and encodes the answer.
//!
//! - `POST` [`VALIDATE_PATH`]: CREATE runs [`validate_create`], UPDATE runs [`validate_update`]
//!   (old, new), DELETE and CONNECT are allowed. When a shared device class asks for its devices
//!   to be wiped (rule 38), the `LVMVolumeGroupNodeStatus` objects in the operator's namespace are
//!   listed to learn which shared volume groups exist
//!   ([`lvms_core::webhook::existing_shared_volume_groups`]). A denial has `allowed: false` and a
//!   `status.message` listing every [`lvms_core::webhook::FieldError`] as `field: message`, joined
//!   by `"; "`, with code 403 (what controller-runtime, and so LVMS, answers). The rules' warnings
//!   are returned as `warnings` on allowed and denied answers alike.
//! - `POST` [`MUTATE_PATH`]: on CREATE, the JSONPatch from [`mutate_on_create`]
//!   (`patchType: JSONPatch`); nothing otherwise.
//! - `GET /healthz`, `GET /readyz`: 200 `ok`, on the same router and so on the same HTTPS port
//!   (kubelet's HTTPS probes do not verify the certificate). [`health_router`] holds them alone,
//!   for a caller that wants them on a plain-HTTP port as well.
//!
//! A body that is not an AdmissionReview is answered 400 with the reason. A review whose object
//! does not deserialise as an `LVMCluster` is denied with the parse error; the handlers never
//! answer 500 and never panic. If the existing LVMClusters cannot be listed, a CREATE is denied
//! (fail closed: the "only one LVMCluster" rule cannot be checked), saying why; likewise a review
//! that needs the node statuses when they cannot be listed.
//!
//! TLS: [`serve_tls`] serves the router with rustls (ring provider) from a PEM certificate chain
//! and key, as mounted from a Secret, and re-reads both files every [`CERT_RELOAD_INTERVAL`]:
//! when their contents change the new pair is used for new connections; a pair that does not load
//! is logged and the previous one kept.

use std::{
    future::Future,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{DefaultBodyLimit, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::{get, post},
};
use axum_server::tls_rustls::RustlsConfig;
use base64::Engine as _;
use futures::future::BoxFuture;
use kube::{
    Api, Client, ResourceExt,
    api::ListParams,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
        response::Status,
    },
};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus};
use lvms_core::webhook::{
    Context, Review, existing_shared_volume_groups, mutate_on_create,
    needs_existing_shared_volume_groups, validate_create, validate_update,
};
use rustls::{
    ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
};
use serde_json::Value;

use crate::metrics::{Metrics, Readiness};

/// The validating webhook's path, as LVMS serves it.
pub const VALIDATE_PATH: &str = "/validate-lvm-topolvm-io-v1alpha1-lvmcluster";
/// The mutating webhook's path, as LVMS serves it.
pub const MUTATE_PATH: &str = "/mutate-lvm-topolvm-io-v1alpha1-lvmcluster";
/// How often [`serve_tls`] re-reads the certificate and key files.
pub const CERT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// Largest request body accepted: an AdmissionReview carries the object and the old object, each
/// up to etcd's 1.5 MiB limit, plus the envelope.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// How long in-flight requests may finish after shutdown is requested.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Errors of the webhook server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A certificate or key file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate chain or key is not usable.
    #[error("invalid TLS certificate or key: {0}")]
    Tls(String),
    /// Binding or serving failed.
    #[error("serving the admission webhook on {addr}: {source}")]
    Serve {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// `Result` with the webhook server's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads what the rules need from the API server: the LVMClusters that exist (the "only one
/// LVMCluster" rule) and the nodes' `LVMVolumeGroupNodeStatus` objects (rule 38).
pub trait ClusterLister: Send + Sync {
    /// `namespace/name` of every LVMCluster, or why they cannot be listed.
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>>;

    /// The `LVMVolumeGroupNodeStatus` objects in `namespace`, or why they cannot be listed.
    fn node_statuses<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LVMVolumeGroupNodeStatus>, String>>;
}

/// A fixed list of LVMClusters and no node statuses (tests, or a cluster-less setup).
impl ClusterLister for Vec<String> {
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        let clusters = self.clone();
        Box::pin(async move { Ok(clusters) })
    }

    fn node_statuses<'a>(
        &'a self,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LVMVolumeGroupNodeStatus>, String>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Lists LVMClusters in all namespaces, and node statuses in one, through the API server.
struct KubeClusterLister {
    api: Api<LVMCluster>,
}

impl ClusterLister for KubeClusterLister {
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let list = self
                .api
                .list_metadata(&ListParams::default())
                .await
                .map_err(|e| format!("listing LVMClusters: {e}"))?;
            Ok(list
                .items
                .iter()
                .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
                .collect())
        })
    }

    fn node_statuses<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LVMVolumeGroupNodeStatus>, String>> {
        Box::pin(async move {
            let api: Api<LVMVolumeGroupNodeStatus> =
                Api::namespaced(self.api.clone().into_client(), namespace);
            let list = api
                .list(&ListParams::default())
                .await
                .map_err(|e| format!("listing LVMVolumeGroupNodeStatuses in {namespace}: {e}"))?;
            Ok(list.items)
        })
    }
}

/// A [`ClusterLister`] backed by the API server (LVMClusters in all namespaces, so a duplicate in
/// another namespace counts too; needs `list` on `lvmclusters` cluster-wide, and on
/// `lvmvolumegroupnodestatuses` in the operator's namespace).
pub fn kube_cluster_lister(client: Client) -> Arc<dyn ClusterLister> {
    Arc::new(KubeClusterLister {
        api: Api::all(client),
    })
}

/// What the handlers need.
#[derive(Clone)]
pub struct WebhookState {
    /// The namespace the operator runs in; LVMClusters must live there.
    pub operator_namespace: String,
    /// The LVMClusters that exist.
    pub clusters: Arc<dyn ClusterLister>,
    /// Counts the reviews.
    pub metrics: Arc<Metrics>,
}

impl WebhookState {
    /// State for the operator in `operator_namespace`, seeing existing clusters through `clusters`.
    pub fn new(operator_namespace: impl Into<String>, clusters: Arc<dyn ClusterLister>) -> Self {
        Self {
            operator_namespace: operator_namespace.into(),
            clusters,
            metrics: Arc::new(Metrics::new()),
        }
    }

    /// The same state, counting reviews in `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
}

impl std::fmt::Debug for WebhookState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookState")
            .field("operator_namespace", &self.operator_namespace)
            .finish_non_exhaustive()
    }
}

/// The webhook's routes: [`VALIDATE_PATH`], [`MUTATE_PATH`], `/healthz` and `/readyz`.
pub fn router(state: WebhookState) -> Router {
    Router::new()
        .route(VALIDATE_PATH, post(validate))
        .route(MUTATE_PATH, post(mutate))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
        .merge(health_router())
}

/// `/healthz` and `/readyz`, answering 200 `ok`.
pub fn health_router() -> Router {
    Router::new()
        .route("/healthz", get(ok))
        .route("/readyz", get(ok))
}

async fn ok() -> &'static str {
    "ok"
}

/// A decoded request: the envelope, and the objects parsed as LVMClusters (or why they do not
/// parse).
struct Decoded {
    request: AdmissionRequest<DynamicObject>,
    object: Option<Result<LVMCluster, String>>,
    old_object: Option<Result<LVMCluster, String>>,
}

/// Decodes an AdmissionReview, leaving the objects to be parsed separately so that an object that
/// is not an LVMCluster is denied rather than rejected as a bad request.
fn decode(body: &[u8]) -> Result<Decoded, String> {
    let mut value: Value =
        serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let mut take = |key: &str| {
        value
            .get_mut("request")
            .and_then(Value::as_object_mut)
            .and_then(|r| r.remove(key))
            .filter(|v| !v.is_null())
    };
    let object = take("object");
    let old_object = take("oldObject");
    let review: AdmissionReview<DynamicObject> = serde_json::from_value(value)
        .map_err(|e| format!("the body is not an admission.k8s.io/v1 AdmissionReview: {e}"))?;
    let request: AdmissionRequest<DynamicObject> = review
        .try_into()
        .map_err(|_| "the AdmissionReview has no request".to_owned())?;
    // The error names the field, as `spec.storage.deviceClasses[0].fstype: unknown variant ...`.
    let parse = |v: Value| {
        serde_path_to_error::deserialize::<_, LVMCluster>(v).map_err(|e| {
            format!(
                "the object is not a valid LVMCluster: {}: {}",
                e.path(),
                e.inner()
            )
        })
    };
    Ok(Decoded {
        request,
        object: object.map(parse),
        old_object: old_object.map(parse),
    })
}

fn bad_request(message: String) -> Response {
    tracing::warn!(%message, "rejecting a malformed admission request");
    (StatusCode::BAD_REQUEST, message).into_response()
}

/// The AdmissionReview answer. kube serialises `patch` (bytes) as an array of numbers, which the
/// API server happens to accept; it is rewritten as the base64 string `admission.k8s.io/v1`
/// specifies (Go's `[]byte` encoding), as every other webhook sends it.
fn respond(response: AdmissionResponse) -> Response {
    let patch = response.patch.clone();
    let mut review = match serde_json::to_value(response.into_review()) {
        Ok(review) => review,
        Err(e) => {
            // Unreachable in practice: the types serialise infallibly.
            let message = format!("cannot encode the AdmissionReview: {e}");
            return (StatusCode::INTERNAL_SERVER_ERROR, message).into_response();
        }
    };
    if let (Some(patch), Some(answer)) = (
        patch,
        review.get_mut("response").and_then(Value::as_object_mut),
    ) {
        answer.insert(
            "patch".to_owned(),
            Value::String(base64::engine::general_purpose::STANDARD.encode(patch)),
        );
    }
    Json(review).into_response()
}

fn deny(response: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut response = response.deny(&message);
    response.result = Status::failure(&message, "Forbidden").with_code(403);
    response
}

/// The object under review, or why the request is denied: it is missing or not an LVMCluster.
fn require(object: Option<Result<LVMCluster, String>>, what: &str) -> Result<LVMCluster, String> {
    object.unwrap_or_else(|| Err(format!("the request has no {what}")))
}

#[tracing::instrument(skip_all)]
async fn validate(State(state): State<WebhookState>, body: Bytes) -> Response {
    let decoded = match decode(&body) {
        Ok(decoded) => decoded,
        Err(message) => {
            state.metrics.webhook_request("validate", "error");
            return bad_request(message);
        }
    };
    let response = review_validation(&state, decoded).await;
    count(&state, "validate", &response);
    respond(response)
}

fn count(state: &WebhookState, operation: &str, response: &AdmissionResponse) {
    let result = if response.allowed {
        "allowed"
    } else {
        "denied"
    };
    state.metrics.webhook_request(operation, result);
}

async fn review_validation(state: &WebhookState, decoded: Decoded) -> AdmissionResponse {
    let request = &decoded.request;
    let base = AdmissionResponse::from(request);
    let mut ctx = Context {
        operator_namespace: state.operator_namespace.clone(),
        ..Context::default()
    };
    let review = match request.operation {
        Operation::Create => {
            let mut new = match require(decoded.object, "object") {
                Ok(new) => new,
                Err(e) => return deny(base, e),
            };
            // The namespace may be given only in the request's URL.
            if new.metadata.namespace.is_none() {
                new.metadata.namespace.clone_from(&request.namespace);
            }
            if let Err(e) = fill_shared_volume_groups(state, &new, &mut ctx).await {
                return deny(base, e);
            }
            ctx.other_clusters = match state.clusters.list().await {
                Ok(clusters) => {
                    let this =
                        format!("{}/{}", new.namespace().unwrap_or_default(), new.name_any());
                    clusters.into_iter().filter(|c| *c != this).collect()
                }
                Err(e) => {
                    return deny(
                        base,
                        format!(
                            "cannot check that no other LVMCluster exists ({e}); retry once the \
                             operator can list LVMClusters"
                        ),
                    );
                }
            };
            validate_create(&new, &ctx)
        }
        Operation::Update => {
            let new = match require(decoded.object, "object") {
                Ok(new) => new,
                Err(e) => return deny(base, e),
            };
            let old = match require(decoded.old_object, "oldObject") {
                Ok(old) => old,
                Err(e) => return deny(base, e),
            };
            if old.spec != new.spec
                && let Err(e) = fill_shared_volume_groups(state, &new, &mut ctx).await
            {
                return deny(base, e);
            }
            validate_update(&old, &new, &ctx)
        }
        Operation::Delete | Operation::Connect => Review::default(),
    };
    tracing::debug!(
        uid = %request.uid,
        name = %request.name,
        operation = ?request.operation,
        allowed = review.allowed(),
        errors = review.errors.len(),
        warnings = review.warnings.len(),
        "validated LVMCluster"
    );
    answer(base, review)
}

/// Fills [`Context::existing_shared_volume_groups`] from the node statuses in the operator's
/// namespace when `cluster` needs it (a shared class that wipes its devices); the denial message
/// when they cannot be listed (fail closed: wiping an existing shared volume group destroys it).
async fn fill_shared_volume_groups(
    state: &WebhookState,
    cluster: &LVMCluster,
    ctx: &mut Context,
) -> Result<(), String> {
    if !needs_existing_shared_volume_groups(cluster) {
        return Ok(());
    }
    let statuses = state
        .clusters
        .node_statuses(&state.operator_namespace)
        .await
        .map_err(|e| {
            format!(
                "cannot check whether the shared volume groups to be wiped exist already ({e}); retry                  once the operator can list LVMVolumeGroupNodeStatuses"
            )
        })?;
    ctx.existing_shared_volume_groups = existing_shared_volume_groups(&statuses);
    Ok(())
}

/// Turns the rules' [`Review`] into the response.
fn answer(base: AdmissionResponse, review: Review) -> AdmissionResponse {
    let mut response = if review.allowed() {
        base
    } else {
        let message = review
            .errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ");
        deny(base, message)
    };
    if !review.warnings.is_empty() {
        response.warnings = Some(review.warnings);
    }
    response
}

#[tracing::instrument(skip_all)]
async fn mutate(State(state): State<WebhookState>, body: Bytes) -> Response {
    let decoded = match decode(&body) {
        Ok(decoded) => decoded,
        Err(message) => {
            state.metrics.webhook_request("mutate", "error");
            return bad_request(message);
        }
    };
    let response = review_mutation(decoded);
    count(&state, "mutate", &response);
    respond(response)
}

fn review_mutation(decoded: Decoded) -> AdmissionResponse {
    let base = AdmissionResponse::from(&decoded.request);
    if decoded.request.operation != Operation::Create {
        return base;
    }
    // An object that does not parse is left as it is: the API server's schema validation, which
    // runs after mutation, refuses it naming the field and the allowed values, and the validating
    // webhook would too. Denying it here would give the user a message without them.
    let cluster = match require(decoded.object, "object") {
        Ok(cluster) => cluster,
        Err(e) => {
            tracing::info!(reason = %e, "not mutating an object that does not parse");
            return base;
        }
    };
    let operations = mutate_on_create(&cluster);
    if operations.is_empty() {
        return base;
    }
    let patch = match serde_json::from_value::<json_patch::Patch>(Value::Array(operations)) {
        Ok(patch) => patch,
        Err(e) => return deny(base, format!("internal error building the patch: {e}")),
    };
    match base.clone().with_patch(patch) {
        Ok(response) => response,
        Err(e) => deny(base, format!("internal error encoding the patch: {e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

/// Builds a rustls server configuration (ring provider, HTTP/1.1) from PEM data.
pub(crate) fn server_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig> {
    let tls = |what: &str, e: &dyn std::fmt::Display| Error::Tls(format!("{what}: {e}"));
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls("reading the certificate chain", &e))?;
    if chain.is_empty() {
        return Err(Error::Tls(
            "the certificate file holds no CERTIFICATE block".to_owned(),
        ));
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| tls("reading the private key", &e))?;
    let mut config =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| tls("choosing protocol versions", &e))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| tls("using the certificate and key", &e))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

async fn read(path: &Path) -> Result<Vec<u8>> {
    tokio::fs::read(path).await.map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// Serves `router` over HTTPS on `addr` with the PEM certificate chain and key at `cert_path` and
/// `key_path`, re-read every [`CERT_RELOAD_INTERVAL`], until `shutdown` completes (then in-flight
/// requests get a grace period). Fails at once if the pair does not load. `readiness` learns when
/// the webhook listens with a loaded certificate.
pub async fn serve_tls(
    addr: SocketAddr,
    cert_path: impl AsRef<Path>,
    key_path: impl AsRef<Path>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    readiness: Readiness,
) -> Result<()> {
    let listener = std::net::TcpListener::bind(addr).map_err(|source| Error::Serve {
        addr: addr.to_string(),
        source,
    })?;
    serve(
        listener,
        cert_path.as_ref(),
        key_path.as_ref(),
        router,
        shutdown,
        CERT_RELOAD_INTERVAL,
        Some(readiness),
    )
    .await
}

/// [`serve_tls`] on a bound listener, re-reading the files every `reload_interval`.
pub async fn serve_tls_on(
    listener: std::net::TcpListener,
    cert_path: &Path,
    key_path: &Path,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    reload_interval: Duration,
) -> Result<()> {
    serve(
        listener,
        cert_path,
        key_path,
        router,
        shutdown,
        reload_interval,
        None,
    )
    .await
}

async fn serve(
    listener: std::net::TcpListener,
    cert_path: &Path,
    key_path: &Path,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    reload_interval: Duration,
    readiness: Option<Readiness>,
) -> Result<()> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "?".to_owned(), |a| a.to_string());
    let serve_error = |source| Error::Serve {
        addr: addr.clone(),
        source,
    };
    let mut loaded = (read(cert_path).await?, read(key_path).await?);
    let config = RustlsConfig::from_config(Arc::new(server_config(&loaded.0, &loaded.1)?));
    listener.set_nonblocking(true).map_err(serve_error)?;
    let server = axum_server::from_tcp_rustls(listener, config.clone()).map_err(serve_error)?;

    let handle = axum_server::Handle::new();
    let reloader = {
        let (cert_path, key_path) = (cert_path.to_owned(), key_path.to_owned());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let current = match (read(&cert_path).await, read(&key_path).await) {
                    (Ok(cert), Ok(key)) => (cert, key),
                    (Err(e), _) | (_, Err(e)) => {
                        tracing::warn!(error = %e, "keeping the current TLS certificate");
                        continue;
                    }
                };
                if current == loaded {
                    continue;
                }
                match server_config(&current.0, &current.1) {
                    Ok(new) => {
                        config.reload_from_config(Arc::new(new));
                        tracing::info!(cert = %cert_path.display(), "reloaded the TLS certificate");
                        loaded = current;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "keeping the current TLS certificate");
                    }
                }
            }
        })
    };
    let stopper = {
        let handle = handle.clone();
        tokio::spawn(async move {
            shutdown.await;
            handle.graceful_shutdown(Some(SHUTDOWN_GRACE));
        })
    };
    tracing::info!(%addr, "serving the admission webhook");
    if let Some(readiness) = readiness {
        readiness.webhook_listening();
    }
    let served = server
        .handle(handle)
        .serve(router.into_make_service())
        .await
        .map_err(serve_error);
    reloader.abort();
    stopper.abort();
    served
}

#[cfg(test)]
mod tests;
