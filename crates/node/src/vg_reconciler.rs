//! The volume-group reconciler's I/O: for each `LVMVolumeGroup` this node serves, the finalizer, the
//! node engine ([`lvms_host::engine::converge`]), the node's `LVMVolumeGroupNodeStatus`, the set of
//! classes the CSI backend serves, and the node-local cleanup when the object is deleted.
//!
//! - The node's status object (named after the node, in the objects' namespace) is server-side applied
//!   whole, with field manager [`FIELD_MANAGER`], holding one entry per class this node serves, and
//!   carries [`NODE_STATUS_FINALIZER`] so the operator can tell a node that went away.
//! - Cleanup removes the thin pool, the volume group (only one tagged as ours) and the physical-volume
//!   labels, and only when no other logical volume remains in the group; otherwise the class stays
//!   `Failed` with the volumes to remove by hand, and the finalizer stays.
//! - `forceWipeDevicesAndDestroyAllData` wipes a device once: the wipe is recorded in the class's
//!   `wipedDevices` on the node status object *before* it happens (no record, no wipe), and a recorded
//!   device that holds a signature again is excluded instead of wiped a second time.
//! - A RAID class reports `raidStatus` (see [`volume_group::raid_status`]) and is looked at again
//!   every [`DYNAMIC_REQUEUE`], so a lost disk shows within a minute.
//! - Static discovery converges on start and on spec changes; Dynamic converges again every
//!   [`DYNAMIC_REQUEUE`], so disks added later are picked up.
//! - A shared class (ADR 0016) converges through [`lvms_host::shared::converge`] over the host's
//!   `sanlock` and `lvmlockd`, with the host id the operator recorded for this node in ConfigMap
//!   [`SANLOCK_HOST_IDS_CONFIGMAP`] (read at every reconcile, and watched so an assignment is acted
//!   on at once; no entry: `Progressing`, never a made-up id). Only the holder of the class's
//!   creator Lease ([`crate::creator_lease`]) may run `vgcreate --shared`; the others wait for the
//!   group and then join its lockspace. It is served once joined, looked at again every
//!   [`SHARED_WAIT`] while it waits and every [`DYNAMIC_REQUEUE`] once joined (a lockspace lost
//!   with a restarted `lvmlockd` is joined again). Deleting it stops serving it and leaves the
//!   volume group and the lockspace alone (docs/known-limitations.md).
//! - [`Context::settling`] says which shared classes this node is still joining (seeded at start
//!   from the `LVMVolumeGroups` that select the node, then following each class's status), so
//!   `NodeGetInfo` can wait for them ([`crate::switch::Switch::with_settling`]): kubelet reads a
//!   driver's topology once, when it registers.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{Controller, controller::Action, reflector::ObjectRef, watcher},
};
use lvms_api::{
    DeviceDiscoveryPolicy, LVMVolumeGroup, LVMVolumeGroupNodeStatus, LVMVolumeGroupNodeStatusSpec,
    NODE_STATUS_FINALIZER, SANLOCK_HOST_IDS_CONFIGMAP, VGStatus, VGStatusType,
};
use lvms_core::{
    config::{Claims, DeviceClassConfig, SharedConfig, SharedNodeConfig},
    leave::{LeaveState, LocalStep, LocalVg},
    plan::{Action as HostAction, Observed},
    shared,
};
use lvms_engine::backend::Backend;
use lvms_host::{
    class::{Converged, Hosts},
    engine::{ConvergeReport, LocalLeaveHost, NodeHost, RealNodeHost},
    runner::Runner,
    shared::{RealSharedHost, SharedHost, SharedLeaveHost, SharedReport},
};
use tokio::sync::{Mutex, watch};
use tracing::{info, instrument, warn};

use crate::{
    creator_lease::{CreatorLease, Holding, creator_lease},
    finalizers,
    volume_group::{self, Step, vg_status},
};

