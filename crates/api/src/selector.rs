//! Kubernetes' node selection rules, as the scheduler applies them to the node pods: `NodeSelector`
//! matching (component-helpers' `MatchNodeSelectorTerms`) and taint toleration.
//!
//! A requirement Kubernetes would reject (an unknown operator, `In` without values, `Gt` with a
//! value that is not an integer, ...) makes its term match nothing, as in Kubernetes, where such a
//! term is skipped and the other terms still count.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration,
};

/// The only field `matchFields` may name.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// Whether `node` matches `selector`: any term matches (terms are ORed). No terms match nothing.
pub fn matches(selector: &NodeSelector, node: &Node) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|term| term_matches(term, node))
}

/// Whether `node` matches `term`: every `matchExpressions` requirement on its labels and every
/// `matchFields` requirement on its name (requirements are ANDed). An empty term matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, node: &Node) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.as_deref().unwrap_or_default();
    expressions
        .iter()
        .all(|r| label_requirement_matches(r, labels) == Some(true))
        && fields
            .iter()
            .all(|r| field_requirement_matches(r, name) == Some(true))
}

/// Evaluates a `matchExpressions` requirement; `None` when Kubernetes would reject it.
fn label_requirement_matches(
    req: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Option<bool> {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    match req.operator.as_str() {
        "In" if !values.is_empty() => Some(value.is_some_and(|v| values.contains(v))),
        "NotIn" if !values.is_empty() => Some(!value.is_some_and(|v| values.contains(v))),
        "Exists" if values.is_empty() => Some(value.is_some()),
        "DoesNotExist" if values.is_empty() => Some(value.is_none()),
        op @ ("Gt" | "Lt") => {
            let [bound] = values else { return None };
            let bound: i64 = bound.parse().ok()?;
            // A label that is absent or not an integer does not match (it is not an error).
            Some(
                value
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| if op == "Gt" { v > bound } else { v < bound }),
            )
        }
        _ => None,
    }
}

/// Evaluates a `matchFields` requirement: only `metadata.name`, `In`/`NotIn`, one value.
fn field_requirement_matches(req: &NodeSelectorRequirement, node_name: &str) -> Option<bool> {
    if req.key != NODE_NAME_FIELD {
        return None;
    }
    let [value] = req.values.as_deref().unwrap_or_default() else {
        return None;
    };
    match req.operator.as_str() {
        "In" => Some(node_name == value),
        "NotIn" => Some(node_name != value),
        _ => None,
    }
}

/// Taints the DaemonSet controller tolerates on every daemon pod (the node pods do not use the
/// host network, so `network-unavailable` is not among them).
const DAEMON_SET_TOLERATED: [(&str, &str); 6] = [
    ("node.kubernetes.io/not-ready", "NoExecute"),
    ("node.kubernetes.io/unreachable", "NoExecute"),
    ("node.kubernetes.io/disk-pressure", "NoSchedule"),
    ("node.kubernetes.io/memory-pressure", "NoSchedule"),
    ("node.kubernetes.io/pid-pressure", "NoSchedule"),
    ("node.kubernetes.io/unschedulable", "NoSchedule"),
];

