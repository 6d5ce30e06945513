//! What the Kubernetes roles share beside the API types (`lvms-api`): the node agent (`lvms-node`) and
//! the CSI controller on Kubernetes (`lvms-csi-controller`) both collect garbage and serve metrics,
//! and every role with a reconciler (those two and the operator) runs it the same way.
//!
//! - [`lease`]: a Lease one holder at a time holds (a shared class's creator, a controller's leader);
//! - [`leader`]: leader election over such a Lease for what must run once per cluster;
//! - [`gc`]: the garbage collectors' Kubernetes side (PersistentVolumes' handles, Warning events);
//! - [`metrics`]: their Prometheus metrics (and the node's storage numbers) on `/metrics`;
//! - [`reconciler`]: the event recorder and the run loop every reconciler shares;
//! - [`client`]: the API client each role makes, named in the API server's audit log.
#![forbid(unsafe_code)]

/// A client from the environment (in-cluster, or `KUBECONFIG`), whose requests carry the user
/// agent `lvms-<role>/<version>`: the audit log then tells the operator from the CSI controller,
/// which share a ServiceAccount, and both from their sidecars (kube-rs sends no user agent of
/// its own).
pub async fn client(role: &str) -> Result<kube::Client, kube::Error> {
    let mut config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    config.headers.push((
        http::header::USER_AGENT,
        user_agent(role)
            .parse()
            .map_err(|e: http::header::InvalidHeaderValue| kube::Error::Service(Box::new(e)))?,
    ));
    kube::Client::try_from(config)
}

/// `lvms-<role>/<version>`.
fn user_agent(role: &str) -> String {
    format!("lvms-{role}/{}", env!("CARGO_PKG_VERSION"))
}

pub mod finalizers;
pub mod gc;
pub mod leader;
pub mod lease;
pub mod metrics;
pub mod reconciler;
