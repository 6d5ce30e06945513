//! The scale benchmark (issue 39): `lvms csi-controller` (the binary, `LVMS_E2E_LVMS`) on the real
//! API server with many simulated nodes, each a node agent's LogicalVolume reconciler and capacity
//! publisher over the in-memory backend, in this process with a client of its own. It prints, from
//! one run:
//!
//! - CreateVolume latency p50 and p95 (each call on the next node in turn, one at a time) with no
//!   volume, and again once `volumes` exist, each with a PersistentVolume, beside `stale`
//!   LogicalVolumes of a node that is gone and no PersistentVolume (topolvm#715's state); the
//!   ratios;
//! - the rate the fill reached (16 CreateVolume calls at a time);
//! - the CSI controller's resident memory, and its garbage collector's last pass time;
//! - the API requests of a steady-state window, per user agent;
//! - `lvms operator` (the binary) over an LVMCluster on all the nodes: the time from its start to
//!   its first successful reconcile and its memory, at its first start and after a restart.
//!
//! `cargo xtask scale` runs it with 100 nodes, 10,000 volumes and 1,000 stale objects on a control
//! plane of its own (release build); the e2e suite runs it small (5 nodes, 100 volumes, 20 stale)
//! to show it works. It asserts that every call succeeded and that the collector found the stale
//! objects; the figures are for people to read.

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use k8s_openapi::api::{
    core::v1::PersistentVolume,
    storage::v1::{CSIDriver, StorageClass},
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume};
use lvms_csi::{
    csi::{
        CapacityRange, CreateVolumeRequest, TopologyRequirement, VolumeCapability,
        controller_client::ControllerClient, volume_capability::access_mode::Mode,
    },
    server,
};
use lvms_node::{capacity::Publisher, lv_reconciler};
use lvms_operator::VolumeSnapshotClass;
use lvms_testkit::{
    csi_requests::{mount, on},
    fake_backend::FakeBackend,
};
use serde_json::json;

use crate::{
    idle,
    leader::Replica,
    support::{self, TestNamespace, eventually},
};

/// The driver name of the benchmark's controller: its own, so no other controller's collector
/// counts its volumes.
const DRIVER: &str = "scale.lvms.topolvm.io";
/// Each volume's size.
const SIZE: i64 = 16 << 20;
/// CreateVolume calls in flight while filling.
const FILL_CONCURRENCY: usize = 16;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// p50 and p95 of `xs` (seconds).
fn p50_p95(mut xs: Vec<f64>) -> (f64, f64) {
    xs.sort_by(f64::total_cmp);
    (percentile(&xs, 0.5), percentile(&xs, 0.95))
}

fn cap() -> VolumeCapability {
    mount(Mode::SingleNodeWriter, "xfs")
}

/// `VmRSS` and `VmHWM` of process `pid`, in MiB.
fn rss(pid: u32) -> (f64, f64) {
    crate::bench::rss(&std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default())
}

/// One simulated node: its name and what runs for it.
struct SimNode {
    name: String,
    agent: tokio::task::JoinHandle<()>,
}

/// A Node, its class Ready in a node status, and a node agent's LogicalVolume reconciler and
/// capacity publisher over the in-memory backend (`class`, a pool of 1 TiB), with a client of its
/// own.
async fn sim_node(admin: &Client, ns: &str, class: &str, name: String) -> SimNode {
    support::create_node(admin, &name, &[]).await;
    let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeStatus": [{"name": class, "status": "Ready"}]},
    }))
    .unwrap();
    Api::<LVMVolumeGroupNodeStatus>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &status)
        .await
        .unwrap();
    let client = support::client().await;
    let backend = Arc::new(FakeBackend::new().with_thin_class(class, 1 << 40));
    let agent = tokio::spawn(lv_reconciler::run(Arc::new(lv_reconciler::Context::fixed(
        client.clone(),
        &name,
        backend.clone(),
    ))));
    // The capacity is published once; the backend never changes, so its sender may go.
    let (_sender, rx) = tokio::sync::watch::channel(Some(backend));
    let mut publisher = Publisher::new(client, &name, DRIVER, rx);
    publisher.publish_once().await.unwrap();
    SimNode { name, agent }
}

