//! The Identity and Controller services over the in-memory backend on a real socket, for the CSI
//! contract tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use lvms_csi::{
    controller::ControllerService,
    csi::{controller_client::ControllerClient, identity_client::IdentityClient},
    identity::{Converged, IdentityService},
    server::{self, Services},
};
pub use lvms_testkit::fake_backend::{EXTENT, FakeBackend, NODE, NoNode};
use tonic::transport::Channel;

/// The Identity and Controller services over `backend` on a socket in a temp dir, and clients.
pub struct Driver {
    pub backend: Arc<FakeBackend>,
    pub converged: Converged,
    pub socket: PathBuf,
    pub controller: ControllerClient<Channel>,
    pub identity: IdentityClient<Channel>,
    _dir: tempfile::TempDir,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Driver {
    pub async fn start() -> Self {
        Self::start_with(Arc::new(FakeBackend::new())).await
    }

    pub async fn start_with(backend: Arc<FakeBackend>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi/csi.sock");
        let converged = Converged::default();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let listener = server::bind(&socket).unwrap();
        let services: Services<FakeBackend, NoNode> = Services {
            snapshot_metadata: None,
            identity: IdentityService::new("topolvm.io", true, backend.clone(), converged.clone()),
            controller: Some(ControllerService::new(backend.clone())),
            node: None,
        };
        tokio::spawn(async move {
            server::serve(listener, services, async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        let channel = server::connect(&socket).await.unwrap();
        Self {
            backend,
            converged,
            controller: ControllerClient::new(channel.clone()),
            identity: IdentityClient::new(channel),
            socket,
            _dir: dir,
            stop,
        }
    }

    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn stop(self) {
        let _ = self.stop.send(());
    }
}
