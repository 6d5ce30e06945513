//! What the Kubernetes roles share beside the API types (`lvms-api`): the node agent (`lvms-node`) and
//! the CSI controller on Kubernetes (`lvms-csi-controller`) both collect garbage and serve metrics.
//!
//! - [`gc`]: the garbage collectors' Kubernetes side (PersistentVolumes' handles, Warning events);
//! - [`metrics`]: their Prometheus metrics (and the node's storage numbers) on `/metrics`.
#![forbid(unsafe_code)]

pub mod gc;
pub mod metrics;
