//! LVM through the `lvm` program: reports as JSON, mutations with validated names and device paths.
//!
//! Every call is `lvm <subcommand> ...` (program `lvm`, never `lvcreate` & co.), so the calls can later be
//! routed through one long-lived `lvm shell`. Sizes go to LVM in bytes (`--size 1073741824b`), reports come
//! back in bytes (`--units b --nosuffix`).
//!
//! # Prompts and `--yes`
//! LVM prompts on stdin, which is `/dev/null` here, so any prompt is answered "no" and the command fails.
//! `--yes` is passed where the question is one we mean to answer "yes": wiping stale signatures inside a
//! newly allocated LV (`lvcreate`), removing an active LV (`lvremove`). It is deliberately NOT passed where
//! the prompt is LVM's last safety net: `pvcreate`/`vgcreate`/`vgextend` (would wipe a filesystem found on
//! the device: the device must be wiped on purpose first, see [`crate::devices::Devices::wipe`]) and
//! `vgremove` (would remove every LV of the VG). `-f`/`--force` is never passed.
//!
//! # Idempotency
//! | operation | already done | how it is known |
//! |---|---|---|
//! | `pv_create` | device is a PV already: `Ok` | `pvs` first |
//! | `pv_remove` | no PV label on the device: `Ok` | LVM's "No PV found" / device not found |
//! | `vg_create` | VG exists with all the devices: `Ok`; otherwise `AlreadyExists` | LVM's "already exists", then `pvs` |
//! | `vg_extend` / `vg_reduce` | devices already in / already out: skipped, `Ok` if none left | `pvs` first |
//! | `vg_remove` | VG missing: `Ok`; VG with LVs: `InUse` | `vgs` first, LVM's "not found" |
//! | `vg_activate` | LVM's own; deactivating a missing VG: `Ok` | LVM's "not found" |
//! | `lv_create`, `thin_lv_create`, `thin_pool_create`, `thin_snapshot` | `AlreadyExists`: the caller compares | LVM's "already exists" |
//! | `lv_extend`, `thin_pool_extend` | size already ≥: `Ok` (no-op) | `lvs` first, LVM's "matches/not larger than existing size" |
//! | `lv_remove` | LV or VG missing: `Ok`; thin pool with thin volumes: `InUse` | `lvs` first, LVM's "not found" |
//! | `lv_remove_tagged` | as `lv_remove`, answering `Missing`; an LV without the tag: `Refused`, nothing run | `lvs` first |
//! | `lv_activate` | LVM's own | |
//! | `lv_deactivate` | LV missing: `Ok` | LVM's "not found" |
//! | `lv_add_tag` / `lv_del_tag`, `vg_add_tag` / `vg_del_tag` | LVM's own (adding a present tag or removing an absent one succeeds) | |
//!
//! Device paths are compared with `pvs` output as given: pass canonical paths (`/dev/vdb`, see
//! [`crate::devices::Devices::resolve_path`]); LVM does not resolve symlinks outside its device cache.

mod errors;
mod report;
mod thin;

use std::{collections::BTreeSet, time::Duration};

pub use lvms_core::layout::Layout;
use lvms_core::{
    config::RaidType,
    model::{LogicalVolume, PhysicalVolume, VolumeGroup},
    plan::{PoolRaid, pool_metadata_lv},
};

pub use self::{
    errors::classify,
    report::{
        LV_FIELDS, PV_FIELDS, ReportError, VG_FIELDS, group_fields, parse_group, parse_lvs,
        parse_pvs, parse_vgs, split_tags,
    },
    thin::{ChunkRuns, parse_delta, parse_dump},
};
use crate::{
    error::{Error, Result},
    runner::{Command, DEFAULT_TIMEOUT, Output, Runner},
    scope::LockScope,
    validate,
};

/// The LVM program. Every call goes through it.
pub const LVM: &str = "lvm";

/// How big a thin pool is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// A size in bytes (`--size <n>b`).
    Bytes(u64),
    /// A percentage (1–100) of the VG's free space (`--extents <n>%FREE`).
    PercentFree(u8),
}

/// A thin pool to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinPoolSpec {
    pub vg: String,
    pub name: String,
    pub size: PoolSize,
    /// `--chunksize`; LVM chooses when `None`.
    pub chunk_size: Option<u64>,
    /// `--poolmetadatasize`; LVM chooses when `None`.
    pub metadata_size: Option<u64>,
    /// Zero newly provisioned blocks (`--zero y`). Slower first writes, no stale data from earlier volumes.
    pub zero: bool,
}

/// How an LV of a shared volume group is activated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `ey`: only this host; LVM refuses every other host while it is active.
    Exclusive,
    /// `sy`: this host and others in shared mode (linear LVs only).
    Shared,
}

/// A (non-thin) logical volume to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvSpec {
    pub vg: String,
    pub name: String,
    /// Bytes; LVM rounds up to whole extents (and to the stripe boundary).
    pub size: u64,
    pub layout: Layout,
    pub tags: Vec<String>,
}

/// LVM commands over a [`Runner`].
///
/// # Shared volume groups
/// Volume groups named in [`Lvm::with_shared`] belong to shared classes: a command on one of them
/// carries its [`LockScope::args`] (lvmlockd and the class's devices file) right after
/// its subcommand. The volume group a command acts on is its last argument (`vg` or `vg/lv`): every
/// method here builds its command that way, except those that end in device paths (`pvcreate`,
/// `vgcreate`, `vgextend`, `vgreduce`), which shared classes never run through this type. The
/// all-group reports (`vgs()`, `lvs(None)`) add one scoped report per shared volume group that
/// exists, since without lvmlockd LVM skips those groups.
#[derive(Debug, Clone)]
pub struct Lvm<R> {
    runner: R,
    timeout: Duration,
    shared: BTreeSet<String>,
}

