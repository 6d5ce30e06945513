//! Death of a node of a shared class, detected rather than declared (issue 38, ADR 0029): the pure
//! decisions; the I/O half runs in [`crate::controller::node_removal`]'s passes.
//!
//! A node is dead for shared class `C` when both hold:
//! - Kubernetes says it is not Ready (its kubelet stopped reporting, or reports it not Ready), or
//!   it is Ready and its own status says the fence hook fenced it from `C` (`fencing.fenced`: it
//!   lost its leases, say its path to the LUN, and the hook gave its volumes of `C` the error
//!   target; it is alive, and no longer writes to `C`);
//! - sanlock on another node, Ready and joined to `C`, counts its host id dead in `C`'s lockspace
//!   (`shared.deadHostIds` in that node's status: no renewal for the host-dead time, `8N + 60` s),
//!   and no Ready node reports the id live.
//!
//! A fenced node that is still Ready loses the class's topology label (`shared.lvms.topolvm.io/C`),
//! so the scheduler puts no pod of the class there until it joins again; the label is given back
//! once its status shows it joined and not fenced ([`topology_labels`]). It is never tainted out of
//! service: it is alive, with other drivers' volumes attached.
//!
//! sanlock frees a dead host's leases exactly then, because by then the host has stopped writing:
//! its watchdog reset it, or its kill hook gave every device of the class the error target. That
//! holds only with fencing armed, so under `watchdog: Disabled` a dead node is only reported.
//!
//! What the operator then does for a fenced dead node (ADR 0029): it deletes, with grace period 0,
//! the node's pods whose persistent volumes are all volumes of its dead shared classes (as the pod
//! garbage collector would after the `node.kubernetes.io/out-of-service` taint; their controllers
//! make them anew elsewhere), and hands those classes' `LogicalVolume`s over
//! ([`crate::handover::plan`]). A pod that also uses another volume (another driver's, a node-local
//! class's, an inline one) may still have it attached on a node that is fenced from the LUN but
//! alive; it stays, with an Event saying it waits for the admin. The node-wide out-of-service
//! taint, which releases every driver's volumes, is set only when the admin opted in.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use lvms_api::{
    LVMCluster, LVMVolumeGroupNodeStatus, LockspaceState, WatchdogPolicy, shared_topology_key,
    topolvm::LogicalVolume,
};

use crate::eviction::is_ready;

/// A node found dead in one shared class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Death {
    pub node: String,
    pub class: String,
    /// Its sanlock host id in the class (from its last status).
    pub host_id: u16,
    /// The Ready node whose sanlock counts the id dead.
    pub seen_by: String,
    /// The class's fencing is armed (`watchdog: Required`) or the hook fenced the node: it no
    /// longer writes, and the operator may free its pods. Otherwise it is only reported.
    pub fenced: bool,
    /// What showed the node gone from the class besides its lease.
    pub cause: Cause,
}

/// What, besides a dead lease, shows a node gone from a shared class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Kubernetes says it is not Ready.
    NotReady,
    /// It is Ready, and its status says the fence hook fenced it from the class.
    Fenced,
}

impl Death {
    /// The evidence, in words: the start of every message about this death.
    pub fn evidence(&self) -> String {
        match self.cause {
            Cause::NotReady => format!(
                "node {} is not Ready and sanlock on {} counts its host id {} dead in shared class \
                 {}",
                self.node, self.seen_by, self.host_id, self.class
            ),
            Cause::Fenced => format!(
                "node {} lost its leases in shared class {} and the fence hook stopped its volumes \
                 of the class, and sanlock on {} counts its host id {} dead",
                self.node, self.class, self.seen_by, self.host_id
            ),
        }
    }
}

/// The shared classes of `clusters` and their fencing policy.
pub fn shared_policies(clusters: &[LVMCluster]) -> BTreeMap<String, WatchdogPolicy> {
    clusters
        .iter()
        .flat_map(|c| &c.spec.storage.device_classes)
        .filter(|c| c.is_shared())
        .map(|c| {
            let policy = c
                .shared_config
                .as_ref()
                .and_then(|s| s.watchdog)
                .unwrap_or_default();
            (c.name.clone(), policy)
        })
        .collect()
}

/// One node's report of one shared class, from its status.
struct Seen<'a> {
    node: &'a str,
    class: &'a str,
    host_id: Option<u16>,
    live: BTreeSet<u16>,
    dead: BTreeSet<u16>,
    /// The fence hook fenced this node from the class.
    fenced: bool,
    /// Joined to the class's lockspace.
    joined: bool,
}

