//! The lvms-rs volume engine: what a volume is and how it is made on this node, under every role
//! that serves volumes (the CSI services of `lvms-csi`, the node agent of `lvms-node`, the
//! standalone driver).
//!
//! - [`backend`]: the `Backend` trait (create, delete, expand, snapshot, capacity) and its types;
//! - [`local`]: the `Backend` that makes volumes with LVM on this node, for local and shared
//!   device classes;
//! - [`ids`]: names, ids and tags on disk; [`locks`]: one operation per volume at a time;
//! - [`gc`]: the garbage collectors' rules: which volumes are orphans and which of them may go.
#![forbid(unsafe_code)]

pub mod backend;
pub mod gc;
pub mod ids;
pub mod local;
pub mod locks;
