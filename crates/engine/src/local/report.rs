//! The backend's cached LVM report: what LVM said of the classes' volume groups, patched after each
//! change ([`Changed`]) instead of read again, and dropped when a mutation made it stale
//! ([`ReportCache`]).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use lvms_core::model::{LogicalVolume, PhysicalVolume, VolumeGroup};
use tokio::{sync::Mutex, time::Instant};

use super::THIN_POOL;
use crate::backend::DeviceClassConfig;

/// What LVM reported about the classes' volume groups.
#[derive(Debug, Clone)]
pub(super) struct Report {
    /// The classes' volume groups that exist.
    pub(super) vgs: Vec<VolumeGroup>,
    /// The visible logical volumes of those volume groups (ours and others), each shared: a
    /// report patched while another task holds it is copied ([`Arc::make_mut`]), and that copy
    /// then costs a count per LV, not every LV's strings.
    pub(super) lvs: Vec<Arc<LogicalVolume>>,
    /// The LVM physical volumes of every group, read the first time a thick class's capacity per
    /// device is asked for ([`LocalBackend::free_space`]) and dropped when a group's free space
    /// changes.
    pub(super) pvs: Option<Vec<PhysicalVolume>>,
    pub(super) taken: Instant,
}

impl Report {
    pub(super) fn vg(&self, name: &str) -> Option<&VolumeGroup> {
        self.vgs.iter().find(|vg| vg.name == name)
    }

    pub(super) fn lv(&self, vg: &str, name: &str) -> Option<&LogicalVolume> {
        self.lvs().find(|lv| lv.vg_name == vg && lv.name == name)
    }

    /// The LV called `name` in any of the classes' volume groups.
    pub(super) fn find(&self, name: &str) -> Option<&LogicalVolume> {
        self.lvs().find(|lv| lv.name == name)
    }

    /// The logical volumes.
    pub(super) fn lvs(&self) -> impl Iterator<Item = &LogicalVolume> {
        self.lvs.iter().map(Arc::as_ref)
    }

    /// The thin pool of a thin class, if it exists.
    pub(super) fn pool(&self, class: &DeviceClassConfig) -> Option<&LogicalVolume> {
        let pool = class.thin_pool()?;
        self.lv(&class.name, pool)
            .filter(|lv| lv.segtype == THIN_POOL)
    }

    /// Whether the class's volume group (and pool) exist.
    pub(super) fn converged(&self, class: &DeviceClassConfig) -> bool {
        self.vg(&class.name).is_some()
            && (class.thin_pool().is_none() || self.pool(class).is_some())
    }

    /// Puts `lv` in the place of the LV of that name, or adds it.
    pub(super) fn put_lv(&mut self, lv: LogicalVolume) {
        match self
            .lvs
            .iter_mut()
            .find(|l| l.vg_name == lv.vg_name && l.name == lv.name)
        {
            Some(slot) => *slot = Arc::new(lv),
            None => self.lvs.push(Arc::new(lv)),
        }
    }

    pub(super) fn remove_lv(&mut self, vg: &str, name: &str) {
        self.lvs.retain(|l| !(l.vg_name == vg && l.name == name));
    }

    /// Puts `vg` in the place of the volume group of that name, or adds it.
    pub(super) fn put_vg(&mut self, vg: VolumeGroup) {
        match self.vgs.iter_mut().find(|v| v.name == vg.name) {
            Some(slot) => *slot = vg,
            None => self.vgs.push(vg),
        }
    }
}

/// What a successful mutation changed, to be read from LVM and put into the cached report.
#[derive(Debug, Default)]
pub(super) struct Changed<'a> {
    /// LVs that were made or changed.
    pub(super) lvs: Vec<&'a str>,
    /// An LV that was removed.
    pub(super) removed: Option<&'a str>,
    /// Whether the volume group's free space changed.
    pub(super) vg: bool,
}

/// The cached [`Report`] and the mutation counter that makes it stale.
#[derive(Debug)]
pub(super) struct ReportCache {
    pub(super) ttl: Duration,
    /// Counts finished mutations.
    pub(super) mutations: AtomicU64,
    /// The last report and the value of `mutations` when it was started. A tokio mutex: one refresh at a
    /// time, readers that find it stale wait for that refresh instead of starting their own.
    pub(super) slot: Mutex<Option<(u64, Arc<Report>)>>,
}

impl ReportCache {
    pub(super) fn invalidate(&self) {
        self.mutations.fetch_add(1, Ordering::SeqCst);
    }
}
