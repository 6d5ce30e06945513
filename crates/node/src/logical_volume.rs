//! The `LogicalVolume` reconciler's plan: the next step the node agent takes for one `LogicalVolume`
//! object of its node, from the object and what is on disk. Pure; the executor runs the step (through
//! the [`Backend`](lvms_engine::backend::Backend)) and asks again until the answer is [`Step::Done`] or
//! [`Step::Wait`].
//!
//! # Names and crash safety
//! The LV is found by the name the backend derives from `spec.name` (the CSI volume name): a volume is
//! [`ids::volume_lv_name`], a read-only snapshot (`spec.source` with `accessType: ro`)
//! [`ids::snapshot_lv_name`]. The same CSI name gives the same LV in standalone mode and on Kubernetes, and
//! an agent killed between creating the LV and writing `status.volumeID` finds the LV at its restart and
//! records it ([`Step::WriteStatus`]) instead of making a second one.
//!
//! # Order
//! | state | step |
//! |---|---|
//! | being deleted, our finalizer present, the LV exists | [`Step::Delete`] |
//! | being deleted, our finalizer present, no LV | [`Step::RemoveFinalizer`] |
//! | being deleted without our finalizer, or not this node's | [`Step::Done`] |
//! | no finalizer yet | [`Step::AddFinalizer`] (before anything is made) |
//! | a spec the agent cannot serve | [`Step::WriteStatus`] with `code` and `message` |
//! | no LV, `status.volumeID` recorded | [`Step::WriteStatus`] `NOT_FOUND`: never remade silently |
//! | no LV, an earlier failure recorded in `status.code` | [`Step::Done`] (the controller deletes the object) |
//! | no LV, a source that has no `status.volumeID` yet | [`Step::Wait`] |
//! | no LV | [`Step::Create`] or [`Step::Snapshot`] |
//! | the LV is smaller than `spec.size` (a volume, not a snapshot) | [`Step::Expand`] |
//! | `status` differs from the LV | [`Step::WriteStatus`] |
//! | otherwise | [`Step::Done`] |

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use lvms_api::{
    LOGICAL_VOLUME_FINALIZER,
    topolvm::{LogicalVolume, LogicalVolumeStatus},
};
use lvms_core::{layout::Layout, size::ByteSize};
use lvms_engine::{
    backend::{BackendError, NewSnapshot, NewVolume, Source, Volume},
    ids,
};

/// gRPC status codes written to `status.code` (the values of the CSI spec's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    AlreadyExists = 6,
    ResourceExhausted = 8,
}

/// What the agent knows about the object named in `spec.source`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceState {
    /// No such `LogicalVolume`.
    Missing,
    /// It exists but has no `status.volumeID` yet.
    Pending,
    /// Its volume: the id recorded in its `status.volumeID`, and whether it is a snapshot.
    Ready { volume_id: String, snapshot: bool },
}

/// The inputs of [`plan`].
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// This node's name.
    pub node: &'a str,
    /// The device class used when `spec.deviceClass` is empty: the node's default class.
    pub default_class: Option<&'a str>,
    /// The volume found under [`lv_name`]'s name, if any.
    pub found: Option<&'a Volume>,
    /// The state of `spec.source`, when it is set.
    pub source: Option<&'a SourceState>,
}

/// The next step for one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Add [`LOGICAL_VOLUME_FINALIZER`].
    AddFinalizer,
    /// Make a volume (empty, or restored or cloned from a source).
    Create(NewVolume),
    /// Make a read-only snapshot.
    Snapshot(NewSnapshot),
    /// Grow the volume to `size` bytes.
    Expand { volume_id: String, size: u64 },
    /// Remove the LV.
    Delete { volume_id: String },
    /// Remove [`LOGICAL_VOLUME_FINALIZER`].
    RemoveFinalizer,
    /// Write this status.
    WriteStatus(LogicalVolumeStatus),
    /// Nothing to do until something else changes (the reason, for the log).
    Wait(String),
    /// Nothing left to do.
    Done,
}

/// The LV name the object's volume has on disk (also its volume id).
pub fn lv_name(lv: &LogicalVolume) -> String {
    if is_snapshot(lv) {
        ids::snapshot_lv_name(&lv.spec.name)
    } else {
        ids::volume_lv_name(&lv.spec.name)
    }
}

/// A read-only snapshot: `spec.source` with `accessType: ro`.
fn is_snapshot(lv: &LogicalVolume) -> bool {
    !lv.spec.source.is_empty() && lv.spec.access_type == "ro"
}

fn failed(code: Code, message: String) -> Step {
    Step::WriteStatus(LogicalVolumeStatus {
        volume_id: String::new(),
        code: code as i32,
        message,
        current_size: None,
    })
}

/// `spec.size` in bytes, or why it cannot be used.
fn requested_size(lv: &LogicalVolume) -> Result<u64, String> {
    match lv.spec.size.0.parse::<ByteSize>() {
        Ok(ByteSize(0)) => {
            Err("spec.size is 0: give the size of the volume, such as 1Gi".to_owned())
        }
        Ok(ByteSize(n)) => Ok(n),
        Err(e) => Err(format!("spec.size: {e}")),
    }
}

