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
//! The id of a node whose Node object is gone is kept until sanlock counts its host dead: the
//! record's annotation [`SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION`] says since when each such node
//! has been seen gone, and the id is released once that is [`wait_seconds`] ago and no node
//! reports the id live in a shared class's lockspace ([`live_host_ids`]).
//!
//! The ConfigMap has no owner reference: it outlives the `LVMCluster`, since the nodes may still hold
//! their leases on the LUNs after the cluster is deleted, and a re-created cluster must keep their
//! ids.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use k8s_openapi::jiff::Timestamp;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Node},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, api::PostParams};
use lvms_api::{
    LVMCluster, LVMVolumeGroupNodeStatus, SANLOCK_HOST_IDS_CONFIGMAP,
    SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION,
};
use lvms_core::shared::{HostIds, MAX_HOST_ID, Release, assign_host_ids};
use tracing::{debug, warn};

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
    let shared: BTreeSet<&str> = shared_classes(cluster).map(|c| c.name.as_str()).collect();
    expected_nodes(cluster, nodes)
        .into_iter()
        .filter(|(class, _)| shared.contains(class.as_str()))
        .flat_map(|(_, nodes)| nodes)
        .collect()
}

/// How long the id of a node that is gone is kept at least: the longest sanlock host-dead time
/// (`8 × ioTimeoutSeconds + 60`) among the shared classes of `cluster`.
pub fn wait_seconds(cluster: &LVMCluster) -> i64 {
    Release::host_dead_seconds_for(
        shared_classes(cluster)
            .map(|c| c.shared_config_or_default().io_timeout_seconds_or_default()),
    )
}

/// The shared device classes of `cluster`.
fn shared_classes(cluster: &LVMCluster) -> impl Iterator<Item = &lvms_api::DeviceClass> {
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .filter(|c| c.is_shared())
}

/// The host ids some node reports live (`shared.liveHostIds`) in a shared class of `cluster`.
pub fn live_host_ids(
    cluster: &LVMCluster,
    node_statuses: &[LVMVolumeGroupNodeStatus],
) -> BTreeSet<u16> {
    let shared: BTreeSet<&str> = shared_classes(cluster).map(|c| c.name.as_str()).collect();
    node_statuses
        .iter()
        .flat_map(|s| &s.spec.lvm_vg_status)
        .filter(|vg| shared.contains(vg.name.as_str()))
        .filter_map(|vg| vg.shared.as_ref())
        .flat_map(|s| &s.live_host_ids)
        .filter_map(|id| u16::try_from(*id).ok())
        .collect()
}

/// The record's [`SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION`], in Unix seconds. An entry that does
/// not parse is left out (its node counts as gone from now: the wait starts again, never shorter).
pub fn read_gone_since(cm: Option<&ConfigMap>) -> BTreeMap<String, i64> {
    let Some(text) = cm
        .and_then(|cm| cm.metadata.annotations.as_ref())
        .and_then(|a| a.get(SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION))
    else {
        return BTreeMap::new();
    };
    let entries: BTreeMap<String, String> = match serde_json::from_str(text) {
        Ok(entries) => entries,
        Err(e) => {
            warn!(error = %e, "unreadable gone-since annotation on the host-id record, ignored");
            return BTreeMap::new();
        }
    };
    entries
        .into_iter()
        .filter_map(|(node, time)| {
            let ts = time.parse::<Timestamp>().ok()?;
            Some((node, ts.as_second()))
        })
        .collect()
}

/// The annotation's value for `gone_since` (Unix seconds), or `None` when it is empty.
fn write_gone_since(gone_since: &BTreeMap<String, i64>) -> Option<String> {
    if gone_since.is_empty() {
        return None;
    }
    let entries: BTreeMap<&str, String> = gone_since
        .iter()
        .map(|(node, secs)| {
            let time = Timestamp::from_second(*secs).unwrap_or(Timestamp::UNIX_EPOCH);
            (node.as_str(), time.to_string())
        })
        .collect();
    serde_json::to_string(&entries).ok()
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
         exist (ConfigMap {SANLOCK_HOST_IDS_CONFIGMAP}); an id is released only once its Node is \
         deleted and sanlock counts its host dead, so delete the Node objects of machines that \
         are gone"
    )
}

/// The record to write: `read` (when there is one, with its `resourceVersion`, which makes the
/// update conditional) with the outcome's ids as its data, its gone-since annotation and the
/// operator's labels.
fn record(read: Option<ConfigMap>, namespace: &str, out: &HostIds) -> ConfigMap {
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
    let annotations = cm.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match write_gone_since(&out.gone_since) {
        Some(value) => {
            annotations.insert(SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION.to_owned(), value);
        }
        None => {
            annotations.remove(SANLOCK_HOST_IDS_GONE_SINCE_ANNOTATION);
        }
    }
    cm.data = Some(
        out.ids
            .iter()
            .map(|(node, id)| (node.clone(), id.to_string()))
            .collect(),
    );
    cm
}

/// Reads the record through `api` (the operator's namespace; absent means empty), assigns ids with
/// [`assign_host_ids`] and, when something changed, writes the result back: an update with the
/// read `resourceVersion`, or a create when there was none. A 409 means another writer won the race;
/// the round starts over from a fresh read, at most [`ATTEMPTS`] times. `release` says when a gone
/// node's id may go (its `gone_since` is taken from each read record). Returns the outcome that
/// was written (or that needed no write); `exhausted` nodes got no id.
pub async fn allocate(
    api: &Api<ConfigMap>,
    needing: &BTreeSet<String>,
    present: &BTreeSet<String>,
    release: &Release,
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
        let release = Release {
            gone_since: read_gone_since(read.as_ref()),
            ..release.clone()
        };
        let out = assign_host_ids(&current, needing, present, &release);
        if !out.changed(&release.gone_since) {
            return Ok(out);
        }
        let exists = read.is_some();
        let cm = record(read, &namespace, &out);
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
