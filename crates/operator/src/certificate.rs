//! The admission webhook's serving certificate when the installation brings none
//! (`--self-signed-webhook-cert`, on in `deploy/`): at start the operator makes a CA and a certificate
//! for the webhook Service, stores them (and the CA's key) in the Secret its pod mounts, marked
//! [`MADE_HERE`], and writes the CA into the `caBundle` of both webhook configurations. The webhook
//! server re-reads the mounted pair every 10 s, so it serves a new certificate once kubelet has
//! updated the volume (within about a minute).
//!
//! Renewal ([`keep_renewed`], run by the leader): a certificate of a Secret marked [`MADE_HERE`] is
//! made anew once less than a third of its lifetime is left ([`Validity`]: a year by default, its CA
//! ten), signed by the same CA, so the `caBundle`s need no change and admission never sees a
//! certificate it does not trust. A CA that is itself due (or whose key the Secret lacks) is
//! replaced the same way, its successor added to the `caBundle`s *before* the Secret changes, so
//! both the old certificate (still served until kubelet updates the volume) and the new one are
//! trusted throughout.
//!
//! The same machinery makes and renews the certificate of changed-block tracking
//! ([`Names::snapshot_metadata`], ADR 0039): the csi-snapshot-metadata sidecar's TLS API, the node
//! agents' server and the CSI controller's client share it; its CA is kept in the
//! `SnapshotMetadataService` (`spec.caCert`, which backup clients trust) instead of webhook
//! configurations.
//!
//! A Secret that holds `tls.crt` and `tls.key` but is not marked (cert-manager's, OpenShift's
//! service CA's, or one made by an earlier lvms-rs, valid ten years) is never written: only the
//! `caBundle`s are brought in line with its `ca.crt` (or `tls.crt` when it has none), and only
//! with `--self-signed-webhook-cert`; with those injectors, turn it off and let them inject.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
};
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::json;

/// Name of the ValidatingWebhookConfiguration of `deploy/`.
pub const VALIDATING_WEBHOOK: &str = "lvms-validating-webhook";
/// Name of the MutatingWebhookConfiguration of `deploy/`.
pub const MUTATING_WEBHOOK: &str = "lvms-mutating-webhook";
/// Name of the webhook's Service in `deploy/`.
pub const WEBHOOK_SERVICE: &str = "lvms-webhook-service";
/// Name of the Secret the operator's pod mounts in `deploy/`.
pub const WEBHOOK_SECRET: &str = "lvms-webhook-cert";
/// Name of the Secret of changed-block tracking (`deploy/components/snapshot-metadata`).
pub const SNAPSHOT_METADATA_SECRET: &str = "lvms-snapshot-metadata-cert";
/// Name of the csi-snapshot-metadata sidecar's Service (`deploy/components/snapshot-metadata`).
pub const SNAPSHOT_METADATA_SERVICE: &str = "lvms-snapshot-metadata";
/// The port of that Service.
pub const SNAPSHOT_METADATA_PORT: u16 = 6443;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("making the webhook certificate: {0}")]
    Generate(String),
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
}

/// Where the webhook's certificate lives and who must trust it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The operator's namespace: the Secret's and the Service's.
    pub namespace: String,
    /// The Secret the operator's pods mount.
    pub secret: String,
    /// The webhook's Service (the certificate's names).
    pub service: String,
    /// The ValidatingWebhookConfiguration and MutatingWebhookConfiguration whose `caBundle`s are
    /// kept.
    pub validating: String,
    pub mutating: String,
    /// More names (DNS names or IP addresses) the certificate holds: a webhook the API server
    /// reaches by `url` rather than through the Service.
    pub extra: Vec<String>,
    /// The `SnapshotMetadataService` whose `caCert` is kept (changed-block tracking); `None` for
    /// the webhook's certificate.
    pub snapshot_metadata: Option<MetadataService>,
}

/// The `SnapshotMetadataService` object (`cbt.storage.k8s.io/v1beta1`, named after the CSI driver)
/// that tells backup clients where the csi-snapshot-metadata sidecar is and which CA it answers
/// with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataService {
    /// The driver's name (the object's name).
    pub driver: String,
    /// `host:port` backup clients dial.
    pub address: String,
    /// The audience of the tokens they present.
    pub audience: String,
}

