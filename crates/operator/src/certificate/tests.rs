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
    let ca = ensure(&client, &Names::new(NS), Validity::default())
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
    let again = ensure(&client, &Names::new(NS), Validity::default())
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
    let pair = Names {
        service: "elsewhere".to_owned(),
        ..Names::new(NS)
    }
    .pair(Validity::default(), None)
    .unwrap();
    api.insert(
        SECRET_PATH,
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": WEBHOOK_SECRET, "namespace": NS},
               "data": {"tls.crt": ByteString(pair.cert_pem.clone().into_bytes()),
                        "tls.key": ByteString(pair.key_pem.clone().into_bytes())}}),
    );
    let ca = ensure(&api.client(NS), &Names::new(NS), Validity::default())
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
    let pair = Names {
        service: "svc".to_owned(),
        ..Names::new("ns")
    }
    .pair(Validity::default(), None)
    .unwrap();
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
        let names = Names::new(NS);
        let (a, b) = tokio::join!(
            ensure(&a, &names, Validity::default()),
            ensure(&b, &names, Validity::default())
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_eq!(a, b, "both trust one CA");
        assert_eq!(secret_key(&api, "ca.crt"), a, "the stored one");
        let ca_b64 = serde_json::to_value(ByteString(a)).unwrap();
        assert_eq!(bundles(&api), vec![ca_b64; 3]);
    }
}

/// Whether `cert` (PEM) is signed by `ca` (PEM).
fn signed_by(cert: &[u8], ca: &[u8]) -> bool {
    let (_, cert) = x509_parser::pem::parse_x509_pem(cert).unwrap();
    let (_, ca) = x509_parser::pem::parse_x509_pem(ca).unwrap();
    let (cert, ca) = (cert.parse_x509().unwrap(), ca.parse_x509().unwrap());
    cert.verify_signature(Some(ca.public_key())).is_ok()
}

fn bundle_text(b: &Value) -> String {
    String::from_utf8(serde_json::from_value::<ByteString>(b.clone()).unwrap().0).unwrap()
}

const SHORT: std::time::Duration = std::time::Duration::from_secs(90);

#[test]
fn a_certificate_is_due_once_less_than_a_third_of_its_lifetime_is_left() {
    assert!(!due((0, 300), 199));
    assert!(!due((0, 300), 200));
    assert!(due((0, 300), 201));
    assert!(due((0, 300), 400), "expired");
    assert!(due((10, 10), 11), "no lifetime, expired");
}

#[tokio::test]
async fn a_certificate_made_here_is_renewed_under_the_same_ca_once_due() {
    let api = world();
    let client = api.client(NS);
    let validity = Validity::with_certificate(SHORT);
    let ca = ensure(&client, &Names::new(NS), validity).await.unwrap();
    let first = secret_key(&api, "tls.crt");
    let (not_before, not_after) = validity_of(&first).unwrap();
    assert_eq!(not_after - not_before, 60 + 90);
    let made = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let made = i64::try_from(made).unwrap();
    assert!(
        (made - 62..=made - 58).contains(&not_before),
        "valid from a minute ago"
    );
    let bundles_before = bundles(&api);

    let early = renew_if_due(&client, &Names::new(NS), validity, not_before + 99)
        .await
        .unwrap();
    assert_eq!(early, Renewal::NotDue { at: not_after - 50 });
    assert_eq!(secret_key(&api, "tls.crt"), first);

    let renewed = renew_if_due(&client, &Names::new(NS), validity, not_after - 29)
        .await
        .unwrap();
    assert!(
        matches!(renewed, Renewal::Renewed { new_ca: false, .. }),
        "{renewed:?}"
    );
    let second = secret_key(&api, "tls.crt");
    assert_ne!(second, first);
    assert_eq!(secret_key(&api, "ca.crt"), ca, "the same CA");
    assert!(signed_by(&second, &ca));
    assert_eq!(bundles(&api), bundles_before, "nothing to trust anew");
    crate::webhook::server_config(&second, &secret_key(&api, "tls.key"))
        .expect("a usable certificate and key");
}

