//! The `LogicalVolume` reconciler's I/O: reads the object and the disk, asks
//! [`logical_volume::plan`] for the next step, carries it out (through the [`Backend`] for LVM, through
//! the API for the finalizer and `status`), and asks again with what the step returned, until the plan
//! says [`Step::Done`] or [`Step::Wait`].
//!
//! - The finalizer goes on with a JSON merge patch that carries the object's `resourceVersion`, so a
//!   concurrent change (the controller deleting the object, another finalizer) fails the patch instead of
//!   being overwritten; the next reconcile starts from the new object.
//! - `status` is written on the status subresource with a merge patch that names every field (an empty
//!   one as `null`), so a cleared `code` or `message` is cleared on the server too.
//! - A failed create, snapshot or expand that retrying will not fix is recorded in `status.code` and
//!   `status.message` (the controller answers the CSI call with it); LVM being unavailable is an error and
//!   the object is retried after [`ERROR_REQUEUE`].
//! - Objects of other nodes cost no request.

use std::{
    fmt::Debug,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller,
        controller::{self, Action},
        events::{Event, EventType},
        watcher,
    },
};
use lvms_api::{
    LOGICAL_VOLUME_FINALIZER,
    topolvm::{LogicalVolume, LogicalVolumeStatus},
};
use lvms_engine::backend::{Backend, BackendError};
use serde_json::{Value, json};
use tokio::sync::watch;
use tracing::{debug, info, instrument, warn};

use crate::{
    finalizers,
    logical_volume::{self, Observed, SourceState, Step, failure_status, lv_name},
};

