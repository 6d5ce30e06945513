//! `lvms node`: the node agent, run by the DaemonSet the operator renders (it sets `NODE_NAME`,
//! `NAMESPACE`, `CSI_ENDPOINT` and `CSI_DRIVER_NAME`).
//!
//! - The volume-group reconciler converges each `LVMVolumeGroup` this node serves and reports the
//!   node's `LVMVolumeGroupNodeStatus`.
//! - The `LogicalVolume` reconciler makes, grows and removes this node's volumes.
//! - Identity and Node are served on the plugin socket; `Probe` is ready once a device class is.
//! - With `--csi-driver-lvm-endpoint`, csi-driver-lvm's volumes in adopted groups are served under
//!   its driver name on a second socket (Identity, Node, and DeleteVolume; ADR 0033).
//! - What each class can still hold is published on the Node (`capacity.<driver>/<class>`).
//! - LVs of ours that no LogicalVolume names are reported (and removed after `--gc-delete-after`).
//!
//! LVM commands of the volumes go to one long-lived `lvm` shell per set of ready classes; the node
//! engine and the filesystem tools run as processes. The backend is made again whenever the set of
//! ready classes changes, and a shared class is ready only once this node joined its lockspace, so
//! the backend's [`Lvm::with_shared`] set is always exactly the shared classes it serves: their
//! LV commands carry lvmlockd and the class's devices file (as in `lvms standalone`).

use std::{path::PathBuf, sync::Arc};

use anyhow::{Context, Result, bail};
use lvms_core::config::Fstype;
use lvms_csi::{
    controller::{CSI_DRIVER_LVM_CAPABILITIES, ControllerService},
    identity::{Converged, IdentityService},
    node::{NodeOptions, NodeService},
    server::{self, Services},
    snapshot_metadata::SnapshotMetadataService,
};
use lvms_engine::local::LocalBackend;
use lvms_host::{
    engine::RealNodeHost, fs::Filesystems, lvm::Lvm, runner::RealRunner, shared::RealSharedHost,
    shell::LvmShell,
};
use lvms_k8s::metrics::{GcMetrics, StorageMetrics};
use lvms_node::{
    capacity::Publisher,
    csi_driver_lvm::{
        CSI_DRIVER_LVM_DRIVER_NAME, CSI_DRIVER_LVM_TOPOLOGY_KEY, CsiDriverLvmVolumes,
    },
    gc::NodeCollector,
    lv_reconciler,
    switch::Switch,
    vg_reconciler,
};

