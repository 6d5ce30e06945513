//! Deletion decisions, so storage is never orphaned and a gone node never blocks forever.
//!
//! Deleting an `LVMCluster` runs in three steps, each decided by [`cluster_deletion`] from what the
//! reconciler observed:
//! 1. while PVCs use our StorageClasses, or `Retain` PVs of ours remain, nothing is deleted: their
//!    data lives in the volume groups ([`DeletionPlan::Block`]);
//! 2. then the `LVMVolumeGroup`s (and the StorageClasses and VolumeSnapshotClasses) are deleted, and
//!    the operator waits while the node agents wipe their volume groups and remove their
//!    `cleanup.vgmanager.node.topolvm.io/<node>` finalizers ([`DeletionPlan::WaitForNodeCleanup`]);
//! 3. then the rest goes and the `lvmcluster.topolvm.io` finalizer is removed
//!    ([`DeletionPlan::RemoveFinalizer`]).
//!
//! The per-node finalizers are the node agents' to remove. Only for a node that no longer exists
//! does the operator step in: [`node_removal`] says what to release.

use std::collections::{BTreeMap, BTreeSet};

use lvms_api::{
    LVMCLUSTER_FINALIZER, LVMCluster, LVMVolumeGroup, NODE_CLEANUP_FINALIZER_PREFIX,
    node_cleanup_finalizer, node_of_cleanup_finalizer,
};

/// What to do about an `LVMCluster`'s deletion and its `lvmcluster.topolvm.io` finalizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeletionPlan {
    /// Not being deleted, finalizer missing: add it before creating anything.
    AddFinalizer,
    /// Nothing to do: not being deleted and the finalizer is on, or being deleted and our
    /// finalizer is already gone.
    Nothing,
    /// Storage is still in use: delete nothing, keep the finalizer, surface `reason` (event and
    /// status) and retry later.
    Block {
        /// What remains and what to do about it.
        reason: String,
    },
    /// Storage is free: delete the `LVMVolumeGroup`s, StorageClasses and VolumeSnapshotClasses (if
    /// not gone yet), keep the node `DaemonSet` running, and wait for these nodes' agents to clean
    /// up and remove their finalizers.
    WaitForNodeCleanup {
        /// Nodes whose cleanup finalizer is still on an `LVMVolumeGroup`, sorted.
        nodes: Vec<String>,
        /// Which nodes are awaited, in words.
        reason: String,
    },
    /// Every node cleaned up: delete whatever rendered objects remain (the `LVMVolumeGroup`s,
    /// classes, the `CSIDriver`, the `DaemonSet`), then remove the finalizer.
    RemoveFinalizer,
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Decides the next deletion step for `cluster`.
///
/// - `pvcs_using_our_classes`: PersistentVolumeClaims whose StorageClass is one of ours;
/// - `retained_pvs_of_ours`: PersistentVolumes provisioned by our driver with reclaim policy
///   `Retain` (they outlive their claims, and their data is in our volume groups);
/// - `lvmvg_pending_node_finalizers`: the `cleanup.vgmanager.node.topolvm.io/<node>` finalizers
///   still on our `LVMVolumeGroup`s (bare node names are accepted too).
pub fn cluster_deletion(
    cluster: &LVMCluster,
    pvcs_using_our_classes: usize,
    retained_pvs_of_ours: usize,
    lvmvg_pending_node_finalizers: &[String],
) -> DeletionPlan {
    let has_finalizer = cluster
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == LVMCLUSTER_FINALIZER));
    if cluster.metadata.deletion_timestamp.is_none() {
        return if has_finalizer {
            DeletionPlan::Nothing
        } else {
            DeletionPlan::AddFinalizer
        };
    }
    if !has_finalizer {
        return DeletionPlan::Nothing;
    }

    let name = cluster.metadata.name.as_deref().unwrap_or_default();
    let mut remains = Vec::new();
    if pvcs_using_our_classes > 0 {
        let classes: Vec<String> = cluster.spec.storage.storage_class_names().collect();
        remains.push(format!(
            "{} {} the {} {}: delete {} (and the pods using {}) first",
            plural(
                pvcs_using_our_classes,
                "PersistentVolumeClaim",
                "PersistentVolumeClaims"
            ),
            if pvcs_using_our_classes == 1 {
                "still uses"
            } else {
                "still use"
            },
            if classes.len() == 1 {
                "StorageClass"
            } else {
                "StorageClasses"
            },
            classes.join(", "),
            if pvcs_using_our_classes == 1 {
                "it"
            } else {
                "them"
            },
            if pvcs_using_our_classes == 1 {
                "it"
            } else {
                "them"
            },
        ));
    }
    if retained_pvs_of_ours > 0 {
        let one = retained_pvs_of_ours == 1;
        remains.push(format!(
            "{} with reclaim policy Retain {}, and {} data is in the volume groups: delete {} once \
             the data is no longer needed",
            plural(
                retained_pvs_of_ours,
                "PersistentVolume",
                "PersistentVolumes"
            ),
            if one { "remains" } else { "remain" },
            if one { "its" } else { "their" },
            if one { "it" } else { "them" },
        ));
    }
    if !remains.is_empty() {
        return DeletionPlan::Block {
            reason: format!("deleting LVMCluster {name} waits: {}", remains.join("; ")),
        };
    }

    let nodes: BTreeSet<&str> = lvmvg_pending_node_finalizers
        .iter()
        .map(|f| node_of_cleanup_finalizer(f).unwrap_or(f.as_str()))
        .filter(|n| !n.is_empty() && *n != NODE_CLEANUP_FINALIZER_PREFIX)
        .collect();
    if !nodes.is_empty() {
        let nodes: Vec<String> = nodes.into_iter().map(str::to_owned).collect();
        let reason = format!(
            "deleting LVMCluster {name} waits for the vg-manager pods on {} {} to remove their \
             volume groups and their {NODE_CLEANUP_FINALIZER_PREFIX}<node> finalizers; a node that \
             no longer exists is released by the node-removal controller",
            if nodes.len() == 1 { "node" } else { "nodes" },
            nodes.join(", ")
        );
        return DeletionPlan::WaitForNodeCleanup { nodes, reason };
    }
    DeletionPlan::RemoveFinalizer
}

