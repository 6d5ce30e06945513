//! Every branch of the eviction decision, from objects shaped as the API server returns them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};

use super::*;

const DRIVER: &str = "topolvm.io";
const NODE: &str = "worker-1";

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// `web-0` of StatefulSet `web`, being evicted by `kubectl drain`, using claims `data-web-0` (a
/// template's), `extra` (not a template's) and an emptyDir.
fn pod_json() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "db",
            "uid": "pod-uid",
            "creationTimestamp": "2026-01-01T00:01:00Z",
            "ownerReferences": [{
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "name": "web",
                "uid": "sts-uid",
                "controller": true,
                "blockOwnerDeletion": true
            }]
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "db", "image": "db"}],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "extra", "persistentVolumeClaim": {"claimName": "extra"}}
            ]
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                 "message": "Eviction API: evicting"}
            ]
        }
    })
}

fn pod() -> Pod {
    from(pod_json())
}

fn statefulset() -> StatefulSet {
    from(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "db", "uid": "sts-uid"},
        "spec": {
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "db", "image": "db"}]}},
            "volumeClaimTemplates": [
                {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"]}},
                {"metadata": {"name": "logs"}, "spec": {"accessModes": ["ReadWriteOnce"]}}
            ]
        }
    }))
}

/// `data-web-0`, opted in, bound to `pv-1`, made before the pod.
fn claim_json() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "data-web-0",
            "namespace": "db",
            "uid": "claim-uid",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {EVICTION_ALLOWED_ANNOTATION: "true"}
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1",
                 "storageClassName": "lvms-vg1"}
    })
}

fn claim() -> PersistentVolumeClaim {
    from(claim_json())
}

fn affinity(terms: Value) -> Value {
    json!({"required": {"nodeSelectorTerms": terms}})
}

fn node_term(node: &str) -> Value {
    json!([{"matchExpressions": [{"key": TOPOLOGY_NODE_KEY, "operator": "In", "values": [node]}]}])
}

/// `pv-1` of our driver, bound to `data-web-0`, on [`NODE`], as external-provisioner makes it.
fn volume_json() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": "pv-1"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "lvms-vg1",
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": "db", "name": "data-web-0",
                         "uid": "claim-uid"},
            "csi": {"driver": DRIVER, "volumeHandle": "vol-1"},
            "nodeAffinity": affinity(node_term(NODE))
        }
    })
}

fn volume() -> PersistentVolume {
    from(volume_json())
}

fn node_json(unschedulable: bool, ready: &str, taints: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
        "spec": {"unschedulable": unschedulable, "taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": ready}]}
    })
}

