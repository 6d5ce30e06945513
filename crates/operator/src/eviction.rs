//! When a StatefulSet's claim may be deleted so the StatefulSet makes it again on another node:
//! metal-stack csi-driver-lvm's eviction controller, as a pure decision. The I/O half is
//! [`crate::controller::eviction`].
//!
//! A volume of ours lives on one node's disks. When that node is drained or gone, a StatefulSet's pod
//! cannot follow its claim anywhere else, and the StatefulSet controller never replaces a claim that
//! exists. Users who would rather lose the data than the replica (a replicated database rebuilds it)
//! opt in per pod or per claim, and the operator deletes the claim; the StatefulSet makes a new one,
//! which the scheduler places on a node that works. The rules, in the order [`decide`] checks them:
//!
//! 1. the pod is being disrupted (`DisruptionTarget=True`, which the eviction API, the taint manager,
//!    the scheduler's preemption and kubelet set before they delete it) or cannot be scheduled
//!    (`PodScheduled=False`, reason `Unschedulable`) — [`trigger`];
//! 2. its controller is a StatefulSet, the one read (same name and UID) — [`statefulset_owner`];
//! 3. the claim is one of the pod's volumes named `<template>-<pod>` after one of that StatefulSet's
//!    `volumeClaimTemplates` — [`candidate_claims`]; it is not being deleted already, and it is not
//!    younger than the pod (a younger claim is one the StatefulSet already made anew);
//! 4. the pod or the claim says `"true"` in [`EVICTION_ALLOWED_ANNOTATION`] or csi-driver-lvm's
//!    [`CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION`] (the values Go's `strconv.ParseBool` takes, as
//!    csi-driver-lvm parses them); a value that is not a boolean on either keeps the claim and is
//!    reported, even if another annotation says `"true"`: a deletion cannot be undone, so an unclear
//!    opt-in is no opt-in (csi-driver-lvm fails the reconcile instead);
//! 5. the claim is bound to a PersistentVolume that names it back, of our CSI driver, whose required
//!    node affinity is one term pinning exactly one node on [`TOPOLOGY_NODE_KEY`] — [`volume_node`]
//!    (a shared class's volumes are reachable from other nodes and are never touched);
//! 6. that node is gone (NotFound), out of service (not Ready and tainted
//!    `node.kubernetes.io/out-of-service`, the taint an administrator sets on a node that is shut
//!    down; Kubernetes' own non-graceful shutdown handling treats it as gone too) or cordoned
//!    (`spec.unschedulable`) — [`node_state`]. A node that exists and is schedulable never loses a
//!    claim, whatever happens to the pod (an autoscaler's or a descheduler's eviction, a rollout).
//!
//! Every branch that keeps the claim has its own [`Keep`] variant, so logs and tests say which rule
//! held it.

use std::fmt;

use k8s_openapi::{
    api::{
        apps::v1::StatefulSet,
        core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
pub use lvms_api::{
    CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION, EVICTION_ALLOWED_ANNOTATION,
    EVICTION_ALLOWED_ANNOTATIONS, TOPOLOGY_NODE_KEY,
};

/// The pod condition set on a pod that is about to be deleted by a disruption.
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// The pod condition the scheduler sets to `False`, reason [`UNSCHEDULABLE`], when no node fits.
pub const POD_SCHEDULED: &str = "PodScheduled";
/// The reason of `PodScheduled=False` when no node fits the pod.
pub const UNSCHEDULABLE: &str = "Unschedulable";
/// The taint an administrator puts on a node that is shut down for good (non-graceful node
/// shutdown); on a node that is not Ready it counts as gone.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// Why a pod is looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// `DisruptionTarget=True`: the pod is being evicted or otherwise deleted by a disruption.
    Disrupted {
        /// The condition's reason (`EvictionByEvictionAPI`, `DeletionByTaintManager`, …).
        reason: String,
    },
    /// `PodScheduled=False` with reason `Unschedulable`.
    Unschedulable,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disrupted { reason } if reason.is_empty() => {
                write!(f, "is being evicted ({DISRUPTION_TARGET})")
            }
            Self::Disrupted { reason } => {
                write!(f, "is being evicted ({DISRUPTION_TARGET}: {reason})")
            }
            Self::Unschedulable => write!(
                f,
                "cannot be scheduled ({POD_SCHEDULED}=False: {UNSCHEDULABLE})"
            ),
        }
    }
}

