//! How much data a new thin pool can get so that lvm2 can place it together with its metadata and the
//! pool metadata spare (ADR 0012).
//!
//! `lvcreate --type thin-pool --size D --poolmetadatasize M` (lvm2 2.03, allocation policy `normal`,
//! `--poolmetadataspare y`, `thin_pool_metadata_require_separate_pvs = 0`, the defaults) allocates in two
//! steps, each on the physical volumes' free extents:
//!
//! 1. the spare (`lvol0_pmspare`, M extents, linear) when the group has none yet: lvm2 takes, among the
//!    physical volumes with at least M free extents, one it picks by its own order (we cannot predict
//!    which, so every one is considered). When no physical volume has M free extents, the spare is split
//!    over several and no physical volume can hold the pool's metadata any more;
//! 2. the pool: its data (linear, may span physical volumes) and its metadata, which lvm2 allocates as a
//!    "log" area and needs whole on one physical volume. In its first step lvm2 takes one candidate area
//!    per physical volume, puts the data on the largest and the metadata on the smallest area that is at
//!    least M. When that is the data's own area (one physical volume has M free extents, the others
//!    fewer), the metadata must fit behind the data on that physical volume: with more data lvm2 aborts
//!    (`consume_pv_area: Assertion to_go <= pva->count failed`) instead of failing cleanly.
//!
//! So, with `f'` the free extents per physical volume after the spare:
//! - two or more physical volumes with `f' ≥ M`: data `≤ Σf' − M`;
//! - exactly one, `p`: data `≤ f'_p − M`; when `p` is the only physical volume with free extents at all,
//!   lvm2 reserves `max(data, M)` for the data first, so also `M ≤ f'_p − M`;
//! - none: no pool.
//!
//! The data limit is the smallest over every place the spare may go. Free extents are taken as one
//! contiguous area per physical volume, which holds for a group that has no logical volumes yet (the pool
//! is the first thing lvms-rs creates in it).

/// The most data extents a new thin pool can get on physical volumes with `pv_free` free extents each, with
/// `metadata` extents of pool metadata and `spare` extents of new pool metadata spare (0 when the group's
/// spare is already large enough). `None` when lvm2 cannot place the metadata (or the spare) at all.
pub fn max_data_extents(pv_free: &[u64], metadata: u64, spare: u64) -> Option<u64> {
    if metadata == 0 {
        return None;
    }
    let placements: Vec<Vec<u64>> = if spare == 0 {
        vec![pv_free.to_vec()]
    } else {
        pv_free
            .iter()
            .enumerate()
            .filter(|(_, f)| **f >= spare)
            .map(|(i, _)| {
                let mut after = pv_free.to_vec();
                after[i] -= spare;
                after
            })
            .collect()
    };
    if placements.is_empty() {
        // No physical volume holds the spare whole: lvm2 splits it and, when it is as large as the
        // metadata, no physical volume holds the metadata afterwards. A smaller spare (one that grows an
        // existing spare) might still leave room; refusing is the safe answer.
        return None;
    }
    placements
        .iter()
        .map(|free| pool_cap(free, metadata))
        .try_fold(u64::MAX, |acc, cap| cap.map(|c| acc.min(c)))
        .filter(|cap| *cap > 0)
}

