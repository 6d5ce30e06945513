//! `cargo xtask vm-test`: the real-LVM suite (every `vm_*` integration-test target) inside one boot
//! of the test VM, or one shard of it (`--shard 1/2`: `cargo xtask test` runs the shards side by
//! side, each in a VM of its own).

use std::{fmt::Write as _, path::Path, process::ExitCode};

use anyhow::{Context, Result, bail};

use crate::{
    artifacts::{Artifacts, TestExe},
    report,
    vm::{self, VmSpec},
};

/// The disks every VM-suite run attaches: clean disks to claim and decoys that must never be touched.
fn suite_disks(repo: &Path) -> Result<Vec<vm::Disk>> {
    let mut disks = Vec::new();
    for (spec, readonly) in [
        ("clean0=2048", false),
        ("clean1=2048", false),
        ("clean2=2048", false),
        ("decoy-ext4=1536", false),
        ("decoy-part=1536", false),
        ("decoy-mounted=1536", false),
        ("decoy-foreign=1536", false),
        ("decoy-ro=1536", true),
    ] {
        let mut d = vm::disk(repo, spec)?;
        d.readonly = readonly;
        disks.push(d);
    }
    Ok(disks)
}

/// Seconds each test target took in the VM, used only to balance the shards (their proportions
/// matter); a target not listed counts as [`UNKNOWN_SECS`]. From `cargo xtask vm-test` in one
/// user-mode guest (ADR 0026), nothing else running.
const MEASURED_SECS: &[(&str, u64)] = &[
    ("vm_lvm", 330),
    ("vm_local", 161),
    ("vm_engine", 158),
    ("vm_cli", 78),
    ("vm_driver", 70),
    ("vm_shell", 70),
    ("vm_agent", 65),
    ("vm_node", 58),
    ("vm_host_tools", 13),
    ("vm_ephemeral", 12),
];
const UNKNOWN_SECS: u64 = 30;

/// `index`/`count` (1-based) of `--shard`.
pub fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let (i, n) = s
        .split_once('/')
        .context("--shard takes INDEX/COUNT, e.g. --shard 1/2")?;
    let (i, n): (usize, usize) = (i.parse()?, n.parse()?);
    if n == 0 || i == 0 || i > n {
        bail!("--shard {s}: INDEX must be 1..=COUNT");
    }
    Ok((i, n))
}

/// Splits `targets` into `count` shards of about equal measured time (longest first onto the
/// lightest shard), each shard's targets in name order; the same list always splits the same way.
pub fn shards<'a>(targets: &[&'a TestExe], count: usize) -> Vec<Vec<&'a TestExe>> {
    let secs = |t: &TestExe| {
        MEASURED_SECS
            .iter()
            .find(|(name, _)| *name == t.target)
            .map_or(UNKNOWN_SECS, |(_, s)| *s)
    };
    let mut sorted = targets.to_vec();
    sorted.sort_by(|a, b| secs(b).cmp(&secs(a)).then(a.target.cmp(&b.target)));
    let mut out: Vec<(u64, Vec<&TestExe>)> = vec![(0, Vec::new()); count];
    for t in sorted {
        if let Some(lightest) = out.iter_mut().min_by_key(|(load, _)| *load) {
            lightest.0 += secs(t);
            lightest.1.push(t);
        }
    }
    out.into_iter()
        .map(|(_, mut ts)| {
            ts.sort_by(|a, b| a.target.cmp(&b.target));
            ts
        })
        .collect()
}

pub fn run(repo: &Path, filter: Option<&str>, shard: Option<(usize, usize)>) -> Result<ExitCode> {
    let artifacts = Artifacts::get(repo)?;
    let all = artifacts.vm_tests();
    if all.is_empty() {
        bail!("no vm_* test targets found");
    }
    let exes = match shard {
        Some((i, n)) => shards(&all, n).swap_remove(i - 1),
        None => all,
    };
    let mut command = String::from("status=0\n");
    // Each test binary runs from its crate's directory, as cargo runs it.
    for t in &exes {
        let _ = writeln!(
            command,
            "start=$(date +%s); cd {} && {} --ignored --test-threads=1 --color never {} || status=1; \
             echo \"vm-test: {} took $(( $(date +%s) - start )) s\"",
            vm::shell_quote(&t.crate_dir.to_string_lossy()),
            vm::shell_quote(&t.exe.to_string_lossy()),
            filter.map(vm::shell_quote).unwrap_or_default(),
            t.target,
        );
    }
    command.push_str("exit $status");
    // RUST_TEST_NOCAPTURE=1 on the host shows what passing tests print (measured numbers).
    let spec = VmSpec::new("vm-test", repo, command)
        .disks(suite_disks(repo)?)
        .env("RUST_BACKTRACE", "1")
        .env_from_host(&["RUST_TEST_NOCAPTURE"]);
    let out = vm::run_all(repo, vec![spec])?.remove(0);
    let counts = report::Counts::from_libtest(&out.test_summaries);
    println!(
        "vm-test: {} test binaries ({}), guest finished in {:.0} s with status {:?}",
        exes.len(),
        exes.iter()
            .map(|t| t.target.as_str())
            .collect::<Vec<_>>()
            .join(" "),
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
    println!("vm-suite: {counts}");
    if out.test_summaries.len() != exes.len() {
        bail!("not every VM test binary finished");
    }
    report::exit_from(out.exit_code)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn exe(target: &str) -> TestExe {
        TestExe {
            target: target.into(),
            kind: "test".into(),
            exe: PathBuf::from(target),
            crate_dir: PathBuf::new(),
        }
    }

    #[test]
    fn shards_cover_every_target_once_and_balance_the_measured_time() {
        let owned: Vec<TestExe> = MEASURED_SECS
            .iter()
            .map(|(n, _)| exe(n))
            .chain([exe("vm_new")])
            .collect();
        let targets: Vec<&TestExe> = owned.iter().collect();
        let split = shards(&targets, 2);
        let mut names: Vec<&str> = split.iter().flatten().map(|t| t.target.as_str()).collect();
        names.sort_unstable();
        let mut expected: Vec<&str> = owned.iter().map(|t| t.target.as_str()).collect();
        expected.sort_unstable();
        assert_eq!(names, expected);
        let load = |s: &Vec<&TestExe>| -> u64 {
            s.iter()
                .map(|t| {
                    MEASURED_SECS
                        .iter()
                        .find(|(n, _)| *n == t.target)
                        .map_or(UNKNOWN_SECS, |(_, s)| *s)
                })
                .sum()
        };
        let (a, b) = (load(&split[0]), load(&split[1]));
        let longest = MEASURED_SECS.iter().map(|(_, s)| *s).max().unwrap_or(0);
        assert!(a.abs_diff(b) <= longest, "{a} vs {b}");
        // The same list splits the same way.
        assert_eq!(
            shards(&targets, 2)[0]
                .iter()
                .map(|t| &t.target)
                .collect::<Vec<_>>(),
            split[0].iter().map(|t| &t.target).collect::<Vec<_>>()
        );
    }

    #[test]
    fn shard_flags_are_index_over_count() {
        assert_eq!(parse_shard("2/3").unwrap(), (2, 3));
        assert!(parse_shard("0/2").is_err());
        assert!(parse_shard("3/2").is_err());
        assert!(parse_shard("1").is_err());
    }
}
