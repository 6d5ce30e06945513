//! Checks on what a CO sends to the Node service, before anything touches the machine: volume ids,
//! paths (they reach `mount` and `umount`), volume capabilities and mount flags.

use lvms_core::config::Fstype;

use crate::csi::{
    VolumeCapability,
    volume_capability::{AccessType, access_mode::Mode},
};
use lvms_engine::ids;

/// The longest path accepted (Linux `PATH_MAX`); the spec lets paths exceed the general 128-byte limit.
pub const MAX_PATH_BYTES: usize = 4096;
/// The spec's limit on all mount flags of a capability together.
pub const MAX_MOUNT_FLAGS_BYTES: usize = 4096;

/// Option names refused in `mount_flags`: they change what `mount` does (bind, move, remount, set up a
/// loop device, run a helper program) rather than how the filesystem is mounted. `x-*` options are
/// refused as well (util-linux's `X-mount.mkdir`, `X-mount.owner`, …).
const REFUSED_FLAGS: &[&str] = &[
    "bind",
    "rbind",
    "remount",
    "move",
    "loop",
    "offset",
    "sizelimit",
    "encryption",
    "helper",
];

/// Why a request was refused before anything ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// INVALID_ARGUMENT: a missing or malformed field.
    Argument(String),
    /// NOT_FOUND: a well-formed request for a volume id this driver never hands out.
    NotOurs(String),
}

/// How the volume is accessed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A block device.
    Block,
    /// A filesystem.
    Mount {
        /// The filesystem asked for; `None` when the CO left it empty.
        fstype: Option<Fstype>,
        /// Mount flags, each checked by [`mount_flags`].
        flags: Vec<String>,
    },
}

impl Access {
    /// `block` or `mount`, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Block => "block",
            Self::Mount { .. } => "mount",
        }
    }
}

/// A checked volume capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capability {
    pub access: Access,
    pub mode: Mode,
}

impl Capability {
    /// The mode allows one publication on the node only (SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER).
    pub fn exclusive(&self) -> bool {
        matches!(
            self.mode,
            Mode::SingleNodeWriter | Mode::SingleNodeSingleWriter
        )
    }

    /// The mode is read-only (SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY).
    pub fn reader_only(&self) -> bool {
        matches!(
            self.mode,
            Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly
        )
    }

    /// A MULTI_NODE_* mode (only ever with block access, see [`capability`]).
    pub fn multi_node(&self) -> bool {
        matches!(
            self.mode,
            Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
        )
    }

    /// The flags contain `ro`.
    pub fn ro_flag(&self) -> bool {
        matches!(&self.access, Access::Mount { flags, .. } if flags.iter().any(|f| f == "ro"))
    }
}

/// A volume id: present and within the spec's size limit. Whether it is one of ours is a separate
/// check ([`our_volume_id`]), made after every required field: the spec wants INVALID_ARGUMENT for a
/// missing field whatever the id.
pub fn volume_id(id: &str) -> Result<(), Invalid> {
    if id.is_empty() {
        return Err(Invalid::Argument("volume_id is required".to_owned()));
    }
    if id.len() > ids::MAX_STRING_BYTES {
        return Err(Invalid::Argument(format!(
            "volume_id is {} bytes long, more than the {} the CSI spec allows",
            id.len(),
            ids::MAX_STRING_BYTES
        )));
    }
    Ok(())
}

/// A volume id of our shape, or one TopoLVM or LVMS handed out that lvms-rs may have taken over
/// (ADR 0032) (NOT_FOUND otherwise: this driver never handed it out).
pub fn our_volume_id(id: &str) -> Result<(), Invalid> {
    if !ids::is_volume_id(id) && !ids::is_taken_over_id(id) {
        return Err(Invalid::NotOurs(format!(
            "volume {id:?} does not exist: it is not a volume id this driver hands out"
        )));
    }
    Ok(())
}

