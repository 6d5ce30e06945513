//! Host-id allocation against the in-memory API server (crates/testkit), judged by the record it
//! leaves and the requests it made.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Method, Request, StatusCode};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{Api, Client, client::Body};
use lvms_api::{LVMCluster, SANLOCK_HOST_IDS_CONFIGMAP};
use lvms_testkit::fake_api::FakeApi;
use serde_json::{Value, json};

use lvms_core::shared::Release;

use super::{
    ATTEMPTS, Error, allocate, any_shared, exhausted_message, live_host_ids, needing, present,
    read_gone_since, wait_seconds,
};

const NS: &str = "lvms";
const CM_PATH: &str = "/api/v1/namespaces/lvms/configmaps/lvms-sanlock-host-ids";
const CM_COLLECTION: &str = "/api/v1/namespaces/lvms/configmaps";

/// Releases a gone node's id at once (nothing live, no wait): the rule before issue 13.
fn at_once() -> Release {
    Release {
        live: Some(BTreeSet::new()),
        ..Release::default()
    }
}

fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn record(data: &[(&str, &str)]) -> Value {
    let data: BTreeMap<&str, &str> = data.iter().copied().collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap",
           "metadata": {"name": SANLOCK_HOST_IDS_CONFIGMAP, "namespace": NS},
           "data": data})
}

fn data(fake: &FakeApi) -> BTreeMap<String, String> {
    let cm = fake.get(CM_PATH).expect("the record exists");
    serde_json::from_value(cm["data"].clone()).unwrap()
}

fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(n, i)| ((*n).to_owned(), (*i).to_owned()))
        .collect()
}

fn api(client: Client) -> Api<ConfigMap> {
    Api::namespaced(client, NS)
}

/// `(method, status)` of every request to the record, in order.
fn calls(fake: &FakeApi) -> Vec<(Method, u16)> {
    fake.requests()
        .into_iter()
        .filter(|s| s.path == CM_PATH || s.path == CM_COLLECTION)
        .map(|s| (s.method, s.status))
        .collect()
}

/// A client of `fake` that, before each of the first `times` writes (create or update) of the
/// record, lets `other` write it first: another operator that read after us and wrote before us.
fn racing_client(
    fake: &FakeApi,
    times: usize,
    other: impl Fn(&FakeApi) + Send + Sync + 'static,
) -> Client {
    let inner = fake.client(NS);
    let fake = fake.clone();
    let left = Arc::new(AtomicUsize::new(times));
    let other = Arc::new(other);
    let service = tower::service_fn(move |req: Request<Body>| {
        let inner = inner.clone();
        let fake = fake.clone();
        let left = left.clone();
        let other = other.clone();
        async move {
            let write = matches!(*req.method(), Method::POST | Method::PUT)
                && (req.uri().path() == CM_PATH || req.uri().path() == CM_COLLECTION);
            if write
                && left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                other(&fake);
            }
            inner.send(req).await
        }
    });
    Client::new(service, NS)
}

#[tokio::test]
async fn first_assignment_creates_the_record_with_the_lowest_ids_and_the_operators_labels() {
    let fake = FakeApi::new();
    let nodes = names(&["node-a", "node-b", "node-c"]);
    let out = allocate(&api(fake.client(NS)), &nodes, &nodes, &at_once())
        .await
        .unwrap();
    assert_eq!(
        out.added,
        [
            ("node-a".to_owned(), 1),
            ("node-b".to_owned(), 2),
            ("node-c".to_owned(), 3)
        ]
    );
    assert_eq!(
        data(&fake),
        ids(&[("node-a", "1"), ("node-b", "2"), ("node-c", "3")])
    );
    let cm = fake.get(CM_PATH).unwrap();
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/component"],
        "sanlock-host-ids"
    );
    assert_eq!(
        cm["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "lvms-operator"
    );
    assert!(
        cm["metadata"].get("ownerReferences").is_none(),
        "the record outlives the LVMCluster: {cm}"
    );
    assert_eq!(
        calls(&fake),
        [(Method::GET, 404), (Method::POST, 201)],
        "read, then create (never apply)"
    );
}

