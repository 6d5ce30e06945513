//! The CSI Node service against real LVM, mkfs, mount and bind mounts, inside the test VM (ADR 0002):
//! stage and publish as a CO drives them, what a workload sees through the target, the spec's publish
//! table against real mounts, stats, online growth, and a restarted service finding the mounts it left.
//!
//! Each test makes its own loop disks and volume group (`Scratch`) and LVs named like the driver's
//! volumes; a small in-test backend maps the ids to them. Staging and target paths live under
//! `/run/lvms-mnt/`. Run with `cargo xtask vm-test vm_node`; on the host every test shows as ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Named so that `cargo xtask vm-test vm_node` selects these tests.
mod vm_node {
    use std::{
        collections::HashMap,
        os::unix::fs::FileTypeExt,
        path::Path,
        sync::{Arc, Mutex},
    };

    use lvms_core::lvattr::LvHealth;
    use lvms_csi::{
        csi::{
            NodeExpandVolumeRequest, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
            NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
            NodeUnstageVolumeRequest, VolumeCapability,
            node_server::Node,
            volume_capability::{
                AccessMode, AccessType, BlockVolume, MountVolume, access_mode::Mode,
            },
            volume_usage::Unit,
        },
        node::{NodeOptions, NodeService},
    };
    use lvms_engine::{
        backend::{
            Backend, BackendError, Capacity, DeviceClassConfig, NewSnapshot, NewVolume,
            Result as BResult, Volume,
        },
        ids::volume_lv_name,
    };
    use lvms_host::{
        fs::{Filesystems, statvfs},
        runner::RealRunner,
    };
    use lvms_testkit::{Scratch, sh, sh_status, unique};
    use tonic::{Code, Request, Status};

    const MIB: u64 = 1 << 20;
    /// mkfs.xfs (xfsprogs ≥ 5.19) refuses filesystems smaller than 300 MiB.
    const XFS_MIB: u64 = 320;

    // ---- an in-test backend over LVs made by the test ----

    struct VmBackend {
        volumes: Mutex<HashMap<String, Volume>>,
    }

    fn unused<T>() -> BResult<T> {
        Err(BackendError::Unavailable(
            "not used by the Node service".into(),
        ))
    }

    impl Backend for VmBackend {
        fn node_id(&self) -> &str {
            "vm-node"
        }
        fn classes(&self) -> Vec<DeviceClassConfig> {
            vec![]
        }
        async fn ready(&self) -> BResult<bool> {
            Ok(true)
        }
        async fn get(&self, id: &str) -> BResult<Option<Volume>> {
            Ok(self.volumes.lock().unwrap().get(id).cloned())
        }
        async fn list(&self) -> BResult<Vec<Volume>> {
            unused()
        }
        async fn create_volume(&self, _: &NewVolume) -> BResult<Volume> {
            unused()
        }
        async fn create_snapshot(&self, _: &NewSnapshot) -> BResult<Volume> {
            unused()
        }
        async fn delete(&self, _: &str) -> BResult<bool> {
            unused()
        }
        async fn expand(&self, _: &str, _: u64) -> BResult<u64> {
            unused()
        }
        async fn capacity(&self, _: &str, _: &lvms_engine::backend::Layout) -> BResult<Capacity> {
            unused()
        }
        async fn activate(&self, id: &str) -> BResult<String> {
            let vol = self
                .volumes
                .lock()
                .unwrap()
                .get(id)
                .cloned()
                .ok_or_else(|| BackendError::NotFound(id.to_owned()))?;
            sh(&format!("lvm lvchange -q -ay {}/{id} 2>&1", vol.class));
            Ok(vol.device)
        }
    }

    /// A volume group on one loop disk, the backend over it, and a directory for staging and targets.
    struct Env {
        /// Dropped first: unmounts what the test left, before the volume group goes.
        dir: Dir,
        backend: Arc<VmBackend>,
        vg: String,
        _s: Scratch,
    }