/// A namespaced object's name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Namespace (`None` when unset on the object read).
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// What to release after a node that no longer exists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeCleanup {
    /// The gone node.
    pub node: String,
    /// Delete the node's `LVMVolumeGroupNodeStatus` (named after the node), removing its
    /// `delete-protection.lvm.openshift.io` finalizer first: nobody else will.
    pub delete_node_status: bool,
    /// `LVMVolumeGroup`s to remove [`NodeCleanup::finalizer`] from.
    pub volume_groups: Vec<ObjectKey>,
    /// The node's cleanup finalizer, `cleanup.vgmanager.node.topolvm.io/<node>`.
    pub finalizer: String,
}

/// What to clean up after nodes that no longer exist, sorted by node: their
/// `LVMVolumeGroupNodeStatus` objects (`node_statuses` are their names, which are node names) and
/// their cleanup finalizers on `volume_groups`. Nodes in `existing_nodes` are never touched, even
/// while being deleted: their agents clean up themselves.
///
/// `existing_nodes` must be complete (a synced cache or a fresh list): a node missing from it
/// loses its finalizers, and its volume group is then no longer waited for.
pub fn node_removal(
    existing_nodes: &BTreeSet<String>,
    node_statuses: &[String],
    volume_groups: &[LVMVolumeGroup],
) -> Vec<NodeCleanup> {
    let mut cleanups: BTreeMap<&str, NodeCleanup> = BTreeMap::new();
    for name in node_statuses {
        if let Some(cleanup) = gone_node(&mut cleanups, existing_nodes, name) {
            cleanup.delete_node_status = true;
        }
    }
    for vg in volume_groups {
        let key = ObjectKey {
            namespace: vg.metadata.namespace.clone(),
            name: vg.metadata.name.clone().unwrap_or_default(),
        };
        for finalizer in vg.metadata.finalizers.iter().flatten() {
            let Some(node) = node_of_cleanup_finalizer(finalizer) else {
                continue;
            };
            if let Some(cleanup) = gone_node(&mut cleanups, existing_nodes, node)
                && !cleanup.volume_groups.contains(&key)
            {
                cleanup.volume_groups.push(key.clone());
            }
        }
    }
    cleanups
        .into_values()
        .map(|mut c| {
            c.volume_groups.sort();
            c
        })
        .collect()
}

/// The cleanup entry of `node`, created on first use; `None` for a node that exists.
fn gone_node<'m, 'a>(
    cleanups: &'m mut BTreeMap<&'a str, NodeCleanup>,
    existing_nodes: &BTreeSet<String>,
    node: &'a str,
) -> Option<&'m mut NodeCleanup> {
    if node.is_empty() || existing_nodes.contains(node) {
        return None;
    }
    Some(cleanups.entry(node).or_insert_with(|| NodeCleanup {
        node: node.to_owned(),
        delete_node_status: false,
        volume_groups: Vec::new(),
        finalizer: node_cleanup_finalizer(node),
    }))
}

#[cfg(test)]
mod tests;
