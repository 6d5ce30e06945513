//! The node-removal controller: the I/O half of [`crate::finalizer::node_removal`]. A node that is
//! deleted from the cluster takes its vg-manager pod with it, so nobody would ever delete its
//! `LVMVolumeGroupNodeStatus` or remove its `cleanup.vgmanager.node.topolvm.io/<node>` finalizers
//! from the `LVMVolumeGroup`s, and deleting the `LVMCluster` would wait forever.
//!
//! A pass lists the Nodes (fresh, so the list is complete), the node statuses and the volume groups
//! in the operator's namespace, plans, and executes: each finalizer is removed with a JSON merge
//! patch carrying the observed `resourceVersion` (a concurrent change makes it fail with 409, and
//! the next pass works from fresh data); the node status loses its
//! `delete-protection.lvm.openshift.io` finalizer the same way and is then deleted. A node status
//! being deleted while its Node exists, and a Node being deleted with TopoLVM's `topolvm.io/node`
//! finalizer, lose that finalizer too (what LVMS or TopoLVM left, ADR 0032). A pass runs at
//! start, whenever a Node deletion is seen, and every [`NODE_REMOVAL_INTERVAL`].
//!
//! Each pass also hands the `LogicalVolume`s of shared classes whose node is deleted or out of
//! service to another node of the class ([`hand_over_shared_volumes`], the decision is
//! [`crate::handover::plan`]): a merge patch of `spec.nodeName` carrying the observed
//! `resourceVersion`.

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
use lvms_api::{
    LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus, NODE_FINALIZER, NODE_STATUS_FINALIZER,
    topolvm::LogicalVolume,
};
use tracing::{info, warn};

pub use super::dead_nodes::{DeathPolicy, release_dead_nodes};
use super::{Result, delete, kube_err};
use crate::{
    finalizer::{NodeCleanup, node_removal},
    handover::{self, Plan},
    metrics::Metrics,
};

/// The `controller` label of this controller's metrics.
pub const NODE_REMOVAL_CONTROLLER: &str = "node-removal";
/// The `controller` label of the handover's metrics.
pub const HANDOVER_CONTROLLER: &str = "shared-volume-handover";
/// The `controller` label (and the Events' reporter) of the dead-node passes.
pub const DEATH_CONTROLLER: &str = "shared-dead-node";
/// How often a pass runs without a Node deletion to trigger it.
pub const NODE_REMOVAL_INTERVAL: Duration = Duration::from_secs(60);
/// The shortest time between two passes that changes triggered.
pub const MIN_PASS_GAP: Duration = Duration::from_secs(5);

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
    release_topolvm_node_finalizers(client, &nodes.items).await?;
    let statuses_api = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns);
    let statuses = statuses_api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMVolumeGroupNodeStatuses"))?;
    release_deleted_node_statuses(&statuses_api, &statuses.items, &existing).await?;
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

/// Removes TopoLVM's `topolvm.io/node` finalizer from each Node being deleted. TopoLVM's and
/// LVMS's node plugins add it and their controller removes it; after a takeover (ADR 0032) neither
/// runs, and the Node would stay Terminating for good. lvms-rs adds no finalizer to Nodes: what a
/// gone node leaves is released by [`release_gone_nodes`] once the Node is gone.
async fn release_topolvm_node_finalizers<R: kube::Resource>(
    client: &Client,
    nodes: &[R],
) -> Result<()> {
    let api = Api::<Node>::all(client.clone());
    for node in nodes {
        let Some(keep) = released_while_deleting(node, NODE_FINALIZER) else {
            continue;
        };
        api.patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(finalizers_patch(&keep, node.resource_version().as_deref())),
        )
        .await
        .map_err(kube_err(format!(
            "removing finalizer {NODE_FINALIZER} from deleted Node {}",
            node.name_any()
        )))?;
        info!(node = %node.name_any(), "removed TopoLVM's node finalizer from a deleted Node");
    }
    Ok(())
}

/// Removes [`NODE_STATUS_FINALIZER`] from each node status being deleted whose Node exists (a
/// gone node's status is released by the node-removal plan). The finalizer only keeps a status
/// until the operator has seen its node go; one deleted on purpose is let go: the garbage
/// collector deletes the statuses LVMS made, which LVMS owned by their `LVMCluster`, when that
/// cluster is deleted, and LVMS's node plugin, which released them, is gone after a takeover (ADR
/// 0032). A node agent that still serves a class applies its status again.
async fn release_deleted_node_statuses(
    api: &Api<LVMVolumeGroupNodeStatus>,
    statuses: &[LVMVolumeGroupNodeStatus],
    existing: &BTreeSet<String>,
) -> Result<()> {
    for status in statuses {
        let name = status.name_any();
        let Some(keep) = released_while_deleting(status, NODE_STATUS_FINALIZER) else {
            continue;
        };
        if !existing.contains(&name) {
            continue;
        }
        lvms_k8s::finalizers::set(api, status, keep)
            .await
            .map_err(kube_err(format!(
            "removing finalizer {NODE_STATUS_FINALIZER} from deleted LVMVolumeGroupNodeStatus {name}"
        )))?;
        info!(node = %name, "released a node status being deleted");
    }
    Ok(())
}

/// The finalizers `obj` keeps once `finalizer` is released, when it is being deleted and has it.
fn released_while_deleting(obj: &impl kube::Resource, finalizer: &str) -> Option<Vec<String>> {
    (obj.meta().deletion_timestamp.is_some() && obj.finalizers().iter().any(|f| f == finalizer))
        .then(|| lvms_k8s::finalizers::without(obj, finalizer))
}

