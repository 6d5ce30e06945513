//! The Node service's errors: one enum per RPC, each mapped to its gRPC code, and the codes of the
//! engine's and the host's errors.

use std::io;

use tonic::{Code, Status};

use super::{MAX_STACKED_MOUNTS, request::Invalid};
use crate::chain;
use lvms_engine::backend::BackendError;

fn host_code(e: &lvms_host::Error) -> Code {
    use lvms_host::Error as E;
    match e {
        E::InvalidName(_) | E::InvalidDevicePath { .. } | E::InvalidArgument(_) => {
            Code::InvalidArgument
        }
        E::NotFound(_) => Code::NotFound,
        E::AlreadyExists(_) => Code::AlreadyExists,
        E::InsufficientSpace(_) => Code::ResourceExhausted,
        E::InUse(_) | E::SignatureExists { .. } => Code::FailedPrecondition,
        _ => Code::Internal,
    }
}

fn backend_code(e: &BackendError) -> Code {
    match e {
        BackendError::NotFound(_) => Code::NotFound,
        BackendError::InvalidArgument(_) => Code::InvalidArgument,
        BackendError::InsufficientSpace(_) => Code::ResourceExhausted,
        BackendError::Conflict(_) | BackendError::Unsupported(_) => Code::FailedPrecondition,
        BackendError::Unavailable(_) => Code::Unavailable,
        BackendError::Host(h) => host_code(h),
    }
}

/// Failures every volume RPC shares.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A required field is missing or malformed (INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// Not a volume of ours, or no such volume (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// Another operation on the volume is running (ABORTED).
    #[error("an operation on volume {0} is in progress; retry later")]
    Busy(String),
    /// The backend could not look the volume up.
    #[error("looking up volume {id}")]
    Lookup {
        id: String,
        #[source]
        source: BackendError,
    },
    /// `/proc/self/mountinfo` could not be read (INTERNAL).
    #[error("reading the mount table")]
    Mounts(#[source] lvms_host::Error),
    /// The volume's device could not be examined (INTERNAL).
    #[error("examining device {device} of the volume")]
    Device {
        device: String,
        #[source]
        source: io::Error,
    },
}

impl RequestError {
    fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::Busy(_) => Code::Aborted,
            Self::Lookup { source, .. } => backend_code(source),
            Self::Mounts(_) | Self::Device { .. } => Code::Internal,
        }
    }
}

impl From<Invalid> for RequestError {
    fn from(e: Invalid) -> Self {
        match e {
            Invalid::Argument(m) => Self::InvalidArgument(m),
            Invalid::NotOurs(m) => Self::NotFound(m),
        }
    }
}

/// Implements `From<Invalid>` (through [`RequestError`]) and `From<$e> for Status`.
macro_rules! rpc_error {
    ($e:ident) => {
        impl From<Invalid> for $e {
            fn from(e: Invalid) -> Self {
                Self::Request(e.into())
            }
        }

        impl From<$e> for Status {
            fn from(e: $e) -> Self {
                Status::new(e.code(), chain(&e))
            }
        }
    };
}

/// Why `NodeStageVolume` failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The staging directory is not there (INVALID_ARGUMENT).
    #[error("staging_target_path {0} is not an existing directory")]
    StagingPath(String, #[source] io::Error),
    /// The staging path is not a directory (INVALID_ARGUMENT).
    #[error("staging_target_path {0} is not a directory")]
    StagingNotDir(String),
    /// Not mounted yet and not empty: a mount would hide what it holds (FAILED_PRECONDITION).
    #[error(
        "staging_target_path {0} is {1}: lvms-rs mounts only over an empty directory, never over \
         what it did not put there; give an empty one"
    )]
    WouldHide(String, String),
    /// Staged at the path with other arguments, or another volume is there (ALREADY_EXISTS).
    #[error("{0}")]
    Incompatible(String),
    /// The device has another filesystem than asked for (FAILED_PRECONDITION).
    #[error(
        "{device} has a {found} filesystem, not the {wanted} asked for: refusing to reformat it"
    )]
    WrongFilesystem {
        device: String,
        found: String,
        wanted: &'static str,
    },
    /// The device has a signature that is no filesystem this node mounts (FAILED_PRECONDITION).
    #[error(
        "{device} has a {found} signature, which is neither ext4 nor xfs: refusing to mount or reformat it"
    )]
    UnsupportedSignature { device: String, found: String },
    /// Activating the volume failed.
    #[error("activating volume {id}")]
    Activate {
        id: String,
        #[source]
        source: BackendError,
    },
    /// Probing, formatting, mounting or growing failed.
    #[error("{step} {device}")]
    Host {
        step: &'static str,
        device: String,
        #[source]
        source: lvms_host::Error,
    },
}

impl StageError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::StagingPath(..) | Self::StagingNotDir(_) => Code::InvalidArgument,
            Self::Incompatible(_) => Code::AlreadyExists,
            Self::WrongFilesystem { .. }
            | Self::UnsupportedSignature { .. }
            | Self::WouldHide(..) => Code::FailedPrecondition,
            Self::Activate { source, .. } => backend_code(source),
            Self::Host { source, .. } => host_code(source),
        }
    }
}
rpc_error!(StageError);

/// Why `NodeUnstageVolume` failed.
#[derive(Debug, thiserror::Error)]
pub enum UnstageError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Something else is mounted at the path (FAILED_PRECONDITION).
    #[error("{0}")]
    Foreign(String),
    /// `umount` failed (busy: FAILED_PRECONDITION).
    #[error("unmounting {0}")]
    Unmount(String, #[source] lvms_host::Error),
    /// Mounts kept appearing at the path (INTERNAL).
    #[error("{0} is still mounted after {MAX_STACKED_MOUNTS} unmounts")]
    StillMounted(String),
    /// Deactivating a shared class's volume failed (open elsewhere on this node: FAILED_PRECONDITION).
    #[error("deactivating volume {id}")]
    Release {
        id: String,
        #[source]
        source: BackendError,
    },
}

