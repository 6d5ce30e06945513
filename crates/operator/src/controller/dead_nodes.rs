//! The I/O half of [`crate::death`]: one pass finds the nodes dead in a shared class and, where the
//! class's fencing is armed, deletes their pods whose persistent volumes are all that class's
//! (grace 0, with the pod's uid as precondition), posts an Event on the pods it leaves for the
//! admin, and, only when the admin opted in, taints a node that is not Ready out of service. Dead
//! nodes of classes without fencing get a warning Event on the Node and nothing else. The fenced
//! deaths go on to the handover ([`super::node_removal::hand_over_shared_volumes`]). First it
//! removes a class's topology label from a node whose status says the hook fenced it from the
//! class, and gives it back once the node joined again ([`death::topology_labels`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{
    Client, Resource, ResourceExt,
    api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions},
    runtime::events::{Event, EventType, Recorder},
};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use tracing::{info, warn};

use super::{Result, kube_err};
use crate::{
    death::{self, Cause, Death, Fate, LabelChange, Volumes},
    eviction::{OUT_OF_SERVICE_TAINT, is_tainted_out_of_service},
    handover,
};

/// What the operator may do about a dead node.
#[derive(Clone, Debug)]
pub struct DeathPolicy {
    /// The CSI driver's name (which persistent volumes are ours).
    pub driver: String,
    /// Taint a fenced dead node `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`
    /// (`--shared-dead-node-out-of-service`, off by default): Kubernetes then releases every
    /// pod and every driver's volume on it. For clusters whose nodes are reset whenever their
    /// lease dies.
    pub out_of_service_taint: bool,
}

/// What a pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Fenced deaths: (node, class), for the handover.
    pub dead: BTreeSet<(String, String)>,
    /// Pods deleted (`namespace/name`).
    pub deleted: Vec<String>,
    /// Pods left for the admin (`namespace/name`).
    pub waiting: Vec<String>,
}

/// One pass over the `LVMCluster`s in `ns` (see the module's documentation). Stops at the first
/// failed list; a failed deletion or Event is logged and retried by the next pass.
pub async fn release_dead_nodes(
    client: &Client,
    ns: &str,
    policy: &DeathPolicy,
    recorder: &Recorder,
) -> Result<Released> {
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMClusters"))?;
    let policies = death::shared_policies(&clusters.items);
    if policies.is_empty() {
        return Ok(Released::default());
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing Nodes"))?;
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LVMVolumeGroupNodeStatuses"))?;
    let mut out = Released::default();
    // Labels first: the pods deleted below must not be scheduled back onto a fenced node.
    for change in death::topology_labels(&nodes.items, &statuses.items, &policies) {
        label(client, &change).await;
    }
    let deaths = death::dead_nodes(&nodes.items, &statuses.items, &policies);
    let mut fenced: BTreeMap<&str, Vec<&Death>> = BTreeMap::new();
    for d in &deaths {
        let node = nodes.items.iter().find(|n| n.name_any() == d.node);
        if d.fenced {
            out.dead.insert((d.node.clone(), d.class.clone()));
            fenced.entry(d.node.as_str()).or_default().push(d);
        } else if let Some(node) = node {
            let note = format!(
                "{}, whose sharedConfig.watchdog is Disabled: nothing shows it stopped writing, so \
                 lvms-rs releases none of its pods or volumes (taint it out of service once it is \
                 off)",
                d.evidence()
            );
            warn!(node = %d.node, class = %d.class, "{note}");
            publish(
                recorder,
                EventType::Warning,
                "SharedNodeDeadNotFenced",
                note,
                node,
            )
            .await;
        }
    }
    if fenced.is_empty() {
        return Ok(out);
    }
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing PersistentVolumes"))?;
    let lvs = Api::<LogicalVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing LogicalVolumes"))?;
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(kube_err("listing PersistentVolumeClaims"))?;
    let (_, default_class) = handover::shared_classes(&clusters.items);
    let volumes = Volumes::new(
        &policy.driver,
        &claims.items,
        &pvs.items,
        &lvs.items,
        default_class.as_deref(),
    );
    for (node_name, node_deaths) in &fenced {
        let classes: BTreeSet<String> = node_deaths.iter().map(|d| d.class.clone()).collect();
        let pods = Api::<Pod>::all(client.clone())
            .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
            .await
            .map_err(kube_err(format!("listing the pods of node {node_name}")))?;
        for pod in &pods.items {
            let Some(fate) = death::pod_fate(pod, &classes, &volumes) else {
                continue;
            };
            let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
            let first = node_deaths[0];
            match fate {
                Fate::Release => {
                    let note = format!(
                        "{} (fenced): deleting this pod, whose volumes are all that class's, so it \
                         can run on another node",
                        first.evidence()
                    );
                    publish(
                        recorder,
                        EventType::Normal,
                        "ReleasedFromDeadNode",
                        note,
                        pod,
                    )
                    .await;
                    if delete_now(client, pod).await {
                        info!(pod = %key, node = %node_name, "deleted a pod of a dead node of a shared class");
                        out.deleted.push(key);
                    }
                }
                Fate::WaitsForAdmin(others) => {
                    let note = death::waits_message(first, &others);
                    publish(recorder, EventType::Warning, "WaitingForAdmin", note, pod).await;
                    out.waiting.push(key);
                }
            }
        }
        // Never a node that is still Ready (fenced from the LUN, alive): the taint would release
        // every driver's volumes on it.
        if policy.out_of_service_taint
            && node_deaths.iter().any(|d| d.cause == Cause::NotReady)
            && let Some(node) = nodes.items.iter().find(|n| n.name_any() == *node_name)
            && !is_tainted_out_of_service(node)
        {
            taint_out_of_service(client, node).await;
        }
    }
    Ok(out)
}

/// Deletes `pod` at once (grace 0, as the pod garbage collector does for a node out of service),
/// only if it is still the pod that was judged; whether it is gone.
async fn delete_now(client: &Client, pod: &Pod) -> bool {
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name_any(), &params).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => true,
        Err(e) => {
            warn!(pod = %pod.name_any(), error = %e, "deleting a pod of a dead node failed; the next pass retries");
            false
        }
    }
}