impl Names {
    /// `deploy/`'s names in `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            secret: WEBHOOK_SECRET.to_owned(),
            service: WEBHOOK_SERVICE.to_owned(),
            validating: VALIDATING_WEBHOOK.to_owned(),
            mutating: MUTATING_WEBHOOK.to_owned(),
            extra: Vec::new(),
            snapshot_metadata: None,
        }
    }

    /// The certificate of changed-block tracking in `namespace`: for the sidecar's Service, and
    /// for [`lvms_api::SNAPSHOT_METADATA_SERVER_NAME`] (the node agents' name the controller checks); its CA
    /// is kept in `service`, no webhook configuration.
    pub fn snapshot_metadata(namespace: &str, service: MetadataService) -> Self {
        Self {
            namespace: namespace.to_owned(),
            secret: SNAPSHOT_METADATA_SECRET.to_owned(),
            service: SNAPSHOT_METADATA_SERVICE.to_owned(),
            validating: String::new(),
            mutating: String::new(),
            extra: vec![lvms_api::SNAPSHOT_METADATA_SERVER_NAME.to_owned()],
            snapshot_metadata: Some(service),
        }
    }

    /// Which certificate it is, in log lines ("the admission webhook's certificate").
    fn purpose(&self) -> &'static str {
        if self.snapshot_metadata.is_some() {
            "changed-block tracking's certificate"
        } else {
            "the admission webhook's certificate"
        }
    }

    /// A certificate for the Service (every name the API server may dial, and [`Names::extra`]),
    /// made as [`generate_with`] makes it.
    pub fn pair(&self, validity: Validity, ca: Option<(&str, &str)>) -> Result<Pair, Error> {
        let (service, namespace) = (&self.service, &self.namespace);
        let mut names = vec![
            service.clone(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ];
        names.extend(self.extra.iter().cloned());
        generate_with(&names, &format!("{service}.{namespace}.svc"), validity, ca)
    }
}

/// The annotation marking a Secret whose certificate this operator made, and so renews.
pub const MADE_HERE: &str = "lvms.topolvm.io/self-signed-webhook-cert";

/// How long the certificate and its CA are valid from when they are made; each is made anew once
/// less than a third of it is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub certificate: std::time::Duration,
    pub ca: std::time::Duration,
}

impl Default for Validity {
    /// A year, and ten for the CA.
    fn default() -> Self {
        const DAY: u64 = 24 * 3600;
        Self {
            certificate: std::time::Duration::from_secs(365 * DAY),
            ca: std::time::Duration::from_secs(3650 * DAY),
        }
    }
}

impl Validity {
    /// A certificate valid `certificate` long, its CA ten times that (at least ten years).
    pub fn with_certificate(certificate: std::time::Duration) -> Self {
        Self {
            certificate,
            ca: (certificate * 10).max(Self::default().ca),
        }
    }
}

/// A certificate, its key, the CA that signed it and the CA's key, in PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
    pub ca_key_pem: String,
}

/// A CA ("lvms webhook CA") and a certificate for `names` (DNS names or IP addresses) with common
/// name `common_name`, valid as [`Validity::default`] says.
pub fn generate_for(names: &[String], common_name: &str) -> Result<Pair, Error> {
    generate_with(names, common_name, Validity::default(), None)
}

