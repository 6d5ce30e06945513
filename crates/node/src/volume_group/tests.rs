#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use lvms_core::{
    config::{Adopt, CalculationPolicy, DiscoveryPolicy, RaidType},
    filter::ExclusionReason,
    plan::DeviceReport,
    size::ByteSize,
};
use serde_json::json;

use lvms_engine::backend::DeviceClassConfig;

use super::*;

fn node(name: &str, labels: serde_json::Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
}

fn vg(spec: serde_json::Value) -> LVMVolumeGroup {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "vg1", "namespace": "lvms"},
        "spec": spec,
    }))
    .unwrap()
}

fn thin_spec() -> serde_json::Value {
    json!({
        "deviceSelector": {"paths": ["/dev/vdb"], "optionalPaths": ["/dev/vdc"]},
        "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10},
        "default": true,
    })
}

fn with_finalizer(mut vg: LVMVolumeGroup, node: &str) -> LVMVolumeGroup {
    vg.metadata.finalizers = Some(vec![node_cleanup_finalizer(node)]);
    vg
}

#[test]
fn steps_follow_selector_finalizer_and_deletion() {
    let a = node("a", json!({"disk": "yes"}));
    let b = node("b", json!({}));
    let mut selected = thin_spec();
    selected["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "disk", "operator": "In", "values": ["yes"]}]}]});
    let fresh = vg(selected);
    assert_eq!(plan(&fresh, &a), Step::AddFinalizer);
    assert_eq!(plan(&fresh, &b), Step::Ignore);

    let held = with_finalizer(fresh.clone(), "a");
    assert!(matches!(plan(&held, &a), Step::Converge(_)));
    assert_eq!(plan(&held, &b), Step::Ignore, "a's finalizer is not b's");

    let mut deleting = held.clone();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    assert_eq!(plan(&deleting, &a), Step::Cleanup);
    assert_eq!(plan(&deleting, &b), Step::Ignore);

    // Still holding the finalizer after the node stopped matching: keeps serving.
    assert!(matches!(
        plan(&held, &node("a", json!({}))),
        Step::Converge(_)
    ));
}

#[test]
fn the_engine_config_carries_every_field_with_the_apis_defaults() {
    let cfg = device_class_config(&vg(thin_spec())).unwrap();
    assert_eq!(cfg.name, "vg1");
    assert_eq!(cfg.device_selector.paths, ["/dev/vdb"]);
    assert_eq!(cfg.device_selector.optional_paths, ["/dev/vdc"]);
    assert!(!cfg.device_selector.force_wipe_devices_and_destroy_all_data);
    assert!(cfg.default);
    let tp = cfg.thin_pool_config.clone().unwrap();
    assert_eq!(tp.name, "thin-pool-1");
    assert_eq!(tp.size_percent, 90);
    assert_eq!(tp.overprovision_ratio, 10);
    assert_eq!(tp.chunk_size_calculation_policy, CalculationPolicy::Static);
    assert_eq!(tp.chunk_size, Some(ByteSize(128 << 10)));
    assert_eq!(tp.metadata_size_calculation_policy, CalculationPolicy::Host);
    assert_eq!(tp.metadata_size, None);
    assert_eq!(
        (cfg.thin_pool(), cfg.overprovision_ratio(), cfg.shared()),
        (Some("thin-pool-1"), 10, None)
    );

    let raid = device_class_config(&vg(json!({
        "deviceSelector": {"paths": ["/dev/vdb", "/dev/vdc"], "forceWipeDevicesAndDestroyAllData": true},
        "raidConfig": {"type": "raid1", "mirrors": 1, "stripeSize": "64Ki"},
    })))
    .unwrap();
    assert!(raid.device_selector.force_wipe_devices_and_destroy_all_data);
    let r = raid.raid_config.clone().unwrap();
    assert_eq!(
        (r.raid_type, r.mirrors, r.stripes, r.stripe_size),
        (RaidType::Raid1, Some(1), None, Some(ByteSize(64 << 10)))
    );
    assert_eq!(raid.thin_pool(), None);
    assert_eq!(raid.overprovision_ratio(), 1);
    // Its volumes are RAID volumes of that layout unless a request names another.
    assert_eq!(
        raid.layout(),
        lvms_engine::backend::Layout::Raid {
            level: RaidType::Raid1,
            mirrors: Some(1),
            stripes: None,
            stripe_size: Some(64 << 10),
            nosync: false,
            integrity: false,
        }
    );

    let host = device_class_config(&vg(json!({
        "deviceSelector": {"paths": ["/dev/vdb"]},
        "thinPoolConfig": {"name": "p", "overprovisionRatio": 1, "sizePercent": 50,
            "chunkSizeCalculationPolicy": "Host", "metadataSizeCalculationPolicy": "Static",
            "metadataSize": "1Gi"},
    })))
    .unwrap()
    .thin_pool_config
    .unwrap();
    assert_eq!(host.size_percent, 50);
    assert_eq!(host.chunk_size_calculation_policy, CalculationPolicy::Host);
    assert_eq!(host.chunk_size, None);
    assert_eq!(host.metadata_size, Some(ByteSize(1 << 30)));
}

#[test]
fn without_paths_the_class_discovers_and_avoids_what_other_classes_on_the_node_list() {
    let discovering =
        device_class_config(&vg(json!({"deviceDiscoveryPolicy": "Dynamic"}))).unwrap();
    assert!(lvms_core::plan::discovers(&discovering));
    assert_eq!(
        discovering.device_discovery_policy,
        DiscoveryPolicy::Dynamic
    );
    let unset = device_class_config(&vg(json!({}))).unwrap();
    assert_eq!(unset.device_discovery_policy, DiscoveryPolicy::Static);

    let a = node("a", json!({"disk": "yes"}));
    let named = |name: &str, spec: serde_json::Value| {
        let mut v = vg(spec);
        v.metadata.name = Some(name.into());
        v
    };
    let vgs = [
        named("vg1", json!({})),
        named(
            "fast",
            json!({"deviceSelector": {"paths": ["/dev/vdb"],
                                                 "optionalPaths": ["/dev/vdc"]}}),
        ),
        named(
            "matched",
            json!({"deviceSelector": {"devicePatterns": ["/dev/nvme[0-9]n1"]}}),
        ),
        named(
            "elsewhere",
            json!({"deviceSelector": {"paths": ["/dev/vdd"], "devicePatterns": ["/dev/sd*"]},
                                  "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                                      {"key": "disk", "operator": "In", "values": ["no"]}]}]}}),
        ),
    ];
    let claims = claims_of_others(&vgs, "vg1", &a);
    assert_eq!(
        (claims.paths, claims.patterns),
        (
            vec!["/dev/vdb".to_owned(), "/dev/vdc".to_owned()],
            vec!["/dev/nvme[0-9]n1".to_owned()]
        ),
        "its own and those of classes on other nodes are not listed"
    );
    let matching = device_class_config(&vg(
        json!({"deviceSelector": {"devicePatterns": ["/dev/sd*"]}}),
    ))
    .unwrap();
    assert_eq!(matching.device_selector.device_patterns, ["/dev/sd*"]);
    assert!(lvms_core::plan::takes_unlisted(&matching));
}

#[test]
fn specs_the_engine_cannot_take_are_reported_failed_naming_the_field() {
    let a = node("a", json!({}));
    for (spec, field) in [
        (
            json!({"deviceSelector": {"paths": ["/dev/vdb"]},
                   "thinPoolConfig": {"name": "p", "overprovisionRatio": 0}}),
            "thinPoolConfig.overprovisionRatio",
        ),
        (
            json!({"deviceSelector": {"paths": ["/dev/vdb"]},
                   "thinPoolConfig": {"name": "p", "overprovisionRatio": 1, "chunkSize": "lots"}}),
            "thinPoolConfig.chunkSize",
        ),
        (
            json!({"deviceSelector": {"paths": ["/dev/vdb"]},
                   "raidConfig": {"type": "raid5", "stripes": -2}}),
            "raidConfig.stripes",
        ),
    ] {
        match plan(&with_finalizer(vg(spec.clone()), "a"), &a) {
            Step::Report(s) => {
                assert_eq!(s.status, Some(VGStatusType::Failed), "{spec}");
                assert!(s.reason.contains(field), "{spec}: {}", s.reason);
                assert_eq!(s.name, "vg1");
            }
            other => panic!("{spec}: expected a failed report, got {other:?}"),
        }
    }
}

#[test]
fn the_status_lists_members_and_excluded_devices_with_reasons() {
    let report = |path: &str, canonical: Option<&str>, verdict| DeviceReport {
        path: path.into(),
        canonical_path: canonical.map(str::to_owned),
        optional: false,
        pattern: None,
        verdict,
    };
    let plan = ClassPlan {
        devices: vec![
            report("/dev/disk/by-id/a", Some("/dev/vdb"), DeviceVerdict::Member),
            report(
                "/dev/vdc",
                None,
                DeviceVerdict::Excluded {
                    reasons: vec![ExclusionReason::ReadOnly],
                },
            ),
            report("/dev/vdz", None, DeviceVerdict::Missing),
            DeviceReport {
                pattern: Some("/dev/vd*".into()),
                ..report(
                    "/dev/vde",
                    Some("/dev/vde"),
                    DeviceVerdict::Excluded {
                        reasons: vec![ExclusionReason::ReadOnly],
                    },
                )
            },
        ],
        actions: vec![],
        state: ClassState::Ready,
    };
    let mut dynamic = thin_spec();
    dynamic["deviceDiscoveryPolicy"] = json!("Dynamic");
    let s = vg_status(&vg(dynamic), &plan);
    assert_eq!(s.status, Some(VGStatusType::Ready));
    assert_eq!(s.devices, ["/dev/vdb"]);
    assert_eq!(
        s.excluded
            .iter()
            .map(|e| e.name.as_str())
            .collect::<Vec<_>>(),
        ["/dev/vdc", "/dev/vdz", "/dev/vde"]
    );
    assert!(s.excluded[0].reasons[0].contains("/dev/vdc"));
    assert!(
        s.excluded[2].reasons[0].contains("/dev/vde (matched by devicePatterns /dev/vd*)"),
        "{:?}",
        s.excluded[2]
    );
    assert!(s.excluded[1].reasons[0].contains("does not exist"));
    assert_eq!(
        s.device_discovery_policy,
        Some(DeviceDiscoveryPolicyStatus::RuntimeDynamic)
    );

    let failed = ClassPlan {
        state: ClassState::Failed {
            reason: "no usable device".into(),
        },
        ..plan
    };
    let s = vg_status(&vg(thin_spec()), &failed);
    assert_eq!(
        (s.status, s.reason.as_str()),
        (Some(VGStatusType::Failed), "no usable device")
    );
}

fn raid_lv(name: &str, attr: &str, segtype: &str, sync: Option<f64>) -> LogicalVolume {
    serde_json::from_value(json!({
        "name": name, "vgName": "vg1", "uuid": "u", "size": 64u64 << 20, "attr": attr,
        "segtype": segtype, "syncPercent": sync, "tags": []}))
    .unwrap()
}

fn pv(name: &str, attr: &str) -> PhysicalVolume {
    serde_json::from_value(json!({
        "name": name, "vgName": "vg1", "uuid": "u", "size": 1u64 << 30, "free": 0, "attr": attr}))
    .unwrap()
}

#[test]
fn raid_thin_pool_health_is_its_data_and_metadata_as_lvs_a_reports_them() {
    // `lvs -a` of a raid1 thin pool with one disk lost (captured from lvm2 2.03 in the VM).
    let pvs = [pv("/dev/mapper/ra", "a--"), pv("[unknown]", "a-m")];
    let lvs = [
        raid_lv("[lvol0_pmspare]", "ewi-------", "linear", None),
        raid_lv("pool", "twi-aotzp-", "thin-pool", None),
        raid_lv("[pool_tdata]", "rwi-aor-p-", "raid1", Some(100.0)),
        raid_lv("[pool_tdata_rimage_0]", "iwi-aor---", "linear", None),
        raid_lv("[pool_tdata_rimage_1]", "Iwi-aor-p-", "linear", None),
        raid_lv("[pool_tmeta]", "ewi-aor-p-", "raid1", Some(42.0)),
        raid_lv("t1", "Vwi-aotzp-", "thin", None),
    ];
    let s = raid_status(&lvs, &pvs);
    assert_eq!(s.status, RaidHealth::Degraded);
    assert_eq!((s.member_count, s.degraded_member_count), (2, 1));
    assert_eq!(s.min_sync_percent, 42.0);
    let names: Vec<&str> = s.lv_health.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["pool_tdata", "pool_tmeta"]);
    // A failed metadata image fails the pool.
    let mut failed = lvs.clone();
    failed[5] = raid_lv("[pool_tmeta]", "ewi-aor-F-", "raid1", Some(100.0));
    assert_eq!(raid_status(&failed, &pvs[..1]).status, RaidHealth::Failed);
}

#[test]
fn raid_health_is_the_worst_of_its_volumes_and_members() {
    let pvs = [pv("/dev/vdb", "a--"), pv("/dev/vdc", "a--")];
    let healthy = [
        raid_lv("r1", "rwi-a-r---", "raid1", Some(100.0)),
        // Hidden sub-volumes and non-RAID volumes do not count.
        raid_lv("[r1_rimage_0]", "iwi-aor-p-", "linear", None),
        raid_lv("lin", "-wi-a-----", "linear", None),
    ];
    let s = raid_status(&healthy, &pvs);
    assert_eq!(s.status, RaidHealth::Healthy);
    assert_eq!((s.member_count, s.degraded_member_count), (2, 0));
    assert_eq!(s.min_sync_percent, 100.0);
    assert_eq!(
        s.lv_health,
        [RaidLvHealth {
            name: "r1".into(),
            raid_type: "raid1".into(),
            sync_percent: 100.0
        }]
    );

    // Still syncing.
    let syncing = [raid_lv("r1", "rwi-a-r---", "raid1", Some(37.5))];
    let s = raid_status(&syncing, &pvs);
    assert_eq!((s.status, s.min_sync_percent), (RaidHealth::Degraded, 37.5));

    // A member lost: the LV is partial and the LVM physical volume missing.
    let partial = [raid_lv("r1", "rwi-a-r-p-", "raid1", Some(100.0))];
    let lost = [pv("/dev/vdb", "a--"), pv("[unknown]", "a-m")];
    let s = raid_status(&partial, &lost);
    assert_eq!(s.status, RaidHealth::Degraded);
    assert_eq!((s.member_count, s.degraded_member_count), (2, 1));

    // A failed RAID volume makes the class Failed, whatever the others say.
    let failed = [
        raid_lv("r1", "rwi-a-r---", "raid1", Some(100.0)),
        raid_lv("r5", "rwi-a-r-F-", "raid5_ls", Some(100.0)),
    ];
    assert_eq!(raid_status(&failed, &pvs).status, RaidHealth::Failed);

    // No RAID volume yet: the members decide.
    assert_eq!(raid_status(&[], &pvs).status, RaidHealth::Healthy);
    assert_eq!(raid_status(&[], &lost).status, RaidHealth::Degraded);
}

#[test]
fn the_host_id_is_the_operators_entry_for_this_node_or_a_reason_never_a_guess() {
    let record = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(
        assigned_host_id(Some(&record(&[("a", "7"), ("b", "1")])), "a", "lvms"),
        Ok(7)
    );
    assert_eq!(
        assigned_host_id(Some(&record(&[("a", " 2000\n")])), "a", "lvms"),
        Ok(2000)
    );
    for absent in [None, Some(record(&[("b", "1")]))] {
        let why = assigned_host_id(absent.as_ref(), "a", "lvms").unwrap_err();
        assert!(
            why.contains("has not assigned this node")
                && why.contains("lvms/lvms-sanlock-host-ids has no entry a"),
            "{why}"
        );
    }
    for bad in ["0", "2001", "-1", "x", ""] {
        let why = assigned_host_id(Some(&record(&[("a", bad)])), "a", "lvms").unwrap_err();
        assert!(
            why.contains("not an id 1–2000") && why.contains(&format!("{bad:?}")),
            "{why}"
        );
    }
}

fn shared_class() -> (LVMVolumeGroup, DeviceClassConfig) {
    let mut v = vg(json!({"deviceAccessPolicy": "shared",
                          "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-1"]},
                          "sharedConfig": {"ioTimeoutSeconds": 20}}));
    v.metadata.name = Some("san".into());
    let config = device_class_config(&v).unwrap();
    (v, config)
}

