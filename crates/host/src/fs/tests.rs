use super::*;
use crate::fake::FakeRunner;

const MOUNTINFO: &str = include_str!("../../tests/fixtures/mountinfo/host.txt");
const BLKID_XFS: &str = include_str!("../../tests/fixtures/blkid/loop4.export");

/// Lines as the kernel writes them for awkward paths, with propagation fields and stacked mounts.
const MOUNTINFO_ESCAPES: &str = "\
25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 25 253:3 / /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pvc-1/mount rw,relatime shared:5 master:2 - xfs /dev/mapper/vg-pvc--1 rw,attr2,nouuid
31 25 0:40 / /mnt/tab\\011and\\012newline\\134back rw - tmpfs tmpfs rw
32 25 253:4 / /mnt/stacked rw - ext4 /dev/mapper/vg-a rw
33 32 253:5 / /mnt/stacked ro - ext4 /dev/mapper/vg-b ro
34 25 0:41 / /mnt/no-super-options rw - tmpfs tmpfs
garbage line
35 25 x:y / /bad rw - tmpfs tmpfs rw
";

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

fn blkid(dev: &str) -> Vec<&str> {
    vec!["blkid", "-p", "-o", "export", dev]
}

/// A `Filesystems` over a fake runner reading `mountinfo` from a temp procfs.
fn setup(mountinfo: &str) -> (FakeRunner, Filesystems<FakeRunner>, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("self")).unwrap();
    std::fs::write(tmp.path().join("self/mountinfo"), mountinfo).unwrap();
    let fake = FakeRunner::new();
    let fs = Filesystems::new(fake.clone()).with_proc_root(tmp.path());
    (fake, fs, tmp)
}

// ---- mountinfo ----

#[test]
fn mountinfo_from_this_host_parses_every_line() {
    let mounts = parse_mountinfo(MOUNTINFO);
    assert_eq!(mounts.len(), MOUNTINFO.lines().count());
    let root = find_mount_by_target(&mounts, "/").unwrap();
    assert_eq!((root.major, root.minor), (254, 0));
    assert_eq!(root.fs_type, "ext4");
    assert_eq!(root.source, "/dev/vda");
    assert!(root.super_options.contains(&"discard".to_owned()));
}

#[test]
fn mountinfo_from_the_vm_parses() {
    let mounts = parse_mountinfo(include_str!("../../tests/fixtures/real/mountinfo.txt"));
    assert_eq!(mounts.len(), 6);
    let root = find_mount_by_target(&mounts, "/").unwrap();
    assert_eq!(root.fs_type, "9p");
    assert_eq!(root.source, "hostroot");
}

#[test]
fn mountinfo_decodes_a_space_in_a_mount_point() {
    let mounts = parse_mountinfo(MOUNTINFO);
    let m = find_mount_by_target(&mounts, "/tmp/lvmcap/mnt with space").unwrap();
    assert_eq!(m.fs_type, "xfs");
    assert_eq!(m.source, "/dev/loop4");
    assert_eq!((m.major, m.minor), (7, 4));
    assert!(!m.read_only());
}

#[test]
fn mountinfo_shows_a_read_only_bind_of_a_subdirectory() {
    let mounts = parse_mountinfo(MOUNTINFO);
    let bind = find_mount_by_target(&mounts, "/tmp/lvmcap/bindtarget").unwrap();
    assert_eq!(bind.root, "/sub");
    assert!(bind.read_only());
    assert_eq!(bind.source, "/dev/loop4");
    assert!(
        bind.super_options.contains(&"rw".to_owned()),
        "superblock stays rw"
    );
    let ro = find_mount_by_target(&mounts, "/tmp/lvmcap/mnt5").unwrap();
    assert!(ro.read_only());
}

#[test]
fn mountinfo_decodes_tab_newline_and_backslash_and_keeps_propagation_fields() {
    let mounts = parse_mountinfo(MOUNTINFO_ESCAPES);
    assert_eq!(
        mounts.len(),
        6,
        "garbage and bad device numbers are skipped"
    );
    assert_eq!(mounts[2].mount_point, "/mnt/tab\tand\nnewline\\back");
    assert_eq!(mounts[1].optional_fields, ["shared:5", "master:2"]);
    assert_eq!(mounts[1].source, "/dev/mapper/vg-pvc--1");
    assert!(mounts[5].super_options.is_empty());
}

#[test]
fn find_mount_by_target_takes_the_top_of_a_stack_and_ignores_a_trailing_slash() {
    let mounts = parse_mountinfo(MOUNTINFO_ESCAPES);
    let top = find_mount_by_target(&mounts, "/mnt/stacked/").unwrap();
    assert_eq!(top.source, "/dev/mapper/vg-b");
    assert!(find_mount_by_target(&mounts, "/mnt").is_none());
}

#[test]
fn unescape_leaves_incomplete_escapes_alone() {
    assert_eq!(unescape(r"a\04"), r"a\04");
    assert_eq!(unescape(r"a\9999"), r"a\9999");
    assert_eq!(unescape(r"\040"), " ");
}

