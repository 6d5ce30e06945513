//! The exact LVM command lines of each backend call, with a scripted runner: what is looked up, what is
//! made, with which tags, and which calls the cached report saves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lvms_core::{
    config::{RaidConfig, RaidType},
    size::{GIB, MIB},
};
use lvms_host::{
    fake::FakeRunner,
    lvm::{LV_FIELDS, PV_FIELDS, VG_FIELDS},
};

use super::*;

const EXTENT: u64 = 4 * MIB;
const NOW: u64 = 1_700_000_000;

const REAL_VGS: &str = include_str!("../../../host/tests/fixtures/real/vgs-all.json");
const REAL_LVS: &str = include_str!("../../../host/tests/fixtures/real/lvs-fields.json");
const LVCREATE_NO_SPACE: &str =
    include_str!("../../../host/tests/fixtures/lvm/stderr/lvcreate-insufficient-free-space.txt");

fn classes() -> Vec<DeviceClassConfig> {
    vec![
        DeviceClassConfig::named("thin")
            .with_thin_pool("pool", 10)
            .as_default(),
        DeviceClassConfig::named("thick"),
    ]
}

fn setup() -> (FakeRunner, LocalBackend<FakeRunner>) {
    let fake = FakeRunner::new();
    let backend = LocalBackend::new("node-a", classes(), Lvm::new(fake.clone())).with_clock(|| NOW);
    (fake, backend)
}

fn report_argv(sub: &'static str, fields: &'static str) -> Vec<&'static str> {
    vec![
        "lvm",
        sub,
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
    ]
}

fn vg_row(name: &str, size: u64, free: u64) -> String {
    format!(
        r#"{{"vg_name":"{name}", "vg_uuid":"u-{name}", "vg_size":"{size}", "vg_free":"{free}", "vg_extent_size":"{EXTENT}", "vg_extent_count":"{}", "vg_free_count":"{}", "pv_count":"2", "lv_count":"1", "vg_tags":"lvms", "vg_attr":"wz--n-", "vg_mda_free":"520704", "vg_mda_size":"1044480"}}"#,
        size / EXTENT,
        free / EXTENT
    )
}

/// Both class volume groups (8 GiB each; the thick one has 5 GiB free) and an unrelated one.
fn vgs() -> String {
    format!(
        r#"{{"report":[{{"vg":[{},{},{}]}}]}}"#,
        vg_row("thin", 8 * GIB, 0),
        vg_row("thick", 8 * GIB, 5 * GIB),
        vg_row("other", 8 * GIB, 8 * GIB)
    )
}

#[derive(Clone)]
struct Lv {
    vg: &'static str,
    name: String,
    size: u64,
    attr: &'static str,
    segtype: &'static str,
    pool: &'static str,
    data: &'static str,
    tags: Vec<String>,
}

impl Lv {
    fn row(&self) -> String {
        format!(
            r#"{{"lv_name":"{}", "vg_name":"{}", "lv_uuid":"u-{}", "lv_size":"{}", "lv_attr":"{}", "segtype":"{}", "pool_lv":"{}", "origin":"", "data_percent":"{}", "metadata_percent":"", "lv_metadata_size":"", "sync_percent":"", "lv_tags":"{}", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}}"#,
            self.name,
            self.vg,
            self.name,
            self.size,
            self.attr,
            self.segtype,
            self.pool,
            self.data,
            self.tags.join(",")
        )
    }
}

/// The 4 GiB pool of class `thin`, 25 % used.
fn pool() -> Lv {
    Lv {
        vg: "thin",
        name: "pool".into(),
        size: 4 * GIB,
        attr: "twi-aotz--",
        segtype: "thin-pool",
        pool: "",
        data: "25.00",
        tags: vec![],
    }
}

fn thin_volume(name: &str, size: u64) -> Lv {
    Lv {
        vg: "thin",
        name: ids::volume_lv_name(name),
        size,
        attr: "Vwi-a-tz--",
        segtype: "thin",
        pool: "pool",
        data: "0.00",
        tags: vec![ids::OWNER_TAG.into(), ids::name_tag(name)],
    }
}

fn thin_snapshot(name: &str, source: &str, size: u64) -> Lv {
    Lv {
        vg: "thin",
        name: ids::snapshot_lv_name(name),
        size,
        attr: "Vri---tz-k",
        segtype: "thin",
        pool: "pool",
        data: "",
        tags: vec![
            ids::OWNER_TAG.into(),
            ids::name_tag(name),
            ids::SNAPSHOT_TAG.into(),
            ids::created_tag(NOW),
            Source::Volume(ids::volume_lv_name(source)).tag(),
        ],
    }
}

fn thick_volume(name: &str, size: u64) -> Lv {
    Lv {
        vg: "thick",
        name: ids::volume_lv_name(name),
        size,
        attr: "-wi-a-----",
        segtype: "linear",
        pool: "",
        data: "",
        tags: vec![ids::OWNER_TAG.into(), ids::name_tag(name)],
    }
}

