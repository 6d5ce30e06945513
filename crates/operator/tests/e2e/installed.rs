//! An installed lvms-rs (operator, CSI sidecars and node agents from `deploy/` or the Helm chart) on
//! a node with a kubelet and a spare disk, driven as a user drives it: the operator's pod becomes
//! Ready and its webhook answers through its Service, an `LVMCluster` becomes Ready, the node
//! plugin registers with kubelet, a WaitForFirstConsumer claim is bound and mounted by a Pod that
//! writes a file a second Pod reads back, a block claim is a block device in its Pod, a claim is
//! expanded while mounted, the node DaemonSet rolls to a new image under a writer, the operator
//! pod is deleted mid-reconcile, and deleting the claims removes their LVs.
//!
//! `cargo xtask installed` runs it on the test node (ADR 0018). Elsewhere it runs only with
//! `LVMS_E2E=1`, `LVMS_E2E_DEVICE` naming the spare disk, `LVMS_E2E_NODE` the node that has it,
//! `LVMS_E2E_POD_IMAGE` an image with a busybox shell, `LVMS_E2E_IMAGE` the lvms-rs image
//! installed and `LVMS_E2E_ROLL_IMAGE` a second one to roll to, and `LVMS_E2E_VM` the node's command server (`xtask guest-serve`, for `lvs`
//! and process RSS). `cargo xtask installed` boots a second node beside it and names it too:
//! `LVMS_E2E_NODE2`, its command server `LVMS_E2E_VM2`, its spare disk `LVMS_E2E_DEVICE2`, and the
//! shared LUN both nodes attach, `LVMS_E2E_SHARED_DEVICE`; the test's class selects the first node
//! only. lvms-rs never wipes a disk without `forceWipeDevicesAndDestroyAllData`.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    coordination::v1::Lease,
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::CSINode,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCluster, topolvm::LogicalVolume};
use serde_json::json;

mod adopt;

use crate::{
    stack::Vm,
    support::{self, TestNamespace, eventually},
};

/// Building a volume group and thin pool, and starting containers in a TCG VM, take longer than API
/// round trips.
pub(crate) const SLOW: Duration = Duration::from_secs(600);
pub(crate) const INSTALL_NS: &str = "lvms-system";
pub(crate) const OPERATOR: &str = "lvms-operator";
pub(crate) const NODE_DAEMON_SET: &str = "vg-manager";
pub(crate) const DRIVER: &str = lvms_api::DEFAULT_DRIVER_NAME;
/// The StorageClass the operator renders for the device class `e2e`.
const CLASS: &str = "lvms-e2e";

pub(crate) struct Env {
    pub(crate) device: String,
    pub(crate) node: String,
    pub(crate) image: String,
    /// The lvms-rs image installed, and the one the upgrade rolls to.
    pub(crate) install_image: String,
    pub(crate) roll_image: String,
    pub(crate) vm: Vm,
    /// When `kubectl apply` of the manifests started (the clock the install times count from).
    pub(crate) applied: Option<SystemTime>,
    /// The second node, when there is one.
    pub(crate) node2: Option<SecondNode>,
}

/// A second node with a spare disk of its own, and the shared LUN both nodes attach.
pub(crate) struct SecondNode {
    pub(crate) node: String,
    pub(crate) vm: Vm,
    pub(crate) device: String,
    pub(crate) shared_device: String,
    /// Its second spare disk, for csi-driver-lvm's volume group (`LVMS_E2E_CSI_LVM_DEVICE`).
    pub(crate) csi_lvm_device: Option<String>,
    /// Its third, for a plain TopoLVM install's volume group (`LVMS_E2E_TOPOLVM_DEVICE`).
    pub(crate) topolvm_device: Option<String>,
}

