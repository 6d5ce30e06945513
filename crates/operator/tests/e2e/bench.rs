//! The benchmark on the [`stack`](crate::stack) (`cargo xtask e2e --bench`: a release build of
//! lvms, output shown). It prints, measured in one run on one VM:
//!
//! - PVC-to-Bound time on the real control plane ÷ CreateVolume time of `lvms standalone` on
//!   another disk of the same VM (target ≤ 1.0× with the client's start subtracted), and the
//!   median of each step between (from watches in this process);
//! - API requests per idle minute of each component, from the API server's audit log (target: no
//!   write but Lease renewals);
//! - the node agent's, the operator's and the CSI controller's resident memory with no volume and
//!   with 500 (targets: agent 12 MiB idle and 20 MiB at 500, operator 20 MiB, controller 24 MiB).
//!
//! It asserts only that the measurements could be taken; the numbers are for people to read.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use lvms_api::{LOGICAL_VOLUME_FINALIZER, topolvm::LogicalVolume};
use lvms_engine::ids;
use serde_json::json;

use crate::{
    idle,
    scenarios::{CLASS, scenario},
    stack::{self, NODE, SLOW, Stack},
    support::{self, eventually},
};

/// Claims timed one after another on each side.
const ROUNDS: usize = 10;
/// Volumes for the memory figures.
const VOLUMES: usize = 500;
/// The standalone driver's disk and files in the VM.
const STANDALONE_DISK: &str = "/dev/disk/by-id/virtio-e2e1";
const STANDALONE_DIR: &str = "/run/lvms-bench";

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

#[tokio::test]
async fn bench_provisioning_idle_requests_and_memory_on_the_real_control_plane() {
    if std::env::var("LVMS_E2E_BENCH").is_err() {
        eprintln!("the benchmark runs with `cargo xtask e2e --bench`");
        return;
    }
    let Some(guard) =
        stack::stack("bench_provisioning_idle_requests_and_memory_on_the_real_control_plane").await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let (client, ns) = scenario(stack, "lvms-e2e-bench").await;
    if std::env::var("LVMS_E2E_BENCH").as_deref() == Ok("memory") {
        // Only the memory figures (`cargo xtask e2e --bench --memory`).
        memory_with_volumes(stack, &client).await;
        ns.delete().await;
        return;
    }

    idle_requests().await;
    let bound = pvc_to_bound(&client, &ns.name).await;
    let (create, probe) = standalone_create_volume(stack).await;
    println!(
        "bench: PVC-to-Bound on the real control plane, median of {ROUNDS}: {bound:.2} s \
         (WaitForFirstConsumer: a Pod, the scheduler, external-provisioner, CreateVolume over a \
         LogicalVolume, the agent in the VM)"
    );
    println!(
        "bench: standalone CreateVolume in the same VM, median of {ROUNDS}: {create:.2} s, of \
         which {probe:.2} s is starting the `lvms csi` client (median Probe)"
    );
    println!(
        "bench: ratio PVC-to-Bound ÷ standalone CreateVolume: {:.2}× (client start subtracted: \
         {:.2}×; target ≤ 1.0×)",
        bound / create,
        bound / (create - probe).max(0.001)
    );
    memory_with_volumes(stack, &client).await;
    ns.delete().await;
}

/// The requests of one idle minute (the LVMCluster Ready, no claim changing), per component.
async fn idle_requests() {
    // Let what the LVMCluster's creation started settle.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let idle = idle::installed(idle::window(Duration::from_secs(60)).await);
    idle::print(
        &idle,
        "bench: in one idle minute (lvms-system's ServiceAccounts)",
    );
    for ((account, agent), r) in &idle {
        println!(
            "bench: {account} ({agent}) per idle minute: {} requests, writes but Lease renewals {:?} (target: none)",
            r.all,
            r.writes_but_leases()
        );
    }
}

/// When each step of one claim's provisioning was first seen (from watches, in this process).
#[derive(Clone, Debug, Default)]
struct Steps {
    /// The scheduler picked the node (`volume.kubernetes.io/selected-node` on the claim).
    selected: Option<Instant>,
    /// The CSI controller wrote the `LogicalVolume` (external-provisioner called CreateVolume).
    written: Option<Instant>,
    /// The node agent took it (its finalizer).
    taken: Option<Instant>,
    /// The LV made and the status written (`status.volumeID`).
    made: Option<Instant>,
    /// external-provisioner created the PersistentVolume.
    pv: Option<Instant>,
    /// The claim Bound.
    bound: Option<Instant>,
}

type StepLog = Arc<Mutex<HashMap<String, Steps>>>;