fn seen(statuses: &[LVMVolumeGroupNodeStatus]) -> Vec<Seen<'_>> {
    let ids = |v: &[i32]| v.iter().filter_map(|i| u16::try_from(*i).ok()).collect();
    statuses
        .iter()
        .flat_map(|s| {
            let node = s.metadata.name.as_deref().unwrap_or_default();
            s.spec.lvm_vg_status.iter().filter_map(move |vg| {
                let shared = vg.shared.as_ref()?;
                Some(Seen {
                    node,
                    class: vg.name.as_str(),
                    host_id: shared.host_id.and_then(|i| u16::try_from(i).ok()),
                    live: ids(&shared.live_host_ids),
                    dead: ids(&shared.dead_host_ids),
                    fenced: shared.fencing.as_ref().is_some_and(|f| f.fenced),
                    joined: shared.lockspace == LockspaceState::Joined,
                })
            })
        })
        .collect()
}

/// The nodes dead in a shared class of `policies`, given every Node and every node status; sorted
/// by node, then class.
pub fn dead_nodes(
    nodes: &[Node],
    statuses: &[LVMVolumeGroupNodeStatus],
    policies: &BTreeMap<String, WatchdogPolicy>,
) -> Vec<Death> {
    let ready: BTreeSet<String> = nodes
        .iter()
        .filter(|n| is_ready(n))
        .map(ResourceExt::name_any)
        .collect();
    let not_ready: BTreeSet<String> = nodes
        .iter()
        .filter(|n| !is_ready(n))
        .map(ResourceExt::name_any)
        .collect();
    let seen = seen(statuses);
    let mut out = Vec::new();
    for s in &seen {
        let (Some(policy), Some(host_id)) = (policies.get(s.class), s.host_id) else {
            continue;
        };
        let cause = if not_ready.contains(s.node) {
            Cause::NotReady
        } else if s.fenced && ready.contains(s.node) {
            Cause::Fenced
        } else {
            continue;
        };
        // Witnesses: Ready nodes of the class, other than the node itself.
        let witnesses = seen
            .iter()
            .filter(|w| w.class == s.class && w.node != s.node && ready.contains(w.node));
        let mut seen_by = None;
        let mut contradicted = false;
        for w in witnesses {
            contradicted |= w.live.contains(&host_id);
            if w.dead.contains(&host_id) && seen_by.is_none() {
                seen_by = Some(w.node);
            }
        }
        if let (Some(by), false) = (seen_by, contradicted) {
            out.push(Death {
                node: s.node.to_owned(),
                class: s.class.to_owned(),
                host_id,
                seen_by: by.to_owned(),
                fenced: *policy == WatchdogPolicy::Required || cause == Cause::Fenced,
                cause,
            });
        }
    }
    out.sort_by(|a, b| (&a.node, &a.class).cmp(&(&b.node, &b.class)));
    out
}

/// The value of a shared class's topology label on a node joined to it (what kubelet sets from
/// NodeGetInfo).
pub const JOINED_LABEL_VALUE: &str = "true";

/// The annotation (`fenced.lvms.topolvm.io/<class>`) that records the operator removed a class's
/// topology label from a fenced node: only such a label is given back.
pub fn fenced_annotation(class: &str) -> String {
    format!("fenced.lvms.topolvm.io/{class}")
}

/// A change of a shared class's topology label on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelChange {
    pub node: String,
    pub class: String,
    /// `true`: remove the label and record it in [`fenced_annotation`]; `false`: give the label
    /// back (`true`) and drop the record.
    pub fence: bool,
}

/// The topology labels to change. A node whose status says it is fenced from a shared class of
/// `policies` and that has the class's label loses it (so no pod of the class is scheduled there),
/// with an annotation saying the operator took it; once its status shows it joined and not
/// fenced, a label the operator took is given back. No other label is touched: kubelet sets them
/// at registration, and they go when the node leaves the class (the value is never changed either:
/// kubelet refuses a plugin whose NodeGetInfo contradicts an existing label).
pub fn topology_labels(
    nodes: &[Node],
    statuses: &[LVMVolumeGroupNodeStatus],
    policies: &BTreeMap<String, WatchdogPolicy>,
) -> Vec<LabelChange> {
    let seen = seen(statuses);
    let mut out = Vec::new();
    for node in nodes {
        let name = node.name_any();
        for s in seen.iter().filter(|s| s.node == name) {
            if !policies.contains_key(s.class) {
                continue;
            }
            let labelled = node.labels().contains_key(&shared_topology_key(s.class));
            let taken = node.annotations().contains_key(&fenced_annotation(s.class));
            let fence = match (s.fenced, labelled, taken, s.joined) {
                (true, true, _, _) => true,
                (false, _, true, true) => false,
                _ => continue,
            };
            out.push(LabelChange {
                node: name.clone(),
                class: s.class.to_owned(),
                fence,
            });
        }
    }
    out
}