fn cordoned() -> Node {
    from(node_json(
        true,
        "True",
        json!([{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]),
    ))
}

fn healthy() -> Node {
    from(node_json(false, "True", json!([])))
}

fn out_of_service(ready: &str) -> Node {
    from(node_json(
        false,
        ready,
        json!([{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]),
    ))
}

/// The decision over the given objects.
fn decide_on(
    pod: &Pod,
    sts: &StatefulSet,
    claim: &PersistentVolumeClaim,
    volume: Option<&PersistentVolume>,
    node: Option<&Node>,
) -> Decision {
    decide(
        &Observed {
            pod,
            statefulset: sts,
            claim,
            volume,
            node,
        },
        DRIVER,
    )
}

/// The decision on the drain fixture with `pod` and `claim` changed, on a cordoned node.
fn decide_drained(pod: &Pod, claim: &PersistentVolumeClaim) -> Decision {
    decide_on(
        pod,
        &statefulset(),
        claim,
        Some(&volume()),
        Some(&cordoned()),
    )
}

fn keep(decision: Decision) -> Keep {
    match decision {
        Decision::Keep(k) => k,
        Decision::Delete(d) => panic!("expected the claim kept, got a deletion: {d}"),
    }
}

fn deletion(decision: Decision) -> Deletion {
    match decision {
        Decision::Delete(d) => d,
        Decision::Keep(k) => panic!("expected a deletion, got keep: {k}"),
    }
}

fn annotated(
    mut claim: PersistentVolumeClaim,
    annotations: &[(&str, &str)],
) -> PersistentVolumeClaim {
    claim.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    claim
}

fn pod_annotated(annotations: &[(&str, &str)]) -> Pod {
    let mut pod = pod();
    pod.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    pod
}

fn unannotated_claim() -> PersistentVolumeClaim {
    let mut c = claim();
    c.metadata.annotations = None;
    c
}

// ---------------------------------------------------------------------------------------------
// The deletions
// ---------------------------------------------------------------------------------------------

#[test]
fn evicted_pod_whose_claim_lives_on_a_cordoned_node_loses_the_claim() {
    let d = deletion(decide_drained(&pod(), &claim()));
    assert_eq!(
        d,
        Deletion {
            namespace: "db".into(),
            pod: "web-0".into(),
            statefulset: "web".into(),
            claim: "data-web-0".into(),
            claim_uid: Some("claim-uid".into()),
            trigger: Trigger::Disrupted {
                reason: "EvictionByEvictionAPI".into()
            },
            volume: "pv-1".into(),
            node: NODE.into(),
            node_state: NodeState::Cordoned,
        }
    );
    let message = d.to_string();
    for part in [
        "pod db/web-0 is being evicted (DisruptionTarget: EvictionByEvictionAPI)",
        "claim data-web-0 (volume pv-1)",
        "node worker-1, which is cordoned (spec.unschedulable)",
        "StatefulSet web makes a new one",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
}

#[test]
fn evicted_pod_whose_claim_lives_on_a_gone_node_loses_the_claim() {
    let d = deletion(decide_on(
        &pod(),
        &statefulset(),
        &claim(),
        Some(&volume()),
        None,
    ));
    assert_eq!(d.node_state, NodeState::Gone);
    assert!(d.to_string().contains("which no longer exists"));
}

#[test]
fn a_not_ready_node_tainted_out_of_service_counts_as_gone() {
    for ready in ["False", "Unknown"] {
        let d = deletion(decide_on(
            &pod(),
            &statefulset(),
            &claim(),
            Some(&volume()),
            Some(&out_of_service(ready)),
        ));
        assert_eq!(d.node_state, NodeState::OutOfService, "Ready={ready}");
    }
}

#[test]
fn a_ready_node_tainted_out_of_service_keeps_the_claim() {
    let k = keep(decide_on(
        &pod(),
        &statefulset(),
        &claim(),
        Some(&volume()),
        Some(&out_of_service("True")),
    ));
    assert_eq!(k, Keep::NodeSchedulable { node: NODE.into() });
}

#[test]
fn unschedulable_pod_whose_claim_lives_on_a_gone_node_loses_the_claim() {
    let mut pod = pod();
    pod.spec.as_mut().unwrap().node_name = None;
    pod.status = Some(from(json!({
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 node(s) had volume node affinity conflict."}]
    })));
    let d = deletion(decide_on(
        &pod,
        &statefulset(),
        &claim(),
        Some(&volume()),
        None,
    ));
    assert_eq!(d.trigger, Trigger::Unschedulable);
    assert_eq!(d.node_state, NodeState::Gone);
    assert!(
        d.to_string()
            .contains("cannot be scheduled (PodScheduled=False: Unschedulable)")
    );
}

// ---------------------------------------------------------------------------------------------
// The node: never a healthy, schedulable one
// ---------------------------------------------------------------------------------------------

#[test]
fn a_healthy_schedulable_node_never_loses_a_claim() {
    let mut unschedulable = pod();
    unschedulable.status = Some(from(json!({"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})));
    let not_ready: Node = from(node_json(false, "False", json!([])));
    for pod in [pod(), unschedulable] {
        for node in [healthy(), not_ready.clone()] {
            assert_eq!(
                keep(decide_on(
                    &pod,
                    &statefulset(),
                    &claim(),
                    Some(&volume()),
                    Some(&node)
                )),
                Keep::NodeSchedulable { node: NODE.into() }
            );
        }
    }
}

#[test]
fn node_state_ranks_gone_and_out_of_service_over_cordoned() {
    assert_eq!(node_state(None), Some(NodeState::Gone));
    let mut both = out_of_service("False");
    both.spec.as_mut().unwrap().unschedulable = Some(true);
    assert_eq!(node_state(Some(&both)), Some(NodeState::OutOfService));
    assert_eq!(node_state(Some(&cordoned())), Some(NodeState::Cordoned));
    assert_eq!(node_state(Some(&healthy())), None);
    // A node without spec or status (as made by hand) is schedulable.
    let bare: Node = from(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    assert_eq!(node_state(Some(&bare)), None);
}

// ---------------------------------------------------------------------------------------------
// The pod
// ---------------------------------------------------------------------------------------------

#[test]
fn a_pod_neither_evicted_nor_unschedulable_keeps_its_claims() {
    let conditions = [
        json!([{"type": "Ready", "status": "True"}]),
        json!([{"type": "DisruptionTarget", "status": "False", "reason": "EvictionByEvictionAPI"}]),
        json!([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}]),
        json!([{"type": "PodScheduled", "status": "True"}]),
    ];
    for c in conditions {
        let mut pod = pod();
        pod.status = Some(from(json!({"conditions": c})));
        assert_eq!(trigger(&pod), None, "{c}");
        assert_eq!(
            keep(decide_drained(&pod, &claim())),
            Keep::NotDisrupted,
            "{c}"
        );
    }
    let mut no_status = pod();
    no_status.status = None;
    assert_eq!(
        keep(decide_drained(&no_status, &claim())),
        Keep::NotDisrupted
    );
}

#[test]
fn a_disruption_wins_over_unschedulable() {
    let mut pod = pod();
    pod.status = Some(from(json!({"conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"},
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]})));
    assert_eq!(
        trigger(&pod),
        Some(Trigger::Disrupted {
            reason: "DeletionByTaintManager".into()
        })
    );
}

#[test]
fn a_pod_without_a_controlling_statefulset_keeps_its_claims() {
    let owners = [
        json!(null),
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "sts-uid",
                "controller": true}]),
        // Not the controller.
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "sts-uid"}]),
        // A StatefulSet kind of another group.
        json!([{"apiVersion": "example.com/v1", "kind": "StatefulSet", "name": "web",
                "uid": "sts-uid", "controller": true}]),
    ];
    for owner in owners {
        let mut v = pod_json();
        v["metadata"]["ownerReferences"] = owner.clone();
        let pod: Pod = from(v);
        assert_eq!(statefulset_owner(&pod), None, "{owner}");
        assert_eq!(
            keep(decide_drained(&pod, &claim())),
            Keep::NoStatefulSetOwner,
            "{owner}"
        );
    }
}

