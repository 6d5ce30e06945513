use k8s_openapi::{
    api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, NodeSpec, Taint, Toleration},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
    jiff::Timestamp,
};
use lvms_api::{DeviceClass, LVMClusterSpec, LVMVolumeGroupNodeStatusSpec, RaidStatus, Storage};

use super::*;

fn t(secs: i64) -> Time {
    Time(Timestamp::from_second(1_700_000_000 + secs).unwrap())
}

fn cluster(classes: &[&str]) -> LVMCluster {
    let mut c = LVMCluster::new(
        "my-lvmcluster",
        LVMClusterSpec {
            tolerations: Vec::new(),
            storage: Storage {
                device_classes: classes
                    .iter()
                    .map(|name| DeviceClass {
                        name: (*name).into(),
                        ..DeviceClass::default()
                    })
                    .collect(),
            },
        },
    );
    c.metadata.generation = Some(3);
    c
}

fn with_conditions(mut c: LVMCluster, conditions: Vec<Condition>) -> LVMCluster {
    c.status = Some(LVMClusterStatus {
        conditions,
        ..LVMClusterStatus::default()
    });
    c
}

fn vg(class: &str, status: Option<VGStatusType>, reason: &str) -> VGStatus {
    VGStatus {
        name: class.into(),
        status,
        reason: reason.into(),
        devices: vec!["/dev/sdb".into()],
        ..VGStatus::default()
    }
}

fn report(node: &str, vgs: Vec<VGStatus>) -> LVMVolumeGroupNodeStatus {
    let mut s =
        LVMVolumeGroupNodeStatus::new(node, LVMVolumeGroupNodeStatusSpec { lvm_vg_status: vgs });
    s.metadata.namespace = Some("openshift-lvm-storage".into());
    s
}

fn ready(node: &str, classes: &[&str]) -> LVMVolumeGroupNodeStatus {
    report(
        node,
        classes
            .iter()
            .map(|c| vg(c, Some(VGStatusType::Ready), ""))
            .collect(),
    )
}

fn expect(pairs: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    pairs
        .iter()
        .map(|(class, nodes)| {
            (
                (*class).to_owned(),
                nodes.iter().map(|n| (*n).to_owned()).collect(),
            )
        })
        .collect()
}

fn cond<'a>(status: &'a LVMClusterStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {:?}", status.conditions))
}

fn vgs_ready(status: &LVMClusterStatus) -> &Condition {
    cond(status, CONDITION_VOLUME_GROUPS_READY)
}

fn resources(status: &LVMClusterStatus) -> &Condition {
    cond(status, CONDITION_RESOURCES_AVAILABLE)
}

// ---------------------------------------------------------------------------------------------
// States
// ---------------------------------------------------------------------------------------------

