#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use axum::{
    body::Body,
    http::{Request, StatusCode},
};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;

const NAMESPACE: &str = "openshift-storage";

fn state(existing: &[&str]) -> WebhookState {
    let existing: Vec<String> = existing.iter().map(|s| (*s).to_owned()).collect();
    WebhookState::new(NAMESPACE, Arc::new(existing))
}

/// LVMS's single-class thin-pool sample: valid, with a "names no devices" warning.
fn cluster() -> Value {
    json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": NAMESPACE},
        "spec": {"storage": {"deviceClasses": [{
            "name": "vg1",
            "default": true,
            "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}
        }]}}
    })
}

fn review(operation: &str, object: Option<Value>, old_object: Option<Value>) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "lvm.topolvm.io", "version": "v1alpha1", "kind": "LVMCluster"},
            "resource": {"group": "lvm.topolvm.io", "version": "v1alpha1", "resource": "lvmclusters"},
            "name": "my-lvmcluster",
            "namespace": NAMESPACE,
            "operation": operation,
            "userInfo": {"username": "admin"},
            "object": object,
            "oldObject": old_object,
            "dryRun": false
        }
    })
}

async fn post_raw(state: WebhookState, path: &str, body: Vec<u8>) -> (StatusCode, Vec<u8>) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let response = router(state).oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

