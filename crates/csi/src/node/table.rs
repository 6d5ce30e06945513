//! What the mount table says about a volume, and what to do about a request: pure functions over parsed
//! `/proc/self/mountinfo`, so every answer survives a restart of the driver and is tested as a table.
//!
//! A volume shows in the mount table in two ways:
//! - **filesystem** (staged, or published with a mount capability): the device's own major:minor with
//!   root `/` (a bind mount of the staging directory shows the same);
//! - **block** (published with a block capability): a bind mount of the device *node*, which shows the
//!   major:minor of the filesystem holding the node (devtmpfs) and the node's path there as its root
//!   (`/dm-3`).

use lvms_host::fs::{MountInfo, find_mount_by_target};

use super::request::Access;

/// How to recognise a volume's mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceIds {
    /// major:minor of the block device.
    pub rdev: (u32, u32),
    /// major:minor of the filesystem holding the device node.
    pub node_fs: (u32, u32),
    /// The device node's file name there (`dm-3`).
    pub node_name: String,
}

impl DeviceIds {
    /// A mount of the volume's filesystem (its root, not a subdirectory).
    pub fn is_filesystem(&self, m: &MountInfo) -> bool {
        (m.major, m.minor) == self.rdev && m.root == "/"
    }

    /// A bind mount of the volume's device node.
    pub fn is_block(&self, m: &MountInfo) -> bool {
        (m.major, m.minor) == self.node_fs
            && m.root.rsplit('/').next() == Some(self.node_name.as_str())
    }

    /// A mount of the volume made with the given access.
    pub fn is(&self, access: &Access, m: &MountInfo) -> bool {
        match access {
            Access::Block => self.is_block(m),
            Access::Mount { .. } => self.is_filesystem(m),
        }
    }

    /// Any mount of the volume made by the driver.
    pub fn is_ours(&self, m: &MountInfo) -> bool {
        self.is_filesystem(m) || self.is_block(m)
    }
}

fn trim(p: &str) -> &str {
    if p.len() > 1 {
        p.trim_end_matches('/')
    } else {
        p
    }
}

fn mode(ro: bool) -> &'static str {
    if ro { "read-only" } else { "read-write" }
}

fn describe(m: &MountInfo) -> String {
    format!(
        "{} ({} {}:{}{})",
        m.source,
        m.fs_type,
        m.major,
        m.minor,
        if m.root == "/" {
            String::new()
        } else {
            format!(" {}", m.root)
        }
    )
}

/// What to do for `NodeStageVolume` with a mount capability.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// Nothing is mounted at the staging path: format if needed, then mount.
    Mount,
    /// Staged there already as asked.
    AlreadyStaged,
    /// Something else, or this volume another way, is there: ALREADY_EXISTS.
    Incompatible(String),
}

/// Decides `NodeStageVolume` for a filesystem: `fs_type` is the filesystem asked for (`None`: any).
pub fn decide_stage(
    mounts: &[MountInfo],
    ids: &DeviceIds,
    staging: &str,
    fs_type: Option<&str>,
    readonly: bool,
) -> Stage {
    let Some(m) = find_mount_by_target(mounts, staging) else {
        return Stage::Mount;
    };
    if !ids.is_filesystem(m) {
        return Stage::Incompatible(format!(
            "staging path {staging} has {} mounted, not this volume",
            describe(m)
        ));
    }
    if let Some(wanted) = fs_type.filter(|t| *t != m.fs_type) {
        return Stage::Incompatible(format!(
            "the volume is staged at {staging} with {}, not {wanted}",
            m.fs_type
        ));
    }
    if m.read_only() != readonly {
        return Stage::Incompatible(format!(
            "the volume is staged at {staging} {}, not {}",
            mode(m.read_only()),
            mode(readonly)
        ));
    }
    Stage::AlreadyStaged
}

/// Decides `NodeStageVolume` for a block volume: there is nothing to mount, but a staging path that holds
/// the volume's filesystem was staged with a mount capability (ALREADY_EXISTS, as `Err`).
pub fn decide_stage_block(
    mounts: &[MountInfo],
    ids: &DeviceIds,
    staging: &str,
) -> Result<(), String> {
    match find_mount_by_target(mounts, staging) {
        Some(m) if ids.is_filesystem(m) => Err(format!(
            "the volume is staged at {staging} as a {} filesystem, not as a block device",
            m.fs_type
        )),
        _ => Ok(()),
    }
}

/// A `NodePublishVolume` request, as far as the mount table can check it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishArgs<'a> {
    pub target: &'a str,
    pub staging: &'a str,
    pub access: &'a Access,
    /// `readonly`, or a reader-only access mode.
    pub readonly: bool,
    /// The access mode allows one publication only (SINGLE_NODE_WRITER, SINGLE_NODE_SINGLE_WRITER).
    pub exclusive: bool,
}

