//! The tasks that run `lvms standalone` in one VM without Kubernetes: the demo and the CSI
//! benchmark.

use std::{
    path::Path,
    process::{Command, ExitCode},
    time::Duration,
};

use anyhow::{Result, bail};

use crate::{
    report,
    vm::{self, VmSpec},
};

/// `cargo xtask bench`: the CSI benchmark in the VM (release build), the driver against raw LVM.
pub fn bench(repo: &Path, args: &[String]) -> Result<ExitCode> {
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
    let bin = crate::artifacts::cargo_target(repo).join("release");
    let mut command = format!(
        "{} --device /dev/disk/by-id/virtio-bench --lvms {}",
        vm::shell_quote(&bin.join("lvms-csi-bench").to_string_lossy()),
        vm::shell_quote(&bin.join("lvms").to_string_lossy())
    );
    for a in args {
        command.push(' ');
        command.push_str(&vm::shell_quote(a));
    }
    // `--raid-thin` compares a raid1 thin class with a plain one, each on disks of its own.
    let mut disks = vec!["bench=8192"];
    if args.iter().any(|a| a == "--raid-thin") {
        disks.extend(["raid-plain=2048", "raid-a=2048", "raid-b=2048"]);
    }
    let spec = VmSpec::new("bench", repo, command)
        .disks(vm::disks(repo, &disks)?)
        .memory_mib(1024)
        .timeout(Duration::from_secs(120 * 60));
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    report::exit_from(out.exit_code)
}

/// `cargo xtask demo`: scripts/demo.sh against the standalone driver on real LVM.
pub fn demo(repo: &Path) -> Result<ExitCode> {
    let status = Command::new(env!("CARGO"))
        .args(["build", "--package", "lvms"])
        .current_dir(repo)
        .status()?;
    if !status.success() {
        bail!("building lvms failed");
    }
    let lvms = crate::artifacts::lvms(repo);
    let config = repo.join("examples/node-engine.yaml");
    let script = repo.join("scripts/demo.sh");
    let command = format!(
        "LVMS={} CONFIG={} sh {}",
        vm::shell_quote(&lvms.to_string_lossy()),
        vm::shell_quote(&config.to_string_lossy()),
        vm::shell_quote(&script.to_string_lossy())
    );
    let spec = VmSpec::new("demo", repo, command)
        .disks(vm::disks(
            repo,
            &["data0=2048", "data1=2048", "bootlike=1024"],
        )?)
        .memory_mib(1024)
        .timeout(Duration::from_secs(15 * 60));
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    report::exit_from(out.exit_code)
}
