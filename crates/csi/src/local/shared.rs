//! Volumes of shared classes (one volume group on a LUN that several nodes see, under lvmlockd).
//!
//! - **Linear** volumes are made inactive and activated where they are staged: exclusively (`ey`) for
//!   one node, shared (`sy`) for MULTI_NODE_* block volumes. With `wipePolicy: Full` a new volume
//!   carries [`ids::UNWIPED_TAG`] and is zeroed at its first stage.
//! - **Thin** volumes get a thin pool each (`pool-<digest>`, [`pool_name`]), because lvmlockd locks a
//!   thin pool, not its thin volumes: every thin volume of a pool is active on the same node. Snapshots
//!   and clones of a volume live in its pool. The pool's data is kept at least the sum of its thin
//!   volumes' virtual sizes ([`LocalBackend::cover`]), so the pool can never run full (autoextend would
//!   only run on the node where the pool is active), and pools zero new blocks (`--zero y`): a thin
//!   volume never shows a previous tenant's data, so `wipePolicy` does not apply to it. A new pool and
//!   volume are left inactive; the staging node activates both exclusively, unstage deactivates both.

use lvms_core::{lvattr::LvAttr, model::LogicalVolume, size::round_up_to_extent};
use lvms_host::{
    devices::zero_out,
    lvm::{Activation, PoolSize, ThinPoolSpec},
    runner::Runner,
};

use super::{Bytes, LocalBackend, Report, THIN, THIN_POOL, has_tag, host, is_ours};
use crate::{
    backend::{BackendError, ClassInfo, NewSnapshot, Result, Source, Volume},
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
    /// A crash after the pool was made finds and reuses it.
    pub(super) async fn create_shared_thin(
        &self,
        class: &ClassInfo,
        lv_name: &str,
        name: &str,
        size: u64,
        tags: &[String],
    ) -> Result<Volume> {
        let vg = class.name.as_str();
        let pool = pool_name(lv_name);
        let report = self.fresh_report().await?;
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
            match self.mutate(self.lvm.thin_pool_create(&spec)).await {
                Ok(()) | Err(lvms_host::Error::AlreadyExists(_)) => {}
                Err(e) => return Err(host(e)),
            }
        }
        // Tagged after creation (lvcreate of a pool takes no tag here): a pool that lost its tag to
        // a crash gets it at the retry.
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
            .lvs
            .iter()
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
            .mutate(self.lvm.lv_remove_tagged(vg, pool, ids::OWNER_TAG))
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
    /// between zeroes it again at the next stage). The LV is read afresh: another node may have
    /// changed it since the cached report.
    pub(super) async fn activate_shared(
        &self,
        lv: &LogicalVolume,
        multi_node: bool,
    ) -> Result<String> {
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
                .map_err(conflict(id))?;
            tracing::info!(
                volume_id = id,
                "zeroing a new volume of a shared class before first use"
            );
            self.mutate(zero_out(self.lvm.runner(), &device))
                .await
                .map_err(host)?;
            self.mutate(self.lvm.lv_del_tag(vg, id, ids::UNWIPED_TAG))
                .await
                .map_err(host)?;
            if multi_node {
                self.mutate(self.lvm.lv_deactivate(vg, id))
                    .await
                    .map_err(host)?;
            }
        }
        let how = if multi_node {
            Activation::Shared
        } else {
            Activation::Exclusive
        };
        self.mutate(self.lvm.lv_activate_shared(vg, id, how))
            .await
            .map_err(conflict(id))?;
        self.read_back_lv(vg, id, "activating").await;
        Ok(device)
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

/// An activation refused because another node holds the volume: FAILED_PRECONDITION at the node.
fn conflict(id: &str) -> impl FnOnce(lvms_host::Error) -> BackendError + '_ {
    move |e| match e {
        lvms_host::Error::InUse(m) => BackendError::Conflict(format!(
            "volume {id} is in use on another node ({m}): unstage it there first"
        )),
        other => host(other),
    }
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
    use super::*;

    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;

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
        let held = lvms_host::Error::InUse("LV locked by other host: san/csi-a".into());
        match conflict("csi-a")(held) {
            BackendError::Conflict(m) => assert!(m.contains("unstage it there first"), "{m}"),
            other => panic!("{other:?}"),
        }
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
}