/// A certificate for `names` with common name `common_name`, valid from a minute ago (clocks
/// differ) until `validity.certificate` from now, signed by `ca` (its certificate and key in PEM) or, with
/// none, by a new CA valid for `validity.ca`.
pub fn generate_with(
    names: &[String],
    common_name: &str,
    validity: Validity,
    ca: Option<(&str, &str)>,
) -> Result<Pair, Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| Error::Generate(e.to_string());
    let now = time::OffsetDateTime::now_utc();
    let since = now - time::Duration::minutes(1);
    let until = |d: std::time::Duration| {
        now + time::Duration::try_from(d).unwrap_or(time::Duration::days(3650))
    };
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_before = since;
    params.not_after = until(validity.certificate);
    let key = KeyPair::generate().map_err(err)?;
    let (cert, ca_pem, ca_key_pem) = match ca {
        Some((ca_pem, ca_key_pem)) => {
            let ca_key = KeyPair::from_pem(ca_key_pem).map_err(err)?;
            let issuer = Issuer::from_ca_cert_pem(ca_pem, &ca_key).map_err(err)?;
            let cert = params.signed_by(&key, &issuer).map_err(err)?;
            (cert, ca_pem.to_owned(), ca_key_pem.to_owned())
        }
        None => {
            let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
            ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            ca_params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            ca_params
                .distinguished_name
                .push(DnType::CommonName, "lvms webhook CA");
            ca_params.not_before = since;
            ca_params.not_after = until(validity.ca);
            let ca_key = KeyPair::generate().map_err(err)?;
            let ca_key_pem = ca_key.serialize_pem();
            let issuer = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;
            let cert = params.signed_by(&key, &issuer).map_err(err)?;
            (cert, issuer.pem(), ca_key_pem)
        }
    };
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem,
        ca_key_pem,
    })
}

/// The validity of the (first) certificate in `pem`, as Unix seconds (not before, not after).
pub fn validity_of(pem: &[u8]) -> Option<(i64, i64)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// Whether a certificate valid from `not_before` to `not_after` is to be made anew at `now`: less
/// than a third of its lifetime is left.
pub fn due((not_before, not_after): (i64, i64), now: i64) -> bool {
    let lifetime = not_after.saturating_sub(not_before).max(0);
    not_after.saturating_sub(now) < lifetime / 3
}

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

fn key(secret: &Secret, name: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()?
        .get(name)
        .map(|b| b.0.clone())
        .filter(|b| !b.is_empty())
}

/// The Secret's data for `pair`.
fn secret_data(pair: &Pair) -> BTreeMap<String, ByteString> {
    [
        ("tls.crt", &pair.cert_pem),
        ("tls.key", &pair.key_pem),
        ("ca.crt", &pair.ca_pem),
        ("ca.key", &pair.ca_key_pem),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
    .collect()
}

/// Writes `pair` into the Secret `found` read (marked [`MADE_HERE`]), on the condition that it has
/// not changed since; creates it when `found` is `None`. `Ok(false)`: another wrote first (409).
async fn write_pair(
    secrets: &Api<Secret>,
    name: &str,
    found: Option<&Secret>,
    pair: &Pair,
) -> Result<bool, Error> {
    let data = secret_data(pair);
    let written = match found {
        None => {
            let mut obj = Secret {
                data: Some(data),
                type_: Some("kubernetes.io/tls".to_owned()),
                ..Secret::default()
            };
            obj.metadata.name = Some(name.to_owned());
            obj.metadata.annotations = Some([(MADE_HERE.to_owned(), "true".to_owned())].into());
            secrets
                .create(&PostParams::default(), &obj)
                .await
                .map(|_| ())
        }
        Some(found) => secrets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({
                    "metadata": {
                        "resourceVersion": found.metadata.resource_version,
                        "annotations": {MADE_HERE: "true"},
                    },
                    "data": data,
                    "type": "kubernetes.io/tls",
                })),
            )
            .await
            .map(|_| ()),
    };
    match written {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(kube_err(format!("write Secret {name}"))(e)),
    }
}