fn lvs(lvs: &[Lv]) -> String {
    let rows: Vec<String> = lvs.iter().map(Lv::row).collect();
    format!(r#"{{"report":[{{"lv":[{}]}}]}}"#, rows.join(","))
}

/// Scripts one report: `vgs` then `lvs`.
fn expect_report(fake: &FakeRunner, lv_list: &[Lv]) {
    fake.expect(&report_argv("vgs", VG_FIELDS)).stdout(vgs());
    fake.expect(&report_argv("lvs", LV_FIELDS))
        .stdout(lvs(lv_list));
}

/// `lvm lvs ... <vg>/<lv>`, the look `Lvm::lv` makes.
fn expect_lv(fake: &FakeRunner, lv: &Lv) {
    let target = format!("{}/{}", lv.vg, lv.name);
    let mut argv = report_argv("lvs", LV_FIELDS);
    argv.push(&target);
    fake.expect(&argv).stdout(lvs(std::slice::from_ref(lv)));
}

/// `lvm vgs ... <vg>`, the look `Lvm::vg` makes, answering `row`.
fn expect_vg(fake: &FakeRunner, vg: &str, row: String) {
    let mut argv = report_argv("vgs", VG_FIELDS);
    argv.push(vg);
    fake.expect(&argv)
        .stdout(format!(r#"{{"report":[{{"vg":[{row}]}}]}}"#));
}

/// `lvm lvcreate` of thin volume `name` (CO name) of `size` bytes in pool `thin/pool`, succeeding.
fn expect_thin_lvcreate(fake: &FakeRunner, name: &str, size: u64) {
    let size = format!("{size}b");
    let name_tag = ids::name_tag(name);
    let lv_name = ids::volume_lv_name(name);
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--virtualsize",
        &size,
        "--thinpool",
        "pool",
        "--addtag",
        "lvms",
        "--addtag",
        &name_tag,
        "--name",
        &lv_name,
        "thin",
    ])
    .succeeds();
}

fn new_volume(name: &str, class: &str, size: u64) -> NewVolume {
    NewVolume {
        name: name.into(),
        class: class.into(),
        size,
        lv_type: None,
        volume_mode: None,
        source: None,
        ephemeral: None,
    }
}

// ---- volumes ----

#[tokio::test]
async fn create_thin_volume_runs_lvcreate_in_the_pool_with_owner_and_name_tags() {
    let (fake, b) = setup();
    let lv_name = ids::volume_lv_name("pvc-1");
    let name_tag = ids::name_tag("pvc-1");
    expect_report(&fake, &[pool()]);
    // 1 GiB + 1 byte is rounded up to whole extents.
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--virtualsize",
        "1077936128b",
        "--thinpool",
        "pool",
        "--addtag",
        "lvms",
        "--addtag",
        &name_tag,
        "--name",
        &lv_name,
        "thin",
    ])
    .succeeds();
    // Read back: the new LV only.
    expect_lv(&fake, &thin_volume("pvc-1", GIB + EXTENT));

    let vol = b
        .create_volume(&new_volume("pvc-1", "thin", GIB + 1))
        .await
        .unwrap();
    fake.assert_done();
    assert_eq!(
        vol,
        Volume {
            id: lv_name.clone(),
            class: "thin".into(),
            size: GIB + EXTENT,
            name: Some("pvc-1".into()),
            source: None,
            snapshot: false,
            thin: true,
            created: None,
            requested: None,
            health: LvHealth::Ok,
            device: format!("/dev/thin/{lv_name}"),
            ephemeral: None,
            open: false,
        }
    );
}

#[tokio::test]
async fn create_volume_twice_runs_one_lvcreate() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool()]);
    expect_thin_lvcreate(&fake, "pvc-1", GIB);
    expect_lv(&fake, &thin_volume("pvc-1", GIB));

    let req = new_volume("pvc-1", "thin", GIB);
    let first = b.create_volume(&req).await.unwrap();
    let second = b.create_volume(&req).await.unwrap();
    fake.assert_done();
    assert_eq!(first, second);
    assert_eq!(
        fake.calls().len(),
        4,
        "one report, one lvcreate, its read-back; the second create is answered from the patched report"
    );
}

#[tokio::test]
async fn a_change_while_the_report_is_held_copies_no_unchanged_volume() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool(), thin_volume("pvc-0", GIB)]);
    expect_thin_lvcreate(&fake, "pvc-1", GIB);
    expect_lv(&fake, &thin_volume("pvc-1", GIB));
    let held = b.report().await.unwrap();
    b.create_volume(&new_volume("pvc-1", "thin", GIB))
        .await
        .unwrap();
    fake.assert_done();
    let patched = b.report().await.unwrap();
    // The held report is as it was; the patched one shares its volumes, and adds the new one.
    assert_eq!(held.lvs.len(), 2);
    assert_eq!(patched.lvs.len(), 3);
    for (before, after) in held.lvs.iter().zip(&patched.lvs) {
        assert!(Arc::ptr_eq(before, after), "{} was copied", after.name);
    }
}

