//! `LVMCluster.status`, aggregated from what the nodes report.
//!
//! The state is about what the spec asks for: every device class on every node it selects.
//! - `Ready` only when the operator's objects are applied and every selected node reports every
//!   class `Ready`;
//! - `Failed` when applying the objects failed, a node reports a class `Failed` (or its RAID
//!   failed), or a class selects no node at all (its volumes could never be provisioned);
//! - else `Degraded` when a node reports a class `Degraded` (or its RAID degraded);
//! - else `Progressing` (objects being applied, reports missing or `Progressing`).
//!
//! A shared class whose `sharedConfig.watchdog` is `Required` (or unset) is not ready on a node
//! whose report says fencing is not armed there (watchdog `Missing`, or no kill hook): that node
//! counts as `Degraded`, with the node's message. `Softdog` counts as ready with a warning; with
//! `Disabled` the message says the admin disabled fencing. Warnings are appended to the
//! `VolumeGroupsReady` message. A report without `fencing` (an older node agent) is not judged.
//!
//! Conditions keep their `lastTransitionTime` while their status stays the same, as
//! `meta.SetStatusCondition` does; condition types other than ours are kept as they were.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use k8s_openapi::{
    api::core::v1::{Node, NodeSelector},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use lvms_api::{
    CONDITION_RESOURCES_AVAILABLE, CONDITION_VOLUME_GROUPS_READY, DeviceClass, DeviceClassStatus,
    LVMCluster, LVMClusterStatus, LVMStateType, LVMVolumeGroupNodeStatus, LockspaceState,
    NodeStatus, RaidHealth, SharedTiming, VGStatus, VGStatusType, WatchdogPolicy, WatchdogState,
};

use crate::selector;

/// `ResourcesAvailable` reason: every object is applied (LVMS's reason).
pub const REASON_RESOURCES_AVAILABLE: &str = "ResourcesAvailable";
/// `ResourcesAvailable` reason: objects are being applied (LVMS's reason).
pub const REASON_RECONCILIATION_IN_PROGRESS: &str = "ReconciliationInProgress";
/// `ResourcesAvailable` reason: applying an object failed (LVMS's reason).
pub const REASON_RESOURCES_SYNC_FAILED: &str = "ResourcesSyncFailed";
/// `VolumeGroupsReady` reason: every volume group is ready (LVMS's reason).
pub const REASON_VGS_READY: &str = "VGsReady";
/// `VolumeGroupsReady` reason: some are missing or progressing (LVMS's reason).
pub const REASON_VG_READINESS_IN_PROGRESS: &str = "VGReadinessInProgress";
/// `VolumeGroupsReady` reason: some are degraded (LVMS's reason).
pub const REASON_VGS_DEGRADED: &str = "VGsDegraded";
/// `VolumeGroupsReady` reason: some failed (LVMS's reason).
pub const REASON_VGS_FAILED: &str = "VGsFailed";

/// At most this many problems are spelled out in a condition message; the rest are counted.
pub const MAX_LISTED_PROBLEMS: usize = 10;

/// How applying the rendered objects went, as the reconciler saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceSync {
    /// Every object is applied.
    Applied,
    /// Not done yet (first reconcile, or waiting on something retried later).
    InProgress,
    /// Applying failed; the message names the object and the cause.
    Failed(String),
}

/// Health of one volume group on one node, or of the whole; ordered from best to worst.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Health {
    Ready,
    Progressing,
    Degraded,
    Failed,
}

impl Health {
    fn state(self) -> LVMStateType {
        match self {
            Health::Ready => LVMStateType::Ready,
            Health::Progressing => LVMStateType::Progressing,
            Health::Degraded => LVMStateType::Degraded,
            Health::Failed => LVMStateType::Failed,
        }
    }

    fn of(vg: &VGStatus) -> Health {
        let reported = match vg.status {
            Some(VGStatusType::Ready) => Health::Ready,
            Some(VGStatusType::Progressing) | None => Health::Progressing,
            Some(VGStatusType::Degraded) => Health::Degraded,
            Some(VGStatusType::Failed) => Health::Failed,
        };
        let raid = match vg.raid_status.as_ref().map(|r| r.status) {
            Some(RaidHealth::Failed) => Health::Failed,
            Some(RaidHealth::Degraded) => Health::Degraded,
            Some(RaidHealth::Healthy) | None => Health::Ready,
        };
        reported.max(raid)
    }
}

