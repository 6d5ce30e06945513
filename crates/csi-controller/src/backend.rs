//! [`NodeBackend`]: the [`Backend`] of one node as the controller sees it on Kubernetes. A volume is a
//! `LogicalVolume` object named after the volume id (ADR 0008: `csi-…`/`snap-…` from the CSI name),
//! made by that node's agent; this backend creates, patches and deletes the objects and waits for the
//! agent's answer by watching the object (never polling).
//!
//! - Create: the object is created (or found, after a crash or a cancelled call) and the backend waits
//!   for `status.volumeID`. A non-zero `status.code` deletes the object and returns that failure.
//! - Expand: `spec.size` is patched; the backend waits for `status.currentSize` to reach it.
//! - Delete: the object is deleted; the backend waits until it is gone (its finalizer goes when the LV is
//!   removed).
//! - Reads come from the [`View`]'s stores; capacity from the node's annotations (ADR 0009).

use std::{sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    runtime::wait::await_condition,
};
use lvms_api::topolvm::{LogicalVolume, LogicalVolumeSpec};
use lvms_core::{lvattr::LvHealth, size::ByteSize};
use lvms_engine::{
    backend::{
        Backend, BackendError, Capacity, DeviceClassConfig, Layout, NewSnapshot, NewVolume, Result,
        Source, Volume,
    },
    ids,
};
use serde_json::json;

use crate::view::View;

/// How long a call waits for the node agent before answering `UNAVAILABLE` (the CO retries; the
/// object stays, so the retry picks up where this one stopped).
pub const WAIT: Duration = Duration::from_secs(120);

/// gRPC codes the node agent records in `status.code`.
fn from_code(code: i32, message: String) -> BackendError {
    match code {
        3 => BackendError::InvalidArgument(message),
        5 => BackendError::NotFound(message),
        6 => BackendError::Conflict(message),
        8 => BackendError::InsufficientSpace(message),
        _ => BackendError::Unavailable(message),
    }
}

fn api_err(what: String) -> impl FnOnce(kube::Error) -> BackendError {
    move |e| BackendError::Unavailable(format!("{what}: {e}"))
}

/// One node's volumes, through `LogicalVolume` objects.
pub struct NodeBackend {
    node: String,
    view: Arc<View>,
    api: Api<LogicalVolume>,
    wait: Duration,
}

impl NodeBackend {
    pub fn new(node: impl Into<String>, view: Arc<View>, api: Api<LogicalVolume>) -> Self {
        Self {
            node: node.into(),
            view,
            api,
            wait: WAIT,
        }
    }

    /// Waits at most `wait` for the node agent.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }

