//! The reconciler against an in-memory API server (a real `kube::Client`) and the in-memory backend:
//! the requests it sends, the state it leaves, and what a crash between two steps leaves for the next
//! run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use http::{Method, StatusCode};
use lvms_testkit::{
    fake_api::{FakeApi, Seen},
    fake_backend::{FakeBackend, NODE},
};
use serde_json::{Value, json};

use super::*;

const GIB: u64 = 1 << 30;

fn path(name: &str) -> String {
    format!("/apis/topolvm.io/v1/logicalvolumes/{name}")
}

fn object(name: &str, size: &str) -> Value {
    json!({
        "apiVersion": "topolvm.io/v1",
        "kind": "LogicalVolume",
        "metadata": {"name": name},
        "spec": {"name": name, "nodeName": NODE, "size": size, "deviceClass": "thin"},
    })
}

struct World {
    api: FakeApi,
    backend: Arc<FakeBackend>,
}

impl World {
    fn new() -> Self {
        Self {
            api: FakeApi::new(),
            backend: Arc::new(FakeBackend::new()),
        }
    }

    /// A fresh agent (as after a restart): a new context over the same API and disk.
    fn context(&self) -> Arc<Context<FakeBackend>> {
        Arc::new(Context::fixed(
            self.api.client("default"),
            NODE,
            self.backend.clone(),
        ))
    }

    fn insert(&self, obj: Value) {
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        self.api.insert(&path(&name), obj);
    }

    fn get(&self, name: &str) -> Option<Value> {
        self.api.get(&path(name))
    }

    fn typed(&self, name: &str) -> Arc<LogicalVolume> {
        Arc::new(serde_json::from_value(self.get(name).expect("object exists")).unwrap())
    }

    /// One reconcile of the object as it is now, by a fresh agent.
    async fn reconcile(&self, name: &str) -> Result<Action> {
        reconcile(self.typed(name), self.context()).await
    }

    /// Requests other than reads, as `METHOD path status`.
    fn writes(&self) -> Vec<String> {
        self.api
            .requests()
            .iter()
            .filter(|s| s.method != Method::GET)
            .map(|s| format!("{} {} {}", s.method, s.path, s.status))
            .collect()
    }
}

fn finalizers(obj: &Value) -> Value {
    obj["metadata"]["finalizers"].clone()
}

#[tokio::test]
async fn a_new_object_gets_the_finalizer_then_its_volume_then_its_status() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    let action = w.reconcile("pvc-1").await.unwrap();
    assert_eq!(action, Action::requeue(DONE_REQUEUE));

    let p = path("pvc-1");
    assert_eq!(
        w.writes(),
        [format!("PATCH {p} 200"), format!("PATCH {p}/status 200")]
    );
    let reqs: Vec<Seen> = w.api.requests();
    let fin = reqs
        .iter()
        .find(|s| s.path == p && s.method == Method::PATCH)
        .unwrap();
    assert_eq!(
        fin.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(
        fin.body,
        json!({"metadata": {"finalizers": [LOGICAL_VOLUME_FINALIZER], "resourceVersion": "1"}})
    );
    let id = lvms_engine::ids::volume_lv_name("pvc-1");
    let st = reqs.iter().find(|s| s.path.ends_with("/status")).unwrap();
    assert_eq!(
        st.body,
        json!({"status": {"volumeID": id, "code": null, "message": null,
                          "currentSize": GIB.to_string()}})
    );
    assert_eq!(w.backend.calls(), ["create_volume pvc-1"]);

    let obj = w.get("pvc-1").unwrap();
    assert_eq!(finalizers(&obj), json!([LOGICAL_VOLUME_FINALIZER]));
    assert_eq!(obj["status"]["volumeID"], json!(id));

    // Settled: another reconcile only reads.
    w.api.clear_requests();
    w.reconcile("pvc-1").await.unwrap();
    assert_eq!(w.writes(), Vec::<String>::new());
    assert_eq!(w.backend.calls().len(), 1);
}