fn blank_lun(host_id: Option<u16>) -> shared::Observed {
    shared::Observed {
        daemons: shared::Daemons {
            sanlock: shared::Daemon::Running,
            lvmlockd: shared::Daemon::Running,
        },
        host_id,
        may_create: false,
        resolved: [(
            "/dev/disk/by-id/wwn-1".to_owned(),
            Some("/dev/sdx".to_owned()),
        )]
        .into(),
        devices_file: ["/dev/sdx".to_owned()].into(),
        vg: None,
        orphan_pvs: Default::default(),
        signatures: Default::default(),
        lockspace_started: false,
    }
}

#[test]
fn only_a_node_about_to_create_the_volume_group_needs_the_creator_lease() {
    let (_, class) = shared_class();
    assert!(needs_creator(&class, &blank_lun(Some(3))));
    let orphan = shared::Observed {
        orphan_pvs: ["/dev/sdx".to_owned()].into(),
        signatures: [("/dev/sdx".to_owned(), "LVM2_member".to_owned())].into(),
        ..blank_lun(Some(3))
    };
    assert!(needs_creator(&class, &orphan), "an orphan PV is reused");

    let exists = shared::Observed {
        vg: Some(shared::SharedVg {
            name: "san".into(),
            lock_type: "sanlock".into(),
            tags: vec![lvms_core::config::VG_OWNER_TAG.into()],
            pvs: vec!["/dev/sdx".into()],
        }),
        ..blank_lun(Some(3))
    };
    let no_daemon = shared::Observed {
        daemons: shared::Daemons {
            sanlock: shared::Daemon::Missing,
            lvmlockd: shared::Daemon::Running,
        },
        ..blank_lun(Some(3))
    };
    let not_listed = shared::Observed {
        devices_file: Default::default(),
        ..blank_lun(Some(3))
    };
    let data = shared::Observed {
        signatures: [("/dev/sdx".to_owned(), "xfs".to_owned())].into(),
        ..blank_lun(Some(3))
    };
    for (why, o) in [
        ("the group exists", exists),
        ("no host id", blank_lun(None)),
        ("a daemon is missing", no_daemon),
        ("the devices file comes first", not_listed),
        ("the LUN holds data: refused anyway", data),
    ] {
        assert!(!needs_creator(&class, &o), "{why}");
    }
}

