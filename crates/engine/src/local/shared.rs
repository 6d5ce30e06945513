//! Volumes of shared classes (one volume group on a LUN that several nodes see, under lvmlockd).
//!
//! - **Linear** volumes are made inactive and activated where they are staged: exclusively (`ey`) for
//!   one node, shared (`sy`) for MULTI_NODE_* block volumes. With `wipePolicy: Full` a new volume
//!   carries [`ids::UNWIPED_TAG`] and is zeroed at its first stage, in chunks ([`zero_chunk`]): after
//!   each chunk is zeroed and flushed, [`ids::WIPED_TO_TAG_PREFIX`] on the LV records how far, so a
//!   stage after a crash resumes there ([`next_zero_range`]).
//! - **Thin** volumes get a thin pool each (`pool-<digest>`, [`pool_name`]), because lvmlockd locks a
//!   thin pool, not its thin volumes: every thin volume of a pool is active on the same node. Snapshots
//!   and clones of a volume live in its pool. The pool's data is kept at least the sum of its thin
//!   volumes' virtual sizes ([`LocalBackend::cover`]), so the pool can never run full (autoextend would
//!   only run on the node where the pool is active), and pools zero new blocks (`--zero y`): a thin
//!   volume never shows a previous tenant's data, so `wipePolicy` does not apply to it. A new pool and
//!   volume are left inactive; the staging node activates both exclusively, unstage deactivates both.

use std::sync::Arc;

use lvms_core::{
    lvattr::LvAttr,
    model::LogicalVolume,
    shared::fencing::Timing,
    size::{GIB, MIB, round_up_to_extent},
};
use lvms_host::{
    devices::{flush, zero_range},
    lvm::{Activation, PoolSize, ThinPoolSpec},
    runner::Runner,
    sanlock::{self, LockspaceTiming},
};

use super::{Bytes, LocalBackend, Report, THIN, THIN_POOL, has_tag, host, is_ours};
use crate::{
    backend::{BackendError, DeviceClassConfig, NewSnapshot, Result, Source, Volume},
    ids,
};

fn is_active(lv: &LogicalVolume) -> bool {
    LvAttr::parse(&lv.attr).is_ok_and(|a| a.is_active())
}

/// Chunk size of a shared thin volume's pool.
const POOL_CHUNK: u64 = 64 * 1024;
/// Smallest metadata of a shared thin volume's pool.
const MIN_POOL_METADATA: u64 = 4 * 1024 * 1024;
/// LVM's largest thin pool metadata (15.81 GiB), rounded down.
const MAX_POOL_METADATA: u64 = 15 * 1024 * 1024 * 1024;

/// How often a stage of a volume another node holds tries again ([`LocalBackend::activate_shared`]).
pub const STAGE_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

/// The smallest chunk a new volume is zeroed in.
const MIN_ZERO_CHUNK: u64 = GIB;
/// A volume larger than 32 GiB is zeroed in about this many chunks.
const ZERO_CHUNKS: u64 = 32;
/// Chunks, and a resumed zeroing's start, are whole MiB: a multiple of every sector size, which
/// `blkdiscard --offset/--length` needs.
const ZERO_ALIGN: u64 = MIB;

/// The chunk a volume of `size` bytes is zeroed in: a 32nd of it, at least 1 GiB, in whole MiB.
/// After each chunk the progress is written to the LV's tags, one `lvchange` (a VG metadata write
/// under the shared VG lock, taken from every node) per chunk: at most about 32 of them per volume,
/// however large, while a crash repeats at most one chunk, 1 GiB (a few seconds) for a small volume
/// and 1/32 of the work for a large one.
pub(super) fn zero_chunk(size: u64) -> u64 {
    let chunk = (size / ZERO_CHUNKS).max(MIN_ZERO_CHUNK);
    chunk.div_ceil(ZERO_ALIGN).saturating_mul(ZERO_ALIGN)
}

/// The next range to zero, `(offset, length)`, of a volume of `size` bytes of which the first
/// `done` are zeroed, in chunks of `chunk` bytes; `None` when nothing is left. A `done` off the MiB
/// grid (a record not written by [`zero_chunk`]'s chunks) is rounded down: the range may zero
/// some bytes again, never skip one.
pub(super) fn next_zero_range(size: u64, done: u64, chunk: u64) -> Option<(u64, u64)> {
    if done >= size {
        return None;
    }
    let offset = done - done % ZERO_ALIGN;
    Some((offset, chunk.max(ZERO_ALIGN).min(size - offset)))
}

/// The thin pool of the shared class's thin volume `id` (`csi-<digest>` → `pool-<digest>`).
pub(super) fn pool_name(id: &str) -> String {
    format!("pool-{}", id.strip_prefix(ids::VOLUME_PREFIX).unwrap_or(id))
}

/// The metadata size given to a shared thin pool of `data` bytes: twice what 64 KiB chunks need (64
/// bytes per chunk), at least 4 MiB, in whole extents.
pub(super) fn pool_metadata(data: u64, extent: u64) -> u64 {
    let want = (data / (POOL_CHUNK / 64) * 2).clamp(MIN_POOL_METADATA, MAX_POOL_METADATA);
    round_up_to_extent(want, extent).unwrap_or(want)
}

/// What a new pool for a volume of `size` costs in the volume group: data, metadata, and LVM's
/// spare metadata volume (`lvol0_pmspare`, as large as the largest pool metadata).
pub(super) fn new_pool_cost(size: u64, extent: u64) -> u64 {
    size.saturating_add(pool_metadata(size, extent).saturating_mul(2))
}

/// The largest thin volume a new pool can hold in `free` bytes.
pub(super) fn max_thin_volume(free: u64, extent: u64) -> u64 {
    let guess = free.saturating_sub(pool_metadata(free, extent).saturating_mul(2));
    lvms_core::capacity::max_volume_size(guess, extent)
}