/// What to do for `NodePublishVolume` (the spec's table, plus "not staged").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// Bind-mount at the target.
    Bind,
    /// Published at the target already, as asked: OK.
    AlreadyPublished,
    /// Published at the target with other arguments, or the target holds something else: ALREADY_EXISTS.
    Incompatible(String),
    /// Published at another target while the access mode allows one: FAILED_PRECONDITION.
    PublishedElsewhere(String),
    /// A filesystem volume whose staging path does not hold it (or holds it read-only while read-write is
    /// asked): FAILED_PRECONDITION.
    NotStaged(String),
}

/// Decides `NodePublishVolume`.
pub fn decide_publish(mounts: &[MountInfo], ids: &DeviceIds, req: &PublishArgs<'_>) -> Publish {
    if let Some(m) = find_mount_by_target(mounts, req.target) {
        let target = req.target;
        if ids.is(req.access, m) {
            return if m.read_only() == req.readonly {
                Publish::AlreadyPublished
            } else {
                Publish::Incompatible(format!(
                    "the volume is published at {target} {}, not {}",
                    mode(m.read_only()),
                    mode(req.readonly)
                ))
            };
        }
        if ids.is_ours(m) {
            let was = if ids.is_block(m) { "block" } else { "mount" };
            return Publish::Incompatible(format!(
                "the volume is published at {target} with {was} access, not {} access",
                req.access.name()
            ));
        }
        return Publish::Incompatible(format!(
            "target path {target} has {} mounted, not this volume",
            describe(m)
        ));
    }
    if req.exclusive {
        let (target, staging) = (trim(req.target), trim(req.staging));
        let elsewhere: Vec<&str> = mounts
            .iter()
            .filter(|m| ids.is_ours(m))
            .map(|m| trim(&m.mount_point))
            .filter(|p| *p != target && *p != staging)
            .collect();
        if !elsewhere.is_empty() {
            return Publish::PublishedElsewhere(format!(
                "the volume is published at {} already and its access mode allows one publication on the \
                 node (use SINGLE_NODE_MULTI_WRITER for several)",
                elsewhere.join(", ")
            ));
        }
    }
    if matches!(req.access, Access::Mount { .. }) {
        match find_mount_by_target(mounts, req.staging) {
            Some(m) if ids.is_filesystem(m) && m.read_only() && !req.readonly => {
                return Publish::NotStaged(format!(
                    "the volume is staged read-only at {}: it cannot be published read-write",
                    req.staging
                ));
            }
            Some(m) if ids.is_filesystem(m) => {}
            Some(m) => {
                return Publish::NotStaged(format!(
                    "staging path {} has {} mounted, not this volume: stage the volume first",
                    req.staging,
                    describe(m)
                ));
            }
            None => {
                return Publish::NotStaged(format!(
                    "the volume is not staged at {}: stage it first",
                    req.staging
                ));
            }
        }
    }
    Publish::Bind
}

/// What to do for `NodeUnpublishVolume` or `NodeUnstageVolume` at a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmount {
    /// Nothing is mounted there.
    Nothing,
    /// The top mount there is this volume's: unmount it (and look again).
    Unmount,
    /// Something else is mounted there: leave it (FAILED_PRECONDITION).
    Foreign(String),
}

/// Decides one unmount step at `path`; `ids` is `None` when the volume's device does not exist (then
/// nothing mounted can be the volume's).
pub fn decide_unmount(mounts: &[MountInfo], ids: Option<&DeviceIds>, path: &str) -> Unmount {
    match find_mount_by_target(mounts, path) {
        None => Unmount::Nothing,
        Some(m) if ids.is_some_and(|ids| ids.is_ours(m)) => Unmount::Unmount,
        Some(m) => Unmount::Foreign(format!(
            "{path} has {} mounted, not this volume: leaving it alone",
            describe(m)
        )),
    }
}

/// What `path` holds of the volume: its filesystem, its block device, or neither (`None`).
pub fn mounted_as<'a>(mounts: &'a [MountInfo], ids: &DeviceIds, path: &str) -> Option<Mounted<'a>> {
    let m = find_mount_by_target(mounts, path)?;
    if ids.is_filesystem(m) {
        Some(Mounted::Filesystem(m))
    } else if ids.is_block(m) {
        Some(Mounted::Block)
    } else {
        None
    }
}

/// See [`mounted_as`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mounted<'a> {
    Filesystem(&'a MountInfo),
    Block,
}

#[cfg(test)]
mod tests {
    use lvms_host::fs::parse_mountinfo;

    use super::*;

