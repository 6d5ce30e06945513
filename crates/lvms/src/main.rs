//! `lvms`: one binary, one subcommand per role.

mod csi_cli;
mod csi_controller;
mod node;
mod standalone;

use std::{collections::BTreeSet, path::PathBuf, sync::Arc};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use lvms_core::{
    config::NodeConfig,
    filter::{FilterContext, Verdict, evaluate},
    leave::LeaveState,
    lvattr::LvAttr,
    model::BlockDevice,
    plan::{ClassState, DeviceVerdict},
    shared::State as SharedState,
    size::ByteSize,
};
use lvms_host::{
    class::{Converged, Hosts, Left},
    engine::{ConvergeReport, NodeHost, RealNodeHost},
    runner::RealRunner,
    shared::{RealSharedHost, SharedReport},
};

#[derive(Parser)]
#[command(
    name = "lvms",
    version,
    about = "Logical Volume Manager Storage for Kubernetes"
)]
struct Cli {
    /// Log format.
    #[arg(long, env = "LVMS_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Plain,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Output {
    Plain,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Converge this node's device classes from a config file (volume groups, thin pools), then report.
    Converge {
        #[arg(long, env = "LVMS_CONFIG")]
        config: PathBuf,
        #[arg(long, value_enum, default_value_t = Output::Plain)]
        output: Output,
    },
    /// Leave a device class of the config on this node. A node-local class: remove its volume
    /// group (tagged lvms) and the labels of its devices once it holds no volume but its thin pool.
    /// A shared class: stop its lockspace; on the node configured with `createVolumeGroups` (the
    /// remover), also remove the volume group, its LUNs' labels and the devices file once the group
    /// holds no volume and the other nodes have left. Exits non-zero until nothing of the class is
    /// left on this node (run it again).
    Leave {
        #[arg(long, env = "LVMS_CONFIG")]
        config: PathBuf,
        /// The device class to leave.
        #[arg(long)]
        class: String,
        #[arg(long, value_enum, default_value_t = Output::Plain)]
        output: Output,
    },
    /// The fence hook of shared classes: set `global { lvmlockctl_kill_command = "<path to lvms>
    /// fence" }` in the host's lvm.conf. When sanlock cannot renew this host's lease of shared volume
    /// group VG, lvmlockctl runs it: every device of VG gets the error target (its openers' I/O
    /// fails) and unopened ones are removed; exit 0 only when nothing of VG can write, so lvmlockctl
    /// drops VG's locks (otherwise the watchdog resets the host). Writes /run/lvms/fenced-VG.
    Fence {
        /// The volume group (lvmlockctl passes it).
        vg: String,
    },
    /// Report every block device on this node and whether a device class could use it, and why not.
    Devices {
        /// Treat the config's device classes' volume groups as ours.
        #[arg(long, env = "LVMS_CONFIG")]
        config: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = Output::Plain)]
        output: Output,
    },
    /// Print the CustomResourceDefinitions as one multi-document YAML, or write one file per CRD.
    Crd {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing
        /// (`lvms crd --split deploy/crds` refreshes the checked-in copies).
        #[arg(long, value_name = "DIR")]
        split: Option<PathBuf>,
    },
    /// Run the operator: the LVMCluster controller and the admission webhook.
    Operator(OperatorArgs),
    /// Run the node agent: converge this node's LVMVolumeGroups, serve its LogicalVolumes, and
    /// serve CSI Identity and Node on the plugin socket.
    Node(node::NodeArgs),
    /// Run the cluster's CSI Controller service (beside the CSI sidecars): volumes become
    /// LogicalVolumes that the node agents make.
    CsiController(csi_controller::CsiControllerArgs),
    /// Call one CSI RPC on a CSI endpoint (a small CSI client).
    Csi(csi_cli::CsiArgs),
    /// Run the CSI driver without Kubernetes: converge the config's device classes, serve Identity,
    /// Controller and Node on one socket.
    Standalone(standalone::StandaloneArgs),
}

