//! The CSI Node service: stage (activate, format when blank, mount), publish (bind mounts, filesystem or
//! block), unpublish and unstage, stats with the volume's condition, and online filesystem growth.
//!
//! Every decision is read from `/proc/self/mountinfo` ([`table`]), never kept only in memory, so a
//! restarted driver answers retries as the one before it would have. Requests are checked before
//! anything runs ([`request`]); one operation per volume runs at a time ([`InFlight`]), a second gets
//! ABORTED. Inline ephemeral volumes (made at publish, removed at unpublish) are [`ephemeral`]; the
//! errors of each call, with their gRPC codes, are `errors`.

pub mod ephemeral;
mod errors;
pub mod request;
pub mod table;

use std::{
    collections::HashMap,
    io::{self, SeekFrom},
    sync::Arc,
};

use lvms_core::config::Fstype;
use lvms_host::{
    fs::{Filesystems, MountInfo, find_mount_by_target, fstype_name, statvfs},
    runner::Runner,
};
use tokio::io::AsyncSeekExt as _;
use tonic::{Request, Response, Status};

pub use self::errors::{
    ExpandError, PublishError, RequestError, StageError, StatsError, UnpublishError, UnstageError,
};
use self::{
    request::{Access, Invalid, known_fstype},
    table::{DeviceIds, Mounted, Publish, Stage, Unmount},
};
use crate::csi::{
    self, NodeExpandVolumeRequest, NodeExpandVolumeResponse, NodeGetCapabilitiesRequest,
    NodeGetCapabilitiesResponse, NodeGetInfoRequest, NodeGetInfoResponse,
    NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse, NodePublishVolumeRequest,
    NodePublishVolumeResponse, NodeServiceCapability, NodeStageVolumeRequest,
    NodeStageVolumeResponse, NodeUnpublishVolumeRequest, NodeUnpublishVolumeResponse,
    NodeUnstageVolumeRequest, NodeUnstageVolumeResponse, Topology, VolumeCondition, VolumeUsage,
    node_service_capability, volume_usage::Unit,
};
use lvms_engine::{
    backend::{Backend, Volume},
    locks::{Guard, InFlight},
};

/// How many mounts stacked at one path unpublish and unstage take off before giving up.
const MAX_STACKED_MOUNTS: usize = 8;

/// How the Node service is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOptions {
    /// The filesystem made on a blank volume when neither the capability nor the volume's class
    /// ([`lvms_engine::backend::DeviceClassConfig::fstype`]) names one.
    pub default_fstype: Fstype,
    /// The topology key `NodeGetInfo` names this node under ([`crate::TOPOLOGY_NODE_KEY`]; another
    /// driver's for volumes served under its name, ADR 0033).
    pub topology_key: &'static str,
    /// Whether `NodeExpandVolume` grows the volume itself when it is smaller than asked (the
    /// Controller service then advertises no `EXPAND_VOLUME`: csi-driver-lvm's way, ADR 0033).
    /// Otherwise ControllerExpandVolume grows it and the node only grows the filesystem.
    pub grows_volume: bool,
}

impl Default for NodeOptions {
    /// ext4, as TopoLVM and LVMS default to, and lvms-rs's topology key.
    fn default() -> Self {
        Self {
            default_fstype: Fstype::Ext4,
            topology_key: crate::TOPOLOGY_NODE_KEY,
            grows_volume: false,
        }
    }
}

/// The CSI Node service over a volume [`Backend`] and the host's filesystem tools.
#[derive(Debug)]
pub struct NodeService<B, R> {
    backend: Arc<B>,
    fs: Filesystems<R>,
    in_flight: InFlight,
    options: NodeOptions,
    /// Where sysfs is (`/sys`; tests give their own).
    sys_root: std::path::PathBuf,
    /// Where the fence hook leaves its records ([`lvms_host::fence::RECORD_DIR`]).
    fence_records: std::path::PathBuf,
}

// ---- errors ----

// ---- devices and files ----

fn dev_pair(dev: u64) -> (u32, u32) {
    (rustix::fs::major(dev), rustix::fs::minor(dev))
}