pub(crate) fn env() -> Option<Env> {
    let var = |k: &str| std::env::var(k).ok();
    Some(Env {
        device: var("LVMS_E2E_DEVICE")?,
        node: var("LVMS_E2E_NODE")?,
        image: var("LVMS_E2E_POD_IMAGE")?,
        install_image: var("LVMS_E2E_IMAGE")?,
        roll_image: var("LVMS_E2E_ROLL_IMAGE")?,
        vm: Vm::new(var("LVMS_E2E_VM")?),
        applied: var("LVMS_E2E_APPLIED_AT_MS")
            .and_then(|ms| ms.parse().ok())
            .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
        node2: (|| {
            Some(SecondNode {
                node: var("LVMS_E2E_NODE2")?,
                vm: Vm::new(var("LVMS_E2E_VM2")?),
                device: var("LVMS_E2E_DEVICE2")?,
                shared_device: var("LVMS_E2E_SHARED_DEVICE")?,
                csi_lvm_device: var("LVMS_E2E_CSI_LVM_DEVICE"),
                topolvm_device: var("LVMS_E2E_TOPOLVM_DEVICE"),
            })
        })(),
    })
}

/// Seconds since `kubectl apply`, for the closing report.
pub(crate) fn since_apply(env: &Env) -> String {
    env.applied
        .and_then(|t| t.elapsed().ok())
        .map_or_else(|| "?".to_owned(), |d| format!("{:.0}", d.as_secs_f64()))
}

pub(crate) fn pod(
    name: &str,
    image: &str,
    script: &str,
    volume: serde_json::Value,
    node: &str,
) -> Pod {
    let mut container = json!({
        "name": "c", "image": image, "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", script],
    });
    let volumes = match volume {
        serde_json::Value::Null => json!([]),
        // An inline ephemeral volume: `{"csi": <the Pod volume's csi source>}`.
        v if v.get("csi").is_some() => {
            container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
            json!([{"name": "data", "csi": v["csi"]}])
        }
        v => {
            let claim = v["claim"].as_str().unwrap().to_owned();
            if v["block"] == true {
                container["volumeDevices"] = json!([{"name": "data", "devicePath": "/dev/xvda"}]);
            } else {
                container["volumeMounts"] = json!([{"name": "data", "mountPath": "/data"}]);
            }
            json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}])
        }
    };
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [container], "volumes": volumes,
                 "terminationGracePeriodSeconds": 1,
                 "nodeSelector": {"kubernetes.io/hostname": node}}
    }))
    .unwrap()
}

fn claim(name: &str, size: &str, block: bool) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": CLASS,
                 "volumeMode": if block { "Block" } else { "Filesystem" },
                 "resources": {"requests": {"storage": size}}}
    }))
    .unwrap()
}

async fn create_pod(
    pods: &Api<Pod>,
    env: &Env,
    name: &str,
    script: &str,
    volume: serde_json::Value,
) {
    pods.create(
        &PostParams::default(),
        &pod(name, &env.image, script, volume, &env.node),
    )
    .await
    .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
}

pub(crate) async fn wait_running(pods: &Api<Pod>, name: &str) {
    eventually(&format!("pod {name} is Running"), SLOW, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            let status = p.status.unwrap_or_default();
            match status.phase.as_deref() {
                Some("Running") => Ok(()),
                other => Err(format!(
                    "{other:?} {:?}",
                    status
                        .container_statuses
                        .unwrap_or_default()
                        .into_iter()
                        .map(|c| c.state)
                        .collect::<Vec<_>>()
                )),
            }
        }
    })
    .await;
}

/// Waits until pod `name`'s log holds a line for which `pick` answers (the last such line); that
/// answer. Logs come through the API server from kubelet.
pub(crate) async fn wait_log<T>(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    pick: impl Fn(&str) -> Option<T>,
) -> T {
    let pick = &pick;
    eventually(what, SLOW, || async move {
        let log = pods
            .logs(name, &LogParams::default())
            .await
            .map_err(|e| format!("the log of {name}: {e}"))?;
        log.lines()
            .rev()
            .find_map(pick)
            .ok_or_else(|| format!("log of {name}: {log}"))
    })
    .await
}

pub(crate) async fn delete_pod(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    eventually(&format!("pod {name} is gone"), SLOW, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move {
            match pods.get_opt(&name).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(_) => Err("still there".to_owned()),
            }
        }
    })
    .await;
}

