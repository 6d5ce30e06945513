//! Developer tasks: `cargo xtask deps | test | lint | vm-run | vm-test | vm-shared | demo | e2e |
//! installed | cluster | sanity | helm | bench`. This file is the command line only; each task's
//! body lives in its module.

mod artifacts;
mod cluster;
mod deps;
mod e2e;
mod guest;
mod helm;
mod images;
mod lanes;
mod node;
mod relay;
mod report;
mod sanity;
mod shared;
mod standalone;
mod turn;
mod vm;
mod vm_suite;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "lvms-rs developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the Debian packages the VM suite and the demo need (as root; skipped when present).
    Deps,
    /// Boot the test VM and run a shell command inside it, from the repository root.
    VmRun {
        /// A disk as SERIAL=SIZE_IN_MIB (repeatable); appears as /dev/disk/by-id/virtio-SERIAL.
        #[arg(long = "disk")]
        disks: Vec<String>,
        /// User-mode networking (the host's loopback is 10.0.2.2 inside).
        #[arg(long)]
        net: bool,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// The command (a shell command line).
        #[arg(trailing_var_arg = true, required = true)]
        command: Vec<String>,
    },
    /// Every test, as phases run side by side (xtask/src/lanes.rs): fmt and clippy, host unit
    /// tests (`cargo test --workspace`), the real-LVM suite in the VM, the two-node shared-LUN
    /// tests, csi-sanity against the standalone driver in the VM, the e2e suite on a real control
    /// plane, and lvms-rs installed on a real node (`installed`). Logs in `target/ci/`.
    Test {
        /// Phases run at once, at most (their loads must also fit on the two cores).
        #[arg(long, default_value_t = 3)]
        lanes: usize,
        /// vCPUs of each guest but the installed node's (which has two): one, so two guests side
        /// by side never contend for a core (ADR 0025).
        #[arg(long, default_value_t = 1)]
        vm_cpus: u32,
        /// Only the phases whose name contains this (repeatable).
        #[arg(long = "only")]
        only: Vec<String>,
    },
    /// `cargo fmt --check` and `cargo clippy --workspace --all-targets -- -D warnings`.
    Lint,
    /// For `test`: build the tests once and list them in FILE, unpack the Kubernetes assets, make
    /// the VM's initramfs.
    #[command(hide = true)]
    Prepare {
        #[arg(long)]
        artifacts: PathBuf,
    },
    /// Build the real-LVM integration tests (`tests/vm_*.rs`) and run them inside the VM.
    VmTest {
        /// Only tests whose name contains this.
        filter: Option<String>,
        /// Only shard INDEX of COUNT (`1/2`), split by measured time.
        #[arg(long, value_parser = vm_suite::parse_shard)]
        shard: Option<(usize, usize)>,
    },
    /// Two VMs sharing one disk image as two nodes see one SAN LUN: the `shared_vms` tests
    /// (sanlock and lvmlockd in each guest, shared device classes).
    VmShared {
        /// Only tests whose name contains this.
        filter: Option<String>,
        /// Not the tests whose name contains this (repeatable).
        #[arg(long)]
        skip: Vec<String>,
    },
    /// The demo: in the VM, the standalone CSI driver on real LVM, driven by `lvms csi` (scripts/demo.sh).
    Demo,
    /// The end-to-end suite on a throwaway control plane (etcd, kube-apiserver, controller-manager,
    /// scheduler on loopback; binaries from `$LVMS_K8S_ASSETS` or `../shared/k8s`).
    E2e {
        /// Only tests whose name contains this.
        filter: Option<String>,
        /// Run the benchmark instead (release build of lvms): PVC-to-Bound ÷ standalone
        /// CreateVolume, API requests per idle minute, RSS with 500 volumes.
        #[arg(long, conflicts_with = "filter")]
        bench: bool,
        /// With `--bench`: only the memory figures (RSS with no volume and with 500, and where it
        /// is: binary, libraries, heap, stacks).
        #[arg(long, requires = "bench")]
        memory: bool,
    },
    /// The scale benchmark on a control plane of its own (no VM; release build of lvms unless
    /// `--debug`): `lvms csi-controller` with simulated nodes (node agents over the in-memory
    /// backend, in the test process): CreateVolume p50/p95 at 0 and at N volumes, the controller's
    /// memory, its collector's pass, API requests per minute (crates/operator/tests/e2e/scale.rs).
    Scale(e2e::Scale),
    /// Inside the e2e VM: execute the host's shell commands (see xtask/src/guest.rs).
    #[command(hide = true)]
    GuestServe { port: u16 },
    /// Inside the installed test's node VM: the API server's HTTP CONNECT proxy (xtask/src/guest.rs).
    #[command(hide = true)]
    GuestConnect { port: u16 },
    /// Inside a user-mode guest: the guest's side of its forwarded ports (xtask/src/relay.rs).
    #[command(hide = true)]
    GuestRelay { host: String },
    /// lvms-rs installed on two real nodes on one shared LUN: the control plane, a kubelet with
    /// containerd in each VM, local images, `kubectl apply -k` of deploy/base, and the e2e test
    /// `installed` (ADR 0018), then `installed_shared` (one LUN on both nodes: failover after a
    /// node's power loss, and its rejoin).
    Installed {
        /// Keep the cluster up after the test (for development).
        #[arg(long)]
        keep: bool,
    },
    /// Start the throwaway control plane of `e2e` and keep it up until killed (for development:
    /// `export KUBECONFIG=target/e2e/dev/admin.kubeconfig`).
    Cluster,
    /// csi-sanity against the standalone driver in the VM: thin mount, thin block and thick classes.
    Sanity {
        /// Also the shared class's thin volumes (about 17 minutes more in the VM; not part of
        /// `cargo xtask test`).
        #[arg(long)]
        shared_thin: bool,
        /// Only these modes (repeatable): thin-mount, thin-block, raid-thin-mount, thick, shared-linear-mount,
        /// shared-linear-block, shared-thin-mount, shared-thin-block.
        #[arg(long = "only")]
        only: Vec<String>,
    },
    /// Regenerate the Helm chart deploy/helm/lvms from the kustomize base (needs kubectl).
    Helm,
    /// The CSI benchmark in the VM (release build): the driver against raw LVM, ratios printed.
    Bench {
        /// Passed to lvms-csi-bench: `--runner process`, or `--scale 2000` for the scale check.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    let repo = repo_root();
    let result = run_task(cli.task, &repo);
    let _ = std::fs::remove_dir_all(vm::disks_dir(&repo));
    result
}

