//! The whole driver against real LVM, inside the test VM (`cargo xtask vm-test driver_`): the
//! Identity, Controller and Node services over [`LocalBackend`] on a real Unix socket, driven by the
//! generated gRPC client, through each volume's whole life — thin and thick, mount and block, ext4 and
//! xfs, snapshots, restores, clones and expansion — and a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::PathBuf, sync::Arc};

use lvms_core::config::Fstype;
use lvms_csi::{
    controller::ControllerService,
    csi::{
        CapacityRange, ControllerExpandVolumeRequest, ControllerGetVolumeRequest,
        CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest,
        GetSnapshotRequest, ListVolumesRequest, NodeExpandVolumeRequest, NodeGetVolumeStatsRequest,
        NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
        NodeUnstageVolumeRequest, VolumeCapability, VolumeContentSource,
        controller_client::ControllerClient,
        node_client::NodeClient,
        volume_capability::{self, AccessMode, BlockVolume, MountVolume, access_mode::Mode},
        volume_content_source,
        volume_usage::Unit,
    },
    identity::{Converged, IdentityService},
    node::{NodeOptions, NodeService},
    server::{self, Services},
};
use lvms_engine::{backend::DeviceClassConfig, local::LocalBackend};
use lvms_host::{
    fs::Filesystems,
    lvm::{Lvm, PoolSize, ThinPoolSpec},
    runner::RealRunner,
    shell::LvmShell,
};
use lvms_testkit::{Scratch, sh, sh_status, unique};
use tonic::{Code, transport::Channel};

const MIB: i64 = 1 << 20;

/// The backend as `lvms standalone` runs it: LVM commands in one long-lived shell process.
type Backend = LocalBackend<Arc<LvmShell>>;

/// Two volume groups on loop disks: `thin` (a thin pool, ratio 4) and `thick`.
struct Setup {
    _scratch: Scratch,
    thin: String,
    thick: String,
    mnt: PathBuf,
}

async fn setup() -> Setup {
    let mut scratch = Scratch::new(3, 1024);
    let (thin, thick) = (scratch.vg_name(), scratch.vg_name());
    let lvm = Lvm::new(Arc::new(RealRunner));
    for d in &scratch.disks {
        lvm.pv_create(d, None).await.unwrap();
    }
    lvm.vg_create(&thin, &scratch.disks[..1], &["lvms".into()])
        .await
        .unwrap();
    lvm.vg_create(&thick, &scratch.disks[1..], &["lvms".into()])
        .await
        .unwrap();
    lvm.thin_pool_create(&ThinPoolSpec {
        vg: thin.clone(),
        name: "pool".into(),
        size: PoolSize::PercentFree(90),
        chunk_size: None,
        metadata_size: None,
        zero: false,
    })
    .await
    .unwrap();
    let mnt = PathBuf::from(format!("/run/lvms-mnt/{}", unique("drv")));
    Setup {
        _scratch: scratch,
        thin,
        thick,
        mnt,
    }
}

struct Driver {
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(s: &Setup, socket: &std::path::Path) -> Driver {
    let runner = Arc::new(RealRunner);
    let backend: Arc<Backend> = Arc::new(LocalBackend::new(
        "vm-node",
        vec![
            DeviceClassConfig::named(&s.thin)
                .with_thin_pool("pool", 4)
                .as_default(),
            DeviceClassConfig {
                // A blank volume whose capability names no filesystem gets the class's, not the
                // driver's default (xfs below).
                fstype: Some(Fstype::Ext4),
                ..DeviceClassConfig::named(&s.thick)
            },
        ],
        Lvm::new(Arc::new(LvmShell::new())),
    ));
    let converged = Converged::default();
    converged.set(true);
    let listener = server::bind(socket).unwrap();
    let services: Services<_, _> = Services {
        snapshot_metadata: None,
        identity: IdentityService::new("topolvm.io", true, backend.clone(), converged),
        controller: Some(ControllerService::new(backend.clone())),
        node: Some(NodeService::new(
            backend,
            Filesystems::new(runner),
            NodeOptions {
                default_fstype: Fstype::Xfs,
                ..NodeOptions::default()
            },
        )),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server::serve(listener, services, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let channel = server::connect(socket).await.unwrap();
    Driver {
        controller: ControllerClient::new(channel.clone()),
        node: NodeClient::new(channel),
        stop,
        task,
    }
}

impl Driver {
    async fn stop(self) {
        drop(self.controller);
        drop(self.node);
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

fn mount(fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..MountVolume::default()
        })),
    }
}

fn block() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Block(BlockVolume {})),
    }
}

