//! [`ClusterController`]: the CSI Controller service of a cluster. Each RPC is answered by the
//! single-node [`ControllerService`] (the same code standalone mode runs, with all its validation,
//! idempotency and error codes) over the [`NodeBackend`] of the node the volume lives on; this type only
//! picks that node:
//!
//! - `CreateVolume`: the node already holding the name; else the source's node (clones and restores
//!   stay with their source); else the first node of the accessibility requirements (preferred, then
//!   requisite) that serves the class and has room, or the first that serves it; with no requirements,
//!   the serving node with the most room (from the capacity annotations, ADR 0009).
//! - Calls naming a volume or snapshot id: the node of its `LogicalVolume`. An id no node holds is
//!   answered by the service of no node (`""`), which knows no volume: `DeleteVolume` is OK,
//!   `ControllerExpandVolume` and `GetSnapshot` NOT_FOUND, as the spec asks.
//! - `ListVolumes`/`ListSnapshots`: every node's entries, merged by id and paged here.
//! - `GetCapacity`: the node of the topology segment; without one, the sum over serving nodes.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::Api;
use lvms_api::topolvm::LogicalVolume;
use lvms_csi::{
    TOPOLOGY_NODE_KEY,
    controller::{ControllerService, page},
    csi::{controller_server::Controller, *},
    params,
};
use lvms_engine::ids;
use tonic::{Request, Response, Status};

use crate::{backend::NodeBackend, view::View};

/// The cluster's Controller service.
pub struct ClusterController {
    view: Arc<View>,
    api: Api<LogicalVolume>,
    wait: Option<Duration>,
    services: Mutex<BTreeMap<String, Arc<ControllerService<NodeBackend>>>>,
}

impl ClusterController {
    pub fn new(view: Arc<View>, api: Api<LogicalVolume>) -> Self {
        Self {
            view,
            api,
            wait: None,
            services: Mutex::new(BTreeMap::new()),
        }
    }

    /// How long a call waits for a node agent (default [`crate::backend::WAIT`]).
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The single-node service of `node` (kept, so its in-flight table serialises calls per volume).
    fn service(&self, node: &str) -> Arc<ControllerService<NodeBackend>> {
        let mut services = self
            .services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        services
            .entry(node.to_owned())
            .or_insert_with(|| {
                let mut backend = NodeBackend::new(node, self.view.clone(), self.api.clone());
                if let Some(w) = self.wait {
                    backend = backend.with_wait(w);
                }
                Arc::new(ControllerService::new(Arc::new(backend)))
            })
            .clone()
    }

    /// The node of the volume or snapshot `id` (`""` when no node holds it).
    fn node_of(&self, id: &str) -> String {
        self.view
            .logical_volume(id)
            .map(|lv| lv.spec.node_name.clone())
            .unwrap_or_default()
    }

    fn by_id(&self, id: &str) -> Arc<ControllerService<NodeBackend>> {
        self.service(&self.node_of(id))
    }

    /// Nodes that serve `class` (`None`: a default class).
    fn serving(&self, class: Option<&str>) -> Vec<String> {
        self.view
            .serving_nodes()
            .into_iter()
            .filter(|n| {
                self.view
                    .node_classes(n)
                    .iter()
                    .any(|c| class.map_or(c.default, |name| c.name == name))
            })
            .collect()
    }

    /// Every node the controller knows: serving ones and those holding volumes.
    fn known_nodes(&self) -> BTreeSet<String> {
        let mut nodes: BTreeSet<String> = self.view.serving_nodes().into_iter().collect();
        nodes.extend(
            self.view
                .logical_volumes
                .state()
                .iter()
                .map(|lv| lv.spec.node_name.clone()),
        );
        nodes
    }

    /// The node a new volume goes to (see the [module documentation](self)).
    fn place(&self, req: &CreateVolumeRequest) -> Result<String, Status> {
        let held = self.node_of(&ids::volume_lv_name(&req.name));
        if !held.is_empty() {
            return Ok(held);
        }
        let source = req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
            .map(|t| match t {
                volume_content_source::Type::Snapshot(s) => s.snapshot_id.clone(),
                volume_content_source::Type::Volume(v) => v.volume_id.clone(),
            });
        if let Some(source) = source.filter(|s| !s.is_empty()) {
            let node = self.node_of(&source);
            if node.is_empty() {
                return Err(Status::not_found(format!(
                    "the content source {source} does not exist"
                )));
            }
            return Ok(node);
        }
        let class = params::parse(&req.parameters)
            .map_err(Status::invalid_argument)?
            .class;
        let serving = self.serving(class.as_deref());
        let class_name = class.as_deref().unwrap_or("(the default class)");
        let required = req
            .capacity_range
            .as_ref()
            .map_or(0, |r| u64::try_from(r.required_bytes).unwrap_or(0));
        let room = |n: &String| self.view.available(n, class.as_deref()).unwrap_or(0);
        let wanted: Vec<String> = req
            .accessibility_requirements
            .as_ref()
            .map(|r| {
                let mut out: Vec<String> = Vec::new();
                for t in r.preferred.iter().chain(&r.requisite) {
                    if let Some(n) = t.segments.get(TOPOLOGY_NODE_KEY)
                        && !out.contains(n)
                    {
                        out.push(n.clone());
                    }
                }
                out
            })
            .unwrap_or_default();
        if !wanted.is_empty() {
            let candidates: Vec<&String> = wanted.iter().filter(|n| serving.contains(n)).collect();
            return candidates
                .iter()
                .find(|n| room(n) >= required)
                .or(candidates.first())
                .map(|n| (*n).clone())
                .ok_or_else(|| {
                    Status::resource_exhausted(format!(
                        "no node of the accessibility requirements ({}) serves device class {class_name}",
                        wanted.join(", ")
                    ))
                });
        }
        serving
            .iter()
            .max_by_key(|n| (room(n), std::cmp::Reverse((*n).clone())))
            .cloned()
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "no node serves device class {class_name} yet: see the LVMCluster's status"
                ))
            })
    }
}

