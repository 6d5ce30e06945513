use super::*;

const DEV: &str = "/dev/sdc";
const FILE: &str = "lvms-san.devices";

fn running() -> Daemons {
    Daemons {
        sanlock: Daemon::Running,
        lvmlockd: Daemon::Running,
    }
}

/// A joined node of an empty group of ours.
fn joined(remover: bool) -> LeaveObserved {
    LeaveObserved {
        daemons: running(),
        host_id: Some(3),
        remover,
        undecided: None,
        devices_file: [DEV.to_owned()].into(),
        vg: Some(SharedVg {
            name: "san".into(),
            lock_type: "sanlock".into(),
            tags: vec![VG_OWNER_TAG.into()],
            pvs: vec![DEV.into()],
        }),
        orphan_pvs: BTreeSet::new(),
        lockspace_started: true,
        lvs: Vec::new(),
    }
}

fn lv(name: &str, segtype: &str, pool: Option<&str>) -> SharedLv {
    SharedLv {
        name: name.into(),
        segtype: segtype.into(),
        pool_lv: pool.map(str::to_owned),
    }
}

fn refused(plan: &LeavePlan) -> &str {
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    match &plan.state {
        LeaveState::Refused { reason } => reason,
        other => panic!("expected Refused, got {other:?}"),
    }
}

#[test]
fn another_node_stops_its_lockspace_and_drops_the_devices_file_and_leaves_the_group() {
    let plan = plan_leave("san", &joined(false));
    assert_eq!(
        plan.actions,
        [
            LeaveAction::StopLockspace { vg: "san".into() },
            LeaveAction::RemoveDevicesFile { file: FILE.into() },
        ]
    );
    assert!(matches!(plan.state, LeaveState::Waiting { .. }));
    // Once done, nothing is left: the group itself is the remover's.
    let mut done = joined(false);
    done.lockspace_started = false;
    done.devices_file.clear();
    done.vg = None;
    assert_eq!(plan_leave("san", &done).state, LeaveState::Left);
}

#[test]
fn the_remover_removes_empty_pools_then_the_group_then_the_labels_then_the_devices_file() {
    let mut o = joined(true);
    o.lvs = vec![lv("pool-abc", "thin-pool", None)];
    let plan = plan_leave("san", &o);
    assert_eq!(
        plan.actions,
        [
            LeaveAction::RemovePool {
                vg: "san".into(),
                pool: "pool-abc".into()
            },
            LeaveAction::RemoveVolumeGroup { vg: "san".into() },
        ]
    );
    // After vgremove: the LUN is an orphan physical volume.
    let mut gone = joined(true);
    gone.vg = None;
    gone.lockspace_started = false;
    gone.orphan_pvs = [DEV.to_owned()].into();
    assert_eq!(
        plan_leave("san", &gone).actions,
        [LeaveAction::RemovePhysicalVolumes {
            file: FILE.into(),
            pvs: vec![DEV.into()]
        }]
    );
    gone.orphan_pvs.clear();
    assert_eq!(
        plan_leave("san", &gone).actions,
        [LeaveAction::RemoveDevicesFile { file: FILE.into() }]
    );
    gone.devices_file.clear();
    assert_eq!(plan_leave("san", &gone).state, LeaveState::Left);
}

#[test]
fn a_remover_that_has_stopped_its_lockspace_starts_it_to_remove_the_group() {
    let mut o = joined(true);
    o.lockspace_started = false;
    assert_eq!(
        plan_leave("san", &o).actions,
        [LeaveAction::StartLockspace {
            vg: "san".into(),
            host_id: 3
        }]
    );
    o.host_id = None;
    let plan = plan_leave("san", &o);
    assert!(plan.actions.is_empty());
    assert!(matches!(plan.state, LeaveState::Waiting { reason } if reason.contains("host id")));
}

#[test]
fn volumes_left_in_the_group_are_named_and_every_node_keeps_its_lockspace() {
    for remover in [true, false] {
        let mut o = joined(remover);
        o.lvs = vec![
            lv("pool-abc", "thin-pool", None),
            lv("vol-1", "thin", Some("pool-abc")),
            lv("vol-2", "linear", None),
            lv("pool-def", "thin-pool", None),
        ];
        let reason = refused(&plan_leave("san", &o)).to_owned();
        assert!(reason.starts_with("ManualCleanupRequired"), "{reason}");
        // The pool a volume uses counts; the empty one does not.
        assert!(
            reason.contains("pool-abc, vol-1, vol-2;") && !reason.contains("pool-def"),
            "{reason}"
        );
        assert!(reason.contains("PersistentVolumeClaims"), "{reason}");
    }
}

#[test]
fn a_group_lvms_did_not_make_is_refused_by_the_remover_and_left_by_the_others() {
    for (lock_type, tags) in [("sanlock", vec![]), ("", vec![VG_OWNER_TAG.to_owned()])] {
        let mut o = joined(true);
        let vg = o.vg.as_mut().unwrap();
        vg.lock_type = lock_type.into();
        vg.tags = tags;
        let reason = refused(&plan_leave("san", &o)).to_owned();
        assert!(
            reason.contains("ManualCleanupRequired") && reason.contains(DEV),
            "{reason}"
        );
        o.remover = false;
        let plan = plan_leave("san", &o);
        assert!(
            !plan
                .actions
                .iter()
                .any(|a| matches!(a, LeaveAction::RemoveVolumeGroup { .. })),
            "{plan:?}"
        );
    }
}

#[test]
fn the_remover_without_lock_daemons_fails_with_the_fix_and_another_node_leaves() {
    let mut o = joined(true);
    o.daemons.lvmlockd = Daemon::Missing;
    o.lockspace_started = false;
    o.vg = None;
    let plan = plan_leave("san", &o);
    assert!(plan.actions.is_empty());
    assert!(
        matches!(&plan.state, LeaveState::Failed { reason } if reason.contains("apt install lvm2-lockd")),
        "{plan:?}"
    );
    o.remover = false;
    assert_eq!(
        plan_leave("san", &o).actions,
        [LeaveAction::RemoveDevicesFile { file: FILE.into() }]
    );
}

#[test]
fn a_node_that_never_saw_the_lun_has_nothing_to_do() {
    for remover in [true, false] {
        let o = LeaveObserved {
            daemons: running(),
            host_id: Some(1),
            remover,
            undecided: None,
            devices_file: BTreeSet::new(),
            vg: None,
            orphan_pvs: BTreeSet::new(),
            lockspace_started: false,
            lvs: Vec::new(),
        };
        assert_eq!(plan_leave("san", &o), LeavePlan::stop(LeaveState::Left));
    }
}

#[test]
fn only_pools_no_volume_uses_are_removable() {
    let lvs = [
        lv("p1", "thin-pool", None),
        lv("t1", "thin", Some("p1")),
        lv("p2", "thin-pool", None),
    ];
    assert_eq!(remaining(&lvs), ["p1", "t1"]);
    assert!(remaining(&[lv("p2", "thin-pool", None)]).is_empty());
}

#[test]
fn while_the_remover_is_not_known_nothing_is_stopped() {
    let mut o = joined(false);
    o.undecided = Some("the Lease changed under every attempt".into());
    let plan = plan_leave("san", &o);
    assert!(plan.actions.is_empty(), "{plan:?}");
    assert!(
        matches!(&plan.state, LeaveState::Waiting { reason } if reason.contains("every attempt")),
        "{plan:?}"
    );
}