#[test]
fn every_selected_node_ready_for_every_class_is_ready() {
    let c = cluster(&["a", "b"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a", "b"]), ready("n2", &["a"])],
        &expect(&[("a", &["n1", "n2"]), ("b", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert!(s.ready);
    assert_eq!(s.state, Some(LVMStateType::Ready));
    assert_eq!(
        s.conditions,
        vec![
            Condition {
                type_: "ResourcesAvailable".into(),
                status: "True".into(),
                reason: "ResourcesAvailable".into(),
                message: "every object the LVMCluster stands for is applied".into(),
                observed_generation: Some(3),
                last_transition_time: t(0),
            },
            Condition {
                type_: "VolumeGroupsReady".into(),
                status: "True".into(),
                reason: "VGsReady".into(),
                message: "all 3 volume groups are ready (2 device classes on 2 nodes)".into(),
                observed_generation: Some(3),
                last_transition_time: t(0),
            },
        ]
    );
}

#[test]
fn a_node_that_has_not_reported_keeps_the_cluster_progressing() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1", "n2"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert!(!s.ready);
    assert_eq!(s.state, Some(LVMStateType::Progressing));
    let vgs = vgs_ready(&s);
    assert_eq!(
        (vgs.status.as_str(), vgs.reason.as_str()),
        ("False", "VGReadinessInProgress")
    );
    assert_eq!(
        vgs.message,
        "device class a on node n2: not reported yet (is the vg-manager pod running there?)"
    );
}

#[test]
fn a_node_missing_one_class_keeps_the_cluster_progressing() {
    let c = cluster(&["a", "b"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"]), ("b", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Progressing));
    assert!(vgs_ready(&s).message.contains("device class b on node n1"));
}

#[test]
fn progressing_and_unset_reports_are_progressing() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[
            report(
                "n1",
                vec![vg(
                    "a",
                    Some(VGStatusType::Progressing),
                    "creating thin pool",
                )],
            ),
            report("n2", vec![vg("a", None, "")]),
        ],
        &expect(&[("a", &["n1", "n2"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Progressing));
    assert_eq!(
        vgs_ready(&s).message,
        "device class a on node n1: Progressing (creating thin pool); \
         device class a on node n2: no status yet"
    );
}

#[test]
fn a_degraded_volume_group_degrades_the_cluster() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[
            report(
                "n1",
                vec![vg(
                    "a",
                    Some(VGStatusType::Degraded),
                    "optional path /dev/sdc missing",
                )],
            ),
            ready("n2", &["a"]),
        ],
        &expect(&[("a", &["n1", "n2"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Degraded));
    assert!(!s.ready);
    let vgs = vgs_ready(&s);
    assert_eq!(
        (vgs.status.as_str(), vgs.reason.as_str()),
        ("False", "VGsDegraded")
    );
    assert_eq!(
        vgs.message,
        "device class a on node n1: Degraded (optional path /dev/sdc missing)"
    );
}

#[test]
fn degraded_wins_over_progressing() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[report(
            "n1",
            vec![vg("a", Some(VGStatusType::Degraded), "x")],
        )],
        &expect(&[("a", &["n1", "n2"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Degraded));
    // Worst first.
    assert!(
        vgs_ready(&s)
            .message
            .starts_with("device class a on node n1: Degraded")
    );
}

#[test]
fn a_failed_volume_group_fails_the_cluster_and_names_node_and_class() {
    let c = cluster(&["a", "b"]);
    let s = aggregate(
        &c,
        &[
            report(
                "n1",
                vec![
                    vg("a", Some(VGStatusType::Degraded), "one device missing"),
                    vg("b", Some(VGStatusType::Failed), "/dev/sdz does not exist"),
                ],
            ),
            ready("n2", &["a", "b"]),
        ],
        &expect(&[("a", &["n1", "n2"]), ("b", &["n1", "n2"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Failed));
    let vgs = vgs_ready(&s);
    assert_eq!(
        (vgs.status.as_str(), vgs.reason.as_str()),
        ("False", "VGsFailed")
    );
    assert_eq!(
        vgs.message,
        "device class b on node n1: Failed (/dev/sdz does not exist); \
         device class a on node n1: Degraded (one device missing)"
    );
}

fn raid(status: RaidHealth) -> Option<RaidStatus> {
    Some(RaidStatus {
        status,
        member_count: 2,
        degraded_member_count: 1,
        min_sync_percent: 42.5,
        lv_health: Vec::new(),
    })
}

#[test]
fn raid_health_counts_even_when_the_volume_group_says_ready() {
    let c = cluster(&["m"]);
    let mut degraded = vg("m", Some(VGStatusType::Ready), "");
    degraded.raid_status = raid(RaidHealth::Degraded);
    let s = aggregate(
        &c,
        &[report("n1", vec![degraded])],
        &expect(&[("m", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Degraded));
    assert_eq!(
        vgs_ready(&s).message,
        "device class m on node n1: Ready; RAID Degraded: 1 of 2 members missing or failed, lowest sync 42.5%"
    );

    let mut failed = vg("m", Some(VGStatusType::Ready), "");
    failed.raid_status = raid(RaidHealth::Failed);
    let s = aggregate(
        &c,
        &[report("n1", vec![failed])],
        &expect(&[("m", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Failed));

    let mut healthy = vg("m", Some(VGStatusType::Ready), "");
    healthy.raid_status = raid(RaidHealth::Healthy);
    let s = aggregate(
        &c,
        &[report("n1", vec![healthy])],
        &expect(&[("m", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
}

#[test]
fn a_class_that_selects_no_node_fails_the_cluster() {
    let c = cluster(&["a", "b"]);
    for expected in [
        expect(&[("a", &["n1"]), ("b", &[])]),
        expect(&[("a", &["n1"])]), // b absent from the map
    ] {
        let s = aggregate(
            &c,
            &[ready("n1", &["a"])],
            &expected,
            &ResourceSync::Applied,
            &t(0),
        );
        assert_eq!(s.state, Some(LVMStateType::Failed));
        let vgs = vgs_ready(&s);
        assert_eq!(vgs.reason, "VGsFailed");
        assert!(
            vgs.message.starts_with("device class b selects no node"),
            "{}",
            vgs.message
        );
    }
}

#[test]
fn reports_from_nodes_a_class_does_not_select_do_not_change_the_state() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[
            ready("n1", &["a"]),
            report("old", vec![vg("a", Some(VGStatusType::Failed), "gone")]),
        ],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
    // ... but they are listed.
    let nodes: Vec<&str> = s.device_class_statuses[0]
        .node_status
        .iter()
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(nodes, ["n1", "old"]);
}

#[test]
fn failed_resources_fail_the_cluster_even_with_ready_volume_groups() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Failed("applying StorageClass lvms-a: forbidden".into()),
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Failed));
    assert!(!s.ready);
    let r = resources(&s);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str(), r.message.as_str()),
        (
            "False",
            "ResourcesSyncFailed",
            "applying the objects the LVMCluster stands for failed: applying StorageClass lvms-a: forbidden"
        )
    );
    assert_eq!(vgs_ready(&s).status, "True");
}

#[test]
fn resources_in_progress_keep_the_cluster_progressing_but_not_better_than_failed() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::InProgress,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Progressing));
    let r = resources(&s);
    assert_eq!(
        (r.status.as_str(), r.reason.as_str()),
        ("False", "ReconciliationInProgress")
    );

    let s = aggregate(
        &c,
        &[report("n1", vec![vg("a", Some(VGStatusType::Failed), "x")])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::InProgress,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Failed));
}

#[test]
fn long_problem_lists_are_cut_after_ten() {
    let c = cluster(&["a"]);
    let nodes: Vec<String> = (0..15).map(|i| format!("n{i:02}")).collect();
    let node_refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let s = aggregate(
        &c,
        &[],
        &expect(&[("a", &node_refs)]),
        &ResourceSync::Applied,
        &t(0),
    );
    let message = &vgs_ready(&s).message;
    assert_eq!(message.matches("not reported yet").count(), 10);
    assert!(message.ends_with("; and 5 more"), "{message}");
    assert!(
        message.contains("node n09") && !message.contains("node n10"),
        "{message}"
    );
}

// ---------------------------------------------------------------------------------------------
// Conditions over time
// ---------------------------------------------------------------------------------------------

#[test]
fn unchanged_condition_status_keeps_its_transition_time_and_updates_the_rest() {
    let c = cluster(&["a"]);
    let first = aggregate(
        &c,
        &[report(
            "n1",
            vec![vg("a", Some(VGStatusType::Progressing), "")],
        )],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::InProgress,
        &t(0),
    );
    // Still not ready, now degraded: status False → False keeps t(0), reason and message change.
    let c = with_conditions(c, first.conditions.clone());
    let second = aggregate(
        &c,
        &[report(
            "n1",
            vec![vg("a", Some(VGStatusType::Degraded), "x")],
        )],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(60),
    );
    let vgs = vgs_ready(&second);
    assert_eq!(vgs.last_transition_time, t(0));
    assert_eq!(vgs.reason, "VGsDegraded");
    // ResourcesAvailable went False → True: new transition time.
    assert_eq!(resources(&second).last_transition_time, t(60));

    // Ready: False → True at t(120); then still True at t(180) keeps t(120).
    let c = with_conditions(c, second.conditions.clone());
    let third = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(120),
    );
    assert_eq!(vgs_ready(&third).last_transition_time, t(120));
    assert_eq!(resources(&third).last_transition_time, t(60));
    let c = with_conditions(c, third.conditions.clone());
    let fourth = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(180),
    );
    assert_eq!(
        fourth.conditions, third.conditions,
        "nothing changed, nothing moves"
    );
}

#[test]
fn conditions_carry_the_generation_and_foreign_conditions_are_kept() {
    let foreign = Condition {
        type_: "Upgradeable".into(),
        status: "True".into(),
        reason: "AsExpected".into(),
        message: String::new(),
        observed_generation: Some(1),
        last_transition_time: t(-100),
    };
    let c = with_conditions(cluster(&["a"]), vec![foreign.clone()]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        ["ResourcesAvailable", "VolumeGroupsReady", "Upgradeable"]
    );
    assert_eq!(s.conditions[2], foreign);
    assert!(
        s.conditions[..2]
            .iter()
            .all(|c| c.observed_generation == Some(3))
    );
}

// ---------------------------------------------------------------------------------------------
// deviceClassStatuses
// ---------------------------------------------------------------------------------------------

#[test]
fn device_class_statuses_follow_spec_order_with_nodes_sorted() {
    let c = cluster(&["b", "a", "quiet"]);
    let failing = vg("a", Some(VGStatusType::Failed), "boom");
    let s = aggregate(
        &c,
        &[
            report(
                "n2",
                vec![
                    vg("a", Some(VGStatusType::Ready), ""),
                    vg("removed", Some(VGStatusType::Ready), ""),
                ],
            ),
            report(
                "n1",
                vec![failing.clone(), vg("b", Some(VGStatusType::Ready), "")],
            ),
        ],
        &expect(&[("a", &["n1", "n2"]), ("b", &["n1"]), ("quiet", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(
        s.device_class_statuses,
        vec![
            DeviceClassStatus {
                name: "b".into(),
                node_status: vec![NodeStatus {
                    node: "n1".into(),
                    vg_status: vg("b", Some(VGStatusType::Ready), "")
                }],
                joined_nodes: vec![],
                shared_timing: None,
            },
            DeviceClassStatus {
                name: "a".into(),
                node_status: vec![
                    NodeStatus {
                        node: "n1".into(),
                        vg_status: failing
                    },
                    NodeStatus {
                        node: "n2".into(),
                        vg_status: vg("a", Some(VGStatusType::Ready), "")
                    },
                ],
                joined_nodes: vec![],
                shared_timing: None,
            },
            DeviceClassStatus {
                name: "quiet".into(),
                node_status: vec![],
                joined_nodes: vec![],
                shared_timing: None,
            },
        ]
    );
}

fn shared_vg(class: &str, lockspace: LockspaceState) -> VGStatus {
    VGStatus {
        shared: Some(Box::new(lvms_api::SharedVGStatus {
            devices_visible: true,
            lockspace,
            ..lvms_api::SharedVGStatus::default()
        })),
        ..vg(class, Some(VGStatusType::Ready), "")
    }
}

#[test]
fn joined_nodes_of_a_shared_class_are_the_nodes_that_joined_its_lockspace_sorted() {
    let mut c = cluster(&["san", "local"]);
    c.spec.storage.device_classes[0].device_access_policy =
        Some(lvms_api::DeviceAccessPolicy::Shared);
    let s = aggregate(
        &c,
        &[
            report("n3", vec![shared_vg("san", LockspaceState::Joined)]),
            report("n2", vec![shared_vg("san", LockspaceState::Joining)]),
            report(
                "n1",
                vec![
                    shared_vg("san", LockspaceState::Joined),
                    vg("local", Some(VGStatusType::Ready), ""),
                ],
            ),
            report("n4", vec![shared_vg("san", LockspaceState::NotJoined)]),
            // Reports the class without a shared sub-status (an older node agent).
            report("n5", vec![vg("san", Some(VGStatusType::Ready), "")]),
        ],
        &expect(&[("san", &["n1", "n2", "n3", "n4", "n5"]), ("local", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.device_class_statuses[0].name, "san");
    assert_eq!(s.device_class_statuses[0].joined_nodes, ["n1", "n3"]);
    assert_eq!(s.device_class_statuses[0].node_status.len(), 5);
    assert!(s.device_class_statuses[1].joined_nodes.is_empty());
}

#[test]
fn a_node_local_class_has_no_joined_nodes_even_if_a_report_says_joined() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[report("n1", vec![shared_vg("a", LockspaceState::Joined)])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert!(s.device_class_statuses[0].joined_nodes.is_empty());
    let json = serde_json::to_value(&s.device_class_statuses[0]).unwrap();
    assert!(json.get("joinedNodes").is_none(), "{json}");
}

#[test]
fn joined_nodes_serialise_as_joined_nodes() {
    let status = DeviceClassStatus {
        name: "san".into(),
        node_status: vec![],
        joined_nodes: vec!["n1".into()],
        shared_timing: None,
    };
    assert_eq!(
        serde_json::to_value(&status).unwrap(),
        serde_json::json!({"name": "san", "joinedNodes": ["n1"]})
    );
}

#[test]
fn a_class_listed_twice_by_one_node_counts_once_first_wins() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[report(
            "n1",
            vec![
                vg("a", Some(VGStatusType::Ready), ""),
                vg("a", Some(VGStatusType::Failed), "stale"),
            ],
        )],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
    assert_eq!(s.device_class_statuses[0].node_status.len(), 1);
    assert_eq!(
        s.device_class_statuses[0].node_status[0].vg_status.status,
        Some(VGStatusType::Ready)
    );
}

#[test]
fn status_serialises_like_lvms() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["ready"], true);
    assert_eq!(v["state"], "Ready");
    assert_eq!(
        v["deviceClassStatuses"],
        serde_json::json!([{"name": "a", "nodeStatus": [
            {"node": "n1", "name": "a", "status": "Ready", "devices": ["/dev/sdb"]}
        ]}])
    );
    assert_eq!(
        v["conditions"][0]["lastTransitionTime"],
        "2023-11-14T22:13:20Z"
    );
}

// ---------------------------------------------------------------------------------------------
// Which nodes a class selects
// ---------------------------------------------------------------------------------------------

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

fn disk_in(values: &[&str]) -> NodeSelector {
    NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "disk".into(),
                operator: "In".into(),
                values: Some(values.iter().map(|v| (*v).into()).collect()),
            }]),
            match_fields: None,
        }],
    }
}

#[test]
fn nodes_for_class_without_selector_is_every_node_sorted() {
    let nodes = [
        node("n2", &[]),
        node("n1", &[("disk", "ssd")]),
        node("", &[]),
    ];
    assert_eq!(nodes_for_class(None, &nodes), ["n1", "n2"]);
}

#[test]
fn nodes_for_class_applies_the_selector() {
    let nodes = [
        node("n1", &[("disk", "ssd")]),
        node("n2", &[("disk", "hdd")]),
        node("n3", &[]),
    ];
    assert_eq!(nodes_for_class(Some(&disk_in(&["ssd"])), &nodes), ["n1"]);
    assert_eq!(
        nodes_for_class(Some(&disk_in(&["ssd", "hdd"])), &nodes),
        ["n1", "n2"]
    );
    assert!(nodes_for_class(Some(&NodeSelector::default()), &nodes).is_empty());
}

#[test]
fn expected_nodes_leave_out_untolerated_taints_and_deleted_nodes() {
    let mut c = cluster(&["all", "ssd"]);
    c.spec.storage.device_classes[1].node_selector = Some(disk_in(&["ssd"]));
    let tainted = |name: &str, key: &str| Node {
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: key.into(),
                effect: "NoSchedule".into(),
                value: None,
                time_added: None,
            }]),
            ..NodeSpec::default()
        }),
        ..node(name, &[("disk", "ssd")])
    };
    let mut leaving = node("leaving", &[("disk", "ssd")]);
    leaving.metadata.deletion_timestamp = Some(t(0));
    let nodes = [
        node("w1", &[("disk", "ssd")]),
        node("w2", &[]),
        tainted("cp", "node-role.kubernetes.io/control-plane"),
        tainted("storage", "dedicated-storage"),
        tainted("cordoned", "node.kubernetes.io/unschedulable"),
        leaving,
    ];
    assert_eq!(
        expected_nodes(&c, &nodes),
        expect(&[
            ("all", &["cordoned", "w1", "w2"]),
            ("ssd", &["cordoned", "w1"])
        ])
    );

    c.spec.tolerations = vec![Toleration {
        key: Some("dedicated-storage".into()),
        operator: Some("Exists".into()),
        ..Toleration::default()
    }];
    assert_eq!(
        expected_nodes(&c, &nodes),
        expect(&[
            ("all", &["cordoned", "storage", "w1", "w2"]),
            ("ssd", &["cordoned", "storage", "w1"])
        ])
    );
}

fn shared_cluster(watchdog: Option<WatchdogPolicy>, io_timeout: Option<i32>) -> LVMCluster {
    let mut c = cluster(&["san"]);
    let class = &mut c.spec.storage.device_classes[0];
    class.device_access_policy = Some(lvms_api::DeviceAccessPolicy::Shared);
    class.shared_config = Some(lvms_api::SharedConfig {
        watchdog,
        io_timeout_seconds: io_timeout,
        ..lvms_api::SharedConfig::default()
    });
    c
}

fn fenced_vg(watchdog: WatchdogState, kill_hook: bool, message: &str) -> VGStatus {
    VGStatus {
        shared: Some(Box::new(lvms_api::SharedVGStatus {
            devices_visible: true,
            lockspace: LockspaceState::Joined,
            fencing: Some(lvms_api::FencingStatus {
                watchdog,
                kill_hook,
                lease_renewal_failures: 0,
                message: message.into(),
                fenced: false,
            }),
            ..lvms_api::SharedVGStatus::default()
        })),
        ..vg("san", Some(VGStatusType::Ready), "")
    }
}

fn aggregate_san(c: &LVMCluster, reports: &[LVMVolumeGroupNodeStatus]) -> LVMClusterStatus {
    let nodes: Vec<&str> = reports
        .iter()
        .filter_map(|r| r.metadata.name.as_deref())
        .collect();
    aggregate(
        c,
        reports,
        &expect(&[("san", &nodes)]),
        &ResourceSync::Applied,
        &t(0),
    )
}

fn vg_condition(s: &LVMClusterStatus) -> &Condition {
    s.conditions
        .iter()
        .find(|c| c.type_ == CONDITION_VOLUME_GROUPS_READY)
        .unwrap()
}

#[test]
fn a_shared_class_reports_its_timing_and_fencing_policy() {
    let s = aggregate_san(&shared_cluster(None, Some(20)), &[]);
    assert_eq!(
        s.device_class_statuses[0].shared_timing,
        Some(SharedTiming {
            io_timeout_seconds: 20,
            renewal_fail_seconds: 160,
            host_dead_seconds: 220,
            watchdog: WatchdogPolicy::Required,
        })
    );
    let s = aggregate_san(&shared_cluster(Some(WatchdogPolicy::Disabled), None), &[]);
    assert_eq!(
        s.device_class_statuses[0].shared_timing,
        Some(SharedTiming {
            io_timeout_seconds: 10,
            renewal_fail_seconds: 80,
            host_dead_seconds: 140,
            watchdog: WatchdogPolicy::Disabled,
        })
    );
}

#[test]
fn the_shared_timing_shown_is_the_longest_one_the_joined_nodes_keep() {
    let kept = |io: i32, lockspace: LockspaceState| {
        let mut vg = fenced_vg(WatchdogState::Armed, true, "");
        let shared = vg.shared.as_mut().unwrap();
        shared.io_timeout_seconds = Some(io);
        shared.lockspace = lockspace;
        vg
    };
    // The class says 10 s; w1's sanlock keeps 5 s, w2's 20 s; w3 (not joined) would say 60 s.
    let reports = [
        report("w1", vec![kept(5, LockspaceState::Joined)]),
        report("w2", vec![kept(20, LockspaceState::Joined)]),
        report("w3", vec![kept(60, LockspaceState::NotJoined)]),
    ];
    let s = aggregate_san(&shared_cluster(None, None), &reports);
    assert_eq!(
        s.device_class_statuses[0].shared_timing,
        Some(SharedTiming {
            io_timeout_seconds: 20,
            renewal_fail_seconds: 160,
            host_dead_seconds: 220,
            watchdog: WatchdogPolicy::Required,
        })
    );
}

#[test]
fn a_node_local_class_has_no_shared_timing() {
    let c = cluster(&["a"]);
    let s = aggregate(
        &c,
        &[ready("n1", &["a"])],
        &expect(&[("a", &["n1"])]),
        &ResourceSync::Applied,
        &t(0),
    );
    assert_eq!(s.device_class_statuses[0].shared_timing, None);
}

#[test]
fn required_fencing_armed_with_the_hook_is_ready_without_warnings() {
    let s = aggregate_san(
        &shared_cluster(None, None),
        &[report(
            "n1",
            vec![fenced_vg(WatchdogState::Armed, true, "")],
        )],
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
    let c = vg_condition(&s);
    assert_eq!(c.status, "True");
    assert!(!c.message.contains("warning"), "{}", c.message);
}

#[test]
fn required_fencing_with_the_watchdog_missing_is_not_ready_on_that_node() {
    let s = aggregate_san(
        &shared_cluster(Some(WatchdogPolicy::Required), None),
        &[
            report(
                "n1",
                vec![fenced_vg(
                    WatchdogState::Missing,
                    true,
                    "there is no /dev/watchdog (modprobe softdog)",
                )],
            ),
            report("n2", vec![fenced_vg(WatchdogState::Armed, true, "")]),
        ],
    );
    assert!(!s.ready);
    assert_eq!(s.state, Some(LVMStateType::Degraded));
    let c = vg_condition(&s);
    assert_eq!(c.status, "False");
    assert_eq!(c.reason, REASON_VGS_DEGRADED);
    assert_eq!(
        c.message,
        "device class san on node n1: fencing is not armed (watchdog Missing): there is no \
         /dev/watchdog (modprobe softdog); or set sharedConfig.watchdog: Disabled to opt out"
    );
}

#[test]
fn required_fencing_without_the_kill_hook_is_not_ready_on_that_node() {
    let s = aggregate_san(
        &shared_cluster(None, None),
        &[report(
            "n1",
            vec![fenced_vg(
                WatchdogState::Armed,
                false,
                "set lvmlockctl_kill_command",
            )],
        )],
    );
    assert_eq!(s.state, Some(LVMStateType::Degraded));
    let c = vg_condition(&s);
    assert!(
        c.message.starts_with(
            "device class san on node n1: fencing is not armed (lvmlockctl_kill_command is not \
             the lvms fence hook): set lvmlockctl_kill_command"
        ),
        "{}",
        c.message
    );
}

#[test]
fn a_node_failing_for_another_reason_names_both_reasons() {
    let mut failing = fenced_vg(WatchdogState::Missing, false, "");
    failing.status = Some(VGStatusType::Failed);
    failing.reason = "sanlock is not running".into();
    let s = aggregate_san(&shared_cluster(None, None), &[report("n1", vec![failing])]);
    assert_eq!(s.state, Some(LVMStateType::Failed));
    assert_eq!(
        vg_condition(&s).message,
        "device class san on node n1: Failed (sanlock is not running); fencing is not armed \
         (watchdog Missing, lvmlockctl_kill_command is not the lvms fence hook); or set \
         sharedConfig.watchdog: Disabled to opt out"
    );
}

#[test]
fn softdog_counts_as_ready_with_a_warning() {
    let s = aggregate_san(
        &shared_cluster(None, None),
        &[report(
            "n1",
            vec![fenced_vg(WatchdogState::Softdog, true, "")],
        )],
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
    let c = vg_condition(&s);
    assert_eq!(c.status, "True");
    assert_eq!(
        c.message,
        "all 1 volume groups are ready (1 device classes on 1 nodes); warning: device class san \
         on node n1: the watchdog is softdog, which a hung kernel may not fire; use a hardware \
         watchdog"
    );
}

#[test]
fn disabled_fencing_accepts_a_missing_watchdog_and_says_so() {
    let s = aggregate_san(
        &shared_cluster(Some(WatchdogPolicy::Disabled), None),
        &[report(
            "n1",
            vec![fenced_vg(WatchdogState::Disabled, false, "")],
        )],
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
    let s2 = aggregate_san(
        &shared_cluster(Some(WatchdogPolicy::Disabled), None),
        &[report(
            "n1",
            vec![fenced_vg(WatchdogState::Missing, false, "")],
        )],
    );
    assert_eq!(s2.state, Some(LVMStateType::Ready));
    let c = vg_condition(&s2);
    assert!(
        c.message.ends_with(
            "; warning: device class san: fencing is disabled by the admin \
             (sharedConfig.watchdog: Disabled), so a node that loses its leases may keep writing \
             to volumes another node takes over"
        ),
        "{}",
        c.message
    );
}

#[test]
fn a_report_without_fencing_is_not_judged() {
    let s = aggregate_san(
        &shared_cluster(None, None),
        &[report("n1", vec![shared_vg("san", LockspaceState::Joined)])],
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
}

#[test]
fn fencing_of_a_node_local_class_is_not_judged() {
    let mut c = cluster(&["san"]);
    c.spec.storage.device_classes[0].shared_config = Some(lvms_api::SharedConfig::default());
    let s = aggregate_san(
        &c,
        &[report(
            "n1",
            vec![fenced_vg(WatchdogState::Missing, false, "")],
        )],
    );
    assert_eq!(s.state, Some(LVMStateType::Ready));
}