/// The data limit of step 2 for one placement of the spare (see the module documentation).
fn pool_cap(free: &[u64], metadata: u64) -> Option<u64> {
    let fitting: Vec<u64> = free.iter().copied().filter(|f| *f >= metadata).collect();
    match fitting.as_slice() {
        [] => None,
        [only] => {
            let cap = only - metadata;
            let sole = free.iter().filter(|f| **f > 0).count() == 1;
            (!sole || cap >= metadata).then_some(cap)
        }
        _ => Some(free.iter().sum::<u64>() - metadata),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What lvm2 does with an allocation.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Created,
        /// A clean error ("Insufficient suitable allocatable extents").
        Refused,
        /// `consume_pv_area: Assertion to_go <= pva->count failed`.
        Aborted,
    }

    /// Every order lvm2's sort of `used` (largest first) may leave `indices` in: equal values in any order.
    fn sorted_orders(indices: &[usize], used: &[u64]) -> Vec<Vec<usize>> {
        if indices.is_empty() {
            return vec![vec![]];
        }
        let top = indices.iter().map(|&i| used[i]).max().unwrap_or(0);
        let mut out = Vec::new();
        for &first in indices.iter().filter(|&&i| used[i] == top) {
            let rest: Vec<usize> = indices.iter().copied().filter(|&i| i != first).collect();
            for mut tail in sorted_orders(&rest, used) {
                tail.insert(0, first);
                out.push(tail);
            }
        }
        out
    }

    /// A linear allocation of `n` extents step by step as lvm2's `_find_some_parallel_space` does it with
    /// one area per physical volume: each step takes the largest candidate (`min(still needed, free)`).
    /// Every free-extent vector it may end with; empty when it cannot allocate.
    fn linear(free: &[u64], n: u64) -> Vec<Vec<u64>> {
        if n == 0 {
            return vec![free.to_vec()];
        }
        if free.iter().sum::<u64>() < n {
            return vec![];
        }
        let used: Vec<u64> = free.iter().map(|f| (*f).min(n)).collect();
        let top = used.iter().copied().max().unwrap_or(0);
        let mut out = Vec::new();
        for i in (0..free.len()).filter(|&i| used[i] == top && top > 0) {
            let mut after = free.to_vec();
            after[i] -= used[i];
            out.extend(linear(&after, n - used[i]));
        }
        out
    }

    /// The thin pool's own allocation: `data` linear extents with a `meta` extent "log" area, first step
    /// as in lvm2's `_find_some_parallel_space` and `_alloc_parallel_area`, then the rest of the data.
    fn pool_outcomes(free: &[u64], data: u64, meta: u64) -> Vec<Outcome> {
        if free.iter().sum::<u64>() < data + meta {
            return vec![Outcome::Refused];
        }
        let candidates: Vec<usize> = (0..free.len()).filter(|&i| free[i] > 0).collect();
        let used: Vec<u64> = free.iter().map(|f| data.max(meta).min(*f)).collect();
        let rest = |after: &[u64], placed: u64| {
            if linear(after, data - placed).is_empty() {
                Outcome::Refused
            } else {
                Outcome::Created
            }
        };
        match candidates.as_slice() {
            [] => vec![Outcome::Refused],
            [p] => {
                // A second pass looks for the log on the data's physical volume.
                let unreserved = free[*p] - used[*p];
                if unreserved < meta {
                    return vec![Outcome::Refused];
                }
                let placed = data.min(used[*p]);
                let mut after = free.to_vec();
                after[*p] -= placed + meta;
                vec![rest(&after, placed)]
            }
            _ => sorted_orders(&candidates, &used)
                .into_iter()
                .map(|order| {
                    let too_small = order.iter().rev().take_while(|&&i| used[i] < meta).count();
                    if too_small == order.len() {
                        return Outcome::Refused;
                    }
                    let log = order[order.len() - too_small - 1];
                    let first = order[0];
                    let placed = data.min(used[first]);
                    let mut after = free.to_vec();
                    after[first] -= placed;
                    if after[log] < meta {
                        return Outcome::Aborted;
                    }
                    after[log] -= meta;
                    rest(&after, placed)
                })
                .collect(),
        }
    }

    /// Every outcome `lvcreate --type thin-pool` may have: the spare first, then the pool.
    fn lvcreate(free: &[u64], data: u64, meta: u64, spare: u64) -> Vec<Outcome> {
        let after_spare = linear(free, spare);
        if after_spare.is_empty() {
            return vec![Outcome::Refused];
        }
        after_spare
            .iter()
            .flat_map(|f| pool_outcomes(f, data, meta))
            .collect()
    }

    /// Whether lvm2 creates the pool whatever order it takes the physical volumes in.
    pub(crate) fn always_created(free: &[u64], data: u64, meta: u64, spare: u64) -> bool {
        lvcreate(free, data, meta, spare)
            .iter()
            .all(|o| *o == Outcome::Created)
    }

    // Two 2 GiB disks: 510 extents of 4 MiB each after the 4 MiB metadata area; 1 GiB of metadata.
    const TWO_GIB_PV: u64 = 510;
    const GIB_OF_EXTENTS: u64 = 256;

    #[test]
    fn two_disks_with_a_gib_of_metadata_and_its_spare_leave_the_data_one_disk_minus_the_metadata() {
        let free = [TWO_GIB_PV, TWO_GIB_PV];
        let cap = max_data_extents(&free, GIB_OF_EXTENTS, GIB_OF_EXTENTS).unwrap();
        // The spare takes one disk's first GiB; only the other disk holds the metadata, behind the data.
        assert_eq!(cap, TWO_GIB_PV - GIB_OF_EXTENTS);
        assert!(always_created(&free, cap, GIB_OF_EXTENTS, GIB_OF_EXTENTS));
    }

    #[test]
    fn what_the_old_plan_asked_for_on_two_disks_aborts_lvm() {
        // Data = all free extents minus metadata and spare: 508 extents (2130706432 bytes).
        let outcomes = lvcreate(&[TWO_GIB_PV; 2], 508, GIB_OF_EXTENTS, GIB_OF_EXTENTS);
        assert!(outcomes.contains(&Outcome::Aborted), "{outcomes:?}");
    }

    #[test]
    fn one_disk_too_small_for_metadata_and_spare_has_no_pool() {
        assert_eq!(
            max_data_extents(&[TWO_GIB_PV], GIB_OF_EXTENTS, GIB_OF_EXTENTS),
            None
        );
        assert!(!always_created(
            &[TWO_GIB_PV],
            1,
            GIB_OF_EXTENTS,
            GIB_OF_EXTENTS
        ));
    }

    #[test]
    fn one_disk_gets_everything_but_metadata_and_spare() {
        assert_eq!(max_data_extents(&[2550], 256, 256), Some(2550 - 512));
    }

    #[test]
    fn three_disks_hold_metadata_and_spare_on_two_and_data_everywhere() {
        let free = [TWO_GIB_PV; 3];
        let cap = max_data_extents(&free, GIB_OF_EXTENTS, GIB_OF_EXTENTS).unwrap();
        assert_eq!(cap, 3 * TWO_GIB_PV - 2 * GIB_OF_EXTENTS);
        assert!(always_created(&free, cap, GIB_OF_EXTENTS, GIB_OF_EXTENTS));
    }

    #[test]
    fn small_metadata_leaves_all_but_twice_the_metadata() {
        let free = [TWO_GIB_PV, TWO_GIB_PV];
        assert_eq!(max_data_extents(&free, 16, 16), Some(2 * TWO_GIB_PV - 32));
    }

    #[test]
    fn an_existing_spare_is_not_allocated_again() {
        assert_eq!(
            max_data_extents(&[TWO_GIB_PV, TWO_GIB_PV], GIB_OF_EXTENTS, 0),
            Some(2 * TWO_GIB_PV - GIB_OF_EXTENTS)
        );
    }

    #[test]
    fn metadata_larger_than_every_disk_has_no_pool() {
        assert_eq!(max_data_extents(&[100, 100, 100], 101, 101), None);
        assert_eq!(max_data_extents(&[100, 100, 100], 101, 0), None);
        assert_eq!(max_data_extents(&[], 1, 1), None);
        assert_eq!(max_data_extents(&[100], 0, 0), None);
    }

    fn frees() -> impl Strategy<Value = Vec<u64>> {
        prop::collection::vec(prop_oneof![0u64..40, 0u64..2_000], 1..=4)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_data_size_up_to_the_limit_is_created_by_lvm(
            free in frees(), meta in 1u64..700, has_spare in any::<bool>(), pick in any::<u64>(),
        ) {
            let spare = if has_spare { 0 } else { meta };
            if let Some(cap) = max_data_extents(&free, meta, spare) {
                prop_assert!(cap >= 1);
                prop_assert!(cap + meta + spare <= free.iter().sum::<u64>());
                for data in [1, cap, 1 + pick % cap] {
                    prop_assert!(
                        always_created(&free, data, meta, spare),
                        "data {} of cap {}: {:?}", data, cap, lvcreate(&free, data, meta, spare)
                    );
                }
            }
        }

        #[test]
        fn the_limit_is_the_largest_size_lvm_always_creates(
            free in frees(), meta in 1u64..700, has_spare in any::<bool>(),
        ) {
            let spare = if has_spare { 0 } else { meta };
            match max_data_extents(&free, meta, spare) {
                Some(cap) => prop_assert!(!always_created(&free, cap + 1, meta, spare)),
                None => prop_assert!(!always_created(&free, 1, meta, spare)),
            }
        }

        #[test]
        fn a_smaller_spare_never_makes_room_that_is_not_there(
            free in frees(), meta in 2u64..700, spare_part in 1u64..700, data in 1u64..4_000,
        ) {
            let spare = spare_part % meta;
            if let Some(cap) = max_data_extents(&free, meta, spare) {
                prop_assert!(always_created(&free, data.min(cap), meta, spare));
            }
        }
    }
}
