//! The CSI controller on Kubernetes (`lvms csi-controller`): the Controller service of the whole cluster.
//! A volume is a `LogicalVolume` object for one node, made by that node's agent (`lvms node`); the
//! controller creates the object and waits, by watching it, for the agent's answer.
//!
//! - [`view`]: the cluster as reflector stores (volumes, nodes and their capacity, classes).
//! - [`backend`]: one node's volumes as a [`lvms_engine::backend::Backend`] over `LogicalVolume`s.
//! - [`service`]: the Controller service, routing each call to the single-node service of the right node.
//! - [`metadata`]: changed-block tracking, forwarded to the node agent holding the snapshots.
//! - [`gc`]: volume `LogicalVolume`s no PersistentVolume refers to, reported and (after a window) removed.
#![forbid(unsafe_code)]

pub mod backend;
pub mod gc;
pub mod metadata;
pub mod service;
pub mod view;
