//! The lvms-rs CSI driver (spec package `csi.v1`, vendored in `lvms-csi-proto`): the gRPC services
//! over the volume engine (`lvms-engine`).
//!
//! - [`identity`]: plugin info, capabilities, `Probe` (ready once the node's classes are converged);
//! - [`controller`]: volumes, snapshots, clones, expansion, capacity, over a
//!   [`lvms_engine::backend::Backend`];
//! - [`node`]: stage/publish (mount and block), stats, expansion, on this node;
//! - [`snapshot_metadata`]: changed-block tracking (allocated and changed ranges of thin
//!   snapshots);
//! - [`remote`]: the node agent's SnapshotMetadata service over TCP with mutual TLS;
//! - [`server`]: all of it on a Unix socket; [`params`]: StorageClass-style parameters.
#![forbid(unsafe_code)]

pub mod controller;
pub mod identity;
pub mod node;
pub mod params;
pub mod remote;
pub mod server;
pub mod snapshot_metadata;

pub use lvms_csi_proto::v1 as csi;

/// The driver name when none is configured: what LVMS clusters and their StorageClasses use.
pub const DEFAULT_DRIVER_NAME: &str = "topolvm.io";
/// The topology key of the node a volume lives on.
pub const TOPOLOGY_NODE_KEY: &str = "topology.topolvm.io/node";
/// The message of an error and its causes, each once, joined with ": " (what a gRPC status says).
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// Volume context key naming the device class.
pub const DEVICE_CLASS_KEY: &str = "topolvm.io/device-class";
