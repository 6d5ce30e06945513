//! Developer tasks: `cargo xtask deps | vm-run | vm-test | demo | e2e | installed | sanity | bench | helm`.

mod cluster;
mod e2e;
mod guest;
mod helm;
mod images;
mod node;
mod sanity;
mod shared;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

use crate::vm::{Disk, VmSpec};

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
    /// Every test: host unit tests (`cargo test --workspace`), the real-LVM suite in the VM, the
    /// two-node shared-LUN tests, csi-sanity against the standalone driver in the VM, the e2e suite
    /// on a real control plane, and lvms-rs installed on a real node (`installed`).
    Test,
    /// Build the real-LVM integration tests (`tests/vm_*.rs`) and run them inside the VM.
    VmTest {
        /// Only tests whose name contains this.
        filter: Option<String>,
    },
    /// Two VMs sharing one disk image as two nodes see one SAN LUN: the `shared_vms` tests
    /// (sanlock and lvmlockd in each guest, shared device classes).
    VmShared {
        /// Only tests whose name contains this.
        filter: Option<String>,
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
    },
    /// Inside the e2e VM: execute the host's shell commands (see xtask/src/guest.rs).
    #[command(hide = true)]
    GuestServe { port: u16 },
    /// Inside the installed test's node VM: the API server's HTTP CONNECT proxy (xtask/src/guest.rs).
    #[command(hide = true)]
    GuestConnect { port: u16 },
    /// lvms-rs installed on a real node: the control plane, a kubelet with containerd in the VM,
    /// local images, `kubectl apply -k` of deploy/base, and the e2e test `installed` (ADR 0018).
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
        /// Only these modes (repeatable): thin-mount, thin-block, thick, shared-linear-mount,
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
    let _ = std::fs::remove_dir_all(disks_dir(&repo));
    result
}