#[tokio::test]
async fn ids_are_stable_across_reconciles_and_an_unchanged_record_is_not_written() {
    let fake = FakeApi::new();
    let api = api(fake.client(NS));
    let two = names(&["node-b", "node-c"]);
    allocate(&api, &two, &two, &at_once()).await.unwrap();
    fake.clear_requests();

    let again = allocate(&api, &two, &two, &at_once()).await.unwrap();
    assert!(!again.changed(&BTreeMap::new()));
    assert_eq!(calls(&fake), [(Method::GET, 200)], "nothing to write");

    // A new node, first in name order, gets the next free id; the others keep theirs.
    let three = names(&["node-a", "node-b", "node-c"]);
    let rv = fake.get(CM_PATH).unwrap()["metadata"]["resourceVersion"].clone();
    fake.clear_requests();
    let out = allocate(&api, &three, &three, &at_once()).await.unwrap();
    assert_eq!(out.added, [("node-a".to_owned(), 3)]);
    assert_eq!(
        data(&fake),
        ids(&[("node-a", "3"), ("node-b", "1"), ("node-c", "2")])
    );
    let put = fake
        .requests()
        .into_iter()
        .find(|s| s.method == Method::PUT)
        .expect("an update");
    assert_eq!(
        put.body["metadata"]["resourceVersion"], rv,
        "the update is conditional on the read"
    );
}

#[tokio::test]
async fn a_deleted_node_releases_its_id_and_a_later_node_may_take_it() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1"), ("node-b", "2")]));
    let api = api(fake.client(NS));

    // node-a's Node is gone; node-b no longer needs an id but exists, so it keeps its id.
    let out = allocate(&api, &names(&[]), &names(&["node-b"]), &at_once())
        .await
        .unwrap();
    assert_eq!(out.released, [("node-a".to_owned(), 1)]);
    assert_eq!(data(&fake), ids(&[("node-b", "2")]));

    let out = allocate(
        &api,
        &names(&["node-c"]),
        &names(&["node-b", "node-c"]),
        &at_once(),
    )
    .await
    .unwrap();
    assert_eq!(out.added, [("node-c".to_owned(), 1)]);
    assert_eq!(data(&fake), ids(&[("node-b", "2"), ("node-c", "1")]));
}

#[tokio::test]
async fn without_a_node_needing_an_id_no_record_is_created() {
    let fake = FakeApi::new();
    let out = allocate(
        &api(fake.client(NS)),
        &names(&[]),
        &names(&["node-a"]),
        &at_once(),
    )
    .await
    .unwrap();
    assert!(!out.changed(&BTreeMap::new()));
    assert!(fake.get(CM_PATH).is_none());
    assert_eq!(calls(&fake), [(Method::GET, 404)]);
}

#[tokio::test]
async fn a_create_that_loses_the_race_rereads_and_takes_the_next_free_id() {
    let fake = FakeApi::new();
    // Between our read (no record) and our create, another operator creates it for node-b.
    let client = racing_client(&fake, 1, |fake| {
        fake.insert(CM_PATH, record(&[("node-b", "1")]));
    });
    let present = names(&["node-a", "node-b"]);
    let out = allocate(&api(client), &names(&["node-a"]), &present, &at_once())
        .await
        .unwrap();
    assert_eq!(out.added, [("node-a".to_owned(), 2)]);
    assert_eq!(data(&fake), ids(&[("node-a", "2"), ("node-b", "1")]));
    assert_eq!(
        calls(&fake),
        [
            (Method::GET, 404),
            (Method::POST, 409),
            (Method::GET, 200),
            (Method::PUT, 200)
        ]
    );
}

#[tokio::test]
async fn an_update_that_loses_the_race_rereads_and_keeps_the_winners_ids() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1")]));
    // We add node-b; in between, another operator gives node-c id 2.
    let client = racing_client(&fake, 1, |fake| {
        fake.insert(CM_PATH, record(&[("node-a", "1"), ("node-c", "2")]));
    });
    let present = names(&["node-a", "node-b", "node-c"]);
    let out = allocate(
        &api(client),
        &names(&["node-a", "node-b"]),
        &present,
        &at_once(),
    )
    .await
    .unwrap();
    assert_eq!(out.added, [("node-b".to_owned(), 3)]);
    assert_eq!(
        data(&fake),
        ids(&[("node-a", "1"), ("node-b", "3"), ("node-c", "2")])
    );
    assert_eq!(
        calls(&fake),
        [
            (Method::GET, 200),
            (Method::PUT, 409),
            (Method::GET, 200),
            (Method::PUT, 200)
        ]
    );
}

