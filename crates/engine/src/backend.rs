//! Where volumes are made: the [`Backend`] trait the Controller and Node services are written against.
//! [`crate::local::LocalBackend`] makes them with LVM on this node (standalone mode, and the node agent
//! later); the Kubernetes controller (LogicalVolume objects answered by node agents) will be another
//! implementation.

use std::future::Future;

use lvms_core::lvattr::LvHealth;
pub use lvms_core::{config::DeviceClassConfig, layout::Layout};

pub use crate::ids::{EphemeralOwner, Source};

/// A volume or snapshot as found on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Volume {
    /// The volume (or snapshot) id, which is the LV name.
    pub id: String,
    /// The device class (volume group) it lives in.
    pub class: String,
    /// Size in bytes (a snapshot: the size of its source when taken).
    pub size: u64,
    /// The CO's name for it, from its tag.
    pub name: Option<String>,
    /// Its content source, from its tag.
    pub source: Option<Source>,
    /// Whether it is a snapshot.
    pub snapshot: bool,
    /// Whether it is a thin volume.
    pub thin: bool,
    /// Creation time, seconds since the Unix epoch (snapshots record it).
    pub created: Option<u64>,
    /// Restores and clones: the size asked for when it was made (from its tag).
    pub requested: Option<u64>,
    /// Health from `lv_attr`.
    pub health: LvHealth,
    /// The block device, `/dev/<vg>/<lv>` (present once active).
    pub device: String,
    /// An inline ephemeral volume: the pod it was made for (from its tags).
    pub ephemeral: Option<EphemeralOwner>,
    /// Whether its device is open (mounted or in use), from `lv_attr`.
    pub open: bool,
}

/// A volume to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVolume {
    /// The CO's name.
    pub name: String,
    /// The class; already resolved (never empty).
    pub class: String,
    /// Bytes, already rounded as the backend needs.
    pub size: u64,
    /// Thick classes: the layout.
    /// The layout asked for; `None`: the class's [`DeviceClassConfig::layout`].
    pub lv_type: Option<Layout>,
    /// Shared classes: linear or thin volume; `None`: the class's `sharedConfig.volumeMode`.
    pub volume_mode: Option<lvms_core::config::SharedVolumeMode>,
    /// Thin classes: the snapshot or volume to start from (same class, same node).
    pub source: Option<Source>,
    /// An inline ephemeral volume (made by `NodePublishVolume`): the pod it is for, recorded in its
    /// tags. `None` for persistent volumes.
    pub ephemeral: Option<EphemeralOwner>,
}

/// A snapshot to take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSnapshot {
    /// The CO's name.
    pub name: String,
    /// The volume to snapshot.
    pub source_volume: String,
}

/// What a class can still hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    /// Bytes a new volume may take now (thick: VG free; thin: overprovisioned free capped by the pool).
    pub available: u64,
    /// The largest single volume that fits now.
    pub maximum_volume_size: u64,
    /// The smallest volume worth making (one extent).
    pub minimum_volume_size: u64,
    /// Thick layouts other than linear: how many LVM physical volumes (disks) the class's group
    /// has, which bounds the layouts it can make at all.
    pub devices: Option<u64>,
}

/// Why a backend call failed; the services map it to a gRPC code.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// No such volume, snapshot or class.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be honoured as asked (a thick class asked for a snapshot, a source in another
    /// class, a size the layout cannot make).
    #[error("{0}")]
    InvalidArgument(String),
    /// Not enough space.
    #[error("{0}")]
    InsufficientSpace(String),
    /// Something on disk contradicts the request (an LV with our name but not ours).
    #[error("{0}")]
    Conflict(String),
    /// The operation cannot run now (a volume in use, the class not converged).
    #[error("{0}")]
    Unavailable(String),
    /// The volume cannot do what was asked, and no retry will change that (changed blocks of a
    /// thick volume's snapshot).
    #[error("{0}")]
    Unsupported(String),
    /// LVM or the host failed.
    #[error(transparent)]
    Host(#[from] lvms_host::Error),
}

