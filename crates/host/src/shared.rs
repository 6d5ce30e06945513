//! Shared volume groups on the machine: `lvmlockd` + `sanlock`, one devices file per class, and the
//! node side of [`lvms_core::shared`] (observe, execute, converge).
//!
//! Every LVM command of a shared class carries its [`LockScope::args`]: `--config
//! "global/use_lvmlockd=1 local/host_id=<id>"` (the host id reaches lvmlockd with the lock-start; no host
//! file is edited) and `--devicesfile lvms-<class>.devices`, so the class's commands see only its LUNs and
//! the local classes' commands (run without lvmlockd) skip the shared volume group altogether. These
//! commands never go through the long-lived `lvm` shell (see [`crate::shell`]): lock-start takes 20 s
//! to minutes and would hold up every other command.
//!
//! | operation | already done | how it is known |
//! |---|---|---|
//! | `add_device` | LVM's own (adding a listed device again changes nothing) | |
//! | `create_volume_group` | the plan only asks when LVM sees no such group | `vgs` first |
//! | `lock_start` | started: `Ok` (LVM's own) | |
//! | `lock_stop` | not started: `Ok` | `lvmlockctl --info` first |
//! | `remove_pool` | the plan only asks for pools `lvs` shows | `lvs` first |
//! | `remove_volume_group` | the plan only asks when LVM sees the group | `vgs` first |
//! | `remove_pvs` | the plan only asks for labels `pvs` shows | `pvs` first |
//! | `clear_devices_file` | an empty or missing file: `Ok` | the listing first |

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use lvms_core::{
    config::{DeviceClassConfig, SharedNodeConfig},
    shared::{
        self, Action, Daemon, Daemons, Observed, Plan, SharedVg, State,
        fencing::{self, Fencing},
        leave::{self, LeaveAction, LeaveObserved, LeavePlan, SharedLv},
        rejoin::{self, DmUse, FencedSeen, RejoinStep},
    },
};
use serde::{Deserialize, Serialize};

use crate::{
    Error, Result,
    devices::Devices,
    fence::install::{self, FenceHook, Installed},
    lvm::{LVM, classify, split_tags},
    runner::{Command, DEFAULT_TIMEOUT, Output, Runner},
    sanlock::{self, FencingSeen, Renewals},
    scope::{LOCK_TIMEOUT, LockScope},
    validate,
};

/// Plans executed at most per converge (devices file, volume group, lockspace, and spare rounds for a
/// host that changes meanwhile).
pub const MAX_ROUNDS: usize = 6;

/// Where lvmlockd listens; lvm commands and lvmlockctl reach it through this path.
pub const LVMLOCKD_SOCKET: &str = "/run/lvm/lvmlockd.socket";

/// LVM and lock commands for shared classes.
#[derive(Debug, Clone)]
pub struct SharedLvm<R> {
    runner: R,
    /// lvmlockd's socket ([`LVMLOCKD_SOCKET`]; a test's own elsewhere).
    lvmlockd_socket: std::path::PathBuf,
    /// Where to put a stand-in for lvmlockd's pid file while its socket answers, when this
    /// process's `/run` is not the host's (the node pod): see [`SharedLvm::with_pid_file_stand_in`].
    pid_file_stand_in: Option<std::path::PathBuf>,
}

#[derive(Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Deserialize)]
struct VgSection {
    #[serde(default)]
    vg: Vec<VgRow>,
}

#[derive(Deserialize)]
struct VgRow {
    vg_name: String,
    #[serde(default)]
    vg_lock_type: String,
    #[serde(default)]
    vg_tags: String,
}

#[derive(Deserialize)]
struct PvSection {
    #[serde(default)]
    pv: Vec<PvRow>,
}

#[derive(Deserialize)]
struct PvRow {
    pv_name: String,
    #[serde(default)]
    vg_name: String,
}

#[derive(Deserialize)]
struct LvSection {
    #[serde(default)]
    lv: Vec<LvRow>,
}

#[derive(Deserialize)]
struct LvRow {
    lv_name: String,
    #[serde(default)]
    segtype: String,
    #[serde(default)]
    pool_lv: String,
}

/// Parses `sanlock client status`: the volume groups whose lvmlockd lockspace (`s lvm_<vg>:<host
/// id>:<path>:<offset>`) this host has joined; a lockspace still being added or removed (a flag
/// word after it, `ADD` or `REM`) is not.
pub fn parse_started_lockspaces(text: &str) -> BTreeSet<String> {
    lvm_lockspaces(text)
        .filter(|(_, flag)| flag.is_none())
        .map(|(vg, _)| vg)
        .collect()
}

/// The volume groups whose lvmlockd lockspace sanlock lists in any state (joined, being added or
/// removed, or given up after lost renewals): what `vgchange --lock-stop` has to stop.
pub fn parse_listed_lockspaces(text: &str) -> BTreeSet<String> {
    lvm_lockspaces(text).map(|(vg, _)| vg).collect()
}

/// Each `s lvm_<vg>:…` line of `sanlock client status`: the group and the flag word after it.
fn lvm_lockspaces(text: &str) -> impl Iterator<Item = (String, Option<&str>)> {
    text.lines().filter_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some("s")).then_some(())?;
        let space = words.next()?;
        let vg = space.split(':').next()?.strip_prefix("lvm_")?;
        Some((vg.to_owned(), words.next()))
    })
}

