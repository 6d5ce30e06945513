use proptest::prelude::*;

use super::*;
use crate::size::GIB;

const EXTENT: u64 = 4 * MIB;

fn free(extents: &[u64]) -> FreeSpace {
    FreeSpace::new(EXTENT, extents.iter().map(|e| e * EXTENT))
}

fn mirror(mirrors: u32, integrity: bool) -> Layout {
    Layout::Mirror {
        mirrors,
        nosync: false,
        integrity,
    }
}

fn raid(level: RaidType, mirrors: Option<u32>, stripes: Option<u32>) -> Layout {
    Layout::Raid {
        level,
        mirrors,
        stripes,
        stripe_size: None,
        nosync: false,
        integrity: false,
    }
}

fn striped(stripes: Option<u32>) -> Layout {
    Layout::Striped {
        stripes,
        stripe_size: None,
    }
}

#[test]
fn free_space_sorts_devices_largest_first_in_whole_extents() {
    let f = FreeSpace::new(EXTENT, [EXTENT, 510 * EXTENT + 1, 0]);
    assert_eq!(f.free_extents, [510, 1, 0]);
    assert_eq!(f.devices(), 3);
}

#[test]
fn linear_takes_every_free_extent_of_every_device() {
    assert_eq!(Layout::Linear.max_size(&free(&[510, 300, 2])), 812 * EXTENT);
}

#[test]
fn mirror_is_one_copy_on_each_of_the_two_emptiest_devices_less_its_raid_metadata() {
    // Two 2 GiB disks (510 extents each): 509 extents of data and one of _rmeta on each.
    assert_eq!(mirror(1, false).max_size(&free(&[510, 510])), 509 * EXTENT);
    // The second-largest device bounds it; a third device adds nothing to a two-way mirror.
    assert_eq!(
        mirror(1, false).max_size(&free(&[510, 100, 510])),
        509 * EXTENT
    );
    assert_eq!(mirror(1, false).max_size(&free(&[510, 100])), 99 * EXTENT);
    assert_eq!(
        mirror(2, false).max_size(&free(&[510, 510, 100])),
        99 * EXTENT
    );
}

#[test]
fn a_layout_that_needs_more_devices_than_the_group_has_makes_nothing() {
    assert_eq!(mirror(1, false).max_size(&free(&[510])), 0);
    assert_eq!(mirror(1, false).devices_needed(1), 2);
    assert_eq!(striped(Some(3)).max_size(&free(&[510, 510])), 0);
    assert_eq!(
        raid(RaidType::Raid5, None, None).max_size(&free(&[510, 510])),
        0
    );
    assert_eq!(raid(RaidType::Raid10, None, None).devices_needed(9), 4);
    assert_eq!(Layout::Linear.devices_needed(0), 1);
    assert_eq!(Layout::Linear.max_size(&free(&[])), 0);
}

#[test]
fn striped_is_stripes_times_the_emptiest_chosen_device_and_defaults_to_every_device() {
    assert_eq!(
        striped(Some(2)).max_size(&free(&[510, 300, 510])),
        1020 * EXTENT
    );
    assert_eq!(
        striped(None).max_size(&free(&[510, 300, 510])),
        900 * EXTENT
    );
    assert_eq!(
        striped(None).resolved(3),
        Layout::Striped {
            stripes: Some(3),
            stripe_size: None
        }
    );
    assert_eq!(striped(Some(2)).resolved(3), striped(Some(2)));
}

#[test]
fn raid_levels_count_their_images_and_data_stripes() {
    let three = free(&[510, 510, 510]);
    assert_eq!(
        raid(RaidType::Raid1, None, None).max_size(&three),
        509 * EXTENT
    );
    // raid5 over 2 data stripes and parity: 3 images, twice one image's data.
    assert_eq!(
        raid(RaidType::Raid5, None, None).max_size(&three),
        2 * 509 * EXTENT
    );
    assert_eq!(
        raid(RaidType::Raid4, None, Some(2)).max_size(&three),
        2 * 509 * EXTENT
    );
    let five = free(&[510; 5]);
    assert_eq!(
        raid(RaidType::Raid6, None, None).max_size(&five),
        3 * 509 * EXTENT
    );
    let four = free(&[510; 4]);
    assert_eq!(
        raid(RaidType::Raid10, None, None).max_size(&four),
        2 * 509 * EXTENT
    );
    assert_eq!(
        raid(RaidType::Raid10, Some(1), Some(2)).images(4),
        Some((4, 2))
    );
}

