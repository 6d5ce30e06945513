//! The workspace's test executables, built once: every task that runs tests (the VM suite, the
//! two-node tests, csi-sanity's driver, e2e, installed) takes its binaries from one `cargo test
//! --workspace --no-run`, so the driver in `target/debug/lvms` is built with the features the
//! tests use and nothing is built twice. `cargo xtask test` builds before its phases start and
//! hands them the list in a file ([`ARTIFACTS_ENV`]), so no phase waits on cargo's lock.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};

/// A file holding the list [`Artifacts::save`] wrote; phases read it instead of running cargo.
pub const ARTIFACTS_ENV: &str = "LVMS_XTASK_ARTIFACTS";

/// One integration-test or unit-test executable.
#[derive(Debug, Clone)]
pub struct TestExe {
    /// The target's name (`vm_lvm`, `e2e`, `shared_vms`, or the crate's for unit tests).
    pub target: String,
    /// `test` for integration tests, `lib`/`bin` for unit tests.
    pub kind: String,
    pub exe: PathBuf,
    /// Its crate's directory, where cargo would run it.
    pub crate_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Artifacts {
    pub tests: Vec<TestExe>,
}

impl Artifacts {
    /// From [`ARTIFACTS_ENV`]'s file when set, else built now.
    pub fn get(repo: &Path) -> Result<Self> {
        match std::env::var_os(ARTIFACTS_ENV) {
            Some(file) => Self::load(Path::new(&file)),
            None => Self::build(repo, Stdio::inherit()),
        }
    }

    /// `cargo test --workspace --no-run`, its diagnostics to `stderr`.
    pub fn build(repo: &Path, stderr: impl Into<Stdio>) -> Result<Self> {
        let out = Command::new(env!("CARGO"))
            .args(["test", "--workspace", "--no-run", "--message-format=json"])
            .current_dir(repo)
            .stderr(stderr)
            .output()
            .context("cargo test --no-run")?;
        if !out.status.success() {
            bail!("building the tests failed");
        }
        let mut tests = Vec::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if msg["reason"] != "compiler-artifact" {
                continue;
            }
            let (Some(exe), Some(manifest), Some(target)) = (
                msg["executable"].as_str(),
                msg["manifest_path"].as_str(),
                msg["target"]["name"].as_str(),
            ) else {
                continue;
            };
            let kind = msg["target"]["kind"][0].as_str().unwrap_or_default();
            if !msg["profile"]["test"].as_bool().unwrap_or(false) {
                continue;
            }
            tests.push(TestExe {
                target: target.to_owned(),
                kind: kind.to_owned(),
                exe: PathBuf::from(exe),
                crate_dir: Path::new(manifest).parent().unwrap_or(repo).to_path_buf(),
            });
        }
        Ok(Self { tests })
    }

    pub fn save(&self, file: &Path) -> Result<()> {
        let list: Vec<serde_json::Value> = self
            .tests
            .iter()
            .map(|t| {
                serde_json::json!({
                    "target": t.target, "kind": t.kind, "exe": t.exe, "crate_dir": t.crate_dir,
                })
            })
            .collect();
        std::fs::write(file, serde_json::to_vec_pretty(&list)?)?;
        Ok(())
    }

    fn load(file: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading the built tests' list {}", file.display()))?;
        let list: Vec<serde_json::Value> = serde_json::from_str(&text)?;
        let field = |v: &serde_json::Value, k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Ok(Self {
            tests: list
                .iter()
                .map(|v| TestExe {
                    target: field(v, "target"),
                    kind: field(v, "kind"),
                    exe: PathBuf::from(field(v, "exe")),
                    crate_dir: PathBuf::from(field(v, "crate_dir")),
                })
                .collect(),
        })
    }

    /// The integration-test executable `target` (`e2e`, `shared_vms`).
    pub fn exe(&self, target: &str) -> Result<&TestExe> {
        self.tests
            .iter()
            .find(|t| t.kind == "test" && t.target == target)
            .with_context(|| format!("cargo built no {target} test executable"))
    }

    /// The real-LVM suite: every `vm_*` integration-test target.
    pub fn vm_tests(&self) -> Vec<&TestExe> {
        self.tests
            .iter()
            .filter(|t| t.kind == "test" && t.target.starts_with("vm_"))
            .collect()
    }
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR` when it is set (relative to the checkout),
/// else `target/` in the checkout. Work directories stay under the checkout's `target/`.
pub fn cargo_target(repo: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => repo.join(dir),
        _ => repo.join("target"),
    }
}

/// The debug `lvms`, built beside the tests (crates/lvms's integration tests need it).
pub fn lvms(repo: &Path) -> PathBuf {
    cargo_target(repo).join("debug/lvms")
}
