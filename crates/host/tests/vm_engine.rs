//! The node engine against real LVM, inside the test VM (`cargo xtask vm-test engine_`).
//!
//! The VM has virtio disks `clean0..2` to claim and decoys that must never be touched: `decoy-ext4` (a
//! filesystem), `decoy-part` (a GPT partition table), `decoy-mounted` (a mounted filesystem),
//! `decoy-foreign` (an LVM physical volume of a foreign volume group) and `decoy-ro` (read-only). Other tests
//! use loop disks from `lvms_testkit::Scratch`.

use std::sync::OnceLock;

use lvms_core::{
    config::DeviceClassConfig,
    plan::{Action, ClassState, DeviceVerdict},
};
use lvms_host::{
    engine::{ConvergeReport, RealNodeHost, converge},
    lvm::{Layout, LvSpec, Lvm},
    runner::RealRunner,
};
use lvms_testkit::{Scratch, require_vm, sh, sh_status, unique};

static RUNNER: RealRunner = RealRunner;

fn host() -> RealNodeHost<&'static RealRunner> {
    RealNodeHost::new(&RUNNER)
}

fn class(yaml: &str) -> DeviceClassConfig {
    serde_norway::from_str(yaml).unwrap_or_else(|e| panic!("bad test config: {e}\n{yaml}"))
}

const BY_ID: &str = "/dev/disk/by-id/virtio-";
const DECOYS: [&str; 5] = [
    "decoy-ext4",
    "decoy-part",
    "decoy-mounted",
    "decoy-foreign",
    "decoy-ro",
];

/// Puts the decoys in place once per test binary.
fn decoys() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        require_vm();
        sh(&format!(
            "mkfs.ext4 -q -F {BY_ID}decoy-ext4 && \
             printf 'label: gpt\\n,256M,,\\n,,\\n' | sfdisk -q {BY_ID}decoy-part && \
             mkfs.ext4 -q -F {BY_ID}decoy-mounted && mkdir -p /run/lvms-decoy && \
             mount {BY_ID}decoy-mounted /run/lvms-decoy && echo keep > /run/lvms-decoy/file && \
             lvm pvcreate -q {BY_ID}decoy-foreign && lvm vgcreate -q foreignvg {BY_ID}decoy-foreign && \
             lvm lvcreate -q -y -L 64m -n data foreignvg && sync && udevadm settle"
        ));
    });
}

/// sha256 of the first 8 MiB and the last MiB (superblocks, partition tables, LVM labels and metadata,
/// the GPT backup).
fn fingerprint(dev: &str) -> String {
    sh(&format!(
        "d=$(readlink -f {dev}); mib=$(( $(blockdev --getsize64 $d) / 1048576 )); \
         dd if=$d bs=1M count=8 status=none | sha256sum; \
         dd if=$d bs=1M skip=$((mib - 1)) count=1 status=none | sha256sum"
    ))
}

fn signature(dev: &str) -> String {
    sh_status(&format!("blkid -p -o export {dev} | grep -E '^(PT)?TYPE='"))
        .1
        .trim()
        .to_owned()
}

fn verdict<'a>(report: &'a ConvergeReport, path: &str) -> &'a DeviceVerdict {
    &report
        .plan
        .devices
        .iter()
        .find(|d| d.path == path)
        .unwrap_or_else(|| panic!("{path} not in the report: {:#?}", report.plan.devices))
        .verdict
}

fn excluded_codes(report: &ConvergeReport, path: &str) -> Vec<String> {
    match verdict(report, path) {
        DeviceVerdict::Excluded { reasons } => {
            reasons.iter().map(|r| r.code().to_owned()).collect()
        }
        other => panic!("{path}: expected excluded, got {other:?}"),
    }
}

fn failed_reason(report: &ConvergeReport) -> &str {
    match &report.plan.state {
        ClassState::Failed { reason } => reason,
        other => panic!("expected Failed, got {other:?}"),
    }
}

