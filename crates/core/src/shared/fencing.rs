//! Fencing and failover of shared classes: what a node does when it loses its leases, and when
//! another node may take its volumes. Pure decisions; the machine side is `lvms_host::fence`.
//!
//! sanlock's arithmetic (its `timeouts.h`), with io timeout `N` seconds (`sharedConfig.ioTimeoutSeconds`):
//! a host renews its delta lease every `2N`; after `8N` without a successful renewal it gives up,
//! runs the lockspace's kill path (for lvmlockd: `lvmlockctl --kill <vg>`, which runs our hook) and
//! stops petting the watchdog for that lockspace, which resets the machine `60` s later unless
//! every lease of the lockspace was released meanwhile. Other hosts treat a lease as free once its
//! holder's delta lease has not been renewed for `8N + 60` s (host dead): by then the holder has
//! either let go (hook) or been reset (watchdog). Nothing in lvms-rs shortens that wait.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::Daemon;

/// The watchdog's fire timeout wdmd sets (sanlock's `DEFAULT_WATCHDOG_FIRE_TIMEOUT`).
pub const WATCHDOG_FIRE_SECONDS: u32 = 60;

/// sanlock's timings of one lockspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timing {
    /// The lockspace's io timeout, seconds.
    pub io_timeout: u32,
}

impl Timing {
    pub fn new(io_timeout: u32) -> Self {
        Self { io_timeout }
    }

    /// How often a host renews its delta lease.
    pub fn renewal_seconds(&self) -> u32 {
        2 * self.io_timeout
    }

    /// How long renewals may fail before the host gives up the lockspace (runs the kill hook).
    pub fn renewal_fail_seconds(&self) -> u32 {
        8 * self.io_timeout
    }

    /// How long after its last renewal another host may take a host's leases: the failover budget.
    pub fn host_dead_seconds(&self) -> u32 {
        self.renewal_fail_seconds() + WATCHDOG_FIRE_SECONDS
    }

    /// The shortest time from a host's death (power off) to another host taking its leases: its
    /// last renewal may precede the death by up to one renewal interval.
    pub fn earliest_takeover_after_death(&self) -> u32 {
        self.host_dead_seconds() - self.renewal_seconds()
    }
}

/// What the node sees of its watchdog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchdogSeen {
    /// `/dev/watchdog` exists.
    pub device: bool,
    /// The watchdog driver's identity (`/sys/class/watchdog/watchdog0/identity`).
    pub identity: Option<String>,
    /// wdmd, the daemon that pets it for sanlock.
    pub wdmd: Daemon,
    /// Whether sanlock runs with the watchdog (`use_watchdog` in `sanlock client status -D`);
    /// `None` when sanlock could not be asked.
    pub sanlock_uses_watchdog: Option<bool>,
    /// `global/lvmlockctl_kill_command` as `lvm config --typeconfig full` prints it (empty when unset).
    pub kill_command: String,
}

/// The admin's choice (`sharedConfig.watchdog`): part of the class's configuration.
pub use crate::config::WatchdogPolicy as Policy;

/// The watchdog's state on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Watchdog {
    /// A hardware watchdog, petted by wdmd for sanlock.
    Armed,
    /// `softdog`: a kernel timer, which a hung kernel may not fire; accepted with a warning.
    Softdog,
    /// No working watchdog; see the message.
    Missing,
    /// Not checked: the admin opted out.
    Disabled,
}

/// The verdict on a node's fencing for one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fencing {
    pub watchdog: Watchdog,
    /// `lvmlockctl_kill_command` runs lvms-rs's fence hook.
    pub kill_hook: bool,
    /// Whether the class may be Ready on this node.
    pub ready: bool,
    /// What is missing and how to fix it, or the warning; empty when all is well.
    pub message: String,
}

/// The identity the kernel's `softdog` reports.
const SOFTDOG_IDENTITY: &str = "Software Watchdog";

/// Whether `kill_command` (the configured value) runs `lvms fence`: its program is an `lvms`
/// binary and its first argument `fence` (lvmlockctl appends the volume group's name).
pub fn is_fence_hook(kill_command: &str) -> bool {
    let mut words = kill_command.split_whitespace();
    let program = words.next().unwrap_or_default();
    program.starts_with('/')
        && program.rsplit('/').next() == Some("lvms")
        && words.next() == Some("fence")
        && words.next().is_none()
}

