//! Filesystems: make (`mkfs.xfs`, `mkfs.ext4`), grow (`xfs_growfs`, `resize2fs`), mount and bind-mount
//! (`mount`), unmount (`umount`), the mount table (`/proc/self/mountinfo`) and usage (`statvfs`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use lvms_core::config::Fstype;

use crate::{
    devices::probe_signature,
    error::{Error, Result},
    runner::{Command, Output, Runner},
    validate,
};

/// mkfs and grow may take a while on a large or slow device.
pub const MKFS_TIMEOUT: Duration = Duration::from_secs(300);

/// The name mount and mkfs use for a filesystem type.
pub fn fstype_name(fstype: Fstype) -> &'static str {
    match fstype {
        Fstype::Xfs => "xfs",
        Fstype::Ext4 => "ext4",
    }
}

// ---- mountinfo ----

/// One line of `/proc/<pid>/mountinfo` (proc(5)), with octal escapes (`\040` for a space) decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_id: u32,
    pub parent_id: u32,
    pub major: u32,
    pub minor: u32,
    /// The directory of the filesystem mounted here (`/` unless a bind mount of a subdirectory).
    pub root: String,
    pub mount_point: String,
    /// Per-mount options (`rw`, `ro`, `relatime`, …).
    pub mount_options: Vec<String>,
    /// Propagation fields (`shared:1`, `master:2`, …).
    pub optional_fields: Vec<String>,
    pub fs_type: String,
    /// Mount source (`/dev/mapper/vg-lv`, `tmpfs`, …).
    pub source: String,
    /// Per-superblock options.
    pub super_options: Vec<String>,
}

impl MountInfo {
    /// Mounted read-only (per-mount `ro`).
    pub fn read_only(&self) -> bool {
        self.mount_options.iter().any(|o| o == "ro")
    }
}

/// Decodes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..=i + 3]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn split_options(field: &str) -> Vec<String> {
    field
        .split(',')
        .filter(|o| !o.is_empty())
        .map(unescape)
        .collect()
}

fn parse_line(line: &str) -> Option<MountInfo> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    if sep < 6 || fields.len() < sep + 3 {
        return None;
    }
    let (major, minor) = fields[2].split_once(':')?;
    Some(MountInfo {
        mount_id: fields[0].parse().ok()?,
        parent_id: fields[1].parse().ok()?,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root: unescape(fields[3]),
        mount_point: unescape(fields[4]),
        mount_options: split_options(fields[5]),
        optional_fields: fields[6..sep].iter().map(|f| (*f).to_owned()).collect(),
        fs_type: unescape(fields[sep + 1]),
        source: unescape(fields[sep + 2]),
        super_options: fields
            .get(sep + 3)
            .map(|f| split_options(f))
            .unwrap_or_default(),
    })
}

/// Parses the text of `/proc/self/mountinfo`; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let m = parse_line(l);
            if m.is_none() {
                tracing::debug!(line = l, "skipping malformed mountinfo line");
            }
            m
        })
        .collect()
}

fn trim_slash(p: &str) -> &str {
    if p.len() > 1 {
        p.trim_end_matches('/')
    } else {
        p
    }
}

/// The mount on top at `target` (the last one listed, if several are stacked).
pub fn find_mount_by_target<'a>(mounts: &'a [MountInfo], target: &str) -> Option<&'a MountInfo> {
    let target = trim_slash(target);
    mounts
        .iter()
        .rev()
        .find(|m| trim_slash(&m.mount_point) == target)
}

// ---- statvfs ----

/// Usage of the filesystem holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStats {
    pub total_bytes: u64,
    /// Free bytes available to unprivileged users.
    pub available_bytes: u64,
    pub used_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
    pub used_inodes: u64,
}

/// `statvfs(2)` of `path`.
pub fn statvfs(path: impl AsRef<Path>) -> Result<FsStats> {
    let path = path.as_ref();
    let st =
        rustix::fs::statvfs(path).map_err(|e| Error::io(path.display().to_string(), e.into()))?;
    let unit = if st.f_frsize > 0 {
        st.f_frsize
    } else {
        st.f_bsize
    };
    Ok(FsStats {
        total_bytes: st.f_blocks.saturating_mul(unit),
        available_bytes: st.f_bavail.saturating_mul(unit),
        used_bytes: st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(unit),
        total_inodes: st.f_files,
        free_inodes: st.f_ffree,
        used_inodes: st.f_files.saturating_sub(st.f_ffree),
    })
}

/// Whether the mount shows the block device `dev`: by device number when `dev` can be stat'ed, else by
/// the mount source string.
fn shows_device(mount: &MountInfo, dev: &str) -> bool {
    match rustix::fs::stat(dev) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::BlockDevice =>
        {
            #[allow(clippy::useless_conversion)] // st_rdev is not u64 on every target
            let rdev = u64::from(st.st_rdev);
            (rustix::fs::major(rdev), rustix::fs::minor(rdev)) == (mount.major, mount.minor)
        }
        _ => mount.source == dev,
    }
}