/// A path that reaches `mount`, `umount`, `xfs_growfs` or a file operation: present, absolute, at most
/// [`MAX_PATH_BYTES`], no NUL or newline (which neither the kernel nor mountinfo can carry), and no `..`
/// component (so it names the place it seems to name).
pub fn path(field: &str, p: &str) -> Result<(), Invalid> {
    let bad = |why: &str| Err(Invalid::Argument(format!("{field} {p:?} {why}")));
    if p.is_empty() {
        return Err(Invalid::Argument(format!("{field} is required")));
    }
    if p.len() > MAX_PATH_BYTES {
        return Err(Invalid::Argument(format!(
            "{field} is {} bytes long, more than {MAX_PATH_BYTES}",
            p.len()
        )));
    }
    if !p.starts_with('/') {
        return bad("must be an absolute path");
    }
    if p.contains(['\0', '\n']) {
        return bad("must not contain NUL or newline");
    }
    if p.split('/').any(|c| c == "..") {
        return bad("must not contain a '..' component");
    }
    Ok(())
}

/// The path of a volume to report on or expand (`NodeGetVolumeStats`, `NodeExpandVolume`): required
/// (INVALID_ARGUMENT), and a path that [`path`] refuses (relative, with `..`, …) holds no volume of ours
/// (NOT_FOUND), as the spec's tables say of a volume not at the path.
pub fn volume_path(field: &str, p: &str) -> Result<(), Invalid> {
    match path(field, p) {
        Err(Invalid::Argument(m)) if !p.is_empty() => Err(Invalid::NotOurs(format!(
            "no volume is at {field} {p:?}: {m}"
        ))),
        other => other,
    }
}

/// An optional path: checked by [`path`] when not empty.
pub fn optional_path(field: &str, p: &str) -> Result<(), Invalid> {
    if p.is_empty() { Ok(()) } else { path(field, p) }
}

/// A required volume capability this node can serve.
pub fn capability(cap: Option<&VolumeCapability>) -> Result<Capability, Invalid> {
    let arg = |m: String| Invalid::Argument(m);
    let cap = cap.ok_or_else(|| arg("volume_capability is required".to_owned()))?;
    let mode_value = cap
        .access_mode
        .as_ref()
        .ok_or_else(|| arg("volume_capability.access_mode is required".to_owned()))?
        .mode;
    let mode = Mode::try_from(mode_value)
        .map_err(|_| arg(format!("access mode {mode_value} is not a CSI access mode")))?;
    let block = matches!(cap.access_type, Some(AccessType::Block(_)));
    match mode {
        Mode::Unknown => return Err(arg("volume_capability.access_mode is required".to_owned())),
        // Only block volumes of a shared class may be multi-node; the class is checked once the
        // volume is looked up (`Capability::multi_node`).
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter
            if block => {}
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter => {
            return Err(arg(format!(
                "access mode {} is not supported for a filesystem: filesystem volumes are single-node; \
                 only block volumes of a shared device class can be used from several nodes",
                mode.as_str_name()
            )));
        }
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
    }
    let access = match &cap.access_type {
        None => {
            return Err(arg(
                "volume_capability needs an access type (block or mount)".to_owned(),
            ));
        }
        Some(AccessType::Block(_)) => Access::Block,
        Some(AccessType::Mount(m)) => {
            if !m.volume_mount_group.is_empty() {
                return Err(arg(
                    "volume_mount_group is not supported (no VOLUME_MOUNT_GROUP capability)"
                        .to_owned(),
                ));
            }
            mount_flags(&m.mount_flags).map_err(arg)?;
            Access::Mount {
                fstype: fstype(&m.fs_type).map_err(arg)?,
                flags: m.mount_flags.clone(),
            }
        }
    };
    Ok(Capability { access, mode })
}

/// `ext4`, `xfs`, or empty (`None`: the CO leaves the choice to the plugin).
pub fn fstype(name: &str) -> Result<Option<Fstype>, String> {
    match name {
        "" => Ok(None),
        "ext4" => Ok(Some(Fstype::Ext4)),
        "xfs" => Ok(Some(Fstype::Xfs)),
        other => Err(format!(
            "fs_type {:?} is not supported: use ext4 or xfs",
            truncate(other)
        )),
    }
}

/// The filesystem a signature names, when it is one this node mounts.
pub fn known_fstype(signature: &str) -> Option<Fstype> {
    fstype(signature).ok().flatten()
}