/// lvm's own greeting to lvmlockd (libdaemon's `hello`, as every lvm command opens the
/// connection): a request, then libdaemon's end-of-message marker.
const LVMLOCKD_HELLO: &[u8] = b"request = \"hello\"\n\n##\n";

/// Whether lvmlockd answers on `socket`: it replies `OK` to lvm's `hello` (a connection closed
/// without a request would make lvmlockd log `client recv bad message`).
fn lvmlockd_answers(socket: &Path) -> Daemon {
    use std::io::{Read as _, Write as _};
    let mut stream = match std::os::unix::net::UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Daemon::Stopped(format!("no socket at {}", socket.display()));
        }
        Err(e) => {
            return Daemon::Stopped(format!("its socket {} refused: {e}", socket.display()));
        }
    };
    let timeout = Some(std::time::Duration::from_secs(5));
    let _ = stream.set_read_timeout(timeout);
    let _ = stream.set_write_timeout(timeout);
    let mut reply = Vec::new();
    let answered = stream.write_all(LVMLOCKD_HELLO).and_then(|()| {
        let mut buf = [0u8; 1024];
        while !reply.ends_with(b"\n##\n") && reply.len() < 64 * 1024 {
            match stream.read(&mut buf)? {
                0 => break,
                n => reply.extend_from_slice(&buf[..n]),
            }
        }
        Ok(())
    });
    let text = String::from_utf8_lossy(&reply);
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    match answered {
        Ok(()) if compact.contains("response=\"OK\"") => Daemon::Running,
        Ok(()) => Daemon::Stopped(format!(
            "its socket {} did not answer lvm's hello: {:?}",
            socket.display(),
            text.trim()
        )),
        Err(e) => Daemon::Stopped(format!(
            "its socket {} did not answer lvm's hello: {e}",
            socket.display()
        )),
    }
}

/// Parses `lvmdevices --devicesfile F` (lines `Device /dev/vda IDTYPE=… IDNAME=… DEVNAME=/dev/vda
/// PVID=…`): the device names listed.
pub fn parse_devices_file_listing(text: &str) -> BTreeSet<String> {
    text.split_whitespace()
        .filter_map(|w| w.strip_prefix("DEVNAME="))
        .filter(|d| d.starts_with('/'))
        .map(str::to_owned)
        .collect()
}

/// Refuses a devices file name that is not a shared class's ([`shared::devices_file`]).
fn check_devices_file(file: &str) -> Result<()> {
    if !file.starts_with("lvms-") || file.contains('/') {
        return Err(Error::InvalidArgument(format!(
            "devices file {file:?} is not a shared class's"
        )));
    }
    Ok(())
}

fn parse_json<T: for<'de> Deserialize<'de>>(cmd: &Command, text: &str) -> Result<Vec<T>> {
    serde_json::from_str::<Report<T>>(text)
        .map(|r| r.report)
        .map_err(|e| Error::Parse {
            argv: cmd.argv(),
            detail: e.to_string(),
        })
}

impl<R: Runner> SharedLvm<R> {
    pub fn new(runner: R) -> Self {
        Self {
            runner,
            lvmlockd_socket: LVMLOCKD_SOCKET.into(),
            pid_file_stand_in: None,
        }
    }

    /// lvm talks to lvmlockd only when lvmlockd's pid file (`/run/lvmlockd.pid`, compiled in)
    /// exists: without it every shared command fails with "lvmlockd process is not running". A
    /// pod sees the host's lvmlockd socket (`/run/lvm`, mounted) but not the host's `/run`, so the
    /// node agent writes a stand-in at `path` in its own `/run` while the socket answers. Never
    /// for a process that runs on the host (there the real file is lvmlockd's).
    #[must_use]
    pub fn with_pid_file_stand_in(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.pid_file_stand_in = Some(path.into());
        self
    }

    /// Looks for lvmlockd at `socket` instead of [`LVMLOCKD_SOCKET`].
    #[must_use]
    pub fn with_lvmlockd_socket(mut self, socket: impl Into<std::path::PathBuf>) -> Self {
        self.lvmlockd_socket = socket.into();
        self
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    async fn run(&self, program: &str, args: Vec<String>, timeout: Duration) -> Result<Output> {
        let cmd = Command::new(program, args).timeout(timeout);
        self.runner.run(&cmd).await
    }

    async fn lvm(
        &self,
        class: &str,
        host_id: Option<u16>,
        subcommand: &str,
        rest: &[&str],
        timeout: Duration,
    ) -> Result<Output> {
        validate::lvm_name(class)?;
        let mut args = vec![subcommand.to_owned()];
        args.extend(LockScope::shared(class, host_id).args());
        args.extend(rest.iter().map(|s| (*s).to_owned()));
        let cmd = Command::new(LVM, args).timeout(timeout);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(classify(&cmd, out))
        }
    }

    /// Whether `sanlock` and `lvmlockd` run on the host (asked through their own clients).
    pub async fn daemons(&self) -> Daemons {
        let lvmlockd = lvmlockd_answers(&self.lvmlockd_socket);
        if let (Daemon::Running, Some(path)) = (&lvmlockd, &self.pid_file_stand_in)
            && !path.exists()
        {
            let text = "a stand-in written by the lvms node agent: lvmlockd runs on the host \
                        and answers on /run/lvm/lvmlockd.socket\n";
            if let Err(e) = std::fs::write(path, text) {
                tracing::warn!(path = %path.display(), error = %e, "writing the lvmlockd pid file stand-in failed");
            }
        }
        Daemons {
            sanlock: self.daemon("sanlock", &["client", "status"]).await,
            lvmlockd,
        }
    }