/// CreateVolume `name` on `node`; its time in seconds.
async fn create(
    csi: &mut ControllerClient<server::Channel>,
    name: String,
    node: &str,
) -> Result<(String, f64), String> {
    let req = CreateVolumeRequest {
        name,
        capacity_range: Some(CapacityRange {
            required_bytes: SIZE,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![on(node)],
            preferred: vec![on(node)],
        }),
        ..Default::default()
    };
    let started = Instant::now();
    let volume = csi
        .create_volume(req)
        .await
        .map_err(|e| e.to_string())?
        .into_inner()
        .volume
        .ok_or("no volume in the answer")?;
    Ok((volume.volume_id, started.elapsed().as_secs_f64()))
}

/// The PersistentVolume the provisioner would make for volume `id`.
async fn claim(pvs: &Api<PersistentVolume>, id: &str) {
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pv-{id}")},
        "spec": {"capacity": {"storage": "16Mi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "csi": {"driver": DRIVER, "volumeHandle": id}},
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("PersistentVolume of {id}: {e}"));
}

/// `count` CreateVolume calls one after another, each on the next node, each volume then
/// claimed by a PersistentVolume; their times.
async fn timed(
    csi: &mut ControllerClient<server::Channel>,
    pvs: &Api<PersistentVolume>,
    nodes: &[SimNode],
    prefix: &str,
    count: usize,
) -> Vec<f64> {
    let mut times = Vec::new();
    for i in 0..count {
        let node = &nodes[i % nodes.len()].name;
        let (id, secs) = create(csi, format!("{prefix}-{i:05}"), node)
            .await
            .unwrap_or_else(|e| panic!("CreateVolume {prefix}-{i}: {e}"));
        claim(pvs, &id).await;
        times.push(secs);
    }
    times
}

/// A LogicalVolume of gone node `node` with a volume id and no PersistentVolume.
async fn stale(lvs: &Api<LogicalVolume>, name: &str, node: &str, class: &str) {
    let lv: LogicalVolume = serde_json::from_value(json!({
        "apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": node, "deviceClass": class, "size": "16Mi"},
    }))
    .unwrap();
    lvs.create(&PostParams::default(), &lv).await.unwrap();
    lvs.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"volumeID": name, "code": 0}})),
    )
    .await
    .unwrap();
}

/// A number the controller's `/metrics` shows (`NaN` while it shows none).
async fn metric(port: u16, name: &str) -> f64 {
    let out = tokio::process::Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .await
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(f64::NAN)
}