fn run_task(task: Task, repo: &Path) -> Result<ExitCode> {
    let ok = |()| ExitCode::SUCCESS;
    // Tasks that boot VMs or run the control plane need the packages first; `test` installs them
    // once for all its phases.
    if !matches!(
        task,
        Task::Helm
            | Task::GuestServe { .. }
            | Task::GuestConnect { .. }
            | Task::GuestRelay { .. }
            | Task::Lint
    ) {
        deps::ensure()?;
    }
    match task {
        Task::Deps => Ok(ExitCode::SUCCESS),
        Task::VmRun {
            disks,
            net,
            timeout_secs,
            command,
        } => {
            let disks = disks
                .iter()
                .map(|d| vm::disk(repo, d))
                .collect::<Result<Vec<_>>>()?;
            let mut spec = vm::VmSpec::new("run", repo, command.join(" "))
                .disks(disks)
                .timeout(Duration::from_secs(timeout_secs));
            if net {
                spec = spec.net(vec![]);
            }
            let out = vm::run_all(repo, vec![spec])?.remove(0);
            report::exit_from(out.exit_code)
        }
        Task::Test {
            lanes,
            vm_cpus,
            only,
        } => lanes::run(
            repo,
            &lanes::Options {
                lanes,
                vm_cpus,
                only,
            },
        ),
        Task::Lint => lanes::lint(repo),
        Task::Prepare { artifacts } => lanes::prepare(repo, &artifacts).map(ok),
        Task::VmTest { filter, shard } => vm_suite::run(repo, filter.as_deref(), shard),
        Task::VmShared { filter, skip } => shared::run(repo, filter.as_deref(), &skip),
        Task::Demo => standalone::demo(repo),
        Task::E2e {
            filter,
            bench,
            memory,
        } => {
            if bench {
                e2e::bench(repo, memory)
            } else {
                e2e::run(repo, filter.as_deref())
            }
        }
        Task::Scale(scale) => e2e::scale(repo, &scale),
        Task::GuestServe { port } => guest::serve(port).map(ok),
        Task::GuestConnect { port } => guest::serve_connect(port).map(ok),
        Task::GuestRelay { host } => relay::serve_guest(&host).map(ok),
        Task::Installed { keep } => node::run(repo, keep),
        Task::Cluster => e2e::serve_cluster(repo),
        Task::Sanity { shared_thin, only } => sanity::run(repo, shared_thin, &only),
        Task::Helm => helm::generate(repo).map(ok),
        Task::Bench { args } => standalone::bench(repo, &args),
    }
}
