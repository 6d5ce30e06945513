//! The exact command lines of every LVM operation, the idempotency branches, and the error mapping.

use lvms_core::config::RaidType;

use super::*;
use crate::fake::FakeRunner;

const PVS: &str = include_str!("../../tests/fixtures/lvm/pvs.json");
const VGS: &str = include_str!("../../tests/fixtures/lvm/vgs.json");
const LVS: &str = include_str!("../../tests/fixtures/lvm/lvs.json");
const LVS_EMPTY: &str = include_str!("../../tests/fixtures/lvm/lvs.empty-vg.json");

macro_rules! stderr {
    ($name:literal) => {
        include_str!(concat!("../../tests/fixtures/lvm/stderr/", $name, ".txt"))
    };
}

fn setup() -> (FakeRunner, Lvm<FakeRunner>) {
    let fake = FakeRunner::new();
    (fake.clone(), Lvm::new(fake))
}

fn pvs_argv() -> Vec<&'static str> {
    vec![
        "lvm",
        "pvs",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        PV_FIELDS,
    ]
}

fn lvs_argv(target: &'static str) -> Vec<&'static str> {
    vec![
        "lvm",
        "lvs",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        LV_FIELDS,
        target,
    ]
}

fn vgs_argv(target: &'static str) -> Vec<&'static str> {
    vec![
        "lvm",
        "vgs",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        VG_FIELDS,
        target,
    ]
}

/// A one-row `lvs` report.
fn one_lv(name: &str, segtype: &str, size: u64, pool: &str, metadata_size: &str) -> String {
    format!(
        r#"{{"report":[{{"lv":[{{"lv_name":"{name}", "vg_name":"vg1", "lv_uuid":"u-{name}", "lv_size":"{size}", "lv_attr":"-wi-a-----", "segtype":"{segtype}", "pool_lv":"{pool}", "origin":"", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"{metadata_size}", "sync_percent":"", "lv_tags":"", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}}]}}]}}"#
    )
}

fn one_vg(name: &str, lv_count: u64) -> String {
    format!(
        r#"{{"report":[{{"vg":[{{"vg_name":"{name}", "vg_uuid":"u", "vg_size":"1069547520", "vg_free":"1069547520", "vg_extent_size":"4194304", "vg_extent_count":"255", "vg_free_count":"255", "pv_count":"1", "lv_count":"{lv_count}", "vg_tags":"", "vg_attr":"wz--n-", "vg_mda_free":"520704", "vg_mda_size":"1044480"}}]}}]}}"#
    )
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

// ---- reports ----

#[tokio::test]
async fn reports_ask_lvm_for_json_in_bytes_with_explicit_fields() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "pvs",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        "pv_name,vg_name,pv_uuid,pv_size,pv_free,pv_attr",
    ])
    .stdout(PVS);
    fake.expect(&[
        "lvm",
        "vgs",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        "vg_name,vg_uuid,vg_size,vg_free,vg_extent_size,vg_extent_count,vg_free_count,pv_count,\
         lv_count,vg_tags,vg_attr,vg_mda_free,vg_mda_size",
    ])
    .stdout(VGS);
    fake.expect(&[
        "lvm", "lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o",
        "lv_name,vg_name,lv_uuid,lv_size,lv_attr,segtype,pool_lv,origin,data_percent,\
         metadata_percent,lv_metadata_size,sync_percent,lv_tags,lv_path,lv_dm_path,stripes,stripe_size",
    ])
    .stdout(LVS);
    fake.expect(&lvs_argv("vg2")).stdout(LVS_EMPTY);
    assert_eq!(lvm.pvs().await.unwrap().len(), 5);
    assert_eq!(lvm.vgs().await.unwrap().len(), 3);
    assert_eq!(lvm.lvs(None).await.unwrap().len(), 6);
    assert!(lvm.lvs(Some("vg2")).await.unwrap().is_empty());
    fake.assert_done();
}

#[tokio::test]
async fn lvs_of_a_missing_volume_group_is_not_found() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("nosuch"))
        .fails(5, stderr!("vg-not-found"));
    assert!(matches!(
        lvm.lvs(Some("nosuch")).await,
        Err(Error::NotFound(_))
    ));
    fake.assert_done();
}

#[tokio::test]
async fn single_lookups_of_missing_objects_are_none() {
    let (fake, lvm) = setup();
    fake.expect(&vgs_argv("nosuch"))
        .fails(5, stderr!("vg-not-found"));
    fake.expect(&lvs_argv("vg1/nosuch"))
        .fails(5, stderr!("lv-not-found"));
    fake.expect(&lvs_argv("nosuch/lv"))
        .fails(5, stderr!("vg-not-found"));
    assert_eq!(lvm.vg("nosuch").await.unwrap(), None);
    assert_eq!(lvm.lv("vg1", "nosuch").await.unwrap(), None);
    assert_eq!(lvm.lv("nosuch", "lv").await.unwrap(), None);
    fake.assert_done();
}

#[tokio::test]
async fn unparseable_report_is_a_parse_error_with_argv() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout("  WARNING: something\n");
    match lvm.pvs().await {
        Err(Error::Parse { argv, .. }) => assert!(argv.to_string().starts_with("lvm pvs")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_command_timeout_is_reported_as_timeout() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).times_out();
    assert!(matches!(lvm.pvs().await, Err(Error::Timeout { .. })));
}

