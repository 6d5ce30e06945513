//! Changed-block tracking on this node ([`Backend::allocated`], [`Backend::changed`]): which
//! chunks a thin snapshot maps, and where two thin snapshots of one volume differ, read from the
//! pool's metadata ([`Lvm::thin_mapped`], [`Lvm::thin_changed`]; ADR 0039).
//!
//! [`Backend::allocated`]: crate::backend::Backend::allocated
//! [`Backend::changed`]: crate::backend::Backend::changed
//! [`Lvm::thin_mapped`]: lvms_host::lvm::Lvm::thin_mapped
//! [`Lvm::thin_changed`]: lvms_host::lvm::Lvm::thin_changed

use lvms_core::{lvattr::LvAttr, model::LogicalVolume};
use lvms_host::runner::Runner;

use super::{LocalBackend, THIN, has_tag, host, to_volume};
use crate::{
    backend::{BackendError, BlockRanges, Result},
    ids,
};

impl<R: Runner> LocalBackend<R> {
    /// Our thin snapshot `id` and its pool, with the pool active on this node.
    async fn thin_snapshot_of(&self, id: &str) -> Result<(LogicalVolume, String)> {
        let lv = self.locate(id).await?.ok_or_else(|| {
            BackendError::NotFound(format!(
                "snapshot {id} does not exist on node {}",
                self.node_id
            ))
        })?;
        if !has_tag(&lv, ids::SNAPSHOT_TAG) {
            return Err(BackendError::InvalidArgument(format!(
                "{id} is a volume, not a snapshot: snapshot metadata is read from snapshots \
                 (take one with CreateSnapshot)"
            )));
        }
        let pool = match lv.pool_lv.as_deref() {
            Some(pool) if lv.segtype == THIN && !pool.is_empty() => pool.to_owned(),
            _ => {
                return Err(BackendError::Unsupported(format!(
                    "snapshot {id} is not a thin snapshot (segment type {}): changed-block \
                     tracking needs a thin device class; back it up whole",
                    lv.segtype
                )));
            }
        };
        let report = self.report().await?;
        let active = report
            .lv(&lv.vg_name, &pool)
            .and_then(|p| LvAttr::parse(&p.attr).ok())
            .is_some_and(|a| a.is_active());
        if !active {
            if self.class(&lv.vg_name)?.shared().is_some() {
                return Err(BackendError::Unavailable(format!(
                    "thin pool {}/{pool} of snapshot {id} is not active on node {}: ask the node \
                     that holds it",
                    lv.vg_name, self.node_id
                )));
            }
            let _queued = self.lock_vg(&lv.vg_name).await?;
            self.mutate(self.lvm.lv_activate(&lv.vg_name, &pool, false))
                .await
                .map_err(host)?;
            self.read_back_lv(&lv.vg_name, &pool, "activating").await;
        }
        Ok((lv, pool))
    }

    pub(super) async fn allocated_ranges(&self, id: &str) -> Result<BlockRanges> {
        let (lv, pool) = self.thin_snapshot_of(id).await?;
        let _one_reader = self.metadata_reads.lock().await;
        let runs = self
            .lvm
            .thin_mapped(&lv.vg_name, &pool, &lv.name)
            .await
            .map_err(host)?;
        Ok(BlockRanges {
            volume_size: lv.size,
            ranges: runs.byte_ranges(lv.size),
        })
    }

    pub(super) async fn changed_ranges(&self, base: &str, target: &str) -> Result<BlockRanges> {
        let (old, pool) = self.thin_snapshot_of(base).await?;
        let (new, _) = self.thin_snapshot_of(target).await?;
        let (from, to) = (to_volume(&old).source, to_volume(&new).source);
        if from != to || old.vg_name != new.vg_name || old.pool_lv != new.pool_lv {
            return Err(BackendError::InvalidArgument(format!(
                "snapshots {base} and {target} are not of the same volume ({} and {}): a delta \
                 is between two snapshots of one volume",
                describe_source(from.as_ref()),
                describe_source(to.as_ref()),
            )));
        }
        let _one_reader = self.metadata_reads.lock().await;
        let runs = self
            .lvm
            .thin_changed(&new.vg_name, &pool, &old.name, &new.name)
            .await
            .map_err(host)?;
        Ok(BlockRanges {
            volume_size: new.size,
            ranges: runs.byte_ranges(new.size),
        })
    }
}

fn describe_source(source: Option<&ids::Source>) -> String {
    source.map_or_else(|| "unknown".to_owned(), super::describe)
}