/// What [`Lvm::extend`] grows.
#[derive(Debug, Clone, Copy)]
enum Grow {
    Data,
    PoolMetadata,
}

fn bytes(n: u64) -> String {
    format!("{n}b")
}

/// A size argument (`--size`, `--virtualsize`, `--poolmetadatasize`): LVM rejects byte counts that are not a
/// multiple of 512 ("Size is not a multiple of 512") before it rounds up to extents, so round up to 512 here.
/// A CSI capacity range may ask for any byte count.
fn size_arg(n: u64) -> String {
    bytes(n.div_ceil(512).saturating_mul(512))
}

fn lv_path(vg: &str, lv: &str) -> String {
    format!("{vg}/{lv}")
}

fn check_vg_lv(vg: &str, lv: &str) -> Result<()> {
    validate::lvm_name(vg)?;
    validate::lvm_name(lv)
}

fn check_tags(tags: &[String]) -> Result<()> {
    tags.iter().try_for_each(|t| validate::lvm_tag(t))
}

fn check_devices(devs: &[String]) -> Result<()> {
    if devs.is_empty() {
        return Err(Error::InvalidArgument("no devices given".to_owned()));
    }
    devs.iter().try_for_each(|d| validate::device_path(d))
}

fn check_size(what: &str, size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::InvalidArgument(format!(
            "{what} must be greater than 0 bytes"
        )));
    }
    Ok(())
}

/// A new thin pool's size, chunk size, metadata size and zeroing arguments.
fn pool_args(spec: &ThinPoolSpec) -> Result<Vec<String>> {
    let mut args = Vec::new();
    match spec.size {
        PoolSize::Bytes(n) => {
            check_size("thin pool size", n)?;
            args.extend(["--size".to_owned(), size_arg(n)]);
        }
        PoolSize::PercentFree(p) => {
            if !(1..=100).contains(&p) {
                return Err(Error::InvalidArgument(format!(
                    "thin pool size {p}% of free space: give 1 to 100"
                )));
            }
            args.extend(["--extents".to_owned(), format!("{p}%FREE")]);
        }
    }
    args.extend(chunk_arg(spec)?);
    if let Some(m) = spec.metadata_size {
        check_size("metadata size", m)?;
        args.extend(["--poolmetadatasize".to_owned(), size_arg(m)]);
    }
    args.extend(zero_arg(spec));
    Ok(args)
}

/// `--chunksize <n>b` of a pool being made, when given.
fn chunk_arg(spec: &ThinPoolSpec) -> Result<Vec<String>> {
    spec.chunk_size
        .map(|c| {
            check_size("chunk size", c)?;
            Ok(vec!["--chunksize".to_owned(), bytes(c)])
        })
        .unwrap_or_else(|| Ok(Vec::new()))
}

/// `--zero y|n` of a pool being made.
fn zero_arg(spec: &ThinPoolSpec) -> [String; 2] {
    [
        "--zero".to_owned(),
        if spec.zero { "y" } else { "n" }.to_owned(),
    ]
}

fn push_tags(args: &mut Vec<String>, tags: &[String]) {
    for t in tags {
        args.push("--addtag".to_owned());
        args.push(t.clone());
    }
}

fn report_args(subcommand: &str, fields: &str, target: Option<String>) -> Vec<String> {
    let mut args: Vec<String> = [
        subcommand,
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(target);
    args
}

/// What [`Lvm::lv_remove_tagged`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Removal {
    /// The LV was removed.
    Removed,
    /// There was no such LV (or volume group).
    Missing,
    /// The LV is there but does not carry the tag: left alone.
    Refused(Box<LogicalVolume>),
}

impl<R: Runner> Lvm<R> {
    pub fn new(runner: R) -> Self {
        Self {
            runner,
            timeout: DEFAULT_TIMEOUT,
            shared: BTreeSet::new(),
        }
    }

    /// The volume groups of shared classes (see the type's documentation).
    #[must_use]
    pub fn with_shared(mut self, vgs: impl IntoIterator<Item = String>) -> Self {
        self.shared = vgs.into_iter().collect();
        self
    }

    /// Whether `vg` is a shared class's volume group.
    pub fn is_shared(&self, vg: &str) -> bool {
        self.shared.contains(vg)
    }