/// One pass: the `LogicalVolume`s of the shared classes of the `LVMCluster`s in `ns` whose node is
/// gone or out of service get another node of their class ([`handover::plan`]); returns the plan.
/// Stops at the first failed call (the next pass retries; a volume changed since it was read is
/// refused with 409 and planned again from fresh data).
pub async fn hand_over_shared_volumes(
    client: &Client,
    ns: &str,
    dead: &BTreeSet<(String, String)>,
) -> Result<Plan> {
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMClusters"))?;
    let (shared, default) = handover::shared_classes(&clusters.items);
    if shared.is_empty() {
        return Ok(Plan::default());
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing Nodes"))?;
    let api = Api::<LogicalVolume>::all(client.clone());
    let volumes = api
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LogicalVolumes"))?;
    let plan = handover::plan(
        &volumes.items,
        &shared,
        default.as_deref(),
        &nodes.items,
        dead,
    );
    for m in &plan.moves {
        let Some(volume) = volumes.items.iter().find(|v| v.name_any() == m.volume) else {
            continue;
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": volume.resource_version()},
            "spec": {"nodeName": m.to},
        });
        api.patch(&m.volume, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(kube_err(format!(
                "handing LogicalVolume {} of shared class {} from node {} to node {}",
                m.volume, m.class, m.from, m.to
            )))?;
        info!(
            logical_volume = %m.volume, class = %m.class, from = %m.from, to = %m.to,
            why = %m.why,
            "handed a shared volume to another node of its class: its node {}", m.why
        );
    }
    for s in &plan.stuck {
        warn!(
            logical_volume = %s.volume, class = %s.class, node = %s.from,
            "the node of a shared volume is gone and no Ready node of its class can take it; \
             it waits for one"
        );
    }
    Ok(plan)
}

/// Runs passes of [`release_gone_nodes`], [`release_dead_nodes`] and
/// [`hand_over_shared_volumes`] in `ns` until `shutdown` completes: at start, on every Node
/// deletion, when a Node or a node status in `ns` changes (at most one pass per
/// [`MIN_PASS_GAP`]), and every [`NODE_REMOVAL_INTERVAL`].
pub async fn run(
    client: Client,
    ns: String,
    metrics: Arc<Metrics>,
    policy: DeathPolicy,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let recorder = lvms_k8s::reconciler::recorder(client.clone(), DEATH_CONTROLLER);
    let nodes = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(|event| {
        futures::future::ready(match event {
            Ok(watcher::Event::Delete(node)) => Some(Some(node.name_any())),
            Ok(watcher::Event::Apply(_)) => Some(None),
            _ => None,
        })
    });
    // A node's sanlock reporting a dead host shows here first (`shared.deadHostIds`).
    let statuses = watcher(
        Api::<PartialObjectMeta<LVMVolumeGroupNodeStatus>>::namespaced(client.clone(), &ns),
        watcher::Config::default(),
    )
    .default_backoff()
    .filter_map(|event| {
        futures::future::ready(match event {
            Ok(watcher::Event::Apply(_)) => Some(None),
            _ => None,
        })
    });
    let changes = futures::stream::select(nodes, statuses);
    let mut changes = std::pin::pin!(changes);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tick = tokio::time::interval(NODE_REMOVAL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_pass: Option<std::time::Instant> = None;
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            _ = tick.tick() => {}
            Some(deleted) = changes.next() => {
                if let Some(node) = deleted {
                    info!(%node, "node deleted");
                }
                // Changes come in bursts (every status of a node, every Node heartbeat): one
                // pass for a burst.
                if let Some(gap) = last_pass.map(|t| MIN_PASS_GAP.saturating_sub(t.elapsed()))
                    && !gap.is_zero()
                {
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(gap) => {}
                    }
                }
            }
        }
        last_pass = Some(std::time::Instant::now());
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
        let started = std::time::Instant::now();
        let res = release_dead_nodes(&client, &ns, &policy, &recorder).await;
        metrics.reconciled(DEATH_CONTROLLER, res.is_ok(), started.elapsed());
        let dead = match res {
            Ok(released) => {
                metrics.dead_node_pod_deletions(released.deleted.len() as u64);
                released.dead
            }
            Err(e) => {
                warn!(error = %e, "looking for dead nodes of shared classes failed; retrying on the next pass");
                BTreeSet::new()
            }
        };
        let started = std::time::Instant::now();
        let res = hand_over_shared_volumes(&client, &ns, &dead).await;
        metrics.reconciled(HANDOVER_CONTROLLER, res.is_ok(), started.elapsed());
        match res {
            Ok(plan) => metrics.shared_volume_handovers(plan.moves.len() as u64),
            Err(e) => warn!(
                error = %e,
                "handing shared volumes of gone nodes over failed; retrying on the next pass"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(deleting: bool, finalizers: &[&str]) -> PartialObjectMeta<Node> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "worker-1",
                "finalizers": finalizers,
                "deletionTimestamp": deleting.then_some("2026-12-07T00:00:00Z"),
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_finalizer_is_released_only_from_an_object_being_deleted() {
        assert_eq!(
            released_while_deleting(
                &node(true, &[NODE_FINALIZER, "example.com/keep"]),
                NODE_FINALIZER
            ),
            Some(vec!["example.com/keep".to_owned()])
        );
        assert_eq!(
            released_while_deleting(&node(false, &[NODE_FINALIZER]), NODE_FINALIZER),
            None
        );
        assert_eq!(
            released_while_deleting(&node(true, &["example.com/keep"]), NODE_FINALIZER),
            None
        );
    }
}