/// Why `pod` should be looked at, or `None`: `DisruptionTarget=True` wins over `Unschedulable`.
pub fn trigger(pod: &Pod) -> Option<Trigger> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    if let Some(c) = conditions
        .iter()
        .find(|c| c.type_ == DISRUPTION_TARGET && c.status == "True")
    {
        return Some(Trigger::Disrupted {
            reason: c.reason.clone().unwrap_or_default(),
        });
    }
    conditions
        .iter()
        .any(|c| {
            c.type_ == POD_SCHEDULED
                && c.status == "False"
                && c.reason.as_deref() == Some(UNSCHEDULABLE)
        })
        .then_some(Trigger::Unschedulable)
}

/// The owner reference of `pod`'s controlling StatefulSet (`apps/*`, kind `StatefulSet`,
/// `controller: true`), if any.
pub fn statefulset_owner(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata.owner_references.as_deref()?.iter().find(|o| {
        o.kind == "StatefulSet" && o.api_version.starts_with("apps/") && o.controller == Some(true)
    })
}

/// The claims among `pod`'s volumes that `statefulset` made for it: `<template>-<pod>` for each of
/// its `volumeClaimTemplates`, in the order of the pod's volumes, each once.
pub fn candidate_claims(pod: &Pod, statefulset: &StatefulSet) -> Vec<String> {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let templates: Vec<String> = statefulset
        .spec
        .as_ref()
        .and_then(|s| s.volume_claim_templates.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|t| t.metadata.name.as_deref())
        .map(|t| format!("{t}-{pod_name}"))
        .collect();
    let mut out: Vec<String> = Vec::new();
    for volume in pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
    {
        if let Some(claim) = &volume.persistent_volume_claim
            && templates.contains(&claim.claim_name)
            && !out.contains(&claim.claim_name)
        {
            out.push(claim.claim_name.clone());
        }
    }
    out
}

/// What is wrong with a node a claim's volume lives on, for the claim to be deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeState {
    /// The Node does not exist.
    Gone,
    /// Not Ready and tainted `node.kubernetes.io/out-of-service`.
    OutOfService,
    /// `spec.unschedulable: true` (`kubectl cordon`, `kubectl drain`).
    Cordoned,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Gone => "no longer exists",
            Self::OutOfService => {
                "is out of service (not Ready, tainted node.kubernetes.io/out-of-service)"
            }
            Self::Cordoned => "is cordoned (spec.unschedulable)",
        })
    }
}

/// Whether `node` carries [`OUT_OF_SERVICE_TAINT`], whatever its effect.
pub fn is_tainted_out_of_service(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == OUT_OF_SERVICE_TAINT)
}

/// Whether `node`'s `Ready` condition is `True`.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether the node a volume lives on (`None`: it does not exist) lets its claim go, or `None` when
/// it exists and is schedulable. Gone and out of service win over cordoned.
pub fn node_state(node: Option<&Node>) -> Option<NodeState> {
    let Some(node) = node else {
        return Some(NodeState::Gone);
    };
    let spec = node.spec.as_ref();
    let ready = is_ready(node);
    let out_of_service = is_tainted_out_of_service(node);
    if out_of_service && !ready {
        Some(NodeState::OutOfService)
    } else if spec.and_then(|s| s.unschedulable) == Some(true) {
        Some(NodeState::Cordoned)
    } else {
        None
    }
}

/// Which object carries an annotation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// The pod.
    Pod,
    /// The PersistentVolumeClaim.
    Claim,
}

