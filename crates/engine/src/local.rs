//! [`LocalBackend`]: volumes and snapshots made with LVM on this node.
//!
//! # On disk
//! Thin classes make thin volumes in the class's pool (`lvcreate --type thin`), thick classes make
//! linear, striped or RAID volumes in the class's volume group. Names and tags come from [`crate::ids`]:
//! the LV name is derived from the CO's name, and the tags say that the LV is ours ([`ids::OWNER_TAG`]),
//! which CO name it answers to, where its content came from, whether it is a snapshot and whether it is
//! an inline ephemeral volume (with its pod, [`ids::EphemeralOwner`]). Nothing else is
//! kept, so a restarted driver finds every volume. LVs without our owner tag are never changed or removed.
//!
//! Snapshots need a thin class: a snapshot is a read-only thin snapshot of the volume (created with the
//! activation-skip flag, so [`Backend::activate`] passes `--ignoreactivationskip`). A restore or clone is
//! a writable thin snapshot of the snapshot or volume, grown with `lvextend` when more was asked for than
//! the source holds (the node grows the filesystem). Thin snapshots are independent volumes in LVM, so
//! a volume with snapshots (or clones) can be deleted.
//!
//! # Idempotency
//! | call | already done | answer |
//! |---|---|---|
//! | `create_volume`, `create_snapshot` | an LV with the name, our owner tag and the same name tag | returned as found (the caller checks compatibility) |
//! | `create_volume`, `create_snapshot` | an LV with the name that is not ours | [`BackendError::Conflict`] |
//! | `create_volume` from a source | the LV is there but smaller than asked (interrupted between snapshot and extend) | the extend is finished |
//! | `delete` | no such LV | `Ok(false)` |
//! | `expand` | already that big | `Ok` with the current size |
//!
//! # Cost: one cached report, patched after each mutation; mutations queued per volume group
//! Reads ([`Backend::get`], [`Backend::list`], [`Backend::capacity`], [`Backend::ready`]) and the looks
//! before a mutation use one cached report of the classes' volume groups and logical volumes (`lvm vgs`
//! and `lvm lvs`: two commands, whatever the number of LVs). The report is
//!
//! - patched after every successful mutation this backend makes, with what that mutation changed, read
//!   from LVM while the volume group's queue is still held: the new or grown LV (`lvs <vg>/<lv>`), the
//!   activated LV, the thin pool after a thin delete (its data usage falls), the volume group after a thick create, grow
//!   or delete (its free space changes). So a create costs its `lvcreate` and one small `lvs`, however
//!   many volumes there are, instead of a full report;
//! - marked stale by a mutation that failed (it may have done part of its work) and when reading back
//!   what a mutation changed fails; the next read then takes a full report;
//! - refreshed when older than the TTL ([`DEFAULT_CACHE_TTL`], 60 s; [`LocalBackend::with_cache_ttl`]),
//!   to notice changes made by others (a disk that failed, an administrator's `lvremove`);
//! - refreshed before a mutation gives up on a volume, snapshot or volume group it did not find in it,
//!   so a stale report never makes a delete skip an LV or a create fail on a new class.
//!
//! An idle driver therefore runs two LVM commands per TTL at most, however many volumes it has (the
//! CO's periodic `GetCapacity` and `ListVolumes` are answered from the cache); with the
//! [`lvms_host::shell::LvmShell`] runner those go to the one long-lived `lvm` process and start none.
//! While a class is not ready (volume group or pool missing), `ready` and `capacity` take the report
//! again at most every 5 s, so readiness follows the node engine promptly.
//!
//! Mutations of one volume group run one at a time (a [`tokio::sync::Mutex`] per volume group), instead
//! of racing for LVM's own volume-group lock: measured in the test VM, four parallel `lvcreate`s gave only
//! 1.37× the throughput of one, and four parallel `lvremove`s 0.67×. Different volume groups proceed in
//! parallel. Reads never wait for a mutation: they answer from the report of before it.
//!
//! A report is kept together with the mutation counter it was started under: a mutation that fails
//! while a report is being taken makes that report stale at once. A patch waits for a report being taken
//! (one lock guards the report and its refresh) and is applied to it, so a report never hides a mutation
//! that finished before the read that returned it started.
//!
//! # Capacity
//! Thick classes offer the volume group's free space, thin classes
//! [`lvms_core::capacity::thin_capacity`] of the pool with the class's overprovision ratio; new thin
//! volumes, snapshots and expansions that would exceed it are refused with
//! [`BackendError::InsufficientSpace`] (LVM itself only warns when a pool is overprovisioned). Sizes are
//! rounded up to whole extents of the volume group.