/// Whether `toleration` tolerates `taint`. `Lt`/`Gt` (alpha in Kubernetes 1.35) are treated as
/// not tolerating: a node is then counted out rather than waited for.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    let operator = toleration.operator.as_deref().unwrap_or("Equal");
    if key.is_empty() {
        // An empty key with Exists tolerates everything; with another operator it is invalid.
        return operator == "Exists";
    }
    if key != taint.key {
        return false;
    }
    match operator {
        "Exists" => true,
        "Equal" | "" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

/// Whether a daemon pod with `tolerations` can run on `node`: every `NoSchedule` and `NoExecute`
/// taint is tolerated, by `tolerations` or by the DaemonSet controller's own. `PreferNoSchedule`
/// does not keep a daemon pod away.
pub fn daemon_pod_tolerates(tolerations: &[Toleration], node: &Node) -> bool {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .all(|taint| {
            DAEMON_SET_TOLERATED
                .iter()
                .any(|(key, effect)| taint.key == *key && taint.effect == *effect)
                || tolerations.iter().any(|t| tolerates(t, taint))
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{api::core::v1::NodeSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    use super::*;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            ..Node::default()
        }
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).into()).collect()),
        }
    }

    fn exprs(reqs: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
        NodeSelectorTerm {
            match_expressions: Some(reqs),
            match_fields: None,
        }
    }

    fn one(r: NodeSelectorRequirement, n: &Node) -> bool {
        term_matches(&exprs(vec![r]), n)
    }

    #[test]
    fn in_matches_listed_values_only() {
        let n = node("n1", &[("zone", "a")]);
        assert!(one(req("zone", "In", &["a", "b"]), &n));
        assert!(!one(req("zone", "In", &["b"]), &n));
        assert!(!one(req("rack", "In", &["a"]), &n), "absent label");
    }

    #[test]
    fn not_in_matches_other_values_and_absent_labels() {
        let n = node("n1", &[("zone", "a")]);
        assert!(!one(req("zone", "NotIn", &["a"]), &n));
        assert!(one(req("zone", "NotIn", &["b"]), &n));
        assert!(one(req("rack", "NotIn", &["a"]), &n), "absent label");
    }

    #[test]
    fn exists_and_does_not_exist_look_at_the_key_only() {
        let n = node("n1", &[("storage", "")]);
        assert!(one(req("storage", "Exists", &[]), &n));
        assert!(!one(req("other", "Exists", &[]), &n));
        assert!(!one(req("storage", "DoesNotExist", &[]), &n));
        assert!(one(req("other", "DoesNotExist", &[]), &n));
    }

    #[test]
    fn gt_and_lt_compare_integers() {
        let n = node("n1", &[("disks", "4")]);
        assert!(one(req("disks", "Gt", &["3"]), &n));
        assert!(!one(req("disks", "Gt", &["4"]), &n));
        assert!(one(req("disks", "Lt", &["5"]), &n));
        assert!(!one(req("disks", "Lt", &["4"]), &n));
        assert!(one(req("disks", "Gt", &["-1"]), &n));
    }

    #[test]
    fn gt_on_absent_or_non_integer_label_does_not_match() {
        assert!(!one(req("disks", "Gt", &["1"]), &node("n1", &[])));
        assert!(!one(
            req("disks", "Gt", &["1"]),
            &node("n1", &[("disks", "many")])
        ));
    }

    #[test]
    fn invalid_requirements_match_nothing() {
        let n = node("n1", &[("zone", "a"), ("disks", "4")]);
        assert!(!one(req("zone", "In", &[]), &n), "In without values");
        assert!(!one(req("zone", "NotIn", &[]), &n), "NotIn without values");
        assert!(
            !one(req("zone", "Exists", &["a"]), &n),
            "Exists with values"
        );
        assert!(!one(req("zone", "DoesNotExist", &["b"]), &n));
        assert!(!one(req("disks", "Gt", &["1", "2"]), &n), "two values");
        assert!(!one(req("disks", "Gt", &["x"]), &n), "not an integer");
        assert!(!one(req("zone", "Matches", &["a"]), &n), "unknown operator");
    }

    #[test]
    fn expressions_in_a_term_are_anded() {
        let n = node("n1", &[("zone", "a"), ("ssd", "true")]);
        let both = exprs(vec![req("zone", "In", &["a"]), req("ssd", "Exists", &[])]);
        assert!(term_matches(&both, &n));
        let one_fails = exprs(vec![req("zone", "In", &["a"]), req("hdd", "Exists", &[])]);
        assert!(!term_matches(&one_fails, &n));
    }

    #[test]
    fn terms_are_ored_and_an_invalid_term_does_not_spoil_the_others() {
        let n = node("n1", &[("zone", "a")]);
        let selector = NodeSelector {
            node_selector_terms: vec![
                exprs(vec![req("zone", "Bogus", &["a"])]),
                exprs(vec![req("zone", "In", &["b"])]),
                exprs(vec![req("zone", "In", &["a"])]),
            ],
        };
        assert!(matches(&selector, &n));
        let none = NodeSelector {
            node_selector_terms: vec![exprs(vec![req("zone", "In", &["b"])])],
        };
        assert!(!matches(&none, &n));
    }

    #[test]
    fn empty_terms_and_empty_selectors_match_nothing() {
        let n = node("n1", &[("zone", "a")]);
        assert!(!term_matches(&NodeSelectorTerm::default(), &n));
        assert!(!term_matches(&exprs(vec![]), &n));
        assert!(!matches(&NodeSelector::default(), &n));
    }

    #[test]
    fn match_fields_select_by_node_name() {
        let n = node("worker-1", &[]);
        let fields = |r| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![r]),
        };
        assert!(term_matches(
            &fields(req("metadata.name", "In", &["worker-1"])),
            &n
        ));
        assert!(!term_matches(
            &fields(req("metadata.name", "In", &["worker-2"])),
            &n
        ));
        assert!(term_matches(
            &fields(req("metadata.name", "NotIn", &["worker-2"])),
            &n
        ));
        assert!(!term_matches(
            &fields(req("metadata.name", "NotIn", &["worker-1"])),
            &n
        ));
    }

    #[test]
    fn invalid_match_fields_match_nothing() {
        let n = node("worker-1", &[]);
        let fields = |r| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![r]),
        };
        for bad in [
            req("metadata.uid", "In", &["worker-1"]),
            req("metadata.name", "In", &["worker-1", "worker-2"]),
            req("metadata.name", "Exists", &[]),
            req("metadata.name", "In", &[]),
        ] {
            assert!(!term_matches(&fields(bad.clone()), &n), "{bad:?}");
        }
    }

    #[test]
    fn match_fields_and_expressions_in_one_term_are_anded() {
        let n = node("worker-1", &[("zone", "a")]);
        let term = |zone| NodeSelectorTerm {
            match_expressions: Some(vec![req("zone", "In", &[zone])]),
            match_fields: Some(vec![req("metadata.name", "In", &["worker-1"])]),
        };
        assert!(term_matches(&term("a"), &n));
        assert!(!term_matches(&term("b"), &n));
    }

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint {
            key: key.into(),
            value: value.map(str::to_owned),
            effect: effect.into(),
            time_added: None,
        }
    }

    fn toleration(key: &str, op: &str, value: Option<&str>, effect: &str) -> Toleration {
        Toleration {
            key: (!key.is_empty()).then(|| key.into()),
            operator: (!op.is_empty()).then(|| op.into()),
            value: value.map(str::to_owned),
            effect: (!effect.is_empty()).then(|| effect.into()),
            toleration_seconds: None,
        }
    }

    #[test]
    fn toleration_matching_follows_kubernetes() {
        let t = taint("dedicated", Some("storage"), "NoSchedule");
        assert!(tolerates(
            &toleration("dedicated", "Equal", Some("storage"), "NoSchedule"),
            &t
        ));
        assert!(
            tolerates(&toleration("dedicated", "", Some("storage"), ""), &t),
            "Equal by default, any effect"
        );
        assert!(!tolerates(
            &toleration("dedicated", "Equal", Some("db"), ""),
            &t
        ));
        assert!(tolerates(&toleration("dedicated", "Exists", None, ""), &t));
        assert!(
            !tolerates(&toleration("dedicated", "Exists", None, "NoExecute"), &t),
            "other effect"
        );
        assert!(
            tolerates(&toleration("", "Exists", None, ""), &t),
            "wildcard"
        );
        assert!(
            !tolerates(&toleration("", "Equal", None, ""), &t),
            "empty key needs Exists"
        );
        assert!(!tolerates(&toleration("other", "Exists", None, ""), &t));
        assert!(!tolerates(
            &toleration("dedicated", "Gt", Some("1"), ""),
            &t
        ));
    }

    fn tainted(taints: Vec<Taint>) -> Node {
        Node {
            spec: Some(NodeSpec {
                taints: Some(taints),
                ..NodeSpec::default()
            }),
            ..node("n1", &[])
        }
    }

    #[test]
    fn daemon_pods_need_noschedule_and_noexecute_taints_tolerated() {
        let control_plane = tainted(vec![taint(
            "node-role.kubernetes.io/control-plane",
            None,
            "NoSchedule",
        )]);
        assert!(!daemon_pod_tolerates(&[], &control_plane));
        let tol = toleration(
            "node-role.kubernetes.io/control-plane",
            "Exists",
            None,
            "NoSchedule",
        );
        assert!(daemon_pod_tolerates(&[tol], &control_plane));
        let prefer = tainted(vec![taint("soft", None, "PreferNoSchedule")]);
        assert!(daemon_pod_tolerates(&[], &prefer));
        assert!(daemon_pod_tolerates(&[], &node("plain", &[])));
    }

    #[test]
    fn daemon_pods_tolerate_the_daemonset_controllers_taints() {
        let n = tainted(vec![
            taint("node.kubernetes.io/not-ready", None, "NoExecute"),
            taint("node.kubernetes.io/unschedulable", None, "NoSchedule"),
            taint("node.kubernetes.io/disk-pressure", None, "NoSchedule"),
        ]);
        assert!(daemon_pod_tolerates(&[], &n));
        let net = tainted(vec![taint(
            "node.kubernetes.io/network-unavailable",
            None,
            "NoSchedule",
        )]);
        assert!(!daemon_pod_tolerates(&[], &net), "host-network only");
    }
}
