//! Sanlock host ids against a real API server: two allocators racing on one record never give an
//! id to two nodes, and deleting a Node releases its id.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Request, StatusCode};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
    client::Body,
};
use lvms_api::{LVMCluster, SANLOCK_HOST_IDS_CONFIGMAP};
use lvms_core::shared::Release;
use lvms_operator::host_ids;
use serde_json::json;
use tokio::sync::Barrier;

use crate::support::{self, TestNamespace, WAIT, eventually};

/// Releases a gone node's id at once: these tests pin the record's concurrency; the wait for a
/// dead host (issue 13) is decided by `assign_host_ids` and tested with it.
fn at_once() -> Release {
    Release {
        live: Some(BTreeSet::new()),
        ..Release::default()
    }
}

/// Rounds each allocator makes; every round adds nodes of its own and one both need.
const ROUNDS: usize = 25;

/// `client`, counting the 409 answers it gets (the races the test means to provoke).
fn counting_conflicts(client: Client, conflicts: Arc<AtomicUsize>) -> Client {
    let ns = client.default_namespace().to_owned();
    let service = tower::service_fn(move |req: Request<Body>| {
        let client = client.clone();
        let conflicts = conflicts.clone();
        async move {
            let res = client.send(req).await?;
            if res.status() == StatusCode::CONFLICT {
                conflicts.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, kube::Error>(res)
        }
    });
    Client::new(service, ns)
}

/// The record's data, parsed.
async fn record(api: &Api<ConfigMap>) -> BTreeMap<String, u16> {
    api.get_opt(SANLOCK_HOST_IDS_CONFIGMAP)
        .await
        .unwrap()
        .and_then(|cm| cm.data)
        .unwrap_or_default()
        .into_iter()
        .map(|(node, id)| {
            let id = id
                .parse()
                .unwrap_or_else(|_| panic!("{node}: {id:?} is no id"));
            (node, id)
        })
        .collect()
}

/// Panics when two nodes of `ids` have the same id.
fn assert_unique(ids: &BTreeMap<String, u16>, when: &str) {
    let mut owner: BTreeMap<u16, &str> = BTreeMap::new();
    for (node, id) in ids {
        if let Some(other) = owner.insert(*id, node) {
            panic!("{when}: id {id} belongs to both {other} and {node}: {ids:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_allocators_never_give_one_id_to_two_nodes() {
    if !support::enabled("racing_allocators_never_give_one_id_to_two_nodes") {
        return;
    }
    let client = support::client().await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-hostids-{sfx}"), &[]).await;

    // Every node either allocator will ever ask for exists throughout: nothing is released, so an
    // id once seen for a node must stay that node's, and belong to no other.
    let own =
        |who: &str, round: usize| [format!("{who}-{round:02}-x"), format!("{who}-{round:02}-y")];
    let both = |round: usize| format!("both-{round:02}");
    let present: BTreeSet<String> = (0..ROUNDS)
        .flat_map(|r| {
            let mut names = Vec::from(own("a", r));
            names.extend(own("b", r));
            names.push(both(r));
            names
        })
        .collect();

    let conflicts = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(2));
    let mut tasks = Vec::new();
    for who in ["a", "b"] {
        let client = counting_conflicts(support::client().await, conflicts.clone());
        let api = Api::<ConfigMap>::namespaced(client, &ns.name);
        let present = present.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut needing = BTreeSet::new();
            let mut seen: Vec<BTreeMap<String, u16>> = Vec::new();
            for round in 0..ROUNDS {
                needing.extend(own(who, round));
                needing.insert(both(round));
                // Both read at the same moment, so one of the two writes conflicts.
                barrier.wait().await;
                let out = host_ids::allocate(&api, &needing, &present, &at_once())
                    .await
                    .unwrap_or_else(|e| panic!("allocator {who}, round {round}: {e}"));
                assert!(out.exhausted.is_empty(), "{:?}", out.exhausted);
                assert!(
                    out.released.is_empty() && out.replaced.is_empty(),
                    "{out:?}"
                );
                for node in &needing {
                    assert!(
                        out.ids.contains_key(node),
                        "allocator {who}, round {round}: {node} has no id: {:?}",
                        out.ids
                    );
                }
                assert_unique(&out.ids, &format!("allocator {who}, round {round}"));
                seen.push(out.ids);
            }
            seen
        }));
    }
    let mut history: Vec<BTreeMap<String, u16>> = Vec::new();
    for task in tasks {
        history.extend(task.await.unwrap());
    }

    // Across both allocators and every round: one id per node, one node per id.
    let mut id_of: BTreeMap<&str, u16> = BTreeMap::new();
    let mut node_of: BTreeMap<u16, &str> = BTreeMap::new();
    for ids in &history {
        for (node, id) in ids {
            if let Some(before) = id_of.insert(node, *id) {
                assert_eq!(before, *id, "{node} changed its id");
            }
            if let Some(other) = node_of.insert(*id, node) {
                assert_eq!(other, node, "id {id} was given to {other} and to {node}");
            }
        }
    }

    let api = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let ids = record(&api).await;
    assert_unique(&ids, "the final record");
    assert_eq!(
        ids.keys().cloned().collect::<BTreeSet<_>>(),
        present,
        "every node got an id"
    );
    assert_eq!(
        ids.values().copied().collect::<BTreeSet<_>>(),
        (1..=u16::try_from(present.len()).unwrap()).collect(),
        "nothing was released, so the ids are 1..=n without gaps"
    );
    for (node, id) in &ids {
        assert_eq!(id_of.get(node.as_str()), Some(id), "{node}");
    }
    let conflicts = conflicts.load(Ordering::SeqCst);
    eprintln!(
        "host ids: {} nodes, {conflicts} conflicts retried",
        ids.len()
    );
    assert!(
        conflicts > 0,
        "the allocators never raced; the test proves nothing"
    );
    ns.delete().await;
}

