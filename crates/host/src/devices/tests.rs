use std::path::Path;

use super::*;
use crate::fake::FakeRunner;

const LSBLK_LOOPS: &str = include_str!("../../tests/fixtures/lsblk/loops.json");
const LSBLK_VDA: &str = include_str!("../../tests/fixtures/lsblk/vda.json");
const LSBLK_UDEV: &str = include_str!("../../tests/fixtures/lsblk/vm-udev.handwritten.json");
const BLKID_LVM: &str = include_str!("../../tests/fixtures/blkid/loop0.export");
const BLKID_GPT: &str = include_str!("../../tests/fixtures/blkid/loop3.export");
const BLKID_PART: &str = include_str!("../../tests/fixtures/blkid/loop3p1.export");
const BLKID_XFS: &str = include_str!("../../tests/fixtures/blkid/loop4.export");
const BLKID_EXT4: &str = include_str!("../../tests/fixtures/blkid/loop5.export");
const BLKID_EPERM: &str = include_str!("../../tests/fixtures/blkid/vda.eperm.stderr");
const BLKID_AMBIVALENT: &str = include_str!("../../tests/fixtures/blkid/loop6.ambivalent.stderr");
const WIPEFS_BUSY: &str = include_str!("../../tests/fixtures/wipefs/busy.stderr.txt");

const LSBLK: &[&str] = &["lsblk", "-J", "-b", "-o", LSBLK_COLUMNS];

fn blkid(dev: &str) -> Vec<&str> {
    vec!["blkid", "-p", "-o", "export", dev]
}

fn find<'a>(devs: &'a [BlockDevice], name: &str) -> &'a BlockDevice {
    fn walk<'a>(devs: &'a [BlockDevice], name: &str) -> Option<&'a BlockDevice> {
        devs.iter().find_map(|d| {
            if d.name == name {
                Some(d)
            } else {
                walk(&d.children, name)
            }
        })
    }
    walk(devs, name).unwrap_or_else(|| panic!("no device {name}"))
}

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn symlink(target: &str, link: &Path) {
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, link).unwrap();
}

// ---- parsers ----

#[test]
fn lsblk_without_udev_gives_the_tree_and_no_signatures() {
    let devs = parse_lsblk(LSBLK_LOOPS).unwrap();
    let top: Vec<_> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        top,
        [
            "loop0", "loop1", "loop2", "loop3", "loop4", "loop5", "loop6", "loop7", "zram0", "vda"
        ]
    );
    let loop3 = find(&devs, "loop3");
    assert_eq!(loop3.kind, DeviceKind::Loop);
    assert_eq!(loop3.size, 512 * 1024 * 1024);
    let parts: Vec<_> = loop3.children.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(parts, ["/dev/loop3p1", "/dev/loop3p2"]);
    assert_eq!(loop3.children[0].kind, DeviceKind::Part);
    assert_eq!(loop3.children[0].partlabel, None, "no udev, no partlabel");
    assert!(devs.iter().all(|d| d.fstype.is_none()));
    assert_eq!(
        find(&devs, "loop4").mountpoints,
        ["/tmp/lvmcap/mnt with space"]
    );
    assert!(
        find(&devs, "loop0").mountpoints.is_empty(),
        "[null] is no mountpoint"
    );
    assert!(find(&devs, "loop0").rotational);
    assert!(!find(&devs, "zram0").rotational);
    assert_eq!(find(&devs, "zram0").size, 0);
}

#[test]
fn lsblk_of_one_device_parses() {
    let devs = parse_lsblk(LSBLK_VDA).unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(devs[0].path, "/dev/vda");
    assert_eq!(devs[0].kind, DeviceKind::Disk);
    assert_eq!(devs[0].mountpoints, ["/"]);
    assert_eq!(devs[0].size, 274_877_906_944);
}

