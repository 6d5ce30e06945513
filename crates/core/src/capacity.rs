//! Capacity a node reports to the scheduler (CSI `GetCapacity`), for thick and thin device classes.
//!
//! Thin capacity has two sides, both reported:
//! - `virtual_free = ratio × pool_size − virtual_used`: what may still be promised to thin volumes;
//! - `physical_free = pool_size × (1 − data% / 100)`: the pool's real free space.
//!
//! The capacity offered for new volumes is `available = min(virtual_free, ratio × physical_free)`: the
//! overprovision ratio applies to the space the pool really has left as well as to its size. With an
//! empty pool this is exactly `virtual_free`; as the pool fills, fewer new promises are made, and a full
//! pool offers nothing, however little has been promised. With ratio 1 it equals `pool − virtual_used`
//! whenever volumes have written no more than their size (always, without snapshots).

use serde::{Deserialize, Serialize};

use crate::{
    model::{LogicalVolume, VolumeGroup},
    size::round_down_to_extent,
};

/// A thick device class offers what its volume group has free.
pub fn thick_available(vg: &VolumeGroup) -> u64 {
    vg.free
}

/// What thin capacity is computed from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThinPoolUsage {
    /// The pool's data size in bytes.
    pub pool_size: u64,
    /// The pool's `data_percent`. Clamped to 0–100; NaN counts as 100 (nothing is offered when usage
    /// is unknown).
    pub data_percent: f64,
    /// Sum of the virtual sizes of the pool's thin volumes (snapshots included).
    pub virtual_used: u64,
    pub overprovision_ratio: u32,
}

impl ThinPoolUsage {
    /// Gathers the usage of thin pool `pool` from a report of all logical volumes. A pool that reports no
    /// `data_percent` (inactive) counts as full.
    pub fn from_lvs<'a>(
        pool: &LogicalVolume,
        lvs: impl IntoIterator<Item = &'a LogicalVolume>,
        overprovision_ratio: u32,
    ) -> Self {
        let virtual_used = lvs
            .into_iter()
            .filter(|lv| {
                lv.vg_name == pool.vg_name && lv.pool_lv.as_deref() == Some(pool.name.as_str())
            })
            .fold(0u64, |acc, lv| acc.saturating_add(lv.size));
        Self {
            pool_size: pool.size,
            data_percent: pool.data_percent.unwrap_or(100.0),
            virtual_used,
            overprovision_ratio,
        }
    }
}

/// Thin capacity in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThinCapacity {
    /// `ratio × pool_size − virtual_used`, at least 0.
    pub virtual_free: u64,
    /// `pool_size × (1 − data% / 100)`.
    pub physical_free: u64,
    /// `min(virtual_free, ratio × physical_free)`: what `GetCapacity` reports.
    pub available: u64,
}

