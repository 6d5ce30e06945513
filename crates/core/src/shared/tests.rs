use super::*;
use crate::config::{Access, DeviceSelector, DiscoveryPolicy, SharedConfig};

const LUN: &str = "/dev/disk/by-id/wwn-0x600a";
const DEV: &str = "/dev/sdc";

fn class() -> DeviceClassConfig {
    DeviceClassConfig {
        name: "san".into(),
        device_selector: DeviceSelector {
            paths: vec![LUN.into()],
            ..Default::default()
        },
        thin_pool_config: None,
        raid_config: None,
        default: false,
        fstype: None,
        device_discovery_policy: DiscoveryPolicy::Static,
        access: Access::Shared(SharedConfig::default()),
        adopt: None,
    }
}

/// A node that has everything but the volume group.
fn fresh() -> Observed {
    Observed {
        daemons: Daemons {
            sanlock: Daemon::Running,
            lvmlockd: Daemon::Running,
        },
        host_id: Some(7),
        may_create: false,
        resolved: [(LUN.to_owned(), Some(DEV.to_owned()))].into(),
        devices_file: [DEV.to_owned()].into(),
        vg: None,
        orphan_pvs: BTreeSet::new(),
        signatures: BTreeMap::new(),
        lockspace_started: false,
    }
}

fn ours() -> SharedVg {
    SharedVg {
        name: "san".into(),
        lock_type: "sanlock".into(),
        tags: vec!["lvms".into()],
        pvs: vec![DEV.into()],
    }
}

fn reason(plan: &Plan) -> &str {
    match &plan.state {
        State::Failed { reason } | State::Waiting { reason } => reason,
        State::Joined => panic!("expected a reason, got Joined"),
    }
}

fn failed(plan: &Plan) -> &str {
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    match &plan.state {
        State::Failed { reason } => reason,
        other => panic!("expected Failed, got {other:?}"),
    }
}

#[test]
fn devices_file_is_named_after_the_class() {
    assert_eq!(devices_file("san"), "lvms-san.devices");
}

#[test]
fn a_stopped_or_missing_daemon_fails_with_the_command_that_fixes_it() {
    let mut o = fresh();
    o.daemons.lvmlockd = Daemon::Missing;
    let p = plan(&class(), &o);
    let r = failed(&p);
    assert!(r.contains("apt install lvm2-lockd"), "{r}");
    assert!(
        r.contains("never runs a shared class without locking"),
        "{r}"
    );
    o.daemons.sanlock = Daemon::Stopped("sanlock client status: exit 1".into());
    let r = failed(&plan(&class(), &o)).to_owned();
    assert!(r.contains("systemctl enable --now sanlock"), "{r}");
    assert!(r.contains("lvm2-lockd"), "both daemons are named: {r}");
}

#[test]
fn without_a_host_id_the_node_waits_and_touches_nothing() {
    let mut o = fresh();
    o.host_id = None;
    o.may_create = true;
    let p = plan(&class(), &o);
    assert!(p.actions.is_empty());
    assert!(matches!(p.state, State::Waiting { .. }));
    assert!(reason(&p).contains("host id"));
}

#[test]
fn a_host_id_out_of_range_fails() {
    for id in [0, 2001] {
        let mut o = fresh();
        o.host_id = Some(id);
        assert!(failed(&plan(&class(), &o)).contains("1–2000"));
    }
}

#[test]
fn a_node_that_does_not_see_the_lun_says_so_and_is_not_visible() {
    let mut o = fresh();
    o.resolved.insert(LUN.into(), None);
    let p = plan(&class(), &o);
    assert!(!p.devices_visible);
    assert!(failed(&p).contains(LUN));
}

#[test]
fn luns_missing_from_the_devices_file_are_added_first() {
    let mut o = fresh();
    o.devices_file.clear();
    o.may_create = true;
    let p = plan(&class(), &o);
    assert_eq!(
        p.actions,
        vec![Action::AddToDevicesFile {
            file: "lvms-san.devices".into(),
            path: LUN.into()
        }]
    );
}

