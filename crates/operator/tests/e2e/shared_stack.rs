//! A shared device class on the [`stack`](crate::stack): the node agent in the VM joins it on real
//! LVM with real sanlock and lvmlockd (started in the VM as host services would be), with the host
//! id the operator recorded and the creator Lease on the real API server; a claim on its
//! StorageClass is provisioned in the shared volume group; deleting the LVMCluster makes the agent
//! leave: group, label, lockspace and devices-file entry go.

use std::time::Instant;

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node},
    storage::v1::CSINode,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use lvms_api::{
    LVMCluster, LVMVolumeGroupNodeStatus, LockspaceState, SANLOCK_HOST_IDS_CONFIGMAP, VGStatus,
    VGStatusType, shared_creator_lease_name, shared_topology_key, topolvm::LogicalVolume,
};
use serde_json::{Value, json};

use crate::{
    scenarios,
    stack::{self, DRIVER, NAMESPACE, NODE, SLOW, Vm},
    support::{self, TestNamespace, eventually},
};

/// The LVMCluster of this test.
const CLUSTER: &str = "lvmcluster-shared";
/// Its one device class, shared.
const CLASS: &str = "san";
/// The VM's disk that plays the SAN LUN.
const LUN: &str = "/dev/disk/by-id/virtio-e2e2";
const STORAGE_CLASS: &str = "lvms-san";

/// Starts sanlock (watchdog off: fencing is not tested here) and lvmlockd in the VM unless they
/// run, as their host services would, and waits until each answers its client.
const START_LOCK_DAEMONS: &str = "mkdir -p /run/sanlock /run/lvm; \
     sanlock client status >/dev/null 2>&1 || \
       sanlock daemon -w 0 -U root -G root >/run/sanlock-daemon.log 2>&1 </dev/null; \
     for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done; \
     lvmlockctl --info >/dev/null 2>&1 || lvmlockd -g sanlock >/run/lvmlockd.log 2>&1 </dev/null; \
     for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done; \
     sanlock client status >/dev/null && lvmlockctl --info >/dev/null";

/// An LVM command on the class as the agent runs it (`lvms_host::scope::LockScope::args`): lvmlockd
/// on, the class's devices file.
fn scoped(command: &str) -> String {
    format!(
        "lvm {command} --config global/use_lvmlockd=1 --devicesfile {}",
        lvms_core::shared::devices_file(CLASS)
    )
}

