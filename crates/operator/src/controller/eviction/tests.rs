//! The eviction controller against a mocked API server: the exact reads, the deletion with its
//! UID precondition, the two events, and the calls it must not make.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, client::Body};
use serde_json::{Value, json};
use tower_test::mock;

use super::{Context, DELETED_REASON, INVALID_ANNOTATION_REASON, reconcile};
use crate::{
    controller::tests::{ApiServer, Seen, assert_get, assert_no_more_requests, next, not_found},
    metrics::Metrics,
};

const DRIVER: &str = "topolvm.io";
const STS_PATH: &str = "/apis/apps/v1/namespaces/db/statefulsets/web";
const CLAIM_PATH: &str = "/api/v1/namespaces/db/persistentvolumeclaims/data-web-0";
const PV_PATH: &str = "/api/v1/persistentvolumes/pv-1";
const NODE_PATH: &str = "/api/v1/nodes/worker-1";
const EVENTS_PATH: &str = "/apis/events.k8s.io/v1/namespaces/db/events";

fn context() -> (Arc<Context>, ApiServer, Arc<Metrics>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let metrics = Arc::new(Metrics::new());
    (
        Arc::new(Context::new(client, DRIVER.to_owned(), metrics.clone())),
        handle,
        metrics,
    )
}

fn pod_json(conditions: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0", "namespace": "db", "uid": "pod-uid",
            "creationTimestamp": "2026-01-01T00:01:00Z",
            "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                                 "uid": "sts-uid", "controller": true}]
        },
        "spec": {
            "nodeName": "worker-1",
            "containers": [{"name": "db", "image": "db"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}}]
        },
        "status": {"conditions": conditions}
    })
}

fn evicted() -> Value {
    json!([{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}])
}

fn pod(conditions: Value, annotations: Value) -> Arc<Pod> {
    Arc::new(serde_json::from_value(pod_json(conditions, annotations)).unwrap())
}

fn statefulset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "db", "uid": "sts-uid"},
        "spec": {
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "db", "image": "db"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                                      "spec": {"accessModes": ["ReadWriteOnce"]}}]
        }
    })
}

fn claim(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-web-0", "namespace": "db", "uid": "claim-uid",
                     "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1"}
    })
}

fn opted_in() -> Value {
    json!({"metal-stack.io/csi-driver-lvm.is-eviction-allowed": "true"})
}

fn volume(driver: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "claimRef": {"namespace": "db", "name": "data-web-0", "uid": "claim-uid"},
            "csi": {"driver": driver, "volumeHandle": "vol-1"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.topolvm.io/node", "operator": "In", "values": ["worker-1"]}]}]}}
        }
    })
}

fn node(unschedulable: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "worker-1"},
        "spec": {"unschedulable": unschedulable},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn ok(body: Value) -> impl FnOnce(&Seen) -> (StatusCode, Value) {
    move |_| (StatusCode::OK, body)
}

fn echo(seen: &Seen) -> (StatusCode, Value) {
    (StatusCode::CREATED, seen.body.clone())
}

/// Answers the reads up to the Node with the given objects, asserting each path.
async fn serve_reads(server: &mut ApiServer, claim_annotations: Value, driver: &str, node: Value) {
    assert_get(&next(server, ok(statefulset())).await, STS_PATH);
    assert_get(
        &next(server, ok(claim(claim_annotations))).await,
        CLAIM_PATH,
    );
    assert_get(&next(server, ok(volume(driver))).await, PV_PATH);
    assert_get(&next(server, ok(node)).await, NODE_PATH);
}

fn assert_event(seen: &Seen, reason: &str, kind: &str, name: &str) {
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (&Method::POST, EVENTS_PATH)
    );
    assert_eq!(seen.body["reason"], reason, "{}", seen.body);
    assert_eq!(seen.body["regarding"]["kind"], kind, "{}", seen.body);
    assert_eq!(seen.body["regarding"]["name"], name, "{}", seen.body);
    assert_eq!(
        seen.body["reportingController"], "lvms-operator",
        "{}",
        seen.body
    );
}