fn volume_entry_id(e: &list_volumes_response::Entry) -> &str {
    e.volume.as_ref().map_or("", |v| v.volume_id.as_str())
}

fn snapshot_entry_id(e: &list_snapshots_response::Entry) -> &str {
    e.snapshot.as_ref().map_or("", |s| s.snapshot_id.as_str())
}

fn sorted_by_id<T>(mut items: Vec<T>, id: impl Fn(&T) -> &str) -> Vec<T> {
    items.sort_by(|a, b| id(a).cmp(id(b)));
    items
}

fn paged<T>(
    items: Vec<T>,
    id: impl Fn(&T) -> &str,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<T>, String), Status> {
    page(items, id, max_entries, starting_token).map_err(Status::from)
}

#[tonic::async_trait]
impl Controller for ClusterController {
    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let node = if request.get_ref().name.is_empty() {
            String::new()
        } else {
            self.place(request.get_ref())?
        };
        tracing::debug!(%node, "placed");
        self.service(&node).create_volume(request).await
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let svc = self.by_id(&request.get_ref().volume_id);
        svc.delete_volume(request).await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        self.service("").controller_publish_volume(request).await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.service("").controller_unpublish_volume(request).await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let svc = self.by_id(&request.get_ref().volume_id);
        svc.validate_volume_capabilities(request).await
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let mut entries = Vec::new();
        for node in self.known_nodes() {
            let all = self
                .service(&node)
                .list_volumes(Request::new(ListVolumesRequest::default()))
                .await?;
            entries.extend(all.into_inner().entries);
        }
        let entries = sorted_by_id(entries, volume_entry_id);
        let (entries, next_token) = paged(
            entries,
            volume_entry_id,
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(Response::new(ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let node = request
            .get_ref()
            .accessible_topology
            .as_ref()
            .and_then(|t| t.segments.get(TOPOLOGY_NODE_KEY))
            .cloned();
        if let Some(node) = node {
            return self.service(&node).get_capacity(request).await;
        }
        let req = request.into_inner();
        let class = params::parse(&req.parameters)
            .map_err(Status::invalid_argument)?
            .class;
        let (mut available, mut maximum) = (0i64, 0i64);
        for node in self.serving(class.as_deref()) {
            let c = self
                .service(&node)
                .get_capacity(Request::new(req.clone()))
                .await?
                .into_inner();
            available = available.saturating_add(c.available_capacity);
            maximum = maximum.max(c.maximum_volume_size.unwrap_or(0));
        }
        Ok(Response::new(GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(maximum),
            minimum_volume_size: None,
        }))
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        self.service("").controller_get_capabilities(request).await
    }

    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.get_ref();
        let held = self.node_of(&ids::snapshot_lv_name(&req.name));
        let node = if req.name.is_empty() || !held.is_empty() {
            held
        } else {
            self.node_of(&req.source_volume_id)
        };
        self.service(&node).create_snapshot(request).await
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        let svc = self.by_id(&request.get_ref().snapshot_id);
        svc.delete_snapshot(request).await
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let mut entries = Vec::new();
        for node in self.known_nodes() {
            let all = self
                .service(&node)
                .list_snapshots(Request::new(ListSnapshotsRequest {
                    max_entries: 0,
                    starting_token: String::new(),
                    source_volume_id: req.source_volume_id.clone(),
                    snapshot_id: req.snapshot_id.clone(),
                    secrets: req.secrets.clone(),
                }))
                .await?;
            entries.extend(all.into_inner().entries);
        }
        let entries = sorted_by_id(entries, snapshot_entry_id);
        let (entries, next_token) = paged(
            entries,
            snapshot_entry_id,
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(Response::new(ListSnapshotsResponse {
            entries,
            next_token,
        }))
    }

    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let svc = self.by_id(&request.get_ref().snapshot_id);
        svc.get_snapshot(request).await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let svc = self.by_id(&request.get_ref().volume_id);
        svc.controller_expand_volume(request).await
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let svc = self.by_id(&request.get_ref().volume_id);
        svc.controller_get_volume(request).await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        let svc = self.by_id(&request.get_ref().volume_id);
        svc.controller_modify_volume(request).await
    }
}
