//! `cargo xtask sanity`: the CSI conformance suite (csi-test v5.4.0's csi-sanity) against `lvms standalone`
//! in one boot of the test VM, in six modes (eight with `--shared-thin`): a thin class with mount volumes, the thin class with block
//! volumes, a RAID thin class (raid1 pool data and metadata on two disks, ADR 0031) with mount
//! volumes, a thick class (whose snapshot and clone specs are skipped: thick classes cannot snapshot),
//! and a shared class with locking on (sanlock and lvmlockd in the VM): linear volumes mount and block
//! (skipping the snapshot and clone specs), and with `--shared-thin` thin volumes mount and block,
//! against a second driver.
//!
//! csi-sanity comes from the Kubernetes assets directory ([`crate::cluster::assets`]). Each mode's whole output is kept in
//! `target/sanity/<local|shared|all>/<mode>.log`, the drivers' in `standalone.log` (local classes) and
//! `shared.log` (the shared class, its own driver).

use std::{fmt::Write as _, fs, path::Path, process::ExitCode, time::Duration};

use anyhow::{Result, bail};

use crate::{
    artifacts::{self, Artifacts},
    report::Counts,
    vm::{self, VmSpec},
};

/// The CSI socket inside the VM.
const SOCKET: &str = "/run/lvms/csi.sock";
/// Size of every test volume: at least the 300Mi an xfs volume needs, small enough for several at once.
const VOLUME_SIZE: u64 = 512 << 20;
/// What the expansion specs grow a volume to.
const EXPAND_SIZE: u64 = 1 << 30;

/// One csi-sanity run.
struct Mode {
    name: &'static str,
    /// The device class named in `--csi.testvolumeparameters`.
    class: &'static str,
    /// Extra csi-sanity flags.
    flags: &'static [&'static str],
    /// Extra StorageClass parameters (`key: value` lines of the parameters file).
    params: &'static str,
    /// Against the driver of the shared class ([`SHARED_CONFIG`]) instead of the local classes'.
    shared: bool,
    /// Only with `cargo xtask sanity --shared-thin` (too slow for every CI run).
    extra: bool,
}

/// The specs a class without snapshots skips: snapshots, restores and clones need thin volumes.
const NO_SNAPSHOTS: &str = "--ginkgo.skip=[Ss]napshot|source volume";
/// A shared class's volumes in thin mode (one thin pool per volume).
const THIN_MODE: &str = "lvms.topolvm.io/volume-mode: thin\n";

const BLOCK: &str = "--csi.testvolumeaccesstype=block";

const MODES: &[Mode] = &[
    Mode {
        name: "thin-mount",
        class: "sanity-thin",
        flags: &[],
        extra: false,
        shared: false,
        params: "",
    },
    Mode {
        name: "thin-block",
        class: "sanity-thin",
        flags: &[BLOCK],
        extra: false,
        shared: false,
        params: "",
    },
    Mode {
        name: "raid-thin-mount",
        class: "sanity-raid-thin",
        flags: &[],
        extra: false,
        shared: false,
        params: "",
    },
    Mode {
        name: "thick",
        class: "sanity-thick",
        flags: &[NO_SNAPSHOTS],
        extra: false,
        shared: false,
        params: "",
    },
    // A shared class with locking on (sanlock and lvmlockd running, the volume group made with
    // `vgcreate --shared`): linear volumes mount and block; thin volumes mount and block only with
    // `--shared-thin` (thin mount alone took 989 s in the VM, against about 4 minutes for a local
    // thin class): the two-VM tests cover the thin paths in every CI run.
    Mode {
        name: "shared-linear-mount",
        class: "sanity-shared",
        flags: &[NO_SNAPSHOTS],
        extra: false,
        shared: true,
        params: "",
    },
    Mode {
        name: "shared-linear-block",
        class: "sanity-shared",
        flags: &[NO_SNAPSHOTS, BLOCK],
        extra: false,
        shared: true,
        params: "",
    },
    Mode {
        name: "shared-thin-mount",
        class: "sanity-shared",
        flags: &[],
        extra: true,
        shared: true,
        params: THIN_MODE,
    },
    Mode {
        name: "shared-thin-block",
        class: "sanity-shared",
        flags: &[BLOCK],
        extra: true,
        shared: true,
        params: THIN_MODE,
    },
];

