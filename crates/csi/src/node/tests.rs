//! The Node service on this host with a scripted runner and a mount table in a temp procfs: argument
//! checks, what runs for each decision, and the codes that reach the CO. `/dev/null` stands in for the
//! volume's device (it exists, and its numbers show in the scripted mount table).

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use lvms_core::lvattr::LvHealth;
use lvms_engine::backend::BackendError;
use lvms_host::fake::FakeRunner;

use tonic::Code;

use super::*;
use crate::csi::{
    CapacityRange, VolumeCapability,
    node_server::Node,
    volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode},
};
use lvms_engine::{
    backend::{Capacity, DeviceClassConfig, NewSnapshot, NewVolume},
    ids::volume_lv_name,
};

const DEV: &str = "/dev/null";
const BLKID_XFS: &str = "DEVNAME=/dev/null\nUUID=1b2c\nBLOCK_SIZE=512\nTYPE=xfs\n";
const BLKID_EXT4: &str = "DEVNAME=/dev/null\nUUID=1b2c\nBLOCK_SIZE=4096\nTYPE=ext4\n";
const BLKID_PV: &str = "DEVNAME=/dev/null\nUUID=abc\nVERSION=LVM2 001\nTYPE=LVM2_member\n";

/// Volumes by id, all on `/dev/null`.
struct TestBackend {
    volumes: Mutex<HashMap<String, Volume>>,
    activations: AtomicUsize,
    /// What `classes` answers (none unless a test sets them).
    classes: Mutex<Vec<DeviceClassConfig>>,
    /// No class is served: lookups answer UNAVAILABLE, as the node agent's backend does then.
    down: std::sync::atomic::AtomicBool,
    /// The growths asked of the backend, `(id, size)`.
    expanded: Mutex<Vec<(String, u64)>>,
}

fn volume(id: &str) -> Volume {
    Volume {
        id: id.to_owned(),
        class: "vg1".to_owned(),
        size: 1 << 30,
        name: None,
        source: None,
        snapshot: false,
        thin: false,
        created: None,
        requested: None,
        health: LvHealth::Ok,
        device: DEV.to_owned(),
        ephemeral: None,
        open: false,
    }
}

fn unused<T>() -> lvms_engine::backend::Result<T> {
    Err(BackendError::Unavailable(
        "not used by the Node service".to_owned(),
    ))
}

impl Backend for TestBackend {
    fn node_id(&self) -> &str {
        "node-1"
    }
    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.classes.lock().unwrap().clone()
    }
    async fn ready(&self) -> lvms_engine::backend::Result<bool> {
        Ok(true)
    }
    async fn get(&self, id: &str) -> lvms_engine::backend::Result<Option<Volume>> {
        if self.down.load(Ordering::Relaxed) {
            return Err(BackendError::Unavailable("no class is served".to_owned()));
        }
        Ok(self.volumes.lock().unwrap().get(id).cloned())
    }
    async fn list(&self) -> lvms_engine::backend::Result<Vec<Volume>> {
        unused()
    }
    async fn create_volume(&self, _: &NewVolume) -> lvms_engine::backend::Result<Volume> {
        unused()
    }
    async fn create_snapshot(&self, _: &NewSnapshot) -> lvms_engine::backend::Result<Volume> {
        unused()
    }
    async fn delete(&self, _: &str) -> lvms_engine::backend::Result<bool> {
        unused()
    }
    async fn expand(&self, id: &str, size: u64) -> lvms_engine::backend::Result<u64> {
        self.expanded.lock().unwrap().push((id.to_owned(), size));
        Ok(size)
    }
    async fn capacity(
        &self,
        _: &str,
        _: &lvms_engine::backend::Layout,
    ) -> lvms_engine::backend::Result<Capacity> {
        unused()
    }
    async fn activate(&self, id: &str) -> lvms_engine::backend::Result<String> {
        self.activations.fetch_add(1, Ordering::Relaxed);
        Ok(self
            .volumes
            .lock()
            .unwrap()
            .get(id)
            .ok_or_else(|| BackendError::NotFound(id.to_owned()))?
            .device
            .clone())
    }
}

struct Setup {
    fake: FakeRunner,
    svc: NodeService<TestBackend, FakeRunner>,
    backend: Arc<TestBackend>,
    proc: tempfile::TempDir,
    /// A scratch directory for staging and target paths.
    dir: tempfile::TempDir,
    id: String,
}

impl Setup {
    fn new(options: NodeOptions) -> Self {
        let proc = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(proc.path().join("self")).unwrap();
        let fake = FakeRunner::new();
        let id = volume_lv_name("pvc-1");
        let backend = Arc::new(TestBackend {
            volumes: Mutex::new(HashMap::from([(id.clone(), volume(&id))])),
            activations: AtomicUsize::new(0),
            classes: Mutex::new(vec![]),
            down: Default::default(),
            expanded: Mutex::default(),
        });
        let fs = Filesystems::new(fake.clone()).with_proc_root(proc.path());
        let svc = NodeService::new(backend.clone(), fs, options);
        let s = Self {
            fake,
            svc,
            backend,
            proc,
            dir: tempfile::tempdir().unwrap(),
            id,
        };
        s.mountinfo(&[]);
        s
    }

    /// Writes the mount table: a root and `/dev`, then `lines`.
    fn mountinfo(&self, lines: &[String]) {
        let mut text = "1 0 254:0 / / rw - ext4 /dev/vda rw\n".to_owned();
        text.extend(lines.iter().map(|l| format!("{l}\n")));
        std::fs::write(self.proc.path().join("self/mountinfo"), text).unwrap();
    }

    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.dir.path().display())
    }

    /// A staging directory that exists.
    fn staging(&self) -> String {
        let p = self.path("staging");
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

fn ids() -> DeviceIds {
    device_ids(DEV).unwrap().unwrap()
}

/// A mountinfo line showing the volume's filesystem at `target`.
fn fs_line(n: u32, target: &str, opts: &str) -> String {
    let (ma, mi) = ids().rdev;
    format!("{n} 1 {ma}:{mi} / {target} {opts} - ext4 /dev/mapper/vg1-lv rw")
}

/// A mountinfo line showing a bind of the volume's device node at `target`.
fn block_line(n: u32, target: &str) -> String {
    let i = ids();
    let (ma, mi) = i.node_fs;
    format!(
        "{n} 1 {ma}:{mi} /{} {target} rw,nosuid - devtmpfs devtmpfs rw",
        i.node_name
    )
}

fn mount_cap(fs_type: &str, flags: &[&str], mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: flags.iter().map(|f| (*f).to_owned()).collect(),
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

fn block_cap(mode: Mode) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

fn writer() -> Option<VolumeCapability> {
    mount_cap("", &[], Mode::SingleNodeWriter)
}

fn stage_req(id: &str, staging: &str, cap: Option<VolumeCapability>) -> NodeStageVolumeRequest {
    NodeStageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging.to_owned(),
        volume_capability: cap,
        ..Default::default()
    }
}

fn publish_req(
    id: &str,
    staging: &str,
    target: &str,
    cap: Option<VolumeCapability>,
    readonly: bool,
) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging.to_owned(),
        target_path: target.to_owned(),
        volume_capability: cap,
        readonly,
        ..Default::default()
    }
}

