//! What this node's device classes can still hold, published on its `Node` object as TopoLVM does
//! (ADR 0009): `capacity.<driver>/<class>` holds the bytes a new volume of that class may take in
//! the class's own layout (a RAID class: a RAID volume), and the default class is also published
//! under `capacity.<driver>/00default`. `lvms.<driver>/free-space` adds, for each thick class, the
//! free extents of each LVM physical volume, from which the controller computes the capacity of
//! the other layouts a StorageClass may ask for (ADR 0020). The CSI controller answers
//! `GetCapacity` (and so external-provisioner's `CSIStorageCapacity` objects) and picks nodes from
//! them.
//!
//! The publisher looks every [`PERIOD`] and whenever the set of ready classes changes, and patches the
//! Node only when a value changed; a class no longer served loses its annotation. With
//! [`Publisher::with_metrics`] the same look sets each class's fill level on `/metrics`
//! ([`StorageMetrics`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use lvms_api::{DEFAULT_CLASS_CAPACITY_KEY, capacity_annotation, free_space_annotation};
use lvms_core::layout::FreeSpace;
use lvms_engine::backend::Backend;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tracing::{debug, warn};

use lvms_k8s::metrics::StorageMetrics;

/// How often the capacities are looked at.
pub const PERIOD: Duration = Duration::from_secs(10);

/// The annotations for `available` bytes per class (with whether it is the default class), and
/// the thick classes' `free` space per device.
pub fn annotations(
    driver: &str,
    available: &[(String, bool, u64)],
    free: &BTreeMap<String, FreeSpace>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if !free.is_empty()
        && let Ok(json) = serde_json::to_string(free)
    {
        out.insert(free_space_annotation(driver), json);
    }
    for (class, default, bytes) in available {
        out.insert(capacity_annotation(driver, class), bytes.to_string());
        if *default {
            out.insert(
                capacity_annotation(driver, DEFAULT_CLASS_CAPACITY_KEY),
                bytes.to_string(),
            );
        }
    }
    out
}

/// The merge patch from the `published` annotations to `wanted` (`null` removes a key); `None` when
/// nothing changed.
pub fn patch(
    published: &BTreeMap<String, String>,
    wanted: &BTreeMap<String, String>,
) -> Option<Value> {
    let mut changes = Map::new();
    for (k, v) in wanted {
        if published.get(k) != Some(v) {
            changes.insert(k.clone(), json!(v));
        }
    }
    for k in published.keys().filter(|k| !wanted.contains_key(*k)) {
        changes.insert(k.clone(), Value::Null);
    }
    (!changes.is_empty()).then(|| json!({"metadata": {"annotations": changes}}))
}

/// Publishes the capacities of this node's classes until the backend channel closes.
pub struct Publisher<B> {
    pub client: Client,
    pub node: String,
    pub driver: String,
    pub backend: watch::Receiver<Option<Arc<B>>>,
    published: BTreeMap<String, String>,
    metrics: Option<StorageMetrics>,
    measured: BTreeSet<String>,
}

impl<B: Backend> Publisher<B> {
    pub fn new(
        client: Client,
        node: impl Into<String>,
        driver: impl Into<String>,
        backend: watch::Receiver<Option<Arc<B>>>,
    ) -> Self {
        Self {
            client,
            node: node.into(),
            driver: driver.into(),
            backend,
            published: BTreeMap::new(),
            metrics: None,
            measured: BTreeSet::new(),
        }
    }

    /// Also sets each class's fill level on `metrics`.
    pub fn with_metrics(mut self, metrics: StorageMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Records each served class's usage; forgets the classes no longer served.
    async fn measure(&mut self, backend: Option<&Arc<B>>) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let mut now = BTreeSet::new();
        for class in backend.map(|b| b.classes()).unwrap_or_default() {
            let Some(b) = backend else { break };
            match b.usage(&class.name).await {
                Ok(Some(usage)) => {
                    metrics.record(&self.node, &class.name, &usage);
                    now.insert(class.name);
                }
                Ok(None) => {}
                Err(e) => {
                    // Kept at the last numbers rather than dropped: a gap would silence alerts.
                    warn!(device_class = %class.name, error = %e, "cannot measure usage");
                    now.insert(class.name);
                }
            }
        }
        for gone in self.measured.difference(&now) {
            metrics.forget(&self.node, gone);
        }
        self.measured = now;
    }

