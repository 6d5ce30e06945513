//! The admission webhook as the API server calls it: served in this process over HTTPS with a
//! throw-away CA, registered for this test's namespaces only.

use std::{path::Path, sync::Arc, time::Duration};

use base64::Engine as _;
use futures::future::BoxFuture;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus};
use lvms_operator::webhook::{ClusterLister, MUTATE_PATH, VALIDATE_PATH, WebhookState};
use serde_json::json;

use crate::support::{self, TestNamespace, WAIT, api_error, eventually};

/// The LVMClusters of one namespace: concurrent tests in other namespaces do not count as
/// "another LVMCluster" here.
struct NamespaceLister(Api<LVMCluster>);

impl ClusterLister for NamespaceLister {
    fn list(&self) -> BoxFuture<'_, Result<Vec<String>, String>> {
        Box::pin(async move {
            let list = self
                .0
                .list_metadata(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            Ok(list
                .items
                .iter()
                .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
                .collect())
        })
    }

    fn node_statuses<'a>(
        &'a self,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<Vec<LVMVolumeGroupNodeStatus>, String>> {
        Box::pin(async move {
            Api::<LVMVolumeGroupNodeStatus>::namespaced(self.0.clone().into_client(), namespace)
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .map_err(|e| e.to_string())
        })
    }
}

/// A CA and a server certificate for `host`, written as `tls.crt`/`tls.key` into `dir`; returns
/// the CA's PEM (the caBundle).
pub(crate) fn certificates(dir: &Path, host: &str) -> String {
    let mut names = vec![host.to_owned()];
    for n in ["127.0.0.1", "localhost"] {
        if !names.iter().any(|h| h == n) {
            names.push(n.to_owned());
        }
    }
    let pair = lvms_operator::certificate::generate_for(&names, "lvms-e2e webhook").unwrap();
    std::fs::write(dir.join("tls.crt"), pair.cert_pem).unwrap();
    std::fs::write(dir.join("tls.key"), pair.key_pem).unwrap();
    pair.ca_pem
}

/// The webhook, serving and registered; `stop` ends the server, `unregister` removes the
/// configurations.
pub struct Webhook {
    name: String,
    client: Client,
    stop: tokio::sync::watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

impl Webhook {
    pub async fn start(client: &Client, operator_ns: &str, selector_value: &str) -> Self {
        let host =
            std::env::var("LVMS_E2E_WEBHOOK_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
        let bind = if host == "127.0.0.1" {
            "127.0.0.1:0"
        } else {
            "0.0.0.0:0"
        };
        let dir = tempfile::tempdir().unwrap();
        let ca = certificates(dir.path(), &host);
        let listener = std::net::TcpListener::bind(bind).unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = WebhookState::new(
            operator_ns,
            Arc::new(NamespaceLister(Api::namespaced(
                client.clone(),
                operator_ns,
            ))),
        );
        let (stop, stopped) = support::stop_signal();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        tokio::spawn(async move {
            let served = lvms_operator::webhook::serve_tls_on(
                listener,
                &cert,
                &key,
                lvms_operator::webhook::router(state),
                stopped(),
                Duration::from_secs(10),
            )
            .await;
            if let Err(e) = served {
                eprintln!("the e2e webhook server failed: {e}");
            }
        });

        let name = format!("lvms-e2e-{selector_value}");
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
        let url = |path: &str| format!("https://{host}:{port}{path}");
        let hook = |name: &str, path: &str, operations: &[&str]| {
            json!({
                "name": name,
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "clientConfig": {"url": url(path), "caBundle": ca_bundle},
                "rules": [{
                    "apiGroups": ["lvm.topolvm.io"],
                    "apiVersions": ["v1alpha1"],
                    "operations": operations,
                    "resources": ["lvmclusters"],
                    "scope": "Namespaced",
                }],
                "namespaceSelector": {"matchLabels": {"lvms-e2e/webhook": selector_value}},
            })
        };
        let labels = json!({support::E2E_LABEL: "true"});
        let validating: ValidatingWebhookConfiguration = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name, "labels": labels},
            "webhooks": [hook("vlvmcluster.lvms-e2e.topolvm.io", VALIDATE_PATH, &["CREATE", "UPDATE"])],
        }))
        .unwrap();
        let mutating: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name, "labels": labels},
            "webhooks": [hook("mlvmcluster.lvms-e2e.topolvm.io", MUTATE_PATH, &["CREATE"])],
        }))
        .unwrap();
        Api::<ValidatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &validating)
            .await
            .expect("registering the validating webhook");
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &mutating)
            .await
            .expect("registering the mutating webhook");
        Self {
            name,
            client: client.clone(),
            stop,
            _dir: dir,
        }
    }

    /// Waits until the API server calls the webhook for `ns` (registration takes a moment to
    /// apply); the denial of an invalid path, rule 14.
    pub async fn wait_called(&self, ns: &str) -> String {
        let clusters = Api::<LVMCluster>::namespaced(self.client.clone(), ns);
        eventually("the API server calls the webhook", WAIT, || {
            let clusters = clusters.clone();
            let bad = bad_path_cluster(ns);
            async move {
                match clusters.create(&dry_run(), &bad).await {
                    Err(kube::Error::Api(s)) if s.message.contains("denied the request") => {
                        Ok(s.message.clone())
                    }
                    other => Err(format!(
                        "{other:?} (if the API server cannot reach 127.0.0.1, set \
                         LVMS_E2E_WEBHOOK_HOST to an address of this machine it can reach)"
                    )),
                }
            }
        })
        .await
    }

    pub async fn unregister(self) {
        let _ = Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = Api::<MutatingWebhookConfiguration>::all(self.client.clone())
            .delete(&self.name, &DeleteParams::default())
            .await;
        let _ = self.stop.send(true);
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        field_manager: None,
    }
}