#[tokio::test]
async fn commands_carry_the_configured_timeout() {
    let fake = FakeRunner::new();
    let lvm = Lvm::new(fake.clone()).with_timeout(Duration::from_secs(7));
    fake.expect(&pvs_argv()).stdout(PVS);
    lvm.pvs().await.unwrap();
    assert_eq!(fake.calls()[0].timeout, Duration::from_secs(7));
}

// ---- validation happens before any command ----

#[tokio::test]
async fn bad_names_tags_and_paths_never_reach_a_command_line() {
    let (fake, lvm) = setup();
    assert!(matches!(
        lvm.lv_remove("vg1", "-ff").await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        lvm.vg_remove("a b").await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        lvm.pv_create("/dev/vdb --force", None).await,
        Err(Error::InvalidDevicePath { .. })
    ));
    assert!(matches!(
        lvm.vg_create("vg1", &s(&["vdb"]), &[]).await,
        Err(Error::InvalidDevicePath { .. })
    ));
    assert!(matches!(
        lvm.vg_create("vg1", &[], &[]).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        lvm.lv_add_tag("vg1", "lv1", "a,b").await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        lvm.thin_lv_create("vg1", "pool_tdata", "x", 1, &[]).await,
        Err(Error::InvalidName(_))
    ));
    assert!(matches!(
        lvm.thin_pool_create(&ThinPoolSpec {
            vg: "vg1".into(),
            name: "pool".into(),
            size: PoolSize::PercentFree(0),
            chunk_size: None,
            metadata_size: None,
            zero: false,
        })
        .await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(fake.calls().is_empty());
}

// ---- physical volumes ----

#[tokio::test]
async fn pv_create_runs_pvcreate_without_yes_and_with_metadata_size() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    fake.expect(&["lvm", "pvcreate", "--metadatasize", "1048576b", "/dev/vdb"])
        .succeeds();
    fake.expect(&pvs_argv()).stdout(PVS);
    fake.expect(&["lvm", "pvcreate", "/dev/vdc"]).succeeds();
    lvm.pv_create("/dev/vdb", Some(1024 * 1024)).await.unwrap();
    lvm.pv_create("/dev/vdc", None).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn pv_create_on_an_existing_physical_volume_does_nothing() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    lvm.pv_create("/dev/loop7", None).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn pv_create_over_a_filesystem_is_signature_exists() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    fake.expect(&["lvm", "pvcreate", "/dev/loop6"])
        .fails(5, stderr!("pvcreate-signature-refused"));
    match lvm.pv_create("/dev/loop6", None).await {
        Err(Error::SignatureExists { device, signature }) => {
            assert_eq!((device.as_str(), signature.as_str()), ("/dev/loop6", "xfs"));
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn pv_remove_of_a_device_without_label_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "pvremove", "--yes", "/dev/loop6"])
        .fails(5, stderr!("pvremove-no-pv"));
    lvm.pv_remove("/dev/loop6").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn pv_remove_of_a_volume_group_member_is_in_use() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "pvremove", "--yes", "/dev/loop0"])
        .fails(5, stderr!("pvremove-in-use"));
    assert!(matches!(
        lvm.pv_remove("/dev/loop0").await,
        Err(Error::InUse(_))
    ));
}

// ---- volume groups ----

#[tokio::test]
async fn vg_create_passes_tags_name_and_devices_without_yes() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "vgcreate",
        "--addtag",
        "lvms",
        "--addtag",
        "owner=node-1",
        "vg1",
        "/dev/vdb",
        "/dev/vdc",
    ])
    .succeeds();
    lvm.vg_create(
        "vg1",
        &s(&["/dev/vdb", "/dev/vdc"]),
        &s(&["lvms", "owner=node-1"]),
    )
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_create_retried_with_the_same_devices_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "vgcreate", "vg1", "/dev/loop0", "/dev/loop1"])
        .fails(5, stderr!("vgcreate-already-exists"));
    fake.expect(&pvs_argv()).stdout(PVS);
    lvm.vg_create("vg1", &s(&["/dev/loop0", "/dev/loop1"]), &[])
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_create_with_a_name_taken_by_other_devices_is_already_exists() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "vgcreate", "vg1", "/dev/loop7"])
        .fails(5, stderr!("vgcreate-already-exists"));
    fake.expect(&pvs_argv()).stdout(PVS);
    let err = lvm
        .vg_create("vg1", &s(&["/dev/loop7"]), &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert!(
        err.to_string()
            .contains("A volume group called vg1 already exists."),
        "{err}"
    );
}

#[tokio::test]
async fn vg_extend_adds_only_devices_not_yet_in_the_group() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    fake.expect(&["lvm", "vgextend", "vg1", "/dev/loop7", "/dev/vdd"])
        .succeeds();
    lvm.vg_extend("vg1", &s(&["/dev/loop0", "/dev/loop7", "/dev/vdd"]))
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_extend_with_all_devices_present_does_nothing() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    lvm.vg_extend("vg1", &s(&["/dev/loop0", "/dev/loop1"]))
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_extend_with_a_device_of_another_group_is_in_use() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    let err = lvm.vg_extend("vg1", &s(&["/dev/loop2"])).await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert!(err.to_string().contains("vg2"), "{err}");
    fake.assert_done();
}