impl<R: Runner> LocalBackend<R> {
    /// Makes the thin volume `lv_name` of a shared class in a pool of its own, both left inactive.
    /// A crash after the pool was made finds and reuses it. Without a `fresh` report (one taken in
    /// this node's queue for the group) the group is read afresh: other nodes change it.
    pub(super) async fn create_shared_thin(
        &self,
        fresh: Option<Arc<Report>>,
        class: &DeviceClassConfig,
        lv_name: &str,
        name: &str,
        size: u64,
        tags: &[String],
    ) -> Result<Volume> {
        let vg = class.name.as_str();
        let pool = pool_name(lv_name);
        let report = match fresh {
            Some(report) => report,
            None => self.fresh_report().await?,
        };
        let extent = self.extent_size(&report, vg)?;
        if report.lv(vg, &pool).is_none() {
            let free = report.vg(vg).map_or(0, |v| v.free);
            let cost = new_pool_cost(size, extent);
            if cost > free {
                return Err(BackendError::InsufficientSpace(format!(
                    "shared volume group {vg} has {} free: a thin volume of {} needs {} with its own \
                     thin pool's metadata",
                    Bytes(free),
                    Bytes(size),
                    Bytes(cost)
                )));
            }
            let spec = ThinPoolSpec {
                vg: vg.to_owned(),
                name: pool.clone(),
                size: PoolSize::Bytes(size),
                chunk_size: Some(POOL_CHUNK),
                metadata_size: Some(pool_metadata(size, extent)),
                zero: true,
            };
            // Pool and volume in one command, both left inactive. LVM gives its tags to the pool
            // alone: the owner tag there, the volume's own next.
            match self
                .mutate(self.lvm.thin_lv_create_with_pool(
                    &spec,
                    lv_name,
                    size,
                    &[ids::OWNER_TAG.to_owned()],
                ))
                .await
            {
                Ok(()) => {
                    self.mutate(self.lvm.lv_add_tags(vg, lv_name, tags))
                        .await
                        .map_err(host)?;
                    return self.read_back(vg, lv_name).await;
                }
                Err(lvms_host::Error::AlreadyExists(_)) => {
                    return self.finish_shared_thin(vg, lv_name, name, tags).await;
                }
                Err(e) => return Err(host(e)),
            }
        }
        if report.lv(vg, lv_name).is_some() {
            return self.finish_shared_thin(vg, lv_name, name, tags).await;
        }
        // The pool is there without the volume: a crash (or an older lvms) made it alone. Tagged
        // again (an older lvms tagged a pool after making it), then the volume made in it.
        self.mutate(self.lvm.lv_add_tag(vg, &pool, ids::OWNER_TAG))
            .await
            .map_err(host)?;
        let vol = self
            .create_or_adopt(
                self.lvm.thin_lv_create(vg, &pool, lv_name, size, tags),
                vg,
                lv_name,
                name,
            )
            .await?;
        self.park(vg, Some(lv_name), &pool).await;
        Ok(vol)
    }

    /// The thin volume `lv_name` found made already: adopted, after it gets its tags when it has none
    /// and sits in its own pool carrying the owner tag (a crash came between the combined create and
    /// the tagging).
    pub(super) async fn finish_shared_thin(
        &self,
        vg: &str,
        lv_name: &str,
        name: &str,
        tags: &[String],
    ) -> Result<Volume> {
        let report = self.fresh_report().await?;
        let pool = pool_name(lv_name);
        let Some(lv) = report.lv(vg, lv_name) else {
            return Err(BackendError::Conflict(format!(
                "thin pool {vg}/{pool} exists without its volume {lv_name}: retry"
            )));
        };
        let own_pool = report
            .lv(vg, &pool)
            .is_some_and(|p| p.tags.iter().any(|t| t == ids::OWNER_TAG));
        if lv.tags.is_empty() && lv.pool_lv.as_deref() == Some(pool.as_str()) && own_pool {
            self.mutate(self.lvm.lv_add_tags(vg, lv_name, tags))
                .await
                .map_err(host)?;
            return self.read_back(vg, lv_name).await;
        }
        self.adopt(lv, name)
    }

    /// Deactivates `lv` (if given) and then `pool` on this node, so that another node may activate
    /// them; failures (the pool still holds an active volume here) are logged and left.
    pub(super) async fn park(&self, vg: &str, lv: Option<&str>, pool: &str) {
        for name in lv.into_iter().chain([pool]) {
            if let Err(e) = self.mutate(self.lvm.lv_deactivate(vg, name)).await {
                tracing::debug!(lv = name, error = %e, "left active on this node");
            }
        }
    }

    /// Grows the shared thin `pool` (data and metadata) to hold `extra` more bytes beside the
    /// virtual sizes of the thin volumes in it now.
    pub(super) async fn cover(
        &self,
        report: &Report,
        vg: &str,
        pool: &str,
        extra: u64,
    ) -> Result<()> {
        let extent = self.extent_size(report, vg)?;
        let current = report
            .lv(vg, pool)
            .filter(|lv| lv.segtype == THIN_POOL)
            .ok_or_else(|| {
                BackendError::NotFound(format!("thin pool {vg}/{pool} does not exist"))
            })?;
        let promised: u64 = report
            .lvs()
            .filter(|lv| lv.vg_name == vg && lv.pool_lv.as_deref() == Some(pool))
            .map(|lv| lv.size)
            .sum();
        let target = self.round(promised.saturating_add(extra), extent)?;
        if current.size >= target {
            return Ok(());
        }
        let metadata = pool_metadata(target, extent);
        let more = (target - current.size)
            + metadata.saturating_sub(current.metadata_size.unwrap_or(metadata));
        let free = report.vg(vg).map_or(0, |v| v.free);
        if more > free {
            return Err(BackendError::InsufficientSpace(format!(
                "thin pool {vg}/{pool} must grow by {} to hold {} more, and shared volume group {vg} \
                 has {} free",
                Bytes(more),
                Bytes(extra),
                Bytes(free)
            )));
        }
        self.mutate(self.lvm.thin_pool_extend(vg, pool, target))
            .await
            .map_err(in_use_elsewhere(pool, "grow"))?;
        self.mutate(self.lvm.thin_pool_metadata_extend(vg, pool, metadata))
            .await
            .map_err(in_use_elsewhere(pool, "grow"))?;
        Ok(())
    }

    /// Removes the shared thin pool of a removed thin volume when nothing is left in it, or parks it.
    pub(super) async fn drop_pool_if_empty(&self, vg: &str, pool: &str) {
        match self
            .mutate(self.lvm.thin_pool_remove_tagged(vg, pool, ids::OWNER_TAG))
            .await
        {
            Ok(lvms_host::lvm::Removal::Removed) => {
                tracing::info!(pool, "removed the emptied thin pool");
            }
            Ok(_) => {}
            Err(lvms_host::Error::InUse(_)) => self.park(vg, None, pool).await,
            Err(e) => tracing::warn!(pool, error = %e, "could not remove the emptied thin pool"),
        }
    }

