//! The reconciler against a mocked API server (tower-test), asserting the exact requests, as
//! kube-rs's reference controller does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use http::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body, runtime::controller::Action};
use lvms_api::{LVMCLUSTER_FINALIZER, LVMCluster};
use serde_json::{Value, json};
use tower_test::mock::{self, Handle};

use super::{Context, DELETION_REQUEUE, REQUEUE, reconcile};
use crate::render::RenderConfig;

pub(super) type ApiServer = Handle<Request<Body>, Response<Body>>;

const NS: &str = "lvms";
const CLUSTER_PATH: &str =
    "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmclusters/my-lvmcluster";

fn context() -> (Arc<Context>, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, NS);
    let cfg = RenderConfig::new(NS, "quay.io/lvms/lvms:test");
    (Arc::new(Context::new(client, cfg)), handle)
}

fn cluster_json() -> Value {
    json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": NS, "uid": "uid-1", "resourceVersion": "1"},
        "spec": {"storage": {"deviceClasses": [{
            "name": "vg1",
            "default": true,
            "fstype": "xfs",
            "deviceSelector": {"paths": ["/dev/sdb"]},
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}
        }]}}
    })
}

fn cluster() -> LVMCluster {
    serde_json::from_value(cluster_json()).unwrap()
}

fn finalized() -> LVMCluster {
    let mut c = cluster();
    c.metadata.finalizers = Some(vec![LVMCLUSTER_FINALIZER.to_owned()]);
    c
}

fn deleting() -> LVMCluster {
    let mut c = finalized();
    c.metadata.resource_version = Some("2".into());
    c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    c
}

fn list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items})
}

pub(super) fn not_found() -> (StatusCode, Value) {
    (
        StatusCode::NOT_FOUND,
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "NotFound",
               "message": "not found", "code": 404}),
    )
}

/// One request as the API server saw it.
#[derive(Debug)]
pub(super) struct Seen {
    pub(super) method: Method,
    pub(super) path: String,
    pub(super) query: BTreeMap<String, String>,
    pub(super) content_type: Option<String>,
    pub(super) body: Value,
}

/// Takes the next request, answers it with `respond(&request)`, and returns it.
pub(super) async fn next(
    server: &mut ApiServer,
    respond: impl FnOnce(&Seen) -> (StatusCode, Value),
) -> Seen {
    let (request, send) = tokio::time::timeout(Duration::from_secs(5), server.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is alive");
    let (parts, body) = request.into_parts();
    let bytes = body.collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap()
    };
    let query = parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let seen = Seen {
        method: parts.method,
        path: parts.uri.path().to_owned(),
        query,
        content_type: parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_owned()),
        body,
    };
    let (status, response) = respond(&seen);
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(&response).unwrap()))
            .unwrap(),
    );
    seen
}

/// Asserts `seen` is a forced server-side apply by `lvms-operator` to `path`.
fn assert_ssa(seen: &Seen, path: &str) {
    assert_eq!(seen.method, Method::PATCH, "{path}");
    assert_eq!(seen.path, path);
    assert_eq!(
        seen.query.get("fieldManager").map(String::as_str),
        Some("lvms-operator")
    );
    assert_eq!(seen.query.get("force").map(String::as_str), Some("true"));
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
}

pub(super) fn assert_get(seen: &Seen, path: &str) {
    assert_eq!((&seen.method, seen.path.as_str()), (&Method::GET, path));
}

/// Answers the look for TopoLVM's legacy `LogicalVolume`s: the group is not served.
async fn legacy_group_absent(server: &mut ApiServer) {
    let seen = next(server, |_| not_found()).await;
    assert_get(&seen, "/apis/topolvm.cybozu.com/v1/logicalvolumes");
    assert_eq!(seen.query.get("limit").map(String::as_str), Some("1"));
}