#[tokio::test]
async fn vg_reduce_removes_only_member_devices() {
    let (fake, lvm) = setup();
    fake.expect(&pvs_argv()).stdout(PVS);
    fake.expect(&["lvm", "vgreduce", "vg1", "/dev/loop1"])
        .succeeds();
    fake.expect(&pvs_argv()).stdout(PVS);
    lvm.vg_reduce("vg1", &s(&["/dev/loop1", "/dev/loop2", "/dev/loop7"]))
        .await
        .unwrap();
    lvm.vg_reduce("vg1", &s(&["/dev/loop7"])).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_remove_of_an_empty_group_runs_vgremove_without_yes() {
    let (fake, lvm) = setup();
    fake.expect(&vgs_argv("vg2")).stdout(one_vg("vg2", 0));
    fake.expect(&["lvm", "vgremove", "vg2"]).succeeds();
    lvm.vg_remove("vg2").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_remove_of_a_missing_group_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&vgs_argv("nosuch"))
        .fails(5, stderr!("vg-not-found"));
    lvm.vg_remove("nosuch").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn vg_remove_of_a_group_with_volumes_is_in_use_and_removes_nothing() {
    let (fake, lvm) = setup();
    fake.expect(&vgs_argv("vg1")).stdout(one_vg("vg1", 3));
    let err = lvm.vg_remove("vg1").await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    fake.assert_done();
}

#[tokio::test]
async fn vg_remove_refused_by_lvm_prompt_is_in_use() {
    let (fake, lvm) = setup();
    fake.expect(&vgs_argv("vg3")).stdout(one_vg("vg3", 0));
    fake.expect(&["lvm", "vgremove", "vg3"])
        .fails(5, stderr!("vgremove-has-lvs"));
    assert!(matches!(lvm.vg_remove("vg3").await, Err(Error::InUse(_))));
}

#[tokio::test]
async fn vg_activate_and_deactivate_use_vgchange() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "vgchange", "--activate", "y", "vg1"])
        .succeeds();
    fake.expect(&["lvm", "vgchange", "--activate", "n", "vg1"])
        .succeeds();
    fake.expect(&["lvm", "vgchange", "--activate", "n", "nosuch"])
        .fails(5, stderr!("vg-not-found"));
    fake.expect(&["lvm", "vgchange", "--activate", "y", "nosuch"])
        .fails(5, stderr!("vg-not-found"));
    lvm.vg_activate("vg1", true).await.unwrap();
    lvm.vg_activate("vg1", false).await.unwrap();
    lvm.vg_activate("nosuch", false).await.unwrap();
    assert!(matches!(
        lvm.vg_activate("nosuch", true).await,
        Err(Error::NotFound(_))
    ));
    fake.assert_done();
}

#[tokio::test]
async fn vg_tags_use_vgchange() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "vgchange", "--addtag", "lvms", "vg1"])
        .succeeds();
    fake.expect(&["lvm", "vgchange", "--deltag", "old", "vg1"])
        .succeeds();
    lvm.vg_add_tag("vg1", "lvms").await.unwrap();
    lvm.vg_del_tag("vg1", "old").await.unwrap();
    fake.assert_done();
}

// ---- thin pools ----

#[tokio::test]
async fn thin_pool_from_a_percentage_of_free_space() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin-pool",
        "--extents",
        "90%FREE",
        "--chunksize",
        "65536b",
        "--poolmetadatasize",
        "1073741824b",
        "--zero",
        "n",
        "--name",
        "pool",
        "vg1",
    ])
    .succeeds();
    lvm.thin_pool_create(&ThinPoolSpec {
        vg: "vg1".into(),
        name: "pool".into(),
        size: PoolSize::PercentFree(90),
        chunk_size: Some(65536),
        metadata_size: Some(1 << 30),
        zero: false,
    })
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn thin_pool_of_a_fixed_size_with_lvm_defaults() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin-pool",
        "--size",
        "209715200b",
        "--zero",
        "y",
        "--name",
        "pool",
        "vg1",
    ])
    .succeeds();
    lvm.thin_pool_create(&ThinPoolSpec {
        vg: "vg1".into(),
        name: "pool".into(),
        size: PoolSize::Bytes(200 << 20),
        chunk_size: None,
        metadata_size: None,
        zero: true,
    })
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn thin_pool_create_without_space_is_insufficient_space() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin-pool",
        "--size",
        "10737418240b",
        "--zero",
        "n",
        "--name",
        "pool",
        "vg1",
    ])
    .fails(5, stderr!("lvcreate-insufficient-free-space"));
    let err = lvm
        .thin_pool_create(&ThinPoolSpec {
            vg: "vg1".into(),
            name: "pool".into(),
            size: PoolSize::Bytes(10 << 30),
            chunk_size: None,
            metadata_size: None,
            zero: false,
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace(_)), "{err:?}");
}

