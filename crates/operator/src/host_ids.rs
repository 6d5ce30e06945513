//! Sanlock host ids for the nodes of shared device classes (ADR 0017): the record is the ConfigMap
//! [`SANLOCK_HOST_IDS_CONFIGMAP`] in the operator's namespace, data `<node>: "<id>"`.
//!
//! [`needing`] and [`present`] say which nodes need an id and which exist; the pure
//! [`assign_host_ids`] decides; [`allocate`] reads the record, asks it and writes the result back
//! with optimistic concurrency only: an update carries the `resourceVersion` it read, a record that
//! does not exist yet is created, and a 409 (`Conflict` or `AlreadyExists`: someone else wrote in
//! between) starts over from a fresh read, at most [`ATTEMPTS`] times. Never server-side apply and
//! never force: two writers that both read the same record would otherwise give the same id to two
//! nodes.
//!
//! The ConfigMap has no owner reference: it outlives the `LVMCluster`, since the nodes may still hold
//! their leases on the LUNs after the cluster is deleted, and a re-created cluster must keep their
//! ids.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use k8s_openapi::{
    api::core::v1::{ConfigMap, Node},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, api::PostParams};
use lvms_api::{LVMCluster, SANLOCK_HOST_IDS_CONFIGMAP};
use lvms_core::shared::{HostIds, MAX_HOST_ID, assign_host_ids};
use tracing::debug;

use crate::{
    render::{APP_NAME, app_labels},
    status::{MAX_LISTED_PROBLEMS, expected_nodes},
};

/// `app.kubernetes.io/component` of the host-id ConfigMap.
pub const COMPONENT_HOST_IDS: &str = "sanlock-host-ids";

/// How many read-decide-write rounds [`allocate`] makes before it gives up on a record that keeps
/// changing under it. Each lost round means another writer's round succeeded.
pub const ATTEMPTS: usize = 5;

/// Why [`allocate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed; `action` says which.
    #[error("{action} ConfigMap {SANLOCK_HOST_IDS_CONFIGMAP}: {source}")]
    Kube {
        /// What was being done with the ConfigMap.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Every write lost a race with another writer.
    #[error(
        "ConfigMap {SANLOCK_HOST_IDS_CONFIGMAP} changed between read and write in each of \
         {attempts} attempts (another operator or reconcile is writing it); nothing was assigned, \
         the next reconcile tries again"
    )]
    Contended {
        /// How many rounds were made.
        attempts: usize,
    },
}

/// Whether any device class of `cluster` is shared (only then are host ids assigned).
pub fn any_shared(cluster: &LVMCluster) -> bool {
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .any(lvms_api::DeviceClass::is_shared)
}

/// The nodes that need a host id: those a shared class of `cluster` selects, by the same rules as
/// the `LVMCluster`'s status ([`expected_nodes`]: not being deleted, taints tolerated, the class's
/// node selector).
pub fn needing(cluster: &LVMCluster, nodes: &[Node]) -> BTreeSet<String> {
    let shared: BTreeSet<&str> = cluster
        .spec
        .storage
        .device_classes
        .iter()
        .filter(|c| c.is_shared())
        .map(|c| c.name.as_str())
        .collect();
    expected_nodes(cluster, nodes)
        .into_iter()
        .filter(|(class, _)| shared.contains(class.as_str()))
        .flat_map(|(_, nodes)| nodes)
        .collect()
}

/// Every node that exists (also those being deleted: their ids are kept until they are gone).
pub fn present(nodes: &[Node]) -> BTreeSet<String> {
    nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .collect()
}

/// `node: id` pairs, at most [`MAX_LISTED_PROBLEMS`] of them and a count of the rest.
pub fn list<T: std::fmt::Display>(entries: &[(String, T)]) -> String {
    let mut text = entries
        .iter()
        .take(MAX_LISTED_PROBLEMS)
        .map(|(node, id)| format!("{node}: {id}"))
        .collect::<Vec<_>>()
        .join(", ");
    if entries.len() > MAX_LISTED_PROBLEMS {
        let _ = write!(text, " and {} more", entries.len() - MAX_LISTED_PROBLEMS);
    }
    text
}

/// What to say when nodes need an id and none is left.
pub fn exhausted_message(nodes: &[String]) -> String {
    let mut names = nodes
        .iter()
        .take(MAX_LISTED_PROBLEMS)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if nodes.len() > MAX_LISTED_PROBLEMS {
        let _ = write!(names, " and {} more", nodes.len() - MAX_LISTED_PROBLEMS);
    }
    format!(
        "no sanlock host id left for node(s) {names}: all {MAX_HOST_ID} ids belong to nodes that \
         exist (ConfigMap {SANLOCK_HOST_IDS_CONFIGMAP}); an id is released only when its Node is \
         deleted, so delete the Node objects of machines that are gone"
    )
}

/// The record to write: `read` (when there is one, with its `resourceVersion`, which makes the
/// update conditional) with `ids` as its data and the operator's labels.
fn record(read: Option<ConfigMap>, namespace: &str, ids: &BTreeMap<String, u16>) -> ConfigMap {
    let mut cm = read.unwrap_or_else(|| ConfigMap {
        metadata: ObjectMeta {
            name: Some(SANLOCK_HOST_IDS_CONFIGMAP.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    });
    cm.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .extend(app_labels(APP_NAME, COMPONENT_HOST_IDS));
    cm.data = Some(
        ids.iter()
            .map(|(node, id)| (node.clone(), id.to_string()))
            .collect(),
    );
    cm
}

/// Reads the record through `api` (the operator's namespace; absent means empty), assigns ids with
/// [`assign_host_ids`] and, when something changed, writes the result back: an update with the
/// read `resourceVersion`, or a create when there was none. A 409 means another writer won the race;
/// the round starts over from a fresh read, at most [`ATTEMPTS`] times. Returns the outcome that
/// was written (or that needed no write); `exhausted` nodes got no id.
pub async fn allocate(
    api: &Api<ConfigMap>,
    needing: &BTreeSet<String>,
    present: &BTreeSet<String>,
) -> Result<HostIds, Error> {
    let namespace = api.namespace().unwrap_or_default().to_owned();
    for attempt in 1..=ATTEMPTS {
        let read = api
            .get_opt(SANLOCK_HOST_IDS_CONFIGMAP)
            .await
            .map_err(|source| Error::Kube {
                action: "reading",
                source,
            })?;
        let current = read
            .as_ref()
            .and_then(|cm| cm.data.clone())
            .unwrap_or_default();
        let out = assign_host_ids(&current, needing, present);
        if !out.changed() {
            return Ok(out);
        }
        let exists = read.is_some();
        let cm = record(read, &namespace, &out.ids);
        let pp = PostParams::default();
        let written = if exists {
            api.replace(SANLOCK_HOST_IDS_CONFIGMAP, &pp, &cm).await
        } else {
            api.create(&pp, &cm).await
        };
        match written {
            Ok(_) => return Ok(out),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                debug!(attempt, reason = %status.reason, "host-id record changed since read, reading again");
            }
            Err(source) => {
                return Err(Error::Kube {
                    action: if exists { "updating" } else { "creating" },
                    source,
                });
            }
        }
    }
    Err(Error::Contended { attempts: ATTEMPTS })
}

#[cfg(test)]
mod tests;