    impl Env {
        fn new(disk_mib: u64) -> Self {
            let mut s = Scratch::new(1, disk_mib);
            let vg = s.vg_name();
            sh(&format!("lvm vgcreate -q {vg} {} 2>&1", s.disks[0]));
            Self {
                dir: Dir::new(),
                backend: Arc::new(VmBackend {
                    volumes: Mutex::new(HashMap::new()),
                }),
                vg,
                _s: s,
            }
        }

        /// An LV named as the driver names the volume `name`, of `mib` MiB; returns its id.
        fn volume(&self, name: &str, mib: u64) -> String {
            let id = volume_lv_name(&format!("{name}-{}", unique("")));
            sh(&format!(
                "lvm lvcreate -q -y -L {mib}m -n {id} {} 2>&1",
                self.vg
            ));
            let vol = Volume {
                id: id.clone(),
                class: self.vg.clone(),
                size: mib * MIB,
                name: Some(name.to_owned()),
                source: None,
                snapshot: false,
                thin: false,
                created: None,
                requested: None,
                health: LvHealth::Ok,
                device: format!("/dev/{}/{id}", self.vg),
                ephemeral: None,
                open: false,
            };
            self.backend.volumes.lock().unwrap().insert(id.clone(), vol);
            id
        }

        fn device(&self, id: &str) -> String {
            format!("/dev/{}/{id}", self.vg)
        }

        /// A fresh Node service, as after a restart of the driver.
        fn service(&self) -> NodeService<VmBackend, RealRunner> {
            NodeService::new(
                self.backend.clone(),
                Filesystems::new(RealRunner),
                NodeOptions::default(),
            )
        }

        /// A staging directory, created as the CO does.
        fn staging(&self, name: &str) -> String {
            let p = self.dir.path(&format!("staging-{name}"));
            std::fs::create_dir_all(&p).unwrap();
            p
        }

        /// A target path (not created: publish creates it), its parent created as the CO does.
        fn target(&self, name: &str) -> String {
            let parent = self.dir.path(&format!("pods/{name}"));
            std::fs::create_dir_all(&parent).unwrap();
            format!("{parent}/mount")
        }
    }

    /// A directory under `/run/lvms-mnt/`; on drop everything mounted under it is unmounted and it is
    /// removed.
    struct Dir {
        path: String,
    }

    impl Dir {
        fn new() -> Self {
            let path = format!("/run/lvms-mnt/{}", unique("n"));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }

        fn path(&self, name: &str) -> String {
            format!("{}/{name}", self.path)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let p = &self.path;
            let _ = sh_status(&format!(
                "for m in $(awk 'index($5, \"{p}/\") == 1 {{print $5}}' /proc/self/mountinfo | sort -r); do umount -l $m; done; rm -rf {p}"
            ));
        }
    }

    // ---- requests ----