impl BackendError {
    /// UNAVAILABLE for a request naming `class`, which failed to converge on `node` for `reason`
    /// ([`Backend::unserved`]).
    pub fn class_not_ready(class: &str, node: &str, reason: &str) -> Self {
        Self::Unavailable(format!(
            "device class {class} is not ready on node {node}: {reason}"
        ))
    }
}

/// `Result` with [`BackendError`].
pub type Result<T, E = BackendError> = std::result::Result<T, E>;

/// Makes, finds, grows and removes volumes and snapshots. Every method is idempotent on what is on
/// disk; callers serialise operations on one volume ([`crate::locks`]).
pub trait Backend: Send + Sync + 'static {
    /// The node this backend's volumes live on.
    fn node_id(&self) -> &str;

    /// The classes served (owned: the node agent's set changes as device classes become ready).
    fn classes(&self) -> Vec<DeviceClassConfig>;

    /// The classes configured here but not served, each with why (a class that failed to
    /// converge): a request naming one answers that reason. None by default.
    fn unserved(&self) -> Vec<(DeviceClassConfig, String)> {
        Vec::new()
    }

    /// Whether every class is ready to serve (volume group and pool exist).
    fn ready(&self) -> impl Future<Output = Result<bool>> + Send;

    /// The volume or snapshot with this id.
    fn get(&self, id: &str) -> impl Future<Output = Result<Option<Volume>>> + Send;

    /// Every volume and snapshot of ours, sorted by id.
    fn list(&self) -> impl Future<Output = Result<Vec<Volume>>> + Send;

    /// Makes a volume; when its LV exists already, returns it as found (the caller checks that it is
    /// compatible).
    fn create_volume(&self, req: &NewVolume) -> impl Future<Output = Result<Volume>> + Send;

    /// Takes a read-only snapshot; when its LV exists already, returns it as found.
    fn create_snapshot(&self, req: &NewSnapshot) -> impl Future<Output = Result<Volume>> + Send;

    /// Removes a volume or snapshot; `Ok(false)` when it did not exist.
    fn delete(&self, id: &str) -> impl Future<Output = Result<bool>> + Send;

    /// Grows a volume to at least `size` bytes; returns the new size.
    fn expand(&self, id: &str, size: u64) -> impl Future<Output = Result<u64>> + Send;

    /// What `class` can still hold in volumes of `layout` (thick classes; thin and shared classes
    /// ignore it).
    fn capacity(
        &self,
        class: &str,
        layout: &Layout,
    ) -> impl Future<Output = Result<Capacity>> + Send;

    /// What a thick class's group has free on each of its LVM physical volumes (what every
    /// layout's capacity is computed from); `None` for thin and shared classes, and where the
    /// backend does not see the disks.
    fn free_space(
        &self,
        class: &str,
    ) -> impl Future<Output = Result<Option<lvms_core::layout::FreeSpace>>> + Send {
        let _ = class;
        async { Ok(None) }
    }

    /// Activates the volume so its block device exists (thin snapshots and what was restored from
    /// them skip activation by default); returns the device path.
    fn activate(&self, id: &str) -> impl Future<Output = Result<String>> + Send;

    /// [`Backend::activate`] for a stage in `multi_node` mode or not. Volumes of a shared class are
    /// activated exclusively for one node (LVM then refuses every other node) or shared for several
    /// (block volumes of a shared linear class only); volumes of local classes cannot be multi-node.
    fn activate_for(
        &self,
        id: &str,
        multi_node: bool,
    ) -> impl Future<Output = Result<String>> + Send {
        async move {
            if multi_node {
                return Err(BackendError::InvalidArgument(format!(
                    "volume {id} lives on one node: MULTI_NODE_* access needs a block volume of a shared \
                     device class"
                )));
            }
            self.activate(id).await
        }
    }

    /// The shared classes this node has joined (their volume group is visible and its lockspace
    /// started): `NodeGetInfo` advertises their class-wide topology segments.
    fn joined_shared(&self) -> impl Future<Output = Vec<String>> + Send {
        async { Vec::new() }
    }

    /// Undoes [`Backend::activate_for`] once the volume is unstaged: a shared class's volume is
    /// deactivated so that another node can take it. Local volumes stay active.
    fn release(&self, id: &str) -> impl Future<Output = Result<()>> + Send {
        let _ = id;
        async { Ok(()) }
    }

    /// Takes over a volume another driver made ([`TakeOver`]): checks that its LV is there, of the
    /// shape the class and the request say (thin in the class's pool, or thick; a snapshot
    /// read-only), and tags it ours without changing anything else of it (its name, size, data and
    /// activation stay). Taken over already: returned as found. Backends that do not see the disks
    /// refuse.
    fn take_over(&self, req: &TakeOver) -> impl Future<Output = Result<Volume>> + Send {
        async move {
            Err(BackendError::Unavailable(format!(
                "volume {} cannot be taken over here: only the node agent of its node sees its LV",
                req.id
            )))
        }
    }

    /// How full `class`'s volume group and thin pool are, for metrics and alerts; `None` where the
    /// backend does not see the disks (the cluster controller).
    fn usage(&self, class: &str) -> impl Future<Output = Result<Option<Usage>>> + Send {
        let _ = class;
        async { Ok(None) }
    }

    /// Changed-block tracking: the ranges of snapshot `id` that hold data (a thin snapshot: the
    /// chunks its pool maps for it). Backends that do not see the pools refuse.
    fn allocated(&self, id: &str) -> impl Future<Output = Result<BlockRanges>> + Send {
        let _ = id;
        async move {
            Err(BackendError::Unsupported(format!(
                "node {} does not serve snapshot metadata",
                self.node_id()
            )))
        }
    }

    /// Changed-block tracking: the ranges where snapshots `base` and `target` of one volume differ
    /// (written, or discarded, between the two). Backends that do not see the pools refuse.
    fn changed(
        &self,
        base: &str,
        target: &str,
    ) -> impl Future<Output = Result<BlockRanges>> + Send {
        let _ = (base, target);
        async move {
            Err(BackendError::Unsupported(format!(
                "node {} does not serve snapshot metadata",
                self.node_id()
            )))
        }
    }
}