#[tokio::test]
async fn a_failed_read_back_marks_the_report_stale() {
    let (fake, b) = setup();
    let made = thin_volume("pvc-1", GIB);
    expect_report(&fake, &[pool()]);
    expect_thin_lvcreate(&fake, "pvc-1", GIB);
    let target = format!("thin/{}", made.name);
    let mut argv = report_argv("lvs", LV_FIELDS);
    argv.push(&target);
    fake.expect(&argv).times_out();
    let err = b
        .create_volume(&new_volume("pvc-1", "thin", GIB))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::Host(_)), "{err:?}");
    fake.assert_done();
    // The next read takes a full report and finds the volume.
    expect_report(&fake, &[pool(), made.clone()]);
    assert!(b.get(&made.name).await.unwrap().is_some());
    fake.assert_done();
}

#[tokio::test]
async fn create_volume_found_with_another_size_is_returned_as_found() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool(), thin_volume("pvc-1", GIB)]);
    let vol = b
        .create_volume(&new_volume("pvc-1", "thin", 2 * GIB))
        .await
        .unwrap();
    fake.assert_done();
    assert_eq!(vol.size, GIB, "the controller decides compatibility");
}

#[tokio::test]
async fn create_volume_found_in_another_class_is_returned_as_found_there() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool(), thin_volume("pvc-1", GIB)]);
    let vol = b
        .create_volume(&new_volume("pvc-1", "thick", GIB))
        .await
        .unwrap();
    fake.assert_done();
    assert_eq!(vol.class, "thin", "the controller sees the other class");
}

#[tokio::test]
async fn create_volume_over_a_foreign_lv_of_the_same_name_is_a_conflict() {
    let (fake, b) = setup();
    let mut foreign = thin_volume("pvc-1", GIB);
    foreign.tags = vec!["backup".into()];
    expect_report(&fake, &[pool(), foreign]);
    let err = b
        .create_volume(&new_volume("pvc-1", "thin", GIB))
        .await
        .unwrap_err();
    fake.assert_done();
    let BackendError::Conflict(msg) = err else {
        panic!("{err:?}")
    };
    let lv_name = ids::volume_lv_name("pvc-1");
    assert!(msg.contains(&format!("thin/{lv_name}")), "{msg}");
    assert!(msg.contains("does not carry this driver's tag"), "{msg}");
}

#[tokio::test]
async fn create_volume_over_our_lv_with_another_name_tag_is_a_conflict() {
    let (fake, b) = setup();
    let mut other = thin_volume("pvc-1", GIB);
    other.tags = vec![ids::OWNER_TAG.into(), ids::name_tag("pvc-2")];
    expect_report(&fake, &[pool(), other]);
    let err = b
        .create_volume(&new_volume("pvc-1", "thin", GIB))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::Conflict(_)), "{err:?}");
}

/// Expects the report, `lvcreate` of a 1 GiB volume `name` in class `thick` with the `layout`
/// arguments (segment type `segtype`), and the read-back leaving `free` bytes in the group.
fn expect_thick_create(
    fake: &FakeRunner,
    name: &str,
    layout: &[&str],
    segtype: &'static str,
    free: u64,
) {
    expect_report(fake, &[]);
    expect_thick_lvcreate(fake, name, layout, segtype, free);
}

/// [`expect_thick_create`] with the report already cached.
fn expect_thick_lvcreate(
    fake: &FakeRunner,
    name: &str,
    layout: &[&str],
    segtype: &'static str,
    free: u64,
) {
    let lv_name = ids::volume_lv_name(name);
    let name_tag = ids::name_tag(name);
    let mut argv = vec!["lvm", "lvcreate", "--yes", "--type"];
    argv.extend(layout);
    argv.extend([
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--addtag",
        &name_tag,
        "--name",
        &lv_name,
        "thick",
    ]);
    fake.expect(&argv).succeeds();
    let mut made = thick_volume(name, GIB);
    made.segtype = segtype;
    // Read back: the LV and the volume group's free space.
    expect_lv(fake, &made);
    expect_vg(fake, "thick", vg_row("thick", 8 * GIB, free));
}

