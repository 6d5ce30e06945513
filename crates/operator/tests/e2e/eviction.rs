//! The eviction controller, in this process, against the real API server, controller-manager and
//! scheduler: a drained node's opted-in StatefulSet claim is deleted and made anew by the
//! StatefulSet controller, while a claim of another driver on the same node and a claim on a
//! healthy node are left alone; an unschedulable pod whose volume's node is gone gets its claim
//! back as a new one.
//!
//! The claims are bound to PersistentVolumes the test makes (as external-provisioner would, with
//! node affinity on `topology.topolvm.io/node`) before the StatefulSets exist, so the StatefulSet
//! controller adopts them by name and no provisioner is needed; each run uses a CSI driver name of
//! its own. There is no kubelet: the test writes the pods' Running/Ready status as kubelet would,
//! evicts them through the eviction API (as `kubectl drain` does, retrying while the
//! PodDisruptionBudget is not yet computed), and finishes an evicted pod's termination with a
//! grace-0 delete, as kubelet confirms it. The `DisruptionTarget` condition the controller reacts
//! to is the one the API server's eviction handler adds before it deletes the pod.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    events::v1::Event,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams},
};
use lvms_api::{CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION, TOPOLOGY_NODE_KEY};
use lvms_operator::{
    controller::eviction::{DELETED_REASON, run},
    metrics::Metrics,
};
use serde_json::{Value, json};

use crate::support::{self, TestNamespace, WAIT, consistently, eventually};

/// The claim template of every StatefulSet here.
const TEMPLATE: &str = "data";

/// A StatefulSet of one replica named `name`, its pod opted in, pinned to `node` by `nodeName`
/// (there is no kubelet to run it anyway) or left to the scheduler.
fn statefulset(name: &str, node: Option<&str>) -> Value {
    let mut pod_spec = json!({
        "containers": [{"name": "db", "image": "registry.k8s.io/pause:3.10",
                        "volumeMounts": [{"name": TEMPLATE, "mountPath": "/data"}]}],
        "terminationGracePeriodSeconds": 30
    });
    if let Some(node) = node {
        pod_spec["nodeName"] = json!(node);
    }
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "labels": {support::E2E_LABEL: "true"}},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name},
                             "annotations": {CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION: "true"}},
                "spec": pod_spec
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": TEMPLATE},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "",
                         "resources": {"requests": {"storage": "1Gi"}}}
            }]
        }
    })
}

/// A claim `<template>-<sts>-0` bound to a PersistentVolume of `driver` on `node` that the test
/// makes; returns the claim's UID once the PersistentVolume controller has bound the two.
async fn bound_claim(
    client: &Client,
    ns: &str,
    sts: &str,
    driver: &str,
    node: &str,
    sfx: &str,
) -> String {
    let claim = format!("{TEMPLATE}-{sts}-0");
    let pv_name = format!("lvms-e2e-ev-{sfx}-{sts}");
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {support::E2E_LABEL: "true"}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": claim},
            "csi": {"driver": driver, "volumeHandle": format!("{sfx}-{sts}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_NODE_KEY, "operator": "In", "values": [node]}]}]}}
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &pv)
        .await
        .unwrap_or_else(|e| panic!("creating PersistentVolume {pv_name}: {e}"));
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "labels": {"app": sts}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let made = claims.create(&PostParams::default(), &pvc).await.unwrap();
    let uid = made.uid().unwrap();
    let pvs = Api::<PersistentVolume>::all(client.clone());
    eventually(&format!("claim {claim} bound"), WAIT, || {
        let (claims, pvs, claim, pv_name, uid) = (
            claims.clone(),
            pvs.clone(),
            claim.clone(),
            pv_name.clone(),
            uid.clone(),
        );
        async move {
            let phase = claims
                .get(&claim)
                .await
                .map_err(|e| e.to_string())?
                .status
                .and_then(|s| s.phase);
            let bound_to = pvs
                .get(&pv_name)
                .await
                .map_err(|e| e.to_string())?
                .spec
                .and_then(|s| s.claim_ref)
                .and_then(|r| r.uid);
            if phase.as_deref() == Some("Bound") && bound_to.as_deref() == Some(&uid) {
                Ok(())
            } else {
                Err(format!(
                    "claim phase {phase:?}, volume bound to {bound_to:?}"
                ))
            }
        }
    })
    .await;
    uid
}

/// Creates the StatefulSet and waits for its pod `<name>-0`.
async fn create_statefulset(client: &Client, ns: &str, name: &str, node: Option<&str>) {
    let api = Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), ns);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(statefulset(name, node)).unwrap(),
    )
    .await
    .unwrap_or_else(|e| panic!("creating StatefulSet {name}: {e}"));
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pod = format!("{name}-0");
    eventually(&format!("the StatefulSet makes pod {pod}"), WAIT, || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            pods.get_opt(&pod)
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .ok_or_else(|| "not yet".to_owned())
        }
    })
    .await;
}

