//! Which volumes of shared device classes move to another node when theirs is gone (issue 13, ADR
//! 0024): the pure decision; the I/O half runs in [`crate::controller::node_removal`]'s passes.
//!
//! A `LogicalVolume` names the node whose agent answers for it (`spec.nodeName`: create, grow,
//! snapshot, delete). A shared class's volume lives on a LUN every node of the class sees, so any
//! of them can answer; when the named node is deleted, or not Ready and tainted
//! `node.kubernetes.io/out-of-service` (non-graceful shutdown: the administrator says it is off),
//! its volumes would otherwise wait for it forever: a claim could not be deleted or grown. The
//! operator then names another node of the class in `spec.nodeName`; its agent picks the volume up.
//! What a dead node still holds stays safe: the volume's lock is its sanlock lease, freed only at
//! the host-dead time, and the new node's `lvremove`/`lvextend` is refused by LVM until then (the
//! agent retries). Nothing moves off a node that is merely not Ready (partitioned, restarting
//! kubelet) or cordoned: its agent may still be serving.
//!
//! The new node is one that joined the class (the `shared.lvms.topolvm.io/<class>: "true"` label
//! kubelet sets from the agent's topology), is Ready and not tainted out of service; among them,
//! the one naming the fewest volumes (counting the moves of this pass), then by name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use lvms_api::{LVMCluster, shared_topology_key, topolvm::LogicalVolume};

use crate::eviction::{NodeState, is_ready, is_tainted_out_of_service, node_state};

/// A volume to move: set `spec.nodeName` of `LogicalVolume` `volume` from `from` to `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    /// The `LogicalVolume`'s name.
    pub volume: String,
    /// Its shared device class.
    pub class: String,
    /// The node it names now.
    pub from: String,
    /// Why that node no longer answers.
    pub why: Why,
    /// The node it will name.
    pub to: String,
}

/// Why a node's volumes move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// What Kubernetes says of it: deleted, or out of service.
    State(NodeState),
    /// Not Ready (or fenced from the class while Ready), and sanlock on another node counts its
    /// lease dead with fencing armed ([`crate::death`]).
    LeaseDead,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::State(s) => s.fmt(f),
            Self::LeaseDead => f.write_str(
                "is not Ready or was fenced from the class, and sanlock on another node counts its \
                 lease dead (fenced)",
            ),
        }
    }
}

/// A volume of a gone node that stays where it is, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stuck {
    /// The `LogicalVolume`'s name.
    pub volume: String,
    /// Its shared device class.
    pub class: String,
    /// The node it names.
    pub from: String,
}

/// What a pass does: the moves, and the volumes of gone nodes no node can take (no Ready node
/// has joined their class).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub moves: Vec<Handover>,
    pub stuck: Vec<Stuck>,
}

/// The shared device classes of `clusters`, and the default class's name (what an empty
/// `spec.deviceClass` means), if there is one.
pub fn shared_classes(clusters: &[LVMCluster]) -> (BTreeSet<String>, Option<String>) {
    let classes = clusters.iter().flat_map(|c| &c.spec.storage.device_classes);
    let mut shared = BTreeSet::new();
    let mut default = None;
    for class in classes {
        if class.is_shared() {
            shared.insert(class.name.clone());
        }
        if class.default {
            default = Some(class.name.clone());
        }
    }
    (shared, default)
}

/// Whether `node` can take over volumes of `class`: it joined the class, is Ready, and is neither
/// tainted out of service (even while Ready) nor being deleted.
fn can_take(node: &Node, class: &str) -> bool {
    let joined = node
        .labels()
        .get(&shared_topology_key(class))
        .is_some_and(|v| v == "true");
    joined
        && is_ready(node)
        && !is_tainted_out_of_service(node)
        && node.metadata.deletion_timestamp.is_none()
}

/// Plans the moves of the shared classes' volumes (`shared`, with `default` for an empty class)
/// named by `volumes` off nodes that are gone or out of service, or dead in the volume's class
/// with fencing armed (`dead`: node and class, from [`crate::death::dead_nodes`]), given every
/// Node of the cluster.
pub fn plan(
    volumes: &[LogicalVolume],
    shared: &BTreeSet<String>,
    default: Option<&str>,
    nodes: &[Node],
    dead: &BTreeSet<(String, String)>,
) -> Plan {
    let by_name: BTreeMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let mut load: BTreeMap<&str, usize> = BTreeMap::new();
    for v in volumes {
        *load.entry(v.spec.node_name.as_str()).or_default() += 1;
    }
    let mut out = Plan::default();
    for v in volumes {
        let class = match v.spec.device_class.as_str() {
            "" => match default {
                Some(d) => d,
                None => continue,
            },
            c => c,
        };
        if !shared.contains(class) {
            continue;
        }
        let from = v.spec.node_name.as_str();
        let why = match node_state(by_name.get(from).copied()) {
            Some(s @ (NodeState::Gone | NodeState::OutOfService)) => Why::State(s),
            _ if dead.contains(&(from.to_owned(), class.to_owned())) => Why::LeaseDead,
            _ => continue,
        };
        let target = by_name
            .values()
            .filter(|n| can_take(n, class))
            .map(|n| n.metadata.name.as_deref().unwrap_or_default())
            .min_by_key(|n| (load.get(n).copied().unwrap_or(0), *n));
        match target {
            Some(to) => {
                *load.entry(to).or_default() += 1;
                out.moves.push(Handover {
                    volume: v.name_any(),
                    class: class.to_owned(),
                    from: from.to_owned(),
                    why,
                    to: to.to_owned(),
                });
            }
            None => out.stuck.push(Stuck {
                volume: v.name_any(),
                class: class.to_owned(),
                from: from.to_owned(),
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests;