/// Answers the look for the CSIDriver of csi-driver-lvm's volumes, which no class adopts here:
/// there is none.
async fn csi_driver_lvm_absent(server: &mut ApiServer) {
    let seen = next(server, |_| not_found()).await;
    assert_get(
        &seen,
        "/apis/storage.k8s.io/v1/csidrivers/lvm.csi.metal-stack.io",
    );
}

/// Asserts that the reconciler sends nothing more once it is done.
pub(super) async fn assert_no_more_requests(server: &mut ApiServer) {
    if let Ok(Some((request, _))) =
        tokio::time::timeout(Duration::from_millis(200), server.next_request()).await
    {
        panic!("unexpected request {} {}", request.method(), request.uri());
    }
}

#[tokio::test]
async fn new_cluster_gets_finalizer_then_every_object_is_applied_and_status_patched() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(cluster()), ctx.clone()));

    let seen = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await;
    assert_eq!(seen.method, Method::PATCH);
    assert_eq!(seen.path, CLUSTER_PATH);
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        seen.body,
        json!({"metadata": {"finalizers": ["lvmcluster.topolvm.io"], "resourceVersion": "1"}})
    );

    // Snapshot API discovery: absent, which must not fail anything.
    let seen = next(&mut server, |_| not_found()).await;
    assert_get(&seen, "/apis/snapshot.storage.k8s.io/v1");
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(&seen, "/apis/storage.k8s.io/v1/storageclasses");

    let echo = |s: &Seen| (StatusCode::OK, s.body.clone());
    let seen = next(&mut server, echo).await;
    assert_ssa(
        &seen,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/vg1",
    );
    assert_eq!(seen.body["kind"], "LVMVolumeGroup");
    assert_eq!(seen.body["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/storage.k8s.io/v1/storageclasses/lvms-vg1");
    assert_eq!(seen.body["provisioner"], "topolvm.io");
    assert_eq!(seen.body["parameters"]["topolvm.io/device-class"], "vg1");
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/storage.k8s.io/v1/csidrivers/topolvm.io");
    assert_eq!(seen.body["spec"]["attachRequired"], false);
    csi_driver_lvm_absent(&mut server).await;
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/apps/v1/namespaces/lvms/daemonsets/vg-manager");
    assert_eq!(seen.body["kind"], "DaemonSet");
    legacy_group_absent(&mut server).await;

    // Stale volume groups, then what status is made of.
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(
        &seen,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups",
    );
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(
        &seen,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroupnodestatuses",
    );
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(&seen, "/api/v1/nodes");

    let seen = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await;
    assert_ssa(&seen, &format!("{CLUSTER_PATH}/status"));
    assert_eq!(seen.body["apiVersion"], "lvm.topolvm.io/v1alpha1");
    assert_eq!(seen.body["kind"], "LVMCluster");
    let conditions = seen.body["status"]["conditions"].as_array().unwrap();
    let resources = conditions
        .iter()
        .find(|c| c["type"] == "ResourcesAvailable")
        .unwrap();
    assert_eq!(resources["status"], "True");

    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn volume_snapshot_class_is_applied_when_the_snapshot_api_exists() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(finalized()), ctx.clone()));
    let seen = next(&mut server, |_| {
        (
            StatusCode::OK,
            json!({"kind": "APIResourceList", "apiVersion": "v1",
                   "groupVersion": "snapshot.storage.k8s.io/v1",
                   "resources": [{"name": "volumesnapshotclasses", "singularName": "volumesnapshotclass",
                                  "namespaced": false, "kind": "VolumeSnapshotClass",
                                  "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}]}),
        )
    })
    .await;
    assert_get(&seen, "/apis/snapshot.storage.k8s.io/v1");
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // storage classes
    let echo = |s: &Seen| (StatusCode::OK, s.body.clone());
    let _ = next(&mut server, echo).await; // LVMVolumeGroup
    let _ = next(&mut server, echo).await; // StorageClass
    let seen = next(&mut server, echo).await;
    assert_ssa(
        &seen,
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses/lvms-vg1",
    );
    assert_eq!(seen.body["kind"], "VolumeSnapshotClass");
    assert_eq!(seen.body["driver"], "topolvm.io");
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/storage.k8s.io/v1/csidrivers/topolvm.io");
    csi_driver_lvm_absent(&mut server).await;
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/apps/v1/namespaces/lvms/daemonsets/vg-manager");
    legacy_group_absent(&mut server).await;
    for _ in 0..3 {
        let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    }
    let seen = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await;
    assert_ssa(&seen, &format!("{CLUSTER_PATH}/status"));
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn stale_volume_group_of_a_removed_class_is_deleted() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(finalized()), ctx.clone()));
    let _ = next(&mut server, |_| not_found()).await; // snapshot discovery
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // storage classes
    for _ in 0..3 {
        let _ = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
    }
    csi_driver_lvm_absent(&mut server).await;
    let _ = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await; // DaemonSet
    legacy_group_absent(&mut server).await;
    let stale = json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "old", "namespace": NS, "ownerReferences": [{
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster", "name": "my-lvmcluster",
            "uid": "uid-1", "controller": true}]},
        "spec": {}
    });
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![stale.clone()]))).await;
    let seen = next(&mut server, |_| (StatusCode::OK, stale.clone())).await;
    assert_eq!(seen.method, Method::DELETE);
    assert_eq!(
        seen.path,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/old"
    );
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    let seen = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await;
    assert_ssa(&seen, &format!("{CLUSTER_PATH}/status"));
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
}

