//! `lvms csi-controller`: the CSI Controller (and Identity) service of the cluster, beside the CSI
//! sidecars (external-provisioner, -resizer, -snapshotter) in the operator's pod. Volumes are
//! `LogicalVolume` objects the node agents answer (see `lvms_csi_controller`).

use std::{path::PathBuf, sync::Arc};

use anyhow::{Context, Result, bail};
use kube::Api;
use lvms_api::topolvm::LogicalVolume;
use lvms_csi::{
    identity::{Converged, IdentityService},
    remote::Tls,
    server::{self, NoNode, Services},
};
use lvms_csi_controller::{
    backend::NodeBackend, gc::ControllerCollector, metadata::ForwardedMetadata,
    service::ClusterController, view::View,
};

/// `lvms csi-controller`'s flags.
#[derive(clap::Args)]
pub struct CsiControllerArgs {
    /// Namespace of the `LVMVolumeGroup`s and node statuses (the operator's).
    #[arg(long, env = "NAMESPACE")]
    namespace: String,
    /// The CSI socket the sidecars dial.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///run/lvms/csi-controller.sock"
    )]
    endpoint: String,
    /// The CSI driver name.
    #[arg(long, env = "CSI_DRIVER_NAME", default_value = lvms_csi::DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Delete volume LogicalVolumes that no PersistentVolume refers to after this many seconds
    /// (unset: only report them, with an event).
    #[arg(long, env = "LVMS_GC_DELETE_AFTER", value_name = "SECONDS")]
    gc_delete_after: Option<u64>,
    /// Look for unclaimed LogicalVolumes every this many seconds.
    #[arg(long, env = "LVMS_GC_PERIOD", value_name = "SECONDS", default_value_t = lvms_engine::gc::PERIOD.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    gc_period: u64,
    /// Port of `/metrics` (the garbage collector's numbers) and `/healthz`.
    #[arg(long, env = "METRICS_PORT", default_value_t = 8082)]
    metrics_port: u16,
    /// Elect one leader among the replicas by the Lease `lvms-csi-controller` in the namespace: only
    /// it runs the garbage collector; every replica serves CSI (the sidecars elect their own).
    /// `false`: this process collects at once; run one replica only then.
    #[arg(long, env = "LVMS_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// This replica's name in the leader Lease (the pod's name; the host's name and the process id
    /// when unset).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Directory of the certificate (`ca.crt`, `tls.crt`, `tls.key`) with which changed-block
    /// tracking requests are forwarded to the node agents (mutual TLS, ADR 0039); set: the
    /// SnapshotMetadata service is served and advertised. Unset or empty: it is not.
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA_CERT_DIR")]
    snapshot_metadata_cert_dir: Option<PathBuf>,
}

/// Serves until SIGTERM or Ctrl-C, or until the watches end.
pub async fn run(args: CsiControllerArgs) -> Result<()> {
    let client = lvms_k8s::client("csi-controller")
        .await
        .context("connecting to the Kubernetes API")?;
    let (view, keep_current) = View::start(client.clone(), &args.namespace, &args.driver_name);
    let lvs: Api<LogicalVolume> = Api::all(client.clone());
    let metrics = Arc::new(lvms_k8s::metrics::GcMetrics::new(
        "unclaimed_logical_volumes",
    ));
    let collector = ControllerCollector::new(
        view.clone(),
        lvs.clone(),
        args.gc_delete_after.map(std::time::Duration::from_secs),
    )
    .with_metrics(metrics.clone());
    let metrics_listener = crate::bind_metrics(args.metrics_port).await?;
    let socket = PathBuf::from(
        args.endpoint
            .strip_prefix("unix://")
            .unwrap_or(&args.endpoint),
    );
    let converged = Converged::default();
    let metadata = match args
        .snapshot_metadata_cert_dir
        .as_deref()
        .filter(|d| !d.as_os_str().is_empty())
    {
        Some(dir) => Some(ForwardedMetadata::new(
            view.clone(),
            Tls::read(dir).context("LVMS_SNAPSHOT_METADATA_CERT_DIR")?,
        )),
        None => None,
    };
    let mut identity = IdentityService::new(
        args.driver_name,
        true,
        Arc::new(NodeBackend::new("", view.clone(), lvs.clone())),
        converged.clone(),
    );
    if metadata.is_some() {
        identity = identity.with_snapshot_metadata();
    }
    let services: Services<NodeBackend, NoNode, ClusterController, ForwardedMetadata> = Services {
        snapshot_metadata: metadata,
        identity,
        controller: Some(ClusterController::new(view.clone(), lvs)),
        node: None,
    };
    let listener = server::bind(&socket)?;
    tracing::info!(socket = %socket.display(), "serving CSI Identity and Controller");
    let ready = async {
        view.ready().await.context("watching the cluster")?;
        converged.set(true);
        tracing::info!("cluster view ready");
        std::future::pending::<Result<()>>().await
    };
    let period = std::time::Duration::from_secs(args.gc_period);
    let collect = async move {
        tokio::select! {
            () = collector.run(period) => tracing::error!("the garbage collector ended"),
            () = crate::shutdown_signal() => {}
        }
    };
    let identity = crate::replica_identity(args.pod_name);
    // Completes only when leadership is lost: once stopping, the server below ends on the same
    // signal.
    let collected = async {
        if !args.leader_election {
            collect.await;
            return std::future::pending::<lvms_k8s::leader::Lost>().await;
        }
        let timings = lvms_k8s::leader::Timings::DEFAULT;
        let lease = timings.lease(
            client,
            &args.namespace,
            lvms_csi_controller::gc::LEADER_LEASE,
            &identity,
        );
        match lvms_k8s::leader::lead(&lease, timings, collect, crate::shutdown_signal(), || {})
            .await
        {
            Err(lost) => lost,
            Ok(()) => std::future::pending().await,
        }
    };
    tokio::select! {
        () = keep_current => bail!("the cluster watches ended"),
        lost = collected => Err(lost).context("leading the garbage collector"),
        served = lvms_k8s::metrics::serve(metrics_listener, metrics) => {
            served.context("serving /metrics")
        }
        r = ready => r,
        served = server::serve(listener, services, crate::shutdown_signal()) => {
            served.context("serving CSI")
        }
    }
}