/// The local classes' driver config: a thin class (the default, xfs) and a thick ext4 class, one
/// disk each, and a RAID thin class on two.
const CONFIG: &str = "\
deviceClasses:
  - name: sanity-thin
    default: true
    fstype: xfs
    deviceSelector:
      paths: [/dev/disk/by-id/virtio-sanity-thin]
    thinPoolConfig:
      name: pool
      sizePercent: 90
      overprovisionRatio: 10
      metadataSize: 64Mi
  - name: sanity-thick
    fstype: ext4
    deviceSelector:
      paths: [/dev/disk/by-id/virtio-sanity-thick]
  - name: sanity-raid-thin
    deviceSelector:
      paths: [/dev/disk/by-id/virtio-sanity-raid-a, /dev/disk/by-id/virtio-sanity-raid-b]
    raidConfig:
      type: raid1
    thinPoolConfig:
      name: pool
      sizePercent: 90
      overprovisionRatio: 10
      metadataSize: 64Mi
";

/// The shared class's driver config: this node is sanlock host 1 and makes the shared volume group.
/// A driver of its own, so the local modes run as a driver without shared classes does.
const SHARED_CONFIG: &str = "\
shared:
  hostId: 1
  createVolumeGroups: true
deviceClasses:
  - name: sanity-shared
    default: true
    fstype: ext4
    deviceAccessPolicy: shared
    deviceSelector:
      paths: [/dev/disk/by-id/virtio-sanity-shared]
    # sanlock runs without the watchdog here: csi-sanity does not test fencing.
    sharedConfig:
      watchdog: Disabled
";

/// The counts of ginkgo's summary line (`FAIL! -- 50 Passed | 2 Failed | 0 Pending | 42 Skipped`);
/// pending specs count as skipped. `None` when the output has no such line (the run did not finish).
pub fn parse_summary(output: &str) -> Option<Counts> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.contains(" Passed | ") && l.contains(" Failed | "))?;
    let mut counts = Counts::default();
    let tail = line.rsplit_once("-- ").map_or(line, |(_, t)| t);
    for part in tail.split('|') {
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else { continue };
        match what {
            "Passed" => counts.passed += n,
            "Failed" => counts.failed += n,
            "Pending" | "Skipped" => counts.skipped += n,
            _ => {}
        }
    }
    Some(counts)
}

/// The guest script: start the driver, wait for Probe, run every mode (each output to its log).
fn guest_script(lvms: &Path, sanity: &Path, out: &Path, modes: &[&Mode]) -> String {
    let q = |p: &Path| vm::shell_quote(&p.to_string_lossy());
    let mut s = String::from("set -u\n");
    let _ = writeln!(s, "out={} lvms={} sanity={}", q(out), q(lvms), q(sanity));
    let _ = writeln!(s, "sock={SOCKET}");
    s.push_str(
        r#"status=0
driver=
start_driver() {
  LVMS_LOG="${LVMS_LOG:-warn}" "$lvms" standalone --config "$out/$1.yaml" --endpoint "$sock" \
    --node-id sanity-node 2>"$out/$1.log" &
  driver=$!
  i=0
  until "$lvms" csi --endpoint "$sock" probe >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 300 ]; then
      echo "sanity: the $1 driver did not become ready"; tail -n 40 "$out/$1.log"; kill $driver; exit 1
    fi
    sleep 1
  done
}
stop_driver() {
  kill $driver; wait $driver 2>/dev/null
}
run_mode() {
  mode=$1; shift
  dir=/run/sanity/$mode
  mkdir -p "$dir"
  echo "== csi-sanity: $mode"
  "$sanity" --csi.endpoint "$sock" --csi.mountdir "$dir/mount" --csi.stagingdir "$dir/staging" \
    --ginkgo.no-color --ginkgo.timeout=40m "$@" >"$out/$mode.log" 2>&1 || status=1
  # The failures ginkgo summarises at the end, and its counts.
  sed -n '/^Summarizing/,$p' "$out/$mode.log" | grep -v '^\s*$' | head -n 60
  grep -E 'Passed \| [0-9]+ Failed' "$out/$mode.log" || echo "csi-sanity $mode did not finish"
}
"#,
    );
    for shared in [false, true] {
        if !modes.iter().any(|m| m.shared == shared) {
            continue;
        }
        if shared {
            // The shared class's lock managers run as host services would (the driver only checks
            // them), lvmlockd with a short sanlock io timeout (5 s, not 10): the lockspace joins
            // wait a few io timeouts, and csi-sanity checks no timing.
            s.push_str(
                "mkdir -p /run/sanlock /run/lvm\n\
                 sanlock daemon -w 0 -U root -G root\n\
                 for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done\n\
                 lvmlockd -g sanlock -o 5\n\
                 for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done\n\
                 start_driver shared\n",
            );
        } else {
            s.push_str("start_driver standalone\n");
        }
        for mode in modes.iter().filter(|m| m.shared == shared) {
            let _ = write!(
                s,
                "run_mode {} --csi.testvolumesize={VOLUME_SIZE} --csi.testvolumeexpandsize={EXPAND_SIZE} \
                 --csi.testvolumeparameters=\"$out/{}.params.yaml\"",
                mode.name, mode.name
            );
            for f in mode.flags {
                let _ = write!(s, " {}", vm::shell_quote(f));
            }
            s.push('\n');
        }
        s.push_str("stop_driver\n");
    }
    s.push_str("exit $status\n");
    s
}