#[test]
fn only_the_creator_creates_the_volume_group_on_a_blank_lun() {
    let mut o = fresh();
    let p = plan(&class(), &o);
    assert!(p.actions.is_empty());
    assert!(reason(&p).contains("waiting for the node that creates"));
    o.may_create = true;
    let p = plan(&class(), &o);
    assert_eq!(
        p.actions,
        vec![Action::CreateVolumeGroup {
            name: "san".into(),
            pvs: vec![DEV.into()],
            tags: vec!["lvms".into()],
            host_id: 7,
        }]
    );
}

#[test]
fn the_creator_refuses_a_lun_that_holds_data_but_reuses_an_orphan_pv() {
    let mut o = fresh();
    o.may_create = true;
    o.signatures.insert(DEV.into(), "xfs".into());
    let r = failed(&plan(&class(), &o)).to_owned();
    assert!(r.contains("/dev/sdc (xfs)") && r.contains("wipefs"), "{r}");
    // A PV of no group (a creator that died between pvcreate and vgcreate): reused.
    o.signatures.insert(DEV.into(), "LVM2_member".into());
    o.orphan_pvs.insert(DEV.into());
    assert!(matches!(
        plan(&class(), &o).actions.as_slice(),
        [Action::CreateVolumeGroup { .. }]
    ));
}

