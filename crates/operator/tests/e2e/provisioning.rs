//! The provisioning path on a real API server, in this process, without disks: the cluster's CSI
//! Controller (`lvms csi-controller`'s service) on a socket, driven by the generated CSI client, and a
//! node agent's LogicalVolume reconciler and capacity publisher (`lvms node`'s) over the in-memory backend
//! standing in for LVM. What is real: LogicalVolume objects, their finalizer (merge patch with
//! `resourceVersion`), their status subresource, the watches both sides wait on, deletion behind the
//! finalizer, and the Node capacity annotations.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::PostParams};
use lvms_api::{
    LOGICAL_VOLUME_FINALIZER, LVMVolumeGroup, LVMVolumeGroupNodeStatus, topolvm::LogicalVolume,
};
use lvms_controller::{backend::NodeBackend, service::ClusterController, view::View};
use lvms_csi::{
    csi::{
        CapacityRange, ControllerExpandVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
        DeleteSnapshotRequest, DeleteVolumeRequest, GetCapacityRequest, TopologyRequirement,
        VolumeCapability, controller_client::ControllerClient,
        volume_capability::access_mode::Mode,
    },
    identity::{Converged, IdentityService},
    ids,
    server::{self, NoNode, Services},
};
use lvms_node::{capacity::Publisher, lv_reconciler};
use lvms_testkit::{
    csi_requests::{mount, on},
    fake_backend::FakeBackend,
};
use serde_json::json;

use crate::support::{self, TestNamespace, WAIT, eventually};

const GIB: i64 = 1 << 30;

fn cap() -> VolumeCapability {
    mount(Mode::SingleNodeWriter, "xfs")
}

/// The annotations Node `name` carries now.
async fn annotations_of(
    nodes: &Api<Node>,
    name: &str,
) -> std::collections::BTreeMap<String, String> {
    nodes
        .get(name)
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default()
}