#[derive(clap::Args)]
struct OperatorArgs {
    /// The operator's namespace: the LVMCluster and the namespaced objects live here.
    #[arg(long, env = "NAMESPACE")]
    namespace: Option<String>,
    /// Image of the node agent (this binary) for the node DaemonSet.
    #[arg(long, env = "LVMS_IMAGE")]
    image: String,
    /// CSI driver name: the CSIDriver object and every StorageClass's provisioner.
    #[arg(long, env = "CSI_DRIVER_NAME", default_value = lvms_api::DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Image of the `node-driver-registrar` sidecar in the node DaemonSet (mirror it for
    /// disconnected clusters).
    #[arg(long, env = "LVMS_NODE_DRIVER_REGISTRAR_IMAGE", default_value = lvms_operator::render::DEFAULT_NODE_DRIVER_REGISTRAR_IMAGE)]
    node_driver_registrar_image: String,
    /// Host directory where the node agents install the fence hook of shared classes, mounted
    /// into the node pods at the same path (ADR 0028); "" to install it by hand instead.
    #[arg(long, env = "LVMS_FENCE_HOOK_DIR", default_value = lvms_operator::render::DEFAULT_FENCE_HOOK_DIR)]
    fence_hook_dir: String,
    /// When a node is not Ready and sanlock on another node counts its lease dead in a shared class
    /// with fencing armed, also taint it `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`,
    /// which makes Kubernetes release every pod and every driver's volume on it (ADR 0029). Off: only
    /// the pods whose volumes are all that class's are deleted. Turn on only where a node whose
    /// lease died is surely off (reset by its watchdog).
    #[arg(long, env = "LVMS_SHARED_DEAD_NODE_OUT_OF_SERVICE")]
    shared_dead_node_out_of_service: bool,
    /// Image of the `livenessprobe` sidecar in the node DaemonSet.
    #[arg(long, env = "LVMS_LIVENESSPROBE_IMAGE", default_value = lvms_operator::render::DEFAULT_LIVENESSPROBE_IMAGE)]
    livenessprobe_image: String,
    /// Image of the `csi-provisioner` sidecar the node pods run when a class adopts csi-driver-lvm
    /// (ADR 0033).
    #[arg(long, env = "LVMS_CSI_PROVISIONER_IMAGE", default_value = lvms_operator::render::DEFAULT_CSI_PROVISIONER_IMAGE)]
    csi_provisioner_image: String,
    /// Image of the `csi-resizer` sidecar the node pods run when a class adopts csi-driver-lvm.
    #[arg(long, env = "LVMS_CSI_RESIZER_IMAGE", default_value = lvms_operator::render::DEFAULT_CSI_RESIZER_IMAGE)]
    csi_resizer_image: String,
    /// Directory holding the webhook's serving certificate (`tls.crt`, `tls.key`).
    #[arg(
        long,
        env = "WEBHOOK_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    webhook_cert_dir: PathBuf,
    /// Make a self-signed certificate for the webhook at start when the Secret `--webhook-cert-secret`
    /// holds none, and write its CA into both webhook configurations' caBundle.
    #[arg(long, env = "LVMS_SELF_SIGNED_WEBHOOK_CERT")]
    self_signed_webhook_cert: bool,
    /// How long a self-signed webhook certificate is valid (`s`, `m`, `h` or `d`); it is renewed,
    /// under the same CA, once less than a third of that is left. Its CA is valid ten times as
    /// long, at least ten years.
    #[arg(long, env = "LVMS_WEBHOOK_CERT_VALIDITY", default_value = "365d", value_parser = parse_duration)]
    webhook_cert_validity: std::time::Duration,
    /// The Secret the operator's pod mounts at `--webhook-cert-dir`.
    #[arg(long, env = "WEBHOOK_CERT_SECRET", default_value = lvms_operator::certificate::WEBHOOK_SECRET)]
    webhook_cert_secret: String,
    /// The ValidatingWebhookConfiguration whose caBundle a self-signed certificate's CA is kept in.
    #[arg(long, env = "LVMS_VALIDATING_WEBHOOK_CONFIGURATION", default_value = lvms_operator::certificate::VALIDATING_WEBHOOK)]
    validating_webhook_configuration: String,
    /// The MutatingWebhookConfiguration whose caBundle a self-signed certificate's CA is kept in.
    #[arg(long, env = "LVMS_MUTATING_WEBHOOK_CONFIGURATION", default_value = lvms_operator::certificate::MUTATING_WEBHOOK)]
    mutating_webhook_configuration: String,
    /// More names (DNS names or IP addresses, comma-separated) for a self-signed certificate: for
    /// webhook configurations that reach the operator by `url`.
    #[arg(long, env = "LVMS_WEBHOOK_CERT_EXTRA_NAMES", value_delimiter = ',')]
    webhook_cert_extra_names: Vec<String>,
    /// The webhook's Service (the certificate's names).
    #[arg(long, env = "WEBHOOK_SERVICE", default_value = lvms_operator::certificate::WEBHOOK_SERVICE)]
    webhook_service: String,
    /// HTTPS port of the admission webhook (also serves `/healthz` and `/readyz`).
    #[arg(long, env = "WEBHOOK_PORT", default_value_t = 9443)]
    webhook_port: u16,
    /// Port of `/metrics`.
    #[arg(long, env = "METRICS_PORT", default_value_t = 8080)]
    metrics_port: u16,
    /// Run the eviction controller (metal-stack csi-driver-lvm's): when a StatefulSet's pod is
    /// evicted or unschedulable and it or its claim says `lvms.topolvm.io/is-eviction-allowed:
    /// "true"` (or `metal-stack.io/csi-driver-lvm.is-eviction-allowed`), delete the claim if its
    /// volume's node is gone, out of service or cordoned, so the StatefulSet makes a new one
    /// elsewhere. Runs in the leader replica only.
    #[arg(long, env = "LVMS_EVICTION_CONTROLLER")]
    eviction_controller: bool,
    /// Elect one leader among the operator's replicas by the Lease `lvms-operator` in the
    /// namespace: the leader runs the controllers (LVMCluster, node removal, eviction), every
    /// replica serves the webhook (`lvms_k8s::leader`). `false`: this process runs the controllers
    /// at once; run one replica only then.
    #[arg(long, env = "LVMS_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// This replica's name in the leader Lease (the pod's name; the host's name and the process id
    /// when unset).
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// Changed-block tracking (ADR 0039, `deploy/components/snapshot-metadata`): make and renew the
    /// certificate in the Secret `lvms-snapshot-metadata-cert` (the sidecar's, the agents' and the
    /// CSI controller's), publish the `SnapshotMetadataService` with its CA, and render the node
    /// agents serving it.
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA")]
    snapshot_metadata: bool,
    /// Where backup clients reach the csi-snapshot-metadata sidecar (`host:port`, written into the
    /// `SnapshotMetadataService` and named by the certificate); default: its Service,
    /// `lvms-snapshot-metadata.<namespace>:6443`.
    #[arg(long, env = "LVMS_SNAPSHOT_METADATA_ADDRESS")]
    snapshot_metadata_address: Option<String>,
}

