//! The certificate flow over the in-memory API server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lvms_testkit::fake_api::FakeApi;
use serde_json::Value;

use super::*;

const NS: &str = "lvms-system";
const SECRET_PATH: &str = "/api/v1/namespaces/lvms-system/secrets/lvms-webhook-cert";

fn config_path(kind: &str, name: &str) -> String {
    format!("/apis/admissionregistration.k8s.io/v1/{kind}/{name}")
}

fn webhook_config(kind: &str, name: &str, hooks: usize) -> Value {
    let hooks: Vec<Value> = (0..hooks)
        .map(|i| {
            json!({"name": format!("h{i}.lvm.topolvm.io"), "admissionReviewVersions": ["v1"],
                   "sideEffects": "None",
                   "clientConfig": {"service": {"name": WEBHOOK_SERVICE, "namespace": NS}}})
        })
        .collect();
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
           "metadata": {"name": name}, "webhooks": hooks})
}

fn world() -> FakeApi {
    let api = FakeApi::new();
    api.insert(
        &config_path("validatingwebhookconfigurations", VALIDATING_WEBHOOK),
        webhook_config("ValidatingWebhookConfiguration", VALIDATING_WEBHOOK, 1),
    );
    api.insert(
        &config_path("mutatingwebhookconfigurations", MUTATING_WEBHOOK),
        webhook_config("MutatingWebhookConfiguration", MUTATING_WEBHOOK, 2),
    );
    api
}

fn bundles(api: &FakeApi) -> Vec<Value> {
    [
        ("validatingwebhookconfigurations", VALIDATING_WEBHOOK),
        ("mutatingwebhookconfigurations", MUTATING_WEBHOOK),
    ]
    .iter()
    .flat_map(|(kind, name)| {
        api.get(&config_path(kind, name)).unwrap()["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["clientConfig"]["caBundle"].clone())
            .collect::<Vec<_>>()
    })
    .collect()
}

fn secret_key(api: &FakeApi, key: &str) -> Vec<u8> {
    let b64 = api.get(SECRET_PATH).unwrap()["data"][key]
        .as_str()
        .unwrap()
        .to_owned();
    serde_json::from_value::<ByteString>(json!(b64)).unwrap().0
}

#[tokio::test]
async fn without_a_secret_a_certificate_is_made_stored_and_trusted_by_both_configurations() {
    let api = world();
    let client = api.client(NS);
    let ca = ensure(&client, NS, WEBHOOK_SECRET, WEBHOOK_SERVICE)
        .await
        .unwrap();

    let cert = secret_key(&api, "tls.crt");
    let key = secret_key(&api, "tls.key");
    assert_eq!(secret_key(&api, "ca.crt"), ca);
    assert_eq!(api.get(SECRET_PATH).unwrap()["type"], "kubernetes.io/tls");
    // The webhook server accepts the pair.
    crate::webhook::server_config(&cert, &key).expect("a usable certificate and key");
    let ca_b64 = serde_json::to_value(ByteString(ca.clone())).unwrap();
    assert_eq!(bundles(&api), vec![ca_b64.clone(); 3]);

    // A second start keeps the certificate and patches nothing.
    api.clear_requests();
    let again = ensure(&client, NS, WEBHOOK_SECRET, WEBHOOK_SERVICE)
        .await
        .unwrap();
    assert_eq!(again, ca);
    assert_eq!(secret_key(&api, "tls.crt"), cert);
    assert!(
        api.requests().iter().all(|r| r.method == http::Method::GET),
        "{:?}",
        api.requests()
    );
}

#[tokio::test]
async fn an_installed_certificate_is_kept_and_its_ca_trusted() {
    let api = world();
    let pair = generate("elsewhere", NS).unwrap();
    api.insert(
        SECRET_PATH,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": WEBHOOK_SECRET, "namespace": NS},
               "data": {"tls.crt": ByteString(pair.cert_pem.clone().into_bytes()),
                        "tls.key": ByteString(pair.key_pem.clone().into_bytes())}}),
    );
    let ca = ensure(&api.client(NS), NS, WEBHOOK_SECRET, WEBHOOK_SERVICE)
        .await
        .unwrap();
    assert_eq!(
        ca,
        pair.cert_pem.into_bytes(),
        "no ca.crt: the certificate is its own CA"
    );
    assert_eq!(secret_key(&api, "tls.key"), pair.key_pem.into_bytes());
    assert!(
        bundles(&api)
            .iter()
            .all(|b| *b == serde_json::to_value(ByteString(ca.clone())).unwrap())
    );
}

#[test]
fn the_certificate_names_every_address_of_the_service() {
    let pair = generate("svc", "ns").unwrap();
    crate::webhook::server_config(pair.cert_pem.as_bytes(), pair.key_pem.as_bytes()).unwrap();
    assert!(pair.ca_pem.contains("BEGIN CERTIFICATE"));
    assert_ne!(pair.ca_pem, pair.cert_pem);
}

#[tokio::test]
async fn two_replicas_starting_at_once_store_one_certificate_and_both_trust_its_ca() {
    let empty = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": WEBHOOK_SECRET, "namespace": NS}});
    for before in [None, Some(empty)] {
        let api = world();
        if let Some(secret) = before {
            api.insert(SECRET_PATH, secret);
        }
        let (a, b) = (api.client(NS), api.client(NS));
        let (a, b) = tokio::join!(
            ensure(&a, NS, WEBHOOK_SECRET, WEBHOOK_SERVICE),
            ensure(&b, NS, WEBHOOK_SECRET, WEBHOOK_SERVICE)
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "both trust one CA");
        assert_eq!(secret_key(&api, "ca.crt"), a, "the stored one");
        let ca_b64 = serde_json::to_value(ByteString(a)).unwrap();
        assert_eq!(bundles(&api), vec![ca_b64; 3]);
    }
}
