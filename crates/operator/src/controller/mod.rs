//! The `LVMCluster` reconciler: the I/O half. It reads the cluster, calls the pure planners
//! ([`crate::render()`], [`crate::status::aggregate`], [`crate::finalizer::cluster_deletion`]) and
//! executes what they decide, nothing more:
//!
//! - not being deleted: add the `lvmcluster.topolvm.io` finalizer (JSON merge patch with the
//!   observed `resourceVersion` as precondition), discover the snapshot API and an existing default
//!   StorageClass, render, server-side apply every object (field manager
//!   [`OPERATOR_FIELD_MANAGER`], forced), delete the `LVMVolumeGroup`s and StorageClasses of classes
//!   no longer in the spec, when a class is shared assign sanlock host ids ([`crate::host_ids`]:
//!   read, decide, update with the read `resourceVersion` or create, never apply), then aggregate
//!   and server-side apply `status`;
//! - being deleted: count what still needs the storage, and follow the [`DeletionPlan`].
//!
//! Every step is idempotent: apply is declarative, deletes treat "not found" as done.
//!
//! Beside it: [`node_removal`] releases what deleted nodes leave behind, and [`eviction`] (off by
//! default) deletes the claims of StatefulSet pods evicted from drained or gone nodes.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Debug,
    future::Future,
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim},
        storage::v1::{CSIDriver, CSIDriverSpec, StorageClass},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Client, Resource, ResourceExt,
    api::{Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams},
    discovery,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event, EventType, Recorder},
        reflector::ObjectRef,
        watcher::{self, watcher},
    },
};
use lvms_api::{
    DEFAULT_STORAGE_CLASS_ANNOTATION, LABEL_OWNED_BY_NAME, LABEL_OWNED_BY_NAMESPACE,
    LVMCLUSTER_FINALIZER, LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus,
    NODE_CLEANUP_FINALIZER_PREFIX, OPERATOR_FIELD_MANAGER,
};
use lvms_core::shared::Release;
use serde::{Serialize, de::DeserializeOwned};
use tracing::{debug, info, instrument, warn};

use self::applied::{Applied, Version};
use crate::{
    finalizer::{DeletionPlan, cluster_deletion},
    host_ids,
    metrics::{Metrics, Readiness, shared_series},
    render::{
        NODE_DAEMON_SET, RenderConfig, RenderError, Rendered, SNAPSHOT_CLASS_KIND, SNAPSHOT_GROUP,
        SNAPSHOT_VERSION, VolumeSnapshotClass, render,
    },
    status::{ResourceSync, aggregate, expected_nodes},
};

/// Requeue interval of a reconcile that succeeded.
pub const REQUEUE: Duration = Duration::from_secs(60);
/// What [`Reconciler::assign_host_ids`] has to say to the reconcile.
#[derive(Debug, Default)]
struct HostIdsOutcome {
    /// What failed, in words.
    failure: Option<String>,
    /// When to look again because a held host id may then be released.
    look_again: Option<Duration>,
}

/// Requeue interval after a failed reconcile.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Requeue interval while a deletion waits for PVCs, PVs or node agents.
pub const DELETION_REQUEUE: Duration = Duration::from_secs(10);

/// The `controller` label of the `LVMCluster` reconciler's metrics.
pub const LVMCLUSTER_CONTROLLER: &str = "lvmcluster";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed; `action` says which.
    #[error("{action}: {source}")]
    Kube {
        /// What the operator was doing.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The spec cannot be rendered.
    #[error("rendering the LVMCluster's objects: {0}")]
    Render(#[from] RenderError),
    /// Some rendered objects could not be applied (the status says so too).
    #[error("applying the LVMCluster's objects: {0}")]
    Apply(String),
    /// The `LVMCluster` read has no name or namespace.
    #[error("the LVMCluster has no name or namespace")]
    MissingMetadata,
}

/// `Result` with the controller's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn kube_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Kube { action, source }
}

