//! The operator's pure planning logic: from an `LVMCluster` (the spec) and what the operator observed
//! in the cluster to what should exist. No client, no async: the reconcilers read the world, call
//! these functions, and execute the result with server-side apply (field manager
//! [`lvms_api::OPERATOR_FIELD_MANAGER`]).
//!
//! - [`mod@render`]: the objects an `LVMCluster` stands for (one `LVMVolumeGroup`, `StorageClass` and, for
//!   thin classes, `VolumeSnapshotClass` per device class; the `CSIDriver`; the node `DaemonSet`).
//! - [`status`]: `LVMCluster.status` aggregated from the nodes' `LVMVolumeGroupNodeStatus` reports, and
//!   which nodes each device class selects ([`selector`] holds the Kubernetes matching rules).
//! - [`finalizer`]: when deleting an `LVMCluster` may proceed, and what to clean up after nodes that no
//!   longer exist.
//! - [`eviction`]: when a StatefulSet's claim on a drained or gone node may be deleted so the
//!   StatefulSet makes it anew elsewhere (metal-stack csi-driver-lvm's eviction controller).
//! - [`handover`]: which shared classes' volumes another node answers for when theirs is gone.
//!
//! The planning modules above have no client and no async. [`controller`] is the thin I/O half that
//! executes their plans against the API server (the `LVMCluster` reconciler and its `run` loop);
//! [`host_ids`] keeps the sanlock host-id record of shared classes (the decision is
//! `lvms_core::shared::assign_host_ids`, the write is conditional on what was read).
#![forbid(unsafe_code)]

pub mod certificate;
pub mod controller;
pub mod death;
pub mod eviction;
pub mod finalizer;
pub mod handover;
pub mod host_ids;
pub mod metrics;
pub mod render;
pub use lvms_api::selector;
pub mod status;
pub mod webhook;

/// The Lease whose holder, of the operator's replicas, runs the controllers (the webhook is served
/// by every replica); see [`lvms_k8s::leader`].
pub const LEADER_LEASE: &str = "lvms-operator";

pub use finalizer::{DeletionPlan, NodeCleanup, ObjectKey, cluster_deletion, node_removal};
pub use render::{RenderConfig, RenderError, Rendered, VolumeSnapshotClass, render};
pub use status::{ResourceSync, aggregate, expected_nodes, nodes_for_class};

/// `Result` with the render error.
pub type Result<T, E = RenderError> = std::result::Result<T, E>;