fn create(name: &str, class: &str, size: i64, cap: VolumeCapability) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: size,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap],
        parameters: [("topolvm.io/device-class".to_owned(), class.to_owned())].into(),
        ..CreateVolumeRequest::default()
    }
}

fn source(req: CreateVolumeRequest, t: volume_content_source::Type) -> CreateVolumeRequest {
    CreateVolumeRequest {
        volume_content_source: Some(VolumeContentSource { r#type: Some(t) }),
        ..req
    }
}

async fn create_id(d: &mut Driver, req: CreateVolumeRequest) -> String {
    d.controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

/// Stages and publishes `id`; returns the target path.
async fn attach(d: &mut Driver, s: &Setup, id: &str, name: &str, cap: VolumeCapability) -> String {
    let staging = s.mnt.join("staging").join(name);
    let target = s.mnt.join("pods").join(name);
    std::fs::create_dir_all(&staging).unwrap();
    d.node
        .node_stage_volume(NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            volume_capability: Some(cap.clone()),
            ..NodeStageVolumeRequest::default()
        })
        .await
        .unwrap();
    d.node
        .node_publish_volume(NodePublishVolumeRequest {
            volume_id: id.into(),
            staging_target_path: staging.to_string_lossy().into(),
            target_path: target.to_string_lossy().into(),
            volume_capability: Some(cap),
            ..NodePublishVolumeRequest::default()
        })
        .await
        .unwrap();
    target.to_string_lossy().into_owned()
}

async fn detach(d: &mut Driver, s: &Setup, id: &str, name: &str) {
    let staging = s.mnt.join("staging").join(name);
    let target = s.mnt.join("pods").join(name);
    for _ in 0..2 {
        d.node
            .node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: id.into(),
                target_path: target.to_string_lossy().into(),
            })
            .await
            .unwrap();
        d.node
            .node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: id.into(),
                staging_target_path: staging.to_string_lossy().into(),
            })
            .await
            .unwrap();
    }
}

fn fs_size(path: &str) -> u64 {
    sh(&format!("df -B1 --output=size {path} | tail -1"))
        .trim()
        .parse()
        .unwrap()
}