#[tokio::test]
async fn a_record_that_changes_under_every_write_gives_up_after_the_bounded_attempts() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1")]));
    let client = racing_client(&fake, usize::MAX, |fake| {
        fake.insert(CM_PATH, record(&[("node-a", "1")]));
    });
    let nodes = names(&["node-a", "node-b"]);
    let err = allocate(&api(client), &nodes, &nodes, &at_once())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::Contended { attempts } if attempts == ATTEMPTS),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("changed between read and write in each of 5 attempts")
            && text.contains(SANLOCK_HOST_IDS_CONFIGMAP),
        "{text}"
    );
    assert_eq!(data(&fake), ids(&[("node-a", "1")]), "nothing was assigned");
    let puts = calls(&fake)
        .into_iter()
        .filter(|(m, _)| *m == Method::PUT)
        .count();
    assert_eq!(puts, ATTEMPTS);
}

#[tokio::test]
async fn a_failed_write_other_than_a_conflict_is_an_error_naming_the_step() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1")]));
    fake.fail(Method::PUT, CM_PATH, StatusCode::INTERNAL_SERVER_ERROR, 1);
    let nodes = names(&["node-a", "node-b"]);
    let err = allocate(&api(fake.client(NS)), &nodes, &nodes, &at_once())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("updating ConfigMap lvms-sanlock-host-ids: "),
        "{err}"
    );
    assert_eq!(data(&fake), ids(&[("node-a", "1")]));
}

#[tokio::test]
async fn when_every_id_is_taken_the_nodes_left_without_one_are_named() {
    let fake = FakeApi::new();
    let taken: Vec<(String, String)> = (1..=2000)
        .map(|i| (format!("node-{i:04}"), i.to_string()))
        .collect();
    let mut cm = record(&[]);
    cm["data"] = serde_json::to_value(taken.iter().cloned().collect::<BTreeMap<_, _>>()).unwrap();
    fake.insert(CM_PATH, cm);
    let mut present: BTreeSet<String> = taken.iter().map(|(n, _)| n.clone()).collect();
    present.insert("node-new".to_owned());
    let out = allocate(
        &api(fake.client(NS)),
        &names(&["node-new"]),
        &present,
        &at_once(),
    )
    .await
    .unwrap();
    assert_eq!(out.exhausted, ["node-new"]);
    let text = exhausted_message(&out.exhausted);
    assert!(
        text.starts_with("no sanlock host id left for node(s) node-new: all 2000 ids"),
        "{text}"
    );
}

fn cluster(classes: Value) -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": NS, "uid": "uid-1"},
        "spec": {"storage": {"deviceClasses": classes}}
    }))
    .unwrap()
}

fn node(name: &str, labels: Value, extra: Value) -> Node {
    let mut node = json!({"apiVersion": "v1", "kind": "Node",
                          "metadata": {"name": name, "labels": labels}});
    json_patch::merge(&mut node, &extra);
    serde_json::from_value(node).unwrap()
}

#[test]
fn the_nodes_needing_ids_are_those_a_shared_class_selects_and_the_pods_can_run_on() {
    let shared = json!({
        "name": "san",
        "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "san", "operator": "In", "values": ["yes"]}]}]}
    });
    let local = json!({"name": "local", "deviceSelector": {"paths": ["/dev/sdb"]}});
    let nodes = [
        node("a", json!({"san": "yes"}), json!({})),
        node("b", json!({}), json!({})),
        node(
            "c",
            json!({"san": "yes"}),
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        ),
        node(
            "d",
            json!({"san": "yes"}),
            json!({"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}),
        ),
    ];
    let both = cluster(json!([shared.clone(), local.clone()]));
    assert!(any_shared(&both));
    assert_eq!(needing(&both, &nodes), names(&["a"]));
    assert_eq!(present(&nodes), names(&["a", "b", "c", "d"]));

    let only_local = cluster(json!([local]));
    assert!(!any_shared(&only_local));
    assert!(needing(&only_local, &nodes).is_empty());
}

// ---------------------------------------------------------------------------------------------
// Through the LVMCluster reconciler
// ---------------------------------------------------------------------------------------------

const CLUSTER_PATH: &str = "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmclusters/c";

fn shared_class() -> Value {
    json!({
        "name": "san",
        "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "san", "operator": "In", "values": ["yes"]}]}]}
    })
}

fn insert_node(fake: &FakeApi, name: &str, labels: Value) {
    fake.insert(
        &format!("/api/v1/nodes/{name}"),
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}),
    );
}