fn blkid() -> Vec<&'static str> {
    vec!["blkid", "-p", "-o", "export", DEV]
}

fn code<T: std::fmt::Debug>(r: Result<Response<T>, Status>) -> Code {
    match r {
        Ok(r) => panic!("expected an error, got {r:?}"),
        Err(s) => s.code(),
    }
}

// ---- argument checks: nothing runs ----

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_foreign_or_unknown_ids_not_found() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let id = s.id.clone();
    let unknown = volume_lv_name("pvc-unknown");
    let long = "c".repeat(129);
    let target = s.path("target");

    let stage = |id: &str, staging: &str, cap| {
        s.svc
            .node_stage_volume(Request::new(stage_req(id, staging, cap)))
    };
    use Code::{InvalidArgument as Inv, NotFound as Nf};
    type Case<'a> = (
        &'a str,
        Code,
        Result<Response<NodeStageVolumeResponse>, Status>,
    );
    let cases: Vec<Case<'_>> = vec![
        ("stage: no id", Inv, stage("", &staging, writer()).await),
        (
            "stage: id too long",
            Inv,
            stage(&long, &staging, writer()).await,
        ),
        (
            "stage: foreign id",
            Nf,
            stage("vol-1", &staging, writer()).await,
        ),
        (
            "stage: unknown id",
            Nf,
            stage(&unknown, &staging, writer()).await,
        ),
        (
            "stage: no staging path",
            Inv,
            stage(&id, "", writer()).await,
        ),
        (
            "stage: relative staging path",
            Inv,
            stage(&id, "staging", writer()).await,
        ),
        (
            "stage: dotdot staging path",
            Inv,
            stage(&id, &format!("{staging}/../x"), writer()).await,
        ),
        (
            "stage: missing staging dir",
            Inv,
            stage(&id, &s.path("nope"), writer()).await,
        ),
        (
            "stage: no capability",
            Inv,
            stage(&id, &staging, None).await,
        ),
        (
            "stage: multi-node",
            Inv,
            stage(
                &id,
                &staging,
                mount_cap("", &[], Mode::MultiNodeMultiWriter),
            )
            .await,
        ),
        (
            "stage: btrfs",
            Inv,
            stage(
                &id,
                &staging,
                mount_cap("btrfs", &[], Mode::SingleNodeWriter),
            )
            .await,
        ),
        (
            "stage: comma flag",
            Inv,
            stage(
                &id,
                &staging,
                mount_cap("", &["noatime,bind"], Mode::SingleNodeWriter),
            )
            .await,
        ),
        (
            "stage: rw on a reader",
            Inv,
            stage(
                &id,
                &staging,
                mount_cap("", &["rw"], Mode::SingleNodeReaderOnly),
            )
            .await,
        ),
    ];
    for (case, want, got) in cases {
        assert_eq!(code(got), want, "{case}");
    }

    let publish = |id: &str, staging: &str, target: &str, cap| {
        s.svc
            .node_publish_volume(Request::new(publish_req(id, staging, target, cap, false)))
    };
    assert_eq!(code(publish("", &staging, &target, writer()).await), Inv);
    assert_eq!(code(publish(&id, &staging, "", writer()).await), Inv);
    assert_eq!(code(publish(&id, &staging, "rel", writer()).await), Inv);
    assert_eq!(code(publish(&id, &staging, &target, None).await), Inv);
    assert_eq!(
        code(publish(&id, "", &target, writer()).await),
        Code::FailedPrecondition,
        "the spec's code for a missing staging path when the node stages"
    );
    assert_eq!(
        code(publish(&unknown, &staging, &target, writer()).await),
        Nf
    );
    assert_eq!(
        code(
            publish(
                &id,
                &staging,
                &target,
                mount_cap("", &[], Mode::MultiNodeReaderOnly)
            )
            .await
        ),
        Inv
    );

    let unpublish = |id: &str, target: &str| {
        s.svc
            .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
                volume_id: id.to_owned(),
                target_path: target.to_owned(),
            }))
    };
    assert_eq!(code(unpublish("", &target).await), Inv);
    assert_eq!(code(unpublish(&id, "").await), Inv);
    assert_eq!(code(unpublish(&id, "/a/../b").await), Inv);
    assert_eq!(code(unpublish(&unknown, &target).await), Nf);
    // Any other id may be the CO's id of an inline ephemeral volume: with no LV of it and nothing
    // mounted, it was unpublished before.
    assert_eq!(
        unpublish("vol-1", &target)
            .await
            .map(|_| ())
            .map_err(|e| e.code()),
        Ok(())
    );

    let unstage = |id: &str, staging: &str| {
        s.svc
            .node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
                volume_id: id.to_owned(),
                staging_target_path: staging.to_owned(),
            }))
    };
    assert_eq!(code(unstage("", &staging).await), Inv);
    assert_eq!(code(unstage(&id, "").await), Inv);
    assert_eq!(code(unstage(&unknown, &staging).await), Nf);

    let stats = |id: &str, path: &str| {
        s.svc
            .node_get_volume_stats(Request::new(NodeGetVolumeStatsRequest {
                volume_id: id.to_owned(),
                volume_path: path.to_owned(),
                staging_target_path: String::new(),
            }))
    };
    assert_eq!(code(stats("", &staging).await), Inv);
    assert_eq!(code(stats(&id, "").await), Inv);
    assert_eq!(code(stats(&unknown, &staging).await), Nf);
    assert_eq!(code(stats(&id, &staging).await), Nf, "not mounted there");

    let expand = |id: &str, path: &str| {
        s.svc
            .node_expand_volume(Request::new(NodeExpandVolumeRequest {
                volume_id: id.to_owned(),
                volume_path: path.to_owned(),
                ..Default::default()
            }))
    };
    assert_eq!(code(expand("", &staging).await), Inv);
    assert_eq!(code(expand(&id, "").await), Inv);
    assert_eq!(code(expand(&unknown, &staging).await), Nf);
    assert_eq!(code(expand(&id, &staging).await), Nf, "not mounted there");

    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    assert_eq!(s.backend.activations.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn a_second_operation_on_a_busy_volume_is_aborted() {
    let s = Setup::new(NodeOptions::default());
    let _busy = s.svc.in_flight.try_claim(&[&s.id]).unwrap();
    let staging = s.staging();
    let got = s
        .svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await;
    assert_eq!(code(got), Code::Aborted);
    let got = s
        .svc
        .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
            volume_id: s.id.clone(),
            target_path: s.path("t"),
        }))
        .await;
    assert_eq!(code(got), Code::Aborted);
}