/// `lvms node`'s flags.
#[derive(clap::Args)]
pub struct NodeArgs {
    /// This node's name (`spec.nodeName` of its pod).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// Namespace of the `LVMVolumeGroup`s and of this node's status object.
    #[arg(long, env = "NAMESPACE")]
    namespace: String,
    /// The CSI socket kubelet dials through the plugin directory.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// The CSI driver name.
    #[arg(long, env = "CSI_DRIVER_NAME", default_value = lvms_csi::DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Where TopoLVM's and LVMS's node plugin listens, as this container sees the host's
    /// `<kubelet>/plugins/topolvm.io/node/csi-topolvm.sock`: while something answers there, none
    /// of their volumes is taken over (ADR 0032). Default: `node/csi-topolvm.sock` beside the CSI
    /// socket.
    #[arg(long, env = "LVMS_OLD_DRIVER_SOCKET")]
    old_driver_socket: Option<PathBuf>,
    /// Where to serve, under metal-stack csi-driver-lvm's driver name (`lvm.csi.metal-stack.io`),
    /// the volumes csi-driver-lvm made in a group a class adopts (`adopt: csi-driver-lvm`, ADR
    /// 0033); unset or empty: not served. The operator sets it when a class adopts.
    #[arg(long, env = "LVMS_CSI_DRIVER_LVM_ENDPOINT")]
    csi_driver_lvm_endpoint: Option<String>,
    /// Where csi-driver-lvm's node plugin listens, as this container sees it: while something
    /// answers there, none of its volumes is taken over.
    #[arg(long, env = "LVMS_CSI_DRIVER_LVM_OLD_SOCKET", default_value = lvms_node::csi_driver_lvm::DEFAULT_OLD_SOCKET)]
    csi_driver_lvm_old_socket: PathBuf,
    /// Remove LVs of ours that no LogicalVolume names after they have been orphans this many seconds
    /// (unset: only report them, with an event on the Node). Also the grace period of inline
    /// ephemeral volumes that are not mounted and whose pod is gone (unset: 300 s).
    #[arg(long, env = "LVMS_GC_DELETE_AFTER", value_name = "SECONDS")]
    gc_delete_after: Option<u64>,
    /// Look for orphaned LVs every this many seconds.
    #[arg(long, env = "LVMS_GC_PERIOD", value_name = "SECONDS", default_value_t = lvms_engine::gc::PERIOD.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    gc_period: u64,
    /// Port of `/metrics` (the garbage collector's numbers) and `/healthz`.
    #[arg(long, env = "METRICS_PORT", default_value_t = 8081)]
    metrics_port: u16,
    /// Filesystem made on a blank volume whose capability names none.
    #[arg(long, env = "LVMS_DEFAULT_FSTYPE", default_value = "xfs", value_parser = parse_fstype)]
    default_fstype: Fstype,
    /// How long a stage of a shared class's volume that another node holds waits for its lock (a
    /// dead node's is freed at sanlock's host-dead time), trying again every 5 s; 0 refuses at once.
    /// At most 110: kubelet gives NodeStage 2 minutes.
    #[arg(long, env = "LVMS_SHARED_STAGE_WAIT", value_name = "SECONDS", default_value_t = lvms_engine::local::DEFAULT_SHARED_STAGE_WAIT.as_secs(), value_parser = clap::value_parser!(u64).range(0..=110))]
    shared_stage_wait: u64,
    /// Host directory (mounted at the same path in the pod) where the fence hook of shared classes
    /// goes: this binary is copied there as `lvms`, and `lvmlockctl_kill_command` in the host's
    /// /etc/lvm/lvmlocal.conf is pointed at it unless the host names another command (ADR 0028).
    /// Empty: install nothing (the admin installs the hook by hand).
    #[arg(long, env = "LVMS_FENCE_HOOK_DIR", default_value = lvms_host::fence::install::DEFAULT_DIR)]
    fence_hook_dir: String,
    /// Directory of the certificate (`ca.crt`, `tls.crt`, `tls.key`, a mounted TLS Secret) with
    /// which changed-block tracking is served to the CSI controller over TCP, mutual TLS (ADR
    /// 0039); unset or empty: not served.
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA_CERT_DIR")]
    snapshot_metadata_cert_dir: Option<PathBuf>,
    /// Port of changed-block tracking, on every address of the node.
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA_PORT", default_value_t = lvms_csi::remote::DEFAULT_PORT)]
    snapshot_metadata_port: u16,
    /// Where the CSI controller reaches that port (`host:port`), published on the Node; default:
    /// `$POD_IP` and the port (the DaemonSet is on the host network).
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA_ADDRESS")]
    snapshot_metadata_address: Option<String>,
}

/// Changed-block tracking for the CSI controller, when a certificate directory is given: served on
/// the port with mutual TLS, its address published on this node's Node (ADR 0039).
async fn serve_snapshot_metadata<B: lvms_engine::backend::Backend>(
    client: kube::Client,
    args: &NodeArgs,
    backend: Arc<B>,
) -> Result<()> {
    let Some(dir) = args
        .snapshot_metadata_cert_dir
        .as_deref()
        .filter(|d| !d.as_os_str().is_empty())
    else {
        return std::future::pending().await;
    };
    let tls = lvms_csi::remote::Tls::read(dir).context("LVMS_SNAPSHOT_METADATA_CERT_DIR")?;
    let port = args.snapshot_metadata_port;
    let address = match (&args.snapshot_metadata_address, std::env::var("POD_IP")) {
        (Some(a), _) if !a.is_empty() => a.clone(),
        (_, Ok(ip)) if !ip.is_empty() => format!("{ip}:{port}"),
        _ => bail!(
            "LVMS_SNAPSHOT_METADATA_CERT_DIR is set but neither LVMS_SNAPSHOT_METADATA_ADDRESS nor \
             POD_IP says where the CSI controller reaches this node: set one"
        ),
    };
    lvms_node::metadata_address::publish(client, &args.node_name, &args.driver_name, &address)
        .await
        .context("publishing the changed-block tracking address on the Node")?;
    tracing::info!(%address, port, "serving changed-block tracking to the CSI controller");
    let listen = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    lvms_csi::remote::serve(
        listen,
        &tls,
        SnapshotMetadataService::new(backend),
        crate::shutdown_signal(),
    )
    .await
    .context("serving changed-block tracking")
}