    async fn daemon(&self, program: &str, args: &[&str]) -> Daemon {
        let args = args.iter().map(|s| (*s).to_owned()).collect();
        match self.run(program, args, DEFAULT_TIMEOUT).await {
            Ok(out) if out.success() => Daemon::Running,
            Ok(out) => Daemon::Stopped(format!(
                "`{program}` exited with {}: {}",
                out.code
                    .map_or_else(|| "a signal".into(), |c| c.to_string()),
                out.stderr.trim()
            )),
            Err(Error::Spawn { .. }) => Daemon::Missing,
            Err(e) => Daemon::Stopped(e.to_string()),
        }
    }

    /// The volume groups whose lockspace this host has started: lvmlockd's lockspaces
    /// (`lvm_<vg>`) that sanlock lists as joined. Not `lvmlockctl --info`: lvmlockd sends that
    /// answer to an abstract Unix socket, which exists only in the asker's network namespace, so
    /// from a pod without the host's network it never arrives.
    pub async fn started_lockspaces(&self) -> Result<BTreeSet<String>> {
        Ok(parse_started_lockspaces(&self.sanlock_status().await?))
    }

    /// `sanlock client status`'s output.
    async fn sanlock_status(&self) -> Result<String> {
        let out = self
            .run(
                "sanlock",
                vec!["client".into(), "status".into()],
                DEFAULT_TIMEOUT,
            )
            .await?;
        if !out.success() {
            return Err(out.into_error(&Command::new("sanlock", ["client", "status"])));
        }
        Ok(out.stdout)
    }

    /// The device names class `class`'s devices file lists (none when it does not exist yet).
    pub async fn devices_file(&self, class: &str) -> Result<BTreeSet<String>> {
        validate::lvm_name(class)?;
        self.listing(&shared::devices_file(class)).await
    }

