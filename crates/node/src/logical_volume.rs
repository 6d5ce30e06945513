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
//! | being deleted, `status.volumeID` a UUID not taken over yet | [`Step::TakeOver`] first, then deleted as ours (the executor releases the finalizer when the LV is gone) |
//! | being deleted, our finalizer present, the LV exists | [`Step::Delete`] |
//! | being deleted, our finalizer present, no LV | [`Step::RemoveFinalizer`] |
//! | being deleted without our finalizer, or not this node's | [`Step::Done`] |
//! | no finalizer yet | [`Step::AddFinalizer`] (before anything is made) |
//! | a spec the agent cannot serve | [`Step::WriteStatus`] with `code` and `message` |
//! | no LV of ours, `status.volumeID` a UUID (made by TopoLVM or LVMS: the LV is named after the object's UID), their node plugin still live here | [`Step::Foreign`]: object and LV left alone |
//! | the same, their node plugin gone (being deleted or not) | [`Step::TakeOver`] (ADR 0032) |
//! | no LV, `status.volumeID` another id lvms-rs does not know | [`Step::Foreign`] |
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
    backend::{BackendError, NewSnapshot, NewVolume, Source, TakeOver, Volume},
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
    FailedPrecondition = 9,
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
    /// Why another driver's node plugin (TopoLVM's, LVMS's) is live on this node, if it is: then
    /// nothing of theirs is taken over.
    pub old_driver: Option<&'a str>,
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
    /// The object's volume was made by another driver (TopoLVM, LVMS): lvms-rs neither serves nor
    /// changes it, its status included (the reason, for the log).
    Foreign(String),
    /// The object's volume is another driver's whose node plugin still runs on this node: left
    /// alone like [`Step::Foreign`], and looked at again soon, since the takeover follows the old
    /// plugin's removal (the reason, for the log).
    OldDriverLive(String),
    /// Take over the volume another driver made for this object: its LV becomes ours in place.
    TakeOver(TakeOver),
    /// Nothing left to do.
    Done,
}

/// The LV name the object's volume has on disk (also its volume id): the one TopoLVM or LVMS
/// recorded in `status.volumeID` for an object they made, else the one lvms-rs derives from
/// `spec.name`.
pub fn lv_name(lv: &LogicalVolume) -> String {
    if let Some(id) = taken_over_id(lv) {
        return id.to_owned();
    }
    if is_snapshot(lv) {
        ids::snapshot_lv_name(&lv.spec.name)
    } else {
        ids::volume_lv_name(&lv.spec.name)
    }
}

/// A recorded volume id that lvms-rs did not hand out and cannot take over.
fn is_foreign_id(id: &str) -> bool {
    !id.is_empty()
        && !ids::is_volume_id(id)
        && !ids::is_snapshot_id(id)
        && !ids::is_taken_over_id(id)
}

/// The volume id TopoLVM or LVMS recorded for an object they made (the object's UID).
fn taken_over_id(lv: &LogicalVolume) -> Option<&str> {
    lv.status
        .as_ref()
        .map(|s| s.volume_id.as_str())
        .filter(|id| ids::is_topolvm_id(id))
}

/// The device class the object names, or the node's default for an empty `spec.deviceClass`.
fn class_of(lv: &LogicalVolume, observed: &Observed<'_>) -> Result<String, String> {
    if !lv.spec.device_class.is_empty() {
        return Ok(lv.spec.device_class.clone());
    }
    observed.default_class.map(str::to_owned).ok_or_else(|| {
        format!(
            "spec.deviceClass is empty and node {} has no default device class: name one",
            observed.node
        )
    })
}

/// [`Step::TakeOver`] of the volume TopoLVM or LVMS made for `lv` (recorded as `id`), or
/// [`Step::OldDriverLive`] while their node plugin is live here, [`Step::Foreign`] when the object
/// cannot say its class.
fn take_over(lv: &LogicalVolume, id: &str, observed: &Observed<'_>) -> Step {
    if let Some(why) = observed.old_driver {
        return Step::OldDriverLive(format!(
            "LogicalVolume {} was made by TopoLVM or LVMS (volume {id}), whose node plugin is still \
             live on node {} ({why}): nothing is taken over while it runs; remove its DaemonSet first",
            lv.name_any(),
            observed.node
        ));
    }
    let Ok(class) = class_of(lv, observed) else {
        return Step::Foreign(format!(
            "LogicalVolume {} (volume {id}) names no device class and node {} has no default one: \
             not taken over",
            lv.name_any(),
            observed.node
        ));
    };
    let source = match observed.source {
        Some(SourceState::Ready {
            volume_id,
            snapshot: true,
        }) => Some(Source::Snapshot(volume_id.clone())),
        Some(SourceState::Ready {
            volume_id,
            snapshot: false,
        }) => Some(Source::Volume(volume_id.clone())),
        _ => None,
    };
    Step::TakeOver(TakeOver {
        id: id.to_owned(),
        class,
        name: lv.spec.name.clone(),
        snapshot: is_snapshot(lv),
        source,
        created: lv
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| u64::try_from(t.0.as_second()).ok()),
    })
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
    if observed.found.is_none()
        && has_finalizer
        && let Some(id) = taken_over_id(lv)
    {
        // Theirs, not ours yet: taken over before anything else, its deletion included.
        return take_over(lv, id, observed);
    }
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
        if is_foreign_id(&status.volume_id) {
            return Step::Foreign(format!(
                "LogicalVolume {} was made by another driver: its volume {} (status.volumeID) is not \
                 an lvms-rs volume id (TopoLVM and LVMS name the LV after the object's UID); lvms-rs \
                 leaves the object, its status and the LV as they are",
                lv.name_any(),
                status.volume_id
            ));
        }
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
    let class = match class_of(lv, observed) {
        Ok(class) => class,
        Err(msg) => return failed(Code::InvalidArgument, msg),
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
        BackendError::Unsupported(_) => Code::FailedPrecondition,
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
