//! The eviction controller: the I/O half of [`crate::eviction`], off unless `lvms operator
//! --eviction-controller`.
//!
//! It watches every Pod in the cluster (kube-runtime's controller, so the pods are cached in the
//! operator's memory, as csi-driver-lvm's controller-runtime cache does). A pod that carries no
//! [`trigger`] or has no controlling StatefulSet costs nothing but the check. For the others it
//! reads the StatefulSet, then for each claim of [`candidate_claims`]: the claim, and only when
//! [`claim_checks`] pass (the opt-in annotation above all), the PersistentVolume and its Node; then
//! it asks [`decide`]. A claim to delete is deleted with its UID as precondition, so a claim the
//! StatefulSet made anew under the same name since it was read is never deleted (the API server
//! answers 409, and the controller leaves it). Each deletion is logged, counted
//! (`lvms_operator_eviction_claim_deletions_total`) and published as a Normal event
//! [`DELETED_REASON`] on the claim and on the StatefulSet; an opt-in annotation that is not a
//! boolean is a Warning event [`INVALID_ANNOTATION_REASON`] on the object that carries it.
//!
//! It acts on what it sees, not on the kind of watch event: a pod found with `DisruptionTarget` or
//! `Unschedulable` at start is handled like one that just got it (csi-driver-lvm looks at
//! disruptions only on updates and at unschedulable pods only when they are first listed). The
//! operator runs one replica; there is no leader election.

use std::{future::Future, sync::Arc, time::Instant};

use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
};
use kube::{
    Client, Resource, ResourceExt,
    api::{Api, DeleteParams, Preconditions},
    runtime::{
        Controller,
        controller::Action,
        events::{Event, EventType, Recorder},
        watcher,
    },
};
use lvms_api::OPERATOR_FIELD_MANAGER;
use tracing::{debug, info, instrument, warn};

use super::{ERROR_REQUEUE, Error, Result, kube_err};
use crate::{
    eviction::{
        Carrier, Decision, Deletion, Keep, Observed, candidate_claims, claim_checks, decide,
        statefulset_owner, trigger, volume_node,
    },
    metrics::Metrics,
};

/// The `controller` label of this controller's metrics.
pub const EVICTION_CONTROLLER: &str = "eviction";
/// Reason of the event on the claim and the StatefulSet when a claim was deleted.
pub const DELETED_REASON: &str = "ClaimDeletedForEviction";
/// Reason of the Warning event on a pod or claim whose opt-in annotation is not a boolean.
pub const INVALID_ANNOTATION_REASON: &str = "InvalidEvictionAnnotation";

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Our CSI driver: only its volumes are considered.
    pub driver: String,
    /// Publishes the events.
    pub recorder: Recorder,
    /// Counts reconciles and deletions.
    pub metrics: Arc<Metrics>,
}

impl Context {
    /// A context whose events are reported by `lvms-operator`.
    pub fn new(client: Client, driver: String, metrics: Arc<Metrics>) -> Self {
        Self {
            recorder: lvms_k8s::reconciler::recorder(client.clone(), OPERATOR_FIELD_MANAGER),
            client,
            driver,
            metrics,
        }
    }
}

/// Runs the eviction controller for CSI driver `driver` until `shutdown` completes.
pub async fn run(
    client: Client,
    driver: String,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ctx = Arc::new(Context::new(client.clone(), driver, metrics));
    lvms_k8s::reconciler::drive(
        Controller::new(Api::<Pod>::all(client), watcher::Config::default())
            .graceful_shutdown_on(shutdown),
        "Pod",
        reconcile,
        error_policy,
        ctx,
    )
    .await;
}

/// Logs the failure and retries after [`ERROR_REQUEUE`].
pub fn error_policy(pod: Arc<Pod>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(
        pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
        error = %error,
        "eviction reconcile failed, retrying"
    );
    Action::requeue(ERROR_REQUEUE)
}

/// Looks at one pod: nothing for pods without a trigger or a StatefulSet; otherwise every claim
/// its StatefulSet made for it, counted in the metrics.
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    if trigger(&pod).is_none() || statefulset_owner(&pod).is_none() {
        return Ok(Action::await_change());
    }
    let started = Instant::now();
    let res = handle(&pod, &ctx).await;
    ctx.metrics
        .reconciled(EVICTION_CONTROLLER, res.is_ok(), started.elapsed());
    res.map(|()| Action::await_change())
}