    /// The volume `lv` holds, once the agent recorded it.
    fn volume(&self, lv: &LogicalVolume, classes: &[DeviceClassConfig]) -> Option<Volume> {
        let status = lv.status.as_ref()?;
        if status.volume_id.is_empty() || status.code != 0 {
            return None;
        }
        let class = if lv.spec.device_class.is_empty() {
            classes.iter().find(|c| c.default)?.name.clone()
        } else {
            lv.spec.device_class.clone()
        };
        let size = status
            .current_size
            .as_ref()
            .or(Some(&lv.spec.size))
            .and_then(|q| q.0.parse::<ByteSize>().ok())
            .map_or(0, |b| b.0);
        let snapshot = !lv.spec.source.is_empty() && lv.spec.access_type == "ro";
        let source = (!lv.spec.source.is_empty()).then(|| self.source(&lv.spec.source));
        Some(Volume {
            id: status.volume_id.clone(),
            class: class.clone(),
            size,
            name: Some(lv.spec.name.clone()),
            source,
            snapshot,
            thin: classes
                .iter()
                .any(|c| c.name == class && c.thin_pool().is_some()),
            created: lv
                .metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_second()).ok()),
            requested: None,
            health: LvHealth::Ok,
            device: String::new(),
            ephemeral: None,
            open: false,
        })
    }

    /// The source named by `spec.source`, an object's name (TopoLVM's and ours alike). lvms-rs
    /// names its objects after their ids; one TopoLVM or LVMS made has its id in its status.
    fn source(&self, name: &str) -> Source {
        let taken_over = self.view.named(name).and_then(|src| {
            let id = src.status.as_ref()?.volume_id.clone();
            ids::is_topolvm_id(&id).then(|| {
                if src.spec.access_type == "ro" && !src.spec.source.is_empty() {
                    Source::Snapshot(id)
                } else {
                    Source::Volume(id)
                }
            })
        });
        taken_over.unwrap_or_else(|| {
            if ids::is_snapshot_id(name) {
                Source::Snapshot(name.to_owned())
            } else {
                Source::Volume(name.to_owned())
            }
        })
    }

    /// Creates `lv` (or finds it from an earlier attempt) and waits for the agent's answer.
    async fn make(&self, lv: LogicalVolume) -> Result<Volume> {
        let name = lv.name_any();
        match self.api.create(&PostParams::default(), &lv).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let found = self
                    .api
                    .get(&name)
                    .await
                    .map_err(api_err(format!("read LogicalVolume {name}")))?;
                if found.spec.node_name != self.node || found.spec.name != lv.spec.name {
                    return Err(BackendError::Conflict(format!(
                        "LogicalVolume {name} exists for {:?} on node {}",
                        found.spec.name, found.spec.node_name
                    )));
                }
            }
            Err(e) => return Err(api_err(format!("create LogicalVolume {name}"))(e)),
        }
        let answered = |o: Option<&LogicalVolume>| {
            o.and_then(|o| o.status.as_ref())
                .is_some_and(|s| !s.volume_id.is_empty() || s.code != 0)
        };
        let lv = self.wait_for(&name, answered).await?.ok_or_else(|| {
            BackendError::Unavailable(format!("LogicalVolume {name} was deleted while being made"))
        })?;
        let status = lv.status.clone().unwrap_or_default();
        if status.code != 0 {
            // The controller owns the failed request: remove it (the agent releases it) so a retry
            // starts afresh.
            match self.api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    if let Err(e) = self.wait_for(&name, |o| o.is_none()).await {
                        tracing::warn!(logical_volume = %name, error = %e, "failed request not yet removed");
                    }
                }
                Err(e) => {
                    tracing::warn!(logical_volume = %name, error = %e, "cannot remove failed request")
                }
            }
            return Err(from_code(status.code, status.message));
        }
        let classes = self.classes();
        self.volume(&lv, &classes).ok_or_else(|| {
            BackendError::Unavailable(format!(
                "node {} serves no default class for LogicalVolume {name}",
                self.node
            ))
        })
    }

    async fn wait_for(
        &self,
        name: &str,
        cond: impl Fn(Option<&LogicalVolume>) -> bool + Send + 'static,
    ) -> Result<Option<LogicalVolume>> {
        match tokio::time::timeout(self.wait, await_condition(self.api.clone(), name, cond)).await {
            Ok(Ok(lv)) => Ok(lv),
            Ok(Err(e)) => Err(BackendError::Unavailable(format!(
                "watching LogicalVolume {name}: {e}"
            ))),
            Err(_) => Err(BackendError::Unavailable(format!(
                "node {} has not answered LogicalVolume {name} within {} s; the request stays \
                 and a retry picks it up",
                self.node,
                self.wait.as_secs()
            ))),
        }
    }
}

