//! The host layer against this machine's real tools, on loop devices backed by files in a temp dir.
//! Needs root, `losetup`, util-linux, xfsprogs, e2fsprogs and lvm2; does NOT need device-mapper (no LV is
//! created), so it also runs on a development machine as root; the VM suite runs it with the others:
//!
//! ```text
//! cargo xtask vm-test        # in the VM, with every vm_* test
//! cargo test -p lvms-host --test vm_host_tools -- --ignored --test-threads=1   # here, as root
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, process::Command as StdCommand};

use lvms_core::config::Fstype;
use lvms_host::{
    Error,
    devices::Devices,
    fs::{Filesystems, statvfs},
    lvm::Lvm,
    runner::RealRunner,
};

/// A loop device over a sparse file, detached on drop.
struct LoopDisk {
    dev: String,
    file: std::path::PathBuf,
}

impl LoopDisk {
    fn new(dir: &Path, name: &str, size_mib: u64) -> Self {
        let file = dir.join(name);
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(size_mib << 20).unwrap();
        let out = StdCommand::new("losetup")
            .args(["-f", "--show"])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        Self { dev, file }
    }

    /// Grows the backing file and tells the kernel (`losetup -c`).
    fn grow(&self, size_mib: u64) {
        std::fs::OpenOptions::new()
            .write(true)
            .open(&self.file)
            .unwrap()
            .set_len(size_mib << 20)
            .unwrap();
        assert!(
            StdCommand::new("losetup")
                .args(["-c", &self.dev])
                .status()
                .unwrap()
                .success()
        );
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = StdCommand::new("umount").arg(&self.dev).output();
        let _ = StdCommand::new("losetup").args(["-d", &self.dev]).output();
    }
}

#[tokio::test]
#[ignore = "needs root and loop devices"]
async fn filesystem_lifecycle_on_a_loop_device() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDisk::new(tmp.path(), "fs.img", 320);
    let fs = Filesystems::new(RealRunner);
    let mnt = tmp.path().join("mnt with space");
    let bind = tmp.path().join("bind");
    std::fs::create_dir_all(&mnt).unwrap();
    std::fs::create_dir_all(&bind).unwrap();
    let (mnt, bind) = (mnt.to_str().unwrap(), bind.to_str().unwrap());

    assert_eq!(fs.detect_fs(&disk.dev).await.unwrap(), None);
    fs.mkfs(&disk.dev, Fstype::Xfs).await.unwrap();
    assert_eq!(
        fs.detect_fs(&disk.dev).await.unwrap().as_deref(),
        Some("xfs")
    );
    assert!(matches!(
        fs.mkfs(&disk.dev, Fstype::Ext4).await,
        Err(Error::SignatureExists { .. })
    ));

    fs.mount(&disk.dev, mnt, Fstype::Xfs, &["noatime".to_owned()], false)
        .await
        .unwrap();
    fs.mount(&disk.dev, mnt, Fstype::Xfs, &[], false)
        .await
        .unwrap();
    let m = fs.find_mount_by_target(mnt).await.unwrap().unwrap();
    assert_eq!(m.fs_type, "xfs");
    assert!(m.mount_options.contains(&"noatime".to_owned()));
    let before = statvfs(mnt).unwrap();
    assert!(before.total_bytes > 200 << 20);

    fs.bind_mount(mnt, bind, true).await.unwrap();
    fs.bind_mount(mnt, bind, true).await.unwrap();
    assert!(
        fs.find_mount_by_target(bind)
            .await
            .unwrap()
            .unwrap()
            .read_only()
    );
    assert!(
        std::fs::write(Path::new(bind).join("x"), "x").is_err(),
        "bind is read-only"
    );
    std::fs::write(Path::new(mnt).join("x"), "x").unwrap();

    disk.grow(640);
    fs.grow(&disk.dev, mnt, Fstype::Xfs).await.unwrap();
    fs.grow(&disk.dev, mnt, Fstype::Xfs).await.unwrap();
    assert!(statvfs(mnt).unwrap().total_bytes > before.total_bytes + (250 << 20));

    fs.unmount(bind).await.unwrap();
    fs.unmount(bind).await.unwrap();
    fs.unmount(mnt).await.unwrap();
    assert!(fs.find_mount_by_target(mnt).await.unwrap().is_none());

    let devices = Devices::new(RealRunner);
    devices.wipe(&disk.dev).await.unwrap();
    assert_eq!(devices.probe_signature(&disk.dev).await.unwrap(), None);
}

#[tokio::test]
#[ignore = "needs root and loop devices"]
async fn ext4_grows_through_its_device() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDisk::new(tmp.path(), "ext4.img", 64);
    let fs = Filesystems::new(RealRunner);
    let mnt = tmp.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mnt = mnt.to_str().unwrap();
    fs.mkfs(&disk.dev, Fstype::Ext4).await.unwrap();
    fs.mount(&disk.dev, mnt, Fstype::Ext4, &[], false)
        .await
        .unwrap();
    let before = statvfs(mnt).unwrap().total_bytes;
    disk.grow(128);
    match fs.grow(&disk.dev, mnt, Fstype::Ext4).await {
        Ok(()) => assert!(statvfs(mnt).unwrap().total_bytes > before + (50 << 20)),
        // Online ext4 resize needs CAP_SYS_RESOURCE, which some sandboxes drop even for root.
        Err(Error::CommandFailed { stderr, .. })
            if stderr.contains("Permission denied to resize filesystem") =>
        {
            eprintln!("skipping the online ext4 grow check: no CAP_SYS_RESOURCE here");
        }
        Err(e) => panic!("{e}"),
    }
    assert!(matches!(
        fs.mount(&disk.dev, mnt, Fstype::Ext4, &[], true).await,
        Err(Error::AlreadyExists(_))
    ));
    fs.unmount(mnt).await.unwrap();
}

