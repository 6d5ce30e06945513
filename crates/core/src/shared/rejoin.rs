//! Coming back after the fence hook: a node fenced from a shared class (its lease lost, its
//! devices of the class given the `error` target, `/run/lvms/fenced-<vg>` written; ADR 0024) joins
//! the lockspace again by itself once nothing of the class is open on it and its path to the LUN
//! is back. Until then it touches nothing of the class and says what it waits for.
//!
//! The steps, each checked before the next:
//! 1. a device of the class still open by something other than another device of the class (a
//!    mounted filesystem, a process): wait — the pods using it end, kubelet unmounts;
//! 2. a device of the class's LUNs cannot be read: wait for the path;
//! 3. remove the class's device-mapper devices (holders first), stop what is left of the
//!    lockspace, remove the lock volume (`<vg>-lvmlock`, which sanlock holds open until the
//!    lockspace stops, and so is not counted as open), delete the record; the join then runs as
//!    on any node.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::fencing::fence_order;

/// One device-mapper device of the class on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DmUse {
    /// The class's devices that hold it open (a thin volume holds its pool).
    pub holders: BTreeSet<String>,
    /// How many openers it has, its holders included.
    pub open: u32,
}

/// What a fenced node sees of the class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FencedSeen {
    /// The class's device-mapper devices, by name.
    pub devices: BTreeMap<String, DmUse>,
    /// The class's LUN paths that could not be read, with why.
    pub unreadable: Vec<String>,
}

/// One step back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum RejoinStep {
    /// `dmsetup remove` of a device the hook left (its table the `error` target).
    RemoveDevice { name: String },
    /// `vgchange --lock-stop` of what is left of the lockspace.
    StopLockspace { vg: String },
    /// Deletes `/run/lvms/fenced-<vg>`.
    ClearRecord { vg: String },
}

/// What a fenced node does next for class `vg`: the steps back, or why it waits.
pub fn plan_rejoin(vg: &str, seen: &FencedSeen) -> Result<Vec<RejoinStep>, String> {
    let lock_lv = format!("{vg}-lvmlock");
    let open: Vec<&str> = seen
        .devices
        .iter()
        .filter(|(name, d)| **name != lock_lv && d.open as usize > d.holders.len())
        .map(|(name, _)| name.as_str())
        .collect();
    if !open.is_empty() {
        return Err(format!(
            "fenced from {vg}: its devices here fail every I/O and are still open ({}): once the \
             pods that use them are gone and kubelet has unmounted them, the node joins again by \
             itself",
            open.join(", ")
        ));
    }
    if !seen.unreadable.is_empty() {
        return Err(format!(
            "fenced from {vg}: its LUN cannot be read from this node yet ({}): when the path is \
             back the node joins again by itself",
            seen.unreadable.join("; ")
        ));
    }
    let holders: BTreeMap<String, BTreeSet<String>> = seen
        .devices
        .iter()
        .filter(|(name, _)| **name != lock_lv)
        .map(|(name, d)| (name.clone(), d.holders.clone()))
        .collect();
    let mut steps: Vec<RejoinStep> = fence_order(&holders)
        .into_iter()
        .map(|name| RejoinStep::RemoveDevice { name })
        .collect();
    steps.push(RejoinStep::StopLockspace { vg: vg.to_owned() });
    if seen.devices.contains_key(&lock_lv) {
        steps.push(RejoinStep::RemoveDevice { name: lock_lv });
    }
    steps.push(RejoinStep::ClearRecord { vg: vg.to_owned() });
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dm(holders: &[&str], open: u32) -> DmUse {
        DmUse {
            holders: holders.iter().map(|h| (*h).to_owned()).collect(),
            open,
        }
    }

    /// A thin volume on its pool (the pool's `-tpool` held by the volume), as the hook left them.
    fn thin(volume_open: u32) -> FencedSeen {
        FencedSeen {
            devices: [
                ("san-pool--a-tpool".to_owned(), dm(&["san-csi--a"], 1)),
                ("san-csi--a".to_owned(), dm(&[], volume_open)),
            ]
            .into(),
            unreadable: Vec::new(),
        }
    }

    #[test]
    fn a_volume_still_mounted_keeps_the_node_out_and_says_so() {
        let err = plan_rejoin("san", &thin(1)).unwrap_err();
        assert!(err.contains("still open (san-csi--a)"), "{err}");
        assert!(
            !err.contains("tpool"),
            "the pool is held by the volume only: {err}"
        );
    }

    #[test]
    fn an_unreadable_lun_keeps_the_node_out_and_says_so() {
        let seen = FencedSeen {
            unreadable: vec!["/dev/disk/by-id/lun: Input/output error".into()],
            ..thin(0)
        };
        let err = plan_rejoin("san", &seen).unwrap_err();
        assert!(
            err.contains("cannot be read") && err.contains("Input/output error"),
            "{err}"
        );
    }

    #[test]
    fn once_closed_and_readable_the_devices_go_holders_first_then_the_lockspace_and_the_record() {
        assert_eq!(
            plan_rejoin("san", &thin(0)).unwrap(),
            [
                RejoinStep::RemoveDevice {
                    name: "san-csi--a".into()
                },
                RejoinStep::RemoveDevice {
                    name: "san-pool--a-tpool".into()
                },
                RejoinStep::StopLockspace { vg: "san".into() },
                RejoinStep::ClearRecord { vg: "san".into() },
            ]
        );
        // Nothing left of the class: only the lockspace and the record.
        assert_eq!(plan_rejoin("san", &FencedSeen::default()).unwrap().len(), 2);
    }

    #[test]
    fn the_lock_volume_sanlock_holds_does_not_count_as_open_and_goes_after_the_lockspace() {
        let mut seen = thin(0);
        seen.devices.insert("san-lvmlock".into(), dm(&[], 1));
        let steps = plan_rejoin("san", &seen).unwrap();
        assert_eq!(
            steps[2..],
            [
                RejoinStep::StopLockspace { vg: "san".into() },
                RejoinStep::RemoveDevice {
                    name: "san-lvmlock".into()
                },
                RejoinStep::ClearRecord { vg: "san".into() },
            ]
        );
    }
}