impl Backend for NodeBackend {
    fn node_id(&self) -> &str {
        &self.node
    }

    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.view.node_classes(&self.node)
    }

    async fn ready(&self) -> Result<bool> {
        Ok(true)
    }

    async fn get(&self, id: &str) -> Result<Option<Volume>> {
        let classes = self.classes();
        Ok(self
            .view
            .logical_volume(id)
            .filter(|lv| lv.spec.node_name == self.node)
            .and_then(|lv| self.volume(&lv, &classes)))
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        let classes = self.classes();
        let mut out: Vec<Volume> = self
            .view
            .logical_volumes_on(&self.node)
            .iter()
            .filter_map(|lv| self.volume(lv, &classes))
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn create_volume(&self, req: &NewVolume) -> Result<Volume> {
        let id = ids::volume_lv_name(&req.name);
        let (source, access_type) = match &req.source {
            None => (String::new(), String::new()),
            // TopoLVM's `spec.source` is the source object's name.
            Some(s) => (self.view.object_name(s.id()), "rw".to_owned()),
        };
        self.make(LogicalVolume::new(
            &id,
            LogicalVolumeSpec {
                name: req.name.clone(),
                node_name: self.node.clone(),
                size: Quantity(req.size.to_string()),
                device_class: req.class.clone(),
                lvcreate_option_class: String::new(),
                source,
                access_type,
                layout: req.lv_type.map(|l| l.to_api()),
                volume_mode: req.volume_mode.map(Into::into),
            },
        ))
        .await
    }

    async fn create_snapshot(&self, req: &NewSnapshot) -> Result<Volume> {
        let source = self.get(&req.source_volume).await?.ok_or_else(|| {
            BackendError::NotFound(format!("volume {} does not exist", req.source_volume))
        })?;
        let id = ids::snapshot_lv_name(&req.name);
        self.make(LogicalVolume::new(
            &id,
            LogicalVolumeSpec {
                name: req.name.clone(),
                node_name: self.node.clone(),
                size: Quantity(source.size.to_string()),
                device_class: source.class.clone(),
                lvcreate_option_class: String::new(),
                source: self.view.object_name(&source.id),
                access_type: "ro".to_owned(),
                layout: None,
                volume_mode: None,
            },
        ))
        .await
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        let name = self.view.object_name(id);
        let found = self
            .api
            .get_opt(&name)
            .await
            .map_err(api_err(format!("read LogicalVolume {name}")))?;
        match found {
            Some(lv) if lv.spec.node_name == self.node => {}
            _ => return Ok(false),
        }
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(true),
            Err(e) => return Err(api_err(format!("delete LogicalVolume {name}"))(e)),
        }
        self.wait_for(&name, |o| o.is_none()).await?;
        Ok(true)
    }

    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        let name = self.view.object_name(id);
        let patch = json!({"spec": {"size": size.to_string()}});
        self.api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(api_err(format!("grow LogicalVolume {name}")))?;
        let grown = move |o: Option<&LogicalVolume>| {
            o.and_then(|o| o.status.as_ref()).is_some_and(|s| {
                s.code != 0
                    || s.current_size
                        .as_ref()
                        .and_then(|q| q.0.parse::<ByteSize>().ok())
                        .is_some_and(|b| b.0 >= size)
            })
        };
        let lv = self.wait_for(&name, grown).await?.ok_or_else(|| {
            BackendError::NotFound(format!("LogicalVolume {name} was deleted while growing"))
        })?;
        let status = lv.status.unwrap_or_default();
        if status.code != 0 {
            return Err(from_code(status.code, status.message));
        }
        Ok(status
            .current_size
            .and_then(|q| q.0.parse::<ByteSize>().ok())
            .map_or(size, |b| b.0))
    }

    /// The class's own layout (and thin and shared classes): the TopoLVM annotation. Another
    /// layout: computed from the free extents of each device the node publishes (none published:
    /// nothing, rather than a number that might not fit).
    async fn capacity(&self, class: &str, layout: &Layout) -> Result<Capacity> {
        let info = self.classes().into_iter().find(|c| c.name == class);
        let own = info.as_ref().is_none_or(|c| {
            c.thin_pool().is_some() || c.shared().is_some() || c.layout() == *layout
        });
        if own {
            let available = self.view.available(&self.node, Some(class)).unwrap_or(0);
            return Ok(Capacity {
                available,
                maximum_volume_size: available,
                minimum_volume_size: 0,
                devices: None,
            });
        }
        let free = self.view.free_space(&self.node, class);
        let available = free.as_ref().map_or(0, |f| layout.max_size(f));
        Ok(Capacity {
            available,
            maximum_volume_size: available,
            minimum_volume_size: 0,
            devices: free.map(|f| f.devices()),
        })
    }

    async fn activate(&self, id: &str) -> Result<String> {
        Err(BackendError::Unavailable(format!(
            "{id}: volumes are activated by the node agent of node {}, not by the controller",
            self.node
        )))
    }
}
