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
use lvms_core::layout::Layout;
use lvms_csi::{
    csi::{
        CapacityRange, ControllerExpandVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
        DeleteSnapshotRequest, DeleteVolumeRequest, GetCapacityRequest, TopologyRequirement,
        VolumeCapability, controller_client::ControllerClient,
        volume_capability::access_mode::Mode,
    },
    identity::{Converged, IdentityService},
    params as ids_param,
    server::{self, NoNode, Services},
};
use lvms_csi_controller::{backend::NodeBackend, service::ClusterController, view::View};
use lvms_engine::ids;
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

/// One node agent (LogicalVolume reconciler and capacity publisher over `backend`) and the
/// cluster's CSI Controller on a socket, on the real API server, in a namespace of their own.
struct Stack {
    client: kube::Client,
    ns: TestNamespace,
    node: String,
    sfx: String,
    backend: Arc<FakeBackend>,
    publish: tokio::sync::watch::Sender<Option<Arc<FakeBackend>>>,
    publisher: Publisher<FakeBackend>,
    view: Arc<View>,
    lvs: Api<LogicalVolume>,
    csi: ControllerClient<server::Channel>,
    stop: tokio::sync::watch::Sender<bool>,
    serving: tokio::task::JoinHandle<()>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Stack {
    async fn start(what: &str, backend: FakeBackend) -> Self {
        let client = support::client().await;
        support::install_crds(&client).await;
        let sfx = support::suffix();
        let ns = TestNamespace::create(&client, &format!("lvms-e2e-{what}-{sfx}"), &[]).await;
        let node = format!("lvms-e2e-{sfx}-{what}");
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
        let backend = Arc::new(backend);
        let agent = tokio::spawn(lv_reconciler::run(Arc::new(lv_reconciler::Context::fixed(
            client.clone(),
            &node,
            backend.clone(),
        ))));
        let (publish, backend_rx) = tokio::sync::watch::channel(Some(backend.clone()));
        let mut publisher = Publisher::new(client.clone(), &node, "topolvm.io", backend_rx);
        publisher.publish_once().await.unwrap();

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
            snapshot_metadata: None,
            identity: IdentityService::new(
                "topolvm.io",
                true,
                Arc::new(NodeBackend::new("", view.clone(), lvs.clone())),
                Converged::default(),
            ),
            controller: Some(
                ClusterController::new(view.clone(), lvs.clone())
                    .with_wait(Duration::from_secs(60)),
            ),
            node: None,
        };
        let (stop, stopped) = support::stop_signal();
        let serving = tokio::spawn(async move {
            let _ = server::serve(listener, services, stopped()).await;
        });
        let csi = ControllerClient::new(server::connect(&socket).await.unwrap());
        Self {
            client,
            ns,
            node,
            sfx,
            backend,
            publish,
            publisher,
            view,
            lvs,
            csi,
            stop,
            serving,
            tasks: vec![
                agent,
                tokio::spawn(async move {
                    watches.await.ok();
                }),
            ],
            _dir: dir,
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.serving.await;
        for task in self.tasks {
            task.abort();
        }
        support::delete_node(&self.client, &self.node).await;
        self.ns.delete().await;
    }
}

#[tokio::test]
async fn a_volume_is_made_grown_snapshotted_and_removed_through_logical_volumes() {
    if !support::enabled("a_volume_is_made_grown_snapshotted_and_removed_through_logical_volumes") {
        return;
    }
    let mut st = Stack::start("prov", FakeBackend::new()).await;
    let (node, sfx, backend, view, lvs) = (
        st.node.clone(),
        st.sfx.clone(),
        st.backend.clone(),
        st.view.clone(),
        st.lvs.clone(),
    );
    let csi = &mut st.csi;
    let nodes = Api::<Node>::all(st.client.clone());
    let annotations = annotations_of(&nodes, &node).await;
    assert_eq!(
        annotations
            .get("capacity.topolvm.io/thin")
            .map(String::as_str),
        Some((8u64 << 30).to_string().as_str()),
        "{annotations:?}"
    );

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
    st.publish.send_replace(None);
    st.publisher.publish_once().await.unwrap();
    let annotations = annotations_of(&nodes, &node).await;
    assert!(
        !annotations
            .keys()
            .any(|k| k.starts_with("capacity.topolvm.io/")),
        "{annotations:?}"
    );

    st.stop().await;
}

/// A StorageClass's layout on the real API server: GetCapacity answers per layout from the node's
/// free-space annotation, CreateVolume carries csi-driver-lvm's `type` on the LogicalVolume's
/// `spec.layout` (which the CRD's schema keeps rather than prunes), the node agent makes the
/// volume in that layout, and a layout the node has too few devices for is refused naming them.
#[tokio::test]
async fn a_storage_class_layout_reaches_the_node_through_the_logical_volume() {
    if !support::enabled("a_storage_class_layout_reaches_the_node_through_the_logical_volume") {
        return;
    }
    // `thick`: 1 GiB free over two devices of 128 extents each.
    let mut st = Stack::start("layout", FakeBackend::new().with_devices("thick", 2)).await;
    let (node, view) = (st.node.clone(), st.view.clone());
    eventually("the view sees the node's two devices", WAIT, || {
        let (view, node) = (view.clone(), node.clone());
        async move {
            view.free_space(&node, "thick")
                .filter(|f| f.devices() == 2)
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", view.free_space(&node, "thick")))
        }
    })
    .await;
    let params = |layout: &[(&str, &str)]| {
        std::iter::once((ids_param::DEVICE_CLASS, "thick"))
            .chain(layout.iter().copied())
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect::<std::collections::HashMap<_, _>>()
    };
    let capacity = async |csi: &mut ControllerClient<server::Channel>, layout| {
        csi.get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap()],
            parameters: params(layout),
            accessible_topology: Some(on(&node)),
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity
    };
    const MIB: i64 = 1 << 20;
    // Linear and striped over both devices: all of it; a mirror: one device less its metadata
    // extent.
    assert_eq!(capacity(&mut st.csi, &[]).await, GIB);
    assert_eq!(capacity(&mut st.csi, &[("type", "striped")]).await, GIB);
    assert_eq!(
        capacity(&mut st.csi, &[("type", "mirror")]).await,
        508 * MIB
    );

