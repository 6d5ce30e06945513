//! Checks on every string that reaches a command line, so none can be read as an option, a second
//! argument or a different path.

use crate::error::{Error, Result};

/// LVM's limit for a tag (lvm2 `validate_tag` and `NAME_LEN`-sized tag buffers allow up to 1024).
pub const MAX_TAG_LEN: usize = 1024;

/// A volume group or logical volume name, by LVM's rules ([`lvms_core::names::validate_lvm_name`]).
pub fn lvm_name(name: &str) -> Result<()> {
    Ok(lvms_core::names::validate_lvm_name(name)?)
}

/// A device path for `pvcreate`, `vgcreate`, `wipefs`, `mkfs`, …: LVM does not accept `--` before its
/// device arguments, so the path itself must be harmless: absolute under `/dev/`, no whitespace or control
/// characters, no `..` component.
pub fn device_path(path: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidDevicePath {
            path: path.to_owned(),
            reason,
        })
    };
    if !path.starts_with("/dev/") || path.len() == "/dev/".len() {
        return bad(
            "must be an absolute path under /dev/ (such as /dev/vdb or /dev/disk/by-id/...)",
        );
    }
    if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return bad("must not contain whitespace or control characters");
    }
    if path.split('/').any(|c| c == "..") {
        return bad("must not contain '..'");
    }
    Ok(())
}

/// An LVM tag (lvm2 `validate_tag`): letters, digits and `_ + . - / = ! : # &`, at most 1024 bytes. A
/// leading `-` is refused as well so the tag cannot look like an option.
pub fn lvm_tag(tag: &str) -> Result<()> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && !tag.starts_with('-')
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_+.-/=!:#&".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "LVM tag {tag:?} is not valid: use 1 to {MAX_TAG_LEN} letters, digits and _ + . - / = ! : # &, \
             not starting with '-'"
        )))
    }
}

/// A path given to `mount`, `umount` or `xfs_growfs`: absolute, no newline or NUL (which mountinfo and
/// the kernel cannot represent), not empty.
pub fn mount_path(path: &str) -> Result<()> {
    if !path.starts_with('/') || path.contains('\n') || path.contains('\0') {
        return Err(Error::InvalidArgument(format!(
            "mount path {path:?} must be absolute and contain no newline or NUL"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_paths_must_be_plain_dev_paths() {
        for ok in [
            "/dev/vdb",
            "/dev/disk/by-id/virtio-abc_123",
            "/dev/mapper/vg-lv",
            "/dev/loop0p1",
        ] {
            device_path(ok).unwrap();
        }
        for bad in [
            "",
            "vdb",
            "/dev/",
            "-ff",
            "/tmp/disk.img",
            "/dev/vdb /dev/vdc",
            "/dev/vdb\n",
            "/dev/../etc/passwd",
            "/devx/vdb",
        ] {
            assert!(
                matches!(device_path(bad), Err(Error::InvalidDevicePath { .. })),
                "{bad:?} accepted"
            );
        }
    }

    #[test]
    fn tags_follow_lvm_rules() {
        for ok in ["lvms", "owner=node-1", "pvc=ns/claim", "a:b#c&d!e+f.g_h"] {
            lvm_tag(ok).unwrap();
        }
        for bad in ["", "-x", "a b", "a,b", "é", "@tag", &"x".repeat(1025)] {
            assert!(lvm_tag(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn names_are_checked_by_core_rules() {
        lvm_name("vg1").unwrap();
        assert!(matches!(lvm_name("-vg"), Err(Error::InvalidName(_))));
    }

    #[test]
    fn mount_paths_must_be_absolute() {
        mount_path("/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pvc-1/mount").unwrap();
        mount_path("/mnt/with space").unwrap();
        assert!(mount_path("relative").is_err());
        assert!(mount_path("-o").is_err());
        assert!(mount_path("/a\nb").is_err());
    }
}