#[test]
fn lsblk_with_udev_gives_signatures_labels_serials_and_stacked_volumes() {
    let devs = parse_lsblk(LSBLK_UDEV).unwrap();
    let sr0 = find(&devs, "sr0");
    assert_eq!(sr0.kind, DeviceKind::Rom);
    assert_eq!(sr0.model.as_deref(), Some("QEMU DVD-ROM"));
    assert_eq!(sr0.state.as_deref(), Some("running"));
    let vda1 = find(&devs, "vda1");
    assert_eq!(vda1.partlabel.as_deref(), Some("root"));
    assert_eq!(vda1.mountpoints, ["/", "/var/lib/kubelet"]);
    let vdb = find(&devs, "vdb");
    assert_eq!(vdb.fstype.as_deref(), Some("LVM2_member"));
    assert_eq!(
        vdb.serial.as_deref(),
        Some("lvms-disk-1"),
        "trailing blanks trimmed"
    );
    let thin = find(&devs, "lvms--vg-pvc--1");
    assert_eq!(thin.kind, DeviceKind::Lvm);
    assert_eq!(thin.kname, "dm-4");
    assert_eq!(thin.path, "/dev/mapper/lvms--vg-pvc--1");
    let vdc = find(&devs, "vdc");
    assert_eq!(vdc.model, None, "empty model is no model");
    assert!(!vdc.rotational);
}

#[test]
fn lsblk_from_old_util_linux_with_string_numbers_parses() {
    let old = r#"{"blockdevices": [{"name":"sda","kname":"sda","path":"/dev/sda","type":"disk",
        "size":"1024","ro":"1","state":null,"partlabel":null,"fstype":null,"rota":"0",
        "serial":null,"model":null,"pkname":null}]}"#;
    let devs = parse_lsblk(old).unwrap();
    assert_eq!(devs[0].size, 1024);
    assert!(devs[0].read_only);
    assert!(!devs[0].rotational);
    assert!(devs[0].mountpoints.is_empty());
}

