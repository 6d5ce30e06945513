//! The cluster's Controller service on a real socket, driven by the generated CSI client, against the
//! in-memory API server, with two real node agents (`lvms_node::lv_reconciler::run`, the watch-driven
//! controller `lvms node` runs) over in-memory backends answering the `LogicalVolume`s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::HashMap, sync::Arc, time::Duration};

use kube::Api;
use lvms_api::topolvm::LogicalVolume;
use lvms_csi::{
    csi::{
        CreateSnapshotRequest, DeleteSnapshotRequest, DeleteVolumeRequest, GetCapacityRequest,
        GetSnapshotRequest, ListSnapshotsRequest, ListVolumesRequest, VolumeCapability,
        VolumeContentSource, controller_client::ControllerClient,
        volume_capability::access_mode::Mode, volume_content_source,
    },
    identity::{Converged, IdentityService},
    server::{self, Services},
};
use lvms_csi_controller::{backend::NodeBackend, service::ClusterController, view::View};
use lvms_engine::ids;
use lvms_node::lv_reconciler;
use lvms_testkit::{
    csi_requests::{create, expand, mount, on, on_node, snapshot},
    fake_api::FakeApi,
    fake_backend::{FakeBackend, NoNode},
};
use serde_json::json;
use tonic::{Code, transport::Channel};

const NS: &str = "lvms";
const GIB: i64 = 1 << 30;

struct Cluster {
    api: FakeApi,
    view: Arc<View>,
    agents: HashMap<&'static str, Arc<FakeBackend>>,
    client: ControllerClient<Channel>,
    _dir: tempfile::TempDir,
}

fn node(name: &str, thin_gib: u64, thick_gib: u64) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": {
        "capacity.topolvm.io/thin": (thin_gib << 30).to_string(),
        "capacity.topolvm.io/00default": (thin_gib << 30).to_string(),
        "capacity.topolvm.io/thick": (thick_gib << 30).to_string(),
    }}})
}

/// Two nodes serving `thin` (default) and `thick`; node-a has more room.
async fn cluster() -> Cluster {
    let api = FakeApi::new();
    api.insert("/api/v1/nodes/node-a", node("node-a", 8, 100));
    api.insert("/api/v1/nodes/node-b", node("node-b", 2, 1));
    for (name, spec) in [
        (
            "thin",
            json!({"deviceSelector": {"paths": ["/dev/vdb"]}, "default": true,
                   "thinPoolConfig": {"name": "pool", "overprovisionRatio": 2}}),
        ),
        ("thick", json!({"deviceSelector": {"paths": ["/dev/vdc"]}})),
    ] {
        api.insert(
            &format!("/apis/lvm.topolvm.io/v1alpha1/namespaces/{NS}/lvmvolumegroups/{name}"),
            json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
                   "metadata": {"name": name, "namespace": NS}, "spec": spec}),
        );
    }
    let mut agents = HashMap::new();
    for n in ["node-a", "node-b"] {
        api.insert(
            &format!(
                "/apis/lvm.topolvm.io/v1alpha1/namespaces/{NS}/lvmvolumegroupnodestatuses/{n}"
            ),
            json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
                   "metadata": {"name": n, "namespace": NS},
                   "spec": {"nodeStatus": [{"name": "thin", "status": "Ready"},
                                           {"name": "thick", "status": "Ready"}]}}),
        );
        let backend = Arc::new(FakeBackend::new());
        agents.insert(n, backend.clone());
        tokio::spawn(lv_reconciler::run(Arc::new(lv_reconciler::Context::fixed(
            api.client(NS),
            n,
            backend,
        ))));
    }

    let (view, keep_current) = View::start(api.client(NS), NS, "topolvm.io");
    tokio::spawn(keep_current);
    tokio::time::timeout(Duration::from_secs(5), view.ready())
        .await
        .expect("the stores list within 5 s")
        .unwrap();
    let lvs: Api<LogicalVolume> = Api::all(api.client(NS));
    let controller =
        ClusterController::new(view.clone(), lvs.clone()).with_wait(Duration::from_secs(10));
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = server::bind(&socket).unwrap();
    let services: Services<NodeBackend, NoNode, ClusterController> = Services {
        snapshot_metadata: None,
        identity: IdentityService::new(
            "topolvm.io",
            true,
            Arc::new(NodeBackend::new("", view.clone(), lvs)),
            Converged::default(),
        ),
        controller: Some(controller),
        node: None,
    };
    tokio::spawn(server::serve(listener, services, std::future::pending()));
    let channel = server::connect(&socket).await.unwrap();
    Cluster {
        api,
        view,
        agents,
        client: ControllerClient::new(channel),
        _dir: dir,
    }
}