fn report(state: shared::State, host_id: Option<u16>, failures: usize) -> SharedReport {
    SharedReport {
        device_class: "san".into(),
        host_id,
        executed: Vec::new(),
        plan: shared::Plan {
            actions: Vec::new(),
            state,
            devices_visible: true,
        },
        lock_start_failures: vec!["lock-start failed".to_owned(); failures],
        fencing: None,
        rejoined: Vec::new(),
    }
}

/// What a node with a hardware watchdog, wdmd, sanlock using it and the kill hook shows.
fn armed() -> fencing::WatchdogSeen {
    fencing::WatchdogSeen {
        device: true,
        identity: Some("iTCO_wdt".into()),
        wdmd: shared::Daemon::Running,
        sanlock_uses_watchdog: Some(true),
        kill_command: "/usr/bin/lvms fence".into(),
    }
}

/// A joined report whose fencing `judge` decided from `seen`.
fn fenced_report(policy: fencing::Policy, seen: &fencing::WatchdogSeen) -> SharedReport {
    SharedReport {
        fencing: Some(lvms_host::shared::FencingReport {
            fenced: false,
            verdict: fencing::judge(policy, seen),
            renewals: Some(lvms_host::sanlock::Renewals {
                io_timeout: 20,
                last_failed: true,
                ..Default::default()
            }),
            live_host_ids: vec![1, 3],
            dead_host_ids: vec![2],
            silent_host_ids: vec![],
        }),
        ..report(shared::State::Joined, Some(3), 0)
    }
}

