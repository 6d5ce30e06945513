//! The node agent's SnapshotMetadata service over the network, for the CSI controller on Kubernetes
//! (ADR 0039): the external-snapshot-metadata sidecar runs beside the controller and calls it on the
//! controller's socket; the controller forwards each call to the agent of the node whose thin pool
//! holds the snapshots, which serves the same service over TCP.
//!
//! Both ends use mutual TLS with one certificate from one directory laid out as a
//! `kubernetes.io/tls` Secret with its CA (`ca.crt`, `tls.crt`, `tls.key`): the agent accepts only
//! clients whose certificate that CA signed, and the controller accepts only an agent whose
//! certificate that CA signed for [`SERVER_NAME`]. Nothing else is exposed: the agent's port serves
//! the SnapshotMetadata service alone, which only reads.

use std::{net::SocketAddr, path::Path, time::Duration};

use tonic::transport::{
    Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig,
};

use crate::{
    csi::snapshot_metadata_server::{SnapshotMetadata, SnapshotMetadataServer},
    server::{Error, Result},
};

/// The name the controller checks in the agent's certificate (one of its DNS names).
pub const SERVER_NAME: &str = lvms_api::SNAPSHOT_METADATA_SERVER_NAME;
/// The port the agent serves on unless told otherwise.
pub const DEFAULT_PORT: u16 = 9810;
/// How long the controller waits to connect to an agent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The CA, certificate and key of `dir`.
#[derive(Clone)]
pub struct Tls {
    ca: Certificate,
    identity: Identity,
}

impl Tls {
    /// Reads `ca.crt`, `tls.crt` and `tls.key` from `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(|source| Error::Io { path, source })
        };
        Ok(Self {
            ca: Certificate::from_pem(read("ca.crt")?),
            identity: Identity::from_pem(read("tls.crt")?, read("tls.key")?),
        })
    }
}

/// Serves `service` on `addr` with mutual TLS until `shutdown` completes.
pub async fn serve<S: SnapshotMetadata>(
    addr: SocketAddr,
    tls: &Tls,
    service: S,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<()> {
    Server::builder()
        .tls_config(
            ServerTlsConfig::new()
                .identity(tls.identity.clone())
                .client_ca_root(tls.ca.clone()),
        )?
        .add_service(SnapshotMetadataServer::new(service))
        .serve_with_shutdown(addr, shutdown)
        .await?;
    Ok(())
}

/// A channel to the agent at `address` (`host:port`), with mutual TLS.
pub async fn connect(address: &str, tls: &Tls) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("https://{address}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(tls.ca.clone())
                .identity(tls.identity.clone())
                .domain_name(SERVER_NAME),
        )?
        .connect()
        .await
}