// ---- stage ----

#[tokio::test]
async fn stage_formats_a_blank_volume_with_the_default_ext4_and_mounts_it_without_growing() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&["mkfs.ext4", "-q", DEV]).succeeds();
    s.fake
        .expect(&["mount", "-t", "ext4", "-o", "noatime", DEV, &staging])
        .succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            mount_cap("", &["noatime"], Mode::SingleNodeMultiWriter),
        )))
        .await
        .unwrap();
    s.fake.assert_done();
    assert_eq!(s.backend.activations.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn stage_default_fstype_is_a_constructor_option_and_the_capability_wins() {
    let s = Setup::new(NodeOptions {
        default_fstype: Fstype::Xfs,
        ..NodeOptions::default()
    });
    let staging = s.staging();
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&["mkfs.xfs", "-q", DEV]).succeeds();
    s.fake
        .expect(&["mount", "-t", "xfs", "-o", "nouuid", DEV, &staging])
        .succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap();
    s.fake.assert_done();

    let s = Setup::new(NodeOptions {
        default_fstype: Fstype::Xfs,
        ..NodeOptions::default()
    });
    let staging = s.staging();
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&blkid()).fails(2, "");
    s.fake.expect(&["mkfs.ext4", "-q", DEV]).succeeds();
    s.fake
        .expect(&["mount", "-t", "ext4", DEV, &staging])
        .succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            mount_cap("ext4", &[], Mode::SingleNodeWriter),
        )))
        .await
        .unwrap();
    s.fake.assert_done();
}

#[tokio::test]
async fn stage_without_a_capability_fstype_formats_with_the_volume_class_fstype_before_the_default()
{
    let class = |fstype| DeviceClassConfig {
        fstype,
        ..DeviceClassConfig::named("vg1")
    };
    // (the class's fstype, the driver default, the capability's fs_type) -> what is made.
    for (class_fs, default, asked, made) in [
        (Some(Fstype::Ext4), Fstype::Xfs, "", "ext4"),
        (Some(Fstype::Xfs), Fstype::Ext4, "", "xfs"),
        (None, Fstype::Xfs, "", "xfs"),
        (None, Fstype::Ext4, "", "ext4"),
        (Some(Fstype::Ext4), Fstype::Xfs, "xfs", "xfs"),
    ] {
        let s = Setup::new(NodeOptions {
            default_fstype: default,
            ..NodeOptions::default()
        });
        *s.backend.classes.lock().unwrap() = vec![class(class_fs)];
        let staging = s.staging();
        s.fake.expect(&blkid()).fails(2, "");
        s.fake.expect(&blkid()).fails(2, "");
        s.fake
            .expect(&[&format!("mkfs.{made}"), "-q", DEV])
            .succeeds();
        let mut mount = vec!["mount", "-t", made];
        if made == "xfs" {
            mount.extend(["-o", "nouuid"]);
        }
        mount.extend([DEV, &staging]);
        s.fake.expect(&mount).succeeds();
        s.svc
            .node_stage_volume(Request::new(stage_req(
                &s.id,
                &staging,
                mount_cap(asked, &[], Mode::SingleNodeWriter),
            )))
            .await
            .unwrap();
        s.fake.assert_done();
    }
}

#[tokio::test]
async fn stage_of_a_formatted_volume_mounts_its_filesystem_and_grows_it() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.fake.expect(&blkid()).stdout(BLKID_XFS);
    s.fake
        .expect(&["mount", "-t", "xfs", "-o", "nouuid", DEV, &staging])
        .succeeds();
    s.fake.expect(&["xfs_growfs", &staging]).succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap();
    s.fake.assert_done();
}

#[tokio::test]
async fn stage_never_reformats_another_filesystem_or_signature() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.fake.expect(&blkid()).stdout(BLKID_XFS);
    let err = s
        .svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            mount_cap("ext4", &[], Mode::SingleNodeWriter),
        )))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("xfs filesystem, not the ext4"),
        "{}",
        err.message()
    );
    s.fake.expect(&blkid()).stdout(BLKID_PV);
    let err = s
        .svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("LVM2_member"), "{}", err.message());
    s.fake.assert_done();
}

#[tokio::test]
async fn stage_for_a_reader_mounts_read_only_and_does_not_grow() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.fake.expect(&blkid()).stdout(BLKID_EXT4);
    s.fake
        .expect(&["mount", "-t", "ext4", "-o", "ro", DEV, &staging])
        .succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            mount_cap("", &[], Mode::SingleNodeReaderOnly),
        )))
        .await
        .unwrap();
    s.fake.assert_done();
}

#[tokio::test]
async fn stage_again_only_grows_and_another_volume_at_the_path_is_already_exists() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.mountinfo(&[fs_line(40, &staging, "rw,relatime")]);
    s.fake.expect(&["resize2fs", DEV]).succeeds();
    s.svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap();
    s.fake.assert_done();
    // Asked xfs, staged as ext4; asked read-only, staged read-write.
    for cap in [
        mount_cap("xfs", &[], Mode::SingleNodeWriter),
        mount_cap("", &[], Mode::SingleNodeReaderOnly),
    ] {
        let got = s
            .svc
            .node_stage_volume(Request::new(stage_req(&s.id, &staging, cap)))
            .await;
        assert_eq!(code(got), Code::AlreadyExists);
    }
    s.mountinfo(&[format!(
        "40 1 253:99 / {staging} rw - ext4 /dev/mapper/vg1-other rw"
    )]);
    let err = s
        .svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains("vg1-other"), "{}", err.message());
    s.fake.assert_done();
}