#[test]
fn a_joined_class_without_armed_fencing_fails_with_the_fix_unless_disabled() {
    let (v, class) = shared_class();
    let seen = fencing::WatchdogSeen {
        device: false,
        identity: None,
        wdmd: shared::Daemon::Missing,
        sanlock_uses_watchdog: Some(false),
        kill_command: String::new(),
    };
    let unarmed = shared_vg_status(
        &v,
        &class,
        &fenced_report(fencing::Policy::Required, &seen),
        None,
        None,
    );
    assert_eq!(unarmed.status, Some(VGStatusType::Failed));
    assert!(
        unarmed.reason.contains("fencing is not armed"),
        "{}",
        unarmed.reason
    );
    let shared = unarmed.shared.unwrap();
    assert_eq!(shared.lockspace, LockspaceState::Joined);
    assert_eq!(shared.live_host_ids, vec![1, 3]);
    assert_eq!(shared.dead_host_ids, vec![2]);
    let f = shared.fencing.unwrap();
    assert_eq!(f.watchdog, lvms_api::WatchdogState::Missing);
    assert!(!f.kill_hook);
    assert_eq!(f.lease_renewal_failures, 1);

    let opted_out = shared_vg_status(
        &v,
        &class,
        &fenced_report(fencing::Policy::Disabled, &seen),
        None,
        None,
    );
    assert_eq!(opted_out.status, Some(VGStatusType::Ready));
    let f = opted_out.shared.unwrap().fencing.unwrap();
    assert_eq!(f.watchdog, lvms_api::WatchdogState::Disabled);
    assert!(f.message.contains("fencing disabled"), "{}", f.message);
}

