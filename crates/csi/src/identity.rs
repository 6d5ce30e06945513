//! The Identity service: who the plugin is, what it offers, and whether it is ready.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use tonic::{Request, Response, Status};

use crate::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
    identity_server::Identity,
    plugin_capability::{self, VolumeExpansion, service, volume_expansion},
};
use lvms_engine::backend::Backend;

/// Set once the node's device classes have converged (the node engine's work is done); `Probe` is
/// not ready before.
#[derive(Debug, Clone, Default)]
pub struct Converged(Arc<AtomicBool>);

impl Converged {
    /// Marks the classes converged (or not).
    pub fn set(&self, converged: bool) {
        self.0.store(converged, Ordering::Release);
    }

    /// Whether the classes converged.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The Identity service.
pub struct IdentityService<B> {
    driver_name: String,
    controller: bool,
    snapshot_metadata: bool,
    backend: Arc<B>,
    converged: Converged,
}

impl<B: Backend> IdentityService<B> {
    /// `controller`: whether this process also serves the Controller service (advertised).
    pub fn new(
        driver_name: impl Into<String>,
        controller: bool,
        backend: Arc<B>,
        converged: Converged,
    ) -> Self {
        Self {
            driver_name: driver_name.into(),
            controller,
            snapshot_metadata: false,
            backend,
            converged,
        }
    }

    /// Advertises the SnapshotMetadata service (`SNAPSHOT_METADATA_SERVICE`): the process serves it.
    #[must_use]
    pub fn with_snapshot_metadata(mut self) -> Self {
        self.snapshot_metadata = true;
        self
    }
}

fn service(t: service::Type) -> PluginCapability {
    PluginCapability {
        r#type: Some(plugin_capability::Type::Service(
            plugin_capability::Service { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl<B: Backend> Identity for IdentityService<B> {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_owned(),
            manifest: [("implementation".to_owned(), "lvms-rs".to_owned())].into(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let mut capabilities = Vec::new();
        if self.controller {
            capabilities.push(service(service::Type::ControllerService));
        }
        capabilities.push(service(service::Type::VolumeAccessibilityConstraints));
        if self.snapshot_metadata {
            capabilities.push(service(service::Type::SnapshotMetadataService));
        }
        capabilities.push(PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        });
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        let ready = self.converged.get()
            && self.backend.ready().await.map_err(|e| {
                Status::failed_precondition(format!("the volume groups cannot be read: {e}"))
            })?;
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