async fn delete(d: &mut Driver, id: &str) {
    for _ in 0..2 {
        d.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.into(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
    }
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn driver_thin_xfs_volume_lives_through_snapshot_restore_larger_and_online_expansion() {
    let s = setup().await;
    let socket = s.mnt.join("csi.sock");
    let mut d = start(&s, &socket).await;

    let vol = create_id(&mut d, create("pvc-thin", &s.thin, 256 * MIB, mount("xfs"))).await;
    let target = attach(&mut d, &s, &vol, "thin", mount("xfs")).await;
    std::fs::write(format!("{target}/data"), "before the snapshot").unwrap();
    sh("sync");

    let snap = d
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: vol.clone(),
            name: "snap-1".into(),
            ..CreateSnapshotRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id;
    std::fs::write(format!("{target}/data"), "after the snapshot").unwrap();
    let got = d
        .controller
        .get_snapshot(GetSnapshotRequest {
            snapshot_id: snap.clone(),
            ..GetSnapshotRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(
        (got.snapshot_id.as_str(), got.source_volume_id.as_str()),
        (snap.as_str(), vol.as_str())
    );
    // The source's size (xfs volumes are made at least 300 MiB, so not the 256 MiB asked for).
    let source_size = d
        .controller
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: vol.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .capacity_bytes;
    assert_eq!(got.size_bytes, source_size);
    assert!(got.ready_to_use && got.creation_time.is_some_and(|t| t.seconds > 0));

    // Restore into a larger volume: the data of the snapshot, the filesystem grown to the volume.
    let restored = create_id(
        &mut d,
        source(
            create("pvc-restored", &s.thin, 512 * MIB, mount("xfs")),
            volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                snapshot_id: snap.clone(),
            }),
        ),
    )
    .await;
    let rtarget = attach(&mut d, &s, &restored, "restored", mount("xfs")).await;
    assert_eq!(
        std::fs::read_to_string(format!("{rtarget}/data")).unwrap(),
        "before the snapshot"
    );
    assert!(fs_size(&rtarget) > 400 << 20, "{}", fs_size(&rtarget));
    assert_eq!(
        std::fs::read_to_string(format!("{target}/data")).unwrap(),
        "after the snapshot"
    );

    // Online expansion: controller grows the LV, node grows xfs while mounted.
    let before = fs_size(&target);
    let r = d
        .controller
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: vol.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 640 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount("xfs")),
            ..ControllerExpandVolumeRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.node_expansion_required);
    d.node
        .node_expand_volume(NodeExpandVolumeRequest {
            volume_id: vol.clone(),
            volume_path: target.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 640 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount("xfs")),
            ..NodeExpandVolumeRequest::default()
        })
        .await
        .unwrap();
    let after = fs_size(&target);
    assert!(after > before + (100 << 20), "{before} -> {after}");

    // Stats: bytes and inodes, healthy.
    let stats = d
        .node
        .node_get_volume_stats(NodeGetVolumeStatsRequest {
            volume_id: vol.clone(),
            volume_path: target.clone(),
            staging_target_path: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == Unit::Bytes as i32)
        .unwrap();
    assert_eq!(bytes.total.unsigned_abs(), after);
    assert!(stats.usage.iter().any(|u| u.unit == Unit::Inodes as i32));
    assert!(!stats.volume_condition.unwrap().abnormal);

    detach(&mut d, &s, &restored, "restored").await;
    detach(&mut d, &s, &vol, "thin").await;
    for _ in 0..2 {
        d.controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snap.clone(),
                ..DeleteSnapshotRequest::default()
            })
            .await
            .unwrap();
    }
    let gone = d
        .controller
        .get_snapshot(GetSnapshotRequest {
            snapshot_id: snap.clone(),
            ..GetSnapshotRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
    delete(&mut d, &restored).await;
    delete(&mut d, &vol).await;
    let left = sh(&format!("lvm lvs --noheadings -o lv_name {}", s.thin));
    assert_eq!(left.trim(), "pool", "only the pool is left: {left}");
    d.stop().await;
    drop(s);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn driver_thick_ext4_and_block_volumes_and_a_thin_block_clone() {
    let s = setup().await;
    let socket = s.mnt.join("csi.sock");
    let mut d = start(&s, &socket).await;

    // Thick, ext4, mounted.
    let ext4 = create_id(
        &mut d,
        create("pvc-ext4", &s.thick, 128 * MIB, mount("ext4")),
    )
    .await;
    let target = attach(&mut d, &s, &ext4, "ext4", mount("ext4")).await;
    std::fs::write(format!("{target}/f"), "thick").unwrap();
    let fstype = sh(&format!("findmnt -n -o FSTYPE {target}"));
    assert_eq!(fstype.trim(), "ext4");
    // Thick, no filesystem asked for: the class's ext4, though the driver's default is xfs.
    let unnamed = create_id(
        &mut d,
        create("pvc-class-fs", &s.thick, 128 * MIB, mount("")),
    )
    .await;
    let unnamed_target = attach(&mut d, &s, &unnamed, "class-fs", mount("")).await;
    let fstype = sh(&format!("findmnt -n -o FSTYPE {unnamed_target}"));
    assert_eq!(fstype.trim(), "ext4", "the class's fstype");
    detach(&mut d, &s, &unnamed, "class-fs").await;
    delete(&mut d, &unnamed).await;

    // Thick striped over both disks, from parameters.
    let mut striped = create("pvc-striped", &s.thick, 64 * MIB, block());
    striped
        .parameters
        .insert("lvms.topolvm.io/lv-type".into(), "striped".into());
    striped
        .parameters
        .insert("lvms.topolvm.io/stripes".into(), "2".into());
    let striped = create_id(&mut d, striped).await;
    let stripes = sh(&format!(
        "lvm lvs --noheadings -o stripes {}/{striped}",
        s.thick
    ));
    assert_eq!(stripes.trim(), "2");

    // Snapshots of thick volumes are refused, naming the class.
    let err = d
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: ext4.clone(),
            name: "nope".into(),
            ..CreateSnapshotRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains(&s.thick), "{}", err.message());

    // Thin block volume with data, then a clone of it carries the data.
    let blk = create_id(&mut d, create("pvc-block", &s.thin, 64 * MIB, block())).await;
    let dev = attach(&mut d, &s, &blk, "block", block()).await;
    let size: u64 = sh(&format!("blockdev --getsize64 {dev}"))
        .trim()
        .parse()
        .unwrap();
    assert_eq!(size, 64 << 20);
    sh(&format!(
        "printf 'block payload' | dd of={dev} bs=512 conv=notrunc,fsync status=none"
    ));
    let clone = create_id(
        &mut d,
        source(
            create("pvc-clone", &s.thin, 64 * MIB, block()),
            volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                volume_id: blk.clone(),
            }),
        ),
    )
    .await;
    let cdev = attach(&mut d, &s, &clone, "clone", block()).await;
    let head = sh(&format!("dd if={cdev} bs=13 count=1 status=none"));
    assert_eq!(head, "block payload");

    // A block volume cannot be deleted while published? It can be unpublished and deleted.
    detach(&mut d, &s, &clone, "clone").await;
    detach(&mut d, &s, &blk, "block").await;
    detach(&mut d, &s, &ext4, "ext4").await;
    for id in [&clone, &blk, &ext4, &striped] {
        delete(&mut d, id).await;
    }
    d.stop().await;
    drop(s);
}