/// How the mount table shows `device` ([`DeviceIds`]); `Ok(None)` when it does not exist.
fn device_ids(device: &str) -> Result<Option<DeviceIds>, RequestError> {
    let err = |source| RequestError::Device {
        device: device.to_owned(),
        source,
    };
    if device.is_empty() {
        return Ok(None);
    }
    let real = match std::fs::canonicalize(device) {
        Ok(real) => real,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let st = rustix::fs::stat(&real).map_err(|e| err(e.into()))?;
    #[allow(clippy::useless_conversion)] // st_rdev and st_dev are not u64 on every target
    let (rdev, dev) = (u64::from(st.st_rdev), u64::from(st.st_dev));
    Ok(Some(DeviceIds {
        rdev: dev_pair(rdev),
        node_fs: dev_pair(dev),
        node_name: real
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    }))
}

/// The size of a block device in bytes (its end, found by seeking).
async fn device_size(device: &str) -> Result<u64, RequestError> {
    let err = |source| RequestError::Device {
        device: device.to_owned(),
        source,
    };
    let mut f = tokio::fs::File::open(device).await.map_err(err)?;
    f.seek(SeekFrom::End(0)).await.map_err(err)
}

fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// What a mount at `path` would hide, or `None` when nothing: the path is missing, an empty
/// directory or an empty file. A node plugin mounts only over what holds nothing, so it never hides
/// data it did not put there (issue 35: an inline volume published at `/etc` was mounted over it).
async fn hidden_by_mount(path: &str) -> io::Result<Option<String>> {
    match tokio::fs::symlink_metadata(path).await {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
        Ok(md) if md.is_dir() => {
            let mut entries = tokio::fs::read_dir(path).await?;
            Ok(entries.next_entry().await?.map(|e| {
                format!(
                    "a directory that is not empty (it holds {:?})",
                    e.file_name()
                )
            }))
        }
        Ok(md) if md.is_file() && md.len() == 0 => Ok(None),
        Ok(md) if md.is_file() => Ok(Some(format!("a file of {} bytes", md.len()))),
        Ok(md) => Ok(Some(format!("a {:?}", md.file_type()))),
    }
}

/// [`hidden_by_mount`] as the refusal `what` gets (FAILED_PRECONDITION, naming the path).
async fn refuse_to_hide(field: &str, path: &str) -> Result<(), PublishError> {
    match hidden_by_mount(path).await {
        Ok(None) => Ok(()),
        Ok(Some(what)) => Err(PublishError::WouldHide(format!(
            "{field} {path} is {what}: lvms-rs mounts only over a missing path, an empty \
             directory or an empty file, never over what it did not put there; give an empty path"
        ))),
        Err(e) => Err(PublishError::CreateTarget(path.to_owned(), e)),
    }
}

/// Creates the publish target when missing: a directory for a filesystem, a file for a block device.
/// One that exists must hold nothing ([`hidden_by_mount`]). Returns whether it was created.
async fn prepare_target(target: &str, block: bool) -> Result<bool, PublishError> {
    let (want, want_name) = if block {
        (true, "a file")
    } else {
        (false, "a directory")
    };
    match tokio::fs::symlink_metadata(target).await {
        Ok(md) if (block && md.is_file()) || (!block && md.is_dir()) => {
            refuse_to_hide("target path", target).await?;
            Ok(false)
        }
        Ok(md) => Err(PublishError::TargetKind(format!(
            "target path {target} exists and is not {want_name} ({:?}), which {} access needs",
            md.file_type(),
            if want { "block" } else { "mount" }
        ))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let create = |e| PublishError::CreateTarget(target.to_owned(), e);
            if let Some(parent) = std::path::Path::new(target).parent() {
                tokio::fs::create_dir_all(parent).await.map_err(create)?;
            }
            if block {
                tokio::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(target)
                    .await
                    .map_err(create)?;
            } else {
                tokio::fs::create_dir(target).await.map_err(create)?;
            }
            Ok(true)
        }
        Err(e) => Err(PublishError::CreateTarget(target.to_owned(), e)),
    }
}

/// Removes the file or (empty) directory publish created; a missing target is fine. Never removes
/// anything recursively: a directory with content is an error.
async fn remove_target(target: &str) -> io::Result<()> {
    let result = match tokio::fs::symlink_metadata(target).await {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
        Ok(md) if md.is_dir() => tokio::fs::remove_dir(target).await,
        Ok(_) => tokio::fs::remove_file(target).await,
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn condition(vol: &Volume) -> VolumeCondition {
    VolumeCondition {
        abnormal: vol.health.is_abnormal(),
        message: format!("{:?}: {}", vol.health, vol.health.message()),
    }
}

// ---- the service ----

impl<B: Backend, R: Runner> NodeService<B, R> {
    /// A Node service for the volumes of `backend`, mounting with `fs`.
    pub fn new(backend: Arc<B>, fs: Filesystems<R>, options: NodeOptions) -> Self {
        Self {
            backend,
            fs,
            in_flight: InFlight::default(),
            options,
            sys_root: std::path::PathBuf::from("/sys"),
            fence_records: std::path::PathBuf::from(lvms_host::fence::RECORD_DIR),
        }
    }

    /// Reads sysfs under `sys_root` instead of `/sys`, and the fence hook's records from
    /// `fence_records`.
    #[must_use]
    pub fn with_host_paths(
        mut self,
        sys_root: impl Into<std::path::PathBuf>,
        fence_records: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.sys_root = sys_root.into();
        self.fence_records = fence_records.into();
        self
    }

    /// For unpublish and unstage of a volume no class here serves: its device-mapper device if
    /// one is still here, as after the fence hook gave a shared class's devices the `error`
    /// target, or after the volume was handed to another node while still mounted here. Kubelet
    /// must be able to unmount it, or nothing of the class is ever free on this node again. With
    /// `fenced_only` (no class is served here at all, which is also the case while the node
    /// agent starts) only a device of a class the fence hook fenced counts.
    fn leftover_device(
        &self,
        id: &str,
        fenced_only: bool,
    ) -> Result<Option<DeviceIds>, RequestError> {
        let found = lvms_host::fence::lv_device(&self.sys_root, id).map_err(|source| {
            RequestError::Device {
                device: format!("{}/block/dm-*", self.sys_root.display()),
                source,
            }
        })?;
        let Some(found) = found.filter(|f| {
            !fenced_only || lvms_host::fence::record_path(&self.fence_records, &f.vg).exists()
        }) else {
            return Ok(None);
        };
        let dev_fs = rustix::fs::stat("/dev").map_err(|e| RequestError::Device {
            device: "/dev".to_owned(),
            source: e.into(),
        })?;
        #[allow(clippy::useless_conversion)] // st_dev is not u64 on every target
        let node_fs = dev_pair(u64::from(dev_fs.st_dev));
        tracing::warn!(
            device = %found.name,
            "the volume is not served on this node (its class fenced, or the volume handed to \
             another node), but its device is still here: unmounting what of it kubelet asks"
        );
        Ok(Some(DeviceIds {
            rdev: found.dev,
            node_fs,
            node_name: found.kernel,
        }))
    }

    /// Claims the volume (as [`Self::begin`]) for unpublish or unstage: the volume (`None`: not
    /// served here, its device left here, [`Self::leftover_device`]) and the ids of its device
    /// (`None`: it has none, so nothing mounted is it).
    async fn begin_unmount(
        &self,
        id: &str,
    ) -> Result<(Guard, Option<Volume>, Option<DeviceIds>), RequestError> {
        let guard = self
            .in_flight
            .try_claim(&[id])
            .map_err(RequestError::Busy)?;
        let err = match self.lookup(id).await {
            Ok(vol) => {
                let ids = device_ids(&vol.device)?;
                return Ok((guard, Some(vol), ids));
            }
            Err(e) => e,
        };
        let fenced_only = match &err {
            RequestError::NotFound(_) => false,
            RequestError::Lookup {
                source: lvms_engine::backend::BackendError::Unavailable(_),
                ..
            } => true,
            _ => return Err(err),
        };
        match self.leftover_device(id, fenced_only)? {
            Some(ids) => Ok((guard, None, Some(ids))),
            None => Err(err),
        }
    }

    /// The volume, or NOT_FOUND.
    async fn lookup(&self, id: &str) -> Result<Volume, RequestError> {
        self.backend
            .get(id)
            .await
            .map_err(|source| RequestError::Lookup {
                id: id.to_owned(),
                source,
            })?
            .ok_or_else(|| {
                RequestError::NotFound(format!(
                    "volume {id} does not exist on node {}",
                    self.backend.node_id()
                ))
            })
    }

    /// Claims the volume for this operation (ABORTED when another one runs), then looks it up.
    async fn begin(&self, id: &str) -> Result<(Guard, Volume), RequestError> {
        let guard = self
            .in_flight
            .try_claim(&[id])
            .map_err(RequestError::Busy)?;
        Ok((guard, self.lookup(id).await?))
    }

    /// The filesystem of a blank volume of `class` whose capability names none: the class's, else the
    /// driver's default.
    fn fstype_of_class(&self, class: &str) -> Fstype {
        self.backend
            .classes()
            .iter()
            .find(|c| c.name == class)
            .and_then(|c| c.fstype)
            .unwrap_or(self.options.default_fstype)
    }

    async fn mounts(&self) -> Result<Vec<MountInfo>, RequestError> {
        self.fs.mounts().await.map_err(RequestError::Mounts)
    }

    /// `NodeStageVolume`: activates the volume; for a filesystem also formats it when blank, mounts it
    /// at the staging path, and grows a filesystem smaller than its device (a restore or clone larger
    /// than its source, or a volume expanded while unstaged).
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, staging = %req.staging_target_path))]
    pub async fn stage(
        &self,
        req: &NodeStageVolumeRequest,
    ) -> Result<NodeStageVolumeResponse, StageError> {
        request::volume_id(&req.volume_id)?;
        request::path("staging_target_path", &req.staging_target_path)?;
        let cap = request::capability(req.volume_capability.as_ref())?;
        let readonly = cap.reader_only() || cap.ro_flag();
        if let Access::Mount { flags, .. } = &cap.access
            && readonly
            && flags.iter().any(|f| f == "rw")
        {
            return Err(Invalid::Argument(
                "mount flag rw contradicts the read-only access mode".to_owned(),
            )
            .into());
        }
        request::our_volume_id(&req.volume_id)?;
        let staging = req.staging_target_path.as_str();
        let (_guard, vol) = self.begin(&req.volume_id).await?;
        if matches!(cap.access, Access::Mount { .. }) {
            match tokio::fs::metadata(staging).await {
                Ok(md) if md.is_dir() => {}
                Ok(_) => return Err(StageError::StagingNotDir(staging.to_owned())),
                Err(e) => return Err(StageError::StagingPath(staging.to_owned(), e)),
            }
        }
        let device = self
            .backend
            .activate_for(&vol.id, cap.multi_node())
            .await
            .map_err(|source| StageError::Activate {
                id: vol.id.clone(),
                source,
            })?;
        let ids = device_ids(&device)?.ok_or_else(|| RequestError::Device {
            device: device.clone(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such device after activation"),
        })?;
        let mounts = self.mounts().await?;
        let (asked, flags) = match &cap.access {
            Access::Block => {
                table::decide_stage_block(&mounts, &ids, staging)
                    .map_err(StageError::Incompatible)?;
                tracing::info!(device, "staged for block access (activated)");
                return Ok(NodeStageVolumeResponse {});
            }
            Access::Mount { fstype, flags } => (*fstype, flags),
        };
        let host = |step: &'static str| {
            let device = device.clone();
            move |source| StageError::Host {
                step,
                device,
                source,
            }
        };
        match table::decide_stage(&mounts, &ids, staging, asked.map(fstype_name), readonly) {
            Stage::Incompatible(m) => return Err(StageError::Incompatible(m)),
            Stage::AlreadyStaged => {
                let fstype =
                    find_mount_by_target(&mounts, staging).and_then(|m| known_fstype(&m.fs_type));
                if let (Some(fstype), false) = (fstype, readonly) {
                    self.fs
                        .grow(&device, staging, fstype)
                        .await
                        .map_err(host("growing the filesystem of"))?;
                }
                tracing::debug!(device, "already staged");
                return Ok(NodeStageVolumeResponse {});
            }
            Stage::Mount => {}
        }
        match hidden_by_mount(staging).await {
            Ok(None) => {}
            Ok(Some(what)) => return Err(StageError::WouldHide(staging.to_owned(), what)),
            Err(e) => return Err(StageError::StagingPath(staging.to_owned(), e)),
        }
        let found = self.fs.detect_fs(&device).await.map_err(host("probing"))?;
        let (fstype, blank) = match found {
            None => (
                asked.unwrap_or_else(|| self.fstype_of_class(&vol.class)),
                true,
            ),
            Some(sig) => match (known_fstype(&sig), asked) {
                (Some(have), Some(want)) if have != want => {
                    return Err(StageError::WrongFilesystem {
                        device,
                        found: sig,
                        wanted: fstype_name(want),
                    });
                }
                (Some(have), _) => (have, false),
                (None, _) => {
                    return Err(StageError::UnsupportedSignature { device, found: sig });
                }
            },
        };
        if blank {
            tracing::info!(device, fstype = fstype_name(fstype), "formatting");
            self.fs
                .mkfs(&device, fstype)
                .await
                .map_err(host("formatting"))?;
        }
        self.fs
            .mount(&device, staging, fstype, flags, readonly)
            .await
            .map_err(host("mounting"))?;
        if !blank && !readonly {
            // Growing to the current size does nothing; this catches a device larger than its filesystem.
            self.fs
                .grow(&device, staging, fstype)
                .await
                .map_err(host("growing the filesystem of"))?;
        }
        tracing::info!(device, fstype = fstype_name(fstype), readonly, "staged");
        Ok(NodeStageVolumeResponse {})
    }

    /// `NodeUnstageVolume`: unmounts the volume's filesystem from the staging path; nothing mounted is
    /// fine. A local LV stays active; a shared class's LV is deactivated, so another node can take it.
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, staging = %req.staging_target_path))]
    pub async fn unstage(
        &self,
        req: &NodeUnstageVolumeRequest,
    ) -> Result<NodeUnstageVolumeResponse, UnstageError> {
        request::volume_id(&req.volume_id)?;
        request::path("staging_target_path", &req.staging_target_path)?;
        request::our_volume_id(&req.volume_id)?;
        let staging = req.staging_target_path.as_str();
        let (_guard, vol, ids) = self.begin_unmount(&req.volume_id).await?;
        for _ in 0..MAX_STACKED_MOUNTS {
            match table::decide_unmount(&self.mounts().await?, ids.as_ref(), staging) {
                Unmount::Nothing => {
                    // Not served here: the node agent removes the device when the class joins
                    // again (a fenced class), or it was never active here.
                    let Some(vol) = vol else {
                        tracing::info!("unstaged (the volume is not served on this node)");
                        return Ok(NodeUnstageVolumeResponse {});
                    };
                    self.backend.release(&vol.id).await.map_err(|source| {
                        UnstageError::Release {
                            id: vol.id.clone(),
                            source,
                        }
                    })?;
                    tracing::info!("unstaged");
                    return Ok(NodeUnstageVolumeResponse {});
                }
                Unmount::Foreign(m) => return Err(UnstageError::Foreign(m)),
                Unmount::Unmount => self
                    .fs
                    .unmount(staging)
                    .await
                    .map_err(|e| UnstageError::Unmount(staging.to_owned(), e))?,
            }
        }
        Err(UnstageError::StillMounted(staging.to_owned()))
    }

    /// `NodePublishVolume`: bind-mounts the staging directory (filesystem) or the device node (block) at
    /// the target, which it creates, deciding by the spec's table ([`table::decide_publish`]).
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, target = %req.target_path))]
    pub async fn publish(
        &self,
        req: &NodePublishVolumeRequest,
    ) -> Result<NodePublishVolumeResponse, PublishError> {
        request::volume_id(&req.volume_id)?;
        request::path("target_path", &req.target_path)?;
        let cap = request::capability(req.volume_capability.as_ref())?;
        if ephemeral::is_ephemeral(&req.volume_context) {
            return self.publish_ephemeral(req, &cap).await;
        }
        if req.staging_target_path.is_empty() {
            return Err(PublishError::StagingRequired);
        }
        request::path("staging_target_path", &req.staging_target_path)?;
        request::our_volume_id(&req.volume_id)?;
        let (target, staging) = (req.target_path.as_str(), req.staging_target_path.as_str());
        let readonly = req.readonly || cap.reader_only();
        let (_guard, vol) = self.begin(&req.volume_id).await?;
        let ids = device_ids(&vol.device)?.ok_or_else(|| {
            PublishError::NotStaged(format!(
                "the device of volume {} ({}) does not exist: stage the volume first",
                vol.id, vol.device
            ))
        })?;
        let args = table::PublishArgs {
            target,
            staging,
            access: &cap.access,
            readonly,
            exclusive: cap.exclusive(),
        };
        match table::decide_publish(&self.mounts().await?, &ids, &args) {
            Publish::Bind => {}
            Publish::AlreadyPublished => {
                tracing::debug!("already published");
                return Ok(NodePublishVolumeResponse {});
            }
            Publish::Incompatible(m) => return Err(PublishError::Incompatible(m)),
            Publish::PublishedElsewhere(m) => return Err(PublishError::PublishedElsewhere(m)),
            Publish::NotStaged(m) => return Err(PublishError::NotStaged(m)),
        }
        let block = cap.access == Access::Block;
        let src = if block { vol.device.as_str() } else { staging };
        let created = prepare_target(target, block).await?;
        if let Err(source) = self.fs.bind_mount(src, target, readonly).await {
            if created && let Err(e) = remove_target(target).await {
                tracing::warn!(error = %e, "could not remove the target after a failed bind mount");
            }
            return Err(PublishError::Bind {
                src: src.to_owned(),
                target: target.to_owned(),
                source,
            });
        }
        tracing::info!(src, readonly, access = cap.access.name(), "published");
        Ok(NodePublishVolumeResponse {})
    }

    /// `NodeUnpublishVolume`: unmounts the volume from the target and removes the file or directory
    /// publish created; a target not mounted or missing is fine.
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, target = %req.target_path))]
    pub async fn unpublish(
        &self,
        req: &NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, UnpublishError> {
        request::volume_id(&req.volume_id)?;
        request::path("target_path", &req.target_path)?;
        if !lvms_engine::ids::is_volume_id(&req.volume_id)
            && !lvms_engine::ids::is_taken_over_id(&req.volume_id)
        {
            // Not an id this driver hands out: the CO's id of an inline ephemeral volume, or none.
            return self.unpublish_ephemeral(req).await;
        }
        let target = req.target_path.as_str();
        let (_guard, _, ids) = self.begin_unmount(&req.volume_id).await?;
        self.unmount_ids(target, ids).await?;
        tracing::info!("unpublished");
        Ok(NodeUnpublishVolumeResponse {})
    }

    /// Unmounts what of `vol` is mounted at `target` (stacked mounts too), then removes the file or
    /// directory publish created. `vol` `None`: the volume has no device, so nothing mounted is it.
    async fn unmount_target(
        &self,
        target: &str,
        vol: impl Into<Option<&Volume>>,
    ) -> Result<(), UnpublishError> {
        let ids = match vol.into() {
            Some(vol) => device_ids(&vol.device)?,
            None => None,
        };
        self.unmount_ids(target, ids).await
    }

    /// [`Self::unmount_target`] of the device `ids` names (`None`: no device).
    async fn unmount_ids(
        &self,
        target: &str,
        ids: Option<DeviceIds>,
    ) -> Result<(), UnpublishError> {
        for _ in 0..MAX_STACKED_MOUNTS {
            match table::decide_unmount(&self.mounts().await?, ids.as_ref(), target) {
                Unmount::Nothing => {
                    remove_target(target)
                        .await
                        .map_err(|e| UnpublishError::RemoveTarget(target.to_owned(), e))?;
                    return Ok(());
                }
                Unmount::Foreign(m) => return Err(UnpublishError::Foreign(m)),
                Unmount::Unmount => self
                    .fs
                    .unmount(target)
                    .await
                    .map_err(|e| UnpublishError::Unmount(target.to_owned(), e))?,
            }
        }
        Err(UnpublishError::StillMounted(target.to_owned()))
    }

    /// `NodeGetVolumeStats`: bytes and inodes of a mounted filesystem, or the size of a published block
    /// device, with the volume's condition from LVM.
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, path = %req.volume_path))]
    pub async fn stats(
        &self,
        req: &NodeGetVolumeStatsRequest,
    ) -> Result<NodeGetVolumeStatsResponse, StatsError> {
        request::volume_id(&req.volume_id)?;
        request::volume_path("volume_path", &req.volume_path)?;
        request::optional_path("staging_target_path", &req.staging_target_path)?;
        let vol = match self.ephemeral_volume(&req.volume_id).await? {
            Some(vol) => vol,
            None => {
                request::our_volume_id(&req.volume_id)?;
                self.lookup(&req.volume_id).await?
            }
        };
        let path = req.volume_path.as_str();
        let not_here = || {
            StatsError::NotMounted(format!(
                "volume {} is not staged or published at {path}",
                vol.id
            ))
        };
        let ids = device_ids(&vol.device)?.ok_or_else(not_here)?;
        let mounts = self.mounts().await?;
        let usage = match table::mounted_as(&mounts, &ids, path).ok_or_else(not_here)? {
            Mounted::Filesystem(_) => {
                let st = statvfs(path).map_err(|e| StatsError::Statvfs(path.to_owned(), e))?;
                vec![
                    VolumeUsage {
                        available: i64_of(st.available_bytes),
                        total: i64_of(st.total_bytes),
                        used: i64_of(st.used_bytes),
                        unit: Unit::Bytes as i32,
                    },
                    VolumeUsage {
                        available: i64_of(st.free_inodes),
                        total: i64_of(st.total_inodes),
                        used: i64_of(st.used_inodes),
                        unit: Unit::Inodes as i32,
                    },
                ]
            }
            Mounted::Block => vec![VolumeUsage {
                total: i64_of(device_size(&vol.device).await?),
                unit: Unit::Bytes as i32,
                ..Default::default()
            }],
        };
        Ok(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: Some(condition(&vol)),
        })
    }

    /// `NodeExpandVolume`: grows the filesystem mounted at the volume path to the size of its device
    /// (online: ext4 with `resize2fs`, XFS with `xfs_growfs`); a block volume has nothing to grow.
    /// Answers the device's size.
    #[tracing::instrument(skip_all, fields(volume_id = %req.volume_id, path = %req.volume_path))]
    pub async fn expand(
        &self,
        req: &NodeExpandVolumeRequest,
    ) -> Result<NodeExpandVolumeResponse, ExpandError> {
        request::volume_id(&req.volume_id)?;
        request::volume_path("volume_path", &req.volume_path)?;
        request::optional_path("staging_target_path", &req.staging_target_path)?;
        let cap = req
            .volume_capability
            .as_ref()
            .map(|c| request::capability(Some(c)))
            .transpose()?;
        request::our_volume_id(&req.volume_id)?;
        let path = req.volume_path.as_str();
        let (_guard, vol) = self.begin(&req.volume_id).await?;
        let not_here = || {
            ExpandError::NotMounted(format!(
                "volume {} is not staged or published at {path}",
                vol.id
            ))
        };
        let ids = device_ids(&vol.device)?.ok_or_else(not_here)?;
        let mut size = device_size(&vol.device).await?;
        let required = req
            .capacity_range
            .as_ref()
            .map_or(0, |r| u64::try_from(r.required_bytes).unwrap_or(0));
        if self.options.grows_volume && required > size {
            self.backend
                .expand(&vol.id, required)
                .await
                .map_err(ExpandError::Volume)?;
            size = device_size(&vol.device).await?;
            tracing::info!(size, "volume grown");
        }
        if let Some(range) = &req.capacity_range {
            if required > size {
                return Err(ExpandError::OutOfRange(format!(
                    "volume {} is {size} bytes, less than the {} required: expand it with the controller first",
                    vol.id, range.required_bytes
                )));
            }
            if range.limit_bytes > 0 && u64::try_from(range.limit_bytes).unwrap_or(0) < size {
                return Err(ExpandError::OutOfRange(format!(
                    "volume {} is {size} bytes, more than the limit of {}",
                    vol.id, range.limit_bytes
                )));
            }
        }
        let response = NodeExpandVolumeResponse {
            capacity_bytes: i64_of(size),
        };
        if cap.as_ref().is_some_and(|c| c.access == Access::Block) {
            return Ok(response);
        }
        let mounts = self.mounts().await?;
        let m = match table::mounted_as(&mounts, &ids, path).ok_or_else(not_here)? {
            Mounted::Block => return Ok(response),
            Mounted::Filesystem(m) => m,
        };
        let fstype = known_fstype(&m.fs_type).ok_or_else(|| {
            ExpandError::CannotGrow(format!(
                "{path} has a {} filesystem, which this node cannot grow",
                m.fs_type
            ))
        })?;
        if m.read_only() {
            return Err(ExpandError::CannotGrow(format!(
                "{path} is mounted read-only: the filesystem cannot be grown there"
            )));
        }
        self.fs
            .grow(&vol.device, path, fstype)
            .await
            .map_err(|source| ExpandError::Grow {
                device: vol.device.clone(),
                path: path.to_owned(),
                source,
            })?;
        tracing::info!(size, fstype = fstype_name(fstype), "filesystem grown");
        Ok(response)
    }

    /// `NodeGetInfo`: the node id, and the node as the volumes' topology; on a node that joined
    /// shared classes also `shared.lvms.topolvm.io/<class>: "true"` for each, the segment their
    /// volumes are accessible from.
    pub async fn info(&self) -> NodeGetInfoResponse {
        let node = self.backend.node_id().to_owned();
        let mut segments = HashMap::from([(self.options.topology_key.to_owned(), node.clone())]);
        for class in self.backend.joined_shared().await {
            segments.insert(lvms_api::shared_topology_key(&class), "true".to_owned());
        }
        NodeGetInfoResponse {
            node_id: node,
            max_volumes_per_node: 0,
            accessible_topology: Some(Topology { segments }),
        }
    }

    /// `NodeGetCapabilities`.
    pub fn capabilities() -> NodeGetCapabilitiesResponse {
        use node_service_capability::{Rpc, Type, rpc::Type as T};
        NodeGetCapabilitiesResponse {
            capabilities: [
                T::StageUnstageVolume,
                T::GetVolumeStats,
                T::ExpandVolume,
                T::VolumeCondition,
                T::SingleNodeMultiWriter,
            ]
            .into_iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: t as i32 })),
            })
            .collect(),
        }
    }
}

/// The answer to the CO; a failure is logged with its code and whole message.
fn respond<T, E: Into<Status>>(result: Result<T, E>) -> Result<Response<T>, Status> {
    result.map(Response::new).map_err(|e| {
        let status: Status = e.into();
        tracing::warn!(code = ?status.code(), error = status.message(), "request failed");
        status
    })
}

#[tonic::async_trait]
impl<B: Backend, R: Runner> csi::node_server::Node for NodeService<B, R> {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        respond(self.stage(request.get_ref()).await)
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        respond(self.unstage(request.get_ref()).await)
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        respond(self.publish(request.get_ref()).await)
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        respond(self.unpublish(request.get_ref()).await)
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        respond(self.stats(request.get_ref()).await)
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        respond(self.expand(request.get_ref()).await)
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(Self::capabilities()))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(self.info().await))
    }
}

#[cfg(test)]
mod tests;