/// The next step for `lv` (see the [module documentation](self)).
pub fn plan(lv: &LogicalVolume, observed: &Observed<'_>) -> Step {
    if lv.spec.node_name != observed.node {
        return Step::Done;
    }
    let has_finalizer = lv
        .finalizers()
        .iter()
        .any(|f| f == LOGICAL_VOLUME_FINALIZER);
    if lv.metadata.deletion_timestamp.is_some() {
        return match (has_finalizer, observed.found) {
            (false, _) => Step::Done,
            (true, Some(vol)) => Step::Delete {
                volume_id: vol.id.clone(),
            },
            (true, None) => Step::RemoveFinalizer,
        };
    }
    if !has_finalizer {
        return Step::AddFinalizer;
    }
    let status = lv.status.clone().unwrap_or_default();
    let Some(vol) = observed.found else {
        return plan_create(lv, observed, &status);
    };
    if !vol.snapshot {
        match requested_size(lv) {
            Ok(size) if size > vol.size => {
                return Step::Expand {
                    volume_id: vol.id.clone(),
                    size,
                };
            }
            Ok(_) => {}
            Err(msg) => return failed(Code::InvalidArgument, msg),
        }
    }
    let want = LogicalVolumeStatus {
        volume_id: vol.id.clone(),
        code: Code::Ok as i32,
        message: String::new(),
        current_size: Some(Quantity(vol.size.to_string())),
    };
    if status == want {
        Step::Done
    } else {
        Step::WriteStatus(want)
    }
}

/// No LV on disk yet.
fn plan_create(lv: &LogicalVolume, observed: &Observed<'_>, status: &LogicalVolumeStatus) -> Step {
    if !status.volume_id.is_empty() {
        return failed(
            Code::NotFound,
            format!(
                "logical volume {} recorded in status.volumeID is missing on node {}: it was removed \
                 outside lvms; delete this LogicalVolume (and its PersistentVolume) to release it",
                status.volume_id, observed.node
            ),
        );
    }
    if status.code != Code::Ok as i32 {
        return Step::Done;
    }
    let size = match requested_size(lv) {
        Ok(size) => size,
        Err(msg) => return failed(Code::InvalidArgument, msg),
    };
    if !lv.spec.lvcreate_option_class.is_empty() {
        return failed(
            Code::InvalidArgument,
            format!(
                "spec.lvcreateOptionClass {:?} is not supported by lvms: leave it empty (thick volume \
                 layouts come from the device class)",
                lv.spec.lvcreate_option_class
            ),
        );
    }
    let class = if lv.spec.device_class.is_empty() {
        match observed.default_class {
            Some(c) => c.to_owned(),
            None => {
                return failed(
                    Code::InvalidArgument,
                    format!(
                        "spec.deviceClass is empty and node {} has no default device class: name one",
                        observed.node
                    ),
                );
            }
        }
    } else {
        lv.spec.device_class.clone()
    };
    let lv_type = match lv.spec.layout.as_ref().map(Layout::from_api).transpose() {
        Ok(layout) => layout,
        Err(e) => return failed(Code::InvalidArgument, e),
    };
    if lv.spec.source.is_empty() {
        if !lv.spec.access_type.is_empty() {
            return failed(
                Code::InvalidArgument,
                format!(
                    "spec.accessType {:?} is only valid with spec.source: remove it",
                    lv.spec.access_type
                ),
            );
        }
        return Step::Create(NewVolume {
            name: lv.spec.name.clone(),
            class,
            size,
            lv_type,
            volume_mode: lv.spec.volume_mode.map(Into::into),
            source: None,
            ephemeral: None,
        });
    }
    if !matches!(lv.spec.access_type.as_str(), "ro" | "rw") {
        return failed(
            Code::InvalidArgument,
            format!(
                "spec.accessType {:?}: with spec.source it must be ro (a snapshot) or rw (a clone or \
                 restore)",
                lv.spec.access_type
            ),
        );
    }
    let (source_id, source_is_snapshot) = match observed.source {
        None | Some(SourceState::Missing) => {
            return failed(
                Code::NotFound,
                format!("source LogicalVolume {} does not exist", lv.spec.source),
            );
        }
        Some(SourceState::Pending) => {
            return Step::Wait(format!(
                "source LogicalVolume {} has no status.volumeID yet",
                lv.spec.source
            ));
        }
        Some(SourceState::Ready {
            volume_id,
            snapshot,
        }) => (volume_id.clone(), *snapshot),
    };
    if is_snapshot(lv) {
        if source_is_snapshot {
            return failed(
                Code::InvalidArgument,
                format!(
                    "source LogicalVolume {} is a snapshot: a snapshot is taken of a volume",
                    lv.spec.source
                ),
            );
        }
        return Step::Snapshot(NewSnapshot {
            name: lv.spec.name.clone(),
            source_volume: source_id,
        });
    }
    Step::Create(NewVolume {
        name: lv.spec.name.clone(),
        class,
        size,
        lv_type,
        volume_mode: None,
        source: Some(if source_is_snapshot {
            Source::Snapshot(source_id)
        } else {
            Source::Volume(source_id)
        }),
        ephemeral: None,
    })
}

/// The status to record for a failed create, snapshot or expand of an object whose status is `current`
/// (what an expand failure leaves of the volume, `volumeID` and `currentSize`, is kept); `None` for a
/// failure worth retrying (LVM or the volume group unavailable for now).
pub fn failure_status(
    err: &BackendError,
    current: &LogicalVolumeStatus,
) -> Option<LogicalVolumeStatus> {
    let code = match err {
        BackendError::InvalidArgument(_) => Code::InvalidArgument,
        BackendError::NotFound(_) => Code::NotFound,
        BackendError::Conflict(_) => Code::AlreadyExists,
        BackendError::InsufficientSpace(_) => Code::ResourceExhausted,
        BackendError::Unavailable(_) | BackendError::Host(_) => return None,
    };
    Some(LogicalVolumeStatus {
        volume_id: current.volume_id.clone(),
        code: code as i32,
        message: err.to_string(),
        current_size: current.current_size.clone(),
    })
}

#[cfg(test)]
mod tests;