    let name = format!("pvc-e2e-mirror-{}", st.sfx);
    let id = ids::volume_lv_name(&name);
    let create = |name: &str, layout: &[(&str, &str)]| CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange {
            // XFS's smallest filesystem.
            required_bytes: 300 * MIB,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        parameters: params(layout),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![on(&node)],
            preferred: vec![on(&node)],
        }),
        ..Default::default()
    };
    st.csi
        .create_volume(create(&name, &[("type", "mirror")]))
        .await
        .unwrap();
    // What the API server stored, read back: the layout survived its schema.
    let stored = st.lvs.get(&id).await.unwrap().spec.layout;
    let stored = Layout::from_api(stored.as_ref().expect("spec.layout is kept")).unwrap();
    assert_eq!(stored.name(), "mirror");
    assert_eq!(
        st.backend.state.lock().unwrap().layouts.get(&id),
        Some(&stored)
    );
    {
        let s = st.backend.state.lock().unwrap();
        // Both copies came out of the group's free space.
        assert_eq!(
            (s.volumes[&id].size, s.thick_free["thick"]),
            (300 << 20, 424 << 20),
            "{:?}",
            s.calls
        );
    }
    // The node says so: 53 extents left on each device.
    st.publisher.publish_once().await.unwrap();
    eventually("the view sees the mirror's two copies taken", WAIT, || {
        let (view, node) = (view.clone(), node.clone());
        async move {
            view.free_space(&node, "thick")
                .filter(|f| f.free_extents == [53, 53])
                .map(|_| ())
                .ok_or_else(|| format!("{:?}", view.free_space(&node, "thick")))
        }
    })
    .await;
    assert_eq!(
        capacity(&mut st.csi, &[("type", "mirror")]).await,
        208 * MIB
    );

    // raid5 over two data stripes needs three devices: refused before any LogicalVolume is made.
    let wide = format!("pvc-e2e-raid5-{}", st.sfx);
    let err = st
        .csi
        .create_volume(create(
            &wide,
            &[
                ("lvms.topolvm.io/lv-type", "raid5"),
                ("lvms.topolvm.io/stripes", "2"),
            ],
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("needs 3 LVM physical volumes"),
        "{err:?}"
    );
    assert!(
        st.lvs
            .get_opt(&ids::volume_lv_name(&wide))
            .await
            .unwrap()
            .is_none()
    );

    st.csi
        .delete_volume(DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(st.backend.state.lock().unwrap().volumes.is_empty());
    st.stop().await;
}
