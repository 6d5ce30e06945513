use super::*;
use crate::fake::FakeRunner;

/// Real output of sanlock 3.8.5 in the two-VM test (node 2, joined to `lvm_san`).
const STATUS: &str = include_str!("status-D.txt");
const HOST_STATUS: &str = include_str!("host-status-D.txt");

#[test]
fn status_gives_the_watchdog_and_each_lockspaces_renewals() {
    let (watchdog, spaces) = parse_status(STATUS);
    assert_eq!(watchdog, Some(true));
    assert_eq!(
        spaces.get("lvm_san"),
        Some(&Renewals {
            io_timeout: 10,
            renew_fail: false,
            last_failed: false,
            last_attempt: 168,
            last_success: 168,
        })
    );
    assert_eq!(spaces.len(), 1);
    let failing = STATUS
        .replace("renewal_last_result=1", "renewal_last_result=-5")
        .replace("renew_fail=0", "renew_fail=1")
        .replace("use_watchdog=1", "use_watchdog=0");
    let (watchdog, spaces) = parse_status(&failing);
    assert_eq!(watchdog, Some(false));
    let r = &spaces["lvm_san"];
    assert!(r.last_failed && r.renew_fail);
    assert_eq!(parse_status("").0, None);
}

#[test]
fn host_status_lists_each_host_and_whether_it_still_renews() {
    let hosts = parse_host_status(HOST_STATUS);
    assert_eq!(
        hosts
            .iter()
            .map(|h| (h.host_id, h.timestamp))
            .collect::<Vec<_>>(),
        vec![(1, 196), (2, 147)]
    );
    assert!(hosts.iter().all(HostLease::live));
    let seen_long_ago = HostLease {
        last_check: 500,
        last_live: 360,
        ..hosts[0].clone()
    };
    assert!(
        !seen_long_ago.live() && seen_long_ago.dead(),
        "140 s without a change at io timeout 10: dead"
    );
    let just_before = HostLease {
        last_live: 361,
        ..seen_long_ago.clone()
    };
    assert!(just_before.live() && !just_before.dead());
    let left = HostLease {
        timestamp: 0,
        ..seen_long_ago.clone()
    };
    assert!(!left.live(), "a host that left cleanly holds nothing");
    assert!(!left.dead(), "and did not die: it left");
}

#[test]
fn a_host_that_stopped_renewing_is_counted_down_from_when_this_host_last_saw_it_renew() {
    let hosts = parse_host_status(HOST_STATUS);
    assert!(
        hosts.iter().all(|h| h.frees_in().is_none()),
        "both renew: nothing to count down"
    );
    // Silent for 41 s at io timeout 10 (renewals every 20 s): stopped; 99 s of 140 s left.
    let silent = HostLease {
        last_check: 209,
        ..hosts[1].clone()
    };
    assert_eq!(silent.frees_in(), Some((41, 99)));
    // Two renewal intervals of silence are still within a live host's jitter.
    let late = HostLease {
        last_check: 208,
        ..hosts[1].clone()
    };
    assert_eq!(late.frees_in(), None);
    // Past the host-dead time the leases are free: nothing left to wait for.
    let dead = HostLease {
        last_check: 168 + 140,
        ..hosts[1].clone()
    };
    assert_eq!(dead.frees_in(), None);
}

#[tokio::test]
async fn observe_timing_reads_the_kept_io_timeout_and_the_hosts() {
    let fake = answering(STATUS, HOST_STATUS);
    let timing = observe_timing(&fake, "san").await;
    fake.assert_done();
    assert_eq!(timing.hosts.len(), 2);
    assert_eq!(timing.io_timeout, Some(10));
    // sanlock not answering: nothing known.
    let silent = FakeRunner::new();
    silent
        .expect(&["sanlock", "client", "status", "-D"])
        .fails(1, "sanlock daemon not running");
    silent
        .expect(&["sanlock", "client", "host_status", "-s", "lvm_san", "-D"])
        .fails(1, "sanlock daemon not running");
    assert_eq!(
        observe_timing(&silent, "san").await,
        LockspaceTiming::default()
    );
}