#[tokio::test]
async fn create_thick_striped_volume_runs_lvcreate_with_the_layout() {
    let (fake, b) = setup();
    expect_thick_create(
        &fake,
        "pvc-s",
        &["striped", "--stripes", "2", "--stripesize", "65536b"],
        "striped",
        4 * GIB,
    );
    let mut req = new_volume("pvc-s", "thick", GIB);
    req.lv_type = Some(Layout::Striped {
        stripes: Some(2),
        stripe_size: Some(64 * 1024),
    });
    let vol = b.create_volume(&req).await.unwrap();
    fake.assert_done();
    assert!(!vol.thin && !vol.snapshot);
    assert_eq!(vol.class, "thick");
    // The patched report answers capacity with the new free space.
    assert_eq!(
        b.capacity("thick", &Layout::Linear)
            .await
            .unwrap()
            .available,
        4 * GIB
    );
    fake.assert_done();
}

#[tokio::test]
async fn a_raid_class_makes_raid_volumes_when_the_request_names_no_layout() {
    let fake = FakeRunner::new();
    let raid = DeviceClassConfig {
        raid_config: Some(RaidConfig {
            raid_type: RaidType::Raid1,
            mirrors: Some(1),
            stripes: None,
            stripe_size: None,
        }),
        ..classes()[1].clone()
    };
    let b = LocalBackend::new("node-a", vec![raid], Lvm::new(fake.clone())).with_clock(|| NOW);
    expect_thick_create(
        &fake,
        "pvc-r",
        &["raid1", "--mirrors", "1"],
        "raid1",
        6 * GIB,
    );
    let vol = b
        .create_volume(&new_volume("pvc-r", "thick", GIB))
        .await
        .unwrap();
    fake.assert_done();
    assert_eq!(vol.class, "thick");
}

/// `lvm pvs` answering the thick group's two devices (`free` bytes each) and the thin group's one.
fn expect_pvs(fake: &FakeRunner, free: [u64; 2]) {
    let row = |name: &str, vg: &str, free: u64| {
        format!(
            r#"{{"pv_name":"/dev/{name}", "vg_name":"{vg}", "pv_uuid":"u-{name}", "pv_size":"{}", "pv_free":"{free}", "pv_attr":"a--"}}"#,
            4 * GIB
        )
    };
    fake.expect(&report_argv("pvs", PV_FIELDS)).stdout(format!(
        r#"{{"report":[{{"pv":[{},{},{}]}}]}}"#,
        row("vdb", "thick", free[0]),
        row("vdc", "thick", free[1]),
        row("vdd", "thin", 0)
    ));
}

fn mirror() -> Layout {
    Layout::Mirror {
        mirrors: 1,
        nosync: false,
        integrity: false,
    }
}