#[test]
fn our_group_without_a_lock_type_yet_is_another_nodes_creation_in_progress() {
    let mut o = fresh();
    o.may_create = false;
    o.vg = Some(SharedVg {
        lock_type: String::new(),
        ..ours()
    });
    let p = plan(&class(), &o);
    assert!(p.actions.is_empty());
    match &p.state {
        State::Waiting { reason } => assert!(reason.contains("to finish it"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Not tagged by lvms-rs: someone else's local group, refused as before.
    o.vg = Some(SharedVg {
        lock_type: String::new(),
        tags: vec![],
        ..ours()
    });
    assert!(failed(&plan(&class(), &o)).contains("local (not shared)"));
}

#[test]
fn a_local_or_foreign_volume_group_of_that_name_is_never_touched() {
    let mut o = fresh();
    o.may_create = true;
    o.vg = Some(SharedVg {
        lock_type: String::new(),
        ..ours()
    });
    assert!(failed(&plan(&class(), &o)).contains("local (not shared)"));
    o.vg = Some(SharedVg {
        lock_type: "dlm".into(),
        ..ours()
    });
    assert!(failed(&plan(&class(), &o)).contains("lock type dlm"));
    o.vg = Some(SharedVg {
        tags: vec![],
        ..ours()
    });
    assert!(failed(&plan(&class(), &o)).contains("not made by lvms-rs"));
}

#[test]
fn an_existing_volume_group_is_joined_then_ready() {
    let mut o = fresh();
    o.vg = Some(ours());
    let p = plan(&class(), &o);
    assert_eq!(
        p.actions,
        vec![Action::StartLockspace {
            vg: "san".into(),
            host_id: 7
        }]
    );
    o.lockspace_started = true;
    let p = plan(&class(), &o);
    assert_eq!(p.state, State::Joined);
    assert!(p.actions.is_empty() && p.devices_visible);
}

#[test]
fn the_creator_joins_an_existing_group_instead_of_creating_one() {
    let mut o = fresh();
    o.may_create = true;
    o.vg = Some(ours());
    o.signatures.insert(DEV.into(), "LVM2_member".into());
    assert!(matches!(
        plan(&class(), &o).actions.as_slice(),
        [Action::StartLockspace { .. }]
    ));
}

#[test]
fn lock_start_is_retried_five_times_with_growing_delays() {
    assert_eq!(lock_start_delay(0), None);
    let delays: Vec<u64> = (1..)
        .map_while(lock_start_delay)
        .map(|d| d.as_secs())
        .collect();
    assert_eq!(delays, [1, 2, 5, 10, 20]);
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// Releases the id of a gone node at once (no host-dead wait, nothing live).
fn at_once() -> Release {
    Release {
        live: Some(BTreeSet::new()),
        ..Release::default()
    }
}

fn record(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(n, i)| (n.to_string(), i.to_string()))
        .collect()
}

#[test]
fn new_nodes_get_the_lowest_free_ids_in_name_order() {
    let out = assign_host_ids(
        &record(&[("b", "1"), ("d", "3")]),
        &set(&["a", "b", "c", "d"]),
        &set(&["a", "b", "c", "d"]),
        &at_once(),
    );
    assert_eq!(out.added, [("a".into(), 2), ("c".into(), 4)]);
    assert_eq!(out.ids.get("b"), Some(&1));
    assert!(out.changed(&BTreeMap::new()));
}

#[test]
fn ids_survive_while_their_node_exists_and_are_released_when_it_is_gone() {
    let current = record(&[("a", "1"), ("b", "2")]);
    // "a" no longer needs one (its class was removed) but still exists: it keeps its id.
    let out = assign_host_ids(&current, &set(&["b"]), &set(&["a", "b"]), &at_once());
    assert!(!out.changed(&BTreeMap::new()));
    assert_eq!(out.ids.len(), 2);
    // "a" is gone: released, and not handed to the newcomer in the same step.
    let out = assign_host_ids(&current, &set(&["b", "c"]), &set(&["b", "c"]), &at_once());
    assert_eq!(out.released, [("a".into(), 1)]);
    assert_eq!(out.added, [("c".into(), 3)]);
    assert!(!out.ids.contains_key("a"));
}

#[test]
fn invalid_and_duplicate_entries_are_replaced() {
    let out = assign_host_ids(
        &record(&[("a", "5"), ("b", "5"), ("c", "zero"), ("d", "2001")]),
        &set(&[]),
        &set(&["a", "b", "c", "d"]),
        &at_once(),
    );
    assert_eq!(out.ids.get("a"), Some(&5));
    let mut all: Vec<u16> = out.ids.values().copied().collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 4, "every node has its own id: {:?}", out.ids);
    assert_eq!(
        out.replaced
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["b", "c", "d"]
    );
}

#[test]
fn nodes_beyond_2000_are_reported_not_wrapped() {
    let nodes: BTreeSet<String> = (0..2002).map(|i| format!("n{i:04}")).collect();
    let out = assign_host_ids(&BTreeMap::new(), &nodes, &nodes, &at_once());
    assert_eq!(out.ids.len(), 2000);
    assert_eq!(out.exhausted, ["n2000", "n2001"]);
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever the record holds, the result gives distinct in-range ids, keeps every valid
        /// unique id of a present node, and gives one to every present node that needs it.
        #[test]
        fn ids_are_unique_stable_and_complete(
            current in proptest::collection::btree_map("[a-h]", 0u16..2010, 0..8),
            needing in proptest::collection::btree_set("[a-h]", 0..8),
            present in proptest::collection::btree_set("[a-h]", 0..8),
        ) {
            let text: BTreeMap<String, String> =
                current.iter().map(|(n, i)| (n.clone(), i.to_string())).collect();
            let out = assign_host_ids(&text, &needing, &present, &at_once());
            let ids: BTreeSet<u16> = out.ids.values().copied().collect();
            prop_assert_eq!(ids.len(), out.ids.len());
            prop_assert!(ids.iter().all(|i| (MIN_HOST_ID..=MAX_HOST_ID).contains(i)));
            for n in needing.intersection(&present) {
                prop_assert!(out.ids.contains_key(n));
            }
            for n in out.ids.keys() {
                prop_assert!(present.contains(n));
            }
            for (node, id) in &current {
                let unique = current.values().filter(|i| *i == id).count() == 1;
                if present.contains(node) && unique && (MIN_HOST_ID..=MAX_HOST_ID).contains(id) {
                    prop_assert_eq!(out.ids.get(node), Some(id));
                }
            }
            for (_, id) in &out.added {
                prop_assert!(!out.released.iter().any(|(_, r)| r == id));
            }
        }
    }
}

// Releasing the id of a gone node only once its host is dead (issue 13).

const NOW: i64 = 1_800_000_000;

fn release(gone_since: &[(&str, i64)], live: &[u16]) -> Release {
    Release {
        now: NOW,
        gone_since: gone_since
            .iter()
            .map(|(n, t)| (n.to_string(), *t))
            .collect(),
        host_dead_seconds: 140,
        live: Some(live.iter().copied().collect()),
    }
}

#[test]
fn a_node_just_gone_keeps_its_id_and_is_recorded_gone_from_now() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[], &[]);
    let out = assign_host_ids(&current, &set(&["b", "c"]), &set(&["b", "c"]), &rule);
    assert!(out.released.is_empty());
    assert_eq!(out.held, [("a".into(), 1)]);
    assert_eq!(out.ids.get("a"), Some(&1), "still taken in the record");
    assert_eq!(out.added, [("c".into(), 3)], "not given to the newcomer");
    assert_eq!(out.gone_since, BTreeMap::from([("a".to_string(), NOW)]));
    assert_eq!(out.release_at, Some(NOW + 140));
    assert!(out.changed(&rule.gone_since));
}