#[test]
fn lsblk_garbage_is_an_error() {
    assert!(parse_lsblk("").is_err());
    assert!(parse_lsblk(r#"{"blockdevices":[{"name":"x"}]}"#).is_err());
}

#[test]
fn blkid_export_gives_type_then_partition_table_type() {
    assert_eq!(
        parse_blkid_export(BLKID_LVM).as_deref(),
        Some("LVM2_member")
    );
    assert_eq!(parse_blkid_export(BLKID_GPT).as_deref(), Some("gpt"));
    assert_eq!(parse_blkid_export(BLKID_XFS).as_deref(), Some("xfs"));
    assert_eq!(parse_blkid_export(BLKID_EXT4).as_deref(), Some("ext4"));
    assert_eq!(
        parse_blkid_export(BLKID_PART),
        None,
        "PART_ENTRY_* is no signature"
    );
    assert_eq!(parse_blkid_export(""), None);
}

#[tokio::test]
async fn probe_reads_blkid_exit_codes() {
    let fake = FakeRunner::new();
    fake.expect(&blkid("/dev/loop4")).stdout(BLKID_XFS);
    fake.expect(&blkid("/dev/loop2")).fails(2, "");
    fake.expect(&blkid("/dev/loop6")).fails(8, BLKID_AMBIVALENT);
    fake.expect(&blkid("/dev/vda")).fails(2, BLKID_EPERM);
    fake.expect(&blkid("/dev/vdb")).fails(4, "blkid: bad usage");
    assert_eq!(
        probe_signature(&fake, "/dev/loop4")
            .await
            .unwrap()
            .as_deref(),
        Some("xfs")
    );
    assert_eq!(probe_signature(&fake, "/dev/loop2").await.unwrap(), None);
    assert_eq!(
        probe_signature(&fake, "/dev/loop6")
            .await
            .unwrap()
            .as_deref(),
        Some(AMBIVALENT_SIGNATURE)
    );
    let err = probe_signature(&fake, "/dev/vda").await.unwrap_err();
    assert!(err.to_string().contains("Operation not permitted"), "{err}");
    assert!(matches!(
        probe_signature(&fake, "/dev/vdb").await,
        Err(Error::CommandFailed { code: Some(4), .. })
    ));
    fake.assert_done();
}

#[tokio::test]
async fn probe_refuses_paths_outside_dev() {
    let fake = FakeRunner::new();
    assert!(matches!(
        probe_signature(&fake, "-p").await,
        Err(Error::InvalidDevicePath { .. })
    ));
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn zeroing_a_range_names_its_offset_and_length_in_bytes_and_a_busy_device_is_in_use() {
    let fake = FakeRunner::new();
    fake.expect(&[
        "blkdiscard",
        "--zeroout",
        "--offset",
        "1073741824",
        "--length",
        "536870912",
        "/dev/san/csi-a",
    ])
    .succeeds();
    fake.expect(&["sync", "/dev/san/csi-a"]).succeeds();
    fake.expect(&[
        "blkdiscard",
        "--zeroout",
        "--offset",
        "0",
        "--length",
        "4096",
        "/dev/san/csi-a",
    ])
    .fails(
        1,
        "blkdiscard: cannot open /dev/san/csi-a: Device or resource busy",
    );
    zero_range(&fake, "/dev/san/csi-a", 1 << 30, 1 << 29)
        .await
        .unwrap();
    flush(&fake, "/dev/san/csi-a").await.unwrap();
    let err = zero_range(&fake, "/dev/san/csi-a", 0, 4096)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert!(matches!(
        zero_range(&fake, "--all", 0, 4096).await,
        Err(Error::InvalidDevicePath { .. })
    ));
    assert!(matches!(
        flush(&fake, "-f").await,
        Err(Error::InvalidDevicePath { .. })
    ));
    fake.assert_done();
}

// ---- discovery ----

#[tokio::test]
async fn discover_enriches_lsblk_with_probe_by_id_links_and_loop_files() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = (tmp.path().join("sys"), tmp.path().join("dev"));
    write(
        &sys.join("block/loop0/loop/backing_file"),
        "/tmp/lvmcap/d0.img\n",
    );
    write(
        &sys.join("block/loop3/loop/backing_file"),
        "/var/disks/with space.img\n",
    );
    symlink("../../loop3", &dev.join("disk/by-id/virtio-disk-a"));
    symlink("../../loop3p1", &dev.join("disk/by-id/virtio-disk-a-part1"));
    symlink("../../loop3", &dev.join("disk/by-id/wwn-0x5000"));
    symlink("../../vda", &dev.join("disk/by-id/virtio-root"));

    let fake = FakeRunner::new();
    fake.expect(LSBLK).stdout(LSBLK_LOOPS);
    fake.expect(&blkid("/dev/loop0")).stdout(BLKID_LVM);
    fake.expect(&blkid("/dev/loop1")).stdout(BLKID_LVM);
    fake.expect(&blkid("/dev/loop2")).stdout(BLKID_LVM);
    fake.expect(&blkid("/dev/loop3")).stdout(BLKID_GPT);
    fake.expect(&blkid("/dev/loop3p1")).stdout(BLKID_PART);
    fake.expect(&blkid("/dev/loop3p2")).fails(2, "");
    fake.expect(&blkid("/dev/loop4")).stdout(BLKID_XFS);
    fake.expect(&blkid("/dev/loop5")).stdout(BLKID_EXT4);
    fake.expect(&blkid("/dev/loop6")).fails(8, BLKID_AMBIVALENT);
    fake.expect(&blkid("/dev/loop7")).stdout(BLKID_LVM);
    // zram0 has size 0: not probed.
    fake.expect(&blkid("/dev/vda")).fails(2, BLKID_EPERM);

    let devices = Devices::new(fake.clone()).with_roots(&sys, &dev);
    let devs = devices.discover().await.unwrap();
    fake.assert_done();

    let sig = |n: &str| find(&devs, n).fstype.clone();
    assert_eq!(sig("loop0").as_deref(), Some("LVM2_member"));
    assert_eq!(sig("loop3").as_deref(), Some("gpt"));
    assert_eq!(sig("loop3p1"), None);
    assert_eq!(sig("loop3p2"), None);
    assert_eq!(sig("loop6").as_deref(), Some(AMBIVALENT_SIGNATURE));
    assert_eq!(sig("zram0"), None);
    assert_eq!(
        sig("vda").as_deref(),
        Some(UNKNOWN_SIGNATURE),
        "unreadable is never blank"
    );

    assert_eq!(
        find(&devs, "loop3").by_id,
        [
            "/dev/disk/by-id/virtio-disk-a",
            "/dev/disk/by-id/wwn-0x5000"
        ]
    );
    assert_eq!(
        find(&devs, "loop3p1").by_id,
        ["/dev/disk/by-id/virtio-disk-a-part1"]
    );
    assert_eq!(find(&devs, "vda").by_id, ["/dev/disk/by-id/virtio-root"]);
    assert!(find(&devs, "loop1").by_id.is_empty());

    assert_eq!(
        find(&devs, "loop0").loop_backing_file.as_deref(),
        Some("/tmp/lvmcap/d0.img")
    );
    assert_eq!(
        find(&devs, "loop3").loop_backing_file.as_deref(),
        Some("/var/disks/with space.img")
    );
    assert_eq!(find(&devs, "loop1").loop_backing_file, None);
    assert_eq!(find(&devs, "vda").loop_backing_file, None);
}

#[tokio::test]
async fn discover_with_udev_probes_unknown_signatures_and_lvm_labels_but_no_logical_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeRunner::new();
    fake.expect(LSBLK).stdout(LSBLK_UDEV);
    // sr0 (iso9660) and vda1 (ext4) are known; dm-0, dm-2 and dm-4 are LVs. vdb's LVM label,
    // which lvms-rs itself writes and removes, is checked on the device: here udev's database
    // still had it after a pvremove.
    fake.expect(&blkid("/dev/vda")).stdout(BLKID_GPT);
    fake.expect(&blkid("/dev/vdb")).fails(2, "");
    fake.expect(&blkid("/dev/vdc")).fails(2, "");
    let devices =
        Devices::new(fake.clone()).with_roots(tmp.path().join("sys"), tmp.path().join("dev"));
    let devs = devices.discover().await.unwrap();
    fake.assert_done();
    assert_eq!(find(&devs, "vda").fstype.as_deref(), Some("gpt"));
    assert_eq!(find(&devs, "vdc").fstype, None);
    assert_eq!(
        find(&devs, "vdb").fstype,
        None,
        "a stale LVM label is not kept"
    );
    assert_eq!(find(&devs, "lvms--vg-pool-tpool").fstype, None);
}

/// `tests/fixtures/real/`: lsblk and blkid in the test VM (udev running, VGs active).
#[tokio::test]
async fn discover_in_the_vm_probes_lvm_labels_and_disks_and_partitions_without_a_known_signature() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = FakeRunner::new();
    fake.expect(LSBLK)
        .stdout(include_str!("../../tests/fixtures/real/lsblk-fields.json"));
    for pv in ["/dev/vda", "/dev/vdb", "/dev/vdc"] {
        fake.expect(&blkid(pv)).stdout(BLKID_LVM);
    }
    fake.expect(&blkid("/dev/vde"))
        .stdout(include_str!("../../tests/fixtures/real/blkid-gpt.txt"));
    fake.expect(&blkid("/dev/vde1")).fails(2, "");
    fake.expect(&blkid("/dev/vde2")).fails(2, "");
    let devices =
        Devices::new(fake.clone()).with_roots(tmp.path().join("sys"), tmp.path().join("dev"));
    let devs = devices.discover().await.unwrap();
    fake.assert_done();
    assert_eq!(find(&devs, "vda").fstype.as_deref(), Some("LVM2_member"));
    assert_eq!(find(&devs, "vda").serial.as_deref(), Some("fx0"));
    assert_eq!(find(&devs, "vdd").fstype.as_deref(), Some("ext4"));
    assert_eq!(find(&devs, "vde").fstype.as_deref(), Some("gpt"));
    assert_eq!(find(&devs, "vde1").partlabel.as_deref(), Some("BIOS boot"));
    let raid = find(&devs, "vg1-raid1");
    assert_eq!(
        (raid.kname.as_str(), &raid.kind),
        ("dm-11", &DeviceKind::Lvm)
    );
    let vda = find(&devs, "vda");
    let tpool = &vda.children[0].children[0];
    assert_eq!(tpool.name, "vg1-pool1-tpool");
    assert_eq!(tpool.children.len(), 2);
}