    /// The device names devices file `file` lists (none when it does not exist).
    async fn listing(&self, file: &str) -> Result<BTreeSet<String>> {
        let args = vec![
            "lvmdevices".to_owned(),
            "--devicesfile".to_owned(),
            file.to_owned(),
        ];
        let cmd = Command::new(LVM, args).timeout(DEFAULT_TIMEOUT);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            return Ok(parse_devices_file_listing(&out.stdout));
        }
        // lvm2 2.03.16: "Devices file does not exist." (exit 5) before the first device is added.
        if out.stderr.contains("Devices file does not exist") {
            return Ok(BTreeSet::new());
        }
        Err(classify(&cmd, out))
    }

    /// Adds `path` to the devices file `file` ([`shared::devices_file`]), creating the file.
    pub async fn add_device(&self, file: &str, path: &str) -> Result<()> {
        validate::device_path(path)?;
        check_devices_file(file)?;
        let args = vec![
            "lvmdevices".to_owned(),
            "--devicesfile".to_owned(),
            file.to_owned(),
            "--adddev".to_owned(),
            path.to_owned(),
        ];
        let cmd = Command::new(LVM, args).timeout(DEFAULT_TIMEOUT);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(())
        } else {
            Err(classify(&cmd, out))
        }
    }

    /// The class's volume group as seen through its devices file, with lvmlockd.
    pub async fn vg(&self, class: &str) -> Result<Option<SharedVg>> {
        let vgs = match self
            .lvm(
                class,
                None,
                "vgs",
                &[
                    "--reportformat",
                    "json",
                    "-o",
                    "vg_name,vg_lock_type,vg_tags",
                    class,
                ],
                DEFAULT_TIMEOUT,
            )
            .await
        {
            Ok(out) => out,
            Err(Error::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let cmd = Command::new(LVM, ["vgs"]);
        let Some(row) = parse_json::<VgSection>(&cmd, &vgs.stdout)?
            .into_iter()
            .flat_map(|s| s.vg)
            .find(|r| r.vg_name == class)
        else {
            return Ok(None);
        };
        let pvs = self
            .pvs(class)
            .await?
            .into_iter()
            .filter(|(_, vg)| vg == class)
            .map(|(pv, _)| pv)
            .collect();
        Ok(Some(SharedVg {
            name: row.vg_name,
            lock_type: row.vg_lock_type,
            tags: split_tags(&row.vg_tags),
            pvs,
        }))
    }

    /// Physical volumes the class's devices file lets LVM see: (device, volume group or "").
    pub async fn pvs(&self, class: &str) -> Result<Vec<(String, String)>> {
        let out = self
            .lvm(
                class,
                None,
                "pvs",
                &["--reportformat", "json", "-o", "pv_name,vg_name"],
                DEFAULT_TIMEOUT,
            )
            .await?;
        let cmd = Command::new(LVM, ["pvs"]);
        Ok(parse_json::<PvSection>(&cmd, &out.stdout)?
            .into_iter()
            .flat_map(|s| s.pv)
            .map(|r| (r.pv_name, r.vg_name))
            .collect())
    }

    /// The physical volumes the class's devices file lets LVM see that belong to no volume group.
    pub async fn orphan_pvs(&self, class: &str) -> Result<BTreeSet<String>> {
        Ok(self
            .pvs(class)
            .await?
            .into_iter()
            .filter(|(_, vg)| vg.is_empty())
            .map(|(pv, _)| pv)
            .collect())
    }

    /// `vgcreate --shared`: makes the volume group and its `lvmlock` LV, and starts this host's
    /// lockspace.
    pub async fn create_volume_group(
        &self,
        name: &str,
        pvs: &[String],
        tags: &[String],
        host_id: u16,
    ) -> Result<()> {
        pvs.iter().try_for_each(|p| validate::device_path(p))?;
        tags.iter().try_for_each(|t| validate::lvm_tag(t))?;
        let mut rest: Vec<&str> = vec!["--shared"];
        for t in tags {
            rest.extend(["--addtag", t]);
        }
        rest.push(name);
        rest.extend(pvs.iter().map(String::as_str));
        self.lvm(name, Some(host_id), "vgcreate", &rest, LOCK_TIMEOUT)
            .await
            .map(drop)
    }

    /// `vgchange --lock-start`: joins the volume group's lockspace with `host_id`.
    pub async fn lock_start(&self, vg: &str, host_id: u16) -> Result<()> {
        self.lvm(
            vg,
            Some(host_id),
            "vgchange",
            &["--lock-start", vg],
            LOCK_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// `vgchange --lock-stop`: leaves the lockspace (LVM refuses while an LV is active); nothing
    /// when sanlock does not list it at all.
    pub async fn lock_stop(&self, vg: &str) -> Result<()> {
        if !parse_listed_lockspaces(&self.sanlock_status().await?).contains(vg) {
            return Ok(());
        }
        self.lvm(vg, None, "vgchange", &["--lock-stop", vg], LOCK_TIMEOUT)
            .await
            .map(drop)
    }
}

impl<R: Runner> SharedLvm<R> {
    /// The group's logical volumes through the class's devices file (hidden ones and `lvmlock`
    /// left out).
    pub async fn lvs(&self, class: &str) -> Result<Vec<SharedLv>> {
        let out = self
            .lvm(
                class,
                None,
                "lvs",
                &[
                    "--reportformat",
                    "json",
                    "-o",
                    "lv_name,segtype,pool_lv",
                    class,
                ],
                DEFAULT_TIMEOUT,
            )
            .await?;
        let cmd = Command::new(LVM, ["lvs"]);
        Ok(parse_json::<LvSection>(&cmd, &out.stdout)?
            .into_iter()
            .flat_map(|s| s.lv)
            .filter(|r| !r.lv_name.starts_with('[') && r.lv_name != "lvmlock")
            .map(|r| SharedLv {
                name: r.lv_name,
                segtype: r.segtype,
                pool_lv: Some(r.pool_lv).filter(|p| !p.is_empty()),
            })
            .collect())
    }

    /// `lvremove` of an empty, inactive thin pool, without `--yes`: LVM's questions (remove the
    /// pool's thin volumes? remove an active LV?) are answered "no" ([`Error::InUse`]).
    pub async fn remove_pool(&self, vg: &str, pool: &str) -> Result<()> {
        validate::lvm_name(pool)?;
        let target = format!("{vg}/{pool}");
        self.lvm(vg, None, "lvremove", &[&target], LOCK_TIMEOUT)
            .await
            .map(drop)
    }

    /// `vgremove` without `--yes` (a group that holds a logical volume is not removed: LVM's
    /// question is answered "no"): removes the group and stops this host's lockspace. LVM refuses
    /// ([`Error::InUse`]) while another host has the lockspace started.
    pub async fn remove_volume_group(&self, vg: &str) -> Result<()> {
        self.lvm(vg, None, "vgremove", &[vg], LOCK_TIMEOUT)
            .await
            .map(drop)
    }

    /// `pvremove` of the class's LUNs' labels once no group holds them. Without lvmlockd: the last
    /// shared group held lvmlockd's global lock, and with it gone a lockd `pvremove` cannot get it.
    pub async fn remove_pvs(&self, file: &str, pvs: &[String]) -> Result<()> {
        check_devices_file(file)?;
        pvs.iter().try_for_each(|p| validate::device_path(p))?;
        let mut args = vec![
            "pvremove".to_owned(),
            "--config".to_owned(),
            "global/use_lvmlockd=0".to_owned(),
            "--devicesfile".to_owned(),
            file.to_owned(),
            "--yes".to_owned(),
        ];
        args.extend(pvs.iter().cloned());
        let cmd = Command::new(LVM, args).timeout(DEFAULT_TIMEOUT);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(())
        } else {
            Err(classify(&cmd, out))
        }
    }

    /// Takes every device out of devices file `file` (`lvmdevices --deldev`); the empty file
    /// stays, and reads as no file.
    pub async fn clear_devices_file(&self, file: &str) -> Result<()> {
        check_devices_file(file)?;
        for dev in self.listing(file).await? {
            let args = vec![
                "lvmdevices".to_owned(),
                "--devicesfile".to_owned(),
                file.to_owned(),
                "--deldev".to_owned(),
                dev,
            ];
            let cmd = Command::new(LVM, args).timeout(DEFAULT_TIMEOUT);
            let out = self.runner.run(&cmd).await?;
            if !out.success() {
                return Err(classify(&cmd, out));
            }
        }
        Ok(())
    }
}

/// What [`converge`] ended with, for one shared class on this node.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedReport {
    pub device_class: String,
    pub host_id: Option<u16>,
    /// Actions executed, in order (lock-start retries included).
    pub executed: Vec<Action>,
    /// The last plan's state and device visibility.
    pub plan: Plan,
    /// Failed lock-start attempts, with LVM's answer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lock_start_failures: Vec<String>,
    /// Fencing on this node, once joined (ADR 0024).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fencing: Option<FencingReport>,
    /// The steps that brought this node back after the fence hook, when this converge took them
    /// ([`rejoin`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rejoined: Vec<RejoinStep>,
}

/// Fencing of a joined class on this node: the verdict and what sanlock says of the lockspace.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FencingReport {
    pub verdict: Fencing,
    /// This node's renewals of its lease in the class's lockspace.
    pub renewals: Option<Renewals>,
    /// Host ids whose leases sanlock on this node sees renewed (this node's included).
    pub live_host_ids: Vec<u16>,
    /// Host ids sanlock on this node counts dead: silent for their host-dead time, without having
    /// left the lockspace (their leases are free).
    pub dead_host_ids: Vec<u16>,
    /// Host ids that stopped renewing and are not dead yet (sanlock still counts their leases
    /// held): the node looks again sooner, to report their death when it comes.
    pub silent_host_ids: Vec<u16>,
    /// The fence hook fenced this node (see [`fencing::fenced_message`]).
    pub fenced: bool,
}