/// What the status makes of one node's report of one class: its health, why fencing makes it not
/// ready (if it does), and a warning that does not.
struct Verdict {
    health: Health,
    not_fenced: Option<String>,
    warning: Option<String>,
}

/// Judges one node's report of `class`: the reported state and RAID health ([`Health::of`]),
/// and for a shared class whose fencing is `Required`, the node's fencing.
fn judge(class: &DeviceClass, node: &str, vg: &VGStatus) -> Verdict {
    let mut verdict = Verdict {
        health: Health::of(vg),
        not_fenced: None,
        warning: None,
    };
    if !class.is_shared()
        || class.shared_config_or_default().watchdog_or_default() == WatchdogPolicy::Disabled
    {
        return verdict;
    }
    let Some(fencing) = vg.shared.as_ref().and_then(|s| s.fencing.as_ref()) else {
        return verdict;
    };
    let message = if fencing.message.is_empty() {
        String::new()
    } else {
        format!(": {}", fencing.message)
    };
    if !fencing.watchdog.is_armed() || !fencing.kill_hook {
        let mut missing = Vec::new();
        if !fencing.watchdog.is_armed() {
            missing.push(format!("watchdog {}", fencing.watchdog));
        }
        if !fencing.kill_hook {
            missing.push("lvmlockctl_kill_command is not the lvms fence hook".to_owned());
        }
        verdict.health = verdict.health.max(Health::Degraded);
        verdict.not_fenced = Some(format!(
            "fencing is not armed ({}){message}; or set sharedConfig.watchdog: Disabled to opt out",
            missing.join(", ")
        ));
    } else if fencing.watchdog == WatchdogState::Softdog {
        verdict.warning = Some(format!(
            "device class {} on node {node}: the watchdog is softdog, which a hung kernel may not \
             fire; use a hardware watchdog{message}",
            class.name
        ));
    }
    verdict
}

/// One thing that is not ready, for the condition message.
struct Problem {
    health: Health,
    text: String,
}

fn describe(class: &str, node: &str, vg: &VGStatus, not_fenced: Option<&str>) -> String {
    let mut text = format!("device class {class} on node {node}: ");
    match (vg.status, not_fenced) {
        (Some(VGStatusType::Ready), Some(_)) => {}
        (Some(status), _) => text.push_str(status.as_str()),
        (None, _) => text.push_str("no status yet"),
    }
    if !vg.reason.is_empty() {
        let _ = write!(text, " ({})", vg.reason);
    }
    if let Some(not_fenced) = not_fenced {
        if vg.status != Some(VGStatusType::Ready) {
            text.push_str("; ");
        }
        text.push_str(not_fenced);
    }
    if let Some(raid) = vg
        .raid_status
        .as_ref()
        .filter(|r| r.status != RaidHealth::Healthy)
    {
        let _ = write!(
            text,
            "; RAID {}: {} of {} members missing or failed, lowest sync {}%",
            raid.status, raid.degraded_member_count, raid.member_count, raid.min_sync_percent
        );
    }
    text
}