use std::{
    collections::HashMap,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use lvms_core::{
    capacity::{ThinPoolUsage, max_volume_size, min_volume_size, thick_available, thin_capacity},
    config::{Adopt, CSI_DRIVER_LVM_LV_TAG, SharedVolumeMode, WipePolicy},
    layout::FreeSpace,
    lvattr::{LvAttr, LvHealth, Permissions, VgAttr},
    model::LogicalVolume,
    size::{ByteSize, round_up_to_extent},
};
use lvms_host::{
    lvm::{LvSpec, Lvm, Removal},
    runner::Runner,
};
use tokio::{sync::Mutex, time::Instant};

use self::report::{Changed, Report, ReportCache};
use crate::{
    backend::{
        Backend, BackendError, BlockRanges, Capacity, DeviceClassConfig, Layout, NewSnapshot,
        NewVolume, PoolUsage, Result, Source, TakeOver, Usage, Volume,
    },
    ids,
};

/// How long a report of the volume groups and logical volumes is used before it is taken again.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(60);

/// How long a stage of a shared class's volume waits, by default, for a lock another node holds:
/// 90 s, within kubelet's 2-minute NodeStage timeout. A dead node's lock is freed at sanlock's
/// host-dead time (140 s after its last renewal at the default io timeout), so a stage started
/// after about 50 s gets the volume in one call; an earlier one is refused and kubelet retries.
pub const DEFAULT_SHARED_STAGE_WAIT: Duration = Duration::from_secs(90);

/// A class that is not ready (volume group or pool missing) is looked at again after this long, so
/// readiness follows the node engine quickly without an LVM call on every probe.
const NOT_READY_RECHECK: Duration = Duration::from_secs(5);

/// Segment type of thin volumes.
const THIN: &str = "thin";
/// Segment type of thin pools.
const THIN_POOL: &str = "thin-pool";

/// Maps a host error to the backend's: out of space and not found keep their meaning, the rest is a
/// host failure.
fn host(e: lvms_host::Error) -> BackendError {
    match e {
        lvms_host::Error::InsufficientSpace(msg) => BackendError::InsufficientSpace(msg),
        lvms_host::Error::NotFound(msg) => BackendError::NotFound(msg),
        other => BackendError::Host(other),
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn has_tag(lv: &LogicalVolume, tag: &str) -> bool {
    lv.tags.iter().any(|t| t == tag)
}

fn is_ours(lv: &LogicalVolume) -> bool {
    has_tag(lv, ids::OWNER_TAG)
}

fn is_our_id(id: &str) -> bool {
    ids::is_volume_id(id) || ids::is_snapshot_id(id) || ids::is_taken_over_id(id)
}

/// Whether `lv` is a volume TopoLVM's lvmd made in `class`: a thin volume of the class's pool, or
/// in a thick class a plain, visible LV (topolvm `internal/lvmd/command/lvm.go`; ADR 0032).
fn topolvm_shape(
    class: &DeviceClassConfig,
    lv: &LogicalVolume,
    attr: &LvAttr,
) -> std::result::Result<(), String> {
    match (class.thin_pool(), lv.segtype == THIN) {
        (Some(pool), true) if lv.pool_lv.as_deref() == Some(pool) => Ok(()),
        (Some(pool), _) => Err(format!(
            "it is not a thin volume of the class's pool {pool} (segment type {}, pool {:?})",
            lv.segtype,
            lv.pool_lv.as_deref().unwrap_or("")
        )),
        (None, false) if !attr.is_thin_pool() && !lv.name.starts_with('[') => Ok(()),
        (None, _) => Err(format!(
            "device class {} is thick and it is a {} volume",
            class.name, lv.segtype
        )),
    }
}

/// Whether `lv` is a volume csi-driver-lvm made: its tag, and a plain, visible, linear, striped or
/// raid1 LV (csi-driver-lvm `pkg/lvm/lvm.go` `CreateLV`; ADR 0033).
fn csi_driver_lvm_shape(lv: &LogicalVolume, attr: &LvAttr) -> std::result::Result<(), String> {
    if !has_tag(lv, CSI_DRIVER_LVM_LV_TAG) {
        return Err(format!(
            "it lacks csi-driver-lvm's tag {CSI_DRIVER_LVM_LV_TAG} (tags {:?})",
            lv.tags
        ));
    }
    if lv.name.starts_with('[') || attr.is_thin_pool() || lv.segtype == THIN {
        return Err(format!(
            "csi-driver-lvm makes linear, striped and raid1 volumes, and it is a {} volume",
            lv.segtype
        ));
    }
    Ok(())
}

/// A size for messages: `1Gi (1073741824 bytes)`.
struct Bytes(u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} bytes)", ByteSize(self.0), self.0)
    }
}

/// The volume or snapshot an LV of ours is.
fn to_volume(lv: &LogicalVolume) -> Volume {
    Volume {
        id: lv.name.clone(),
        class: lv.vg_name.clone(),
        size: lv.size,
        name: ids::name_from_tags(&lv.tags),
        source: Source::from_tags(&lv.tags),
        snapshot: has_tag(lv, ids::SNAPSHOT_TAG),
        thin: lv.segtype == THIN,
        created: ids::created_from_tags(&lv.tags),
        requested: ids::requested_from_tags(&lv.tags),
        health: LvAttr::parse(&lv.attr).map_or(LvHealth::Unknown, |a| a.health()),
        device: format!("/dev/{}/{}", lv.vg_name, lv.name),
        ephemeral: ids::EphemeralOwner::from_tags(&lv.tags),
        open: LvAttr::parse(&lv.attr).is_ok_and(|a| a.is_open()),
    }
}

/// A [`Backend`] making volumes with LVM on this node. See the [module documentation](self).
#[derive(Debug)]
pub struct LocalBackend<R> {
    node_id: String,
    classes: Vec<DeviceClassConfig>,
    lvm: Lvm<R>,
    /// One per class volume group: mutations of one volume group run one at a time.
    vg_locks: HashMap<String, Mutex<()>>,
    cache: ReportCache,
    /// Seconds since the Unix epoch, for the creation tag of snapshots.
    clock: fn() -> u64,
    /// How long a stage of a shared class's volume waits for another node's lock.
    shared_stage_wait: Duration,
    /// Where a stage that starts waiting says so (the node agent posts it on the volume's claim).
    stage_waits: Option<StageWaits>,
    /// Reads of a thin pool's metadata run one at a time: a pool keeps one metadata snapshot.
    metadata_reads: Mutex<()>,
}

/// A stage of a shared class's volume that waits for another node's lock: the volume and why,
/// with when sanlock frees the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageWait {
    pub volume_id: String,
    pub message: String,
}

/// Where [`LocalBackend::with_stage_waits`] sends [`StageWait`]s.
pub type StageWaits = tokio::sync::mpsc::UnboundedSender<StageWait>;

impl<R: Runner> LocalBackend<R> {
    /// A backend serving `classes` on node `node_id` through `lvm`.
    pub fn new(node_id: impl Into<String>, classes: Vec<DeviceClassConfig>, lvm: Lvm<R>) -> Self {
        let vg_locks = classes
            .iter()
            .map(|c| (c.name.clone(), Mutex::new(())))
            .collect();
        Self {
            node_id: node_id.into(),
            classes,
            lvm,
            vg_locks,
            cache: ReportCache {
                ttl: DEFAULT_CACHE_TTL,
                mutations: AtomicU64::new(0),
                slot: Mutex::new(None),
            },
            clock: unix_now,
            shared_stage_wait: DEFAULT_SHARED_STAGE_WAIT,
            stage_waits: None,
            metadata_reads: Mutex::new(()),
        }
    }

    /// Sends a [`StageWait`] to `waits` whenever a stage starts waiting for another node's lock.
    #[must_use]
    pub fn with_stage_waits(mut self, waits: StageWaits) -> Self {
        self.stage_waits = Some(waits);
        self
    }

    /// How long a stage of a shared class's volume that another node holds waits for its lock,
    /// trying again every few seconds ([`DEFAULT_SHARED_STAGE_WAIT`] unless set; zero refuses at
    /// once). Keep it under the CO's NodeStage timeout (kubelet's is 2 minutes).
    #[must_use]
    pub fn with_shared_stage_wait(mut self, wait: Duration) -> Self {
        self.shared_stage_wait = wait;
        self
    }