#[test]
fn integrity_metadata_is_4_mib_per_started_500_mib_and_the_journals_in_whole_extents() {
    // Up to 512 MiB of data: 4 MiB of journals beside the 4 MiB block per started 500 MiB.
    assert_eq!(integrity_metadata_extents(1, EXTENT), 2);
    // 244 MiB, the raid1 image lvm2 2.03.31 refused with one extent: "2 extents needed".
    assert_eq!(integrity_metadata_extents(61, EXTENT), 2);
    assert_eq!(integrity_metadata_extents(124, EXTENT), 2);
    assert_eq!(integrity_metadata_extents(125, EXTENT), 3);
    // Over 512 MiB: 8 MiB of journals; over 1 GiB: 32 MiB; over 4 GiB: 64 MiB.
    assert_eq!(integrity_metadata_extents(129, EXTENT), 4);
    assert_eq!(integrity_metadata_extents(257, EXTENT), 8 + 3);
    assert_eq!(integrity_metadata_extents(1025, EXTENT), 16 + 9);
    // 1 GiB extents: 8 MiB still takes a whole extent.
    assert_eq!(integrity_metadata_extents(3, GIB), 1);
    assert_eq!(integrity_metadata_extents(5, 0), 0);
}

#[test]
fn mirror_with_integrity_leaves_room_for_each_images_integrity_metadata() {
    // 510 extents per device: 1 _rmeta, and for d data extents the metadata above.
    let size = mirror(1, true).max_size(&free(&[510, 510]));
    let data = size / EXTENT;
    assert_eq!(data, 497, "497 + 1 + (4 + 8) = 510");
    assert_eq!(data + 1 + integrity_metadata_extents(data, EXTENT), 510);
    assert!(data + 1 + 1 + integrity_metadata_extents(data + 1, EXTENT) > 510);
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        Just(Layout::Linear),
        (proptest::option::of(1u32..5)).prop_map(striped),
        (1u32..3, any::<bool>()).prop_map(|(m, i)| mirror(m, i)),
        (
            prop_oneof![
                Just(RaidType::Raid1),
                Just(RaidType::Raid4),
                Just(RaidType::Raid5),
                Just(RaidType::Raid6),
                Just(RaidType::Raid10)
            ],
            proptest::option::of(1u32..3),
            proptest::option::of(2u32..4),
            any::<bool>()
        )
            .prop_map(|(level, mirrors, stripes, integrity)| Layout::Raid {
                level,
                mirrors,
                stripes,
                stripe_size: None,
                nosync: false,
                integrity,
            }),
    ]
}

proptest! {
    /// What is reported fits: every image (data, _rmeta, _imeta) on its own device, the images
    /// on the emptiest devices that can hold them, and never more than the group has free.
    #[test]
    fn the_reported_maximum_fits_image_by_image(
        layout in layout(),
        devices in proptest::collection::vec(0u64..5000, 0..7),
    ) {
        let f = free(&devices);
        let size = layout.max_size(&f);
        prop_assert_eq!(size % EXTENT, 0);
        let total: u64 = devices.iter().sum();
        prop_assert!(size / EXTENT <= total);
        if let Some((images, data_stripes)) = layout.images(f.devices())
            && size > 0
        {
            prop_assert!(images <= f.devices());
            let data = size / EXTENT / data_stripes;
            let meta = u64::from(!matches!(layout, Layout::Striped { .. }));
            let integrity = matches!(
                layout,
                Layout::Mirror { integrity: true, .. } | Layout::Raid { integrity: true, .. }
            );
            let image = data + meta
                + if integrity { integrity_metadata_extents(data, EXTENT) } else { 0 };
            let chosen = &f.free_extents[..usize::try_from(images).unwrap()];
            prop_assert!(chosen.iter().all(|free| *free >= image));
        }
    }
}

#[test]
fn every_layout_goes_through_a_logical_volume_unchanged() {
    let all = [
        Layout::Linear,
        striped(None),
        Layout::Striped {
            stripes: Some(3),
            stripe_size: Some(64 << 10),
        },
        mirror(1, false),
        Layout::Mirror {
            mirrors: 2,
            nosync: true,
            integrity: true,
        },
        raid(RaidType::Raid10, Some(1), Some(2)),
        Layout::Raid {
            level: RaidType::Raid5,
            mirrors: None,
            stripes: Some(3),
            stripe_size: Some(1 << 20),
            nosync: true,
            integrity: false,
        },
    ];
    for layout in all {
        let api = layout.to_api();
        let json = serde_json::to_value(&api).unwrap();
        let back: VolumeLayout = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(Layout::from_api(&back), Ok(layout), "{json}");
    }
    assert_eq!(
        serde_json::to_value(mirror(1, false).to_api()).unwrap(),
        serde_json::json!({"type": "mirror", "mirrors": 1})
    );
}

#[test]
fn a_logical_volume_layout_that_makes_no_sense_is_refused_naming_the_field() {
    for (json, needle) in [
        (
            serde_json::json!({"type": "linear", "mirrors": 1}),
            "spec.layout.mirrors does not apply",
        ),
        (
            serde_json::json!({"type": "striped", "integrity": true}),
            "spec.layout.integrity does not apply",
        ),
        (
            serde_json::json!({"type": "raid5", "stripeSize": "3000"}),
            "spec.layout.stripeSize \"3000\"",
        ),
        (
            serde_json::json!({"type": "mirror", "mirrors": 0}),
            "spec.layout.mirrors must be at least 1",
        ),
    ] {
        let api: VolumeLayout = serde_json::from_value(json.clone()).unwrap();
        let err = Layout::from_api(&api).unwrap_err();
        assert!(err.contains(needle), "{json}: {err}");
    }
}