#[test]
fn blkid_from_the_vm_parses() {
    let ext4 = include_str!("../../tests/fixtures/real/blkid-ext4.txt");
    assert_eq!(parse_blkid_export(ext4).as_deref(), Some("ext4"));
}

#[tokio::test]
async fn discover_fails_when_lsblk_fails() {
    let fake = FakeRunner::new();
    fake.expect(LSBLK)
        .fails(1, "lsblk: unknown column: MOUNTPOINTS");
    let err = Devices::new(fake).discover().await.unwrap_err();
    assert!(matches!(err, Error::CommandFailed { .. }), "{err:?}");
}

#[tokio::test]
async fn resolve_path_follows_symlinks_and_misses_are_none() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("dev/vdb"), "");
    symlink("../../vdb", &tmp.path().join("dev/disk/by-id/virtio-1"));
    let devices = Devices::new(FakeRunner::new());
    let link = tmp.path().join("dev/disk/by-id/virtio-1");
    let resolved = devices.resolve_path(link.to_str().unwrap()).await.unwrap();
    assert_eq!(
        Path::new(&resolved),
        tmp.path().join("dev/vdb").canonicalize().unwrap()
    );
    assert_eq!(devices.resolve_path("/dev/lvms-no-such-device").await, None);
}

// ---- wipe ----