#[tokio::test]
async fn thin_pool_extend_grows_data_only_when_smaller() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/pool")).stdout(one_lv(
        "pool",
        "thin-pool",
        200 << 20,
        "",
        "4194304",
    ));
    fake.expect(&[
        "lvm",
        "lvextend",
        "--yes",
        "--size",
        "419430400b",
        "vg1/pool",
    ])
    .succeeds();
    fake.expect(&lvs_argv("vg1/pool")).stdout(one_lv(
        "pool",
        "thin-pool",
        400 << 20,
        "",
        "4194304",
    ));
    lvm.thin_pool_extend("vg1", "pool", 400 << 20)
        .await
        .unwrap();
    lvm.thin_pool_extend("vg1", "pool", 300 << 20)
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn thin_pool_metadata_extend_only_when_smaller() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/pool")).stdout(one_lv(
        "pool",
        "thin-pool",
        200 << 20,
        "",
        "4194304",
    ));
    fake.expect(&[
        "lvm",
        "lvextend",
        "--yes",
        "--poolmetadatasize",
        "8388608b",
        "vg1/pool",
    ])
    .succeeds();
    fake.expect(&lvs_argv("vg1/pool")).stdout(one_lv(
        "pool",
        "thin-pool",
        200 << 20,
        "",
        "8388608",
    ));
    lvm.thin_pool_metadata_extend("vg1", "pool", 8 << 20)
        .await
        .unwrap();
    lvm.thin_pool_metadata_extend("vg1", "pool", 8 << 20)
        .await
        .unwrap();
    fake.assert_done();
}

// ---- logical volumes ----

fn spec(layout: Layout) -> LvSpec {
    LvSpec {
        vg: "vg1".into(),
        name: "lv1".into(),
        size: 1 << 30,
        layout,
        tags: s(&["lvms"]),
    }
}

#[tokio::test]
async fn lv_create_linear() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "linear",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    lvm.lv_create(&spec(Layout::Linear)).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_create_rounds_a_byte_size_up_to_a_multiple_of_512_as_lvm_requires() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "linear",
        "--size",
        "10486272b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    let mut odd = spec(Layout::Linear);
    odd.size = 10 * 1024 * 1024 + 1;
    lvm.lv_create(&odd).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_create_striped_with_and_without_stripe_size() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "striped",
        "--stripes",
        "2",
        "--stripesize",
        "65536b",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "striped",
        "--stripes",
        "3",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    lvm.lv_create(&spec(Layout::Striped {
        stripes: Some(2),
        stripe_size: Some(65536),
    }))
    .await
    .unwrap();
    lvm.lv_create(&spec(Layout::Striped {
        stripes: Some(3),
        stripe_size: None,
    }))
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_create_mirror_is_raid1_with_mirrors() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "raid1",
        "--mirrors",
        "1",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    lvm.lv_create(&spec(Layout::Mirror {
        mirrors: 1,
        nosync: false,
        integrity: false,
    }))
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_create_raid_levels() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "raid10",
        "--mirrors",
        "1",
        "--stripes",
        "2",
        "--stripesize",
        "65536b",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "raid5",
        "--stripes",
        "3",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .succeeds();
    lvm.lv_create(&spec(Layout::Raid {
        level: RaidType::Raid10,
        mirrors: Some(1),
        stripes: Some(2),
        stripe_size: Some(65536),
        nosync: false,
        integrity: false,
    }))
    .await
    .unwrap();
    lvm.lv_create(&spec(Layout::Raid {
        level: RaidType::Raid5,
        mirrors: None,
        stripes: Some(3),
        stripe_size: None,
        nosync: false,
        integrity: false,
    }))
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_create_rejects_zero_stripes_and_zero_size() {
    let (fake, lvm) = setup();
    let zero_stripes = spec(Layout::Striped {
        stripes: Some(0),
        stripe_size: None,
    });
    assert!(matches!(
        lvm.lv_create(&zero_stripes).await,
        Err(Error::InvalidArgument(_))
    ));
    let mut zero_size = spec(Layout::Linear);
    zero_size.size = 0;
    assert!(matches!(
        lvm.lv_create(&zero_size).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn lv_create_of_an_existing_name_is_already_exists() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "linear",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .fails(5, stderr!("lvcreate-already-exists"));
    assert!(matches!(
        lvm.lv_create(&spec(Layout::Linear)).await,
        Err(Error::AlreadyExists(_))
    ));
}

#[tokio::test]
async fn lv_create_too_big_is_insufficient_space() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "striped",
        "--stripes",
        "2",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .fails(5, stderr!("lvcreate-insufficient-suitable-extents"));
    let err = lvm
        .lv_create(&spec(Layout::Striped {
            stripes: Some(2),
            stripe_size: None,
        }))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InsufficientSpace(_)), "{err:?}");
}