#[tokio::test]
async fn stage_for_block_access_only_activates() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.path("block-staging");
    s.svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            block_cap(Mode::SingleNodeWriter),
        )))
        .await
        .unwrap();
    assert!(s.fake.calls().is_empty());
    assert_eq!(s.backend.activations.load(Ordering::Relaxed), 1);
    // A filesystem of the volume staged at the path: staged another way.
    s.mountinfo(&[fs_line(40, &staging, "rw")]);
    let got = s
        .svc
        .node_stage_volume(Request::new(stage_req(
            &s.id,
            &staging,
            block_cap(Mode::SingleNodeWriter),
        )))
        .await;
    assert_eq!(code(got), Code::AlreadyExists);
}

#[tokio::test]
async fn stage_failure_carries_the_whole_cause() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.fake.expect(&blkid()).stdout(BLKID_EXT4);
    s.fake
        .expect(&["mount", "-t", "ext4", DEV, &staging])
        .fails(32, "mount: wrong fs type, bad option, bad superblock\n");
    let err = s
        .svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    let m = err.message();
    assert!(m.starts_with("mounting /dev/null: `mount -t ext4"), "{m}");
    assert!(m.contains("exit code 32: mount: wrong fs type"), "{m}");
}

// ---- publish ----

#[tokio::test]
async fn publish_binds_the_staging_directory_at_a_target_it_creates() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let target = s.path("pods/a/mount");
    s.mountinfo(&[fs_line(40, &staging, "rw")]);
    s.fake
        .expect(&["mount", "--bind", &staging, &target])
        .succeeds();
    s.svc
        .node_publish_volume(Request::new(publish_req(
            &s.id,
            &staging,
            &target,
            writer(),
            false,
        )))
        .await
        .unwrap();
    assert!(std::path::Path::new(&target).is_dir());
    s.fake.assert_done();

    // Read-only: by the flag, or by a reader-only mode.
    let target2 = s.path("pods/b/mount");
    for (cap, readonly) in [
        (mount_cap("", &[], Mode::SingleNodeMultiWriter), true),
        (mount_cap("", &[], Mode::SingleNodeReaderOnly), false),
    ] {
        s.fake
            .expect(&["mount", "--bind", &staging, &target2])
            .succeeds();
        s.fake
            .expect(&["mount", "-o", "remount,bind,ro", &target2])
            .succeeds();
        s.svc
            .node_publish_volume(Request::new(publish_req(
                &s.id, &staging, &target2, cap, readonly,
            )))
            .await
            .unwrap();
        s.fake.assert_done();
    }
}

#[tokio::test]
async fn publish_block_binds_the_device_onto_a_file_it_creates() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.path("block-staging");
    let target = s.path("publish/pv/pod");
    s.fake.expect(&["mount", "--bind", DEV, &target]).succeeds();
    s.svc
        .node_publish_volume(Request::new(publish_req(
            &s.id,
            &staging,
            &target,
            block_cap(Mode::SingleNodeWriter),
            false,
        )))
        .await
        .unwrap();
    assert!(std::path::Path::new(&target).is_file());
    s.fake.assert_done();
}

/// A directory holding a file of someone else's, as `/etc` would.
fn not_ours(s: &Setup, name: &str) -> String {
    let dir = s.path(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(format!("{dir}/passwd"), "root:x:0:0").unwrap();
    dir
}

fn assert_refused_naming<T: std::fmt::Debug>(got: Result<Response<T>, Status>, path: &str) {
    let err = got.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
    assert!(
        err.message().contains(path) && err.message().contains("not empty"),
        "{}",
        err.message()
    );
    assert_eq!(
        std::fs::read_to_string(format!("{path}/passwd")).unwrap(),
        "root:x:0:0",
        "left as it was"
    );
}

#[tokio::test]
async fn stage_and_publish_never_mount_over_a_directory_or_file_that_is_not_empty() {
    let s = Setup::new(NodeOptions::default());
    // Stage: the volume is activated and probed, but neither formatted nor mounted.
    let staging = not_ours(&s, "staging-etc");
    let got = s
        .svc
        .node_stage_volume(Request::new(stage_req(&s.id, &staging, writer())))
        .await;
    assert_refused_naming(got, &staging);
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());

    // Publish of a staged volume onto a full directory: no bind mount.
    let good_staging = s.staging();
    s.mountinfo(&[fs_line(40, &good_staging, "rw")]);
    let target = not_ours(&s, "pods/a/etc");
    let got = s
        .svc
        .node_publish_volume(Request::new(publish_req(
            &s.id,
            &good_staging,
            &target,
            writer(),
            false,
        )))
        .await;
    assert_refused_naming(got, &target);

    // Block access onto a file with content, and a symlink to a directory of someone else's.
    let file = s.path("pods/b/device");
    std::fs::create_dir_all(s.path("pods/b")).unwrap();
    std::fs::write(&file, "data").unwrap();
    let link = s.path("pods/c");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (t, cap) in [
        (&file, block_cap(Mode::SingleNodeWriter)),
        (&link, writer()),
    ] {
        let err = s
            .svc
            .node_publish_volume(Request::new(publish_req(
                &s.id,
                &good_staging,
                t,
                cap,
                false,
            )))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        assert!(err.message().contains(t.as_str()), "{}", err.message());
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "data");
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());

    // An empty directory is mounted over as before.
    let empty = s.path("pods/d/mount");
    std::fs::create_dir_all(&empty).unwrap();
    s.fake
        .expect(&["mount", "--bind", &good_staging, &empty])
        .succeeds();
    s.svc
        .node_publish_volume(Request::new(publish_req(
            &s.id,
            &good_staging,
            &empty,
            writer(),
            false,
        )))
        .await
        .unwrap();
    s.fake.assert_done();
}