/// Aggregates the nodes' reports into the cluster's status.
///
/// - `node_statuses`: the `LVMVolumeGroupNodeStatus` objects (named after their nodes);
/// - `expected_nodes`: per device class, the nodes it selects ([`expected_nodes`] computes it); a
///   class missing from the map selects no node;
/// - `resources`: how applying the rendered objects went;
/// - `now`: the time recorded on conditions whose status changes.
///
/// The previous conditions are read from `cluster.status`.
pub fn aggregate(
    cluster: &LVMCluster,
    node_statuses: &[LVMVolumeGroupNodeStatus],
    expected_nodes: &BTreeMap<String, Vec<String>>,
    resources: &ResourceSync,
    now: &Time,
) -> LVMClusterStatus {
    let classes = &cluster.spec.storage.device_classes;

    // (class, node) -> report; the first report wins if a node lists a class twice.
    let mut reports: BTreeMap<(&str, &str), &VGStatus> = BTreeMap::new();
    for status in node_statuses {
        let node = status.metadata.name.as_deref().unwrap_or_default();
        if node.is_empty() {
            continue;
        }
        for vg in &status.spec.lvm_vg_status {
            reports.entry((vg.name.as_str(), node)).or_insert(vg);
        }
    }

    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    let mut ready_pairs = 0usize;
    let mut ready_nodes = BTreeSet::new();
    for class in classes {
        if class.is_shared()
            && class.shared_config_or_default().watchdog_or_default() == WatchdogPolicy::Disabled
        {
            warnings.push(format!(
                "device class {}: fencing is disabled by the admin (sharedConfig.watchdog: \
                 Disabled), so a node that loses its leases may keep writing to volumes another \
                 node takes over",
                class.name
            ));
        }
        let nodes: BTreeSet<&str> = expected_nodes
            .get(&class.name)
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if nodes.is_empty() {
            problems.push(Problem {
                health: Health::Failed,
                text: format!(
                    "device class {} selects no node: no node matches its nodeSelector and tolerates \
                     its taints with spec.tolerations; label nodes, add tolerations or change the \
                     selector",
                    class.name
                ),
            });
        }
        for node in nodes {
            match reports.get(&(class.name.as_str(), node)) {
                None => problems.push(Problem {
                    health: Health::Progressing,
                    text: format!(
                        "device class {} on node {node}: not reported yet (is the vg-manager pod running there?)",
                        class.name
                    ),
                }),
                Some(vg) => {
                    let verdict = judge(class, node, vg);
                    warnings.extend(verdict.warning);
                    if verdict.health == Health::Ready {
                        ready_pairs += 1;
                        ready_nodes.insert(node);
                    } else {
                        problems.push(Problem {
                            health: verdict.health,
                            text: describe(&class.name, node, vg, verdict.not_fenced.as_deref()),
                        });
                    }
                }
            }
        }
    }

    let vg_health = problems
        .iter()
        .map(|p| p.health)
        .max()
        .unwrap_or(Health::Ready);
    let mut vg_condition = match vg_health {
        Health::Ready => condition(
            CONDITION_VOLUME_GROUPS_READY,
            true,
            REASON_VGS_READY,
            format!(
                "all {ready_pairs} volume groups are ready ({} device classes on {} nodes)",
                classes.len(),
                ready_nodes.len()
            ),
        ),
        worst => {
            let reason = match worst {
                Health::Failed => REASON_VGS_FAILED,
                Health::Degraded => REASON_VGS_DEGRADED,
                _ => REASON_VG_READINESS_IN_PROGRESS,
            };
            condition(
                CONDITION_VOLUME_GROUPS_READY,
                false,
                reason,
                problem_message(problems),
            )
        }
    };
    append_warnings(&mut vg_condition.message, &warnings);

    let (resources_health, resources_condition) = match resources {
        ResourceSync::Applied => (
            Health::Ready,
            condition(
                CONDITION_RESOURCES_AVAILABLE,
                true,
                REASON_RESOURCES_AVAILABLE,
                "every object the LVMCluster stands for is applied".into(),
            ),
        ),
        ResourceSync::InProgress => (
            Health::Progressing,
            condition(
                CONDITION_RESOURCES_AVAILABLE,
                false,
                REASON_RECONCILIATION_IN_PROGRESS,
                "the objects the LVMCluster stands for are being applied".into(),
            ),
        ),
        ResourceSync::Failed(message) => (
            Health::Failed,
            condition(
                CONDITION_RESOURCES_AVAILABLE,
                false,
                REASON_RESOURCES_SYNC_FAILED,
                format!("applying the objects the LVMCluster stands for failed: {message}"),
            ),
        ),
    };

    let previous = cluster
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let generation = cluster.metadata.generation;
    let mut conditions: Vec<Condition> = [resources_condition, vg_condition]
        .into_iter()
        .map(|c| finish_condition(c, previous, generation, now))
        .collect();
    conditions.extend(
        previous
            .iter()
            .filter(|c| {
                c.type_ != CONDITION_RESOURCES_AVAILABLE && c.type_ != CONDITION_VOLUME_GROUPS_READY
            })
            .cloned(),
    );

    let state = resources_health.max(vg_health).state();
    LVMClusterStatus {
        ready: state == LVMStateType::Ready,
        state: Some(state),
        conditions,
        device_class_statuses: device_class_statuses(cluster, node_statuses),
    }
}