/// Takes one topology label away (recording it in an annotation) or gives it back (merge patch);
/// a failure is logged and retried by the next pass.
async fn label(client: &Client, change: &LabelChange) {
    let key = lvms_api::shared_topology_key(&change.class);
    let note = death::fenced_annotation(&change.class);
    let patch = if change.fence {
        serde_json::json!({"metadata": {"labels": {&key: null}, "annotations": {&note: "true"}}})
    } else {
        serde_json::json!({"metadata": {"labels": {&key: death::JOINED_LABEL_VALUE},
                                        "annotations": {&note: null}}})
    };
    match Api::<Node>::all(client.clone())
        .patch(&change.node, &PatchParams::default(), &Patch::Merge(patch))
        .await
    {
        Ok(_) => {
            info!(node = %change.node, class = %change.class, fenced = change.fence, "changed a shared class's topology label");
        }
        Err(e) => {
            warn!(node = %change.node, class = %change.class, error = %e, "changing a shared class's topology label failed; the next pass retries");
        }
    }
}

/// Adds the out-of-service taint to `node` (merge patch of its taints at the resourceVersion read).
async fn taint_out_of_service(client: &Client, node: &Node) {
    let mut taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: OUT_OF_SERVICE_TAINT.to_owned(),
        value: Some("nodeshutdown".to_owned()),
        effect: "NoExecute".to_owned(),
        time_added: None,
    });
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": taints},
    });
    match Api::<Node>::all(client.clone())
        .patch(
            &node.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(_) => {
            info!(node = %node.name_any(), "tainted a dead node of a shared class out of service (opted in)")
        }
        Err(e) => {
            warn!(node = %node.name_any(), error = %e, "tainting a dead node out of service failed; the next pass retries")
        }
    }
}

async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    type_: EventType,
    reason: &str,
    note: String,
    on: &K,
) {
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "ReleaseDeadNode".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &on.object_ref(&())).await {
        warn!(error = %e, reason, "publishing an event failed");
    }
}