impl fmt::Display for Carrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pod => "pod",
            Self::Claim => "claim",
        })
    }
}

/// Why a claim is kept: one variant per rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The pod is neither being evicted nor unschedulable.
    NotDisrupted,
    /// The pod has no controlling StatefulSet.
    NoStatefulSetOwner,
    /// The StatefulSet read is not the pod's controller (another name or UID: it was replaced).
    NotTheOwner {
        /// The StatefulSet read.
        statefulset: String,
    },
    /// The claim is not `<template>-<pod>` of one of the StatefulSet's templates among the pod's
    /// volumes.
    NotFromTemplate,
    /// The claim is already being deleted.
    ClaimBeingDeleted,
    /// Neither the pod nor the claim opts in.
    NotAllowed,
    /// An opt-in annotation holds something that is not a boolean.
    InvalidAnnotation {
        /// Which object carries it.
        carrier: Carrier,
        /// The annotation.
        key: &'static str,
        /// Its value.
        value: String,
    },
    /// The claim was made after the pod: the StatefulSet already replaced the claim the pod had.
    ClaimNewerThanPod,
    /// The claim is not bound to a volume.
    ClaimNotBound,
    /// The claim names a volume that does not exist.
    VolumeMissing {
        /// The volume the claim names.
        volume: String,
    },
    /// The volume is not bound to this claim (its `claimRef` names another UID, or none).
    VolumeOfAnotherClaim {
        /// The volume.
        volume: String,
    },
    /// The volume is not of our CSI driver.
    OtherDriver {
        /// The volume.
        volume: String,
        /// Its CSI driver, if it is a CSI volume.
        driver: Option<String>,
    },
    /// The volume has no required node affinity.
    NoNodeAffinity {
        /// The volume.
        volume: String,
    },
    /// The volume's required node affinity has several terms (or none).
    NodeAffinityTerms {
        /// The volume.
        volume: String,
        /// How many terms.
        terms: usize,
    },
    /// The volume's node affinity does not pin one node on [`TOPOLOGY_NODE_KEY`] (a shared class's
    /// volume, reachable from other nodes).
    NotOnOneNode {
        /// The volume.
        volume: String,
    },
    /// The volume's node exists and is schedulable.
    NodeSchedulable {
        /// The node.
        node: String,
    },
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotDisrupted => f.write_str("the pod is neither being evicted nor unschedulable"),
            Self::NoStatefulSetOwner => f.write_str("the pod has no controlling StatefulSet"),
            Self::NotTheOwner { statefulset } => write!(
                f,
                "StatefulSet {statefulset} is not the pod's controller (replaced since?)"
            ),
            Self::NotFromTemplate => f.write_str(
                "the claim is not one the pod's StatefulSet made from its volumeClaimTemplates",
            ),
            Self::ClaimBeingDeleted => f.write_str("the claim is already being deleted"),
            Self::NotAllowed => write!(
                f,
                "neither the pod nor the claim has {EVICTION_ALLOWED_ANNOTATION} or \
                 {CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION} set to \"true\""
            ),
            Self::InvalidAnnotation {
                carrier,
                key,
                value,
            } => write!(
                f,
                "the {carrier}'s annotation {key} is {value:?}, not a boolean (true, false, 1, 0, \
                 t, f); the claim is kept"
            ),
            Self::ClaimNewerThanPod => f.write_str(
                "the claim was made after the pod: the StatefulSet already replaced the pod's claim",
            ),
            Self::ClaimNotBound => f.write_str("the claim is not bound to a volume"),
            Self::VolumeMissing { volume } => write!(f, "the claim's volume {volume} does not exist"),
            Self::VolumeOfAnotherClaim { volume } => {
                write!(f, "volume {volume} is not bound to this claim")
            }
            Self::OtherDriver { volume, driver } => match driver {
                Some(d) => write!(f, "volume {volume} is of CSI driver {d}, not ours"),
                None => write!(f, "volume {volume} is not a CSI volume"),
            },
            Self::NoNodeAffinity { volume } => {
                write!(f, "volume {volume} has no required node affinity")
            }
            Self::NodeAffinityTerms { volume, terms } => write!(
                f,
                "volume {volume}'s required node affinity has {terms} terms, not one"
            ),
            Self::NotOnOneNode { volume } => write!(
                f,
                "volume {volume}'s node affinity does not pin one node on {TOPOLOGY_NODE_KEY}"
            ),
            Self::NodeSchedulable { node } => {
                write!(f, "node {node} exists and is schedulable")
            }
        }
    }
}