/// What every reconcile shares.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The operator's configuration; the observed fields are filled in on every reconcile.
    pub config: RenderConfig,
    /// Publishes events on the `LVMCluster`.
    pub recorder: Recorder,
    /// Counts reconciles and records the clusters' states.
    pub metrics: Arc<Metrics>,
    /// What was last applied of each rendered object: a reconcile applies only what changed.
    pub applied: Applied,
}

impl Context {
    /// A context whose events are reported by `lvms-operator`.
    pub fn new(client: Client, config: RenderConfig) -> Self {
        Self {
            recorder: lvms_k8s::reconciler::recorder(client.clone(), OPERATOR_FIELD_MANAGER),
            client,
            config,
            metrics: Arc::new(Metrics::new()),
            applied: Applied::default(),
        }
    }

    /// The same context, recording into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }
}

/// Runs the `LVMCluster` controller in `ctx.config.namespace` until `shutdown` completes: it
/// reconciles on changes of the `LVMCluster`, of the `LVMVolumeGroup`s and `DaemonSet` it owns, of
/// any `LVMVolumeGroupNodeStatus` in the namespace, and when a Node appears, goes or changes its
/// labels (the last two mapped to every `LVMCluster` there; there is only one). `readiness` learns
/// when the controller's cache has synced.
pub async fn run(
    client: Client,
    config: RenderConfig,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let ns = config.namespace.clone();
    let ctx = Arc::new(Context::new(client.clone(), config).with_metrics(metrics));
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns);
    let controller = Controller::new(clusters, watcher::Config::default());
    let store = controller.store();
    let node_store = store.clone();
    let ready_store = store.clone();
    tokio::spawn(async move {
        if synced(&ready_store).await {
            readiness.controller_synced();
        }
    });
    let all_clusters = move |store: &kube::runtime::reflector::Store<LVMCluster>| {
        store
            .state()
            .iter()
            .map(|c| ObjectRef::from_obj(c.as_ref()))
            .collect::<Vec<_>>()
    };
    let node_changes = node_label_changes(Api::all(client.clone()))
        .map(move |res| res.map(|()| all_clusters(&node_store)));
    let controller = controller
        .owns(
            Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .owns(
            Api::<DaemonSet>::namespaced(client.clone(), &ns),
            watcher::Config::default(),
        )
        .watches(
            Api::<LVMVolumeGroupNodeStatus>::namespaced(client, &ns),
            watcher::Config::default(),
            move |_status| all_clusters(&store),
        )
        .reconcile_all_on(
            node_changes
                .filter_map(|res| async move { res.ok() })
                .map(|_| ()),
        )
        .graceful_shutdown_on(shutdown);
    lvms_k8s::reconciler::drive(controller, "LVMCluster", timed_reconcile, error_policy, ctx).await;
}

/// Resolves once `store` has had its first complete list (`false` if its writer went away first).
///
/// kube-runtime's `Store::wait_until_ready` keeps one waker: of several tasks waiting at once, only
/// the last to poll is woken. The controller's applier waits on the same store, so a plain
/// `wait_until_ready` here could sleep forever (seen on a real API server); asking again every
/// second sees the store ready without being woken.
pub async fn synced<K>(store: &kube::runtime::reflector::Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    loop {
        if let Ok(res) = tokio::time::timeout(SYNC_POLL, store.wait_until_ready()).await {
            return res.is_ok();
        }
    }
}

/// How often [`synced`] asks again.
const SYNC_POLL: Duration = Duration::from_secs(1);

/// Yields once per Node that appears, goes, or changes its labels (what decides which nodes a
/// device class selects); status-only updates are skipped. Watch errors are retried with backoff.
fn node_label_changes(
    nodes: Api<PartialObjectMeta<Node>>,
) -> impl futures::Stream<Item = Result<(), watcher::Error>> + Send {
    let mut seen: std::collections::HashMap<String, std::collections::BTreeMap<String, String>> =
        std::collections::HashMap::new();
    watcher(nodes, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let changed = match event {
                Err(e) => Some(Err(e)),
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let name = node.name_any();
                    let labels = node.metadata.labels.clone().unwrap_or_default();
                    (seen.insert(name, labels.clone()).as_ref() != Some(&labels)).then_some(Ok(()))
                }
                Ok(watcher::Event::Delete(node)) => {
                    seen.remove(&node.name_any());
                    Some(Ok(()))
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
            };
            futures::future::ready(changed)
        })
}