#[instrument(skip_all, fields(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())))]
async fn handle(pod: &Pod, ctx: &Context) -> Result<()> {
    let (Some(ns), Some(owner)) = (pod.namespace(), statefulset_owner(pod)) else {
        return Ok(());
    };
    let Some(sts) = Api::<StatefulSet>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&owner.name)
        .await
        .map_err(kube_err(format!("reading StatefulSet {ns}/{}", owner.name)))?
    else {
        debug!(statefulset = %owner.name, "the pod's StatefulSet is gone");
        return Ok(());
    };
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    for name in candidate_claims(pod, &sts) {
        let Some(claim) = claims.get_opt(&name).await.map_err(kube_err(format!(
            "reading PersistentVolumeClaim {ns}/{name}"
        )))?
        else {
            continue;
        };
        if let Err(keep) = claim_checks(pod, &sts, &claim) {
            kept(ctx, pod, &claim, &keep).await;
            continue;
        }
        let volume = match claim
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
        {
            Some(pv) => Api::<PersistentVolume>::all(ctx.client.clone())
                .get_opt(pv)
                .await
                .map_err(kube_err(format!("reading PersistentVolume {pv}")))?,
            None => None,
        };
        let node = match volume_node(&claim, volume.as_ref(), &ctx.driver) {
            Ok(node) => Api::<Node>::all(ctx.client.clone())
                .get_opt(node)
                .await
                .map_err(kube_err(format!("reading Node {node}")))?,
            Err(keep) => {
                kept(ctx, pod, &claim, &keep).await;
                continue;
            }
        };
        let observed = Observed {
            pod,
            statefulset: &sts,
            claim: &claim,
            volume: volume.as_ref(),
            node: node.as_ref(),
        };
        match decide(&observed, &ctx.driver) {
            Decision::Keep(keep) => kept(ctx, pod, &claim, &keep).await,
            Decision::Delete(deletion) => {
                delete_claim(ctx, &claims, pod, &sts, &claim, &deletion).await?;
            }
        }
    }
    Ok(())
}

/// Logs why `claim` stays; a malformed opt-in is also a Warning event on its carrier.
async fn kept(ctx: &Context, pod: &Pod, claim: &PersistentVolumeClaim, keep: &Keep) {
    let claim_name = claim.name_any();
    if let Keep::InvalidAnnotation { carrier, .. } = keep {
        warn!(claim = %claim_name, reason = %keep, "claim kept");
        let on = match carrier {
            Carrier::Pod => pod.object_ref(&()),
            Carrier::Claim => claim.object_ref(&()),
        };
        publish(
            ctx,
            EventType::Warning,
            INVALID_ANNOTATION_REASON,
            "Evict",
            format!("claim {claim_name}: {keep}"),
            &on,
            None,
        )
        .await;
    } else {
        debug!(claim = %claim_name, reason = %keep, "claim kept");
    }
}

/// Deletes the claim if it is still the one read; then logs, counts and publishes the events.
async fn delete_claim(
    ctx: &Context,
    claims: &Api<PersistentVolumeClaim>,
    pod: &Pod,
    sts: &StatefulSet,
    claim: &PersistentVolumeClaim,
    deletion: &Deletion,
) -> Result<()> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: deletion.claim_uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match claims.delete(&deletion.claim, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.is_not_found() => {
            debug!(claim = %deletion.claim, "claim already gone");
            return Ok(());
        }
        Err(kube::Error::Api(s)) if s.is_conflict() => {
            info!(claim = %deletion.claim, message = %s.message,
                  "claim replaced since it was read; left alone");
            return Ok(());
        }
        Err(e) => {
            return Err(kube_err(format!(
                "deleting PersistentVolumeClaim {}/{}",
                deletion.namespace, deletion.claim
            ))(e));
        }
    }
    info!(
        claim = %deletion.claim,
        statefulset = %deletion.statefulset,
        node = %deletion.node,
        "{deletion}"
    );
    ctx.metrics.eviction_claim_deleted();
    let note = deletion.to_string();
    publish(
        ctx,
        EventType::Normal,
        DELETED_REASON,
        "DeleteClaim",
        note.clone(),
        &claim.object_ref(&()),
        Some(pod.object_ref(&())),
    )
    .await;
    publish(
        ctx,
        EventType::Normal,
        DELETED_REASON,
        "DeleteClaim",
        note,
        &sts.object_ref(&()),
        Some(claim.object_ref(&())),
    )
    .await;
    Ok(())
}

async fn publish(
    ctx: &Context,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
    on: &k8s_openapi::api::core::v1::ObjectReference,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
) {
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: action.to_owned(),
        secondary: related,
    };
    if let Err(e) = ctx.recorder.publish(&ev, on).await {
        warn!(error = %e, reason, "publishing an event failed");
    }
}

#[cfg(test)]
mod tests;