/// A duration as `<n>s`, `<n>m`, `<n>h` or `<n>d`.
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?}: a number and s, m, h or d, such as 365d"))?;
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit is s, m, h or d, such as 365d")),
    };
    if n == 0 {
        return Err(format!("{s:?}: must be longer than zero"));
    }
    Ok(std::time::Duration::from_secs(n.saturating_mul(secs)))
}

/// The name a replica holds a leader Lease under: `pod_name`, else the host's name and the process
/// id (unique while the process lives).
pub(crate) fn replica_identity(pod_name: Option<String>) -> String {
    pod_name.filter(|n| !n.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "lvms".to_owned());
        format!("{host}_{}", std::process::id())
    })
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        match cli.command {
            Cmd::Converge { config, output } => cmd_converge(&config, output).await,
            Cmd::Leave {
                config,
                class,
                output,
            } => cmd_leave(&config, &class, output).await,
            Cmd::Fence { vg } => cmd_fence(&vg).await,
            Cmd::Devices { config, output } => cmd_devices(config.as_deref(), output).await,
            Cmd::Crd { split } => cmd_crd(split.as_deref()),
            Cmd::Operator(args) => cmd_operator(args).await,
            Cmd::Csi(args) => csi_cli::run(args).await,
            Cmd::Standalone(args) => standalone::run(args).await,
            Cmd::Node(args) => node::run(args).await,
            Cmd::CsiController(args) => csi_controller::run(args).await,
        }
    })
}

