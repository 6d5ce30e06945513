//! Block devices: discovery (`lsblk` plus sysfs/devfs facts and a `blkid` low-level probe), path
//! resolution, signature probing and wiping.
//!
//! lsblk alone is not enough inside a container or on a host without udev: its `FSTYPE`, `PARTLABEL` and
//! the `/dev/disk/by-id` links come from the udev database, which may be empty. So discovery asks
//! `blkid -p` (a low-level probe of the device itself) where lsblk knows no signature or an LVM label
//! (which lvms-rs writes and removes itself, so udev's copy may lag), and reads the
//! by-id links and loop backing files itself.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Component, Path, PathBuf},
};

use lvms_core::model::{BlockDevice, DeviceKind};
use serde::Deserialize;

use crate::{
    error::{Error, Result},
    runner::{Command, DEFAULT_TIMEOUT, Output, Runner},
    validate,
};

/// The columns discovery asks of lsblk (util-linux ≥ 2.37 for `MOUNTPOINTS`).
pub const LSBLK_COLUMNS: &str =
    "NAME,KNAME,PATH,TYPE,SIZE,RO,STATE,PARTLABEL,FSTYPE,ROTA,SERIAL,MODEL,MOUNTPOINTS,PKNAME";

/// The signature recorded by discovery for a device `blkid` could not read (permission, no medium, I/O
/// error): something unknown, so it is never taken for an empty disk.
pub const UNKNOWN_SIGNATURE: &str = "unknown";

/// The signature for a device on which `blkid` finds several conflicting ones (its exit code 8).
pub const AMBIVALENT_SIGNATURE: &str = "ambivalent";

/// Never follow device-mapper holders deeper than this (a loop in sysfs would be a kernel bug).
const MAX_HOLDER_DEPTH: usize = 16;

// ---- lsblk ----

#[derive(Deserialize)]
struct Lsblk {
    blockdevices: Vec<RawDevice>,
}

/// lsblk prints numbers and booleans natively since util-linux 2.33 and as strings before.
#[derive(Deserialize)]
#[serde(untagged)]
enum Num {
    N(u64),
    S(String),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Flag {
    B(bool),
    N(u64),
    S(String),
}

#[derive(Deserialize)]
struct RawDevice {
    name: String,
    kname: String,
    path: String,
    #[serde(rename = "type")]
    kind: String,
    size: Option<Num>,
    ro: Option<Flag>,
    state: Option<String>,
    partlabel: Option<String>,
    fstype: Option<String>,
    rota: Option<Flag>,
    serial: Option<String>,
    model: Option<String>,
    #[serde(default)]
    mountpoints: Vec<Option<String>>,
    #[serde(default)]
    children: Vec<RawDevice>,
}

/// lsblk JSON that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LsblkError(pub String);

fn text(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

fn flag(v: Option<Flag>) -> bool {
    match v {
        Some(Flag::B(b)) => b,
        Some(Flag::N(n)) => n != 0,
        Some(Flag::S(s)) => s == "1" || s == "true",
        None => false,
    }
}

fn convert(raw: RawDevice) -> std::result::Result<BlockDevice, LsblkError> {
    let size = match raw.size {
        None => 0,
        Some(Num::N(n)) => n,
        Some(Num::S(s)) => s.trim().parse().map_err(|_| {
            LsblkError(format!("{}: size {s:?} is not a number of bytes", raw.name))
        })?,
    };
    Ok(BlockDevice {
        kind: DeviceKind::from_lsblk(&raw.kind),
        size,
        read_only: flag(raw.ro),
        state: text(raw.state),
        partlabel: text(raw.partlabel),
        fstype: text(raw.fstype),
        rotational: flag(raw.rota),
        serial: text(raw.serial),
        model: text(raw.model),
        mountpoints: raw.mountpoints.into_iter().flatten().collect(),
        by_id: Vec::new(),
        loop_backing_file: None,
        children: raw
            .children
            .into_iter()
            .map(convert)
            .collect::<std::result::Result<_, _>>()?,
        name: raw.name,
        kname: raw.kname,
        path: raw.path,
    })
}

/// Parses `lsblk -J -b -o LSBLK_COLUMNS` into the device tree (children are partitions and the devices
/// stacked on them). The enrichment fields (`by_id`, `loop_backing_file`) are left empty.
pub fn parse_lsblk(json: &str) -> std::result::Result<Vec<BlockDevice>, LsblkError> {
    let lsblk: Lsblk =
        serde_json::from_str(json).map_err(|e| LsblkError(format!("not lsblk JSON: {e}")))?;
    lsblk.blockdevices.into_iter().map(convert).collect()
}

// ---- blkid ----

/// The signature in `blkid -p -o export` output: `TYPE` (filesystem, LVM2_member, swap, …), else
/// `PTTYPE` (a partition table). A partition's own `PART_ENTRY_*` keys are not a signature.
pub fn parse_blkid_export(output: &str) -> Option<String> {
    let get = |key: &str| {
        output.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k == key && !v.is_empty()).then(|| v.to_owned())
        })
    };
    get("TYPE").or_else(|| get("PTTYPE"))
}