fn cap() -> VolumeCapability {
    mount(Mode::SingleNodeWriter, "ext4")
}

fn lv_path(id: &str) -> String {
    format!("/apis/topolvm.io/v1/logicalvolumes/{id}")
}

#[tokio::test]
async fn create_goes_to_the_roomiest_node_through_a_logical_volume_and_is_idempotent() {
    let mut c = cluster().await;
    let vol = c
        .client
        .create_volume(create("pvc-1", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let id = ids::volume_lv_name("pvc-1");
    assert_eq!(vol.volume_id, id);
    assert_eq!(vol.capacity_bytes, GIB);
    assert_eq!(vol.accessible_topology, vec![on("node-a")]);
    let lv = c.api.get(&lv_path(&id)).expect("the LogicalVolume exists");
    assert_eq!(lv["spec"]["nodeName"], "node-a");
    assert_eq!(lv["spec"]["name"], "pvc-1");
    assert_eq!(lv["status"]["volumeID"], json!(id));

    let again = c
        .client
        .create_volume(create("pvc-1", GIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again, vol);
    assert_eq!(c.agents["node-a"].calls(), ["create_volume pvc-1"]);
    assert!(c.agents["node-b"].calls().is_empty());

    let bigger = c
        .client
        .create_volume(create("pvc-1", 2 * GIB))
        .await
        .unwrap_err();
    assert_eq!(bigger.code(), Code::AlreadyExists, "{bigger:?}");
}

#[tokio::test]
async fn accessibility_requirements_choose_the_node_and_an_unserved_one_is_resource_exhausted() {
    let mut c = cluster().await;
    let mut req = create("pvc-b", GIB);
    req = on_node(req, "node-b");
    let vol = c
        .client
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.accessible_topology, vec![on("node-b")]);
    assert_eq!(c.agents["node-b"].calls(), ["create_volume pvc-b"]);

    let mut req = create("pvc-x", GIB);
    req = on_node(req, "node-x");
    let err = c.client.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("node-x"), "{err:?}");
}

#[tokio::test]
async fn a_failure_the_node_records_is_returned_and_its_logical_volume_removed() {
    let mut c = cluster().await;
    // node-a claims 100 GiB of thick room, its disk (the fake) has 1 GiB.
    let mut req = create("big", 2 * GIB);
    req.parameters = [("topolvm.io/device-class".to_owned(), "thick".to_owned())].into();
    let err = c.client.create_volume(req).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("bytes free"), "{err:?}");
    assert!(c.api.get(&lv_path(&ids::volume_lv_name("big"))).is_none());
    assert_eq!(c.agents["node-a"].calls(), ["create_volume big"]);
}