/// csi-driver-lvm's volumes' CSIDriver goes once no class adopts its group, but only the one this
/// cluster made: csi-driver-lvm's own (no owned-by labels) is never deleted.
#[tokio::test]
async fn the_csi_driver_lvm_csi_driver_is_deleted_only_when_this_cluster_made_it() {
    let path = "/apis/storage.k8s.io/v1/csidrivers/lvm.csi.metal-stack.io";
    let ours =
        json!({"owned-by.topolvm.io/name": "my-lvmcluster", "owned-by.topolvm.io/namespace": NS});
    for (labels, deleted) in [(json!({"app": "csi-driver-lvm"}), false), (ours, true)] {
        let (ctx, mut server) = context();
        let task = tokio::spawn(reconcile(Arc::new(finalized()), ctx.clone()));
        let _ = next(&mut server, |_| not_found()).await; // snapshot discovery
        let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // storage classes
        for _ in 0..3 {
            let _ = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
        }
        let driver = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": "lvm.csi.metal-stack.io", "labels": labels}, "spec": {}});
        let seen = next(&mut server, |_| (StatusCode::OK, driver.clone())).await;
        assert_get(&seen, path);
        if deleted {
            let seen = next(&mut server, |_| (StatusCode::OK, driver.clone())).await;
            assert_eq!((&seen.method, seen.path.as_str()), (&Method::DELETE, path));
        }
        let seen = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
        assert_ssa(&seen, "/apis/apps/v1/namespaces/lvms/daemonsets/vg-manager");
        legacy_group_absent(&mut server).await;
        for _ in 0..3 {
            let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
        }
        let _ = next(&mut server, |_| {
            (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
        })
        .await;
        assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
        assert_no_more_requests(&mut server).await;
    }
}

/// `finalized()` with `csiDriverLVMStorageClasses` on its class `vg1`.
fn with_csi_driver_lvm_storage_classes(mut c: LVMCluster) -> LVMCluster {
    c.spec.storage.device_classes[0].csi_driver_lvm_storage_classes = true;
    c
}

#[tokio::test]
async fn csi_driver_lvm_storage_classes_are_applied_after_the_class_storage_class() {
    let (ctx, mut server) = context();
    let cluster = with_csi_driver_lvm_storage_classes(finalized());
    let task = tokio::spawn(reconcile(Arc::new(cluster.clone()), ctx.clone()));
    let _ = next(&mut server, |_| not_found()).await; // snapshot discovery
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // storage classes
    let echo = |s: &Seen| (StatusCode::OK, s.body.clone());
    let _ = next(&mut server, echo).await; // LVMVolumeGroup
    let seen = next(&mut server, echo).await;
    assert_ssa(&seen, "/apis/storage.k8s.io/v1/storageclasses/lvms-vg1");
    for ty in ["linear", "striped", "mirror"] {
        let seen = next(&mut server, echo).await;
        assert_ssa(
            &seen,
            &format!("/apis/storage.k8s.io/v1/storageclasses/csi-driver-lvm-{ty}"),
        );
        assert_eq!(seen.body["parameters"]["type"], ty);
        assert_eq!(seen.body["parameters"]["topolvm.io/device-class"], "vg1");
        assert_eq!(
            seen.body["metadata"]["labels"]["owned-by.topolvm.io/name"],
            "my-lvmcluster"
        );
    }
    let _ = next(&mut server, echo).await; // CSIDriver
    csi_driver_lvm_absent(&mut server).await;
    let _ = next(&mut server, echo).await; // DaemonSet
    legacy_group_absent(&mut server).await;
    for _ in 0..3 {
        let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    }
    let _ = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(&cluster).unwrap())
    })
    .await;
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn stale_csi_driver_lvm_storage_class_is_deleted_when_the_flag_is_turned_off() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(finalized()), ctx.clone()));
    let owned = |name: &str| {
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "labels": {
                "owned-by.topolvm.io/name": "my-lvmcluster", "owned-by.topolvm.io/namespace": NS}},
            "provisioner": "topolvm.io"})
    };
    // csi-driver-lvm's own StorageClass of the same name (not ours) is left alone.
    let foreign = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "csi-driver-lvm-striped"}, "provisioner": "lvm.csi.metal-stack.io"});
    let scs = list(vec![
        owned("lvms-vg1"),
        owned("csi-driver-lvm-linear"),
        owned("csi-driver-lvm-mirror"),
        foreign,
    ]);
    let _ = next(&mut server, |_| not_found()).await; // snapshot discovery
    let _ = next(&mut server, |_| (StatusCode::OK, scs.clone())).await;
    for _ in 0..3 {
        let _ = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
    }
    csi_driver_lvm_absent(&mut server).await;
    let _ = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await; // DaemonSet
    legacy_group_absent(&mut server).await;
    for name in ["csi-driver-lvm-linear", "csi-driver-lvm-mirror"] {
        let seen = next(&mut server, |_| (StatusCode::OK, owned(name))).await;
        assert_eq!(seen.method, Method::DELETE);
        assert_eq!(
            seen.path,
            format!("/apis/storage.k8s.io/v1/storageclasses/{name}")
        );
    }
    for _ in 0..3 {
        let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
        assert_eq!(seen.method, Method::GET);
    }
    let _ = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await;
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn deletion_with_a_pvc_on_a_csi_driver_lvm_storage_class_keeps_the_finalizer() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(
        Arc::new(with_csi_driver_lvm_storage_classes(deleting())),
        ctx.clone(),
    ));
    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "app"},
        "spec": {"storageClassName": "csi-driver-lvm-mirror"}});
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![pvc]))).await;
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    let seen = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
    assert_eq!(seen.body["reason"], "DeletionBlocked");
    let note = seen.body["note"].as_str().unwrap();
    assert!(note.contains("csi-driver-lvm-mirror"), "{note}");
    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(DELETION_REQUEUE)
    );
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn deletion_with_a_pvc_on_our_storage_class_keeps_the_finalizer() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(deleting()), ctx.clone()));

    let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "app"},
        "spec": {"storageClassName": "lvms-vg1"}});
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![pvc]))).await;
    assert_get(&seen, "/api/v1/persistentvolumeclaims");
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(&seen, "/api/v1/persistentvolumes");
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(
        &seen,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups",
    );
    // A warning event on the LVMCluster, and nothing else: no delete, no finalizer patch.
    let seen = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.path, "/apis/events.k8s.io/v1/namespaces/lvms/events");
    assert_eq!(seen.body["type"], "Warning");
    assert_eq!(seen.body["reason"], "DeletionBlocked");
    assert!(
        seen.body["note"]
            .as_str()
            .unwrap()
            .contains("1 PersistentVolumeClaim still uses")
    );

    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(DELETION_REQUEUE)
    );
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn deletion_when_nothing_remains_removes_the_finalizer() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(deleting()), ctx.clone()));

    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(&seen, "/api/v1/persistentvolumeclaims");
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(&seen, "/api/v1/persistentvolumes");
    let seen = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    assert_get(
        &seen,
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups",
    );
    let seen = next(&mut server, |_| not_found()).await;
    assert_get(&seen, "/apis/snapshot.storage.k8s.io/v1");
    // Already gone counts as deleted.
    for path in [
        "/apis/storage.k8s.io/v1/storageclasses/lvms-vg1",
        "/apis/storage.k8s.io/v1/csidrivers/topolvm.io",
        "",
        "/apis/apps/v1/namespaces/lvms/daemonsets/vg-manager",
    ] {
        if path.is_empty() {
            csi_driver_lvm_absent(&mut server).await;
            continue;
        }
        let seen = next(&mut server, |_| not_found()).await;
        assert_eq!((&seen.method, seen.path.as_str()), (&Method::DELETE, path));
    }
    let seen = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(cluster()).unwrap())
    })
    .await;
    assert_eq!(seen.method, Method::PATCH);
    assert_eq!(seen.path, CLUSTER_PATH);
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        seen.body,
        json!({"metadata": {"finalizers": [], "resourceVersion": "2"}})
    );

    assert_eq!(task.await.unwrap().unwrap(), Action::await_change());
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn deletion_waiting_for_node_cleanup_deletes_volume_groups_and_keeps_the_finalizer() {
    let (ctx, mut server) = context();
    let task = tokio::spawn(reconcile(Arc::new(deleting()), ctx.clone()));

    let vg = json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "vg1", "namespace": NS,
            "finalizers": ["cleanup.vgmanager.node.topolvm.io/node-a"],
            "ownerReferences": [{
                "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
                "name": "my-lvmcluster", "uid": "uid-1", "controller": true}]},
        "spec": {}
    });
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // PVCs
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // PVs
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![vg.clone()]))).await;
    let seen = next(&mut server, |_| (StatusCode::OK, vg.clone())).await;
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (
            &Method::DELETE,
            "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/vg1"
        )
    );
    let seen = next(&mut server, |_| not_found()).await;
    assert_get(&seen, "/apis/snapshot.storage.k8s.io/v1");
    let seen = next(&mut server, |_| not_found()).await;
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (
            &Method::DELETE,
            "/apis/storage.k8s.io/v1/storageclasses/lvms-vg1"
        )
    );
    let seen = next(&mut server, |s| (StatusCode::OK, s.body.clone())).await;
    assert_eq!(seen.method, Method::POST);
    assert_eq!(seen.body["reason"], "WaitingForNodeCleanup");
    assert!(seen.body["note"].as_str().unwrap().contains("node-a"));

    assert_eq!(
        task.await.unwrap().unwrap(),
        Action::requeue(DELETION_REQUEUE)
    );
    assert_no_more_requests(&mut server).await;
}