/// Interprets `blkid -p -o export <dev>`: exit 0 with a `TYPE`/`PTTYPE`, exit 2 without a message (no
/// signature; blkid says the same for a path that does not exist), exit 8 (several signatures:
/// [`AMBIVALENT_SIGNATURE`]); anything else is an error.
pub fn interpret_blkid(cmd: &Command, out: Output) -> Result<Option<String>> {
    match out.code {
        Some(0) => Ok(parse_blkid_export(&out.stdout)),
        Some(2) if out.stderr.trim().is_empty() => Ok(None),
        Some(8) => Ok(Some(AMBIVALENT_SIGNATURE.to_owned())),
        _ => Err(out.into_error(cmd)),
    }
}

/// Probes `dev` for a filesystem, partition table or other signature with `blkid -p -o export <dev>`.
pub async fn probe_signature<R: Runner>(runner: &R, dev: &str) -> Result<Option<String>> {
    validate::device_path(dev)?;
    let cmd = Command::new("blkid", ["-p", "-o", "export", dev]).timeout(DEFAULT_TIMEOUT);
    let out = runner.run(&cmd).await?;
    interpret_blkid(&cmd, out)
}

/// How long zeroing a volume may take (`blkdiscard --zeroout` of a large LUN-backed LV).
pub const ZERO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60 * 60);

/// Writes zeros over all of `dev` (`blkdiscard --zeroout`, which lets the device zero ranges itself
/// where it can). Destroys its data: only for a volume of ours that holds none yet.
pub async fn zero_out<R: Runner>(runner: &R, dev: &str) -> Result<()> {
    validate::device_path(dev)?;
    let cmd = Command::new("blkdiscard", ["--zeroout", dev]).timeout(ZERO_TIMEOUT);
    let out = runner.run(&cmd).await?;
    if out.success() {
        Ok(())
    } else {
        Err(busy_or_failed(&cmd, out))
    }
}

/// Writes zeros over `length` bytes of `dev` from byte `offset` (`blkdiscard --zeroout --offset
/// <offset> --length <length>`; both a multiple of the device's sector size, or blkdiscard refuses).
/// Destroys the data in that range: only for a volume of ours that holds none yet.
pub async fn zero_range<R: Runner>(runner: &R, dev: &str, offset: u64, length: u64) -> Result<()> {
    validate::device_path(dev)?;
    let (offset, length) = (offset.to_string(), length.to_string());
    let cmd = Command::new(
        "blkdiscard",
        [
            "--zeroout",
            "--offset",
            offset.as_str(),
            "--length",
            length.as_str(),
            dev,
        ],
    )
    .timeout(ZERO_TIMEOUT);
    let out = runner.run(&cmd).await?;
    if out.success() {
        Ok(())
    } else {
        Err(busy_or_failed(&cmd, out))
    }
}

/// Makes what was written to `dev` durable (`sync <dev>`: an fsync of the block device, which sends
/// the device a cache flush), so that a record of it can be trusted after a power loss too.
pub async fn flush<R: Runner>(runner: &R, dev: &str) -> Result<()> {
    validate::device_path(dev)?;
    let cmd = Command::new("sync", [dev]).timeout(DEFAULT_TIMEOUT);
    let out = runner.run(&cmd).await?;
    if out.success() {
        Ok(())
    } else {
        Err(out.into_error(&cmd))
    }
}

/// A failed command, as [`Error::InUse`] when the kernel said the device is busy.
fn busy_or_failed(cmd: &Command, out: Output) -> Error {
    if out.stderr.contains("Device or resource busy") {
        Error::InUse(format!("`{}`: {}", cmd.argv(), out.stderr.trim()))
    } else {
        out.into_error(cmd)
    }
}

/// Resolves `.` and `..` without touching the filesystem.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

