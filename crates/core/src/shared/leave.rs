//! Leaving a shared class: what one node does when the class is removed from it. Every node stops
//! its lockspace; one node, the *remover* (the holder of the class's creator Lease; standalone: the
//! node configured with `createVolumeGroups`), then removes the volume group, its physical volume
//! labels and its devices file — only when the group holds no logical volume but empty thin pools
//! of ours. Anything else left in the group is `ManualCleanupRequired`, named, on every node, and
//! every node keeps its lockspace (and keeps serving the class), so the volumes can still be deleted
//! through their claims.
//!
//! The remover cannot know when the others have stopped: LVM can. `vgremove` of a sanlock group
//! fails with "lockspace is not stopped on other hosts" until every other host's lease is gone, and
//! the caller maps that to [`LeaveState::Waiting`] and tries again later.
//!
//! The steps, each checked before the next:
//! 1. the daemons run — otherwise the remover `Failed` (it needs them to remove the group); another
//!    node holds no lockspace without lvmlockd and leaves;
//! 2. the group is not visible here (removed, or this node never saw the LUN): the remover removes
//!    the orphan physical volume labels on the LUNs; then the devices file goes — `Left`;
//! 3. the group is a sanlock group made by lvms-rs — otherwise the remover refuses
//!    (`ManualCleanupRequired`), and the others leave without touching it;
//! 4. no logical volume remains but empty thin pools — otherwise every node refuses, naming them;
//! 5. not the remover: stop the lockspace, remove the devices file — `Left` (while it is not known
//!    who removes, nothing is done);
//! 6. the remover: start the lockspace if stopped, remove the empty pools, remove the group.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{Daemon, Daemons, SharedVg, daemon_problem, devices_file};
use crate::config::VG_OWNER_TAG;
pub use crate::leave::LeaveState;

/// A logical volume of the shared group, as a lockd-enabled `lvs` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedLv {
    pub name: String,
    /// `linear`, `thin-pool`, `thin`, …
    pub segtype: String,
    /// For a thin volume, its pool.
    pub pool_lv: Option<String>,
}

/// Everything [`plan_leave`] looks at, for one shared class on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaveObserved {
    pub daemons: Daemons,
    pub host_id: Option<u16>,
    /// Whether this node removes the volume group.
    pub remover: bool,
    /// Why it is not known yet whether this node removes the group (the creator Lease could not
    /// be read or taken): nothing is stopped or removed meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undecided: Option<String>,
    /// Canonical device paths the class's devices file lists (empty: no file).
    pub devices_file: BTreeSet<String>,
    pub vg: Option<SharedVg>,
    /// Canonical paths in the devices file that are LVM physical volumes of no volume group.
    pub orphan_pvs: BTreeSet<String>,
    pub lockspace_started: bool,
    /// The group's logical volumes (hidden ones and `lvmlock` left out).
    pub lvs: Vec<SharedLv>,
}

/// One step of leaving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum LeaveAction {
    /// `vgchange --lock-start` (the remover needs the lockspace to remove the group).
    StartLockspace { vg: String, host_id: u16 },
    /// `lvremove` of an empty thin pool.
    RemovePool { vg: String, pool: String },
    /// `vgremove` (which also stops this node's lockspace); refused by LVM while another host has
    /// the lockspace started.
    RemoveVolumeGroup { vg: String },
    /// `pvremove` of the LUNs' labels through devices file `file`, without lvmlockd (no shared
    /// group holds them any more).
    RemovePhysicalVolumes { file: String, pvs: Vec<String> },
    /// `vgchange --lock-stop`.
    StopLockspace { vg: String },
    /// Deletes the class's devices file.
    RemoveDevicesFile { file: String },
}

/// The plan of a shared class's leaving.
pub type LeavePlan = crate::leave::LeavePlan<LeaveAction>;

/// The logical volumes that keep the group: all but thin pools no thin volume uses.
pub fn remaining(lvs: &[SharedLv]) -> Vec<&str> {
    let used: BTreeSet<&str> = lvs.iter().filter_map(|lv| lv.pool_lv.as_deref()).collect();
    lvs.iter()
        .filter(|lv| lv.segtype != "thin-pool" || used.contains(lv.name.as_str()))
        .map(|lv| lv.name.as_str())
        .collect()
}