#[tokio::test]
async fn lv_create_in_a_missing_group_is_not_found() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "linear",
        "--size",
        "1073741824b",
        "--wipesignatures",
        "y",
        "--addtag",
        "lvms",
        "--name",
        "lv1",
        "vg1",
    ])
    .fails(5, stderr!("lvcreate-vg-not-found"));
    assert!(matches!(
        lvm.lv_create(&spec(Layout::Linear)).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn thin_lv_create_uses_virtual_size_and_pool() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--virtualsize",
        "1073741824b",
        "--thinpool",
        "pool",
        "--addtag",
        "lvms",
        "--name",
        "pvc-1",
        "vg1",
    ])
    .succeeds();
    lvm.thin_lv_create("vg1", "pool", "pvc-1", 1 << 30, &s(&["lvms"]))
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn thin_lv_create_in_a_missing_pool_is_not_found() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--virtualsize",
        "1073741824b",
        "--thinpool",
        "pool1",
        "--name",
        "thin1",
        "vg1",
    ])
    .fails(5, "  Pool pool1 not found in Volume group vg1.\n");
    assert!(matches!(
        lvm.thin_lv_create("vg1", "pool1", "thin1", 1 << 30, &[])
            .await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn thin_snapshot_sets_activation_skip_and_permission() {
    let (fake, lvm) = setup();
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
        "--name",
        "snap-1",
        "vg1/pvc-1",
    ])
    .succeeds();
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
        "--name",
        "clone-1",
        "vg1/snap-1",
    ])
    .succeeds();
    lvm.thin_snapshot("vg1", "pvc-1", "snap-1", true, &s(&["lvms"]))
        .await
        .unwrap();
    lvm.thin_snapshot("vg1", "snap-1", "clone-1", false, &[])
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_extend_grows_when_smaller() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&[
        "lvm",
        "lvextend",
        "--yes",
        "--size",
        "209715200b",
        "vg1/lv1",
    ])
    .succeeds();
    lvm.lv_extend("vg1", "lv1", 200 << 20).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_extend_to_the_same_or_a_smaller_size_is_a_no_op() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    lvm.lv_extend("vg1", "lv1", 100 << 20).await.unwrap();
    lvm.lv_extend("vg1", "lv1", 50 << 20).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_extend_raced_by_another_extend_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&[
        "lvm",
        "lvextend",
        "--yes",
        "--size",
        "104858112b",
        "vg1/lv1",
    ])
    .fails(5, stderr!("lvextend-same-size"));
    lvm.lv_extend("vg1", "lv1", (100 << 20) + 1).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_extend_of_a_missing_volume_is_not_found() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/nosuch"))
        .fails(5, stderr!("lv-not-found"));
    assert!(matches!(
        lvm.lv_extend("vg1", "nosuch", 1 << 30).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn lv_extend_beyond_free_space_is_insufficient_space() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&[
        "lvm",
        "lvextend",
        "--yes",
        "--size",
        "10737418240b",
        "vg1/lv1",
    ])
    .fails(5, stderr!("lvextend-insufficient"));
    assert!(matches!(
        lvm.lv_extend("vg1", "lv1", 10 << 30).await,
        Err(Error::InsufficientSpace(_))
    ));
}

#[tokio::test]
async fn lv_remove_runs_lvremove_yes() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&["lvm", "lvremove", "--yes", "vg1/lv1"])
        .succeeds();
    lvm.lv_remove("vg1", "lv1").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_remove_tagged_removes_only_an_lv_with_the_tag_after_one_look() {
    let (fake, lvm) = setup();
    let untagged = one_lv("lv1", "linear", 100 << 20, "", "");
    let tagged = untagged.replace(r#""lv_tags":"""#, r#""lv_tags":"other,lvms""#);
    fake.expect(&lvs_argv("vg1/lv1")).stdout(untagged);
    let Removal::Refused(lv) = lvm.lv_remove_tagged("vg1", "lv1", "lvms").await.unwrap() else {
        panic!("an LV without the tag must be refused")
    };
    assert_eq!(lv.name, "lv1");
    fake.assert_done();
    fake.expect(&lvs_argv("vg1/lv1")).stdout(tagged);
    fake.expect(&["lvm", "lvremove", "--yes", "vg1/lv1"])
        .succeeds();
    assert_eq!(
        lvm.lv_remove_tagged("vg1", "lv1", "lvms").await.unwrap(),
        Removal::Removed
    );
    fake.assert_done();
    fake.expect(&lvs_argv("vg1/lv1"))
        .fails(5, stderr!("lv-not-found"));
    assert_eq!(
        lvm.lv_remove_tagged("vg1", "lv1", "lvms").await.unwrap(),
        Removal::Missing
    );
    fake.assert_done();
}

#[tokio::test]
async fn lv_remove_of_a_missing_volume_or_group_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/nosuch"))
        .fails(5, stderr!("lv-not-found"));
    fake.expect(&lvs_argv("nosuch/lv"))
        .fails(5, stderr!("vg-not-found"));
    lvm.lv_remove("vg1", "nosuch").await.unwrap();
    lvm.lv_remove("nosuch", "lv").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_remove_raced_by_another_remove_is_ok() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&["lvm", "lvremove", "--yes", "vg1/lv1"])
        .fails(5, stderr!("lvremove-not-found"));
    lvm.lv_remove("vg1", "lv1").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_remove_of_a_mounted_volume_is_in_use() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/lv1"))
        .stdout(one_lv("lv1", "linear", 100 << 20, "", ""));
    fake.expect(&["lvm", "lvremove", "--yes", "vg1/lv1"])
        .fails(5, stderr!("lvremove-in-use.handwritten"));
    assert!(matches!(
        lvm.lv_remove("vg1", "lv1").await,
        Err(Error::InUse(_))
    ));
}

#[tokio::test]
async fn lv_remove_of_a_thin_pool_with_thin_volumes_is_in_use_and_removes_nothing() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/pool1")).stdout(one_lv(
        "pool1",
        "thin-pool",
        200 << 20,
        "",
        "4194304",
    ));
    fake.expect(&lvs_argv("vg1")).stdout(LVS);
    let err = lvm.lv_remove("vg1", "pool1").await.unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    assert!(err.to_string().contains("snap1, thin1"), "{err}");
    fake.assert_done();
}