#[tokio::test]
async fn publish_that_fails_removes_the_target_it_created() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let target = s.path("t");
    s.mountinfo(&[fs_line(40, &staging, "rw")]);
    s.fake
        .expect(&["mount", "--bind", &staging, &target])
        .fails(32, "mount: permission denied\n");
    let got = s
        .svc
        .node_publish_volume(Request::new(publish_req(
            &s.id,
            &staging,
            &target,
            writer(),
            false,
        )))
        .await;
    assert_eq!(code(got), Code::Internal);
    assert!(!std::path::Path::new(&target).exists());
}

#[tokio::test]
async fn publish_table_codes_from_the_mount_table() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let (t1, t2) = (s.path("t1"), s.path("t2"));
    s.mountinfo(&[fs_line(40, &staging, "rw"), fs_line(41, &t1, "rw")]);
    let publish = |target: &str, cap, readonly| {
        s.svc.node_publish_volume(Request::new(publish_req(
            &s.id, &staging, target, cap, readonly,
        )))
    };
    publish(&t1, writer(), false).await.unwrap();
    assert_eq!(
        code(publish(&t1, writer(), true).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(publish(&t1, block_cap(Mode::SingleNodeWriter), false).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(publish(&t2, writer(), false).await),
        Code::FailedPrecondition
    );
    assert_eq!(
        code(publish(&t2, mount_cap("", &[], Mode::SingleNodeSingleWriter), false).await),
        Code::FailedPrecondition
    );
    // Not staged.
    s.mountinfo(&[]);
    assert_eq!(
        code(publish(&t2, writer(), false).await),
        Code::FailedPrecondition
    );
    // Block published at t1.
    s.mountinfo(&[block_line(41, &t1)]);
    publish(&t1, block_cap(Mode::SingleNodeWriter), false)
        .await
        .unwrap();
    assert_eq!(
        code(publish(&t2, block_cap(Mode::SingleNodeSingleWriter), false).await),
        Code::FailedPrecondition
    );
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
}

// ---- unpublish, unstage ----

#[tokio::test]
async fn unpublish_of_a_target_not_mounted_removes_it_and_is_ok_when_missing() {
    let s = Setup::new(NodeOptions::default());
    let dir = s.path("t-dir");
    let file = s.path("t-file");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(&file, "").unwrap();
    for target in [&dir, &file, &dir] {
        s.svc
            .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
                volume_id: s.id.clone(),
                target_path: target.clone(),
            }))
            .await
            .unwrap();
        assert!(!std::path::Path::new(target).exists());
    }
    // A directory with content is never removed.
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(format!("{dir}/data"), "keep").unwrap();
    let got = s
        .svc
        .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
            volume_id: s.id.clone(),
            target_path: dir.clone(),
        }))
        .await;
    assert_eq!(code(got), Code::Internal);
    assert!(std::path::Path::new(&format!("{dir}/data")).exists());
    assert!(s.fake.calls().is_empty());
}

#[tokio::test]
async fn unpublish_and_unstage_leave_other_mounts_alone() {
    let s = Setup::new(NodeOptions::default());
    let (target, staging) = (s.path("t"), s.staging());
    std::fs::create_dir(&target).unwrap();
    s.mountinfo(&[
        format!("41 1 253:99 / {target} rw - ext4 /dev/mapper/vg1-other rw"),
        format!("42 1 253:99 / {staging} rw - ext4 /dev/mapper/vg1-other rw"),
    ]);
    let got = s
        .svc
        .node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
            volume_id: s.id.clone(),
            target_path: target.clone(),
        }))
        .await;
    assert_eq!(code(got), Code::FailedPrecondition);
    let got = s
        .svc
        .node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
            volume_id: s.id.clone(),
            staging_target_path: staging.clone(),
        }))
        .await;
    assert_eq!(code(got), Code::FailedPrecondition);
    assert!(std::path::Path::new(&target).exists());
    assert!(s.fake.calls().is_empty());
}

#[tokio::test]
async fn unstage_unmounts_the_volume_and_gives_up_when_mounts_keep_appearing() {
    // The scripted mount table never changes, so the mount is still there after each umount.
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.mountinfo(&[fs_line(40, &staging, "rw")]);
    for _ in 0..MAX_STACKED_MOUNTS {
        s.fake.expect(&["umount", &staging]).succeeds();
    }
    let err = s
        .svc
        .node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
            volume_id: s.id.clone(),
            staging_target_path: staging.clone(),
        }))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    assert!(err.message().contains("still mounted"), "{}", err.message());
    s.fake.assert_done();

    s.fake
        .expect(&["umount", &staging])
        .fails(32, "umount: target is busy.\n");
    let got = s
        .svc
        .node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
            volume_id: s.id.clone(),
            staging_target_path: staging.clone(),
        }))
        .await;
    assert_eq!(code(got), Code::FailedPrecondition);
    s.fake.assert_done();
}