async fn cmd_operator(args: OperatorArgs) -> Result<()> {
    let namespace = match args.namespace {
        Some(ns) => ns,
        None => std::env::var("OPERATOR_NAMESPACE")
            .context("--namespace (or NAMESPACE / OPERATOR_NAMESPACE) is required")?,
    };
    let client = lvms_k8s::client("operator")
        .await
        .context("building a Kubernetes client from the environment")?;
    let cert_validity =
        lvms_operator::certificate::Validity::with_certificate(args.webhook_cert_validity);
    let cert_names = lvms_operator::certificate::Names {
        secret: args.webhook_cert_secret.clone(),
        service: args.webhook_service.clone(),
        validating: args.validating_webhook_configuration.clone(),
        mutating: args.mutating_webhook_configuration.clone(),
        extra: args.webhook_cert_extra_names.clone(),
        ..lvms_operator::certificate::Names::new(&namespace)
    };
    if args.self_signed_webhook_cert {
        lvms_operator::certificate::ensure(&client, &cert_names, cert_validity)
            .await
            .context("providing the webhook's certificate")?;
    }
    let metadata_names = args.snapshot_metadata.then(|| {
        use lvms_operator::certificate::{
            MetadataService, Names, SNAPSHOT_METADATA_PORT, SNAPSHOT_METADATA_SERVICE,
        };
        let address = args
            .snapshot_metadata_address
            .clone()
            .filter(|a| !a.is_empty())
            .unwrap_or_else(|| {
                format!("{SNAPSHOT_METADATA_SERVICE}.{namespace}:{SNAPSHOT_METADATA_PORT}")
            });
        let mut names = Names::snapshot_metadata(
            &namespace,
            MetadataService {
                driver: args.driver_name.clone(),
                address: address.clone(),
                audience: args.driver_name.clone(),
            },
        );
        // The host the clients dial, when it is not one of the Service's names.
        let host = address
            .rsplit_once(':')
            .map_or(address.as_str(), |(h, _)| h);
        names.extra.push(host.to_owned());
        names
    });
    if let Some(names) = &metadata_names {
        lvms_operator::certificate::ensure(&client, names, cert_validity)
            .await
            .context("providing the certificate of changed-block tracking")?;
    }
    let mut cfg = lvms_operator::RenderConfig::new(namespace.clone(), args.image);
    let driver_name = args.driver_name.clone();
    cfg.driver_name = args.driver_name;
    cfg.node_driver_registrar_image = args.node_driver_registrar_image;
    cfg.livenessprobe_image = args.livenessprobe_image;
    cfg.csi_provisioner_image = args.csi_provisioner_image;
    cfg.csi_resizer_image = args.csi_resizer_image;
    cfg.fence_hook_dir = (!args.fence_hook_dir.is_empty()).then_some(args.fence_hook_dir);
    cfg.snapshot_metadata_secret = metadata_names.as_ref().map(|n| n.secret.clone());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });

    let metrics = std::sync::Arc::new(lvms_operator::metrics::Metrics::new());
    let readiness = lvms_operator::metrics::Readiness::default();
    let metrics_listener = crate::bind_metrics(args.metrics_port).await?;
    let metrics_server = {
        let served = lvms_operator::metrics::serve(
            metrics_listener,
            metrics.clone(),
            readiness.clone(),
            stopped(),
        );
        async {
            served
                .await
                .context("serving /metrics, /healthz and /readyz")
        }
    };
    let state = lvms_operator::webhook::WebhookState::new(
        namespace.clone(),
        lvms_operator::webhook::kube_cluster_lister(client.clone()),
    )
    .with_metrics(metrics.clone());
    let (self_signed, cert_dir) = (args.self_signed_webhook_cert, args.webhook_cert_dir.clone());
    let webhook = lvms_operator::webhook::serve_tls(
        std::net::SocketAddr::from(([0, 0, 0, 0], args.webhook_port)),
        args.webhook_cert_dir.join("tls.crt"),
        args.webhook_cert_dir.join("tls.key"),
        lvms_operator::webhook::router(state),
        stopped(),
        readiness.clone(),
    );
    let node_removal = lvms_operator::controller::node_removal::run(
        client.clone(),
        namespace.clone(),
        metrics.clone(),
        lvms_operator::controller::node_removal::DeathPolicy {
            driver: driver_name.clone(),
            out_of_service_taint: args.shared_dead_node_out_of_service,
        },
        stopped(),
    );
    let eviction = {
        let (client, metrics, stop) = (client.clone(), metrics.clone(), stopped());
        async move {
            if args.eviction_controller {
                tracing::info!(driver = %driver_name, "eviction controller enabled");
                lvms_operator::controller::eviction::run(client, driver_name, metrics, stop).await;
            }
        }
    };
    let leader_metrics = metrics.clone();
    let controllers = {
        let controller = lvms_operator::controller::run(
            client.clone(),
            cfg,
            metrics,
            readiness.clone(),
            stopped(),
        );
        let renewal = {
            let (client, names) = (client.clone(), cert_names.clone());
            let (self_signed, stop) = (args.self_signed_webhook_cert, stopped());
            async move {
                if self_signed {
                    lvms_operator::certificate::keep_renewed(client, names, cert_validity, stop)
                        .await;
                }
            }
        };
        let metadata_renewal = {
            let (client, names, stop) = (client.clone(), metadata_names.clone(), stopped());
            async move {
                if let Some(names) = names {
                    lvms_operator::certificate::keep_renewed(client, names, cert_validity, stop)
                        .await;
                }
            }
        };
        async move {
            tokio::join!(
                controller,
                node_removal,
                eviction,
                renewal,
                metadata_renewal
            );
        }
    };
    let identity = replica_identity(args.pod_name);
    let led = async {
        if !args.leader_election {
            controllers.await;
            return Ok(());
        }
        readiness.standing_by(true);
        let timings = lvms_k8s::leader::Timings::DEFAULT;
        let lease = timings.lease(
            client.clone(),
            &namespace,
            lvms_operator::LEADER_LEASE,
            &identity,
        );
        lvms_k8s::leader::lead(&lease, timings, controllers, stopped(), || {
            readiness.standing_by(false);
            leader_metrics.leading(true);
        })
        .await
        .context("leading the operator's controllers")
    };
    // A webhook that cannot serve (e.g. no certificate) ends the process rather than leaving a
    // controller whose LVMClusters can no longer be admitted.
    tokio::try_join!(
        async {
            if self_signed {
                wait_for_mounted_pair(&cert_dir).await?;
            }
            webhook.await.context("serving the admission webhook")
        },
        metrics_server,
        led,
    )?;
    Ok(())
}