/// Posts `review` and returns the AdmissionReview's `response`.
async fn post(state: WebhookState, path: &str, review: &Value) -> Value {
    let (status, body) = post_raw(state, path, serde_json::to_vec(review).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = answer["response"].clone();
    assert_eq!(response["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    response
}

fn message(response: &Value) -> &str {
    response["status"]["message"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn valid_create_is_allowed_with_warnings() {
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("CREATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    let warnings = response["warnings"].as_array().unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().contains("names no devices")),
        "{warnings:?}"
    );
    assert!(response.get("patch").is_none());
}

#[tokio::test]
async fn invalid_create_is_denied_listing_every_field() {
    let mut object = cluster();
    object["metadata"]["namespace"] = json!("default");
    object["spec"]["storage"]["deviceClasses"] = json!([
        {"name": "a", "default": true, "deviceSelector": {"paths": ["sdb"]}},
        {"name": "b", "default": true, "deviceSelector": {"paths": ["/dev/sdc"]}}
    ]);
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("CREATE", Some(object), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert_eq!(response["status"]["code"], 403);
    let message = message(&response);
    for field in [
        "metadata.namespace: ",
        "spec.storage.deviceClasses[0].deviceSelector.paths[0]: ",
        "spec.storage.deviceClasses[1].default: ",
    ] {
        assert!(message.contains(field), "{field} missing from {message}");
    }
    assert_eq!(message.matches("; ").count(), 2, "{message}");
}

#[tokio::test]
async fn create_takes_the_namespace_from_the_request() {
    let mut object = cluster();
    object["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("CREATE", Some(object), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn update_changing_thin_pool_name_is_denied() {
    let old = cluster();
    let mut new = cluster();
    new["spec"]["storage"]["deviceClasses"][0]["thinPoolConfig"]["name"] = json!("other");
    // Another cluster existing does not matter on update.
    let response = post(
        state(&["openshift-storage/other"]),
        VALIDATE_PATH,
        &review("UPDATE", Some(new), Some(old)),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        message(&response).starts_with("spec.storage.deviceClasses[0].thinPoolConfig.name: "),
        "{response}"
    );
}

#[tokio::test]
async fn update_with_unchanged_spec_is_allowed() {
    let old = cluster();
    let mut new = cluster();
    new["metadata"]["finalizers"] = json!(["lvmcluster.topolvm.io"]);
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("UPDATE", Some(new), Some(old)),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn delete_is_allowed() {
    let response = post(
        state(&["openshift-storage/my-lvmcluster"]),
        VALIDATE_PATH,
        &review("DELETE", None, Some(cluster())),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("warnings").is_none());
}

#[tokio::test]
async fn second_cluster_is_denied() {
    let response = post(
        state(&["openshift-storage/first"]),
        VALIDATE_PATH,
        &review("CREATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = message(&response);
    assert!(message.starts_with("metadata.name: "), "{message}");
    assert!(message.contains("openshift-storage/first"), "{message}");
    // Warnings come with denials too.
    assert!(!response["warnings"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn create_retried_for_the_same_cluster_is_not_a_second_cluster() {
    let response = post(
        state(&["openshift-storage/my-lvmcluster"]),
        VALIDATE_PATH,
        &review("CREATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

struct FailingLister;

impl ClusterLister for FailingLister {
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async { Err("connection refused".to_owned()) })
    }

    fn node_statuses<'a>(
        &'a self,
        _namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LVMVolumeGroupNodeStatus>, String>> {
        Box::pin(async { Err("connection refused".to_owned()) })
    }
}

#[tokio::test]
async fn create_is_denied_when_clusters_cannot_be_listed() {
    let state = WebhookState::new(NAMESPACE, Arc::new(FailingLister));
    let response = post(
        state,
        VALIDATE_PATH,
        &review("CREATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        message(&response).contains("connection refused"),
        "{response}"
    );
}

// ---------------------------------------------------------------------------------------------
// Rule 38: existing shared volume groups, from the node statuses (through the in-memory API)
// ---------------------------------------------------------------------------------------------

const WIPE_FIELD: &str =
    "spec.storage.deviceClasses[1].deviceSelector.forceWipeDevicesAndDestroyAllData";

/// `cluster()` plus the shared class `san`, wiping its LUN when `wipe`.
fn shared_cluster(wipe: bool) -> Value {
    let mut object = cluster();
    // Next to another class, the node-local class must name its devices (rule 13).
    object["spec"]["storage"]["deviceClasses"][0]["deviceSelector"] =
        json!({"paths": ["/dev/sdb"]});
    object["spec"]["storage"]["deviceClasses"]
        .as_array_mut()
        .unwrap()
        .push(json!({
            "name": "san",
            "deviceAccessPolicy": "shared",
            "deviceSelector": {
                "paths": ["/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"],
                "forceWipeDevicesAndDestroyAllData": wipe
            }
        }));
    object
}

fn node_status_path(namespace: &str, node: &str) -> String {
    format!(
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/{namespace}/lvmvolumegroupnodestatuses/{node}"
    )
}

/// The in-memory API server with `node`'s status in `namespace`, reporting `vgs`.
fn insert_node_status(
    api: &lvms_testkit::fake_api::FakeApi,
    namespace: &str,
    node: &str,
    vgs: Value,
) {
    api.insert(
        &node_status_path(namespace, node),
        json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": namespace},
            "spec": {"nodeStatus": vgs}
        }),
    );
}

fn kube_state(api: &lvms_testkit::fake_api::FakeApi) -> WebhookState {
    WebhookState::new(NAMESPACE, kube_cluster_lister(api.client(NAMESPACE)))
}

fn node_status_lists(api: &lvms_testkit::fake_api::FakeApi) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.ends_with("/lvmvolumegroupnodestatuses"))
        .count()
}

#[tokio::test]
async fn force_wipe_of_a_shared_volume_group_a_node_reports_is_denied() {
    let api = lvms_testkit::fake_api::FakeApi::new();
    insert_node_status(
        &api,
        NAMESPACE,
        "worker-0",
        json!([{"name": "vg1", "status": "Ready"},
               {"name": "san", "status": "Progressing", "shared": {"lockspace": "Joined", "hostId": 1}}]),
    );
    let create = post(
        kube_state(&api),
        VALIDATE_PATH,
        &review("CREATE", Some(shared_cluster(true)), None),
    )
    .await;
    assert_eq!(create["allowed"], false, "{create}");
    assert!(
        message(&create).starts_with(&format!("{WIPE_FIELD}: ")),
        "{create}"
    );
    assert!(message(&create).contains("already exists"), "{create}");
    assert_eq!(
        node_status_lists(&api),
        1,
        "the node statuses of the operator's namespace are listed"
    );
    assert!(api.requests().iter().any(|r| r.path
        == format!(
            "/apis/lvm.topolvm.io/v1alpha1/namespaces/{NAMESPACE}/lvmvolumegroupnodestatuses"
        )));

    // An update that keeps the flag on is denied too; one that turns it off is allowed.
    let mut old = shared_cluster(true);
    old["spec"]["storage"]["deviceClasses"][0]["thinPoolConfig"]["overprovisionRatio"] = json!(5);
    let update = post(
        kube_state(&api),
        VALIDATE_PATH,
        &review("UPDATE", Some(shared_cluster(true)), Some(old)),
    )
    .await;
    assert_eq!(update["allowed"], false, "{update}");
    assert!(message(&update).contains(WIPE_FIELD), "{update}");
    let off = post(
        kube_state(&api),
        VALIDATE_PATH,
        &review(
            "UPDATE",
            Some(shared_cluster(false)),
            Some(shared_cluster(true)),
        ),
    )
    .await;
    assert_eq!(off["allowed"], true, "{off}");
}

#[tokio::test]
async fn force_wipe_of_a_shared_volume_group_no_node_reports_is_allowed() {
    let api = lvms_testkit::fake_api::FakeApi::new();
    // Reported only in another namespace, as joining, or failed: not known to exist here.
    insert_node_status(
        &api,
        "elsewhere",
        "worker-0",
        json!([{"name": "san", "status": "Ready", "shared": {"lockspace": "Joined"}}]),
    );
    insert_node_status(
        &api,
        NAMESPACE,
        "worker-1",
        json!([{"name": "san", "status": "Progressing", "shared": {"lockspace": "Joining"}}]),
    );
    insert_node_status(
        &api,
        NAMESPACE,
        "worker-2",
        json!([{"name": "san", "status": "Failed", "shared": {"lockspace": "NotJoined"}}]),
    );
    let response = post(
        kube_state(&api),
        VALIDATE_PATH,
        &review("CREATE", Some(shared_cluster(true)), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
}

#[tokio::test]
async fn node_statuses_are_listed_only_for_a_shared_class_that_wipes() {
    let api = lvms_testkit::fake_api::FakeApi::new();
    let mut wipes_local = shared_cluster(false);
    wipes_local["spec"]["storage"]["deviceClasses"][0]["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] =
        json!(true);
    for object in [cluster(), shared_cluster(false), wipes_local] {
        let response = post(
            kube_state(&api),
            VALIDATE_PATH,
            &review("CREATE", Some(object), None),
        )
        .await;
        assert_eq!(response["allowed"], true, "{response}");
    }
    assert_eq!(node_status_lists(&api), 0);
}

#[tokio::test]
async fn force_wipe_on_a_shared_class_is_denied_when_node_statuses_cannot_be_listed() {
    let api = lvms_testkit::fake_api::FakeApi::new();
    api.fail(
        http::Method::GET,
        &format!("/apis/lvm.topolvm.io/v1alpha1/namespaces/{NAMESPACE}/lvmvolumegroupnodestatuses"),
        http::StatusCode::SERVICE_UNAVAILABLE,
        1,
    );
    let response = post(
        kube_state(&api),
        VALIDATE_PATH,
        &review("CREATE", Some(shared_cluster(true)), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(
        message(&response).contains("cannot check whether the shared volume groups"),
        "{response}"
    );
    let fixed = post(
        WebhookState::new(NAMESPACE, Arc::new(FailingLister)),
        VALIDATE_PATH,
        &review(
            "UPDATE",
            Some(shared_cluster(true)),
            Some(shared_cluster(false)),
        ),
    )
    .await;
    assert!(message(&fixed).contains("connection refused"), "{fixed}");
}

#[tokio::test]
async fn malformed_json_is_bad_request() {
    for path in [VALIDATE_PATH, MUTATE_PATH] {
        let (status, body) = post_raw(state(&[]), path, b"{not json".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let body = String::from_utf8(body).unwrap();
        assert!(body.contains("not JSON"), "{body}");
    }
}

#[tokio::test]
async fn review_without_request_is_bad_request() {
    let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"});
    let (status, body) = post_raw(
        state(&[]),
        VALIDATE_PATH,
        serde_json::to_vec(&body).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8(body).unwrap().contains("no request"));
}

#[tokio::test]
async fn unparsable_object_is_denied_with_the_field_and_the_parse_error() {
    let mut object = cluster();
    object["spec"]["storage"]["deviceClasses"][0]["fstype"] = json!("btrfs");
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("CREATE", Some(object.clone()), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    let message = message(&response);
    assert!(
        message.starts_with(
            "the object is not a valid LVMCluster: spec.storage.deviceClasses[0].fstype: "
        ),
        "{message}"
    );
    assert!(message.contains("btrfs"), "{message}");
}

#[tokio::test]
async fn unparsable_object_is_left_to_schema_validation_by_the_mutating_webhook() {
    let mut object = cluster();
    object["spec"]["storage"]["deviceClasses"][0]["fstype"] = json!("btrfs");
    object["spec"]["storage"]["deviceClasses"][0]
        .as_object_mut()
        .unwrap()
        .remove("deviceSelector");
    let response = post(
        state(&[]),
        MUTATE_PATH,
        &review("CREATE", Some(object), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert!(response.get("patch").is_none(), "{response}");
}

#[tokio::test]
async fn update_without_old_object_is_denied() {
    let response = post(
        state(&[]),
        VALIDATE_PATH,
        &review("UPDATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], false, "{response}");
    assert!(message(&response).contains("oldObject"), "{response}");
}

#[tokio::test]
async fn mutate_create_sets_static_discovery_policy() {
    let response = post(
        state(&[]),
        MUTATE_PATH,
        &review("CREATE", Some(cluster()), None),
    )
    .await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = response["patch"].as_str().expect("base64 patch");
    let patch: Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(patch)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        patch,
        json!([{
            "op": "add",
            "path": "/spec/storage/deviceClasses/0/deviceDiscoveryPolicy",
            "value": "Static"
        }])
    );
}

#[tokio::test]
async fn mutate_without_changes_or_on_update_has_no_patch() {
    let mut with_paths = cluster();
    with_paths["spec"]["storage"]["deviceClasses"][0]["deviceSelector"] =
        json!({"paths": ["/dev/sdb"]});
    for review in [
        review("CREATE", Some(with_paths), None),
        review("UPDATE", Some(cluster()), Some(cluster())),
        review("DELETE", None, Some(cluster())),
    ] {
        let response = post(state(&[]), MUTATE_PATH, &review).await;
        assert_eq!(response["allowed"], true, "{response}");
        assert!(response.get("patch").is_none(), "{response}");
        assert!(response.get("patchType").is_none(), "{response}");
    }
}

#[tokio::test]
async fn health_endpoints_answer_ok() {
    for path in ["/healthz", "/readyz"] {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let response = router(state(&[])).oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}

mod tls {
    use std::{path::Path, sync::Arc, time::Duration};

    use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
        sync::oneshot,
    };
    use tokio_rustls::TlsConnector;

    use super::*;

    struct Pair {
        cert_pem: String,
        key_pem: String,
        der: Vec<u8>,
    }

    fn self_signed() -> Pair {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        Pair {
            cert_pem: certified.cert.pem(),
            key_pem: certified.signing_key.serialize_pem(),
            der: certified.cert.der().to_vec(),
        }
    }

    fn write(dir: &Path, pair: &Pair) {
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem).unwrap();
        std::fs::write(dir.join("tls.key"), &pair.key_pem).unwrap();
    }

    /// POSTs `body` over HTTPS trusting only `trusted`; returns the status code and body.
    async fn https_post(
        addr: std::net::SocketAddr,
        trusted: &[u8],
        path: &str,
        body: &[u8],
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let mut roots = RootCertStore::empty();
        roots.add(trusted.to_vec().into()).unwrap();
        let config =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        tls.write_all(head.as_bytes()).await?;
        tls.write_all(body).await?;
        tls.flush().await?;
        // Read until the body announced by Content-Length is complete.
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = tls.read(&mut chunk).await?;
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map_or(0, |v| v.trim().parse().unwrap());
                if buf.len() >= end + 4 + length {
                    let status = head[9..12].parse().unwrap();
                    return Ok((status, buf[end + 4..end + 4 + length].to_vec()));
                }
            }
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    #[tokio::test]
    async fn serves_reviews_over_tls_and_reloads_the_certificate() {
        let dir = tempfile_dir();
        let first = self_signed();
        write(&dir, &first);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn({
            let dir = dir.clone();
            async move {
                serve_tls_on(
                    listener,
                    &dir.join("tls.crt"),
                    &dir.join("tls.key"),
                    router(state(&[])),
                    async {
                        let _ = stopped.await;
                    },
                    Duration::from_millis(50),
                )
                .await
            }
        });

        let body = serde_json::to_vec(&review("CREATE", Some(cluster()), None)).unwrap();
        let (status, answer) = https_post(addr, &first.der, VALIDATE_PATH, &body)
            .await
            .unwrap();
        assert_eq!(status, 200);
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["response"]["allowed"], true, "{answer}");

        // A new pair in the files is served once the poll picks it up.
        let second = self_signed();
        write(&dir, &second);
        let mut reloaded = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            if https_post(addr, &second.der, VALIDATE_PATH, &body)
                .await
                .is_ok()
            {
                reloaded = true;
                break;
            }
        }
        assert!(reloaded, "the new certificate was not served");
        assert!(
            https_post(addr, &first.der, VALIDATE_PATH, &body)
                .await
                .is_err(),
            "the old certificate is still served"
        );

        // A broken pair is ignored; the current one stays.
        std::fs::write(dir.join("tls.key"), "not a key").unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (status, _) = https_post(addr, &second.der, VALIDATE_PATH, &body)
            .await
            .unwrap();
        assert_eq!(status, 200);

        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(15), server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn serve_fails_on_an_invalid_key() {
        let dir = tempfile_dir();
        write(&dir, &self_signed());
        std::fs::write(dir.join("tls.key"), "not a key").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let result = serve_tls_on(
            listener,
            &dir.join("tls.crt"),
            &dir.join("tls.key"),
            router(state(&[])),
            async {},
            Duration::from_secs(10),
        )
        .await;
        assert!(matches!(result, Err(Error::Tls(_))), "{result:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lvms-webhook-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