/// A claim to delete, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deletion {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod.
    pub pod: String,
    /// The StatefulSet that will make the claim anew.
    pub statefulset: String,
    /// The claim.
    pub claim: String,
    /// The claim's UID: the deletion's precondition.
    pub claim_uid: Option<String>,
    /// Why the pod was looked at.
    pub trigger: Trigger,
    /// The volume.
    pub volume: String,
    /// The node the volume lives on.
    pub node: String,
    /// What is wrong with that node.
    pub node_state: NodeState,
}

impl fmt::Display for Deletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod {}/{} {}, and its claim {} (volume {}) lives on node {}, which {}: the claim is \
             deleted so that StatefulSet {} makes a new one on another node; the data on node {} \
             is lost",
            self.namespace,
            self.pod,
            self.trigger,
            self.claim,
            self.volume,
            self.node,
            self.node_state,
            self.statefulset,
            self.node,
        )
    }
}

/// What to do with one claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Delete the claim (with its UID as precondition).
    Delete(Deletion),
    /// Leave it.
    Keep(Keep),
}

/// Everything [`decide`] looks at, as read from the API server.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The pod.
    pub pod: &'a Pod,
    /// The StatefulSet named by the pod's controller reference.
    pub statefulset: &'a StatefulSet,
    /// One of the pod's claims.
    pub claim: &'a PersistentVolumeClaim,
    /// The volume the claim is bound to, `None` if it does not exist (or the claim is unbound).
    pub volume: Option<&'a PersistentVolume>,
    /// The Node [`volume_node`] names, `None` if it does not exist. Only looked at once the
    /// volume passed its checks.
    pub node: Option<&'a Node>,
}

/// Go's `strconv.ParseBool`, which csi-driver-lvm uses for its annotation.
fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Whether the pod or the claim opts in: `Ok(true)` when one of the annotations says true and
/// none is malformed.
fn allowed(pod: &Pod, claim: &PersistentVolumeClaim) -> Result<bool, Keep> {
    let mut any = false;
    for (carrier, annotations) in [
        (Carrier::Pod, pod.metadata.annotations.as_ref()),
        (Carrier::Claim, claim.metadata.annotations.as_ref()),
    ] {
        let Some(annotations) = annotations else {
            continue;
        };
        for key in EVICTION_ALLOWED_ANNOTATIONS {
            if let Some(value) = annotations.get(key) {
                match parse_bool(value) {
                    Some(v) => any |= v,
                    None => {
                        return Err(Keep::InvalidAnnotation {
                            carrier,
                            key,
                            value: value.clone(),
                        });
                    }
                }
            }
        }
    }
    Ok(any)
}

/// The checks of pod, StatefulSet and claim (rules 1 to 4), which need no further reads: the
/// controller runs them before it reads the volume and the node. Returns the trigger.
pub fn claim_checks(
    pod: &Pod,
    statefulset: &StatefulSet,
    claim: &PersistentVolumeClaim,
) -> Result<Trigger, Keep> {
    let trigger = trigger(pod).ok_or(Keep::NotDisrupted)?;
    let owner = statefulset_owner(pod).ok_or(Keep::NoStatefulSetOwner)?;
    let sts_name = statefulset.metadata.name.as_deref().unwrap_or_default();
    if owner.name != sts_name
        || statefulset
            .metadata
            .uid
            .as_deref()
            .is_some_and(|uid| uid != owner.uid)
    {
        return Err(Keep::NotTheOwner {
            statefulset: sts_name.to_owned(),
        });
    }
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    if !candidate_claims(pod, statefulset)
        .iter()
        .any(|c| c == claim_name)
    {
        return Err(Keep::NotFromTemplate);
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(Keep::ClaimBeingDeleted);
    }
    if !allowed(pod, claim)? {
        return Err(Keep::NotAllowed);
    }
    if let (Some(claim_made), Some(pod_made)) = (
        &claim.metadata.creation_timestamp,
        &pod.metadata.creation_timestamp,
    ) && claim_made.0 > pod_made.0
    {
        return Err(Keep::ClaimNewerThanPod);
    }
    Ok(trigger)
}

