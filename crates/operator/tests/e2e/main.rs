//! End-to-end tests against the cluster in `KUBECONFIG`, run only when `LVMS_E2E=1`:
//!
//! ```text
//! LVMS_E2E=1 KUBECONFIG=~/.kube/config cargo test -p lvms-operator --test e2e -- --nocapture
//! ```
//!
//! They need cluster-admin and a control plane (API server, controller-manager); no kubelet: Nodes
//! are created as plain API objects. Each test works in its own namespace with unique names, so
//! they run concurrently; CRDs are server-side applied and left installed. The webhook test serves
//! the admission webhook in this process on `127.0.0.1` (`LVMS_E2E_WEBHOOK_HOST` names another
//! address the API server can reach) and registers it for its own namespace only.
//!
//! - [`crds`]: the generated CRDs install, the API server enforces their bounds and CEL rules, and
//!   selects `LogicalVolume`s by `spec.nodeName` as the node agents ask;
//! - [`webhook`]: LVMS's sample manifests are admitted, invalid clusters are denied with field
//!   paths, the mutating webhook defaults the discovery policy, update rules apply;
//! - [`operator`]: the LVMCluster controller renders every object, aggregates a hand-written node
//!   status into `LVMCluster.status`, and runs the deletion flow (PVCs and Retain PVs block it, node
//!   cleanup finalizers are awaited);
//! - [`cert_renewal`]: the operator binary renews a one-minute self-signed webhook certificate
//!   under its CA while the API server's admission reviews keep being answered;
//! - [`leader`]: two replicas of the `lvms operator` binary with the operator's RBAC elect one
//!   leader; killed mid-reconcile it is replaced within the Lease's duration and the cluster
//!   finished, stopped it hands over at once;
//! - [`idle`]: an idle minute on the stack has no write from lvms-rs but its Lease renewals;
//! - [`node_removal`]: deleting a Node releases its node status and cleanup finalizers;
//! - [`eviction`]: draining a node deletes the opted-in claim of its evicted StatefulSet pod (not
//!   another driver's, not one on a healthy node) and the StatefulSet makes it anew; an
//!   unschedulable pod whose volume's node is gone gets a new claim;
//! - [`host_ids`]: two sanlock host-id allocators racing on one record never give an id to two
//!   nodes, and deleting a Node releases its id;
//! - [`provisioning`]: the CSI controller and a node agent's LogicalVolume reconciler (over an in-memory
//!   backend, no disks) make, grow, snapshot and remove a volume through LogicalVolume objects;
//! - [`scale`]: the benchmark of `lvms csi-controller` with many simulated nodes and volumes
//!   (`cargo xtask scale`), run small here;
//! - [`shared_lease`]: node agents, with the agent's RBAC, racing for a shared class's creator
//!   Lease end with one holder, and an expired Lease is taken over by exactly one;
//! - [`shared_stack`]: on the stack, the node agent joins a shared device class with real sanlock
//!   and lvmlockd in the VM (host id from the operator, creator Lease), provisions a claim in the
//!   shared volume group, and leaves the class when the LVMCluster is deleted;
//! - [`installed`]: on a cluster where lvms-rs is installed and nodes have a spare disk
//!   (`LVMS_E2E_DEVICE`; skipped otherwise), an LVMCluster becomes Ready and a PVC Bound.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bench;
mod cert_renewal;
mod changed_blocks;
mod cleanup;
mod crds;
mod dead_nodes;
mod eviction;
mod host_ids;
mod idle;
mod installed;
mod installed_shared;
mod leader;
mod node_removal;
mod operator;
mod provisioning;
mod rules;
mod scale;
mod scenarios;
mod shared_lease;
mod shared_stack;
mod stack;
mod support;
mod webhook;