#[tokio::test]
async fn a_ca_without_its_key_is_replaced_after_both_cas_are_trusted() {
    let api = world();
    let client = api.client(NS);
    let validity = Validity::with_certificate(SHORT);
    let old_ca = ensure(&client, &Names::new(NS), validity).await.unwrap();
    let mut secret = api.get(SECRET_PATH).unwrap();
    secret["data"].as_object_mut().unwrap().remove("ca.key");
    api.insert(SECRET_PATH, secret);
    let (_, not_after) = validity_of(&secret_key(&api, "tls.crt")).unwrap();
    let renewed = renew_if_due(&client, &Names::new(NS), validity, not_after)
        .await
        .unwrap();
    assert!(
        matches!(renewed, Renewal::Renewed { new_ca: true, .. }),
        "{renewed:?}"
    );
    let new_ca = secret_key(&api, "ca.crt");
    assert_ne!(new_ca, old_ca);
    assert!(signed_by(&secret_key(&api, "tls.crt"), &new_ca));
    for b in bundles(&api) {
        let text = bundle_text(&b);
        let (old, new) = (
            String::from_utf8_lossy(&old_ca),
            String::from_utf8_lossy(&new_ca),
        );
        assert!(
            text.contains(old.trim()) && text.contains(new.trim()),
            "{text}"
        );
    }
    // A restart during the rollover keeps both trusted.
    ensure(&client, &Names::new(NS), validity).await.unwrap();
    for b in bundles(&api) {
        assert!(bundle_text(&b).contains(String::from_utf8_lossy(&old_ca).trim()));
    }
}

#[tokio::test]
async fn a_certificate_not_made_here_is_never_renewed() {
    let api = world();
    let client = api.client(NS);
    // As cert-manager leaves it: the pair and its CA, no mark of ours.
    let pair = generate_with(
        &["elsewhere".to_owned()],
        "elsewhere",
        Validity::with_certificate(SHORT),
        None,
    )
    .unwrap();
    let data: BTreeMap<String, ByteString> = secret_data(&pair);
    api.insert(
        SECRET_PATH,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": WEBHOOK_SECRET, "namespace": NS}, "data": data}),
    );
    api.clear_requests();
    let (_, not_after) = validity_of(pair.cert_pem.as_bytes()).unwrap();
    let seen = renew_if_due(&client, &Names::new(NS), Validity::default(), not_after + 1)
        .await
        .unwrap();
    assert_eq!(seen, Renewal::NotOurs);
    assert!(
        api.requests().iter().all(|r| r.method == http::Method::GET),
        "{:?}",
        api.requests()
    );
}

#[tokio::test]
async fn the_changed_block_tracking_certificate_names_the_agents_and_lands_in_its_service() {
    let api = world();
    let client = api.client(NS);
    let names = Names::snapshot_metadata(
        NS,
        MetadataService {
            driver: "topolvm.io".into(),
            address: "lvms-snapshot-metadata.lvms-system:6443".into(),
            audience: "topolvm.io".into(),
        },
    );
    let ca = ensure(&client, &names, Validity::default()).await.unwrap();

    let path = format!("/api/v1/namespaces/{NS}/secrets/{SNAPSHOT_METADATA_SECRET}");
    let secret = api.get(&path).unwrap();
    let cert: ByteString = serde_json::from_value(secret["data"]["tls.crt"].clone()).unwrap();
    let (_, parsed) = x509_parser::pem::parse_x509_pem(&cert.0).unwrap();
    let parsed = parsed.parse_x509().unwrap();
    let dns: Vec<String> = parsed
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect();
    for name in [
        lvms_api::SNAPSHOT_METADATA_SERVER_NAME,
        "lvms-snapshot-metadata.lvms-system",
    ] {
        assert!(dns.iter().any(|d| d == name), "{name} not in {dns:?}");
    }
    let service = api
        .get("/apis/cbt.storage.k8s.io/v1beta1/snapshotmetadataservices/topolvm.io")
        .unwrap();
    assert_eq!(
        service["spec"]["caCert"],
        serde_json::to_value(ByteString(ca)).unwrap()
    );
    assert_eq!(
        service["spec"]["address"],
        "lvms-snapshot-metadata.lvms-system:6443"
    );
    // The webhook configurations are not this certificate's business.
    assert!(
        bundles(&api).iter().all(Value::is_null),
        "{:?}",
        bundles(&api)
    );
}