#[test]
fn the_kill_command_is_read_from_lvm_config() {
    assert_eq!(
        parse_kill_command("lvmlockctl_kill_command=\"/var/lib/lvms/bin/lvms fence\"\n"),
        "/var/lib/lvms/bin/lvms fence"
    );
    assert_eq!(parse_kill_command("lvmlockctl_kill_command=\"\"\n"), "");
    assert_eq!(parse_kill_command(""), "");
}

const KILL_COMMAND: [&str; 5] = [
    "lvm",
    "config",
    "--typeconfig",
    "full",
    "global/lvmlockctl_kill_command",
];

/// A runner whose sanlock answers `status` and `host_status` of `lvm_san`; the kill-hook read is
/// left for the test to script.
fn answering(status: &str, host_status: &str) -> FakeRunner {
    let fake = FakeRunner::new();
    fake.expect(&["sanlock", "client", "status", "-D"])
        .stdout(status);
    fake.expect(&["sanlock", "client", "host_status", "-s", "lvm_san", "-D"])
        .stdout(host_status);
    fake
}

#[tokio::test]
async fn observe_lockspace_reads_files_and_the_commands() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for (path, body) in [
        ("dev/watchdog", ""),
        (
            "sys/class/watchdog/watchdog0/identity",
            "Software Watchdog\n",
        ),
        ("run/wdmd/wdmd.sock", ""),
    ] {
        std::fs::create_dir_all(root.join(path).parent().unwrap()).unwrap();
        std::fs::write(root.join(path), body).unwrap();
    }
    let fake = answering(STATUS, HOST_STATUS);
    fake.expect(&KILL_COMMAND)
        .stdout("lvmlockctl_kill_command=\"/usr/bin/lvms fence\"\n");
    let seen = observe_lockspace(&fake, root, "san").await;
    fake.assert_done();
    assert_eq!(
        seen.watchdog,
        WatchdogSeen {
            device: true,
            identity: Some("Software Watchdog".into()),
            wdmd: Daemon::Running,
            sanlock_uses_watchdog: Some(true),
            kill_command: "/usr/bin/lvms fence".into(),
        }
    );
    assert_eq!(seen.renewals.map(|r| r.last_success), Some(168));
    assert_eq!(seen.hosts.len(), 2);
    assert!(!seen.fenced);

    // Nothing there: no device, no wdmd, sanlock and lvm not answering.
    let empty = tempfile::tempdir().unwrap();
    let fake = FakeRunner::new();
    fake.expect(&["sanlock", "client", "status", "-D"])
        .spawn_fails();
    fake.expect(&["sanlock", "client", "host_status", "-s", "lvm_san", "-D"])
        .fails(1, "");
    fake.expect(&[
        "lvm",
        "config",
        "--typeconfig",
        "full",
        "global/lvmlockctl_kill_command",
    ])
    .fails(
        5,
        "Configuration node global/lvmlockctl_kill_command not found",
    );
    let seen = observe_lockspace(&fake, empty.path(), "san").await;
    let w = &seen.watchdog;
    assert_eq!(
        (
            w.device,
            &w.wdmd,
            w.sanlock_uses_watchdog,
            w.kill_command.as_str()
        ),
        (false, &Daemon::Missing, None, "")
    );
    assert_eq!((seen.renewals, seen.hosts.len()), (None, 0));

    // The fence hook's record.
    std::fs::create_dir_all(root.join("run/lvms")).unwrap();
    std::fs::write(root.join("run/lvms/fenced-san"), "{}").unwrap();
    let fake = answering(STATUS, HOST_STATUS);
    fake.expect(&KILL_COMMAND).stdout("");
    assert!(observe_lockspace(&fake, root, "san").await.fenced);
}