    fn mount_cap(fs_type: &str, mode: Mode) -> Option<VolumeCapability> {
        Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs_type.to_owned(),
                mount_flags: vec![],
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

    fn writer(fs_type: &str) -> Option<VolumeCapability> {
        mount_cap(fs_type, Mode::SingleNodeWriter)
    }

    async fn stage(
        svc: &impl Node,
        id: &str,
        staging: &str,
        cap: Option<VolumeCapability>,
    ) -> Result<(), Status> {
        svc.node_stage_volume(Request::new(NodeStageVolumeRequest {
            volume_id: id.to_owned(),
            staging_target_path: staging.to_owned(),
            volume_capability: cap,
            ..Default::default()
        }))
        .await
        .map(drop)
    }

    async fn unstage(svc: &impl Node, id: &str, staging: &str) -> Result<(), Status> {
        svc.node_unstage_volume(Request::new(NodeUnstageVolumeRequest {
            volume_id: id.to_owned(),
            staging_target_path: staging.to_owned(),
        }))
        .await
        .map(drop)
    }

    async fn publish(
        svc: &impl Node,
        id: &str,
        staging: &str,
        target: &str,
        cap: Option<VolumeCapability>,
        readonly: bool,
    ) -> Result<(), Status> {
        svc.node_publish_volume(Request::new(NodePublishVolumeRequest {
            volume_id: id.to_owned(),
            staging_target_path: staging.to_owned(),
            target_path: target.to_owned(),
            volume_capability: cap,
            readonly,
            ..Default::default()
        }))
        .await
        .map(drop)
    }

    async fn unpublish(svc: &impl Node, id: &str, target: &str) -> Result<(), Status> {
        svc.node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            target_path: target.to_owned(),
        }))
        .await
        .map(drop)
    }

    async fn stats(
        svc: &impl Node,
        id: &str,
        path: &str,
    ) -> Result<NodeGetVolumeStatsResponse, Status> {
        svc.node_get_volume_stats(Request::new(NodeGetVolumeStatsRequest {
            volume_id: id.to_owned(),
            volume_path: path.to_owned(),
            staging_target_path: String::new(),
        }))
        .await
        .map(tonic::Response::into_inner)
    }

    async fn expand(svc: &impl Node, id: &str, path: &str) -> Result<i64, Status> {
        svc.node_expand_volume(Request::new(NodeExpandVolumeRequest {
            volume_id: id.to_owned(),
            volume_path: path.to_owned(),
            ..Default::default()
        }))
        .await
        .map(|r| r.into_inner().capacity_bytes)
    }

    fn code(r: Result<(), Status>) -> Code {
        r.expect_err("expected an error").code()
    }

    // ---- independent views of the machine ----

    fn blkid_type(dev: &str) -> String {
        sh_status(&format!("blkid -p -o value -s TYPE {dev}"))
            .1
            .trim()
            .to_owned()
    }

    /// `findmnt`'s SOURCE at exactly `path`, empty when nothing is mounted there.
    fn mounted_source(path: &str) -> String {
        sh_status(&format!("findmnt -n -o SOURCE --mountpoint {path}"))
            .1
            .trim()
            .to_owned()
    }

    fn is_mounted(path: &str) -> bool {
        sh_status(&format!("findmnt --mountpoint {path}")).0 == 0
    }

    fn dev_size(dev: &str) -> u64 {
        sh(&format!("blockdev --getsize64 {dev}"))
            .trim()
            .parse()
            .unwrap()
    }

    fn exists(p: &str) -> bool {
        Path::new(p).symlink_metadata().is_ok()
    }

    // ---- tests ----

    /// Stage, publish, write through the target, and take it all down twice, for one filesystem.
    async fn round_trip(fs_type: &str) {
        let env = Env::new(1024);
        let id = env.volume("pvc-rt", XFS_MIB);
        let dev = env.device(&id);
        let svc = env.service();
        let (staging, target) = (env.staging("a"), env.target("a"));

        stage(&svc, &id, &staging, writer(fs_type)).await.unwrap();
        assert_eq!(blkid_type(&dev), fs_type);
        assert!(mounted_source(&staging).starts_with("/dev/mapper/"));
        stage(&svc, &id, &staging, writer(fs_type)).await.unwrap();

        publish(&svc, &id, &staging, &target, writer(fs_type), false)
            .await
            .unwrap();
        assert!(Path::new(&target).is_dir());
        publish(&svc, &id, &staging, &target, writer(fs_type), false)
            .await
            .unwrap();
        std::fs::write(format!("{target}/data"), "written through the target").unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{staging}/data")).unwrap(),
            "written through the target"
        );

        for _ in 0..2 {
            unpublish(&svc, &id, &target).await.unwrap();
            assert!(!is_mounted(&target));
            assert!(!exists(&target), "unpublish removes the target it created");
        }
        assert!(
            Path::new(&format!("{staging}/data")).exists(),
            "still staged"
        );
        for _ in 0..2 {
            unstage(&svc, &id, &staging).await.unwrap();
            assert!(!is_mounted(&staging));
        }

        // Staged again: the filesystem and its data are kept, not reformatted.
        stage(&svc, &id, &staging, writer(fs_type)).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{staging}/data")).unwrap(),
            "written through the target"
        );
        unstage(&svc, &id, &staging).await.unwrap();
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_publish_write_unpublish_unstage_ext4() {
        round_trip("ext4").await;
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_publish_write_unpublish_unstage_xfs() {
        round_trip("xfs").await;
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_without_fs_type_formats_ext4_and_keeps_an_existing_xfs() {
        let env = Env::new(1024);
        let (blank, xfs) = (env.volume("pvc-blank", 64), env.volume("pvc-xfs", XFS_MIB));
        sh(&format!("mkfs.xfs -q {}", env.device(&xfs)));
        let svc = env.service();
        let (s1, s2) = (env.staging("blank"), env.staging("xfs"));
        stage(&svc, &blank, &s1, writer("")).await.unwrap();
        assert_eq!(blkid_type(&env.device(&blank)), "ext4");
        stage(&svc, &xfs, &s2, writer("")).await.unwrap();
        assert_eq!(
            sh(&format!("findmnt -n -o FSTYPE --mountpoint {s2}")).trim(),
            "xfs"
        );
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_refuses_to_reformat_another_filesystem() {
        let env = Env::new(1024);
        let id = env.volume("pvc-x", XFS_MIB);
        let dev = env.device(&id);
        sh(&format!("mkfs.xfs -q {dev}"));
        let uuid = sh(&format!("blkid -p -o value -s UUID {dev}"));
        let svc = env.service();
        let staging = env.staging("x");
        let err = stage(&svc, &id, &staging, writer("ext4"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(
            err.message().contains("xfs") && err.message().contains("ext4"),
            "{}",
            err.message()
        );
        assert!(!is_mounted(&staging));
        assert_eq!(sh(&format!("blkid -p -o value -s UUID {dev}")), uuid);
    }

    /// Issue 35: a node plugin never mounts over what it did not put there. Stage onto a full
    /// directory, publish onto one, and block publish onto a file with content are refused naming
    /// the path, and nothing is formatted, mounted or changed.
    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_and_publish_refuse_a_target_that_is_not_empty_and_change_nothing() {
        let env = Env::new(1024);
        let id = env.volume("pvc-hide", XFS_MIB);
        let dev = env.device(&id);
        let svc = env.service();
        let full = |name: &str| {
            let p = env.staging(name);
            std::fs::write(format!("{p}/keep"), "theirs").unwrap();
            p
        };
        let kept = |p: &str| std::fs::read_to_string(format!("{p}/keep")).unwrap() == "theirs";

        let staging = full("full");
        let err = stage(&svc, &id, &staging, writer("ext4"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        assert!(err.message().contains(&staging), "{}", err.message());
        assert!(!is_mounted(&staging) && kept(&staging));
        assert_eq!(blkid_type(&dev), "", "the blank volume was not formatted");

        let good = env.staging("good");
        stage(&svc, &id, &good, writer("ext4")).await.unwrap();
        let target = full("target");
        let err = publish(&svc, &id, &good, &target, writer("ext4"), false)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        assert!(err.message().contains(&target), "{}", err.message());
        assert!(!is_mounted(&target) && kept(&target));
        unstage(&svc, &id, &good).await.unwrap();

        let file = env.target("block");
        std::fs::write(&file, "theirs").unwrap();
        let block_staging = env.staging("block");
        stage(&svc, &id, &block_staging, block_cap(Mode::SingleNodeWriter))
            .await
            .unwrap();
        let err = publish(
            &svc,
            &id,
            &block_staging,
            &file,
            block_cap(Mode::SingleNodeWriter),
            false,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        assert!(err.message().contains(&file), "{}", err.message());
        assert!(!is_mounted(&file));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "theirs");
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn readonly_publish_refuses_writes() {
        let env = Env::new(1024);
        let id = env.volume("pvc-ro", 64);
        let svc = env.service();
        let staging = env.staging("ro");
        stage(&svc, &id, &staging, writer("ext4")).await.unwrap();
        std::fs::write(format!("{staging}/seen"), "yes").unwrap();

        // By the readonly flag, and by a reader-only access mode.
        for (name, cap, readonly) in [
            ("flag", mount_cap("ext4", Mode::SingleNodeMultiWriter), true),
            ("mode", mount_cap("ext4", Mode::SingleNodeReaderOnly), false),
        ] {
            let target = env.target(name);
            publish(&svc, &id, &staging, &target, cap, readonly)
                .await
                .unwrap();
            assert_eq!(
                std::fs::read_to_string(format!("{target}/seen")).unwrap(),
                "yes"
            );
            let err = std::fs::write(format!("{target}/new"), "no").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(30), "EROFS expected: {err}");
        }
        // The staging mount stays writable.
        std::fs::write(format!("{staging}/still-rw"), "yes").unwrap();
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn block_publish_gives_a_block_device_file_of_the_right_size() {
        let env = Env::new(1024);
        let id = env.volume("pvc-blk", 64);
        let dev = env.device(&id);
        let svc = env.service();
        let staging = env.dir.path("block-staging");
        let target = env.target("blk");
        let cap = || block_cap(Mode::SingleNodeWriter);

        stage(&svc, &id, &staging, cap()).await.unwrap();
        assert!(!is_mounted(&staging));
        publish(&svc, &id, &staging, &target, cap(), false)
            .await
            .unwrap();
        publish(&svc, &id, &staging, &target, cap(), false)
            .await
            .unwrap();
        let ft = std::fs::metadata(&target).unwrap().file_type();
        assert!(ft.is_block_device(), "{ft:?}");
        assert_eq!(dev_size(&target), 64 * MIB);
        // Bytes written through the target land on the LV.
        sh(&format!(
            "printf 'through-target' | dd of={target} conv=fsync,notrunc status=none"
        ));
        assert_eq!(sh(&format!("head -c 14 {dev}")), "through-target");

        let st = stats(&svc, &id, &target).await.unwrap();
        assert_eq!(st.usage.len(), 1);
        assert_eq!(st.usage[0].unit, Unit::Bytes as i32);
        assert_eq!(st.usage[0].total, (64 * MIB) as i64);
        assert!(!st.volume_condition.unwrap().abnormal);
        // Block: nothing to grow, the size is the answer.
        assert_eq!(expand(&svc, &id, &target).await.unwrap(), (64 * MIB) as i64);

        // A filesystem publication asked at the same target: another capability.
        assert_eq!(
            code(publish(&svc, &id, &staging, &target, writer(""), false).await),
            Code::AlreadyExists
        );

        for _ in 0..2 {
            unpublish(&svc, &id, &target).await.unwrap();
            assert!(!exists(&target));
        }
        unstage(&svc, &id, &staging).await.unwrap();
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stats_report_bytes_and_inodes_of_the_mounted_filesystem() {
        let env = Env::new(1024);
        let id = env.volume("pvc-st", 128);
        let svc = env.service();
        let (staging, target) = (env.staging("st"), env.target("st"));
        stage(&svc, &id, &staging, writer("ext4")).await.unwrap();
        publish(&svc, &id, &staging, &target, writer("ext4"), false)
            .await
            .unwrap();

        let before = stats(&svc, &id, &target).await.unwrap();
        let (bytes, inodes) = (before.usage[0], before.usage[1]);
        assert_eq!(
            (bytes.unit, inodes.unit),
            (Unit::Bytes as i32, Unit::Inodes as i32)
        );
        assert!(
            bytes.total > (100 * MIB) as i64 && bytes.total <= (128 * MIB) as i64,
            "{bytes:?}"
        );
        assert!(bytes.available > 0 && bytes.available <= bytes.total);
        assert!(inodes.total > 0 && inodes.used > 0);
        let st = statvfs(&target).unwrap();
        assert_eq!(bytes.total, st.total_bytes as i64);
        let c = before.volume_condition.unwrap();
        assert!(!c.abnormal, "{c:?}");
        assert!(c.message.contains("healthy"), "{c:?}");

        sh(&format!(
            "dd if=/dev/zero of={target}/ten bs=1M count=10 conv=fsync status=none"
        ));
        let after = stats(&svc, &id, &target).await.unwrap();
        assert!(
            after.usage[0].used >= bytes.used + (10 * MIB) as i64,
            "{bytes:?} -> {:?}",
            after.usage[0]
        );
        assert_eq!(after.usage[1].used, inodes.used + 1);
        // The staging path is a place the volume is too.
        let at_staging = stats(&svc, &id, &staging).await.unwrap();
        assert_eq!(at_staging.usage[0].total, bytes.total);
        // A path that does not hold it is NOT_FOUND.
        let err = stats(&svc, &id, &env.dir.path("")).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound);
    }

    /// Stage and publish, `lvextend` the LV, then NodeExpandVolume at the target.
    async fn expand_online(fs_type: &str) {
        let env = Env::new(1024);
        let id = env.volume("pvc-grow", XFS_MIB);
        let dev = env.device(&id);
        let svc = env.service();
        let (staging, target) = (env.staging("g"), env.target("g"));
        stage(&svc, &id, &staging, writer(fs_type)).await.unwrap();
        publish(&svc, &id, &staging, &target, writer(fs_type), false)
            .await
            .unwrap();
        let small = statvfs(&target).unwrap().total_bytes;
        assert!(small < XFS_MIB * MIB);

        sh(&format!("lvm lvextend -q -L 512m {dev} 2>&1"));
        for _ in 0..2 {
            assert_eq!(
                expand(&svc, &id, &target).await.unwrap(),
                (512 * MIB) as i64
            );
        }
        let big = statvfs(&target).unwrap().total_bytes;
        // The device grew by 192 MiB (statvfs leaves out what the filesystem keeps for itself: new block
        // groups' metadata for ext4, the internal log for XFS).
        assert!(big >= small + 150 * MIB, "{fs_type}: {small} -> {big}");
        assert_eq!(statvfs(&staging).unwrap().total_bytes, big);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn node_expand_grows_a_mounted_ext4_after_lvextend() {
        expand_online("ext4").await;
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn node_expand_grows_a_mounted_xfs_after_lvextend() {
        expand_online("xfs").await;
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn stage_grows_a_filesystem_smaller_than_its_device() {
        // What a restore larger than its snapshot looks like: a filesystem, then a bigger device.
        let env = Env::new(2048);
        let svc = env.service();
        for fs_type in ["ext4", "xfs"] {
            let id = env.volume(&format!("pvc-restore-{fs_type}"), XFS_MIB);
            let dev = env.device(&id);
            sh(&format!("mkfs.{fs_type} -q {dev}"));
            sh(&format!("lvm lvextend -q -L 640m {dev} 2>&1"));
            let staging = env.staging(fs_type);
            stage(&svc, &id, &staging, writer(fs_type)).await.unwrap();
            // Not grown, the filesystem would stay under the 320 MiB it was made with.
            let total = statvfs(&staging).unwrap().total_bytes;
            assert!(total > 500 * MIB, "{fs_type}: {total}");
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn publish_table_codes_against_real_mounts() {
        let env = Env::new(1024);
        let id = env.volume("pvc-table", 64);
        let other = env.volume("pvc-other", 64);
        let svc = env.service();
        let staging = env.staging("t");
        let [t1, t2, t3, t4] = ["t1", "t2", "t3", "t4"].map(|n| env.target(n));
        let snw = || writer("ext4");

        // Not staged yet.
        assert_eq!(
            code(publish(&svc, &id, &staging, &t1, snw(), false).await),
            Code::FailedPrecondition
        );
        stage(&svc, &id, &staging, snw()).await.unwrap();
        // Staging: same volume again OK; asked another filesystem, or another volume at the path.
        stage(&svc, &id, &staging, snw()).await.unwrap();
        assert_eq!(
            code(stage(&svc, &id, &staging, writer("xfs")).await),
            Code::AlreadyExists
        );
        assert_eq!(
            code(stage(&svc, &other, &staging, snw()).await),
            Code::AlreadyExists
        );

        publish(&svc, &id, &staging, &t1, snw(), false)
            .await
            .unwrap();
        // Same target, same arguments: OK; different arguments: ALREADY_EXISTS.
        publish(&svc, &id, &staging, &t1, snw(), false)
            .await
            .unwrap();
        assert_eq!(
            code(publish(&svc, &id, &staging, &t1, snw(), true).await),
            Code::AlreadyExists
        );
        assert_eq!(
            code(
                publish(
                    &svc,
                    &id,
                    &staging,
                    &t1,
                    block_cap(Mode::SingleNodeWriter),
                    false
                )
                .await
            ),
            Code::AlreadyExists
        );
        // Another target: refused for the single-publication modes, allowed for the others.
        assert_eq!(
            code(publish(&svc, &id, &staging, &t2, snw(), false).await),
            Code::FailedPrecondition
        );
        assert_eq!(
            code(
                publish(
                    &svc,
                    &id,
                    &staging,
                    &t2,
                    mount_cap("ext4", Mode::SingleNodeSingleWriter),
                    false
                )
                .await
            ),
            Code::FailedPrecondition
        );
        assert!(!exists(&t2), "a refused publish leaves nothing behind");
        publish(
            &svc,
            &id,
            &staging,
            &t2,
            mount_cap("ext4", Mode::SingleNodeMultiWriter),
            false,
        )
        .await
        .unwrap();
        publish(
            &svc,
            &id,
            &staging,
            &t3,
            mount_cap("ext4", Mode::SingleNodeReaderOnly),
            false,
        )
        .await
        .unwrap();
        // Another volume's target is not ours to publish over.
        stage(&svc, &other, &env.staging("o"), snw()).await.unwrap();
        assert_eq!(
            code(publish(&svc, &other, &env.staging("o"), &t1, snw(), false).await),
            Code::AlreadyExists
        );
        // Unpublishing another volume's target leaves it alone.
        assert_eq!(
            code(unpublish(&svc, &other, &t1).await),
            Code::FailedPrecondition
        );
        assert!(is_mounted(&t1));

        // With t1 alone left, a SINGLE_NODE_WRITER publication elsewhere is still refused; gone, allowed.
        unpublish(&svc, &id, &t2).await.unwrap();
        unpublish(&svc, &id, &t3).await.unwrap();
        assert_eq!(
            code(publish(&svc, &id, &staging, &t4, snw(), false).await),
            Code::FailedPrecondition
        );
        unpublish(&svc, &id, &t1).await.unwrap();
        publish(&svc, &id, &staging, &t4, snw(), false)
            .await
            .unwrap();
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_new_service_sees_the_mounts_the_old_one_left() {
        let env = Env::new(1024);
        let id = env.volume("pvc-restart", 64);
        let (staging, t1, t2) = (env.staging("r"), env.target("r1"), env.target("r2"));
        {
            let before = env.service();
            stage(&before, &id, &staging, writer("ext4")).await.unwrap();
            publish(&before, &id, &staging, &t1, writer("ext4"), false)
                .await
                .unwrap();
            std::fs::write(format!("{t1}/data"), "before the restart").unwrap();
        }
        let svc = env.service();
        stage(&svc, &id, &staging, writer("ext4")).await.unwrap();
        publish(&svc, &id, &staging, &t1, writer("ext4"), false)
            .await
            .unwrap();
        assert_eq!(
            code(publish(&svc, &id, &staging, &t1, writer("ext4"), true).await),
            Code::AlreadyExists
        );
        assert_eq!(
            code(publish(&svc, &id, &staging, &t2, writer("ext4"), false).await),
            Code::FailedPrecondition
        );
        assert!(stats(&svc, &id, &t1).await.unwrap().usage[0].used > 0);
        unpublish(&svc, &id, &t1).await.unwrap();
        unstage(&svc, &id, &staging).await.unwrap();
        assert!(!is_mounted(&t1) && !is_mounted(&staging));
        // The data is on the volume.
        stage(&svc, &id, &staging, writer("ext4")).await.unwrap();
        assert_eq!(
            std::fs::read_to_string(format!("{staging}/data")).unwrap(),
            "before the restart"
        );
    }
}
