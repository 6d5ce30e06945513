//! `cargo xtask e2e`: the end-to-end suite (`crates/operator/tests/e2e`) against a throwaway control
//! plane ([`crate::cluster`]). Builds the suite, starts the control plane, runs the suite with
//! `LVMS_E2E=1` and the admin kubeconfig, then stops everything the run started: the suite runs in
//! a process group of its own that is killed when it ends, and the control plane is dropped.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, bail};

use crate::{
    artifacts::Artifacts,
    cluster::{self, ControlPlane},
    guest,
    report::Counts,
    vm,
};

/// The e2e test binary (built with the lvms binary beside it).
pub fn suite(repo: &Path) -> Result<PathBuf> {
    Ok(Artifacts::get(repo)?.exe("e2e")?.exe.clone())
}

/// The binaries the suite runs beside the control plane, as the operator's pod would.
const SIDECARS: &[&str] = &[
    "csi-provisioner",
    "csi-resizer",
    "csi-snapshotter",
    "snapshot-controller",
];

/// The disks the e2e VM attaches (`/dev/disk/by-id/virtio-<serial>` inside).
const E2E_DISKS: [&str; 3] = ["e2e0=4096", "e2e1=2048", "e2e2=2048"];

/// Boots the VM that plays the node (real LVM, the node agent) and waits for its command server.
/// The guest port on which the node agent serves changed-block tracking in the e2e VM
/// (`lvms_csi::remote::DEFAULT_PORT`).
const GUEST_METADATA_PORT: u16 = 9810;

fn start_node_vm(repo: &Path, exec_port: u16, metadata_port: u16) -> Result<vm::RunningVm> {
    let kernel = vm::prepare(repo)?;
    // e2e0 for the LVMCluster; e2e1 for the standalone driver the benchmark compares with; e2e2
    // the LUN of the shared device class (shared_stack).
    let disks = vm::disks(repo, &E2E_DISKS)?;
    guest::start_served(
        repo,
        &kernel,
        "e2e",
        disks,
        2,
        exec_port,
        &[(metadata_port, GUEST_METADATA_PORT)],
    )
}

/// The node VM's forwarded ports: its command server's, and the agent's changed-block tracking
/// (which the CSI controller on the host dials).
#[derive(Clone, Copy)]
struct NodePorts {
    exec: u16,
    metadata: u16,
}

/// The assets, a control plane under `target/e2e/<name>`, and the node VM with its ports.
fn start_cluster(
    repo: &Path,
    name: &str,
) -> Result<(PathBuf, ControlPlane, NodePorts, vm::RunningVm)> {
    let (assets, control_plane) = cluster::start(
        repo,
        &repo.join("target/e2e").join(name),
        SIDECARS,
        &cluster::Options::default(),
    )?;
    let ports = NodePorts {
        exec: cluster::free_port()?,
        metadata: cluster::free_port()?,
    };
    let node_vm = start_node_vm(repo, ports.exec, ports.metadata)?;
    Ok((assets, control_plane, ports, node_vm))
}

pub fn run(repo: &Path, filter: Option<&str>) -> Result<ExitCode> {
    let lvms = crate::artifacts::lvms(repo);
    // The stack's scenarios first, one at a time; then the tests that run operators of their own,
    // side by side (the installed webhook refuses a second LVMCluster while the stack's exists
    // only in its own namespace, and the stack's would be refused beside theirs). The benchmark
    // runs only when asked for.
    let passes: Vec<Vec<&str>> = match filter {
        Some(f) => vec![vec![f, "--skip", "bench_"]],
        None => vec![
            vec!["stack_", "--test-threads=1", "--skip", "bench_"],
            vec!["--skip", "stack_", "--skip", "bench_"],
        ],
    };
    run_passes(repo, &lvms, &passes, &[])
}

/// What `cargo xtask scale` runs.
#[derive(clap::Args)]
pub struct Scale {
    /// Simulated nodes.
    #[arg(long, default_value_t = 100)]
    nodes: usize,
    /// Volumes made through CreateVolume, each with a PersistentVolume.
    #[arg(long, default_value_t = 10_000)]
    volumes: usize,
    /// LogicalVolumes of a gone node with no PersistentVolume.
    #[arg(long, default_value_t = 1_000)]
    stale: usize,
    /// Seconds of the steady-state window whose API requests are counted.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// The debug build the tests use instead of a release build.
    #[arg(long)]
    debug: bool,
}

/// The release build of lvms (the benchmarks' figures are a release build's).
fn release_lvms(repo: &Path) -> Result<PathBuf> {
    let built = Command::new(env!("CARGO"))
        .args(["build", "--release", "-p", "lvms"])
        .current_dir(repo)
        .status()
        .context("cargo build --release -p lvms")?;
    if !built.success() {
        bail!("building lvms (release) failed");
    }
    Ok(crate::artifacts::cargo_target(repo).join("release/lvms"))
}

