//! What sanlock and the host say about fencing: `sanlock client status -D` (whether sanlock uses the
//! watchdog, each lockspace's renewals), `sanlock client host_status -s <lockspace> -D` (which
//! hosts renew their leases), the watchdog device and wdmd, and `lvmlockctl_kill_command`.

use std::{collections::BTreeMap, path::Path};

use lvms_core::shared::{
    Daemon,
    fencing::{Timing, WatchdogSeen},
};
use serde::Serialize;

use crate::runner::{Command, DEFAULT_TIMEOUT, Runner};

/// The lockspace lvmlockd makes for volume group `vg`.
pub fn lockspace(vg: &str) -> String {
    format!("lvm_{vg}")
}

/// One lockspace's lease renewals, as `sanlock client status -D` shows them (times in sanlock's
/// monotonic seconds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Renewals {
    pub io_timeout: u32,
    /// sanlock gave up renewing (the kill path ran).
    pub renew_fail: bool,
    /// The last renewal attempt failed (`renewal_last_result` is not 1, sanlock's OK).
    pub last_failed: bool,
    pub last_attempt: u64,
    pub last_success: u64,
}

/// `sanlock client status -D`: `use_watchdog` of the daemon, and the renewals of each lockspace
/// by name.
pub fn parse_status(text: &str) -> (Option<bool>, BTreeMap<String, Renewals>) {
    let mut use_watchdog = None;
    let mut spaces: BTreeMap<String, Renewals> = BTreeMap::new();
    let mut section: Option<String> = None; // the lockspace being read, if any
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            section = line
                .strip_prefix("s ")
                .and_then(|s| s.split(':').next())
                .map(str::to_owned);
            if let Some(name) = &section {
                spaces.entry(name.clone()).or_default();
            }
            continue;
        }
        let Some((key, value)) = line.trim().split_once('=') else {
            continue;
        };
        if key == "use_watchdog" && section.is_none() {
            use_watchdog = Some(value == "1");
        }
        let Some(r) = section.as_ref().and_then(|s| spaces.get_mut(s)) else {
            continue;
        };
        let num = || value.parse::<u64>().unwrap_or_default();
        match key {
            "io_timeout" => r.io_timeout = u32::try_from(num()).unwrap_or_default(),
            "renew_fail" => r.renew_fail = value != "0",
            "renewal_last_result" => r.last_failed = value != "1",
            "renewal_last_attempt" => r.last_attempt = num(),
            "renewal_last_success" => r.last_success = num(),
            _ => {}
        }
    }
    (use_watchdog, spaces)
}

/// Another host's delta lease as `sanlock client host_status -D` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostLease {
    pub host_id: u16,
    /// The lease's timestamp (0: the host left cleanly).
    pub timestamp: u64,
    /// When this host last read the lease, and last saw its timestamp change (monotonic seconds).
    pub last_check: u64,
    pub last_live: u64,
    pub io_timeout: u32,
}

impl HostLease {
    /// Whether the host may still hold leases: it has not left, and its timestamp changed less
    /// than its host-dead time before the last check.
    pub fn live(&self) -> bool {
        self.timestamp != 0 && self.silent() < u64::from(self.timing().host_dead_seconds())
    }

    /// Whether sanlock counts the host dead: it has not left, and its timestamp has not changed for
    /// its host-dead time (its leases are free; with fencing armed it no longer writes).
    pub fn dead(&self) -> bool {
        self.timestamp != 0 && !self.live()
    }

    /// For a host that stopped renewing (its timestamp unchanged for more than two renewal
    /// intervals) whose leases sanlock still counts as held: how long it has been silent and the
    /// seconds until sanlock frees its leases, both as this host counts them — from when it last
    /// saw the timestamp change, so a host that joined after the death counts from its join.
    pub fn frees_in(&self) -> Option<(u64, u64)> {
        let silent = self.silent();
        let timing = self.timing();
        (self.live() && silent > 2 * u64::from(timing.renewal_seconds()))
            .then(|| (silent, u64::from(timing.host_dead_seconds()) - silent))
    }

    fn silent(&self) -> u64 {
        self.last_check.saturating_sub(self.last_live)
    }

    fn timing(&self) -> Timing {
        Timing::new(self.io_timeout.max(1))
    }
}

/// `sanlock client host_status -s <lockspace> -D`.
pub fn parse_host_status(text: &str) -> Vec<HostLease> {
    let mut hosts: Vec<HostLease> = Vec::new();
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            if let Some(id) = line.split_whitespace().next().and_then(|w| w.parse().ok()) {
                hosts.push(HostLease {
                    host_id: id,
                    ..HostLease::default()
                });
            }
            continue;
        }
        let (Some(h), Some((key, value))) = (hosts.last_mut(), line.trim().split_once('=')) else {
            continue;
        };
        let num = value.parse::<u64>().unwrap_or_default();
        match key {
            "timestamp" => h.timestamp = num,
            "last_check" => h.last_check = num,
            "last_live" => h.last_live = num,
            "io_timeout" => h.io_timeout = u32::try_from(num).unwrap_or_default(),
            _ => {}
        }
    }
    hosts
}