#[tokio::test]
async fn drained_node_claim_is_deleted_with_its_uid_as_precondition_and_both_objects_get_an_event()
{
    let (ctx, mut server, metrics) = context();
    let task = tokio::spawn(reconcile(pod(evicted(), json!(null)), ctx));
    serve_reads(&mut server, opted_in(), DRIVER, node(true)).await;

    let seen = next(&mut server, ok(claim(opted_in()))).await;
    assert_eq!(
        (&seen.method, seen.path.as_str()),
        (&Method::DELETE, CLAIM_PATH)
    );
    assert_eq!(seen.body["preconditions"], json!({"uid": "claim-uid"}));

    let seen = next(&mut server, echo).await;
    assert_event(&seen, DELETED_REASON, "PersistentVolumeClaim", "data-web-0");
    assert_eq!(seen.body["type"], "Normal");
    assert_eq!(seen.body["related"]["kind"], "Pod");
    let note = seen.body["note"].as_str().unwrap();
    assert!(
        note.contains("pod db/web-0 is being evicted")
            && note.contains("node worker-1, which is cordoned"),
        "{note}"
    );
    let seen = next(&mut server, echo).await;
    assert_event(&seen, DELETED_REASON, "StatefulSet", "web");
    assert_eq!(seen.body["related"]["name"], "data-web-0");

    task.await.unwrap().unwrap();
    assert_no_more_requests(&mut server).await;
    let text = metrics.encode();
    for line in [
        "lvms_operator_eviction_claim_deletions_total 1",
        r#"lvms_operator_reconciles_total{controller="eviction",result="success"} 1"#,
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn a_claim_on_a_schedulable_node_or_of_another_driver_is_read_and_left_alone() {
    for (driver, node_body, reads_node) in [
        (DRIVER, node(false), true),
        ("lvm.csi.metal-stack.io", node(true), false),
    ] {
        let (ctx, mut server, metrics) = context();
        let task = tokio::spawn(reconcile(pod(evicted(), opted_in()), ctx));
        assert_get(&next(&mut server, ok(statefulset())).await, STS_PATH);
        assert_get(&next(&mut server, ok(claim(json!(null)))).await, CLAIM_PATH);
        assert_get(&next(&mut server, ok(volume(driver))).await, PV_PATH);
        if reads_node {
            assert_get(&next(&mut server, ok(node_body)).await, NODE_PATH);
        }
        task.await.unwrap().unwrap();
        assert_no_more_requests(&mut server).await;
        assert!(
            !metrics
                .encode()
                .contains("lvms_operator_eviction_claim_deletions_total 1")
        );
    }
}

#[tokio::test]
async fn without_the_opt_in_neither_the_volume_nor_the_node_is_read() {
    let (ctx, mut server, _) = context();
    let task = tokio::spawn(reconcile(pod(evicted(), json!(null)), ctx));
    assert_get(&next(&mut server, ok(statefulset())).await, STS_PATH);
    assert_get(&next(&mut server, ok(claim(json!(null)))).await, CLAIM_PATH);
    task.await.unwrap().unwrap();
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn a_malformed_opt_in_is_a_warning_event_on_the_object_that_carries_it() {
    let (ctx, mut server, _) = context();
    let task = tokio::spawn(reconcile(
        pod(
            evicted(),
            json!({"lvms.topolvm.io/is-eviction-allowed": "yes"}),
        ),
        ctx,
    ));
    assert_get(&next(&mut server, ok(statefulset())).await, STS_PATH);
    assert_get(&next(&mut server, ok(claim(opted_in()))).await, CLAIM_PATH);
    let seen = next(&mut server, echo).await;
    assert_event(&seen, INVALID_ANNOTATION_REASON, "Pod", "web-0");
    assert_eq!(seen.body["type"], "Warning");
    task.await.unwrap().unwrap();
    assert_no_more_requests(&mut server).await;
}

#[tokio::test]
async fn a_claim_replaced_since_it_was_read_is_left_without_events() {
    let (ctx, mut server, metrics) = context();
    let task = tokio::spawn(reconcile(pod(evicted(), opted_in()), ctx));
    assert_get(&next(&mut server, ok(statefulset())).await, STS_PATH);
    assert_get(&next(&mut server, ok(claim(json!(null)))).await, CLAIM_PATH);
    assert_get(&next(&mut server, ok(volume(DRIVER))).await, PV_PATH);
    // The node is gone.
    assert_get(&next(&mut server, |_| not_found()).await, NODE_PATH);
    let seen = next(&mut server, |_| {
        (
            StatusCode::CONFLICT,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Conflict",
                   "code": 409, "message": "Precondition failed: UID in precondition: claim-uid, \
                   UID in object meta: new-uid"}),
        )
    })
    .await;
    assert_eq!(seen.method, Method::DELETE);
    task.await.unwrap().unwrap();
    assert_no_more_requests(&mut server).await;
    assert!(
        !metrics
            .encode()
            .contains("lvms_operator_eviction_claim_deletions_total 1")
    );
}

#[tokio::test]
async fn pods_without_a_trigger_or_a_statefulset_cost_no_request_and_no_count() {
    let (ctx, mut server, metrics) = context();
    let running = pod(json!([{"type": "Ready", "status": "True"}]), opted_in());
    reconcile(running, ctx.clone()).await.unwrap();
    let mut v = pod_json(evicted(), opted_in());
    v["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "web-7d9", "uid": "rs-uid", "controller": true}]);
    reconcile(Arc::new(serde_json::from_value(v).unwrap()), ctx)
        .await
        .unwrap();
    assert_no_more_requests(&mut server).await;
    assert!(!metrics.encode().contains("controller=\"eviction\""));
}

#[tokio::test]
async fn a_failed_read_fails_the_reconcile_and_is_counted() {
    let (ctx, mut server, metrics) = context();
    let task = tokio::spawn(reconcile(pod(evicted(), opted_in()), ctx));
    next(&mut server, |_| {
        (
            StatusCode::FORBIDDEN,
            json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "Forbidden",
                   "code": 403, "message": "statefulsets.apps \"web\" is forbidden"}),
        )
    })
    .await;
    let err = task.await.unwrap().unwrap_err();
    assert!(
        err.to_string().contains("reading StatefulSet db/web"),
        "{err}"
    );
    assert!(
        metrics
            .encode()
            .contains(r#"lvms_operator_reconciles_total{controller="eviction",result="error"} 1"#)
    );
}