#[tokio::test]
async fn a_crash_between_create_and_status_is_finished_by_the_next_agent_without_a_second_volume() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    // The status write never arrives, as if the agent died right after lvcreate.
    w.api.fail(
        Method::PATCH,
        &format!("{}/status", path("pvc-1")),
        StatusCode::SERVICE_UNAVAILABLE,
        1,
    );
    let err = w.reconcile("pvc-1").await.unwrap_err();
    assert!(matches!(err, Error::Kube { .. }), "{err}");
    assert!(w.get("pvc-1").unwrap().get("status").is_none());
    assert_eq!(w.backend.state.lock().unwrap().volumes.len(), 1);

    w.reconcile("pvc-1").await.unwrap();
    let obj = w.get("pvc-1").unwrap();
    assert_eq!(
        obj["status"]["volumeID"],
        json!(lvms_engine::ids::volume_lv_name("pvc-1"))
    );
    assert_eq!(w.backend.calls(), ["create_volume pvc-1"]);
    assert_eq!(w.backend.state.lock().unwrap().volumes.len(), 1);
}

#[tokio::test]
async fn a_grown_spec_size_grows_the_volume_and_the_recorded_size() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    w.reconcile("pvc-1").await.unwrap();
    let mut obj = w.get("pvc-1").unwrap();
    obj["spec"]["size"] = json!("2Gi");
    w.insert(obj);
    w.reconcile("pvc-1").await.unwrap();
    let id = lvms_engine::ids::volume_lv_name("pvc-1");
    assert_eq!(
        w.backend.calls(),
        [
            "create_volume pvc-1".to_owned(),
            format!("expand {id} {}", 2 * GIB)
        ]
    );
    assert_eq!(
        w.get("pvc-1").unwrap()["status"]["currentSize"],
        json!((2 * GIB).to_string())
    );
}

#[tokio::test]
async fn deletion_removes_the_volume_then_releases_the_object() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    w.reconcile("pvc-1").await.unwrap();
    let mut obj = w.get("pvc-1").unwrap();
    obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
    w.insert(obj);
    let action = w.reconcile("pvc-1").await.unwrap();
    assert_eq!(action, Action::await_change());
    let id = lvms_engine::ids::volume_lv_name("pvc-1");
    assert_eq!(w.backend.calls().last().unwrap(), &format!("delete {id}"));
    assert!(w.backend.state.lock().unwrap().volumes.is_empty());
    assert!(
        w.get("pvc-1").is_none(),
        "the last finalizer went, so did the object"
    );
}

#[tokio::test]
async fn deletion_of_a_volume_already_gone_only_releases_the_object() {
    let w = World::new();
    let mut obj = object("pvc-1", "1Gi");
    obj["metadata"]["finalizers"] = json!([LOGICAL_VOLUME_FINALIZER, "example.com/other"]);
    obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:01Z");
    w.insert(obj);
    w.reconcile("pvc-1").await.unwrap();
    assert!(w.backend.calls().is_empty());
    assert_eq!(
        finalizers(&w.get("pvc-1").unwrap()),
        json!(["example.com/other"]),
        "only our finalizer is removed"
    );
}