fn client() -> (Client, ApiServer) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (Client::new(service, NS), handle)
}

fn node_meta(name: &str) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
           "metadata": {"name": name, "resourceVersion": "5"}})
}

const NODE_STATUSES_PATH: &str =
    "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroupnodestatuses";
const VOLUME_GROUPS_PATH: &str = "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups";

fn node_status(node: &str, finalizers: &[&str]) -> Value {
    json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
           "metadata": {"name": node, "namespace": NS, "resourceVersion": format!("rv-{node}"),
                        "finalizers": finalizers},
           "spec": {}})
}

fn volume_group(name: &str, finalizers: &[&str]) -> Value {
    json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
           "metadata": {"name": name, "namespace": NS, "resourceVersion": format!("rv-{name}"),
                        "finalizers": finalizers},
           "spec": {"deviceSelector": {"paths": ["/dev/sdb"]}}})
}

#[tokio::test]
async fn gone_node_loses_its_finalizers_and_node_status_while_present_nodes_keep_theirs() {
    let (client, mut server) = client();
    let task =
        tokio::spawn(async move { super::node_removal::release_gone_nodes(&client, NS).await });

    let seen = next(&mut server, |_| {
        (StatusCode::OK, list(vec![node_meta("node-a")]))
    })
    .await;
    assert_get(&seen, "/api/v1/nodes");
    let seen = next(&mut server, |_| {
        (
            StatusCode::OK,
            list(vec![
                node_status("node-a", &["delete-protection.lvm.openshift.io"]),
                node_status(
                    "node-b",
                    &["delete-protection.lvm.openshift.io", "other.io/keep"],
                ),
            ]),
        )
    })
    .await;
    assert_get(&seen, NODE_STATUSES_PATH);
    let seen = next(&mut server, |_| {
        (
            StatusCode::OK,
            list(vec![
                volume_group(
                    "vg1",
                    &[
                        "cleanup.vgmanager.node.topolvm.io/node-a",
                        "cleanup.vgmanager.node.topolvm.io/node-b",
                    ],
                ),
                volume_group("vg2", &["cleanup.vgmanager.node.topolvm.io/node-a"]),
            ]),
        )
    })
    .await;
    assert_get(&seen, VOLUME_GROUPS_PATH);

    // vg1 loses node-b's finalizer only, guarded by the resourceVersion read.
    let seen = next(&mut server, |_| (StatusCode::OK, volume_group("vg1", &[]))).await;
    assert_eq!(seen.method, Method::PATCH);
    assert_eq!(seen.path, format!("{VOLUME_GROUPS_PATH}/vg1"));
    assert_eq!(
        seen.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        seen.body,
        json!({"metadata": {
            "finalizers": ["cleanup.vgmanager.node.topolvm.io/node-a"],
            "resourceVersion": "rv-vg1"
        }})
    );
    // node-b's status loses our delete protection (other finalizers stay), then is deleted.
    let seen = next(&mut server, |_| {
        (StatusCode::OK, node_status("node-b", &[]))
    })
    .await;
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (
            &Method::PATCH,
            format!("{NODE_STATUSES_PATH}/node-b").as_str()
        )
    );
    assert_eq!(
        seen.body,
        json!({"metadata": {"finalizers": ["other.io/keep"], "resourceVersion": "rv-node-b"}})
    );
    let seen = next(&mut server, |_| {
        (StatusCode::OK, node_status("node-b", &[]))
    })
    .await;
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (
            &Method::DELETE,
            format!("{NODE_STATUSES_PATH}/node-b").as_str()
        )
    );

    let cleanups = task.await.unwrap().unwrap();
    assert_eq!(
        cleanups.iter().map(|c| c.node.as_str()).collect::<Vec<_>>(),
        ["node-b"]
    );
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn node_removal_conflict_stops_the_pass_with_the_objects_name() {
    let (client, mut server) = client();
    let task =
        tokio::spawn(async move { super::node_removal::release_gone_nodes(&client, NS).await });
    next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    next(&mut server, |_| {
        (
            StatusCode::OK,
            list(vec![volume_group(
                "vg1",
                &["cleanup.vgmanager.node.topolvm.io/gone"],
            )]),
        )
    })
    .await;
    let seen = next(&mut server, |_| {
        (
            StatusCode::CONFLICT,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict",
                   "message": "the object has been modified", "code": 409}),
        )
    })
    .await;
    assert_eq!(
        seen.body["metadata"]["finalizers"],
        json!([]),
        "the only finalizer was the gone node's"
    );
    let err = task.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains("LVMVolumeGroup vg1") && err.contains("gone node gone"),
        "{err}"
    );
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn node_removal_with_every_node_present_changes_nothing() {
    let (client, mut server) = client();
    let task =
        tokio::spawn(async move { super::node_removal::release_gone_nodes(&client, NS).await });
    next(&mut server, |_| {
        (StatusCode::OK, list(vec![node_meta("node-a")]))
    })
    .await;
    next(&mut server, |_| {
        (StatusCode::OK, list(vec![node_status("node-a", &[])]))
    })
    .await;
    next(&mut server, |_| {
        (
            StatusCode::OK,
            list(vec![volume_group(
                "vg1",
                &["cleanup.vgmanager.node.topolvm.io/node-a"],
            )]),
        )
    })
    .await;
    assert!(task.await.unwrap().unwrap().is_empty());
    assert_no_more_requests(&mut server).await;
}