/// Byte ranges of a snapshot ([`Backend::allocated`], [`Backend::changed`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockRanges {
    /// The snapshot's size in bytes.
    pub volume_size: u64,
    /// `(offset, length)` in bytes: sorted, apart (adjacent ones merged), each a whole number of the
    /// pool's chunks but the last, which stops at `volume_size`.
    pub ranges: Vec<(u64, u64)>,
}

/// A volume another driver made on this node (TopoLVM or LVMS: an LV named after its
/// `LogicalVolume`'s UID, with no tags), to be served by lvms-rs from now on ([`Backend::take_over`],
/// ADR 0032).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakeOver {
    /// The LV's name, which stays its volume id ([`crate::ids::is_taken_over_id`]).
    pub id: String,
    pub class: String,
    /// The CO's name for it (the `LogicalVolume`'s `spec.name`: `pvc-…`, `snapshot-…`).
    pub name: String,
    /// A read-only snapshot (TopoLVM's `accessType: ro`).
    pub snapshot: bool,
    /// What it was made from, when known.
    pub source: Option<Source>,
    /// When it was made (seconds since the epoch), when known.
    pub created: Option<u64>,
}

/// How full one class is on its node (TopoLVM's metrics carry the same numbers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    /// The volume group's size in bytes.
    pub vg_size: u64,
    /// The volume group's free bytes.
    pub vg_free: u64,
    /// The thin pool, for a thin class.
    pub pool: Option<PoolUsage>,
}

/// How full a thin pool is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolUsage {
    /// The pool's data size in bytes.
    pub size: u64,
    /// Data space used, percent (`None` when LVM reports none: the pool is inactive).
    pub data_percent: Option<f64>,
    /// Metadata space used, percent.
    pub metadata_percent: Option<f64>,
    /// Bytes new thin volumes may still promise (overprovisioned, capped by the pool's free space).
    pub overprovisioned_available: u64,
}