#[tokio::test]
async fn capacity_per_layout_reads_the_devices_once_until_a_change_of_the_group() {
    let (fake, b) = setup();
    expect_report(&fake, &[]);
    // Linear: the group's free space, no look at the devices.
    let linear = b.capacity("thick", &Layout::Linear).await.unwrap();
    assert_eq!((linear.available, linear.devices), (5 * GIB, None));
    fake.assert_done();

    // 4 GiB free on one device, 1 GiB on the other.
    expect_pvs(&fake, [4 * GIB, GIB]);
    let m = b.capacity("thick", &mirror()).await.unwrap();
    assert_eq!(
        m,
        Capacity {
            available: GIB - EXTENT,
            maximum_volume_size: GIB - EXTENT,
            minimum_volume_size: EXTENT,
            devices: Some(2),
        },
        "one copy on each device, less one extent of RAID metadata"
    );
    let striped = Layout::Striped {
        stripes: None,
        stripe_size: None,
    };
    assert_eq!(
        b.capacity("thick", &striped).await.unwrap().available,
        2 * GIB
    );
    assert_eq!(
        b.free_space("thick").await.unwrap(),
        Some(FreeSpace {
            extent_size: EXTENT,
            free_extents: vec![1024, 256],
        })
    );
    assert_eq!(b.free_space("thin").await.unwrap(), None);
    fake.assert_done();

    // A volume made in the group: the devices are read again at the next question.
    expect_thick_lvcreate(&fake, "pvc-a", &["linear"], "linear", 4 * GIB);
    b.create_volume(&new_volume("pvc-a", "thick", GIB))
        .await
        .unwrap();
    expect_pvs(&fake, [3 * GIB, GIB]);
    b.capacity("thick", &mirror()).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn a_layout_the_group_has_too_few_devices_for_is_refused_naming_them() {
    let fake = FakeRunner::new();
    let b = LocalBackend::new("node-a", classes(), Lvm::new(fake.clone())).with_clock(|| NOW);
    fake.expect(&report_argv("vgs", VG_FIELDS)).stdout(vgs().replace(
        r#""vg_name":"thick", "vg_uuid":"u-thick", "vg_size":"8589934592", "vg_free":"5368709120", "vg_extent_size":"4194304", "vg_extent_count":"2048", "vg_free_count":"1280", "pv_count":"2""#,
        r#""vg_name":"thick", "vg_uuid":"u-thick", "vg_size":"8589934592", "vg_free":"5368709120", "vg_extent_size":"4194304", "vg_extent_count":"2048", "vg_free_count":"1280", "pv_count":"1""#,
    ));
    fake.expect(&report_argv("lvs", LV_FIELDS)).stdout(lvs(&[]));
    for layout in [
        mirror(),
        Layout::Striped {
            stripes: None,
            stripe_size: None,
        },
    ] {
        let mut req = new_volume("pvc-m", "thick", GIB);
        req.lv_type = Some(layout);
        let err = b.create_volume(&req).await.unwrap_err();
        assert!(
            matches!(&err, BackendError::InsufficientSpace(m)
                if m.contains(&format!("a {} volume needs 2 LVM physical volumes", layout.name()))
                    && m.contains("which has 1")),
            "{err}"
        );
    }
    fake.assert_done();
}

#[tokio::test]
async fn a_striped_volume_without_a_stripe_count_stripes_over_every_device() {
    let (fake, b) = setup();
    expect_thick_create(
        &fake,
        "pvc-s",
        &["striped", "--stripes", "2"],
        "striped",
        4 * GIB,
    );
    let mut req = new_volume("pvc-s", "thick", GIB);
    req.lv_type = Some(Layout::Striped {
        stripes: None,
        stripe_size: None,
    });
    b.create_volume(&req).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn mirror_options_reach_lvcreate() {
    let (fake, b) = setup();
    expect_thick_create(
        &fake,
        "pvc-m",
        &[
            "raid1",
            "--mirrors",
            "1",
            "--nosync",
            "--raidintegrity",
            "y",
        ],
        "raid1",
        4 * GIB,
    );
    let mut req = new_volume("pvc-m", "thick", GIB);
    req.lv_type = Some(Layout::Mirror {
        mirrors: 1,
        nosync: true,
        integrity: true,
    });
    b.create_volume(&req).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn thick_create_without_space_is_insufficient_space() {
    let (fake, b) = setup();
    expect_report(&fake, &[]);
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "linear",
        "--size",
        "10737418240b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--addtag",
        &ids::name_tag("big"),
        "--name",
        &ids::volume_lv_name("big"),
        "thick",
    ])
    .fails(5, LVCREATE_NO_SPACE);
    let err = b
        .create_volume(&new_volume("big", "thick", 10 * GIB))
        .await
        .unwrap_err();
    fake.assert_done();
    assert!(matches!(err, BackendError::InsufficientSpace(_)), "{err:?}");
}

#[tokio::test]
async fn thin_create_beyond_the_overprovision_ratio_is_refused_without_lvcreate() {
    let (fake, b) = setup();
    // Pool 4 GiB, ratio 10: 40 GiB may be promised; 35 GiB are.
    expect_report(&fake, &[pool(), thin_volume("a", 35 * GIB)]);
    let err = b
        .create_volume(&new_volume("b", "thin", 6 * GIB))
        .await
        .unwrap_err();
    fake.assert_done();
    let BackendError::InsufficientSpace(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("thin pool thin/pool"), "{msg}");
    assert!(msg.contains("overprovision ratio 10"), "{msg}");
}

#[tokio::test]
async fn create_in_an_unknown_class_is_not_found_and_a_missing_pool_unavailable() {
    let (fake, b) = setup();
    let err = b
        .create_volume(&new_volume("x", "nope", GIB))
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
    expect_report(&fake, &[]);
    let err = b
        .create_volume(&new_volume("x", "thin", GIB))
        .await
        .unwrap_err();
    fake.assert_done();
    let BackendError::Unavailable(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("thin pool thin/pool"), "{msg}");
}

// ---- snapshots, restores, clones ----

#[tokio::test]
async fn snapshot_is_a_read_only_thin_snapshot_tagged_with_its_source_and_time() {
    let (fake, b) = setup();
    let vol = thin_volume("pvc-1", GIB);
    let snap_name = ids::snapshot_lv_name("snap-1");
    let source_tag = Source::Volume(vol.name.clone()).tag();
    let origin = format!("thin/{}", vol.name);
    expect_report(&fake, &[pool(), vol.clone()]);
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--setactivationskip",
        "y",
        "--permission",
        "r",
        "--addtag",
        "lvms",
        "--addtag",
        &ids::name_tag("snap-1"),
        "--addtag",
        "lvms.snapshot",
        "--addtag",
        "lvms.created=1700000000",
        "--addtag",
        &source_tag,
        "--name",
        &snap_name,
        &origin,
    ])
    .succeeds();
    expect_lv(&fake, &thin_snapshot("snap-1", "pvc-1", GIB));
    let snap = b
        .create_snapshot(&NewSnapshot {
            name: "snap-1".into(),
            source_volume: vol.name.clone(),
        })
        .await
        .unwrap();
    fake.assert_done();
    assert_eq!(snap.id, snap_name);
    assert!(snap.snapshot && snap.thin);
    assert_eq!(snap.created, Some(NOW));
    assert_eq!(snap.source, Some(Source::Volume(vol.name)));
    assert_eq!(snap.name.as_deref(), Some("snap-1"));
}