    /// A snapshot of the shared class's thin volume `src`, in its pool, which grows to hold it.
    pub(super) async fn snapshot_shared(
        &self,
        req: &NewSnapshot,
        src: &LogicalVolume,
        lv_name: &str,
        source: &Source,
    ) -> Result<Volume> {
        let vg = src.vg_name.as_str();
        let pool = match (src.segtype.as_str(), src.pool_lv.as_deref()) {
            (THIN, Some(pool)) => pool,
            _ => {
                return Err(BackendError::InvalidArgument(format!(
                    "volume {} of shared device class {vg} is linear: snapshots need a thin volume \
                     (volume mode thin)",
                    src.name
                )));
            }
        };
        let _queued = self.lock_vg(vg).await?;
        let report = self.fresh_report().await?;
        if let Some(lv) = report.find(lv_name) {
            return self.adopt(lv, &req.name);
        }
        self.cover(&report, vg, pool, src.size).await?;
        let tags = self.snapshot_tags(req, source);
        let snap = self
            .create_or_adopt(
                self.lvm.thin_snapshot(vg, &src.name, lv_name, true, &tags),
                vg,
                lv_name,
                &req.name,
            )
            .await
            .map_err(|e| match e {
                BackendError::Host(h) => in_use_elsewhere(&src.name, "snapshot")(h),
                other => other,
            })?;
        // lvcreate activated the pool here if it was not: leave it free for the staging node.
        if !report.lv(vg, &src.name).is_some_and(is_active) {
            self.park(vg, None, pool).await;
        }
        Ok(snap)
    }

    /// Activates a shared class's volume for this stage: exclusively (`ey`) for one node, shared
    /// (`sy`) for several (linear only: a thin volume's pool is active on one node). A volume still
    /// carrying [`ids::UNWIPED_TAG`] is zeroed first, exclusively, then the tag removed (a crash in
    /// between resumes at the next stage from the last chunk recorded, [`Self::zero_unwiped`]). The
    /// LV is read afresh: another node may have changed it since the cached report.
    ///
    /// While another node holds the volume the stage waits, trying again every [`STAGE_RETRY`], for
    /// at most the backend's shared stage wait ([`LocalBackend::with_shared_stage_wait`]), out of
    /// this node's queue for the group between tries: a dead node's lock is freed by sanlock at its
    /// host-dead time, and a stage that waits for it is not left to kubelet's backoff. After the
    /// wait the refusal is FAILED_PRECONDITION, saying why, how long it waited and when the lock is
    /// freed.
    pub(super) async fn activate_shared(
        &self,
        lv: &LogicalVolume,
        multi_node: bool,
    ) -> Result<String> {
        let id = lv.name.as_str();
        let started = tokio::time::Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let waited = started.elapsed();
            match self.try_activate_shared(lv, multi_node).await {
                Err(BackendError::Conflict(m))
                    if waited + STAGE_RETRY <= self.shared_stage_wait =>
                {
                    if tries == 1 {
                        tracing::info!(
                            volume_id = id,
                            wait_s = self.shared_stage_wait.as_secs(),
                            reason = %m,
                            "another node holds the volume: the stage waits for its lock"
                        );
                        if let Some(waits) = &self.stage_waits {
                            let why = self.refusal(&lv.vg_name, id, &m).await;
                            let _ = waits.send(super::StageWait {
                                volume_id: id.to_owned(),
                                message: format!(
                                    "NodeStage waits up to {} s for the volume's lock: {why}",
                                    self.shared_stage_wait.as_secs()
                                ),
                            });
                        }
                    }
                    tokio::time::sleep(STAGE_RETRY).await;
                }
                Err(BackendError::Conflict(held)) => {
                    let m = self.refusal(&lv.vg_name, id, &held).await;
                    return Err(BackendError::Conflict(if tries > 1 {
                        format!(
                            "{m} (this stage waited {} s, {tries} tries)",
                            waited.as_secs()
                        )
                    } else {
                        m
                    }));
                }
                other => return other,
            }
        }
    }

    /// Why the stage of `vg/id` is refused (LVM said `held`), with when the lock can be had
    /// ([`conflict_message`], from what sanlock says here).
    async fn refusal(&self, vg: &str, id: &str, held: &str) -> String {
        let configured = self
            .class(vg)
            .ok()
            .and_then(DeviceClassConfig::shared)
            .map_or(lvms_core::config::DEFAULT_IO_TIMEOUT_SECONDS, |s| {
                s.io_timeout_seconds
            });
        let timing = sanlock::observe_timing(self.lvm.runner(), vg).await;
        conflict_message(id, held, configured, &timing)
    }

    /// One try of [`Self::activate_shared`].
    async fn try_activate_shared(&self, lv: &LogicalVolume, multi_node: bool) -> Result<String> {
        let (vg, id) = (lv.vg_name.as_str(), lv.name.as_str());
        let _queued = self.lock_vg(vg).await?;
        let device = format!("/dev/{vg}/{id}");
        let fresh = self
            .mutate(self.lvm.lv(vg, id))
            .await
            .map_err(host)?
            .filter(is_ours)
            .ok_or_else(|| {
                BackendError::NotFound(format!("volume {id} no longer exists in {vg}"))
            })?;
        if multi_node && fresh.segtype == THIN {
            return Err(BackendError::InvalidArgument(format!(
                "volume {id} of device class {vg} is thin: its thin pool is active on one node at a \
                 time; MULTI_NODE_* access needs a linear volume of a shared class"
            )));
        }
        if has_tag(&fresh, ids::UNWIPED_TAG) {
            self.mutate(self.lvm.lv_activate_shared(vg, id, Activation::Exclusive))
                .await
                .map_err(held_elsewhere)?;
            self.zero_unwiped(&fresh, &device).await?;
            if multi_node {
                self.mutate(self.lvm.lv_deactivate(vg, id))
                    .await
                    .map_err(host)?;
            }
        } else {
            self.drop_stale_wipe_records(&fresh).await;
        }
        let how = if multi_node {
            Activation::Shared
        } else {
            Activation::Exclusive
        };
        self.mutate(self.lvm.lv_activate_shared(vg, id, how))
            .await
            .map_err(held_elsewhere)?;
        self.read_back_lv(vg, id, "activating").await;
        Ok(device)
    }

    /// Zeroes the new volume `lv`, active exclusively here (so no other node writes it), from where
    /// its [`ids::WIPED_TO_TAG_PREFIX`] record says an earlier stage got, chunk by chunk, then removes
    /// [`ids::UNWIPED_TAG`] and the record. Each chunk is flushed before it is recorded, so the record
    /// never claims more than is zeroed; the new record is added before the old one is removed, so a
    /// crash in between leaves two, of which the larger counts. The last chunk is not recorded:
    /// removing [`ids::UNWIPED_TAG`] says it. A record left by a crash after that is removed at the
    /// next stage ([`Self::drop_stale_wipe_records`]).
    async fn zero_unwiped(&self, lv: &LogicalVolume, device: &str) -> Result<()> {
        let (vg, id) = (lv.vg_name.as_str(), lv.name.as_str());
        let mut records: Vec<String> = lv
            .tags
            .iter()
            .filter(|t| t.starts_with(ids::WIPED_TO_TAG_PREFIX))
            .cloned()
            .collect();
        let chunk = zero_chunk(lv.size);
        let mut done = ids::wiped_to_from_tags(&lv.tags).unwrap_or(0);
        tracing::info!(
            volume_id = id,
            from = done,
            size = lv.size,
            chunk,
            "zeroing a new volume of a shared class before first use"
        );
        while let Some((offset, length)) = next_zero_range(lv.size, done, chunk) {
            self.mutate(zero_range(self.lvm.runner(), device, offset, length))
                .await
                .map_err(host)?;
            done = offset + length;
            if done >= lv.size {
                break;
            }
            self.mutate(flush(self.lvm.runner(), device))
                .await
                .map_err(host)?;
            let record = ids::wiped_to_tag(done);
            self.mutate(self.lvm.lv_add_tag(vg, id, &record))
                .await
                .map_err(host)?;
            for old in std::mem::replace(&mut records, vec![record]) {
                self.mutate(self.lvm.lv_del_tag(vg, id, &old))
                    .await
                    .map_err(host)?;
            }
            tracing::debug!(volume_id = id, done, size = lv.size, "zeroed so far");
        }
        self.mutate(flush(self.lvm.runner(), device))
            .await
            .map_err(host)?;
        self.mutate(self.lvm.lv_del_tag(vg, id, ids::UNWIPED_TAG))
            .await
            .map_err(host)?;
        for old in records {
            self.mutate(self.lvm.lv_del_tag(vg, id, &old))
                .await
                .map_err(host)?;
        }
        Ok(())
    }

    /// Removes the [`ids::WIPED_TO_TAG_PREFIX`] records of a zeroed volume, which a crash right
    /// after its [`ids::UNWIPED_TAG`] was removed leaves; a failure is logged and left for the next
    /// stage (the records mean nothing without [`ids::UNWIPED_TAG`]).
    async fn drop_stale_wipe_records(&self, lv: &LogicalVolume) {
        let (vg, id) = (lv.vg_name.as_str(), lv.name.as_str());
        for record in lv
            .tags
            .iter()
            .filter(|t| t.starts_with(ids::WIPED_TO_TAG_PREFIX))
        {
            if let Err(e) = self.mutate(self.lvm.lv_del_tag(vg, id, record)).await {
                tracing::warn!(volume_id = id, error = %e, "could not remove a stale zeroing record");
            }
        }
    }

    /// Unstage of a shared class's volume: deactivates it (and a thin volume's pool), so another
    /// node may activate it.
    pub(super) async fn release_shared(&self, lv: &LogicalVolume) -> Result<()> {
        let (vg, id) = (lv.vg_name.as_str(), lv.name.as_str());
        let _queued = self.lock_vg(vg).await?;
        self.mutate(self.lvm.lv_deactivate(vg, id))
            .await
            .map_err(host)?;
        if let Some(pool) = lv.pool_lv.as_deref() {
            self.park(vg, None, pool).await;
        }
        self.read_back_lv(vg, id, "deactivating").await;
        tracing::info!(volume_id = id, "deactivated: another node may use it now");
        Ok(())
    }
}