#[tokio::test]
async fn a_volume_is_made_grown_snapshotted_and_removed_through_logical_volumes() {
    if !support::enabled("a_volume_is_made_grown_snapshotted_and_removed_through_logical_volumes") {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-prov-{sfx}"), &[]).await;
    let node = format!("lvms-e2e-{sfx}-prov");
    support::create_node(&client, &node, &[]).await;

    // The classes the node reports Ready (the in-memory backend serves `thin` and `thick`).
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns.name);
    for (name, spec) in [
        (
            "thin",
            json!({"deviceSelector": {"paths": ["/dev/sdb"]}, "default": true,
                   "thinPoolConfig": {"name": "pool", "overprovisionRatio": 2}}),
        ),
        ("thick", json!({"deviceSelector": {"paths": ["/dev/sdc"]}})),
    ] {
        let vg: LVMVolumeGroup = serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
            "metadata": {"name": name, "namespace": ns.name}, "spec": spec,
        }))
        .unwrap();
        vgs.create(&PostParams::default(), &vg).await.unwrap();
    }
    let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": node, "namespace": ns.name},
        "spec": {"nodeStatus": [{"name": "thin", "status": "Ready"}, {"name": "thick", "status": "Ready"}]},
    }))
    .unwrap();
    Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &status)
        .await
        .unwrap();

    // The node agent's side: the LogicalVolume reconciler and the capacity publisher.
    let backend = Arc::new(FakeBackend::new());
    let agent = tokio::spawn(lv_reconciler::run(Arc::new(lv_reconciler::Context::fixed(
        client.clone(),
        &node,
        backend.clone(),
    ))));
    let (publish, backend_rx) = tokio::sync::watch::channel(Some(backend.clone()));
    let mut publisher = Publisher::new(client.clone(), &node, "topolvm.io", backend_rx);
    publisher.publish_once().await.unwrap();
    let nodes = Api::<Node>::all(client.clone());
    let annotations = annotations_of(&nodes, &node).await;
    assert_eq!(
        annotations
            .get("capacity.topolvm.io/thin")
            .map(String::as_str),
        Some((8u64 << 30).to_string().as_str()),
        "{annotations:?}"
    );

    // The controller's side, on a socket.
    let (view, keep_current) = View::start(client.clone(), &ns.name, "topolvm.io");
    let watches = tokio::spawn(keep_current);
    tokio::time::timeout(WAIT, view.ready())
        .await
        .unwrap()
        .unwrap();
    let lvs: Api<LogicalVolume> = Api::all(client.clone());
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = server::bind(&socket).unwrap();
    let services: Services<NodeBackend, NoNode, ClusterController> = Services {
        identity: IdentityService::new(
            "topolvm.io",
            true,
            Arc::new(NodeBackend::new("", view.clone(), lvs.clone())),
            Converged::default(),
        ),
        controller: Some(
            ClusterController::new(view.clone(), lvs.clone()).with_wait(Duration::from_secs(60)),
        ),
        node: None,
    };
    let (stop, stopped) = support::stop_signal();
    let serving = tokio::spawn(server::serve(listener, services, stopped()));
    let mut csi = ControllerClient::new(server::connect(&socket).await.unwrap());

    // The node's capacity reaches the controller's view.
    eventually("the view sees the node's capacity", WAIT, || {
        let view = view.clone();
        let node = node.clone();
        async move {
            view.available(&node, Some("thin"))
                .filter(|a| *a == 8 << 30)
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", view.available(&node, Some("thin"))))
        }
    })
    .await;
    let capacity = csi
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap()],
            accessible_topology: Some(on(&node)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, 8 * GIB);

    // CreateVolume: a LogicalVolume the agent answers.
    let name = format!("pvc-e2e-{sfx}");
    let id = ids::volume_lv_name(&name);
    let req = CreateVolumeRequest {
        name: name.clone(),
        capacity_range: Some(CapacityRange {
            required_bytes: GIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![on(&node)],
            preferred: vec![on(&node)],
        }),
        ..Default::default()
    };
    let vol = csi
        .create_volume(req.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.volume_id, id);
    assert_eq!(vol.accessible_topology, vec![on(&node)]);
    let lv = lvs.get(&id).await.unwrap();
    assert_eq!(lv.spec.node_name, node);
    assert_eq!(
        lv.metadata.finalizers,
        Some(vec![LOGICAL_VOLUME_FINALIZER.to_owned()])
    );
    let status = lv.status.clone().unwrap();
    assert_eq!((status.volume_id.as_str(), status.code), (id.as_str(), 0));
    // Idempotent.
    let again = csi
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, id);
    assert_eq!(backend.calls(), [format!("create_volume {name}")]);

    // Expand through spec.size and the agent's currentSize.
    let grown = csi
        .controller_expand_volume(ControllerExpandVolumeRequest {
            volume_id: id.clone(),
            capacity_range: Some(CapacityRange {
                required_bytes: 2 * GIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    assert_eq!(
        lvs.get(&id)
            .await
            .unwrap()
            .status
            .unwrap()
            .current_size
            .map(|q| q.0),
        Some((2 * GIB).to_string())
    );

    // A snapshot is a LogicalVolume with a source, on the same node.
    let snap = csi
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: id.clone(),
            name: format!("snap-e2e-{sfx}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let snap_lv = lvs.get(&snap.snapshot_id).await.unwrap();
    assert_eq!(
        (
            snap_lv.spec.source.as_str(),
            snap_lv.spec.access_type.as_str()
        ),
        (id.as_str(), "ro")
    );

    // Deletion waits for the agent to remove the LV and release its finalizer.
    csi.delete_snapshot(DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    csi.delete_volume(DeleteVolumeRequest {
        volume_id: id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(lvs.get_opt(&id).await.unwrap().is_none());
    assert!(lvs.get_opt(&snap.snapshot_id).await.unwrap().is_none());
    assert!(backend.state.lock().unwrap().volumes.is_empty());

    // A class the node no longer serves loses its annotation.
    publish.send_replace(None);
    publisher.publish_once().await.unwrap();
    let annotations = annotations_of(&nodes, &node).await;
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("capacity.topolvm.io/")),
        "{annotations:?}"
    );

    let _ = stop.send(true);
    let _ = serving.await;
    agent.abort();
    watches.abort();
    support::delete_node(&client, &node).await;
    ns.delete().await;
}