/// A disk vdb with partitions vdb1 (holding dm-0 "vg-lv1") and vdb2, itself holding dm-1 "vg2-pool_tdata"
/// which is held by dm-2 "vg2-pool" (thin pool on top).
fn wipe_tree(root: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (sys, dev) = (root.join("sys"), root.join("dev"));
    write(&dev.join("vdb"), "");
    symlink("../../vdb", &dev.join("disk/by-id/virtio-d1"));
    let blk = sys.join("class/block");
    write(&blk.join("vdb/vdb1/partition"), "1\n");
    write(&blk.join("vdb/vdb2/partition"), "2\n");
    write(&blk.join("vdb/queue/rotational"), "1\n");
    write(&blk.join("vdb/holders/dm-1"), "");
    write(&blk.join("vdb1/holders/dm-0"), "");
    std::fs::create_dir_all(blk.join("vdb2/holders")).unwrap();
    write(&blk.join("dm-0/dm/name"), "vg-lv1\n");
    std::fs::create_dir_all(blk.join("dm-0/holders")).unwrap();
    write(&blk.join("dm-1/dm/name"), "vg2-pool_tdata\n");
    write(&blk.join("dm-1/holders/dm-2"), "");
    write(&blk.join("dm-2/dm/name"), "vg2-pool\n");
    (sys, dev)
}