/// An activation refused because another node holds the volume: FAILED_PRECONDITION at the node,
/// which kubelet retries (its event carries this text). If that node is dead, the retry succeeds
/// once sanlock's host-dead time has passed.
/// An activation refused because another node holds the lock: CONFLICT with LVM's words (the stage
/// waits and tries again, or says why it gives up: [`LocalBackend::activate_shared`]); any other
/// failure as it is.
fn held_elsewhere(e: lvms_host::Error) -> BackendError {
    match e {
        lvms_host::Error::InUse(held) => BackendError::Conflict(held),
        other => host(other),
    }
}

/// The refusal of a stage because another node holds volume `id` (LVM's words `held`), with when
/// the lock can be had: for a node that stopped renewing its lease, the seconds left as this node
/// counts them; otherwise the host-dead time at the io timeout sanlock keeps here (`timing.io_timeout`,
/// else the class's `configured` one).
fn conflict_message(id: &str, held: &str, configured: u16, timing: &LockspaceTiming) -> String {
    let start = format!("volume {id} is in use on another node ({held}): unstage it there first");
    let dying: Vec<String> = timing
        .hosts
        .iter()
        .filter_map(|h| {
            h.frees_in().map(|(silent, left)| {
                format!(
                    "host {} stopped renewing its lease {silent} s ago as this node counts, and \
                     sanlock frees its locks in {left} s",
                    h.host_id
                )
            })
        })
        .collect();
    if !dying.is_empty() {
        return format!("{start}; {}: a retry succeeds then", dying.join("; "));
    }
    let kept = Timing::new(timing.io_timeout.unwrap_or(u32::from(configured)));
    format!(
        "{start}; if that node is dead, sanlock frees its lock {} s after this node last saw its \
         lease renewed ({} s io timeout; a node that joined the lockspace after the death counts \
         from its join), and a retry succeeds then",
        kept.host_dead_seconds(),
        kept.io_timeout
    )
}

/// A change refused because the LV (or its pool) is active on another node, or on several:
/// FAILED_PRECONDITION at the controller, with the fix.
pub(super) fn in_use_elsewhere<'a>(
    what: &'a str,
    doing: &'a str,
) -> impl FnOnce(lvms_host::Error) -> BackendError + 'a {
    move |e| match e {
        lvms_host::Error::InUse(m) => BackendError::Host(lvms_host::Error::InUse(format!(
            "{what} is active on another node or on several nodes ({m}): {doing} it through the \
             driver of the one node that has it staged, or unstage it on the other nodes first"
        ))),
        other => host(other),
    }
}

#[cfg(test)]
mod tests {
    use lvms_core::config::{SharedConfig, SharedVolumeMode};
    use lvms_host::{
        fake::FakeRunner,
        lvm::{LV_FIELDS, Lvm, group_fields},
    };
    use proptest::prelude::*;

    use super::*;
    use crate::backend::Backend as _;

    #[test]
    fn zeroing_chunks_are_a_32nd_of_the_volume_at_least_1_gib_in_whole_mib() {
        assert_eq!(zero_chunk(0), GIB);
        assert_eq!(zero_chunk(100 * MIB), GIB);
        assert_eq!(zero_chunk(32 * GIB), GIB);
        assert_eq!(zero_chunk(100 * GIB), 3200 * MIB);
        // 1/32 of 100 GiB + 4 MiB is not whole MiB: rounded up.
        assert_eq!(zero_chunk(100 * GIB + 4 * MIB), 3201 * MIB);
        assert_eq!(zero_chunk(u64::MAX) % MIB, 0);
    }

