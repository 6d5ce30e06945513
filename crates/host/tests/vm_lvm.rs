//! The host layer against real LVM, device-mapper, mkfs and mount, inside the test VM (ADR 0002): every
//! operation of `Lvm`, `Devices` and `Filesystems`, with what it did read back through the host API and,
//! where that proves more, independently with `lvm`, `blkid`, `findmnt` and friends.
//!
//! Each test builds its own loop disks (`Scratch`) and volume group, so tests are independent and can run
//! in any order. The VM's virtio disks (`clean*`, `decoy-*`) belong to another test file: they are only
//! read here. Run with `cargo xtask vm-test <name filter>`; on the host every test shows as ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    time::{Duration, Instant},
};

use lvms_core::{
    config::{Fstype, RaidType},
    lvattr::{LvAttr, LvHealth, Permissions, VolumeType},
    model::{DeviceKind, LogicalVolume},
};
use lvms_host::{
    Error,
    devices::Devices,
    fs::{Filesystems, statvfs},
    lvm::{Layout, LvSpec, Lvm, PoolSize, ThinPoolSpec},
    runner::RealRunner,
};
use lvms_testkit::{Scratch, lvs_field, sh, sh_status, unique, vgs_field};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// LVM's default extent size.
const EXTENT: u64 = 4 * MIB;
/// mkfs.xfs (xfsprogs ≥ 5.19) refuses filesystems smaller than 300 MiB.
const XFS_MIN: u64 = 320 * MIB;

static RUNNER: RealRunner = RealRunner;

fn lvm() -> Lvm<&'static RealRunner> {
    Lvm::new(&RUNNER)
}

fn devices() -> Devices<&'static RealRunner> {
    Devices::new(&RUNNER)
}

fn filesystems() -> Filesystems<&'static RealRunner> {
    Filesystems::new(&RUNNER)
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

// ---- independent views of the machine (not through the code under test) ----

/// `pvs` field of one device; empty when LVM does not know the device as a physical volume.
fn pvs_field(dev: &str, field: &str) -> String {
    sh_status(&format!(
        "lvm pvs --noheadings --units b --nosuffix -o {field} {dev} 2>/dev/null"
    ))
    .1
    .trim()
    .to_owned()
}

/// Whether LVM knows `dev` as a physical volume.
fn is_pv(dev: &str) -> bool {
    sh_status(&format!("lvm pvs {dev} >/dev/null 2>&1")).0 == 0
}

/// Names of the visible LVs of a volume group, sorted (`lvm lvs`).
fn lv_names(vg: &str) -> Vec<String> {
    let mut names: Vec<String> = sh(&format!("lvm lvs --noheadings -o lv_name {vg} 2>/dev/null"))
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// `blkid -p`'s TYPE of a device, empty when it has none.
fn blkid_type(dev: &str) -> String {
    sh_status(&format!("blkid -p -o value -s TYPE {dev}"))
        .1
        .trim()
        .to_owned()
}

fn dev_size(dev: &str) -> u64 {
    sh(&format!("blockdev --getsize64 {dev}"))
        .trim()
        .parse()
        .unwrap()
}

fn exists(path: &str) -> bool {
    Path::new(path).exists()
}

/// The kernel name of a device (`loop3`, `dm-4`), following symlinks.
fn kname(dev: &str) -> String {
    sh(&format!("basename $(readlink -f {dev})"))
        .trim()
        .to_owned()
}

/// Writes `text` at the start of a block device and flushes it.
fn write_marker(dev: &str, text: &str) {
    sh(&format!(
        "printf '%s' '{text}' | dd of={dev} conv=fsync,notrunc status=none"
    ));
}

fn read_marker(dev: &str, len: usize) -> String {
    sh(&format!("head -c {len} {dev}"))
}

// ---- independent setup ----

/// A volume group on `disks` made with `lvm vgcreate`, removed when `s` drops.
fn sh_vg(s: &mut Scratch, disks: &[String]) -> String {
    let vg = s.vg_name();
    sh(&format!("lvm vgcreate -q {vg} {} 2>&1", disks.join(" ")));
    vg
}

fn sh_lv(vg: &str, name: &str, mib: u64) {
    sh(&format!("lvm lvcreate -q -y -L {mib}m -n {name} {vg} 2>&1"));
}

fn sh_pool(vg: &str, name: &str, mib: u64) {
    sh(&format!(
        "lvm lvcreate -q -y --type thin-pool -L {mib}m -n {name} {vg} 2>&1"
    ));
}

fn sh_thin(vg: &str, pool: &str, name: &str, mib: u64) {
    sh(&format!(
        "lvm lvcreate -q -y --type thin -V {mib}m --thinpool {pool} -n {name} {vg} 2>&1"
    ));
}

/// A directory under `/run/lvms-mnt/`, unmounted (all stacked mounts) and removed on drop.
struct Mnt {
    path: String,
}

impl Mnt {
    fn new() -> Self {
        let path = format!("/run/lvms-mnt/{}", unique("m"));
        std::fs::create_dir_all(&path).unwrap();
        Self { path }
    }

    fn file(&self, name: &str) -> String {
        format!("{}/{name}", self.path)
    }
}

impl Drop for Mnt {
    fn drop(&mut self) {
        let p = &self.path;
        let _ = sh_status(&format!(
            "for m in $(awk '$5 == \"{p}\" || index($5, \"{p}/\") == 1 {{print $5}}' /proc/self/mountinfo | sort -r); do umount -l $m; done; rm -rf {p}"
        ));
    }
}

fn lv_spec(vg: &str, name: &str, size: u64, layout: Layout) -> LvSpec {
    LvSpec {
        vg: vg.to_owned(),
        name: name.to_owned(),
        size,
        layout,
        tags: vec![],
    }
}

fn pool_spec(vg: &str, name: &str, size: PoolSize) -> ThinPoolSpec {
    ThinPoolSpec {
        vg: vg.to_owned(),
        name: name.to_owned(),
        size,
        chunk_size: None,
        metadata_size: None,
        zero: false,
    }
}

async fn get_lv(vg: &str, name: &str) -> LogicalVolume {
    lvm()
        .lv(vg, name)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{vg}/{name} should exist"))
}

fn attr(lv: &LogicalVolume) -> LvAttr {
    LvAttr::parse(&lv.attr).unwrap_or_else(|e| panic!("{}: {e}", lv.name))
}

// ==== physical volumes ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn pv_create_then_pvs_reports_orphan_with_4mib_metadata_area() {
    let s = Scratch::new(1, 1024);
    let d = &s.disks[0];
    lvm().pv_create(d, Some(4 * MIB)).await.unwrap();

    let pvs = lvm().pvs().await.unwrap();
    let pv = pvs.iter().find(|pv| &pv.name == d).expect("new PV listed");
    assert_eq!(pv.vg_name, None, "an orphan has no volume group");
    assert!(!pv.uuid.is_empty());
    assert!(pv.size > 1000 * MIB && pv.size <= GIB, "{}", pv.size);
    // LVM rounds the metadata area up so the data area starts aligned: 4 MiB asked, 5 MiB - 4 KiB given.
    let mda: u64 = pvs_field(d, "pv_mda_size").parse().unwrap();
    assert!((4 * MIB..6 * MIB).contains(&mda), "pv_mda_size {mda}");
    assert_eq!(blkid_type(d), "LVM2_member");

    // A retried create leaves the PV (and its UUID) as it is.
    lvm().pv_create(d, Some(4 * MIB)).await.unwrap();
    assert_eq!(pvs_field(d, "pv_uuid"), pv.uuid);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn pv_remove_of_orphan_clears_label_and_is_idempotent() {
    let s = Scratch::new(1, 1024);
    let d = &s.disks[0];
    sh(&format!("lvm pvcreate -q {d}"));
    assert!(is_pv(d));

    lvm().pv_remove(d).await.unwrap();
    assert!(!is_pv(d));
    assert_eq!(blkid_type(d), "");
    assert!(!lvm().pvs().await.unwrap().iter().any(|pv| &pv.name == d));

    // No label left: still Ok.
    lvm().pv_remove(d).await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn pv_remove_of_volume_group_member_is_in_use() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let err = lvm().pv_remove(&disks[0]).await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert_eq!(pvs_field(&disks[0], "vg_name"), vg);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn pv_create_vg_create_and_vg_extend_refuse_a_device_with_a_filesystem() {
    let mut s = Scratch::new(2, 1024);
    let d = s.disks[0].clone();
    sh(&format!("mkfs.ext4 -q {d}"));
    let uuid = sh(&format!("blkid -p -o value -s UUID {d}"));

    let err = lvm().pv_create(&d, Some(4 * MIB)).await.unwrap_err();
    match &err {
        Error::SignatureExists { device, signature } => {
            assert_eq!(device, &d);
            assert_eq!(signature, "ext4");
        }
        other => panic!("expected SignatureExists, got {other:?}"),
    }
    // vgcreate's implicit pvcreate refuses the same way.
    let vg = s.vg_name();
    let err = lvm()
        .vg_create(&vg, std::slice::from_ref(&d), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SignatureExists { .. }), "{err:?}");
    assert!(lvm().vg(&vg).await.unwrap().is_none());
    // So does vgextend's.
    let rest = s.disks[1..].to_vec();
    let other = sh_vg(&mut s, &rest);
    let err = lvm()
        .vg_extend(&other, std::slice::from_ref(&d))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::SignatureExists { device, signature } if device == &d && signature == "ext4"),
        "{err:?}"
    );
    assert_eq!(vgs_field(&other, "pv_count"), "1");

    assert!(!is_pv(&d));
    assert_eq!(blkid_type(&d), "ext4");
    assert_eq!(sh(&format!("blkid -p -o value -s UUID {d}")), uuid);
}