/// This node's next steps in leaving shared class `class`.
pub fn plan_leave(class: &str, observed: &LeaveObserved) -> LeavePlan {
    let file = devices_file(class);
    let daemons_run =
        observed.daemons.sanlock == Daemon::Running && observed.daemons.lvmlockd == Daemon::Running;
    if !daemons_run {
        if !observed.remover {
            // Without lvmlockd this node holds no lockspace (and cannot read the group); the group
            // is the remover's.
            return leave_alone(class, observed, &file);
        }
        let problems: Vec<String> = [
            daemon_problem("sanlock", "sanlock", &observed.daemons.sanlock),
            daemon_problem("lvmlockd", "lvm2-lockd", &observed.daemons.lvmlockd),
        ]
        .into_iter()
        .flatten()
        .collect();
        return LeavePlan::stop(LeaveState::Failed {
            reason: format!(
                "this node removes shared volume group {class} and needs its lock daemons: {}",
                problems.join("; ")
            ),
        });
    }
    let Some(vg) = &observed.vg else {
        if observed.remover && !observed.orphan_pvs.is_empty() {
            return LeavePlan::act(
                vec![LeaveAction::RemovePhysicalVolumes {
                    file,
                    pvs: observed.orphan_pvs.iter().cloned().collect(),
                }],
                format!("removing the LVM labels the volume group {class} left on its LUNs"),
            );
        }
        return leave_alone(class, observed, &file);
    };
    if vg.lock_type != "sanlock" || !vg.tags.iter().any(|t| t == VG_OWNER_TAG) {
        if !observed.remover {
            return leave_alone(class, observed, &file);
        }
        return LeavePlan::stop(LeaveState::Refused {
            reason: format!(
                "ManualCleanupRequired: volume group {class} on {} is not a sanlock volume group \
                 tagged {VG_OWNER_TAG}, so lvms-rs leaves it alone; remove it by hand and cleanup \
                 continues",
                vg.pvs.join(", ")
            ),
        });
    }
    let left = remaining(&observed.lvs);
    if !left.is_empty() {
        return LeavePlan::stop(LeaveState::Refused {
            reason: format!(
                "ManualCleanupRequired: logical volumes remain in shared volume group {class}: {}; \
                 delete their PersistentVolumeClaims (or remove them with lvremove on a node that \
                 joined the group) and cleanup continues",
                left.join(", ")
            ),
        });
    }
    if let Some(why) = &observed.undecided {
        return LeavePlan::stop(LeaveState::Waiting {
            reason: format!("not yet known which node removes shared volume group {class}: {why}"),
        });
    }
    if !observed.remover {
        return leave_alone(class, observed, &file);
    }
    let Some(host_id) = observed.host_id else {
        return LeavePlan::stop(LeaveState::Waiting {
            reason: format!(
                "this node removes shared volume group {class} and has no sanlock host id to \
                 start its lockspace with"
            ),
        });
    };
    if !observed.lockspace_started {
        return LeavePlan::act(
            vec![LeaveAction::StartLockspace {
                vg: class.to_owned(),
                host_id,
            }],
            format!("joining the lockspace of {class} to remove the group"),
        );
    }
    let mut actions: Vec<LeaveAction> = observed
        .lvs
        .iter()
        .map(|lv| LeaveAction::RemovePool {
            vg: class.to_owned(),
            pool: lv.name.clone(),
        })
        .collect();
    actions.push(LeaveAction::RemoveVolumeGroup {
        vg: class.to_owned(),
    });
    LeavePlan::act(actions, format!("removing shared volume group {class}"))
}

/// A node other than the remover: stop the lockspace, drop the devices file.
fn leave_alone(class: &str, observed: &LeaveObserved, file: &str) -> LeavePlan {
    let mut actions = Vec::new();
    if observed.lockspace_started {
        actions.push(LeaveAction::StopLockspace {
            vg: class.to_owned(),
        });
    }
    if !observed.devices_file.is_empty() {
        actions.push(LeaveAction::RemoveDevicesFile {
            file: file.to_owned(),
        });
    }
    if actions.is_empty() {
        return LeavePlan::stop(LeaveState::Left);
    }
    LeavePlan::act(
        actions,
        format!("leaving shared volume group {class} (another node removes it)"),
    )
}

/// What a remover's `vgremove` answer means when other hosts still hold the lockspace.
pub fn others_still_joined(class: &str) -> LeaveState {
    LeaveState::Waiting {
        reason: format!(
            "other nodes still have the lockspace of {class} started: each stops it when it sees \
             the class removed; a node that is down keeps it until sanlock declares it dead, or \
             until `vgchange --lock-stop {class}` runs there"
        ),
    }
}

#[cfg(test)]
mod tests;
