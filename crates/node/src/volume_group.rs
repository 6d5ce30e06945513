//! The volume-group reconciler's pure part: which `LVMVolumeGroup`s this node serves, the node engine's
//! configuration from one, the step to take, and the `VGStatus` the node reports from the engine's
//! result.
//!
//! | state | step |
//! |---|---|
//! | the node selector does not match this node, no finalizer of ours | [`Step::Ignore`] |
//! | being deleted, our finalizer present | [`Step::Cleanup`] |
//! | being deleted without our finalizer | [`Step::Ignore`] |
//! | no finalizer of ours yet ([`node_cleanup_finalizer`]) | [`Step::AddFinalizer`] (before any disk is touched) |
//! | a spec the engine cannot take | [`Step::Report`] a `Failed` status naming the field |
//! | otherwise | [`Step::Converge`] |
//!
//! A node that stops matching the selector while holding the finalizer keeps converging: its volumes
//! stay served until the `LVMVolumeGroup` is deleted, rather than being dropped on a label change.
//!
//! Shared classes (ADR 0016) converge through [`lvms_host::shared::converge`]; what the node adds is
//! pure and here: its sanlock host id from the operator's record ([`assigned_host_id`]), whether its
//! next step needs the creator Lease ([`needs_creator`]), and its status ([`shared_vg_status`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use lvms_api::{
    DeviceDiscoveryPolicy, DeviceDiscoveryPolicyStatus, LVMVolumeGroup, LockspaceState, RaidHealth,
    RaidLvHealth, RaidStatus, SANLOCK_HOST_IDS_CONFIGMAP, SharedVGStatus, VGStatus, VGStatusType,
    node_cleanup_finalizer, selector,
};
use lvms_core::{
    config::{Claims, DeviceClassConfig},
    lvattr::{LvAttr, LvHealth},
    model::{LogicalVolume, PhysicalVolume},
    plan::{ClassPlan, ClassState, DeviceVerdict},
    shared::{self, MAX_HOST_ID, MIN_HOST_ID, fencing},
};
use lvms_host::shared::SharedReport;

/// Whether `vg`'s node selector matches `node` (no selector: every node).
pub fn selects(vg: &LVMVolumeGroup, node: &Node) -> bool {
    vg.spec
        .node_selector
        .as_ref()
        .is_none_or(|s| selector::matches(s, node))
}

/// The next step for one `LVMVolumeGroup`.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Not this node's.
    Ignore,
    /// Add [`node_cleanup_finalizer`].
    AddFinalizer,
    /// Remove the class from this node (when no volumes remain), then the finalizer.
    Cleanup,
    /// Report this status without touching the disks.
    Report(VGStatus),
    /// Run the node engine with this configuration.
    Converge(Box<DeviceClassConfig>),
}

/// The next step for `vg` on `node` (see the [module documentation](self)).
pub fn plan(vg: &LVMVolumeGroup, node: &Node) -> Step {
    let finalizer = node_cleanup_finalizer(&node.name_any());
    let has_finalizer = vg.finalizers().contains(&finalizer);
    if vg.metadata.deletion_timestamp.is_some() {
        return if has_finalizer {
            Step::Cleanup
        } else {
            Step::Ignore
        };
    }
    if !has_finalizer {
        return if selects(vg, node) {
            Step::AddFinalizer
        } else {
            Step::Ignore
        };
    }
    match device_class_config(vg) {
        Ok(config) => Step::Converge(Box::new(config)),
        Err(reason) => Step::Report(VGStatus {
            name: vg.name_any(),
            status: Some(VGStatusType::Failed),
            reason,
            device_discovery_policy: Some(discovery_status(vg)),
            ..VGStatus::default()
        }),
    }
}

pub use lvms_core::from_api::device_class_config;

fn discovery_status(vg: &LVMVolumeGroup) -> DeviceDiscoveryPolicyStatus {
    match vg.spec.device_discovery_policy {
        Some(DeviceDiscoveryPolicy::Dynamic) => DeviceDiscoveryPolicyStatus::RuntimeDynamic,
        Some(DeviceDiscoveryPolicy::Static) | None => DeviceDiscoveryPolicyStatus::RuntimeStatic,
    }
}