fn vg_exists(name: &str) -> bool {
    sh_status(&format!("lvm vgs {name}")).0 == 0
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_claims_virtio_disks_by_id_extends_on_new_path_and_never_touches_decoys() {
    decoys();
    let before: Vec<String> = DECOYS
        .iter()
        .filter(|d| **d != "decoy-mounted")
        .map(|d| fingerprint(&format!("{BY_ID}{d}")))
        .collect();
    let optional: String = std::iter::once("clean1")
        .chain(DECOYS)
        .map(|d| format!("      - {BY_ID}{d}\n"))
        .collect();
    let yaml = format!(
        "name: vmclass\ndeviceSelector:\n  paths:\n    - {BY_ID}clean0\n  optionalPaths:\n{optional}\
         thinPoolConfig:\n  name: pool\n  sizePercent: 90\n  overprovisionRatio: 10\n  metadataSize: 32Mi\n"
    );
    let host = host();

    let first = converge(&host, &class(&yaml)).await.unwrap();
    assert!(first.is_ready(), "{:?}", first.plan.state);
    assert_eq!(
        verdict(&first, &format!("{BY_ID}clean0")),
        &DeviceVerdict::Member
    );
    assert_eq!(
        verdict(&first, &format!("{BY_ID}clean1")),
        &DeviceVerdict::Member
    );
    for (decoy, code) in [
        ("decoy-ext4", "filesystemSignature"),
        ("decoy-part", "hasChildren"),
        ("decoy-mounted", "mounted"),
        ("decoy-foreign", "physicalVolumeInOtherVg"),
        ("decoy-ro", "readOnly"),
    ] {
        let codes = excluded_codes(&first, &format!("{BY_ID}{decoy}"));
        assert!(codes.iter().any(|c| c == code), "{decoy}: {codes:?}");
    }
    let vg = first.volume_group.as_ref().unwrap();
    assert_eq!(vg.pv_count, 2);
    assert_eq!(vg.tags, ["lvms"]);
    let pool = first.thin_pool.as_ref().unwrap();
    assert_eq!(pool.segtype, "thin-pool");
    assert_eq!(sh("lvm vgs --noheadings -o vg_tags vmclass").trim(), "lvms");

    let second = converge(&host, &class(&yaml)).await.unwrap();
    assert!(second.is_ready());
    assert!(second.executed.is_empty(), "{:?}", second.executed);

    // A new mandatory path: the VG and the pool grow.
    let grown_yaml = yaml.replace(
        &format!("    - {BY_ID}clean0\n"),
        &format!("    - {BY_ID}clean0\n    - {BY_ID}clean2\n"),
    );
    let third = converge(&host, &class(&grown_yaml)).await.unwrap();
    assert!(third.is_ready(), "{:?}", third.plan.state);
    assert!(
        third
            .executed
            .iter()
            .any(|a| matches!(a, Action::ExtendVolumeGroup { .. })),
        "{:?}",
        third.executed
    );
    assert!(
        third
            .executed
            .iter()
            .any(|a| matches!(a, Action::ExtendThinPool { .. })),
        "{:?}",
        third.executed
    );
    assert_eq!(third.volume_group.as_ref().unwrap().pv_count, 3);
    assert!(third.thin_pool.as_ref().unwrap().size > pool.size);
    let fourth = converge(&host, &class(&grown_yaml)).await.unwrap();
    assert!(fourth.executed.is_empty(), "{:?}", fourth.executed);

    // Decoys: same bytes where LVM, a filesystem or a partition table would write.
    let after: Vec<String> = DECOYS
        .iter()
        .filter(|d| **d != "decoy-mounted")
        .map(|d| fingerprint(&format!("{BY_ID}{d}")))
        .collect();
    assert_eq!(before, after);
    assert_eq!(sh("cat /run/lvms-decoy/file").trim(), "keep");
    assert!(signature(&format!("{BY_ID}decoy-ext4")).contains("ext4"));
    assert!(signature(&format!("{BY_ID}decoy-part")).contains("gpt"));
    assert_eq!(sh("lvm vgs --noheadings -o pv_count foreignvg").trim(), "1");

    sh(&format!(
        "lvm vgremove -ff -y vmclass >/dev/null; for d in clean0 clean1 clean2; do \
         lvm pvremove -y $(readlink -f {BY_ID}$d) >/dev/null; done"
    ));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_mandatory_path_with_filesystem_fails_class_and_creates_nothing() {
    let mut s = Scratch::new(2, 1200);
    let vg = s.vg_name();
    sh(&format!("mkfs.ext4 -q {}", s.disks[0]));
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{}, {}]\n",
        s.disks[0], s.disks[1]
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    let reason = failed_reason(&report);
    assert!(reason.contains(&s.disks[0]), "{reason}");
    assert!(report.executed.is_empty());
    assert!(!vg_exists(&vg));
    assert_eq!(
        signature(&s.disks[1]),
        "",
        "the clean disk was left untouched"
    );
    assert!(signature(&s.disks[0]).contains("ext4"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_force_wipe_claims_disk_with_partitions_and_filesystem() {
    let mut s = Scratch::new(1, 1200);
    let vg = s.vg_name();
    let dev = s.disks[0].clone();
    sh(&format!(
        "printf 'label: gpt\\n,256M,,\\n,,\\n' | sfdisk -q {dev} && partx -u {dev} && \
         mkfs.ext4 -q -F {dev}p1 && udevadm settle"
    ));
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{dev}]\n  forceWipeDevicesAndDestroyAllData: true\n"
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    assert!(matches!(report.executed[0], Action::WipeDevice { .. }));
    assert!(
        signature(&dev).contains("LVM2_member"),
        "{}",
        signature(&dev)
    );
    assert_eq!(report.volume_group.unwrap().pv_count, 1);

    // Once it is ours, a second run does not wipe it again.
    let again = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(again.executed.is_empty(), "{:?}", again.executed);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_force_wipe_never_takes_a_mounted_disk() {
    let mut s = Scratch::new(1, 1200);
    let vg = s.vg_name();
    let dev = s.disks[0].clone();
    let mnt = format!("/run/lvms-mnt/{}", unique("m"));
    sh(&format!(
        "mkfs.ext4 -q {dev} && mkdir -p {mnt} && mount {dev} {mnt} && echo data > {mnt}/f"
    ));
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{dev}]\n  forceWipeDevicesAndDestroyAllData: true\n"
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(failed_reason(&report).contains("mounted"));
    assert!(report.executed.is_empty());
    assert_eq!(sh(&format!("cat {mnt}/f")).trim(), "data");
    sh(&format!("umount {mnt}"));
    assert!(signature(&dev).contains("ext4"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_leaves_a_same_named_volume_group_without_our_tag_alone() {
    let mut s = Scratch::new(2, 1200);
    let vg = s.vg_name();
    sh(&format!("lvm vgcreate -q {vg} {}", s.disks[0]));
    let yaml = format!("name: {vg}\ndeviceSelector:\n  paths: [{}]\n", s.disks[1]);
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    let reason = failed_reason(&report);
    assert!(reason.contains("not ours"), "{reason}");
    assert!(report.executed.is_empty());
    assert_eq!(
        sh(&format!("lvm vgs --noheadings -o pv_count,vg_tags {vg}")).trim(),
        "1"
    );
    assert_eq!(signature(&s.disks[1]), "");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_resumes_after_a_crash_between_pvcreate_and_vgcreate() {
    let mut s = Scratch::new(2, 1200);
    let vg = s.vg_name();
    // The state a crash after the first action leaves behind.
    sh(&format!("lvm pvcreate -q --metadatasize 4m {}", s.disks[0]));
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{}, {}]\nthinPoolConfig:\n  name: pool\n  \
         overprovisionRatio: 5\n  metadataSize: 16Mi\n",
        s.disks[0], s.disks[1]
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    let pvcreates: Vec<&Action> = report
        .executed
        .iter()
        .filter(|a| matches!(a, Action::CreatePhysicalVolume { .. }))
        .collect();
    assert_eq!(pvcreates.len(), 1, "{:?}", report.executed);
    assert_eq!(report.volume_group.unwrap().pv_count, 2);
    assert!(report.thin_pool.is_some());
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_thick_class_builds_only_a_volume_group() {
    let mut s = Scratch::new(1, 1200);
    let vg = s.vg_name();
    let yaml = format!("name: {vg}\ndeviceSelector:\n  paths: [{}]\n", s.disks[0]);
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.is_ready());
    let g = report.volume_group.unwrap();
    assert_eq!(g.lv_count, 0);
    assert_eq!(g.free, g.size);
    assert!(report.thin_pool.is_none());
    // The metadata area is sized for thousands of volumes.
    let mda: u64 = sh(&format!(
        "lvm pvs --noheadings --units b --nosuffix -o pv_mda_size {}",
        s.disks[0]
    ))
    .trim()
    .parse()
    .unwrap();
    assert!(mda >= 4 * 1024 * 1024, "pv_mda_size {mda}");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_raid1_class_builds_a_volume_group_that_takes_raid1_volumes() {
    let mut s = Scratch::new(2, 1200);
    let vg = s.vg_name();
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{}, {}]\nraidConfig:\n  type: raid1\n  mirrors: 1\n",
        s.disks[0], s.disks[1]
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    let lvm = Lvm::new(&RUNNER);
    lvm.lv_create(&LvSpec {
        vg: vg.clone(),
        name: "r1".into(),
        size: 64 * 1024 * 1024,
        layout: Layout::Raid {
            level: lvms_core::config::RaidType::Raid1,
            mirrors: Some(1),
            stripes: None,
            stripe_size: None,
            nosync: false,
            integrity: false,
        },
        tags: vec![],
    })
    .await
    .unwrap();
    let lv = lvm.lv(&vg, "r1").await.unwrap().unwrap();
    assert_eq!(lv.segtype, "raid1");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_raid1_class_with_one_device_fails_naming_the_minimum() {
    let mut s = Scratch::new(1, 1200);
    let vg = s.vg_name();
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{}]\nraidConfig:\n  type: raid1\n",
        s.disks[0]
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    let reason = failed_reason(&report);
    assert!(
        reason.contains("raid1 with 2 devices at least, but only 1 usable"),
        "{reason}"
    );
    assert!(!vg_exists(&vg));
    assert_eq!(signature(&s.disks[0]), "");
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_optional_paths_use_the_usable_devices_and_report_the_rest() {
    let mut s = Scratch::new(2, 1200);
    let vg = s.vg_name();
    sh(&format!("mkfs.xfs -q {}", s.disks[0]));
    let yaml = format!(
        "name: {vg}\ndeviceSelector:\n  optionalPaths: [{}, {}]\n",
        s.disks[0], s.disks[1]
    );
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    assert_eq!(verdict(&report, &s.disks[1]), &DeviceVerdict::Member);
    assert_eq!(
        excluded_codes(&report, &s.disks[0]),
        ["filesystemSignature"]
    );
    assert!(signature(&s.disks[0]).contains("xfs"));
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_missing_path_fails_the_class() {
    require_vm();
    let vg = unique("tvg");
    let yaml = format!("name: {vg}\ndeviceSelector:\n  paths: [/dev/disk/by-id/virtio-nosuch]\n");
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert_eq!(
        verdict(&report, "/dev/disk/by-id/virtio-nosuch"),
        &DeviceVerdict::Missing
    );
    assert!(failed_reason(&report).contains("does not exist"));
    assert!(!vg_exists(&vg));
}

// ---------------------------------------------------------------------------------------------------------
// Device patterns (csi-driver-lvm's devicePattern, ADR 0019)

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_a_pattern_over_every_virtio_disk_takes_the_clean_ones_and_names_itself() {
    // clean0 and clean1 blank, clean2 formatted; the decoys in place.
    only_free(&["clean0", "clean1"]);
    let fingerprints = || -> Vec<String> {
        DECOYS
            .iter()
            .filter(|d| **d != "decoy-mounted")
            .map(|d| fingerprint(&format!("{BY_ID}{d}")))
            .collect()
    };
    let before = fingerprints();
    let pattern = format!("{BY_ID}*");
    let yaml = format!("name: pattvg\ndeviceSelector:\n  devicePatterns: [\"{pattern}\"]\n");
    let dynamic = format!("{yaml}deviceDiscoveryPolicy: Dynamic\n");
    let host = host();

    // Under Dynamic every match is reported on every pass (under Static, once the group exists,
    // only its members are, as for discovered disks).
    let first = converge(&host, &class(&dynamic)).await.unwrap();
    assert!(first.is_ready(), "{:?}", first.plan.state);
    for clean in ["clean0", "clean1"] {
        assert_eq!(
            verdict(&first, &format!("{BY_ID}{clean}")),
            &DeviceVerdict::Member
        );
    }
    for (device, code) in [
        ("clean2", "filesystemSignature"),
        ("decoy-ext4", "filesystemSignature"),
        ("decoy-part", "hasChildren"),
        // The blank partition of a matched disk: a pattern that matches a disk takes none of its
        // partitions.
        ("decoy-part-part2", "partitionOfMatchedDisk"),
        ("decoy-mounted", "mounted"),
        ("decoy-foreign", "physicalVolumeInOtherVg"),
        ("decoy-ro", "readOnly"),
    ] {
        let path = format!("{BY_ID}{device}");
        let codes = excluded_codes(&first, &path);
        assert!(codes.iter().any(|c| c == code), "{device}: {codes:?}");
        let report = first.plan.devices.iter().find(|d| d.path == path).unwrap();
        assert_eq!(report.pattern.as_deref(), Some(pattern.as_str()));
        assert!(
            report
                .problems()
                .contains(&format!("matched by devicePatterns {pattern}")),
            "{}",
            report.problems()
        );
    }
    assert_eq!(first.volume_group.as_ref().unwrap().pv_count, 2);

    // A disk that matches later: Static leaves it alone, Dynamic adds it.
    sh(&format!(
        "wipefs -a -q $(readlink -f {BY_ID}clean2) && udevadm settle"
    ));
    let again = converge(&host, &class(&yaml)).await.unwrap();
    assert!(again.is_ready(), "{:?}", again.plan.state);
    assert!(again.executed.is_empty(), "{:?}", again.executed);
    assert!(
        !again
            .plan
            .devices
            .iter()
            .any(|d| d.path == format!("{BY_ID}clean2")),
        "{:#?}",
        again.plan.devices
    );
    let grown = converge(&host, &class(&dynamic)).await.unwrap();
    assert!(grown.is_ready(), "{:?}", grown.plan.state);
    let clean2 = sh(&format!("readlink -f {BY_ID}clean2")).trim().to_owned();
    assert!(
        grown.executed.contains(&Action::ExtendVolumeGroup {
            name: "pattvg".into(),
            pvs: vec![clean2],
        }),
        "{:?}",
        grown.executed
    );
    assert_eq!(grown.volume_group.as_ref().unwrap().pv_count, 3);

    assert_eq!(before, fingerprints());
    assert_eq!(sh("cat /run/lvms-decoy/file").trim(), "keep");
    assert!(signature(&format!("{BY_ID}decoy-part")).contains("gpt"));
    blank_clean_disks("pattvg");
}

// ---------------------------------------------------------------------------------------------------------
// Thin pools that lvm2 can place beside their metadata and its spare (ADR 0012), on discovered disks.

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
const CLEAN: [&str; 3] = ["clean0", "clean1", "clean2"];

/// A thin class without `deviceSelector` (it takes the node's free disks) and the Static metadata policy
/// with its default size, 1 GiB.
fn discovering_thin_class(name: &str, policy: &str) -> DeviceClassConfig {
    class(&format!(
        "name: {name}\ndeviceDiscoveryPolicy: {policy}\nthinPoolConfig:\n  name: pool\n  sizePercent: 90\n  \
         overprovisionRatio: 10\n  metadataSizeCalculationPolicy: Static\n"
    ))
}

/// Leaves only `free` of the clean 2 GiB disks free for discovery: the others get a filesystem (and the
/// decoys are set up, so discovery excludes them too).
fn only_free(free: &[&str]) {
    decoys();
    for d in CLEAN.iter().filter(|d| !free.contains(d)) {
        sh(&format!("mkfs.ext4 -q -F {BY_ID}{d}"));
    }
    sh("udevadm settle");
}

/// Removes the group and blanks the clean disks again.
fn blank_clean_disks(vg: &str) {
    sh_status(&format!("lvm vgremove -ff -y {vg}"));
    for d in CLEAN {
        sh_status(&format!(
            "lvm pvremove -y $(readlink -f {BY_ID}{d}); wipefs -a -q $(readlink -f {BY_ID}{d})"
        ));
    }
    sh("udevadm settle");
}

fn number(cmd: &str) -> u64 {
    let out = sh(cmd);
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("`{cmd}`: {e}: {out}"))
}

/// Extents of one clean disk once it is an LVM physical volume (510 of 4 MiB for 2 GiB).
fn pe_count(disk: &str) -> u64 {
    number(&format!(
        "lvm pvs --noheadings -o pv_pe_count $(readlink -f {BY_ID}{disk})"
    ))
}

fn created_pool(report: &ConvergeReport) -> (u64, Option<u64>) {
    report
        .executed
        .iter()
        .find_map(|a| match a {
            Action::CreateThinPool {
                data_size,
                metadata_size,
                ..
            } => Some((*data_size, *metadata_size)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no pool created: {:?}", report.executed))
}

/// The sizes of the group's logical volumes, hidden ones included (`[pool_tmeta]`, `[lvol0_pmspare]`).
fn lv_sizes(vg: &str) -> String {
    sh(&format!(
        "lvm lvs -a --noheadings --units b --nosuffix -o lv_name,lv_size,devices {vg}"
    ))
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_pool_on_two_discovered_2gib_disks_with_static_1gib_metadata_fits_beside_its_spare()
{
    only_free(&["clean0", "clean1"]);
    let vg = "poolfit2";
    let report = converge(&host(), &discovering_thin_class(vg, "Static"))
        .await
        .unwrap();
    assert!(
        report.is_ready(),
        "{:?}\n{}",
        report.plan.state,
        lv_sizes(vg)
    );
    let extent = report.volume_group.as_ref().unwrap().extent_size;
    assert_eq!(extent, 4 * MIB);
    assert_eq!(report.volume_group.as_ref().unwrap().pv_count, 2);
    let per_disk = pe_count("clean0");
    assert_eq!(pe_count("clean1"), per_disk);
    let (data, metadata) = created_pool(&report);
    assert_eq!(metadata, Some(GIB));
    // The spare takes 1 GiB of one disk, so only the other disk holds the metadata, behind the data.
    assert_eq!(data, (per_disk - GIB / extent) * extent, "{}", lv_sizes(vg));
    // The next round grows the data into the spare's disk: lvextend has no metadata to place.
    let all_but_metadata_and_spare = (2 * per_disk - 2 * GIB / extent) * extent;
    assert!(
        report.executed.contains(&Action::ExtendThinPool {
            vg: vg.into(),
            name: "pool".into(),
            data_size: all_but_metadata_and_spare
        }),
        "{:?}",
        report.executed
    );
    let pool = report.thin_pool.as_ref().unwrap();
    assert_eq!(pool.size, all_but_metadata_and_spare);
    assert_eq!(pool.metadata_size, Some(GIB));
    assert_eq!(report.volume_group.as_ref().unwrap().free_count, 0);
    let lvs = lv_sizes(vg);
    assert!(lvs.contains("[lvol0_pmspare]"), "{lvs}");
    // A thin volume can be made in it.
    sh(&format!("lvm lvcreate -q -y -V 64m -T {vg}/pool -n t1"));
    let again = converge(&host(), &discovering_thin_class(vg, "Static"))
        .await
        .unwrap();
    assert!(again.executed.is_empty(), "{:?}", again.executed);
    blank_clean_disks(vg);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_pool_on_one_discovered_2gib_disk_with_static_1gib_metadata_is_refused_naming_sizes()
{
    only_free(&["clean0"]);
    let vg = "poolfit1";
    let report = converge(&host(), &discovering_thin_class(vg, "Static"))
        .await
        .unwrap();
    let reason = failed_reason(&report).to_owned();
    for part in [
        "does not fit",
        "thinPoolConfig.metadataSize",
        "metadata (1Gi",
        "spare (1Gi)",
        "lower thinPoolConfig.metadataSize",
    ] {
        assert!(reason.contains(part), "{part:?} not in {reason}");
    }
    assert!(
        !report
            .executed
            .iter()
            .any(|a| matches!(a, Action::CreateThinPool { .. })),
        "{:?}",
        report.executed
    );
    assert_eq!(report.volume_group.as_ref().unwrap().pv_count, 1);
    assert!(report.thin_pool.is_none());
    assert_eq!(lv_sizes(vg).trim(), "", "nothing allocated");
    blank_clean_disks(vg);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_pool_on_discovered_disks_grows_onto_a_disk_found_later() {
    only_free(&["clean0", "clean1"]);
    let vg = "poolgrow";
    let class = discovering_thin_class(vg, "Dynamic");
    let first = converge(&host(), &class).await.unwrap();
    assert!(first.is_ready(), "{:?}", first.plan.state);
    let extent = first.volume_group.as_ref().unwrap().extent_size;
    let per_disk = pe_count("clean0");
    assert_eq!(
        first.thin_pool.as_ref().unwrap().size,
        (2 * per_disk - 2 * GIB / extent) * extent
    );

    // A third disk becomes free: the group takes it and the pool grows into every free extent (below
    // its 90 % target), its metadata and spare already placed.
    sh(&format!(
        "wipefs -a -q $(readlink -f {BY_ID}clean2) && udevadm settle"
    ));
    let second = converge(&host(), &class).await.unwrap();
    assert!(second.is_ready(), "{:?}", second.plan.state);
    assert!(
        second
            .executed
            .iter()
            .any(|a| matches!(a, Action::ExtendVolumeGroup { .. })),
        "{:?}",
        second.executed
    );
    let g = second.volume_group.as_ref().unwrap();
    assert_eq!(g.pv_count, 3);
    let pool = second.thin_pool.as_ref().unwrap();
    assert_eq!(
        pool.size,
        (3 * per_disk - 2 * GIB / extent) * extent,
        "{}",
        lv_sizes(vg)
    );
    assert_eq!(g.free_count, 0, "{}", lv_sizes(vg));
    let third = converge(&host(), &class).await.unwrap();
    assert!(third.executed.is_empty(), "{:?}", third.executed);
    blank_clean_disks(vg);
}

/// sha256 of a logical volume's first 4 MiB.
fn lv_sum(vg: &str, lv: &str) -> String {
    sh(&format!(
        "dd if=$(lvm lvs --noheadings -o lv_path {vg}/{lv} | tr -d ' ') bs=1M count=4 status=none \
         | sha256sum"
    ))
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_adopts_a_csi_driver_lvm_group_keeping_its_volumes_and_refuses_it_without_adopt() {
    let mut s = Scratch::new(2, 1200);
    // The group as csi-driver-lvm makes it (`vgcreate` with its tag over its devices, lvcreate
    // with `-W y` and its LV tag; mirror is raid1 with --nosync), under its default name.
    let vg = "csi-lvm";
    let _ = sh_status(&format!("lvm vgremove -ff -y {vg} >/dev/null 2>&1"));
    s.vgs.push(vg.to_owned());
    let (d0, d1) = (s.disks[0].clone(), s.disks[1].clone());
    sh(&format!(
        "lvm vgcreate -q --addtag vg.metal-stack.io/csi-lvm-driver {vg} {d0} {d1} && \
         lvm lvcreate -q -y -W y -L 64m --addtag lv.metal-stack.io/csi-lvm-driver -n pvc-11111111 {vg} && \
         lvm lvcreate -q -y -W y -L 64m --type raid1 --mirrors 1 --nosync \
           --addtag lv.metal-stack.io/csi-lvm-driver -n pvc-22222222 {vg} && \
         for lv in pvc-11111111 pvc-22222222; do \
           dd if=/dev/urandom of=$(lvm lvs --noheadings -o lv_path {vg}/$lv | tr -d ' ') bs=1M \
             count=4 conv=fsync status=none; done"
    ));
    let sums = [lv_sum(vg, "pvc-11111111"), lv_sum(vg, "pvc-22222222")];
    let disks_before = [fingerprint(&d0), fingerprint(&d1)];

    // Without adopt: the class of the group's name is refused, naming adopt; a class of another
    // name that lists the disks finds them excluded by the safety filter. Nothing is executed.
    let plain = format!("name: {vg}\ndeviceSelector:\n  optionalPaths: [{d0}, {d1}]\n");
    let report = converge(&host(), &class(&plain)).await.unwrap();
    let reason = failed_reason(&report);
    assert!(
        reason.contains("not ours") && reason.contains("adopt: csi-driver-lvm"),
        "{reason}"
    );
    assert!(report.executed.is_empty(), "{:?}", report.executed);
    let other = s.vg_name();
    let yaml = format!("name: {other}\ndeviceSelector:\n  optionalPaths: [{d0}, {d1}]\n");
    let report = converge(&host(), &class(&yaml)).await.unwrap();
    assert!(report.executed.is_empty(), "{:?}", report.executed);
    for d in [&d0, &d1] {
        let codes = excluded_codes(&report, d);
        assert!(
            codes.iter().any(|c| c == "physicalVolumeInOtherVg"),
            "{d}: {codes:?}"
        );
    }
    assert!(!vg_exists(&other));
    assert_eq!([fingerprint(&d0), fingerprint(&d1)], disks_before);

    // With adopt: only our tag is added; the volumes and their data stay, listed as foreign.
    let adopting = format!("{plain}adopt: csi-driver-lvm\n");
    let report = converge(&host(), &class(&adopting)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    assert_eq!(
        report.executed,
        [Action::AdoptVolumeGroup {
            name: vg.into(),
            tag: "lvms".into()
        }]
    );
    assert_eq!(report.foreign_volumes, ["pvc-11111111", "pvc-22222222"]);
    for d in [&d0, &d1] {
        assert_eq!(verdict(&report, d), &DeviceVerdict::Member);
    }
    let tags = sh(&format!("lvm vgs --noheadings -o vg_tags {vg}"));
    let mut tags: Vec<&str> = tags.trim().split(',').collect();
    tags.sort_unstable();
    assert_eq!(tags, ["lvms", "vg.metal-stack.io/csi-lvm-driver"]);
    assert_eq!(
        sh(&format!("lvm lvs --noheadings -o lv_name {vg}"))
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["pvc-11111111", "pvc-22222222"]
    );
    assert_eq!(
        [lv_sum(vg, "pvc-11111111"), lv_sum(vg, "pvc-22222222")],
        sums
    );
    // Converged: a second run executes nothing, with or without adopt.
    for yaml in [&adopting, &plain] {
        let again = converge(&host(), &class(yaml)).await.unwrap();
        assert!(again.is_ready(), "{:?}", again.plan.state);
        assert!(again.executed.is_empty(), "{:?}", again.executed);
    }
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn engine_adopts_a_topolvm_group_with_its_thin_pool_and_volumes_and_only_with_adopt() {
    let mut s = Scratch::new(1, 512);
    // The group an admin makes for TopoLVM's lvmd (no tag: lvmd never tags it), its thin pool
    // and one thin volume named after a LogicalVolume's UID, as lvmd makes it.
    let vg = s.vg_name();
    // lvmd's default chart names the class `ssd` and its group `myvg1`: the group is renamed after
    // the class first (docs/migration-from-lvms.md), which LVM does under a mounted volume.
    let lvmd_vg = format!("{vg}lvmd");
    s.vgs.push(lvmd_vg.clone());
    let d0 = s.disks[0].clone();
    let id = "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
    let mnt = "/run/lvms-vgrename";
    sh(&format!(
        "lvm vgcreate -q {lvmd_vg} {d0} && lvm lvcreate -q -y -L 256m -T {lvmd_vg}/pool0 && \
         lvm lvcreate -q -y -T {lvmd_vg}/pool0 -n {id} -V 64m -W y && \
         mkfs.ext4 -q /dev/{lvmd_vg}/{id} && mkdir -p {mnt} && mount /dev/{lvmd_vg}/{id} {mnt} && \
         echo before > {mnt}/f && sync && lvm vgrename -q {lvmd_vg} {vg}"
    ));
    // The mount survives the rename and reads and writes; the LV's new path is the device mounted
    // (mountinfo keeps the source string given at mount time, so the device numbers are compared,
    // as the Node service compares them).
    let out = sh(&format!(
        "echo after >> {mnt}/f && sync && cat {mnt}/f && findmnt -n -o MAJ:MIN {mnt} && \
         lsblk -dn -o MAJ:MIN /dev/{vg}/{id}"
    ));
    let lines: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(lines[..2], ["before", "after"], "{out}");
    assert_eq!(
        lines[2], lines[3],
        "mounted device and /dev/{vg}/{id}: {out}"
    );
    sh(&format!("umount {mnt}"));
    let sum = lv_sum(&vg, id);
    let pool_uuid = sh(&format!("lvm lvs --noheadings -o lv_uuid {vg}/pool0"));
    let plain = format!(
        "name: {vg}\ndeviceSelector:\n  paths: [{d0}]\nthinPoolConfig:\n  name: pool0\n  \
         sizePercent: 50\n  overprovisionRatio: 10\n"
    );

    // Without adopt: refused, adopt: topolvm named, nothing executed.
    let report = converge(&host(), &class(&plain)).await.unwrap();
    let reason = failed_reason(&report);
    assert!(reason.contains("set adopt: topolvm"), "{reason}");
    assert!(report.executed.is_empty(), "{:?}", report.executed);

    // With adopt: the tag, and nothing else; the pool is the class's pool, the volume kept.
    let adopting = format!("{plain}adopt: topolvm\n");
    let report = converge(&host(), &class(&adopting)).await.unwrap();
    assert!(report.is_ready(), "{:?}", report.plan.state);
    assert_eq!(
        report.executed,
        [Action::AdoptVolumeGroup {
            name: vg.clone(),
            tag: "lvms".into()
        }]
    );
    assert_eq!(
        sh(&format!("lvm vgs --noheadings -o vg_tags {vg}")).trim(),
        "lvms"
    );
    assert_eq!(
        sh(&format!("lvm lvs --noheadings -o lv_uuid {vg}/pool0")),
        pool_uuid
    );
    assert_eq!(lv_sum(&vg, id), sum);
    let again = converge(&host(), &class(&plain)).await.unwrap();
    assert!(again.is_ready(), "{:?}", again.plan.state);
    assert!(again.executed.is_empty(), "{:?}", again.executed);
}