#[tokio::test]
async fn scale_create_volume_memory_requests_and_collection_at_many_volumes_and_nodes() {
    if !support::enabled(
        "scale_create_volume_memory_requests_and_collection_at_many_volumes_and_nodes",
    ) {
        return;
    }
    let Ok(lvms) = std::env::var("LVMS_E2E_LVMS") else {
        eprintln!("scale: skipped (run by `cargo xtask e2e` or `cargo xtask scale`)");
        return;
    };
    let nodes_wanted = setting("LVMS_E2E_SCALE_NODES", 5);
    // CreateVolume calls timed one after another, at each end.
    let samples = setting("LVMS_E2E_SCALE_SAMPLES", 20).max(1);
    let volumes = setting("LVMS_E2E_SCALE_VOLUMES", 100).max(2 * samples + 1);
    let stale_wanted = setting("LVMS_E2E_SCALE_STALE", 20);
    let steady = Duration::from_secs(setting("LVMS_E2E_SCALE_WINDOW", 10) as u64);
    let admin = support::client().await;
    support::install_crds(&admin).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&admin, &format!("lvms-e2e-scale-{sfx}"), &[]).await;
    // The device class: a name of this run's (its StorageClass, rendered by the operator below,
    // is cluster-wide).
    let class = format!("s{sfx}");
    let vg: LVMVolumeGroup = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": class, "namespace": ns.name},
        "spec": {"deviceSelector": {"paths": ["/dev/sdb"]}, "default": true,
                 "thinPoolConfig": {"name": "pool", "overprovisionRatio": 2}},
    }))
    .unwrap();
    Api::<LVMVolumeGroup>::namespaced(admin.clone(), &ns.name)
        .create(&PostParams::default(), &vg)
        .await
        .unwrap();

    let started = Instant::now();
    let mut nodes = Vec::new();
    for i in 0..nodes_wanted {
        nodes.push(sim_node(&admin, &ns.name, &class, format!("scale-{sfx}-{i:03}")).await);
    }
    println!(
        "scale: {nodes_wanted} simulated nodes up in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The controller, as its container runs it (the admin's kubeconfig instead of its
    // ServiceAccount's), its collector every 10 s.
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let metrics_port = crate::stack::free_port();
    let log = std::fs::File::create(dir.path().join("csi-controller.log")).unwrap();
    let mut controller = tokio::process::Command::new(&lvms)
        .args([
            "csi-controller",
            "--namespace",
            &ns.name,
            "--endpoint",
            &format!("unix://{}", socket.display()),
            "--driver-name",
            DRIVER,
            "--metrics-port",
            &metrics_port.to_string(),
            "--leader-election=false",
            "--gc-period",
            "10",
        ])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = controller.id().unwrap();
    let channel = eventually("the controller serves CSI", support::WAIT, || {
        let socket = socket.clone();
        async move { server::connect(&socket).await.map_err(|e| e.to_string()) }
    })
    .await;
    let mut csi = ControllerClient::new(channel);
    let (idle_rss, _) = rss(pid);
    let pvs = Api::<PersistentVolume>::all(admin.clone());
    let lvs = Api::<LogicalVolume>::all(admin.clone());

    // At none: the first call waits for the controller's view of the node; not counted.
    timed(&mut csi, &pvs, &nodes, &format!("scale-{sfx}-warm"), 1).await;
    let at_zero = timed(&mut csi, &pvs, &nodes, &format!("scale-{sfx}-a"), samples).await;

    // The fill, 16 at a time, each claimed; and the stale objects of a node that is gone.
    let fill = volumes - 2 * samples - 1;
    let filling = Instant::now();
    let names: Vec<(String, String)> = (0..fill)
        .map(|i| {
            (
                format!("scale-{sfx}-f-{i:05}"),
                nodes[i % nodes.len()].name.clone(),
            )
        })
        .collect();
    let failures: Vec<String> = stream::iter(names)
        .map(|(name, node)| {
            let mut csi = csi.clone();
            let pvs = pvs.clone();
            async move {
                let (id, _) = create(&mut csi, name.clone(), &node)
                    .await
                    .map_err(|e| format!("{name}: {e}"))?;
                claim(&pvs, &id).await;
                Ok::<(), String>(())
            }
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await;
    assert!(failures.is_empty(), "CreateVolume failed: {failures:?}");
    let fill_secs = filling.elapsed().as_secs_f64();
    let stale_started = Instant::now();
    let gone = format!("scale-{sfx}-gone");
    stream::iter(0..stale_wanted)
        .map(|i| {
            let (lvs, gone, class) = (lvs.clone(), gone.clone(), class.clone());
            let name = format!("scale-{sfx}-stale-{i:05}");
            async move { stale(&lvs, &name, &gone, &class).await }
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    println!(
        "scale: {fill} volumes made and claimed in {fill_secs:.0} s ({:.1}/s, {FILL_CONCURRENCY} at \
         a time); {stale_wanted} stale LogicalVolumes in {:.0} s",
        fill as f64 / fill_secs,
        stale_started.elapsed().as_secs_f64()
    );

    let at_full = timed(&mut csi, &pvs, &nodes, &format!("scale-{sfx}-b"), samples).await;
    let (z50, z95) = p50_p95(at_zero);
    let (f50, f95) = p50_p95(at_full);
    println!("scale: {samples} CreateVolume calls one after another at each end:");
    println!(
        "scale: CreateVolume at 0 volumes: p50 {:.1} ms, p95 {:.1} ms",
        z50 * 1e3,
        z95 * 1e3
    );
    println!(
        "scale: CreateVolume at {volumes} volumes and {stale_wanted} stale on {nodes_wanted} nodes: \
         p50 {:.1} ms, p95 {:.1} ms",
        f50 * 1e3,
        f95 * 1e3
    );
    println!(
        "scale: ratio at {volumes} ÷ at 0: p50 {:.2}×, p95 {:.2}× (target ≤ 1.2×)",
        f50 / z50,
        f95 / z95
    );

    // The collector's pass over all of them: it finds the stale objects (and whatever other
    // tests' volumes without a PersistentVolume exist beside).
    let orphans = eventually(
        "the collector counts the stale LogicalVolumes",
        Duration::from_secs(300),
        || async move {
            let found = metric(metrics_port, "lvms_unclaimed_logical_volumes").await;
            if found >= stale_wanted as f64 {
                Ok(found)
            } else {
                tokio::time::sleep(Duration::from_secs(2)).await;
                Err(format!("{found}"))
            }
        },
    )
    .await;
    let sweep = metric(metrics_port, "lvms_unclaimed_logical_volumes_sweep_seconds").await;
    println!(
        "scale: garbage collection pass over {} LogicalVolumes: {:.3} s; {orphans} unclaimed",
        volumes + stale_wanted,
        sweep
    );

    let window = idle::window(steady).await;
    let per_minute = 60.0 / steady.as_secs_f64();
    println!(
        "scale: API requests per minute at steady state ({} s window, scaled):",
        steady.as_secs()
    );
    for ((user, agent), r) in &window {
        let writes: u64 = r.writes.values().sum();
        println!(
            "scale:   {user} ({agent}): {:.0} requests, {:.0} writes {:?}",
            r.all as f64 * per_minute,
            writes as f64 * per_minute,
            r.writes
        );
    }
    let (now, peak) = rss(pid);
    println!(
        "scale: csi-controller RSS {idle_rss:.1} MiB before the volumes; {now:.1} MiB (peak \
         {peak:.1}) with {volumes} volumes and {stale_wanted} stale (target ≤ 64 MiB at 10,000)"
    );

    // A small run (the e2e suite's) removes what it made, on a control plane other tests share:
    // the volumes' objects (their agents take their finalizers off), the stale ones, the
    // PersistentVolumes. A large one leaves them to its control plane's end.
    let _ = controller.kill().await;
    if volumes + stale_wanted <= 1000 {
        let mine = |name: &str| name.starts_with(&format!("scale-{sfx}-"));
        for lv in lvs.list(&Default::default()).await.unwrap().items {
            let name = lv.metadata.name.unwrap_or_default();
            if mine(&name) {
                let _ = lvs.delete(&name, &Default::default()).await;
            }
        }
        eventually(
            "the benchmark's LogicalVolumes are gone",
            support::WAIT,
            || {
                let lvs = lvs.clone();
                async move {
                    let left = lvs
                        .list(&Default::default())
                        .await
                        .map_err(|e| e.to_string())?
                        .items
                        .iter()
                        .filter(|lv| lv.metadata.name.as_deref().is_some_and(mine))
                        .count();
                    if left == 0 {
                        Ok(())
                    } else {
                        Err(format!("{left} left"))
                    }
                }
            },
        )
        .await;
        for pv in pvs.list(&Default::default()).await.unwrap().items {
            let csi = pv.spec.as_ref().and_then(|s| s.csi.as_ref());
            if csi.is_some_and(|c| c.driver == DRIVER) {
                let _ = pvs
                    .delete(&pv.metadata.name.unwrap_or_default(), &Default::default())
                    .await;
            }
        }
    }
    operator_at_scale(&lvms, &admin, &ns.name, &class, nodes.len()).await;
    for node in &nodes {
        node.agent.abort();
        support::delete_node(&admin, &node.name).await;
    }
    ns.delete().await;
}

/// `lvms operator` (the binary) over the simulated nodes: an LVMCluster of the run's class on all
/// of them (each reports the class Ready). Printed: the time from the process's start to its first
/// successful reconcile, and its memory, at its first start and after a restart (SIGKILL and a new
/// process: nothing remembered, everything read and applied again).
async fn operator_at_scale(lvms: &str, admin: &Client, ns: &str, class: &str, nodes: usize) {
    let work = tempfile::tempdir().unwrap();
    let cert = work.path().join("cert");
    std::fs::create_dir_all(&cert).unwrap();
    crate::webhook::certificates(&cert, "127.0.0.1");
    // As its container runs it, with the admin's kubeconfig instead of its ServiceAccount's.
    std::fs::copy(
        std::env::var("KUBECONFIG").unwrap(),
        work.path().join("operator.kubeconfig"),
    )
    .unwrap();
    let clusters = Api::<LVMCluster>::namespaced(admin.clone(), ns);
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "scale", "namespace": ns},
        "spec": {
            // Nodes without a kubelet get the node lifecycle controller's taints.
            "tolerations": [{"operator": "Exists"}],
            "storage": {"deviceClasses": [
                {"name": class, "default": true, "deviceSelector": {"paths": ["/dev/sdb"]},
                 "thinPoolConfig": {"name": "pool", "overprovisionRatio": 2}}
            ]}
        }
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();
    let mut operator = Replica::new(
        Path::new(lvms),
        work.path(),
        "scale-operator",
        ns,
        DRIVER,
        &["--leader-election=false".to_owned()],
    );
    for start in ["its first start", "a restart"] {
        let started = Instant::now();
        operator.start();
        eventually(
            "the operator reconciles the LVMCluster",
            support::WAIT,
            || async {
                match operator.successful_reconciles().await {
                    Ok(n) if n > 0 => Ok(()),
                    other => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Err(format!("{other:?}; its log:\n{}", operator.tail()))
                    }
                }
            },
        )
        .await;
        let first = started.elapsed().as_secs_f64();
        // What the reconcile started settles (its status write, the watches' events).
        tokio::time::sleep(Duration::from_secs(10)).await;
        let (now, peak) = rss(operator.pid().unwrap());
        let deployed = clusters.get_status("scale").await.unwrap();
        let reported = deployed
            .status
            .map(|s| {
                s.device_class_statuses
                    .iter()
                    .map(|d| d.node_status.len())
                    .sum::<usize>()
            })
            .unwrap_or_default();
        println!(
            "scale: operator over {nodes} nodes, after {start}: first reconcile done {first:.2} s \
             after the process started; {reported} node statuses in the LVMCluster's status; RSS \
             {now:.1} MiB (peak {peak:.1}; target ≤ 64 MiB)"
        );
        operator.kill();
    }
    // No node agent takes its finalizers off: the objects go by hand, the cluster-wide ones too.
    let unfinalized = PatchParams::default();
    let strip = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let groups = Api::<LVMVolumeGroup>::namespaced(admin.clone(), ns);
    for group in groups.list(&Default::default()).await.unwrap().items {
        let name = group.metadata.name.unwrap_or_default();
        let _ = groups.patch(&name, &unfinalized, &strip).await;
    }
    let _ = clusters.patch("scale", &unfinalized, &strip).await;
    let _ = clusters.delete("scale", &Default::default()).await;
    let name = lvms_api::storage_class_name(class);
    let _ = Api::<StorageClass>::all(admin.clone())
        .delete(&name, &Default::default())
        .await;
    let _ = Api::<VolumeSnapshotClass>::all(admin.clone())
        .delete(&name, &Default::default())
        .await;
    let _ = Api::<CSIDriver>::all(admin.clone())
        .delete(DRIVER, &Default::default())
        .await;
}