#[tokio::test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
async fn driver_restarted_finds_every_volume_and_duplicates_none() {
    let s = setup().await;
    let socket = s.mnt.join("csi.sock");
    let mut d = start(&s, &socket).await;
    let mut made = Vec::new();
    for i in 0..3 {
        made.push(
            create_id(
                &mut d,
                create(&format!("pvc-{i}"), &s.thin, 32 * MIB, mount("ext4")),
            )
            .await,
        );
    }
    made.push(
        create_id(
            &mut d,
            create("pvc-thick", &s.thick, 32 * MIB, mount("ext4")),
        )
        .await,
    );
    let target = attach(&mut d, &s, &made[0], "m0", mount("ext4")).await;
    d.stop().await;

    // A new process: same answers, no new LV, the mount still known.
    let mut d = start(&s, &socket).await;
    let lvs_before = sh("lvm lvs --noheadings -o lv_name | wc -l");
    for (i, id) in made.iter().take(3).enumerate() {
        assert_eq!(
            &create_id(
                &mut d,
                create(&format!("pvc-{i}"), &s.thin, 32 * MIB, mount("ext4"))
            )
            .await,
            id
        );
    }
    assert_eq!(sh("lvm lvs --noheadings -o lv_name | wc -l"), lvs_before);
    let mut listed: Vec<String> = d
        .controller
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.unwrap().volume_id)
        .collect();
    listed.sort();
    let mut want = made.clone();
    want.sort();
    assert_eq!(listed, want);
    // Publishing again at the same target is OK (idempotent from mountinfo).
    let again = attach(&mut d, &s, &made[0], "m0", mount("ext4")).await;
    assert_eq!(again, target);
    detach(&mut d, &s, &made[0], "m0").await;
    for id in &made {
        delete(&mut d, id).await;
    }
    let (_, left) = sh_status(&format!("lvm lvs --noheadings -o lv_name {}", s.thick));
    assert!(left.trim().is_empty(), "{left}");
    d.stop().await;
    drop(s);
}
