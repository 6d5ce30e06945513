//! The admission webhook's serving certificate when the installation brings none
//! (`--self-signed-webhook-cert`, on in `deploy/`): at start the operator makes a CA and a certificate
//! for the webhook Service, stores them in the Secret its pod mounts, and writes the CA into the
//! `caBundle` of both webhook configurations. The webhook server re-reads the mounted pair every 10 s,
//! so it serves the new certificate once kubelet has updated the volume.
//!
//! A Secret that already holds `tls.crt` and `tls.key` (from cert-manager, or an earlier start) is kept;
//! only the `caBundle`s are brought in line with its `ca.crt` (or `tls.crt` when it has none). Nothing is
//! rotated: the certificate is valid for ten years.

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

/// A certificate, its key and the CA that signed it, in PEM.
#[derive(Debug, Clone)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

/// A CA and a certificate for `service` in `namespace` (every name the API server may dial).
pub fn generate(service: &str, namespace: &str) -> Result<Pair, Error> {
    generate_for(
        &[
            service.to_owned(),
            format!("{service}.{namespace}"),
            format!("{service}.{namespace}.svc"),
            format!("{service}.{namespace}.svc.cluster.local"),
        ],
        &format!("{service}.{namespace}.svc"),
    )
}

/// A CA ("lvms webhook CA") and a certificate for `names` (DNS names or IP addresses) with common
/// name `common_name`, both valid until January 1st ten years from now.
pub fn generate_for(names: &[String], common_name: &str) -> Result<Pair, Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let err = |e: rcgen::Error| Error::Generate(e.to_string());
    // January 1st, ten years after this year.
    let year = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(2026, |d| 1970 + d.as_secs() / 31_556_952);
    let ten_years = rcgen::date_time_ymd(i32::try_from(year + 10).unwrap_or(2036), 1, 1);
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
    ca_params.not_after = ten_years;
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(err)?).map_err(err)?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.not_after = ten_years;
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.signed_by(&key, &ca).map_err(err)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        ca_pem: ca.pem(),
    })
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

/// Makes sure the Secret `secret` in `namespace` holds a certificate for `service` (making one when it
/// holds none) and that both webhook configurations trust its CA; returns the CA in PEM.
pub async fn ensure(
    client: &Client,
    namespace: &str,
    secret: &str,
    service: &str,
) -> Result<Vec<u8>, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
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
        let pair = generate(service, namespace)?;
        let data: BTreeMap<String, ByteString> = [
            ("tls.crt", &pair.cert_pem),
            ("tls.key", &pair.key_pem),
            ("ca.crt", &pair.ca_pem),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.as_bytes().to_vec())))
        .collect();
        let mut obj = Secret {
            data: Some(data),
            type_: Some("kubernetes.io/tls".to_owned()),
            ..Secret::default()
        };
        obj.metadata.name = Some(secret.to_owned());
        obj.metadata.namespace = Some(namespace.to_owned());
        let written = match found {
            None => secrets
                .create(&PostParams::default(), &obj)
                .await
                .map(|_| ()),
            Some(found) => secrets
                .patch(
                    secret,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": {"resourceVersion": found.metadata.resource_version},
                        "data": obj.data,
                        "type": obj.type_,
                    })),
                )
                .await
                .map(|_| ()),
        };
        match written {
            Ok(()) => {
                tracing::info!(
                    secret,
                    "made a self-signed certificate for the admission webhook"
                );
                break pair.ca_pem.into_bytes();
            }
            Err(kube::Error::Api(s)) if s.code == 409 && attempts < 3 => {}
            Err(e) => return Err(kube_err(format!("write Secret {secret}"))(e)),
        }
    };
    trust::<ValidatingWebhookConfiguration>(client, VALIDATING_WEBHOOK, &ca).await?;
    trust::<MutatingWebhookConfiguration>(client, MUTATING_WEBHOOK, &ca).await?;
    Ok(ca)
}

/// Sets `caBundle` of every webhook of configuration `name` that does not hold `ca` yet (a JSON patch
/// per changed entry); a configuration that does not exist is left to the installer.
async fn trust<K>(client: &Client, name: &str, ca: &[u8]) -> Result<(), Error>
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
    // Both configuration kinds hold `webhooks[*].clientConfig.caBundle`, compared as serialised.
    let want = json!(ByteString(ca.to_vec()));
    let config = serde_json::to_value(&config)
        .map_err(|e| Error::Generate(format!("reading {name}: {e}")))?;
    let ops: Vec<serde_json::Value> = config["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, w)| w["clientConfig"]["caBundle"] != want)
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
