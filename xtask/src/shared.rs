//! `cargo xtask vm-shared`: two VMs attach one disk image (`share-rw`, no image locking), as two
//! nodes see one SAN LUN, and the host runs the `shared_vms` tests, which drive both guests through
//! their command servers ([`crate::guest`]). Each guest also has a local disk of its own.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result, bail};

use crate::{cluster, guest, vm};

/// The shared LUN (`/dev/disk/by-id/virtio-lun0` in both guests) and each node's local disk.
const LUN: &str = "lun0=3072";
const LOCAL: [&str; 2] = ["local1=1024", "local2=1024"];

/// Builds the `shared_vms` test binary (and `target/debug/lvms` beside it).
fn build(repo: &Path) -> Result<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .args([
            "test",
            "-p",
            "lvms",
            "--test",
            "shared_vms",
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(repo)
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the shared_vms tests failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "shared_vms")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built no shared_vms executable")
}

/// Tests that end a guest (power loss, a fenced node) start with their own fresh pair of VMs and
/// LUN; their names start with this.
const FENCING_PREFIX: &str = "fencing_";

/// The `shared_vms` tests' names, `--ignored` as they all are.
fn list(exe: &Path) -> Result<Vec<String>> {
    let out = Command::new(exe)
        .args(["--list", "--ignored", "--format", "terse"])
        .output()
        .context("listing the shared_vms tests")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Boots two VMs on a fresh LUN, runs `exe` with `args` against them, powers them off.
fn pair(repo: &Path, kernel: &vm::Kernel, exe: &Path, args: &[&str]) -> Result<bool> {
    let mut lun = crate::parse_disk(repo, LUN)?;
    lun.shared = true;
    let ports = [cluster::free_port()?, cluster::free_port()?];
    let mut vms = Vec::new();
    for (i, local) in LOCAL.iter().enumerate() {
        let disks = vec![lun.clone(), crate::parse_disk(repo, local)?];
        // One vCPU each: two guests under TCG on a two-core machine.
        vms.push(guest::start_served(
            repo,
            kernel,
            &format!("node{}", i + 1),
            disks,
            1,
            ports[i],
        )?);
    }
    let join = |v: Vec<String>| v.join(",");
    let nodes = join(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect());
    // The fencing tests end a guest by killing its qemu (power loss).
    let pids = join(vms.iter().map(|vm| vm.pid().to_string()).collect());
    let status = Command::new(exe)
        .args([
            "--ignored",
            "--test-threads=1",
            "--nocapture",
            "--color",
            "never",
        ])
        .args(args)
        .env("LVMS_SHARED_NODES", nodes)
        .env("LVMS_SHARED_PIDS", pids)
        .current_dir(repo.join("crates/lvms"))
        .status()
        .context("running the shared_vms tests")?;
    for p in ports {
        guest::poweroff(p);
    }
    for vm in vms {
        let out = vm.wait()?;
        println!(
            "vm-shared: a guest finished in {:.0} s",
            out.elapsed.as_secs_f64()
        );
    }
    Ok(status.success())
}

pub fn run(repo: &Path, filter: Option<&str>) -> Result<ExitCode> {
    let exe = build(repo)?;
    let kernel = vm::prepare(repo)?;
    let selected: Vec<String> = list(&exe)?
        .into_iter()
        .filter(|t| filter.is_none_or(|f| t.contains(f)))
        .collect();
    let (fencing, rest): (Vec<String>, Vec<String>) = selected
        .into_iter()
        .partition(|t| t.starts_with(FENCING_PREFIX));
    let mut ok = true;
    if !rest.is_empty() {
        let mut args = vec!["--skip", FENCING_PREFIX];
        args.extend(filter);
        ok &= pair(repo, &kernel, &exe, &args)?;
    }
    for test in &fencing {
        println!("vm-shared: {test} on a fresh pair of VMs");
        ok &= pair(repo, &kernel, &exe, &["--exact", test])?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