#[tokio::test]
async fn mounts_reads_the_injected_procfs() {
    let (_fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    assert_eq!(fs.mounts().await.unwrap().len(), 6);
    let m = fs
        .find_mount_by_target("/mnt/stacked")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.mount_id, 33);
}

// ---- statvfs ----

#[test]
fn statvfs_of_a_directory_adds_up() {
    let tmp = tempfile::tempdir().unwrap();
    let st = statvfs(tmp.path()).unwrap();
    assert!(st.total_bytes > 0);
    assert!(st.available_bytes <= st.total_bytes);
    assert!(st.used_bytes <= st.total_bytes);
    assert_eq!(st.used_inodes, st.total_inodes - st.free_inodes);
}

#[test]
fn statvfs_of_a_missing_path_is_an_io_error_naming_it() {
    let err = statvfs("/lvms-no-such-dir").unwrap_err();
    assert!(
        matches!(err, Error::Io { ref path, .. } if path == "/lvms-no-such-dir"),
        "{err:?}"
    );
}

// ---- mkfs, grow ----

#[tokio::test]
async fn mkfs_on_a_blank_device_runs_quietly_without_force() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&blkid("/dev/vg1/lv1")).fails(2, "");
    fake.expect(&["mkfs.xfs", "-q", "/dev/vg1/lv1"]).succeeds();
    fake.expect(&blkid("/dev/vg1/lv2")).fails(2, "");
    fake.expect(&["mkfs.ext4", "-q", "/dev/vg1/lv2"]).succeeds();
    fs.mkfs("/dev/vg1/lv1", Fstype::Xfs).await.unwrap();
    fs.mkfs("/dev/vg1/lv2", Fstype::Ext4).await.unwrap();
    fake.assert_done();
    assert_eq!(fake.calls()[1].timeout, MKFS_TIMEOUT);
}

#[tokio::test]
async fn mkfs_refuses_a_device_with_a_signature() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&blkid("/dev/vg1/lv1")).stdout(BLKID_XFS);
    let err = fs.mkfs("/dev/vg1/lv1", Fstype::Ext4).await.unwrap_err();
    assert!(
        matches!(&err, Error::SignatureExists { device, signature } if device == "/dev/vg1/lv1" && signature == "xfs"),
        "{err:?}"
    );
    fake.assert_done();
}

#[tokio::test]
async fn detect_fs_reports_the_probe() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&blkid("/dev/vg1/lv1")).stdout(BLKID_XFS);
    fake.expect(&blkid("/dev/vg1/lv2")).fails(2, "");
    assert_eq!(
        fs.detect_fs("/dev/vg1/lv1").await.unwrap().as_deref(),
        Some("xfs")
    );
    assert_eq!(fs.detect_fs("/dev/vg1/lv2").await.unwrap(), None);
}

#[tokio::test]
async fn grow_uses_the_mount_point_for_xfs_and_the_device_for_ext4() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&["xfs_growfs", "/mnt/a"]).succeeds();
    fake.expect(&["resize2fs", "/dev/vg1/lv2"]).succeeds();
    fs.grow("/dev/vg1/lv1", "/mnt/a", Fstype::Xfs)
        .await
        .unwrap();
    fs.grow("/dev/vg1/lv2", "/mnt/b", Fstype::Ext4)
        .await
        .unwrap();
    fake.assert_done();
}

// ---- mount ----

#[tokio::test]
async fn mount_passes_type_options_ro_and_nouuid_for_xfs() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    fake.expect(&[
        "mount",
        "-t",
        "xfs",
        "-o",
        "noatime,ro,nouuid",
        "/dev/vg1/lv1",
        "/mnt/a",
    ])
    .succeeds();
    fake.expect(&["mount", "-t", "ext4", "/dev/vg1/lv2", "/mnt/b"])
        .succeeds();
    fake.expect(&[
        "mount",
        "-t",
        "xfs",
        "-o",
        "nouuid",
        "/dev/vg1/lv3",
        "/mnt/c",
    ])
    .succeeds();
    fs.mount(
        "/dev/vg1/lv1",
        "/mnt/a",
        Fstype::Xfs,
        &s(&["noatime"]),
        true,
    )
    .await
    .unwrap();
    fs.mount("/dev/vg1/lv2", "/mnt/b", Fstype::Ext4, &[], false)
        .await
        .unwrap();
    fs.mount(
        "/dev/vg1/lv3",
        "/mnt/c",
        Fstype::Xfs,
        &s(&["nouuid"]),
        false,
    )
    .await
    .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn mount_of_the_same_device_again_does_nothing() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    let target = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pvc-1/mount";
    fs.mount("/dev/mapper/vg-pvc--1", target, Fstype::Xfs, &[], false)
        .await
        .unwrap();
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn mount_over_another_device_or_mode_is_already_exists() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    let err = fs
        .mount(
            "/dev/mapper/vg-other",
            "/mnt/stacked",
            Fstype::Ext4,
            &[],
            true,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists(ref m) if m.contains("vg-b")),
        "{err:?}"
    );
    let err = fs
        .mount("/dev/mapper/vg-b", "/mnt/stacked", Fstype::Ext4, &[], false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists(ref m) if m.contains("read-only")),
        "{err:?}"
    );
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn mount_rejects_relative_targets_and_odd_options() {
    let (fake, fs, _tmp) = setup("");
    assert!(
        fs.mount("/dev/vg1/lv1", "mnt", Fstype::Xfs, &[], false)
            .await
            .is_err()
    );
    assert!(
        fs.mount("/dev/vg1/lv1", "/mnt", Fstype::Xfs, &s(&["a b"]), false)
            .await
            .is_err()
    );
    assert!(
        fs.mount("/dev/vg1/lv1", "/mnt", Fstype::Xfs, &s(&[""]), false)
            .await
            .is_err()
    );
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn mount_failure_keeps_the_whole_stderr() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&["mount", "-t", "ext4", "/dev/vg1/lv1", "/mnt/a"]).fails(
        32,
        "mount: /mnt/a: wrong fs type, bad option, bad superblock on /dev/vg1/lv1, missing codepage or helper program, or other error.\n",
    );
    let err = fs
        .mount("/dev/vg1/lv1", "/mnt/a", Fstype::Ext4, &[], false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::CommandFailed { code: Some(32), .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("bad superblock"), "{err}");
}