/// [`reconcile`], counted and timed in the context's metrics.
async fn timed_reconcile(cluster: Arc<LVMCluster>, ctx: Arc<Context>) -> Result<Action> {
    let started = std::time::Instant::now();
    let res = reconcile(cluster, ctx.clone()).await;
    ctx.metrics
        .reconciled(LVMCLUSTER_CONTROLLER, res.is_ok(), started.elapsed());
    res
}

/// Logs the failure and retries after [`ERROR_REQUEUE`].
pub fn error_policy(cluster: Arc<LVMCluster>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(lvmcluster = %cluster.name_any(), error = %error, "reconcile failed, retrying");
    Action::requeue(ERROR_REQUEUE)
}

/// Reconciles one `LVMCluster`: the deletion flow when it is being deleted, else finalizer, apply
/// and status.
#[instrument(skip_all, fields(lvmcluster = %cluster.name_any()))]
pub async fn reconcile(cluster: Arc<LVMCluster>, ctx: Arc<Context>) -> Result<Action> {
    let ns = cluster.namespace().ok_or(Error::MissingMetadata)?;
    let name = cluster
        .metadata
        .name
        .clone()
        .ok_or(Error::MissingMetadata)?;
    let r = Reconciler {
        ctx: &ctx,
        cluster: &cluster,
        ns,
        name,
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        r.delete().await
    } else {
        r.apply().await
    }
}

struct Reconciler<'a> {
    ctx: &'a Context,
    cluster: &'a LVMCluster,
    ns: String,
    name: String,
}