/// Basis points (1/100 %) used, rounded up so free space is never overstated.
fn used_basis_points(data_percent: f64) -> u128 {
    if data_percent.is_nan() {
        return 10_000;
    }
    let clamped = data_percent.clamp(0.0, 100.0);
    // In range 0..=10_000 after the clamp, so the cast cannot truncate.
    ((clamped * 100.0).ceil() as u128).min(10_000)
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Computes thin capacity; overflow-safe (u128 internally, results saturate at `u64::MAX`).
pub fn thin_capacity(usage: &ThinPoolUsage) -> ThinCapacity {
    let pool = u128::from(usage.pool_size);
    let ratio = u128::from(usage.overprovision_ratio);
    let used = (pool * used_basis_points(usage.data_percent)).div_ceil(10_000);
    let physical_free = pool - used.min(pool);
    let virtual_free = (ratio * pool).saturating_sub(u128::from(usage.virtual_used));
    let available = virtual_free.min(ratio * physical_free);
    ThinCapacity {
        virtual_free: saturate(virtual_free),
        physical_free: saturate(physical_free),
        available: saturate(available),
    }
}

/// The largest volume that fits in `available`: rounded down to whole extents (0 for a zero extent).
pub fn max_volume_size(available: u64, extent_size: u64) -> u64 {
    round_down_to_extent(available, extent_size).unwrap_or(0)
}

/// The smallest volume LVM allocates: one extent.
pub fn min_volume_size(extent_size: u64) -> u64 {
    extent_size
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::size::{GIB, MIB};

    fn usage(pool: u64, pct: f64, vused: u64, ratio: u32) -> ThinPoolUsage {
        ThinPoolUsage {
            pool_size: pool,
            data_percent: pct,
            virtual_used: vused,
            overprovision_ratio: ratio,
        }
    }

    #[test]
    fn empty_pool_offers_ratio_times_pool() {
        let c = thin_capacity(&usage(100 * GIB, 0.0, 0, 10));
        assert_eq!(c.virtual_free, 1000 * GIB);
        assert_eq!(c.physical_free, 100 * GIB);
        assert_eq!(c.available, 1000 * GIB);
    }

    #[test]
    fn promised_space_reduces_virtual_free() {
        let c = thin_capacity(&usage(100 * GIB, 10.0, 300 * GIB, 10));
        assert_eq!(c.virtual_free, 700 * GIB);
        assert_eq!(c.physical_free, 90 * GIB);
        assert_eq!(c.available, 700 * GIB);
    }

    #[test]
    fn filling_pool_caps_available_by_ratio_times_physical_free() {
        let c = thin_capacity(&usage(100 * GIB, 95.0, 200 * GIB, 10));
        assert_eq!(c.virtual_free, 800 * GIB);
        assert_eq!(c.physical_free, 5 * GIB);
        assert_eq!(c.available, 50 * GIB);
    }

    #[test]
    fn full_pool_offers_nothing() {
        let c = thin_capacity(&usage(100 * GIB, 100.0, 10 * GIB, 10));
        assert_eq!(c.physical_free, 0);
        assert_eq!(c.available, 0);
        assert_eq!(
            c.virtual_free,
            990 * GIB,
            "the virtual side is still reported"
        );
    }

    #[test]
    fn overpromised_pool_saturates_at_zero() {
        let c = thin_capacity(&usage(100 * GIB, 1.0, 5000 * GIB, 10));
        assert_eq!(c.virtual_free, 0);
        assert_eq!(c.available, 0);
    }

    #[test]
    fn unknown_or_out_of_range_data_percent_is_conservative() {
        assert_eq!(
            thin_capacity(&usage(100 * GIB, f64::NAN, 0, 5)).available,
            0
        );
        assert_eq!(thin_capacity(&usage(100 * GIB, 150.0, 0, 5)).available, 0);
        assert_eq!(
            thin_capacity(&usage(100 * GIB, -3.0, 0, 5)).physical_free,
            100 * GIB
        );
    }

    #[test]
    fn physical_free_rounds_usage_up() {
        // 0.01 % of a 1-byte pool rounds up to the whole byte.
        assert_eq!(thin_capacity(&usage(1, 0.01, 0, 1)).physical_free, 0);
        assert_eq!(
            thin_capacity(&usage(10_000, 12.34, 0, 1)).physical_free,
            8_766
        );
    }

    #[test]
    fn huge_values_do_not_overflow() {
        let c = thin_capacity(&usage(u64::MAX, 0.0, 0, 100));
        assert_eq!(c.virtual_free, u64::MAX);
        assert_eq!(c.available, u64::MAX);
        assert_eq!(c.physical_free, u64::MAX);
    }

    #[test]
    fn usage_is_gathered_from_the_pools_thin_volumes_only() {
        let lv =
            |name: &str, vg: &str, size: u64, pool: Option<&str>, pct: Option<f64>| LogicalVolume {
                name: name.into(),
                vg_name: vg.into(),
                uuid: name.into(),
                size,
                attr: "Vwi-a-tz--".into(),
                segtype: "thin".into(),
                pool_lv: pool.map(Into::into),
                origin: None,
                data_percent: pct,
                metadata_percent: None,
                metadata_size: None,
                sync_percent: None,
                tags: vec![],
                path: None,
                dm_path: None,
                stripes: None,
                stripe_size: None,
            };
        let pool = lv("pool", "vg1", 100 * GIB, None, Some(20.0));
        let lvs = vec![
            pool.clone(),
            lv("a", "vg1", 30 * GIB, Some("pool"), None),
            lv("snap", "vg1", 30 * GIB, Some("pool"), None),
            lv("b", "vg2", 50 * GIB, Some("pool"), None),
            lv("thick", "vg1", 7 * GIB, None, None),
        ];
        let u = ThinPoolUsage::from_lvs(&pool, &lvs, 4);
        assert_eq!(u.virtual_used, 60 * GIB);
        assert_eq!(u.pool_size, 100 * GIB);
        assert_eq!(u.data_percent, 20.0);
        let inactive = lv("pool", "vg1", 100 * GIB, None, None);
        assert_eq!(
            thin_capacity(&ThinPoolUsage::from_lvs(&inactive, &lvs, 4)).available,
            0
        );
    }

    #[test]
    fn thick_offers_vg_free_and_sizes_round_to_extents() {
        let vg = VolumeGroup {
            name: "vg1".into(),
            uuid: "u".into(),
            size: 10 * GIB,
            free: 3 * GIB + 5,
            extent_size: 4 * MIB,
            extent_count: 2560,
            free_count: 768,
            pv_count: 1,
            lv_count: 2,
            tags: vec![],
            attr: "wz--n-".into(),
            mda_free: 0,
            mda_size: 0,
        };
        assert_eq!(thick_available(&vg), 3 * GIB + 5);
        assert_eq!(
            max_volume_size(thick_available(&vg), vg.extent_size),
            3 * GIB
        );
        assert_eq!(max_volume_size(4 * MIB - 1, 4 * MIB), 0);
        assert_eq!(max_volume_size(GIB, 0), 0);
        assert_eq!(min_volume_size(4 * MIB), 4 * MIB);
    }

    proptest! {
        #[test]
        fn available_never_exceeds_ratio_times_pool(
            pool in any::<u64>(), pct in 0.0f64..=100.0, vused in any::<u64>(), ratio in 1u32..=100,
        ) {
            let c = thin_capacity(&usage(pool, pct, vused, ratio));
            prop_assert!(u128::from(c.available) <= u128::from(ratio) * u128::from(pool));
            prop_assert!(c.available <= c.virtual_free);
            prop_assert!(c.physical_free <= pool);
            prop_assert!(u128::from(c.available) <= u128::from(ratio) * u128::from(c.physical_free));
        }

        #[test]
        fn available_is_monotone_in_virtual_used(
            pool in 0u64..(1 << 50), pct in 0.0f64..=100.0, a in any::<u64>(), b in any::<u64>(),
            ratio in 1u32..=100,
        ) {
            let (lo, hi) = (a.min(b), a.max(b));
            let c_lo = thin_capacity(&usage(pool, pct, lo, ratio));
            let c_hi = thin_capacity(&usage(pool, pct, hi, ratio));
            prop_assert!(c_hi.available <= c_lo.available);
            prop_assert!(c_hi.virtual_free <= c_lo.virtual_free);
        }

        #[test]
        fn available_is_monotone_in_data_percent(
            pool in any::<u64>(), p in 0.0f64..=100.0, q in 0.0f64..=100.0, vused in any::<u64>(),
            ratio in 1u32..=100,
        ) {
            let (lo, hi) = (p.min(q), p.max(q));
            prop_assert!(
                thin_capacity(&usage(pool, hi, vused, ratio)).available
                    <= thin_capacity(&usage(pool, lo, vused, ratio)).available
            );
        }

        #[test]
        fn full_pool_is_always_zero(pool in any::<u64>(), vused in any::<u64>(), ratio in 1u32..=100) {
            prop_assert_eq!(thin_capacity(&usage(pool, 100.0, vused, ratio)).available, 0);
        }

        #[test]
        fn ratio_one_without_overwrites_is_pool_minus_promised(
            pool in 0u64..(1 << 50), pct in 0u64..=100, extra in 0u64..(1 << 50),
        ) {
            // Data written never exceeds what was promised: virtual_used >= pool × data%.
            let vused = (pool * pct).div_ceil(100) + extra;
            let c = thin_capacity(&usage(pool, pct as f64, vused, 1));
            prop_assert_eq!(c.available, pool.saturating_sub(vused));
        }

        #[test]
        fn max_volume_size_is_a_whole_number_of_extents_within_available(
            available in any::<u64>(), extent_exp in 20u32..=30,
        ) {
            let extent = 1u64 << extent_exp;
            let max = max_volume_size(available, extent);
            prop_assert!(max <= available);
            prop_assert_eq!(max % extent, 0);
            prop_assert!(available - max < extent);
        }
    }
}