#[tokio::test]
async fn snapshot_restore_expand_and_delete_follow_the_volume_to_its_node() {
    let mut c = cluster().await;
    let mut req = create("src", GIB);
    req = on_node(req, "node-b");
    let src = c
        .client
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();

    let snap = c
        .client
        .create_snapshot(snapshot(&src.volume_id, "snap-1"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snap.snapshot_id, ids::snapshot_lv_name("snap-1"));
    assert_eq!(snap.source_volume_id, src.volume_id);
    assert!(snap.ready_to_use);

    let mut restore = create("restored", GIB);
    restore.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let restored = c
        .client
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.accessible_topology, vec![on("node-b")]);
    assert_eq!(
        c.agents["node-b"].calls(),
        [
            "create_volume src",
            "create_snapshot snap-1",
            "create_volume restored"
        ]
    );
    assert!(c.agents["node-a"].calls().is_empty());

    let grown = c
        .client
        .controller_expand_volume(expand(&src.volume_id, 2 * GIB, Some(cap())))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    assert!(grown.node_expansion_required);
    assert_eq!(
        c.api.get(&lv_path(&src.volume_id)).unwrap()["status"]["currentSize"],
        json!((2 * GIB).to_string())
    );

    c.client
        .delete_volume(DeleteVolumeRequest {
            volume_id: restored.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(c.api.get(&lv_path(&restored.volume_id)).is_none());
    assert!(
        !c.agents["node-b"]
            .state
            .lock()
            .unwrap()
            .volumes
            .contains_key(&restored.volume_id),
        "the node removed the LV before the object went"
    );
    // Deleting it again, or an id no node knows, is OK.
    for id in [restored.volume_id.clone(), ids::volume_lv_name("never")] {
        c.client
            .delete_volume(DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let missing = c
        .client
        .controller_expand_volume(expand(&ids::volume_lv_name("never"), GIB, None))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
}

#[tokio::test]
async fn get_snapshot_is_answered_from_the_snapshot_node_as_list_snapshots_lists_it() {
    let mut c = cluster().await;
    let mut ids_on = HashMap::new();
    for (name, node) in [("src-a", "node-a"), ("src-b", "node-b")] {
        let vol = c
            .client
            .create_volume(on_node(create(name, GIB), node))
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        ids_on.insert(node, vol.volume_id);
    }
    let snap = c
        .client
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: ids_on["node-b"].clone(),
            name: "snap-b".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    c.client
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: ids_on["node-a"].clone(),
            name: "snap-a".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let get = |c: &Cluster, id: &str| {
        let mut client = c.client.clone();
        let req = GetSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        };
        async move { client.get_snapshot(req).await }
    };

    let got = get(&c, &snap.snapshot_id)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got.snapshot_id, ids::snapshot_lv_name("snap-b"));
    assert_eq!(got.source_volume_id, ids_on["node-b"]);
    assert_eq!(got.size_bytes, GIB);
    assert!(got.ready_to_use && got.creation_time.is_some());
    assert_eq!(got, snap);
    let listed = c
        .client
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].snapshot.as_ref(), Some(&got));

    for (id, want) in [
        (String::new(), Code::InvalidArgument),
        (ids::snapshot_lv_name("never"), Code::NotFound),
        // A volume is not a snapshot.
        (ids_on["node-b"].clone(), Code::NotFound),
    ] {
        let err = get(&c, &id).await.unwrap_err();
        assert_eq!(err.code(), want, "{id}: {err:?}");
    }

    c.client
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(c.api.get(&lv_path(&snap.snapshot_id)).is_none());
    let err = get(&c, &snap.snapshot_id).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    // The other node's snapshot is still there.
    get(&c, &ids::snapshot_lv_name("snap-a")).await.unwrap();
}