#[test]
fn a_node_the_fence_hook_fenced_says_so_in_its_status() {
    let (v, class) = shared_class();
    let seen = armed();
    let mut fenced = fenced_report(fencing::Policy::Required, &seen);
    fenced.fencing.as_mut().unwrap().fenced = true;
    fenced.plan.state = shared::State::Failed {
        reason: fencing::fenced_message("san"),
    };
    let status = shared_vg_status(&v, &class, &fenced, None, None);
    assert_eq!(status.status, Some(VGStatusType::Failed));
    let f = status.shared.unwrap().fencing.unwrap();
    assert!(f.fenced);
    let json = serde_json::to_value(&f).unwrap();
    assert_eq!(json["fenced"], true, "{json}");
    // Not fenced: the field is left out.
    let armed = shared_vg_status(
        &v,
        &class,
        &fenced_report(fencing::Policy::Required, &seen),
        None,
        None,
    );
    let json = serde_json::to_value(armed.shared.unwrap().fencing.unwrap()).unwrap();
    assert!(json.get("fenced").is_none(), "{json}");
}

#[test]
fn the_io_timeout_shown_is_the_one_sanlock_keeps_once_it_says() {
    let (v, class) = shared_class();
    assert_eq!(class.shared().unwrap().io_timeout_seconds, 20);
    let seen = armed();
    let mut kept = fenced_report(fencing::Policy::Required, &seen);
    kept.fencing
        .as_mut()
        .unwrap()
        .renewals
        .as_mut()
        .unwrap()
        .io_timeout = 7;
    let status = shared_vg_status(&v, &class, &kept, None, None);
    assert_eq!(status.shared.unwrap().io_timeout_seconds, Some(7));
    // Not joined yet (sanlock says nothing): the class's.
    let joining = shared_vg_status(
        &v,
        &class,
        &report(shared::State::Waiting { reason: "w".into() }, Some(3), 0),
        None,
        None,
    );
    assert_eq!(joining.shared.unwrap().io_timeout_seconds, Some(20));
}