    /// How long a report is used before it is taken again (default [`DEFAULT_CACHE_TTL`]).
    #[must_use]
    pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache.ttl = ttl;
        self
    }

    /// The clock for the creation tag of snapshots, in seconds since the Unix epoch (default: the system
    /// clock).
    #[must_use]
    pub fn with_clock(mut self, clock: fn() -> u64) -> Self {
        self.clock = clock;
        self
    }

    /// Puts LV `vg/id`, whose attributes an activation or deactivation changed, into the cached report;
    /// when the read fails the next read takes a full report.
    async fn read_back_lv(&self, vg: &str, id: &str, after: &str) {
        let changed = Changed {
            lvs: vec![id],
            ..Changed::default()
        };
        if let Err(e) = self.patch(vg, changed).await {
            tracing::warn!(volume_id = id, error = %e, "could not read back after {after}; the next read takes a full report");
        }
    }

    /// Whether a class is shared (its volume group changes under other nodes' hands).
    fn has_shared(&self) -> bool {
        self.classes.iter().any(|c| c.shared().is_some())
    }

    /// The LVM commands this backend runs.
    pub fn lvm(&self) -> &Lvm<R> {
        &self.lvm
    }

    fn class(&self, name: &str) -> Result<&DeviceClassConfig> {
        self.classes.iter().find(|c| c.name == name).ok_or_else(|| {
            BackendError::NotFound(format!(
                "device class {name} is not served on node {}",
                self.node_id
            ))
        })
    }

    // ---- the report ----

    /// The cached report, taken again when a mutation or the TTL made it stale.
    async fn report(&self) -> Result<Arc<Report>> {
        let mut slot = self.cache.slot.lock().await;
        let now = self.cache.mutations.load(Ordering::SeqCst);
        if let Some((taken_at, report)) = slot.as_ref()
            && *taken_at == now
            && report.taken.elapsed() < self.cache.ttl
        {
            return Ok(report.clone());
        }
        let report = Arc::new(self.fetch().await?);
        *slot = Some((now, report.clone()));
        Ok(report)
    }

    /// A report taken now.
    async fn fresh_report(&self) -> Result<Arc<Report>> {
        self.cache.invalidate();
        self.report().await
    }

    async fn fetch(&self) -> Result<Report> {
        let taken = Instant::now();
        let ours = |vg: &str| self.classes.iter().any(|c| c.name == vg);
        let local = self.classes.iter().any(|c| c.shared().is_none());
        let (vgs, lvs) = self.lvm.groups(local).await.map_err(host)?;
        tracing::debug!(
            node = %self.node_id,
            vgs = vgs.len(),
            lvs = lvs.len(),
            "took the LVM report"
        );
        Ok(Report {
            vgs: vgs.into_iter().filter(|vg| ours(&vg.name)).collect(),
            lvs: lvs
                .into_iter()
                .filter(|lv| ours(&lv.vg_name))
                .map(Arc::new)
                .collect(),
            pvs: None,
            taken,
        })
    }

    /// Runs a mutation. A failed one marks the report stale (it may have done part of its work); after a
    /// successful one the caller patches the report ([`Self::patch`]) or marks it stale.
    async fn mutate<T>(
        &self,
        op: impl Future<Output = lvms_host::Result<T>>,
    ) -> lvms_host::Result<T> {
        let result = op.await;
        if result.is_err() {
            self.cache.invalidate();
        }
        result
    }

    /// Reads what a mutation of volume group `vg` changed and puts it into the cached report; returns the
    /// changed LVs as read. Called with `vg`'s queue held. When the read fails the report is marked stale
    /// and the error returned.
    async fn patch(&self, vg: &str, changed: Changed<'_>) -> Result<Vec<LogicalVolume>> {
        let read = async {
            let missing = |name: &str| {
                BackendError::NotFound(format!(
                    "logical volume {vg}/{name} on node {} is missing right after it was changed",
                    self.node_id
                ))
            };
            // On a shared group every read is a process and a round through the lock: the group's
            // free space comes with the first LV (local reads share one `lvm shell`).
            let with_group = changed.vg && self.lvm.is_shared(vg);
            let mut lvs = Vec::with_capacity(changed.lvs.len());
            let mut group = None;
            for (i, name) in changed.lvs.iter().enumerate() {
                let lv = if with_group && i == 0 {
                    self.lvm.lv_and_group(vg, name).await.map(|found| {
                        found.map(|(lv, g)| {
                            group = Some(g);
                            lv
                        })
                    })
                } else {
                    self.lvm.lv(vg, name).await
                };
                lvs.push(lv.map_err(host)?.ok_or_else(|| missing(name))?);
            }
            if changed.vg && group.is_none() {
                group = Some(self.lvm.vg(vg).await.map_err(host)?.ok_or_else(|| {
                    BackendError::NotFound(format!(
                        "volume group {vg} on node {} is missing right after a change",
                        self.node_id
                    ))
                })?);
            }
            Ok::<_, BackendError>((lvs, group))
        };
        let (lvs, group) = match read.await {
            Ok(read) => read,
            Err(e) => {
                self.cache.invalidate();
                return Err(e);
            }
        };
        let mut slot = self.cache.slot.lock().await;
        if let Some((_, report)) = slot.as_mut() {
            let report = Arc::make_mut(report);
            if let Some(name) = changed.removed {
                report.remove_lv(vg, name);
            }
            for lv in &lvs {
                report.put_lv(lv.clone());
            }
            if let Some(group) = group {
                report.put_vg(group);
                // Which device the change took its extents from is not known.
                report.pvs = None;
            }
        }
        Ok(lvs)
    }

    /// The free extents of each LVM physical volume of `class`'s group, from `report`'s physical
    /// volumes; when it has none yet they are read (one `pvs`) and kept in the cached report until
    /// a group's free space changes.
    async fn free_space_in(
        &self,
        report: &Arc<Report>,
        class: &DeviceClassConfig,
    ) -> Result<FreeSpace> {
        let extent = self.extent_size(report, &class.name)?;
        let pvs = match &report.pvs {
            Some(pvs) => pvs.clone(),
            None => {
                let pvs = self.lvm.pvs().await.map_err(host)?;
                let mut slot = self.cache.slot.lock().await;
                if let Some((_, cached)) = slot.as_mut()
                    && Arc::ptr_eq(cached, report)
                {
                    Arc::make_mut(cached).pvs = Some(pvs.clone());
                }
                pvs
            }
        };
        Ok(FreeSpace::new(
            extent,
            pvs.iter()
                .filter(|pv| pv.vg_name.as_deref() == Some(class.name.as_str()))
                .filter(|pv| !pv.attr.contains('m'))
                .map(|pv| pv.free),
        ))
    }

    /// Whether `vg` is a thick class: its volume group's free space changes with each LV.
    fn is_thick(&self, vg: &str) -> bool {
        self.classes
            .iter()
            .any(|c| c.name == vg && c.thin_pool().is_none())
    }

    /// The report with `class`'s volume group (and pool) in it, taking it again when they are missing
    /// from a report older than [`NOT_READY_RECHECK`]; `Unavailable` if they are still missing.
    async fn converged_report(&self, class: &DeviceClassConfig) -> Result<Arc<Report>> {
        let mut report = self.report().await?;
        if !report.converged(class) && report.taken.elapsed() >= NOT_READY_RECHECK {
            report = self.fresh_report().await?;
        }
        if report.vg(&class.name).is_none() {
            return Err(BackendError::Unavailable(format!(
                "volume group {} of device class {} does not exist on node {} (yet)",
                class.name, class.name, self.node_id
            )));
        }
        if let Some(pool) = &class.thin_pool()
            && report.pool(class).is_none()
        {
            return Err(BackendError::Unavailable(format!(
                "thin pool {}/{pool} of device class {} does not exist on node {} (yet)",
                class.name, class.name, self.node_id
            )));
        }
        Ok(report)
    }

    /// Whether the class's volume group is missing LVM physical volumes (a RAID class that lost a
    /// disk: its volumes are served, but LVM changes nothing in the group until it is repaired).
    fn is_partial(report: &Report, class: &DeviceClassConfig) -> bool {
        report
            .vg(&class.name)
            .is_some_and(|vg| VgAttr::parse(&vg.attr).is_ok_and(|a| a.is_partial()))
    }

    /// Refuses a change of `class` while its group is partial, with the reason, rather than with
    /// the error LVM would give.
    fn refuse_partial(&self, report: &Report, class: &DeviceClassConfig) -> Result<()> {
        if Self::is_partial(report, class) {
            return Err(BackendError::Unavailable(format!(
                "volume group {} of device class {} on node {} is missing LVM physical volumes: its \
                 volumes are still served, but nothing new is made in it until the lost disk is \
                 replaced and its RAID volumes repaired (the class's status says how)",
                class.name, class.name, self.node_id
            )));
        }
        Ok(())
    }

    /// [`Self::converged_report`] for a change ([`Self::refuse_partial`]).
    async fn changeable_report(&self, class: &DeviceClassConfig) -> Result<Arc<Report>> {
        let report = self.converged_report(class).await?;
        self.refuse_partial(&report, class)?;
        Ok(report)
    }

    /// Our LV with this id, from the report; a miss is checked against a fresh report, so a mutation never
    /// acts on a stale "not there".
    async fn locate(&self, id: &str) -> Result<Option<LogicalVolume>> {
        let report = self.report().await?;
        if let Some(lv) = report.find(id) {
            return Ok(Some(lv.clone()).filter(is_ours));
        }
        let report = self.fresh_report().await?;
        Ok(report.find(id).filter(|lv| is_ours(lv)).cloned())
    }

    async fn lock_vg(&self, vg: &str) -> Result<tokio::sync::MutexGuard<'_, ()>> {
        match self.vg_locks.get(vg) {
            Some(lock) => Ok(lock.lock().await),
            None => Err(BackendError::NotFound(format!(
                "volume group {vg} is not a device class on node {}",
                self.node_id
            ))),
        }
    }

    fn extent_size(&self, report: &Report, vg: &str) -> Result<u64> {
        report
            .vg(vg)
            .map(|v| v.extent_size)
            .filter(|e| *e > 0)
            .ok_or_else(|| {
                BackendError::Unavailable(format!(
                    "volume group {vg} does not exist on node {} (yet)",
                    self.node_id
                ))
            })
    }

    /// `size` rounded up to whole extents (at least one).
    fn round(&self, size: u64, extent: u64) -> Result<u64> {
        round_up_to_extent(size.max(1), extent).ok_or_else(|| {
            BackendError::InvalidArgument(format!(
                "size {} is too large to round up to extents of {}",
                Bytes(size),
                Bytes(extent)
            ))
        })
    }

    /// Refuses to promise `more` bytes of a thin class's pool beyond what its overprovision ratio allows.
    fn check_thin_space(
        &self,
        report: &Report,
        class: &DeviceClassConfig,
        more: u64,
    ) -> Result<()> {
        let Some(pool) = report.pool(class) else {
            return Err(BackendError::Unavailable(format!(
                "the thin pool of device class {} does not exist on node {} (yet)",
                class.name, self.node_id
            )));
        };
        let usage = ThinPoolUsage::from_lvs(pool, report.lvs(), class.overprovision_ratio());
        let available = thin_capacity(&usage).available;
        if more > available {
            return Err(BackendError::InsufficientSpace(format!(
                "thin pool {}/{} on node {} can promise {} more with overprovision ratio {} \
                 (pool {}, {:.2}% used, {} promised); {} requested",
                class.name,
                pool.name,
                self.node_id,
                Bytes(available),
                class.overprovision_ratio(),
                Bytes(pool.size),
                usage.data_percent,
                Bytes(usage.virtual_used),
                Bytes(more),
            )));
        }
        Ok(())
    }

    /// An LV found under the name of `name`: ours (owner and name tags) or a conflict.
    fn adopt(&self, lv: &LogicalVolume, name: &str) -> Result<Volume> {
        if is_ours(lv) && has_tag(lv, &ids::name_tag(name)) {
            tracing::debug!(
                volume_id = %lv.name,
                device_class = %lv.vg_name,
                "found, created before"
            );
            return Ok(to_volume(lv));
        }
        let whose = if is_ours(lv) {
            "it belongs to another name of this driver"
        } else {
            "it does not carry this driver's tag"
        };
        Err(BackendError::Conflict(format!(
            "logical volume {}/{} on node {} exists but is not {name}: {whose} (tags: {})",
            lv.vg_name,
            lv.name,
            self.node_id,
            if lv.tags.is_empty() {
                "none".to_owned()
            } else {
                lv.tags.join(",")
            }
        )))
    }

    /// The LV `name` read back after creating or growing it, and put into the cached report.
    async fn read_back(&self, vg: &str, name: &str) -> Result<Volume> {
        let changed = Changed {
            lvs: vec![name],
            vg: self.is_thick(vg),
            ..Changed::default()
        };
        let lvs = self.patch(vg, changed).await?;
        lvs.first().map(to_volume).ok_or_else(|| {
            BackendError::NotFound(format!(
                "logical volume {vg}/{name} on node {} was not read back",
                self.node_id
            ))
        })
    }

    /// Creates with `op`; when LVM says the LV exists already (made by someone else since the report),
    /// adopts it or reports the conflict.
    async fn create_or_adopt(
        &self,
        op: impl Future<Output = lvms_host::Result<()>>,
        vg: &str,
        lv_name: &str,
        name: &str,
    ) -> Result<Volume> {
        match self.mutate(op).await {
            Ok(()) => self.read_back(vg, lv_name).await,
            Err(lvms_host::Error::AlreadyExists(msg)) => {
                let report = self.fresh_report().await?;
                match report.find(lv_name) {
                    Some(lv) => self.adopt(lv, name),
                    None => Err(BackendError::Conflict(msg)),
                }
            }
            Err(e) => Err(host(e)),
        }
    }

    /// A writable thin snapshot of `req.source`, grown to `size`.
    async fn restore(
        &self,
        mut report: Arc<Report>,
        class: &DeviceClassConfig,
        req: &NewVolume,
        source: &Source,
        lv_name: &str,
        size: u64,
    ) -> Result<Volume> {
        let find = |r: &Report| {
            r.find(source.id())
                .filter(|lv| is_ours(lv))
                .filter(|lv| match source {
                    Source::Snapshot(_) => has_tag(lv, ids::SNAPSHOT_TAG),
                    Source::Volume(_) => !has_tag(lv, ids::SNAPSHOT_TAG),
                })
                .cloned()
        };
        if find(&report).is_none() {
            // Not in the report: make sure with a fresh one.
            report = self.fresh_report().await?;
        }
        let src = find(&report).ok_or_else(|| self.source_not_found(source))?;
        if src.vg_name != class.name {
            return Err(BackendError::InvalidArgument(format!(
                "{} is in device class {}, the new volume {} in device class {}: a volume can only be \
                 restored or cloned within its device class",
                describe(source),
                src.vg_name,
                req.name,
                class.name
            )));
        }
        if class.thin_pool().is_none() && class.shared().is_none() {
            return Err(BackendError::InvalidArgument(format!(
                "device class {} is thick: restoring a snapshot or cloning a volume needs a thin device \
                 class",
                class.name
            )));
        }
        if src.segtype != THIN {
            return Err(BackendError::InvalidArgument(format!(
                "{} is not a thin volume: restoring a snapshot or cloning a volume of shared device \
                 class {} needs a thin one (volume mode thin)",
                describe(source),
                class.name
            )));
        }
        if size < src.size {
            return Err(BackendError::InvalidArgument(format!(
                "{} holds {}: the new volume {} cannot be smaller ({} requested)",
                describe(source),
                Bytes(src.size),
                req.name,
                Bytes(size)
            )));
        }
        let pool = src.pool_lv.clone().unwrap_or_default();
        if class.shared().is_some() {
            // The clone lives in its source's pool, which grows to hold it.
            let report = self.fresh_report().await?;
            self.cover(&report, &class.name, &pool, size).await?;
        } else {
            self.check_thin_space(&report, class, size)?;
        }
        let tags = vec![
            ids::OWNER_TAG.to_owned(),
            ids::name_tag(&req.name),
            source.tag(),
            ids::requested_tag(req.size),
        ];
        let vol = self
            .create_or_adopt(
                self.lvm
                    .thin_snapshot(&class.name, &src.name, lv_name, false, &tags),
                &class.name,
                lv_name,
                &req.name,
            )
            .await?;
        let vol = if vol.size < size {
            self.grow(&class.name, lv_name, size).await?
        } else {
            vol
        };
        if class.shared().is_some() {
            self.park(&class.name, Some(lv_name), &pool).await;
        }
        Ok(vol)
    }

    /// The tags of the snapshot `req` of `source`.
    fn snapshot_tags(&self, req: &NewSnapshot, source: &Source) -> Vec<String> {
        vec![
            ids::OWNER_TAG.to_owned(),
            ids::name_tag(&req.name),
            ids::SNAPSHOT_TAG.to_owned(),
            ids::created_tag((self.clock)()),
            source.tag(),
        ]
    }

    fn source_not_found(&self, source: &Source) -> BackendError {
        BackendError::NotFound(format!(
            "{} does not exist on node {}",
            describe(source),
            self.node_id
        ))
    }

    /// `lvextend` to `size`, then the volume as it is now.
    async fn grow(&self, vg: &str, lv: &str, size: u64) -> Result<Volume> {
        self.mutate(self.lvm.lv_extend(vg, lv, size))
            .await
            .map_err(host)?;
        self.read_back(vg, lv).await
    }
}