    /// The timeout of every `lvm` call (default [`DEFAULT_TIMEOUT`]).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    fn command(&self, mut args: Vec<String>) -> Command {
        let target = args
            .last()
            .and_then(|a| a.split('/').next())
            .filter(|vg| self.shared.contains(*vg))
            .map(str::to_owned);
        let scope = match target {
            Some(vg) if args.len() > 1 => LockScope::shared(&vg, None),
            _ => LockScope::Local,
        };
        let timeout = scope.timeout(self.timeout);
        args.splice(1..1, scope.args());
        Command::new(LVM, args).timeout(timeout)
    }

    /// `report` of each shared volume group that exists, appended to `out`.
    async fn shared_reports<T>(
        &self,
        subcommand: &str,
        fields: &str,
        parse: fn(&str) -> std::result::Result<Vec<T>, ReportError>,
        out: &mut Vec<T>,
    ) -> Result<()> {
        for vg in &self.shared {
            match self
                .report(report_args(subcommand, fields, Some(vg.clone())), parse)
                .await
            {
                Ok(more) => out.extend(more),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Runs `lvm args...`; a non-zero exit becomes the classified error.
    async fn exec(&self, args: Vec<String>) -> Result<Output> {
        let cmd = self.command(args);
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(classify(&cmd, out))
        }
    }

    async fn report<T>(
        &self,
        args: Vec<String>,
        parse: fn(&str) -> std::result::Result<T, ReportError>,
    ) -> Result<T> {
        let cmd = self.command(args);
        let out = self.runner.run(&cmd).await?;
        if !out.success() {
            return Err(classify(&cmd, out));
        }
        parse(&out.stdout).map_err(|e| Error::Parse {
            argv: cmd.argv(),
            detail: e.0,
        })
    }

    // ---- reports ----

    /// Every LVM physical volume LVM sees, orphans included.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn pvs(&self) -> Result<Vec<PhysicalVolume>> {
        self.report(report_args("pvs", PV_FIELDS, None), parse_pvs)
            .await
    }

    /// Every volume group.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vgs(&self) -> Result<Vec<VolumeGroup>> {
        let mut vgs = self
            .report(report_args("vgs", VG_FIELDS, None), parse_vgs)
            .await?;
        self.shared_reports("vgs", VG_FIELDS, parse_vgs, &mut vgs)
            .await?;
        Ok(vgs)
    }

    /// The volume groups and their visible logical volumes: with `local`, every local group (`vgs`,
    /// `lvs`); and each shared group by one `lvs -a` that carries the group's fields too, so one
    /// command under the group's lock reads both (`-a` lists the hidden `[lvmlock]` LV every
    /// sanlock group has, so even an empty group has a row; a group without any row is read by
    /// `vgs` after). A shared group that does not exist is left out.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn groups(&self, local: bool) -> Result<(Vec<VolumeGroup>, Vec<LogicalVolume>)> {
        let (mut vgs, mut lvs) = if local {
            (
                self.report(report_args("vgs", VG_FIELDS, None), parse_vgs)
                    .await?,
                self.report(report_args("lvs", LV_FIELDS, None), parse_lvs)
                    .await?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        for vg in &self.shared {
            let mut args = report_args("lvs", &group_fields(), Some(vg.clone()));
            args.insert(1, "-a".to_owned());
            let read = self.report(args, parse_group).await;
            match read {
                Ok((Some(group), rows)) => {
                    vgs.push(group);
                    lvs.extend(rows);
                }
                Ok((None, _)) => vgs.extend(self.vg(vg).await?),
                Err(Error::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok((vgs, lvs))
    }

    /// One volume group, `None` if it does not exist.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg(&self, name: &str) -> Result<Option<VolumeGroup>> {
        validate::lvm_name(name)?;
        match self
            .report(
                report_args("vgs", VG_FIELDS, Some(name.to_owned())),
                parse_vgs,
            )
            .await
        {
            Ok(vgs) => Ok(vgs.into_iter().find(|vg| vg.name == name)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The visible logical volumes (thin pools included; hidden sub-volumes such as `[pool_tdata]` not) of
    /// one volume group or of all. A missing volume group is `NotFound`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lvs(&self, vg: Option<&str>) -> Result<Vec<LogicalVolume>> {
        if let Some(vg) = vg {
            validate::lvm_name(vg)?;
        }
        let mut lvs = self
            .report(
                report_args("lvs", LV_FIELDS, vg.map(str::to_owned)),
                parse_lvs,
            )
            .await?;
        if vg.is_none() {
            self.shared_reports("lvs", LV_FIELDS, parse_lvs, &mut lvs)
                .await?;
        }
        Ok(lvs)
    }

    /// [`Lvm::lvs`] of every group with the hidden sub-volumes too (`lvs -a`: `[pool_tdata]`,
    /// `[pool_tmeta]`, RAID images), named in brackets as LVM names them.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lvs_all(&self) -> Result<Vec<LogicalVolume>> {
        let mut args = report_args("lvs", LV_FIELDS, None);
        args.insert(1, "-a".to_owned());
        let mut lvs = self.report(args, parse_lvs).await?;
        self.shared_reports("lvs", LV_FIELDS, parse_lvs, &mut lvs)
            .await?;
        Ok(lvs)
    }

    /// One logical volume, `None` if it (or its volume group) does not exist.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv(&self, vg: &str, name: &str) -> Result<Option<LogicalVolume>> {
        check_vg_lv(vg, name)?;
        match self
            .report(
                report_args("lvs", LV_FIELDS, Some(lv_path(vg, name))),
                parse_lvs,
            )
            .await
        {
            Ok(lvs) => Ok(lvs.into_iter().find(|lv| lv.name == name)),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// One logical volume and its volume group, read by one `lvs` (see [`Self::groups`]); `None`
    /// if either does not exist.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_and_group(
        &self,
        vg: &str,
        name: &str,
    ) -> Result<Option<(LogicalVolume, VolumeGroup)>> {
        check_vg_lv(vg, name)?;
        match self
            .report(
                report_args("lvs", &group_fields(), Some(lv_path(vg, name))),
                parse_group,
            )
            .await
        {
            Ok((group, lvs)) => Ok(group
                .zip(lvs.into_iter().find(|lv| lv.name == name))
                .map(|(g, lv)| (lv, g))),
            Err(Error::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    // ---- physical volumes ----

    /// Initialises `dev` as an LVM physical volume (`pvcreate [--metadatasize <n>b] <dev>`). A device that
    /// is a physical volume already is left as is. Without `--yes`: a device carrying a filesystem or
    /// other signature is refused with [`Error::SignatureExists`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn pv_create(&self, dev: &str, metadata_size: Option<u64>) -> Result<()> {
        validate::device_path(dev)?;
        if self.pvs().await?.iter().any(|pv| pv.name == dev) {
            tracing::debug!(dev, "already an LVM physical volume");
            return Ok(());
        }
        let mut args = vec!["pvcreate".to_owned()];
        if let Some(m) = metadata_size {
            check_size("metadata size", m)?;
            args.extend(["--metadatasize".to_owned(), bytes(m)]);
        }
        args.push(dev.to_owned());
        self.exec(args).await.map(drop)
    }

    /// Removes the LVM label from `dev` (`pvremove --yes <dev>`). No label: `Ok`. A physical volume of a
    /// volume group: [`Error::InUse`] (reduce the volume group first).
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn pv_remove(&self, dev: &str) -> Result<()> {
        validate::device_path(dev)?;
        match self
            .exec(vec![
                "pvremove".to_owned(),
                "--yes".to_owned(),
                dev.to_owned(),
            ])
            .await
        {
            Err(Error::NotFound(msg)) => {
                tracing::debug!(dev, %msg, "no LVM physical volume to remove");
                Ok(())
            }
            other => other.map(drop),
        }
    }

    // ---- volume groups ----

    /// Creates a volume group (`vgcreate [--addtag <t>]... <name> <dev>...`). If it exists already and
    /// holds all of `devs` (a retried create), `Ok`; otherwise [`Error::AlreadyExists`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_create(&self, name: &str, devs: &[String], tags: &[String]) -> Result<()> {
        validate::lvm_name(name)?;
        check_devices(devs)?;
        check_tags(tags)?;
        let mut args = vec!["vgcreate".to_owned()];
        push_tags(&mut args, tags);
        args.push(name.to_owned());
        args.extend(devs.iter().cloned());
        match self.exec(args).await {
            Err(Error::AlreadyExists(msg)) => {
                let pvs = self.pvs().await?;
                let all_ours = devs.iter().all(|d| {
                    pvs.iter()
                        .any(|pv| &pv.name == d && pv.vg_name.as_deref() == Some(name))
                });
                if all_ours {
                    tracing::debug!(name, "volume group exists with these devices already");
                    Ok(())
                } else {
                    Err(Error::AlreadyExists(msg))
                }
            }
            other => other.map(drop),
        }
    }

    /// Adds devices to a volume group (`vgextend <name> <dev>...`), skipping those already in it. A device
    /// of another volume group is [`Error::InUse`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_extend(&self, name: &str, devs: &[String]) -> Result<()> {
        validate::lvm_name(name)?;
        check_devices(devs)?;
        let pvs = self.pvs().await?;
        let mut todo = Vec::new();
        for dev in devs {
            match pvs
                .iter()
                .find(|pv| &pv.name == dev)
                .and_then(|pv| pv.vg_name.as_deref())
            {
                Some(vg) if vg == name => {}
                Some(other) => {
                    return Err(Error::InUse(format!(
                        "{dev} is an LVM physical volume of volume group {other}, not {name}"
                    )));
                }
                None => todo.push(dev.clone()),
            }
        }
        if todo.is_empty() {
            tracing::debug!(name, "all devices are in the volume group already");
            return Ok(());
        }
        let mut args = vec!["vgextend".to_owned(), name.to_owned()];
        args.extend(todo);
        self.exec(args).await.map(drop)
    }

    /// Removes devices from a volume group (`vgreduce <name> <dev>...`), skipping those not in it. A device
    /// with allocated extents is [`Error::InUse`] (move or remove its LVs first).
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_reduce(&self, name: &str, devs: &[String]) -> Result<()> {
        validate::lvm_name(name)?;
        check_devices(devs)?;
        let pvs = self.pvs().await?;
        let todo: Vec<String> = devs
            .iter()
            .filter(|d| {
                pvs.iter()
                    .any(|pv| &pv.name == *d && pv.vg_name.as_deref() == Some(name))
            })
            .cloned()
            .collect();
        if todo.is_empty() {
            tracing::debug!(name, "none of the devices is in the volume group");
            return Ok(());
        }
        let mut args = vec!["vgreduce".to_owned(), name.to_owned()];
        args.extend(todo);
        self.exec(args).await.map(drop)
    }

    /// Removes an empty volume group (`vgremove <name>`, without `--yes`). Missing: `Ok`. Still holding
    /// logical volumes: [`Error::InUse`]; remove them one by one first.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_remove(&self, name: &str) -> Result<()> {
        let Some(vg) = self.vg(name).await? else {
            tracing::debug!(name, "volume group does not exist");
            return Ok(());
        };
        if vg.lv_count > 0 {
            return Err(Error::InUse(format!(
                "volume group {name} still has {} logical volume(s)",
                vg.lv_count
            )));
        }
        match self
            .exec(vec!["vgremove".to_owned(), name.to_owned()])
            .await
        {
            Err(Error::NotFound(_)) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Activates or deactivates every LV of a volume group (`vgchange --activate y|n <name>`; LVs with the
    /// activation-skip flag are not activated). Deactivating a missing volume group is `Ok`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_activate(&self, name: &str, active: bool) -> Result<()> {
        validate::lvm_name(name)?;
        let yn = if active { "y" } else { "n" };
        let args = ["vgchange", "--activate", yn, name]
            .map(str::to_owned)
            .to_vec();
        match self.exec(args).await {
            Err(Error::NotFound(_)) if !active => Ok(()),
            other => other.map(drop),
        }
    }

    /// `vgchange --addtag <tag> <name>`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_add_tag(&self, name: &str, tag: &str) -> Result<()> {
        self.vg_tag(name, "--addtag", tag).await
    }

    /// `vgchange --deltag <tag> <name>`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn vg_del_tag(&self, name: &str, tag: &str) -> Result<()> {
        self.vg_tag(name, "--deltag", tag).await
    }

    async fn vg_tag(&self, name: &str, op: &str, tag: &str) -> Result<()> {
        validate::lvm_name(name)?;
        validate::lvm_tag(tag)?;
        let args = ["vgchange", op, tag, name].map(str::to_owned).to_vec();
        self.exec(args).await.map(drop)
    }

    // ---- thin pools ----

    /// Creates a thin pool: `lvcreate --yes --type thin-pool (--size <n>b | --extents <p>%FREE)
    /// [--chunksize <n>b] [--poolmetadatasize <n>b] --zero y|n --name <name> <vg>`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_pool_create(&self, spec: &ThinPoolSpec) -> Result<()> {
        check_vg_lv(&spec.vg, &spec.name)?;
        let mut args = ["lvcreate", "--yes", "--type", "thin-pool"]
            .map(str::to_owned)
            .to_vec();
        args.extend(pool_args(spec)?);
        args.extend(["--name".to_owned(), spec.name.clone(), spec.vg.clone()]);
        self.exec(args).await.map(drop)
    }

    /// Creates a thin pool over RAID (ADR 0031) in three commands, each skipped when its result is
    /// already there, so an interrupted creation resumes: the data as a RAID LV of `raid.data`'s
    /// layout under the pool's name (`lvcreate --type raidN … --size <data>`), the metadata as a
    /// raid1 LV `<pool>_meta` with `raid.metadata_mirrors` extra copies, then both joined
    /// (`lvconvert --yes --type thin-pool --poolmetadata <vg>/<pool>_meta [--chunksize <n>b]
    /// --zero y|n <vg>/<pool>`), which also makes the pool metadata spare. `spec.size` must be
    /// bytes and `spec.metadata_size` given.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_pool_create_raid(&self, spec: &ThinPoolSpec, raid: &PoolRaid) -> Result<()> {
        check_vg_lv(&spec.vg, &spec.name)?;
        let (PoolSize::Bytes(data), Some(metadata)) = (spec.size, spec.metadata_size) else {
            return Err(Error::InvalidArgument(format!(
                "thin pool {}/{} over RAID needs its data and metadata sizes in bytes",
                spec.vg, spec.name
            )));
        };
        let meta = pool_metadata_lv(&spec.name);
        let data_lv = self.lv(&spec.vg, &spec.name).await?;
        if data_lv.as_ref().is_some_and(|lv| lv.segtype == "thin-pool") {
            return Ok(());
        }
        if data_lv.is_none() {
            self.lv_create(&LvSpec {
                vg: spec.vg.clone(),
                name: spec.name.clone(),
                size: data,
                layout: Layout::of_raid_config(&raid.data),
                tags: Vec::new(),
            })
            .await?;
        }
        if self.lv(&spec.vg, &meta).await?.is_none() {
            self.lv_create(&LvSpec {
                vg: spec.vg.clone(),
                name: meta.clone(),
                size: metadata,
                layout: Layout::Raid {
                    level: RaidType::Raid1,
                    mirrors: Some(raid.metadata_mirrors),
                    stripes: None,
                    stripe_size: None,
                    nosync: false,
                    integrity: false,
                },
                tags: Vec::new(),
            })
            .await?;
        }
        let mut args = [
            "lvconvert",
            "--yes",
            "--type",
            "thin-pool",
            "--poolmetadata",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(lv_path(&spec.vg, &meta));
        args.extend(chunk_arg(spec)?);
        args.extend(zero_arg(spec));
        args.push(lv_path(&spec.vg, &spec.name));
        self.exec(args).await.map(drop)
    }

    /// Creates the thin volume `name` together with the new thin pool `pool` that holds it, in one
    /// command, both left inactive: `lvcreate --yes --type thin --virtualsize <n>b --thinpool <pool>
    /// (--size <n>b | --extents <p>%FREE) [--chunksize <n>b] [--poolmetadatasize <n>b] --zero y|n
    /// --activate n [--addtag <t>]... --name <name> <vg>`. LVM puts the tags on the pool, not on the
    /// volume (lvm2 2.03.16): tag the volume with [`Lvm::lv_add_tags`]. One command instead of three
    /// (pool, volume, deactivation): on a shared volume group each takes the lock and the second
    /// activates the pool.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_lv_create_with_pool(
        &self,
        pool: &ThinPoolSpec,
        name: &str,
        virtual_size: u64,
        pool_tags: &[String],
    ) -> Result<()> {
        check_vg_lv(&pool.vg, name)?;
        validate::lvm_name(&pool.name)?;
        check_tags(pool_tags)?;
        check_size("virtual size", virtual_size)?;
        let mut args = ["lvcreate", "--yes", "--type", "thin", "--virtualsize"]
            .map(str::to_owned)
            .to_vec();
        args.extend([
            size_arg(virtual_size),
            "--thinpool".to_owned(),
            pool.name.clone(),
        ]);
        args.extend(pool_args(pool)?);
        args.extend(["--activate".to_owned(), "n".to_owned()]);
        push_tags(&mut args, pool_tags);
        args.extend(["--name".to_owned(), name.to_owned(), pool.vg.clone()]);
        self.exec(args).await.map(drop)
    }

    /// Grows a thin pool's data to at least `new_size` bytes (`lvextend --yes --size <n>b <vg>/<pool>`).
    /// Already that big: no-op. Missing: [`Error::NotFound`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_pool_extend(&self, vg: &str, name: &str, new_size: u64) -> Result<()> {
        self.extend(vg, name, new_size, Grow::Data).await
    }

    /// Grows a thin pool's metadata to at least `new_size` bytes
    /// (`lvextend --yes --poolmetadatasize <n>b <vg>/<pool>`). Already that big: no-op.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_pool_metadata_extend(
        &self,
        vg: &str,
        name: &str,
        new_size: u64,
    ) -> Result<()> {
        self.extend(vg, name, new_size, Grow::PoolMetadata).await
    }

    // ---- logical volumes ----

    /// Creates a logical volume: `lvcreate --yes --type <t> [layout options] --size <n>b
    /// --wipesignatures y [--addtag <t>]... --name <name> <vg>`. `--yes` answers LVM's question whether to
    /// wipe a stale signature found in the newly allocated extents.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_create(&self, spec: &LvSpec) -> Result<()> {
        let args = self.lv_create_args(spec, &["--wipesignatures", "y"])?;
        self.exec(args).await.map(drop)
    }

    /// [`Lvm::lv_create`], leaving the LV inactive (`--activate n --zero n --wipesignatures n`: LVM can
    /// neither zero nor wipe an LV it does not activate). For shared volume groups, where a new LV would
    /// otherwise be active (and locked) on the creating node; the LV is wiped where it is first used.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_create_inactive(&self, spec: &LvSpec) -> Result<()> {
        let args = self.lv_create_args(
            spec,
            &["--activate", "n", "--zero", "n", "--wipesignatures", "n"],
        )?;
        self.exec(args).await.map(drop)
    }

    fn lv_create_args(&self, spec: &LvSpec, activation: &[&str]) -> Result<Vec<String>> {
        check_vg_lv(&spec.vg, &spec.name)?;
        check_tags(&spec.tags)?;
        check_size("logical volume size", spec.size)?;
        let mut args = vec![
            "lvcreate".to_owned(),
            "--yes".to_owned(),
            "--type".to_owned(),
        ];
        let positive = |what: &str, n: u32| {
            if n == 0 {
                Err(Error::InvalidArgument(format!("{what} must be at least 1")))
            } else {
                Ok(n.to_string())
            }
        };
        let stripe_size = |args: &mut Vec<String>, size: Option<u64>| -> Result<()> {
            if let Some(s) = size {
                check_size("stripe size", s)?;
                args.extend(["--stripesize".to_owned(), bytes(s)]);
            }
            Ok(())
        };
        // raid1 and the RAID levels: `--nosync` skips the initial synchronisation,
        // `--raidintegrity y` puts dm-integrity under each image.
        let raid_options = |args: &mut Vec<String>, nosync: bool, integrity: bool| {
            if nosync {
                args.push("--nosync".to_owned());
            }
            if integrity {
                args.extend(["--raidintegrity".to_owned(), "y".to_owned()]);
            }
        };
        match spec.layout {
            Layout::Linear => args.push("linear".to_owned()),
            Layout::Striped {
                stripes,
                stripe_size: size,
            } => {
                let stripes = stripes.ok_or_else(|| {
                    Error::InvalidArgument(
                        "a striped volume needs its stripe count settled (one per LVM physical \
                         volume of the group) before lvcreate"
                            .to_owned(),
                    )
                })?;
                args.extend([
                    "striped".to_owned(),
                    "--stripes".to_owned(),
                    positive("stripes", stripes)?,
                ]);
                stripe_size(&mut args, size)?;
            }
            Layout::Mirror {
                mirrors,
                nosync,
                integrity,
            } => {
                args.extend([
                    "raid1".to_owned(),
                    "--mirrors".to_owned(),
                    positive("mirrors", mirrors)?,
                ]);
                raid_options(&mut args, nosync, integrity);
            }
            Layout::Raid {
                level,
                mirrors,
                stripes,
                stripe_size: size,
                nosync,
                integrity,
            } => {
                args.push(level.as_lvm().to_owned());
                if let Some(m) = mirrors {
                    args.extend(["--mirrors".to_owned(), positive("mirrors", m)?]);
                }
                if let Some(s) = stripes {
                    args.extend(["--stripes".to_owned(), positive("stripes", s)?]);
                }
                stripe_size(&mut args, size)?;
                raid_options(&mut args, nosync, integrity);
            }
        }
        args.extend(["--size".to_owned(), size_arg(spec.size)]);
        args.extend(activation.iter().map(|a| (*a).to_owned()));
        push_tags(&mut args, &spec.tags);
        args.extend(["--name".to_owned(), spec.name.clone(), spec.vg.clone()]);
        Ok(args)
    }

    /// Creates a thin volume: `lvcreate --yes --type thin --virtualsize <n>b --thinpool <pool>
    /// [--addtag <t>]... --name <name> <vg>`.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_lv_create(
        &self,
        vg: &str,
        pool: &str,
        name: &str,
        virtual_size: u64,
        tags: &[String],
    ) -> Result<()> {
        check_vg_lv(vg, name)?;
        validate::lvm_name(pool)?;
        check_tags(tags)?;
        check_size("virtual size", virtual_size)?;
        let mut args = ["lvcreate", "--yes", "--type", "thin", "--virtualsize"]
            .map(str::to_owned)
            .to_vec();
        args.extend([
            size_arg(virtual_size),
            "--thinpool".to_owned(),
            pool.to_owned(),
        ]);
        push_tags(&mut args, tags);
        args.extend(["--name".to_owned(), name.to_owned(), vg.to_owned()]);
        self.exec(args).await.map(drop)
    }

    /// Creates a thin snapshot of the thin volume `origin`: `lvcreate --yes --type thin
    /// --setactivationskip y --permission r|rw [--addtag <t>]... --name <name> <vg>/<origin>`.
    /// (`--type thin` with an origin and no size is lvcreate's "thin snapshot of a thin LV" form; it never
    /// makes an old-style COW snapshot. lvm2 2.03 rejects `--type thin` together with `--snapshot`.)
    ///
    /// Thin snapshots carry the activation-skip flag (set explicitly here; it is also LVM's default): they
    /// are not activated by `lvcreate`, `vgchange -ay` or `lvchange -ay`, and do not appear under `/dev`
    /// until activated with [`Lvm::lv_activate`] and `ignore_skip = true` (`lvchange -ay -K`).
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_snapshot(
        &self,
        vg: &str,
        origin: &str,
        name: &str,
        read_only: bool,
        tags: &[String],
    ) -> Result<()> {
        check_vg_lv(vg, name)?;
        validate::lvm_name(origin)?;
        check_tags(tags)?;
        let mut args = [
            "lvcreate",
            "--yes",
            "--type",
            "thin",
            "--setactivationskip",
            "y",
            "--permission",
            if read_only { "r" } else { "rw" },
        ]
        .map(str::to_owned)
        .to_vec();
        push_tags(&mut args, tags);
        args.extend(["--name".to_owned(), name.to_owned(), lv_path(vg, origin)]);
        self.exec(args).await.map(drop)
    }

    /// Grows a logical volume to at least `new_size` bytes (`lvextend --yes --size <n>b <vg>/<lv>`); the
    /// filesystem is grown separately ([`crate::fs::Filesystems::grow`]). Already that big: no-op.
    /// Missing: [`Error::NotFound`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_extend(&self, vg: &str, name: &str, new_size: u64) -> Result<()> {
        self.extend(vg, name, new_size, Grow::Data).await
    }

    /// Grows a volume's data (`--size`) or a thin pool's metadata (`--poolmetadatasize`) to at least
    /// `new_size`: looks first (already that big: no-op), and treats LVM's "not larger" answer after a
    /// racing extend as success.
    async fn extend(&self, vg: &str, name: &str, new_size: u64, what: Grow) -> Result<()> {
        check_vg_lv(vg, name)?;
        let (size_label, object, flag) = match what {
            Grow::Data => ("new size", "logical volume", "--size"),
            Grow::PoolMetadata => ("metadata size", "thin pool", "--poolmetadatasize"),
        };
        check_size(size_label, new_size)?;
        let lv = self
            .lv(vg, name)
            .await?
            .ok_or_else(|| Error::NotFound(format!("{object} {vg}/{name}")))?;
        let current = match what {
            Grow::Data => Some(lv.size),
            Grow::PoolMetadata => lv.metadata_size,
        };
        if current.is_some_and(|c| c >= new_size) {
            tracing::debug!(vg, name, ?current, new_size, "already big enough");
            return Ok(());
        }
        let args = vec![
            "lvextend".to_owned(),
            "--yes".to_owned(),
            flag.to_owned(),
            size_arg(new_size),
            lv_path(vg, name),
        ];
        match self.exec(args).await {
            // Grown by someone else between the look and the extend.
            Err(Error::CommandFailed { stderr, .. }) if errors::is_size_not_larger(&stderr) => {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// Removes a logical volume (`lvremove --yes <vg>/<lv>`; `--yes` answers "remove an active LV?").
    /// Missing (or its volume group missing): `Ok`. A thin pool that still has thin volumes:
    /// [`Error::InUse`] (LVM would remove them all with it). Open or mounted: [`Error::InUse`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_remove(&self, vg: &str, name: &str) -> Result<()> {
        self.remove_if(vg, name, |_| true).await.map(drop)
    }

    /// Removes a logical volume only if it carries `tag`, looking at it once: what
    /// [`Self::lv_remove`] does, for callers that must never remove an LV that is not theirs.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_remove_tagged(&self, vg: &str, name: &str, tag: &str) -> Result<Removal> {
        self.remove_if(vg, name, |lv| lv.tags.iter().any(|t| t == tag))
            .await
    }

    /// Removes the thin pool `vg/name` when it carries `tag` and holds no thin volume, from one look
    /// at the group (pool and users in one report); [`Error::InUse`] naming the volumes it holds.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn thin_pool_remove_tagged(
        &self,
        vg: &str,
        name: &str,
        tag: &str,
    ) -> Result<Removal> {
        check_vg_lv(vg, name)?;
        let lvs = match self.lvs(Some(vg)).await {
            Err(Error::NotFound(_)) => return Ok(Removal::Missing),
            other => other?,
        };
        let Some(lv) = lvs.iter().find(|l| l.name == name) else {
            return Ok(Removal::Missing);
        };
        if lv.segtype != "thin-pool" || !lv.tags.iter().any(|t| t == tag) {
            return Ok(Removal::Refused(Box::new(lv.clone())));
        }
        self.remove_checked(vg, name, &lvs).await
    }

    async fn remove_if(
        &self,
        vg: &str,
        name: &str,
        allowed: impl FnOnce(&LogicalVolume) -> bool,
    ) -> Result<Removal> {
        check_vg_lv(vg, name)?;
        let Some(lv) = self.lv(vg, name).await? else {
            tracing::debug!(vg, name, "logical volume does not exist");
            return Ok(Removal::Missing);
        };
        if !allowed(&lv) {
            return Ok(Removal::Refused(Box::new(lv)));
        }
        let users = if lv.segtype == "thin-pool" {
            self.lvs(Some(vg)).await?
        } else {
            Vec::new()
        };
        self.remove_checked(vg, name, &users).await
    }

    /// `lvremove --yes <vg>/<name>` unless `lvs` (the group's volumes, when `name` is a thin pool)
    /// shows thin volumes in it.
    async fn remove_checked(&self, vg: &str, name: &str, lvs: &[LogicalVolume]) -> Result<Removal> {
        let users: Vec<&str> = lvs
            .iter()
            .filter(|l| l.pool_lv.as_deref() == Some(name))
            .map(|l| l.name.as_str())
            .collect();
        if !users.is_empty() {
            return Err(Error::InUse(format!(
                "thin pool {vg}/{name} still has thin volumes: {}",
                users.join(", ")
            )));
        }
        let args = vec!["lvremove".to_owned(), "--yes".to_owned(), lv_path(vg, name)];
        match self.exec(args).await {
            Err(Error::NotFound(_)) => Ok(Removal::Missing),
            other => other.map(|_| Removal::Removed),
        }
    }

    /// Activates a logical volume (`lvchange --activate y [--ignoreactivationskip] <vg>/<lv>`).
    /// `ignore_skip` (`-K`) is needed for LVs with the activation-skip flag, such as thin snapshots.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_activate(&self, vg: &str, name: &str, ignore_skip: bool) -> Result<()> {
        check_vg_lv(vg, name)?;
        let mut args = ["lvchange", "--activate", "y"].map(str::to_owned).to_vec();
        if ignore_skip {
            args.push("--ignoreactivationskip".to_owned());
        }
        args.push(lv_path(vg, name));
        self.exec(args).await.map(drop)
    }

    /// Activates an LV of a shared volume group: `lvchange --activate ey|sy --ignoreactivationskip
    /// <vg>/<lv>` (thin snapshots and clones carry the activation-skip flag). LVM refuses
    /// (`LV locked by other host`, [`Error::InUse`]) while another host holds it in a mode that excludes
    /// this one.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_activate_shared(&self, vg: &str, name: &str, how: Activation) -> Result<()> {
        check_vg_lv(vg, name)?;
        let mode = match how {
            Activation::Exclusive => "ey",
            Activation::Shared => "sy",
        };
        let args = vec![
            "lvchange".to_owned(),
            "--activate".to_owned(),
            mode.to_owned(),
            "--ignoreactivationskip".to_owned(),
            lv_path(vg, name),
        ];
        self.exec(args).await.map(drop)
    }

    /// Deactivates a logical volume (`lvchange --activate n <vg>/<lv>`). Missing: `Ok`. Open: [`Error::InUse`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_deactivate(&self, vg: &str, name: &str) -> Result<()> {
        check_vg_lv(vg, name)?;
        let args = vec![
            "lvchange".to_owned(),
            "--activate".to_owned(),
            "n".to_owned(),
            lv_path(vg, name),
        ];
        match self.exec(args).await {
            Err(Error::NotFound(_)) => Ok(()),
            other => other.map(drop),
        }
    }

    /// `lvchange --addtag <tag> <vg>/<lv>`. Adding a tag the LV has already succeeds.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_add_tag(&self, vg: &str, name: &str, tag: &str) -> Result<()> {
        self.lv_tag(vg, name, "--addtag", tag).await
    }

    /// `lvchange --deltag <tag> <vg>/<lv>`. Removing a tag the LV does not have succeeds.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_del_tag(&self, vg: &str, name: &str, tag: &str) -> Result<()> {
        self.lv_tag(vg, name, "--deltag", tag).await
    }

    /// `lvchange --addtag <t>... <vg>/<lv>`: several tags in one command.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn lv_add_tags(&self, vg: &str, name: &str, tags: &[String]) -> Result<()> {
        check_vg_lv(vg, name)?;
        check_tags(tags)?;
        if tags.is_empty() {
            return Ok(());
        }
        let mut args = vec!["lvchange".to_owned()];
        push_tags(&mut args, tags);
        args.push(lv_path(vg, name));
        self.exec(args).await.map(drop)
    }

    async fn lv_tag(&self, vg: &str, name: &str, op: &str, tag: &str) -> Result<()> {
        check_vg_lv(vg, name)?;
        validate::lvm_tag(tag)?;
        let args = vec![
            "lvchange".to_owned(),
            op.to_owned(),
            tag.to_owned(),
            lv_path(vg, name),
        ];
        self.exec(args).await.map(drop)
    }
}

#[cfg(test)]
mod tests;