    /// Reads the annotations this node carries now (so a restart removes what it no longer serves).
    async fn read_published(&mut self) -> Result<(), kube::Error> {
        let node = Api::<Node>::all(self.client.clone())
            .get(&self.node)
            .await?;
        let prefix = capacity_annotation(&self.driver, "");
        let free = free_space_annotation(&self.driver);
        self.published = node
            .metadata
            .annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.starts_with(&prefix) || *k == free)
            .collect();
        Ok(())
    }

    /// One look: computes the annotations and patches the Node when they changed.
    pub async fn publish_once(&mut self) -> Result<(), String> {
        let backend = self.backend.borrow().clone();
        self.measure(backend.as_ref()).await;
        let mut available = Vec::new();
        let mut free = BTreeMap::new();
        if let Some(b) = backend {
            for class in b.classes() {
                let c = b
                    .capacity(&class.name, &class.layout())
                    .await
                    .map_err(|e| format!("capacity of {}: {e}", class.name))?;
                if let Some(f) = b
                    .free_space(&class.name)
                    .await
                    .map_err(|e| format!("free space of {}: {e}", class.name))?
                {
                    free.insert(class.name.clone(), f);
                }
                available.push((class.name, class.default, c.available));
            }
        }
        let wanted = annotations(&self.driver, &available, &free);
        if let Some(p) = patch(&self.published, &wanted) {
            debug!(annotations = %p, "publishing capacity");
            Api::<Node>::all(self.client.clone())
                .patch(&self.node, &PatchParams::default(), &Patch::Merge(p))
                .await
                .map_err(|e| format!("annotate Node {}: {e}", self.node))?;
            self.published = wanted;
        }
        Ok(())
    }

    /// Publishes every [`PERIOD`] and on every change of the ready classes.
    pub async fn run(mut self) {
        if let Err(e) = self.read_published().await {
            warn!(error = %e, "cannot read this node's annotations; publishing from scratch");
        }
        loop {
            if let Err(e) = self.publish_once().await {
                warn!(error = %e, "publishing capacity failed");
            }
            tokio::select! {
                () = tokio::time::sleep(PERIOD) => {}
                changed = self.backend.changed() => if changed.is_err() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lvms_testkit::{fake_api::FakeApi, fake_backend::FakeBackend};

    use super::*;

    #[test]
    fn each_class_and_the_default_get_an_annotation_and_stale_ones_are_removed() {
        let wanted = annotations(
            "topolvm.io",
            &[
                ("thin".into(), true, 8 << 30),
                ("thick".into(), false, 1 << 30),
            ],
            &BTreeMap::new(),
        );
        assert_eq!(
            wanted,
            BTreeMap::from([
                (
                    "capacity.topolvm.io/00default".into(),
                    (8u64 << 30).to_string()
                ),
                ("capacity.topolvm.io/thick".into(), (1u64 << 30).to_string()),
                ("capacity.topolvm.io/thin".into(), (8u64 << 30).to_string()),
            ])
        );
        assert_eq!(
            patch(&wanted, &wanted),
            None,
            "nothing changed, nothing sent"
        );
        let mut published = wanted.clone();
        published.insert("capacity.topolvm.io/old".into(), "1".into());
        published.insert("capacity.topolvm.io/thick".into(), "2".into());
        assert_eq!(
            patch(&published, &wanted),
            Some(json!({"metadata": {"annotations": {
                "capacity.topolvm.io/old": null,
                "capacity.topolvm.io/thick": (1u64 << 30).to_string(),
            }}}))
        );
    }

    #[tokio::test]
    async fn the_node_is_annotated_once_per_change() {
        let api = FakeApi::new();
        api.insert(
            "/api/v1/nodes/node-a",
            json!({"metadata": {"name": "node-a", "annotations": {"capacity.topolvm.io/gone": "5"}}}),
        );
        let (tx, rx) = watch::channel(None);
        let mut p = Publisher::new(api.client("default"), "node-a", "topolvm.io", rx);
        p.read_published().await.unwrap();
        p.publish_once().await.unwrap();
        let annotations = &api.get("/api/v1/nodes/node-a").unwrap()["metadata"]["annotations"];
        assert_eq!(
            annotations,
            &json!({}),
            "nothing served: the stale key is removed"
        );

        tx.send_replace(Some(Arc::new(FakeBackend::new())));
        p.publish_once().await.unwrap();
        let node = api.get("/api/v1/nodes/node-a").unwrap();
        // FakeBackend: thin (default) 2 x 4 GiB overprovisioned, thick 1 GiB free.
        // The thick class's one device: 256 free extents of 4 MiB.
        assert_eq!(
            node["metadata"]["annotations"],
            json!({"capacity.topolvm.io/00default": (8u64 << 30).to_string(),
                   "capacity.topolvm.io/thin": (8u64 << 30).to_string(),
                   "capacity.topolvm.io/thick": (1u64 << 30).to_string(),
                   "lvms.topolvm.io/free-space":
                       r#"{"thick":{"extentSize":4194304,"freeExtents":[256]}}"#})
        );
        api.clear_requests();
        p.publish_once().await.unwrap();
        assert!(api.requests().is_empty(), "unchanged: no patch");

        // A restart reads what it published; a class no longer served loses its keys, the
        // free-space annotation too.
        let mut p = Publisher::new(
            api.client("default"),
            "node-a",
            "topolvm.io",
            watch::channel(Some(Arc::new(FakeBackend::new()))).1,
        );
        p.read_published().await.unwrap();
        assert_eq!(p.published.len(), 4, "{:?}", p.published);
        tx.send_replace(None);
        let (_, none) = watch::channel::<Option<Arc<FakeBackend>>>(None);
        p.backend = none;
        p.publish_once().await.unwrap();
        assert_eq!(
            api.get("/api/v1/nodes/node-a").unwrap()["metadata"]["annotations"],
            json!({})
        );
    }

    #[tokio::test]
    async fn each_look_sets_the_served_classes_fill_levels_and_forgets_the_others() {
        let api = FakeApi::new();
        api.insert(
            "/api/v1/nodes/node-a",
            json!({"metadata": {"name": "node-a"}}),
        );
        let backend = FakeBackend::new();
        backend.state.lock().unwrap().usage.insert(
            "thin".into(),
            lvms_engine::backend::Usage {
                vg_size: 5 << 30,
                vg_free: 0,
                pool: Some(lvms_engine::backend::PoolUsage {
                    size: 4 << 30,
                    data_percent: Some(81.0),
                    metadata_percent: Some(12.5),
                    overprovisioned_available: 1 << 30,
                }),
            },
        );
        let storage = StorageMetrics::default();
        let m = lvms_k8s::metrics::GcMetrics::with_storage("orphaned_volumes", Some(&storage));
        let (tx, rx) = watch::channel(Some(Arc::new(backend)));
        let mut p =
            Publisher::new(api.client("default"), "node-a", "topolvm.io", rx).with_metrics(storage);
        p.publish_once().await.unwrap();
        let text = m.encode();
        assert!(
            text.contains(
                "topolvm_thinpool_data_percent{device_class=\"thin\",node=\"node-a\"} 81.0"
            ),
            "{text}"
        );
        assert!(
            !text.contains("device_class=\"thick\""),
            "no usage, no numbers: {text}"
        );

        tx.send_replace(None);
        p.publish_once().await.unwrap();
        assert!(!m.encode().contains("device_class="), "{}", m.encode());
    }
}
