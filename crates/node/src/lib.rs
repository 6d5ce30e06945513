//! The node agent (`lvms node`): what one node does for the API objects of its storage.
//!
//! - [`logical_volume`]: the pure plan of the `LogicalVolume` reconciler, one step at a time, over the
//!   same [`lvms_engine::backend::Backend`] the standalone driver uses.
//! - [`lv_reconciler`]: its I/O, carrying each step to LVM and to the API server.
//! - [`volume_group`] and [`vg_reconciler`]: each `LVMVolumeGroup` this node serves, through the node
//!   engine, to a volume group (and pool), the node's `LVMVolumeGroupNodeStatus`, and cleanup.
//! - [`creator_lease`]: the Lease that picks the one node which creates a shared volume group.
//! - [`switch`]: the CSI backend that follows the set of ready classes.
//! - [`csi_driver_lvm`]: the view of it that serves csi-driver-lvm's volumes under its name.
//! - [`capacity`]: what each class can still hold, published on the Node for the CSI controller.
//! - [`gc`]: orphaned volumes, reported and (after a safety window, when configured) removed.
//!
//! The collectors' rules are the engine's (`lvms_engine::gc`); their Kubernetes side and the metrics
//! the agent serves are `lvms_k8s`'s.

pub mod capacity;
pub mod creator_lease;
pub mod csi_driver_lvm;
pub use lvms_k8s::finalizers;
pub mod gc;
pub mod logical_volume;
pub mod lv_reconciler;
pub mod metadata_address;
pub mod stage_wait;
pub mod switch;
pub mod vg_reconciler;
pub mod volume_group;
