//! The fence hook: `lvms fence <vg>`, which lvmlockctl runs as `lvmlockctl_kill_command` when
//! sanlock could not renew this host's lease of a shared volume group for `8 × io timeout` seconds
//! (ADR 0024). Another host may take the group's locks `60` s later; by then nothing on this host
//! may write to it.
//!
//! The hook replaces the table of every device-mapper device of the group with the `error` target
//! (`dmsetup wipe_table --noflush --nolockfs`, holders first): every opener's I/O, a mounted
//! filesystem's writeback included, fails from then on, even if the LUN's path comes back. Devices
//! nothing holds open are then removed. It exits 0 only when every device of the group fails I/O or
//! is gone; lvmlockctl then drops the group's locks, and sanlock stops the watchdog's countdown for
//! the lockspace. Otherwise lvmlockctl keeps the locks and the watchdog resets the host: either way
//! the host stops writing before another host takes over.
//!
//! A record of the fence goes to `/run/lvms/fenced-<vg>`, so the node agent can report it and
//! never treats an error-table device as an active volume.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    time::Duration,
};

use lvms_core::shared::fencing::{fence_order, split_dm_name};
use serde::Serialize;

use crate::runner::{Command, Runner};

/// `dmsetup`.
pub const DMSETUP: &str = "dmsetup";

/// Where fence records go.
pub const RECORD_DIR: &str = "/run/lvms";

/// A wipe waits for in-flight I/O; on a dead path with queueing that could be forever, and the
/// watchdog fires 60 s after the hook starts.
const WIPE_TIMEOUT: Duration = Duration::from_secs(20);

/// What the hook did to one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fenced {
    pub device: String,
    /// The table is the error target.
    pub wiped: bool,
    /// The device is gone.
    pub removed: bool,
    /// What failed, if anything.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The hook's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceReport {
    pub vg: String,
    pub devices: Vec<Fenced>,
}

impl FenceReport {
    /// Whether nothing of the group can write any more.
    pub fn fenced(&self) -> bool {
        self.devices.iter().all(|d| d.wiped || d.removed)
    }
}

/// The device-mapper devices of `vg` as sysfs shows them under `sys` (`/sys` on a machine):
/// name → the names of the devices that hold it open.
pub fn devices_of(sys: &Path, vg: &str) -> std::io::Result<BTreeMap<String, BTreeSet<String>>> {
    let block = sys.join("block");
    let mut names: BTreeMap<String, String> = BTreeMap::new(); // dm-N → name
    for entry in std::fs::read_dir(&block)? {
        let kernel = entry?.file_name().to_string_lossy().into_owned();
        if !kernel.starts_with("dm-") {
            continue;
        }
        if let Ok(name) = std::fs::read_to_string(block.join(&kernel).join("dm/name")) {
            names.insert(kernel, name.trim().to_owned());
        }
    }
    let mut out = BTreeMap::new();
    for (kernel, name) in &names {
        if split_dm_name(name).is_none_or(|(g, _)| g != vg) {
            continue;
        }
        let mut holders = BTreeSet::new();
        if let Ok(dir) = std::fs::read_dir(block.join(kernel).join("holders")) {
            for h in dir.flatten() {
                let h = h.file_name().to_string_lossy().into_owned();
                holders.insert(names.get(&h).cloned().unwrap_or(h));
            }
        }
        out.insert(name.clone(), holders);
    }
    Ok(out)
}

/// A device-mapper device of an LVM volume, as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvDevice {
    /// Its kernel name (`dm-3`).
    pub kernel: String,
    /// Its device-mapper name (`san-csi--1234`).
    pub name: String,
    /// Its volume group (`san`).
    pub vg: String,
    /// Its device numbers.
    pub dev: (u32, u32),
}

/// The device-mapper device under `sys` of the LVM volume named `lv` in any volume group: one
/// whose uuid is LVM's (`LVM-…`) and whose name is `<vg>-<lv>`. A volume this node no longer
/// serves (its class fenced, the volume handed over) may still have one, mounted where kubelet
/// asks to unmount it.
pub fn lv_device(sys: &Path, lv: &str) -> std::io::Result<Option<LvDevice>> {
    let block = sys.join("block");
    for entry in std::fs::read_dir(&block)? {
        let kernel = entry?.file_name().to_string_lossy().into_owned();
        if !kernel.starts_with("dm-") {
            continue;
        }
        let dir = block.join(&kernel);
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).map(|s| s.trim().to_owned());
        let (Ok(name), Ok(uuid)) = (read("dm/name"), read("dm/uuid")) else {
            continue;
        };
        let Some((vg, _)) = split_dm_name(&name).filter(|(_, l)| l == lv) else {
            continue;
        };
        if !uuid.starts_with("LVM-") {
            continue;
        }
        let dev = read("dev")?;
        let parsed = dev
            .split_once(':')
            .and_then(|(ma, mi)| Some((ma.parse().ok()?, mi.parse().ok()?)));
        let Some(dev) = parsed else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}/dev reads {dev:?}, not MAJOR:MINOR", dir.display()),
            ));
        };
        return Ok(Some(LvDevice {
            kernel,
            name,
            vg,
            dev,
        }));
    }
    Ok(None)
}

/// Fences `devices` (from [`devices_of`]) in [`fence_order`]: wipe every table, then remove what
/// nothing holds open.
pub async fn fence<R: Runner>(
    runner: &R,
    vg: &str,
    devices: &BTreeMap<String, BTreeSet<String>>,
) -> FenceReport {
    let order = fence_order(devices);
    let mut report = FenceReport {
        vg: vg.to_owned(),
        devices: Vec::new(),
    };
    for name in &order {
        let cmd = Command::new(
            DMSETUP,
            ["wipe_table", "--noflush", "--nolockfs", name.as_str()],
        )
        .timeout(WIPE_TIMEOUT);
        let (wiped, error) = match runner.run(&cmd).await {
            Ok(out) if out.success() => (true, String::new()),
            Ok(out) => (false, out.stderr.trim().to_owned()),
            Err(e) => (false, e.to_string()),
        };
        tracing::warn!(device = %name, wiped, %error, "fence: error table");
        report.devices.push(Fenced {
            device: name.clone(),
            wiped,
            removed: false,
            error,
        });
    }
    // Removal is best effort: a mounted filesystem keeps its device open (failing every I/O).
    for fenced in &mut report.devices {
        let cmd = Command::new(DMSETUP, ["remove", fenced.device.as_str()]).timeout(WIPE_TIMEOUT);
        fenced.removed = matches!(runner.run(&cmd).await, Ok(out) if out.success());
    }
    report
}

/// `dmsetup info -c --noheadings -o name,open --separator ,`: each device's open count, by name.
pub fn parse_open_counts(text: &str) -> BTreeMap<String, u32> {
    text.lines()
        .filter_map(|line| {
            let (name, open) = line.trim().rsplit_once(',')?;
            Some((name.to_owned(), open.trim().parse().ok()?))
        })
        .collect()
}

/// The record's path for `vg` under `dir`.
pub fn record_path(dir: &Path, vg: &str) -> PathBuf {
    dir.join(format!("fenced-{vg}"))
}

pub mod install;
#[cfg(test)]
mod tests;