/// Stores `cluster` and reconciles it as the controller would (with the stored resourceVersion).
async fn reconcile(
    fake: &FakeApi,
    cluster: &LVMCluster,
) -> crate::controller::Result<kube::runtime::controller::Action> {
    if fake.get(CLUSTER_PATH).is_none() {
        fake.insert(CLUSTER_PATH, serde_json::to_value(cluster).unwrap());
    }
    let stored: LVMCluster = serde_json::from_value(fake.get(CLUSTER_PATH).unwrap()).unwrap();
    let ctx = crate::controller::Context::new(
        fake.client(NS),
        crate::render::RenderConfig::new(NS, "quay.io/lvms/lvms:test"),
    );
    crate::controller::reconcile(Arc::new(stored), Arc::new(ctx)).await
}

fn events(fake: &FakeApi) -> Vec<(String, String)> {
    fake.requests()
        .into_iter()
        .filter(|s| s.method == Method::POST && s.path.ends_with("/events"))
        .map(|s| {
            (
                s.body["reason"].as_str().unwrap_or_default().to_owned(),
                s.body["note"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_reconcile_gives_the_shared_classes_nodes_ids_keeps_them_and_releases_a_deleted_nodes() {
    let fake = FakeApi::new();
    insert_node(&fake, "a", json!({"san": "yes"}));
    insert_node(&fake, "b", json!({"san": "yes"}));
    insert_node(&fake, "local-only", json!({}));
    let cluster = cluster(json!([shared_class()]));

    reconcile(&fake, &cluster).await.unwrap();
    assert_eq!(data(&fake), ids(&[("a", "1"), ("b", "2")]));
    assert_eq!(
        events(&fake),
        [(
            "HostIdsAssigned".to_owned(),
            "sanlock host ids assigned: a: 1, b: 2".to_owned()
        )]
    );

    fake.clear_requests();
    reconcile(&fake, &cluster).await.unwrap();
    assert_eq!(data(&fake), ids(&[("a", "1"), ("b", "2")]));
    assert!(
        calls(&fake).iter().all(|(m, _)| *m == Method::GET),
        "a second reconcile writes nothing: {:?}",
        calls(&fake)
    );
    assert!(events(&fake).is_empty());

    // a's Node is deleted: its id is kept (its host may still renew its lease), and when it went
    // is recorded.
    fake.delete("/api/v1/nodes/a");
    fake.clear_requests();
    reconcile(&fake, &cluster).await.unwrap();
    assert_eq!(data(&fake), ids(&[("a", "1"), ("b", "2")]));
    assert!(
        gone_since(&fake).contains_key("a"),
        "{:?}",
        gone_since(&fake)
    );
    assert!(events(&fake).is_empty());

    // 140 s later (the default io timeout's host-dead time), nobody reporting it live: released.
    set_gone_since(&fake, &[("a", "2020-01-01T00:00:00Z")]);
    fake.clear_requests();
    reconcile(&fake, &cluster).await.unwrap();
    assert_eq!(data(&fake), ids(&[("b", "2")]));
    assert!(gone_since(&fake).is_empty());
    assert_eq!(
        events(&fake),
        [(
            "HostIdsReleased".to_owned(),
            "sanlock host ids released (their nodes are gone and their hosts dead): a: 1"
                .to_owned()
        )]
    );
}

#[tokio::test]
async fn a_reconcile_without_shared_classes_never_reads_or_creates_the_record() {
    let fake = FakeApi::new();
    insert_node(&fake, "a", json!({"san": "yes"}));
    let local = json!({"name": "local", "deviceSelector": {"paths": ["/dev/sdb"]}});
    reconcile(&fake, &cluster(json!([local]))).await.unwrap();
    assert!(fake.get(CM_PATH).is_none());
    assert!(calls(&fake).is_empty(), "{:?}", calls(&fake));
}

#[tokio::test]
async fn a_reconcile_with_no_id_left_fails_naming_the_node_in_the_error_and_the_condition() {
    let fake = FakeApi::new();
    let mut taken = BTreeMap::new();
    for i in 1..=2000 {
        let name = format!("old-{i:04}");
        insert_node(&fake, &name, json!({}));
        taken.insert(name, i.to_string());
    }
    let mut cm = record(&[]);
    cm["data"] = serde_json::to_value(&taken).unwrap();
    fake.insert(CM_PATH, cm);
    insert_node(&fake, "new", json!({"san": "yes"}));

    let err = reconcile(&fake, &cluster(json!([shared_class()])))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("no sanlock host id left for node(s) new: all 2000 ids"),
        "{text}"
    );
    let status = &fake.get(CLUSTER_PATH).unwrap()["status"];
    let resources = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "ResourcesAvailable")
        .unwrap()
        .clone();
    assert_eq!(resources["status"], "False");
    assert!(
        resources["message"]
            .as_str()
            .unwrap()
            .contains("no sanlock host id left for node(s) new"),
        "{resources}"
    );
}

// ---------------------------------------------------------------------------------------------
// Releasing only once the host is dead (issue 13)
// ---------------------------------------------------------------------------------------------

const GONE_SINCE: &str = "lvms.topolvm.io/nodes-gone-since";

fn gone_since(fake: &FakeApi) -> BTreeMap<String, String> {
    let cm = fake.get(CM_PATH).expect("the record exists");
    cm["metadata"]["annotations"][GONE_SINCE]
        .as_str()
        .map(|text| serde_json::from_str(text).unwrap())
        .unwrap_or_default()
}

fn set_gone_since(fake: &FakeApi, entries: &[(&str, &str)]) {
    let mut cm = fake.get(CM_PATH).unwrap();
    let map: BTreeMap<&str, &str> = entries.iter().copied().collect();
    cm["metadata"]["annotations"][GONE_SINCE] = json!(serde_json::to_string(&map).unwrap());
    fake.insert(CM_PATH, cm);
}

/// Now is 2026-01-01T00:00:00Z; a gone node's id waits 140 s; `live` ids are renewing somewhere.
fn waiting(live: &[u16]) -> Release {
    Release {
        now: 1_767_225_600,
        gone_since: BTreeMap::new(),
        host_dead_seconds: 140,
        live: Some(live.iter().copied().collect()),
    }
}

#[tokio::test]
async fn a_gone_nodes_id_is_kept_with_the_time_it_went_and_the_data_format_unchanged() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1"), ("node-b", "2")]));
    let api = api(fake.client(NS));
    let present = names(&["node-b", "node-c"]);
    let out = allocate(&api, &present, &present, &waiting(&[]))
        .await
        .unwrap();
    assert_eq!(out.held, [("node-a".to_owned(), 1)]);
    assert_eq!(out.added, [("node-c".to_owned(), 3)], "id 1 is not reused");
    assert_eq!(out.release_at, Some(1_767_225_600 + 140));
    assert_eq!(
        data(&fake),
        ids(&[("node-a", "1"), ("node-b", "2"), ("node-c", "3")])
    );
    assert_eq!(
        gone_since(&fake),
        BTreeMap::from([("node-a".to_owned(), "2026-01-01T00:00:00Z".to_owned())])
    );

    // A later round keeps the first time seen gone and writes nothing.
    fake.clear_requests();
    let later = Release {
        now: 1_767_225_600 + 100,
        ..waiting(&[])
    };
    let out = allocate(&api, &present, &present, &later).await.unwrap();
    assert_eq!(out.release_at, Some(1_767_225_600 + 140));
    assert_eq!(calls(&fake), [(Method::GET, 200)]);
}

#[tokio::test]
async fn a_gone_nodes_id_still_live_somewhere_is_kept_past_the_wait() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1")]));
    set_gone_since(&fake, &[("node-a", "2025-12-31T23:00:00Z")]);
    let out = allocate(
        &api(fake.client(NS)),
        &names(&[]),
        &names(&[]),
        &waiting(&[1]),
    )
    .await
    .unwrap();
    assert_eq!(out.held, [("node-a".to_owned(), 1)]);
    assert!(out.released.is_empty());
    assert_eq!(data(&fake), ids(&[("node-a", "1")]));
}

#[tokio::test]
async fn a_gone_nodes_id_is_released_after_the_wait_and_its_annotation_entry_removed() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1"), ("node-b", "2")]));
    set_gone_since(&fake, &[("node-a", "2025-12-31T23:57:40Z")]);
    let present = names(&["node-b"]);
    let out = allocate(&api(fake.client(NS)), &present, &present, &waiting(&[2]))
        .await
        .unwrap();
    assert_eq!(out.released, [("node-a".to_owned(), 1)]);
    assert_eq!(data(&fake), ids(&[("node-b", "2")]));
    let cm = fake.get(CM_PATH).unwrap();
    assert!(
        cm["metadata"]["annotations"].get(GONE_SINCE).is_none(),
        "{cm}"
    );
}

