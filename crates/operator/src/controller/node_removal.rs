//! The node-removal controller: the I/O half of [`crate::finalizer::node_removal`]. A node that is
//! deleted from the cluster takes its vg-manager pod with it, so nobody would ever delete its
//! `LVMVolumeGroupNodeStatus` or remove its `cleanup.vgmanager.node.topolvm.io/<node>` finalizers
//! from the `LVMVolumeGroup`s, and deleting the `LVMCluster` would wait forever.
//!
//! A pass lists the Nodes (fresh, so the list is complete), the node statuses and the volume groups
//! in the operator's namespace, plans, and executes: each finalizer is removed with a JSON merge
//! patch carrying the observed `resourceVersion` (a concurrent change makes it fail with 409, and
//! the next pass works from fresh data); the node status loses its
//! `delete-protection.lvm.openshift.io` finalizer the same way and is then deleted. A pass runs at
//! start, whenever a Node deletion is seen, and every [`NODE_REMOVAL_INTERVAL`].

use std::{collections::BTreeSet, future::Future, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::{
    Client, ResourceExt,
    api::{Api, ListParams, PartialObjectMeta, Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        watcher::{self, watcher},
    },
};
use lvms_api::{LVMVolumeGroup, LVMVolumeGroupNodeStatus, NODE_STATUS_FINALIZER};
use tracing::{info, warn};

use super::{Result, delete, kube_err};
use crate::{
    finalizer::{NodeCleanup, node_removal},
    metrics::Metrics,
};

/// The `controller` label of this controller's metrics.
pub const NODE_REMOVAL_CONTROLLER: &str = "node-removal";
/// How often a pass runs without a Node deletion to trigger it.
pub const NODE_REMOVAL_INTERVAL: Duration = Duration::from_secs(60);

/// Merge patch setting `metadata.finalizers` to `finalizers`, valid only at `resource_version`.
fn finalizers_patch(finalizers: &[String], resource_version: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": resource_version,
        }
    })
}

/// One pass over the operator's namespace `ns`: releases what nodes that no longer exist left
/// behind and returns what it released. Stops at the first failed call (the next pass retries).
pub async fn release_gone_nodes(client: &Client, ns: &str) -> Result<Vec<NodeCleanup>> {
    let nodes = Api::<PartialObjectMeta<Node>>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(kube_err("listing Nodes"))?;
    let existing: BTreeSet<String> = nodes.items.iter().map(ResourceExt::name_any).collect();
    let statuses_api = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns);
    let statuses = statuses_api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMVolumeGroupNodeStatuses"))?;
    let vgs_api = Api::<LVMVolumeGroup>::namespaced(client.clone(), ns);
    let vgs = vgs_api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMVolumeGroups"))?;
    let status_names: Vec<String> = statuses.items.iter().map(ResourceExt::name_any).collect();
    let cleanups = node_removal(&existing, &status_names, &vgs.items);

    for cleanup in &cleanups {
        for key in &cleanup.volume_groups {
            let Some(vg) = vgs.items.iter().find(|vg| vg.name_any() == key.name) else {
                continue;
            };
            let keep: Vec<String> = vg
                .finalizers()
                .iter()
                .filter(|f| **f != cleanup.finalizer)
                .cloned()
                .collect();
            vgs_api
                .patch(
                    &key.name,
                    &PatchParams::default(),
                    &Patch::Merge(finalizers_patch(&keep, vg.resource_version().as_deref())),
                )
                .await
                .map_err(kube_err(format!(
                    "removing finalizer {} of gone node {} from LVMVolumeGroup {}",
                    cleanup.finalizer, cleanup.node, key.name
                )))?;
            info!(node = %cleanup.node, lvmvolumegroup = %key.name, "removed the cleanup finalizer of a gone node");
        }
        if cleanup.delete_node_status {
            let Some(status) = statuses.items.iter().find(|s| s.name_any() == cleanup.node) else {
                continue;
            };
            if status
                .finalizers()
                .iter()
                .any(|f| f == NODE_STATUS_FINALIZER)
            {
                let keep: Vec<String> = status
                    .finalizers()
                    .iter()
                    .filter(|f| *f != NODE_STATUS_FINALIZER)
                    .cloned()
                    .collect();
                statuses_api
                    .patch(
                        &cleanup.node,
                        &PatchParams::default(),
                        &Patch::Merge(finalizers_patch(
                            &keep,
                            status.resource_version().as_deref(),
                        )),
                    )
                    .await
                    .map_err(kube_err(format!(
                        "removing finalizer {NODE_STATUS_FINALIZER} from the \
                         LVMVolumeGroupNodeStatus of gone node {}",
                        cleanup.node
                    )))?;
            }
            delete(&statuses_api, &cleanup.node)
                .await
                .map_err(kube_err(format!(
                    "deleting the LVMVolumeGroupNodeStatus of gone node {}",
                    cleanup.node
                )))?;
            info!(node = %cleanup.node, "deleted the node status of a gone node");
        }
    }
    Ok(cleanups)
}

/// Runs passes of [`release_gone_nodes`] in `ns` until `shutdown` completes: at start, on every
/// Node deletion, and every [`NODE_REMOVAL_INTERVAL`].
pub async fn run(
    client: Client,
    ns: String,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let deletions = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(|event| {
        futures::future::ready(match event {
            Ok(watcher::Event::Delete(node)) => Some(node.name_any()),
            _ => None,
        })
    });
    let mut deletions = std::pin::pin!(deletions);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(NODE_REMOVAL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
            Some(node) = deletions.next() => info!(%node, "node deleted"),
        }
        let started = std::time::Instant::now();
        let res = release_gone_nodes(&client, &ns).await;
        metrics.reconciled(NODE_REMOVAL_CONTROLLER, res.is_ok(), started.elapsed());
        match res {
            Ok(cleanups) if !cleanups.is_empty() => {
                metrics.node_cleanups(cleanups.len() as u64);
            }
            Ok(_) => {}
            Err(e) => warn!(error = %e, "releasing gone nodes failed; retrying on the next pass"),
        }
    }
}