    #[test]
    fn the_next_zero_range_starts_at_the_record_and_stops_at_the_end() {
        // Fresh, then resumed after one chunk, then the short last chunk, then nothing.
        assert_eq!(next_zero_range(3 * GIB, 0, GIB), Some((0, GIB)));
        assert_eq!(next_zero_range(3 * GIB, GIB, GIB), Some((GIB, GIB)));
        assert_eq!(
            next_zero_range(2 * GIB + 4 * MIB, 2 * GIB, GIB),
            Some((2 * GIB, 4 * MIB))
        );
        assert_eq!(next_zero_range(3 * GIB, 3 * GIB, GIB), None);
        // A record beyond the end (the volume cannot shrink; a hand-set tag) is done.
        assert_eq!(next_zero_range(3 * GIB, 5 * GIB, GIB), None);
        // A record off the MiB grid is rounded down: zero again, never skip.
        assert_eq!(next_zero_range(3 * GIB, GIB + 512, GIB), Some((GIB, GIB)));
        // The end of a volume not in whole MiB is the end, not a record to round down.
        assert_eq!(next_zero_range(GIB + 512, GIB + 512, GIB), None);
        // A volume smaller than a chunk, and a chunk of 0 that would never finish.
        assert_eq!(next_zero_range(8 * MIB, 0, GIB), Some((0, 8 * MIB)));
        assert_eq!(next_zero_range(8 * MIB, 0, 0), Some((0, MIB)));
    }

    proptest! {
        #[test]
        fn zeroing_from_any_record_covers_the_rest_in_whole_mib_chunks(
            sectors in 1u64..(1 << 35),
            recorded in 0u64..(1 << 45),
        ) {
            let size = sectors * 512;
            let chunk = zero_chunk(size);
            let mut done = recorded;
            let mut ranges = Vec::new();
            while let Some((offset, length)) = next_zero_range(size, done, chunk) {
                ranges.push((offset, length));
                done = offset + length;
                prop_assert!(ranges.len() <= 34, "{ranges:?}");
            }
            let start = recorded - recorded % MIB;
            if recorded < size {
                prop_assert_eq!(ranges.first().map(|r| r.0), Some(start));
                prop_assert_eq!(done, size);
            } else {
                prop_assert!(ranges.is_empty());
            }
            for w in ranges.windows(2) {
                prop_assert_eq!(w[0].0 + w[0].1, w[1].0, "contiguous");
            }
            for (offset, length) in &ranges {
                prop_assert!(offset % MIB == 0 && *length > 0 && *length <= chunk);
                prop_assert!(length % 512 == 0);
            }
        }
    }

    // ---- the stage path of a `wipePolicy: Full` volume, command by command ----

    const SAN: &str = "san";

    fn shared_backend() -> (FakeRunner, LocalBackend<FakeRunner>) {
        let fake = FakeRunner::new();
        let class = DeviceClassConfig::named(SAN)
            .as_default()
            .with_shared(SharedConfig::default());
        let lvm = Lvm::new(fake.clone()).with_shared([SAN.to_owned()]);
        (fake, LocalBackend::new("node-a", vec![class], lvm))
    }

    /// A linear volume of the shared class with these tags beside ours.
    fn linear(size: u64, tags: &[String]) -> LogicalVolume {
        LogicalVolume {
            name: ids::volume_lv_name("pvc-1"),
            vg_name: SAN.into(),
            size,
            attr: "-wi-------".into(),
            segtype: "linear".into(),
            tags: [ids::OWNER_TAG.to_owned(), ids::name_tag("pvc-1")]
                .into_iter()
                .chain(tags.iter().cloned())
                .collect(),
            uuid: "u".into(),
            pool_lv: None,
            origin: None,
            data_percent: None,
            metadata_percent: None,
            metadata_size: None,
            sync_percent: None,
            path: None,
            dm_path: None,
            stripes: Some(1),
            stripe_size: Some(0),
        }
    }

    /// `lvm <sub> <scope of the shared class> <args...>`.
    fn lvm_san(sub: &str, args: &[&str]) -> Vec<String> {
        let mut argv = vec!["lvm".to_owned(), sub.to_owned()];
        argv.extend(lvms_host::scope::LockScope::shared(SAN, None).args());
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv
    }