/// A reconcile that changed nothing looks again after this long (an LV removed behind our back is
/// then reported).
pub const DONE_REQUEUE: Duration = Duration::from_secs(300);
/// A volume waiting for its source looks again after this long.
pub const WAIT_REQUEUE: Duration = Duration::from_secs(5);
/// How soon a volume TopoLVM or LVMS made is looked at again while their node plugin runs: the
/// takeover follows within this of the plugin's removal (one connection attempt per volume).
pub const OLD_DRIVER_REQUEUE: Duration = Duration::from_secs(15);
/// After an error, or a failure recorded in `status`.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Steps one reconcile may take; a fresh volume takes three (finalizer, create, status).
pub const MAX_STEPS: usize = 8;
/// Reconciles in flight at once. LVM changes of one volume group run one at a time anyway (the
/// engine's queue per group); more in flight would only wait there, each holding its object, its
/// half-done future and an HTTP connection: 500 new objects at once peaked the agent's heap at
/// 18 MiB with 6 MiB live after, and glibc kept the rest (ADR 0038). The rest wait in the
/// controller's queue as names.
pub const CONCURRENCY: u16 = 8;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("{action}: {source}")]
    Backend {
        action: String,
        #[source]
        source: BackendError,
    },
    #[error("node {0} serves no device class yet: its LVMVolumeGroups are not converged")]
    NoClasses(String),
    #[error("LogicalVolume {0} was not settled after {MAX_STEPS} steps")]
    TooManySteps(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// What the reconciler works with.
pub struct Context<B> {
    pub client: Client,
    /// This node's name (`spec.nodeName` of the objects it serves).
    pub node: String,
    /// The backend over this node's converged classes; `None` until the first class is ready. The
    /// volume-group side replaces it when the set of classes changes.
    pub backend: watch::Receiver<Option<Arc<B>>>,
    /// Where TopoLVM's and LVMS's node plugin listens on this node (the host's
    /// `<kubelet>/plugins/topolvm.io/node/csi-topolvm.sock`, as this container sees it): while
    /// something answers there, nothing of theirs is taken over (ADR 0032).
    pub old_driver_socket: Option<PathBuf>,
}

impl<B> Context<B> {
    /// A context whose backend never changes.
    pub fn fixed(client: Client, node: impl Into<String>, backend: Arc<B>) -> Self {
        Self {
            client,
            node: node.into(),
            backend: watch::channel(Some(backend)).1,
            old_driver_socket: None,
        }
    }
}

/// The field selector of `node`'s `LogicalVolume`s (the CRD declares `.spec.nodeName` selectable).
pub fn node_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// Runs the reconciler until the watch ends: the `LogicalVolume`s of this node, selected by the
/// API server, so an agent holds only its own.
pub async fn run<B: Backend>(ctx: Arc<Context<B>>) {
    let api: Api<LogicalVolume> = Api::all(ctx.client.clone());
    let config = watcher::Config::default()
        .any_semantic()
        .fields(&node_selector(&ctx.node));
    lvms_k8s::reconciler::drive(
        Controller::new(api, config)
            .with_config(controller::Config::default().concurrency(CONCURRENCY)),
        "LogicalVolume",
        reconcile,
        error_policy,
        ctx,
    )
    .await;
}

pub fn error_policy<B>(lv: Arc<LogicalVolume>, error: &Error, _ctx: Arc<Context<B>>) -> Action {
    warn!(logical_volume = %lv.name_any(), error = %error, "will retry");
    Action::requeue(ERROR_REQUEUE)
}

/// Takes `lv` as far as it can go now (see the [module documentation](self)).
#[instrument(skip_all, fields(logical_volume = %lv.name_any(), node = %ctx.node))]
pub async fn reconcile<B: Backend>(lv: Arc<LogicalVolume>, ctx: Arc<Context<B>>) -> Result<Action> {
    if lv.spec.node_name != ctx.node {
        return Ok(Action::await_change());
    }
    let backend = ctx.backend.borrow().clone();
    let Some(backend) = backend else {
        return Err(Error::NoClasses(ctx.node.clone()));
    };
    let api: Api<LogicalVolume> = Api::all(ctx.client.clone());
    let mut lv = (*lv).clone();
    for _ in 0..MAX_STEPS {
        let step = next_step(&lv, &ctx, &*backend, &api).await?;
        debug!(?step, "step");
        match step {
            Step::Done => return Ok(Action::requeue(DONE_REQUEUE)),
            Step::Wait(why) => {
                info!(%why, "waiting");
                return Ok(Action::requeue(WAIT_REQUEUE));
            }
            Step::Foreign(why) => {
                info!(%why, "left alone");
                return Ok(Action::requeue(DONE_REQUEUE));
            }
            Step::OldDriverLive(why) => {
                info!(%why, "left alone while the old driver runs");
                return Ok(Action::requeue(OLD_DRIVER_REQUEUE));
            }
            Step::TakeOver(req) => {
                info!(volume_id = %req.id, class = %req.class, "taking over");
                match backend.take_over(&req).await {
                    Ok(_) => {
                        let note = format!(
                            "volume {} of class {} on node {} taken over in place from TopoLVM or \
                             LVMS: tagged as lvms-rs's, nothing else changed",
                            req.id, req.class, ctx.node
                        );
                        event(&ctx, &lv, EventType::Normal, "TakenOver", note).await;
                    }
                    // Being deleted and its LV gone (removed just now, or before): released.
                    Err(BackendError::NotFound(why))
                        if lv.metadata.deletion_timestamp.is_some() =>
                    {
                        info!(%why, "no volume left to take over or remove");
                        release(&api, &lv).await?;
                        return Ok(Action::await_change());
                    }
                    // A mismatch or a missing LV: named, and everything left as it is.
                    Err(
                        e @ (BackendError::NotFound(_)
                        | BackendError::Conflict(_)
                        | BackendError::InvalidArgument(_)),
                    ) => {
                        warn!(error = %e, "not taken over; left alone");
                        let note = format!("not taken over; left alone: {e}");
                        event(&ctx, &lv, EventType::Warning, "TakeOverRefused", note).await;
                        return Ok(Action::requeue(DONE_REQUEUE));
                    }
                    Err(source) => {
                        return Err(Error::Backend {
                            action: format!("take over {}", req.id),
                            source,
                        });
                    }
                }
            }
            Step::AddFinalizer => {
                lv = finalizers::set(&api, &lv, finalizers::with(&lv, LOGICAL_VOLUME_FINALIZER))
                    .await
                    .map_err(kube_err(format!("add the finalizer to {}", lv.name_any())))?;
            }
            Step::RemoveFinalizer => {
                release(&api, &lv).await?;
                info!("volume removed, finalizer released");
                return Ok(Action::await_change());
            }
            Step::Create(req) => {
                info!(volume = %req.name, class = %req.class, size = req.size, "creating");
                if let Err(e) = backend.create_volume(&req).await {
                    return record_failure(&api, &lv, "create", e).await;
                }
            }
            Step::Snapshot(req) => {
                info!(volume = %req.name, source = %req.source_volume, "snapshotting");
                if let Err(e) = backend.create_snapshot(&req).await {
                    return record_failure(&api, &lv, "snapshot", e).await;
                }
            }
            Step::Expand { volume_id, size } => {
                info!(%volume_id, size, "expanding");
                if let Err(e) = backend.expand(&volume_id, size).await {
                    return record_failure(&api, &lv, "expand", e).await;
                }
            }
            Step::Delete { volume_id } => {
                info!(%volume_id, "removing");
                backend
                    .delete(&volume_id)
                    .await
                    .map_err(|source| Error::Backend {
                        action: format!("remove {volume_id}"),
                        source,
                    })?;
            }
            Step::WriteStatus(status) => {
                lv = write_status(&api, &lv, &status).await?;
            }
        }
    }
    Err(Error::TooManySteps(lv.name_any()))
}

/// Publishes an Event about `lv` (a failure to publish is only logged).
async fn event<B>(
    ctx: &Context<B>,
    lv: &LogicalVolume,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = lvms_k8s::reconciler::recorder(ctx.client.clone(), "lvms-node");
    let ev = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: "TakeOver".to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &lv.object_ref(&())).await {
        warn!(error = %e, reason, "publishing an event failed");
    }
}