async fn read_trimmed(path: &Path) -> Option<String> {
    tokio::fs::read_to_string(path)
        .await
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Names of the entries of a directory; a missing directory has none.
async fn dir_names(path: &Path) -> Result<Vec<String>> {
    let mut rd = match tokio::fs::read_dir(path).await {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(path.display().to_string(), e)),
    };
    let mut names = Vec::new();
    while let Some(entry) = rd
        .next_entry()
        .await
        .map_err(|e| Error::io(path.display().to_string(), e))?
    {
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Block devices of this machine through a [`Runner`] (lsblk, blkid, wipefs, dmsetup) and the sysfs and
/// devfs trees (injectable for tests).
#[derive(Debug, Clone)]
pub struct Devices<R> {
    runner: R,
    sys_root: PathBuf,
    dev_root: PathBuf,
}

impl<R: Runner> Devices<R> {
    pub fn new(runner: R) -> Self {
        Self {
            runner,
            sys_root: PathBuf::from("/sys"),
            dev_root: PathBuf::from("/dev"),
        }
    }

    /// Reads sysfs under `sys_root` instead of `/sys` and devfs under `dev_root` instead of `/dev`
    /// (command lines still name devices `/dev/...`).
    #[must_use]
    pub fn with_roots(
        mut self,
        sys_root: impl Into<PathBuf>,
        dev_root: impl Into<PathBuf>,
    ) -> Self {
        self.sys_root = sys_root.into();
        self.dev_root = dev_root.into();
        self
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    /// Where a `/dev/...` path lives under the devfs root.
    fn dev_fs_path(&self, dev: &str) -> PathBuf {
        self.dev_root.join(dev.strip_prefix("/dev/").unwrap_or(dev))
    }

    /// Every block device as a tree, enriched with by-id links, loop backing files and, where lsblk knows
    /// no signature, a `blkid -p` probe. LVM logical volumes (lsblk type `lvm`) and empty devices (size 0)
    /// are not probed: there may be thousands of the former, and the latter have nothing to read. A device
    /// blkid cannot read gets [`UNKNOWN_SIGNATURE`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn discover(&self) -> Result<Vec<BlockDevice>> {
        let cmd = Command::new("lsblk", ["-J", "-b", "-o", LSBLK_COLUMNS]).timeout(DEFAULT_TIMEOUT);
        let out = self.runner.run(&cmd).await?;
        if !out.success() {
            return Err(out.into_error(&cmd));
        }
        let mut devices = parse_lsblk(&out.stdout).map_err(|e| Error::Parse {
            argv: cmd.argv(),
            detail: e.0,
        })?;
        let by_id = self.by_id_links().await?;
        for dev in &mut devices {
            self.enrich(dev, &by_id).await?;
        }
        Ok(devices)
    }

    /// `/dev/disk/by-id` links by the device path they resolve to.
    async fn by_id_links(&self) -> Result<BTreeMap<String, Vec<String>>> {
        let dir = self.dev_root.join("disk/by-id");
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for name in dir_names(&dir).await? {
            let Ok(target) = tokio::fs::read_link(dir.join(&name)).await else {
                continue;
            };
            let resolved = normalize(&Path::new("/dev/disk/by-id").join(target));
            map.entry(resolved.to_string_lossy().into_owned())
                .or_default()
                .push(format!("/dev/disk/by-id/{name}"));
        }
        Ok(map)
    }

    fn enrich<'a>(
        &'a self,
        dev: &'a mut BlockDevice,
        by_id: &'a BTreeMap<String, Vec<String>>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            let mut links: Vec<String> = [dev.path.clone(), format!("/dev/{}", dev.kname)]
                .iter()
                .filter_map(|p| by_id.get(p))
                .flatten()
                .cloned()
                .collect();
            links.sort();
            links.dedup();
            dev.by_id = links;
            if dev.kind == DeviceKind::Loop {
                dev.loop_backing_file = read_trimmed(
                    &self
                        .sys_root
                        .join("block")
                        .join(&dev.kname)
                        .join("loop/backing_file"),
                )
                .await;
            }
            // An LVM label is what lvms-rs itself writes and removes (pvcreate, pvremove): the udev
            // database lsblk reads may not have seen the latest change yet (it kept a removed
            // label for good on a loaded CI machine), so the device itself is asked.
            let stale = dev.fstype.as_deref() == Some(lvms_core::filter::LVM_SIGNATURE);
            if (dev.fstype.is_none() || stale) && dev.size > 0 && dev.kind != DeviceKind::Lvm {
                dev.fstype = match probe_signature(&self.runner, &dev.path).await {
                    Ok(sig) => sig,
                    Err(e) => {
                        tracing::warn!(device = %dev.path, error = %e, "signature probe failed");
                        Some(UNKNOWN_SIGNATURE.to_owned())
                    }
                };
            }
            for child in &mut dev.children {
                self.enrich(child, by_id).await?;
            }
            Ok(())
        })
    }

    /// The canonical path of a configured device path (`/dev/disk/by-id/...` → `/dev/vdb`), `None` if it
    /// does not exist.
    pub async fn resolve_path(&self, path: &str) -> Option<String> {
        tokio::fs::canonicalize(path)
            .await
            .ok()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// The signature on `dev` (see [`probe_signature`]).
    pub async fn probe_signature(&self, dev: &str) -> Result<Option<String>> {
        probe_signature(&self.runner, dev).await
    }

    /// Destroys every signature on `dev` and its partitions: removes the device-mapper devices stacked on
    /// them (`dmsetup remove`, innermost first, from `/sys/class/block/<kname>/holders`), runs
    /// `wipefs --all <partitions...> <dev>`, and probes again. Fails if a signature remains, if a holder is
    /// not a device-mapper device (md RAID, bcache: stop those by hand), or with [`Error::InUse`] when the
    /// kernel reports the device busy (mounted, open). Destroys data: only on the user's explicit request.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn wipe(&self, dev: &str) -> Result<()> {
        validate::device_path(dev)?;
        let fs_path = self.dev_fs_path(dev);
        let canonical = tokio::fs::canonicalize(&fs_path)
            .await
            .map_err(|e| Error::io(dev, e))?;
        let kname = canonical
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::InvalidArgument(format!("{dev} names no device")))?;
        let partitions = self.partitions(&kname).await?;
        let mut removed = HashSet::new();
        for part in &partitions {
            self.remove_holders(part, 0, &mut removed).await?;
        }
        self.remove_holders(&kname, 0, &mut removed).await?;

        let mut args = vec!["--all".to_owned()];
        args.extend(partitions.iter().map(|p| format!("/dev/{p}")));
        args.push(dev.to_owned());
        let cmd = Command::new("wipefs", args).timeout(DEFAULT_TIMEOUT);
        let out = self.runner.run(&cmd).await?;
        if !out.success() {
            return Err(busy_or_failed(&cmd, out));
        }
        if let Some(signature) = self.probe_signature(dev).await? {
            return Err(Error::WipeIncomplete {
                device: dev.to_owned(),
                signature,
            });
        }
        Ok(())
    }

    /// Kernel names of the partitions of `kname` (sysfs subdirectories with a `partition` file).
    async fn partitions(&self, kname: &str) -> Result<Vec<String>> {
        let dir = self.sys_root.join("class/block").join(kname);
        let mut parts = Vec::new();
        for name in dir_names(&dir).await? {
            if name.starts_with(kname)
                && tokio::fs::try_exists(dir.join(&name).join("partition"))
                    .await
                    .unwrap_or(false)
            {
                parts.push(name);
            }
        }
        Ok(parts)
    }

    /// Removes, innermost first, every device-mapper device holding `kname`.
    fn remove_holders<'a>(
        &'a self,
        kname: &'a str,
        depth: usize,
        removed: &'a mut HashSet<String>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + Send + 'a>> {
        Box::pin(async move {
            if depth > MAX_HOLDER_DEPTH {
                return Err(Error::InvalidArgument(format!(
                    "device holders of {kname} nest deeper than {MAX_HOLDER_DEPTH}"
                )));
            }
            let holders_dir = self
                .sys_root
                .join("class/block")
                .join(kname)
                .join("holders");
            for holder in dir_names(&holders_dir).await? {
                if removed.contains(&holder) {
                    continue;
                }
                self.remove_holders(&holder, depth + 1, removed).await?;
                let dm_name_file = self
                    .sys_root
                    .join("class/block")
                    .join(&holder)
                    .join("dm/name");
                let Some(dm_name) = read_trimmed(&dm_name_file).await else {
                    return Err(Error::InUse(format!(
                        "{holder} holds {kname} and is not a device-mapper device: stop it by hand first"
                    )));
                };
                if dm_name.starts_with('-')
                    || dm_name.contains(|c: char| c.is_whitespace() || c == '/')
                {
                    return Err(Error::InvalidArgument(format!(
                        "device-mapper name {dm_name:?} of {holder} cannot be passed to dmsetup safely"
                    )));
                }
                let cmd =
                    Command::new("dmsetup", ["remove", dm_name.as_str()]).timeout(DEFAULT_TIMEOUT);
                let out = self.runner.run(&cmd).await?;
                if !out.success() {
                    return Err(busy_or_failed(&cmd, out));
                }
                removed.insert(holder);
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests;