#[tokio::test]
#[ignore = "needs root and loop devices"]
async fn discovery_sees_a_loop_device_its_file_and_its_partitions() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDisk::new(tmp.path(), "parted.img", 64);
    let mut sfdisk = StdCommand::new("sfdisk")
        .args(["-q", &disk.dev])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        sfdisk
            .stdin
            .take()
            .unwrap()
            .write_all(b"label: gpt\n,16M,,\n,,\n")
            .unwrap();
    }
    assert!(sfdisk.wait().unwrap().success());
    // Without udev (and where the kernel re-read failed) partitions show up only after partx.
    let _ = StdCommand::new("partx").args(["-a", &disk.dev]).output();

    let devices = Devices::new(RealRunner);
    let all = devices.discover().await.unwrap();
    let dev = all
        .iter()
        .find(|d| d.path == disk.dev)
        .expect("loop device listed");
    assert_eq!(dev.fstype.as_deref(), Some("gpt"));
    assert_eq!(
        dev.loop_backing_file.as_deref(),
        Some(disk.file.to_str().unwrap())
    );
    assert_eq!(dev.children.len(), 2, "{:?}", dev.children);

    devices.wipe(&disk.dev).await.unwrap();
    assert_eq!(devices.probe_signature(&disk.dev).await.unwrap(), None);
}

#[tokio::test]
#[ignore = "needs root and loop devices"]
async fn lvm_physical_volume_and_volume_group_lifecycle() {
    let tmp = tempfile::tempdir().unwrap();
    let a = LoopDisk::new(tmp.path(), "a.img", 64);
    let b = LoopDisk::new(tmp.path(), "b.img", 64);
    let lvm = Lvm::new(RealRunner);
    let vg = format!("lvms-test-{}", std::process::id());

    lvm.pv_create(&a.dev, Some(1 << 20)).await.unwrap();
    lvm.pv_create(&a.dev, Some(1 << 20)).await.unwrap();
    assert!(
        lvm.pvs()
            .await
            .unwrap()
            .iter()
            .any(|pv| pv.name == a.dev && pv.vg_name.is_none())
    );

    lvm.vg_create(&vg, std::slice::from_ref(&a.dev), &["lvms".to_owned()])
        .await
        .unwrap();
    lvm.vg_create(&vg, std::slice::from_ref(&a.dev), &["lvms".to_owned()])
        .await
        .unwrap();
    let got = lvm.vg(&vg).await.unwrap().unwrap();
    assert_eq!(got.tags, ["lvms"]);
    assert_eq!(got.pv_count, 1);
    assert!(matches!(
        lvm.vg_create(&vg, std::slice::from_ref(&b.dev), &[]).await,
        Err(Error::AlreadyExists(_))
    ));

    lvm.pv_create(&b.dev, None).await.unwrap();
    lvm.vg_extend(&vg, &[a.dev.clone(), b.dev.clone()])
        .await
        .unwrap();
    lvm.vg_extend(&vg, std::slice::from_ref(&b.dev))
        .await
        .unwrap();
    assert_eq!(lvm.vg(&vg).await.unwrap().unwrap().pv_count, 2);
    lvm.vg_add_tag(&vg, "extra").await.unwrap();
    lvm.vg_del_tag(&vg, "extra").await.unwrap();
    assert!(lvm.lvs(Some(&vg)).await.unwrap().is_empty());
    assert_eq!(lvm.lv(&vg, "nosuch").await.unwrap(), None);
    lvm.lv_remove(&vg, "nosuch").await.unwrap();

    lvm.vg_reduce(&vg, std::slice::from_ref(&b.dev))
        .await
        .unwrap();
    lvm.vg_reduce(&vg, std::slice::from_ref(&b.dev))
        .await
        .unwrap();
    assert_eq!(lvm.vg(&vg).await.unwrap().unwrap().pv_count, 1);

    lvm.vg_remove(&vg).await.unwrap();
    lvm.vg_remove(&vg).await.unwrap();
    assert_eq!(lvm.vg(&vg).await.unwrap(), None);
    lvm.pv_remove(&a.dev).await.unwrap();
    lvm.pv_remove(&a.dev).await.unwrap();
    lvm.pv_remove(&b.dev).await.unwrap();
    assert!(
        !lvm.pvs()
            .await
            .unwrap()
            .iter()
            .any(|pv| pv.name == a.dev || pv.name == b.dev)
    );
}

#[tokio::test]
#[ignore = "needs root and loop devices"]
async fn pv_create_refuses_a_device_with_a_filesystem() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = LoopDisk::new(tmp.path(), "sig.img", 64);
    Filesystems::new(RealRunner)
        .mkfs(&disk.dev, Fstype::Ext4)
        .await
        .unwrap();
    let err = Lvm::new(RealRunner)
        .pv_create(&disk.dev, None)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::SignatureExists { signature, .. } if signature == "ext4"),
        "{err:?}"
    );
}
