//! Serving the services on a Unix socket, and connecting to one.
//!
//! The socket path is where kubelet (or any CSI client) expects it. A stale socket left by a crashed
//! run is removed at start; anything else at that path is refused (never deleted). The socket is made
//! readable and writable by its owner only (mode 0600): every CSI client runs as root.

use std::{
    future::Future,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
pub use tonic::transport::Channel;
use tonic::transport::{Endpoint, Server};

use crate::{
    controller::ControllerService,
    csi::{
        controller_server::{Controller, ControllerServer},
        identity_server::IdentityServer,
        node_server::{Node, NodeServer},
        snapshot_metadata_server::{SnapshotMetadata, SnapshotMetadataServer},
    },
    identity::IdentityService,
    snapshot_metadata::SnapshotMetadataService,
};
use lvms_engine::backend::Backend;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket path holds something that is not a socket.
    #[error("{}: exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A filesystem call on the socket path failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("serving CSI: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// `Result` with the server's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_owned(),
        source,
    }
}

/// Binds `path`: removes a stale socket there, creates the parent directory, binds, sets mode 0600.
pub fn bind(path: &Path) -> Result<UnixListener> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(io(path))?,
        Ok(_) => {
            return Err(Error::NotASocket {
                path: path.to_owned(),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path)(e)),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let listener = UnixListener::bind(path).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io(path))?;
    Ok(listener)
}

/// Which services to serve (`N` is the Node service, [`crate::node`]'s in the driver; `C` the Controller
/// service, [`ControllerService`] over one node's backend unless a cluster-wide one is given; `M` the
/// SnapshotMetadata service, [`SnapshotMetadataService`] over the backend unless one that forwards
/// to the nodes is given).
pub struct Services<B, N, C = ControllerService<B>, M = SnapshotMetadataService<B>> {
    /// Always served.
    pub identity: IdentityService<B>,
    /// The Controller service, if this process is a controller.
    pub controller: Option<C>,
    /// The Node service, if this process is on a node.
    pub node: Option<N>,
    /// The SnapshotMetadata service, where this process sees the thin pools (advertise it with
    /// [`IdentityService::with_snapshot_metadata`]).
    pub snapshot_metadata: Option<M>,
}

/// Serves `services` on `listener` until `shutdown` completes.
pub async fn serve<B, N, C, M>(
    listener: UnixListener,
    services: Services<B, N, C, M>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()>
where
    B: Backend,
    N: Node,
    C: Controller,
    M: SnapshotMetadata,
{
    let router = Server::builder()
        .add_service(IdentityServer::new(services.identity))
        .add_optional_service(services.controller.map(ControllerServer::new))
        .add_optional_service(services.node.map(NodeServer::new))
        .add_optional_service(services.snapshot_metadata.map(SnapshotMetadataServer::new));
    router
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

/// A gRPC channel to the CSI socket at `path`.
pub async fn connect(path: impl Into<PathBuf>) -> Result<Channel, tonic::transport::Error> {
    let path = path.into();
    // The URI is required by the API and ignored: the connector dials the socket.
    Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// The Node service type of a server that serves none (`node: None`): every call is UNIMPLEMENTED.
pub struct NoNode;

#[tonic::async_trait]
impl Node for NoNode {
    async fn node_stage_volume(
        &self,
        _: tonic::Request<crate::csi::NodeStageVolumeRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeStageVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_unstage_volume(
        &self,
        _: tonic::Request<crate::csi::NodeUnstageVolumeRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeUnstageVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_publish_volume(
        &self,
        _: tonic::Request<crate::csi::NodePublishVolumeRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodePublishVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_unpublish_volume(
        &self,
        _: tonic::Request<crate::csi::NodeUnpublishVolumeRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeUnpublishVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_get_volume_stats(
        &self,
        _: tonic::Request<crate::csi::NodeGetVolumeStatsRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeGetVolumeStatsResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_expand_volume(
        &self,
        _: tonic::Request<crate::csi::NodeExpandVolumeRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeExpandVolumeResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_get_capabilities(
        &self,
        _: tonic::Request<crate::csi::NodeGetCapabilitiesRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeGetCapabilitiesResponse>, tonic::Status>
    {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_get_info(
        &self,
        _: tonic::Request<crate::csi::NodeGetInfoRequest>,
    ) -> std::result::Result<tonic::Response<crate::csi::NodeGetInfoResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented(""))
    }
}