/// The applier and the readiness task wait on one store; kube-runtime wakes only the last waiter.
#[tokio::test]
async fn readiness_sees_the_store_synced_while_another_task_also_waits() {
    use kube::runtime::{reflector::store::Writer, watcher::Event};
    let mut writer = Writer::<LVMCluster>::default();
    let store = writer.as_reader();
    let ours = tokio::spawn({
        let store = store.clone();
        async move { super::synced(&store).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Polled after ours, as the applier is: this one takes the store's only waker.
    let other = tokio::spawn({
        let store = store.clone();
        async move { store.wait_until_ready().await.is_ok() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
    let ours = tokio::time::timeout(Duration::from_secs(5), ours)
        .await
        .expect("readiness learns of the synced store within 5 s");
    assert!(ours.unwrap());
    assert!(other.await.unwrap());
}

#[test]
fn only_csi_driver_fields_the_api_keeps_immutable_force_a_replacement() {
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    use super::immutable_csi_driver_fields;
    let spec = |attach: Option<bool>, modes: Option<&[&str]>, pod_info: bool| CSIDriverSpec {
        attach_required: attach,
        volume_lifecycle_modes: modes.map(|m| m.iter().map(|s| (*s).to_owned()).collect()),
        pod_info_on_mount: Some(pod_info),
        ..CSIDriverSpec::default()
    };
    let ours = spec(Some(false), Some(&["Persistent", "Ephemeral"]), true);
    // LVMS's: no Ephemeral mode.
    assert_eq!(
        immutable_csi_driver_fields(&spec(Some(false), Some(&["Persistent"]), true), &ours),
        vec!["volumeLifecycleModes"]
    );
    // Unset fields take the API's defaults: attach required, Persistent only.
    assert_eq!(
        immutable_csi_driver_fields(&spec(None, None, true), &ours),
        vec!["attachRequired", "volumeLifecycleModes"]
    );
    assert!(
        immutable_csi_driver_fields(
            &spec(Some(true), Some(&[]), true),
            &spec(None, Some(&["Persistent"]), true)
        )
        .is_empty()
    );
    // A mutable field alone is applied in place.
    assert!(
        immutable_csi_driver_fields(
            &spec(Some(false), Some(&["Persistent", "Ephemeral"]), false),
            &ours
        )
        .is_empty()
    );
}

#[test]
fn the_legacy_group_warning_names_a_volume_and_the_fix() {
    let note = super::legacy_note("pvc-0d8e3f5c");
    for part in [
        "topolvm.cybozu.com",
        "pvc-0d8e3f5c",
        "leaves them",
        "rename-group.md",
        "docs/migration-from-lvms.md",
    ] {
        assert!(note.contains(part), "{part}: {note}");
    }
}

/// Answers an apply with its body as the stored object, at resourceVersion `rv` and generation 1,
/// and keeps it by path for later reads.
fn store_applied(
    stored: &mut BTreeMap<String, Value>,
    seen: &Seen,
    rv: &str,
) -> (StatusCode, Value) {
    let mut object = seen.body.clone();
    object["metadata"]["resourceVersion"] = json!(rv);
    object["metadata"]["generation"] = json!(1);
    stored.insert(seen.path.clone(), object.clone());
    (StatusCode::OK, object)
}

/// The objects one reconcile of `finalized()` applies, in order (no snapshot API).
const APPLIED_PATHS: [&str; 4] = [
    "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/vg1",
    "/apis/storage.k8s.io/v1/storageclasses/lvms-vg1",
    "/apis/storage.k8s.io/v1/csidrivers/topolvm.io",
    "/apis/apps/v1/namespaces/lvms/daemonsets/vg-manager",
];

#[tokio::test]
async fn a_second_reconcile_over_unchanged_objects_reads_them_and_writes_nothing() {
    let (ctx, mut server) = context();
    let mut stored = BTreeMap::new();

    // The first reconcile applies every object and the status.
    let task = tokio::spawn(reconcile(Arc::new(finalized()), ctx.clone()));
    let _ = next(&mut server, |_| not_found()).await; // snapshot API
    let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await; // storage classes
    for path in APPLIED_PATHS {
        let seen = next(&mut server, |s| store_applied(&mut stored, s, "5")).await;
        assert_ssa(&seen, path);
        if path.contains("csidrivers") {
            csi_driver_lvm_absent(&mut server).await;
        }
    }
    legacy_group_absent(&mut server).await;
    for _ in 0..3 {
        let _ = next(&mut server, |_| (StatusCode::OK, list(vec![]))).await;
    }
    let status = next(&mut server, |_| {
        (StatusCode::OK, serde_json::to_value(finalized()).unwrap())
    })
    .await
    .body["status"]
        .clone();
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(&mut server).await;

    // The second, with the status it wrote: each object is read, none written.
    let mut read = finalized();
    read.status = Some(serde_json::from_value(status).unwrap());
    let read = Arc::new(read);
    reconcile_again(&ctx, read.clone(), &mut server, &mut stored, &[]).await;

    // Someone edits the StorageClass (a new resourceVersion) and takes the operator's label off
    // the DaemonSet: those two are applied again, the others only read.
    let sc = APPLIED_PATHS[1];
    stored.get_mut(sc).unwrap()["metadata"]["resourceVersion"] = json!("6");
    let ds = APPLIED_PATHS[3];
    stored.get_mut(ds).unwrap()["metadata"]["labels"] = json!({});
    reconcile_again(&ctx, read, &mut server, &mut stored, &[sc, ds]).await;
}

/// A reconcile of `cluster` (its status as the last one wrote it) after a first one applied
/// every object into `stored`: each object is read back from `stored`, those in `reapplied` are
/// applied again, and nothing else is written.
async fn reconcile_again(
    ctx: &Arc<Context>,
    cluster: Arc<LVMCluster>,
    server: &mut ApiServer,
    stored: &mut BTreeMap<String, Value>,
    reapplied: &[&str],
) {
    let task = tokio::spawn(reconcile(cluster, ctx.clone()));
    let _ = next(server, |_| not_found()).await;
    let _ = next(server, |_| (StatusCode::OK, list(vec![]))).await;
    for path in APPLIED_PATHS {
        let seen = next(server, |s| (StatusCode::OK, stored[&s.path].clone())).await;
        assert_get(&seen, path);
        if reapplied.contains(&path) {
            let seen = next(server, |s| store_applied(stored, s, "7")).await;
            assert_ssa(&seen, path);
        }
        if path.contains("csidrivers") {
            csi_driver_lvm_absent(server).await;
        }
    }
    legacy_group_absent(server).await;
    for _ in 0..3 {
        let _ = next(server, |_| (StatusCode::OK, list(vec![]))).await;
    }
    assert_eq!(task.await.unwrap().unwrap(), Action::requeue(REQUEUE));
    assert_no_more_requests(server).await;
}