/// Watches claims in `ns`, every `LogicalVolume` and PersistentVolume, and records each step by
/// the volume's `LogicalVolume` name (the digest of `pvc-<claim uid>`, the CreateVolume name).
fn watch_steps(client: &Client, ns: &str) -> (StepLog, tokio::task::JoinHandle<()>) {
    enum Seen {
        Claim(Box<PersistentVolumeClaim>),
        Volume(Box<LogicalVolume>),
        Pv(Box<PersistentVolume>),
    }
    let log: StepLog = Arc::default();
    let config = watcher::Config::default();
    let claims = watcher(
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns),
        config.clone(),
    )
    .applied_objects()
    .map(|r| r.map(|c| Seen::Claim(Box::new(c))))
    .boxed();
    let volumes = watcher(Api::<LogicalVolume>::all(client.clone()), config.clone())
        .applied_objects()
        .map(|r| r.map(|lv| Seen::Volume(Box::new(lv))))
        .boxed();
    let pvs = watcher(Api::<PersistentVolume>::all(client.clone()), config)
        .applied_objects()
        .map(|r| r.map(|pv| Seen::Pv(Box::new(pv))))
        .boxed();
    let task = {
        let log = log.clone();
        tokio::spawn(async move {
            let mut all = futures::stream::select_all([claims, volumes, pvs]);
            while let Some(seen) = all.next().await {
                let now = Instant::now();
                let Ok(seen) = seen else { continue };
                let key = match &seen {
                    Seen::Claim(c) => c
                        .metadata
                        .uid
                        .as_ref()
                        .map(|u| ids::volume_lv_name(&format!("pvc-{u}"))),
                    Seen::Volume(lv) => lv.metadata.name.clone(),
                    Seen::Pv(pv) => pv.metadata.name.as_ref().map(|n| ids::volume_lv_name(n)),
                };
                let Some(key) = key else { continue };
                let mut log = log.lock().unwrap();
                let steps = log.entry(key).or_default();
                let first = |at: &mut Option<Instant>, yes: bool| {
                    if yes && at.is_none() {
                        *at = Some(now);
                    }
                };
                match seen {
                    Seen::Claim(c) => {
                        first(
                            &mut steps.selected,
                            c.annotations()
                                .contains_key("volume.kubernetes.io/selected-node"),
                        );
                        first(
                            &mut steps.bound,
                            c.status.and_then(|s| s.phase).as_deref() == Some("Bound"),
                        );
                    }
                    Seen::Volume(lv) => {
                        first(&mut steps.written, true);
                        first(
                            &mut steps.taken,
                            lv.finalizers()
                                .iter()
                                .any(|f| f == LOGICAL_VOLUME_FINALIZER),
                        );
                        first(
                            &mut steps.made,
                            lv.status.as_ref().is_some_and(|s| !s.volume_id.is_empty()),
                        );
                    }
                    Seen::Pv(_) => first(&mut steps.pv, true),
                }
            }
        })
    };
    (log, task)
}

/// PVC-to-Bound, one claim (and its Pod) after another; the median in seconds. Prints the
/// medians of the steps between.
async fn pvc_to_bound(client: &Client, ns: &str) -> f64 {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let (log, watching) = watch_steps(client, ns);
    // The watches' first lists.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut times = Vec::new();
    let mut steps = Vec::new();
    for i in 0..ROUNDS {
        let name = format!("b{i:02}");
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "lvms-vg1",
                     "resources": {"requests": {"storage": "64Mi"}}}
        }))
        .unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": name}}]}
        }))
        .unwrap();
        let started = Instant::now();
        let made = pvcs.create(&PostParams::default(), &pvc).await.unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        loop {
            let c = pvcs.get(&name).await.unwrap();
            if c.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                break;
            }
            assert!(started.elapsed() < SLOW, "the claim {name} was not Bound");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        times.push(started.elapsed().as_secs_f64());
        let key = ids::volume_lv_name(&format!("pvc-{}", made.metadata.uid.unwrap_or_default()));
        // The watches may hear the last step a moment after the poll above.
        tokio::time::sleep(Duration::from_millis(300)).await;
        steps.push((
            started,
            log.lock().unwrap().get(&key).cloned().unwrap_or_default(),
        ));
    }
    watching.abort();
    println!("bench: PVC-to-Bound times (s): {times:.2?}");
    print_steps(&steps);
    for i in 0..ROUNDS {
        let name = format!("b{i:02}");
        let _ = pods
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await;
        let _ = pvcs.delete(&name, &DeleteParams::default()).await;
    }
    median(times)
}