    fn expect<'a>(fake: &'a FakeRunner, argv: &[String]) -> lvms_host::fake::Expect<'a> {
        fake.expect(&argv.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// The look at `lv` that the stage and its read-back make, answering `lv`.
    fn expect_lv(fake: &FakeRunner, lv: &LogicalVolume) {
        let target = format!("{SAN}/{}", lv.name);
        let argv = lvm_san(
            "lvs",
            &[
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                LV_FIELDS,
                &target,
            ],
        );
        let row = format!(
            r#"{{"report":[{{"lv":[{{"lv_name":"{}", "vg_name":"{SAN}", "lv_uuid":"u", "lv_size":"{}", "lv_attr":"{}", "segtype":"linear", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"", "sync_percent":"", "lv_tags":"{}", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}}]}}]}}"#,
            lv.name,
            lv.size,
            lv.attr,
            lv.tags.join(",")
        );
        expect(fake, &argv).stdout(row);
    }

    fn expect_lvchange(fake: &FakeRunner, lv: &LogicalVolume, args: &[&str]) {
        let target = format!("{SAN}/{}", lv.name);
        let mut args = args.to_vec();
        args.push(&target);
        expect(fake, &lvm_san("lvchange", &args)).succeeds();
    }

    fn expect_zero(fake: &FakeRunner, lv: &LogicalVolume, offset: u64, length: u64) {
        let dev = format!("/dev/{SAN}/{}", lv.name);
        let (offset, length) = (offset.to_string(), length.to_string());
        fake.expect(&[
            "blkdiscard",
            "--zeroout",
            "--offset",
            &offset,
            "--length",
            &length,
            &dev,
        ])
        .succeeds();
    }

    fn expect_flush(fake: &FakeRunner, lv: &LogicalVolume) {
        let dev = format!("/dev/{SAN}/{}", lv.name);
        fake.expect(&["sync", &dev]).succeeds();
    }

    /// The single-node activation after the zeroing, and its read-back.
    fn expect_activated(fake: &FakeRunner, lv: &LogicalVolume) {
        expect_lvchange(fake, lv, &["--activate", "ey", "--ignoreactivationskip"]);
        let mut active = lv.clone();
        active.attr = "-wi-a-----".into();
        active
            .tags
            .retain(|t| t != ids::UNWIPED_TAG && !t.starts_with(ids::WIPED_TO_TAG_PREFIX));
        expect_lv(fake, &active);
    }

    #[tokio::test]
    async fn a_new_volume_is_zeroed_chunk_by_chunk_each_recorded_after_it_is_flushed() {
        let (fake, b) = shared_backend();
        let lv = linear(3 * GIB, &[ids::UNWIPED_TAG.to_owned()]);
        let (one, two) = (ids::wiped_to_tag(GIB), ids::wiped_to_tag(2 * GIB));
        expect_lv(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--activate", "ey", "--ignoreactivationskip"]);
        expect_zero(&fake, &lv, 0, GIB);
        expect_flush(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--addtag", &one]);
        expect_zero(&fake, &lv, GIB, GIB);
        expect_flush(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--addtag", &two]);
        expect_lvchange(&fake, &lv, &["--deltag", &one]);
        // The last chunk is not recorded: removing the unwiped tag says it.
        expect_zero(&fake, &lv, 2 * GIB, GIB);
        expect_flush(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--deltag", ids::UNWIPED_TAG]);
        expect_lvchange(&fake, &lv, &["--deltag", &two]);
        expect_activated(&fake, &lv);
        assert_eq!(
            b.activate_shared(&lv, false).await.unwrap(),
            format!("/dev/{SAN}/{}", lv.name)
        );
        fake.assert_done();
    }

    #[tokio::test]
    async fn a_stage_after_a_crash_resumes_from_the_furthest_record() {
        let (fake, b) = shared_backend();
        // Crashed between adding the record of 2 GiB and removing that of 1 GiB.
        let (one, two) = (ids::wiped_to_tag(GIB), ids::wiped_to_tag(2 * GIB));
        let lv = linear(
            3 * GIB + 8 * MIB,
            &[ids::UNWIPED_TAG.to_owned(), one.clone(), two.clone()],
        );
        expect_lv(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--activate", "ey", "--ignoreactivationskip"]);
        expect_zero(&fake, &lv, 2 * GIB, GIB);
        expect_flush(&fake, &lv);
        let three = ids::wiped_to_tag(3 * GIB);
        expect_lvchange(&fake, &lv, &["--addtag", &three]);
        expect_lvchange(&fake, &lv, &["--deltag", &one]);
        expect_lvchange(&fake, &lv, &["--deltag", &two]);
        expect_zero(&fake, &lv, 3 * GIB, 8 * MIB);
        expect_flush(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--deltag", ids::UNWIPED_TAG]);
        expect_lvchange(&fake, &lv, &["--deltag", &three]);
        expect_activated(&fake, &lv);
        b.activate_shared(&lv, false).await.unwrap();
        fake.assert_done();
    }

    /// `lvchange -aey` of `lv` refused because another host holds its lock.
    fn expect_held(fake: &FakeRunner, lv: &LogicalVolume) {
        let target = format!("{SAN}/{}", lv.name);
        let argv = lvm_san(
            "lvchange",
            &["--activate", "ey", "--ignoreactivationskip", &target],
        );
        expect(fake, &argv).fails(
            5,
            format!(
                "  LV locked by other host: {target}\n  Failed to lock logical volume {target}.\n"
            ),
        );
    }

    /// sanlock asked for the lockspace's timing when a stage gives up, answering nothing (so the
    /// class's io timeout counts).
    fn expect_sanlock_asked(fake: &FakeRunner) {
        fake.expect(&["sanlock", "client", "status", "-D"])
            .fails(1, "connect error");
        fake.expect(&["sanlock", "client", "host_status", "-s", "lvm_san", "-D"])
            .fails(1, "connect error");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_waits_for_a_lock_held_elsewhere_trying_again_outside_the_queue() {
        let (fake, b) = shared_backend();
        let lv = linear(GIB, &[]);
        for _ in 0..2 {
            expect_lv(&fake, &lv);
            expect_held(&fake, &lv);
        }
        expect_lv(&fake, &lv);
        expect_activated(&fake, &lv);
        let started = tokio::time::Instant::now();
        // While the stage waits, the group's queue is free for other volumes' work.
        let other_work = async {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let queued = std::time::Duration::from_secs(1);
            tokio::time::timeout(queued, b.lock_vg(SAN)).await.is_ok()
        };
        let (staged, queue_was_free) = tokio::join!(b.activate_shared(&lv, false), other_work);
        staged.unwrap();
        assert!(queue_was_free, "the waiting stage kept the group's queue");
        assert_eq!(started.elapsed(), 2 * STAGE_RETRY);
        fake.assert_done();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_starts_waiting_says_so_once_with_when_the_lock_is_freed() {
        let (fake, b) = shared_backend();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let b = b.with_stage_waits(tx);
        let lv = linear(GIB, &[]);
        expect_lv(&fake, &lv);
        expect_held(&fake, &lv);
        expect_sanlock_asked(&fake);
        expect_lv(&fake, &lv);
        expect_held(&fake, &lv);
        expect_lv(&fake, &lv);
        expect_activated(&fake, &lv);
        b.activate_shared(&lv, false).await.unwrap();
        let wait = rx.try_recv().expect("the wait was announced");
        assert_eq!(wait.volume_id, lv.name);
        assert!(
            wait.message
                .starts_with("NodeStage waits up to 90 s for the volume's lock: "),
            "{}",
            wait.message
        );
        assert!(
            wait.message
                .contains("frees its lock 140 s after this node last saw its lease renewed"),
            "{}",
            wait.message
        );
        assert!(rx.try_recv().is_err(), "once per stage");
        fake.assert_done();
    }

    #[tokio::test(start_paused = true)]
    async fn a_stage_that_waited_its_time_is_refused_saying_how_long_and_when_the_lock_is_freed() {
        let (fake, b) = shared_backend();
        let b = b.with_shared_stage_wait(std::time::Duration::from_secs(12));
        let lv = linear(GIB, &[]);
        for _ in 0..3 {
            expect_lv(&fake, &lv);
            expect_held(&fake, &lv);
        }
        expect_sanlock_asked(&fake);
        match b.activate_shared(&lv, false).await {
            Err(BackendError::Conflict(m)) => {
                assert!(
                    m.contains("frees its lock 140 s after this node last saw its lease renewed"),
                    "{m}"
                );
                assert!(m.contains("this stage waited 10 s, 3 tries"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        fake.assert_done();
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_stage_wait_a_lock_held_elsewhere_is_refused_at_once() {
        let (fake, b) = shared_backend();
        let b = b.with_shared_stage_wait(std::time::Duration::ZERO);
        let lv = linear(GIB, &[]);
        expect_lv(&fake, &lv);
        expect_held(&fake, &lv);
        expect_sanlock_asked(&fake);
        let started = tokio::time::Instant::now();
        match b.activate_shared(&lv, false).await {
            Err(BackendError::Conflict(m)) => {
                assert!(m.contains("unstage it there first"), "{m}");
                assert!(!m.contains("waited"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
        fake.assert_done();
    }

    #[tokio::test]
    async fn a_failed_chunk_is_not_recorded_and_fails_the_stage() {
        let (fake, b) = shared_backend();
        let lv = linear(3 * GIB, &[ids::UNWIPED_TAG.to_owned()]);
        let one = ids::wiped_to_tag(GIB);
        expect_lv(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--activate", "ey", "--ignoreactivationskip"]);
        expect_zero(&fake, &lv, 0, GIB);
        expect_flush(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--addtag", &one]);
        let dev = format!("/dev/{SAN}/{}", lv.name);
        let (offset, length) = (GIB.to_string(), GIB.to_string());
        fake.expect(&[
            "blkdiscard",
            "--zeroout",
            "--offset",
            &offset,
            "--length",
            &length,
            &dev,
        ])
        .fails(1, "blkdiscard: BLKZEROOUT ioctl failed: Input/output error");
        let err = b.activate_shared(&lv, false).await.unwrap_err();
        assert!(err.to_string().contains("Input/output error"), "{err}");
        fake.assert_done();
    }

    #[tokio::test]
    async fn a_record_left_beside_a_zeroed_volume_is_removed_at_its_next_stage() {
        let (fake, b) = shared_backend();
        let stale = ids::wiped_to_tag(GIB);
        let lv = linear(3 * GIB, std::slice::from_ref(&stale));
        expect_lv(&fake, &lv);
        expect_lvchange(&fake, &lv, &["--deltag", &stale]);
        expect_activated(&fake, &lv);
        b.activate_shared(&lv, false).await.unwrap();
        fake.assert_done();
    }

    #[test]
    fn a_volume_held_elsewhere_is_in_use_with_the_fix_and_other_errors_keep_their_meaning() {
        let held = lvms_host::Error::InUse("LV locked by other host: san/csi-a".into());
        match in_use_elsewhere("csi-a", "grow")(held) {
            BackendError::Host(lvms_host::Error::InUse(m)) => {
                assert!(m.contains("grow it through the driver"), "{m}");
                assert!(m.contains("unstage it on the other nodes"), "{m}");
                assert!(m.contains("LV locked by other host"), "{m}");
            }
            other => panic!("{other:?}"),
        }
        let full = lvms_host::Error::InsufficientSpace("no room".into());
        assert!(matches!(
            in_use_elsewhere("csi-a", "grow")(full),
            BackendError::InsufficientSpace(_)
        ));
    }

    #[test]
    fn a_stage_refused_for_another_nodes_lock_says_when_the_lock_can_be_had() {
        let held = "LV locked by other host: san/csi-a";
        // sanlock says nothing: the class's io timeout.
        let m = conflict_message("csi-a", held, 10, &LockspaceTiming::default());
        assert!(
            m.contains("unstage it there first") && m.contains(held),
            "{m}"
        );
        assert!(
            m.contains("frees its lock 140 s after") && m.contains("(10 s io timeout"),
            "{m}"
        );
        assert!(m.contains("counts from its join"), "{m}");
        // sanlock keeps 5 s here: its budget, not the class's.
        let renewing = lvms_host::sanlock::HostLease {
            host_id: 2,
            timestamp: 900,
            last_check: 1000,
            last_live: 996,
            io_timeout: 5,
        };
        let kept = LockspaceTiming {
            io_timeout: Some(5),
            hosts: vec![renewing.clone()],
        };
        let m = conflict_message("csi-a", held, 10, &kept);
        assert!(
            m.contains("frees its lock 100 s after") && m.contains("(5 s io timeout"),
            "{m}"
        );
        // Host 2 went silent 60 s ago: 40 s of its 100 s host-dead time are left.
        let silent = LockspaceTiming {
            io_timeout: Some(5),
            hosts: vec![lvms_host::sanlock::HostLease {
                last_live: 940,
                ..renewing
            }],
        };
        let m = conflict_message("csi-a", held, 10, &silent);
        assert!(
            m.contains("host 2 stopped renewing its lease 60 s ago")
                && m.contains("frees its locks in 40 s"),
            "{m}"
        );
    }

    #[test]
    fn a_pool_is_named_after_its_first_volume() {
        assert_eq!(
            pool_name("csi-abcdefghijklmnopqrstuvwxyz"),
            "pool-abcdefghijklmnopqrstuvwxyz"
        );
    }

    #[test]
    fn pool_metadata_is_twice_what_the_chunks_need_and_at_least_four_mib() {
        assert_eq!(pool_metadata(64 * MIB, 4 * MIB), 4 * MIB);
        // 100 GiB of 64 KiB chunks: 1.6 Mi chunks × 64 B = 100 MiB, twice that.
        assert_eq!(pool_metadata(100 * GIB, 4 * MIB), 200 * MIB);
        // Rounded up to whole extents.
        assert_eq!(pool_metadata(3 * GIB, 4 * MIB), 8 * MIB);
        assert!(pool_metadata(u64::MAX / 2, 4 * MIB) <= MAX_POOL_METADATA + 4 * MIB);
    }

    #[test]
    fn the_largest_new_thin_volume_and_its_pool_fit_in_the_free_space() {
        for free in [16 * MIB, 100 * MIB, 3 * GIB - 12 * MIB, 500 * GIB] {
            let max = max_thin_volume(free, 4 * MIB);
            assert!(max > 0, "{free}");
            assert!(new_pool_cost(max, 4 * MIB) <= free, "{free}: {max}");
            assert_eq!(max % (4 * MIB), 0);
        }
        assert_eq!(max_thin_volume(4 * MIB, 4 * MIB), 0);
    }

    // ---- a thin volume and its pool, made together ----

    const EXTENT: u64 = 4 * MIB;

    fn report_argv(sub: &str, fields: &str, target: Option<&str>) -> Vec<String> {
        let mut args = vec![
            "--reportformat",
            "json",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            fields,
        ];
        args.extend(target);
        lvm_san(sub, &args)
    }

    /// A row of `lvs` JSON for `lv`.
    fn lv_row(lv: &LogicalVolume) -> String {
        format!(
            r#"{{"lv_name":"{}", "vg_name":"{SAN}", "lv_uuid":"u-{}", "lv_size":"{}", "lv_attr":"{}", "segtype":"{}", "pool_lv":"{}", "origin":"", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"", "sync_percent":"", "lv_tags":"{}", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}}"#,
            lv.name,
            lv.name,
            lv.size,
            lv.attr,
            lv.segtype,
            lv.pool_lv.as_deref().unwrap_or(""),
            lv.tags.join(",")
        )
    }

    /// The shared group: 8 GiB, all free.
    fn vgs_json() -> String {
        let (size, free) = (8 * GIB, 8 * GIB);
        format!(
            r#"{{"report":[{{"vg":[{{"vg_name":"{SAN}", "vg_uuid":"u-{SAN}", "vg_size":"{size}", "vg_free":"{free}", "vg_extent_size":"{EXTENT}", "vg_extent_count":"{}", "vg_free_count":"{}", "pv_count":"1", "lv_count":"0", "vg_tags":"lvms", "vg_attr":"wz--ns", "vg_mda_free":"520704", "vg_mda_size":"1044480"}}]}}]}}"#,
            size / EXTENT,
            free / EXTENT
        )
    }

    /// `lvs -o <group_fields()>` JSON: each of `lvs` with the group's fields ([`vgs_json`]).
    fn group_json(lvs: &[LogicalVolume]) -> String {
        let vg: serde_json::Value = serde_json::from_str(&vgs_json()).unwrap();
        let vg = vg["report"][0]["vg"][0].as_object().unwrap().clone();
        let rows: Vec<serde_json::Value> = lvs
            .iter()
            .map(|lv| {
                let mut row: serde_json::Value = serde_json::from_str(&lv_row(lv)).unwrap();
                row.as_object_mut().unwrap().extend(vg.clone());
                row
            })
            .collect();
        serde_json::json!({"report": [{"lv": rows}]}).to_string()
    }

    /// The driver's full report, its classes all shared: one `lvs -a` with the group's fields on
    /// each row, the group's hidden `[lvmlock]` among them.
    fn expect_report(fake: &FakeRunner, lvs: &[LogicalVolume]) {
        let mut argv = report_argv("lvs", &group_fields(), Some(SAN));
        // After `lvm lvs` and the scope (`--config …`, `--devicesfile …`).
        argv.insert(6, "-a".to_owned());
        let lock = LogicalVolume {
            name: "[lvmlock]".into(),
            ..linear(256 * MIB, &[])
        };
        let rows: Vec<LogicalVolume> = std::iter::once(lock).chain(lvs.iter().cloned()).collect();
        expect(fake, &argv).stdout(group_json(&rows));
    }

    fn thin(name: &str, pool: &str, tags: &[String]) -> LogicalVolume {
        LogicalVolume {
            name: name.into(),
            attr: "Vwi---tz--".into(),
            segtype: THIN.into(),
            pool_lv: Some(pool.into()),
            tags: tags.to_vec(),
            stripes: None,
            stripe_size: None,
            ..linear(GIB, &[])
        }
    }

    fn thin_pool(name: &str, tags: &[String]) -> LogicalVolume {
        LogicalVolume {
            name: name.into(),
            attr: "twi---tz--".into(),
            segtype: THIN_POOL.into(),
            tags: tags.to_vec(),
            ..linear(GIB, &[])
        }
    }

    fn new_thin(name: &str) -> crate::backend::NewVolume {
        crate::backend::NewVolume {
            name: name.into(),
            class: SAN.into(),
            size: GIB,
            lv_type: None,
            volume_mode: Some(SharedVolumeMode::Thin),
            source: None,
            ephemeral: None,
        }
    }

    fn our_tags(name: &str) -> Vec<String> {
        vec![ids::OWNER_TAG.to_owned(), ids::name_tag(name)]
    }

    /// One `lvchange` giving `lv_name` all of `tags`.
    fn expect_add_tags(fake: &FakeRunner, lv_name: &str, tags: &[String]) {
        let target = format!("{SAN}/{lv_name}");
        let mut add = vec![];
        for t in tags {
            add.extend(["--addtag", t.as_str()]);
        }
        add.push(&target);
        expect(fake, &lvm_san("lvchange", &add)).succeeds();
    }

    /// The read-back of `lv` after it was made: the LV and the group's free space in one `lvs`.
    fn expect_read_back(fake: &FakeRunner, lv: &LogicalVolume) {
        let target = format!("{SAN}/{}", lv.name);
        expect(fake, &report_argv("lvs", &group_fields(), Some(&target)))
            .stdout(group_json(std::slice::from_ref(lv)));
    }

    #[tokio::test]
    async fn a_shared_thin_volume_and_its_pool_are_made_inactive_in_one_lvcreate_then_tagged() {
        let (fake, b) = shared_backend();
        let lv_name = ids::volume_lv_name("pvc-1");
        let pool = pool_name(&lv_name);
        expect_report(&fake, &[]);
        let (size, meta) = (
            format!("{GIB}b"),
            format!("{}b", pool_metadata(GIB, EXTENT)),
        );
        let chunk = format!("{POOL_CHUNK}b");
        expect(
            &fake,
            &lvm_san(
                "lvcreate",
                &[
                    "--yes",
                    "--type",
                    "thin",
                    "--virtualsize",
                    &size,
                    "--thinpool",
                    &pool,
                    "--size",
                    &size,
                    "--chunksize",
                    &chunk,
                    "--poolmetadatasize",
                    &meta,
                    "--zero",
                    "y",
                    "--activate",
                    "n",
                    "--addtag",
                    ids::OWNER_TAG,
                    "--name",
                    &lv_name,
                    SAN,
                ],
            ),
        )
        .succeeds();
        let tags = our_tags("pvc-1");
        expect_add_tags(&fake, &lv_name, &tags);
        expect_read_back(&fake, &thin(&lv_name, &pool, &tags));
        // No deactivation follows: both were made inactive.
        let vol = b.create_volume(&new_thin("pvc-1")).await.unwrap();
        assert_eq!((vol.id.as_str(), vol.size), (lv_name.as_str(), GIB));
        fake.assert_done();
    }

    #[tokio::test]
    async fn an_untagged_volume_in_its_own_tagged_pool_is_tagged_and_adopted_at_the_retry() {
        let (fake, b) = shared_backend();
        let lv_name = ids::volume_lv_name("pvc-1");
        let pool = pool_name(&lv_name);
        // A crash came between the combined lvcreate and the tagging.
        let left = [
            thin_pool(&pool, &[ids::OWNER_TAG.to_owned()]),
            thin(&lv_name, &pool, &[]),
        ];
        expect_report(&fake, &left);
        // The volume is found by name, its tags checked afresh, then added.
        expect_report(&fake, &left);
        let tags = our_tags("pvc-1");
        expect_add_tags(&fake, &lv_name, &tags);
        expect_read_back(&fake, &thin(&lv_name, &pool, &tags));
        let vol = b.create_volume(&new_thin("pvc-1")).await.unwrap();
        assert_eq!(vol.id, lv_name);
        fake.assert_done();
    }

    #[tokio::test]
    async fn an_untagged_volume_outside_a_pool_of_ours_is_a_conflict_and_left_untagged() {
        let (fake, b) = shared_backend();
        let lv_name = ids::volume_lv_name("pvc-1");
        let pool = pool_name(&lv_name);
        // Someone else's volume of that name, in a pool without our tag.
        let foreign = [thin_pool(&pool, &[]), thin(&lv_name, &pool, &[])];
        expect_report(&fake, &foreign);
        expect_report(&fake, &foreign);
        let err = b.create_volume(&new_thin("pvc-1")).await.unwrap_err();
        assert!(matches!(err, BackendError::Conflict(_)), "{err:?}");
        fake.assert_done();
    }
}
