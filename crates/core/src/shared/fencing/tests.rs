use super::*;

fn armed() -> WatchdogSeen {
    WatchdogSeen {
        device: true,
        identity: Some("iTCO_wdt".into()),
        wdmd: Daemon::Running,
        sanlock_uses_watchdog: Some(true),
        kill_command: "/var/lib/lvms/bin/lvms fence".into(),
    }
}

#[test]
fn timing_follows_sanlock_arithmetic() {
    let t = Timing::new(10);
    assert_eq!(t.renewal_seconds(), 20);
    assert_eq!(t.renewal_fail_seconds(), 80);
    assert_eq!(t.host_dead_seconds(), 140);
    assert_eq!(t.earliest_takeover_after_death(), 120);
    assert_eq!(Timing::new(5).host_dead_seconds(), 100);
    assert_eq!(Timing::new(30).host_dead_seconds(), 300);
    assert_eq!(Timing::new(60).host_dead_seconds(), 540);
}

#[test]
fn a_hardware_watchdog_with_the_hook_is_armed_and_ready() {
    let f = judge(Policy::Required, &armed());
    assert_eq!(f.watchdog, Watchdog::Armed);
    assert!(f.kill_hook && f.ready, "{f:?}");
    assert_eq!(f.message, "");
}

#[test]
fn softdog_is_ready_with_a_warning() {
    let f = judge(
        Policy::Required,
        &WatchdogSeen {
            identity: Some("Software Watchdog".into()),
            ..armed()
        },
    );
    assert_eq!(f.watchdog, Watchdog::Softdog);
    assert!(f.ready);
    assert!(f.message.contains("softdog"), "{}", f.message);
}

#[test]
fn each_missing_part_makes_the_class_not_ready_and_names_the_fix() {
    let cases: [(WatchdogSeen, &str); 6] = [
        (
            WatchdogSeen {
                device: false,
                ..armed()
            },
            "modprobe softdog",
        ),
        (
            WatchdogSeen {
                wdmd: Daemon::Missing,
                ..armed()
            },
            "wdmd is not installed",
        ),
        (
            WatchdogSeen {
                wdmd: Daemon::Stopped("no socket".into()),
                ..armed()
            },
            "systemctl enable --now wdmd",
        ),
        (
            WatchdogSeen {
                sanlock_uses_watchdog: Some(false),
                ..armed()
            },
            "use_watchdog = 1",
        ),
        (
            WatchdogSeen {
                kill_command: String::new(),
                ..armed()
            },
            "lvmlockctl_kill_command is unset",
        ),
        (
            WatchdogSeen {
                kill_command: "/usr/local/bin/my-kill".into(),
                ..armed()
            },
            "\"/usr/local/bin/my-kill\"",
        ),
    ];
    for (seen, fix) in cases {
        let f = judge(Policy::Required, &seen);
        assert!(!f.ready, "{seen:?} → {f:?}");
        assert!(f.message.contains(fix), "{fix}: {}", f.message);
        assert!(f.message.contains("sharedConfig.watchdog: Disabled"));
    }
    // A missing hook alone leaves the watchdog armed (it still resets the node).
    let f = judge(
        Policy::Required,
        &WatchdogSeen {
            kill_command: String::new(),
            ..armed()
        },
    );
    assert_eq!((f.watchdog, f.kill_hook), (Watchdog::Armed, false));
    let f = judge(
        Policy::Required,
        &WatchdogSeen {
            device: false,
            ..armed()
        },
    );
    assert_eq!(f.watchdog, Watchdog::Missing);
}

#[test]
fn disabled_is_ready_whatever_is_missing_and_says_so() {
    let f = judge(
        Policy::Disabled,
        &WatchdogSeen {
            device: false,
            identity: None,
            wdmd: Daemon::Missing,
            sanlock_uses_watchdog: Some(false),
            kill_command: String::new(),
        },
    );
    assert_eq!(f.watchdog, Watchdog::Disabled);
    assert!(f.ready);
    assert!(f.message.contains("fencing disabled"), "{}", f.message);
}

#[test]
fn the_fenced_message_names_the_group_and_each_step() {
    let m = fenced_message("san");
    for step in [
        "dmsetup remove",
        "vgchange --lock-stop san",
        "/run/lvms/fenced-san",
    ] {
        assert!(m.contains(step), "{step}: {m}");
    }
}

#[test]
fn only_an_absolute_lvms_fence_command_is_the_hook() {
    assert!(is_fence_hook("/var/lib/lvms/bin/lvms fence"));
    assert!(is_fence_hook("/usr/bin/lvms   fence"));
    assert!(!is_fence_hook("lvms fence"));
    assert!(!is_fence_hook("/usr/bin/lvms"));
    assert!(!is_fence_hook("/usr/bin/lvms fence --now"));
    assert!(!is_fence_hook("/usr/bin/notlvms fence"));
    assert!(!is_fence_hook(""));
}

#[test]
fn dm_names_split_at_the_single_dash() {
    assert_eq!(split_dm_name("san-v1"), Some(("san".into(), "v1".into())));
    assert_eq!(
        split_dm_name("my--vg-pool--1_tdata"),
        Some(("my-vg".into(), "pool-1_tdata".into()))
    );
    assert_eq!(split_dm_name("lunpath"), None);
    assert_eq!(split_dm_name("a--b"), None);
    assert_eq!(split_dm_name("-x"), None);
}

#[test]
fn holders_are_fenced_before_what_they_hold() {
    let devices: BTreeMap<String, BTreeSet<String>> = [
        ("san-pool_tdata", vec!["san-pool-tpool"]),
        ("san-pool_tmeta", vec!["san-pool-tpool"]),
        ("san-pool-tpool", vec!["san-pool", "san-thin1"]),
        ("san-pool", vec![]),
        ("san-thin1", vec!["outside"]),
        ("san-lin", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    let order = fence_order(&devices);
    assert_eq!(order.len(), devices.len());
    let at = |n: &str| order.iter().position(|x| x == n).unwrap();
    assert!(at("san-thin1") < at("san-pool-tpool"));
    assert!(at("san-pool") < at("san-pool-tpool"));
    assert!(at("san-pool-tpool") < at("san-pool_tdata"));
    assert!(at("san-pool-tpool") < at("san-pool_tmeta"));
}

#[test]
fn a_cycle_still_yields_every_device_once() {
    let devices: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "a")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), BTreeSet::from([v.to_owned()])))
        .collect();
    assert_eq!(fence_order(&devices), vec!["a".to_owned(), "b".to_owned()]);
}

#[test]
fn a_kept_io_timeout_other_than_the_class_s_is_named_with_both_budgets_and_the_fix() {
    assert_eq!(io_timeout_mismatch("san", 10, 10), None);
    assert_eq!(
        io_timeout_mismatch("san", 10, 0),
        None,
        "sanlock did not say"
    );
    let m = io_timeout_mismatch("san", 10, 20).unwrap();
    assert!(
        m.contains("io timeout 20 s") && m.contains("ioTimeoutSeconds 10 s"),
        "{m}"
    );
    assert!(m.contains("after 220 s, not 140 s"), "{m}");
    assert!(m.contains("--sanlock-timeout 10"), "{m}");
}