#[tokio::test]
async fn snapshot_of_a_thick_volume_is_invalid_argument_naming_the_class() {
    let (fake, b) = setup();
    let vol = thick_volume("pvc-1", GIB);
    expect_report(&fake, std::slice::from_ref(&vol));
    let err = b
        .create_snapshot(&NewSnapshot {
            name: "snap-1".into(),
            source_volume: vol.name,
        })
        .await
        .unwrap_err();
    fake.assert_done();
    let BackendError::InvalidArgument(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("device class thick"), "{msg}");
    assert!(msg.contains("snapshots need a thin device class"), "{msg}");
}

#[tokio::test]
async fn snapshot_of_a_missing_volume_is_not_found_after_a_fresh_look() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool()]);
    expect_report(&fake, &[pool()]);
    let err = b
        .create_snapshot(&NewSnapshot {
            name: "snap-1".into(),
            source_volume: ids::volume_lv_name("gone"),
        })
        .await
        .unwrap_err();
    fake.assert_done();
    assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn restore_larger_than_the_snapshot_extends_the_new_volume() {
    let (fake, b) = setup();
    let snap = thin_snapshot("snap-1", "pvc-1", GIB);
    let source = Source::Snapshot(snap.name.clone());
    let lv_name = ids::volume_lv_name("pvc-2");
    let origin = format!("thin/{}", snap.name);
    let mut restored = thin_volume("pvc-2", GIB);
    restored.tags.push(source.tag());
    expect_report(&fake, &[pool(), snap.clone()]);
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--setactivationskip",
        "y",
        "--permission",
        "rw",
        "--addtag",
        "lvms",
        "--addtag",
        &ids::name_tag("pvc-2"),
        "--addtag",
        &source.tag(),
        "--addtag",
        &ids::requested_tag(2 * GIB),
        "--name",
        &lv_name,
        &origin,
    ])
    .succeeds();
    expect_lv(&fake, &restored); // read back
    expect_lv(&fake, &restored); // lv_extend's own look
    let target = format!("thin/{lv_name}");
    fake.expect(&["lvm", "lvextend", "--yes", "--size", "2147483648b", &target])
        .succeeds();
    let mut grown = restored.clone();
    grown.size = 2 * GIB;
    expect_lv(&fake, &grown);

    let mut req = new_volume("pvc-2", "thin", 2 * GIB);
    req.source = Some(source.clone());
    let vol = b.create_volume(&req).await.unwrap();
    fake.assert_done();
    assert_eq!(vol.size, 2 * GIB);
    assert_eq!(vol.source, Some(source));
    assert!(!vol.snapshot);
}

#[tokio::test]
async fn an_interrupted_restore_is_finished_on_retry() {
    let (fake, b) = setup();
    let snap = thin_snapshot("snap-1", "pvc-1", GIB);
    let source = Source::Snapshot(snap.name.clone());
    let mut restored = thin_volume("pvc-2", GIB);
    restored.tags.push(source.tag());
    // The snapshot was made, the extend never ran.
    expect_report(&fake, &[pool(), snap.clone(), restored.clone()]);
    expect_lv(&fake, &restored);
    let target = format!("thin/{}", restored.name);
    fake.expect(&["lvm", "lvextend", "--yes", "--size", "2147483648b", &target])
        .succeeds();
    let mut grown = restored.clone();
    grown.size = 2 * GIB;
    expect_lv(&fake, &grown);
    let mut req = new_volume("pvc-2", "thin", 2 * GIB);
    req.source = Some(source);
    assert_eq!(b.create_volume(&req).await.unwrap().size, 2 * GIB);
    fake.assert_done();
}

#[tokio::test]
async fn restore_smaller_than_the_snapshot_is_invalid_argument() {
    let (fake, b) = setup();
    let snap = thin_snapshot("snap-1", "pvc-1", 2 * GIB);
    expect_report(&fake, &[pool(), snap.clone()]);
    let mut req = new_volume("pvc-2", "thin", GIB);
    req.source = Some(Source::Snapshot(snap.name));
    let err = b.create_volume(&req).await.unwrap_err();
    fake.assert_done();
    let BackendError::InvalidArgument(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("cannot be smaller"), "{msg}");
}

#[tokio::test]
async fn clone_into_another_class_is_invalid_argument_naming_both() {
    let (fake, b) = setup();
    let vol = thin_volume("pvc-1", GIB);
    expect_report(&fake, &[pool(), vol.clone()]);
    let mut req = new_volume("pvc-2", "thick", GIB);
    req.source = Some(Source::Volume(vol.name));
    let err = b.create_volume(&req).await.unwrap_err();
    fake.assert_done();
    let BackendError::InvalidArgument(msg) = err else {
        panic!("{err:?}")
    };
    assert!(
        msg.contains("device class thin") && msg.contains("device class thick"),
        "{msg}"
    );
}