// ==== volume groups ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_create_tags_and_reports_sizes_in_bytes() {
    let mut s = Scratch::new(2, 1024);
    let vg = s.vg_name();
    let disks = s.disks.clone();
    lvm()
        .vg_create(&vg, &disks, &strings(&["lvms", "owner=lvms-rs"]))
        .await
        .unwrap();

    let v = lvm().vg(&vg).await.unwrap().expect("vg exists");
    assert_eq!(v.name, vg);
    assert_eq!(v.pv_count, 2);
    assert_eq!(v.lv_count, 0);
    assert_eq!(v.extent_size, EXTENT);
    assert_eq!(v.size, v.extent_count * v.extent_size);
    assert_eq!(v.free, v.size);
    assert_eq!(v.free_count, v.extent_count);
    assert!(v.size > 2000 * MIB && v.size <= 2 * GIB, "{}", v.size);
    let mut tags = v.tags.clone();
    tags.sort();
    assert_eq!(tags, ["lvms", "owner=lvms-rs"]);
    assert!(v.mda_size > 0 && v.mda_free > 0 && v.mda_free <= v.mda_size);

    assert_eq!(vgs_field(&vg, "vg_size"), v.size.to_string());
    assert_eq!(vgs_field(&vg, "vg_uuid"), v.uuid);
    assert_eq!(vgs_field(&vg, "vg_tags"), "lvms,owner=lvms-rs");
    for d in &disks {
        assert_eq!(pvs_field(d, "vg_name"), vg);
    }
    assert!(lvm().vgs().await.unwrap().iter().any(|x| x.name == vg));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_create_twice_with_same_devices_is_ok_and_with_other_devices_already_exists() {
    let mut s = Scratch::new(3, 1024);
    let vg = s.vg_name();
    let two = s.disks[..2].to_vec();
    lvm().vg_create(&vg, &two, &[]).await.unwrap();
    let uuid = vgs_field(&vg, "vg_uuid");

    // A retried create of an empty volume group.
    lvm().vg_create(&vg, &two, &[]).await.unwrap();
    // And of one with an active LV (LVM then trips over /dev/<vg> before its own name check).
    sh_lv(&vg, "lv1", 8);
    lvm().vg_create(&vg, &two, &[]).await.unwrap();
    assert_eq!(vgs_field(&vg, "vg_uuid"), uuid);

    let other = vec![s.disks[0].clone(), s.disks[2].clone()];
    let err = lvm().vg_create(&vg, &other, &[]).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert_eq!(vgs_field(&vg, "pv_count"), "2");
    assert_ne!(pvs_field(&s.disks[2], "vg_name"), vg);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_extend_adds_device_and_free_space_and_skips_members() {
    let mut s = Scratch::new(3, 1024);
    let (d0, d1, d2) = (s.disks[0].clone(), s.disks[1].clone(), s.disks[2].clone());
    let vg = sh_vg(&mut s, std::slice::from_ref(&d0));
    let before = lvm().vg(&vg).await.unwrap().unwrap();

    lvm()
        .vg_extend(&vg, std::slice::from_ref(&d1))
        .await
        .unwrap();
    let after = lvm().vg(&vg).await.unwrap().unwrap();
    assert_eq!(after.pv_count, 2);
    assert_eq!(after.free, before.free * 2, "{before:?} -> {after:?}");
    assert_eq!(pvs_field(&d1, "vg_name"), vg);

    // Both already in: nothing to do.
    lvm()
        .vg_extend(&vg, &[d0.clone(), d1.clone()])
        .await
        .unwrap();
    assert_eq!(vgs_field(&vg, "pv_count"), "2");

    // A physical volume of another volume group is refused before LVM is asked.
    let other = sh_vg(&mut s, std::slice::from_ref(&d2));
    let err = lvm()
        .vg_extend(&vg, std::slice::from_ref(&d2))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert_eq!(pvs_field(&d2, "vg_name"), other);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_reduce_removes_unused_pv_and_refuses_one_with_extents() {
    let mut s = Scratch::new(2, 1024);
    let (d0, d1) = (s.disks[0].clone(), s.disks[1].clone());
    let vg = sh_vg(&mut s, &[d0.clone(), d1.clone()]);
    sh(&format!("lvm lvcreate -q -y -L 8m -n lv1 {vg} {d0} 2>&1"));

    lvm()
        .vg_reduce(&vg, std::slice::from_ref(&d1))
        .await
        .unwrap();
    assert_eq!(vgs_field(&vg, "pv_count"), "1");
    let pvs = lvm().pvs().await.unwrap();
    let pv1 = pvs.iter().find(|pv| pv.name == d1).expect("still a PV");
    assert_eq!(pv1.vg_name, None, "reduced PV is an orphan");

    // Not a member any more: nothing to do.
    lvm()
        .vg_reduce(&vg, std::slice::from_ref(&d1))
        .await
        .unwrap();

    let err = lvm()
        .vg_reduce(&vg, std::slice::from_ref(&d0))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert_eq!(pvs_field(&d0, "vg_name"), vg);
    assert_eq!(lv_names(&vg), ["lv1"]);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_remove_refuses_while_lvs_exist_then_succeeds_when_empty() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "lv1", 8);

    let err = lvm().vg_remove(&vg).await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert_eq!(lv_names(&vg), ["lv1"]);

    sh(&format!("lvm lvremove -q -y {vg}/lv1 2>&1"));
    lvm().vg_remove(&vg).await.unwrap();
    assert!(lvm().vg(&vg).await.unwrap().is_none());
    assert_ne!(sh_status(&format!("lvm vgs {vg} 2>&1")).0, 0);
    // The disk is left an orphan PV.
    assert!(is_pv(&disks[0]));
    assert_eq!(pvs_field(&disks[0], "vg_name"), "");

    // Gone already: Ok.
    lvm().vg_remove(&vg).await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_activate_and_deactivate_toggle_every_lv() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "a", 8);
    sh_lv(&vg, "b", 8);

    lvm().vg_activate(&vg, false).await.unwrap();
    for lv in lvm().lvs(Some(&vg)).await.unwrap() {
        assert!(!attr(&lv).is_active(), "{lv:?}");
    }
    assert!(!exists(&format!("/dev/mapper/{vg}-a")));
    assert_eq!(lvs_field(&vg, "a", "lv_active"), "");

    lvm().vg_activate(&vg, true).await.unwrap();
    for lv in lvm().lvs(Some(&vg)).await.unwrap() {
        assert!(attr(&lv).is_active(), "{lv:?}");
    }
    assert!(exists(&format!("/dev/{vg}/a")) && exists(&format!("/dev/{vg}/b")));
    assert_eq!(lvs_field(&vg, "b", "lv_active"), "active");

    // Deactivating a volume group that does not exist is done already; activating it is not.
    let missing = unique("novg");
    lvm().vg_activate(&missing, false).await.unwrap();
    let err = lvm().vg_activate(&missing, true).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn vg_tags_add_and_delete() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);

    lvm().vg_add_tag(&vg, "lvms").await.unwrap();
    lvm().vg_add_tag(&vg, "lvms").await.unwrap();
    assert_eq!(lvm().vg(&vg).await.unwrap().unwrap().tags, ["lvms"]);
    assert_eq!(vgs_field(&vg, "vg_tags"), "lvms");

    lvm().vg_del_tag(&vg, "lvms").await.unwrap();
    lvm().vg_del_tag(&vg, "lvms").await.unwrap();
    assert!(lvm().vg(&vg).await.unwrap().unwrap().tags.is_empty());
    assert_eq!(vgs_field(&vg, "vg_tags"), "");
}