/// A volume no class on this node serves (its class fenced, or the volume handed over) whose
/// device-mapper device is still here: kubelet can unmount it, and nothing else.
#[tokio::test]
async fn unpublish_and_unstage_of_a_volume_not_served_here_unmount_only_its_leftover_device() {
    let s = Setup::new(NodeOptions::default());
    let gone = volume_lv_name("pvc-gone");
    let sys = tempfile::tempdir().unwrap();
    let dm = sys.path().join("block/dm-7");
    std::fs::create_dir_all(dm.join("dm")).unwrap();
    let (ma, mi) = ids().rdev;
    std::fs::write(dm.join("dev"), format!("{ma}:{mi}\n")).unwrap();
    std::fs::write(dm.join("dm/uuid"), "LVM-abc\n").unwrap();
    std::fs::write(
        dm.join("dm/name"),
        format!("san-{}\n", gone.replace('-', "--")),
    )
    .unwrap();
    let svc = NodeService::new(
        s.backend.clone(),
        Filesystems::new(s.fake.clone()).with_proc_root(s.proc.path()),
        NodeOptions::default(),
    )
    .with_host_paths(sys.path(), sys.path().join("records"));
    let (target, staging) = (s.path("t"), s.staging());
    let unpublish = |id: &str| NodeUnpublishVolumeRequest {
        volume_id: id.to_owned(),
        target_path: target.clone(),
    };
    let unstage = |id: &str| NodeUnstageVolumeRequest {
        volume_id: id.to_owned(),
        staging_target_path: staging.clone(),
    };

    // Nothing of it mounted: both are done.
    std::fs::create_dir(&target).unwrap();
    svc.node_unpublish_volume(Request::new(unpublish(&gone)))
        .await
        .unwrap();
    assert!(!std::path::Path::new(&target).exists());
    svc.node_unstage_volume(Request::new(unstage(&gone)))
        .await
        .unwrap();

    // Its filesystem mounted at both paths: unmounted (the scripted table keeps showing it).
    s.mountinfo(&[fs_line(40, &target, "rw"), fs_line(41, &staging, "rw")]);
    for path in [&target, &staging] {
        for _ in 0..MAX_STACKED_MOUNTS {
            s.fake.expect(&["umount", path]).succeeds();
        }
    }
    let err = svc
        .node_unpublish_volume(Request::new(unpublish(&gone)))
        .await
        .unwrap_err();
    assert!(err.message().contains("still mounted"), "{}", err.message());
    let err = svc
        .node_unstage_volume(Request::new(unstage(&gone)))
        .await
        .unwrap_err();
    assert!(err.message().contains("still mounted"), "{}", err.message());
    s.fake.assert_done();

    // Another device at the path is left alone.
    s.mountinfo(&[format!(
        "42 1 253:99 / {staging} rw - ext4 /dev/mapper/vg1-other rw"
    )]);
    let got = svc.node_unstage_volume(Request::new(unstage(&gone))).await;
    assert_eq!(code(got), Code::FailedPrecondition);

    // Not LVM's device, or no device at all: NOT_FOUND, as before, and nothing runs.
    std::fs::write(dm.join("dm/uuid"), "CRYPT-LUKS2-abc\n").unwrap();
    s.mountinfo(&[fs_line(41, &staging, "rw")]);
    let got = svc.node_unstage_volume(Request::new(unstage(&gone))).await;
    assert_eq!(code(got), Code::NotFound);
    let other = volume_lv_name("pvc-other");
    let got = svc.node_unstage_volume(Request::new(unstage(&other))).await;
    assert_eq!(code(got), Code::NotFound);
    let got = svc
        .node_unpublish_volume(Request::new(unpublish(&other)))
        .await;
    assert_eq!(code(got), Code::NotFound);
    assert!(s.fake.calls().iter().all(|c| c.program == "umount"));
    assert_eq!(s.backend.activations.load(Ordering::Relaxed), 0);

    // No class served at all (as while the node agent starts): only a device of a class the
    // fence hook fenced counts.
    std::fs::write(dm.join("dm/uuid"), "LVM-abc\n").unwrap();
    s.mountinfo(&[]);
    s.backend.down.store(true, Ordering::Relaxed);
    let got = svc.node_unstage_volume(Request::new(unstage(&gone))).await;
    assert_eq!(code(got), Code::Unavailable);
    let records = sys.path().join("records");
    std::fs::create_dir_all(&records).unwrap();
    std::fs::write(records.join("fenced-san"), "{}").unwrap();
    svc.node_unstage_volume(Request::new(unstage(&gone)))
        .await
        .unwrap();
    std::fs::create_dir(&target).unwrap();
    svc.node_unpublish_volume(Request::new(unpublish(&gone)))
        .await
        .unwrap();
    assert!(!std::path::Path::new(&target).exists());
}

// ---- stats, expand ----