impl SharedReport {
    /// The lockspace's io timeout sanlock keeps on this node, once joined and listed by sanlock.
    pub fn kept_io_timeout(&self) -> Option<u32> {
        self.fencing
            .as_ref()
            .and_then(|f| f.renewals.as_ref())
            .map(|r| r.io_timeout)
            .filter(|t| *t > 0)
    }

    pub fn is_joined(&self) -> bool {
        self.plan.state == State::Joined
    }

    /// Joined, and fencing armed (or opted out of): the class may be served here.
    pub fn is_ready(&self) -> bool {
        self.is_joined() && self.fencing.as_ref().is_none_or(|f| f.verdict.ready)
    }
}

/// What the shared-class engine needs from the machine.
pub trait SharedHost: Send + Sync {
    fn observe(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> impl Future<Output = Result<Observed>> + Send;
    fn execute(&self, action: &Action) -> impl Future<Output = Result<()>> + Send;
    /// Waits before a retry (a real sleep; tests skip it).
    fn pause(&self, d: Duration) -> impl Future<Output = ()> + Send;
    /// What the machine says of fencing and of the lockspace of volume group `vg`; `None` when it
    /// cannot be looked at (test hosts), which leaves the class's readiness to the join alone.
    fn observe_fencing(&self, vg: &str) -> impl Future<Output = Option<FencingSeen>> + Send {
        let _ = vg;
        async { None }
    }
    /// Puts the fence hook on the host, when this host installs it (ADR 0028): the node agent
    /// does, before it judges a class's fencing under `watchdog: Required`. `None` when it does
    /// not (test hosts, `lvms standalone`, the admin's opt-out). No default: a host that wraps
    /// another must pass it on (a default once silently dropped the node agent's).
    fn install_fence_hook(&self) -> impl Future<Output = Option<Installed>> + Send;
    /// Whether the fence hook fenced this node for `vg` (its record exists); false on test hosts.
    fn is_fenced(&self, vg: &str) -> impl Future<Output = bool> + Send {
        let _ = vg;
        async { false }
    }
    /// What a fenced node sees of `class` ([`rejoin::plan_rejoin`]); `None` when it cannot be
    /// looked at (test hosts): the node then stays out until someone cleans up by hand.
    fn observe_fenced(
        &self,
        class: &DeviceClassConfig,
    ) -> impl Future<Output = Option<FencedSeen>> + Send {
        let _ = class;
        async { None }
    }
    /// Executes one step back after fencing.
    fn execute_rejoin(&self, step: &RejoinStep) -> impl Future<Output = Result<()>> + Send {
        let step = step.clone();
        async move {
            Err(Error::InvalidArgument(format!(
                "this host cannot take {step:?}"
            )))
        }
    }
}

/// [`SharedHost`] on the real machine.
#[derive(Debug, Clone)]
pub struct RealSharedHost<R> {
    lvm: SharedLvm<R>,
    devices: Devices<R>,
    /// The fence hook this host installs, if it does; and whether its binary was copied by
    /// this process already (the binary is compared once, the configuration at every check).
    fence_hook: Option<(FenceHook, Arc<AtomicBool>)>,
}

impl<R: Runner + Clone> RealSharedHost<R> {
    pub fn new(runner: R) -> Self {
        Self {
            lvm: SharedLvm::new(runner.clone()),
            devices: Devices::new(runner),
            fence_hook: None,
        }
    }

    /// Looks for lvmlockd at `socket` (tests).
    #[must_use]
    pub fn with_lvmlockd_socket(mut self, socket: impl Into<std::path::PathBuf>) -> Self {
        self.lvm = self.lvm.with_lvmlockd_socket(socket);
        self
    }

    /// See [`SharedLvm::with_pid_file_stand_in`] (the node agent, in its pod).
    #[must_use]
    pub fn with_pid_file_stand_in(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.lvm = self.lvm.with_pid_file_stand_in(path);
        self
    }

    /// Installs `hook` on the host before judging fencing (the node agent's default).
    pub fn with_fence_hook(mut self, hook: FenceHook) -> Self {
        self.fence_hook = Some((hook, Arc::new(AtomicBool::new(false))));
        self
    }
}

impl<R: Runner> RealSharedHost<R> {
    pub fn lvm(&self) -> &SharedLvm<R> {
        &self.lvm
    }

