use std::sync::Mutex;

use lvms_core::config::{Access, DeviceSelector, DiscoveryPolicy, SharedConfig};
use lvms_core::leave::LeaveState;
use lvms_core::shared::rejoin::{DmUse, FencedSeen, RejoinStep};

use super::*;
use crate::fake::FakeRunner;

const SCOPE: [&str; 4] = [
    "--config",
    "global/use_lvmlockd=1",
    "--devicesfile",
    "lvms-san.devices",
];

fn with_scope<'a>(sub: &'a str, host_id: Option<&'a str>, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["lvm", sub];
    match host_id {
        Some(cfg) => v.extend(["--config", cfg, "--devicesfile", "lvms-san.devices"]),
        None => v.extend(SCOPE),
    }
    v.extend(rest);
    v
}

#[test]
fn sanlock_status_lists_joined_lvmlockd_lockspaces_only() {
    let text = "daemon 0e3c.node\np -1 helper\np -1 listener\np 812 lvmlockd\n\
                s lvm_san:2:/dev/mapper/san-lvmlock:0\n\
                s lvm_other:2:/dev/mapper/other-lvmlock:0\n\
                s lvm_joining:2:/dev/mapper/joining-lvmlock:0 ADD\n\
                s lvm_leaving:2:/dev/mapper/leaving-lvmlock:0 REM\n\
                s someone_else:1:/dev/sdz:0\nr lvm_san:VGLK:/dev/mapper/san-lvmlock:69206016:1 p 812\n";
    assert_eq!(
        parse_started_lockspaces(text),
        BTreeSet::from(["san".to_owned(), "other".to_owned()])
    );
    assert!(parse_started_lockspaces("").is_empty());
    assert_eq!(
        parse_listed_lockspaces(text),
        BTreeSet::from([
            "san".to_owned(),
            "other".to_owned(),
            "joining".to_owned(),
            "leaving".to_owned()
        ])
    );
}

/// A socket that answers as lvmlockd's would (bound and listening; nothing is read from it).
fn lvmlockd() -> (tempfile::TempDir, std::path::PathBuf) {
    // lvmlockd's reply to lvm's hello (libdaemon's format).
    socket_answering("response=\"OK\"\nprotocol=\"lvmlockd\"\nversion=1\n\n##\n")
}

/// A socket that answers every connection's first message with `reply` (for as long as the test
/// runs: the thread is left behind).
fn socket_answering(reply: &'static str) -> (tempfile::TempDir, std::path::PathBuf) {
    use std::io::{Read as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lvmlockd.socket");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().map_while(Result::ok) {
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while !got.ends_with(b"\n##\n") {
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            if String::from_utf8_lossy(&got).contains("hello") {
                let _ = conn.write_all(reply.as_bytes());
            }
        }
    });
    (dir, path)
}

#[test]
fn lvmlockd_answers_only_when_the_socket_replies_ok_to_hello() {
    let (_live, socket) = lvmlockd();
    assert_eq!(lvmlockd_answers(&socket), Daemon::Running);
    let (_other, socket) = socket_answering("response=\"unknown request\"\n\n##\n");
    let Daemon::Stopped(why) = lvmlockd_answers(&socket) else {
        panic!("a socket that does not answer OK is not lvmlockd");
    };
    assert!(why.contains("did not answer lvm's hello"), "{why}");
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        lvmlockd_answers(&dir.path().join("none")),
        Daemon::Stopped(why) if why.contains("no socket")
    ));
}

#[test]
fn devices_file_listing_gives_device_names() {
    let text = "  Device /dev/vda IDTYPE=sys_serial IDNAME=lun0 DEVNAME=/dev/vda PVID=abc\n\
                  Device /dev/vdb IDTYPE=devname IDNAME=/dev/vdb DEVNAME=/dev/vdb PVID=.\n";
    assert_eq!(
        parse_devices_file_listing(text),
        BTreeSet::from(["/dev/vda".to_owned(), "/dev/vdb".to_owned()])
    );
}

