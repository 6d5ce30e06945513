//! The creator Lease of a shared device class (`lvms_node::creator_lease`) on the real API server,
//! with exactly the node agent's permissions: the rules of the Role in `deploy/base/node-rbac.yaml`,
//! bound in the test's own namespace to a `vg-manager` ServiceAccount that the agents impersonate.
//! Agents racing for an absent Lease end with one holder; the holder renews; an expired Lease is
//! taken over by exactly one of two racing agents, and the old holder then waits.

use std::{path::Path, time::Duration};

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        rbac::v1::{Role, RoleBinding},
    },
    jiff::Timestamp,
};
use kube::{Api, Client, api::PostParams};
use lvms_node::creator_lease::{Holding, creator_lease};
use serde::Deserialize as _;
use serde_json::{Value, json};

use crate::support::{self, TestNamespace};

/// The node agent's Role from `deploy/base/node-rbac.yaml`, made in `ns` and bound to ServiceAccount
/// `vg-manager` there; a client that acts as that ServiceAccount.
async fn agent_client(admin: &Client, ns: &str) -> Client {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/node-rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let role = serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Role")
        .expect("node-rbac.yaml has the agent's Role");
    let role: Role = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "lvms-node", "namespace": ns},
        "rules": role["rules"],
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "lvms-node", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "lvms-node"},
        "subjects": [{"kind": "ServiceAccount", "name": "vg-manager", "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let mut config = kube::Config::infer().await.unwrap();
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:vg-manager"));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".to_owned(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".to_owned(),
    ]);
    Client::try_from(config).unwrap()
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref()?.holder_identity.clone()
}

/// Of two outcomes of a race, the name of the one that holds (panics unless exactly one does, and
/// the other names it).
fn one_winner(a: (&str, &Holding), b: (&str, &Holding)) -> String {
    match (a.1, b.1) {
        (Holding::Held, Holding::Other { holder, .. }) if holder == a.0 => a.0.to_owned(),
        (Holding::Other { holder, .. }, Holding::Held) if holder == b.0 => b.0.to_owned(),
        other => panic!("exactly one holder expected, got {other:?}"),
    }
}

#[tokio::test]
async fn shared_lease_racing_agents_end_with_one_holder_and_an_expired_lease_is_taken_over() {
    if !support::enabled(
        "shared_lease_racing_agents_end_with_one_holder_and_an_expired_lease_is_taken_over",
    ) {
        return;
    }
    let admin = support::client().await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&admin, &format!("lvms-e2e-lease-{sfx}"), &[]).await;
    let agent = agent_client(&admin, &ns.name).await;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns.name);
    // The agents really act with the Role only: it grants no delete.
    let (code, _) = support::api_error(
        Api::<Lease>::namespaced(agent.clone(), &ns.name)
            .delete("any", &Default::default())
            .await,
    );
    assert_eq!(code, 403, "the impersonated agent may not delete Leases");

    // Two agents race for the absent Lease of each of several classes: one creates it, the other's
    // create is refused (409) and it finds the winner's Lease.
    for round in 0..5 {
        let class = format!("san{round}");
        let (a, b) = (
            creator_lease(agent.clone(), &ns.name, &class, "node-a"),
            creator_lease(agent.clone(), &ns.name, &class, "node-b"),
        );
        let (ra, rb) = tokio::join!(a.try_hold(), b.try_hold());
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let winner = one_winner(("node-a", &ra), ("node-b", &rb));
        let stored = leases.get(a.name()).await.unwrap();
        assert_eq!(holder(&stored).as_deref(), Some(winner.as_str()));
        let spec = stored.spec.clone().unwrap();
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(
            spec.lease_duration_seconds,
            Some(i32::try_from(lvms_node::creator_lease::DURATION.as_secs()).unwrap())
        );

        // The holder renews (an update with the resourceVersion it read); the other still waits.
        let (holding, waiting) = if winner == "node-a" {
            (&a, &b)
        } else {
            (&b, &a)
        };
        assert_eq!(holding.try_hold().await.unwrap(), Holding::Held);
        let renewed = leases.get(a.name()).await.unwrap();
        assert_ne!(
            renewed.metadata.resource_version, stored.metadata.resource_version,
            "renewed"
        );
        assert_eq!(holder(&renewed).as_deref(), Some(winner.as_str()));
        assert!(matches!(
            waiting.try_hold().await.unwrap(),
            Holding::Other { holder, expires } if holder == winner && expires > Timestamp::now()
        ));
    }

    // A Lease of 2 s held by node-a expires; node-b and node-c race to take it over.
    let a = creator_lease(agent.clone(), &ns.name, "expiring", "node-a")
        .with_duration(Duration::from_secs(2));
    let (b, c) = (
        creator_lease(agent.clone(), &ns.name, "expiring", "node-b"),
        creator_lease(agent.clone(), &ns.name, "expiring", "node-c"),
    );
    assert_eq!(a.try_hold().await.unwrap(), Holding::Held);
    assert!(matches!(
        b.try_hold().await.unwrap(),
        Holding::Other { holder, .. } if holder == "node-a"
    ));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rb, rc) = tokio::join!(b.try_hold(), c.try_hold());
    let winner = one_winner(("node-b", &rb.unwrap()), ("node-c", &rc.unwrap()));
    let taken = leases.get(a.name()).await.unwrap();
    assert_eq!(holder(&taken).as_deref(), Some(winner.as_str()));
    assert_eq!(taken.spec.unwrap().lease_transitions, Some(1));
    // The old holder finds it taken and waits.
    assert!(matches!(
        a.try_hold().await.unwrap(),
        Holding::Other { holder, .. } if holder == winner
    ));

    ns.delete().await;
}