/// Per process of lvms-rs and its sidecars on a node: name, first argument, VmRSS and VmHWM (KiB),
/// CPU seconds (user + system) and age in seconds.
pub(crate) const USAGE: &str = r#"tick=$(getconf CLK_TCK); up=$(cut -d' ' -f1 /proc/uptime)
for c in /proc/[0-9]*/comm; do
  p=${c#/proc/}; p=${p%/comm}
  case "$(cat $c 2>/dev/null)" in
    lvms|csi-provisioner|csi-resizer|csi-snapshotter|livenessprobe|csi-node-driver) ;;
    *) continue ;;
  esac
  set -- $(tr '\0' ' ' < /proc/$p/cmdline)
  rss=$(awk '/^VmRSS/ {print $2}' /proc/$p/status); hwm=$(awk '/^VmHWM/ {print $2}' /proc/$p/status)
  awk -v n="${1##*/} $2" -v r="$rss" -v h="$hwm" -v t="$tick" -v u="$up" \
    '{printf "%s rss %d KiB peak %d KiB cpu %.1f s age %.0f s\n", n, r, h, ($14+$15)/t, u-$22/t}' \
    /proc/$p/stat
done"#;

/// The LVs of the class's volume group and their sizes, as LVM reports them on the node.
async fn lvs(vm: &Vm) -> String {
    vm.ok("lvm lvs --noheadings --units b -o vg_name,lv_name,lv_size,lv_attr 2>/dev/null | sort")
        .await
}

/// The leading operator pod's name (the holder of the Lease `lvms-operator`) once its Deployment
/// has rolled out: every replica of the current template Ready, none of an older one left.
pub(crate) async fn operator_ready(client: &Client) -> String {
    let deployments = Api::<Deployment>::namespaced(client.clone(), INSTALL_NS);
    let pods = Api::<Pod>::namespaced(client.clone(), INSTALL_NS);
    let leases = Api::<Lease>::namespaced(client.clone(), INSTALL_NS);
    eventually("the operator's pods are Ready and one leads", SLOW, || {
        let (deployments, pods, leases) = (deployments.clone(), pods.clone(), leases.clone());
        async move {
            let d = deployments.get(OPERATOR).await.map_err(|e| e.to_string())?;
            let status = d.status.clone().unwrap_or_default();
            let generation = d.metadata.generation.unwrap_or_default();
            let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            if status.observed_generation != Some(generation)
                || status.updated_replicas != Some(want)
                || status.ready_replicas != Some(want)
                || status.replicas != Some(want)
            {
                return Err(format!("{status:?}"));
            }
            let list = pods
                .list(&ListParams::default().labels("app.kubernetes.io/name=lvms-operator"))
                .await
                .map_err(|e| e.to_string())?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                })
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            let leader = leases
                .get_opt(lvms_operator::LEADER_LEASE)
                .await
                .map_err(|e| e.to_string())?
                .and_then(|l| l.spec?.holder_identity)
                .unwrap_or_default();
            if ready.len() == usize::try_from(want).unwrap_or(1) && ready.contains(&leader) {
                Ok(leader)
            } else {
                Err(format!("ready operator pods {ready:?}, leader {leader:?}"))
            }
        }
    })
    .await
}

/// The node DaemonSet's pod on `node` once it runs `image` and is Ready; its name.
pub(crate) async fn node_pod_ready(client: &Client, image: &str, node: &str) -> String {
    let pods = Api::<Pod>::namespaced(client.clone(), INSTALL_NS);
    let image = image.to_owned();
    let node = node.to_owned();
    eventually(
        &format!("the node pod runs {image} and is Ready"),
        SLOW,
        || {
            let pods = pods.clone();
            let image = image.clone();
            let node = node.clone();
            async move {
                let list = pods
                    .list(
                        &ListParams::default()
                            .labels(&format!("app.kubernetes.io/name={NODE_DAEMON_SET}"))
                            .fields(&format!("spec.nodeName={node}")),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let found: Vec<(String, Option<String>, bool)> = list
                    .items
                    .iter()
                    .map(|p| {
                        let spec_image = p
                            .spec
                            .as_ref()
                            .and_then(|s| s.containers.first())
                            .and_then(|c| c.image.clone());
                        let ready = p
                            .status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| {
                                c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                            });
                        (
                            p.metadata.name.clone().unwrap_or_default(),
                            spec_image,
                            ready && p.metadata.deletion_timestamp.is_none(),
                        )
                    })
                    .collect();
                match found.as_slice() {
                    [(name, Some(i), true)] if *i == image => Ok(name.clone()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
}

/// Sets the operator's image and the node agent's image (`LVMS_IMAGE`) to `image`: an upgrade.
async fn set_lvms_image(client: &Client, image: &str) {
    let deployments = Api::<Deployment>::namespaced(client.clone(), INSTALL_NS);
    let patch = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "operator", "image": image, "env": [{"name": "LVMS_IMAGE", "value": image}]},
        {"name": "csi-controller", "image": image},
    ]}}}});
    deployments
        .patch(OPERATOR, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
}

