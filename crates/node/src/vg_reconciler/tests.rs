//! The node status object over the in-memory API server (the disk side runs in the VM: `vm_agent`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lvms_host::runner::RealRunner;
use lvms_testkit::{fake_api::FakeApi, fake_backend::FakeBackend};
use serde_json::{Value, json};

use super::*;

static RUNNER: RealRunner = RealRunner;
const PATH: &str =
    "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroupnodestatuses/node-a";

fn context(api: &FakeApi) -> Context<&'static RealRunner, FakeBackend> {
    Context::new(
        api.client("lvms"),
        "node-a",
        "lvms",
        RealNodeHost::new(&RUNNER),
        Box::new(|_| FakeBackend::new()),
    )
}

fn entries(api: &FakeApi) -> Vec<(String, String)> {
    api.get(PATH).unwrap()["spec"]["nodeStatus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn ready(name: &str) -> VGStatus {
    VGStatus {
        name: name.into(),
        status: Some(VGStatusType::Ready),
        ..VGStatus::default()
    }
}

#[tokio::test]
async fn a_restarted_agent_keeps_reporting_the_classes_it_has_not_reconciled_yet() {
    let api = FakeApi::new();
    api.insert(
        PATH,
        json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
               "metadata": {"name": "node-a", "namespace": "lvms"},
               "spec": {"nodeStatus": [{"name": "a", "status": "Progressing"},
                                       {"name": "b", "status": "Ready"}]}}),
    );
    let ctx = context(&api);
    ctx.load_node_status().await.unwrap();
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert_eq!(
        entries(&api),
        [("a".into(), "Ready".into()), ("b".into(), "Ready".into())]
    );
    let applied = api.requests().last().unwrap().clone();
    assert_eq!(
        applied.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert!(
        applied.query.contains("fieldManager=lvms-node"),
        "{}",
        applied.query
    );
    assert!(applied.query.contains("force=true"), "{}", applied.query);
    assert_eq!(
        applied.body["metadata"]["finalizers"],
        json!([NODE_STATUS_FINALIZER])
    );

    // Gone from this node: its entry goes; an unchanged status sends nothing.
    ctx.record("b", None, None).await.unwrap();
    assert_eq!(entries(&api), [("a".into(), "Ready".into())]);
    ctx.record("a", None, None).await.unwrap();
    assert_eq!(entries(&api), [], "an empty list is sent, not left out");
    assert_eq!(
        api.requests().last().unwrap().body["spec"],
        json!({"nodeStatus": []})
    );
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    api.clear_requests();
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn the_backend_follows_the_ready_classes() {
    let api = FakeApi::new();
    let ctx = context(&api);
    let rx = ctx.backend();
    assert!(rx.borrow().is_none());
    let class = |name: &str| ClassInfo {
        name: name.into(),
        thin_pool: None,
        overprovision_ratio: 1,
        default: false,
    };
    ctx.record("a", Some(ready("a")), Some(class("a")))
        .await
        .unwrap();
    assert!(rx.borrow().is_some(), "a ready class is served");
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert!(rx.borrow().is_none(), "no ready class, no backend");
    let _: Value = api.get(PATH).unwrap();
}

#[test]
fn only_a_change_of_the_nodes_labels_looks_at_the_volume_groups_again() {
    let node = |labels: Value, rv: &str| -> Node {
        serde_json::from_value(json!({"metadata": {"name": "node-a", "labels": labels,
                                                   "resourceVersion": rv}}))
        .unwrap()
    };
    let last = std::sync::Mutex::new(None);
    assert!(
        labels_changed(&last, &node(json!({"a": "1"}), "1")),
        "first look"
    );
    assert!(
        !labels_changed(&last, &node(json!({"a": "1"}), "2")),
        "a status update"
    );
    assert!(labels_changed(&last, &node(json!({"a": "2"}), "3")));
    assert!(labels_changed(&last, &node(json!({}), "4")));
}