impl UnstageError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::Foreign(_) => Code::FailedPrecondition,
            Self::Unmount(_, e) => host_code(e),
            Self::StillMounted(_) => Code::Internal,
            Self::Release { source, .. } => backend_code(source),
        }
    }
}
rpc_error!(UnstageError);

/// Why `NodePublishVolume` failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// No staging path though the node stages volumes (FAILED_PRECONDITION, as the spec's table says).
    #[error("staging_target_path is required: this node stages volumes (STAGE_UNSTAGE_VOLUME)")]
    StagingRequired,
    /// Published at the target with other arguments, or something else is there (ALREADY_EXISTS).
    #[error("{0}")]
    Incompatible(String),
    /// Published at another target and the access mode allows one (FAILED_PRECONDITION).
    #[error("{0}")]
    PublishedElsewhere(String),
    /// Not staged (FAILED_PRECONDITION).
    #[error("{0}")]
    NotStaged(String),
    /// The target exists as the wrong kind of file (FAILED_PRECONDITION).
    #[error("{0}")]
    TargetKind(String),
    /// The target holds something a mount would hide (FAILED_PRECONDITION).
    #[error("{0}")]
    WouldHide(String),
    /// The target could not be created (INTERNAL).
    #[error("creating target path {0}")]
    CreateTarget(String, #[source] io::Error),
    /// The bind mount failed.
    #[error("bind-mounting {src} at {target}")]
    Bind {
        src: String,
        target: String,
        #[source]
        source: lvms_host::Error,
    },
    /// Making or activating an inline ephemeral volume's LV failed.
    #[error("{step} the LV of inline ephemeral volume {id}")]
    Ephemeral {
        step: &'static str,
        id: String,
        #[source]
        source: BackendError,
    },
    /// Probing, formatting or mounting an inline ephemeral volume failed.
    #[error("{step} {device}")]
    Host {
        step: &'static str,
        device: String,
        #[source]
        source: lvms_host::Error,
    },
}

impl PublishError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::Incompatible(_) => Code::AlreadyExists,
            Self::StagingRequired
            | Self::PublishedElsewhere(_)
            | Self::NotStaged(_)
            | Self::TargetKind(_)
            | Self::WouldHide(_) => Code::FailedPrecondition,
            Self::CreateTarget(..) => Code::Internal,
            Self::Bind { source, .. } | Self::Host { source, .. } => host_code(source),
            Self::Ephemeral { source, .. } => backend_code(source),
        }
    }
}
rpc_error!(PublishError);

/// Why `NodeUnpublishVolume` failed.
#[derive(Debug, thiserror::Error)]
pub enum UnpublishError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Something else is mounted at the target (FAILED_PRECONDITION).
    #[error("{0}")]
    Foreign(String),
    /// `umount` failed (busy: FAILED_PRECONDITION).
    #[error("unmounting {0}")]
    Unmount(String, #[source] lvms_host::Error),
    /// Mounts kept appearing at the target (INTERNAL).
    #[error("{0} is still mounted after {MAX_STACKED_MOUNTS} unmounts")]
    StillMounted(String),
    /// The target could not be removed (a directory not empty once unmounted: INTERNAL).
    #[error("removing target path {0}")]
    RemoveTarget(String, #[source] io::Error),
    /// Removing an inline ephemeral volume's LV failed.
    #[error("removing the LV {id} of an inline ephemeral volume")]
    RemoveEphemeral {
        id: String,
        #[source]
        source: BackendError,
    },
}

impl UnpublishError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::Foreign(_) => Code::FailedPrecondition,
            Self::Unmount(_, e) => host_code(e),
            Self::StillMounted(_) | Self::RemoveTarget(..) => Code::Internal,
            Self::RemoveEphemeral { source, .. } => backend_code(source),
        }
    }
}
rpc_error!(UnpublishError);

/// Why `NodeGetVolumeStats` failed.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The path does not hold the volume (NOT_FOUND).
    #[error("{0}")]
    NotMounted(String),
    /// `statvfs` failed (INTERNAL).
    #[error("reading the usage of {0}")]
    Statvfs(String, #[source] lvms_host::Error),
}

impl StatsError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::NotMounted(_) => Code::NotFound,
            Self::Statvfs(..) => Code::Internal,
        }
    }
}
rpc_error!(StatsError);

/// Why `NodeExpandVolume` failed.
#[derive(Debug, thiserror::Error)]
pub enum ExpandError {
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The path does not hold the volume (NOT_FOUND).
    #[error("{0}")]
    NotMounted(String),
    /// The device is not the size asked for (OUT_OF_RANGE).
    #[error("{0}")]
    OutOfRange(String),
    /// The filesystem cannot be grown here (FAILED_PRECONDITION).
    #[error("{0}")]
    CannotGrow(String),
    /// Growing the filesystem failed.
    #[error("growing the filesystem of {device} at {path}")]
    Grow {
        device: String,
        path: String,
        #[source]
        source: lvms_host::Error,
    },
    /// Growing the volume itself failed ([`super::NodeOptions::grows_volume`]).
    #[error("growing the volume: {0}")]
    Volume(#[source] BackendError),
}

impl ExpandError {
    fn code(&self) -> Code {
        match self {
            Self::Request(e) => e.code(),
            Self::NotMounted(_) => Code::NotFound,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::CannotGrow(_) => Code::FailedPrecondition,
            Self::Grow { source, .. } => host_code(source),
            Self::Volume(e) => backend_code(e),
        }
    }
}
rpc_error!(ExpandError);