    /// `paths` with every symlink resolved (a path that does not resolve stays as it is).
    async fn canonical(&self, paths: impl IntoIterator<Item = String>) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for p in paths {
            out.insert(self.devices.resolve_path(&p).await.unwrap_or(p));
        }
        out
    }
}

impl<R: Runner> SharedHost for RealSharedHost<R> {
    async fn observe(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> Result<Observed> {
        let mut resolved = BTreeMap::new();
        for path in &class.device_selector.paths {
            resolved.insert(path.clone(), self.devices.resolve_path(path).await);
        }
        let daemons = self.lvm.daemons().await;
        let base = Observed {
            daemons: daemons.clone(),
            host_id: node.map(|n| n.host_id),
            may_create: node.is_some_and(|n| n.create_volume_groups),
            resolved: resolved.clone(),
            devices_file: BTreeSet::new(),
            vg: None,
            orphan_pvs: BTreeSet::new(),
            signatures: BTreeMap::new(),
            lockspace_started: false,
        };
        // Without both daemons nothing below can be read (and the plan stops there).
        if daemons.sanlock != Daemon::Running || daemons.lvmlockd != Daemon::Running {
            return Ok(base);
        }
        // LVM names a device-mapper device (a multipath map) /dev/mapper/<name>; the plan compares
        // canonical paths.
        let devices_file = self
            .canonical(self.lvm.devices_file(&class.name).await?)
            .await;
        let vg = if devices_file.is_empty() {
            None
        } else {
            match self.lvm.vg(&class.name).await? {
                Some(vg) => Some(SharedVg {
                    pvs: self.canonical(vg.pvs.clone()).await.into_iter().collect(),
                    ..vg
                }),
                None => None,
            }
        };
        let mut orphan_pvs = BTreeSet::new();
        let mut signatures = BTreeMap::new();
        if vg.is_none() {
            if !devices_file.is_empty() {
                orphan_pvs = self
                    .canonical(self.lvm.orphan_pvs(&class.name).await?)
                    .await;
            }
            for canonical in resolved.values().flatten() {
                if let Some(sig) = self.devices.probe_signature(canonical).await? {
                    signatures.insert(canonical.clone(), sig);
                }
            }
        }
        let lockspace_started = self.lvm.started_lockspaces().await?.contains(&class.name);
        Ok(Observed {
            devices_file,
            vg,
            orphan_pvs,
            signatures,
            lockspace_started,
            ..base
        })
    }

    async fn execute(&self, action: &Action) -> Result<()> {
        match action {
            Action::AddToDevicesFile { file, path } => self.lvm.add_device(file, path).await,
            Action::CreateVolumeGroup {
                name,
                pvs,
                tags,
                host_id,
            } => {
                self.lvm
                    .create_volume_group(name, pvs, tags, *host_id)
                    .await
            }
            Action::StartLockspace { vg, host_id } => self.lvm.lock_start(vg, *host_id).await,
        }
    }

    async fn pause(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn observe_fencing(&self, vg: &str) -> Option<FencingSeen> {
        Some(sanlock::observe_lockspace(self.lvm.runner(), Path::new("/"), vg).await)
    }

    async fn install_fence_hook(&self) -> Option<Installed> {
        let (hook, copied) = self.fence_hook.as_ref()?;
        if !copied.load(Ordering::Relaxed) {
            match install::install_binary(hook) {
                Ok(_) => copied.store(true, Ordering::Relaxed),
                Err(why) => return Some(Installed::Failed(why)),
            }
        }
        Some(install::configure(self.lvm.runner(), hook).await)
    }

    async fn is_fenced(&self, vg: &str) -> bool {
        crate::fence::record_path(Path::new(crate::fence::RECORD_DIR), vg).exists()
    }

    async fn observe_fenced(&self, class: &DeviceClassConfig) -> Option<FencedSeen> {
        let holders = crate::fence::devices_of(Path::new("/sys"), &class.name).ok()?;
        let open = self
            .lvm
            .runner()
            .run(&Command::new(
                crate::fence::DMSETUP,
                [
                    "info",
                    "-c",
                    "--noheadings",
                    "-o",
                    "name,open",
                    "--separator",
                    ",",
                ],
            ))
            .await
            .ok()
            .filter(Output::success)
            .map(|out| crate::fence::parse_open_counts(&out.stdout))
            .unwrap_or_default();
        let devices = holders
            .into_iter()
            .map(|(name, holders)| {
                // A device dmsetup does not list is gone: nothing opens it.
                let open = open.get(&name).copied().unwrap_or(0);
                (name, DmUse { holders, open })
            })
            .collect();
        let mut unreadable = Vec::new();
        for path in &class.device_selector.paths {
            let read = Command::new(
                "dd",
                [
                    format!("if={path}"),
                    "of=/dev/null".to_owned(),
                    "bs=4096".to_owned(),
                    "count=1".to_owned(),
                    "iflag=direct".to_owned(),
                    "status=none".to_owned(),
                ],
            );
            match self.lvm.runner().run(&read).await {
                Ok(out) if out.success() => {}
                Ok(out) => unreadable.push(format!("{path}: {}", out.stderr.trim())),
                Err(e) => unreadable.push(format!("{path}: {e}")),
            }
        }
        Some(FencedSeen {
            devices,
            unreadable,
        })
    }

    async fn execute_rejoin(&self, step: &RejoinStep) -> Result<()> {
        match step {
            RejoinStep::RemoveDevice { name } => {
                let cmd = Command::new(crate::fence::DMSETUP, ["remove", name.as_str()]);
                let out = self.lvm.runner().run(&cmd).await?;
                // Gone already is what was wanted.
                if out.success() || out.stderr.contains("No such device") {
                    Ok(())
                } else {
                    Err(out.into_error(&cmd))
                }
            }
            RejoinStep::StopLockspace { vg } => self.lvm.lock_stop(vg).await,
            RejoinStep::ClearRecord { vg } => {
                let record = crate::fence::record_path(Path::new(crate::fence::RECORD_DIR), vg);
                match std::fs::remove_file(&record) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
                        path: record.display().to_string(),
                        source: e,
                    }),
                    _ => Ok(()),
                }
            }
        }
    }
}