impl Reconciler<'_> {
    fn client(&self) -> Client {
        self.ctx.client.clone()
    }

    /// Server-side applies `obj` unless it is unchanged since the last apply ([`applied`]).
    async fn ssa<K>(&self, api: &Api<K>, obj: &K, version: Version) -> Result<()>
    where
        K: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Clone + Debug,
    {
        self.ctx.applied.apply(api, obj, version).await
    }

    fn clusters(&self) -> Api<LVMCluster> {
        Api::namespaced(self.client(), &self.ns)
    }

    fn volume_groups(&self) -> Api<LVMVolumeGroup> {
        Api::namespaced(self.client(), &self.ns)
    }

    fn finalizers(&self) -> Vec<String> {
        self.cluster.finalizers().to_vec()
    }

    /// Sets `metadata.finalizers` with a merge patch that fails if the object changed since read.
    async fn patch_finalizers(&self, finalizers: Vec<String>, action: &str) -> Result<()> {
        let patch = serde_json::json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": self.cluster.resource_version(),
            }
        });
        self.clusters()
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(action))?;
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self
            .ctx
            .recorder
            .publish(&ev, &self.cluster.object_ref(&()))
            .await
        {
            warn!(error = %e, reason, "publishing an event failed");
        }
    }

    /// Whether the cluster serves `snapshot.storage.k8s.io/v1` `VolumeSnapshotClass`; any failure
    /// to find out counts as "no" (snapshot classes are optional).
    async fn snapshot_api_available(&self) -> bool {
        let gvk =
            kube::api::GroupVersionKind::gvk(SNAPSHOT_GROUP, SNAPSHOT_VERSION, SNAPSHOT_CLASS_KIND);
        match discovery::pinned_kind(&self.client(), &gvk).await {
            Ok(_) => true,
            Err(e) => {
                info!(error = %e, "snapshot API not available: no VolumeSnapshotClasses");
                false
            }
        }
    }

    fn owns_cluster_scoped(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        labels.get(LABEL_OWNED_BY_NAME) == Some(&self.name)
            && labels.get(LABEL_OWNED_BY_NAMESPACE) == Some(&self.ns)
    }

    fn owns_namespaced<K: Resource>(&self, obj: &K) -> bool {
        let uid = self.cluster.metadata.uid.as_deref();
        obj.owner_references()
            .iter()
            .any(|o| o.kind == "LVMCluster" && (Some(o.uid.as_str()) == uid || o.name == self.name))
    }

    async fn apply(&self) -> Result<Action> {
        let mut finalizers = self.finalizers();
        if !finalizers.iter().any(|f| f == LVMCLUSTER_FINALIZER) {
            finalizers.push(LVMCLUSTER_FINALIZER.to_owned());
            self.patch_finalizers(finalizers, "adding the LVMCluster finalizer")
                .await?;
        }

        let mut cfg = self.ctx.config.clone();
        cfg.snapshot_api_available = self.snapshot_api_available().await;
        let storage_classes = Api::<StorageClass>::all(self.client())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing StorageClasses"))?;
        cfg.existing_default_storage_class = storage_classes
            .items
            .iter()
            .find(|sc| {
                sc.annotations()
                    .get(DEFAULT_STORAGE_CLASS_ANNOTATION)
                    .is_some_and(|v| v == "true")
                    && !self.owns_cluster_scoped(sc.labels())
            })
            .map(|sc| sc.name_any());

        let rendered = render(self.cluster, &cfg)?;
        let failures = self.apply_all(&rendered).await;
        if let Some(note) = self.legacy_topolvm_volumes().await {
            warn!("{note}");
            self.event(EventType::Warning, "LegacyTopoLVMVolumes", "Apply", note)
                .await;
        }

        // Classes no longer in the spec.
        let keep: BTreeSet<String> = rendered
            .storage_classes
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let mut failures = failures;
        for sc in &storage_classes.items {
            let name = sc.name_any();
            if self.owns_cluster_scoped(sc.labels()) && !keep.contains(&name) {
                let api = Api::<StorageClass>::all(self.client());
                if let Err(e) = delete(&api, &name).await {
                    failures.push(format!("deleting StorageClass {name}: {e}"));
                }
            }
        }
        let keep: BTreeSet<String> = rendered
            .volume_groups
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        let vgs = self
            .volume_groups()
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing LVMVolumeGroups"))?;
        for vg in &vgs.items {
            let name = vg.name_any();
            if self.owns_namespaced(vg)
                && !keep.contains(&name)
                && vg.metadata.deletion_timestamp.is_none()
                && let Err(e) = delete(&self.volume_groups(), &name).await
            {
                failures.push(format!("deleting LVMVolumeGroup {name}: {e}"));
            }
        }

        let host_ids = self.assign_host_ids().await;
        if let Some(failure) = host_ids.failure {
            failures.push(failure);
        }

        let sync = if failures.is_empty() {
            ResourceSync::Applied
        } else {
            ResourceSync::Failed(failures.join("; "))
        };
        self.update_status(&sync).await?;
        if let ResourceSync::Failed(message) = sync {
            self.event(
                EventType::Warning,
                "ResourcesSyncFailed",
                "Apply",
                message.clone(),
            )
            .await;
            return Err(Error::Apply(message));
        }
        Ok(Action::requeue(
            host_ids.look_again.map_or(REQUEUE, |d| d.min(REQUEUE)),
        ))
    }

    /// When a device class is shared, gives every node it selects a sanlock host id
    /// ([`host_ids::allocate`]); logs each id assigned, released, held or replaced and publishes one
    /// event per kind of change. Returns what failed, in words (nodes left without an id
    /// included), and when a held id may be released.
    async fn assign_host_ids(&self) -> HostIdsOutcome {
        let mut outcome = HostIdsOutcome::default();
        if !host_ids::any_shared(self.cluster) {
            return outcome;
        }
        let nodes = match Api::<Node>::all(self.client())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list.items,
            Err(e) => {
                outcome.failure = Some(format!("assigning sanlock host ids: listing Nodes: {e}"));
                return outcome;
            }
        };
        // Ids some node still sees renewing are not released; unknown, none is.
        let live = match Api::<LVMVolumeGroupNodeStatus>::namespaced(self.client(), &self.ns)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => Some(host_ids::live_host_ids(self.cluster, &list.items)),
            Err(e) => {
                warn!(error = %e, "listing LVMVolumeGroupNodeStatuses failed: no sanlock host id is released");
                None
            }
        };
        let now = Timestamp::now().as_second();
        let release = Release {
            now,
            gone_since: BTreeMap::new(),
            host_dead_seconds: host_ids::wait_seconds(self.cluster),
            live,
        };
        let api = Api::<ConfigMap>::namespaced(self.client(), &self.ctx.config.namespace);
        let needing = host_ids::needing(self.cluster, &nodes);
        let present = host_ids::present(&nodes);
        let out = match host_ids::allocate(&api, &needing, &present, &release).await {
            Ok(out) => out,
            Err(e) => {
                outcome.failure = Some(format!("assigning sanlock host ids: {e}"));
                return outcome;
            }
        };
        outcome.look_again = out.release_at.map(|at| {
            Duration::from_secs(u64::try_from(at.saturating_sub(now)).unwrap_or(0).max(1))
        });
        for (node, host_id) in &out.held {
            debug!(
                node,
                host_id, "sanlock host id kept: the node is gone but its host may not be dead yet"
            );
        }
        for (node, host_id) in &out.added {
            info!(node, host_id, "sanlock host id assigned");
        }
        for (node, host_id) in &out.released {
            info!(
                node,
                host_id, "sanlock host id released: the node is gone and its host dead"
            );
        }
        for (node, value) in &out.replaced {
            warn!(node, value, "invalid sanlock host id entry replaced");
        }
        if !out.added.is_empty() {
            let note = format!("sanlock host ids assigned: {}", host_ids::list(&out.added));
            self.event(EventType::Normal, "HostIdsAssigned", "AssignHostIds", note)
                .await;
        }
        if !out.released.is_empty() {
            let note = format!(
                "sanlock host ids released (their nodes are gone and their hosts dead): {}",
                host_ids::list(&out.released)
            );
            self.event(EventType::Normal, "HostIdsReleased", "AssignHostIds", note)
                .await;
        }
        if !out.replaced.is_empty() {
            let note = format!(
                "invalid sanlock host id entries replaced (out of range or another node's id): {}",
                host_ids::list(&out.replaced)
            );
            self.event(EventType::Warning, "HostIdsReplaced", "AssignHostIds", note)
                .await;
        }
        outcome.failure =
            (!out.exhausted.is_empty()).then(|| host_ids::exhausted_message(&out.exhausted));
        outcome
    }

    /// Applies every rendered object; returns what failed, in words.
    async fn apply_all(&self, rendered: &Rendered) -> Vec<String> {
        let mut failures = Vec::new();
        let client = self.client();
        for vg in &rendered.volume_groups {
            push_err(
                &mut failures,
                self.ssa(&self.volume_groups(), vg, Version::Generation)
                    .await,
            );
        }
        let scs = Api::<StorageClass>::all(client.clone());
        for sc in &rendered.storage_classes {
            push_err(
                &mut failures,
                self.ssa(&scs, sc, Version::ResourceVersion).await,
            );
        }
        let vscs = Api::<VolumeSnapshotClass>::all(client.clone());
        for vsc in &rendered.snapshot_classes {
            push_err(
                &mut failures,
                self.ssa(&vscs, vsc, Version::ResourceVersion).await,
            );
        }
        push_err(
            &mut failures,
            self.apply_csi_driver(&rendered.csi_driver).await,
        );
        let csi_driver_lvm = match &rendered.csi_driver_lvm {
            Some(driver) => self.apply_csi_driver(driver).await,
            None => self.delete_csi_driver_lvm().await,
        };
        push_err(&mut failures, csi_driver_lvm);
        push_err(
            &mut failures,
            self.ssa(
                &Api::<DaemonSet>::namespaced(client, &self.ns),
                &rendered.daemon_set,
                Version::Generation,
            )
            .await,
        );
        failures
    }

    /// What to tell the user when TopoLVM's legacy API group (`topolvm.cybozu.com`, its Helm
    /// chart's `useLegacy`) holds `LogicalVolume`s: lvms-rs serves `topolvm.io` only and leaves
    /// them, their PersistentVolumes and their LVs alone (ADR 0032). `None` without the group.
    async fn legacy_topolvm_volumes(&self) -> Option<String> {
        let resource = kube::api::ApiResource {
            group: LEGACY_TOPOLVM_GROUP.to_owned(),
            version: "v1".to_owned(),
            api_version: format!("{LEGACY_TOPOLVM_GROUP}/v1"),
            kind: "LogicalVolume".to_owned(),
            plural: "logicalvolumes".to_owned(),
        };
        let api = Api::<kube::api::DynamicObject>::all_with(self.client(), &resource);
        match api.list_metadata(&ListParams::default().limit(1)).await {
            Ok(list) => list.items.first().map(|lv| legacy_note(&lv.name_any())),
            Err(kube::Error::Api(s)) if s.is_not_found() => None,
            Err(e) => {
                debug!(error = %e, "looking for TopoLVM's legacy LogicalVolumes");
                None
            }
        }
    }

    /// Applies the CSIDriver. One that another install made (LVMS's or TopoLVM's, left by their
    /// uninstall: ADR 0032) and that differs in a field the API server keeps immutable is deleted
    /// and made anew, with an Event; the CSIDriver only tells kubelet and the attach controller how
    /// to call the driver, so mounted volumes are not affected.
    async fn apply_csi_driver(&self, driver: &CSIDriver) -> Result<()> {
        let api = Api::<CSIDriver>::all(self.client());
        let name = driver.name_any();
        match self.ssa(&api, driver, Version::ResourceVersion).await {
            Ok(()) => return Ok(()),
            Err(Error::Kube {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 422 => {}
            Err(e) => return Err(e),
        }
        let current = api
            .get(&name)
            .await
            .map_err(kube_err(format!("reading CSIDriver {name}")))?;
        let differ = immutable_csi_driver_fields(&current.spec, &driver.spec);
        if differ.is_empty() {
            return self.ssa(&api, driver, Version::ResourceVersion).await;
        }
        delete(&api, &name)
            .await
            .map_err(kube_err(format!("deleting CSIDriver {name}")))?;
        let note = format!(
            "CSIDriver {name} replaced: another install made it with other {} (immutable)",
            differ.join(" and ")
        );
        info!("{note}");
        self.event(
            EventType::Normal,
            "CSIDriverReplaced",
            "ApplyCSIDriver",
            note,
        )
        .await;
        self.ssa(&api, driver, Version::ResourceVersion).await
    }

    /// Deletes the `CSIDriver` of csi-driver-lvm's volumes when this cluster made it (no class
    /// adopts any more, or the cluster goes); csi-driver-lvm's own is never touched.
    async fn delete_csi_driver_lvm(&self) -> Result<()> {
        let api = Api::<CSIDriver>::all(self.client());
        let name = lvms_core::config::CSI_DRIVER_LVM_DRIVER_NAME;
        let current = api
            .get_opt(name)
            .await
            .map_err(kube_err(format!("reading CSIDriver {name}")))?;
        match current {
            Some(d) if self.owns_cluster_scoped(d.labels()) => delete(&api, name)
                .await
                .map_err(kube_err(format!("deleting CSIDriver {name}"))),
            _ => Ok(()),
        }
    }

    async fn update_status(&self, sync: &ResourceSync) -> Result<()> {
        let node_statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(self.client(), &self.ns)
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing LVMVolumeGroupNodeStatuses"))?;
        let nodes = Api::<Node>::all(self.client())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing Nodes"))?;
        let expected = expected_nodes(self.cluster, &nodes.items);
        let status = aggregate(
            self.cluster,
            &node_statuses.items,
            &expected,
            sync,
            &Time(Timestamp::now()),
        );
        self.ctx.metrics.cluster_status(
            &self.ns,
            &self.name,
            status.ready,
            status.state.map_or("Unknown", |s| s.as_str()),
        );
        self.ctx.metrics.shared_status(
            &self.ns,
            &self.name,
            &shared_series(self.cluster, &node_statuses.items),
        );
        // Only a status that changed is written: the conditions keep their transition times, so an
        // idle reconcile computes the status it read.
        if serde_json::to_value(&status).ok()
            == self
                .cluster
                .status
                .as_ref()
                .and_then(|s| serde_json::to_value(s).ok())
        {
            return Ok(());
        }
        let patch = serde_json::json!({
            "apiVersion": LVMCluster::api_version(&()),
            "kind": LVMCluster::kind(&()),
            "status": status,
        });
        self.clusters()
            .patch_status(
                &self.name,
                &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(kube_err("applying the LVMCluster status"))?;
        Ok(())
    }

    async fn delete(&self) -> Result<Action> {
        if !self.finalizers().iter().any(|f| f == LVMCLUSTER_FINALIZER) {
            return Ok(Action::await_change());
        }
        let ours: BTreeSet<String> = self.cluster.spec.storage.storage_class_names().collect();
        let pvcs = Api::<PersistentVolumeClaim>::all(self.client())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing PersistentVolumeClaims"))?;
        let pvcs_using = pvcs
            .items
            .iter()
            .filter(|pvc| {
                pvc.spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_ref())
                    .is_some_and(|sc| ours.contains(sc))
            })
            .count();
        let pvs = Api::<PersistentVolume>::all(self.client())
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing PersistentVolumes"))?;
        let retained = pvs
            .items
            .iter()
            .filter_map(|pv| pv.spec.as_ref())
            .filter(|spec| {
                spec.persistent_volume_reclaim_policy.as_deref() == Some("Retain")
                    && (spec
                        .csi
                        .as_ref()
                        .is_some_and(|c| c.driver == self.ctx.config.driver_name)
                        || spec
                            .storage_class_name
                            .as_ref()
                            .is_some_and(|sc| ours.contains(sc)))
            })
            .count();
        let vgs = self
            .volume_groups()
            .list(&ListParams::default())
            .await
            .map_err(kube_err("listing LVMVolumeGroups"))?;
        let vgs: Vec<LVMVolumeGroup> = vgs
            .items
            .into_iter()
            .filter(|vg| self.owns_namespaced(vg))
            .collect();
        let pending: Vec<String> = vgs
            .iter()
            .flat_map(|vg| vg.finalizers().iter())
            .filter(|f| f.starts_with(NODE_CLEANUP_FINALIZER_PREFIX))
            .cloned()
            .collect();

        match cluster_deletion(self.cluster, pvcs_using, retained, &pending) {
            DeletionPlan::AddFinalizer | DeletionPlan::Nothing => Ok(Action::await_change()),
            DeletionPlan::Block { reason } => {
                info!(%reason, "deletion blocked");
                self.event(EventType::Warning, "DeletionBlocked", "Delete", reason)
                    .await;
                Ok(Action::requeue(DELETION_REQUEUE))
            }
            DeletionPlan::WaitForNodeCleanup { reason, .. } => {
                info!(%reason, "deletion waits for node cleanup");
                self.delete_storage(&vgs).await?;
                self.event(EventType::Normal, "WaitingForNodeCleanup", "Delete", reason)
                    .await;
                Ok(Action::requeue(DELETION_REQUEUE))
            }
            DeletionPlan::RemoveFinalizer => {
                self.delete_storage(&vgs).await?;
                let client = self.client();
                let driver = self.ctx.config.driver_name.clone();
                delete(&Api::<CSIDriver>::all(client.clone()), &driver)
                    .await
                    .map_err(kube_err(format!("deleting CSIDriver {driver}")))?;
                self.delete_csi_driver_lvm().await?;
                delete(
                    &Api::<DaemonSet>::namespaced(client, &self.ns),
                    NODE_DAEMON_SET,
                )
                .await
                .map_err(kube_err(format!("deleting DaemonSet {NODE_DAEMON_SET}")))?;
                let finalizers = self
                    .finalizers()
                    .into_iter()
                    .filter(|f| f != LVMCLUSTER_FINALIZER)
                    .collect();
                self.patch_finalizers(finalizers, "removing the LVMCluster finalizer")
                    .await?;
                self.ctx.metrics.cluster_deleted(&self.ns, &self.name);
                info!("deletion complete, finalizer removed");
                Ok(Action::await_change())
            }
        }
    }

    /// Deletes the `LVMVolumeGroup`s (unless already being deleted), the StorageClasses and, when
    /// the snapshot API exists, the VolumeSnapshotClasses.
    async fn delete_storage(&self, vgs: &[LVMVolumeGroup]) -> Result<()> {
        for vg in vgs {
            if vg.metadata.deletion_timestamp.is_none() {
                let name = vg.name_any();
                delete(&self.volume_groups(), &name)
                    .await
                    .map_err(kube_err(format!("deleting LVMVolumeGroup {name}")))?;
            }
        }
        let mut cfg = self.ctx.config.clone();
        cfg.snapshot_api_available = self.snapshot_api_available().await;
        // Names come from the renderer; a spec that no longer renders still names its classes.
        let (classes, snapshot_classes) = match render(self.cluster, &cfg) {
            Ok(r) => (
                r.storage_classes
                    .iter()
                    .map(ResourceExt::name_any)
                    .collect(),
                r.snapshot_classes
                    .iter()
                    .filter_map(|c| c.metadata.name.clone())
                    .collect(),
            ),
            Err(_) => (
                self.cluster
                    .spec
                    .storage
                    .storage_class_names()
                    .collect::<Vec<_>>(),
                Vec::new(),
            ),
        };
        let scs = Api::<StorageClass>::all(self.client());
        for name in classes {
            delete(&scs, &name)
                .await
                .map_err(kube_err(format!("deleting StorageClass {name}")))?;
        }
        let vscs = Api::<VolumeSnapshotClass>::all(self.client());
        for name in snapshot_classes {
            delete(&vscs, &name)
                .await
                .map_err(kube_err(format!("deleting VolumeSnapshotClass {name}")))?;
        }
        Ok(())
    }
}

/// TopoLVM's API group before it became `topolvm.io` (topolvm `constants.go`, `api/legacy/v1`).
pub const LEGACY_TOPOLVM_GROUP: &str = "topolvm.cybozu.com";

/// The Warning for a cluster whose TopoLVM install still uses the legacy group (`example`: one of
/// its `LogicalVolume`s), with the fix.
fn legacy_note(example: &str) -> String {
    format!(
        "TopoLVM's legacy API group {LEGACY_TOPOLVM_GROUP} holds LogicalVolumes (such as {example}): \
         lvms-rs serves only topolvm.io and leaves them, their PersistentVolumes and their LVs \
         alone. To carry them over, first move them to topolvm.io with TopoLVM's own procedure \
         (topolvm docs/proposals/rename-group.md, \"Migrate from topolvm.cybozu.com to \
         topolvm.io\"), then take them over (docs/migration-from-lvms.md)"
    )
}

/// The fields of `current` the API server keeps immutable that differ from `wanted`, with the API's
/// defaults applied (`attachRequired` true, `volumeLifecycleModes` `[Persistent]`).
fn immutable_csi_driver_fields(
    current: &CSIDriverSpec,
    wanted: &CSIDriverSpec,
) -> Vec<&'static str> {
    let modes = |s: &CSIDriverSpec| match s.volume_lifecycle_modes.as_deref() {
        None | Some([]) => vec!["Persistent".to_owned()],
        Some(m) => m.to_vec(),
    };
    let mut differ = Vec::new();
    if current.attach_required.unwrap_or(true) != wanted.attach_required.unwrap_or(true) {
        differ.push("attachRequired");
    }
    if modes(current) != modes(wanted) {
        differ.push("volumeLifecycleModes");
    }
    differ
}

fn push_err(failures: &mut Vec<String>, res: Result<()>) {
    if let Err(e) = res {
        failures.push(e.to_string());
    }
}

/// Deletes `name`; "not found" counts as done.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Resource + DeserializeOwned + Clone + Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

pub mod applied;
pub mod dead_nodes;
pub mod eviction;
pub mod node_removal;

#[cfg(test)]
mod tests;
