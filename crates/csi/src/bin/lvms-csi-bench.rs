//! The CSI driver's benchmark, run inside the test VM by `cargo xtask bench` (not a timed test): in one
//! run, on one volume group, it measures raw LVM and the driver and prints the ratios.
//!
//! 1. sequential thin `CreateVolume` (50 volumes) ÷ 50 sequential raw `lvm lvcreate` processes
//!    (target ≤ 1.0×), and the same for deletion;
//! 2. 32-way concurrent `CreateVolume` (64 volumes) throughput ÷ sequential raw throughput (target
//!    ≥ 1.0×) with p50/p95 latency (target p95 ≤ 2× p50);
//! 3. with 500 thin LVs in the pool, the idle `lvms standalone` process: its RSS (target ≤ 15 MiB) and
//!    the LVM processes it spawns in one idle minute while a CO polls `GetCapacity` and `ListVolumes`
//!    every 10 s (target ≤ 1).
//!
//! `--raid-thin` measures a RAID thin class against a plain thin class instead (ADR 0031), both
//! built by the engine's converge on disks of their own (`raid-plain`, `raid-a` and `raid-b`):
//! thin `CreateVolume`, `CreateSnapshot` and sequential direct writes, and prints the ratios.
//!
//! `--scale N` runs the scale check instead (outside CI): `lvms converge` builds the volume group and
//! thin pool with the LVMCluster defaults (Host metadata policy), N thin volumes are made in batches
//! through one `lvm` process (not activated), and the time of single `lvcreate` processes and of the driver's
//! `CreateVolume` is printed at 0 and at N volumes, with the metadata room left.
//!
//! `--cbt` measures changed-block tracking instead (ADR 0039): a 1 GiB thin volume written whole,
//! snapshotted, 1 % of its 64 KiB chunks rewritten at random places, snapshotted again; the time of
//! the engine's delta between the two snapshots (`thin_delta` on a metadata snapshot) against
//! reading the whole second snapshot, as a backup without changed-block tracking would, and against
//! reading only the changed ranges.
//!
//! The driver runs with its LVM commands in one long-lived `lvm` shell process, as `lvms standalone`
//! does (`--runner process`: a process per command).
//!
//! Usage: `lvms-csi-bench --device /dev/... --lvms /path/to/lvms [--runner shell|process]` (destroys
//! what is on the device).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use lvms_csi::{
    controller::ControllerService,
    csi::{
        CapacityRange, CreateVolumeRequest, DeleteVolumeRequest, GetCapacityRequest,
        ListVolumesRequest, VolumeCapability,
        controller_client::ControllerClient,
        volume_capability::{self, AccessMode, MountVolume, access_mode::Mode},
    },
    identity::{Converged, IdentityService},
    server::{self, Services},
};
use lvms_engine::{
    backend::{Backend, DeviceClassConfig, NewSnapshot, NewVolume},
    local::LocalBackend,
};
use lvms_host::{lvm::Lvm, runner::Runner};
use tonic::transport::Channel;

const VG: &str = "benchvg";
const POOL: &str = "pool";
const SEQ: usize = 50;
const CONC_VOLUMES: usize = 64;
const CONCURRENCY: usize = 32;
const IDLE_LVS: usize = 500;

fn sh(cmd: &str) -> String {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn cap() -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(volume_capability::AccessType::Mount(MountVolume::default())),
    }
}

fn create(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        ..CreateVolumeRequest::default()
    }
}

fn classes() -> Vec<DeviceClassConfig> {
    vec![
        DeviceClassConfig::named(VG)
            .with_thin_pool(POOL, 100)
            .as_default(),
    ]
}