/// Removes [`LOGICAL_VOLUME_FINALIZER`]: the object's volume is gone.
async fn release(api: &Api<LogicalVolume>, lv: &LogicalVolume) -> Result<()> {
    finalizers::set(api, lv, finalizers::without(lv, LOGICAL_VOLUME_FINALIZER))
        .await
        .map(drop)
        .map_err(kube_err(format!(
            "remove the finalizer of {}",
            lv.name_any()
        )))
}

/// Why another driver's node plugin is live at `socket` (something accepts a connection there),
/// or `None` (no socket, or a stale one nothing listens on).
pub async fn old_driver_live(socket: &Path) -> Option<String> {
    let connect = tokio::net::UnixStream::connect(socket);
    match tokio::time::timeout(Duration::from_secs(2), connect).await {
        Ok(Ok(_)) => Some(format!("{} accepts connections", socket.display())),
        Ok(Err(_)) => None,
        Err(_) => Some(format!(
            "{} did not answer within 2 s, and may be live",
            socket.display()
        )),
    }
}

/// Reads what the plan needs and asks it.
async fn next_step<B: Backend>(
    lv: &LogicalVolume,
    ctx: &Context<B>,
    backend: &B,
    api: &Api<LogicalVolume>,
) -> Result<Step> {
    let node = ctx.node.as_str();
    let name = lv_name(lv);
    let found = backend.get(&name).await.map_err(|source| Error::Backend {
        action: format!("look up {name}"),
        source,
    })?;
    // Asked only where the answer matters: a volume another driver made, not taken over yet.
    let old_driver = match &ctx.old_driver_socket {
        Some(path) if found.is_none() && lvms_engine::ids::is_topolvm_id(&name) => {
            old_driver_live(path).await
        }
        _ => None,
    };
    let source = if lv.spec.source.is_empty() || lv.metadata.deletion_timestamp.is_some() {
        None
    } else {
        let src = api
            .get_opt(&lv.spec.source)
            .await
            .map_err(kube_err(format!(
                "read source LogicalVolume {}",
                lv.spec.source
            )))?;
        Some(match src {
            None => SourceState::Missing,
            Some(src) => match src.status.as_ref().map(|s| s.volume_id.as_str()) {
                None | Some("") => SourceState::Pending,
                Some(id) => SourceState::Ready {
                    volume_id: id.to_owned(),
                    snapshot: src.spec.access_type == "ro",
                },
            },
        })
    };
    let classes = backend.classes();
    let default_class = classes.iter().find(|c| c.default).map(|c| c.name.as_str());
    Ok(logical_volume::plan(
        lv,
        &Observed {
            node,
            default_class,
            found: found.as_ref(),
            source: source.as_ref(),
            old_driver: old_driver.as_deref(),
        },
    ))
}

/// Records a failure that retrying will not fix in `status`; returns the error otherwise.
async fn record_failure(
    api: &Api<LogicalVolume>,
    lv: &LogicalVolume,
    action: &str,
    err: BackendError,
) -> Result<Action> {
    let current = lv.status.clone().unwrap_or_default();
    match failure_status(&err, &current) {
        Some(status) => {
            warn!(error = %err, code = status.code, "{action} failed; recorded in status");
            write_status(api, lv, &status).await?;
            Ok(Action::requeue(ERROR_REQUEUE))
        }
        None => Err(Error::Backend {
            action: format!("{action} {}", lv_name(lv)),
            source: err,
        }),
    }
}

/// The merge patch that makes `status` exactly `status`.
pub fn status_patch(status: &LogicalVolumeStatus) -> Value {
    fn or_null(s: &str) -> Value {
        if s.is_empty() { Value::Null } else { json!(s) }
    }
    json!({"status": {
        "volumeID": or_null(&status.volume_id),
        "code": if status.code == 0 { Value::Null } else { json!(status.code) },
        "message": or_null(&status.message),
        "currentSize": status.current_size.as_ref().map_or(Value::Null, |q| json!(q.0)),
    }})
}

async fn write_status(
    api: &Api<LogicalVolume>,
    lv: &LogicalVolume,
    status: &LogicalVolumeStatus,
) -> Result<LogicalVolume> {
    api.patch_status(
        &lv.name_any(),
        &PatchParams::default(),
        &Patch::Merge(status_patch(status)),
    )
    .await
    .map_err(kube_err(format!("write status of {}", lv.name_any())))
}

#[cfg(test)]
mod tests;