#[tokio::test]
async fn lv_remove_of_an_empty_thin_pool_runs_lvremove() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg2/pool")).stdout(one_lv(
        "pool",
        "thin-pool",
        200 << 20,
        "",
        "4194304",
    ));
    fake.expect(&lvs_argv("vg2")).stdout(LVS_EMPTY);
    fake.expect(&["lvm", "lvremove", "--yes", "vg2/pool"])
        .succeeds();
    lvm.lv_remove("vg2", "pool").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn lv_activate_with_and_without_ignoring_activation_skip() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "lvchange", "--activate", "y", "vg1/lv1"])
        .succeeds();
    fake.expect(&[
        "lvm",
        "lvchange",
        "--activate",
        "y",
        "--ignoreactivationskip",
        "vg1/snap1",
    ])
    .succeeds();
    fake.expect(&["lvm", "lvchange", "--activate", "y", "vg1/nosuch"])
        .fails(5, stderr!("lv-not-found"));
    lvm.lv_activate("vg1", "lv1", false).await.unwrap();
    lvm.lv_activate("vg1", "snap1", true).await.unwrap();
    assert!(matches!(
        lvm.lv_activate("vg1", "nosuch", false).await,
        Err(Error::NotFound(_))
    ));
    fake.assert_done();
}

#[tokio::test]
async fn lv_deactivate_of_a_missing_volume_is_ok_and_of_an_open_one_in_use() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "lvchange", "--activate", "n", "vg1/lv1"])
        .succeeds();
    fake.expect(&["lvm", "lvchange", "--activate", "n", "vg1/nosuch"])
        .fails(5, stderr!("lv-not-found"));
    fake.expect(&["lvm", "lvchange", "--activate", "n", "vg1/busy"])
        .fails(5, "  Logical volume vg1/busy in use.\n");
    lvm.lv_deactivate("vg1", "lv1").await.unwrap();
    lvm.lv_deactivate("vg1", "nosuch").await.unwrap();
    assert!(matches!(
        lvm.lv_deactivate("vg1", "busy").await,
        Err(Error::InUse(_))
    ));
    fake.assert_done();
}

#[tokio::test]
async fn lv_tags_use_lvchange() {
    let (fake, lvm) = setup();
    fake.expect(&["lvm", "lvchange", "--addtag", "pvc=ns/claim", "vg1/lv1"])
        .succeeds();
    fake.expect(&["lvm", "lvchange", "--deltag", "old", "vg1/lv1"])
        .succeeds();
    fake.expect(&["lvm", "lvchange", "--addtag", "x", "vg1/nosuch"])
        .fails(5, stderr!("lvchange-tag-not-found"));
    lvm.lv_add_tag("vg1", "lv1", "pvc=ns/claim").await.unwrap();
    lvm.lv_del_tag("vg1", "lv1", "old").await.unwrap();
    assert!(matches!(
        lvm.lv_add_tag("vg1", "nosuch", "x").await,
        Err(Error::NotFound(_))
    ));
    fake.assert_done();
}

// ---- shared volume groups ----

fn scoped(mut argv: Vec<&'static str>, vg: &'static str) -> Vec<String> {
    let file: &'static str = Box::leak(format!("lvms-{vg}.devices").into_boxed_str());
    argv.splice(
        2..2,
        ["--config", "global/use_lvmlockd=1", "--devicesfile", file],
    );
    s(&argv)
}