/// Mount flags: each a plain option word (`noatime`, `discard`, `commit=30`, `context=system_u:…`):
/// letters, digits and `_ . : = / + -`, not starting with `-`, no comma (which would smuggle in more
/// options), not one of the options that change what `mount` does ([`REFUSED_FLAGS`], `x-*`), and all
/// of them together at most [`MAX_MOUNT_FLAGS_BYTES`].
pub fn mount_flags(flags: &[String]) -> Result<(), String> {
    let total: usize = flags.iter().map(String::len).sum();
    if total > MAX_MOUNT_FLAGS_BYTES {
        return Err(format!(
            "mount_flags are {total} bytes together, more than the {MAX_MOUNT_FLAGS_BYTES} the CSI spec allows"
        ));
    }
    for flag in flags {
        let plain = !flag.is_empty()
            && !flag.starts_with('-')
            && flag
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.:=/+-".contains(c));
        if !plain {
            return Err(format!(
                "mount flag {:?} is not a plain mount option: use letters, digits and _ . : = / + -, one \
                 option per flag, not starting with '-'",
                truncate(flag)
            ));
        }
        let name = flag
            .split_once('=')
            .map_or(flag.as_str(), |(n, _)| n)
            .to_ascii_lowercase();
        if REFUSED_FLAGS.contains(&name.as_str()) || name.starts_with("x-") {
            return Err(format!(
                "mount flag {flag:?} is not allowed: the driver decides how volumes are bound and mounted"
            ));
        }
    }
    if flags.iter().any(|f| f == "ro") && flags.iter().any(|f| f == "rw") {
        return Err("mount flags ask for both ro and rw".to_owned());
    }
    Ok(())
}

