//! What the Kubernetes roles share beside the API types (`lvms-api`): the node agent (`lvms-node`) and
//! the CSI controller on Kubernetes (`lvms-csi-controller`) both collect garbage and serve metrics,
//! and every role with a reconciler (those two and the operator) runs it the same way.
//!
//! - [`lease`]: a Lease one holder at a time holds (a shared class's creator, a controller's leader);
//! - [`leader`]: leader election over such a Lease for what must run once per cluster;
//! - [`gc`]: the garbage collectors' Kubernetes side (PersistentVolumes' handles, Warning events);
//! - [`metrics`]: their Prometheus metrics (and the node's storage numbers) on `/metrics`;
//! - [`reconciler`]: the event recorder and the run loop every reconciler shares.
#![forbid(unsafe_code)]

pub mod finalizers;
pub mod gc;
pub mod leader;
pub mod lease;
pub mod metrics;
pub mod reconciler;