#[tokio::test]
async fn a_missing_program_is_missing_and_a_failing_one_stopped() {
    let fake = FakeRunner::new();
    fake.expect(&["sanlock", "client", "status"]).spawn_fails();
    let dir = tempfile::tempdir().unwrap();
    let d = SharedLvm::new(fake.clone())
        .with_lvmlockd_socket(dir.path().join("lvmlockd.socket"))
        .daemons()
        .await;
    assert_eq!(d.sanlock, Daemon::Missing);
    assert!(
        matches!(&d.lvmlockd, Daemon::Stopped(s) if s.contains("no socket at")),
        "{d:?}"
    );
    // A socket nobody listens on any more.
    let stale = dir.path().join("stale.socket");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    let d = SharedLvm::new(fake.clone())
        .with_lvmlockd_socket(&stale)
        .daemons()
        .await;
    assert_eq!(d.sanlock, Daemon::Running);
    assert!(
        matches!(&d.lvmlockd, Daemon::Stopped(s) if s.contains("refused")),
        "{d:?}"
    );
    let (_live, socket) = lvmlockd();
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    let d = SharedLvm::new(fake.clone())
        .with_lvmlockd_socket(&socket)
        .daemons()
        .await;
    assert_eq!(d.lvmlockd, Daemon::Running);
    fake.assert_done();
}

#[tokio::test]
async fn a_pod_gets_a_pid_file_stand_in_only_while_lvmlockd_answers() {
    let fake = FakeRunner::new();
    let dir = tempfile::tempdir().unwrap();
    let pid = dir.path().join("lvmlockd.pid");
    // No lvmlockd: no stand-in.
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    SharedLvm::new(fake.clone())
        .with_lvmlockd_socket(dir.path().join("none.socket"))
        .with_pid_file_stand_in(&pid)
        .daemons()
        .await;
    assert!(!pid.exists());
    // lvmlockd answers: lvm in the pod will find the file it looks for.
    let (_live, socket) = lvmlockd();
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    SharedLvm::new(fake.clone())
        .with_lvmlockd_socket(&socket)
        .with_pid_file_stand_in(&pid)
        .daemons()
        .await;
    assert!(std::fs::read_to_string(&pid).unwrap().contains("stand-in"));
    fake.assert_done();
}

#[tokio::test]
async fn create_volume_group_is_shared_tagged_scoped_and_carries_the_host_id() {
    let fake = FakeRunner::new();
    fake.expect(&with_scope(
        "vgcreate",
        Some("global/use_lvmlockd=1 local/host_id=3"),
        &["--shared", "--addtag", "lvms", "san", "/dev/vdb"],
    ))
    .succeeds();
    SharedLvm::new(fake.clone())
        .create_volume_group("san", &["/dev/vdb".into()], &["lvms".into()], 3)
        .await
        .unwrap();
    let call = &fake.calls()[0];
    assert_eq!(call.timeout, LOCK_TIMEOUT);
    fake.assert_done();
}