/// The shared classes' host, installing the fence hook in `fence_hook_dir` unless it is empty.
fn shared_host(
    runner: Arc<RealRunner>,
    fence_hook_dir: &str,
) -> Result<RealSharedHost<Arc<RealRunner>>> {
    // The pod's /run is its own: lvm there needs a stand-in for lvmlockd's pid file.
    let host = RealSharedHost::new(runner).with_pid_file_stand_in("/run/lvmlockd.pid");
    if fence_hook_dir.is_empty() {
        return Ok(host);
    }
    if !lvms_core::shared::hook::is_valid_dir(fence_hook_dir) {
        bail!(
            "LVMS_FENCE_HOOK_DIR {fence_hook_dir:?} is not an absolute path without spaces: give \
             one (default {}), or \"\" to install the fence hook by hand",
            lvms_host::fence::install::DEFAULT_DIR
        );
    }
    let hook = lvms_host::fence::install::FenceHook::new(fence_hook_dir)
        .context("finding this binary to install as the fence hook")?;
    Ok(host.with_fence_hook(hook))
}

/// `xfs` or `ext4`, as the Node service reads a capability's `fs_type`.
fn parse_fstype(s: &str) -> Result<Fstype, String> {
    lvms_csi::node::request::fstype(s)?.ok_or_else(|| "give xfs or ext4".to_owned())
}