/// Writes the status kubelet would: the pod runs and is ready.
async fn mark_running(pods: &Api<Pod>, name: &str) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let conditions: Vec<Value> = ["PodScheduled", "Initialized", "ContainersReady", "Ready"]
        .iter()
        .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": now}))
        .collect();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Running", "conditions": conditions,
                                        "startTime": now}}),
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("marking pod {name} running: {e}"));
}

/// A PodDisruptionBudget allowing one of the StatefulSet's pods to be unavailable.
async fn budget(client: &Client, ns: &str, sts: &str) {
    let pdb = serde_json::from_value::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": sts},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": sts}}}
    }))
    .unwrap();
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
}

/// Evicts the pod as `kubectl drain` does: again while the API server answers 429 (the budget
/// not yet computed by the disruption controller).
async fn evict(pods: &Api<Pod>, name: &str) {
    eventually(&format!("evicting pod {name}"), WAIT, || {
        let (pods, name) = (pods.clone(), name.to_owned());
        async move {
            match pods.evict(&name, &EvictParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 429 => Err(s.message),
                Err(e) => panic!("evicting pod {name}: {e}"),
            }
        }
    })
    .await;
}

/// The `DisruptionTarget` condition's (status, reason) on the pod.
async fn disruption_target(pods: &Api<Pod>, name: &str) -> Option<(String, Option<String>)> {
    pods.get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .map(|c| (c.status, c.reason))
}

/// The events in `ns` about the object of `kind` and `name`, with `reason`.
async fn events_about(
    client: &Client,
    ns: &str,
    kind: &str,
    name: &str,
    reason: &str,
) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                })
        })
        .collect()
}

/// The claim's UID while it exists and is not being deleted.
async fn live_claim_uid(claims: &Api<PersistentVolumeClaim>, name: &str) -> Option<String> {
    claims
        .get_opt(name)
        .await
        .unwrap()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .and_then(|c| c.uid())
}

