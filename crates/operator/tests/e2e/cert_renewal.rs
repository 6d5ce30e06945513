//! The self-signed webhook certificate renewed on the real API server: the `lvms operator` binary,
//! with the operator's RBAC, makes a certificate valid for one minute, keeps its CA in webhook
//! configurations of its own (reached by `url` on loopback), and renews it under the same CA while
//! the API server sends it an admission review every half second: every review is answered.
//!
//! kubelet's part, projecting the Secret into the pod's volume, is done here by copying the
//! Secret's `tls.crt` and `tls.key` into the certificate directory every 2 s (kubelet's Secret
//! volumes take up to about a minute; the installed test runs with kubelet).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use k8s_openapi::{
    ByteString,
    api::{
        admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
        core::v1::Secret,
    },
};
use kube::{Api, api::PostParams};
use lvms_api::LVMCluster;
use serde_json::json;

use crate::{
    leader::{OperatorSetup, Replica},
    stack::{apply, documents},
    support::{WAIT, eventually},
};

/// How long the probes run: the one-minute certificate is renewed every 20 s or so.
const PROBING: Duration = Duration::from_secs(70);

fn data(secret: &Secret, key: &str) -> Option<Vec<u8>> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b: &ByteString| b.0.clone())
}

#[tokio::test]
async fn a_short_lived_webhook_certificate_is_renewed_while_admission_keeps_answering() {
    let Some(setup) = OperatorSetup::new(
        "a_short_lived_webhook_certificate_is_renewed_while_admission_keeps_answering",
        "cert",
    )
    .await
    else {
        return;
    };
    let (client, sfx, ns, work) = (&setup.client, &setup.sfx, &setup.ns, &setup.work);
    let cert_dir = work.join("cert");

    let (validating, mutating) = (
        format!("lvms-e2e-cert-{sfx}-validating"),
        format!("lvms-e2e-cert-{sfx}-mutating"),
    );
    let mut operator = Replica::new(
        &setup.lvms,
        work,
        "cert",
        &ns.name,
        &format!("{sfx}.cert.topolvm.io"),
        &[
            "--self-signed-webhook-cert".to_owned(),
            "--webhook-cert-validity=60s".to_owned(),
            "--webhook-cert-extra-names=127.0.0.1".to_owned(),
            format!("--validating-webhook-configuration={validating}"),
            format!("--mutating-webhook-configuration={mutating}"),
        ],
    );
    // deploy/base's webhook configurations under this test's names, for its namespace only,
    // calling the operator by URL; no caBundle: the operator puts its CA there.
    let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base");
    for mut doc in documents(&base.join("webhooks.yaml")) {
        let name = if doc["kind"] == "ValidatingWebhookConfiguration" {
            &validating
        } else {
            &mutating
        };
        doc["metadata"]["name"] = json!(name);
        for hook in doc["webhooks"].as_array_mut().unwrap() {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap()
                .to_owned();
            hook["namespaceSelector"] =
                json!({"matchLabels": {"kubernetes.io/metadata.name": ns.name}});
            hook["clientConfig"] =
                json!({"url": format!("https://127.0.0.1:{}{path}", operator.webhook)});
        }
        apply(client, &doc).await;
    }
    operator.start();

    // kubelet's Secret volume, every 2 s; every certificate seen.
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let kubelet = tokio::spawn({
        let (secrets, cert_dir, mut stopped) = (secrets.clone(), cert_dir.clone(), stopped.clone());
        async move {
            let mut seen: Vec<(Instant, Vec<u8>)> = Vec::new();
            loop {
                if let Ok(Some(s)) = secrets
                    .get_opt(lvms_operator::certificate::WEBHOOK_SECRET)
                    .await
                    && let (Some(crt), Some(key)) = (data(&s, "tls.crt"), data(&s, "tls.key"))
                    && seen.last().is_none_or(|(_, last)| *last != crt)
                {
                    for (name, bytes) in [("tls.key", &key), ("tls.crt", &crt)] {
                        let tmp = cert_dir.join(format!(".{name}"));
                        std::fs::write(&tmp, bytes).unwrap();
                        std::fs::rename(&tmp, cert_dir.join(name)).unwrap();
                    }
                    seen.push((Instant::now(), crt));
                }
                tokio::select! {
                    _ = stopped.changed() => return seen,
                    () = tokio::time::sleep(Duration::from_secs(2)) => {}
                }
            }
        }
    });

    // The CA is in both configurations, and the webhook answers.
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns.name);
    let invalid: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "probe", "namespace": ns.name},
        "spec": {"storage": {"deviceClasses": [{
            "name": "probe", "default": true, "deviceSelector": {"paths": ["sdb"]},
            "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}
        }]}}
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe = || async {
        match clusters.create(&dry_run, &invalid).await {
            Err(e) if e.to_string().contains("denied the request") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    };
    eventually("the webhook answers", WAIT, probe).await;
    let ca = data(
        &secrets
            .get(lvms_operator::certificate::WEBHOOK_SECRET)
            .await
            .unwrap(),
        "ca.crt",
    )
    .unwrap();

    // Reviews every half second while the certificate is renewed.
    let started = Instant::now();
    let (mut answered, mut failed) = (0u32, Vec::new());
    while started.elapsed() < PROBING {
        match probe().await {
            Ok(()) => answered += 1,
            Err(e) => failed.push(format!("+{:.1} s: {e}", started.elapsed().as_secs_f64())),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.send(true).unwrap();
    let seen = kubelet.await.unwrap();
    let secret = secrets
        .get(lvms_operator::certificate::WEBHOOK_SECRET)
        .await
        .unwrap();
    let log = std::fs::read_to_string(&operator.log).unwrap_or_default();
    let renewed = log
        .matches("renewed the admission webhook's certificate")
        .count();
    let reloaded = log.matches("reloaded the TLS certificate").count();
    let distinct: BTreeSet<&Vec<u8>> = seen.iter().map(|(_, c)| c).collect();
    let timeline: Vec<String> = seen
        .iter()
        .map(|(at, crt)| {
            let (nb, na) = lvms_operator::certificate::validity_of(crt).unwrap();
            let since = at.saturating_duration_since(started).as_secs_f64()
                - started.saturating_duration_since(*at).as_secs_f64();
            format!("{since:+.0} s: valid {nb}..{na}")
        })
        .collect();
    println!(
        "cert_renewal: {answered} reviews answered, {} failed in {:.0} s; certificates {timeline:?}; \
         renewed {renewed}, reloaded {reloaded}",
        failed.len(),
        PROBING.as_secs_f64()
    );
    operator.kill();
    assert!(failed.is_empty(), "{failed:?}\n{}", operator.tail());
    assert!(distinct.len() >= 3, "two renewals at least: {timeline:?}");
    assert!(renewed >= 2 && reloaded >= 2, "{}", operator.tail());
    assert_eq!(data(&secret, "ca.crt"), Some(ca.clone()), "the same CA");
    let delete = kube::api::DeleteParams::default();
    let v = Api::<ValidatingWebhookConfiguration>::all(client.clone());
    let m = Api::<MutatingWebhookConfiguration>::all(client.clone());
    let bundles: Vec<Vec<u8>> = [
        serde_json::to_value(v.get(&validating).await.unwrap()).unwrap(),
        serde_json::to_value(m.get(&mutating).await.unwrap()).unwrap(),
    ]
    .iter()
    .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
    .map(|h| {
        serde_json::from_value::<ByteString>(h["clientConfig"]["caBundle"].clone())
            .unwrap()
            .0
    })
    .collect();
    assert_eq!(bundles, vec![ca.clone(); 2], "only the one CA, unchanged");
    let _ = v.delete(&validating, &delete).await;
    let _ = m.delete(&mutating, &delete).await;
    setup.delete().await;
}