#[test]
fn a_statefulset_that_is_not_the_pods_owner_keeps_the_claims() {
    let mut replaced = statefulset();
    replaced.metadata.uid = Some("another-uid".into());
    let mut other = statefulset();
    other.metadata.name = Some("web2".into());
    for sts in [replaced, other] {
        let name = sts.metadata.name.clone().unwrap();
        assert_eq!(
            keep(decide_on(
                &pod(),
                &sts,
                &claim(),
                Some(&volume()),
                Some(&cordoned())
            )),
            Keep::NotTheOwner { statefulset: name }
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The claim
// ---------------------------------------------------------------------------------------------

#[test]
fn candidate_claims_are_the_pods_volumes_named_after_a_template() {
    let mut v = pod_json();
    v["spec"]["volumes"] = json!([
        {"name": "b", "persistentVolumeClaim": {"claimName": "logs-web-0"}},
        {"name": "x", "persistentVolumeClaim": {"claimName": "extra"}},
        {"name": "a", "persistentVolumeClaim": {"claimName": "data-web-0"}},
        {"name": "a2", "persistentVolumeClaim": {"claimName": "data-web-0"}},
        {"name": "y", "persistentVolumeClaim": {"claimName": "data-web-1"}},
        {"name": "e", "emptyDir": {}}
    ]);
    let pod: Pod = from(v);
    assert_eq!(
        candidate_claims(&pod, &statefulset()),
        ["logs-web-0", "data-web-0"]
    );
    let mut no_templates = statefulset();
    no_templates.spec.as_mut().unwrap().volume_claim_templates = None;
    assert!(candidate_claims(&pod, &no_templates).is_empty());
}

#[test]
fn a_claim_not_made_from_a_template_for_this_pod_is_kept() {
    let mut v = claim_json();
    // A claim the pod uses that no template made.
    v["metadata"]["name"] = json!("extra");
    assert_eq!(
        keep(decide_drained(&pod(), &from(v.clone()))),
        Keep::NotFromTemplate
    );
    // Another pod's claim of the same template.
    v["metadata"]["name"] = json!("data-web-1");
    assert_eq!(
        keep(decide_drained(&pod(), &from(v))),
        Keep::NotFromTemplate
    );
    // A template's claim the pod does not use.
    let mut v = pod_json();
    v["spec"]["volumes"] = json!([{"name": "e", "emptyDir": {}}]);
    assert_eq!(
        keep(decide_drained(&from(v), &claim())),
        Keep::NotFromTemplate
    );
}

#[test]
fn a_claim_already_being_deleted_is_left_alone() {
    let mut v = claim_json();
    v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:02:00Z");
    assert_eq!(
        keep(decide_drained(&pod(), &from(v))),
        Keep::ClaimBeingDeleted
    );
}

#[test]
fn a_claim_younger_than_the_pod_is_the_replacement_and_is_kept() {
    let mut v = claim_json();
    v["metadata"]["creationTimestamp"] = json!("2026-01-01T00:01:01Z");
    assert_eq!(
        keep(decide_drained(&pod(), &from(v.clone()))),
        Keep::ClaimNewerThanPod
    );
    // Made in the same second as the pod (the StatefulSet controller makes claims first).
    v["metadata"]["creationTimestamp"] = json!("2026-01-01T00:01:00Z");
    deletion(decide_drained(&pod(), &from(v)));
}

// ---------------------------------------------------------------------------------------------
// The opt-in annotations
// ---------------------------------------------------------------------------------------------

#[test]
fn either_annotation_on_the_pod_or_the_claim_opts_in() {
    for key in EVICTION_ALLOWED_ANNOTATIONS {
        let on_pod = decide_drained(&pod_annotated(&[(key, "true")]), &unannotated_claim());
        assert_eq!(
            deletion(on_pod).node_state,
            NodeState::Cordoned,
            "{key} on the pod"
        );
        let on_claim = decide_drained(&pod(), &annotated(claim(), &[(key, "true")]));
        assert_eq!(
            deletion(on_claim).node_state,
            NodeState::Cordoned,
            "{key} on the claim"
        );
    }
}

#[test]
fn one_true_annotation_is_enough_even_if_the_other_object_says_false() {
    let pod = pod_annotated(&[(CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION, "false")]);
    deletion(decide_drained(&pod, &claim()));
    let claim = annotated(claim(), &[(EVICTION_ALLOWED_ANNOTATION, "false")]);
    deletion(decide_drained(
        &pod_annotated(&[(EVICTION_ALLOWED_ANNOTATION, "True")]),
        &claim,
    ));
}

#[test]
fn without_an_annotation_saying_true_the_claim_is_kept() {
    assert_eq!(
        keep(decide_drained(&pod(), &unannotated_claim())),
        Keep::NotAllowed
    );
    for value in ["false", "0", "f", "F", "FALSE", "False"] {
        let claim = annotated(claim(), &[(EVICTION_ALLOWED_ANNOTATION, value)]);
        assert_eq!(
            keep(decide_drained(&pod(), &claim)),
            Keep::NotAllowed,
            "{value}"
        );
    }
    // Other annotations, and a near miss of the key, do not count.
    let claim = annotated(
        claim(),
        &[
            ("lvms.topolvm.io/is-eviction-allowed-typo", "true"),
            ("volume.kubernetes.io/selected-node", NODE),
        ],
    );
    assert_eq!(keep(decide_drained(&pod(), &claim)), Keep::NotAllowed);
}

#[test]
fn the_values_go_parse_bool_takes_as_true_opt_in() {
    for value in ["1", "t", "T", "TRUE", "true", "True"] {
        let claim = annotated(
            claim(),
            &[(CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION, value)],
        );
        deletion(decide_drained(&pod(), &claim));
    }
}

#[test]
fn an_annotation_that_is_not_a_boolean_keeps_the_claim_and_says_where_it_is() {
    for value in ["yes", "", " true", "on", "2"] {
        let claim = annotated(claim(), &[(EVICTION_ALLOWED_ANNOTATION, value)]);
        assert_eq!(
            keep(decide_drained(&pod(), &claim)),
            Keep::InvalidAnnotation {
                carrier: Carrier::Claim,
                key: EVICTION_ALLOWED_ANNOTATION,
                value: value.into()
            },
            "{value:?}"
        );
    }
    // Even beside an annotation that says true.
    let pod = pod_annotated(&[(CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION, "sure")]);
    let k = keep(decide_drained(&pod, &claim()));
    assert_eq!(
        k,
        Keep::InvalidAnnotation {
            carrier: Carrier::Pod,
            key: CSI_DRIVER_LVM_EVICTION_ALLOWED_ANNOTATION,
            value: "sure".into()
        }
    );
    assert!(k.to_string().contains("\"sure\", not a boolean"));
}

// ---------------------------------------------------------------------------------------------
// The volume
// ---------------------------------------------------------------------------------------------

#[test]
fn an_unbound_claim_or_a_missing_volume_is_kept() {
    let mut v = claim_json();
    v["spec"]["volumeName"] = json!(null);
    assert_eq!(
        keep(decide_on(&pod(), &statefulset(), &from(v), None, None)),
        Keep::ClaimNotBound
    );
    assert_eq!(
        keep(decide_on(&pod(), &statefulset(), &claim(), None, None)),
        Keep::VolumeMissing {
            volume: "pv-1".into()
        }
    );
}

#[test]
fn a_volume_not_bound_to_this_claim_is_kept() {
    for claim_ref in [
        json!({"kind": "PersistentVolumeClaim", "namespace": "db", "name": "data-web-0",
               "uid": "an-older-claim"}),
        json!(null),
    ] {
        let mut v = volume_json();
        v["spec"]["claimRef"] = claim_ref.clone();
        assert_eq!(
            keep(decide_on(
                &pod(),
                &statefulset(),
                &claim(),
                Some(&from(v)),
                None
            )),
            Keep::VolumeOfAnotherClaim {
                volume: "pv-1".into()
            },
            "{claim_ref}"
        );
    }
}

#[test]
fn a_volume_of_another_driver_is_never_touched() {
    let mut v = volume_json();
    v["spec"]["csi"]["driver"] = json!("lvm.csi.metal-stack.io");
    assert_eq!(
        keep(decide_on(
            &pod(),
            &statefulset(),
            &claim(),
            Some(&from(v)),
            None
        )),
        Keep::OtherDriver {
            volume: "pv-1".into(),
            driver: Some("lvm.csi.metal-stack.io".into())
        }
    );
    let mut v = volume_json();
    v["spec"]["csi"] = json!(null);
    v["spec"]["local"] = json!({"path": "/mnt/disks/1"});
    assert_eq!(
        keep(decide_on(
            &pod(),
            &statefulset(),
            &claim(),
            Some(&from(v)),
            None
        )),
        Keep::OtherDriver {
            volume: "pv-1".into(),
            driver: None
        }
    );
}

#[test]
fn a_volume_without_node_affinity_is_kept() {
    for affinity in [json!(null), json!({})] {
        let mut v = volume_json();
        v["spec"]["nodeAffinity"] = affinity.clone();
        assert_eq!(
            keep(decide_on(
                &pod(),
                &statefulset(),
                &claim(),
                Some(&from(v)),
                None
            )),
            Keep::NoNodeAffinity {
                volume: "pv-1".into()
            },
            "{affinity}"
        );
    }
}

#[test]
fn a_volume_with_other_than_one_node_affinity_term_is_kept() {
    let two = json!([node_term(NODE)[0], node_term("worker-2")[0]]);
    for (terms, count) in [(json!([]), 0), (two, 2)] {
        let mut v = volume_json();
        v["spec"]["nodeAffinity"] = affinity(terms);
        assert_eq!(
            keep(decide_on(
                &pod(),
                &statefulset(),
                &claim(),
                Some(&from(v)),
                None
            )),
            Keep::NodeAffinityTerms {
                volume: "pv-1".into(),
                terms: count
            }
        );
    }
}

#[test]
fn a_volume_not_pinned_to_one_node_on_our_key_is_kept() {
    let expr = |key: &str, op: &str, values: Value| json!([{"matchExpressions": [{"key": key, "operator": op, "values": values}]}]);
    let cases = [
        // A shared class's volume: reachable from every node that joined the class.
        expr("shared.lvms.topolvm.io/san", "In", json!(["true"])),
        expr("kubernetes.io/hostname", "In", json!([NODE])),
        expr(TOPOLOGY_NODE_KEY, "NotIn", json!([NODE])),
        expr(TOPOLOGY_NODE_KEY, "In", json!([NODE, "worker-2"])),
        expr(TOPOLOGY_NODE_KEY, "In", json!([])),
        json!([{"matchExpressions": [
            {"key": TOPOLOGY_NODE_KEY, "operator": "In", "values": [NODE]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]),
        json!([{"matchExpressions": [
            {"key": TOPOLOGY_NODE_KEY, "operator": "In", "values": [NODE]}],
            "matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}]),
        json!([{}]),
    ];
    for terms in cases {
        let mut v = volume_json();
        v["spec"]["nodeAffinity"] = affinity(terms.clone());
        assert_eq!(
            keep(decide_on(
                &pod(),
                &statefulset(),
                &claim(),
                Some(&from(v)),
                None
            )),
            Keep::NotOnOneNode {
                volume: "pv-1".into()
            },
            "{terms}"
        );
    }
}

#[test]
fn volume_node_names_the_node_of_our_key() {
    assert_eq!(volume_node(&claim(), Some(&volume()), DRIVER), Ok(NODE));
    assert_eq!(
        volume_node(&claim(), Some(&volume()), "another.driver.io"),
        Err(Keep::OtherDriver {
            volume: "pv-1".into(),
            driver: Some(DRIVER.into())
        })
    );
}