/// Worst problems first, at most [`MAX_LISTED_PROBLEMS`] of them.
fn problem_message(mut problems: Vec<Problem>) -> String {
    // Stable: within a severity, device-class order then node order, as found.
    problems.sort_by_key(|p| std::cmp::Reverse(p.health));
    let total = problems.len();
    let mut message = problems
        .iter()
        .take(MAX_LISTED_PROBLEMS)
        .map(|p| p.text.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if total > MAX_LISTED_PROBLEMS {
        let _ = write!(message, "; and {} more", total - MAX_LISTED_PROBLEMS);
    }
    message
}

/// Appends `warnings` to a condition message, at most [`MAX_LISTED_PROBLEMS`] of them.
fn append_warnings(message: &mut String, warnings: &[String]) {
    for warning in warnings.iter().take(MAX_LISTED_PROBLEMS) {
        let _ = write!(message, "; warning: {warning}");
    }
    if warnings.len() > MAX_LISTED_PROBLEMS {
        let _ = write!(
            message,
            "; and {} more warnings",
            warnings.len() - MAX_LISTED_PROBLEMS
        );
    }
}

fn condition(type_: &str, status: bool, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: None,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

/// Sets the generation and the transition time: the previous one while the status is unchanged.
fn finish_condition(
    mut new: Condition,
    previous: &[Condition],
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    new.observed_generation = generation;
    new.last_transition_time = previous
        .iter()
        .find(|c| c.type_ == new.type_ && c.status == new.status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    new
}

/// Per device class in the spec (in spec order), every node's report of it, sorted by node, and
/// for a shared class the nodes that joined its lockspace (sorted) and its timing. Reports of classes no longer in
/// the spec are left out; a class nobody reported has no nodes.
fn device_class_statuses(
    cluster: &LVMCluster,
    node_statuses: &[LVMVolumeGroupNodeStatus],
) -> Vec<DeviceClassStatus> {
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .map(|class| {
            let mut node_status: Vec<NodeStatus> = Vec::new();
            for status in node_statuses {
                let node = status.metadata.name.as_deref().unwrap_or_default();
                if node.is_empty() || node_status.iter().any(|n| n.node == node) {
                    continue;
                }
                if let Some(vg) = status
                    .spec
                    .lvm_vg_status
                    .iter()
                    .find(|vg| vg.name == class.name)
                {
                    node_status.push(NodeStatus {
                        node: node.to_owned(),
                        vg_status: vg.clone(),
                    });
                }
            }
            node_status.sort_by(|a, b| a.node.cmp(&b.node));
            let joined_nodes = if class.is_shared() {
                node_status
                    .iter()
                    .filter(|n| {
                        n.vg_status
                            .shared
                            .as_ref()
                            .is_some_and(|s| s.lockspace == LockspaceState::Joined)
                    })
                    .map(|n| n.node.clone())
                    .collect()
            } else {
                Vec::new()
            };
            // What the joined nodes' sanlock keeps, which may differ from the class's setting
            // (their status says so).
            let shared_timing = class.is_shared().then(|| {
                SharedTiming::kept(
                    &class.shared_config_or_default(),
                    node_status.iter().filter_map(|n| {
                        n.vg_status
                            .shared
                            .as_ref()
                            .filter(|s| s.lockspace == LockspaceState::Joined)
                            .and_then(|s| s.io_timeout_seconds)
                    }),
                )
            });
            DeviceClassStatus {
                name: class.name.clone(),
                node_status,
                joined_nodes,
                shared_timing,
            }
        })
        .collect()
}

/// The names of the nodes `selector` selects, sorted: every node when there is no selector
/// (Kubernetes `NodeSelector` semantics, see [`selector::matches`]).
pub fn nodes_for_class(selector: Option<&NodeSelector>, nodes: &[Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes
        .iter()
        .filter(|node| selector.is_none_or(|s| selector::matches(s, node)))
        .filter_map(|node| node.metadata.name.clone())
        .filter(|name| !name.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Per device class of `cluster`, the nodes its volume group should exist on: the nodes the node
/// pods can run on (every `NoSchedule`/`NoExecute` taint tolerated by `spec.tolerations` or by
/// the DaemonSet controller) that the class's node selector selects. Nodes being deleted are left
/// out: they are leaving, and their reports should not hold the cluster back.
pub fn expected_nodes(cluster: &LVMCluster, nodes: &[Node]) -> BTreeMap<String, Vec<String>> {
    let eligible: Vec<Node> = nodes
        .iter()
        .filter(|node| node.metadata.deletion_timestamp.is_none())
        .filter(|node| selector::daemon_pod_tolerates(&cluster.spec.tolerations, node))
        .cloned()
        .collect();
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .map(|class| {
            (
                class.name.clone(),
                nodes_for_class(class.node_selector.as_ref(), &eligible),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests;
