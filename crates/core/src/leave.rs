//! Leaving a device class: what one node does when the class is removed from it. Both kinds of
//! class end in the same [`LeaveState`]s through a [`LeavePlan`] of their own steps: [`LocalStep`]
//! here for a class on this node's disks, [`crate::shared::leave::LeaveAction`] for a shared one
//! (planned in [`crate::shared::leave`]).
//!
//! A node-local class leaves in three checks:
//! 1. no volume group of the class's name on this node: `Left`;
//! 2. the group is not tagged ours, or holds a logical volume other than the class's thin pool:
//!    `Refused` (`ManualCleanupRequired`, naming it); the class stays served, so its volumes can
//!    still be deleted through their claims;
//! 3. otherwise: remove the pool, the group, and the LVM labels of its physical volumes.

use serde::{Deserialize, Serialize};

use crate::config::{DeviceClassConfig, VG_OWNER_TAG};

/// Where leaving stands on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum LeaveState {
    /// Nothing of the class is left on this node: its finalizer can go.
    Left,
    /// Steps are under way, or other nodes have to leave first.
    Waiting { reason: String },
    /// Something lvms-rs will not remove remains; `reason` starts with `ManualCleanupRequired`
    /// and names it.
    Refused { reason: String },
    /// Cannot go on until someone fixes what `reason` says.
    Failed { reason: String },
}

/// The next steps (of a class kind's step type `A`) and the state they lead from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeavePlan<A> {
    pub actions: Vec<A>,
    pub state: LeaveState,
}

impl<A> LeavePlan<A> {
    /// No step: the plan stops in `state`.
    pub fn stop(state: LeaveState) -> Self {
        Self {
            actions: Vec::new(),
            state,
        }
    }

    /// `actions`, under way for `reason`.
    pub fn act(actions: Vec<A>, reason: String) -> Self {
        Self {
            actions,
            state: LeaveState::Waiting { reason },
        }
    }
}

/// One step of a node-local class leaving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum LocalStep {
    /// `lvremove` of the class's (empty) thin pool.
    RemovePool { vg: String, pool: String },
    /// `vgremove`.
    RemoveVolumeGroup { vg: String },
    /// `pvremove` of the devices that were the group's physical volumes.
    RemovePhysicalVolumes { pvs: Vec<String> },
}

/// The class's volume group on this node, as [`plan_local`] needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalVg {
    pub tags: Vec<String>,
    /// Its logical volumes' names, hidden ones (`[...]`) left out.
    pub lvs: Vec<String>,
    /// Its physical volumes' device paths.
    pub pvs: Vec<String>,
}

/// This node's next steps in leaving node-local class `class`, whose volume group here is `vg`.
pub fn plan_local(class: &DeviceClassConfig, vg: Option<&LocalVg>) -> LeavePlan<LocalStep> {
    let name = &class.name;
    let Some(vg) = vg else {
        return LeavePlan::stop(LeaveState::Left);
    };
    if !vg.tags.iter().any(|t| t == VG_OWNER_TAG) {
        return LeavePlan::stop(LeaveState::Refused {
            reason: format!(
                "ManualCleanupRequired: volume group {name} is not tagged {VG_OWNER_TAG}, so lvms \
                 leaves it alone; remove it by hand"
            ),
        });
    }
    let pool = class.thin_pool();
    let remaining: Vec<&str> = vg
        .lvs
        .iter()
        .map(String::as_str)
        .filter(|n| Some(*n) != pool && !n.starts_with('['))
        .collect();
    if !remaining.is_empty() {
        return LeavePlan::stop(LeaveState::Refused {
            reason: format!(
                "ManualCleanupRequired: logical volumes remain in volume group {name}: {}; delete \
                 their PersistentVolumeClaims (or remove them with lvremove) and cleanup continues",
                remaining.join(", ")
            ),
        });
    }
    let mut actions = Vec::new();
    if let Some(pool) = pool.filter(|p| vg.lvs.iter().any(|lv| lv == p)) {
        actions.push(LocalStep::RemovePool {
            vg: name.clone(),
            pool: pool.to_owned(),
        });
    }
    actions.push(LocalStep::RemoveVolumeGroup { vg: name.clone() });
    if !vg.pvs.is_empty() {
        actions.push(LocalStep::RemovePhysicalVolumes {
            pvs: vg.pvs.clone(),
        });
    }
    LeavePlan::act(actions, format!("removing volume group {name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vg(tags: &[&str], lvs: &[&str]) -> LocalVg {
        LocalVg {
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            lvs: lvs.iter().map(|l| (*l).to_owned()).collect(),
            pvs: vec!["/dev/vdb".into(), "/dev/vdc".into()],
        }
    }

    fn thin() -> DeviceClassConfig {
        DeviceClassConfig::named("vg1").with_thin_pool("pool", 10)
    }

    #[test]
    fn a_class_without_a_volume_group_here_has_left() {
        assert_eq!(plan_local(&thin(), None), LeavePlan::stop(LeaveState::Left));
    }

    #[test]
    fn an_empty_group_of_ours_goes_pool_first_then_group_then_labels() {
        let plan = plan_local(
            &thin(),
            Some(&vg(&[VG_OWNER_TAG], &["pool", "[pool_tdata]"])),
        );
        assert_eq!(
            plan.actions,
            [
                LocalStep::RemovePool {
                    vg: "vg1".into(),
                    pool: "pool".into()
                },
                LocalStep::RemoveVolumeGroup { vg: "vg1".into() },
                LocalStep::RemovePhysicalVolumes {
                    pvs: vec!["/dev/vdb".into(), "/dev/vdc".into()]
                },
            ]
        );
        assert!(matches!(plan.state, LeaveState::Waiting { .. }));
        // A thick class has no pool to remove.
        let thick = plan_local(
            &DeviceClassConfig::named("vg1"),
            Some(&vg(&[VG_OWNER_TAG], &[])),
        );
        assert_eq!(
            thick.actions[0],
            LocalStep::RemoveVolumeGroup { vg: "vg1".into() }
        );
    }

    #[test]
    fn a_group_that_is_not_ours_is_refused_and_touched_by_nothing() {
        let plan = plan_local(&thin(), Some(&vg(&["someone-else"], &[])));
        assert!(plan.actions.is_empty());
        let LeaveState::Refused { reason } = plan.state else {
            panic!("{:?}", plan.state)
        };
        assert!(reason.starts_with("ManualCleanupRequired"), "{reason}");
        assert!(reason.contains("not tagged lvms"), "{reason}");
    }

    #[test]
    fn remaining_volumes_are_refused_naming_each_and_the_way_out() {
        let plan = plan_local(
            &thin(),
            Some(&vg(&[VG_OWNER_TAG], &["pool", "pvc-1", "snap-2"])),
        );
        assert!(plan.actions.is_empty());
        let LeaveState::Refused { reason } = plan.state else {
            panic!("{:?}", plan.state)
        };
        assert!(reason.contains("pvc-1, snap-2"), "{reason}");
        assert!(
            reason.contains("delete their PersistentVolumeClaims"),
            "{reason}"
        );
        // A thick class's volume named like a pool is still a volume.
        let thick = plan_local(
            &DeviceClassConfig::named("vg1"),
            Some(&vg(&[VG_OWNER_TAG], &["pool"])),
        );
        assert!(matches!(thick.state, LeaveState::Refused { .. }));
    }
}