/// At most 64 characters of a CO string, for messages.
fn truncate(s: &str) -> String {
    if s.chars().count() > 64 {
        format!("{}…", s.chars().take(64).collect::<String>())
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn mount_cap(fs_type: &str, flags: &[&str], mode: Mode) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: fs_type.to_owned(),
                mount_flags: s(flags),
                volume_mount_group: String::new(),
            })),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn plain_mount_flags_pass() {
        mount_flags(&s(&[
            "noatime",
            "discard",
            "commit=30",
            "nouuid",
            "data=ordered",
            "context=system_u:object_r:container_file_t:s0",
            "ro",
        ]))
        .unwrap();
        mount_flags(&[]).unwrap();
    }

    #[test]
    fn mount_flags_that_are_not_plain_words_or_change_what_mount_does_are_refused() {
        for bad in [
            "",
            "noatime,bind",
            "a b",
            "-o",
            "--bind",
            "a\nb",
            "a\0b",
            "\"quoted\"",
            "bind",
            "rbind",
            "remount",
            "move",
            "loop",
            "offset=4096",
            "helper=udisks2",
            "X-mount.mkdir",
            "x-systemd.automount",
            "BIND",
            "é",
        ] {
            let err = mount_flags(&s(&[bad])).unwrap_err();
            assert!(err.contains("mount flag"), "{bad:?}: {err}");
        }
        assert!(mount_flags(&s(&["ro", "rw"])).is_err());
        let many = vec!["x".repeat(100); 41];
        assert!(mount_flags(&many).unwrap_err().contains("4096"));
    }

    #[test]
    fn paths_must_be_absolute_without_nul_newline_or_dotdot() {
        path(
            "target_path",
            "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount",
        )
        .unwrap();
        path("target_path", "/with space/and..dots").unwrap();
        for bad in ["", "relative", "/a/../b", "/a/..", "/a\0", "/a\nb", "-o"] {
            assert!(
                matches!(path("target_path", bad), Err(Invalid::Argument(_))),
                "{bad:?}"
            );
        }
        let long = format!("/{}", "a".repeat(MAX_PATH_BYTES));
        assert!(matches!(path("p", &long), Err(Invalid::Argument(m)) if m.contains("4096")));
        optional_path("staging_target_path", "").unwrap();
        assert!(optional_path("staging_target_path", "x").is_err());
    }

    #[test]
    fn volume_ids_empty_or_too_long_are_invalid_and_foreign_ones_not_found() {
        volume_id(&ids::volume_lv_name("pvc-1")).unwrap();
        our_volume_id(&ids::volume_lv_name("pvc-1")).unwrap();
        assert!(matches!(volume_id(""), Err(Invalid::Argument(_))));
        assert!(
            matches!(volume_id(&"c".repeat(129)), Err(Invalid::Argument(m)) if m.contains("128"))
        );
        // TopoLVM's and LVMS's ids (a UUID) may have been taken over (ADR 0032): looked up.
        our_volume_id("6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a").unwrap();
        for foreign in [
            "vol-1",
            &ids::snapshot_lv_name("s"),
            "csi-abc",
            "6F1C2A4E-1B7D-4C1E-9A55-0E1F2D3C4B5A",
        ] {
            volume_id(foreign).unwrap();
            assert!(
                matches!(our_volume_id(foreign), Err(Invalid::NotOurs(_))),
                "{foreign}"
            );
        }
    }

    #[test]
    fn volume_paths_are_required_and_a_malformed_one_holds_no_volume() {
        volume_path("volume_path", "/var/lib/kubelet/pods/p/volumes/x/mount").unwrap();
        assert!(matches!(
            volume_path("volume_path", ""),
            Err(Invalid::Argument(_))
        ));
        for bad in ["some/path", "/a/../b", "/a\0"] {
            assert!(
                matches!(volume_path("volume_path", bad), Err(Invalid::NotOurs(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn capabilities_need_an_access_type_and_a_single_node_mode() {
        let c = capability(Some(&mount_cap("", &["noatime"], Mode::SingleNodeWriter))).unwrap();
        assert_eq!(
            c.access,
            Access::Mount {
                fstype: None,
                flags: s(&["noatime"])
            }
        );
        assert!(c.exclusive() && !c.reader_only());
        let c = capability(Some(&mount_cap("xfs", &[], Mode::SingleNodeMultiWriter))).unwrap();
        assert!(!c.exclusive());
        assert!(matches!(
            c.access,
            Access::Mount {
                fstype: Some(Fstype::Xfs),
                ..
            }
        ));
        let c = capability(Some(&mount_cap("ext4", &[], Mode::SingleNodeReaderOnly))).unwrap();
        assert!(c.reader_only() && !c.exclusive());

        let block = VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeSingleWriter as i32,
            }),
        };
        let c = capability(Some(&block)).unwrap();
        assert_eq!(c.access, Access::Block);
        assert!(c.exclusive());

        let invalid = |cap: Option<&VolumeCapability>| -> String {
            match capability(cap) {
                Err(Invalid::Argument(m)) => m,
                other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
            }
        };
        assert!(invalid(None).contains("required"));
        for mode in [
            Mode::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter,
        ] {
            let m = invalid(Some(&mount_cap("", &[], mode)));
            assert!(
                m.contains(mode.as_str_name()) && m.contains("filesystem volumes are single-node"),
                "{m}"
            );
            // A block volume may be multi-node; the class decides after the lookup.
            let multi = VolumeCapability {
                access_type: Some(AccessType::Block(BlockVolume {})),
                access_mode: Some(AccessMode { mode: mode as i32 }),
            };
            let c = capability(Some(&multi)).unwrap();
            assert!(c.multi_node() && !c.exclusive());
            assert_eq!(c.reader_only(), mode == Mode::MultiNodeReaderOnly);
        }
        assert!(invalid(Some(&mount_cap("", &[], Mode::Unknown))).contains("access_mode"));
        assert!(invalid(Some(&mount_cap("btrfs", &[], Mode::SingleNodeWriter))).contains("btrfs"));
        assert!(invalid(Some(&mount_cap("", &["bind"], Mode::SingleNodeWriter))).contains("bind"));
        let mut no_type = mount_cap("", &[], Mode::SingleNodeWriter);
        no_type.access_type = None;
        assert!(invalid(Some(&no_type)).contains("access type"));
        let mut no_mode = mount_cap("", &[], Mode::SingleNodeWriter);
        no_mode.access_mode = None;
        assert!(invalid(Some(&no_mode)).contains("access_mode"));
        let mut bad_mode = mount_cap("", &[], Mode::SingleNodeWriter);
        bad_mode.access_mode = Some(AccessMode { mode: 99 });
        assert!(invalid(Some(&bad_mode)).contains("99"));
        let mut group = mount_cap("", &[], Mode::SingleNodeWriter);
        if let Some(AccessType::Mount(m)) = &mut group.access_type {
            m.volume_mount_group = "1000".to_owned();
        }
        assert!(invalid(Some(&group)).contains("volume_mount_group"));
    }

    #[test]
    fn known_fstypes_are_ext4_and_xfs() {
        assert_eq!(known_fstype("ext4"), Some(Fstype::Ext4));
        assert_eq!(known_fstype("xfs"), Some(Fstype::Xfs));
        assert_eq!(known_fstype("btrfs"), None);
        assert_eq!(known_fstype("LVM2_member"), None);
        assert_eq!(known_fstype(""), None);
    }
}