#[tokio::test]
async fn a_node_that_comes_back_within_the_wait_keeps_its_id() {
    let fake = FakeApi::new();
    fake.insert(CM_PATH, record(&[("node-a", "1")]));
    set_gone_since(&fake, &[("node-a", "2025-12-31T23:59:00Z")]);
    let present = names(&["node-a"]);
    let out = allocate(&api(fake.client(NS)), &present, &present, &waiting(&[]))
        .await
        .unwrap();
    assert!(out.released.is_empty() && out.added.is_empty());
    assert_eq!(data(&fake), ids(&[("node-a", "1")]));
    assert!(gone_since(&fake).is_empty());
}

#[test]
fn gone_since_reads_rfc3339_and_skips_what_does_not_parse() {
    let mut cm = ConfigMap::default();
    assert!(read_gone_since(Some(&cm)).is_empty());
    cm.metadata.annotations = Some(BTreeMap::from([(
        GONE_SINCE.to_owned(),
        r#"{"a": "2026-01-01T00:00:00Z", "b": "yesterday"}"#.to_owned(),
    )]));
    assert_eq!(
        read_gone_since(Some(&cm)),
        BTreeMap::from([("a".to_owned(), 1_767_225_600)])
    );
    cm.metadata.annotations = Some(BTreeMap::from([(GONE_SINCE.to_owned(), "{".to_owned())]));
    assert!(read_gone_since(Some(&cm)).is_empty());
    assert!(read_gone_since(None).is_empty());
}