/// Field manager of everything the node agent applies.
pub const FIELD_MANAGER: &str = "lvms-node";
/// A class that is not ready (or not cleaned up) is looked at again after this long.
pub const RETRY: Duration = Duration::from_secs(30);
/// Dynamic discovery runs this often.
pub const DYNAMIC_REQUEUE: Duration = Duration::from_secs(60);
/// A shared class that waits (for its host id, the creator, the lockspace) is looked at again after
/// this long.
pub const SHARED_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("encoding the node status: {0}")]
    Encode(String),
    #[error("{action}: {source}")]
    Host {
        action: String,
        #[source]
        source: lvms_host::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

fn host_err(action: impl Into<String>) -> impl FnOnce(lvms_host::Error) -> Error {
    let action = action.into();
    move |source| Error::Host { action, source }
}

/// Makes the CSI backend for a set of classes.
pub type MakeBackend<B> = Box<dyn Fn(Vec<DeviceClassConfig>) -> B + Send + Sync>;

/// What the reconciler works with, and what it remembers between objects.
pub struct Context<R, B> {
    pub client: Client,
    pub node: String,
    /// Namespace of the `LVMVolumeGroup`s and of this node's status object.
    pub namespace: String,
    pub host: RealNodeHost<R>,
    /// The machine's side of shared classes (`sanlock`, `lvmlockd`, the classes' devices files).
    pub shared_host: RealSharedHost<R>,
    make_backend: MakeBackend<B>,
    /// Events on the `LVMVolumeGroup`s (a shared class joined again after a fence).
    recorder: kube::runtime::events::Recorder,
    backend: watch::Sender<Option<Arc<B>>>,
    /// The shared classes this node is still joining; `None` until [`Context::seed_settling`].
    settling: watch::Sender<Option<BTreeSet<String>>>,
    state: Mutex<State>,
    /// RAID health on `/metrics` ([`Context::with_metrics`]).
    metrics: Option<lvms_k8s::metrics::StorageMetrics>,
}

#[derive(Default)]
struct State {
    statuses: BTreeMap<String, VGStatus>,
    ready: BTreeMap<String, DeviceClassConfig>,
}

impl<R: Runner, B: Backend> Context<R, B> {
    pub fn new(
        client: Client,
        node: impl Into<String>,
        namespace: impl Into<String>,
        host: RealNodeHost<R>,
        shared_host: RealSharedHost<R>,
        make_backend: MakeBackend<B>,
    ) -> Self {
        Self {
            recorder: lvms_k8s::reconciler::recorder(client.clone(), "lvms-node"),
            client,
            node: node.into(),
            namespace: namespace.into(),
            host,
            shared_host,
            make_backend,
            backend: watch::channel(None).0,
            settling: watch::channel(None).0,
            state: Mutex::new(State::default()),
            metrics: None,
        }
    }

    /// Sets each RAID class's health on `metrics` (`lvms_raid_*`) as it is reported.
    pub fn with_metrics(mut self, metrics: lvms_k8s::metrics::StorageMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The backend over the ready classes, as it changes (for the LogicalVolume reconciler and the CSI
    /// services).
    pub fn backend(&self) -> watch::Receiver<Option<Arc<B>>> {
        self.backend.subscribe()
    }

    /// The shared classes this node is still joining (status `Progressing`), as that changes;
    /// `None` until the reconciler has looked at the `LVMVolumeGroups` once.
    pub fn settling(&self) -> watch::Receiver<Option<BTreeSet<String>>> {
        self.settling.subscribe()
    }

    /// Starts [`Self::settling`] from the shared classes whose `LVMVolumeGroup` selects this node
    /// (each until its first status); when they cannot be read, from none, so nothing waits on them.
    pub async fn seed_settling(&self) {
        let joining = async {
            let node = Api::<Node>::all(self.client.clone())
                .get(&self.node)
                .await
                .map_err(kube_err(format!("read Node {}", self.node)))?;
            let vgs = Api::<LVMVolumeGroup>::namespaced(self.client.clone(), &self.namespace)
                .list(&Default::default())
                .await
                .map_err(kube_err("list LVMVolumeGroups"))?;
            Ok::<_, Error>(
                vgs.items
                    .iter()
                    .filter(|vg| {
                        vg.spec.is_shared()
                            && vg.metadata.deletion_timestamp.is_none()
                            && volume_group::selects(vg, &node)
                    })
                    .map(ResourceExt::name_any)
                    .collect::<BTreeSet<_>>(),
            )
        };
        let joining = joining.await.unwrap_or_else(|e| {
            warn!(error = %e, "cannot tell which shared classes this node joins: NodeGetInfo waits for none");
            BTreeSet::new()
        });
        self.settling.send_replace(Some(joining));
    }

    /// Records `status` for its class (`None`: the class is gone from this node), marks the class
    /// ready or not, and publishes what changed.
    async fn record(
        &self,
        class: &str,
        status: Option<VGStatus>,
        ready: Option<DeviceClassConfig>,
    ) -> Result<()> {
        let mut st = self.state.lock().await;
        // The wipe record outlives every status the class goes through on this node.
        let status = status.map(|mut s| {
            let before = st.statuses.get(class).map(|p| p.wiped_devices.clone());
            s.wiped_devices = before
                .into_iter()
                .flatten()
                .chain(std::mem::take(&mut s.wiped_devices))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            s
        });
        let joining = status
            .as_ref()
            .is_some_and(|s| s.shared.is_some() && s.status == Some(VGStatusType::Progressing));
        self.settling.send_if_modified(|settling| match settling {
            Some(pending) if joining => pending.insert(class.to_owned()),
            Some(pending) => pending.remove(class),
            None => false,
        });
        let status_changed = st.statuses.get(class) != status.as_ref();
        match status {
            Some(s) => st.statuses.insert(class.to_owned(), s),
            None => st.statuses.remove(class),
        };
        let classes_changed = st.ready.get(class) != ready.as_ref();
        match ready {
            Some(c) => st.ready.insert(class.to_owned(), c),
            None => st.ready.remove(class),
        };
        if classes_changed {
            let classes: Vec<DeviceClassConfig> = st.ready.values().cloned().collect();
            info!(classes = ?classes.iter().map(|c| &c.name).collect::<Vec<_>>(), "serving classes");
            let backend = (!classes.is_empty()).then(|| Arc::new((self.make_backend)(classes)));
            self.backend.send_replace(backend);
        }
        if status_changed {
            self.apply_node_status(&st.statuses).await?;
        }
        Ok(())
    }

    /// Whether `class` has a status on this node (recorded, or loaded from the node's status object).
    async fn has_status(&self, class: &str) -> bool {
        self.state.lock().await.statuses.contains_key(class)
    }

    /// The devices force-wipe wiped for `class` on this node.
    async fn wiped(&self, class: &str) -> BTreeSet<String> {
        let st = self.state.lock().await;
        st.statuses
            .get(class)
            .map(|s| s.wiped_devices.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records that `device` is about to be wiped for `class`, on the API server; only once that
    /// succeeded may the wipe run.
    async fn record_wipe(&self, class: &str, device: &str) -> Result<()> {
        let mut st = self.state.lock().await;
        // Changed in a copy, kept only once the API server has it.
        let mut statuses = st.statuses.clone();
        let entry = statuses
            .entry(class.to_owned())
            .or_insert_with(|| VGStatus {
                name: class.to_owned(),
                status: Some(VGStatusType::Progressing),
                ..VGStatus::default()
            });
        if entry.wiped_devices.iter().any(|d| d == device) {
            return Ok(());
        }
        entry.wiped_devices.push(device.to_owned());
        entry.wiped_devices.sort();
        self.apply_node_status(&statuses).await?;
        st.statuses = statuses;
        Ok(())
    }

    /// This node's sanlock host id as the operator recorded it, or why there is none yet.
    async fn host_id(&self) -> Result<Result<u16, String>> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let record = api
            .get_opt(SANLOCK_HOST_IDS_CONFIGMAP)
            .await
            .map_err(kube_err(format!(
                "read ConfigMap {SANLOCK_HOST_IDS_CONFIGMAP}"
            )))?;
        Ok(volume_group::assigned_host_id(
            record.as_ref().and_then(|c| c.data.as_ref()),
            &self.node,
            &self.namespace,
        ))
    }

    /// Starts from the entries this node's status object holds (a restarted agent keeps reporting
    /// every class while it converges them one by one, instead of dropping the others).
    pub async fn load_node_status(&self) -> Result<()> {
        let api: Api<LVMVolumeGroupNodeStatus> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let found = api.get_opt(&self.node).await.map_err(kube_err(format!(
            "read LVMVolumeGroupNodeStatus {}",
            self.node
        )))?;
        let mut st = self.state.lock().await;
        for entry in found.into_iter().flat_map(|s| s.spec.lvm_vg_status) {
            st.statuses.entry(entry.name.clone()).or_insert(entry);
        }
        Ok(())
    }

    /// Writes this node's status object whole; once the node serves no class, deletes it instead
    /// (its finalizer first), so nothing of the node stays behind when the `LVMCluster` goes.
    async fn apply_node_status(&self, statuses: &BTreeMap<String, VGStatus>) -> Result<()> {
        let api: Api<LVMVolumeGroupNodeStatus> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let last_class_gone = statuses.is_empty();
        let mut obj = LVMVolumeGroupNodeStatus::new(
            &self.node,
            LVMVolumeGroupNodeStatusSpec {
                lvm_vg_status: statuses.values().cloned().collect(),
            },
        );
        obj.metadata.namespace = Some(self.namespace.clone());
        obj.metadata.finalizers = Some(if last_class_gone {
            Vec::new()
        } else {
            vec![NODE_STATUS_FINALIZER.to_owned()]
        });
        // The lists are sent even when empty (the type leaves empty ones out): a node that serves no
        // class any more says so explicitly, and gives up its finalizer.
        let mut body = serde_json::to_value(&obj).map_err(|e| Error::Encode(e.to_string()))?;
        body["spec"]["nodeStatus"] = serde_json::to_value(&obj.spec.lvm_vg_status)
            .map_err(|e| Error::Encode(e.to_string()))?;
        body["metadata"]["finalizers"] = serde_json::to_value(&obj.metadata.finalizers)
            .map_err(|e| Error::Encode(e.to_string()))?;
        api.patch(
            &self.node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(kube_err(format!(
            "apply LVMVolumeGroupNodeStatus {}",
            self.node
        )))?;
        if last_class_gone {
            match api.delete(&self.node, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => {
                    return Err(kube_err(format!(
                        "delete LVMVolumeGroupNodeStatus {}",
                        self.node
                    ))(e));
                }
            }
        }
        Ok(())
    }
}

/// Runs the reconciler until the watch ends.
pub async fn run<R: Runner, B: Backend>(ctx: Arc<Context<R, B>>) {
    if let Err(e) = ctx.load_node_status().await {
        warn!(error = %e, "cannot read this node's status object; it is rewritten as classes converge");
    }
    ctx.seed_settling().await;
    let api: Api<LVMVolumeGroup> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let controller = Controller::new(api, watcher::Config::default().any_semantic());
    // A change of this Node's labels can change which LVMVolumeGroups select it: look at all of them
    // again, on label changes only (the mapper drops every other Node update, such as status).
    let store = controller.store();
    let last_labels = std::sync::Mutex::new(None::<BTreeMap<String, String>>);
    // A host id assigned (or changed) for this node: look at the shared classes again at once.
    let shared_store = controller.store();
    let last_entry = std::sync::Mutex::new(None::<Option<String>>);
    let me = ctx.node.clone();
    let controller = controller.watches(
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.namespace),
        watcher::Config::default().fields(&format!("metadata.name={SANLOCK_HOST_IDS_CONFIGMAP}")),
        move |record: ConfigMap| {
            if !host_id_entry_changed(&last_entry, &record, &me) {
                return Vec::new();
            }
            shared_store
                .state()
                .iter()
                .filter(|vg| vg.spec.is_shared())
                .map(|vg| ObjectRef::from_obj(vg.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    let controller = controller.watches(
        Api::<Node>::all(ctx.client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", ctx.node)),
        move |node: Node| {
            if !labels_changed(&last_labels, &node) {
                return Vec::new();
            }
            store
                .state()
                .iter()
                .map(|vg| ObjectRef::from_obj(vg.as_ref()))
                .collect::<Vec<_>>()
        },
    );
    lvms_k8s::reconciler::drive(controller, "LVMVolumeGroup", reconcile, error_policy, ctx).await;
}

/// Whether `node`'s labels differ from those `last` remembers (the first look counts as a change);
/// remembers them.
fn labels_changed(last: &std::sync::Mutex<Option<BTreeMap<String, String>>>, node: &Node) -> bool {
    let labels = node.labels();
    let mut last = last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.as_ref() == Some(labels) {
        return false;
    }
    *last = Some(labels.clone());
    true
}

/// Whether `node`'s entry in the host-id record differs from the one `last` remembers (the first
/// look counts as a change); remembers it.
fn host_id_entry_changed(
    last: &std::sync::Mutex<Option<Option<String>>>,
    record: &ConfigMap,
    node: &str,
) -> bool {
    let entry = record.data.as_ref().and_then(|d| d.get(node)).cloned();
    let mut last = last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if last.as_ref() == Some(&entry) {
        return false;
    }
    *last = Some(entry);
    true
}

pub fn error_policy<R, B>(
    vg: Arc<LVMVolumeGroup>,
    error: &Error,
    _ctx: Arc<Context<R, B>>,
) -> Action {
    warn!(volume_group = %vg.name_any(), error = %error, "will retry");
    Action::requeue(RETRY)
}

/// Takes one `LVMVolumeGroup` as far as it goes now on this node.
#[instrument(skip_all, fields(device_class = %vg.name_any(), node = %ctx.node))]
pub async fn reconcile<R: Runner, B: Backend>(
    vg: Arc<LVMVolumeGroup>,
    ctx: Arc<Context<R, B>>,
) -> Result<Action> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let node = nodes
        .get(&ctx.node)
        .await
        .map_err(kube_err(format!("read Node {}", ctx.node)))?;
    let api: Api<LVMVolumeGroup> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let class = vg.name_any();
    let mut vg = (*vg).clone();
    let mut step = volume_group::plan(&vg, &node);
    if step == Step::AddFinalizer {
        let ours = lvms_api::node_cleanup_finalizer(&ctx.node);
        vg = finalizers::set(&api, &vg, finalizers::with(&vg, &ours))
            .await
            .map_err(kube_err(format!("add {ours} to LVMVolumeGroup {class}")))?;
        step = volume_group::plan(&vg, &node);
    }
    match step {
        Step::Ignore | Step::AddFinalizer => {
            ctx.record(&class, None, None).await?;
            Ok(Action::await_change())
        }
        Step::Report(status) => {
            warn!(reason = %status.reason, "cannot serve this device class");
            ctx.record(&class, Some(status), None).await?;
            Ok(Action::await_change())
        }
        Step::Converge(config) => {
            converge(&ctx, &ctx.host, &ctx.shared_host, &api, &vg, &node, &config).await
        }
        Step::Cleanup => leave(&ctx, &ctx.shared_host, &api, &vg).await,
    }
}

/// Takes class `vg` as far as it goes now on this node, through the engine of its kind
/// ([`lvms_host::class::converge`]) over `local` or `shared`, and reports it (see the module
/// documentation).
async fn converge<R: Runner, B: Backend, L: NodeHost, S: SharedHost>(
    ctx: &Context<R, B>,
    local: &L,
    shared: &S,
    api: &Api<LVMVolumeGroup>,
    vg: &LVMVolumeGroup,
    node: &Node,
    config: &DeviceClassConfig,
) -> Result<Action> {
    let class = vg.name_any();
    // A class that discovers or matches devices must not take those the other classes list or
    // match.
    let others = if lvms_core::plan::takes_unlisted(config) {
        let all = api
            .list(&Default::default())
            .await
            .map_err(kube_err("list LVMVolumeGroups"))?;
        volume_group::claims_of_others(&all.items, &class, node)
    } else {
        Claims::default()
    };
    // A shared class joins with this node's sanlock host id (`Err`: why there is none).
    let host_id = match config.shared() {
        Some(settings) => Some(joining(ctx, &class, settings).await?),
        None => None,
    };
    // The creator is whoever holds the Lease, decided per observation (`CreatorHost`), never this
    // flag.
    let node_config = host_id
        .as_ref()
        .and_then(|id| id.as_ref().ok())
        .map(|id| SharedNodeConfig {
            host_id: *id,
            create_volume_groups: false,
        });
    let lease = creator_lease(ctx.client.clone(), &ctx.namespace, &class, &ctx.node);
    let hosts = Hosts {
        local: ClassHost {
            inner: local,
            ctx,
            class: &class,
        },
        shared: CreatorHost {
            inner: shared,
            lease: &lease,
            note: std::sync::Mutex::new(None),
        },
    };
    let report =
        match lvms_host::class::converge(&hosts, config, &others, node_config.as_ref()).await {
            Ok(report) => report,
            Err(e) => {
                let reason = e.to_string();
                let status = VGStatus {
                    name: class.clone(),
                    status: Some(VGStatusType::Failed),
                    reason: reason.clone(),
                    shared: config.shared().map(|s| {
                        Box::new(lvms_api::SharedVGStatus {
                            host_id: node_config.map(|n| i32::from(n.host_id)),
                            io_timeout_seconds: Some(i32::from(s.io_timeout_seconds)),
                            reason,
                            ..lvms_api::SharedVGStatus::default()
                        })
                    }),
                    ..VGStatus::default()
                };
                ctx.record(&class, Some(status), None).await?;
                return Err(host_err(format!("converge {class}"))(e));
            }
        };
    let (status, requeue) = match &report {
        Converged::Local(report) => local_outcome(vg, config, report),
        Converged::Shared(report) => {
            let creator = hosts.shared.note();
            let no_host_id = host_id
                .as_ref()
                .and_then(|id| id.as_ref().err())
                .map(String::as_str);
            shared_outcome(vg, config, report, no_host_id, creator.as_deref())
        }
    };
    if let Converged::Shared(report) = &report
        && !report.rejoined.is_empty()
    {
        rejoined_event(ctx, vg, &report.rejoined).await;
    }
    if let Some(metrics) = &ctx.metrics {
        metrics.record_raid(
            &ctx.node,
            &class,
            status.raid_status.as_ref().map(raid_numbers),
        );
    }
    let ready = report.is_ready().then(|| config.clone());
    ctx.record(&class, Some(status), ready).await?;
    Ok(requeue)
}

fn raid_numbers(raid: &lvms_api::RaidStatus) -> lvms_k8s::metrics::RaidNumbers {
    lvms_k8s::metrics::RaidNumbers {
        health: match raid.status {
            lvms_api::RaidHealth::Healthy => 0,
            lvms_api::RaidHealth::Degraded => 1,
            lvms_api::RaidHealth::Failed => 2,
        },
        degraded_members: u32::try_from(raid.degraded_member_count).unwrap_or(0),
        min_sync_percent: raid.min_sync_percent,
    }
}

/// An Event on `vg` saying this node, fenced from the shared class, joined it again by itself
/// (the steps it took are in the converge report and the log).
async fn rejoined_event<R: Runner, B: Backend>(
    ctx: &Context<R, B>,
    vg: &LVMVolumeGroup,
    steps: &[lvms_core::shared::rejoin::RejoinStep],
) {
    use kube::runtime::events::{Event, EventType};
    let note = format!(
        "node {} had been fenced from shared class {} (it lost its sanlock leases) and joined it \
         again by itself once nothing of the class was open and its LUN could be read: {} steps \
         ({steps:?})",
        ctx.node,
        vg.name_any(),
        steps.len()
    );
    info!(node = %ctx.node, "{note}");
    let ev = Event {
        type_: EventType::Normal,
        reason: "Rejoined".to_owned(),
        note: Some(note),
        action: "Rejoin".to_owned(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &vg.object_ref(&())).await {
        warn!(error = %e, "publishing the rejoin event failed");
    }
}

/// This node's sanlock host id for shared class `class` (`Err`: why there is none). A class new
/// to this node says it is joining before the join runs (lock-start can take minutes), so its
/// status shows it and `NodeGetInfo` waits for it (`Context::settling`).
async fn joining<R: Runner, B: Backend>(
    ctx: &Context<R, B>,
    class: &str,
    settings: &SharedConfig,
) -> Result<std::result::Result<u16, String>> {
    let host_id = ctx.host_id().await?;
    if let (Ok(id), false) = (&host_id, ctx.has_status(class).await) {
        let reason = format!("joining shared volume group {class}");
        let status = VGStatus {
            name: class.to_owned(),
            status: Some(VGStatusType::Progressing),
            reason: reason.clone(),
            shared: Some(Box::new(lvms_api::SharedVGStatus {
                lockspace: lvms_api::LockspaceState::Joining,
                host_id: Some(i32::from(*id)),
                io_timeout_seconds: Some(i32::from(settings.io_timeout_seconds)),
                reason,
                ..lvms_api::SharedVGStatus::default()
            })),
            ..VGStatus::default()
        };
        ctx.record(class, Some(status), None).await?;
    }
    Ok(host_id)
}

/// A node-local class's status after converging, and when to look again: RAID health as often as
/// `Dynamic` discovery runs.
fn local_outcome(
    vg: &LVMVolumeGroup,
    config: &DeviceClassConfig,
    report: &ConvergeReport,
) -> (VGStatus, Action) {
    let mut status = vg_status(vg, &report.plan);
    status.foreign_volumes = report.foreign_volumes.clone();
    let raid = config.raid_config.is_some() && report.volume_group.is_some();
    if raid {
        status.raid_status = Some(volume_group::raid_status(
            &report.logical_volumes,
            &report.physical_volumes,
        ));
    }
    let ready = report.is_ready();
    let requeue = match (ready, vg.spec.device_discovery_policy) {
        (false, _) => Action::requeue(RETRY),
        (true, Some(DeviceDiscoveryPolicy::Dynamic)) => Action::requeue(DYNAMIC_REQUEUE),
        (true, _) if raid => Action::requeue(DYNAMIC_REQUEUE),
        (true, _) => Action::await_change(),
    };
    if !report.executed.is_empty() {
        info!(actions = report.executed.len(), ready, "converged");
    }
    (status, requeue)
}

/// A shared class's status after converging (`no_host_id`: why this node has no sanlock host id;
/// `creator`: who holds the creator Lease, when this node wanted it), and when to look again.
fn shared_outcome(
    vg: &LVMVolumeGroup,
    config: &DeviceClassConfig,
    report: &SharedReport,
    no_host_id: Option<&str>,
    creator: Option<&str>,
) -> (VGStatus, Action) {
    let status = volume_group::shared_vg_status(vg, config, report, no_host_id, creator);
    let watching = report
        .fencing
        .as_ref()
        .is_some_and(|f| !f.silent_host_ids.is_empty());
    let requeue = match &report.plan.state {
        // A host stopped renewing: report its death soon after sanlock counts it (the operator
        // acts on it, ADR 0029).
        shared::State::Joined if watching => Action::requeue(SHARED_WAIT),
        shared::State::Joined => Action::requeue(DYNAMIC_REQUEUE),
        shared::State::Waiting { .. } => Action::requeue(SHARED_WAIT),
        shared::State::Failed { .. } => Action::requeue(RETRY),
    };
    if report.is_joined() {
        if !report.executed.is_empty() {
            info!(actions = report.executed.len(), host_id = ?report.host_id, "joined the shared volume group");
        }
    } else {
        warn!(reason = %status.reason, "shared device class not joined");
    }
    (status, requeue)
}

/// The shared-class engine's host for one class on this node: an observation whose next step would
/// be `vgcreate --shared` asks for the class's creator Lease, and only while this node holds it may
/// the plan create (`may_create`). The Lease is created or renewed as the observation's last step,
/// so right before the plan runs `vgcreate`; see [`crate::creator_lease`].
struct CreatorHost<'a, H> {
    inner: &'a H,
    lease: &'a CreatorLease,
    /// Who holds the Lease, when the last observation wanted it and did not get it.
    note: std::sync::Mutex<Option<String>>,
}

impl<H> CreatorHost<'_, H> {
    fn note(&self) -> Option<String> {
        self.note
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl<H: SharedHost> SharedHost for CreatorHost<'_, H> {
    async fn observe(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> lvms_host::Result<shared::Observed> {
        let mut observed = self.inner.observe(class, node).await?;
        observed.may_create = false;
        let mut note = None;
        if volume_group::needs_creator(class, &observed) {
            let name = self.lease.name();
            match self.lease.try_hold().await {
                Ok(Holding::Held) => {
                    info!(lease = %name, "holding the creator Lease");
                    observed.may_create = true;
                }
                Ok(Holding::Other { holder, expires }) => {
                    note = Some(format!(
                        "node {holder} holds the creator Lease {name} until {expires}"
                    ));
                }
                Ok(Holding::Contended) => {
                    note = Some(format!(
                        "the creator Lease {name} changed under every attempt to take it"
                    ));
                }
                Err(e) => {
                    warn!(lease = %name, error = %e, "cannot take the creator Lease");
                    note = Some(format!("cannot take the creator Lease {name}: {e}"));
                }
            }
        }
        *self
            .note
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = note;
        Ok(observed)
    }

    async fn execute(&self, action: &shared::Action) -> lvms_host::Result<()> {
        self.inner.execute(action).await
    }

    async fn pause(&self, d: Duration) {
        self.inner.pause(d).await;
    }

    async fn install_fence_hook(&self) -> Option<lvms_host::fence::install::Installed> {
        self.inner.install_fence_hook().await
    }
    async fn observe_fencing(&self, vg: &str) -> Option<lvms_host::sanlock::FencingSeen> {
        self.inner.observe_fencing(vg).await
    }

    async fn is_fenced(&self, vg: &str) -> bool {
        self.inner.is_fenced(vg).await
    }

    async fn observe_fenced(
        &self,
        class: &DeviceClassConfig,
    ) -> Option<lvms_core::shared::rejoin::FencedSeen> {
        self.inner.observe_fenced(class).await
    }

    async fn execute_rejoin(
        &self,
        step: &lvms_core::shared::rejoin::RejoinStep,
    ) -> lvms_host::Result<()> {
        self.inner.execute_rejoin(step).await
    }
}

/// Leaving: the remover is whoever holds the creator Lease, asked only once the group this node
/// sees holds nothing that keeps it (so a class whose volumes are still being deleted holds no
/// Lease), or once it is gone and its labels remain.
impl<H: SharedLeaveHost> SharedLeaveHost for CreatorHost<'_, H> {
    async fn observe_leave(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> lvms_host::Result<shared::leave::LeaveObserved> {
        let mut observed = self.inner.observe_leave(class, node).await?;
        observed.remover = false;
        let removable = match &observed.vg {
            Some(_) => shared::leave::remaining(&observed.lvs).is_empty(),
            None => !observed.orphan_pvs.is_empty(),
        };
        if removable {
            let name = self.lease.name();
            match self.lease.try_hold().await {
                Ok(Holding::Held) => observed.remover = true,
                Ok(Holding::Other { holder, .. }) => {
                    info!(lease = %name, %holder, "another node removes the group");
                }
                Ok(Holding::Contended) => {
                    observed.undecided = Some(format!(
                        "the creator Lease {name} changed under every attempt to take it"
                    ));
                }
                Err(e) => {
                    warn!(lease = %name, error = %e, "cannot take the creator Lease");
                    observed.undecided = Some(format!("cannot take the creator Lease {name}: {e}"));
                }
            }
        }
        Ok(observed)
    }

    async fn execute_leave(&self, action: &shared::leave::LeaveAction) -> lvms_host::Result<()> {
        self.inner.execute_leave(action).await
    }
}

/// The class leaves this node ([`lvms_host::class::leave`]), then its finalizer goes. A node-local
/// class: its volume group (tagged ours) and the labels of its devices are removed once it holds
/// nothing but its thin pool; this node stops serving the class before the first removal
/// ([`ServingHost`]). A shared class: the lockspace stops here, and the holder of the class's
/// creator Lease, once the group holds no volume, removes the group after every other node has
/// left ([`lvms_core::shared::leave`]). While volumes remain the class stays served (their claims
/// can still be deleted) and the status says `ManualCleanupRequired`, naming them.
async fn leave<R: Runner, B: Backend, H: SharedLeaveHost>(
    ctx: &Context<R, B>,
    shared_host: &H,
    api: &Api<LVMVolumeGroup>,
    vg: &LVMVolumeGroup,
) -> Result<Action> {
    let class = vg.name_any();
    let config = match volume_group::device_class_config(vg) {
        Ok(config) => config,
        Err(reason) => {
            // Nothing was ever made from a spec the engine cannot read.
            warn!(%reason, "class removed with a spec that does not convert; leaving it");
            release(ctx, api, vg, &class).await?;
            return Ok(Action::await_change());
        }
    };
    let node_config = match config.shared() {
        Some(_) => ctx.host_id().await?.ok().map(|id| SharedNodeConfig {
            host_id: id,
            create_volume_groups: false,
        }),
        None => None,
    };
    let lease = creator_lease(ctx.client.clone(), &ctx.namespace, &class, &ctx.node);
    let hosts = Hosts {
        local: ServingHost {
            inner: &ctx.host,
            ctx,
            class: &class,
        },
        shared: CreatorHost {
            inner: shared_host,
            lease: &lease,
            note: std::sync::Mutex::new(None),
        },
    };
    let left = lvms_host::class::leave(&hosts, &config, node_config.as_ref())
        .await
        .map_err(host_err(format!("leave device class {class}")))?;
    let (status, reason, ready, requeue) = match left.state() {
        LeaveState::Left => {
            release(ctx, api, vg, &class).await?;
            info!(actions = left.executed(), "device class left this node");
            return Ok(Action::await_change());
        }
        // Still served (a restarted agent too): the remaining volumes can be deleted through
        // their claims.
        LeaveState::Refused { reason } => (
            VGStatusType::Failed,
            reason.clone(),
            Some(config.clone()),
            RETRY,
        ),
        LeaveState::Waiting { reason } => {
            (VGStatusType::Progressing, reason.clone(), None, SHARED_WAIT)
        }
        LeaveState::Failed { reason } => (VGStatusType::Failed, reason.clone(), None, RETRY),
    };
    warn!(%reason, "device class not left yet");
    let status = VGStatus {
        name: class.clone(),
        status: Some(status),
        reason: reason.clone(),
        shared: config.shared().map(|_| {
            Box::new(lvms_api::SharedVGStatus {
                host_id: node_config.map(|n| i32::from(n.host_id)),
                reason,
                ..lvms_api::SharedVGStatus::default()
            })
        }),
        ..VGStatus::default()
    };
    ctx.record(&class, Some(status), ready).await?;
    Ok(Action::requeue(requeue))
}

/// The local engine's host while a class leaves: before the first removal this node stops serving
/// the class (its status kept), so no volume is made in a group being removed.
struct ServingHost<'a, H, R, B> {
    inner: &'a H,
    ctx: &'a Context<R, B>,
    class: &'a str,
}

impl<H: LocalLeaveHost, R: Runner, B: Backend> LocalLeaveHost for ServingHost<'_, H, R, B> {
    async fn observe_leave(&self, class: &str) -> lvms_host::Result<Option<LocalVg>> {
        self.inner.observe_leave(class).await
    }

    async fn execute_leave(&self, step: &LocalStep) -> lvms_host::Result<()> {
        let current = self
            .ctx
            .state
            .lock()
            .await
            .statuses
            .get(self.class)
            .cloned();
        self.ctx
            .record(self.class, current, None)
            .await
            .map_err(|e| lvms_host::Error::NotPrepared {
                step: format!("{step:?}"),
                reason: format!("could not stop serving device class {}: {e}", self.class),
            })?;
        self.inner.execute_leave(step).await
    }
}

/// The node engine's host for one class: observations carry the class's wipe record, and a wipe
/// runs only after it was recorded.
struct ClassHost<'a, H, R, B> {
    inner: &'a H,
    ctx: &'a Context<R, B>,
    class: &'a str,
}

impl<H: NodeHost, R: Runner, B: Backend> NodeHost for ClassHost<'_, H, R, B> {
    async fn observe(&self, paths: &[String]) -> lvms_host::Result<Observed> {
        let mut observed = self.inner.observe(paths).await?;
        observed.wiped = self.ctx.wiped(self.class).await;
        Ok(observed)
    }

    async fn execute(&self, action: &HostAction) -> lvms_host::Result<()> {
        if let HostAction::WipeDevice { path } = action {
            self.ctx.record_wipe(self.class, path).await.map_err(|e| {
                lvms_host::Error::WipeNotRecorded {
                    device: path.clone(),
                    reason: e.to_string(),
                }
            })?;
            info!(device = %path, "wipe recorded; wiping");
        }
        self.inner.execute(action).await
    }
}

/// Forgets `class` in this node's status and removes this node's cleanup finalizer from `vg`.
async fn release<R: Runner, B: Backend>(
    ctx: &Context<R, B>,
    api: &Api<LVMVolumeGroup>,
    vg: &LVMVolumeGroup,
    class: &str,
) -> Result<()> {
    ctx.record(class, None, None).await?;
    let ours = lvms_api::node_cleanup_finalizer(&ctx.node);
    finalizers::set(api, vg, finalizers::without(vg, &ours))
        .await
        .map_err(kube_err(format!(
            "remove {ours} from LVMVolumeGroup {class}"
        )))?;
    Ok(())
}

#[cfg(test)]
mod tests;