    /// The volume is dm-3 (253:3); devtmpfs is 0:5.
    fn ids() -> DeviceIds {
        DeviceIds {
            rdev: (253, 3),
            node_fs: (0, 5),
            node_name: "dm-3".to_owned(),
        }
    }

    const STAGING: &str = "/k/plugins/globalmount";
    const T1: &str = "/k/pods/a/mount";
    const T2: &str = "/k/pods/b/mount";

    fn mount_access() -> Access {
        Access::Mount {
            fstype: None,
            flags: vec![],
        }
    }

    // Lines as the kernel writes them: the staging mount, bind mounts of it (rw and ro), a bind of a
    // subdirectory (kubelet's subPath), a block bind of the device node, and mounts of other things.
    const ROOT: &str =
        "1 0 254:0 / / rw - ext4 /dev/vda rw\n24 1 0:5 / /dev rw,nosuid - devtmpfs devtmpfs rw\n";
    fn staged() -> String {
        format!("{ROOT}40 1 253:3 / {STAGING} rw,relatime - ext4 /dev/mapper/vg-csi rw\n")
    }
    fn line(id: u32, dev: &str, root: &str, target: &str, opts: &str) -> String {
        let (fs, src) = if dev == "0:5" {
            ("devtmpfs", "devtmpfs")
        } else {
            ("ext4", "/dev/mapper/vg-csi")
        };
        format!("{id} 1 {dev} {root} {target} {opts} - {fs} {src} rw\n")
    }

    fn publish(
        table: &str,
        target: &str,
        access: &Access,
        readonly: bool,
        exclusive: bool,
    ) -> Publish {
        decide_publish(
            &parse_mountinfo(table),
            &ids(),
            &PublishArgs {
                target,
                staging: STAGING,
                access,
                readonly,
                exclusive,
            },
        )
    }