/// Makes sure the Secret `secret` in `namespace` holds a certificate for `service` (making one,
/// valid as `validity` says, when it holds none) and that both webhook configurations trust its CA;
/// returns the CA in PEM.
pub async fn ensure(client: &Client, names: &Names, validity: Validity) -> Result<Vec<u8>, Error> {
    let secret = names.secret.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &names.namespace);
    // Every replica runs this at its start: of two making a certificate at once, one writes it
    // (create, or fill on the condition of the resourceVersion read) and the other, refused with
    // 409, reads it again and trusts the same CA.
    let mut attempts = 0;
    let ca = loop {
        attempts += 1;
        let found = secrets
            .get_opt(secret)
            .await
            .map_err(kube_err(format!("read Secret {secret}")))?;
        if let Some(ca) = found.as_ref().and_then(|s| {
            key(s, "tls.crt")
                .zip(key(s, "tls.key"))
                .map(|(crt, _)| key(s, "ca.crt").unwrap_or(crt))
        }) {
            break ca;
        }
        let pair = names.pair(validity, None)?;
        if write_pair(&secrets, secret, found.as_ref(), &pair).await? {
            tracing::info!(secret, "made {} (self-signed)", names.purpose());
            break pair.ca_pem.into_bytes();
        }
        if attempts >= 3 {
            return Err(Error::Generate(format!(
                "Secret {secret} changed under every one of 3 writes"
            )));
        }
    };
    trust_both(client, names, &ca, &ca).await?;
    Ok(ca)
}

/// What [`renew_if_due`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The Secret is not marked [`MADE_HERE`] (or holds no certificate): left alone.
    NotOurs,
    /// Not due; the certificate is next renewed at this Unix second.
    NotDue { at: i64 },
    /// A new certificate was written (`new_ca`: under a new CA, added to the `caBundle`s first).
    Renewed { new_ca: bool, not_after: i64 },
    /// Another wrote the Secret since it was read: looked at again next time.
    Raced,
}

/// Renews the certificate of the Secret `secret` when it is ours and due at `now` (Unix seconds);
/// see the module documentation.
pub async fn renew_if_due(
    client: &Client,
    names: &Names,
    validity: Validity,
    now: i64,
) -> Result<Renewal, Error> {
    let secret = names.secret.as_str();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &names.namespace);
    let Some(found) = secrets
        .get_opt(secret)
        .await
        .map_err(kube_err(format!("read Secret {secret}")))?
    else {
        return Ok(Renewal::NotOurs);
    };
    let ours = found
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(MADE_HERE).is_some_and(|v| v == "true"));
    let (Some(cert), Some(ca)) = (key(&found, "tls.crt"), key(&found, "ca.crt")) else {
        return Ok(Renewal::NotOurs);
    };
    if !ours {
        return Ok(Renewal::NotOurs);
    }
    let cert_validity = validity_of(&cert)
        .ok_or_else(|| Error::Generate(format!("Secret {secret}: tls.crt does not parse")))?;
    if !due(cert_validity, now) {
        let (not_before, not_after) = cert_validity;
        return Ok(Renewal::NotDue {
            at: not_after - (not_after - not_before) / 3,
        });
    }
    let ca_key = key(&found, "ca.key");
    let keep_ca = ca_key.is_some() && validity_of(&ca).is_some_and(|v| !due(v, now));
    let ca_pem = String::from_utf8_lossy(&ca).into_owned();
    let ca_key_pem = ca_key.map(|k| String::from_utf8_lossy(&k).into_owned());
    let signer = ca_key_pem.as_deref().filter(|_| keep_ca);
    let pair = names.pair(validity, signer.map(|k| (ca_pem.as_str(), k)))?;
    if !keep_ca {
        // Both CAs trusted before the Secret (and then the served certificate) changes.
        let both = format!("{}\n{}", ca_pem.trim_end(), pair.ca_pem);
        trust_both(client, names, pair.ca_pem.as_bytes(), both.as_bytes()).await?;
    }
    if !write_pair(&secrets, secret, Some(&found), &pair).await? {
        return Ok(Renewal::Raced);
    }
    let not_after = validity_of(pair.cert_pem.as_bytes()).map_or(0, |v| v.1);
    tracing::info!(
        secret,
        new_ca = !keep_ca,
        not_after,
        "renewed {}",
        names.purpose()
    );
    Ok(Renewal::Renewed {
        new_ca: !keep_ca,
        not_after,
    })
}