/// Whether `a` and `b` are the same file (same device and inode), as they are after `mount --bind a b`.
fn same_file(a: &str, b: &str) -> bool {
    match (rustix::fs::stat(a), rustix::fs::stat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

fn check_options(options: &[String]) -> Result<()> {
    for o in options {
        if o.is_empty() || o.contains(['\n', '\0', ' ']) {
            return Err(Error::InvalidArgument(format!(
                "mount option {o:?} must be non-empty and contain no space, newline or NUL"
            )));
        }
    }
    Ok(())
}

/// Filesystem operations through a [`Runner`], reading the mount table under an injectable procfs root.
#[derive(Debug, Clone)]
pub struct Filesystems<R> {
    runner: R,
    proc_root: PathBuf,
}

impl<R: Runner> Filesystems<R> {
    pub fn new(runner: R) -> Self {
        Self {
            runner,
            proc_root: PathBuf::from("/proc"),
        }
    }

    /// Reads `<proc_root>/self/mountinfo` instead of `/proc/self/mountinfo`.
    #[must_use]
    pub fn with_proc_root(mut self, proc_root: impl Into<PathBuf>) -> Self {
        self.proc_root = proc_root.into();
        self
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    async fn run_checked(&self, cmd: Command) -> Result<Output> {
        let out = self.runner.run(&cmd).await?;
        if out.success() {
            Ok(out)
        } else if out.stderr.contains("busy") {
            Err(Error::InUse(format!(
                "`{}`: {}",
                cmd.argv(),
                out.stderr.trim()
            )))
        } else {
            Err(out.into_error(&cmd))
        }
    }

    /// The mount table of this process's mount namespace.
    pub async fn mounts(&self) -> Result<Vec<MountInfo>> {
        let path = self.proc_root.join("self/mountinfo");
        let text = tokio::fs::read_to_string(&path)
            .await
            .map_err(|e| Error::io(path.display().to_string(), e))?;
        Ok(parse_mountinfo(&text))
    }

    /// The mount on top at `target`, if any.
    pub async fn find_mount_by_target(&self, target: &str) -> Result<Option<MountInfo>> {
        Ok(find_mount_by_target(&self.mounts().await?, target).cloned())
    }

    /// The filesystem or other signature on `dev` (`blkid -p`: `TYPE`, else a partition table's
    /// `PTTYPE`), `None` for a blank device.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn detect_fs(&self, dev: &str) -> Result<Option<String>> {
        probe_signature(&self.runner, dev).await
    }

    /// Makes a filesystem on a blank device: `mkfs.xfs -q <dev>` or `mkfs.ext4 -q <dev>`. Never forces:
    /// a device with any signature is refused with [`Error::SignatureExists`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn mkfs(&self, dev: &str, fstype: Fstype) -> Result<()> {
        validate::device_path(dev)?;
        if let Some(signature) = self.detect_fs(dev).await? {
            return Err(Error::SignatureExists {
                device: dev.to_owned(),
                signature,
            });
        }
        let program = format!("mkfs.{}", fstype_name(fstype));
        self.run_checked(Command::new(program, ["-q", dev]).timeout(MKFS_TIMEOUT))
            .await
            .map(drop)
    }

    /// Grows a mounted filesystem to its device's size: `xfs_growfs <mountpoint>` (XFS grows through its
    /// mount point) or `resize2fs <dev>` (ext4, online; needs `CAP_SYS_RESOURCE`, else resize2fs says
    /// "Permission denied to resize filesystem"). Growing to the current size succeeds.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn grow(&self, dev: &str, mountpoint: &str, fstype: Fstype) -> Result<()> {
        validate::device_path(dev)?;
        validate::mount_path(mountpoint)?;
        let cmd = match fstype {
            Fstype::Xfs => Command::new("xfs_growfs", [mountpoint]),
            Fstype::Ext4 => Command::new("resize2fs", [dev]),
        };
        self.run_checked(cmd.timeout(MKFS_TIMEOUT)).await.map(drop)
    }

    /// Mounts `dev` at `target`: `mount -t <fstype> [-o <options>[,ro][,nouuid][,norecovery]] <dev>
    /// <target>`. For XFS `nouuid` is added (a snapshot has its origin's filesystem UUID, and XFS refuses to
    /// mount a second filesystem with the same UUID), and `norecovery` when mounting a read-only device
    /// read-only (XFS cannot replay its log there and would refuse the mount). Already mounted there with the same device and mode: `Ok`; with a
    /// different device or mode: [`Error::AlreadyExists`]. The target directory must exist.
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn mount(
        &self,
        dev: &str,
        target: &str,
        fstype: Fstype,
        options: &[String],
        readonly: bool,
    ) -> Result<()> {
        validate::device_path(dev)?;
        validate::mount_path(target)?;
        check_options(options)?;
        if let Some(m) = self.find_mount_by_target(target).await? {
            if !shows_device(&m, dev) {
                return Err(Error::AlreadyExists(format!(
                    "{target} has {} mounted, not {dev}",
                    m.source
                )));
            }
            if m.read_only() != readonly {
                return Err(Error::AlreadyExists(format!(
                    "{dev} is mounted at {target} {}, not {}",
                    if m.read_only() {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    if readonly { "read-only" } else { "read-write" },
                )));
            }
            tracing::debug!(dev, target, "already mounted");
            return Ok(());
        }
        let mut opts: Vec<String> = options.to_vec();
        if readonly && !opts.iter().any(|o| o == "ro") {
            opts.push("ro".to_owned());
        }
        if fstype == Fstype::Xfs && !opts.iter().any(|o| o == "nouuid") {
            opts.push("nouuid".to_owned());
        }
        // XFS replays its log at mount, even read-only, and refuses a read-only device whose log needs
        // it (a read-only thin snapshot of a mounted volume): mount what is on disk instead.
        if fstype == Fstype::Xfs
            && readonly
            && device_is_read_only(dev).await
            && !opts.iter().any(|o| o == "norecovery")
        {
            opts.push("norecovery".to_owned());
        }
        let mut args = vec!["-t".to_owned(), fstype_name(fstype).to_owned()];
        if !opts.is_empty() {
            args.extend(["-o".to_owned(), opts.join(",")]);
        }
        args.extend([dev.to_owned(), target.to_owned()]);
        self.run_checked(Command::new("mount", args))
            .await
            .map(drop)
    }

    /// Bind-mounts `src` (a directory or a device node) at `target`: `mount --bind <src> <target>`, then
    /// for `readonly` `mount -o remount,bind,ro <target>` (a bind mount cannot be made read-only in one
    /// step with older kernels). If the remount fails the bind is undone. Already bound: `Ok` (made
    /// read-only if asked and still writable); something else mounted there: [`Error::AlreadyExists`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn bind_mount(&self, src: &str, target: &str, readonly: bool) -> Result<()> {
        validate::mount_path(src)?;
        validate::mount_path(target)?;
        let remount = || Command::new("mount", ["-o", "remount,bind,ro", target]);
        if let Some(m) = self.find_mount_by_target(target).await? {
            if !same_file(src, target) {
                return Err(Error::AlreadyExists(format!(
                    "{target} has {}:{} {} mounted, not a bind of {src}",
                    m.major, m.minor, m.root
                )));
            }
            if readonly && !m.read_only() {
                self.run_checked(remount()).await?;
            } else if !readonly && m.read_only() {
                return Err(Error::AlreadyExists(format!(
                    "{src} is bound at {target} read-only, not read-write"
                )));
            }
            tracing::debug!(src, target, "already bind-mounted");
            return Ok(());
        }
        self.run_checked(Command::new("mount", ["--bind", src, target]))
            .await?;
        if !readonly {
            return Ok(());
        }
        if let Err(e) = self.run_checked(remount()).await {
            if let Err(undo) = self.run_checked(Command::new("umount", [target])).await {
                tracing::warn!(target, error = %undo, "could not undo the bind mount");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Unmounts `target` (`umount <target>`). Not mounted: `Ok`. Busy: [`Error::InUse`].
    #[tracing::instrument(level = "debug", skip(self))]
    pub async fn unmount(&self, target: &str) -> Result<()> {
        validate::mount_path(target)?;
        if self.find_mount_by_target(target).await?.is_none() {
            tracing::debug!(target, "not mounted");
            return Ok(());
        }
        let cmd = Command::new("umount", [target]);
        let out = self.runner.run(&cmd).await?;
        if out.success() || out.stderr.contains("not mounted") {
            return Ok(());
        }
        if out.stderr.contains("busy") {
            return Err(Error::InUse(format!(
                "`{}`: {}",
                cmd.argv(),
                out.stderr.trim()
            )));
        }
        Err(out.into_error(&cmd))
    }
}

#[cfg(test)]
mod tests;

/// Whether the kernel reports the block device behind `dev` read-only (`/sys/class/block/<kname>/ro`).
/// Unknown (no such device, no sysfs) counts as writable.
async fn device_is_read_only(dev: &str) -> bool {
    let Ok(real) = tokio::fs::canonicalize(dev).await else {
        return false;
    };
    let Some(kname) = real.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    tokio::fs::read_to_string(format!("/sys/class/block/{kname}/ro"))
        .await
        .is_ok_and(|v| v.trim() == "1")
}