fn run_task(task: Task, repo: &Path) -> Result<ExitCode> {
    let repo = repo.to_path_buf();
    match task {
        Task::Deps => deps().map(|()| ExitCode::SUCCESS),
        Task::VmRun {
            disks,
            net,
            timeout_secs,
            command,
        } => {
            let disks = disks
                .iter()
                .map(|d| parse_disk(&repo, d))
                .collect::<Result<Vec<_>>>()?;
            let spec = VmSpec {
                name: "run".into(),
                disks,
                memory_mib: 2048,
                cpus: 2,
                net,
                forwards: vec![],
                command: command.join(" "),
                cwd: repo.clone(),
                env: vec![],
                timeout: Duration::from_secs(timeout_secs),
            };
            let out = vm::run_all(&repo, vec![spec])?.remove(0);
            exit_from(out.exit_code)
        }
        Task::Test => {
            deps()?;
            let mut phases = Phases::start();
            let status = Command::new(env!("CARGO"))
                .args(["test", "--workspace"])
                .current_dir(&repo)
                .status()?;
            phases.done("host tests");
            if !status.success() {
                bail!("host tests failed");
            }
            let vm = vm_test(&repo, None)?;
            phases.done("VM suite");
            let two_nodes = shared::run(&repo, None)?;
            phases.done("two-node shared VMs");
            let sanity = sanity::run(&repo, false, &[])?;
            phases.done("csi-sanity");
            let e2e = e2e::run(&repo, None)?;
            phases.done("e2e on a real control plane");
            let installed = node::run(&repo, false)?;
            phases.done("installed on a real node (kubelet, containerd)");
            phases.print();
            let all = [vm, two_nodes, sanity, e2e, installed];
            Ok(if all.iter().all(|c| *c == ExitCode::SUCCESS) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Task::VmTest { filter } => {
            deps()?;
            vm_test(&repo, filter.as_deref())
        }
        Task::VmShared { filter } => {
            deps()?;
            shared::run(&repo, filter.as_deref())
        }
        Task::Demo => {
            deps()?;
            demo(&repo)
        }
        Task::E2e { filter, bench } => {
            deps()?;
            if bench {
                e2e::bench(&repo)
            } else {
                e2e::run(&repo, filter.as_deref())
            }
        }
        Task::GuestServe { port } => guest::serve(port).map(|()| ExitCode::SUCCESS),
        Task::GuestConnect { port } => guest::serve_connect(port).map(|()| ExitCode::SUCCESS),
        Task::Installed { keep } => {
            deps()?;
            node::run(&repo, keep)
        }
        Task::Cluster => {
            deps()?;
            e2e::serve_cluster(&repo)
        }
        Task::Sanity { shared_thin, only } => {
            deps()?;
            sanity::run(&repo, shared_thin, &only)
        }
        Task::Helm => helm::generate(&repo).map(|()| ExitCode::SUCCESS),
        Task::Bench { args } => {
            deps()?;
            bench(&repo, &args)
        }
    }
}

/// Wall-clock time of each phase of `cargo xtask test`, printed at the end.
struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Self {
        Self {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    fn done(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((name, now - self.last));
        self.last = now;
    }

    fn print(&self) {
        for (name, took) in &self.done {
            println!("phase: {name}: {:.0} s", took.as_secs_f64());
        }
    }
}

fn exit_from(code: Option<i32>) -> Result<ExitCode> {
    match code {
        Some(c) => Ok(ExitCode::from(u8::try_from(c).unwrap_or(1))),
        None => bail!("the VM did not report an exit status (it crashed or timed out)"),
    }
}

pub(crate) fn parse_disk(repo: &Path, s: &str) -> Result<Disk> {
    let (serial, mib) = s
        .split_once('=')
        .context("--disk takes SERIAL=SIZE_IN_MIB, e.g. --disk data0=2048")?;
    let size = mib.parse::<u64>().context("disk size in MiB")? * 1024 * 1024;
    // Per run: concurrent runs must not share (or truncate) each other's disks.
    let image = disks_dir(repo).join(format!("{serial}.img"));
    vm::make_disk(&image, size)?;
    Ok(Disk {
        serial: serial.into(),
        image,
        shared: false,
        readonly: false,
    })
}

fn disks_dir(repo: &Path) -> PathBuf {
    vm::vm_dir(repo).join(format!("disks-{}", std::process::id()))
}

/// Commands the VM suite and the tests need, and the Debian package that brings each.
const DEPS: &[(&str, &str)] = &[
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    ("/bin/busybox", "busybox-static"),
    ("/sbin/lvm", "lvm2"),
    ("/usr/sbin/thin_check", "thin-provisioning-tools"),
    ("/sbin/mkfs.xfs", "xfsprogs"),
    ("/sbin/mkfs.ext4", "e2fsprogs"),
    ("/usr/bin/cpio", "cpio"),
    ("/lib/systemd/systemd-udevd", "udev"),
    ("/sbin/sfdisk", "fdisk"),
    ("/sbin/modprobe", "kmod"),
    ("/usr/bin/etcd", "etcd-server"),
    ("/usr/bin/curl", "curl"),
    ("/usr/bin/xz", "xz-utils"),
    // Shared device classes: the lock daemons run in the guests as host services would.
    ("/usr/sbin/sanlock", "sanlock"),
    ("/usr/sbin/lvmlockd", "lvm2-lockd"),
    // The real node (`cargo xtask installed`): kubelet's container runtime, its CNI plugins and
    // iptables run in the guest; mmdebstrap builds the lvms image's Debian rootfs on the host.
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/bin/mmdebstrap", "mmdebstrap"),
    // pip installs the gRPC C-core client (grpcio) the CSI contract tests run.
    (
        "/usr/lib/python3/dist-packages/pip/__init__.py",
        "python3-pip",
    ),
];

fn deps() -> Result<()> {
    let mut missing: Vec<&str> = DEPS
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if vm::kernel_version().is_err() {
        missing.push("linux-image-amd64");
    }
    if missing.is_empty() {
        println!("deps: all present");
        return Ok(());
    }
    println!("deps: installing {}", missing.join(" "));
    let status = Command::new("apt-get").arg("update").status()?;
    if !status.success() {
        bail!("apt-get update failed (run as root)");
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    if !status.success() {
        bail!("apt-get install {} failed", missing.join(" "));
    }
    Ok(())
}

/// The disks every VM-suite run attaches: clean disks to claim and decoys that must never be touched.
fn suite_disks(repo: &Path) -> Result<Vec<Disk>> {
    let mut disks = Vec::new();
    for (serial, mib, readonly) in [
        ("clean0", 2048, false),
        ("clean1", 2048, false),
        ("clean2", 2048, false),
        ("decoy-ext4", 1536, false),
        ("decoy-part", 1536, false),
        ("decoy-mounted", 1536, false),
        ("decoy-foreign", 1536, false),
        ("decoy-ro", 1536, true),
    ] {
        let mut d = parse_disk(repo, &format!("{serial}={mib}"))?;
        d.readonly = readonly;
        disks.push(d);
    }
    Ok(disks)
}

/// Test executables of the `vm_*` integration-test targets, built on the host.
/// Returns (executable, its crate's directory) pairs.
pub(crate) fn build_vm_tests(repo: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let out = Command::new(env!("CARGO"))
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .current_dir(repo)
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the tests failed");
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_vm_test = msg["reason"] == "compiler-artifact"
            && msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
            && msg["target"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("vm_"));
        if let (true, Some(exe), Some(manifest)) = (
            is_vm_test,
            msg["executable"].as_str(),
            msg["manifest_path"].as_str(),
        ) {
            let dir = Path::new(manifest).parent().unwrap_or(repo).to_path_buf();
            exes.push((PathBuf::from(exe), dir));
        }
    }
    if exes.is_empty() {
        bail!("no vm_* test targets found");
    }
    Ok(exes)
}

fn vm_test(repo: &Path, filter: Option<&str>) -> Result<ExitCode> {
    let exes = build_vm_tests(repo)?;
    let mut command = String::from("status=0\n");
    // Each test binary runs from its crate's directory, as cargo runs it.
    for (exe, crate_dir) in &exes {
        command.push_str(&format!(
            "cd {} && {} --ignored --test-threads=1 --color never {} || status=1\n",
            vm::shell_quote(&crate_dir.to_string_lossy()),
            vm::shell_quote(&exe.to_string_lossy()),
            filter.map(vm::shell_quote).unwrap_or_default(),
        ));
    }
    command.push_str("exit $status");
    let spec = VmSpec {
        name: "vm-test".into(),
        disks: suite_disks(repo)?,
        memory_mib: 2048,
        cpus: 2,
        net: false,
        forwards: vec![],
        command,
        cwd: repo.to_path_buf(),
        // RUST_TEST_NOCAPTURE=1 on the host shows what passing tests print (measured numbers).
        env: std::iter::once(("RUST_BACKTRACE".into(), "1".into()))
            .chain(
                std::env::var("RUST_TEST_NOCAPTURE")
                    .ok()
                    .map(|v| ("RUST_TEST_NOCAPTURE".into(), v)),
            )
            .collect(),
        timeout: Duration::from_secs(60 * 60),
    };
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    let (passed, failed, ignored) = sum_summaries(&out.test_summaries);
    println!(
        "vm-test: {} test binaries, guest finished in {:.0} s with status {:?}",
        exes.len(),
        out.elapsed.as_secs_f64(),
        out.exit_code
    );
    if out.test_summaries.len() != exes.len() {
        println!(
            "vm-test: {} of {} test binaries reported a result",
            out.test_summaries.len(),
            exes.len()
        );
    }
    println!("vm-suite: {passed} passed, {failed} failed, {ignored} skipped");
    if out.test_summaries.len() != exes.len() {
        bail!("not every VM test binary finished");
    }
    exit_from(out.exit_code)
}

/// Adds up libtest summary lines (`test result: ok. 3 passed; 0 failed; 1 ignored; …`).
pub(crate) fn sum_summaries(lines: &[String]) -> (u64, u64, u64) {
    let mut totals = (0, 0, 0);
    for line in lines {
        for part in line.split([';', '.']) {
            let mut words = part.split_whitespace();
            if let (Some(n), Some(what)) = (words.next(), words.next()) {
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => totals.0 += n,
                    "failed" => totals.1 += n,
                    "ignored" => totals.2 += n,
                    _ => {}
                }
            }
        }
    }
    totals
}

fn bench(repo: &Path, args: &[String]) -> Result<ExitCode> {
    let status = Command::new(env!("CARGO"))
        .args([
            "build",
            "--release",
            "--package",
            "lvms",
            "--package",
            "lvms-csi",
            "--bin",
            "lvms",
            "--bin",
            "lvms-csi-bench",
        ])
        .current_dir(repo)
        .status()?;
    if !status.success() {
        bail!("building the benchmark failed");
    }
    let bin = repo.join("target/release");
    let mut command = format!(
        "{} --device /dev/disk/by-id/virtio-bench --lvms {}",
        vm::shell_quote(&bin.join("lvms-csi-bench").to_string_lossy()),
        vm::shell_quote(&bin.join("lvms").to_string_lossy())
    );
    for a in args {
        command.push(' ');
        command.push_str(&vm::shell_quote(a));
    }
    let spec = VmSpec {
        name: "bench".into(),
        disks: vec![parse_disk(repo, "bench=8192")?],
        memory_mib: 1024,
        cpus: 2,
        net: false,
        forwards: vec![],
        command,
        cwd: repo.to_path_buf(),
        env: vec![],
        timeout: Duration::from_secs(120 * 60),
    };
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    exit_from(out.exit_code)
}

fn demo(repo: &Path) -> Result<ExitCode> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--package", "lvms"])
        .current_dir(repo)
        .status()?;
    if !status.success() {
        bail!("building lvms failed");
    }
    let lvms = repo.join("target/debug/lvms");
    let config = repo.join("examples/node-engine.yaml");
    let script = repo.join("scripts/demo.sh");
    let mut disks = Vec::new();
    for serial in ["data0", "data1"] {
        disks.push(parse_disk(repo, &format!("{serial}=2048"))?);
    }
    disks.push(parse_disk(repo, "bootlike=1024")?);
    let command = format!(
        "LVMS={} CONFIG={} sh {}",
        vm::shell_quote(&lvms.to_string_lossy()),
        vm::shell_quote(&config.to_string_lossy()),
        vm::shell_quote(&script.to_string_lossy())
    );
    let spec = VmSpec {
        name: "demo".into(),
        disks,
        memory_mib: 1024,
        cpus: 2,
        net: false,
        forwards: vec![],
        command,
        cwd: repo.to_path_buf(),
        env: vec![],
        timeout: Duration::from_secs(15 * 60),
    };
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    exit_from(out.exit_code)
}