#[tokio::test]
async fn deleting_a_node_releases_its_id_for_a_later_node() {
    if !support::enabled("deleting_a_node_releases_its_id_for_a_later_node") {
        return;
    }
    let client = support::client().await;
    let sfx = support::suffix();
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-hostids-del-{sfx}"), &[]).await;
    let label = format!("lvms-e2e-hostids-{sfx}");
    let cluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": ns.name, "uid": "uid-1"},
        // Nodes made without a kubelet keep the not-ready NoSchedule taint the API server gives
        // them; the node pods tolerate everything here, as in the operator test.
        "spec": {"tolerations": [{"operator": "Exists"}], "storage": {"deviceClasses": [{
            "name": "san",
            "deviceAccessPolicy": "shared",
            "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": label, "operator": "Exists"}]}]}
        }]}}
    }))
    .unwrap();
    let name = |n: usize| format!("lvms-e2e-{sfx}-san-{n}");
    for n in 1..=3 {
        support::create_node(&client, &name(n), &[(&label, "")]).await;
    }
    let nodes_api = Api::<Node>::all(client.clone());
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    // Needing and present as the reconciler computes them, from the real Node list.
    let allocate = || async {
        let nodes = nodes_api.list(&ListParams::default()).await.unwrap().items;
        host_ids::allocate(
            &cms,
            &host_ids::needing(&cluster, &nodes),
            &host_ids::present(&nodes),
            &at_once(),
        )
        .await
        .unwrap()
    };

    let out = allocate().await;
    assert_eq!(out.added.len(), 3, "{out:?}");
    let expected = |pairs: &[(usize, u16)]| -> BTreeMap<String, u16> {
        pairs.iter().map(|(n, id)| (name(*n), *id)).collect()
    };
    assert_eq!(record(&cms).await, expected(&[(1, 1), (2, 2), (3, 3)]));

    support::delete_node(&client, &name(2)).await;
    eventually("node 2 gone", WAIT, || async {
        match nodes_api.get_opt(&name(2)).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let out = allocate().await;
    assert_eq!(out.released, [(name(2), 2)]);
    assert_eq!(record(&cms).await, expected(&[(1, 1), (3, 3)]));

    // The record is kept with the operator's labels and no owner (it outlives the LVMCluster).
    let cm = cms.get(SANLOCK_HOST_IDS_CONFIGMAP).await.unwrap();
    assert_eq!(
        cm.metadata.labels.as_ref().unwrap()["app.kubernetes.io/component"],
        host_ids::COMPONENT_HOST_IDS
    );
    assert!(cm.metadata.owner_references.is_none());

    support::create_node(&client, &name(4), &[(&label, "")]).await;
    let out = allocate().await;
    assert_eq!(out.added, [(name(4), 2)], "the lowest free id");
    assert_eq!(record(&cms).await, expected(&[(1, 1), (3, 3), (4, 2)]));

    // A stale update is refused by the real API server: the precondition allocate relies on.
    let mut stale = cm;
    stale.data = Some(BTreeMap::from([(name(9), "1".to_owned())]));
    let (code, _) = support::api_error(
        cms.replace(SANLOCK_HOST_IDS_CONFIGMAP, &PostParams::default(), &stale)
            .await,
    );
    assert_eq!(code, 409);

    for n in [1, 3, 4] {
        support::delete_node(&client, &name(n)).await;
    }
    ns.delete().await;
}