/// Renews the certificate (with [`renew_if_due`]) whenever due, looking every twentieth of its
/// validity (at most hourly, at least every second), until `stop` completes. Run by the leader.
pub async fn keep_renewed(
    client: Client,
    names: Names,
    validity: Validity,
    stop: impl Future<Output = ()>,
) {
    let every = (validity.certificate / 20).clamp(
        std::time::Duration::from_secs(1),
        std::time::Duration::from_secs(3600),
    );
    tokio::pin!(stop);
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        match renew_if_due(&client, &names, validity, now).await {
            Ok(Renewal::NotDue { at }) => tracing::debug!(at, "webhook certificate not due"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "renewing the webhook certificate"),
        }
        tokio::select! {
            () = &mut stop => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// [`trust`] in both webhook configurations (those named), and the `SnapshotMetadataService`'s
/// `caCert` set to `bundle` (when there is one).
async fn trust_both(client: &Client, names: &Names, ca: &[u8], bundle: &[u8]) -> Result<(), Error> {
    if !names.validating.is_empty() {
        trust::<ValidatingWebhookConfiguration>(client, &names.validating, ca, bundle).await?;
    }
    if !names.mutating.is_empty() {
        trust::<MutatingWebhookConfiguration>(client, &names.mutating, ca, bundle).await?;
    }
    if let Some(service) = &names.snapshot_metadata {
        publish_metadata_service(client, service, bundle).await?;
    }
    Ok(())
}

/// Server-side applies the `SnapshotMetadataService` of `service` with `ca_bundle` as its
/// `caCert`; without its CRD (the external-snapshot-metadata release not installed) it is left out,
/// with a warning.
pub async fn publish_metadata_service(
    client: &Client,
    service: &MetadataService,
    ca_bundle: &[u8],
) -> Result<(), Error> {
    use kube::{api::DynamicObject, discovery::ApiResource};
    let resource = ApiResource {
        group: "cbt.storage.k8s.io".to_owned(),
        version: "v1beta1".to_owned(),
        api_version: "cbt.storage.k8s.io/v1beta1".to_owned(),
        kind: "SnapshotMetadataService".to_owned(),
        plural: "snapshotmetadataservices".to_owned(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let object = json!({
        "apiVersion": resource.api_version, "kind": resource.kind,
        "metadata": {"name": service.driver},
        "spec": {
            "address": service.address,
            "audience": service.audience,
            "caCert": ByteString(ca_bundle.to_vec()),
        },
    });
    match api
        .patch(
            &service.driver,
            &PatchParams::apply("lvms-operator").force(),
            &Patch::Apply(&object),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::warn!(
                "the SnapshotMetadataService CRD is not installed: install the \
                 external-snapshot-metadata release's CRD for backup clients to find the service"
            );
            Ok(())
        }
        Err(e) => Err(kube_err(format!(
            "apply SnapshotMetadataService {}",
            service.driver
        ))(e)),
    }
}

/// Sets `caBundle` to `bundle` in every webhook of configuration `name` whose bundle does not hold
/// `ca` yet (a JSON patch per changed entry); a configuration that does not exist is left to the
/// installer.
async fn trust<K>(client: &Client, name: &str, ca: &[u8], bundle: &[u8]) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let Some(config) = api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("read webhook configuration {name}")))?
    else {
        tracing::warn!(
            name,
            "webhook configuration not found; its caBundle is not set"
        );
        return Ok(());
    };
    // Both configuration kinds hold `webhooks[*].clientConfig.caBundle`.
    let want = json!(ByteString(bundle.to_vec()));
    let config = serde_json::to_value(&config)
        .map_err(|e| Error::Generate(format!("reading {name}: {e}")))?;
    let holds_ca = |b: &serde_json::Value| {
        serde_json::from_value::<ByteString>(b.clone()).is_ok_and(|held| {
            let ca = String::from_utf8_lossy(ca);
            String::from_utf8_lossy(&held.0).contains(ca.trim())
        })
    };
    let ops: Vec<serde_json::Value> = config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, w)| !holds_ca(&w["clientConfig"]["caBundle"]))
        .map(|(i, _)| {
            json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"),
                   "value": want})
        })
        .collect();
    if ops.is_empty() {
        return Ok(());
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))
        .map_err(|e| Error::Generate(format!("building the caBundle patch: {e}")))?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(kube_err(format!("set caBundle of {name}")))?;
    Ok(())
}

#[cfg(test)]
mod tests;