/// The health of a RAID class's volumes: every RAID LV of the group with its sync percentage (the
/// visible ones, and a RAID thin pool's hidden data and metadata, `pool_tdata` and `pool_tmeta`),
/// and the group's LVM physical volumes, counting the missing ones. `Failed` when an LV reports
/// failure, `Degraded` when anything is missing, partial, needs a refresh, has mismatches or is not
/// in sync yet, else `Healthy`.
pub fn raid_status(lvs: &[LogicalVolume], pvs: &[PhysicalVolume]) -> RaidStatus {
    let mut worst = RaidHealth::Healthy;
    let mut lv_health = Vec::new();
    let mut min_sync = 100.0_f64;
    let pool_part = |name: &str| {
        name.strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .filter(|n| n.ends_with("_tdata") || n.ends_with("_tmeta"))
            .map(str::to_owned)
    };
    for (lv, name) in lvs
        .iter()
        .filter(|lv| lv.segtype.starts_with("raid"))
        .filter_map(|lv| match pool_part(&lv.name) {
            Some(part) => Some((lv, part)),
            None => (!lv.name.starts_with('[')).then(|| (lv, lv.name.clone())),
        })
    {
        let sync = lv.sync_percent.unwrap_or(100.0);
        min_sync = min_sync.min(sync);
        let health = LvAttr::parse(&lv.attr).map_or(LvHealth::Unknown, |a| a.health());
        let this = match health {
            LvHealth::Failed => RaidHealth::Failed,
            LvHealth::Ok if sync >= 100.0 => RaidHealth::Healthy,
            _ => RaidHealth::Degraded,
        };
        worst = worse(worst, this);
        lv_health.push(RaidLvHealth {
            name,
            raid_type: lv.segtype.clone(),
            sync_percent: sync,
        });
    }
    let missing = pvs.iter().filter(|pv| pv.attr.contains('m')).count();
    if missing > 0 {
        worst = worse(worst, RaidHealth::Degraded);
    }
    RaidStatus {
        status: worst,
        member_count: i32::try_from(pvs.len()).unwrap_or(i32::MAX),
        degraded_member_count: i32::try_from(missing).unwrap_or(i32::MAX),
        min_sync_percent: min_sync,
        lv_health,
    }
}

fn worse(a: RaidHealth, b: RaidHealth) -> RaidHealth {
    let rank = |h: RaidHealth| match h {
        RaidHealth::Healthy => 0,
        RaidHealth::Degraded => 1,
        RaidHealth::Failed => 2,
    };
    if rank(b) > rank(a) { b } else { a }
}

/// The devices the `LVMVolumeGroup`s other than `class` that select `node` list or match: a class
/// never discovers or matches them.
pub fn claims_of_others(vgs: &[LVMVolumeGroup], class: &str, node: &Node) -> Claims {
    let mut out = Claims::default();
    for s in vgs
        .iter()
        .filter(|vg| vg.name_any() != class && selects(vg, node))
        .filter_map(|vg| vg.spec.device_selector.as_ref())
    {
        out.paths
            .extend(s.paths.iter().chain(&s.optional_paths).cloned());
        out.patterns.extend(s.device_patterns.iter().cloned());
    }
    out
}

/// What this node reports for `vg` after the engine's last plan.
pub fn vg_status(vg: &LVMVolumeGroup, plan: &ClassPlan) -> VGStatus {
    let mut devices = Vec::new();
    let mut excluded = Vec::new();
    for d in &plan.devices {
        let name = d.canonical_path.clone().unwrap_or_else(|| d.path.clone());
        match &d.verdict {
            DeviceVerdict::Member => devices.push(name),
            // Still in the group, though no longer configured: listed with why it stays.
            DeviceVerdict::Retained { reason } => {
                devices.push(name.clone());
                excluded.push(lvms_api::ExcludedDevice {
                    name,
                    reasons: vec![reason.clone()],
                });
            }
            DeviceVerdict::Usable { .. } => {}
            DeviceVerdict::Excluded { reasons } => excluded.push(lvms_api::ExcludedDevice {
                name,
                reasons: reasons.iter().map(|r| r.message(&d.subject())).collect(),
            }),
            DeviceVerdict::Missing => excluded.push(lvms_api::ExcludedDevice {
                name,
                reasons: vec![format!(
                    "{} does not exist or is not a block device",
                    d.path
                )],
            }),
        }
    }
    let (status, reason) = match &plan.state {
        ClassState::Ready => (VGStatusType::Ready, String::new()),
        ClassState::Progressing => (VGStatusType::Progressing, String::new()),
        ClassState::Degraded { reason } => (VGStatusType::Degraded, reason.clone()),
        ClassState::Failed { reason } => (VGStatusType::Failed, reason.clone()),
    };
    VGStatus {
        name: vg.name_any(),
        status: Some(status),
        reason,
        devices,
        excluded,
        device_discovery_policy: Some(discovery_status(vg)),
        raid_status: None,
        // The reconciler carries its wipe record over from the previous status.
        wiped_devices: Vec::new(),
        // The reconciler adds them from the engine's report.
        foreign_volumes: Vec::new(),
        shared: None,
    }
}

/// This node's sanlock host id from the operator's record (the data of ConfigMap
/// [`SANLOCK_HOST_IDS_CONFIGMAP`] in `namespace`, `None` when it does not exist), or why there is
/// none yet. The operator assigns the ids; the node never makes one up.
pub fn assigned_host_id(
    record: Option<&BTreeMap<String, String>>,
    node: &str,
    namespace: &str,
) -> Result<u16, String> {
    let Some(text) = record.and_then(|d| d.get(node)) else {
        return Err(format!(
            "the operator has not assigned this node a sanlock host id yet: ConfigMap \
             {namespace}/{SANLOCK_HOST_IDS_CONFIGMAP} has no entry {node} (the operator adds one for \
             every node of a shared class; check that it runs)"
        ));
    };
    text.trim()
        .parse::<u16>()
        .ok()
        .filter(|id| (MIN_HOST_ID..=MAX_HOST_ID).contains(id))
        .ok_or_else(|| {
            format!(
                "the operator has not assigned this node a valid sanlock host id yet: entry {node} \
                 of ConfigMap {namespace}/{SANLOCK_HOST_IDS_CONFIGMAP} is {text:?}, not an id \
                 {MIN_HOST_ID}–{MAX_HOST_ID} (the operator replaces it)"
            )
        })
}