/// Converges shared class `class` on this node: plan, execute, observe again, until the lockspace is
/// joined or the plan stops (waiting or failed). A failed lock-start is retried after
/// [`shared::lock_start_delay`]; when those are used up the report says why, and the next converge
/// starts again.
#[tracing::instrument(skip_all, fields(device_class = %class.name))]
pub async fn converge<H: SharedHost>(
    host: &H,
    class: &DeviceClassConfig,
    node: Option<&SharedNodeConfig>,
) -> Result<SharedReport> {
    let mut executed = Vec::new();
    let mut lock_start_failures = Vec::new();
    let mut rejoined = Vec::new();
    // A fenced node touches nothing of the class (its lockspace was given up under it) and LVM is
    // not even asked, until nothing of the class is open here and the LUN can be read: then it
    // clears what the hook left and joins as any node does.
    if host.is_fenced(&class.name).await {
        let why = match host.observe_fenced(class).await {
            None => Err(fencing::fenced_message(&class.name)),
            Some(seen) => rejoin::plan_rejoin(&class.name, &seen),
        };
        match why {
            Ok(steps) => {
                for step in steps {
                    tracing::info!(?step, "coming back after fencing");
                    host.execute_rejoin(&step).await?;
                    rejoined.push(step);
                }
                tracing::info!("the fence record is cleared: joining again");
            }
            Err(reason) => {
                let fencing = fencing_report(host, class).await;
                return Ok(SharedReport {
                    device_class: class.name.clone(),
                    host_id: node.map(|n| n.host_id),
                    executed,
                    plan: Plan {
                        actions: Vec::new(),
                        state: State::Failed { reason },
                        devices_visible: true,
                    },
                    lock_start_failures,
                    fencing,
                    rejoined,
                });
            }
        }
    }
    for _ in 0..MAX_ROUNDS {
        let observed = host.observe(class, node).await?;
        let plan = shared::plan(class, &observed);
        if plan.actions.is_empty() {
            let fencing = if plan.state == State::Joined {
                fencing_report(host, class).await
            } else {
                None
            };
            return Ok(SharedReport {
                device_class: class.name.clone(),
                host_id: observed.host_id,
                executed,
                plan,
                lock_start_failures,
                fencing,
                rejoined,
            });
        }
        for action in &plan.actions {
            tracing::info!(?action, "executing");
            let mut attempt = 0;
            loop {
                match host.execute(action).await {
                    Ok(()) => break,
                    Err(e) if matches!(action, Action::StartLockspace { .. }) => {
                        attempt += 1;
                        lock_start_failures.push(e.to_string());
                        let Some(delay) = shared::lock_start_delay(attempt) else {
                            return Ok(SharedReport {
                                device_class: class.name.clone(),
                                host_id: observed.host_id,
                                executed,
                                plan: Plan {
                                    actions: Vec::new(),
                                    state: State::Waiting {
                                        reason: format!(
                                            "lock-start of {} failed {attempt} times, retrying at the \
                                             next converge (after an unclean shutdown sanlock can \
                                             take minutes): {e}",
                                            class.name
                                        ),
                                    },
                                    devices_visible: true,
                                },
                                lock_start_failures,
                                fencing: None,
                                rejoined,
                            });
                        };
                        tracing::warn!(attempt, ?delay, error = %e, "lock-start failed, retrying");
                        host.pause(delay).await;
                    }
                    Err(e) => return Err(e),
                }
            }
            executed.push(action.clone());
        }
    }
    Err(Error::NotConverged {
        device_class: class.name.clone(),
        rounds: MAX_ROUNDS,
    })
}

/// Judges fencing of joined class `class` on this node (see [`FencingReport`]).
async fn fencing_report<H: SharedHost>(
    host: &H,
    class: &DeviceClassConfig,
) -> Option<FencingReport> {
    // Only shared classes get here; a node-local one would be held to the safe policy.
    let policy = class
        .shared()
        .map_or(fencing::Policy::Required, |s| s.watchdog);
    // The hook first, so the look below sees what it wrote; under `Disabled` the host is not
    // touched.
    let hook_problem = if policy == fencing::Policy::Disabled {
        None
    } else {
        host.install_fence_hook()
            .await
            .and_then(|i| i.problem().map(str::to_owned))
    };
    let seen = host.observe_fencing(&class.name).await?;
    let mut verdict = fencing::judge(policy, &seen.watchdog);
    if let Some(problem) = hook_problem {
        verdict.message = if verdict.message.is_empty() {
            problem
        } else {
            format!("{problem}; {}", verdict.message)
        };
    }
    if seen.fenced {
        verdict.ready = false;
        verdict.message = fencing::fenced_message(&class.name);
    }
    // A timing that differs from the class's is reported, not refused: the class works, but its
    // failover takes what sanlock keeps.
    let kept = seen.renewals.as_ref().map_or(0, |r| r.io_timeout);
    if let Some(warning) = class
        .shared()
        .and_then(|s| fencing::io_timeout_mismatch(&class.name, s.io_timeout_seconds, kept))
    {
        if !verdict.message.is_empty() {
            verdict.message.push_str("; ");
        }
        verdict.message.push_str(&warning);
    }
    if !verdict.message.is_empty() {
        tracing::warn!(device_class = %class.name, message = %verdict.message, "fencing");
    }
    Some(FencingReport {
        verdict,
        fenced: seen.fenced,
        renewals: seen.renewals,
        live_host_ids: seen
            .hosts
            .iter()
            .filter(|h| h.live())
            .map(|h| h.host_id)
            .collect(),
        dead_host_ids: seen
            .hosts
            .iter()
            .filter(|h| h.dead())
            .map(|h| h.host_id)
            .collect(),
        silent_host_ids: seen
            .hosts
            .iter()
            .filter(|h| h.frees_in().is_some())
            .map(|h| h.host_id)
            .collect(),
    })
}