#[tokio::test]
async fn list_volumes_pages_over_every_node_and_capacity_is_per_node_or_summed() {
    let mut c = cluster().await;
    for (name, node) in [("v1", "node-a"), ("v2", "node-b"), ("v3", "node-a")] {
        let mut req = create(name, GIB);
        req = on_node(req, node);
        c.client.create_volume(req).await.unwrap();
    }
    let mut ids_seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .client
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        ids_seen.extend(
            page.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    let mut want: Vec<String> = ["v1", "v2", "v3"]
        .iter()
        .map(|n| ids::volume_lv_name(n))
        .collect();
    want.sort();
    assert_eq!(ids_seen, want);

    let on_b = c
        .client
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap()],
            accessible_topology: Some(on("node-b")),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(on_b.available_capacity, 2 * GIB);
    let total = c
        .client
        .get_capacity(GetCapacityRequest {
            volume_capabilities: vec![cap()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(total.available_capacity, 10 * GIB);
    assert_eq!(total.maximum_volume_size, Some(8 * GIB));
}

#[tokio::test]
async fn the_collector_reports_unclaimed_volumes_and_deletes_them_after_the_window_only() {
    let mut c = cluster().await;
    for name in ["claimed", "unclaimed"] {
        c.client.create_volume(create(name, GIB)).await.unwrap();
    }
    let claimed = ids::volume_lv_name("claimed");
    c.client
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: claimed.clone(),
            name: "snap".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    c.api.insert(
        "/api/v1/persistentvolumes/pv-1",
        json!({"metadata": {"name": "pv-1"},
               "spec": {"csi": {"driver": "topolvm.io", "volumeHandle": claimed}}}),
    );
    let lvs: Api<LogicalVolume> = Api::all(c.api.client(NS));
    let unclaimed = ids::volume_lv_name("unclaimed");

    let mut report =
        lvms_csi_controller::gc::ControllerCollector::new(c.view.clone(), lvs.clone(), None);
    let s = report.sweep_once().await.unwrap();
    assert_eq!(
        s.orphans.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        [unclaimed.as_str()],
        "the claimed volume and the snapshot are not orphans"
    );
    assert!(s.delete.is_empty());
    let event = c
        .api
        .requests()
        .into_iter()
        .find(|r| r.path.contains("/events"))
        .expect("an event");
    assert_eq!(event.body["reason"], "OrphanedLogicalVolume");
    assert_eq!(event.body["regarding"]["name"], json!(unclaimed));

    let metrics = Arc::new(lvms_k8s::metrics::GcMetrics::new(
        "unclaimed_logical_volumes",
    ));
    let mut collect = lvms_csi_controller::gc::ControllerCollector::new(
        c.view.clone(),
        lvs,
        Some(Duration::ZERO),
    )
    .with_metrics(metrics.clone());
    let s = collect.sweep_once().await.unwrap();
    assert_eq!(s.delete, std::slice::from_ref(&unclaimed));
    assert_eq!((metrics.orphans.get(), metrics.removed.get()), (1, 1));
    let gone = async {
        while c.api.get(&lv_path(&unclaimed)).is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), gone)
        .await
        .expect("the node agent removes the LV and releases the object");
    assert!(c.api.get(&lv_path(&claimed)).is_some());
    assert!(
        !c.agents["node-a"]
            .state
            .lock()
            .unwrap()
            .volumes
            .contains_key(&unclaimed)
    );
}

/// A volume TopoLVM or LVMS made and the node agent took over (ADR 0032): its object is named
/// `pvc-…` and its id, the LV's name, is a UUID in `status.volumeID`.
#[tokio::test]
async fn a_taken_over_volume_is_found_by_its_status_volume_id_grown_snapshotted_and_deleted() {
    const UID: &str = "7995e78d-8674-4fc7-93b7-56f06f6deaea";
    const OBJECT: &str = "pvc-0d8e3f5c-1111-4222-8333-944455556666";
    let mut c = cluster().await;
    c.agents["node-b"].state.lock().unwrap().volumes.insert(
        UID.to_owned(),
        lvms_engine::backend::Volume {
            id: UID.to_owned(),
            class: "thin".to_owned(),
            size: GIB as u64,
            name: Some(OBJECT.to_owned()),
            source: None,
            snapshot: false,
            thin: true,
            created: Some(1_700_000_000),
            requested: None,
            health: lvms_core::lvattr::LvHealth::Ok,
            device: format!("/dev/thin/{UID}"),
            ephemeral: None,
            open: false,
        },
    );
    c.api.insert(
        &lv_path(OBJECT),
        json!({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
               "metadata": {"name": OBJECT, "uid": UID,
                            "finalizers": [lvms_api::LOGICAL_VOLUME_FINALIZER]},
               "spec": {"name": OBJECT, "nodeName": "node-b", "size": "1Gi", "deviceClass": "thin"},
               "status": {"volumeID": UID, "currentSize": "1Gi"}}),
    );
    let seen = async {
        while c.view.logical_volume(UID).is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), seen)
        .await
        .expect("the view sees the object");
    assert_eq!(c.view.object_name(UID), OBJECT);

    // Grown: the object named pvc-… is patched, not one named after the id.
    let grown = c
        .client
        .controller_expand_volume(expand(UID, 2 * GIB, Some(cap())))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    assert_eq!(
        c.api.get(&lv_path(OBJECT)).unwrap()["spec"]["size"],
        json!((2 * GIB).to_string())
    );
    assert!(
        c.api.get(&lv_path(UID)).is_none(),
        "no object named after the id"
    );

    // A snapshot names its source by the source object's name, as TopoLVM's objects do, and
    // reports the source's id.
    let snap = c
        .client
        .create_snapshot(snapshot(UID, "snap-old"))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snap.source_volume_id, UID);
    assert_eq!(
        c.api.get(&lv_path(&snap.snapshot_id)).unwrap()["spec"]["source"],
        json!(OBJECT)
    );
    assert!(
        c.agents["node-b"]
            .calls()
            .contains(&"create_snapshot snap-old".to_owned())
    );

    // Without a PersistentVolume it is reported as unclaimed by its id, the Event on its object;
    // so is an object of ours made by hand under another name than its id.
    let hand_made = ids::volume_lv_name("hand-made");
    c.api.insert(
        &lv_path("hand-made"),
        json!({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
               "metadata": {"name": "hand-made"},
               "spec": {"name": "hand-made", "nodeName": "node-c", "size": "1Gi"},
               "status": {"volumeID": hand_made, "currentSize": "1Gi"}}),
    );
    let seen = async {
        while c.view.named("hand-made").is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), seen)
        .await
        .expect("the view sees the hand-made object");
    let lvs: Api<LogicalVolume> = Api::all(c.api.client(NS));
    let mut report =
        lvms_csi_controller::gc::ControllerCollector::new(c.view.clone(), lvs.clone(), None);
    let s = report.sweep_once().await.unwrap();
    let mut orphans: Vec<&str> = s.orphans.iter().map(|o| o.id.as_str()).collect();
    orphans.sort_unstable();
    let mut want = [UID, hand_made.as_str()];
    want.sort_unstable();
    assert_eq!(orphans, want);
    let mut regarding: Vec<String> = c
        .api
        .requests()
        .into_iter()
        .filter(|r| r.path.contains("/events"))
        .map(|r| {
            r.body["regarding"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    regarding.sort_unstable();
    assert_eq!(regarding, ["hand-made", OBJECT]);

    // A PersistentVolume holding the id claims the object: the collector leaves it alone.
    c.api.insert(
        "/api/v1/persistentvolumes/pv-old",
        json!({"metadata": {"name": "pv-old"},
               "spec": {"csi": {"driver": "topolvm.io", "volumeHandle": UID}}}),
    );
    let mut collect = lvms_csi_controller::gc::ControllerCollector::new(
        c.view.clone(),
        lvs,
        Some(Duration::ZERO),
    );
    let s = collect.sweep_once().await.unwrap();
    assert_eq!(
        s.orphans.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        [hand_made.as_str()],
        "only the hand-made object is left unclaimed"
    );
    // The one past its (zero) window is deleted by its name.
    assert_eq!(s.delete, std::slice::from_ref(&hand_made));
    assert!(c.api.get(&lv_path("hand-made")).is_none());

    // Deleted through its id: the snapshot first, then the volume; the node removes the LV.
    c.client
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    c.client
        .delete_volume(DeleteVolumeRequest {
            volume_id: UID.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(c.api.get(&lv_path(OBJECT)).is_none());
    assert!(
        !c.agents["node-b"]
            .state
            .lock()
            .unwrap()
            .volumes
            .contains_key(UID),
        "the node removed the LV"
    );
}
