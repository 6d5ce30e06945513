//! `lvms standalone`: the CSI driver without Kubernetes. Converges this node's device classes from a
//! config file (the node engine), then serves Identity, Controller, Node and SnapshotMetadata on one
//! Unix socket.
//! The classes that converged are served as soon as they have (the node agent's [`Switch`] over a
//! backend of those classes, as on Kubernetes); one that failed is retried every 10 s, and until it
//! converges its reason answers every call that names it (issue 35: one bad LUN no longer keeps a
//! host's healthy classes from serving). `Probe` answers ready once any class serves.
//!
//! The driver's LVM commands run in one long-lived `lvm` shell process ([`LvmShell`]).
//!
//! Crash-safe by construction: everything the driver knows is on disk (LV names and tags, mounts), so
//! killing it at any point and starting it again finds every volume.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use lvms_csi::{
    controller::ControllerService,
    identity::{Converged, IdentityService},
    node::{NodeOptions, NodeService},
    server::{self, Services},
    snapshot_metadata::SnapshotMetadataService,
};
use lvms_engine::{backend::DeviceClassConfig, local::LocalBackend};
use lvms_host::{
    class::{self as engines, Hosts},
    engine::RealNodeHost,
    fs::Filesystems,
    lvm::Lvm,
    runner::RealRunner,
    shared::RealSharedHost,
    shell::LvmShell,
};
use lvms_node::switch::Switch;
use tokio::sync::watch;

/// How often convergence is retried while a class is not ready.
const CONVERGE_RETRY: Duration = Duration::from_secs(10);

/// `lvms standalone`'s flags.
#[derive(clap::Args)]
pub struct StandaloneArgs {
    /// This node's device classes (the node engine's config file).
    #[arg(long, env = "LVMS_CONFIG")]
    config: PathBuf,
    /// The CSI socket to serve on.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "/run/lvms/csi.sock")]
    endpoint: String,
    /// The node id and topology value (`topology.topolvm.io/node`); the host name when absent.
    #[arg(long, env = "NODE_NAME")]
    node_id: Option<String>,
    /// The CSI driver name.
    #[arg(long, env = "CSI_DRIVER_NAME", default_value = lvms_csi::DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// How long a stage of a shared class's volume that another node holds waits for its lock (a
    /// dead node's is freed at sanlock's host-dead time), trying again every 5 s; 0 refuses at once.
    /// At most 110: kubelet gives NodeStage 2 minutes.
    #[arg(long, env = "LVMS_SHARED_STAGE_WAIT", value_name = "SECONDS", default_value_t = lvms_engine::local::DEFAULT_SHARED_STAGE_WAIT.as_secs(), value_parser = clap::value_parser!(u64).range(0..=110))]
    shared_stage_wait: u64,
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// Runs the standalone driver until SIGTERM or Ctrl-C.
pub async fn run(args: StandaloneArgs) -> Result<()> {
    let config = crate::load_config(&args.config)?;
    anyhow::ensure!(
        !config.device_classes.is_empty(),
        "{} names no device class: add one under deviceClasses",
        args.config.display()
    );
    let node_id = args.node_id.unwrap_or_else(host_name);
    // A capability without a filesystem gets its volume's class's (see `NodeService`), and when the
    // class names none the default class's, else xfs.
    let default_fstype = config
        .device_classes
        .iter()
        .find(|c| c.default)
        .unwrap_or(&config.device_classes[0])
        .fstype
        .unwrap_or_default();
    let runner = Arc::new(RealRunner);
    // The driver's LVM commands go to one long-lived `lvm` shell process (see `lvms_host::shell`); the
    // node engine's device work and the filesystem tools run as processes.
    let shell = Arc::new(LvmShell::new());
    let shared: Vec<String> = config
        .device_classes
        .iter()
        .filter(|c| c.is_shared())
        .map(|c| c.name.clone())
        .collect();
    let stage_wait = Duration::from_secs(args.shared_stage_wait);
    let make_backend = {
        let node_id = node_id.clone();
        move |classes: Vec<DeviceClassConfig>| {
            LocalBackend::new(
                node_id.clone(),
                classes,
                Lvm::new(shell.clone()).with_shared(shared.clone()),
            )
            .with_shared_stage_wait(stage_wait)
        }
    };
    let (serving, current) = watch::channel(None);
    let (unserved_tx, unserved) = watch::channel(
        config
            .device_classes
            .iter()
            .map(|c| (c.clone(), "not converged yet".to_owned()))
            .collect::<Vec<_>>(),
    );
    let backend = Arc::new(Switch::new(node_id.clone(), current).with_unserved(unserved));
    let converged = Converged::default();
    let socket = PathBuf::from(
        args.endpoint
            .strip_prefix("unix://")
            .unwrap_or(&args.endpoint),
    );
    let listener = server::bind(&socket)?;
    tracing::info!(socket = %socket.display(), node = %node_id, "serving CSI");
    eprintln!(
        "lvms standalone: serving CSI on {} as node {node_id}",
        socket.display()
    );

    // Converge in the background; each round serves the classes that are ready.
    {
        let converged = converged.clone();
        let runner = runner.clone();
        let config = config.clone();
        tokio::spawn(async move {
            let hosts = Hosts {
                local: RealNodeHost::new(runner.clone()),
                shared: RealSharedHost::new(runner),
            };
            let mut served: Option<Vec<String>> = None;
            loop {
                let mut ready = Vec::new();
                let mut failed = Vec::new();
                for class in &config.device_classes {
                    let others = config.claims_of_others(&class.name);
                    let reason =
                        match engines::converge(&hosts, class, &others, config.shared.as_ref())
                            .await
                        {
                            Ok(report) => report.not_ready_reason(),
                            Err(e) => Some(format!("converging failed: {e}")),
                        };
                    match reason {
                        None => ready.push(class.clone()),
                        Some(reason) => {
                            tracing::warn!(device_class = %class.name, %reason, "device class not ready");
                            failed.push((class.clone(), reason));
                        }
                    }
                }
                let names: Vec<String> = ready.iter().map(|c| c.name.clone()).collect();
                if served.as_ref() != Some(&names) {
                    tracing::info!(classes = ?names, "serving classes");
                    eprintln!(
                        "lvms standalone: serving device classes [{}]{}",
                        names.join(", "),
                        if failed.is_empty() {
                            String::new()
                        } else {
                            format!(
                                "; not ready: {}",
                                failed
                                    .iter()
                                    .map(|(c, _)| c.name.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        }
                    );
                    serving
                        .send_replace((!ready.is_empty()).then(|| Arc::new(make_backend(ready))));
                    converged.set(!names.is_empty());
                    served = Some(names);
                }
                let done = failed.is_empty();
                unserved_tx.send_replace(failed);
                if done {
                    eprintln!("lvms standalone: every device class is ready");
                    return;
                }
                tokio::time::sleep(CONVERGE_RETRY).await;
            }
        });
    }

    // The pools are on this machine: changed-block tracking is served here too (ADR 0039).
    let services = Services {
        snapshot_metadata: Some(SnapshotMetadataService::new(backend.clone())),
        identity: IdentityService::new(args.driver_name, true, backend.clone(), converged)
            .with_snapshot_metadata(),
        controller: Some(ControllerService::new(backend.clone())),
        node: Some(NodeService::new(
            backend,
            Filesystems::new(runner),
            NodeOptions {
                default_fstype,
                ..NodeOptions::default()
            },
        )),
    };
    server::serve(listener, services, crate::shutdown_signal())
        .await
        .context("serving CSI")?;
    eprintln!("lvms standalone: stopped");
    Ok(())
}