#[test]
fn the_wait_is_the_longest_host_dead_time_of_the_shared_classes() {
    let mut slow = shared_class();
    slow["name"] = json!("slow");
    slow["sharedConfig"] = json!({"ioTimeoutSeconds": 60});
    let local = json!({"name": "local", "deviceSelector": {"paths": ["/dev/sdb"]}});
    assert_eq!(wait_seconds(&cluster(json!([shared_class()]))), 140);
    assert_eq!(
        wait_seconds(&cluster(json!([shared_class(), slow, local]))),
        540
    );
}

#[test]
fn live_ids_are_those_any_node_reports_in_a_shared_class() {
    let cluster = cluster(json!([
        shared_class(),
        {"name": "local", "deviceSelector": {"paths": ["/dev/sdb"]}}
    ]));
    let status = |node: &str, vgs: Value| -> lvms_api::LVMVolumeGroupNodeStatus {
        serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": NS},
            "spec": {"nodeStatus": vgs}
        }))
        .unwrap()
    };
    let statuses = [
        status(
            "a",
            json!([{"name": "san", "shared": {"lockspace": "Joined", "liveHostIds": [1, 3]}}]),
        ),
        status(
            "b",
            json!([
                {"name": "san", "shared": {"lockspace": "Joined", "liveHostIds": [1, 2]}},
                {"name": "local", "shared": {"lockspace": "Joined", "liveHostIds": [9]}},
                {"name": "removed", "shared": {"lockspace": "Joined", "liveHostIds": [8]}}
            ]),
        ),
        status("c", json!([{"name": "san"}])),
    ];
    let live: Vec<u16> = live_host_ids(&cluster, &statuses).into_iter().collect();
    assert_eq!(live, [1, 2, 3]);
}
