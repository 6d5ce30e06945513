//! One LUN on two installed nodes (issue 38): lvms-rs installed with `kubectl apply -k` on two
//! kubelets that attach one shared disk image, run by `cargo xtask installed` after `installed::`
//! (which leaves no LVMCluster behind). An `LVMCluster` with a node-local class on each node's own
//! disk and a shared class on the LUN (watchdog `Required`, softdog under wdmd in the guests,
//! lvmlockd at io timeout 5 s) becomes Ready on both nodes, which shows the node agents installed
//! the fence hook themselves; a MULTI_NODE block volume is used by a pod on each node at once;
//! then the node without the operator is killed under a StatefulSet pod that wrote to a shared
//! linear and a shared thin volume, and with no step by the test but waiting, the pod runs on the
//! other node and reads back what it wrote: no activation before sanlock's host-dead time. Then
//! the killed node boots again and joins the class by itself. Then the other node loses its path
//! to the LUN under the pod (its map switched to the error target): the hook fences it, the pod
//! moves back, both filesystems check clean, and once the path is back the node joins again by
//! itself. Last, the rollback: lvms-rs's Deployment and DaemonSet deleted and the Deployment
//! created again, and the pod is served again.
//!
//! Besides `installed::`'s variables it needs `LVMS_E2E_NODE2`, `LVMS_E2E_VM2`,
//! `LVMS_E2E_DEVICE2`, `LVMS_E2E_SHARED_DEVICE`, `LVMS_E2E_PIDS` (the two machines' process
//! ids, node 1's first) and `LVMS_E2E_REBOOT_DIR` (where a file named `1` or `2` asks
//! `cargo xtask installed` to boot that node again).

use std::time::{Duration, Instant};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment, StatefulSet},
    core::v1::{Node, PersistentVolumeClaim, Pod},
    storage::v1::{CSINode, StorageClass},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams},
};
use lvms_api::{
    LVMCluster, LVMVolumeGroupNodeStatus, SharedVGStatus, shared_topology_key, storage_class_name,
    topolvm::LogicalVolume,
};
use lvms_core::shared::fencing::Timing;
use serde_json::json;

use crate::{
    installed::{
        self, DRIVER, INSTALL_NS, NODE_DAEMON_SET, OPERATOR, SLOW, delete_pod, operator_ready,
        since_apply, wait_log, wait_running,
    },
    stack::Vm,
    support::{self, TestNamespace, eventually},
};

const SAN: &str = "san";
const LOCAL: &str = "local";
/// lvmlockd's `--sanlock-timeout` in the guests (xtask/src/node.sh), which the class matches.
const IO_TIMEOUT: u32 = 5;
const CLUSTER: &str = "shared";
/// lvm on a node, as the node agent runs it for the class: under lvmlockd, through the class's
/// devices file (the LUN's raw path shows as a duplicate of the map otherwise: the user-mode
/// kernel's disks do not show the map as their holder, so LVM cannot tell them multipath
/// components).
const LVM: &str = "LVM_SYSTEM_DIR=/etc/lvm lvm";
const LVM_CLASS: &str = "--config global/use_lvmlockd=1 --devicesfile lvms-san.devices";

/// One of the two nodes.
struct Member {
    name: String,
    vm: Vm,
    pid: u32,
}

async fn wait_ready(clusters: &Api<LVMCluster>) {
    support::wait_cluster_ready(clusters, CLUSTER, SLOW).await;
}