fn cluster(ns: &str, classes: serde_json::Value) -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": ns},
        "spec": {"storage": {"deviceClasses": classes}},
    }))
    .unwrap()
}

fn bad_path_cluster(ns: &str) -> LVMCluster {
    cluster(
        ns,
        json!([{"name": "vg1", "default": true, "deviceSelector": {"paths": ["sdb"]},
                "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}}]),
    )
}

/// LVMS's samples, placeholders of its RAID test plan filled in as a user would, status-only
/// samples left out; as (file name, cluster in `ns`).
fn samples(ns: &str) -> Vec<(String, LVMCluster)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests/samples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !(name.starts_with("lvmcluster_") && name.ends_with(".yaml")) {
            continue;
        }
        let text = (0..8)
            .fold(std::fs::read_to_string(&path).unwrap(), |t, i| {
                t.replace(&format!("$LOOP{i}"), &format!("/dev/loop{i}"))
            })
            .replace("$NODE", "worker-0");
        let mut c: LVMCluster = serde_norway::from_str(&text).unwrap();
        if c.spec.storage.device_classes.is_empty() {
            continue;
        }
        c.metadata.namespace = Some(ns.to_owned());
        c.status = None;
        out.push((name, c));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test]
async fn webhook_admits_lvms_samples_and_denies_invalid_clusters_with_field_paths() {
    if !support::enabled("webhook_admits_lvms_samples_and_denies_invalid_clusters_with_field_paths")
    {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let selector = [("lvms-e2e/webhook", sfx.as_str())];
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-wh-{sfx}"), &selector).await;
    let other =
        TestNamespace::create(&client, &format!("lvms-e2e-wh-{sfx}-other"), &selector).await;
    let webhook = Webhook::start(&client, &ns.name, &sfx).await;
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns.name);

    // Rule 14, once the API server calls the webhook.
    let message = webhook.wait_called(&ns.name).await;
    assert!(
        message.contains("spec.storage.deviceClasses[0].deviceSelector.paths[0]"),
        "{message}"
    );
    assert!(message.contains("is not a device path"), "{message}");

    // Every LVMS sample is admitted (schema, CEL and webhook).
    let samples = samples(&ns.name);
    assert!(samples.len() >= 7, "{} samples", samples.len());
    for (name, sample) in samples {
        clusters
            .create(&dry_run(), &sample)
            .await
            .unwrap_or_else(|e| panic!("sample {name} was refused: {e}"));
    }

    // Mutation: a class with neither paths nor a policy gets Static.
    let mutated = clusters
        .create(
            &dry_run(),
            &cluster(
                &ns.name,
                json!([{"name": "vg1", "default": true,
                        "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}}]),
            ),
        )
        .await
        .expect("a single class without paths is admitted");
    assert_eq!(
        mutated.spec.storage.device_classes[0]
            .device_discovery_policy
            .map(|p| p.as_str()),
        Some("Static"),
        "{mutated:?}"
    );

    // Rule 1: only in the operator's namespace.
    let (code, message) = api_error(
        Api::<LVMCluster>::namespaced(client.clone(), &other.name)
            .create(&dry_run(), &{
                let mut c = bad_path_cluster(&other.name);
                c.spec.storage.device_classes[0]
                    .device_selector
                    .as_mut()
                    .unwrap()
                    .paths = vec!["/dev/sdb".to_owned()];
                c
            })
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("metadata.namespace"), "{message}");
    assert!(message.contains(&ns.name), "{message}");

    // Update rules: the default class cannot be removed; rule 2: only one LVMCluster.
    let two = cluster(
        &ns.name,
        json!([
            {"name": "vg1", "default": true, "deviceSelector": {"paths": ["/dev/sdb"]},
             "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}},
            {"name": "vg2", "deviceSelector": {"paths": ["/dev/sdc"]}}
        ]),
    );
    clusters
        .create(&PostParams::default(), &two)
        .await
        .expect("a valid cluster is created");
    let mut second = two.clone();
    second.metadata.name = Some("second".to_owned());
    let (code, message) = api_error(clusters.create(&dry_run(), &second).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("my-lvmcluster"), "{message}");

    let mut current = clusters.get("my-lvmcluster").await.unwrap();
    current.spec.storage.device_classes.remove(0);
    let (code, message) = api_error(
        clusters
            .replace("my-lvmcluster", &PostParams::default(), &current)
            .await,
    );
    assert_eq!(code, 403, "{message}");
    assert!(
        message.contains("is the default and cannot be removed"),
        "{message}"
    );

    let _ = clusters
        .delete("my-lvmcluster", &DeleteParams::default())
        .await;
    webhook.unregister().await;
    ns.delete().await;
    other.delete().await;
}