#[tokio::test]
async fn clone_in_a_thick_class_is_invalid_argument_naming_the_class() {
    let (fake, b) = setup();
    let vol = thick_volume("pvc-1", GIB);
    expect_report(&fake, std::slice::from_ref(&vol));
    let mut req = new_volume("pvc-2", "thick", GIB);
    req.source = Some(Source::Volume(vol.name));
    let err = b.create_volume(&req).await.unwrap_err();
    fake.assert_done();
    let BackendError::InvalidArgument(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("device class thick is thick"), "{msg}");
}

#[tokio::test]
async fn restore_from_a_missing_snapshot_is_not_found() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool()]);
    expect_report(&fake, &[pool()]);
    let mut req = new_volume("pvc-2", "thin", GIB);
    req.source = Some(Source::Snapshot(ids::snapshot_lv_name("gone")));
    let err = b.create_volume(&req).await.unwrap_err();
    fake.assert_done();
    assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
}

// ---- delete, expand, activate ----

#[tokio::test]
async fn delete_of_a_missing_volume_is_ok_false_after_a_fresh_look() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool()]);
    expect_report(&fake, &[pool()]);
    assert!(!b.delete(&ids::volume_lv_name("gone")).await.unwrap());
    fake.assert_done();
    // Ids of other shapes are not ours: no LVM call.
    assert!(!b.delete("pool").await.unwrap());
    assert!(!b.delete("csi-x").await.unwrap());
}

#[tokio::test]
async fn delete_removes_our_lv_after_looking_at_it() {
    let (fake, b) = setup();
    let vol = thin_volume("pvc-1", GIB);
    let target = format!("thin/{}", vol.name);
    expect_report(&fake, &[pool(), vol.clone()]);
    expect_lv(&fake, &vol); // ours? (one look, by the removal)
    fake.expect(&["lvm", "lvremove", "--yes", &target])
        .succeeds();
    // Read back: the pool, whose data usage fell.
    let mut emptier = pool();
    emptier.data = "10.00";
    expect_lv(&fake, &emptier);
    assert!(b.delete(&vol.name).await.unwrap());
    fake.assert_done();
    // The patched report answers without LVM: the volume is gone, the pool's usage is the new one.
    assert_eq!(b.get(&vol.name).await.unwrap(), None);
    let report = b.report().await.unwrap();
    assert_eq!(report.lv("thin", "pool").unwrap().data_percent, Some(10.0));
    fake.assert_done();
}

#[tokio::test]
async fn delete_never_removes_an_lv_that_is_not_ours() {
    let (fake, b) = setup();
    let mut foreign = thin_volume("pvc-1", GIB);
    foreign.tags.clear();
    expect_report(&fake, &[pool(), foreign.clone()]);
    expect_lv(&fake, &foreign);
    let err = b.delete(&foreign.name).await.unwrap_err();
    fake.assert_done();
    let BackendError::NotFound(msg) = err else {
        panic!("{err:?}")
    };
    assert!(msg.contains("left alone"), "{msg}");
}

#[tokio::test]
async fn expand_extends_to_whole_extents_and_returns_the_new_size() {
    let (fake, b) = setup();
    let vol = thick_volume("pvc-1", GIB);
    let target = format!("thick/{}", vol.name);
    expect_report(&fake, std::slice::from_ref(&vol));
    expect_lv(&fake, &vol);
    fake.expect(&["lvm", "lvextend", "--yes", "--size", "2151677952b", &target])
        .succeeds();
    let mut grown = vol.clone();
    grown.size = 2 * GIB + EXTENT;
    expect_lv(&fake, &grown);
    expect_vg(&fake, "thick", vg_row("thick", 8 * GIB, 4 * GIB - EXTENT));
    assert_eq!(
        b.expand(&vol.name, 2 * GIB + 1).await.unwrap(),
        2 * GIB + EXTENT
    );
    fake.assert_done();
    // Already that big: no LVM call (the report is fresh after the extend).
    assert_eq!(b.expand(&vol.name, GIB).await.unwrap(), 2 * GIB + EXTENT);
    fake.assert_done();
}