/// The medians of each step of the rounds, from the step before (the claim's creation first).
fn print_steps(rounds: &[(Instant, Steps)]) {
    let names = [
        "the scheduler picks the node",
        "external-provisioner's CreateVolume writes the LogicalVolume",
        "the node agent takes it (finalizer)",
        "the LV is made and the status written",
        "external-provisioner creates the PersistentVolume",
        "the claim is Bound",
    ];
    let mut medians = Vec::new();
    for step in 0..names.len() {
        let gaps: Vec<f64> = rounds
            .iter()
            .filter_map(|(start, s)| {
                let at = [s.selected, s.written, s.taken, s.made, s.pv, s.bound];
                let before = if step == 0 {
                    Some(*start)
                } else {
                    at[step - 1]
                };
                Some(at[step]?.saturating_duration_since(before?).as_secs_f64())
            })
            .collect();
        medians.push((
            names[step],
            gaps.len(),
            if gaps.is_empty() {
                f64::NAN
            } else {
                median(gaps)
            },
        ));
    }
    println!("bench: PVC-to-Bound, the median of each step after the one before:");
    for (name, seen, m) in medians {
        println!(
            "bench:   {name}: {:.0} ms ({seen} of {ROUNDS} rounds seen)",
            m * 1e3
        );
    }
}

/// `lvms standalone` on the VM's second disk, thin like the LVMCluster's class; the medians of
/// CreateVolume and of Probe through `lvms csi`, in seconds.
async fn standalone_create_volume(stack: &Stack) -> (f64, f64) {
    let lvms = std::env::var("LVMS_E2E_LVMS").unwrap();
    let config = format!(
        "deviceClasses:\n  - name: bench\n    default: true\n    fstype: xfs\n    deviceSelector:\n      \
         paths: [{STANDALONE_DISK}]\n    thinPoolConfig:\n      name: pool\n      sizePercent: 90\n      \
         overprovisionRatio: 10\n      metadataSizeCalculationPolicy: Host\n"
    );
    let (code, out) = stack
        .vm
        .sh_with(
            &format!("mkdir -p {STANDALONE_DIR} && cat > {STANDALONE_DIR}/config.yaml"),
            &config,
        )
        .await;
    assert_eq!(code, 0, "{out}");
    let sock = format!("{STANDALONE_DIR}/csi.sock");
    stack
        .vm
        .ok(&format!(
            "setsid {lvms} standalone --config {STANDALONE_DIR}/config.yaml --endpoint {sock} \
             --node-id bench > {STANDALONE_DIR}/standalone.log 2>&1 < /dev/null &"
        ))
        .await;
    stack
        .vm
        .ok(&format!(
            "i=0; until {lvms} csi --endpoint {sock} probe >/dev/null 2>&1; do i=$((i+1)); \
             [ $i -gt 300 ] && tail -n 30 {STANDALONE_DIR}/standalone.log && exit 1; sleep 1; done"
        ))
        .await;
    // Each call timed in the VM, in nanoseconds.
    let timed = |rpc: &str| {
        format!(
            "for i in $(seq 1 {ROUNDS}); do s=$(date +%s%N); {lvms} csi --endpoint {sock} {rpc} \
             >/dev/null || exit 1; e=$(date +%s%N); echo $((e - s)); done"
        )
    };
    let parse = |out: String| -> Vec<f64> {
        out.lines()
            .filter_map(|l| l.trim().parse::<f64>().ok())
            .map(|ns| ns / 1e9)
            .collect()
    };
    let creates = parse(
        stack
            .vm
            .ok(&timed("create-volume --name bench-$i --size 64Mi"))
            .await,
    );
    let probes = parse(stack.vm.ok(&timed("probe")).await);
    assert_eq!(creates.len(), ROUNDS, "{creates:?}");
    println!("bench: standalone CreateVolume times (s): {creates:.2?}");
    stack
        .vm
        .sh(&format!(
            "pkill -f '[ ]standalone --config {STANDALONE_DIR}'"
        ))
        .await;
    (median(creates), median(probes))
}