/// What [`leave`] ended with, for one shared class on this node.
pub type LeaveReport = crate::class::LeaveReport<LeaveAction>;

/// What leaving a shared class needs from the machine.
pub trait SharedLeaveHost: Send + Sync {
    /// What [`leave::plan_leave`] looks at; `remover` is whether this node removes the group.
    fn observe_leave(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> impl Future<Output = Result<LeaveObserved>> + Send;
    fn execute_leave(&self, action: &LeaveAction) -> impl Future<Output = Result<()>> + Send;
}

impl<R: Runner> SharedLeaveHost for RealSharedHost<R> {
    /// The remover is the node configured with `createVolumeGroups` (standalone); the node agent
    /// decides by the creator Lease instead.
    async fn observe_leave(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> Result<LeaveObserved> {
        let name = &class.name;
        let daemons = self.lvm.daemons().await;
        let mut observed = LeaveObserved {
            daemons: daemons.clone(),
            host_id: node.map(|n| n.host_id),
            remover: node.is_some_and(|n| n.create_volume_groups),
            undecided: None,
            devices_file: self.lvm.devices_file(name).await?,
            vg: None,
            orphan_pvs: BTreeSet::new(),
            lockspace_started: false,
            lvs: Vec::new(),
        };
        if daemons.sanlock != Daemon::Running || daemons.lvmlockd != Daemon::Running {
            return Ok(observed);
        }
        observed.lockspace_started = self.lvm.started_lockspaces().await?.contains(name);
        if observed.devices_file.is_empty() {
            return Ok(observed);
        }
        observed.vg = self.lvm.vg(name).await?;
        if observed.vg.is_some() {
            observed.lvs = self.lvm.lvs(name).await?;
        } else {
            observed.orphan_pvs = self.lvm.orphan_pvs(name).await?;
        }
        Ok(observed)
    }

    async fn execute_leave(&self, action: &LeaveAction) -> Result<()> {
        match action {
            LeaveAction::StartLockspace { vg, host_id } => self.lvm.lock_start(vg, *host_id).await,
            LeaveAction::RemovePool { vg, pool } => self.lvm.remove_pool(vg, pool).await,
            LeaveAction::RemoveVolumeGroup { vg } => self.lvm.remove_volume_group(vg).await,
            LeaveAction::RemovePhysicalVolumes { file, pvs } => {
                self.lvm.remove_pvs(file, pvs).await
            }
            LeaveAction::StopLockspace { vg } => self.lvm.lock_stop(vg).await,
            LeaveAction::RemoveDevicesFile { file } => self.lvm.clear_devices_file(file).await,
        }
    }
}

/// Whether `vgremove`'s refusal is sanlock still seeing other hosts in the lockspace (the protocol
/// asking for time, not a failure).
fn others_in_lockspace(e: &Error) -> bool {
    let text = e.to_string();
    text.contains("not stopped on other hosts") || text.contains("unknown host state")
}

/// Leaves shared class `class` on this node ([`leave::plan_leave`]): plan, execute, observe again,
/// until the plan stops. A remover whose `vgremove` finds other hosts still in the lockspace
/// reports `Waiting`; the next call tries again.
#[tracing::instrument(skip_all, fields(device_class = %class.name))]
pub async fn leave<H: SharedLeaveHost>(
    host: &H,
    class: &DeviceClassConfig,
    node: Option<&SharedNodeConfig>,
) -> Result<LeaveReport> {
    let mut executed = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let observed = host.observe_leave(class, node).await?;
        let plan = leave::plan_leave(&class.name, &observed);
        if plan.actions.is_empty() {
            return Ok(LeaveReport {
                device_class: class.name.clone(),
                executed,
                plan,
            });
        }
        for action in &plan.actions {
            tracing::info!(?action, "executing");
            match host.execute_leave(action).await {
                Ok(()) => executed.push(action.clone()),
                Err(e)
                    if matches!(action, LeaveAction::RemoveVolumeGroup { .. })
                        && others_in_lockspace(&e) =>
                {
                    return Ok(LeaveReport {
                        device_class: class.name.clone(),
                        executed,
                        plan: LeavePlan {
                            actions: Vec::new(),
                            state: leave::others_still_joined(&class.name),
                        },
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }
    Err(Error::NotConverged {
        device_class: class.name.clone(),
        rounds: MAX_ROUNDS,
    })
}

#[cfg(test)]
mod tests;