/// What becomes of a pod on a dead node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Every persistent volume it uses is a volume of the node's dead, fenced shared classes:
    /// delete it (grace 0) so its controller makes it elsewhere.
    Release,
    /// It also uses these other volumes (a claim's name, or the pod volume's name): it stays, and
    /// an Event says it waits for the admin.
    WaitsForAdmin(Vec<String>),
}

/// What the pass knows of claims and volumes to judge a pod.
pub struct Volumes<'a> {
    /// This CSI driver's name.
    pub driver: &'a str,
    /// Claims by namespace and name.
    pub claims: BTreeMap<(String, String), &'a PersistentVolumeClaim>,
    /// PersistentVolumes by name.
    pub pvs: BTreeMap<String, &'a PersistentVolume>,
    /// LogicalVolumes by name (a PV's handle), with the default class for an empty `deviceClass`.
    pub lvs: BTreeMap<String, &'a LogicalVolume>,
    pub default_class: Option<&'a str>,
}

impl<'a> Volumes<'a> {
    pub fn new(
        driver: &'a str,
        claims: &'a [PersistentVolumeClaim],
        pvs: &'a [PersistentVolume],
        lvs: &'a [LogicalVolume],
        default_class: Option<&'a str>,
    ) -> Self {
        Self {
            driver,
            claims: claims
                .iter()
                .map(|c| ((c.namespace().unwrap_or_default(), c.name_any()), c))
                .collect(),
            pvs: pvs.iter().map(|p| (p.name_any(), p)).collect(),
            lvs: lvs.iter().map(|l| (l.name_any(), l)).collect(),
            default_class,
        }
    }

    /// The shared class of the volume claim `ns/claim` is bound to, when it is one of ours.
    fn class_of_claim(&self, ns: &str, claim: &str) -> Option<&'a str> {
        let c = self.claims.get(&(ns.to_owned(), claim.to_owned()))?;
        let pv = self.pvs.get(c.spec.as_ref()?.volume_name.as_deref()?)?;
        let csi = pv.spec.as_ref()?.csi.as_ref()?;
        if csi.driver != self.driver {
            return None;
        }
        let lv = self.lvs.get(&csi.volume_handle)?;
        match lv.spec.device_class.as_str() {
            "" => self.default_class,
            c => Some(c),
        }
    }
}

/// What becomes of `pod` on a node dead (and fenced) in `classes`; `None` when it uses no volume
/// of those classes (the pass leaves it to Kubernetes).
pub fn pod_fate(pod: &Pod, classes: &BTreeSet<String>, volumes: &Volumes<'_>) -> Option<Fate> {
    let ns = pod.namespace().unwrap_or_default();
    let mut ours = 0;
    let mut others = Vec::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.as_ref())? {
        // A generic ephemeral volume's claim is `<pod>-<volume>`.
        let claim = v
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.clone())
            .or_else(|| {
                v.ephemeral
                    .as_ref()
                    .map(|_| format!("{}-{}", pod.name_any(), v.name))
            });
        if let Some(claim) = claim {
            match volumes.class_of_claim(&ns, &claim) {
                Some(class) if classes.contains(class) => ours += 1,
                _ => others.push(claim),
            }
            continue;
        }
        // What a pod may leave behind on a dead node without losing or blocking anything: the
        // node's own files and what the API server holds.
        let harmless = v.empty_dir.is_some()
            || v.config_map.is_some()
            || v.secret.is_some()
            || v.projected.is_some()
            || v.downward_api.is_some()
            || v.host_path.is_some()
            || v.image.is_some();
        if !harmless {
            others.push(v.name.clone());
        }
    }
    match (ours, others.is_empty()) {
        (0, _) => None,
        (_, true) => Some(Fate::Release),
        (_, false) => Some(Fate::WaitsForAdmin(others)),
    }
}

/// The Event message on a pod that stays on a dead node.
pub fn waits_message(death: &Death, others: &[String]) -> String {
    let fix = match death.cause {
        Cause::NotReady => {
            "once the node is off, taint it \
             node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (or delete the pod) to move it"
        }
        Cause::Fenced => {
            "the node still runs, with those volumes attached: delete the pod to move it once they \
             can follow"
        }
    };
    format!(
        "{}, but this pod also uses {}, which lvms-rs does not release: {fix}",
        death.evidence(),
        others.join(", ")
    )
}

#[cfg(test)]
mod tests;