// ==== thin pools ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_pool_create_with_chunk_and_metadata_size() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let spec = ThinPoolSpec {
        chunk_size: Some(128 * KIB),
        metadata_size: Some(8 * MIB),
        zero: true,
        ..pool_spec(&vg, "pool", PoolSize::Bytes(256 * MIB))
    };
    lvm().thin_pool_create(&spec).await.unwrap();

    let pool = get_lv(&vg, "pool").await;
    assert_eq!(pool.segtype, "thin-pool");
    assert_eq!(pool.size, 256 * MIB);
    assert_eq!(pool.metadata_size, Some(8 * MIB));
    assert_eq!(pool.data_percent, Some(0.0));
    let a = attr(&pool);
    assert!(a.is_thin_pool() && a.is_active() && a.zero, "{a:?}");

    assert_eq!(
        lvs_field(&vg, "pool", "chunk_size"),
        (128 * KIB).to_string()
    );
    assert_eq!(
        lvs_field(&vg, "pool", "lv_metadata_size"),
        (8 * MIB).to_string()
    );
    assert_eq!(lvs_field(&vg, "pool", "zero"), "zero");
    // A second create of the same name is AlreadyExists (the caller compares).
    let err = lvm().thin_pool_create(&spec).await.unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_pool_create_percent_free_takes_that_share_of_free_space() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let free = lvm().vg(&vg).await.unwrap().unwrap().free;

    for bad in [0, 101] {
        let err = lvm()
            .thin_pool_create(&pool_spec(&vg, "pool", PoolSize::PercentFree(bad)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    assert!(lv_names(&vg).is_empty());

    lvm()
        .thin_pool_create(&pool_spec(&vg, "pool", PoolSize::PercentFree(50)))
        .await
        .unwrap();
    let pool = get_lv(&vg, "pool").await;
    assert_eq!(pool.segtype, "thin-pool");
    assert!(!attr(&pool).zero, "created with --zero n");
    assert_eq!(lvs_field(&vg, "pool", "zero"), "");
    assert!(
        pool.size >= free * 2 / 5 && pool.size <= free / 2 + EXTENT,
        "pool {} of free {free}",
        pool.size
    );
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_pool_extend_grows_data_and_metadata() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let spec = ThinPoolSpec {
        metadata_size: Some(4 * MIB),
        ..pool_spec(&vg, "pool", PoolSize::Bytes(64 * MIB))
    };
    lvm().thin_pool_create(&spec).await.unwrap();

    lvm()
        .thin_pool_extend(&vg, "pool", 128 * MIB)
        .await
        .unwrap();
    assert_eq!(get_lv(&vg, "pool").await.size, 128 * MIB);
    assert_eq!(lvs_field(&vg, "pool", "lv_size"), (128 * MIB).to_string());
    // Smaller or equal: no-op.
    lvm().thin_pool_extend(&vg, "pool", 96 * MIB).await.unwrap();
    lvm()
        .thin_pool_extend(&vg, "pool", 128 * MIB)
        .await
        .unwrap();
    assert_eq!(get_lv(&vg, "pool").await.size, 128 * MIB);

    lvm()
        .thin_pool_metadata_extend(&vg, "pool", 8 * MIB)
        .await
        .unwrap();
    assert_eq!(get_lv(&vg, "pool").await.metadata_size, Some(8 * MIB));
    assert_eq!(
        lvs_field(&vg, "pool", "lv_metadata_size"),
        (8 * MIB).to_string()
    );
    lvm()
        .thin_pool_metadata_extend(&vg, "pool", 4 * MIB)
        .await
        .unwrap();
    assert_eq!(get_lv(&vg, "pool").await.metadata_size, Some(8 * MIB));

    let err = lvm()
        .thin_pool_extend(&vg, "nopool", 128 * MIB)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_lv_create_reports_virtual_size_and_pool() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 128);

    lvm()
        .thin_lv_create(&vg, "pool", "thin1", GIB, &strings(&["lvms-volume"]))
        .await
        .unwrap();
    let lv = get_lv(&vg, "thin1").await;
    assert_eq!(lv.segtype, "thin");
    assert_eq!(lv.size, GIB);
    assert_eq!(lv.pool_lv.as_deref(), Some("pool"));
    assert_eq!(lv.origin, None);
    assert_eq!(lv.tags, ["lvms-volume"]);
    assert_eq!(lv.data_percent, Some(0.0));
    assert_eq!(
        lv.path.as_deref(),
        Some(format!("/dev/{vg}/thin1").as_str())
    );
    assert_eq!(
        lv.dm_path.as_deref(),
        Some(format!("/dev/mapper/{vg}-thin1").as_str())
    );
    let a = attr(&lv);
    assert!(
        a.is_thin_volume() && a.is_active() && !a.skip_activation,
        "{a:?}"
    );

    assert_eq!(dev_size(&format!("/dev/{vg}/thin1")), GIB);
    assert_eq!(lvs_field(&vg, "thin1", "pool_lv"), "pool");
    // Hidden sub-volumes ([pool_tdata], [lvol0_pmspare], …) are not reported.
    let mut names: Vec<String> = lvm()
        .lvs(Some(&vg))
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    names.sort();
    assert_eq!(names, ["pool", "thin1"]);

    let err = lvm()
        .thin_lv_create(&vg, "pool", "thin1", GIB, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    let err = lvm()
        .thin_lv_create(&vg, "nopool", "thin2", GIB, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(lv_names(&vg), ["pool", "thin1"]);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_lv_overprovisioned_beyond_pool_is_allowed() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 64);

    lvm()
        .thin_lv_create(&vg, "pool", "big1", 8 * GIB, &[])
        .await
        .unwrap();
    lvm()
        .thin_lv_create(&vg, "pool", "big2", 8 * GIB, &[])
        .await
        .unwrap();
    assert_eq!(get_lv(&vg, "big1").await.size, 8 * GIB);
    assert_eq!(dev_size(&format!("/dev/{vg}/big2")), 8 * GIB);
    assert_eq!(get_lv(&vg, "pool").await.size, 64 * MIB);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_snapshot_read_only_has_activation_skip_and_activates_with_ignore_skip() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 128);
    sh_thin(&vg, "pool", "origin", 64);
    let origin_dev = format!("/dev/{vg}/origin");
    write_marker(&origin_dev, "lvms-before-snap");

    lvm()
        .thin_snapshot(&vg, "origin", "snap1", true, &strings(&["lvms-snapshot"]))
        .await
        .unwrap();
    let snap = get_lv(&vg, "snap1").await;
    assert_eq!(snap.segtype, "thin");
    assert_eq!(snap.origin.as_deref(), Some("origin"));
    assert_eq!(snap.pool_lv.as_deref(), Some("pool"));
    assert_eq!(snap.size, 64 * MIB);
    assert_eq!(snap.tags, ["lvms-snapshot"]);
    let a = attr(&snap);
    assert!(a.skip_activation, "{a:?}");
    assert_eq!(a.permissions, Permissions::ReadOnly);
    assert!(
        !a.is_active(),
        "a new thin snapshot is not activated: {a:?}"
    );
    let snap_dev = format!("/dev/{vg}/snap1");
    assert!(!exists(&snap_dev));
    assert_eq!(
        lvs_field(&vg, "snap1", "lv_skip_activation"),
        "skip activation"
    );

    // Without -K LVM skips it silently.
    lvm().lv_activate(&vg, "snap1", false).await.unwrap();
    assert!(!attr(&get_lv(&vg, "snap1").await).is_active());
    assert!(!exists(&snap_dev));

    lvm().lv_activate(&vg, "snap1", true).await.unwrap();
    assert!(attr(&get_lv(&vg, "snap1").await).is_active());
    assert_eq!(read_marker(&snap_dev, 16), "lvms-before-snap");
    assert_eq!(sh(&format!("blockdev --getro {snap_dev}")).trim(), "1");
    let (code, _) = sh_status(&format!(
        "printf x | dd of={snap_dev} conv=fsync,notrunc status=none 2>&1"
    ));
    assert_ne!(code, 0, "a read-only snapshot takes no writes");

    // Later writes to the origin do not show in the snapshot.
    write_marker(&origin_dev, "lvms-after--snap");
    assert_eq!(read_marker(&snap_dev, 16), "lvms-before-snap");
    assert_eq!(read_marker(&origin_dev, 16), "lvms-after--snap");

    let err = lvm()
        .thin_snapshot(&vg, "origin", "snap1", true, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn thin_snapshot_read_write_takes_writes_without_touching_origin() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 128);
    sh_thin(&vg, "pool", "origin", 64);
    let origin_dev = format!("/dev/{vg}/origin");
    write_marker(&origin_dev, "origin-data");

    lvm()
        .thin_snapshot(&vg, "origin", "clone1", false, &[])
        .await
        .unwrap();
    let a = attr(&get_lv(&vg, "clone1").await);
    assert_eq!(a.permissions, Permissions::Writeable);
    assert!(a.skip_activation && !a.is_active(), "{a:?}");

    lvm().lv_activate(&vg, "clone1", true).await.unwrap();
    let clone_dev = format!("/dev/{vg}/clone1");
    assert_eq!(read_marker(&clone_dev, 11), "origin-data");
    assert_eq!(sh(&format!("blockdev --getro {clone_dev}")).trim(), "0");
    write_marker(&clone_dev, "clone--data");
    assert_eq!(read_marker(&clone_dev, 11), "clone--data");
    assert_eq!(read_marker(&origin_dev, 11), "origin-data");
    assert_eq!(
        lvs_field(&vg, "clone1", "lv_attr").chars().nth(1),
        Some('w')
    );
}

// ==== logical volumes ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_linear_rounds_up_to_extent() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let spec = LvSpec {
        tags: strings(&["lvms-volume", "pvc=ns/claim"]),
        ..lv_spec(&vg, "lv1", 10 * MIB + 512, Layout::Linear)
    };
    lvm().lv_create(&spec).await.unwrap();
    // udev probes a new device (blkid) and holds it open meanwhile (CI run 20 saw it open).
    sh("udevadm settle");

    let lv = get_lv(&vg, "lv1").await;
    assert_eq!(lv.segtype, "linear");
    assert_eq!(lv.size, 12 * MIB);
    assert_eq!(lv.tags, ["lvms-volume", "pvc=ns/claim"]);
    assert_eq!(lv.pool_lv, None);
    assert_eq!(lv.stripes, Some(1));
    let a = attr(&lv);
    assert_eq!(a.volume_type, VolumeType::Plain);
    assert!(a.is_active() && a.open == Some(false), "{a:?}");
    assert_eq!(dev_size(&format!("/dev/{vg}/lv1")), 12 * MIB);
    assert_eq!(lvs_field(&vg, "lv1", "lv_size"), (12 * MIB).to_string());
    assert_eq!(lvs_field(&vg, "lv1", "lv_tags"), "lvms-volume,pvc=ns/claim");
}