/// Judges fencing on a node: with `Required`, the class is Ready only when sanlock runs with an
/// armed watchdog and the kill hook is configured. The hook lets a node that lost its leases stop
/// writing without a reset; the watchdog resets it if the hook cannot.
pub fn judge(policy: Policy, seen: &WatchdogSeen) -> Fencing {
    let kill_hook = is_fence_hook(&seen.kill_command);
    let mut missing = Vec::new();
    if !seen.device {
        missing.push(
            "there is no /dev/watchdog (load a hardware watchdog driver, or `modprobe softdog`)"
                .to_owned(),
        );
    }
    match &seen.wdmd {
        Daemon::Running => {}
        Daemon::Missing => missing.push("wdmd is not installed (package sanlock)".to_owned()),
        Daemon::Stopped(what) => missing.push(format!(
            "wdmd is not running ({what}): `systemctl enable --now wdmd`"
        )),
    }
    match seen.sanlock_uses_watchdog {
        Some(true) => {}
        Some(false) => missing.push(
            "sanlock runs without the watchdog (`-w 0` or `use_watchdog = 0` in \
             /etc/sanlock/sanlock.conf): set `use_watchdog = 1` and restart sanlock while no \
             lockspace is joined"
                .to_owned(),
        ),
        None => missing.push("sanlock could not be asked whether it uses the watchdog".to_owned()),
    }
    if !kill_hook {
        missing.push(format!(
            "lvmlockctl_kill_command is {} instead of lvms-rs's fence hook: set \
             `global {{ lvmlockctl_kill_command = \"<path to lvms> fence\" }}` in lvm.conf",
            if seen.kill_command.is_empty() {
                "unset".to_owned()
            } else {
                format!("\"{}\"", seen.kill_command)
            }
        ));
    }
    let softdog = seen.identity.as_deref() == Some(SOFTDOG_IDENTITY);
    let watchdog = match policy {
        Policy::Disabled => Watchdog::Disabled,
        _ if !(seen.device
            && seen.wdmd == Daemon::Running
            && seen.sanlock_uses_watchdog == Some(true)) =>
        {
            Watchdog::Missing
        }
        _ if softdog => Watchdog::Softdog,
        _ => Watchdog::Armed,
    };
    let (ready, message) = match watchdog {
        Watchdog::Disabled => (
            true,
            "fencing disabled by sharedConfig.watchdog: a node that loses the LUN may go on \
             writing after another node took its volumes"
                .to_owned(),
        ),
        _ if !missing.is_empty() => (
            false,
            format!(
                "fencing is not armed: {} (or set sharedConfig.watchdog: Disabled to run without it)",
                missing.join("; ")
            ),
        ),
        Watchdog::Softdog => (
            true,
            "the watchdog is softdog, a kernel timer that a hung kernel may not fire: prefer a \
             hardware watchdog"
                .to_owned(),
        ),
        _ => (true, String::new()),
    };
    Fencing {
        watchdog,
        kill_hook,
        ready,
        message,
    }
}

/// The warning when sanlock on this node keeps the lockspace of shared class `vg` at io timeout
/// `kept` seconds while its `sharedConfig.ioTimeoutSeconds` says `configured`: the timing lvms-rs
/// shows (the failover budget, the stage messages) follows the kept one, since that is what sanlock
/// counts. `None` when they agree, or when sanlock does not say (`kept` 0). lvmlockd's
/// `--sanlock-timeout` (`-o`) applies to lockspaces started after it is set, and the class's value
/// cannot change, so the fix is on the host.
pub fn io_timeout_mismatch(vg: &str, configured: u16, kept: u32) -> Option<String> {
    (kept != 0 && kept != u32::from(configured)).then(|| {
        format!(
            "sanlock keeps the lockspace of {vg} at io timeout {kept} s on this node, not the class's \
             sharedConfig.ioTimeoutSeconds {configured} s: a dead node's volumes are freed after {} \
             s, not {} s; start lvmlockd with --sanlock-timeout {configured} on every node of the \
             class, then stop and start the lockspace",
            Timing::new(kept).host_dead_seconds(),
            Timing::new(u32::from(configured)).host_dead_seconds()
        )
    })
}

/// Why a class is not served on a node its fence hook fenced (`/run/lvms/fenced-<vg>` exists), and
/// what brings it back. Whatever the policy: the node's volumes of the class fail every I/O, and
/// its lockspace was given up; it must not activate anything of the class until it joins again.
pub fn fenced_message(vg: &str) -> String {
    format!(
        "this node lost its sanlock leases of {vg} and was fenced (its volumes of the class fail \
         every I/O): unmount them, `dmsetup remove` the {vg}-* devices, run `vgchange --lock-stop \
         {vg}` and delete /run/lvms/fenced-{vg}; the node then joins the lockspace again (the node \
         agent and `lvms converge` do this by themselves once nothing of the class is open and \
         the LUN can be read)"
    )
}

/// Splits a device-mapper name LVM made (`<vg>-<lv>`, each with `-` doubled) into volume group and
/// logical volume; `None` for a name that is not LVM's.
pub fn split_dm_name(name: &str) -> Option<(String, String)> {
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'-' {
            if bytes.get(i + 1) == Some(&b'-') {
                i += 2;
                continue;
            }
            let (vg, lv) = (&name[..i], &name[i + 1..]);
            if vg.is_empty() || lv.is_empty() {
                return None;
            }
            return Some((vg.replace("--", "-"), lv.replace("--", "-")));
        }
        i += 1;
    }
    None
}

/// The order in which to fence device-mapper devices (`name` → the names of the devices that
/// hold it open): a device comes after every device that holds it, so a thin volume goes before
/// its pool and the pool before its data and metadata. Holders outside `devices` are ignored;
/// a cycle (which the kernel does not allow) ends in name order.
pub fn fence_order(devices: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut done: Vec<String> = Vec::new();
    let mut left: BTreeSet<&String> = devices.keys().collect();
    while !left.is_empty() {
        let ready: Vec<&String> = left
            .iter()
            .copied()
            .filter(|name| {
                devices[*name]
                    .iter()
                    .all(|h| !devices.contains_key(h) || done.contains(h))
            })
            .collect();
        let next = if ready.is_empty() {
            left.iter().copied().take(1).collect()
        } else {
            ready
        };
        for name in next {
            left.remove(name);
            done.push(name.clone());
        }
    }
    done
}

#[cfg(test)]
mod tests;