/// Deletes the StatefulSets' pods at once (no kubelet finishes them), the volumes and the nodes.
async fn clean_up(
    client: &Client,
    ns: TestNamespace,
    statefulsets: &[&str],
    sfx: &str,
    nodes: &[&str],
) {
    let sts_api =
        Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(client.clone(), &ns.name);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for sts in statefulsets {
        let _ = sts_api.delete(sts, &DeleteParams::default()).await;
    }
    for sts in statefulsets {
        let _ = pods
            .delete(
                &format!("{sts}-0"),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
    let pvs = Api::<PersistentVolume>::all(client.clone());
    for sts in statefulsets {
        let _ = pvs
            .delete(
                &format!("lvms-e2e-ev-{sfx}-{sts}"),
                &DeleteParams::default(),
            )
            .await;
    }
    for node in nodes {
        support::delete_node(client, node).await;
    }
    ns.delete().await;
}

#[tokio::test]
async fn draining_a_node_deletes_the_opted_in_statefulset_claim_there_and_nothing_else() {
    if !support::enabled(
        "draining_a_node_deletes_the_opted_in_statefulset_claim_there_and_nothing_else",
    ) {
        return;
    }
    let client = support::client().await;
    let sfx = support::suffix();
    let driver = format!("eviction-{sfx}.e2e.lvms.io");
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-ev-{sfx}"), &[]).await;
    let (drained, healthy) = (
        format!("lvms-e2e-{sfx}-drained"),
        format!("lvms-e2e-{sfx}-healthy"),
    );
    support::create_node(&client, &drained, &[]).await;
    support::create_node(&client, &healthy, &[]).await;

    // `web` on the node to drain, our driver: its claim goes. `other` beside it, another driver;
    // `calm` on a node that stays schedulable: theirs stay although their pods are evicted too.
    let cases = [
        ("web", driver.as_str(), drained.as_str()),
        ("other", "other.csi.example.com", drained.as_str()),
        ("calm", driver.as_str(), healthy.as_str()),
    ];
    let mut uids = Vec::new();
    for (sts, claim_driver, node) in cases {
        uids.push(bound_claim(&client, &ns.name, sts, claim_driver, node, &sfx).await);
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for (sts, _, node) in cases {
        budget(&client, &ns.name, sts).await;
        create_statefulset(&client, &ns.name, sts, Some(node)).await;
        mark_running(&pods, &format!("{sts}-0")).await;
    }

    let (stop, stopped) = support::stop_signal();
    let metrics = Arc::new(Metrics::new());
    let controller = tokio::spawn(run(
        client.clone(),
        driver.clone(),
        metrics.clone(),
        stopped(),
    ));

    // kubectl drain: cordon, then evict the node's pods; `calm-0` is evicted too (as an
    // autoscaler or descheduler would), from a node that stays schedulable.
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .patch(
            &drained,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    for (sts, _, _) in cases {
        evict(&pods, &format!("{sts}-0")).await;
    }
    // The API server's eviction handler marked the pods before deleting them (gracefully: they
    // stay, terminating, until kubelet confirms; there is none).
    for (sts, _, _) in cases {
        assert_eq!(
            disruption_target(&pods, &format!("{sts}-0")).await,
            Some(("True".to_owned(), Some("EvictionByEvictionAPI".to_owned()))),
            "pod {sts}-0"
        );
    }

    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    eventually("the drained node's claim is deleted", WAIT, || {
        let claims = claims.clone();
        async move {
            match claims
                .get_opt("data-web-0")
                .await
                .map_err(|e| e.to_string())?
            {
                Some(c) if c.metadata.deletion_timestamp.is_none() => Err("still there".to_owned()),
                // Deleted; kept by kubernetes.io/pvc-protection while the terminating pod uses it.
                _ => Ok(()),
            }
        }
    })
    .await;
    for (kind, name) in [
        ("PersistentVolumeClaim", "data-web-0"),
        ("StatefulSet", "web"),
    ] {
        let found = events_about(&client, &ns.name, kind, name, DELETED_REASON).await;
        assert_eq!(
            found.len(),
            1,
            "one {DELETED_REASON} event on {kind} {name}: {found:?}"
        );
        let note = found[0].note.clone().unwrap_or_default();
        assert!(
            note.contains(&format!("node {drained}, which is cordoned")),
            "{note}"
        );
    }
    // The other claims stay, unchanged, and get no event.
    consistently("the other claims stay", Duration::from_secs(5), || {
        let (claims, uids) = (claims.clone(), uids.clone());
        async move {
            for (name, uid) in [("data-other-0", &uids[1]), ("data-calm-0", &uids[2])] {
                let live = live_claim_uid(&claims, name).await;
                if live.as_ref() != Some(uid) {
                    return Err(format!("claim {name}: {live:?}"));
                }
            }
            Ok(())
        }
    })
    .await;
    for (kind, name) in [
        ("PersistentVolumeClaim", "data-other-0"),
        ("PersistentVolumeClaim", "data-calm-0"),
        ("StatefulSet", "other"),
        ("StatefulSet", "calm"),
    ] {
        assert!(
            events_about(&client, &ns.name, kind, name, DELETED_REASON)
                .await
                .is_empty()
        );
    }

    // Kubelet would now confirm the pod's end; the claim goes with it, and the StatefulSet makes
    // the pod and a new claim (another UID), which the controller leaves alone.
    pods.delete("web-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let new_uid = eventually("the StatefulSet makes the claim anew", WAIT, || {
        let (claims, old) = (claims.clone(), uids[0].clone());
        async move {
            match live_claim_uid(&claims, "data-web-0").await {
                Some(uid) if uid != old => Ok(uid),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    consistently("the new claim stays", Duration::from_secs(5), || {
        let (claims, new_uid) = (claims.clone(), new_uid.clone());
        async move {
            let live = live_claim_uid(&claims, "data-web-0").await;
            (live.as_ref() == Some(&new_uid))
                .then_some(())
                .ok_or(format!("{live:?}"))
        }
    })
    .await;
    let text = metrics.encode();
    assert!(
        text.lines()
            .any(|l| l == "lvms_operator_eviction_claim_deletions_total 1"),
        "{text}"
    );
    assert!(
        !text.contains(r#"lvms_operator_reconciles_total{controller="eviction",result="error"}"#),
        "{text}"
    );

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    clean_up(
        &client,
        ns,
        &["web", "other", "calm"],
        &sfx,
        &[&drained, &healthy],
    )
    .await;
}

#[tokio::test]
async fn an_unschedulable_pod_whose_volume_node_is_gone_gets_a_new_claim() {
    if !support::enabled("an_unschedulable_pod_whose_volume_node_is_gone_gets_a_new_claim") {
        return;
    }
    let client = support::client().await;
    let sfx = support::suffix();
    let driver = format!("eviction-{sfx}.e2e.lvms.io");
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-evu-{sfx}"), &[]).await;
    // The node the volume was made on is gone (never created here).
    let gone = format!("lvms-e2e-{sfx}-gone");
    let old_uid = bound_claim(&client, &ns.name, "db", &driver, &gone, &sfx).await;

    let (stop, stopped) = support::stop_signal();
    let metrics = Arc::new(Metrics::new());
    let controller = tokio::spawn(run(
        client.clone(),
        driver.clone(),
        metrics.clone(),
        stopped(),
    ));
    // Left to the scheduler, which finds no node for the volume.
    create_statefulset(&client, &ns.name, "db", None).await;

    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    // An unscheduled pod does not hold its claim (pvc-protection counts scheduled pods only), so
    // the claim goes at once, and the StatefulSet makes a new one for its pending pod.
    let new_uid = eventually("the claim is replaced", WAIT, || {
        let (claims, old) = (claims.clone(), old_uid.clone());
        async move {
            match live_claim_uid(&claims, "data-db-0").await {
                Some(uid) if uid != old => Ok(uid),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let conditions = pods
        .get("db-0")
        .await
        .unwrap()
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    assert!(
        conditions.iter().any(|c| c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")),
        "{conditions:?}"
    );
    let found = events_about(
        &client,
        &ns.name,
        "PersistentVolumeClaim",
        "data-db-0",
        DELETED_REASON,
    )
    .await;
    assert_eq!(found.len(), 1, "{found:?}");
    let note = found[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("cannot be scheduled") && note.contains("which no longer exists"),
        "{note}"
    );
    assert_eq!(
        events_about(&client, &ns.name, "StatefulSet", "db", DELETED_REASON)
            .await
            .len(),
        1
    );
    // The new claim is not bound to a volume yet: the controller leaves it.
    consistently("the new claim stays", Duration::from_secs(5), || {
        let (claims, new_uid) = (claims.clone(), new_uid.clone());
        async move {
            let live = live_claim_uid(&claims, "data-db-0").await;
            (live.as_ref() == Some(&new_uid))
                .then_some(())
                .ok_or(format!("{live:?}"))
        }
    })
    .await;
    assert!(
        metrics
            .encode()
            .lines()
            .any(|l| l == "lvms_operator_eviction_claim_deletions_total 1")
    );

    let _ = stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(10), controller).await;
    clean_up(&client, ns, &["db"], &sfx, &[]).await;
}