fn describe(source: &Source) -> String {
    match source {
        Source::Snapshot(id) => format!("source snapshot {id}"),
        Source::Volume(id) => format!("source volume {id}"),
    }
}

impl<R: Runner> Backend for LocalBackend<R> {
    fn node_id(&self) -> &str {
        &self.node_id
    }

    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.classes.clone()
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn ready(&self) -> Result<bool> {
        let mut report = self.report().await?;
        let all = |r: &Report| self.classes.iter().all(|c| r.converged(c));
        if !all(&report) && report.taken.elapsed() >= NOT_READY_RECHECK {
            report = self.fresh_report().await?;
        }
        Ok(all(&report))
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn get(&self, id: &str) -> Result<Option<Volume>> {
        if !is_our_id(id) {
            return Ok(None);
        }
        if self.has_shared() {
            // Other nodes make and remove the shared classes' volumes: a miss is checked afresh.
            return Ok(self.locate(id).await?.as_ref().map(to_volume));
        }
        let report = self.report().await?;
        Ok(report.find(id).filter(|lv| is_ours(lv)).map(to_volume))
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn list(&self) -> Result<Vec<Volume>> {
        let report = if self.has_shared() {
            self.fresh_report().await?
        } else {
            self.report().await?
        };
        let mut out: Vec<Volume> = report
            .lvs()
            // csi-driver-lvm's volumes have no `LogicalVolume` and no listing names them: their
            // PersistentVolumes are their only record, so no collector may see them (ADR 0033).
            .filter(|lv| is_ours(lv) && is_our_id(&lv.name) && !ids::is_csi_driver_lvm_id(&lv.name))
            .map(to_volume)
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    #[tracing::instrument(
        skip(self, req),
        fields(node = %self.node_id, name = %req.name, device_class = %req.class, size = req.size)
    )]
    async fn create_volume(&self, req: &NewVolume) -> Result<Volume> {
        let class = self.class(&req.class)?;
        let lv_name = ids::volume_lv_name(&req.name);
        let _queued = self.lock_vg(&class.name).await?;
        let locked = Instant::now();
        let report = self.report().await?;
        let mut tags = vec![ids::OWNER_TAG.to_owned(), ids::name_tag(&req.name)];
        if let Some(owner) = &req.ephemeral {
            tags.extend(owner.tags());
        }
        if let Some(lv) = report.find(&lv_name) {
            if lv.tags.is_empty() && class.shared().is_some() {
                // Perhaps a shared thin volume a crash left untagged beside its pool.
                return self
                    .finish_shared_thin(&class.name, &lv_name, &req.name, &tags)
                    .await;
            }
            let vol = self.adopt(lv, &req.name)?;
            // A restore interrupted between the snapshot and the extend: finish it.
            if req.source.is_some() && vol.source == req.source && vol.class == class.name {
                let extent = self.extent_size(&report, &class.name)?;
                let size = self.round(req.size, extent)?;
                if vol.size < size {
                    tracing::info!(volume_id = %lv_name, "finishing an interrupted restore");
                    return self.grow(&class.name, &lv_name, size).await;
                }
            }
            return Ok(vol);
        }
        let report = self.changeable_report(class).await?;
        let extent = self.extent_size(&report, &class.name)?;
        let size = self.round(req.size, extent)?;
        if let Some(source) = &req.source {
            return self
                .restore(report, class, req, source, &lv_name, size)
                .await;
        }
        match &class.thin_pool() {
            Some(pool) => {
                self.check_thin_space(&report, class, size)?;
                self.create_or_adopt(
                    self.lvm
                        .thin_lv_create(&class.name, pool, &lv_name, size, &tags),
                    &class.name,
                    &lv_name,
                    &req.name,
                )
                .await
            }
            None if class.shared().is_some() => {
                let shared = class.shared().copied().unwrap_or_default();
                if req.lv_type.is_some_and(|t| t != Layout::Linear) {
                    return Err(BackendError::InvalidArgument(format!(
                        "device class {} is shared: its volumes are linear or thin (striped and RAID \
                         volumes cannot be active on several hosts)",
                        class.name
                    )));
                }
                if req.volume_mode.unwrap_or(shared.volume_mode) == SharedVolumeMode::Thin {
                    // A report taken inside this node's queue is fresh enough: a pool made
                    // meanwhile by another node makes the lvcreate fail and the volume be found.
                    let fresh = (report.taken >= locked).then_some(report);
                    return self
                        .create_shared_thin(fresh, class, &lv_name, &req.name, size, &tags)
                        .await;
                }
                let mut tags = tags;
                if shared.wipe_policy == WipePolicy::Full {
                    tags.push(ids::UNWIPED_TAG.to_owned());
                }
                let spec = LvSpec {
                    vg: class.name.clone(),
                    name: lv_name.clone(),
                    size,
                    layout: Layout::Linear,
                    tags,
                };
                // Inactive: a new LV would otherwise be active, and locked, on this node only.
                self.create_or_adopt(
                    self.lvm.lv_create_inactive(&spec),
                    &class.name,
                    &lv_name,
                    &req.name,
                )
                .await
            }
            None => {
                let devices = report.vg(&class.name).map_or(0, |vg| vg.pv_count);
                let layout = req.lv_type.unwrap_or(class.layout()).resolved(devices);
                let needed = layout.devices_needed(devices);
                if needed > devices {
                    // RESOURCE_EXHAUSTED: a node with more disks in the class may make it.
                    return Err(BackendError::InsufficientSpace(format!(
                        "a {} volume needs {needed} LVM physical volumes (disks) in volume group {} \
                         on node {}, which has {devices}: add disks to device class {}, or ask for \
                         a layout that needs fewer (linear needs one)",
                        layout.name(),
                        class.name,
                        self.node_id,
                        class.name
                    )));
                }
                let spec = LvSpec {
                    vg: class.name.clone(),
                    name: lv_name.clone(),
                    size,
                    layout,
                    tags,
                };
                self.create_or_adopt(self.lvm.lv_create(&spec), &class.name, &lv_name, &req.name)
                    .await
            }
        }
    }

    #[tracing::instrument(
        skip(self, req),
        fields(node = %self.node_id, name = %req.name, source = %req.source_volume)
    )]
    async fn create_snapshot(&self, req: &NewSnapshot) -> Result<Volume> {
        let source = Source::Volume(req.source_volume.clone());
        if !ids::is_volume_id(&req.source_volume) && !ids::is_taken_over_id(&req.source_volume) {
            return Err(self.source_not_found(&source));
        }
        let lv_name = ids::snapshot_lv_name(&req.name);
        if let Some(lv) = self.report().await?.find(&lv_name) {
            return self.adopt(lv, &req.name);
        }
        let src = self
            .locate(&req.source_volume)
            .await?
            // A taken-over id may name a snapshot: snapshots are taken of volumes.
            .filter(|lv| !has_tag(lv, ids::SNAPSHOT_TAG))
            .ok_or_else(|| self.source_not_found(&source))?;
        let class = self.class(&src.vg_name)?;
        if class.shared().is_some() {
            return self.snapshot_shared(req, &src, &lv_name, &source).await;
        }
        let Some(pool) = &class.thin_pool() else {
            return Err(BackendError::InvalidArgument(format!(
                "volume {} is in device class {}, which is thick: snapshots need a thin device class",
                req.source_volume, class.name
            )));
        };
        let _queued = self.lock_vg(&class.name).await?;
        let report = self.report().await?;
        if let Some(lv) = report.find(&lv_name) {
            return self.adopt(lv, &req.name);
        }
        let report = self.changeable_report(class).await?;
        let src = report
            .lv(&class.name, &req.source_volume)
            .filter(|lv| is_ours(lv))
            .ok_or_else(|| self.source_not_found(&source))?;
        if src.segtype != THIN {
            return Err(BackendError::InvalidArgument(format!(
                "volume {} is not a thin volume of pool {}/{pool}: snapshots need a thin volume",
                req.source_volume, class.name
            )));
        }
        self.check_thin_space(&report, class, src.size)?;
        let tags = self.snapshot_tags(req, &source);
        self.create_or_adopt(
            self.lvm
                .thin_snapshot(&class.name, &req.source_volume, &lv_name, true, &tags),
            &class.name,
            &lv_name,
            &req.name,
        )
        .await
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn delete(&self, id: &str) -> Result<bool> {
        if !is_our_id(id) {
            return Ok(false);
        }
        let mut report = self.report().await?;
        if report.find(id).is_none() {
            // Not in the report: make sure with a fresh one.
            report = self.fresh_report().await?;
        }
        let Some(vg) = report.find(id).map(|lv| lv.vg_name.clone()) else {
            tracing::debug!(volume_id = id, "nothing to delete");
            return Ok(false);
        };
        let shared_pool = report
            .find(id)
            .and_then(|lv| lv.pool_lv.clone())
            .filter(|_| self.class(&vg).is_ok_and(|c| c.shared().is_some()));
        let _queued = self.lock_vg(&vg).await?;
        // The removal looks at the LV itself first: never remove an LV that is not ours.
        match self
            .mutate(self.lvm.lv_remove_tagged(&vg, id, ids::OWNER_TAG))
            .await
            .map_err(shared::in_use_elsewhere(id, "delete"))?
        {
            Removal::Removed => {}
            Removal::Missing => {
                self.cache.invalidate();
                return Ok(false);
            }
            Removal::Refused(_) => {
                return Err(BackendError::NotFound(format!(
                    "logical volume {vg}/{id} on node {} does not carry the tag {}: not a volume of \
                     this driver, left alone",
                    self.node_id,
                    ids::OWNER_TAG
                )));
            }
        }
        tracing::info!(volume_id = id, device_class = %vg, "deleted");
        if let Some(pool) = &shared_pool {
            self.drop_pool_if_empty(&vg, pool).await;
        }
        // A thin pool's data usage falls, a thick volume group's free space grows.
        let pool = self.class(&vg)?.thin_pool().map(str::to_owned);
        let changed = Changed {
            lvs: pool.as_deref().into_iter().collect(),
            removed: Some(id),
            vg: pool.is_none(),
        };
        if let Err(e) = self.patch(&vg, changed).await {
            tracing::warn!(volume_id = id, error = %e, "could not read back after deleting; the next read takes a full report");
        }
        Ok(true)
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        let missing = || {
            BackendError::NotFound(format!(
                "volume {id} does not exist on node {}",
                self.node_id
            ))
        };
        if !ids::is_volume_id(id) && !ids::is_taken_over_id(id) {
            return Err(missing());
        }
        let lv = self
            .locate(id)
            .await?
            .filter(|lv| !has_tag(lv, ids::SNAPSHOT_TAG))
            .ok_or_else(missing)?;
        let class = self.class(&lv.vg_name)?;
        let _queued = self.lock_vg(&class.name).await?;
        let report = self.report().await?;
        let lv = report
            .lv(&class.name, id)
            .filter(|lv| is_ours(lv))
            .ok_or_else(missing)?;
        let extent = self.extent_size(&report, &class.name)?;
        let size = self.round(size, extent)?;
        if size <= lv.size {
            return Ok(lv.size);
        }
        self.refuse_partial(&report, class)?;
        if class.shared().is_some() {
            if let Some(pool) = lv.pool_lv.as_deref() {
                let fresh = self.fresh_report().await?;
                self.cover(&fresh, &class.name, pool, size - lv.size)
                    .await?;
            }
            self.mutate(self.lvm.lv_extend(&class.name, id, size))
                .await
                .map_err(shared::in_use_elsewhere(id, "grow"))?;
            return Ok(self.read_back(&class.name, id).await?.size);
        }
        if class.thin_pool().is_some() {
            self.check_thin_space(&report, class, size - lv.size)?;
        }
        Ok(self.grow(&class.name, id, size).await?.size)
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn capacity(&self, class: &str, layout: &Layout) -> Result<Capacity> {
        let class = self.class(class)?;
        let report = self.converged_report(class).await?;
        let extent = self.extent_size(&report, &class.name)?;
        let minimum_volume_size = min_volume_size(extent);
        if Self::is_partial(&report, class) {
            // Nothing can be made in it until it is repaired: no node is picked for it.
            return Ok(Capacity {
                available: 0,
                maximum_volume_size: 0,
                minimum_volume_size,
                devices: None,
            });
        }
        // `converged_report` made sure the volume group (and a thin class's pool) exist.
        let available = match report.pool(class) {
            Some(pool) => {
                let usage =
                    ThinPoolUsage::from_lvs(pool, report.lvs(), class.overprovision_ratio());
                thin_capacity(&usage).available
            }
            None if class.shared().is_some() || *layout == Layout::Linear => {
                report.vg(&class.name).map_or(0, thick_available)
            }
            // A thick layout other than linear: what fits device by device.
            None => {
                let free = self.free_space_in(&report, class).await?;
                let largest = layout.max_size(&free);
                return Ok(Capacity {
                    available: largest,
                    maximum_volume_size: largest,
                    minimum_volume_size,
                    devices: Some(free.devices()),
                });
            }
        };
        // A shared thin volume brings its own pool: its metadata (and LVM's spare) come off the top.
        if class.makes_thin() && class.thin_pool().is_none() {
            let largest = shared::max_thin_volume(available, extent);
            return Ok(Capacity {
                available: largest,
                maximum_volume_size: largest,
                minimum_volume_size,
                devices: None,
            });
        }
        Ok(Capacity {
            available,
            maximum_volume_size: max_volume_size(available, extent),
            minimum_volume_size,
            devices: None,
        })
    }

    async fn free_space(&self, class: &str) -> Result<Option<FreeSpace>> {
        let class = self.class(class)?;
        if class.thin_pool().is_some() || class.shared().is_some() {
            return Ok(None);
        }
        let report = self.converged_report(class).await?;
        self.free_space_in(&report, class).await.map(Some)
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn take_over(&self, req: &TakeOver) -> Result<Volume> {
        if !ids::is_taken_over_id(&req.id) {
            return Err(BackendError::InvalidArgument(format!(
                "{} is not a volume id another driver hands out (TopoLVM's and LVMS's are UUIDs, \
                 csi-driver-lvm's pvc-<UUID>): nothing to take over",
                req.id
            )));
        }
        let class = self.class(&req.class)?;
        let csi_driver_lvm = ids::is_csi_driver_lvm_id(&req.id);
        if csi_driver_lvm && class.adopt != Some(Adopt::CsiDriverLvm) {
            return Err(BackendError::Conflict(format!(
                "{} is a csi-driver-lvm volume id and device class {} does not adopt csi-driver-lvm: \
                 nothing is taken over; set adopt: csi-driver-lvm on the class that holds its group",
                req.id, class.name
            )));
        }
        if class.shared().is_some() {
            return Err(BackendError::InvalidArgument(format!(
                "device class {} is shared: its volumes are lvms-rs's own, none is taken over",
                class.name
            )));
        }
        let _queued = self.lock_vg(&class.name).await?;
        // The cached report, and a fresh one on a miss: an agent starting over many of them takes
        // one report, not one each.
        let mut report = self.report().await?;
        if report.lv(&class.name, &req.id).is_none() {
            report = self.fresh_report().await?;
        }
        let Some(lv) = report.lv(&class.name, &req.id) else {
            return Err(BackendError::NotFound(format!(
                "logical volume {}/{} that {} records does not exist on node {}: nothing is taken \
                 over; restore the LV, or delete the object if its data is gone",
                class.name, req.id, req.name, self.node_id
            )));
        };
        if is_ours(lv) {
            return Ok(to_volume(lv));
        }
        let attr = LvAttr::parse(&lv.attr).map_err(|e| {
            BackendError::Conflict(format!(
                "logical volume {}/{} reports lv_attr {:?} ({e}): not taken over",
                class.name, req.id, lv.attr
            ))
        })?;
        let shape = if csi_driver_lvm {
            csi_driver_lvm_shape(lv, &attr)
        } else {
            topolvm_shape(class, lv, &attr)
        }
        .and_then(|()| {
            let writable = matches!(
                attr.permissions,
                Permissions::Writeable | Permissions::ReadOnlyActivation
            );
            match (req.snapshot, writable) {
                (true, true) => {
                    Err("it is writable, and the object says it is a read-only snapshot".to_owned())
                }
                (false, false) => {
                    Err("it is read-only, and the object says it is a volume".to_owned())
                }
                _ => Ok(()),
            }
        });
        if let Err(why) = shape {
            return Err(BackendError::Conflict(format!(
                "logical volume {}/{} does not match {}: {why}; nothing is taken over, the LV and the \
                 object are left as they are",
                class.name, req.id, req.name
            )));
        }
        let mut tags = vec![ids::OWNER_TAG.to_owned(), ids::name_tag(&req.name)];
        if req.snapshot {
            tags.push(ids::SNAPSHOT_TAG.to_owned());
        }
        if let Some(source) = &req.source {
            tags.push(source.tag());
        }
        if let Some(created) = req.created {
            tags.push(ids::created_tag(created));
        }
        self.mutate(self.lvm.lv_add_tags(&class.name, &req.id, &tags))
            .await
            .map_err(host)?;
        self.read_back(&class.name, &req.id).await
    }

    async fn usage(&self, class: &str) -> Result<Option<Usage>> {
        let class = self.class(class)?;
        let report = self.report().await?;
        let Some(vg) = report.vg(&class.name) else {
            return Ok(None);
        };
        let pool = report.pool(class).map(|pool| {
            let usage = ThinPoolUsage::from_lvs(pool, report.lvs(), class.overprovision_ratio());
            PoolUsage {
                size: pool.size,
                data_percent: pool.data_percent,
                metadata_percent: pool.metadata_percent,
                overprovisioned_available: thin_capacity(&usage).available,
            }
        });
        Ok(Some(Usage {
            vg_size: vg.size,
            vg_free: vg.free,
            pool,
        }))
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn activate_for(&self, id: &str, multi_node: bool) -> Result<String> {
        let lv = self.locate(id).await?.ok_or_else(|| {
            BackendError::NotFound(format!(
                "volume or snapshot {id} does not exist on node {}",
                self.node_id
            ))
        })?;
        if self.class(&lv.vg_name)?.shared().is_some() {
            return self.activate_shared(&lv, multi_node).await;
        }
        if multi_node {
            return Err(BackendError::InvalidArgument(format!(
                "volume {id} lives on node {}: MULTI_NODE_* access needs a block volume of a shared \
                 device class",
                self.node_id
            )));
        }
        self.activate(id).await
    }

    async fn joined_shared(&self) -> Vec<String> {
        let Ok(report) = self.report().await else {
            return Vec::new();
        };
        self.classes
            .iter()
            .filter(|c| c.shared().is_some() && report.vg(&c.name).is_some())
            .map(|c| c.name.clone())
            .collect()
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn release(&self, id: &str) -> Result<()> {
        let Some(lv) = self.locate(id).await? else {
            return Ok(());
        };
        if self.class(&lv.vg_name)?.shared().is_none() {
            return Ok(());
        }
        self.release_shared(&lv).await
    }

    #[tracing::instrument(skip(self), fields(node = %self.node_id))]
    async fn activate(&self, id: &str) -> Result<String> {
        let missing = || {
            BackendError::NotFound(format!(
                "volume or snapshot {id} does not exist on node {}",
                self.node_id
            ))
        };
        if !is_our_id(id) {
            return Err(missing());
        }
        let lv = self.locate(id).await?.ok_or_else(missing)?;
        let _queued = self.lock_vg(&lv.vg_name).await?;
        self.mutate(self.lvm.lv_activate(&lv.vg_name, id, true))
            .await
            .map_err(host)?;
        // The LV's attributes changed (active now).
        self.read_back_lv(&lv.vg_name, id, "activating").await;
        Ok(format!("/dev/{}/{id}", lv.vg_name))
    }

    async fn allocated(&self, id: &str) -> Result<BlockRanges> {
        self.allocated_ranges(id).await
    }

    async fn changed(&self, base: &str, target: &str) -> Result<BlockRanges> {
        self.changed_ranges(base, target).await
    }
}

mod metadata;
mod report;
mod shared;

#[cfg(test)]
mod tests;