#[tokio::test]
async fn expand_of_a_missing_volume_is_not_found() {
    let (fake, b) = setup();
    expect_report(&fake, &[pool()]);
    expect_report(&fake, &[pool()]);
    let err = b
        .expand(&ids::volume_lv_name("gone"), GIB)
        .await
        .unwrap_err();
    fake.assert_done();
    assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
    let err = b
        .expand(&ids::snapshot_lv_name("s"), GIB)
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn activate_ignores_the_activation_skip_flag_and_returns_the_device() {
    let (fake, b) = setup();
    let snap = thin_snapshot("snap-1", "pvc-1", GIB);
    let target = format!("thin/{}", snap.name);
    expect_report(&fake, &[pool(), snap.clone()]);
    fake.expect(&[
        "lvm",
        "lvchange",
        "--activate",
        "y",
        "--ignoreactivationskip",
        &target,
    ])
    .succeeds();
    let mut active = snap.clone();
    active.attr = "Vri-a-tz-k";
    expect_lv(&fake, &active);
    assert_eq!(
        b.activate(&snap.name).await.unwrap(),
        format!("/dev/thin/{}", snap.name)
    );
    fake.assert_done();
}

// ---- reads and the cache ----

#[tokio::test]
async fn capacity_from_a_recorded_report_thin_and_thick() {
    let fake = FakeRunner::new();
    let classes = vec![
        DeviceClassConfig::named("vg1")
            .with_thin_pool("pool1", 10)
            .as_default(),
        DeviceClassConfig::named("foreign"),
    ];
    let b = LocalBackend::new("node-a", classes, Lvm::new(fake.clone()));
    fake.expect(&report_argv("vgs", VG_FIELDS)).stdout(REAL_VGS);
    fake.expect(&report_argv("lvs", LV_FIELDS)).stdout(REAL_LVS);
    // Pool 512 MiB at 1.56 %, thin1 and snap1 promise 256 MiB each: with ratio 10,
    // virtual free = 10 × 512 MiB − 512 MiB = 4.5 GiB, below 10 × physical free.
    assert_eq!(
        b.capacity("vg1", &Layout::Linear).await.unwrap(),
        Capacity {
            available: 4_831_838_208,
            maximum_volume_size: 4_831_838_208,
            minimum_volume_size: 4 * MIB,
            devices: None,
        }
    );
    // Thick: the volume group's free space (238 extents).
    assert_eq!(
        b.capacity("foreign", &Layout::Linear).await.unwrap(),
        Capacity {
            available: 998_244_352,
            maximum_volume_size: 998_244_352,
            minimum_volume_size: 4 * MIB,
            devices: None,
        }
    );
    fake.assert_done();
    assert!(matches!(
        b.capacity("nope", &Layout::Linear).await.unwrap_err(),
        BackendError::NotFound(_)
    ));
    // The recorded LVs carry no owner tag: none of them is ours.
    assert!(b.list().await.unwrap().is_empty());
    assert!(b.ready().await.unwrap());
}

#[tokio::test]
async fn reads_after_one_refresh_spawn_no_second_lvs() {
    let (fake, b) = setup();
    let vol = thin_volume("pvc-1", GIB);
    let snap = thin_snapshot("snap-1", "pvc-1", GIB);
    let mut foreign = thin_volume("other", GIB);
    foreign.tags.clear();
    expect_report(&fake, &[pool(), vol.clone(), snap.clone(), foreign]);
    let listed = b.list().await.unwrap();
    let got = b.get(&vol.name).await.unwrap().unwrap();
    b.capacity("thin", &Layout::Linear).await.unwrap();
    b.capacity("thick", &Layout::Linear).await.unwrap();
    assert!(b.ready().await.unwrap());
    fake.assert_done();
    assert_eq!(fake.calls().len(), 2);
    assert_eq!(listed.len(), 2, "ours only: {listed:?}");
    assert!(listed[0].id < listed[1].id, "sorted by id");
    assert_eq!(got.name.as_deref(), Some("pvc-1"));
    assert!(listed.iter().any(|v| v.snapshot && v.id == snap.name));
    // Ids of other shapes: no lookup at all.
    assert_eq!(b.get("pool").await.unwrap(), None);
    assert_eq!(b.get("../etc").await.unwrap(), None);
}

#[tokio::test]
async fn the_report_is_taken_again_after_its_ttl() {
    let fake = FakeRunner::new();
    let b = LocalBackend::new("node-a", classes(), Lvm::new(fake.clone()))
        .with_cache_ttl(Duration::from_millis(50));
    expect_report(&fake, &[pool()]);
    b.list().await.unwrap();
    b.list().await.unwrap();
    fake.assert_done();
    tokio::time::sleep(Duration::from_millis(80)).await;
    expect_report(&fake, &[pool()]);
    b.list().await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn health_comes_from_lv_attr() {
    let (fake, b) = setup();
    let mut vol = thin_volume("pvc-1", GIB);
    vol.attr = "Vwi-a-tzF-";
    expect_report(&fake, &[pool(), vol.clone()]);
    assert_eq!(
        b.get(&vol.name).await.unwrap().unwrap().health,
        LvHealth::Failed
    );
}

#[tokio::test]
async fn ready_needs_every_volume_group_and_pool() {
    let (fake, b) = setup();
    // No pool in the thin class's volume group.
    expect_report(&fake, &[]);
    assert!(!b.ready().await.unwrap());
    fake.assert_done();
}
