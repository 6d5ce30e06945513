//! `cargo xtask vm-shared`: two VMs attach one disk image (`share-rw`, no image locking), as two
//! nodes see one SAN LUN, and the host runs the `shared_vms` tests, which drive both guests through
//! their command servers ([`crate::guest`]). Each guest also has a local disk of its own.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Command, ExitCode, Stdio},
};

use anyhow::{Context, Result};

use crate::{artifacts::Artifacts, cluster, guest, report::Counts, vm};

/// The shared LUN (`/dev/disk/by-id/virtio-lun0` in both guests) and each node's local disk.
const LUN: &str = "lun0=3072";
const LOCAL: [&str; 2] = ["local1=1024", "local2=1024"];

/// Tests that end a guest (power loss, a fenced node) start with their own fresh pair of VMs and
/// LUN; their names start with this.
pub const FENCING_PREFIX: &str = "fencing_";

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

/// Boots two VMs on a fresh LUN, runs `exe` with `args` against them, powers them off; whether
/// the tests passed, and libtest's summary.
fn pair(repo: &Path, kernel: &vm::Kernel, exe: &Path, args: &[&str]) -> Result<(bool, Counts)> {
    let mut lun = vm::disk(repo, LUN)?;
    lun.shared = true;
    let ports = [cluster::free_port()?, cluster::free_port()?];
    let mut vms = Vec::new();
    for (i, local) in LOCAL.iter().enumerate() {
        let disks = vec![lun.clone(), vm::disk(repo, local)?];
        // One vCPU each: two guests under TCG on a two-core machine.
        vms.push(guest::start_served(
            repo,
            kernel,
            &format!("node{}", i + 1),
            disks,
            1,
            ports[i],
            &[],
        )?);
    }
    let join = |v: Vec<String>| v.join(",");
    let nodes = join(ports.iter().map(|p| format!("127.0.0.1:{p}")).collect());
    // The fencing tests end a guest by killing its machine (power loss).
    let pids = join(vms.iter().map(|vm| vm.pid().to_string()).collect());
    let mut child = Command::new(exe)
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
        .stdout(Stdio::piped())
        .spawn()
        .context("running the shared_vms tests")?;
    let mut summaries = Vec::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            if line.starts_with("test result: ") {
                summaries.push(line);
            }
        }
    }
    let status = child.wait()?;
    for p in ports {
        guest::at(p).poweroff();
    }
    for vm in vms {
        let out = vm.wait()?;
        println!(
            "vm-shared: a guest finished in {:.0} s",
            out.elapsed.as_secs_f64()
        );
    }
    Ok((
        status.success() && !summaries.is_empty(),
        Counts::from_libtest(&summaries),
    ))
}

/// `cargo xtask vm-shared [FILTER] [--skip S]…`: the tests other than `fencing_*` on one pair of
/// VMs, then each `fencing_*` test on a fresh pair.
pub fn run(repo: &Path, filter: Option<&str>, skip: &[String]) -> Result<ExitCode> {
    let exe = Artifacts::get(repo)?.exe("shared_vms")?.exe.clone();
    let kernel = vm::prepare(repo)?;
    let selected: Vec<String> = list(&exe)?
        .into_iter()
        .filter(|t| filter.is_none_or(|f| t.contains(f)))
        .filter(|t| !skip.iter().any(|s| t.contains(s.as_str())))
        .collect();
    let (fencing, rest): (Vec<String>, Vec<String>) = selected
        .into_iter()
        .partition(|t| t.starts_with(FENCING_PREFIX));
    let mut ok = true;
    let mut counts = Counts::default();
    if !rest.is_empty() {
        let mut args: Vec<&str> = vec!["--exact"];
        args.extend(rest.iter().map(String::as_str));
        let (passed, c) = pair(repo, &kernel, &exe, &args)?;
        ok &= passed;
        counts.add(c);
    }
    for test in &fencing {
        println!("vm-shared: {test} on a fresh pair of VMs");
        let (passed, c) = pair(repo, &kernel, &exe, &["--exact", test])?;
        ok &= passed;
        counts.add(c);
    }
    println!("vm-shared: {counts}");
    Ok(if ok && counts.passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