#[tokio::test]
async fn lock_stop_only_when_started() {
    let fake = FakeRunner::new();
    fake.expect(&["sanlock", "client", "status"]).stdout("");
    fake.expect(&["sanlock", "client", "status"])
        .stdout("s lvm_san:2:/dev/mapper/san-lvmlock:0\n");
    fake.expect(&with_scope("vgchange", None, &["--lock-stop", "san"]))
        .succeeds();
    let lvm = SharedLvm::new(fake.clone());
    lvm.lock_stop("san").await.unwrap();
    lvm.lock_stop("san").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_reads_lock_type_tags_and_pvs_through_the_devices_file() {
    let fake = FakeRunner::new();
    fake.expect(&with_scope(
        "vgs",
        None,
        &[
            "--reportformat",
            "json",
            "-o",
            "vg_name,vg_lock_type,vg_tags",
            "san",
        ],
    ))
    .stdout(r#"{"report":[{"vg":[{"vg_name":"san","vg_lock_type":"sanlock","vg_tags":"lvms"}]}]}"#);
    fake.expect(&with_scope(
        "pvs",
        None,
        &["--reportformat", "json", "-o", "pv_name,vg_name"],
    ))
    .stdout(r#"{"report":[{"pv":[{"pv_name":"/dev/vdb","vg_name":"san"}]}]}"#);
    fake.expect(&with_scope(
        "vgs",
        None,
        &[
            "--reportformat",
            "json",
            "-o",
            "vg_name,vg_lock_type,vg_tags",
            "san",
        ],
    ))
    .fails(
        5,
        "  Volume group \"san\" not found\n  Cannot process volume group san",
    );
    let lvm = SharedLvm::new(fake.clone());
    assert_eq!(
        lvm.vg("san").await.unwrap(),
        Some(SharedVg {
            name: "san".into(),
            lock_type: "sanlock".into(),
            tags: vec!["lvms".into()],
            pvs: vec!["/dev/vdb".into()],
        })
    );
    assert_eq!(lvm.vg("san").await.unwrap(), None);
    fake.assert_done();
}

/// A scripted host: observations in order, every executed action recorded, lock-start failing
/// `lock_start_failures` times.
struct Script {
    observations: Mutex<Vec<Observed>>,
    executed: Mutex<Vec<Action>>,
    lock_start_failures: Mutex<u32>,
    pauses: Mutex<Vec<Duration>>,
    fencing: Option<crate::sanlock::FencingSeen>,
    /// What a fenced node sees (`None`: it cannot look, as on a test host).
    fenced_seen: Option<FencedSeen>,
    rejoin_steps: Mutex<Vec<RejoinStep>>,
    /// What installing the fence hook ends with (`None`: this host does not install it), and
    /// how often it was asked.
    hook: Option<crate::fence::install::Installed>,
    hook_calls: Mutex<u32>,
}

impl Script {
    /// Fenced, until a step back clears the record.
    fn fenced(&self) -> bool {
        self.fencing.as_ref().is_some_and(|f| f.fenced)
            && !self
                .rejoin_steps
                .lock()
                .unwrap()
                .iter()
                .any(|s| matches!(s, RejoinStep::ClearRecord { .. }))
    }
}

impl SharedHost for Script {
    async fn observe(
        &self,
        _: &DeviceClassConfig,
        _: Option<&SharedNodeConfig>,
    ) -> Result<Observed> {
        let mut o = self.observations.lock().unwrap();
        Ok(if o.len() > 1 {
            o.remove(0)
        } else {
            o[0].clone()
        })
    }
    async fn execute(&self, action: &Action) -> Result<()> {
        self.executed.lock().unwrap().push(action.clone());
        let mut left = self.lock_start_failures.lock().unwrap();
        if matches!(action, Action::StartLockspace { .. }) && *left > 0 {
            *left -= 1;
            return Err(Error::CommandFailed {
                argv: crate::error::Argv(vec!["lvm".into(), "vgchange".into()]),
                code: Some(5),
                stderr: "prepare_lockspace_san stat error 2 disk_path /dev/mapper/san-lvmlock"
                    .into(),
            });
        }
        Ok(())
    }
    async fn pause(&self, d: Duration) {
        self.pauses.lock().unwrap().push(d);
    }
    async fn observe_fencing(&self, _: &str) -> Option<crate::sanlock::FencingSeen> {
        self.fencing.clone().map(|mut f| {
            f.fenced = self.fenced();
            f
        })
    }
    async fn install_fence_hook(&self) -> Option<crate::fence::install::Installed> {
        *self.hook_calls.lock().unwrap() += 1;
        self.hook.clone()
    }
    async fn is_fenced(&self, _: &str) -> bool {
        self.fenced()
    }
    async fn observe_fenced(&self, _: &DeviceClassConfig) -> Option<FencedSeen> {
        self.fenced_seen.clone()
    }
    async fn execute_rejoin(&self, step: &RejoinStep) -> Result<()> {
        self.rejoin_steps.lock().unwrap().push(step.clone());
        Ok(())
    }
}

fn class() -> DeviceClassConfig {
    DeviceClassConfig {
        name: "san".into(),
        device_selector: DeviceSelector {
            paths: vec!["/dev/disk/by-id/lun".into()],
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

fn joined_after(lockspace_started: bool) -> Observed {
    Observed {
        daemons: Daemons {
            sanlock: Daemon::Running,
            lvmlockd: Daemon::Running,
        },
        host_id: Some(2),
        may_create: false,
        resolved: [(
            "/dev/disk/by-id/lun".to_owned(),
            Some("/dev/vdb".to_owned()),
        )]
        .into(),
        devices_file: ["/dev/vdb".to_owned()].into(),
        vg: Some(SharedVg {
            name: "san".into(),
            lock_type: "sanlock".into(),
            tags: vec!["lvms".into()],
            pvs: vec!["/dev/vdb".into()],
        }),
        orphan_pvs: BTreeSet::new(),
        signatures: BTreeMap::new(),
        lockspace_started,
    }
}

fn script(failures: u32) -> Script {
    Script {
        observations: Mutex::new(vec![joined_after(false), joined_after(true)]),
        executed: Mutex::new(vec![]),
        lock_start_failures: Mutex::new(failures),
        pauses: Mutex::new(vec![]),
        fencing: None,
        fenced_seen: None,
        rejoin_steps: Mutex::new(vec![]),
        hook: None,
        hook_calls: Mutex::new(0),
    }
}

/// What a node with softdog, wdmd, sanlock using it and the hook shows, `fenced` or not.
fn armed(fenced: bool) -> crate::sanlock::FencingSeen {
    crate::sanlock::FencingSeen {
        watchdog: lvms_core::shared::fencing::WatchdogSeen {
            device: true,
            identity: Some("Software Watchdog".into()),
            wdmd: Daemon::Running,
            sanlock_uses_watchdog: Some(true),
            kill_command: "/usr/bin/lvms fence".into(),
        },
        renewals: None,
        hosts: vec![crate::sanlock::HostLease {
            host_id: 2,
            timestamp: 100,
            last_check: 100,
            last_live: 100,
            io_timeout: 10,
        }],
        fenced,
    }
}

#[tokio::test]
async fn a_joined_class_with_armed_fencing_is_ready_and_one_without_is_not() {
    let host = Script {
        fencing: Some(armed(false)),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(report.is_ready(), "{report:?}");
    let f = report.fencing.as_ref().unwrap();
    assert_eq!(f.live_host_ids, [2]);
    assert!(f.verdict.message.contains("softdog"), "{f:?}");

    let mut unarmed = armed(false);
    unarmed.watchdog.kill_command = String::new();
    let host = Script {
        fencing: Some(unarmed),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(report.is_joined() && !report.is_ready(), "{report:?}");
}

#[tokio::test]
async fn the_report_lists_hosts_live_dead_and_silent_as_sanlock_sees_them() {
    let lease = |host_id, last_live| crate::sanlock::HostLease {
        host_id,
        timestamp: 7,
        last_check: 300,
        last_live,
        io_timeout: 10,
    };
    let mut seen = armed(false);
    // 2 renews; 1 has been silent 150 s (dead at 140); 3 for 50 s (stopped, not dead yet).
    seen.hosts = vec![lease(1, 150), lease(2, 295), lease(3, 250)];
    let host = Script {
        fencing: Some(seen),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    let f = report.fencing.as_ref().unwrap();
    assert_eq!(f.live_host_ids, [2, 3]);
    assert_eq!(f.dead_host_ids, [1]);
    assert_eq!(f.silent_host_ids, [3]);
}

#[tokio::test]
async fn a_hook_the_host_refuses_is_reported_and_a_disabled_class_never_installs_it() {
    use crate::fence::install::Installed;
    let mut foreign = armed(false);
    foreign.watchdog.kill_command = "/usr/sbin/site-fence".into();
    let host = Script {
        fencing: Some(foreign.clone()),
        hook: Some(Installed::Refused(
            "lvmlockctl_kill_command is already \"/usr/sbin/site-fence\"".into(),
        )),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(report.is_joined() && !report.is_ready(), "{report:?}");
    let message = &report.fencing.as_ref().unwrap().verdict.message;
    assert!(
        message.starts_with("lvmlockctl_kill_command is already \"/usr/sbin/site-fence\""),
        "{message}"
    );
    assert_eq!(*host.hook_calls.lock().unwrap(), 1);

    // Installed: the look after it sees the hook, and the class is served.
    let host = Script {
        fencing: Some(armed(false)),
        hook: Some(Installed::Done { changed: vec![] }),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(report.is_ready(), "{report:?}");
    assert_eq!(*host.hook_calls.lock().unwrap(), 1);

    // The admin opted out of fencing: the host is not touched.
    let mut disabled = class();
    if let Access::Shared(s) = &mut disabled.access {
        s.watchdog = lvms_core::config::WatchdogPolicy::Disabled;
    }
    let host = Script {
        fencing: Some(foreign),
        hook: Some(Installed::Done { changed: vec![] }),
        ..script(0)
    };
    let report = converge(&host, &disabled, None).await.unwrap();
    assert!(report.is_ready(), "{report:?}");
    assert_eq!(*host.hook_calls.lock().unwrap(), 0);
}

#[tokio::test]
async fn a_lockspace_kept_at_another_io_timeout_is_reported_and_still_served() {
    let kept = |io_timeout| crate::sanlock::FencingSeen {
        renewals: Some(crate::sanlock::Renewals {
            io_timeout,
            ..Default::default()
        }),
        ..armed(false)
    };
    // The class says 10 s (the default); sanlock here keeps 5 s.
    let host = Script {
        fencing: Some(kept(5)),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(report.is_ready(), "{report:?}");
    assert_eq!(report.kept_io_timeout(), Some(5));
    let message = &report.fencing.as_ref().unwrap().verdict.message;
    assert!(
        message.contains("softdog") && message.contains("io timeout 5 s"),
        "{message}"
    );
    assert!(message.contains("--sanlock-timeout 10"), "{message}");
    // The same timing: nothing to say about it.
    let host = Script {
        fencing: Some(kept(10)),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    let message = &report.fencing.as_ref().unwrap().verdict.message;
    assert!(!message.contains("io timeout"), "{message}");
}

#[tokio::test]
async fn a_fenced_node_touches_nothing_and_says_how_to_come_back() {
    let host = Script {
        fencing: Some(armed(true)),
        ..script(0)
    };
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(host.executed.lock().unwrap().is_empty());
    assert_eq!(
        host.observations.lock().unwrap().len(),
        2,
        "LVM was not even looked at"
    );
    assert!(!report.is_ready());
    match &report.plan.state {
        State::Failed { reason } => assert!(reason.contains("was fenced"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_failed_first_lock_start_is_retried_and_joins() {
    let host = script(1);
    let node = SharedNodeConfig {
        host_id: 2,
        create_volume_groups: false,
    };
    let report = converge(&host, &class(), Some(&node)).await.unwrap();
    assert!(report.is_joined(), "{report:?}");
    assert_eq!(host.executed.lock().unwrap().len(), 2);
    assert_eq!(*host.pauses.lock().unwrap(), [Duration::from_secs(1)]);
    assert_eq!(report.lock_start_failures.len(), 1);
    assert!(report.lock_start_failures[0].contains("prepare_lockspace_san"));
}

#[tokio::test]
async fn lock_start_gives_up_after_its_retries_and_says_it_will_try_again() {
    let host = script(100);
    let report = converge(&host, &class(), None).await.unwrap();
    assert!(!report.is_joined());
    // 1 try + 5 retries.
    assert_eq!(host.executed.lock().unwrap().len(), 6);
    match &report.plan.state {
        State::Waiting { reason } => {
            assert!(
                reason.contains("failed 6 times") && reason.contains("next converge"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_devices_file_not_made_yet_lists_nothing() {
    let fake = FakeRunner::new();
    fake.expect(&["lvm", "lvmdevices", "--devicesfile", "lvms-san.devices"])
        .fails(5, "  Devices file does not exist.");
    fake.expect(&["lvm", "lvmdevices", "--devicesfile", "lvms-san.devices"])
        .fails(5, "  Some other failure.");
    let lvm = SharedLvm::new(fake.clone());
    assert!(lvm.devices_file("san").await.unwrap().is_empty());
    assert!(lvm.devices_file("san").await.is_err());
    fake.assert_done();
}

const LISTING: &str = "  Device /dev/vdb IDTYPE=sys_serial IDNAME=lun0 DEVNAME=/dev/vdb PVID=abc\n";
const STARTED: &str = "p -1 helper\ns lvm_san:2:/dev/mapper/san-lvmlock:0\n";

/// The commands of one leave observation of a node that sees the group `san` on /dev/vdb.
fn expect_leave_observation(fake: &FakeRunner, started: bool, lvs: &str) {
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    fake.expect(&["lvm", "lvmdevices", "--devicesfile", "lvms-san.devices"])
        .stdout(LISTING);
    fake.expect(&["sanlock", "client", "status"])
        .stdout(if started { STARTED } else { "" });
    fake.expect(&with_scope(
        "vgs",
        None,
        &[
            "--reportformat",
            "json",
            "-o",
            "vg_name,vg_lock_type,vg_tags",
            "san",
        ],
    ))
    .stdout(r#"{"report":[{"vg":[{"vg_name":"san","vg_lock_type":"sanlock","vg_tags":"lvms"}]}]}"#);
    fake.expect(&with_scope(
        "pvs",
        None,
        &["--reportformat", "json", "-o", "pv_name,vg_name"],
    ))
    .stdout(r#"{"report":[{"pv":[{"pv_name":"/dev/vdb","vg_name":"san"}]}]}"#);
    fake.expect(&with_scope(
        "lvs",
        None,
        &[
            "--reportformat",
            "json",
            "-o",
            "lv_name,segtype,pool_lv",
            "san",
        ],
    ))
    .stdout(lvs);
}

fn node(host_id: u16, remover: bool) -> SharedNodeConfig {
    SharedNodeConfig {
        host_id,
        create_volume_groups: remover,
    }
}

#[tokio::test]
async fn lvs_leaves_out_hidden_volumes_and_the_lock_volume() {
    let fake = FakeRunner::new();
    fake.expect(&with_scope(
        "lvs",
        None,
        &[
            "--reportformat",
            "json",
            "-o",
            "lv_name,segtype,pool_lv",
            "san",
        ],
    ))
    .stdout(
        r#"{"report":[{"lv":[{"lv_name":"[lvmlock]","segtype":"linear","pool_lv":""},
            {"lv_name":"pool-a","segtype":"thin-pool","pool_lv":""},
            {"lv_name":"v1","segtype":"thin","pool_lv":"pool-a"}]}]}"#,
    );
    let lvs = SharedLvm::new(fake.clone()).lvs("san").await.unwrap();
    assert_eq!(
        lvs,
        [
            SharedLv {
                name: "pool-a".into(),
                segtype: "thin-pool".into(),
                pool_lv: None
            },
            SharedLv {
                name: "v1".into(),
                segtype: "thin".into(),
                pool_lv: Some("pool-a".into())
            },
        ]
    );
    fake.assert_done();
}

#[tokio::test]
async fn the_remover_removes_the_empty_pool_and_waits_while_another_host_holds_the_lockspace() {
    let fake = FakeRunner::new();
    expect_leave_observation(
        &fake,
        true,
        r#"{"report":[{"lv":[{"lv_name":"pool-a","segtype":"thin-pool","pool_lv":""}]}]}"#,
    );
    fake.expect(&with_scope("lvremove", None, &["san/pool-a"]))
        .succeeds();
    fake.expect(&with_scope("vgremove", None, &["san"])).fails(
        5,
        "  Lockspace for \"san\" not stopped on other hosts\n  Volume group \"san\" not removed",
    );
    let (_lvmlockd, socket) = lvmlockd();
    let host = RealSharedHost::new(fake.clone()).with_lvmlockd_socket(socket);
    let report = leave(&host, &class(), Some(&node(1, true))).await.unwrap();
    assert_eq!(
        report.executed,
        [LeaveAction::RemovePool {
            vg: "san".into(),
            pool: "pool-a".into()
        }]
    );
    assert!(!report.has_left());
    assert!(
        matches!(&report.plan.state, LeaveState::Waiting { reason } if reason.contains("other nodes")),
        "{report:?}"
    );
    fake.assert_done();
}

#[tokio::test]
async fn another_node_stops_its_lockspace_and_empties_its_devices_file_and_has_left() {
    let fake = FakeRunner::new();
    expect_leave_observation(&fake, true, r#"{"report":[{"lv":[]}]}"#);
    // lock_stop looks first.
    fake.expect(&["sanlock", "client", "status"])
        .stdout(STARTED);
    fake.expect(&with_scope("vgchange", None, &["--lock-stop", "san"]))
        .succeeds();
    fake.expect(&["lvm", "lvmdevices", "--devicesfile", "lvms-san.devices"])
        .stdout(LISTING);
    fake.expect(&[
        "lvm",
        "lvmdevices",
        "--devicesfile",
        "lvms-san.devices",
        "--deldev",
        "/dev/vdb",
    ])
    .succeeds();
    // Observed again: nothing left.
    fake.expect(&["sanlock", "client", "status"]).succeeds();
    fake.expect(&["lvm", "lvmdevices", "--devicesfile", "lvms-san.devices"])
        .stdout("");
    fake.expect(&["sanlock", "client", "status"]).stdout("");
    let (_lvmlockd, socket) = lvmlockd();
    let host = RealSharedHost::new(fake.clone()).with_lvmlockd_socket(socket);
    let report = leave(&host, &class(), Some(&node(2, false))).await.unwrap();
    assert!(report.has_left(), "{report:?}");
    assert_eq!(report.executed.len(), 2, "{report:?}");
    fake.assert_done();
}

#[tokio::test]
async fn a_volume_left_in_the_group_is_named_and_nothing_is_run() {
    let fake = FakeRunner::new();
    expect_leave_observation(
        &fake,
        true,
        r#"{"report":[{"lv":[{"lv_name":"vol-1","segtype":"linear","pool_lv":""}]}]}"#,
    );
    let (_lvmlockd, socket) = lvmlockd();
    let host = RealSharedHost::new(fake.clone()).with_lvmlockd_socket(socket);
    let report = leave(&host, &class(), Some(&node(1, true))).await.unwrap();
    assert!(report.executed.is_empty());
    assert!(
        matches!(&report.plan.state, LeaveState::Refused { reason }
            if reason.starts_with("ManualCleanupRequired") && reason.contains("vol-1")),
        "{report:?}"
    );
    fake.assert_done();
}

#[tokio::test]
async fn labels_are_removed_without_lvmlockd_through_the_class_devices_file() {
    let fake = FakeRunner::new();
    fake.expect(&[
        "lvm",
        "pvremove",
        "--config",
        "global/use_lvmlockd=0",
        "--devicesfile",
        "lvms-san.devices",
        "--yes",
        "/dev/vdb",
    ])
    .succeeds();
    let lvm = SharedLvm::new(fake.clone());
    lvm.remove_pvs("lvms-san.devices", &["/dev/vdb".into()])
        .await
        .unwrap();
    assert!(
        lvm.remove_pvs("../lvm.conf", &["/dev/vdb".into()])
            .await
            .is_err()
    );
    fake.assert_done();
}

/// A fenced node that sees its volume `open` times open and its LUN readable or not.
fn fenced_seeing(open: u32, readable: bool) -> Script {
    Script {
        fencing: Some(armed(true)),
        fenced_seen: Some(FencedSeen {
            devices: [(
                "san-csi--a".to_owned(),
                DmUse {
                    holders: BTreeSet::new(),
                    open,
                },
            )]
            .into(),
            unreadable: if readable {
                Vec::new()
            } else {
                vec!["/dev/disk/by-id/lun: Input/output error".into()]
            },
        }),
        ..script(0)
    }
}

#[tokio::test]
async fn a_fenced_node_waits_while_its_volume_is_open_or_its_lun_unreadable_touching_nothing() {
    for (host, waits_for) in [
        (fenced_seeing(1, true), "still open (san-csi--a)"),
        (fenced_seeing(0, false), "cannot be read"),
    ] {
        let report = converge(&host, &class(), None).await.unwrap();
        assert!(host.executed.lock().unwrap().is_empty());
        assert!(host.rejoin_steps.lock().unwrap().is_empty());
        assert!(!report.is_ready() && report.rejoined.is_empty());
        match &report.plan.state {
            State::Failed { reason } => assert!(reason.contains(waits_for), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn a_fenced_node_with_nothing_open_and_its_lun_back_clears_the_hooks_work_and_joins_again() {
    let host = fenced_seeing(0, true);
    let report = converge(&host, &class(), None).await.unwrap();
    assert_eq!(
        *host.rejoin_steps.lock().unwrap(),
        [
            RejoinStep::RemoveDevice {
                name: "san-csi--a".into()
            },
            RejoinStep::StopLockspace { vg: "san".into() },
            RejoinStep::ClearRecord { vg: "san".into() },
        ]
    );
    assert_eq!(report.rejoined.len(), 3);
    assert!(report.is_joined() && report.is_ready(), "{report:?}");
    assert!(
        host.executed
            .lock()
            .unwrap()
            .iter()
            .any(|a| matches!(a, Action::StartLockspace { .. })),
        "the lockspace is started again"
    );
}