/// The node the leading operator pod runs on.
async fn operator_node(client: &Client) -> String {
    let name = operator_ready(client).await;
    Api::<Pod>::namespaced(client.clone(), INSTALL_NS)
        .get(&name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("the operator's pod is scheduled")
}

/// Marks `node` unschedulable (or schedulable again), as `kubectl cordon` does.
async fn cordon(nodes: &Api<Node>, node: &str, unschedulable: bool) {
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .unwrap_or_else(|e| panic!("cordon {node} = {unschedulable}: {e}"));
}

fn ready_status(node: &Node) -> String {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map_or_else(|| "?".to_owned(), |c| c.status.clone())
}

#[tokio::test]
#[ignore = "needs two installed nodes on one LUN: run by `cargo xtask installed`"]
async fn a_shared_lun_on_two_nodes_is_joined_used_by_both_and_a_dead_nodes_pod_moves_by_itself() {
    const TEST: &str =
        "a_shared_lun_on_two_nodes_is_joined_used_by_both_and_a_dead_nodes_pod_moves_by_itself";
    if !support::enabled(TEST) {
        return;
    }
    let pids: Vec<u32> = std::env::var("LVMS_E2E_PIDS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|p| p.parse().ok())
        .collect();
    let Some((env, second)) = installed::env().and_then(|mut e| {
        let second = e.node2.take()?;
        Some((e, second))
    }) else {
        eprintln!("{TEST}: skipped (run by `cargo xtask installed`, which boots two nodes)");
        return;
    };
    assert_eq!(pids.len(), 2, "LVMS_E2E_PIDS names both machines");
    let started = Instant::now();
    let client = support::client().await;
    let members = [
        Member {
            name: env.node.clone(),
            vm: env.vm.clone(),
            pid: pids[0],
        },
        Member {
            name: second.node.clone(),
            vm: second.vm.clone(),
            pid: pids[1],
        },
    ];

    // Both nodes: a node-local class on each one's own disk, and the LUN.
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), INSTALL_NS);
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": CLUSTER, "namespace": INSTALL_NS},
        "spec": {"storage": {"deviceClasses": [
            {"name": LOCAL, "default": true, "fstype": "ext4",
             "deviceSelector": {"optionalPaths": [env.device, second.device]},
             "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}},
            {"name": SAN, "fstype": "ext4", "deviceAccessPolicy": "shared",
             "deviceSelector": {"paths": [second.shared_device]},
             "sharedConfig": {"ioTimeoutSeconds": IO_TIMEOUT, "watchdog": "Required"}},
        ]}},
    }))
    .unwrap();
    let created = Instant::now();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap_or_else(|e| panic!("creating LVMCluster {CLUSTER}: {e}"));
    // Ready under `watchdog: Required` means each node reported its watchdog armed and the kill
    // hook configured: nobody but the node agents put it there.
    wait_ready(&clusters).await;
    println!(
        "installed_shared: LVMCluster Ready on both nodes {:.0} s after it was created ({} s \
         after kubectl apply)",
        created.elapsed().as_secs_f64(),
        since_apply(&env)
    );
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), INSTALL_NS);
    let mut host_ids = Vec::new();
    for m in &members {
        let conf = m.vm.ok("cat /etc/lvm/lvmlocal.conf").await;
        assert!(
            conf.contains("lvmlockctl_kill_command = \"/var/lib/lvms/bin/lvms fence\""),
            "{}: {conf}",
            m.name
        );
        m.vm.ok("test -x /var/lib/lvms/bin/lvms").await;
        // (The operator does not judge a report without fencing, an older node agent's, so the
        // LVMCluster can be Ready before a node reports it: the test waits for each node's.)
        let shared = eventually("the node reports its fencing of the class", SLOW, || {
            let statuses = statuses.clone();
            let name = m.name.clone();
            async move {
                let status = statuses.get(&name).await.map_err(|e| e.to_string())?;
                shared_of(&status)
                    .filter(|s| s.fencing.is_some())
                    .ok_or(format!("{status:?}"))
            }
        })
        .await;
        let fencing = shared.fencing.clone().expect("fencing reported");
        assert!(fencing.kill_hook, "{}: {fencing:?}", m.name);
        assert_eq!(shared.io_timeout_seconds, i32::try_from(IO_TIMEOUT).ok());
        host_ids.push(shared.host_id.expect("a host id"));
        // The class's topology segment, which kubelet learned when the plugin registered.
        let csinode = eventually("CSINode has the shared class's key", SLOW, || {
            let csinodes = Api::<CSINode>::all(client.clone());
            let node = m.name.clone();
            async move {
                let c = csinodes.get(&node).await.map_err(|e| e.to_string())?;
                let keys = c
                    .spec
                    .drivers
                    .iter()
                    .find(|d| d.name == DRIVER)
                    .and_then(|d| d.topology_keys.clone())
                    .unwrap_or_default();
                keys.contains(&shared_topology_key(SAN))
                    .then_some(keys.clone())
                    .ok_or(format!("{keys:?}"))
            }
        })
        .await;
        println!("installed_shared: {} CSINode keys {csinode:?}", m.name);
    }
    assert_ne!(host_ids[0], host_ids[1], "distinct sanlock host ids");

    let ns =
        TestNamespace::create(&client, &format!("lvms-shared-{}", support::suffix()), &[]).await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);

    // A MULTI_NODE block volume, used by a pod on each node at once: each reads (O_DIRECT, no
    // page cache) what the other wrote to the LUN.
    let block_claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "both"},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class_name(SAN),
                 "volumeMode": "Block", "resources": {"requests": {"storage": "64Mi"}}}
    }))
    .unwrap();
    pvcs.create(&PostParams::default(), &block_claim)
        .await
        .unwrap();
    let block_token = support::suffix();
    // Block 0 is node 1's, block 1 node 2's; each writes its own, then reads the other's. 4 KiB
    // blocks: busybox's dd falls back to the page cache when O_DIRECT refuses a smaller one, and
    // kubelet's loop device over a block volume keeps that cache (stale on the other node).
    let script = |mine: usize, theirs: usize| {
        format!(
            "printf '%-4096s' 'from-{mine}-{block_token}' | dd of=/dev/xvda bs=4096 seek={mine} \
             count=1 oflag=direct conv=notrunc,fsync 2>/dev/null && echo wrote; \
             while :; do echo \"saw $(dd if=/dev/xvda bs=4096 skip={theirs} count=1 iflag=direct \
             2>/dev/null | tr -d ' \\000')\"; sleep 1; done"
        )
    };
    for (i, m) in members.iter().enumerate() {
        pods.create(
            &PostParams::default(),
            &installed::pod(
                &format!("both-{i}"),
                &env.image,
                &script(i, 1 - i),
                json!({"claim": "both", "block": true}),
                &m.name,
            ),
        )
        .await
        .unwrap();
    }
    for i in 0..2 {
        let name = format!("both-{i}");
        wait_running(&pods, &name).await;
        let other = format!("from-{}-{block_token}", 1 - i);
        wait_log(&pods, &name, "each pod reads the other node's block", |l| {
            (l.strip_prefix("saw ") == Some(other.as_str())).then_some(())
        })
        .await;
    }
    for i in 0..2 {
        let p = pods.get(&format!("both-{i}")).await.unwrap();
        assert_eq!(
            p.status.and_then(|s| s.phase).as_deref(),
            Some("Running"),
            "both pods run at once"
        );
    }
    println!("installed_shared: a MULTI_NODE block volume is used by a pod on each node at once");
    for i in 0..2 {
        delete_pod(&pods, &format!("both-{i}")).await;
    }

    // Failover: a StatefulSet pod on the node without the leading operator (the standby dies
    // with the victim; the leader sees the death at once rather than after its own takeover)
    // writes to a shared linear and a shared thin volume.
    let survivor_name = operator_node(&client).await;
    let (v, s) = if members[0].name == survivor_name {
        (1, 0)
    } else {
        (0, 1)
    };
    let (victim, survivor) = (&members[v], &members[s]);
    let thin_class: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": format!("{}-thin-{}", storage_class_name(SAN), support::suffix())},
        "provisioner": DRIVER,
        "parameters": {lvms_api::DEVICE_CLASS_PARAMETER: SAN,
                       lvms_api::VOLUME_MODE_PARAMETER: "thin",
                       "csi.storage.k8s.io/fstype": "ext4"},
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }))
    .unwrap();
    let thin_name = thin_class.name_any();
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &thin_class)
        .await
        .unwrap();
    let token = format!("kept-{}", support::suffix());
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "mover"},
        "spec": {
            "replicas": 1, "serviceName": "mover",
            "selector": {"matchLabels": {"app": "mover"}},
            "template": {
                "metadata": {"labels": {"app": "mover"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "c", "image": env.image, "imagePullPolicy": "Never",
                        // After the token, it keeps writing both volumes (the lost path then
                        // hits filesystems in use).
                        "command": ["/bin/sh", "-c", format!(
                            "if [ -f /lin/token ]; then echo \"read $(cat /lin/token) $(cat /thin/token)\"; \
                             else echo {token} > /lin/token && echo {token} > /thin/token && sync \
                             && echo wrote; fi; \
                             while :; do date > /lin/busy; date > /thin/busy; sync; sleep 1; done")],
                        "volumeMounts": [{"name": "lin", "mountPath": "/lin"},
                                         {"name": "thin", "mountPath": "/thin"}],
                    }],
                },
            },
            "volumeClaimTemplates": [
                {"metadata": {"name": "lin"}, "spec": {"accessModes": ["ReadWriteOnce"],
                  "storageClassName": storage_class_name(SAN),
                  "resources": {"requests": {"storage": "256Mi"}}}},
                {"metadata": {"name": "thin"}, "spec": {"accessModes": ["ReadWriteOnce"],
                  "storageClassName": thin_name,
                  "resources": {"requests": {"storage": "256Mi"}}}},
            ],
        },
    }))
    .unwrap();
    // The pod must start on the node that will die, and a preference is only a score (one CI run
    // placed it on the other node): the survivor is cordoned until the pod runs. Nothing the
    // failover needs stays cordoned.
    let nodes = Api::<Node>::all(client.clone());
    cordon(&nodes, &survivor.name, true).await;
    Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    wait_running(&pods, "mover-0").await;
    cordon(&nodes, &survivor.name, false).await;
    wait_log(&pods, "mover-0", "the pod wrote both volumes", |l| {
        (l == "wrote").then_some(())
    })
    .await;
    let first = pods.get("mover-0").await.unwrap();
    assert_eq!(
        first.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(victim.name.as_str()),
        "the pod starts on the node that will die"
    );
    let handles: Vec<String> = {
        let mut out = Vec::new();
        for claim in ["lin-mover-0", "thin-mover-0"] {
            let c = pvcs.get(claim).await.unwrap();
            out.push(c.spec.and_then(|s| s.volume_name).expect("bound"));
        }
        let pvs = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone());
        let mut handles = Vec::new();
        for pv in out {
            let pv = pvs.get(&pv).await.unwrap();
            handles.push(pv.spec.unwrap().csi.unwrap().volume_handle);
        }
        handles
    };
    // The thin claim's volume is thin: its own pool on the LUN (the StorageClass's volume-mode
    // parameter reached the node agent through the LogicalVolume).
    let lv = Api::<LogicalVolume>::all(client.clone())
        .get(&handles[1])
        .await
        .unwrap();
    assert_eq!(
        lv.spec.volume_mode,
        Some(lvms_api::SharedVolumeMode::Thin),
        "{:?}",
        lv.spec
    );
    let segtype = victim
        .vm
        .ok(&format!(
            "{LVM} lvs {LVM_CLASS} --noheadings -o segtype {SAN}/{}",
            handles[1]
        ))
        .await;
    assert_eq!(segtype.trim(), "thin", "the thin claim's LV");

    // Power loss: the victim's machine is killed. The test only watches from here on.
    let killed = Instant::now();
    lvms_testkit::guest::kill_machine(victim.pid);
    println!(
        "installed_shared: killed {} (the StatefulSet's pod on it), {} survives",
        victim.name, survivor.name
    );
    let lvs = Api::<LogicalVolume>::all(client.clone());
    let mut not_ready = None;
    let mut dead_seen = None;
    let mut deleted = None;
    let mut handed = None;
    let mut scheduled = None;
    let mut running = None;
    let deadline = killed + SLOW;
    let read = loop {
        assert!(
            Instant::now() < deadline,
            "the pod did not run on {} within {SLOW:?} of the kill (not Ready {not_ready:?}, \
             dead seen {dead_seen:?}, pod deleted {deleted:?}, handed {handed:?}, scheduled \
             {scheduled:?}, running {running:?})",
            survivor.name
        );
        let t = killed.elapsed();
        if not_ready.is_none()
            && let Ok(n) = nodes.get(&victim.name).await
            && ready_status(&n) != "True"
        {
            not_ready = Some(t);
        }
        if dead_seen.is_none()
            && let Ok(s) = statuses.get(&survivor.name).await
            && shared_of(&s).is_some_and(|s| !s.dead_host_ids.is_empty())
        {
            dead_seen = Some(t);
        }
        let now = pods.get_opt("mover-0").await.ok().flatten();
        if deleted.is_none() && now.as_ref().is_none_or(|p| p.uid() != first.uid()) {
            deleted = Some(t);
        }
        if handed.is_none() && all_on(&lvs, &handles, &survivor.name).await {
            handed = Some(t);
        }
        if let Some(p) = now.filter(|p| p.uid() != first.uid()) {
            let spec_node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            if scheduled.is_none() && spec_node.is_some() {
                assert_eq!(spec_node.as_deref(), Some(survivor.name.as_str()));
                scheduled = Some(t);
            }
            if running.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            {
                running = Some(t);
            }
            if running.is_some()
                && let Some(line) = read_line(&pods).await
            {
                break line;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let at = killed.elapsed();
    assert_eq!(
        read,
        format!("read {token} {token}"),
        "what it wrote, on both volumes"
    );
    let timing = Timing::new(IO_TIMEOUT);
    let deleted = deleted.expect("the old pod went");
    assert!(
        deleted.as_secs() >= u64::from(timing.earliest_takeover_after_death()),
        "the pod was released {deleted:?} after the kill, before sanlock's host-dead time ({} s \
         from the last renewal)",
        timing.host_dead_seconds()
    );
    println!(
        "installed_shared: failover after the kill of {}: node not Ready {} s, death reported by \
         {} {} s, pod deleted {} s, volumes handed over {} s, new pod scheduled {} s, Running {} \
         s, read back {:.0} s (host-dead time {} s after the last renewal, io timeout {} s)",
        victim.name,
        secs(not_ready),
        survivor.name,
        secs(dead_seen),
        secs(Some(deleted)),
        secs(handed),
        secs(scheduled),
        secs(running),
        at.as_secs_f64(),
        timing.host_dead_seconds(),
        IO_TIMEOUT
    );

    // The killed node boots again and joins the class by itself (its sanlock takes its host id
    // back, the old lease being dead by now), then reads through the LUN what the other wrote.
    let reboot_dir = std::env::var("LVMS_E2E_REBOOT_DIR").expect("LVMS_E2E_REBOOT_DIR is set");
    let booted = Instant::now();
    std::fs::write(
        std::path::Path::new(&reboot_dir).join((v + 1).to_string()),
        "",
    )
    .unwrap();
    eventually("the killed node is Ready again", SLOW, || {
        let nodes = nodes.clone();
        let name = victim.name.clone();
        async move {
            let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
            let ready = ready_status(&n);
            (ready == "True").then_some(()).ok_or(ready)
        }
    })
    .await;
    let node_ready = booted.elapsed();
    // Its status still says what it wrote before the kill (and the agent's first write after the
    // join is the same, so the API server keeps the old object): ask its sanlock instead.
    eventually(
        "the rebooted node's sanlock joined the class's lockspace",
        SLOW,
        || {
            let vm = victim.vm.clone();
            let line = format!("s lvm_{SAN}:{}:", host_ids[v]);
            async move {
                let (code, out) = vm.sh("sanlock client status").await;
                let joined = out
                    .lines()
                    .any(|l| l.starts_with(&line) && !l.contains(" ADD"));
                (code == 0 && joined).then_some(()).ok_or(out)
            }
        },
    )
    .await;
    let joined = booted.elapsed();
    wait_ready(&clusters).await;
    let cluster_ready = booted.elapsed();
    pods.create(
        &PostParams::default(),
        &installed::pod(
            "again",
            &env.image,
            &script(v, s),
            json!({"claim": "both", "block": true}),
            &victim.name,
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, "again").await;
    let other = format!("from-{s}-{block_token}");
    wait_log(&pods, "again", "the rebooted node reads the LUN", |l| {
        (l.strip_prefix("saw ") == Some(other.as_str())).then_some(())
    })
    .await;
    println!(
        "installed_shared: rejoin after the reboot of {}: node Ready {:.0} s, lockspace joined \
         (host id {}) {:.0} s, LVMCluster Ready {:.0} s, a pod there read the LUN {:.0} s",
        victim.name,
        node_ready.as_secs_f64(),
        host_ids[v],
        joined.as_secs_f64(),
        cluster_ready.as_secs_f64(),
        booted.elapsed().as_secs_f64()
    );
    // Kubelet asked NodeGetInfo when the plugin registered after the boot, while the lockspace
    // was still joining (sanlock waits out the lease of the node's former self): the class's node
    // label is the one from before the reboot; CSINode shows what NodeGetInfo answered.
    let keys = Api::<CSINode>::all(client.clone())
        .get(&victim.name)
        .await
        .ok()
        .and_then(|c| c.spec.drivers.into_iter().find(|d| d.name == DRIVER))
        .and_then(|d| d.topology_keys)
        .unwrap_or_default();
    let label = nodes
        .get(&victim.name)
        .await
        .unwrap()
        .labels()
        .get(&shared_topology_key(SAN))
        .cloned();
    assert_eq!(label.as_deref(), Some("true"), "the class's node label");
    println!(
        "installed_shared: after the reboot {} has CSINode keys {keys:?}",
        victim.name
    );
    delete_pod(&pods, "again").await;

    lost_path(&LostPath {
        client: &client,
        ns: &ns.name,
        fenced: survivor,
        taker: victim,
        fenced_host_id: host_ids[s],
        handles: &handles,
        token: &token,
    })
    .await;
    for m in &members {
        for line in m.vm.ok(installed::USAGE).await.lines() {
            println!("installed_shared: usage on {}: {line}", m.name);
        }
    }
    rollback(&client, &ns.name, &token).await;
    let _ = Api::<StorageClass>::all(client.clone())
        .delete(&thin_name, &DeleteParams::default())
        .await;
    println!(
        "installed_shared: done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// A node's report of the shared class.
fn shared_of(s: &LVMVolumeGroupNodeStatus) -> Option<SharedVGStatus> {
    s.spec
        .lvm_vg_status
        .iter()
        .find(|v| v.name == SAN)
        .and_then(|v| v.shared.as_deref().cloned())
}

/// Whole seconds, or `-` for a step not seen.
fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_owned(), |d| format!("{:.0}", d.as_secs_f64()))
}

/// Whether every volume of `handles` is handed to `node`.
async fn all_on(lvs: &Api<LogicalVolume>, handles: &[String], node: &str) -> bool {
    for h in handles {
        if !lvs.get(h).await.is_ok_and(|lv| lv.spec.node_name == node) {
            return false;
        }
    }
    true
}

/// The line the StatefulSet's pod prints when it finds its token: `read <lin> <thin>`.
async fn read_line(pods: &Api<Pod>) -> Option<String> {
    let log = pods.logs("mover-0", &LogParams::default()).await.ok()?;
    log.lines()
        .find(|l| l.starts_with("read "))
        .map(str::to_owned)
}

/// What the lost-path story works on.
struct LostPath<'a> {
    client: &'a Client,
    ns: &'a str,
    /// The node that loses its path: it runs the StatefulSet's pod (and the operator, which does
    /// not use the LUN and stays up).
    fenced: &'a Member,
    /// The other node, where the pod goes.
    taker: &'a Member,
    fenced_host_id: i32,
    /// The pod's two volumes (linear, thin).
    handles: &'a [String],
    token: &'a str,
}

/// Lost path under Kubernetes: the LUN's path of the node that runs `mover-0` goes to the error
/// target under its mounted volumes, which it keeps writing. Sanlock there cannot renew its lease
/// and the fence hook gives the class's devices the error target; the node stays Ready, says it
/// was fenced, and the other node counts its lease dead: the operator releases the pod (no
/// out-of-service taint) and takes the class's label from the fenced node, and the pod runs on the
/// other node and reads what it wrote. Both filesystems check clean. Kubelet unmounts the fenced
/// volumes on the fenced node; when the path is back, the node joins again by itself (an Event
/// says so) and gets its label back.
async fn lost_path(t: &LostPath<'_>) {
    let pods = Api::<Pod>::namespaced(t.client.clone(), t.ns);
    let nodes = Api::<Node>::all(t.client.clone());
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(t.client.clone(), INSTALL_NS);
    let lvs = Api::<LogicalVolume>::all(t.client.clone());
    let before = pods.get("mover-0").await.unwrap();
    assert_eq!(
        before.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(t.fenced.name.as_str()),
        "the pod runs on the node whose path goes"
    );
    let label = shared_topology_key(SAN);
    let annotation = lvms_operator::death::fenced_annotation(SAN);

    t.fenced.vm.ok("/run/node-bin/lun-path lose").await;
    let lost = Instant::now();
    println!(
        "installed_shared: {}'s path to the LUN now fails every I/O",
        t.fenced.name
    );
    let (mut fenced_at, mut dead_seen, mut deleted, mut handed, mut unlabelled, mut running) =
        (None, None, None, None, None, None);
    let read = loop {
        assert!(
            lost.elapsed() < SLOW,
            "the pod did not run on {} within {SLOW:?} of the lost path (fenced {fenced_at:?}, \
             dead seen {dead_seen:?}, deleted {deleted:?}, handed {handed:?}, label taken \
             {unlabelled:?}, running {running:?})",
            t.taker.name
        );
        let at = lost.elapsed();
        if fenced_at.is_none()
            && let Ok(st) = statuses.get(&t.fenced.name).await
            && shared_of(&st)
                .and_then(|s| s.fencing)
                .is_some_and(|f| f.fenced)
        {
            fenced_at = Some(at);
        }
        if dead_seen.is_none()
            && let Ok(st) = statuses.get(&t.taker.name).await
            && shared_of(&st).is_some_and(|s| s.dead_host_ids.contains(&t.fenced_host_id))
        {
            dead_seen = Some(at);
        }
        let node = nodes.get(&t.fenced.name).await.unwrap();
        assert_eq!(ready_status(&node), "True", "a fenced node stays Ready");
        assert!(
            node.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(|ts| ts
                    .iter()
                    .all(|t| t.key != "node.kubernetes.io/out-of-service")),
            "a fenced node that still runs is never tainted out of service"
        );
        if unlabelled.is_none() && !node.labels().contains_key(&label) {
            assert!(
                node.annotations().contains_key(&annotation),
                "{:?}",
                node.annotations()
            );
            unlabelled = Some(at);
        }
        let now = pods.get_opt("mover-0").await.ok().flatten();
        if deleted.is_none() && now.as_ref().is_none_or(|p| p.uid() != before.uid()) {
            deleted = Some(at);
        }
        if handed.is_none() && all_on(&lvs, t.handles, &t.taker.name).await {
            handed = Some(at);
        }
        if let Some(p) = now.filter(|p| p.uid() != before.uid()) {
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                assert_eq!(node, t.taker.name, "the pod goes to the node with the path");
            }
            if running.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            {
                running = Some(at);
            }
            if running.is_some()
                && let Some(line) = read_line(&pods).await
            {
                break line;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let moved = lost.elapsed();
    assert_eq!(
        read,
        format!("read {} {}", t.token, t.token),
        "what it wrote, on both volumes"
    );
    let fenced_at = fenced_at.expect("the node said it was fenced");
    let deleted = deleted.expect("the old pod went");
    assert!(
        fenced_at <= deleted,
        "the pod was released ({deleted:?}) before its node said it was fenced ({fenced_at:?})"
    );
    println!(
        "installed_shared: lost path on {}: fenced by the hook {} s, its lease counted dead by {} \
         {} s, pod deleted {} s, volumes handed over {} s, label taken {} s, Running on {} {} s, \
         read back {:.0} s",
        t.fenced.name,
        secs(Some(fenced_at)),
        t.taker.name,
        secs(dead_seen),
        secs(Some(deleted)),
        secs(handed),
        secs(unlabelled),
        t.taker.name,
        secs(running),
        moved.as_secs_f64()
    );

    // Both filesystems check clean: the pod stops, and each volume, once its node let it go, is
    // checked where it is (its journal was replayed by the taker's mount).
    Api::<StatefulSet>::namespaced(t.client.clone(), t.ns)
        .patch(
            "mover",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    eventually("the pod is gone", SLOW, || {
        let pods = pods.clone();
        async move {
            match pods.get_opt("mover-0").await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    for h in t.handles {
        let check = format!(
            "{LVM} lvchange {LVM_CLASS} -aey {SAN}/{h} && {{ e2fsck -fn /dev/{SAN}/{h}; rc=$?; \
             {LVM} lvchange {LVM_CLASS} -an {SAN}/{h}; exit $rc; }}"
        );
        let out = eventually("the volume checks clean", SLOW, || {
            let vm = t.taker.vm.clone();
            let check = check.clone();
            async move {
                let (code, out) = vm.sh(&check).await;
                (code == 0).then_some(out.clone()).ok_or(out)
            }
        })
        .await;
        println!("installed_shared: e2fsck -fn of {h} after the lost path: clean\n{out}");
    }

    // Nothing of the class is open on the fenced node any more (kubelet unmounted the volumes):
    // it waits only for the path. The path comes back, and the node joins again by itself.
    t.fenced.vm.ok("/run/node-bin/lun-path restore").await;
    let restored = Instant::now();
    eventually("the fenced node joins again by itself", SLOW, || {
        let statuses = statuses.clone();
        let name = t.fenced.name.clone();
        async move {
            let st = statuses.get(&name).await.map_err(|e| e.to_string())?;
            let shared = shared_of(&st).ok_or("no shared status")?;
            let fenced = shared.fencing.as_ref().is_some_and(|f| f.fenced);
            (!fenced && shared.host_id.is_some())
                .then_some(())
                .ok_or(format!("{shared:?}"))
        }
    })
    .await;
    let rejoined = restored.elapsed();
    let line = format!("s lvm_{SAN}:{}:", t.fenced_host_id);
    eventually(
        "its sanlock holds the class's lockspace again",
        SLOW,
        || {
            let vm = t.fenced.vm.clone();
            let line = line.clone();
            async move {
                let (code, out) = vm.sh("sanlock client status").await;
                (code == 0
                    && out
                        .lines()
                        .any(|l| l.starts_with(&line) && !l.contains(" ADD")))
                .then_some(())
                .ok_or(out)
            }
        },
    )
    .await;
    let events =
        Api::<k8s_openapi::api::events::v1::Event>::namespaced(t.client.clone(), INSTALL_NS);
    let note = eventually("an Event says the node joined again", SLOW, || {
        let events = events.clone();
        let name = t.fenced.name.clone();
        async move {
            let list = events
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("Rejoined"))
                .filter_map(|e| e.note)
                .find(|n| n.contains(&name))
                .ok_or_else(|| "no Rejoined Event yet".to_owned())
        }
    })
    .await;
    eventually("the class's label is back", SLOW, || {
        let nodes = nodes.clone();
        let name = t.fenced.name.clone();
        let (label, annotation) = (label.clone(), annotation.clone());
        async move {
            let n = nodes.get(&name).await.map_err(|e| e.to_string())?;
            (n.labels().get(&label).map(String::as_str) == Some("true")
                && !n.annotations().contains_key(&annotation))
            .then_some(())
            .ok_or(format!("{:?} {:?}", n.labels(), n.annotations()))
        }
    })
    .await;
    println!(
        "installed_shared: {} joined again {:.0} s after its path came back, label back {:.0} s \
         ({note})",
        t.fenced.name,
        rejoined.as_secs_f64(),
        restored.elapsed().as_secs_f64()
    );
}

/// Rollback, as docs/shared-classes.md says (issue 38): lvms-rs's Deployment and DaemonSet are
/// deleted (the CRDs, the `LVMCluster`, the `LogicalVolume`s, the claims and the LVs stay) and the
/// Deployment is created again as it was applied; the operator renders the DaemonSet again, and
/// the StatefulSet's pod, started anew, is served and reads back what it wrote.
async fn rollback(client: &Client, ns: &str, token: &str) {
    let deployments = Api::<Deployment>::namespaced(client.clone(), INSTALL_NS);
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), INSTALL_NS);
    let lvms_pods = Api::<Pod>::namespaced(client.clone(), INSTALL_NS);
    let saved = deployments.get(OPERATOR).await.unwrap();
    let started = Instant::now();
    let gone = |what: &'static str, selector: &'static str| {
        let lvms_pods = lvms_pods.clone();
        eventually(what, SLOW, move || {
            let lvms_pods = lvms_pods.clone();
            async move {
                let list = lvms_pods
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|e| e.to_string())?;
                let names: Vec<String> = list.items.iter().map(ResourceExt::name_any).collect();
                names.is_empty().then_some(()).ok_or(format!("{names:?}"))
            }
        })
    };
    // The operator first, and its pod gone, or while it shuts down it renders the DaemonSet
    // again (a first version of this test deleted both at once and the DaemonSet came back).
    deployments
        .delete(OPERATOR, &DeleteParams::default())
        .await
        .unwrap();
    gone(
        "the operator's pod is gone",
        "app.kubernetes.io/name=lvms-operator",
    )
    .await;
    daemonsets
        .delete(NODE_DAEMON_SET, &DeleteParams::default())
        .await
        .unwrap();
    gone(
        "the node pods are gone",
        "app.kubernetes.io/name=vg-manager",
    )
    .await;
    let gone = started.elapsed();
    let again = Deployment {
        metadata: kube::api::ObjectMeta {
            name: saved.metadata.name.clone(),
            namespace: saved.metadata.namespace.clone(),
            labels: saved.metadata.labels.clone(),
            ..Default::default()
        },
        spec: saved.spec.clone(),
        status: None,
    };
    deployments
        .create(&PostParams::default(), &again)
        .await
        .unwrap();
    operator_ready(client).await;
    let sts = Api::<StatefulSet>::namespaced(client.clone(), ns);
    sts.patch(
        "mover",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    wait_running(&pods, "mover-0").await;
    let expected = format!("read {token} {token}");
    wait_log(&pods, "mover-0", "the pod reads what it wrote", |l| {
        (l == expected).then_some(())
    })
    .await;
    println!(
        "installed_shared: rollback: lvms-rs's pods gone {:.0} s after its Deployment and \
         DaemonSet were deleted; created again, the StatefulSet's pod read back its data {:.0} s \
         after the deletion",
        gone.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