/// The value of `global/lvmlockctl_kill_command` in `lvm config --typeconfig full` output.
pub fn parse_kill_command(text: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix("lvmlockctl_kill_command="))
        .map(|v| v.trim_matches('"').to_owned())
        .unwrap_or_default()
}

/// `global/lvmlockctl_kill_command` as lvmlockctl reads it (`lvm config --typeconfig full`: the
/// host's lvm.conf and lvmlocal.conf merged); empty when unset, `None` when lvm could not be asked.
pub async fn kill_command<R: Runner>(runner: &R) -> Option<String> {
    stdout_of(
        runner,
        crate::lvm::LVM,
        &[
            "config",
            "--typeconfig",
            "full",
            "global/lvmlockctl_kill_command",
        ],
    )
    .await
    .map(|t| parse_kill_command(&t))
}

/// Where wdmd listens.
pub const WDMD_SOCKET: &str = "/run/wdmd/wdmd.sock";

/// What [`observe_lockspace`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingSeen {
    pub watchdog: WatchdogSeen,
    /// This host's renewals in the lockspace (`None` when sanlock does not list it).
    pub renewals: Option<Renewals>,
    /// Every host's lease in the lockspace as this host sees them.
    pub hosts: Vec<HostLease>,
    /// The fence hook left its record (`/run/lvms/fenced-<vg>`): this host was fenced.
    pub fenced: bool,
}

/// What this host's sanlock says of volume group `vg`'s lockspace timing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockspaceTiming {
    /// The io timeout it keeps the lockspace at (`None`: it does not list the lockspace).
    pub io_timeout: Option<u32>,
    /// Every host's lease in the lockspace, as seen from here.
    pub hosts: Vec<HostLease>,
}

/// Asks sanlock for `vg`'s lockspace timing (two `sanlock client` calls; nothing when sanlock
/// does not answer).
pub async fn observe_timing<R: Runner>(runner: &R, vg: &str) -> LockspaceTiming {
    let space = lockspace(vg);
    let io_timeout = stdout_of(runner, "sanlock", &["client", "status", "-D"])
        .await
        .and_then(|t| parse_status(&t).1.remove(&space))
        .map(|r| r.io_timeout)
        .filter(|t| *t > 0);
    let hosts = host_leases(runner, &space).await;
    LockspaceTiming { io_timeout, hosts }
}

/// Every host's lease in lockspace `space` as this host's sanlock sees it (none when it does not
/// answer).
async fn host_leases<R: Runner>(runner: &R, space: &str) -> Vec<HostLease> {
    stdout_of(
        runner,
        "sanlock",
        &["client", "host_status", "-s", space, "-D"],
    )
    .await
    .map(|t| parse_host_status(&t))
    .unwrap_or_default()
}

/// The output of `program args`, when it succeeds.
async fn stdout_of<R: Runner>(runner: &R, program: &str, args: &[&str]) -> Option<String> {
    let cmd = Command::new(program, args.iter().copied()).timeout(DEFAULT_TIMEOUT);
    match runner.run(&cmd).await {
        Ok(out) if out.success() => Some(out.stdout),
        _ => None,
    }
}

/// Looks at the watchdog, wdmd, sanlock and the kill hook on this machine, and at volume group
/// `vg`'s lockspace (`root` is `/`, or a test's directory for the files).
pub async fn observe_lockspace<R: Runner>(runner: &R, root: &Path, vg: &str) -> FencingSeen {
    let file = |p: &str| root.join(p.trim_start_matches('/'));
    let identity = std::fs::read_to_string(file("/sys/class/watchdog/watchdog0/identity"))
        .ok()
        .map(|s| s.trim().to_owned());
    let wdmd = if file(WDMD_SOCKET).exists() {
        Daemon::Running
    } else if file("/usr/sbin/wdmd").exists() {
        Daemon::Stopped(format!("no socket at {WDMD_SOCKET}"))
    } else {
        Daemon::Missing
    };
    let status = stdout_of(runner, "sanlock", &["client", "status", "-D"]).await;
    let (sanlock_uses_watchdog, mut spaces) =
        status.as_deref().map(parse_status).unwrap_or_default();
    let space = lockspace(vg);
    let hosts = host_leases(runner, &space).await;
    let kill_command = kill_command(runner).await.unwrap_or_default();
    FencingSeen {
        watchdog: WatchdogSeen {
            device: file("/dev/watchdog").exists(),
            identity,
            wdmd,
            sanlock_uses_watchdog,
            kill_command,
        },
        renewals: spaces.remove(&space),
        hosts,
        fenced: crate::fence::record_path(&file(crate::fence::RECORD_DIR), vg).exists(),
    }
}

#[cfg(test)]
mod tests;