/// `cargo xtask scale`: the `scale_` test on a control plane of its own, with no VM.
pub fn scale(repo: &Path, scale: &Scale) -> Result<ExitCode> {
    let lvms = if scale.debug {
        crate::artifacts::lvms(repo)
    } else {
        release_lvms(repo)?
    };
    let suite = suite(repo)?;
    let started = Instant::now();
    let (_assets, control_plane) = cluster::start(
        repo,
        &repo.join("target/e2e/scale"),
        &[],
        &cluster::Options::default(),
    )?;
    println!(
        "scale: control plane up after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut cmd = Command::new(&suite);
    cmd.args(["scale_", "--nocapture"])
        .env("KUBECONFIG", &control_plane.kubeconfig)
        .env("LVMS_E2E_LVMS", &lvms)
        .env("LVMS_E2E_AUDIT_LOG", &control_plane.audit_log)
        .env("LVMS_E2E_SCALE_NODES", scale.nodes.to_string())
        .env("LVMS_E2E_SCALE_VOLUMES", scale.volumes.to_string())
        .env("LVMS_E2E_SCALE_STALE", scale.stale.to_string())
        .env("LVMS_E2E_SCALE_WINDOW", scale.window.to_string())
        .env("LVMS_E2E_SCALE_SAMPLES", "50");
    let (ok, summary) = run_pass(repo, cmd, &repo.join("target/e2e/scale-work"))?;
    drop(control_plane);
    println!("scale: {}", Counts::from_libtest(summary.as_slice()));
    Ok(if ok && summary.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `cargo xtask e2e --bench [--memory]`: the `bench_` tests with a release build of lvms, their
/// output shown.
pub fn bench(repo: &Path, memory_only: bool) -> Result<ExitCode> {
    let lvms = release_lvms(repo)?;
    let passes = vec![vec!["bench_", "--test-threads=1", "--nocapture"]];
    let mode = if memory_only { "memory" } else { "1" };
    run_passes(repo, &lvms, &passes, &[("LVMS_E2E_BENCH", mode)])
}

fn run_passes(
    repo: &Path,
    lvms: &Path,
    passes: &[Vec<&str>],
    env: &[(&str, &str)],
) -> Result<ExitCode> {
    let started = Instant::now();
    let suite = suite(repo)?;
    let (assets, control_plane, ports, node_vm) = start_cluster(repo, "cluster")?;
    let exec_port = ports.exec;
    println!(
        "e2e: node VM up after {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let mut summaries = Vec::new();
    let mut failed_pass = false;
    for args in passes {
        let mut cmd = Command::new(&suite);
        cmd.args(args)
            .env("KUBECONFIG", &control_plane.kubeconfig)
            .env("LVMS_K8S_ASSETS", &assets)
            .env("LVMS_E2E_LVMS", lvms)
            .env("LVMS_E2E_VM", format!("127.0.0.1:{exec_port}"))
            .env(
                "LVMS_E2E_VM_METADATA",
                format!("127.0.0.1:{}", ports.metadata),
            )
            .env(
                "LVMS_E2E_VM_SERVER",
                format!("https://{}:{}", cluster::VM_HOST_ADDR, control_plane.port),
            )
            .env("LVMS_E2E_AUDIT_LOG", &control_plane.audit_log)
            .envs(env.iter().copied());
        match run_pass(repo, cmd, &repo.join("target/e2e/work"))? {
            (ok, Some(summary)) => {
                failed_pass |= !ok;
                summaries.push(summary);
            }
            (_, None) => {
                failed_pass = true;
                println!("e2e: the suite printed no result for {args:?} (it crashed)");
            }
        }
    }
    guest::at(exec_port).poweroff();
    let _ = node_vm.wait();
    drop(control_plane);
    println!(
        "e2e: suite finished in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    println!("e2e: {}", Counts::from_libtest(&summaries));
    Ok(if failed_pass || summaries.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// One run of the suite `cmd` (its arguments and the cluster's environment set); whether it exited
/// 0, and its libtest summary line.
/// `work` is the suite's scratch directory (`LVMS_E2E_WORK`), one per task.
pub fn run_pass(repo: &Path, mut cmd: Command, work: &Path) -> Result<(bool, Option<String>)> {
    cmd.args(["--color", "never"])
        .current_dir(repo.join("crates/operator"))
        .env("LVMS_E2E", "1")
        .env("LVMS_E2E_WORK", work)
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        // Its own process group, so whatever it starts is killed with it.
        .process_group(0);
    let mut child = cmd.spawn().context("starting the e2e suite")?;
    let group = child.id();
    let stdout = child.stdout.take().context("e2e stdout")?;
    let mut summary = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        println!("{line}");
        if line.starts_with("test result: ") {
            summary = Some(line);
        }
    }
    let status = child.wait()?;
    let _ = Command::new("kill")
        .args(["-KILL", "--", &format!("-{group}")])
        .stderr(Stdio::null())
        .status();
    Ok((status.success(), summary))
}

/// `cargo xtask cluster`: the control plane and the node VM, until the process is killed; prints
/// the environment under which the e2e binary runs against them.
pub fn serve_cluster(repo: &Path) -> Result<ExitCode> {
    let (assets, control_plane, ports, _node_vm) = start_cluster(repo, "dev")?;
    let exec_port = ports.exec;
    println!(
        "cluster: LVMS_E2E=1 KUBECONFIG={} LVMS_K8S_ASSETS={} LVMS_E2E_LVMS={} \
         LVMS_E2E_VM=127.0.0.1:{exec_port} LVMS_E2E_VM_METADATA=127.0.0.1:{} \
         LVMS_E2E_VM_SERVER=https://{}:{} LVMS_E2E_WORK={}",
        control_plane.kubeconfig.display(),
        assets.display(),
        crate::artifacts::lvms(repo).display(),
        ports.metadata,
        cluster::VM_HOST_ADDR,
        control_plane.port,
        repo.join("target/e2e/dev-work").display(),
    );
    println!(
        "cluster: LVMS_E2E_AUDIT_LOG={}",
        control_plane.audit_log.display()
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
