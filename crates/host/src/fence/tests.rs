use std::os::unix::fs::symlink;

use super::*;
use crate::fake::FakeRunner;

/// A sysfs tree under `root`: each device as (kernel name, dm name, holders by kernel name).
fn sysfs(root: &Path, devices: &[(&str, &str, &[&str])]) {
    let block = root.join("block");
    for (kernel, name, holders) in devices {
        let dev = block.join(kernel);
        std::fs::create_dir_all(dev.join("dm")).unwrap();
        std::fs::create_dir_all(dev.join("holders")).unwrap();
        std::fs::write(dev.join("dm/name"), format!("{name}\n")).unwrap();
        for h in *holders {
            symlink(block.join(h), dev.join("holders").join(h)).unwrap();
        }
    }
    // Not device-mapper devices: skipped.
    std::fs::create_dir_all(block.join("vda")).unwrap();
}

#[test]
fn devices_of_reads_the_groups_devices_and_their_holders_by_name() {
    let dir = tempfile::tempdir().unwrap();
    sysfs(
        dir.path(),
        &[
            ("dm-0", "lunpath", &["dm-1", "dm-2"]),
            ("dm-1", "san-pool_tdata", &["dm-3"]),
            ("dm-2", "san-lvmlock", &[]),
            ("dm-3", "san-pool-tpool", &["dm-4"]),
            ("dm-4", "san-thin1", &[]),
            ("dm-5", "other-lin", &[]),
            ("dm-6", "san--x-lin", &[]),
        ],
    );
    let devices = devices_of(dir.path(), "san").unwrap();
    let expected: BTreeMap<String, BTreeSet<String>> = [
        ("san-lvmlock", vec![]),
        ("san-pool_tdata", vec!["san-pool-tpool"]),
        ("san-pool-tpool", vec!["san-thin1"]),
        ("san-thin1", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(devices, expected);
    assert_eq!(devices_of(dir.path(), "san-x").unwrap().len(), 1);
}

fn two_devices() -> BTreeMap<String, BTreeSet<String>> {
    BTreeMap::from([
        (
            "san-pool-tpool".to_owned(),
            BTreeSet::from(["san-thin1".to_owned()]),
        ),
        ("san-thin1".to_owned(), BTreeSet::new()),
    ])
}

#[tokio::test]
async fn every_table_is_wiped_holders_first_then_unopened_devices_go() {
    let fake = FakeRunner::new();
    fake.expect(&[
        "dmsetup",
        "wipe_table",
        "--noflush",
        "--nolockfs",
        "san-thin1",
    ])
    .stdout("");
    fake.expect(&[
        "dmsetup",
        "wipe_table",
        "--noflush",
        "--nolockfs",
        "san-pool-tpool",
    ])
    .stdout("");
    // The thin volume is mounted: it stays, failing every I/O.
    fake.expect(&["dmsetup", "remove", "san-thin1"]).fails(
        1,
        "device-mapper: remove ioctl on san-thin1 failed: Device or resource busy",
    );
    fake.expect(&["dmsetup", "remove", "san-pool-tpool"])
        .stdout("");
    let report = fence(&fake, "san", &two_devices()).await;
    fake.assert_done();
    assert!(report.fenced(), "{report:?}");
    assert_eq!(
        report
            .devices
            .iter()
            .map(|d| (d.device.as_str(), d.wiped, d.removed))
            .collect::<Vec<_>>(),
        vec![("san-thin1", true, false), ("san-pool-tpool", true, true)]
    );
}

#[tokio::test]
async fn a_device_neither_wiped_nor_removed_leaves_the_group_unfenced() {
    let fake = FakeRunner::new();
    fake.expect(&[
        "dmsetup",
        "wipe_table",
        "--noflush",
        "--nolockfs",
        "san-thin1",
    ])
    .fails(1, "device-mapper: reload ioctl on san-thin1 failed");
    fake.expect(&[
        "dmsetup",
        "wipe_table",
        "--noflush",
        "--nolockfs",
        "san-pool-tpool",
    ])
    .stdout("");
    fake.expect(&["dmsetup", "remove", "san-thin1"])
        .fails(1, "busy");
    fake.expect(&["dmsetup", "remove", "san-pool-tpool"])
        .fails(1, "busy");
    let report = fence(&fake, "san", &two_devices()).await;
    fake.assert_done();
    assert!(!report.fenced());
    assert!(
        report.devices[0].error.contains("reload ioctl"),
        "{report:?}"
    );
}

#[tokio::test]
async fn a_group_with_nothing_active_is_fenced_at_once() {
    let fake = FakeRunner::new();
    let report = fence(&fake, "san", &BTreeMap::new()).await;
    fake.assert_done();
    assert!(report.fenced());
}

#[test]
fn open_counts_are_read_per_device_and_odd_lines_skipped() {
    let text = "san-csi--a,1\nsan-pool--a-tpool,1\nother-vol,0\nNo devices found\n";
    let counts = parse_open_counts(text);
    assert_eq!(counts.get("san-csi--a"), Some(&1));
    assert_eq!(counts.get("other-vol"), Some(&0));
    assert_eq!(counts.len(), 3);
}

#[test]
fn lv_device_finds_an_lvm_volume_by_its_lv_name_in_any_group() {
    let dir = tempfile::tempdir().unwrap();
    sysfs(
        dir.path(),
        &[
            ("dm-0", "lunpath", &[]),
            ("dm-1", "other-csi--1", &[]),
            ("dm-2", "san-csi--1", &[]),
            ("dm-3", "san-csi--12", &[]),
        ],
    );
    let block = dir.path().join("block");
    for (kernel, uuid, dev) in [
        ("dm-0", "mpath-lun0", "253:0"),
        // Not LVM's, though named like one of its volumes.
        ("dm-1", "CRYPT-LUKS2-1", "253:1"),
        ("dm-2", "LVM-abcdef", "253:2"),
        ("dm-3", "LVM-ghijkl", "253:3"),
    ] {
        std::fs::write(block.join(kernel).join("dm/uuid"), format!("{uuid}\n")).unwrap();
        std::fs::write(block.join(kernel).join("dev"), format!("{dev}\n")).unwrap();
    }
    assert_eq!(
        lv_device(dir.path(), "csi-1").unwrap(),
        Some(LvDevice {
            kernel: "dm-2".to_owned(),
            name: "san-csi--1".to_owned(),
            vg: "san".to_owned(),
            dev: (253, 2),
        })
    );
    assert_eq!(
        lv_device(dir.path(), "csi-12").unwrap().unwrap().dev,
        (253, 3)
    );
    assert_eq!(lv_device(dir.path(), "csi-2").unwrap(), None);
    assert_eq!(lv_device(dir.path(), "lun0").unwrap(), None);
}