#[tokio::test]
async fn stats_of_a_mounted_filesystem_report_bytes_inodes_and_the_condition() {
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    s.mountinfo(&[fs_line(40, &staging, "rw")]);
    s.backend
        .volumes
        .lock()
        .unwrap()
        .get_mut(&s.id)
        .unwrap()
        .health = LvHealth::Partial;
    let r = s
        .svc
        .node_get_volume_stats(Request::new(NodeGetVolumeStatsRequest {
            volume_id: s.id.clone(),
            volume_path: staging.clone(),
            staging_target_path: staging.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    let st = statvfs(&staging).unwrap();
    assert_eq!(r.usage.len(), 2);
    assert_eq!(r.usage[0].unit, Unit::Bytes as i32);
    assert_eq!(r.usage[0].total, i64_of(st.total_bytes));
    assert!(r.usage[0].available <= r.usage[0].total);
    assert_eq!(r.usage[1].unit, Unit::Inodes as i32);
    assert_eq!(r.usage[1].total, i64_of(st.total_inodes));
    let c = r.volume_condition.unwrap();
    assert!(c.abnormal);
    assert!(
        c.message.starts_with("Partial: volume is partial"),
        "{}",
        c.message
    );
}

#[tokio::test]
async fn stats_of_a_block_publication_report_the_device_size_and_a_healthy_condition() {
    let s = Setup::new(NodeOptions::default());
    let target = s.path("blk");
    s.mountinfo(&[block_line(41, &target)]);
    let r = s
        .svc
        .node_get_volume_stats(Request::new(NodeGetVolumeStatsRequest {
            volume_id: s.id.clone(),
            volume_path: target,
            staging_target_path: String::new(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.usage.len(), 1);
    assert_eq!((r.usage[0].unit, r.usage[0].total), (Unit::Bytes as i32, 0));
    let c = r.volume_condition.unwrap();
    assert!(!c.abnormal, "{c:?}");
}

#[tokio::test]
async fn expand_grows_the_mounted_filesystem_and_checks_the_range() {
    let s = Setup::new(NodeOptions::default());
    let (t, ro, blk) = (s.path("t"), s.path("ro"), s.path("blk"));
    s.mountinfo(&[
        fs_line(41, &t, "rw"),
        fs_line(42, &ro, "ro"),
        block_line(43, &blk),
    ]);
    let expand = |path: &str, range: Option<CapacityRange>, cap| {
        s.svc
            .node_expand_volume(Request::new(NodeExpandVolumeRequest {
                volume_id: s.id.clone(),
                volume_path: path.to_owned(),
                capacity_range: range,
                volume_capability: cap,
                ..Default::default()
            }))
    };
    s.fake.expect(&["resize2fs", DEV]).succeeds();
    let r = expand(&t, None, None).await.unwrap().into_inner();
    assert_eq!(r.capacity_bytes, 0, "/dev/null is empty");
    s.fake.assert_done();
    // Nothing to grow for a block volume, by capability or by what is mounted.
    expand(&blk, None, None).await.unwrap();
    expand(
        &s.path("unmounted"),
        None,
        block_cap(Mode::SingleNodeWriter),
    )
    .await
    .unwrap();
    assert_eq!(
        code(expand(&ro, None, None).await),
        Code::FailedPrecondition
    );
    let bigger = CapacityRange {
        required_bytes: 1 << 30,
        limit_bytes: 0,
    };
    assert_eq!(code(expand(&t, Some(bigger), None).await), Code::OutOfRange);
    assert_eq!(
        code(expand(&t, None, mount_cap("", &[], Mode::MultiNodeMultiWriter)).await),
        Code::InvalidArgument
    );
    s.fake.assert_done();
}

/// csi-driver-lvm's way (ADR 0033): with `grows_volume` the node grows a volume smaller than asked
/// before its filesystem; without it only the controller does.
#[tokio::test]
async fn expand_grows_the_volume_first_only_when_the_node_grows_volumes() {
    for grows_volume in [false, true] {
        let s = Setup::new(NodeOptions {
            grows_volume,
            ..NodeOptions::default()
        });
        let t = s.path("t");
        s.mountinfo(&[fs_line(41, &t, "rw")]);
        let err = s
            .svc
            .node_expand_volume(Request::new(NodeExpandVolumeRequest {
                volume_id: s.id.clone(),
                volume_path: t.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                ..Default::default()
            }))
            .await
            .unwrap_err();
        // /dev/null never grows: the growth asked is checked against the device.
        assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
        let asked = s.backend.expanded.lock().unwrap().clone();
        if grows_volume {
            assert_eq!(asked, [(s.id.clone(), 1 << 30)]);
        } else {
            assert!(asked.is_empty(), "{asked:?}");
        }
        s.fake.assert_done();
    }
}

// ---- info ----

#[tokio::test]
async fn info_names_the_node_and_its_topology_and_capabilities_are_the_five() {
    let s = Setup::new(NodeOptions::default());
    let info = s
        .svc
        .node_get_info(Request::new(NodeGetInfoRequest {}))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    assert_eq!(info.max_volumes_per_node, 0);
    assert_eq!(
        info.accessible_topology.unwrap().segments,
        HashMap::from([(crate::TOPOLOGY_NODE_KEY.to_owned(), "node-1".to_owned())])
    );
    // Under another driver's name, its topology key (ADR 0033).
    let other = Setup::new(NodeOptions {
        topology_key: "topology.lvm.csi/node",
        ..NodeOptions::default()
    });
    assert_eq!(
        other.svc.info().await.accessible_topology.unwrap().segments,
        HashMap::from([("topology.lvm.csi/node".to_owned(), "node-1".to_owned())])
    );
    let caps = s
        .svc
        .node_get_capabilities(Request::new(NodeGetCapabilitiesRequest {}))
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let types: Vec<i32> = caps
        .iter()
        .map(|c| match c.r#type {
            Some(node_service_capability::Type::Rpc(r)) => r.r#type,
            None => 0,
        })
        .collect();
    assert_eq!(types, [1, 2, 3, 4, 5]);
}

// ---- over a real socket ----

/// The codes a CO sees from the Node service served on a Unix socket (the same service the tests above
/// call directly): argument checks, unknown ids, the publish table and the idempotent unpublish and
/// unstage of paths that are not mounted.
#[tokio::test]
async fn node_codes_over_a_real_socket() {
    use crate::{
        csi::{NodeUnstageVolumeRequest, node_client::NodeClient},
        identity::{Converged, IdentityService},
        server::{self, Services},
    };
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let (t1, t2) = (s.path("t1"), s.path("t2"));
    s.mountinfo(&[fs_line(40, &staging, "rw"), fs_line(41, &t1, "rw")]);
    let fs = Filesystems::new(s.fake.clone()).with_proc_root(s.proc.path());
    let svc = NodeService::new(s.backend.clone(), fs, NodeOptions::default());
    let socket = s.dir.path().join("csi.sock");
    let listener = server::bind(&socket).unwrap();
    let services: Services<_, _> = Services {
        snapshot_metadata: None,
        identity: IdentityService::new(
            "topolvm.io",
            false,
            s.backend.clone(),
            Converged::default(),
        ),
        controller: None,
        node: Some(svc),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(server::serve(listener, services, async {
        let _ = stopped.await;
    }));
    let mut c = NodeClient::new(server::connect(&socket).await.unwrap());

    let info = c
        .node_get_info(NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, "node-1");
    // Argument checks and ids.
    let got = c.node_stage_volume(stage_req("", &staging, writer())).await;
    assert_eq!(code(got), Code::InvalidArgument);
    let got = c.node_stage_volume(stage_req(&s.id, &staging, None)).await;
    assert_eq!(code(got), Code::InvalidArgument);
    let multi = mount_cap("", &[], Mode::MultiNodeMultiWriter);
    let got = c.node_stage_volume(stage_req(&s.id, &staging, multi)).await;
    assert_eq!(code(got), Code::InvalidArgument);
    let unknown = volume_lv_name("pvc-unknown");
    let got = c
        .node_stage_volume(stage_req(&unknown, &staging, writer()))
        .await;
    assert_eq!(code(got), Code::NotFound);
    // The publish table.
    let publish = |target: &str, cap, readonly| publish_req(&s.id, &staging, target, cap, readonly);
    c.node_publish_volume(publish(&t1, writer(), false))
        .await
        .unwrap();
    let got = c.node_publish_volume(publish(&t1, writer(), true)).await;
    assert_eq!(code(got), Code::AlreadyExists);
    let got = c.node_publish_volume(publish(&t2, writer(), false)).await;
    assert_eq!(code(got), Code::FailedPrecondition);
    // Unpublish and unstage of paths that are not mounted (or do not exist) succeed.
    let never = s.path("never");
    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
        volume_id: s.id.clone(),
        target_path: never.clone(),
    })
    .await
    .unwrap();
    c.node_unstage_volume(NodeUnstageVolumeRequest {
        volume_id: s.id.clone(),
        staging_target_path: never,
    })
    .await
    .unwrap();
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    let _ = stop.send(());
    served.await.unwrap().unwrap();
}

/// The Node service of `s` on a real socket in its scratch directory: a client, and a sender that stops
/// the server.
async fn serve_on_socket(
    s: &Setup,
) -> (
    crate::csi::node_client::NodeClient<tonic::transport::Channel>,
    tokio::sync::oneshot::Sender<()>,
) {
    use crate::{
        identity::{Converged, IdentityService},
        server::{self, Services},
    };
    let fs = Filesystems::new(s.fake.clone()).with_proc_root(s.proc.path());
    let svc = NodeService::new(s.backend.clone(), fs, NodeOptions::default());
    let socket = s.dir.path().join("node.sock");
    let listener = server::bind(&socket).unwrap();
    let services: Services<_, _> = Services {
        snapshot_metadata: None,
        identity: IdentityService::new(
            "topolvm.io",
            false,
            s.backend.clone(),
            Converged::default(),
        ),
        controller: None,
        node: Some(svc),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(server::serve(listener, services, async {
        let _ = stopped.await;
    }));
    let client = crate::csi::node_client::NodeClient::new(server::connect(&socket).await.unwrap());
    (client, stop)
}

#[tokio::test]
async fn a_missing_field_is_invalid_argument_whatever_the_volume_id_and_a_path_without_our_volume_not_found()
 {
    use Code::{FailedPrecondition as Fp, InvalidArgument as Inv, NotFound as Nf};
    let s = Setup::new(NodeOptions::default());
    let staging = s.staging();
    let target = s.path("target");
    let (mut c, stop) = serve_on_socket(&s).await;
    let unknown = volume_lv_name("pvc-unknown");
    // A known volume, one of our shape that does not exist, and one this driver never hands out.
    let ids = [s.id.as_str(), unknown.as_str(), "vol-1"];

    for id in ids {
        let stats = |path: &str| NodeGetVolumeStatsRequest {
            volume_id: id.to_owned(),
            volume_path: path.to_owned(),
            staging_target_path: String::new(),
        };
        let expand = |path: &str| NodeExpandVolumeRequest {
            volume_id: id.to_owned(),
            volume_path: path.to_owned(),
            ..Default::default()
        };
        let rows: Vec<(&str, Code, Code)> = vec![
            (
                "publish without a target path",
                Inv,
                code(
                    c.node_publish_volume(publish_req(id, &staging, "", writer(), false))
                        .await,
                ),
            ),
            (
                "publish without a capability",
                Inv,
                code(
                    c.node_publish_volume(publish_req(id, &staging, &target, None, false))
                        .await,
                ),
            ),
            (
                "publish without a capability or a staging path",
                Inv,
                code(
                    c.node_publish_volume(publish_req(id, "", &target, None, false))
                        .await,
                ),
            ),
            (
                "publish without a staging path",
                Fp,
                code(
                    c.node_publish_volume(publish_req(id, "", &target, writer(), false))
                        .await,
                ),
            ),
            (
                "unpublish without a target path",
                Inv,
                code(
                    c.node_unpublish_volume(NodeUnpublishVolumeRequest {
                        volume_id: id.to_owned(),
                        target_path: String::new(),
                    })
                    .await,
                ),
            ),
            (
                "stage without a staging path",
                Inv,
                code(c.node_stage_volume(stage_req(id, "", writer())).await),
            ),
            (
                "stage without a capability",
                Inv,
                code(c.node_stage_volume(stage_req(id, &staging, None)).await),
            ),
            (
                "unstage without a staging path",
                Inv,
                code(
                    c.node_unstage_volume(NodeUnstageVolumeRequest {
                        volume_id: id.to_owned(),
                        staging_target_path: String::new(),
                    })
                    .await,
                ),
            ),
            (
                "stats without a volume path",
                Inv,
                code(c.node_get_volume_stats(stats("")).await),
            ),
            (
                "stats of a relative path",
                Nf,
                code(c.node_get_volume_stats(stats("some/path")).await),
            ),
            (
                "stats of a path where nothing is mounted",
                Nf,
                code(c.node_get_volume_stats(stats(&staging)).await),
            ),
            (
                "expand without a volume path",
                Inv,
                code(c.node_expand_volume(expand("")).await),
            ),
            (
                "expand of a relative path",
                Nf,
                code(c.node_expand_volume(expand("some/path")).await),
            ),
        ];
        for (case, want, got) in rows {
            assert_eq!(got, want, "{case} (volume {id})");
        }
    }
    // A well-formed request for a volume that is not there is NOT_FOUND.
    for id in &ids[1..] {
        let got = c.node_stage_volume(stage_req(id, &staging, writer())).await;
        assert_eq!(code(got), Nf, "stage of {id}");
        let got = c
            .node_publish_volume(publish_req(id, &staging, &target, writer(), false))
            .await;
        assert_eq!(code(got), Nf, "publish of {id}");
    }
    assert!(s.fake.calls().is_empty(), "{:?}", s.fake.calls());
    let _ = stop.send(());
}

// ---- inline ephemeral volumes ----

#[tokio::test]
async fn ephemeral_publish_over_a_directory_that_is_not_empty_makes_no_volume() {
    let s = Setup::new(NodeOptions::default());
    s.backend
        .classes
        .lock()
        .unwrap()
        .push(DeviceClassConfig::named("vg1").as_default());
    let target = not_ours(&s, "etc");
    let mut req = publish_req("csi-0123456789abcdef", "", &target, writer(), false);
    req.volume_context =
        HashMap::from([("csi.storage.k8s.io/ephemeral".to_owned(), "true".to_owned())]);
    // The test backend would answer UNAVAILABLE to create_volume (`unused`): none is asked for.
    let got = s.svc.node_publish_volume(Request::new(req)).await;
    assert_refused_naming(got, &target);
    assert!(s.fake.calls().is_empty(), "nothing ran");
}

#[tokio::test]
async fn ephemeral_publish_with_a_bad_attribute_is_invalid_argument_naming_it() {
    let s = Setup::new(NodeOptions::default());
    s.backend
        .classes
        .lock()
        .unwrap()
        .push(DeviceClassConfig::named("vg1").as_default());
    let target = s.path("target");
    for (key, value) in [
        ("size", "huge"),
        ("type", "raid7"),
        ("csi.storage.k8s.io/fstype", "btrfs"),
        ("topolvm.io/device-class", "nvme"),
    ] {
        let mut req = publish_req("csi-0123456789abcdef", "", &target, writer(), false);
        req.volume_context = HashMap::from([
            ("csi.storage.k8s.io/ephemeral".to_owned(), "true".to_owned()),
            (key.to_owned(), value.to_owned()),
        ]);
        let err = s
            .svc
            .node_publish_volume(Request::new(req))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{key}: {}",
            err.message()
        );
        assert!(err.message().contains(key), "{key}: {}", err.message());
    }
    assert!(s.fake.calls().is_empty(), "nothing ran");
}