/// Waits (up to five minutes) for kubelet to put the certificate the operator just made into its
/// Secret volume, which it refreshes about once a minute.
async fn wait_for_mounted_pair(dir: &std::path::Path) -> Result<()> {
    let present = |name: &str| std::fs::metadata(dir.join(name)).is_ok_and(|m| m.len() > 0);
    for waited in 0..150u32 {
        if present("tls.crt") && present("tls.key") {
            return Ok(());
        }
        if waited % 15 == 0 {
            tracing::info!(dir = %dir.display(), "waiting for the webhook certificate to be mounted");
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    anyhow::bail!(
        "no tls.crt and tls.key in {} after 5 minutes: is the Secret mounted there?",
        dir.display()
    )
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LVMS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn cmd_crd(split: Option<&std::path::Path>) -> Result<()> {
    let Some(dir) = split else {
        print!("{}", lvms_api::crd::all_yaml()?);
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, yaml) in lvms_api::crd::files()? {
        let path = dir.join(name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn load_config(path: &std::path::Path) -> Result<NodeConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_norway::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Listens on every address at `port` for `/metrics` and the health endpoints.
pub(crate) async fn bind_metrics(port: u16) -> Result<tokio::net::TcpListener> {
    let addr = std::net::SocketAddr::from(([0, 0, 0, 0], port));
    tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics port {addr}"))
}

/// Both engines on the real machine.
fn real_hosts() -> Hosts<RealNodeHost<Arc<RealRunner>>, RealSharedHost<Arc<RealRunner>>> {
    Hosts {
        local: RealNodeHost::new(Arc::new(RealRunner)),
        shared: RealSharedHost::new(Arc::new(RealRunner)),
    }
}

async fn cmd_converge(config: &std::path::Path, output: Output) -> Result<()> {
    let config = load_config(config)?;
    let hosts = real_hosts();
    let mut json = Vec::new();
    let mut failed: Vec<&str> = Vec::new();
    for class in &config.device_classes {
        let others = config.claims_of_others(&class.name);
        let r = lvms_host::class::converge(&hosts, class, &others, config.shared.as_ref()).await?;
        if output == Output::Json {
            json.push(serde_json::to_value(&r)?);
        } else {
            match &r {
                Converged::Local(r) => print_report(r),
                Converged::Shared(r) => print_shared_report(r),
            }
        }
        if !r.is_ready() {
            failed.push(&class.name);
        }
    }
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&json)?);
    }
    anyhow::ensure!(
        failed.is_empty(),
        "device classes not ready: {}",
        failed.join(", ")
    );
    Ok(())
}

async fn cmd_fence(vg: &str) -> Result<()> {
    use lvms_host::fence;
    let devices = fence::devices_of(std::path::Path::new("/sys"), vg)
        .context("reading the device-mapper devices in /sys/block")?;
    let report = fence::fence(&RealRunner, vg, &devices).await;
    let record = serde_json::json!({
        "fencedAtUnixSeconds": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "fenced": report.fenced(),
        "report": &report,
    });
    let dir = std::path::Path::new(fence::RECORD_DIR);
    let written = std::fs::create_dir_all(dir).and_then(|()| {
        std::fs::write(
            fence::record_path(dir, vg),
            serde_json::to_string_pretty(&record).unwrap_or_default(),
        )
    });
    if let Err(e) = written {
        tracing::error!(error = %e, "cannot write the fence record");
    }
    eprintln!("{}", serde_json::to_string_pretty(&record)?);
    anyhow::ensure!(
        report.fenced(),
        "volume group {vg} is not fenced: a device kept its table and stayed (the watchdog resets \
         this host)"
    );
    Ok(())
}

async fn cmd_leave(config: &std::path::Path, class: &str, output: Output) -> Result<()> {
    let config = load_config(config)?;
    let Some(class) = config.device_classes.iter().find(|c| c.name == class) else {
        anyhow::bail!(
            "no device class {class} in the config: name one of {}",
            config
                .device_classes
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let r = lvms_host::class::leave(&real_hosts(), class, config.shared.as_ref()).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        let state = match r.state() {
            LeaveState::Left => "Left".to_owned(),
            LeaveState::Waiting { reason } => format!("Waiting: {reason}"),
            LeaveState::Refused { reason } => format!("Refused: {reason}"),
            LeaveState::Failed { reason } => format!("Failed: {reason}"),
        };
        match &r {
            Left::Local(r) => {
                println!("device class {}: {state}", r.device_class);
                print_actions(&r.executed, "none");
            }
            Left::Shared(r) => {
                println!("device class {} (shared): {state}", r.device_class);
                print_actions(&r.executed, "none");
            }
        }
    }
    anyhow::ensure!(
        r.has_left(),
        "device class {} is not left yet on this node",
        class.name
    );
    Ok(())
}

/// The actions a converge or leave executed, one JSON object a line, or `none`.
fn print_actions<T: serde::Serialize + std::fmt::Debug>(executed: &[T], none: &str) {
    if executed.is_empty() {
        println!("  actions: {none}");
    } else {
        println!("  actions executed:");
        for a in executed {
            let line = serde_json::to_string(a).unwrap_or_else(|_| format!("{a:?}"));
            println!("    {line}");
        }
    }
}

fn print_shared_report(r: &SharedReport) {
    let state = match &r.plan.state {
        SharedState::Joined => "Joined".to_owned(),
        SharedState::Waiting { reason } => format!("Waiting: {reason}"),
        SharedState::Failed { reason } => format!("Failed: {reason}"),
    };
    let host_id = r
        .host_id
        .map_or_else(|| "none".to_owned(), |id| id.to_string());
    println!(
        "device class {} (shared, sanlock host id {host_id}): {state}",
        r.device_class
    );
    for f in &r.lock_start_failures {
        println!("  lock-start failed: {f}");
    }
    if let Some(f) = &r.fencing {
        let v = &f.verdict;
        println!(
            "  fencing: watchdog {:?}, kill hook {}{}",
            v.watchdog,
            if v.kill_hook { "lvms fence" } else { "missing" },
            if v.message.is_empty() {
                String::new()
            } else {
                format!(": {}", v.message)
            }
        );
    }
    print_actions(&r.executed, "none");
}

fn print_report(r: &ConvergeReport) {
    let state = match &r.plan.state {
        ClassState::Ready => "Ready".to_owned(),
        ClassState::Progressing => "Progressing".to_owned(),
        ClassState::Degraded { reason } => format!("Degraded: {reason}"),
        ClassState::Failed { reason } => format!("Failed: {reason}"),
    };
    println!("device class {}: {state}", r.device_class);
    println!("  devices:");
    for d in &r.plan.devices {
        let verdict = match &d.verdict {
            DeviceVerdict::Member => "member of the volume group".to_owned(),
            DeviceVerdict::Usable { .. } => "usable".to_owned(),
            DeviceVerdict::Missing => "missing".to_owned(),
            DeviceVerdict::Retained { .. } => format!("kept: {}", d.problems()),
            DeviceVerdict::Excluded { .. } => format!("excluded: {}", d.problems()),
        };
        println!(
            "    {} -> {}: {verdict}",
            d.path,
            d.canonical_path.as_deref().unwrap_or("?")
        );
    }
    print_actions(&r.executed, "none (already converged)");
    if let Some(vg) = &r.volume_group {
        println!(
            "  volume group {}: size {}, free {}, {} LVM physical volumes, {} logical volumes, tags [{}]",
            vg.name,
            human(vg.size),
            human(vg.free),
            vg.pv_count,
            vg.lv_count,
            vg.tags.join(",")
        );
    }
    if let Some(pool) = &r.thin_pool {
        let health = LvAttr::parse(&pool.attr)
            .map(|a| a.health().message().to_owned())
            .unwrap_or_else(|e| e.to_string());
        println!(
            "  thin pool {}: data {}, metadata {}, data used {:.2}%, metadata used {:.2}%, health: {health}",
            pool.name,
            human(pool.size),
            pool.metadata_size.map(human).unwrap_or_else(|| "?".into()),
            pool.data_percent.unwrap_or(0.0),
            pool.metadata_percent.unwrap_or(0.0),
        );
    }
}

/// Bytes as a binary quantity rounded to two decimals (`3.50 GiB`).
fn human(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < units.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {} ({})", units[i], ByteSize(bytes))
    }
}

async fn cmd_devices(config: Option<&std::path::Path>, output: Output) -> Result<()> {
    let own: BTreeSet<String> = match config {
        Some(p) => load_config(p)?
            .device_classes
            .into_iter()
            .map(|c| c.name)
            .collect(),
        None => BTreeSet::new(),
    };
    let host = RealNodeHost::new(Arc::new(RealRunner));
    let observed = host.observe(&[]).await?;
    let ctx = FilterContext {
        pvs: &observed.pvs,
        vgs: &observed.vgs,
        lvs: &observed.lvs,
        own_vgs: own.iter().map(String::as_str).collect(),
        force_wipe: false,
        wiped: BTreeSet::new(),
        named: false,
    };
    let mut rows: Vec<(BlockDevice, Verdict)> = Vec::new();
    fn walk(d: &BlockDevice, ctx: &FilterContext<'_>, rows: &mut Vec<(BlockDevice, Verdict)>) {
        rows.push((d.clone(), evaluate(d, ctx)));
        for c in &d.children {
            if c.kind == lvms_core::model::DeviceKind::Part {
                walk(c, ctx, rows);
            }
        }
    }
    for d in &observed.devices {
        walk(d, &ctx, &mut rows);
    }
    if output == Output::Json {
        let json: Vec<_> = rows
            .iter()
            .map(|(d, v)| serde_json::json!({"device": d, "verdict": v}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    for (d, v) in &rows {
        let ids = if d.by_id.is_empty() {
            String::new()
        } else {
            format!(" ({})", d.by_id.join(", "))
        };
        let verdict = match v {
            Verdict::Member { vg } => format!("member of our volume group {vg}"),
            Verdict::Usable { .. } => "usable".to_owned(),
            Verdict::Excluded { reasons } => {
                let msgs: Vec<String> = reasons.iter().map(|r| r.message(&d.path)).collect();
                format!("excluded: {}", msgs.join("; "))
            }
        };
        println!("{} {}{ids}: {verdict}", d.path, human(d.size));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_a_number_and_a_unit() {
        assert_eq!(parse_duration("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("9m"), Ok(Duration::from_secs(540)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration("365d"), Ok(Duration::from_secs(31_536_000)));
        for bad in ["", "d", "365", "0d", "1w", "-1d", "1.5d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
    }
}