/// The rows of an LVM JSON report (`report[0][kind]`) of `command`, run in the VM with stderr
/// dropped; none when it prints nothing (as when the group does not exist).
async fn report(vm: &Vm, command: &str, kind: &str) -> Vec<Value> {
    let (_, out) = vm.sh(&format!("{command} 2>/dev/null")).await;
    if out.trim().is_empty() {
        return Vec::new();
    }
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    report["report"][0][kind]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The names of the LVs of the shared group, sorted.
async fn shared_lvs(vm: &Vm) -> Vec<String> {
    let rows = report(
        vm,
        &scoped(&format!("lvs --reportformat json -o lv_name {CLASS}")),
        "lv",
    )
    .await;
    let mut names: Vec<String> = rows
        .iter()
        .filter_map(|lv| lv["lv_name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// The node's status entry for the class, once `accept` takes it.
async fn entry_when(
    client: &Client,
    what: &str,
    accept: impl Fn(&VGStatus) -> bool + Copy,
) -> VGStatus {
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), NAMESPACE);
    eventually(what, SLOW, || {
        let statuses = statuses.clone();
        async move {
            let status = statuses.get(NODE).await.map_err(|e| e.to_string())?;
            let entry = status
                .spec
                .lvm_vg_status
                .iter()
                .find(|s| s.name == CLASS)
                .cloned()
                .ok_or_else(|| format!("no {CLASS} in {:?}", status.spec))?;
            accept(&entry)
                .then_some(entry.clone())
                .ok_or_else(|| format!("{entry:?}"))
        }
    })
    .await
}

/// The node's status entry for the class, as soon as there is one.
async fn class_entry(client: &Client) -> VGStatus {
    entry_when(client, "the node reports the shared class", |_| true).await
}

/// The node's status entry for the class, once it says `Ready` and the lockspace `Joined`.
async fn joined_entry(client: &Client) -> VGStatus {
    entry_when(
        client,
        "the node reports the shared class joined",
        |entry| {
            let joined = entry
                .shared
                .as_ref()
                .is_some_and(|s| s.lockspace == LockspaceState::Joined);
            joined && entry.status == Some(VGStatusType::Ready)
        },
    )
    .await
}

#[tokio::test]
async fn stack_a_shared_class_is_joined_serves_a_claim_and_is_left_cleanly() {
    let Some(guard) =
        stack::stack("stack_a_shared_class_is_joined_serves_a_claim_and_is_left_cleanly").await
    else {
        return;
    };
    let stack = guard.as_ref().unwrap();
    let client = support::client().await;
    let vm = &stack.vm;

    // LVMS allows one LVMCluster: the scenarios' goes (the node wipes its group), and comes back
    // at the end.
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), NAMESPACE);
    let found: Vec<String> = clusters
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    for name in &found {
        clusters
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually("no LVMCluster is left", SLOW, || {
        let clusters = clusters.clone();
        async move {
            let left = clusters
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            left.items
                .is_empty()
                .then_some(())
                .ok_or_else(|| format!("{:?}", left.items.iter().map(|c| c.name_any())))
        }
    })
    .await;

    // The host services, and a blank LUN.
    vm.ok(START_LOCK_DAEMONS).await;
    let signatures = vm.ok(&format!("wipefs --no-act {LUN}")).await;
    assert!(
        signatures.trim().is_empty(),
        "the LUN is not blank: {signatures}"
    );

    // The LVMCluster, through the webhook.
    let started = Instant::now();
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {"storage": {"deviceClasses": [{
            "name": CLASS, "deviceAccessPolicy": "shared",
            "deviceSelector": {"paths": [LUN]},
            // sanlock runs without the watchdog in this VM: fencing is tested by the two-VM tests.
            "sharedConfig": {"volumeMode": "Linear", "watchdog": "Disabled"},
        }]}}
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap_or_else(|e| panic!("creating the shared LVMCluster: {e}"));

    // Kubelet asks NodeGetInfo once, at registration: asked while the class is still joining,
    // the agent answers once it joined, with the class-wide segment.
    let key = shared_topology_key(CLASS);
    let first = class_entry(&client).await;
    // Joining, or waiting for the operator's host id first.
    assert_eq!(
        first.status,
        Some(VGStatusType::Progressing),
        "a class new to the node is Progressing: {first:?}"
    );
    let asked = Instant::now();
    let topology = stack.register_driver(&client).await;
    let answered = asked.elapsed();
    assert_eq!(
        topology.get(&key).map(String::as_str),
        Some("true"),
        "{topology:?}"
    );

    // Joined, with the recorded host id.
    let entry = joined_entry(&client).await;
    let join_time = started.elapsed();
    let record = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE)
        .get(SANLOCK_HOST_IDS_CONFIGMAP)
        .await
        .unwrap_or_else(|e| panic!("the host-id record {SANLOCK_HOST_IDS_CONFIGMAP}: {e}"));
    let host_id: i32 = record
        .data
        .as_ref()
        .and_then(|d| d.get(NODE))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no host id for {NODE} in {:?}", record.data));
    assert!((1..=2000).contains(&host_id), "{host_id}");
    let shared = entry.shared.as_deref().unwrap();
    assert!(shared.devices_visible, "{entry:?}");
    assert_eq!(shared.host_id, Some(host_id), "{entry:?}");

    // This node made the group: it holds the creator Lease.
    let lease = Api::<Lease>::namespaced(client.clone(), NAMESPACE)
        .get(&shared_creator_lease_name(CLASS))
        .await
        .unwrap_or_else(|e| panic!("the creator Lease: {e}"));
    assert_eq!(
        lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref()),
        Some(NODE),
        "{lease:?}"
    );

    // The operator lists the node as joined.
    let status = eventually("LVMCluster.status lists the node joined", SLOW, || {
        let clusters = clusters.clone();
        async move {
            let c = clusters.get(CLUSTER).await.map_err(|e| e.to_string())?;
            let status = c.status.unwrap_or_default();
            status
                .device_class_statuses
                .iter()
                .any(|d| d.name == CLASS && d.joined_nodes == [NODE])
                .then_some(status.clone())
                .ok_or_else(|| format!("{status:?}"))
        }
    })
    .await;
    println!("shared LVMCluster status once joined: {:?}", status.state);

    // LVM and sanlock agree.
    let groups = report(
        vm,
        &scoped("vgs --reportformat json -o vg_name,vg_lock_type"),
        "vg",
    )
    .await;
    assert!(
        groups
            .iter()
            .any(|g| g["vg_name"] == CLASS && g["vg_lock_type"] == "sanlock"),
        "{groups:?}"
    );
    let lockspaces = vm.ok("sanlock client status").await;
    assert!(
        lockspaces.contains(&format!("s lvm_{CLASS}:{host_id}:")),
        "host id {host_id}: {lockspaces}"
    );
    let info = vm.ok("lvmlockctl --info").await;
    assert!(
        info.contains(&format!("VG {CLASS} lock_type=sanlock")),
        "{info}"
    );

    // The class-wide topology segment reached the CSINode at that registration.
    let csi_node = Api::<CSINode>::all(client.clone()).get(NODE).await.unwrap();
    assert!(
        csi_node
            .spec
            .drivers
            .iter()
            .any(|d| d.name == DRIVER && d.topology_keys.iter().flatten().any(|k| *k == key)),
        "{csi_node:?}"
    );

    // A claim on the class's StorageClass: bound, its LV in the shared group, and its PV
    // accessible from the class's segment (where the scheduler then puts the pod).
    let ns = TestNamespace::create(
        &client,
        &format!("lvms-e2e-shared-{}", support::suffix()),
        &[],
    )
    .await;
    let before = shared_lvs(vm).await;
    let (pvcs, pods) =
        scenarios::claim_with_consumer(&client, &ns.name, STORAGE_CLASS, "256Mi").await;
    let claimed = Instant::now();
    let volume = eventually("the shared claim is Bound", SLOW, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await.map_err(|e| e.to_string())?;
            let status = c.status.clone().unwrap_or_default();
            match (status.phase.as_deref(), c.spec.and_then(|s| s.volume_name)) {
                (Some("Bound"), Some(pv)) => Ok(pv),
                other => Err(format!("{other:?} {:?}", c.metadata.annotations)),
            }
        }
    })
    .await;
    let bind_time = claimed.elapsed();
    scenarios::consumer_on_node(&pods).await;
    let (handle, terms) = scenarios::pv_handle_and_terms(&client, &volume).await;
    assert!(
        terms.iter().any(|t| t
            .match_expressions
            .iter()
            .flatten()
            .any(|e| e.key == key && e.values.iter().flatten().any(|v| v == "true"))),
        "the PV is accessible from the class's segment: {terms:?}"
    );
    let lv = Api::<LogicalVolume>::all(client.clone())
        .get(&handle)
        .await
        .unwrap_or_else(|e| panic!("LogicalVolume {handle}: {e}"));
    assert_eq!(lv.spec.node_name, NODE);
    let after = shared_lvs(vm).await;
    let made: Vec<_> = after.iter().filter(|n| !before.contains(n)).collect();
    assert_eq!(made, vec![&handle], "the one new LV in the shared group");

    // The volume's node goes out of service (not Ready, tainted node.kubernetes.io/out-of-service):
    // the operator hands the volume to a Ready node of the class, here the VM's, whose agent then
    // answers for it (the claim's deletion below needs it).
    let handed = hand_over_from_a_node_out_of_service(&client, &handle).await;

    // Pod (at once: no kubelet confirms) and claim go; so does the LV.
    pods.delete("consumer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    eventually("the LV is gone from the shared group", SLOW, || {
        let vm = vm.clone();
        let handle = handle.clone();
        let lvs = Api::<LogicalVolume>::all(client.clone());
        async move {
            let names = shared_lvs(&vm).await;
            let object = lvs.get_opt(&handle).await.map_err(|e| e.to_string())?;
            if names.contains(&handle) || object.is_some() {
                Err(format!(
                    "lvs: {names:?}, LogicalVolume: {:?}",
                    object.map(|o| o.name_any())
                ))
            } else {
                Ok(())
            }
        }
    })
    .await;
    ns.delete().await;

    // Deleting the LVMCluster: the agent, holder of the creator Lease and the only node, removes
    // the group and leaves; the finalizers go.
    let leaving = Instant::now();
    clusters
        .delete(CLUSTER, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the shared LVMCluster is gone", SLOW, || {
        let clusters = clusters.clone();
        let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), NAMESPACE);
        async move {
            match clusters.get_opt(CLUSTER).await.map_err(|e| e.to_string())? {
                None => Ok(()),
                Some(c) => Err(format!(
                    "{:?} {:?}; node status: {:?}",
                    c.metadata.finalizers,
                    c.status,
                    statuses.get_opt(NODE).await.ok().flatten().map(|s| s.spec)
                )),
            }
        }
    })
    .await;
    let leave_time = leaving.elapsed();

    // Nothing of the class is left in the VM.
    let groups = report(vm, &scoped("vgs --reportformat json -o vg_name"), "vg").await;
    assert!(
        !groups.iter().any(|g| g["vg_name"] == CLASS),
        "vgs: {groups:?}"
    );
    let pvs = report(
        vm,
        &format!(
            "lvm pvs --config global/use_lvmlockd=0 --devices {LUN} --reportformat json -o pv_name"
        ),
        "pv",
    )
    .await;
    assert!(pvs.is_empty(), "pvs on the LUN: {pvs:?}");
    let signatures = vm.ok(&format!("wipefs --no-act {LUN}")).await;
    assert!(
        signatures.trim().is_empty(),
        "the LUN keeps a signature: {signatures}"
    );
    let lockspaces = vm.ok("sanlock client status").await;
    assert!(
        !lockspaces.contains(&format!("lvm_{CLASS}")),
        "{lockspaces}"
    );
    let info = vm.ok("lvmlockctl --info").await;
    assert!(!info.contains(&format!("VG {CLASS} ")), "{info}");
    let (_, listed) = vm
        .sh(&format!(
            "lvm lvmdevices --devicesfile {}",
            lvms_core::shared::devices_file(CLASS)
        ))
        .await;
    assert!(!listed.contains("DEVNAME="), "devices file: {listed}");
    let topology = stack.register_driver(&client).await;
    assert!(!topology.contains_key(&key), "{topology:?}");
    let node = Api::<Node>::all(client.clone()).get(NODE).await.unwrap();
    assert!(!node.labels().contains_key(&key), "{:?}", node.labels());

    println!(
        "shared class: joined {:.1} s after the LVMCluster was created (NodeGetInfo asked while \
         joining answered after {:.1} s), claim Bound in {:.1} s, volume handed over {:.1} s \
         after its node went out of service, left {:.1} s after the LVMCluster was deleted",
        join_time.as_secs_f64(),
        answered.as_secs_f64(),
        bind_time.as_secs_f64(),
        handed.as_secs_f64(),
        leave_time.as_secs_f64()
    );

    // The stack as it was found.
    if !found.is_empty() {
        scenarios::ready_cluster(&client, stack).await;
    }
}

