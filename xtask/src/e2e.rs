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

use crate::cluster::{self, ControlPlane};

/// Builds the e2e test binary; returns its path.
fn build_suite(repo: &Path) -> Result<PathBuf> {
    let out = Command::new(env!("CARGO"))
        .args([
            "test",
            "--package",
            "lvms-operator",
            "--test",
            "e2e",
            "--no-run",
            "--message-format=json",
        ])
        .current_dir(repo)
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("building the e2e suite failed");
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "e2e")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .context("cargo built no e2e executable")
}

pub fn run(repo: &Path, filter: Option<&str>) -> Result<ExitCode> {
    let started = Instant::now();
    let suite = build_suite(repo)?;
    let assets = cluster::assets(repo, cluster::CONTROL_PLANE)?;
    let control_plane = ControlPlane::start(&repo.join("target/e2e/cluster"), &assets)?;
    let mut cmd = Command::new(&suite);
    cmd.args(["--color", "never"])
        .args(filter)
        .current_dir(repo.join("crates/operator"))
        .env("LVMS_E2E", "1")
        .env("KUBECONFIG", &control_plane.kubeconfig)
        .env("LVMS_K8S_ASSETS", &assets)
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
    drop(control_plane);
    let (passed, failed, ignored) = summary
        .as_deref()
        .map(|s| crate::sum_summaries(&[s.to_owned()]))
        .unwrap_or_default();
    println!(
        "e2e: suite finished in {:.0} s with {status}",
        started.elapsed().as_secs_f64()
    );
    println!("e2e: {passed} passed, {failed} failed, {ignored} skipped");
    if summary.is_none() {
        bail!("the e2e suite printed no result (it crashed)");
    }
    Ok(if status.success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `cargo xtask cluster`: the control plane alone, until the process is killed.
pub fn serve_cluster(repo: &Path) -> Result<ExitCode> {
    let assets = cluster::assets(repo, cluster::CONTROL_PLANE)?;
    let _control_plane = ControlPlane::start(&repo.join("target/e2e/dev"), &assets)?;
    println!(
        "cluster: export KUBECONFIG={}",
        repo.join("target/e2e/dev/admin.kubeconfig").display()
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