#[tokio::test]
async fn wipe_removes_holders_innermost_first_then_wipes_partitions_and_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = wipe_tree(tmp.path());
    let fake = FakeRunner::new();
    fake.expect(&["dmsetup", "remove", "vg-lv1"]).succeeds();
    fake.expect(&["dmsetup", "remove", "vg2-pool"]).succeeds();
    fake.expect(&["dmsetup", "remove", "vg2-pool_tdata"])
        .succeeds();
    fake.expect(&["wipefs", "--all", "/dev/vdb1", "/dev/vdb2", "/dev/vdb"])
        .succeeds();
    fake.expect(&blkid("/dev/vdb")).fails(2, "");
    Devices::new(fake.clone())
        .with_roots(&sys, &dev)
        .wipe("/dev/vdb")
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn wipe_through_a_by_id_link_finds_the_kernel_device() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = wipe_tree(tmp.path());
    std::fs::remove_dir_all(sys.join("class/block/vdb/holders")).unwrap();
    std::fs::remove_dir_all(sys.join("class/block/vdb1/holders")).unwrap();
    let fake = FakeRunner::new();
    fake.expect(&[
        "wipefs",
        "--all",
        "/dev/vdb1",
        "/dev/vdb2",
        "/dev/disk/by-id/virtio-d1",
    ])
    .succeeds();
    fake.expect(&blkid("/dev/disk/by-id/virtio-d1"))
        .fails(2, "");
    Devices::new(fake.clone())
        .with_roots(&sys, &dev)
        .wipe("/dev/disk/by-id/virtio-d1")
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn wipe_with_a_remaining_signature_fails() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = (tmp.path().join("sys"), tmp.path().join("dev"));
    write(&dev.join("vdc"), "");
    let fake = FakeRunner::new();
    fake.expect(&["wipefs", "--all", "/dev/vdc"]).succeeds();
    fake.expect(&blkid("/dev/vdc")).stdout(BLKID_XFS);
    let err = Devices::new(fake)
        .with_roots(&sys, &dev)
        .wipe("/dev/vdc")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::WipeIncomplete { signature, .. } if signature == "xfs"),
        "{err:?}"
    );
}

#[tokio::test]
async fn wipe_of_a_mounted_device_is_in_use() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = (tmp.path().join("sys"), tmp.path().join("dev"));
    write(&dev.join("loop4"), "");
    let fake = FakeRunner::new();
    fake.expect(&["wipefs", "--all", "/dev/loop4"])
        .fails(1, WIPEFS_BUSY);
    let err = Devices::new(fake)
        .with_roots(&sys, &dev)
        .wipe("/dev/loop4")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
}

#[tokio::test]
async fn wipe_refuses_a_holder_that_is_not_device_mapper() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = (tmp.path().join("sys"), tmp.path().join("dev"));
    write(&dev.join("vdd"), "");
    write(&sys.join("class/block/vdd/holders/md0"), "");
    std::fs::create_dir_all(sys.join("class/block/md0/holders")).unwrap();
    let fake = FakeRunner::new();
    let err = Devices::new(fake.clone())
        .with_roots(&sys, &dev)
        .wipe("/dev/vdd")
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::InUse(ref m) if m.contains("md0")),
        "{err:?}"
    );
    assert!(fake.calls().is_empty(), "nothing was wiped");
}

#[tokio::test]
async fn wipe_stops_when_a_holder_is_busy() {
    let tmp = tempfile::tempdir().unwrap();
    let (sys, dev) = wipe_tree(tmp.path());
    let fake = FakeRunner::new();
    fake.expect(&["dmsetup", "remove", "vg-lv1"]).fails(
        1,
        "device-mapper: remove ioctl on vg-lv1  failed: Device or resource busy\nCommand failed.\n",
    );
    let err = Devices::new(fake.clone())
        .with_roots(&sys, &dev)
        .wipe("/dev/vdb")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    fake.assert_done();
}

#[tokio::test]
async fn wipe_of_a_missing_device_is_an_io_error() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Devices::new(FakeRunner::new())
        .with_roots(tmp.path().join("sys"), tmp.path().join("dev"))
        .wipe("/dev/nope")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}
