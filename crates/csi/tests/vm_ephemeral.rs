//! CSI inline ephemeral volumes against real LVM, mkfs and mount inside the test VM (ADR 0021): the
//! Node service over a real [`LocalBackend`] makes the LV at `NodePublishVolume` (tagged with its
//! pod), formats and mounts it where a workload writes; a repeated publish makes nothing new;
//! `NodeUnpublishVolume` unmounts and removes it, also from a restarted service, and again.
//!
//! Run with `cargo xtask vm-test vm_ephemeral`; on the host every test shows as ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

/// Named so that `cargo xtask vm-test vm_ephemeral` selects these tests.
mod vm_ephemeral {
    use std::{collections::HashMap, sync::Arc};

    use lvms_csi::{
        csi::{
            NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability,
            node_server::Node,
            volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode},
        },
        node::{NodeOptions, NodeService},
    };
    use lvms_engine::{backend::DeviceClassConfig, ids, local::LocalBackend};
    use lvms_host::{fs::Filesystems, lvm::Lvm, runner::RealRunner, shell::LvmShell};
    use lvms_testkit::{Scratch, lvs_field, sh, sh_status, unique};
    use tonic::{Code, Request, Status};

    type Svc = NodeService<LocalBackend<LvmShell>, RealRunner>;

    struct Env {
        /// Dropped first: unmounts what a test left before the volume group goes.
        dir: String,
        vg: String,
        _s: Scratch,
    }

    impl Env {
        fn new() -> Self {
            let mut s = Scratch::new(1, 512);
            let vg = s.vg_name();
            sh(&format!("lvm vgcreate -q {vg} {} 2>&1", s.disks[0]));
            let dir = format!("/run/lvms-mnt/{}", unique("e"));
            std::fs::create_dir_all(&dir).unwrap();
            Self { dir, vg, _s: s }
        }

        /// A fresh Node service over a fresh backend, as after a restart of the driver.
        fn service(&self) -> Svc {
            let class = DeviceClassConfig::named(&self.vg).as_default();
            let backend = LocalBackend::new("vm-node", vec![class], Lvm::new(LvmShell::new()));
            NodeService::new(
                Arc::new(backend),
                Filesystems::new(RealRunner),
                NodeOptions::default(),
            )
        }

        /// A target path (not created: publish creates it), its parent created as kubelet does.
        fn target(&self, pod: &str) -> String {
            let parent = format!("{}/pods/{pod}", self.dir);
            std::fs::create_dir_all(&parent).unwrap();
            format!("{parent}/mount")
        }
    }

    impl Drop for Env {
        fn drop(&mut self) {
            let p = &self.dir;
            let _ = sh_status(&format!(
                "for m in $(awk 'index($5, \"{p}/\") == 1 {{print $5}}' /proc/self/mountinfo | sort -r); do umount -l $m; done; rm -rf {p}"
            ));
        }
    }

    fn writer(fs_type: &str) -> Option<VolumeCapability> {
        Some(VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs_type.to_owned(),
                mount_flags: vec![],
                volume_mount_group: String::new(),
            })),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        })
    }

    /// The volume context kubelet sends for an inline volume of pod `pod` with `attrs`.
    fn context(pod: &str, attrs: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = attrs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (k, v) in [
            ("csi.storage.k8s.io/ephemeral", "true"),
            ("csi.storage.k8s.io/pod.uid", &format!("uid-{pod}")),
            ("csi.storage.k8s.io/pod.namespace", "default"),
            ("csi.storage.k8s.io/pod.name", pod),
        ] {
            m.insert(k.to_owned(), v.to_owned());
        }
        m
    }

    async fn publish(
        svc: &Svc,
        id: &str,
        target: &str,
        ctx: HashMap<String, String>,
    ) -> Result<(), Status> {
        svc.node_publish_volume(Request::new(NodePublishVolumeRequest {
            volume_id: id.to_owned(),
            target_path: target.to_owned(),
            volume_capability: writer(""),
            volume_context: ctx,
            ..Default::default()
        }))
        .await
        .map(drop)
    }

    async fn unpublish(svc: &Svc, id: &str, target: &str) -> Result<(), Status> {
        svc.node_unpublish_volume(Request::new(NodeUnpublishVolumeRequest {
            volume_id: id.to_owned(),
            target_path: target.to_owned(),
        }))
        .await
        .map(drop)
    }

    /// The CO's id of an inline volume, shaped as kubelet makes them (`csi-` and 64 hex digits).
    fn kubelet_id() -> String {
        let digits: String = unique("").chars().filter(char::is_ascii_digit).collect();
        format!("csi-{digits:0>64}")
    }

    fn lvs_in(vg: &str) -> Vec<String> {
        sh(&format!("lvm lvs --noheadings -o lv_name {vg}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    fn mounted_source(path: &str) -> String {
        sh_status(&format!("findmnt -n -o SOURCE --mountpoint {path}"))
            .1
            .trim()
            .to_owned()
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn publish_makes_a_tagged_mounted_writable_lv_once_and_unpublish_removes_it() {
        let env = Env::new();
        let svc = env.service();
        let id = kubelet_id();
        let lv = ids::volume_lv_name(&id);
        let target = env.target("app");
        let ctx = context("app", &[("size", "64Mi"), ("type", "linear")]);

        publish(&svc, &id, &target, ctx.clone()).await.unwrap();
        assert_eq!(lvs_in(&env.vg), std::slice::from_ref(&lv));
        let tags = lvs_field(&env.vg, &lv, "lv_tags");
        for want in [
            "lvms.ephemeral",
            "lvms.pod-uid=uid-app",
            "lvms.pod-ns=default",
            "lvms.pod-name=app",
        ] {
            assert!(tags.split(',').any(|t| t == want), "{want} in {tags}");
        }
        assert_eq!(
            lvs_field(&env.vg, &lv, "lv_size").trim(),
            (64u64 << 20).to_string()
        );
        assert!(!mounted_source(&target).is_empty(), "mounted at {target}");
        assert_eq!(
            sh(&format!("findmnt -n -o FSTYPE --mountpoint {target}")).trim(),
            "ext4"
        );
        std::fs::write(format!("{target}/data"), b"hello").unwrap();

        // Again, as kubelet retries: the same LV, still mounted once, the data still there.
        publish(&svc, &id, &target, ctx).await.unwrap();
        assert_eq!(lvs_in(&env.vg), std::slice::from_ref(&lv));
        assert_eq!(
            sh(&format!(
                "findmnt -n -o SOURCE --mountpoint {target} | wc -l"
            ))
            .trim(),
            "1"
        );
        assert_eq!(std::fs::read(format!("{target}/data")).unwrap(), b"hello");

        unpublish(&svc, &id, &target).await.unwrap();
        assert!(lvs_in(&env.vg).is_empty(), "the LV is gone");
        assert!(mounted_source(&target).is_empty());
        assert!(!std::path::Path::new(&target).exists());
        unpublish(&svc, &id, &target).await.unwrap();
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_restarted_service_unpublishes_and_removes_what_an_earlier_one_published() {
        let env = Env::new();
        let id = kubelet_id();
        let target = env.target("restart");
        {
            let svc = env.service();
            publish(&svc, &id, &target, context("restart", &[("size", "320Mi")]))
                .await
                .unwrap();
            std::fs::write(format!("{target}/data"), b"x").unwrap();
        }
        let svc = env.service();
        unpublish(&svc, &id, &target).await.unwrap();
        assert!(lvs_in(&env.vg).is_empty(), "the LV is gone");
        assert!(!std::path::Path::new(&target).exists());
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn bad_attributes_make_nothing() {
        let env = Env::new();
        let svc = env.service();
        let target = env.target("bad");
        for (k, v) in [
            ("size", "lots"),
            ("type", "raid7"),
            ("topolvm.io/device-class", "nope"),
        ] {
            let err = publish(&svc, &kubelet_id(), &target, context("bad", &[(k, v)]))
                .await
                .unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{k}: {}", err.message());
            assert!(err.message().contains(k), "{k}: {}", err.message());
        }
        assert!(lvs_in(&env.vg).is_empty());
    }

    /// Issue 35: an inline volume published at `/etc`-like directory was made and mounted over it.
    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn publish_over_a_directory_that_is_not_empty_makes_nothing_and_hides_nothing() {
        let env = Env::new();
        let svc = env.service();
        let target = env.target("etc");
        std::fs::create_dir_all(&target).unwrap();
        std::fs::write(format!("{target}/passwd"), "root:x:0:0\n").unwrap();
        let err = publish(&svc, &kubelet_id(), &target, context("etc", &[]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{}", err.message());
        assert!(err.message().contains(&target), "{}", err.message());
        assert!(lvs_in(&env.vg).is_empty(), "no volume was made");
        assert_eq!(mounted_source(&target), "", "nothing mounted over it");
        assert_eq!(
            std::fs::read_to_string(format!("{target}/passwd")).unwrap(),
            "root:x:0:0\n"
        );
    }
}
