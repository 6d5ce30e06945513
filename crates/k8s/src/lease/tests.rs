#![allow(clippy::unwrap_used, clippy::expect_used)]

use lvms_testkit::fake_api::FakeApi;
use serde_json::json;

use super::*;

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/lvms/leases/lvms-shared-create-san";

fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn lease(holder: Option<&str>, renewed: Option<Timestamp>, duration: Option<i32>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("lvms-shared-create-san".into()),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            renew_time: renewed.map(MicroTime),
            lease_duration_seconds: duration,
            lease_transitions: Some(2),
            ..LeaseSpec::default()
        }),
    }
}

#[test]
fn an_absent_lease_is_created() {
    assert_eq!(decide(None, "node-a", at(0)), Decision::Create);
}

#[test]
fn a_lease_held_by_me_is_renewed_even_when_expired() {
    for renewed in [at(-10), at(-1000)] {
        assert_eq!(
            decide(
                Some(&lease(Some("node-a"), Some(renewed), Some(360))),
                "node-a",
                at(0)
            ),
            Decision::Renew {
                resource_version: "7".into()
            }
        );
    }
}

#[test]
fn a_live_lease_held_by_another_node_is_waited_for() {
    let l = lease(Some("node-b"), Some(at(-100)), Some(360));
    assert_eq!(
        decide(Some(&l), "node-a", at(0)),
        Decision::Wait {
            holder: "node-b".into(),
            expires: at(260)
        }
    );
    // Up to the last second.
    assert!(matches!(
        decide(Some(&l), "node-a", at(259)),
        Decision::Wait { .. }
    ));
}

#[test]
fn an_expired_lease_of_another_node_is_taken_over_with_the_read_resource_version() {
    let l = lease(Some("node-b"), Some(at(-400)), Some(360));
    let took = Decision::TakeOver {
        resource_version: "7".into(),
        previous: Some("node-b".into()),
        transitions: 3,
    };
    assert_eq!(decide(Some(&l), "node-a", at(0)), took);
    // Exactly at renewTime + leaseDurationSeconds it is over.
    assert_eq!(decide(Some(&l), "node-a", at(-40)), took);
}

#[test]
fn a_lease_nobody_holds_or_without_times_is_taken_over() {
    for l in [
        lease(None, Some(at(0)), Some(360)),
        lease(Some(""), Some(at(0)), Some(360)),
        lease(Some("node-b"), None, Some(360)),
        lease(Some("node-b"), Some(at(0)), None),
        lease(Some("node-b"), Some(at(0)), Some(0)),
    ] {
        assert!(
            matches!(decide(Some(&l), "node-a", at(0)), Decision::TakeOver { .. }),
            "{l:?}"
        );
    }
}

fn creator(api: &FakeApi, node: &str) -> HeldLease {
    HeldLease::new(
        api.client("lvms"),
        "lvms",
        "lvms-shared-create-san",
        node,
        Duration::from_secs(360),
    )
}

#[tokio::test]
async fn the_first_node_creates_the_lease_the_second_waits_and_the_holder_renews() {
    let api = FakeApi::new();
    assert_eq!(
        creator(&api, "node-a").try_hold().await.unwrap(),
        Holding::Held
    );
    let stored = api.get(PATH).unwrap();
    assert_eq!(stored["spec"]["holderIdentity"], "node-a");
    assert_eq!(stored["spec"]["leaseDurationSeconds"], 360);
    assert_eq!(stored["spec"]["leaseTransitions"], 0);

    let b = creator(&api, "node-b").try_hold().await.unwrap();
    assert!(
        matches!(b, Holding::Other { ref holder, .. } if holder == "node-a"),
        "{b:?}"
    );

    api.clear_requests();
    assert_eq!(
        creator(&api, "node-a").try_hold().await.unwrap(),
        Holding::Held
    );
    let put = api.requests().last().unwrap().clone();
    assert_eq!(put.method, http::Method::PUT);
    assert_eq!(put.body["metadata"]["resourceVersion"], "1");
    let renewed = api.get(PATH).unwrap();
    assert_eq!(renewed["spec"]["holderIdentity"], "node-a");
    assert_eq!(
        renewed["spec"]["acquireTime"],
        stored["spec"]["acquireTime"]
    );
    assert_eq!(renewed["spec"]["leaseTransitions"], 0);
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_counted() {
    let api = FakeApi::new();
    api.insert(
        PATH,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lvms-shared-create-san", "namespace": "lvms"},
               "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 10,
                        "renewTime": "2020-01-01T00:00:00.000000Z", "leaseTransitions": 4}}),
    );
    assert_eq!(
        creator(&api, "node-a").try_hold().await.unwrap(),
        Holding::Held
    );
    let stored = api.get(PATH).unwrap();
    assert_eq!(stored["spec"]["holderIdentity"], "node-a");
    assert_eq!(stored["spec"]["leaseTransitions"], 5);
}

#[tokio::test]
async fn of_two_nodes_racing_for_an_absent_or_expired_lease_exactly_one_holds_it() {
    let api = FakeApi::new();
    let expired = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "lvms-shared-create-san", "namespace": "lvms"},
        "spec": {"holderIdentity": "node-c", "leaseDurationSeconds": 10,
                 "renewTime": "2020-01-01T00:00:00.000000Z"}});
    for before in [None, Some(expired)] {
        if let Some(l) = before {
            api.insert(PATH, l);
        }
        let (node_a, node_b) = (creator(&api, "node-a"), creator(&api, "node-b"));
        let (a, b) = tokio::join!(node_a.try_hold(), node_b.try_hold());
        let (a, b) = (a.unwrap(), b.unwrap());
        let holder = api.get(PATH).unwrap()["spec"]["holderIdentity"].clone();
        match (&a, &b) {
            (Holding::Held, Holding::Other { holder: h, .. }) => {
                assert_eq!(h, "node-a");
                assert_eq!(holder, "node-a");
            }
            (Holding::Other { holder: h, .. }, Holding::Held) => {
                assert_eq!(h, "node-b");
                assert_eq!(holder, "node-b");
            }
            other => panic!("exactly one holder expected: {other:?}"),
        }
        api.delete(PATH);
    }
}