/// Whether the next step for shared class `class` on this node would be `vgcreate --shared` if the
/// node were the creator: only then does it ask for the creator Lease.
pub fn needs_creator(class: &DeviceClassConfig, observed: &shared::Observed) -> bool {
    let as_creator = shared::Observed {
        may_create: true,
        ..observed.clone()
    };
    shared::plan(class, &as_creator)
        .actions
        .iter()
        .any(|a| matches!(a, shared::Action::CreateVolumeGroup { .. }))
}

/// What this node reports for shared class `vg` after [`lvms_host::shared::converge`]: `Ready` once
/// the lockspace is joined, `Progressing` while it waits (`Joining` while lock-start is being
/// retried), `Failed` with the fix. `no_host_id` is why the node has no host id (it replaces the
/// engine's general words); `creator` says who holds the creator Lease while this node waits for it.
pub fn shared_vg_status(
    vg: &LVMVolumeGroup,
    class: &DeviceClassConfig,
    report: &SharedReport,
    no_host_id: Option<&str>,
    creator: Option<&str>,
) -> VGStatus {
    let unarmed = report
        .fencing
        .as_ref()
        .filter(|f| !f.verdict.ready)
        .map(|f| f.verdict.message.clone());
    let (status, lockspace, reason) = match &report.plan.state {
        // Joined, but without armed fencing the class is not served here (ADR 0024).
        shared::State::Joined if unarmed.is_some() => (
            VGStatusType::Failed,
            LockspaceState::Joined,
            unarmed.unwrap_or_default(),
        ),
        shared::State::Joined => (VGStatusType::Ready, LockspaceState::Joined, String::new()),
        shared::State::Waiting { reason } => {
            let reason = match (report.host_id, no_host_id, creator) {
                (None, Some(why), _) => why.to_owned(),
                (Some(_), _, Some(who)) => format!("{reason} ({who})"),
                _ => reason.clone(),
            };
            let lockspace = if report.lock_start_failures.is_empty() {
                LockspaceState::NotJoined
            } else {
                LockspaceState::Joining
            };
            (VGStatusType::Progressing, lockspace, reason)
        }
        shared::State::Failed { reason } => (
            VGStatusType::Failed,
            LockspaceState::NotJoined,
            reason.clone(),
        ),
    };
    VGStatus {
        name: vg.name_any(),
        status: Some(status),
        reason: reason.clone(),
        device_discovery_policy: Some(discovery_status(vg)),
        shared: Some(Box::new(SharedVGStatus {
            devices_visible: report.plan.devices_visible,
            lockspace,
            host_id: report.host_id.map(i32::from),
            // What sanlock keeps, once it says; the class's setting until then.
            io_timeout_seconds: report
                .kept_io_timeout()
                .and_then(|t| i32::try_from(t).ok())
                .or_else(|| class.shared().map(|s| i32::from(s.io_timeout_seconds))),
            reason,
            fencing: report.fencing.as_ref().map(fencing_status),
            live_host_ids: report
                .fencing
                .as_ref()
                .map(|f| f.live_host_ids.iter().map(|id| i32::from(*id)).collect())
                .unwrap_or_default(),
            dead_host_ids: report
                .fencing
                .as_ref()
                .map(|f| f.dead_host_ids.iter().map(|id| i32::from(*id)).collect())
                .unwrap_or_default(),
        })),
        ..VGStatus::default()
    }
}

/// A node's fencing as its status shows it; `leaseRenewalFailures` is 1 while the last renewal
/// attempt failed (or sanlock gave the lockspace up), else 0.
fn fencing_status(f: &lvms_host::shared::FencingReport) -> lvms_api::FencingStatus {
    lvms_api::FencingStatus {
        watchdog: match f.verdict.watchdog {
            fencing::Watchdog::Armed => lvms_api::WatchdogState::Armed,
            fencing::Watchdog::Softdog => lvms_api::WatchdogState::Softdog,
            fencing::Watchdog::Missing => lvms_api::WatchdogState::Missing,
            fencing::Watchdog::Disabled => lvms_api::WatchdogState::Disabled,
        },
        kill_hook: f.verdict.kill_hook,
        lease_renewal_failures: f
            .renewals
            .as_ref()
            .map_or(0, |r| i64::from(r.last_failed || r.renew_fail)),
        message: f.verdict.message.clone(),
        fenced: f.fenced,
    }
}

#[cfg(test)]
mod tests;