/// `cargo xtask sanity`.
pub fn run(repo: &Path, shared_thin: bool, only: &[String]) -> Result<ExitCode> {
    if let Some(unknown) = only
        .iter()
        .find(|o| !MODES.iter().any(|m| m.name == o.as_str()))
    {
        bail!(
            "--only {unknown}: no such mode; the modes are {}",
            MODES.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
        );
    }
    let modes: Vec<&Mode> = MODES
        .iter()
        .filter(|m| {
            if only.is_empty() {
                shared_thin || !m.extra
            } else {
                only.iter().any(|o| o == m.name)
            }
        })
        .collect();
    let sanity = crate::cluster::assets(repo, &["csi-sanity"])?.join("csi-sanity");
    // The workspace's tests build target/debug/lvms with the features the VM suite uses, so
    // `cargo xtask test` builds nothing twice.
    Artifacts::get(repo)?;
    let lvms = artifacts::lvms(repo);
    // One directory per set of modes: `cargo xtask test` runs the local and the shared modes side
    // by side.
    let group = if modes.iter().all(|m| m.shared) {
        "shared"
    } else if modes.iter().all(|m| !m.shared) {
        "local"
    } else {
        "all"
    };
    let out = repo.join("target/sanity").join(group);
    if out.exists() {
        fs::remove_dir_all(&out)?;
    }
    fs::create_dir_all(&out)?;
    fs::write(out.join("standalone.yaml"), CONFIG)?;
    fs::write(out.join("shared.yaml"), SHARED_CONFIG)?;
    for mode in &modes {
        fs::write(
            out.join(format!("{}.params.yaml", mode.name)),
            format!("topolvm.io/device-class: {}\n{}", mode.class, mode.params),
        )?;
    }
    let script = out.join("guest.sh");
    fs::write(&script, guest_script(&lvms, &sanity, &out, &modes))?;
    let disks = vm::disks(
        repo,
        &[
            "sanity-thin=4096",
            "sanity-thick=4096",
            "sanity-raid-a=2048",
            "sanity-raid-b=2048",
            "sanity-shared=8192",
        ],
    )?;
    // `LVMS_LOG=lvms_host=debug` logs every command with its duration in the drivers' logs.
    let spec = VmSpec::new(
        "sanity",
        repo,
        format!("sh {}", vm::shell_quote(&script.to_string_lossy())),
    )
    .disks(disks)
    .env_from_host(&["LVMS_LOG"])
    .timeout(Duration::from_secs(90 * 60));
    let outcome = vm::run_all(repo, vec![spec])?.remove(0);

    let mut total = Counts::default();
    let mut unfinished = Vec::new();
    for mode in &modes {
        let log = fs::read_to_string(out.join(format!("{}.log", mode.name))).unwrap_or_default();
        match parse_summary(&log) {
            Some(c) => {
                println!(
                    "csi-sanity {}: {} passed, {} failed, {} skipped",
                    mode.name, c.passed, c.failed, c.skipped
                );
                total.add(c);
            }
            None => {
                println!("csi-sanity {}: did not finish", mode.name);
                unfinished.push(mode.name);
            }
        }
    }
    println!("csi-sanity: {total}");
    if !unfinished.is_empty() {
        bail!(
            "csi-sanity did not finish in mode(s) {} (see target/sanity/)",
            unfinished.join(", ")
        );
    }
    if total.failed > 0 || outcome.exit_code != Some(0) {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ginkgo_summaries_are_counted_with_pending_as_skipped() {
        let out = "Ran 52 of 94 Specs in 30.512 seconds\n\
                   FAIL! -- 50 Passed | 2 Failed | 1 Pending | 41 Skipped\n--- FAIL: TestSanity\n";
        assert_eq!(
            parse_summary(out),
            Some(Counts {
                passed: 50,
                failed: 2,
                skipped: 42
            })
        );
        let ok = "SUCCESS! -- 60 Passed | 0 Failed | 0 Pending | 34 Skipped\nPASS\n";
        assert_eq!(parse_summary(ok).map(|c| c.failed), Some(0));
        assert_eq!(parse_summary("panic: no connection\n"), None);
    }
}