/// Sizes reach LVM in bytes (`--size <n>b`), and LVM takes only multiples of 512 there ("Size is not a
/// multiple of 512. Try using 10485760 or 10486272."). A byte size from a user (a CSI capacity range) is
/// any number: every sizing operation must round it up like LVM rounds the rest.
#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn sizes_not_a_multiple_of_512_round_up_like_any_other_size() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let odd = 10 * MIB + 1;
    let mut failures = Vec::new();
    let mut check = |what: &str, r: lvms_host::Result<()>| {
        if let Err(e) = r {
            failures.push(format!("{what}: {e}"));
        }
    };
    check(
        "lv_create",
        lvm()
            .lv_create(&lv_spec(&vg, "lv1", odd, Layout::Linear))
            .await,
    );
    sh_lv(&vg, "lv2", 8);
    check("lv_extend", lvm().lv_extend(&vg, "lv2", odd).await);
    check(
        "thin_pool_create",
        lvm()
            .thin_pool_create(&pool_spec(&vg, "pool", PoolSize::Bytes(odd)))
            .await,
    );
    sh_pool(&vg, "pool2", 8);
    check(
        "thin_lv_create",
        lvm().thin_lv_create(&vg, "pool2", "thin1", odd, &[]).await,
    );
    check(
        "thin_pool_extend",
        lvm().thin_pool_extend(&vg, "pool2", odd).await,
    );
    for lv in ["lv1", "lv2", "pool", "thin1", "pool2"] {
        match lvm().lv(&vg, lv).await.unwrap() {
            Some(l) if l.size == 12 * MIB => {}
            other => failures.push(format!(
                "{lv}: size {:?}, expected {}",
                other.map(|l| l.size),
                12 * MIB
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_striped_two_stripes_spans_both_disks() {
    let mut s = Scratch::new(2, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let layout = Layout::Striped {
        stripes: Some(2),
        stripe_size: Some(64 * KIB),
    };
    // 5 extents round up to the stripe boundary: 6.
    lvm()
        .lv_create(&lv_spec(&vg, "st", 20 * MIB, layout))
        .await
        .unwrap();

    let lv = get_lv(&vg, "st").await;
    assert_eq!(lv.segtype, "striped");
    assert_eq!(lv.stripes, Some(2));
    assert_eq!(lv.stripe_size, Some(64 * KIB));
    assert_eq!(lv.size, 24 * MIB);
    assert_eq!(lvs_field(&vg, "st", "stripes"), "2");
    assert_eq!(lvs_field(&vg, "st", "stripe_size"), (64 * KIB).to_string());
    let devs = lvs_field(&vg, "st", "devices");
    for d in &disks {
        assert!(devs.contains(d.as_str()), "{devs}");
    }

    // More stripes than disks: refused, nothing created.
    let three = Layout::Striped {
        stripes: Some(3),
        stripe_size: None,
    };
    let err = lvm()
        .lv_create(&lv_spec(&vg, "st3", 24 * MIB, three))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::CommandFailed { .. } | Error::InsufficientSpace(_)
        ),
        "{err:?}"
    );
    assert_eq!(lv_names(&vg), ["st"]);
}

/// Polls `vg/name` until its RAID sync reaches 100 %.
async fn wait_synced(vg: &str, name: &str) -> LogicalVolume {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let lv = get_lv(vg, name).await;
        if lv.sync_percent == Some(100.0) || Instant::now() > deadline {
            return lv;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_raid1_reports_raid_segtype_and_sync() {
    let mut s = Scratch::new(2, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    lvm()
        .lv_create(&lv_spec(
            &vg,
            "r1",
            16 * MIB,
            Layout::Mirror {
                mirrors: 1,
                nosync: false,
                integrity: false,
            },
        ))
        .await
        .unwrap();

    let lv = wait_synced(&vg, "r1").await;
    assert_eq!(lv.segtype, "raid1");
    assert_eq!(lv.size, 16 * MIB);
    assert_eq!(lv.sync_percent, Some(100.0), "{lv:?}");
    let a = attr(&lv);
    assert!(
        matches!(
            a.volume_type,
            VolumeType::Raid | VolumeType::RaidWithoutInitialSync
        ),
        "{a:?}"
    );
    assert_eq!(a.health(), LvHealth::Ok);
    // Two images, one on each disk.
    let images = sh(&format!(
        "lvm lvs -a --noheadings -o lv_name,devices {vg} 2>/dev/null | grep rimage"
    ));
    for d in &disks {
        assert!(images.contains(d.as_str()), "{images}");
    }
    assert_eq!(lvs_field(&vg, "r1", "segtype"), "raid1");
    assert_eq!(lvs_field(&vg, "r1", "copy_percent"), "100.00");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_raid5_through_raid_layout() {
    let mut s = Scratch::new(3, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let layout = Layout::Raid {
        level: RaidType::Raid5,
        mirrors: None,
        stripes: Some(2),
        stripe_size: Some(64 * KIB),
        nosync: false,
        integrity: false,
    };
    lvm()
        .lv_create(&lv_spec(&vg, "r5", 16 * MIB, layout))
        .await
        .unwrap();
    let lv = wait_synced(&vg, "r5").await;
    assert_eq!(lv.segtype, "raid5");
    assert_eq!(lv.size, 16 * MIB);
    assert_eq!(lv.sync_percent, Some(100.0), "{lv:?}");
    assert_eq!(lvs_field(&vg, "r5", "data_stripes"), "2");
    assert_eq!(dev_size(&format!("/dev/{vg}/r5")), 16 * MIB);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_raid1_on_one_disk_is_insufficient_space() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let err = lvm()
        .lv_create(&lv_spec(
            &vg,
            "r1",
            16 * MIB,
            Layout::Mirror {
                mirrors: 1,
                nosync: false,
                integrity: false,
            },
        ))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace(_)), "{err:?}");
    assert!(lv_names(&vg).is_empty());
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_insufficient_space_is_insufficient_space_error() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let err = lvm()
        .lv_create(&lv_spec(&vg, "huge", 100 * GIB, Layout::Linear))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace(_)), "{err:?}");
    assert!(err.to_string().contains("lvcreate"), "{err}");
    assert!(lv_names(&vg).is_empty());
    assert_eq!(
        vgs_field(&vg, "vg_free"),
        vgs_field(&vg, "vg_size"),
        "nothing allocated"
    );
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_create_existing_name_is_already_exists() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    lvm()
        .lv_create(&lv_spec(&vg, "lv1", 8 * MIB, Layout::Linear))
        .await
        .unwrap();
    let uuid = lvs_field(&vg, "lv1", "lv_uuid");

    let err = lvm()
        .lv_create(&lv_spec(&vg, "lv1", 16 * MIB, Layout::Linear))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert_eq!(lvs_field(&vg, "lv1", "lv_uuid"), uuid);
    assert_eq!(get_lv(&vg, "lv1").await.size, 8 * MIB);

    let err = lvm()
        .lv_create(&lv_spec(&unique("novg"), "lv1", 8 * MIB, Layout::Linear))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_extend_grows_and_smaller_target_is_noop() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "lv1", 12);

    lvm().lv_extend(&vg, "lv1", 20 * MIB).await.unwrap();
    assert_eq!(get_lv(&vg, "lv1").await.size, 20 * MIB);
    assert_eq!(dev_size(&format!("/dev/{vg}/lv1")), 20 * MIB);

    lvm().lv_extend(&vg, "lv1", 8 * MIB).await.unwrap();
    lvm().lv_extend(&vg, "lv1", 20 * MIB).await.unwrap();
    assert_eq!(lvs_field(&vg, "lv1", "lv_size"), (20 * MIB).to_string());

    // Rounds up to whole extents like create.
    lvm().lv_extend(&vg, "lv1", 21 * MIB).await.unwrap();
    assert_eq!(get_lv(&vg, "lv1").await.size, 24 * MIB);

    let err = lvm().lv_extend(&vg, "nolv", 20 * MIB).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    let err = lvm().lv_extend(&vg, "lv1", 100 * GIB).await.unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace(_)), "{err:?}");
    assert_eq!(get_lv(&vg, "lv1").await.size, 24 * MIB);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_remove_active_lv_then_missing_is_ok() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "lv1", 8);

    lvm().lv_remove(&vg, "lv1").await.unwrap();
    assert!(lv_names(&vg).is_empty());
    assert!(!exists(&format!("/dev/mapper/{vg}-lv1")));
    assert!(lvm().lv(&vg, "lv1").await.unwrap().is_none());

    lvm().lv_remove(&vg, "lv1").await.unwrap();
    lvm().lv_remove(&unique("novg"), "lv1").await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_remove_thin_pool_with_volumes_is_in_use() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 64);
    sh_thin(&vg, "pool", "thin1", 128);

    let err = lvm().lv_remove(&vg, "pool").await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert!(err.to_string().contains("thin1"), "{err}");
    assert_eq!(lv_names(&vg), ["pool", "thin1"]);

    lvm().lv_remove(&vg, "thin1").await.unwrap();
    lvm().lv_remove(&vg, "pool").await.unwrap();
    assert!(lv_names(&vg).is_empty());
    assert_eq!(vgs_field(&vg, "vg_free"), vgs_field(&vg, "vg_size"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_remove_and_deactivate_of_mounted_lv_are_in_use() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "lv1", 32);
    let dev = format!("/dev/{vg}/lv1");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let m = Mnt::new();
    sh(&format!("mount {dev} {}", m.path));

    let err = lvm().lv_remove(&vg, "lv1").await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    let err = lvm().lv_deactivate(&vg, "lv1").await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    let a = attr(&get_lv(&vg, "lv1").await);
    assert!(a.is_active() && a.is_open(), "{a:?}");
    assert_eq!(lv_names(&vg), ["lv1"]);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_deactivate_and_activate_one_lv() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "a", 8);
    sh_lv(&vg, "b", 8);

    lvm().lv_deactivate(&vg, "a").await.unwrap();
    assert!(!attr(&get_lv(&vg, "a").await).is_active());
    assert!(attr(&get_lv(&vg, "b").await).is_active(), "b untouched");
    assert!(!exists(&format!("/dev/mapper/{vg}-a")));
    // Again, and for an LV that does not exist: Ok.
    lvm().lv_deactivate(&vg, "a").await.unwrap();
    lvm().lv_deactivate(&vg, "nolv").await.unwrap();

    lvm().lv_activate(&vg, "a", false).await.unwrap();
    assert!(attr(&get_lv(&vg, "a").await).is_active());
    assert_eq!(dev_size(&format!("/dev/{vg}/a")), 8 * MIB);
    assert_eq!(lvs_field(&vg, "a", "lv_active"), "active");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lv_tags_add_and_delete() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "lv1", 8);

    lvm().lv_add_tag(&vg, "lv1", "lvms-volume").await.unwrap();
    lvm().lv_add_tag(&vg, "lv1", "owner=a/b").await.unwrap();
    lvm().lv_add_tag(&vg, "lv1", "lvms-volume").await.unwrap();
    assert_eq!(get_lv(&vg, "lv1").await.tags, ["lvms-volume", "owner=a/b"]);
    assert_eq!(lvs_field(&vg, "lv1", "lv_tags"), "lvms-volume,owner=a/b");

    lvm().lv_del_tag(&vg, "lv1", "lvms-volume").await.unwrap();
    lvm().lv_del_tag(&vg, "lv1", "lvms-volume").await.unwrap();
    assert_eq!(get_lv(&vg, "lv1").await.tags, ["owner=a/b"]);
    assert_eq!(lvs_field(&vg, "lv1", "lv_tags"), "owner=a/b");

    let err = lvm()
        .lv_add_tag(&vg, "nolv", "lvms-volume")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lvs_decodes_lv_attr_health_ok_for_active_pool() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 64);
    sh_thin(&vg, "pool", "thin1", 64);
    sh_lv(&vg, "plain", 8);
    // udev's probe of the new devices holds them open until it is done.
    sh("udevadm settle");

    let lvs = lvm().lvs(Some(&vg)).await.unwrap();
    assert_eq!(lvs.len(), 3, "{lvs:?}");
    for lv in &lvs {
        let a = attr(lv);
        assert_eq!(a.health(), LvHealth::Ok, "{lv:?}");
        assert!(a.is_active(), "{lv:?}");
        assert_eq!(lv.vg_name, vg);
        match lv.name.as_str() {
            "pool" => {
                assert!(a.is_thin_pool(), "{a:?}");
                assert!(lv.data_percent.is_some() && lv.metadata_percent.is_some());
            }
            "thin1" => assert!(a.is_thin_volume() && a.open == Some(false), "{a:?}"),
            "plain" => assert_eq!(a.volume_type, VolumeType::Plain),
            other => panic!("unexpected LV {other}"),
        }
    }

    // Open shows once mounted.
    let dev = format!("/dev/{vg}/thin1");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let m = Mnt::new();
    sh(&format!("mount {dev} {}", m.path));
    let a = attr(&get_lv(&vg, "thin1").await);
    assert!(a.is_open(), "{a:?}");
    assert!(get_lv(&vg, "pool").await.data_percent.unwrap() > 0.0);

    // All volume groups: includes ours.
    assert!(
        lvm()
            .lvs(None)
            .await
            .unwrap()
            .iter()
            .any(|l| l.vg_name == vg && l.name == "thin1")
    );
    let err = lvm().lvs(Some(&unique("novg"))).await.unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn invalid_names_never_reach_lvm() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_pool(&vg, "pool", 64);
    let before = lv_names(&vg);

    for bad in ["-rf", "a b", "x;rm", "", "../x", "snapshot1"] {
        let err = lvm()
            .lv_create(&lv_spec(&vg, bad, 8 * MIB, Layout::Linear))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
        let err = lvm()
            .thin_lv_create(&vg, "pool", bad, 8 * MIB, &[])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
        let err = lvm()
            .lv_create(&lv_spec(bad, "ok", 8 * MIB, Layout::Linear))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
        let err = lvm().lv_remove(&vg, bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
        let err = lvm()
            .vg_create(bad, std::slice::from_ref(&disks[0]), &[])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidName(_)), "{bad:?}: {err:?}");
    }
    for bad_tag in ["-x", "a b", "", "a;b"] {
        let err = lvm().lv_add_tag(&vg, "pool", bad_tag).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        let spec = LvSpec {
            tags: vec![bad_tag.to_owned()],
            ..lv_spec(&vg, "tagged", 8 * MIB, Layout::Linear)
        };
        let err = lvm().lv_create(&spec).await.unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    }
    for bad_dev in [
        "/dev/../etc/passwd",
        "/etc/passwd",
        "-ff",
        "/dev/loop0 /dev/loop1",
    ] {
        let err = lvm().pv_create(bad_dev, None).await.unwrap_err();
        assert!(matches!(err, Error::InvalidDevicePath { .. }), "{err:?}");
        let err = devices().wipe(bad_dev).await.unwrap_err();
        assert!(matches!(err, Error::InvalidDevicePath { .. }), "{err:?}");
    }
    let err = lvm()
        .lv_create(&lv_spec(&vg, "zero", 0, Layout::Linear))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");

    assert_eq!(lv_names(&vg), before);
    assert_eq!(
        sh("lvm vgs --noheadings -o vg_name 2>/dev/null")
            .matches(&vg)
            .count(),
        1
    );
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn lvm_call_past_its_timeout_is_killed_and_reported_as_timeout() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let err = lvm()
        .with_timeout(Duration::from_millis(1))
        .vg(&vg)
        .await
        .unwrap_err();
    match &err {
        Error::Timeout { argv, timeout } => {
            assert_eq!(*timeout, Duration::from_millis(1));
            assert!(argv.to_string().starts_with("lvm vgs"), "{argv}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    // The killed command left no lock behind.
    assert!(lvm().vg(&vg).await.unwrap().is_some());
}

// ==== filesystems ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn mkfs_xfs_and_ext4_then_detect_fs() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "x", XFS_MIN / MIB);
    sh_lv(&vg, "e", 32);
    let (x, e) = (format!("/dev/{vg}/x"), format!("/dev/{vg}/e"));
    let fs = filesystems();

    assert_eq!(fs.detect_fs(&x).await.unwrap(), None);
    assert_eq!(fs.detect_fs(&e).await.unwrap(), None);
    fs.mkfs(&x, Fstype::Xfs).await.unwrap();
    fs.mkfs(&e, Fstype::Ext4).await.unwrap();
    assert_eq!(fs.detect_fs(&x).await.unwrap().as_deref(), Some("xfs"));
    assert_eq!(fs.detect_fs(&e).await.unwrap().as_deref(), Some("ext4"));
    assert_eq!(blkid_type(&x), "xfs");
    assert_eq!(blkid_type(&e), "ext4");
    // Both check clean with their own tools.
    sh(&format!("xfs_db -r -c sb -c 'p blocksize' {x}"));
    sh(&format!("e2fsck -fn {e} 2>&1"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn mkfs_refuses_existing_filesystem_and_keeps_its_data() {
    let mut s = Scratch::new(2, 1024);
    let disks = s.disks[..1].to_vec();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 32);
    let dev = format!("/dev/{vg}/e");
    let fs = filesystems();
    fs.mkfs(&dev, Fstype::Ext4).await.unwrap();
    {
        let m = Mnt::new();
        sh(&format!(
            "mount {dev} {0} && echo keep-me > {0}/data && umount {0}",
            m.path
        ));
    }
    let uuid = sh(&format!("blkid -p -o value -s UUID {dev}"));

    for fstype in [Fstype::Xfs, Fstype::Ext4] {
        let err = fs.mkfs(&dev, fstype).await.unwrap_err();
        match &err {
            Error::SignatureExists { device, signature } => {
                assert_eq!(device, &dev);
                assert_eq!(signature, "ext4");
            }
            other => panic!("expected SignatureExists, got {other:?}"),
        }
    }
    assert_eq!(sh(&format!("blkid -p -o value -s UUID {dev}")), uuid);
    let m = Mnt::new();
    sh(&format!("mount -o ro {dev} {}", m.path));
    assert_eq!(
        std::fs::read_to_string(m.file("data")).unwrap(),
        "keep-me\n"
    );

    // An LVM physical volume is a signature too.
    let pv = &s.disks[1];
    sh(&format!("lvm pvcreate -q {pv}"));
    let err = fs.mkfs(pv, Fstype::Ext4).await.unwrap_err();
    assert!(
        matches!(&err, Error::SignatureExists { signature, .. } if signature == "LVM2_member"),
        "{err:?}"
    );
    assert!(is_pv(pv));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn mount_unmount_and_mountinfo_finds_it() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 32);
    let dev = format!("/dev/{vg}/e");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let fs = filesystems();
    let m = Mnt::new();

    assert!(fs.find_mount_by_target(&m.path).await.unwrap().is_none());
    fs.mount(&dev, &m.path, Fstype::Ext4, &strings(&["noatime"]), false)
        .await
        .unwrap();
    let info = fs
        .find_mount_by_target(&m.path)
        .await
        .unwrap()
        .expect("mounted");
    assert_eq!(info.fs_type, "ext4");
    assert_eq!(info.mount_point, m.path);
    assert!(!info.read_only());
    assert!(
        info.mount_options.iter().any(|o| o == "noatime"),
        "{info:?}"
    );
    let majmin = sh(&format!("lsblk -dno MAJ:MIN {dev}"));
    assert_eq!(format!("{}:{}", info.major, info.minor), majmin.trim());
    assert_eq!(
        sh(&format!("findmnt -n -o FSTYPE {}", m.path)).trim(),
        "ext4"
    );
    assert_eq!(
        sh(&format!("findmnt -n -o SOURCE {}", m.path)).trim(),
        format!("/dev/mapper/{vg}-e")
    );
    assert!(
        fs.mounts()
            .await
            .unwrap()
            .iter()
            .any(|x| x.mount_point == m.path)
    );
    std::fs::write(m.file("f"), "hello").unwrap();

    fs.unmount(&m.path).await.unwrap();
    assert!(fs.find_mount_by_target(&m.path).await.unwrap().is_none());
    assert_ne!(sh_status(&format!("findmnt {}", m.path)).0, 0);
    assert!(!exists(&m.file("f")));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn mount_twice_is_idempotent_and_conflicts_are_already_exists() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "a", 32);
    sh_lv(&vg, "b", 32);
    let (a, b) = (format!("/dev/{vg}/a"), format!("/dev/{vg}/b"));
    sh(&format!("mkfs.ext4 -q {a} && mkfs.ext4 -q {b}"));
    let fs = filesystems();
    let m = Mnt::new();

    fs.mount(&a, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    fs.mount(&a, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    // Through the /dev/mapper name as well: the same device.
    fs.mount(
        &format!("/dev/mapper/{vg}-a"),
        &m.path,
        Fstype::Ext4,
        &[],
        false,
    )
    .await
    .unwrap();
    let count = fs
        .mounts()
        .await
        .unwrap()
        .iter()
        .filter(|x| x.mount_point == m.path)
        .count();
    assert_eq!(count, 1);
    assert_eq!(
        sh(&format!("findmnt -n -o TARGET {}", m.path))
            .lines()
            .count(),
        1
    );

    let err = fs
        .mount(&b, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    let err = fs
        .mount(&a, &m.path, Fstype::Ext4, &[], true)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn mount_readonly_rejects_writes() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 32);
    let dev = format!("/dev/{vg}/e");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let fs = filesystems();
    let m = Mnt::new();

    fs.mount(&dev, &m.path, Fstype::Ext4, &[], true)
        .await
        .unwrap();
    assert!(
        fs.find_mount_by_target(&m.path)
            .await
            .unwrap()
            .unwrap()
            .read_only()
    );
    let (code, out) = sh_status(&format!("touch {}", m.file("x")));
    assert_ne!(code, 0);
    assert!(out.contains("Read-only file system"), "{out}");
    // Again read-only: Ok.
    fs.mount(&dev, &m.path, Fstype::Ext4, &[], true)
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn unmount_not_mounted_is_ok_and_busy_is_in_use() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    let fs = filesystems();
    let m = Mnt::new();
    fs.unmount(&m.path).await.unwrap();
    fs.unmount(&format!("{}/does/not/exist", m.path))
        .await
        .unwrap();

    sh_lv(&vg, "e", 32);
    let dev = format!("/dev/{vg}/e");
    sh(&format!("mkfs.ext4 -q {dev}"));
    fs.mount(&dev, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    // A process with its working directory inside keeps the mount busy.
    let mut holder = std::process::Command::new("sleep")
        .arg("300")
        .current_dir(&m.path)
        .spawn()
        .unwrap();
    let err = fs.unmount(&m.path).await.unwrap_err();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert!(fs.find_mount_by_target(&m.path).await.unwrap().is_some());

    fs.unmount(&m.path).await.unwrap();
    assert!(fs.find_mount_by_target(&m.path).await.unwrap().is_none());
    fs.unmount(&m.path).await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn bind_mount_readonly_rejects_writes() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 32);
    let dev = format!("/dev/{vg}/e");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let fs = filesystems();
    let staging = Mnt::new();
    let publish = Mnt::new();
    fs.mount(&dev, &staging.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    std::fs::write(staging.file("data"), "shared").unwrap();

    fs.bind_mount(&staging.path, &publish.path, true)
        .await
        .unwrap();
    let info = fs
        .find_mount_by_target(&publish.path)
        .await
        .unwrap()
        .expect("bound");
    assert!(info.read_only(), "{info:?}");
    assert_eq!(
        std::fs::read_to_string(publish.file("data")).unwrap(),
        "shared"
    );
    let (code, out) = sh_status(&format!("touch {}", publish.file("x")));
    assert_ne!(code, 0);
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(sh(&format!("findmnt -n -o OPTIONS {}", publish.path)).starts_with("ro"));
    // The staging mount stays writable.
    std::fs::write(staging.file("more"), "x").unwrap();
    assert!(exists(&publish.file("more")));

    // Idempotent; read-write asked of a read-only bind is a conflict.
    fs.bind_mount(&staging.path, &publish.path, true)
        .await
        .unwrap();
    let err = fs
        .bind_mount(&staging.path, &publish.path, false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    let count = fs
        .mounts()
        .await
        .unwrap()
        .iter()
        .filter(|x| x.mount_point == publish.path)
        .count();
    assert_eq!(count, 1);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn bind_mount_block_device_onto_a_file_for_raw_volumes() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "raw", 8);
    let dev = format!("/dev/{vg}/raw");
    let fs = filesystems();
    let m = Mnt::new();
    let target = m.file("dev");
    std::fs::write(&target, "").unwrap();

    fs.bind_mount(&dev, &target, false).await.unwrap();
    fs.bind_mount(&dev, &target, false).await.unwrap();
    assert_eq!(dev_size(&target), 8 * MIB);
    write_marker(&target, "raw-block");
    assert_eq!(read_marker(&dev, 9), "raw-block");
    assert!(fs.find_mount_by_target(&target).await.unwrap().is_some());

    fs.unmount(&target).await.unwrap();
    assert!(fs.find_mount_by_target(&target).await.unwrap().is_none());
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn grow_xfs_online_after_lv_extend() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "x", XFS_MIN / MIB);
    let dev = format!("/dev/{vg}/x");
    let fs = filesystems();
    fs.mkfs(&dev, Fstype::Xfs).await.unwrap();
    let m = Mnt::new();
    fs.mount(&dev, &m.path, Fstype::Xfs, &[], false)
        .await
        .unwrap();
    let before = statvfs(&m.path).unwrap();

    lvm()
        .lv_extend(&vg, "x", XFS_MIN + 128 * MIB)
        .await
        .unwrap();
    fs.grow(&dev, &m.path, Fstype::Xfs).await.unwrap();
    let after = statvfs(&m.path).unwrap();
    assert!(
        after.total_bytes >= before.total_bytes + 120 * MIB,
        "{before:?} -> {after:?}"
    );
    assert!(after.total_bytes <= XFS_MIN + 128 * MIB);
    let df: u64 = sh(&format!("df -B1 --output=size {} | tail -1", m.path))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(df, after.total_bytes);
    // Growing to the size it has: Ok.
    fs.grow(&dev, &m.path, Fstype::Xfs).await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn grow_ext4_online() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 64);
    let dev = format!("/dev/{vg}/e");
    let fs = filesystems();
    fs.mkfs(&dev, Fstype::Ext4).await.unwrap();
    let m = Mnt::new();
    fs.mount(&dev, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    std::fs::write(m.file("data"), "still here").unwrap();
    let before = statvfs(&m.path).unwrap();

    lvm().lv_extend(&vg, "e", 128 * MIB).await.unwrap();
    fs.grow(&dev, &m.path, Fstype::Ext4).await.unwrap();
    let after = statvfs(&m.path).unwrap();
    assert!(
        after.total_bytes >= before.total_bytes + 56 * MIB,
        "{before:?} -> {after:?}"
    );
    assert!(after.total_inodes > before.total_inodes);
    assert_eq!(
        std::fs::read_to_string(m.file("data")).unwrap(),
        "still here"
    );
    let blocks = |key: &str| -> u64 {
        sh(&format!("dumpe2fs -h {dev} 2>/dev/null | grep '^{key}:'"))
            .split_whitespace()
            .last()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(blocks("Block count") * blocks("Block size"), 128 * MIB);
    fs.grow(&dev, &m.path, Fstype::Ext4).await.unwrap();
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn statvfs_reports_bytes_and_inodes() {
    let mut s = Scratch::new(1, 1024);
    let disks = s.disks.clone();
    let vg = sh_vg(&mut s, &disks);
    sh_lv(&vg, "e", 64);
    let dev = format!("/dev/{vg}/e");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let m = Mnt::new();
    sh(&format!("mount {dev} {}", m.path));

    let st = statvfs(&m.path).unwrap();
    assert!(
        st.total_bytes > 48 * MIB && st.total_bytes < 64 * MIB,
        "{st:?}"
    );
    assert!(
        st.available_bytes <= st.total_bytes - st.used_bytes,
        "{st:?}"
    );
    assert_eq!(st.used_inodes + st.free_inodes, st.total_inodes);
    let fields: Vec<u64> = sh(&format!("stat -f -c '%S %b %f %c %d' {}", m.path))
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    let (frsize, blocks, free, files, ffree) =
        (fields[0], fields[1], fields[2], fields[3], fields[4]);
    assert_eq!(st.total_bytes, blocks * frsize);
    assert_eq!(st.used_bytes, (blocks - free) * frsize);
    assert_eq!(st.total_inodes, files);
    assert_eq!(st.free_inodes, ffree);

    sh(&format!(
        "dd if=/dev/zero of={} bs=1M count=4 conv=fsync status=none && mkdir {}",
        m.file("zeros"),
        m.file("d")
    ));
    let after = statvfs(m.file("d")).unwrap();
    assert!(
        after.used_bytes >= st.used_bytes + 4 * MIB,
        "{st:?} -> {after:?}"
    );
    assert_eq!(after.used_inodes, st.used_inodes + 2);

    let err = statvfs("/run/lvms-mnt/does-not-exist").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
}

/// A thin volume with `fstype`, mounted, holding `data` = "v1"; a thin snapshot `snap` of it taken while
/// mounted (as a CSI snapshot of a volume in use is), activated; then "v2" written to the origin.
/// Returns the volume group and the origin's mount.
async fn snapshot_of_mounted_origin(
    s: &mut Scratch,
    fstype: Fstype,
    read_only: bool,
) -> (String, Mnt) {
    let disks = s.disks.clone();
    let vg = sh_vg(s, &disks);
    sh_pool(&vg, "pool", 256);
    let size = if fstype == Fstype::Xfs {
        XFS_MIN
    } else {
        64 * MIB
    };
    sh_thin(&vg, "pool", "origin", size / MIB);
    let origin = format!("/dev/{vg}/origin");
    let fs = filesystems();
    fs.mkfs(&origin, fstype).await.unwrap();
    let om = Mnt::new();
    fs.mount(&origin, &om.path, fstype, &[], false)
        .await
        .unwrap();
    sh(&format!("echo v1 > {} && sync", om.file("data")));

    lvm()
        .thin_snapshot(&vg, "origin", "snap", read_only, &[])
        .await
        .unwrap();
    lvm().lv_activate(&vg, "snap", true).await.unwrap();
    sh(&format!("echo v2 > {} && sync", om.file("data")));
    (vg, om)
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn xfs_writable_snapshot_mounts_next_to_its_origin_with_nouuid() {
    let mut s = Scratch::new(1, 1024);
    let (vg, om) = snapshot_of_mounted_origin(&mut s, Fstype::Xfs, false).await;
    let fs = filesystems();
    let sm = Mnt::new();
    // Same filesystem UUID as the mounted origin: only nouuid (added by mount) lets XFS take it.
    assert_eq!(
        sh(&format!("blkid -p -o value -s UUID /dev/{vg}/snap")),
        sh(&format!("blkid -p -o value -s UUID /dev/{vg}/origin"))
    );
    fs.mount(
        &format!("/dev/{vg}/snap"),
        &sm.path,
        Fstype::Xfs,
        &[],
        false,
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read_to_string(sm.file("data")).unwrap(), "v1\n");
    assert_eq!(std::fs::read_to_string(om.file("data")).unwrap(), "v2\n");
    std::fs::write(sm.file("data"), "v3\n").unwrap();
    assert_eq!(std::fs::read_to_string(om.file("data")).unwrap(), "v2\n");
    let info = fs.find_mount_by_target(&sm.path).await.unwrap().unwrap();
    assert!(!info.read_only(), "{info:?}");
    assert!(info.super_options.iter().any(|o| o == "nouuid"), "{info:?}");
}

/// A read-only thin snapshot (`thin_snapshot(read_only = true)`, `--permission r`) of a mounted XFS volume,
/// mounted read-only (`mount(readonly = true)`): the snapshot's log needs recovery, and XFS cannot
/// recover on a read-only device ("recovery required on read-only device").
#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn xfs_read_only_snapshot_of_mounted_origin_mounts_read_only() {
    let mut s = Scratch::new(1, 1024);
    let (vg, om) = snapshot_of_mounted_origin(&mut s, Fstype::Xfs, true).await;
    let fs = filesystems();
    let sm = Mnt::new();
    fs.mount(&format!("/dev/{vg}/snap"), &sm.path, Fstype::Xfs, &[], true)
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(sm.file("data")).unwrap(), "v1\n");
    assert_eq!(std::fs::read_to_string(om.file("data")).unwrap(), "v2\n");
    let info = fs.find_mount_by_target(&sm.path).await.unwrap().unwrap();
    assert!(info.read_only(), "{info:?}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn ext4_read_only_snapshot_of_mounted_origin_mounts_read_only() {
    let mut s = Scratch::new(1, 1024);
    let (vg, om) = snapshot_of_mounted_origin(&mut s, Fstype::Ext4, true).await;
    let fs = filesystems();
    let sm = Mnt::new();
    fs.mount(
        &format!("/dev/{vg}/snap"),
        &sm.path,
        Fstype::Ext4,
        &[],
        true,
    )
    .await
    .unwrap();
    assert_eq!(std::fs::read_to_string(sm.file("data")).unwrap(), "v1\n");
    assert_eq!(std::fs::read_to_string(om.file("data")).unwrap(), "v2\n");
    assert!(
        fs.find_mount_by_target(&sm.path)
            .await
            .unwrap()
            .unwrap()
            .read_only()
    );
    assert_ne!(sh_status(&format!("touch {}", sm.file("x"))).0, 0);
}

// ==== devices ====

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn discover_finds_loop_disk_with_size_and_by_id_links_for_virtio_disks() {
    let mut s = Scratch::new(1, 1024);
    let d = s.disks[0].clone();
    let vg = sh_vg(&mut s, std::slice::from_ref(&d));
    sh_lv(&vg, "lv1", 8);

    let all = devices().discover().await.unwrap();
    let lp = all.iter().find(|x| x.path == d).expect("loop disk found");
    assert_eq!(lp.kind, DeviceKind::Loop);
    assert_eq!(lp.size, GIB);
    assert!(!lp.read_only);
    assert_eq!(lp.fstype.as_deref(), Some("LVM2_member"));
    let backing = sh(&format!("losetup -n -O BACK-FILE {d}"));
    assert_eq!(lp.loop_backing_file.as_deref(), Some(backing.trim()));
    assert!(backing.starts_with("/tmp/lvms-scratch/"), "{backing}");
    let child = lp
        .children
        .iter()
        .find(|c| c.name == format!("{vg}-lv1"))
        .unwrap_or_else(|| panic!("LV under its disk: {lp:?}"));
    assert_eq!(child.kind, DeviceKind::Lvm);
    assert_eq!(child.size, 8 * MIB);

    // The VM's virtio disks, by their serials: read only.
    // Sizes and modes come from the kernel (blockdev), not from this file: the harness owns them.
    for serial in [
        "clean0",
        "clean1",
        "clean2",
        "decoy-ext4",
        "decoy-part",
        "decoy-mounted",
        "decoy-foreign",
        "decoy-ro",
    ] {
        let link = format!("/dev/disk/by-id/virtio-{serial}");
        let dev = all
            .iter()
            .find(|x| x.by_id.contains(&link))
            .unwrap_or_else(|| panic!("no device with {link}"));
        assert_eq!(dev.kind, DeviceKind::Disk, "{dev:?}");
        assert_eq!(dev.size, dev_size(&link), "{dev:?}");
        assert!(dev.size >= 512 * MIB, "{dev:?}");
        let ro = sh(&format!("blockdev --getro {link}"));
        assert_eq!(dev.read_only, ro.trim() == "1", "{dev:?}");
        assert_eq!(dev.read_only, serial == "decoy-ro", "{dev:?}");
        assert_eq!(dev.serial.as_deref(), Some(serial));
        let resolved = sh(&format!("readlink -f {link}"));
        assert_eq!(dev.path, resolved.trim());
        assert_eq!(
            devices().resolve_path(&link).await.as_deref(),
            Some(dev.path.as_str())
        );
    }
    assert_eq!(
        devices()
            .resolve_path("/dev/disk/by-id/virtio-nosuch")
            .await,
        None
    );
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn probe_signature_on_blank_vs_ext4_vs_pv_vs_gpt() {
    let s = Scratch::new(4, 1024);
    let (blank, ext4, pv, gpt) = (&s.disks[0], &s.disks[1], &s.disks[2], &s.disks[3]);
    sh(&format!("mkfs.ext4 -q {ext4}"));
    sh(&format!("lvm pvcreate -q {pv}"));
    sh(&format!(
        "echo 'label: gpt' | sfdisk -q --no-reread --no-tell-kernel {gpt}"
    ));

    let dv = devices();
    assert_eq!(dv.probe_signature(blank).await.unwrap(), None);
    assert_eq!(
        dv.probe_signature(ext4).await.unwrap().as_deref(),
        Some("ext4")
    );
    assert_eq!(
        dv.probe_signature(pv).await.unwrap().as_deref(),
        Some("LVM2_member")
    );
    assert_eq!(
        dv.probe_signature(gpt).await.unwrap().as_deref(),
        Some("gpt")
    );
    assert_eq!(sh_status(&format!("blkid -p {blank}")).0, 2);

    // Discovery reports the same (lsblk's FSTYPE or its own probe).
    let all = dv.discover().await.unwrap();
    let fstype = |d: &str| all.iter().find(|x| x.path == d).unwrap().fstype.clone();
    assert_eq!(fstype(blank), None);
    assert_eq!(fstype(ext4).as_deref(), Some("ext4"));
    assert_eq!(fstype(pv).as_deref(), Some("LVM2_member"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn wipe_removes_signatures_and_tears_down_dm_holders() {
    let mut s = Scratch::new(2, 1024);
    let (d0, d1) = (s.disks[0].clone(), s.disks[1].clone());
    let vg = sh_vg(&mut s, std::slice::from_ref(&d0));
    sh_lv(&vg, "lv1", 8);
    sh_pool(&vg, "pool", 64);
    sh_thin(&vg, "pool", "thin1", 64);
    let k = kname(&d0);
    let holders = sh(&format!("ls /sys/class/block/{k}/holders"));
    assert!(!holders.trim().is_empty(), "the LVs hold the disk");

    devices().wipe(&d0).await.unwrap();
    assert_eq!(sh(&format!("ls /sys/class/block/{k}/holders")).trim(), "");
    assert_ne!(sh_status(&format!("dmsetup info {vg}-lv1 2>&1")).0, 0);
    assert_eq!(
        sh(&format!("dmsetup ls | grep -c '^{vg}-' || true")).trim(),
        "0"
    );
    assert_eq!(blkid_type(&d0), "");
    assert_eq!(devices().probe_signature(&d0).await.unwrap(), None);
    assert!(!is_pv(&d0));
    assert!(lvm().vg(&vg).await.unwrap().is_none());

    // A disk with a filesystem and a partition table.
    sh(&format!(
        "echo 'label: gpt' | sfdisk -q --no-reread --no-tell-kernel {d1} && mkfs.ext4 -q -F {d1}"
    ));
    devices().wipe(&d1).await.unwrap();
    assert_eq!(blkid_type(&d1), "");
    assert_eq!(
        sh_status(&format!("blkid -p {d1}")).0,
        2,
        "no signature at all"
    );
    // Nothing left to wipe: Ok.
    devices().wipe(&d1).await.unwrap();
}

/// A loop disk with partition scanning (`losetup -P`), which `Scratch` does not give; detached, with its
/// volume group removed, on drop.
struct PartitionedDisk {
    dev: String,
    file: String,
    vg: String,
}

impl PartitionedDisk {
    /// A GPT with two partitions of `part_mib` MiB.
    fn new(size_mib: u64, part_mib: u64) -> Self {
        std::fs::create_dir_all("/tmp/lvms-scratch").unwrap();
        let file = format!("/tmp/lvms-scratch/{}.img", unique("p"));
        std::fs::File::create(&file)
            .unwrap()
            .set_len(size_mib * MIB)
            .unwrap();
        let dev = sh(&format!("losetup --find --show --partscan {file}"))
            .trim()
            .to_owned();
        sh(&format!(
            "printf 'size={part_mib}MiB\\nsize={part_mib}MiB\\n' | sfdisk -q --label gpt {dev} && udevadm settle"
        ));
        Self {
            dev,
            file,
            vg: unique("tvg"),
        }
    }

    fn part(&self, n: u32) -> String {
        format!("{}p{n}", self.dev)
    }
}

impl Drop for PartitionedDisk {
    fn drop(&mut self) {
        let (vg, dev, file) = (&self.vg, &self.dev, &self.file);
        let _ = sh_status(&format!(
            "lvm vgchange -an {vg} >/dev/null 2>&1; lvm vgremove -ff -y {vg} >/dev/null 2>&1; \
             losetup -d {dev}; rm -f {file}"
        ));
    }
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn wipe_of_partitioned_disk_tears_down_partition_holders_and_wipes_partitions() {
    lvms_testkit::require_vm();
    let disk = PartitionedDisk::new(1024, 256);
    let (p1, p2) = (disk.part(1), disk.part(2));
    let vg = &disk.vg;
    sh(&format!("lvm vgcreate -q {vg} {p1} 2>&1"));
    sh_lv(vg, "lv1", 8);
    sh(&format!("mkfs.ext4 -q {p2}"));

    // Discovery shows the partitions under their disk, each with its signature.
    let all = devices().discover().await.unwrap();
    let d = all.iter().find(|x| x.path == disk.dev).expect("disk found");
    assert_eq!(d.fstype.as_deref(), Some("gpt"), "{d:?}");
    let child = |p: &str| d.children.iter().find(|c| c.path == p).cloned();
    let c1 = child(&p1).unwrap_or_else(|| panic!("{p1} under {d:?}"));
    assert_eq!(c1.kind, DeviceKind::Part);
    assert_eq!(c1.size, 256 * MIB);
    assert_eq!(c1.fstype.as_deref(), Some("LVM2_member"));
    assert!(
        c1.children.iter().any(|c| c.name == format!("{vg}-lv1")),
        "{c1:?}"
    );
    assert_eq!(child(&p2).unwrap().fstype.as_deref(), Some("ext4"));

    let holders = format!("/sys/class/block/{}/holders", kname(&p1));
    assert!(!sh(&format!("ls {holders}")).trim().is_empty());
    devices().wipe(&disk.dev).await.unwrap();
    // The partition may be gone (the kernel re-read the wiped table); if not, nothing holds it.
    if exists(&holders) {
        assert_eq!(sh(&format!("ls {holders}")).trim(), "");
    }
    assert_eq!(
        sh(&format!("dmsetup ls | grep -c '^{vg}-' || true")).trim(),
        "0"
    );
    assert_ne!(sh_status(&format!("dmsetup info {vg}-lv1 2>&1")).0, 0);
    assert_eq!(
        sh_status(&format!("blkid -p {}", disk.dev)).0,
        2,
        "no partition table"
    );
    for p in [&p1, &p2] {
        // The partition device may be gone once the kernel re-read the empty table; if not, it is blank.
        if exists(p) {
            assert_eq!(blkid_type(p), "", "{p}");
        }
    }
    assert!(lvm().vg(vg).await.unwrap().is_none());
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn wipe_of_mounted_device_is_in_use_and_keeps_its_filesystem() {
    let s = Scratch::new(1, 1024);
    let d = &s.disks[0];
    let fs = filesystems();
    fs.mkfs(d, Fstype::Ext4).await.unwrap();
    let m = Mnt::new();
    fs.mount(d, &m.path, Fstype::Ext4, &[], false)
        .await
        .unwrap();

    let err = devices().wipe(d).await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert_eq!(blkid_type(d), "ext4");
    fs.unmount(&m.path).await.unwrap();
}