// ---- bind mounts ----

#[tokio::test]
async fn bind_mount_read_only_binds_then_remounts() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&["mount", "--bind", "/staging/pvc-1", "/pods/p/mount"])
        .succeeds();
    fake.expect(&["mount", "-o", "remount,bind,ro", "/pods/p/mount"])
        .succeeds();
    fake.expect(&["mount", "--bind", "/dev/vg1/lv1", "/pods/p/block"])
        .succeeds();
    fs.bind_mount("/staging/pvc-1", "/pods/p/mount", true)
        .await
        .unwrap();
    fs.bind_mount("/dev/vg1/lv1", "/pods/p/block", false)
        .await
        .unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn bind_mount_undoes_the_bind_when_remount_read_only_fails() {
    let (fake, fs, _tmp) = setup("");
    fake.expect(&["mount", "--bind", "/staging/pvc-1", "/pods/p/mount"])
        .succeeds();
    fake.expect(&["mount", "-o", "remount,bind,ro", "/pods/p/mount"])
        .fails(32, "mount: /pods/p/mount: permission denied.\n");
    fake.expect(&["umount", "/pods/p/mount"]).succeeds();
    let err = fs
        .bind_mount("/staging/pvc-1", "/pods/p/mount", true)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("permission denied"), "{err}");
    fake.assert_done();
}

#[tokio::test]
async fn bind_mount_over_something_else_is_already_exists() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    let err = fs
        .bind_mount("/lvms-no-such-src", "/mnt/stacked", false)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn bind_mount_already_bound_is_ok_and_made_read_only_if_asked() {
    // A real directory bound "onto itself" in the fake mount table: same_file(src, target) holds.
    let tmp_dir = tempfile::tempdir().unwrap();
    let dir = tmp_dir.path().to_str().unwrap().to_owned();
    let line = format!("40 25 0:50 / {dir} rw,relatime - tmpfs tmpfs rw\n");
    let (fake, fs, _tmp) = setup(&line);
    fs.bind_mount(&dir, &dir, false).await.unwrap();
    assert!(fake.calls().is_empty());
    fake.expect(&["mount", "-o", "remount,bind,ro", &dir])
        .succeeds();
    fs.bind_mount(&dir, &dir, true).await.unwrap();
    fake.assert_done();
}

// ---- unmount ----

#[tokio::test]
async fn unmount_of_a_target_that_is_not_mounted_does_nothing() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    fs.unmount("/mnt/never").await.unwrap();
    assert!(fake.calls().is_empty());
}

#[tokio::test]
async fn unmount_runs_umount_and_tolerates_a_concurrent_unmount() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    fake.expect(&["umount", "/mnt/stacked"]).succeeds();
    fake.expect(&["umount", "/mnt/stacked/"])
        .fails(32, "umount: /mnt/stacked/: not mounted.\n");
    fs.unmount("/mnt/stacked").await.unwrap();
    fs.unmount("/mnt/stacked/").await.unwrap();
    fake.assert_done();
}

#[tokio::test]
async fn unmount_of_a_busy_target_is_in_use() {
    let (fake, fs, _tmp) = setup(MOUNTINFO_ESCAPES);
    fake.expect(&["umount", "/mnt/stacked"])
        .fails(32, "umount: /mnt/stacked: target is busy.\n");
    assert!(matches!(
        fs.unmount("/mnt/stacked").await,
        Err(Error::InUse(_))
    ));
}

#[test]
fn fstype_names_match_mount_and_mkfs() {
    assert_eq!(fstype_name(Fstype::Xfs), "xfs");
    assert_eq!(fstype_name(Fstype::Ext4), "ext4");
}