#[tokio::test]
async fn no_space_is_recorded_as_resource_exhausted_and_nothing_is_made() {
    let w = World::new();
    let mut obj = object("big", "2Gi");
    obj["spec"]["deviceClass"] = json!("thick");
    w.insert(obj);
    let action = w.reconcile("big").await.unwrap();
    assert_eq!(action, Action::requeue(ERROR_REQUEUE));
    let status = &w.get("big").unwrap()["status"];
    assert_eq!(status["code"], json!(8));
    assert!(
        status["message"].as_str().unwrap().contains("bytes free"),
        "{status}"
    );
    assert!(w.backend.state.lock().unwrap().volumes.is_empty());

    // The failure stands: the next reconcile makes nothing and leaves it for the controller.
    w.api.clear_requests();
    w.reconcile("big").await.unwrap();
    assert_eq!(w.backend.calls(), ["create_volume big"]);
    assert_eq!(w.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_snapshot_waits_for_its_source_then_is_taken_from_the_recorded_volume() {
    let w = World::new();
    w.insert(object("src", "1Gi"));
    let mut snap = object("snap", "1Gi");
    snap["spec"]["source"] = json!("src");
    snap["spec"]["accessType"] = json!("ro");
    w.insert(snap);

    let action = w.reconcile("snap").await.unwrap();
    assert_eq!(action, Action::requeue(WAIT_REQUEUE));
    assert!(w.backend.calls().is_empty());

    w.reconcile("src").await.unwrap();
    w.reconcile("snap").await.unwrap();
    let snap = w.get("snap").unwrap();
    assert_eq!(
        snap["status"]["volumeID"],
        json!(lvms_engine::ids::snapshot_lv_name("snap"))
    );
    assert_eq!(
        w.backend.calls(),
        ["create_volume src", "create_snapshot snap"]
    );
}

#[tokio::test]
async fn a_finalizer_patch_against_a_moved_object_is_a_conflict_and_changes_nothing() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    let stale = w.typed("pvc-1");
    let mut moved = w.get("pvc-1").unwrap();
    moved["metadata"]["labels"] = json!({"x": "y"});
    w.insert(moved);
    let err = reconcile(stale, w.context()).await.unwrap_err();
    match err {
        Error::Kube {
            source: kube::Error::Api(s),
            ..
        } => assert_eq!(s.code, 409),
        other => panic!("expected a conflict, got {other}"),
    }
    assert!(w.backend.calls().is_empty());
    assert_eq!(finalizers(&w.get("pvc-1").unwrap()), Value::Null);
}

#[tokio::test]
async fn objects_of_other_nodes_cost_no_request() {
    let w = World::new();
    let mut obj = object("pvc-1", "1Gi");
    obj["spec"]["nodeName"] = json!("node-b");
    w.insert(obj);
    let action = w.reconcile("pvc-1").await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(w.api.requests().is_empty());
    assert!(w.backend.calls().is_empty());
}

#[tokio::test]
async fn the_running_agent_lists_and_watches_only_its_nodes_objects() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    let mut other = object("pvc-2", "1Gi");
    other["spec"]["nodeName"] = json!("node-b");
    w.insert(other);
    let agent = tokio::spawn(run(w.context()));
    let settled = async {
        while w.get("pvc-1").unwrap()["status"]["volumeID"].is_null() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(5), settled)
        .await
        .expect("the agent settles its object within 5 s");
    agent.abort();
    let selector = format!("fieldSelector=spec.nodeName%3D{NODE}");
    let collection: Vec<Seen> = w
        .api
        .requests()
        .into_iter()
        .filter(|s| s.path == "/apis/topolvm.io/v1/logicalvolumes")
        .collect();
    assert!(!collection.is_empty());
    for s in &collection {
        assert!(s.query.contains(&selector), "{} ?{}", s.path, s.query);
    }
    assert!(w.get("pvc-2").unwrap()["metadata"]["finalizers"].is_null());
    assert_eq!(w.backend.calls(), ["create_volume pvc-1"]);
}

#[tokio::test]
async fn many_new_objects_are_made_a_few_at_a_time() {
    let w = World::new();
    let objects = 25;
    for i in 0..objects {
        w.insert(object(&format!("pvc-{i}"), "1Gi"));
    }
    w.backend.state.lock().unwrap().create_delay = std::time::Duration::from_millis(100);
    let agent = tokio::spawn(run(w.context()));
    let settled = async {
        while (0..objects)
            .any(|i| w.get(&format!("pvc-{i}")).unwrap()["status"]["volumeID"].is_null())
        {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(20), settled)
        .await
        .expect("the agent makes every volume within 20 s");
    agent.abort();
    let state = w.backend.state.lock().unwrap();
    assert_eq!(state.volumes.len(), objects);
    assert_eq!(state.most_creating, usize::from(CONCURRENCY));
}

#[tokio::test]
async fn before_any_class_is_ready_the_object_is_retried() {
    let w = World::new();
    w.insert(object("pvc-1", "1Gi"));
    let ctx = Arc::new(Context::<FakeBackend> {
        client: w.api.client("default"),
        node: NODE.into(),
        backend: watch::channel(None).1,
        old_driver_socket: None,
    });
    let err = reconcile(w.typed("pvc-1"), ctx).await.unwrap_err();
    assert!(matches!(err, Error::NoClasses(ref n) if n == NODE), "{err}");
    assert!(w.api.requests().is_empty());
}

#[test]
fn the_status_patch_names_every_field_so_cleared_ones_clear() {
    let cleared = status_patch(&LogicalVolumeStatus::default());
    assert_eq!(
        cleared,
        json!({"status": {"volumeID": null, "code": null, "message": null, "currentSize": null}})
    );
}