#[test]
fn a_node_gone_too_recently_keeps_its_id_until_the_host_dead_time() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[("a", NOW - 139)], &[]);
    let out = assign_host_ids(&current, &set(&["b"]), &set(&["b"]), &rule);
    assert!(out.released.is_empty());
    assert_eq!(out.held, [("a".into(), 1)]);
    assert_eq!(out.gone_since, rule.gone_since, "first seen gone is kept");
    assert_eq!(out.release_at, Some(NOW + 1));
    assert!(!out.changed(&rule.gone_since), "nothing to write meanwhile");
}

#[test]
fn a_node_gone_long_enough_but_live_on_some_node_keeps_its_id() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[("a", NOW - 600)], &[1, 2]);
    let out = assign_host_ids(&current, &set(&["b"]), &set(&["b"]), &rule);
    assert!(out.released.is_empty());
    assert_eq!(out.held, [("a".into(), 1)]);
    assert_eq!(out.release_at, None, "no time is known while it is live");
}

#[test]
fn without_knowing_what_is_live_nothing_is_released() {
    let current = record(&[("a", "1")]);
    let rule = Release {
        live: None,
        ..release(&[("a", NOW - 600)], &[])
    };
    let out = assign_host_ids(&current, &set(&[]), &set(&[]), &rule);
    assert!(out.released.is_empty());
    assert_eq!(out.held, [("a".into(), 1)]);
}

#[test]
fn a_node_gone_for_the_host_dead_time_and_not_live_is_released() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[("a", NOW - 140)], &[2]);
    let out = assign_host_ids(&current, &set(&["b", "c"]), &set(&["b", "c"]), &rule);
    assert_eq!(out.released, [("a".into(), 1)]);
    assert!(out.held.is_empty());
    assert!(!out.ids.contains_key("a"));
    assert!(out.gone_since.is_empty(), "its record goes with it");
    assert_eq!(out.added, [("c".into(), 3)], "not reused in the same step");
    assert!(out.changed(&rule.gone_since));
}

#[test]
fn a_node_that_comes_back_keeps_its_id_and_loses_its_gone_since() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[("a", NOW - 100)], &[]);
    let out = assign_host_ids(&current, &set(&["a", "b"]), &set(&["a", "b"]), &rule);
    assert_eq!(out.ids.get("a"), Some(&1));
    assert!(out.held.is_empty() && out.released.is_empty() && out.added.is_empty());
    assert!(out.gone_since.is_empty());
    assert_eq!(out.release_at, None);
    assert!(
        out.changed(&rule.gone_since),
        "the gone-since record is removed"
    );
}

