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

pub fn run(repo: &Path, filter: Option<&str>) -> Result<ExitCode> {
    let exe = build(repo)?;
    let kernel = vm::prepare(repo)?;
    let mut lun = crate::parse_disk(repo, LUN)?;
    lun.shared = true;
    let ports = [cluster::free_port()?, cluster::free_port()?];
    let mut vms = Vec::new();
    for (i, local) in LOCAL.iter().enumerate() {
        let disks = vec![lun.clone(), crate::parse_disk(repo, local)?];
        // One vCPU each: two guests under TCG on a two-core machine.
        vms.push(guest::start_served(
            repo,
            &kernel,
            &format!("node{}", i + 1),
            disks,
            1,
            ports[i],
        )?);
    }
    let nodes = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut test = Command::new(&exe);
    test.args([
        "--ignored",
        "--test-threads=1",
        "--nocapture",
        "--color",
        "never",
    ])
    .args(filter)
    .env("LVMS_SHARED_NODES", nodes)
    .current_dir(repo.join("crates/lvms"));
    let status = test.status().context("running the shared_vms tests")?;
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
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