    #[test]
    fn publish_table() {
        let m = mount_access();
        let b = Access::Block;
        let at_t1_rw = staged() + &line(41, "253:3", "/", T1, "rw,relatime");
        let at_t1_ro = staged() + &line(41, "253:3", "/", T1, "ro,relatime");
        let block_t1 = format!("{ROOT}{}", line(41, "0:5", "/dm-3", T1, "rw,nosuid"));
        let subpath = staged() + &line(42, "253:3", "/data", "/k/pods/a/subpath/0", "rw");
        let foreign_t1 = staged() + &line(41, "253:9", "/", T1, "rw");
        let other_block_t1 = format!("{ROOT}{}", line(41, "0:5", "/dm-9", T1, "rw"));
        let ro_staged = format!("{ROOT}{}", line(40, "253:3", "/", STAGING, "ro,relatime"));

        type Row<'a> = (&'a str, String, &'a str, &'a Access, bool, bool, &'a str);
        // (case, mount table, target, access, readonly, exclusive, expected decision)
        #[rustfmt::skip]
        let rows: Vec<Row<'_>> = vec![
            ("first publish", staged(), T1, &m, false, true, "Bind"),
            ("same target, same args", at_t1_rw.clone(), T1, &m, false, true, "AlreadyPublished"),
            ("same target, trailing slash", at_t1_rw.clone(), "/k/pods/a/mount/", &m, false, true, "AlreadyPublished"),
            ("same target read-only, same args", at_t1_ro.clone(), T1, &m, true, false, "AlreadyPublished"),
            ("same target, read-only flip", at_t1_rw.clone(), T1, &m, true, true, "Incompatible"),
            ("same target, read-write flip", at_t1_ro.clone(), T1, &m, false, true, "Incompatible"),
            ("same target, block asked, mount there", at_t1_rw.clone(), T1, &b, false, true, "Incompatible"),
            ("same target, mount asked, block there", block_t1.clone(), T1, &m, false, true, "Incompatible"),
            ("same target, another volume there", foreign_t1, T1, &m, false, false, "Incompatible"),
            ("same target, another device node there", other_block_t1, T1, &b, false, false, "Incompatible"),
            ("other target, SINGLE_NODE_WRITER", at_t1_rw.clone(), T2, &m, false, true, "PublishedElsewhere"),
            ("other target, exclusive, read-only", at_t1_ro.clone(), T2, &m, true, true, "PublishedElsewhere"),
            ("other target, MULTI_WRITER", at_t1_rw.clone(), T2, &m, false, false, "Bind"),
            ("other target, reader", at_t1_ro.clone(), T2, &m, true, false, "Bind"),
            ("block elsewhere, exclusive", block_t1.clone(), T2, &b, false, true, "PublishedElsewhere"),
            ("block elsewhere, multi", block_t1.clone(), T2, &b, false, false, "Bind"),
            ("block, never staged (nothing to stage)", ROOT.to_owned(), T1, &b, false, true, "Bind"),
            ("a subPath bind is no publication", subpath, T2, &m, false, true, "Bind"),
            ("the staging mount is no publication", staged(), T2, &m, false, true, "Bind"),
            ("not staged", ROOT.to_owned(), T1, &m, false, false, "NotStaged"),
            ("staged read-only, asked read-write", ro_staged.clone(), T1, &m, false, false, "NotStaged"),
            ("staged read-only, asked read-only", ro_staged, T1, &m, true, false, "Bind"),
            ("staging holds another volume", format!("{ROOT}{}", line(40, "253:9", "/", STAGING, "rw")), T1, &m, false, false, "NotStaged"),
        ];
        for (case, table, target, access, ro, excl, want) in rows {
            let got = publish(&table, target, access, ro, excl);
            let name = format!("{got:?}");
            assert!(name.starts_with(want), "{case}: got {got:?}, want {want}");
        }
    }

    #[test]
    fn publish_messages_say_what_is_where() {
        let at_t1 = staged() + &line(41, "253:3", "/", T1, "rw");
        let Publish::PublishedElsewhere(msg) = publish(&at_t1, T2, &mount_access(), false, true)
        else {
            panic!()
        };
        assert!(msg.contains(T1) && !msg.contains(STAGING), "{msg}");
        let Publish::Incompatible(msg) = publish(&at_t1, T1, &mount_access(), true, true) else {
            panic!()
        };
        assert!(msg.contains("read-write, not read-only"), "{msg}");
        let Publish::Incompatible(msg) = publish(&at_t1, T1, &Access::Block, false, true) else {
            panic!()
        };
        assert!(msg.contains("mount access, not block access"), "{msg}");
    }

    #[test]
    fn stage_table() {
        let st = |table: &str, fs: Option<&str>, ro: bool| {
            decide_stage(&parse_mountinfo(table), &ids(), STAGING, fs, ro)
        };
        assert_eq!(st(ROOT, None, false), Stage::Mount);
        assert_eq!(st(&staged(), None, false), Stage::AlreadyStaged);
        assert_eq!(st(&staged(), Some("ext4"), false), Stage::AlreadyStaged);
        assert!(
            matches!(st(&staged(), Some("xfs"), false), Stage::Incompatible(m) if m.contains("ext4, not xfs"))
        );
        assert!(
            matches!(st(&staged(), None, true), Stage::Incompatible(m) if m.contains("read-write, not read-only"))
        );
        let other = format!("{ROOT}{}", line(40, "253:9", "/", STAGING, "rw"));
        assert!(matches!(st(&other, None, false), Stage::Incompatible(m) if m.contains("253:9")));

        let blk = |table: &str| decide_stage_block(&parse_mountinfo(table), &ids(), STAGING);
        blk(ROOT).unwrap();
        blk(&other).unwrap();
        assert!(blk(&staged()).unwrap_err().contains("ext4 filesystem"));
    }

    #[test]
    fn unmount_table() {
        let at_t1 = staged() + &line(41, "253:3", "/", T1, "rw");
        let block = format!("{ROOT}{}", line(41, "0:5", "/dm-3", T1, "rw"));
        let foreign = format!("{ROOT}{}", line(41, "253:9", "/", T1, "rw"));
        let un = |table: &str, ids: Option<&DeviceIds>, p: &str| {
            decide_unmount(&parse_mountinfo(table), ids, p)
        };
        let i = ids();
        assert_eq!(un(ROOT, Some(&i), T1), Unmount::Nothing);
        assert_eq!(un(ROOT, None, T1), Unmount::Nothing);
        assert_eq!(un(&at_t1, Some(&i), T1), Unmount::Unmount);
        assert_eq!(un(&at_t1, Some(&i), STAGING), Unmount::Unmount);
        assert_eq!(un(&block, Some(&i), T1), Unmount::Unmount);
        assert!(matches!(un(&foreign, Some(&i), T1), Unmount::Foreign(m) if m.contains("253:9")));
        assert!(matches!(un(&at_t1, None, T1), Unmount::Foreign(_)));
    }

    #[test]
    fn mounted_as_tells_filesystem_block_and_neither_apart() {
        let table =
            staged() + &line(41, "0:5", "/dm-3", T1, "rw") + &line(42, "253:3", "/sub", T2, "rw");
        let mounts = parse_mountinfo(&table);
        assert!(matches!(
            mounted_as(&mounts, &ids(), STAGING),
            Some(Mounted::Filesystem(m)) if m.fs_type == "ext4"
        ));
        assert_eq!(mounted_as(&mounts, &ids(), T1), Some(Mounted::Block));
        assert_eq!(mounted_as(&mounts, &ids(), T2), None);
        assert_eq!(mounted_as(&mounts, &ids(), "/nowhere"), None);
    }
}