/// Names a Node that is out of service (created here: not Ready, tainted
/// `node.kubernetes.io/out-of-service`) in the `LogicalVolume` `handle`, waits until the operator
/// names the VM's node instead, and deletes that Node; how long the handover took.
async fn hand_over_from_a_node_out_of_service(
    client: &Client,
    handle: &str,
) -> std::time::Duration {
    let nodes = Api::<Node>::all(client.clone());
    let down = format!("lvms-e2e-down-{}", support::suffix());
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": down},
        "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
                             "value": "nodeshutdown", "effect": "NoExecute"}]},
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let lvs = Api::<LogicalVolume>::all(client.clone());
    lvs.patch(
        handle,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"nodeName": down}})),
    )
    .await
    .unwrap();
    let moved = Instant::now();
    eventually(
        "the operator hands the volume of the node out of service to the VM's node",
        SLOW,
        || {
            let lvs = lvs.clone();
            async move {
                let lv = lvs.get(handle).await.map_err(|e| e.to_string())?;
                (lv.spec.node_name == NODE)
                    .then_some(())
                    .ok_or_else(|| format!("spec.nodeName {}", lv.spec.node_name))
            }
        },
    )
    .await;
    let took = moved.elapsed();
    nodes.delete(&down, &DeleteParams::default()).await.unwrap();
    took
}
