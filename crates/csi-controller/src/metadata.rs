//! Changed-block tracking on Kubernetes ([`ForwardedMetadata`]): the SnapshotMetadata service the
//! external-snapshot-metadata sidecar calls on the controller's socket, each call forwarded to the
//! node agent whose thin pool holds the snapshots, at the address it published on its Node, over
//! mutual TLS ([`lvms_csi::remote`]); the agent's answer streams back as it is (ADR 0039).

use std::sync::Arc;

use kube::runtime::reflector::ObjectRef;
use lvms_csi::{
    csi::{
        GetMetadataAllocatedRequest, GetMetadataAllocatedResponse, GetMetadataDeltaRequest,
        GetMetadataDeltaResponse, snapshot_metadata_client::SnapshotMetadataClient,
        snapshot_metadata_server::SnapshotMetadata,
    },
    remote::{self, Tls},
};
use tonic::{Request, Response, Status, Streaming, transport::Channel};

use crate::view::View;

/// The SnapshotMetadata service of the cluster, forwarding to the nodes.
pub struct ForwardedMetadata {
    view: Arc<View>,
    tls: Tls,
}

impl ForwardedMetadata {
    pub fn new(view: Arc<View>, tls: Tls) -> Self {
        Self { view, tls }
    }

    /// The node of snapshot `id` and the snapshot's id on that node.
    fn locate(&self, field: &str, id: &str) -> Result<(String, String), Status> {
        if id.is_empty() {
            return Err(Status::invalid_argument(format!("{field} is required")));
        }
        let lv = self
            .view
            .logical_volume(id)
            .ok_or_else(|| Status::not_found(format!("snapshot {id} does not exist")))?;
        let on_node = lv
            .status
            .as_ref()
            .map(|s| s.volume_id.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "snapshot {id} is not made yet on node {}: retry",
                    lv.spec.node_name
                ))
            })?;
        Ok((lv.spec.node_name.clone(), on_node))
    }

    /// A client of the agent of `node`.
    async fn agent(&self, node: &str) -> Result<SnapshotMetadataClient<Channel>, Status> {
        let key = lvms_api::snapshot_metadata_annotation(&self.view.driver);
        let address = self
            .view
            .nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.metadata.annotations.as_ref()?.get(&key).cloned())
            .ok_or_else(|| {
                Status::unavailable(format!(
                    "node {node} publishes no changed-block tracking address ({key}): its agent \
                     runs without LVMS_SNAPSHOT_METADATA_CERT_DIR, or has not started"
                ))
            })?;
        let channel = remote::connect(&address, &self.tls).await.map_err(|e| {
            Status::unavailable(format!(
                "cannot reach the agent of node {node} at {address}: {}",
                lvms_csi::chain(&e)
            ))
        })?;
        Ok(SnapshotMetadataClient::new(channel))
    }
}

#[tonic::async_trait]
impl SnapshotMetadata for ForwardedMetadata {
    type GetMetadataAllocatedStream = Streaming<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Streaming<GetMetadataDeltaResponse>;

    #[tracing::instrument(skip_all, fields(snapshot = %request.get_ref().snapshot_id))]
    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let mut req = request.into_inner();
        let (node, id) = self.locate("snapshot_id", &req.snapshot_id)?;
        req.snapshot_id = id;
        self.agent(&node).await?.get_metadata_allocated(req).await
    }

    #[tracing::instrument(skip_all, fields(base = %request.get_ref().base_snapshot_id, target = %request.get_ref().target_snapshot_id))]
    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let mut req = request.into_inner();
        let (base_node, base) = self.locate("base_snapshot_id", &req.base_snapshot_id)?;
        let (node, target) = self.locate("target_snapshot_id", &req.target_snapshot_id)?;
        if base_node != node {
            return Err(Status::invalid_argument(format!(
                "snapshots {} (node {base_node}) and {} (node {node}) are on different nodes, so \
                 not of the same volume",
                req.base_snapshot_id, req.target_snapshot_id
            )));
        }
        req.base_snapshot_id = base;
        req.target_snapshot_id = target;
        self.agent(&node).await?.get_metadata_delta(req).await
    }
}
