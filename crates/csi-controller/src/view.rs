//! What the controller knows of the cluster, from reflector stores kept current by watches:
//! `LogicalVolume`s (the volumes), `Node`s' metadata (their capacity annotations, ADR 0009), and the
//! `LVMVolumeGroup`s and `LVMVolumeGroupNodeStatus`es of the operator's namespace (which classes each node
//! serves, and how).
//!
//! Nothing kept needs `metadata.managedFields`, which three field managers make as large as the
//! rest of a `LogicalVolume`: each store drops them as objects arrive, and Nodes are watched for
//! their metadata only (a kubelet's Node status lists its images; issue 39).

use std::{future::Future, sync::Arc};

use futures::{StreamExt, future::join4};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::PartialObjectMeta,
    runtime::{
        WatchStreamExt,
        reflector::{self, ObjectRef, Store},
        watcher::{self, watcher},
    },
};
use lvms_api::{
    DEFAULT_CLASS_CAPACITY_KEY, LVMVolumeGroup, LVMVolumeGroupNodeStatus, VGStatusType,
    capacity_annotation, free_space_annotation, topolvm::LogicalVolume,
};
use lvms_core::from_api::device_class_config;
use lvms_core::layout::FreeSpace;
use lvms_engine::backend::DeviceClassConfig;
use serde::de::DeserializeOwned;

/// The stores, and the names needed to read them.
#[derive(Clone)]
pub struct View {
    pub logical_volumes: Store<LogicalVolume>,
    pub nodes: Store<PartialObjectMeta<Node>>,
    pub volume_groups: Store<LVMVolumeGroup>,
    pub node_statuses: Store<LVMVolumeGroupNodeStatus>,
    /// Namespace of the `LVMVolumeGroup`s and node statuses.
    pub namespace: String,
    /// CSI driver name (the capacity annotations carry it).
    pub driver: String,
}

/// A store of `api`'s objects without their managed fields, and the future that fills it.
fn reflect<K>(api: Api<K>) -> (Store<K>, impl Future<Output = ()> + Send + use<K>)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(|o: &mut K| o.managed_fields_mut().clear())
        .reflect(writer)
        .touched_objects()
        .for_each(|_| futures::future::ready(()));
    (reader, stream)
}

impl View {
    /// The view, and the future that keeps it current (run it for as long as the view is used).
    pub fn start(
        client: Client,
        namespace: &str,
        driver: &str,
    ) -> (Arc<Self>, impl Future<Output = ()> + Send + use<>) {
        let (logical_volumes, lvs) = reflect(Api::<LogicalVolume>::all(client.clone()));
        let (nodes, ns) = reflect(Api::<PartialObjectMeta<Node>>::all(client.clone()));
        let (volume_groups, vgs) =
            reflect(Api::<LVMVolumeGroup>::namespaced(client.clone(), namespace));
        let (node_statuses, sts) = reflect(Api::<LVMVolumeGroupNodeStatus>::namespaced(
            client, namespace,
        ));
        let view = Arc::new(Self {
            logical_volumes,
            nodes,
            volume_groups,
            node_statuses,
            namespace: namespace.to_owned(),
            driver: driver.to_owned(),
        });
        let run = async move {
            join4(lvs, ns, vgs, sts).await;
        };
        (view, run)
    }

    /// Waits until every store has its first list.
    pub async fn ready(&self) -> Result<(), reflector::store::WriterDropped> {
        self.logical_volumes.wait_until_ready().await?;
        self.nodes.wait_until_ready().await?;
        self.volume_groups.wait_until_ready().await?;
        self.node_statuses.wait_until_ready().await
    }

    /// The classes `node` reports `Ready`, as the CSI backend serves them.
    pub fn node_classes(&self, node: &str) -> Vec<DeviceClassConfig> {
        let Some(status) = self
            .node_statuses
            .get(&ObjectRef::new(node).within(&self.namespace))
        else {
            return Vec::new();
        };
        status
            .spec
            .lvm_vg_status
            .iter()
            .filter(|s| s.status == Some(VGStatusType::Ready))
            .filter_map(|s| {
                let vg = self
                    .volume_groups
                    .get(&ObjectRef::new(&s.name).within(&self.namespace))?;
                device_class_config(&vg).ok()
            })
            .collect()
    }

    /// Nodes that report at least one ready class, sorted.
    pub fn serving_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .node_statuses
            .state()
            .iter()
            .filter(|s| {
                s.spec
                    .lvm_vg_status
                    .iter()
                    .any(|v| v.status == Some(VGStatusType::Ready))
            })
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        nodes.sort();
        nodes
    }

    /// What a new volume of `class` (`None`: the default class) may take on `node`, from its
    /// annotations.
    pub fn available(&self, node: &str, class: Option<&str>) -> Option<u64> {
        let node = self.nodes.get(&ObjectRef::new(node))?;
        let key = capacity_annotation(&self.driver, class.unwrap_or(DEFAULT_CLASS_CAPACITY_KEY));
        node.metadata.annotations.as_ref()?.get(&key)?.parse().ok()
    }

    /// What thick class `class`'s group has free on each device of `node`, from its
    /// `lvms.<driver>/free-space` annotation; `None` when the node publishes none for it.
    pub fn free_space(&self, node: &str, class: &str) -> Option<FreeSpace> {
        let node = self.nodes.get(&ObjectRef::new(node))?;
        let json = node
            .metadata
            .annotations
            .as_ref()?
            .get(&free_space_annotation(&self.driver))?;
        let mut all: std::collections::BTreeMap<String, FreeSpace> =
            serde_json::from_str(json).ok()?;
        all.remove(class)
    }

    /// The `LogicalVolume` of the volume or snapshot `id`. lvms-rs names its objects after their
    /// ids; one TopoLVM or LVMS made is named `pvc-…`/`snapshot-…` and its id, a UUID, is its
    /// `status.volumeID` (ADR 0032).
    pub fn logical_volume(&self, id: &str) -> Option<Arc<LogicalVolume>> {
        if lvms_engine::ids::is_topolvm_id(id) {
            return self
                .logical_volumes
                .find(|lv| lv.status.as_ref().is_some_and(|s| s.volume_id == id));
        }
        self.named(id)
    }

    /// The `LogicalVolume` named `name`.
    pub fn named(&self, name: &str) -> Option<Arc<LogicalVolume>> {
        self.logical_volumes.get(&ObjectRef::new(name))
    }

    /// The name of the `LogicalVolume` of `id` ([`View::logical_volume`]); `id` itself when the
    /// view has none.
    pub fn object_name(&self, id: &str) -> String {
        self.logical_volume(id)
            .and_then(|lv| lv.metadata.name.clone())
            .unwrap_or_else(|| id.to_owned())
    }

    /// The `LogicalVolume`s of `node`.
    pub fn logical_volumes_on(&self, node: &str) -> Vec<Arc<LogicalVolume>> {
        self.logical_volumes
            .state()
            .into_iter()
            .filter(|lv| lv.spec.node_name == node)
            .collect()
    }
}