/// The Controller service over `runner` on a socket; returns a client and the stop signal.
async fn driver<R: Runner + Clone>(
    runner: R,
    dir: &Path,
) -> (ControllerClient<Channel>, tokio::sync::oneshot::Sender<()>) {
    let backend = Arc::new(LocalBackend::new("bench", classes(), Lvm::new(runner)));
    assert!(backend.ready().await.unwrap());
    let socket = dir.join("csi.sock");
    let listener = server::bind(&socket).unwrap();
    let converged = Converged::default();
    converged.set(true);
    let services: Services<LocalBackend<R>, lvms_csi::node::NodeService<LocalBackend<R>, R>> =
        Services {
            snapshot_metadata: None,
            identity: IdentityService::new("topolvm.io", true, backend.clone(), converged),
            controller: Some(ControllerService::new(backend)),
            node: None,
        };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        server::serve(listener, services, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let channel = server::connect(&socket).await.unwrap();
    (ControllerClient::new(channel), stop)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

async fn bench_driver<R: Runner + Clone>(
    runner: R,
    label: &str,
    raw_create: Duration,
    raw_remove: Duration,
) {
    let dir = tempdir(label);
    let (mut client, stop) = driver(runner, &dir).await;

    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..SEQ {
        let v = client
            .create_volume(create(&format!("seq-{i}")))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids.push(v.volume_id);
    }
    let seq_create = started.elapsed();
    let started = Instant::now();
    for id in &ids {
        client
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
    }
    let seq_delete = started.elapsed();

    // 32-way concurrent creates.
    let started = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = Vec::new();
    for i in 0..CONC_VOLUMES {
        let mut c = client.clone();
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = sem.acquire().await.unwrap();
            let t = Instant::now();
            let v = c
                .create_volume(create(&format!("conc-{i}")))
                .await
                .unwrap()
                .into_inner()
                .volume
                .unwrap();
            (t.elapsed(), v.volume_id)
        }));
    }
    let mut latencies = Vec::new();
    let mut conc_ids = Vec::new();
    for t in tasks {
        let (lat, id) = t.await.unwrap();
        latencies.push(lat);
        conc_ids.push(id);
    }
    let conc_wall = started.elapsed();
    latencies.sort();
    for id in &conc_ids {
        client
            .delete_volume(DeleteVolumeRequest {
                volume_id: id.clone(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
    }
    let _ = stop.send(());

    let raw_rate = SEQ as f64 / raw_create.as_secs_f64();
    let conc_rate = CONC_VOLUMES as f64 / conc_wall.as_secs_f64();
    let (p50, p95) = (percentile(&latencies, 0.5), percentile(&latencies, 0.95));
    println!("\n-- driver with the {label} runner");
    println!(
        "sequential CreateVolume x{SEQ}: {} ; ratio to raw lvcreate: {:.2}x (target <= 1.0x)",
        secs(seq_create),
        seq_create.as_secs_f64() / raw_create.as_secs_f64()
    );
    println!(
        "sequential DeleteVolume x{SEQ}: {} ; ratio to raw lvremove: {:.2}x",
        secs(seq_delete),
        seq_delete.as_secs_f64() / raw_remove.as_secs_f64()
    );
    println!(
        "{CONCURRENCY}-way concurrent CreateVolume x{CONC_VOLUMES}: {} ; throughput {conc_rate:.2}/s vs raw sequential {raw_rate:.2}/s = {:.2}x (target >= 1.0x)",
        secs(conc_wall),
        conc_rate / raw_rate
    );
    println!(
        "  latency p50 {} p95 {} : p95/p50 = {:.2} (target <= 2)",
        secs(p50),
        secs(p95),
        p95.as_secs_f64() / p50.as_secs_f64()
    );
}

fn tempdir(label: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/tmp/lvms-bench-{label}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// RSS of `pid` in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

async fn bench_idle(lvms: &str, device: &str) {
    // 500 thin LVs of ours, made through one lvm process, not activated (activation-skip flag, as thin
    // snapshots): the driver's reports list them all the same, and activating them takes long under TCG.
    let mut script = String::new();
    for i in 0..IDLE_LVS {
        let name = lvms_engine::ids::volume_lv_name(&format!("idle-{i}"));
        script.push_str(&format!(
            "lvcreate --yes --type thin --virtualsize 16m --thinpool {POOL} --setactivationskip y --addtag lvms --addtag {} --name {name} {VG}\n",
            lvms_engine::ids::name_tag(&format!("idle-{i}"))
        ));
    }
    let dir = tempdir("idle");
    std::fs::write(dir.join("create.lvm"), script).unwrap();
    let t = Instant::now();
    sh(&format!("lvm < {}/create.lvm > /dev/null", dir.display()));
    println!(
        "\n-- idle standalone with {IDLE_LVS} thin LVs (made in {} through one lvm process)",
        secs(t.elapsed())
    );

    // An `lvm` on PATH that logs every start.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let real = sh("command -v lvm").trim().to_owned();
    let log = dir.join("lvm-starts.log");
    std::fs::write(
        bin.join("lvm"),
        format!(
            "#!/bin/sh\necho \"$(date +%s.%N) $1\" >> {}\nexec {real} \"$@\"\n",
            log.display()
        ),
    )
    .unwrap();
    sh(&format!("chmod +x {}/lvm", bin.display()));
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "deviceClasses:\n  - name: {VG}\n    default: true\n    deviceSelector:\n      paths: [{device}]\n    thinPoolConfig:\n      name: {POOL}\n      sizePercent: 90\n      overprovisionRatio: 100\n"
        ),
    )
    .unwrap();
    let socket = dir.join("csi.sock");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut child = tokio::process::Command::new(lvms)
        .args(["standalone", "--config"])
        .arg(&config)
        .arg("--endpoint")
        .arg(&socket)
        .args(["--node-id", "bench"])
        .env("PATH", path)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let channel = ready_channel(&socket).await;
    let mut client = ControllerClient::new(channel);
    // Warm the cache as a CO would at start, then measure one idle minute of polling.
    let listed = client
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries
        .len();
    let starts_before = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        client
            .get_capacity(GetCapacityRequest::default())
            .await
            .unwrap();
        client
            .list_volumes(ListVolumesRequest::default())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let starts = std::fs::read_to_string(&log).unwrap_or_default();
    let during: Vec<&str> = starts.lines().skip(starts_before).collect();
    let rss = rss_kib(pid);
    let _ = child.kill().await;
    println!("ListVolumes saw {listed} volumes");
    println!(
        "LVM processes started in one idle minute (GetCapacity + ListVolumes every 10 s): {} (target <= 1){}",
        during.len(),
        if during.is_empty() {
            String::new()
        } else {
            format!(": {}", during.join(", "))
        }
    );
    println!(
        "idle RSS of lvms standalone: {:.1} MiB (target <= 15 MiB)",
        rss as f64 / 1024.0
    );
}

/// Mean time of `n` single `lvm lvcreate` processes of 16 MiB thin volumes named `<prefix><i>`.
fn timed_lvcreates(prefix: &str, n: usize) -> Duration {
    let started = Instant::now();
    for i in 0..n {
        sh(&format!(
            "lvm lvcreate --yes --type thin --virtualsize 16m --thinpool {POOL} --addtag lvms --name {prefix}{i} {VG} >/dev/null"
        ));
    }
    started.elapsed() / u32::try_from(n).unwrap()
}

/// Removes LVM's metadata archives (the VM keeps them on a small tmpfs).
fn clear_archive() {
    let dir = std::env::var("LVM_SYSTEM_DIR").unwrap_or_else(|_| "/etc/lvm".into());
    sh(&format!("find {dir}/archive -type f -delete"));
}

/// The number of LVs in the bench volume group (the pool included).
fn count_lvs() -> usize {
    sh(&format!("lvm vgs --noheadings -o lv_count {VG}"))
        .trim()
        .parse()
        .unwrap()
}

/// Pool metadata use and the volume group's metadata room, as LVM reports them.
fn metadata_room() -> String {
    let pool = sh(&format!(
        "lvm lvs --noheadings --units b --nosuffix -o lv_metadata_size,metadata_percent,data_percent {VG}/{POOL}"
    ));
    let vg = sh(&format!(
        "lvm vgs --noheadings --units b --nosuffix -o lv_count,vg_mda_size,vg_mda_free {VG}"
    ));
    let p: Vec<&str> = pool.split_whitespace().collect();
    let v: Vec<&str> = vg.split_whitespace().collect();
    format!(
        "pool metadata {} MiB, {}% used (data {}% used); volume group: {} LVs, metadata area {} KiB, {} KiB free",
        p[0].parse::<u64>().unwrap() >> 20,
        p[1],
        p[2],
        v[0],
        v[1].parse::<u64>().unwrap() >> 10,
        v[2].parse::<u64>().unwrap() >> 10,
    )
}

/// Mean `CreateVolume` time of `n` volumes through `lvms standalone` on `config`, and the number of
/// volumes `ListVolumes` then reports.
async fn timed_driver_creates(
    lvms: &str,
    config: &Path,
    prefix: &str,
    n: usize,
) -> (Duration, usize) {
    let dir = tempdir(&format!("scale-{prefix}"));
    let socket = dir.join("csi.sock");
    let mut child = tokio::process::Command::new(lvms)
        .args(["standalone", "--config"])
        .arg(config)
        .arg("--endpoint")
        .arg(&socket)
        .args(["--node-id", "bench"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let channel = ready_channel(&socket).await;
    let mut client = ControllerClient::new(channel);
    // The first call takes the full report; time the creates after it.
    client
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..n {
        let mut req = create(&format!("{prefix}-{i}"));
        req.capacity_range = Some(CapacityRange {
            required_bytes: 16 << 20,
            limit_bytes: 0,
        });
        client.create_volume(req).await.unwrap();
    }
    let mean = started.elapsed() / u32::try_from(n).unwrap();
    let mut listed = 0;
    let mut token = String::new();
    loop {
        let page = client
            .list_volumes(ListVolumesRequest {
                max_entries: 0,
                starting_token: token,
            })
            .await
            .unwrap()
            .into_inner();
        listed += page.entries.len();
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let _ = child.kill().await;
    (mean, listed)
}

/// A channel to the driver at `socket` once its Probe answers ready.
async fn ready_channel(socket: &Path) -> Channel {
    loop {
        if let Ok(c) = server::connect(socket).await {
            let mut id = lvms_csi::csi::identity_client::IdentityClient::new(c.clone());
            if let Ok(r) = id.probe(lvms_csi::csi::ProbeRequest {}).await
                && r.into_inner().ready == Some(true)
            {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The scale check: N thin volumes in one class built with the defaults.
async fn scale(lvms: &str, device: &str, n: usize) {
    let dir = tempdir("scale");
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "deviceClasses:\n  - name: {VG}\n    default: true\n    deviceSelector:\n      paths: [{device}]\n    thinPoolConfig:\n      name: {POOL}\n      sizePercent: 90\n      overprovisionRatio: 10\n      metadataSizeCalculationPolicy: Host\n      chunkSizeCalculationPolicy: Host\n"
        ),
    )
    .unwrap();
    sh(&format!("wipefs -a -q {device}"));
    sh(&format!(
        "{lvms} converge --config {} >/dev/null",
        config.display()
    ));
    println!(
        "scale check: {n} thin volumes, class built by `lvms converge` with the Host policies"
    );
    println!("at 0 volumes: {}", metadata_room());
    let at_zero = timed_lvcreates("first", 5);
    let (driver_zero, _) = timed_driver_creates(lvms, &config, "first", 5).await;
    println!(
        "at 0 volumes: lvcreate process {:.0} ms, driver CreateVolume {:.0} ms (means of 5)",
        at_zero.as_secs_f64() * 1000.0,
        driver_zero.as_secs_f64() * 1000.0
    );
    // Ten volumes so far (five by lvcreate, five by the driver); the rest through one lvm process, in
    // batches of 250, with their times. They are made with the
    // activation-skip flag, as thin snapshots are, so they are not activated: the check is about LVM
    // metadata (thin devices are created in the pool either way), and activating thousands of devices
    // under TCG would take hours. The timed creates above and below are ordinary, active volumes.
    let made = 10;
    // LVs besides the volumes (the pool).
    let made_before = count_lvs() - made;
    let mut i = made;
    while i < n {
        let batch = (n - i).min(250);
        let mut script = String::new();
        for j in i..i + batch {
            let name = lvms_engine::ids::volume_lv_name(&format!("scale-{j}"));
            script.push_str(&format!(
                "lvcreate --yes --type thin --virtualsize 16m --thinpool {POOL} --setactivationskip y --addtag lvms --addtag {} --name {name} {VG}\n",
                lvms_engine::ids::name_tag(&format!("scale-{j}"))
            ));
        }
        std::fs::write(dir.join("batch.lvm"), script).unwrap();
        // LVM archives the whole volume group metadata before each change; with thousands of volumes the
        // archives fill the VM's tmpfs (`/run/lvm-etc/archive`), so the old ones go between batches.
        clear_archive();
        let t = Instant::now();
        sh(&format!("lvm < {}/batch.lvm > /dev/null", dir.display()));
        let have = count_lvs();
        assert_eq!(
            have,
            i + made_before + batch,
            "some creates of the batch failed (the lvm shell goes on after a failure)"
        );
        i += batch;
        println!(
            "  {i} volumes: the last {batch} took {:.0} ms each through one lvm process",
            t.elapsed().as_secs_f64() * 1000.0 / batch as f64
        );
    }
    println!("at {n} volumes: {}", metadata_room());
    clear_archive();
    let at_n = timed_lvcreates("last", 5);
    let (driver_n, listed) = timed_driver_creates(lvms, &config, "last", 5).await;
    println!(
        "at {n} volumes: lvcreate process {:.0} ms ({:.2}x the time at 0), driver CreateVolume {:.0} ms \
         ({:.2}x); ListVolumes reports {listed} volumes",
        at_n.as_secs_f64() * 1000.0,
        at_n.as_secs_f64() / at_zero.as_secs_f64(),
        driver_n.as_secs_f64() * 1000.0,
        driver_n.as_secs_f64() / driver_zero.as_secs_f64()
    );
    println!("at {} volumes: {}", n + 10, metadata_room());
}

/// One class of the `--raid-thin` comparison: a thin pool of 90% on `paths` (RAID1 with `raid`),
/// 64 MiB of metadata.
fn bench_class(name: &str, paths: &[&str], raid: bool) -> DeviceClassConfig {
    let mut class = DeviceClassConfig::named(name).with_thin_pool(POOL, 10);
    class.device_selector.paths = paths
        .iter()
        .map(|p| format!("/dev/disk/by-id/virtio-{p}"))
        .collect();
    if raid {
        class.raid_config = Some(lvms_core::config::RaidConfig {
            raid_type: lvms_core::config::RaidType::Raid1,
            mirrors: None,
            stripes: None,
            stripe_size: None,
        });
    }
    let tp = class.thin_pool_config.as_mut().unwrap();
    tp.metadata_size_calculation_policy = lvms_core::config::CalculationPolicy::Static;
    tp.metadata_size = Some(lvms_core::size::ByteSize(64 << 20));
    class
}

/// What one class measured in `--raid-thin`.
struct ClassRun {
    create: Duration,
    snapshot: Duration,
    write_mib_s: f64,
}

const RAID_BENCH_VOLUMES: usize = 20;
const RAID_BENCH_WRITE_MIB: u64 = 256;

async fn raid_thin_class_run<R: Runner + Clone>(b: &LocalBackend<R>, class: &str) -> ClassRun {
    let req = |name: String, size: u64| NewVolume {
        name,
        class: class.to_owned(),
        size,
        lv_type: None,
        volume_mode: None,
        source: None,
        ephemeral: None,
    };
    let started = Instant::now();
    let mut first = None;
    for i in 0..RAID_BENCH_VOLUMES {
        let v = b
            .create_volume(&req(format!("{class}-v{i}"), 64 << 20))
            .await
            .unwrap();
        first.get_or_insert(v.id);
    }
    let create = started.elapsed();
    let origin = first.unwrap();
    let started = Instant::now();
    for i in 0..RAID_BENCH_VOLUMES {
        b.create_snapshot(&NewSnapshot {
            name: format!("{class}-s{i}"),
            source_volume: origin.clone(),
        })
        .await
        .unwrap();
    }
    let snapshot = started.elapsed();
    let big = b
        .create_volume(&req(format!("{class}-w"), RAID_BENCH_WRITE_MIB << 20))
        .await
        .unwrap();
    let started = Instant::now();
    sh(&format!(
        "dd if=/run/lvms-raid-bench.data of={} bs=1M oflag=direct conv=fsync status=none",
        big.device
    ));
    let write = started.elapsed();
    ClassRun {
        create,
        snapshot,
        write_mib_s: RAID_BENCH_WRITE_MIB as f64 / write.as_secs_f64(),
    }
}

/// `--raid-thin`: the cost of a RAID1 thin pool against a plain one, measured in one run.
async fn raid_thin() {
    static RUNNER: lvms_host::runner::RealRunner = lvms_host::runner::RealRunner;
    let host = lvms_host::engine::RealNodeHost::new(&RUNNER);
    let plain = bench_class("benchthin", &["raid-plain"], false);
    let raid = bench_class("benchraid", &["raid-a", "raid-b"], true);
    for class in [&plain, &raid] {
        let report = lvms_host::engine::converge(&host, class).await.unwrap();
        assert!(report.is_ready(), "{}: {:?}", class.name, report.plan.state);
    }
    let started = Instant::now();
    while sh("lvm lvs -a --noheadings -o sync_percent benchraid/pool_tdata benchraid/pool_tmeta")
        .split_whitespace()
        .any(|p| p != "100.00")
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let pool = |vg: &str| {
        sh(&format!(
            "lvm lvs --noheadings --units m -o lv_size {vg}/{POOL}"
        ))
    };
    println!(
        "raid-thin: plain thin pool {} on 1 disk, raid1 thin pool {} on 2 disks of 2 GiB; the raid1 \
         pool's initial sync took {}",
        pool("benchthin").trim(),
        pool("benchraid").trim(),
        secs(started.elapsed())
    );
    sh(&format!(
        "head -c {} /dev/urandom > /run/lvms-raid-bench.data",
        RAID_BENCH_WRITE_MIB << 20
    ));
    let b = LocalBackend::new(
        "bench",
        vec![plain, raid],
        Lvm::new(Arc::new(lvms_host::shell::LvmShell::new())),
    );
    let thin = raid_thin_class_run(&b, "benchthin").await;
    let mirrored = raid_thin_class_run(&b, "benchraid").await;
    sh("rm -f /run/lvms-raid-bench.data");
    println!("| measure | thin | raid1 thin | raid1 ÷ thin |");
    println!("|---|---|---|---|");
    for (what, a, b) in [
        (
            format!("{RAID_BENCH_VOLUMES} sequential thin CreateVolume"),
            thin.create,
            mirrored.create,
        ),
        (
            format!("{RAID_BENCH_VOLUMES} sequential CreateSnapshot"),
            thin.snapshot,
            mirrored.snapshot,
        ),
    ] {
        println!(
            "| {what} | {} | {} | {:.2}× |",
            secs(a),
            secs(b),
            b.as_secs_f64() / a.as_secs_f64()
        );
    }
    println!(
        "| sequential direct write, {RAID_BENCH_WRITE_MIB} MiB | {:.1} MiB/s | {:.1} MiB/s | {:.2}× |",
        thin.write_mib_s,
        mirrored.write_mib_s,
        mirrored.write_mib_s / thin.write_mib_s
    );
}

/// `--cbt`: see the module documentation.
async fn cbt(device: &str) {
    const CHUNK: u64 = 64 << 10;
    const SIZE: u64 = 1 << 30;
    sh(&format!(
        "lvm pvcreate -q -y -ff {device} && lvm vgcreate -q --addtag lvms {VG} {device} && \
         lvm lvcreate -q --yes --type thin-pool --size 4g --chunksize 64k --zero n \
         --poolmetadatasize 64m --name {POOL} {VG}"
    ));
    let b = LocalBackend::new(
        "bench",
        classes(),
        Lvm::new(Arc::new(lvms_host::shell::LvmShell::new())),
    );
    let volume = b
        .create_volume(&NewVolume {
            name: "cbt".into(),
            class: VG.into(),
            size: SIZE,
            lv_type: None,
            volume_mode: None,
            source: None,
            ephemeral: None,
        })
        .await
        .unwrap();
    let dev = format!("/dev/{VG}/{}", volume.id);
    let started = Instant::now();
    sh(&format!(
        "dd if=/dev/zero of={dev} bs=1M count=1024 oflag=direct status=none"
    ));
    println!("cbt: 1 GiB written in {}", secs(started.elapsed()));
    let snapshot = |name: &str| NewSnapshot {
        name: name.into(),
        source_volume: volume.id.clone(),
    };
    let base = b.create_snapshot(&snapshot("cbt-base")).await.unwrap();
    // 1 % of the chunks, spread by a fixed stride (no two the same).
    let chunks = SIZE / CHUNK;
    let changed: Vec<u64> = (0..chunks / 100).map(|i| (i * 6151) % chunks).collect();
    for c in &changed {
        sh(&format!(
            "dd if=/dev/urandom of={dev} bs=64k count=1 seek={c} oflag=direct conv=notrunc status=none"
        ));
    }
    let target = b.create_snapshot(&snapshot("cbt-target")).await.unwrap();
    let started = Instant::now();
    let delta = b.changed(&base.id, &target.id).await.unwrap();
    let delta_time = started.elapsed();
    let found: u64 = delta.ranges.iter().map(|r| r.1).sum::<u64>() / CHUNK;
    println!(
        "cbt: delta of {} ranges, {found} chunks ({} written)",
        delta.ranges.len(),
        changed.len()
    );
    let started = Instant::now();
    let allocated = b.allocated(&target.id).await.unwrap();
    let allocated_time = started.elapsed();
    sh(&format!("lvm lvchange -ay -K {VG}/{}", target.id));
    let target_dev = format!("/dev/{VG}/{}", target.id);
    // Both reads in this process, each after the guest's page cache is dropped.
    let read = |ranges: &[(u64, u64)]| {
        use std::os::unix::fs::FileExt;
        sh("sync; echo 3 > /proc/sys/vm/drop_caches");
        let file = std::fs::File::open(&target_dev).unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let started = Instant::now();
        for &(offset, length) in ranges {
            let mut done = 0;
            while done < length {
                let n = (length - done).min(buf.len() as u64) as usize;
                file.read_exact_at(&mut buf[..n], offset + done).unwrap();
                done += n as u64;
            }
        }
        started.elapsed()
    };
    let whole = read(&[(0, SIZE)]);
    let ranges_only = read(&delta.ranges);
    println!("| 1 GiB thin volume, 1 % changed | time | ÷ reading the whole snapshot |");
    println!("|---|---|---|");
    let ratio = |d: Duration| d.as_secs_f64() / whole.as_secs_f64();
    println!(
        "| delta (GetMetadataDelta's engine call) | {} | {:.3}× |",
        secs(delta_time),
        ratio(delta_time)
    );
    println!(
        "| allocated ({} ranges) | {} | {:.3}× |",
        allocated.ranges.len(),
        secs(allocated_time),
        ratio(allocated_time)
    );
    println!("| reading the whole snapshot | {} | 1× |", secs(whole));
    println!(
        "| reading only the changed ranges | {} | {:.3}× |",
        secs(ranges_only),
        ratio(ranges_only)
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if std::env::args().any(|a| a == "--raid-thin") {
        raid_thin().await;
        return;
    }
    if std::env::args().any(|a| a == "--cbt") {
        let device = arg("--device").expect("--device /dev/... is required");
        cbt(&device).await;
        return;
    }
    let device = arg("--device").expect("--device /dev/... is required");
    let lvms = arg("--lvms").expect("--lvms /path/to/lvms is required");
    if let Some(n) = arg("--scale") {
        scale(&lvms, &device, n.parse().expect("--scale takes a number")).await;
        return;
    }
    println!("lvms-csi-bench on {device}");
    sh(&format!(
        "lvm pvcreate -q -y -ff {device} && lvm vgcreate -q --addtag lvms {VG} {device} && \
         lvm lvcreate -q --yes --type thin-pool --extents 90%FREE --poolmetadatasize 64m --name {POOL} {VG}"
    ));

    // Raw LVM: one process per command.
    let started = Instant::now();
    for i in 0..SEQ {
        sh(&format!(
            "lvm lvcreate --yes --type thin --virtualsize 64m --thinpool {POOL} --name raw{i} {VG} >/dev/null"
        ));
    }
    let raw_create = started.elapsed();
    let started = Instant::now();
    for i in 0..SEQ {
        sh(&format!("lvm lvremove --yes {VG}/raw{i} >/dev/null"));
    }
    let raw_remove = started.elapsed();
    println!(
        "raw: {SEQ} sequential lvcreate processes {} ({:.0} ms each), {SEQ} lvremove {}",
        secs(raw_create),
        raw_create.as_secs_f64() * 1000.0 / SEQ as f64,
        secs(raw_remove)
    );

    // The driver as `lvms standalone` runs it: its LVM commands in one long-lived shell process.
    // `--runner process` measures it with a process per command instead.
    if arg("--runner").as_deref() == Some("process") {
        bench_driver(
            Arc::new(lvms_host::runner::RealRunner),
            "process",
            raw_create,
            raw_remove,
        )
        .await;
    } else {
        bench_driver(
            Arc::new(lvms_host::shell::LvmShell::new()),
            "shell",
            raw_create,
            raw_remove,
        )
        .await;
    }
    bench_idle(&lvms, &device).await;
}