/// `VmRSS` and `VmHWM` of a `/proc/<pid>/status`, in MiB.
pub fn rss(status: &str) -> (f64, f64) {
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// Where a process's resident memory is, in MiB, from its `/proc/<pid>/smaps`: the lvms binary's
/// pages, other files' (libraries), the heap, thread stacks and other anonymous mappings.
pub fn rss_parts(smaps: &str) -> String {
    let mut parts: Vec<(&str, f64)> = vec![
        ("binary", 0.0),
        ("libraries", 0.0),
        ("heap", 0.0),
        ("anonymous", 0.0),
        ("stacks", 0.0),
    ];
    let mut part = 0;
    // The first mapping is the executable's; over 9p its other mappings may name another of its
    // hard links (`deps/lvms-<hash>` for `release/lvms`).
    let mut exe = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && first.chars().next().is_some_and(|c| c.is_ascii_hexdigit()) {
            let path = line.split_whitespace().nth(5).unwrap_or("");
            let exe = *exe.get_or_insert(path);
            part = match path {
                p if p == exe || p.rsplit('/').next().is_some_and(|f| f.starts_with("lvms")) => 0,
                "[heap]" => 2,
                "" => 3,
                p if p.starts_with("[stack") => 4,
                p if p.starts_with('[') => 3,
                _ => 1,
            };
        } else if first == "Rss:" {
            let kib: f64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            parts[part].1 += kib / 1024.0;
        }
    }
    parts
        .iter()
        .map(|(name, mib)| format!("{name} {mib:.1}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// 500 volumes (LogicalVolume objects the agent makes LVs for), then the resident memory of the
/// agent in the VM and of the operator and the CSI controller here.
async fn memory_with_volumes(stack: &Stack, client: &Client) {
    let agent_status = || async {
        stack
            .vm
            .ok("cat /proc/$(pgrep -f '[ ]node --metrics-port 8081' | head -n1)/status")
            .await
    };
    let agent_parts = || async {
        rss_parts(
            &stack
                .vm
                .ok("cat /proc/$(pgrep -f '[ ]node --metrics-port 8081' | head -n1)/smaps")
                .await,
        )
    };
    let host_parts = |pid: u32| {
        rss_parts(&std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default())
    };
    let (rss_now, hwm) = rss(&agent_status().await);
    println!(
        "bench: node agent before the volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB (target \
         12 MiB; {})",
        agent_parts().await
    );
    for name in ["operator", "csi-controller"] {
        let pid = stack.pid(name).unwrap_or_else(|| panic!("{name} runs"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let (rss_now, hwm) = rss(&status);
        println!(
            "bench: {name} before the volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB ({})",
            host_parts(pid)
        );
    }
    let objects = Api::<LogicalVolume>::all(client.clone());
    let sfx = support::suffix();
    let started = Instant::now();
    for chunk in (0..VOLUMES).collect::<Vec<_>>().chunks(25) {
        let creations = chunk.iter().map(|i| {
            let objects = objects.clone();
            let name = format!("bench-{sfx}-{i:03}");
            async move {
                let object: LogicalVolume = serde_json::from_value(json!({
                    "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                    "metadata": {"name": name},
                    "spec": {"name": name, "nodeName": NODE, "deviceClass": CLASS, "size": "16Mi"},
                }))
                .unwrap();
                objects
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap();
            }
        });
        futures::future::join_all(creations).await;
    }
    let made = eventually(
        "the agent makes every LV",
        Duration::from_secs(3600),
        || async {
            let list = objects
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let made = list
                .items
                .iter()
                .filter(|o| o.spec.name.starts_with(&format!("bench-{sfx}-")))
                .filter(|o| o.status.as_ref().is_some_and(|s| !s.volume_id.is_empty()))
                .count();
            if made == VOLUMES {
                Ok(made)
            } else {
                tokio::time::sleep(Duration::from_secs(5)).await;
                Err(format!("{made} of {VOLUMES}"))
            }
        },
    )
    .await;
    let lvs = stack.vm.lvs(CLASS).await.len();
    println!(
        "bench: {made} LogicalVolumes made in {:.0} s; {lvs} LVs in {CLASS}",
        started.elapsed().as_secs_f64()
    );
    // A sweep of every periodic loop (capacity every 10 s, status) with all of them present.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let (rss_now, hwm) = rss(&agent_status().await);
    println!(
        "bench: node agent with {VOLUMES} volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB (target \
         20 MiB; {})",
        agent_parts().await
    );
    for (name, target) in [
        ("operator", "target 20 MiB"),
        ("csi-controller", "target 24 MiB"),
    ] {
        let pid = stack.pid(name).unwrap_or_else(|| panic!("{name} runs"));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let (rss_now, hwm) = rss(&status);
        println!(
            "bench: {name} with {VOLUMES} volumes: RSS {rss_now:.1} MiB, peak {hwm:.1} MiB \
             ({target}; {})",
            host_parts(pid)
        );
    }
}

#[test]
fn resident_memory_is_split_by_mapping() {
    let smaps = "\
5600-5700 r--p 00000000 08:01 12 /usr/bin/lvms
Rss:                2048 kB
5700-5800 r-xp 00001000 08:01 12 /usr/bin/lvms
Rss:                1024 kB
5900-5a00 rw-p 00000000 00:00 0 [heap]
Rss:                 512 kB
7f00-7f10 rw-p 00000000 00:00 0
Rss:                 256 kB
7f10-7f20 r-xp 00000000 08:01 40 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                1024 kB
7ffc-7ffd rw-p 00000000 00:00 0 [stack]
Rss:                 128 kB
";
    assert_eq!(
        rss_parts(smaps),
        "binary 3.0, libraries 1.0, heap 0.5, anonymous 0.2, stacks 0.1"
    );
}