#[test]
fn a_stale_gone_since_without_an_entry_is_dropped() {
    let current = record(&[("b", "2")]);
    let rule = release(&[("x", NOW - 10)], &[]);
    let out = assign_host_ids(&current, &set(&["b"]), &set(&["b"]), &rule);
    assert!(out.gone_since.is_empty());
    assert!(out.changed(&rule.gone_since));
}

#[test]
fn the_wait_is_the_longest_host_dead_time_of_the_shared_classes() {
    assert_eq!(Release::host_dead_seconds_for([10]), 140);
    assert_eq!(Release::host_dead_seconds_for([5, 60, 10]), 540);
    assert_eq!(Release::host_dead_seconds_for([5]), 100);
    assert_eq!(Release::host_dead_seconds_for([]), 140);
    // Gone 200 s: past a 10 s class's 140 s but not a 60 s class's 540 s.
    let current = record(&[("a", "1")]);
    let mut rule = release(&[("a", NOW - 200)], &[]);
    rule.host_dead_seconds = Release::host_dead_seconds_for([10, 60]);
    let out = assign_host_ids(&current, &set(&[]), &set(&[]), &rule);
    assert_eq!(out.held, [("a".into(), 1)]);
    assert_eq!(out.release_at, Some(NOW - 200 + 540));
    rule.host_dead_seconds = Release::host_dead_seconds_for([10, 5]);
    let out = assign_host_ids(&current, &set(&[]), &set(&[]), &rule);
    assert_eq!(out.released, [("a".into(), 1)]);
}

#[test]
fn two_held_nodes_requeue_at_the_earliest_release() {
    let current = record(&[("a", "1"), ("b", "2")]);
    let rule = release(&[("a", NOW - 100), ("b", NOW - 20)], &[]);
    let out = assign_host_ids(&current, &set(&[]), &set(&[]), &rule);
    assert_eq!(out.held.len(), 2);
    assert_eq!(out.release_at, Some(NOW + 40));
}

mod release_properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever is recorded gone and live: a held or released id is never given to a node in
        /// the same step, ids stay unique, an id still live is never released, and an id is
        /// released only after the wait.
        #[test]
        fn a_held_id_is_never_handed_out_and_a_live_one_never_released(
            current in proptest::collection::btree_map("[a-h]", 1u16..12, 0..8),
            present in proptest::collection::btree_set("[a-h]", 0..8),
            gone_for in proptest::collection::btree_map("[a-h]", 0i64..300, 0..8),
            live in proptest::collection::btree_set(1u16..12, 0..6),
        ) {
            let text: BTreeMap<String, String> =
                current.iter().map(|(n, i)| (n.clone(), i.to_string())).collect();
            let rule = Release {
                now: NOW,
                gone_since: gone_for.iter().map(|(n, s)| (n.clone(), NOW - s)).collect(),
                host_dead_seconds: 140,
                live: Some(live.clone()),
            };
            let out = assign_host_ids(&text, &present, &present, &rule);
            let ids: BTreeSet<u16> = out.ids.values().copied().collect();
            prop_assert_eq!(ids.len(), out.ids.len());
            for (_, id) in &out.added {
                prop_assert!(!out.released.iter().any(|(_, r)| r == id));
                prop_assert!(!out.held.iter().any(|(_, h)| h == id));
            }
            for (node, id) in &out.released {
                let unique = current.values().filter(|i| *i == id).count() == 1;
                if unique {
                    prop_assert!(!live.contains(id));
                    prop_assert!(gone_for.get(node).is_some_and(|s| *s >= 140));
                }
            }
            for node in out.gone_since.keys() {
                prop_assert!(!present.contains(node));
            }
        }
    }
}