#[tokio::test]
async fn commands_on_a_shared_volume_group_carry_lvmlockd_and_its_devices_file() {
    let fake = FakeRunner::new();
    let lvm = Lvm::new(fake.clone()).with_shared(["san".to_owned()]);
    let argv = scoped(lvs_argv("san/v1"), "san");
    fake.expect(&argv.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(r#"{"report":[{"lv":[]}]}"#);
    assert_eq!(lvm.lv("san", "v1").await.unwrap(), None);
    // A local group's command is left as it is.
    fake.expect(&lvs_argv("vg1/v1"))
        .stdout(r#"{"report":[{"lv":[]}]}"#);
    assert_eq!(lvm.lv("vg1", "v1").await.unwrap(), None);
    // A mutation too, with the lock timeout (activations may wait for sanlock).
    fake.expect(&[
        "lvm",
        "lvchange",
        "--config",
        "global/use_lvmlockd=1",
        "--devicesfile",
        "lvms-san.devices",
        "--addtag",
        "t1",
        "san/v1",
    ])
    .succeeds();
    lvm.lv_add_tag("san", "v1", "t1").await.unwrap();
    let calls = fake.calls();
    assert_eq!(calls[2].timeout, crate::scope::LOCK_TIMEOUT);
    assert_ne!(calls[1].timeout, crate::scope::LOCK_TIMEOUT);
    fake.assert_done();
}

#[tokio::test]
async fn all_group_reports_add_each_existing_shared_group() {
    let fake = FakeRunner::new();
    let lvm = Lvm::new(fake.clone()).with_shared(["san".to_owned(), "later".to_owned()]);
    let mut all = vgs_argv("x");
    all.pop();
    fake.expect(&all).stdout(one_vg("vg1", 0));
    // In name order; a shared group not made yet is skipped.
    let later = scoped(vgs_argv("later"), "later");
    fake.expect(&later.iter().map(String::as_str).collect::<Vec<_>>())
        .fails(
            5,
            "  Volume group \"later\" not found\n  Cannot process volume group later",
        );
    let san = scoped(vgs_argv("san"), "san");
    fake.expect(&san.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(one_vg("san", 1));
    let names: Vec<String> = lvm
        .vgs()
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert_eq!(names, ["vg1", "san"]);
    let timeouts: Vec<_> = fake.calls().iter().map(|c| c.timeout).collect();
    assert_eq!(timeouts[1], crate::scope::LOCK_TIMEOUT);
    fake.assert_done();
}

#[tokio::test]
async fn shared_linear_volumes_are_created_inactive_and_activated_by_mode() {
    let fake = FakeRunner::new();
    let lvm = Lvm::new(fake.clone()).with_shared(["san".to_owned()]);
    let scope = [
        "--config",
        "global/use_lvmlockd=1",
        "--devicesfile",
        "lvms-san.devices",
    ];
    let mut create = vec!["lvm", "lvcreate"];
    create.extend(scope);
    create.extend([
        "--yes",
        "--type",
        "linear",
        "--size",
        "1048576b",
        "--activate",
        "n",
        "--zero",
        "n",
        "--wipesignatures",
        "n",
        "--addtag",
        "lvms",
        "--name",
        "v1",
        "san",
    ]);
    fake.expect(&create).succeeds();
    for mode in ["ey", "sy"] {
        let mut argv = vec!["lvm", "lvchange"];
        argv.extend(scope);
        argv.extend(["--activate", mode, "--ignoreactivationskip", "san/v1"]);
        fake.expect(&argv).succeeds();
    }
    let mut refused = vec!["lvm", "lvchange"];
    refused.extend(scope);
    refused.extend(["--activate", "ey", "--ignoreactivationskip", "san/v1"]);
    fake.expect(&refused).fails(
        5,
        "  LV locked by other host: san/v1\n  Failed to lock logical volume san/v1.",
    );
    lvm.lv_create_inactive(&LvSpec {
        vg: "san".into(),
        name: "v1".into(),
        size: 1 << 20,
        layout: Layout::Linear,
        tags: vec!["lvms".into()],
    })
    .await
    .unwrap();
    lvm.lv_activate_shared("san", "v1", Activation::Exclusive)
        .await
        .unwrap();
    lvm.lv_activate_shared("san", "v1", Activation::Shared)
        .await
        .unwrap();
    let err = lvm
        .lv_activate_shared("san", "v1", Activation::Exclusive)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InUse(_)), "{err:?}");
    fake.assert_done();
}

#[tokio::test]
async fn a_thin_volume_with_its_pool_is_one_inactive_lvcreate_with_the_pool_tags() {
    let (fake, lvm) = setup();
    fake.expect(&[
        "lvm",
        "lvcreate",
        "--yes",
        "--type",
        "thin",
        "--virtualsize",
        "1073741824b",
        "--thinpool",
        "pool-1",
        "--size",
        "1073741824b",
        "--chunksize",
        "65536b",
        "--poolmetadatasize",
        "4194304b",
        "--zero",
        "y",
        "--activate",
        "n",
        "--addtag",
        "lvms",
        "--name",
        "pvc-1",
        "vg1",
    ])
    .succeeds();
    let pool = ThinPoolSpec {
        vg: "vg1".into(),
        name: "pool-1".into(),
        size: PoolSize::Bytes(1 << 30),
        chunk_size: Some(64 << 10),
        metadata_size: Some(4 << 20),
        zero: true,
    };
    lvm.thin_lv_create_with_pool(&pool, "pvc-1", 1 << 30, &s(&["lvms"]))
        .await
        .unwrap();
    fake.assert_done();
    // Several tags in one lvchange; none is no command at all.
    fake.expect(&[
        "lvm",
        "lvchange",
        "--addtag",
        "a",
        "--addtag",
        "b=1",
        "vg1/pvc-1",
    ])
    .succeeds();
    lvm.lv_add_tags("vg1", "pvc-1", &s(&["a", "b=1"]))
        .await
        .unwrap();
    lvm.lv_add_tags("vg1", "pvc-1", &[]).await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn a_thin_pool_is_removed_only_tagged_and_empty_after_one_look_at_the_group() {
    let (fake, lvm) = setup();
    let group = |tags: &str, user: bool| {
        let pool = format!(
            r#"{{"lv_name":"pool-1", "vg_name":"vg1", "lv_uuid":"u-p", "lv_size":"1073741824", "lv_attr":"twi---tz--", "segtype":"thin-pool", "pool_lv":"", "origin":"", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"4194304", "sync_percent":"", "lv_tags":"{tags}", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}}"#
        );
        let snap = r#"{"lv_name":"snap-1", "vg_name":"vg1", "lv_uuid":"u-s", "lv_size":"1073741824", "lv_attr":"Vri---tz-k", "segtype":"thin", "pool_lv":"pool-1", "origin":"", "data_percent":"", "metadata_percent":"", "lv_metadata_size":"", "sync_percent":"", "lv_tags":"lvms", "lv_path":"", "lv_dm_path":"", "stripes":"1", "stripe_size":"0"}"#;
        let rows = if user { format!("{pool},{snap}") } else { pool };
        format!(r#"{{"report":[{{"lv":[{rows}]}}]}}"#)
    };
    fake.expect(&lvs_argv("vg1")).stdout(group("lvms", true));
    let err = lvm
        .thin_pool_remove_tagged("vg1", "pool-1", "lvms")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InUse(m) if m.contains("snap-1")),
        "{err:?}"
    );
    fake.assert_done();
    fake.expect(&lvs_argv("vg1")).stdout(group("", false));
    assert!(matches!(
        lvm.thin_pool_remove_tagged("vg1", "pool-1", "lvms")
            .await
            .unwrap(),
        Removal::Refused(_)
    ));
    fake.assert_done();
    fake.expect(&lvs_argv("vg1"))
        .stdout(group("other,lvms", false));
    fake.expect(&["lvm", "lvremove", "--yes", "vg1/pool-1"])
        .succeeds();
    assert_eq!(
        lvm.thin_pool_remove_tagged("vg1", "pool-1", "lvms")
            .await
            .unwrap(),
        Removal::Removed
    );
    fake.assert_done();
}

// ---- thin pools over RAID (ADR 0031) ----

fn raid_pool_spec() -> ThinPoolSpec {
    ThinPoolSpec {
        vg: "vg1".into(),
        name: "pool".into(),
        size: PoolSize::Bytes(1 << 30),
        chunk_size: Some(128 << 10),
        metadata_size: Some(8 << 20),
        zero: true,
    }
}

fn raid1_pool() -> lvms_core::plan::PoolRaid {
    lvms_core::plan::PoolRaid::of(&lvms_core::config::RaidConfig {
        raid_type: lvms_core::config::RaidType::Raid1,
        mirrors: None,
        stripes: None,
        stripe_size: None,
    })
}

// raid1 without `mirrors`: lvm2's default, one extra copy.
const RAID_DATA: &[&str] = &[
    "lvm",
    "lvcreate",
    "--yes",
    "--type",
    "raid1",
    "--size",
    "1073741824b",
    "--wipesignatures",
    "y",
    "--name",
    "pool",
    "vg1",
];

const RAID_META: &[&str] = &[
    "lvm",
    "lvcreate",
    "--yes",
    "--type",
    "raid1",
    "--mirrors",
    "1",
    "--size",
    "8388608b",
    "--wipesignatures",
    "y",
    "--name",
    "pool_meta",
    "vg1",
];

const RAID_JOIN: &[&str] = &[
    "lvm",
    "lvconvert",
    "--yes",
    "--type",
    "thin-pool",
    "--poolmetadata",
    "vg1/pool_meta",
    "--chunksize",
    "131072b",
    "--zero",
    "y",
    "vg1/pool",
];

#[tokio::test]
async fn raid_thin_pool_is_its_raid_data_its_raid1_metadata_then_the_join() {
    let (fake, lvm) = setup();
    fake.expect(&lvs_argv("vg1/pool"))
        .fails(5, stderr!("lv-not-found"));
    fake.expect(RAID_DATA).succeeds();
    fake.expect(&lvs_argv("vg1/pool_meta"))
        .fails(5, stderr!("lv-not-found"));
    fake.expect(RAID_META).succeeds();
    fake.expect(RAID_JOIN).succeeds();
    lvm.thin_pool_create_raid(&raid_pool_spec(), &raid1_pool())
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn raid_thin_pool_creation_resumes_after_its_data_and_is_done_once_joined() {
    let (fake, lvm) = setup();
    // Stopped after the data LV: the metadata and the join are left.
    fake.expect(&lvs_argv("vg1/pool"))
        .stdout(one_lv("pool", "raid1", 1 << 30, "", ""));
    fake.expect(&lvs_argv("vg1/pool_meta"))
        .fails(5, stderr!("lv-not-found"));
    fake.expect(RAID_META).succeeds();
    fake.expect(RAID_JOIN).succeeds();
    lvm.thin_pool_create_raid(&raid_pool_spec(), &raid1_pool())
        .await
        .unwrap();
    // Stopped after both: only the join.
    fake.expect(&lvs_argv("vg1/pool"))
        .stdout(one_lv("pool", "raid1", 1 << 30, "", ""));
    fake.expect(&lvs_argv("vg1/pool_meta"))
        .stdout(one_lv("pool_meta", "raid1", 8 << 20, "", ""));
    fake.expect(RAID_JOIN).succeeds();
    lvm.thin_pool_create_raid(&raid_pool_spec(), &raid1_pool())
        .await
        .unwrap();
    // Joined: nothing.
    fake.expect(&lvs_argv("vg1/pool"))
        .stdout(one_lv("pool", "thin-pool", 1 << 30, "", "8388608"));
    lvm.thin_pool_create_raid(&raid_pool_spec(), &raid1_pool())
        .await
        .unwrap();
    fake.assert_done();
    // Without sizes in bytes it refuses before any command.
    let spec = ThinPoolSpec {
        metadata_size: None,
        ..raid_pool_spec()
    };
    let err = lvm
        .thin_pool_create_raid(&spec, &raid1_pool())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}