#[tokio::test]
#[ignore = "needs lvms-rs installed on a node with a kubelet: run by `cargo xtask installed`"]
async fn an_installed_lvms_serves_a_pod_its_claim_through_kubelet() {
    const TEST: &str = "an_installed_lvms_serves_a_pod_its_claim_through_kubelet";
    if !support::enabled(TEST) {
        return;
    }
    let Some(env) = env() else {
        eprintln!(
            "{TEST}: skipped (run by `cargo xtask installed`, which passes LVMS_E2E_DEVICE, \
             LVMS_E2E_NODE, LVMS_E2E_POD_IMAGE, LVMS_E2E_IMAGE, LVMS_E2E_ROLL_IMAGE and LVMS_E2E_VM)"
        );
        return;
    };
    let started = Instant::now();
    let client = support::client().await;

    // The operator's pod is Ready, and its webhook answers through its Service: an LVMCluster
    // with a relative device path is denied by it, not by the schema.
    operator_ready(&client).await;
    println!(
        "installed: operator pod Ready {} s after kubectl apply",
        since_apply(&env)
    );
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), INSTALL_NS);
    // The class is on the test's node only: another node lacks its disk.
    let cluster = |paths: serde_json::Value| -> LVMCluster {
        serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
            "metadata": {"name": "e2e", "namespace": INSTALL_NS},
            "spec": {"storage": {"deviceClasses": [{
                "name": "e2e", "default": true, "fstype": "ext4",
                "deviceSelector": {"paths": paths},
                "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In", "values": [env.node]
                }]}]},
                "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}
            }]}}
        }))
        .unwrap()
    };
    let denied = clusters
        .create(
            &PostParams {
                dry_run: true,
                ..PostParams::default()
            },
            &cluster(json!(["sdb"])),
        )
        .await
        .expect_err("the webhook denies a relative device path");
    let message = denied.to_string();
    assert!(message.contains("denied the request"), "{message}");
    assert!(message.contains("deviceSelector.paths[0]"), "{message}");

    clusters
        .create(&PostParams::default(), &cluster(json!([env.device])))
        .await
        .unwrap_or_else(|e| panic!("creating the LVMCluster in {INSTALL_NS}: {e}"));
    support::wait_cluster_ready(&clusters, "e2e", SLOW).await;
    println!(
        "installed: LVMCluster Ready {} s after kubectl apply",
        since_apply(&env)
    );
    let first_node_pod = node_pod_ready(&client, &env.install_image, &env.node).await;
    println!("installed: node pod {first_node_pod}");

    // node-driver-registrar registered the driver with kubelet: CSINode names it and its
    // topology key.
    let csinode = eventually("CSINode lists topolvm.io", SLOW, || {
        let csinodes = Api::<CSINode>::all(client.clone());
        let node = env.node.clone();
        async move {
            let c = csinodes.get(&node).await.map_err(|e| e.to_string())?;
            c.spec
                .drivers
                .iter()
                .find(|d| d.name == DRIVER)
                .cloned()
                .ok_or_else(|| format!("{:?}", c.spec.drivers))
        }
    })
    .await;
    assert_eq!(
        csinode.topology_keys,
        Some(vec!["topology.topolvm.io/node".to_owned()]),
        "{csinode:?}"
    );

    // A WaitForFirstConsumer claim, bound when a Pod uses it; the Pod writes a file.
    let ns = TestNamespace::create(
        &client,
        &format!("lvms-installed-{}", support::suffix()),
        &[],
    )
    .await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    pvcs.create(&PostParams::default(), &claim("data", "1Gi", false))
        .await
        .unwrap();
    let token = format!("written-{}", support::suffix());
    create_pod(
        &pods,
        &env,
        "writer",
        &format!("echo {token} > /data/file && sync && echo wrote && sleep 3600"),
        json!({"claim": "data"}),
    )
    .await;
    let volume = eventually("the claim is Bound", SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.map_err(|e| e.to_string())?;
            let status = c.status.unwrap_or_default();
            match (status.phase.as_deref(), c.spec.and_then(|s| s.volume_name)) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    println!(
        "installed: first claim Bound {} s after kubectl apply",
        since_apply(&env)
    );
    wait_running(&pods, "writer").await;
    println!(
        "installed: first Pod Running {} s after kubectl apply",
        since_apply(&env)
    );
    wait_log(&pods, "writer", "the writer wrote", |l| {
        (l == "wrote").then_some(())
    })
    .await;

    // The PersistentVolume's handle is a LogicalVolume the node agent made on the node.
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .unwrap();
    let handle = pv.spec.unwrap().csi.unwrap().volume_handle;
    let lv = Api::<LogicalVolume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap_or_else(|e| panic!("LogicalVolume {handle}: {e}"));
    let status = lv.status.clone().unwrap_or_default();
    assert_eq!(status.volume_id, handle, "{lv:?}");
    assert!(
        lvs(&env.vm).await.contains(&handle),
        "LV {handle} on the node"
    );

    // Deleted and re-created, a Pod reads the file back.
    delete_pod(&pods, "writer").await;
    create_pod(
        &pods,
        &env,
        "reader",
        "cat /data/file; while :; do df -kP /data | tail -n 1; sleep 3; done",
        json!({"claim": "data"}),
    )
    .await;
    wait_running(&pods, "reader").await;
    let read = wait_log(&pods, "reader", "the reader printed the file", |l| {
        l.starts_with("written-").then(|| l.to_owned())
    })
    .await;
    assert_eq!(read, token, "the file written by the first Pod");

    // Expanded while mounted: the Pod sees the new size.
    let df_kib = |l: &str| -> Option<u64> { l.split_whitespace().nth(1)?.parse().ok() };
    let before = wait_log(&pods, "reader", "df in the reader", df_kib).await;
    pvcs.patch(
        "data",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
    )
    .await
    .unwrap();
    let after = wait_log(
        &pods,
        "reader",
        "the reader sees the expanded filesystem",
        |l| df_kib(l).filter(|k| *k > 1_800_000),
    )
    .await;
    println!("installed: the filesystem grew from {before} KiB to {after} KiB in its Pod");
    eventually("the claim reports 2Gi", SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.map_err(|e| e.to_string())?;
            let cap = c
                .status
                .and_then(|s| s.capacity)
                .and_then(|c| c.get("storage").cloned());
            match cap {
                Some(q) if q.0 == "2Gi" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    delete_pod(&pods, "reader").await;

    // A block claim is a block device in its Pod.
    pvcs.create(&PostParams::default(), &claim("raw", "512Mi", true))
        .await
        .unwrap();
    create_pod(
        &pods,
        &env,
        "block",
        "if [ -b /dev/xvda ]; then echo \"block $(blockdev --getsize64 /dev/xvda)\"; \
         else echo not-a-block-device; fi; sleep 3600",
        json!({"claim": "raw", "block": true}),
    )
    .await;
    let block = wait_log(&pods, "block", "the block Pod printed its device", |l| {
        (l.starts_with("block ") || l == "not-a-block-device").then(|| l.to_owned())
    })
    .await;
    assert_eq!(
        block,
        format!("block {}", 512 * 1024 * 1024),
        "the Pod's /dev/xvda"
    );
    delete_pod(&pods, "block").await;

    // An inline ephemeral volume: kubelet's NodePublish makes an LV of the asked size for the Pod
    // alone, tagged ephemeral, and its NodeUnpublish, when the Pod goes, removes it.
    create_pod(
        &pods,
        &env,
        "inline",
        "df -kP /data | tail -1 | awk '{print \"size \" $2}'; echo kept > /data/f && \
         echo \"wrote $(cat /data/f)\"; sleep 3600",
        json!({"csi": {"driver": DRIVER, "volumeAttributes": {"size": "320Mi"}}}),
    )
    .await;
    let wrote = wait_log(&pods, "inline", "the inline Pod wrote its file", |l| {
        l.starts_with("wrote ").then(|| l.to_owned())
    })
    .await;
    assert_eq!(wrote, "wrote kept");
    let kib: u64 = wait_log(&pods, "inline", "the inline Pod printed its size", |l| {
        l.strip_prefix("size ").and_then(|n| n.parse().ok())
    })
    .await;
    assert!(
        (250 * 1024..=320 * 1024).contains(&kib),
        "a 320 MiB filesystem, less its own overhead: {kib} KiB"
    );
    let inline_lvs = env
        .vm
        .ok("lvm lvs --noheadings -o lv_name,lv_size,lv_tags --units m 2>/dev/null | grep lvms.ephemeral")
        .await;
    assert_eq!(inline_lvs.lines().count(), 1, "{inline_lvs}");
    assert!(inline_lvs.contains("320.00m"), "{inline_lvs}");
    assert!(inline_lvs.contains("lvms.pod-name=inline"), "{inline_lvs}");
    delete_pod(&pods, "inline").await;
    eventually("the inline volume's LV is removed", SLOW, || async {
        let left = env
            .vm
            .ok("lvm lvs --noheadings -o lv_name,lv_tags 2>/dev/null | grep -c lvms.ephemeral || true")
            .await;
        (left.trim() == "0").then_some(()).ok_or(left)
    })
    .await;

    // The node DaemonSet rolls to a new image while a Pod writes: the writer keeps writing
    // through the roll, never restarts, and every line it wrote is in the file.
    create_pod(
        &pods,
        &env,
        "seq",
        "i=0; while :; do echo $i >> /data/seq; echo \"n $i\"; i=$((i+1)); sleep 1; done",
        json!({"claim": "data"}),
    )
    .await;
    wait_running(&pods, "seq").await;
    let seq_n = |l: &str| -> Option<u64> { l.strip_prefix("n ")?.parse().ok() };
    let at_roll = wait_log(&pods, "seq", "the writer writes", seq_n).await;
    let rolled = Instant::now();
    set_lvms_image(&client, &env.roll_image).await;
    let new_node_pod = node_pod_ready(&client, &env.roll_image, &env.node).await;
    assert_ne!(new_node_pod, first_node_pod, "the DaemonSet made a new pod");
    println!(
        "installed: the node DaemonSet rolled to {} in {:.0} s",
        env.roll_image,
        rolled.elapsed().as_secs_f64()
    );
    let after_roll = wait_log(&pods, "seq", "the writer writes after the roll", |l| {
        seq_n(l).filter(|n| *n > at_roll + 5)
    })
    .await;
    let seq_pod = pods.get("seq").await.unwrap();
    let restarts: i32 = seq_pod
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .sum();
    assert_eq!(restarts, 0, "the writer never restarted");
    delete_pod(&pods, "seq").await;
    create_pod(
        &pods,
        &env,
        "check",
        "awk 'NR-1 != $1 { bad++ } END { print \"lines\", NR, \"gaps\", bad+0 }' /data/seq; sleep 3600",
        json!({"claim": "data"}),
    )
    .await;
    let (lines, gaps) = wait_log(&pods, "check", "the check counted the lines", |l| {
        let mut w = l.split_whitespace();
        match (w.next(), w.next(), w.next(), w.next()) {
            (Some("lines"), Some(n), Some("gaps"), Some(g)) => {
                Some((n.parse::<u64>().ok()?, g.parse::<u64>().ok()?))
            }
            _ => None,
        }
    })
    .await;
    assert_eq!(gaps, 0, "every line in order");
    assert!(
        lines > after_roll,
        "{lines} lines, {after_roll} printed after the roll"
    );
    delete_pod(&pods, "check").await;

    // The leading operator pod deleted mid-reconcile: the other replica leads (the deleted one
    // hands the Lease back as it stops), nothing on disk changes.
    let on_disk = lvs(&env.vm).await;
    let old_operator = operator_ready(&client).await;
    clusters
        .patch(
            "e2e",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"lvms-e2e/touch": support::suffix()}}}),
            ),
        )
        .await
        .unwrap();
    // A claim being provisioned as the pod goes: its pod is scheduled first (WaitForFirstConsumer),
    // then the leading provisioner makes the volume.
    pvcs.create(&PostParams::default(), &claim("during", "64Mi", false))
        .await
        .unwrap();
    create_pod(
        &pods,
        &env,
        "during",
        "echo during > /data/f && sync && echo wrote && sleep 3600",
        json!({"claim": "during"}),
    )
    .await;
    let leases = Api::<Lease>::namespaced(client.clone(), INSTALL_NS);
    for l in leases.list(&ListParams::default()).await.unwrap().items {
        println!(
            "installed: Lease {} held by {:?}",
            l.metadata.name.unwrap_or_default(),
            l.spec.and_then(|s| s.holder_identity)
        );
    }
    Api::<Pod>::namespaced(client.clone(), INSTALL_NS)
        .delete(&old_operator, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    let next = eventually("another replica leads", SLOW, || async {
        let holder = leases
            .get(lvms_operator::LEADER_LEASE)
            .await
            .map_err(|e| e.to_string())?
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        (!holder.is_empty() && holder != old_operator)
            .then_some(holder)
            .ok_or_else(|| format!("held by {old_operator}"))
    })
    .await;
    println!(
        "installed: leading operator pod {old_operator} deleted; {next} leads {:.1} s later",
        deleted.elapsed().as_secs_f64()
    );
    let new_operator = eventually("a new operator pod is Ready", SLOW, || {
        let client = client.clone();
        let old = old_operator.clone();
        async move {
            let name = operator_ready(&client).await;
            if name == old {
                Err("the old pod".to_owned())
            } else {
                Ok(name)
            }
        }
    })
    .await;
    println!("installed: operator pod {old_operator} replaced; {new_operator} leads");
    wait_log(
        &pods,
        "during",
        "the claim made during the handover is written",
        |l| (l == "wrote").then_some(()),
    )
    .await;
    println!(
        "installed: the claim made as the leader went is served {:.1} s after",
        deleted.elapsed().as_secs_f64()
    );
    delete_pod(&pods, "during").await;
    support::wait_cluster_ready(&clusters, "e2e", SLOW).await;
    // Every LV there before is as it was (the claim made during the handover added one).
    let now_on_disk = lvs(&env.vm).await;
    for lv in on_disk.lines() {
        assert!(
            now_on_disk.lines().any(|l| l == lv),
            "{lv} changed: {now_on_disk}"
        );
    }
    let ds = Api::<DaemonSet>::namespaced(client.clone(), INSTALL_NS)
        .get(NODE_DAEMON_SET)
        .await
        .unwrap();
    let ds_image = ds.spec.unwrap().template.spec.unwrap().containers[0]
        .image
        .clone();
    assert_eq!(
        ds_image.as_deref(),
        Some(env.roll_image.as_str()),
        "the DaemonSet's image"
    );

    // What runs on the node: pods, containers, and each lvms process's idle RSS.
    let node_pods = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={}", env.node)))
        .await
        .unwrap();
    for p in &node_pods.items {
        println!(
            "installed: on the node: pod {}/{} with {} containers",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default(),
            p.spec.as_ref().map_or(0, |s| s.containers.len())
        );
    }
    // What the manifests' requests and limits come from: every container process of lvms-rs and
    // its sidecars on the node, its resident memory now and at its peak, and its CPU time over its
    // life.
    for line in env.vm.ok(USAGE).await.lines() {
        println!("installed: usage {line}");
    }

    // Deleting the claims deletes their volumes: no LogicalVolume, no LV left.
    ns.delete().await;
    eventually("the LogicalVolumes are gone", SLOW, || {
        let lvs = Api::<LogicalVolume>::all(client.clone());
        async move {
            let left = lvs
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            if left.items.is_empty() {
                Ok(())
            } else {
                Err(format!("{} left", left.items.len()))
            }
        }
    })
    .await;
    let left = lvs(&env.vm).await;
    assert!(!left.contains(&handle), "LV {handle} removed: {left}");
    clusters
        .delete("e2e", &DeleteParams::default())
        .await
        .unwrap();
    support::wait_cluster_gone(&clusters, "e2e", SLOW).await;
    println!(
        "installed: scenario done in {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