/// The node `volume` lives on, if it is bound to `claim`, of `driver`, and pinned to one node
/// (rule 5).
pub fn volume_node<'a>(
    claim: &PersistentVolumeClaim,
    volume: Option<&'a PersistentVolume>,
    driver: &str,
) -> Result<&'a str, Keep> {
    let wanted = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty())
        .ok_or(Keep::ClaimNotBound)?;
    let volume = volume.ok_or_else(|| Keep::VolumeMissing {
        volume: wanted.to_owned(),
    })?;
    let name = volume.metadata.name.clone().unwrap_or_default();
    let spec = volume.spec.as_ref();
    let claim_ref_uid = spec
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref());
    if name != wanted || claim_ref_uid.is_none() || claim_ref_uid != claim.metadata.uid.as_deref() {
        return Err(Keep::VolumeOfAnotherClaim { volume: name });
    }
    let csi_driver = spec.and_then(|s| s.csi.as_ref()).map(|c| c.driver.clone());
    if csi_driver.as_deref() != Some(driver) {
        return Err(Keep::OtherDriver {
            volume: name,
            driver: csi_driver,
        });
    }
    let Some(required) = spec
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    else {
        return Err(Keep::NoNodeAffinity { volume: name });
    };
    let [term] = required.node_selector_terms.as_slice() else {
        return Err(Keep::NodeAffinityTerms {
            volume: name,
            terms: required.node_selector_terms.len(),
        });
    };
    let pinned = match term.match_expressions.as_deref().unwrap_or_default() {
        [e] if e.key == TOPOLOGY_NODE_KEY
            && e.operator == "In"
            && term.match_fields.as_deref().unwrap_or_default().is_empty() =>
        {
            match e.values.as_deref() {
                Some([node]) => Some(node.as_str()),
                _ => None,
            }
        }
        _ => None,
    };
    pinned.ok_or(Keep::NotOnOneNode { volume: name })
}

/// What to do with `observed.claim` when the CSI driver is `driver`: the rules of the module
/// documentation, in order.
pub fn decide(observed: &Observed<'_>, driver: &str) -> Decision {
    match deletion(observed, driver) {
        Ok(deletion) => Decision::Delete(deletion),
        Err(keep) => Decision::Keep(keep),
    }
}

fn deletion(observed: &Observed<'_>, driver: &str) -> Result<Deletion, Keep> {
    let trigger = claim_checks(observed.pod, observed.statefulset, observed.claim)?;
    let node = volume_node(observed.claim, observed.volume, driver)?;
    let node_state = node_state(observed.node).ok_or_else(|| Keep::NodeSchedulable {
        node: node.to_owned(),
    })?;
    let name = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        meta.name.clone().unwrap_or_default()
    };
    Ok(Deletion {
        namespace: observed.pod.metadata.namespace.clone().unwrap_or_default(),
        pod: name(&observed.pod.metadata),
        statefulset: name(&observed.statefulset.metadata),
        claim: name(&observed.claim.metadata),
        claim_uid: observed.claim.metadata.uid.clone(),
        trigger,
        volume: observed
            .volume
            .map(|v| name(&v.metadata))
            .unwrap_or_default(),
        node: node.to_owned(),
        node_state,
    })
}

#[cfg(test)]
mod tests;