/// Runs the node agent until SIGTERM or Ctrl-C, or until a watch ends.
pub async fn run(args: NodeArgs) -> Result<()> {
    let client = lvms_k8s::client("node")
        .await
        .context("connecting to the Kubernetes API")?;
    let runner = Arc::new(RealRunner);
    let node = args.node_name.clone();
    let stage_wait = std::time::Duration::from_secs(args.shared_stage_wait);
    // Stages that wait for another node's lock, posted on their claims.
    let (stage_waits, waiting) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(lvms_node::stage_wait::post_events(client.clone(), waiting));
    let storage = StorageMetrics::default();
    let vg_ctx = Arc::new(
        vg_reconciler::Context::new(
            client.clone(),
            &args.node_name,
            &args.namespace,
            RealNodeHost::new(runner.clone()),
            shared_host(runner.clone(), &args.fence_hook_dir)?,
            Box::new(move |classes| {
                let shared: Vec<String> = classes
                    .iter()
                    .filter(|c| c.shared().is_some())
                    .map(|c| c.name.clone())
                    .collect();
                LocalBackend::new(
                    node.clone(),
                    classes,
                    Lvm::new(Arc::new(LvmShell::new())).with_shared(shared),
                )
                .with_shared_stage_wait(stage_wait)
                .with_stage_waits(stage_waits.clone())
            }),
        )
        .with_metrics(storage.clone()),
    );
    let publisher = Publisher::new(
        client.clone(),
        &args.node_name,
        &args.driver_name,
        vg_ctx.backend(),
    )
    .with_metrics(storage.clone());
    let metrics = Arc::new(GcMetrics::with_storage("orphaned_volumes", Some(&storage)));
    let collector = NodeCollector::new(
        client.clone(),
        &args.node_name,
        &args.driver_name,
        vg_ctx.backend(),
        args.gc_delete_after.map(std::time::Duration::from_secs),
    )
    .with_metrics(metrics.clone());
    let metrics_listener = crate::bind_metrics(args.metrics_port).await?;
    let csi_socket = PathBuf::from(
        args.endpoint
            .strip_prefix("unix://")
            .unwrap_or(&args.endpoint),
    );
    let old_driver_socket = args.old_driver_socket.clone().or_else(|| {
        csi_socket
            .parent()
            .map(|dir| dir.join("node").join("csi-topolvm.sock"))
    });
    let metadata_client = client.clone();
    let lv_ctx = Arc::new(lv_reconciler::Context {
        client,
        node: args.node_name.clone(),
        backend: vg_ctx.backend(),
        old_driver_socket,
    });
    // NodeGetInfo (kubelet asks once, at registration) waits for the shared classes still joining.
    let switch = Arc::new(
        Switch::new(&args.node_name, vg_ctx.backend())
            .with_settling(vg_ctx.settling(), lvms_node::switch::SETTLE_WAIT),
    );

    // Probe follows whether any class is served.
    let converged = Converged::default();
    {
        let converged = converged.clone();
        let mut backend = vg_ctx.backend();
        tokio::spawn(async move {
            loop {
                converged.set(backend.borrow_and_update().is_some());
                if backend.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    let socket = csi_socket;
    let listener = server::bind(&socket)?;
    tracing::info!(socket = %socket.display(), node = %args.node_name, "serving CSI Identity and Node");
    let services: Services<_, _> = Services {
        snapshot_metadata: None,
        identity: IdentityService::new(
            args.driver_name.clone(),
            false,
            switch.clone(),
            converged.clone(),
        ),
        controller: None,
        node: Some(NodeService::new(
            switch.clone(),
            Filesystems::new(runner.clone()),
            NodeOptions {
                default_fstype: args.default_fstype,
                ..NodeOptions::default()
            },
        )),
    };
    // csi-driver-lvm's volumes under its name, over the same backend (ADR 0033).
    let csi_driver_lvm = match args
        .csi_driver_lvm_endpoint
        .as_deref()
        .filter(|e| !e.is_empty())
    {
        Some(endpoint) => {
            let socket = PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint));
            let listener = server::bind(&socket)?;
            tracing::info!(socket = %socket.display(), driver = CSI_DRIVER_LVM_DRIVER_NAME, "serving csi-driver-lvm's volumes");
            let volumes = Arc::new(CsiDriverLvmVolumes::new(
                switch.clone(),
                Some(args.csi_driver_lvm_old_socket.clone()),
            ));
            let services: Services<_, _> = Services {
                snapshot_metadata: None,
                identity: IdentityService::new(
                    CSI_DRIVER_LVM_DRIVER_NAME,
                    true,
                    volumes.clone(),
                    converged.clone(),
                ),
                controller: Some(
                    ControllerService::new(volumes.clone())
                        .with_capabilities(&CSI_DRIVER_LVM_CAPABILITIES),
                ),
                node: Some(NodeService::new(
                    volumes,
                    Filesystems::new(runner.clone()),
                    // csi-driver-lvm's defaults: ext4 on a blank volume; the node grows the LV.
                    NodeOptions {
                        default_fstype: Fstype::Ext4,
                        topology_key: CSI_DRIVER_LVM_TOPOLOGY_KEY,
                        grows_volume: true,
                    },
                )),
            };
            Some(server::serve(listener, services, crate::shutdown_signal()))
        }
        None => None,
    };
    let csi_driver_lvm = async move {
        match csi_driver_lvm {
            Some(served) => served.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = vg_reconciler::run(vg_ctx) => bail!("the LVMVolumeGroup watch ended"),
        () = lv_reconciler::run(lv_ctx) => bail!("the LogicalVolume watch ended"),
        () = publisher.run() => bail!("the capacity publisher ended"),
        () = collector.run(std::time::Duration::from_secs(args.gc_period)) => bail!("the garbage collector ended"),
        served = lvms_k8s::metrics::serve(metrics_listener, metrics) => {
            served.context("serving /metrics")
        }
        served = server::serve(listener, services, crate::shutdown_signal()) => {
            served.context("serving CSI")
        }
        served = csi_driver_lvm => served.context("serving csi-driver-lvm's volumes"),
        served = serve_snapshot_metadata(metadata_client, &args, switch) => served,
    }
}