#[test]
fn the_shared_status_follows_the_engines_state() {
    let (v, class) = shared_class();
    let joined = shared_vg_status(
        &v,
        &class,
        &report(shared::State::Joined, Some(3), 1),
        None,
        None,
    );
    assert_eq!(joined.status, Some(VGStatusType::Ready));
    assert_eq!(joined.reason, "");
    assert_eq!(
        *joined.shared.unwrap(),
        SharedVGStatus {
            devices_visible: true,
            lockspace: LockspaceState::Joined,
            host_id: Some(3),
            io_timeout_seconds: Some(20),
            reason: String::new(),
            ..SharedVGStatus::default()
        }
    );

    let waiting = |reason: &str| shared::State::Waiting {
        reason: reason.into(),
    };
    let retrying = shared_vg_status(
        &v,
        &class,
        &report(waiting("lock-start of san failed 5 times"), Some(3), 5),
        None,
        None,
    );
    assert_eq!(retrying.status, Some(VGStatusType::Progressing));
    assert_eq!(retrying.shared.unwrap().lockspace, LockspaceState::Joining);

    let creator = shared_vg_status(
        &v,
        &class,
        &report(
            waiting("waiting for the node that creates shared volume group san"),
            Some(3),
            0,
        ),
        None,
        Some("node node-b holds the creator Lease lvms-shared-create-san until T"),
    );
    assert_eq!(
        creator.reason,
        "waiting for the node that creates shared volume group san (node node-b holds the creator \
         Lease lvms-shared-create-san until T)"
    );
    assert_eq!(creator.shared.unwrap().lockspace, LockspaceState::NotJoined);

    let no_id = shared_vg_status(
        &v,
        &class,
        &report(waiting("this node has no sanlock host id yet"), None, 0),
        Some("the operator has not assigned this node a sanlock host id yet"),
        None,
    );
    assert_eq!(
        no_id.reason,
        "the operator has not assigned this node a sanlock host id yet"
    );
    assert_eq!(no_id.shared.as_ref().unwrap().reason, no_id.reason);
    assert_eq!(no_id.shared.unwrap().host_id, None);

    let failed = shared_vg_status(
        &v,
        &class,
        &report(
            shared::State::Failed {
                reason: "sanlock is not installed".into(),
            },
            Some(3),
            0,
        ),
        None,
        None,
    );
    assert_eq!(failed.status, Some(VGStatusType::Failed));
    assert_eq!(failed.reason, "sanlock is not installed");
    assert_eq!(failed.shared.unwrap().lockspace, LockspaceState::NotJoined);
}

#[test]
fn adopt_reaches_the_engine_and_is_absent_by_default() {
    let cfg = device_class_config(&vg(json!({
        "deviceSelector": {"devicePatterns": ["/dev/nvme[0-9]n1"]},
        "adopt": "csi-driver-lvm",
    })))
    .unwrap();
    assert_eq!(cfg.adopt, Some(Adopt::CsiDriverLvm));
    assert_eq!(device_class_config(&vg(thin_spec())).unwrap().adopt, None);
}

#[test]
fn foreign_volumes_are_reported_in_the_node_status_and_omitted_when_none() {
    let mut status = VGStatus {
        name: "csi-lvm".into(),
        ..VGStatus::default()
    };
    assert!(
        serde_json::to_value(&status)
            .unwrap()
            .get("foreignVolumes")
            .is_none()
    );
    status.foreign_volumes = vec!["pvc-1".into(), "pvc-2".into()];
    assert_eq!(
        serde_json::to_value(&status).unwrap()["foreignVolumes"],
        json!(["pvc-1", "pvc-2"])
    );
}
