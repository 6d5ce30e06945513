//! [`Switch`]: the node agent's CSI backend. The volume-group reconciler makes a new backend whenever the
//! set of ready device classes changes ([`crate::vg_reconciler::Context::backend`]); the CSI services
//! hold a `Switch`, which forwards every call to the backend of the moment. Before any class is ready
//! there is none: lookups answer `Unavailable` and `ready` is false, so `Probe` says not ready.
//!
//! Kubelet asks `NodeGetInfo` once, when the plugin registers, and keeps the topology it answered:
//! with [`Switch::with_settling`], the shared classes a node joins are listed only once they
//! settled (joined or failed), waiting for them at most [`SETTLE_WAIT`].

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use lvms_core::layout::FreeSpace;
use lvms_engine::backend::{
    Backend, BackendError, BlockRanges, Capacity, DeviceClassConfig, Layout, NewSnapshot,
    NewVolume, Result, TakeOver, Usage, Volume,
};
use tokio::sync::watch;

/// How long `NodeGetInfo` waits for the shared classes this node is joining: below the 2 minutes
/// kubelet gives the call at registration, above the ~40 s a join takes in the test VM. A class
/// that settles later is advertised only once the plugin registers again (node pod restarted).
pub const SETTLE_WAIT: Duration = Duration::from_secs(100);

/// A [`Backend`] that forwards to the current backend of a `watch` channel.
pub struct Switch<B> {
    node: String,
    current: watch::Receiver<Option<Arc<B>>>,
    /// The shared classes still joining (`None`: not known yet), and how long to wait for them.
    settling: Option<(watch::Receiver<Option<BTreeSet<String>>>, Duration)>,
    /// The classes configured here that are not served, each with why ([`Switch::with_unserved`]).
    unserved: Option<watch::Receiver<Vec<(DeviceClassConfig, String)>>>,
}

impl<B> Switch<B> {
    pub fn new(node: impl Into<String>, current: watch::Receiver<Option<Arc<B>>>) -> Self {
        Self {
            node: node.into(),
            current,
            settling: None,
            unserved: None,
        }
    }

    /// The classes of this node that failed to converge, each with its reason: a call naming one
    /// (create, capacity) answers that reason, and deleting, growing or activating a volume the
    /// served classes do not hold is UNAVAILABLE while any class is unserved (it may be in one),
    /// never done or NOT_FOUND. A lookup (`get`) still answers `None`: CreateVolume looks its new
    /// volume up first.
    #[must_use]
    pub fn with_unserved(
        mut self,
        unserved: watch::Receiver<Vec<(DeviceClassConfig, String)>>,
    ) -> Self {
        self.unserved = Some(unserved);
        self
    }

    fn unserved_now(&self) -> Vec<(DeviceClassConfig, String)> {
        self.unserved
            .as_ref()
            .map(|u| u.borrow().clone())
            .unwrap_or_default()
    }

    /// UNAVAILABLE with `class`'s reason when it is unserved.
    fn served(&self, class: &str) -> Result<()> {
        match self.unserved_now().iter().find(|(c, _)| c.name == class) {
            Some((_, reason)) => Err(BackendError::class_not_ready(class, &self.node, reason)),
            None => Ok(()),
        }
    }

    /// UNAVAILABLE for volume `id`, which no served class holds, while a class is unserved: it
    /// may be in that one. `None` when every class is served.
    fn maybe_unserved(&self, id: &str) -> Option<BackendError> {
        let unserved = self.unserved_now();
        (!unserved.is_empty()).then(|| {
            BackendError::Unavailable(format!(
                "volume {id} is in no ready device class on node {}, and it may be in one that \
                 is not ready: {}",
                self.node,
                describe(&unserved)
            ))
        })
    }

    /// `result`, but a NOT_FOUND is [`Self::maybe_unserved`]'s error while a class is unserved.
    fn missing_or_unserved<T>(&self, id: &str, result: Result<T>) -> Result<T> {
        match result {
            Err(BackendError::NotFound(m)) => {
                Err(self.maybe_unserved(id).unwrap_or(BackendError::NotFound(m)))
            }
            other => other,
        }
    }

    /// `joined_shared` (what `NodeGetInfo` advertises) first waits up to `wait` until `settling`
    /// is known and empty.
    #[must_use]
    pub fn with_settling(
        mut self,
        settling: watch::Receiver<Option<BTreeSet<String>>>,
        wait: Duration,
    ) -> Self {
        self.settling = Some((settling, wait));
        self
    }

    async fn settle(&self) {
        let Some((settling, wait)) = &self.settling else {
            return;
        };
        let mut settling = settling.clone();
        let settled = |s: &Option<BTreeSet<String>>| s.as_ref().is_some_and(BTreeSet::is_empty);
        if tokio::time::timeout(*wait, settling.wait_for(settled))
            .await
            .is_err()
        {
            tracing::warn!(
                node = %self.node,
                joining = ?settling.borrow().clone(),
                waited_s = wait.as_secs(),
                "answering without the shared classes still joining: restart this node's pod once \
                 they joined, so kubelet learns their topology"
            );
        }
    }

    fn current(&self) -> Option<Arc<B>> {
        self.current.borrow().clone()
    }

    fn or_unavailable(&self) -> Result<Arc<B>> {
        self.current().ok_or_else(|| {
            let unserved = self.unserved_now();
            BackendError::Unavailable(if unserved.is_empty() {
                format!(
                    "no device class is ready on node {} yet: see its LVMVolumeGroupNodeStatus",
                    self.node
                )
            } else {
                format!(
                    "no device class is ready on node {}: {}",
                    self.node,
                    describe(&unserved)
                )
            })
        })
    }
}

/// `class: reason; …`.
fn describe(unserved: &[(DeviceClassConfig, String)]) -> String {
    unserved
        .iter()
        .map(|(c, r)| format!("{}: {r}", c.name))
        .collect::<Vec<_>>()
        .join("; ")
}

impl<B: Backend> Backend for Switch<B> {
    fn node_id(&self) -> &str {
        &self.node
    }

    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.current().map(|b| b.classes()).unwrap_or_default()
    }

    fn unserved(&self) -> Vec<(DeviceClassConfig, String)> {
        self.unserved_now()
    }

    async fn ready(&self) -> Result<bool> {
        match self.current() {
            Some(b) => b.ready().await,
            None => Ok(false),
        }
    }

    async fn get(&self, id: &str) -> Result<Option<Volume>> {
        self.or_unavailable()?.get(id).await
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        self.or_unavailable()?.list().await
    }

    async fn create_volume(&self, req: &NewVolume) -> Result<Volume> {
        self.served(&req.class)?;
        self.or_unavailable()?.create_volume(req).await
    }

    async fn create_snapshot(&self, req: &NewSnapshot) -> Result<Volume> {
        self.or_unavailable()?.create_snapshot(req).await
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        let removed = self.or_unavailable()?.delete(id).await;
        match self.missing_or_unserved(id, removed)? {
            false => self.maybe_unserved(id).map_or(Ok(false), Err),
            true => Ok(true),
        }
    }

    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        let grown = self.or_unavailable()?.expand(id, size).await;
        self.missing_or_unserved(id, grown)
    }

    async fn capacity(&self, class: &str, layout: &Layout) -> Result<Capacity> {
        self.served(class)?;
        self.or_unavailable()?.capacity(class, layout).await
    }

    async fn free_space(&self, class: &str) -> Result<Option<FreeSpace>> {
        self.served(class)?;
        self.or_unavailable()?.free_space(class).await
    }

    async fn activate(&self, id: &str) -> Result<String> {
        let device = self.or_unavailable()?.activate(id).await;
        self.missing_or_unserved(id, device)
    }

    async fn activate_for(&self, id: &str, multi_node: bool) -> Result<String> {
        let device = self.or_unavailable()?.activate_for(id, multi_node).await;
        self.missing_or_unserved(id, device)
    }

    async fn joined_shared(&self) -> Vec<String> {
        self.settle().await;
        match self.current() {
            Some(b) => b.joined_shared().await,
            None => Vec::new(),
        }
    }

    async fn release(&self, id: &str) -> Result<()> {
        self.or_unavailable()?.release(id).await
    }

    async fn usage(&self, class: &str) -> Result<Option<Usage>> {
        self.or_unavailable()?.usage(class).await
    }

    async fn take_over(&self, req: &TakeOver) -> Result<Volume> {
        self.or_unavailable()?.take_over(req).await
    }

    async fn allocated(&self, id: &str) -> Result<BlockRanges> {
        self.or_unavailable()?.allocated(id).await
    }

    async fn changed(&self, base: &str, target: &str) -> Result<BlockRanges> {
        self.or_unavailable()?.changed(base, target).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lvms_testkit::fake_backend::FakeBackend;

    use super::*;

    #[tokio::test]
    async fn forwards_to_the_backend_of_the_moment_and_is_unavailable_without_one() {
        let (tx, rx) = watch::channel(None);
        let switch = Switch::new("node-a", rx);
        assert!(!switch.ready().await.unwrap());
        assert!(switch.classes().is_empty());
        let err = switch.get("x").await.unwrap_err();
        assert!(
            matches!(err, BackendError::Unavailable(ref m) if m.contains("node-a")),
            "{err}"
        );

        let backend = Arc::new(FakeBackend::new());
        tx.send_replace(Some(backend.clone()));
        assert!(switch.ready().await.unwrap());
        assert_eq!(switch.classes().len(), 2);
        switch.delete("gone").await.unwrap();
        assert_eq!(backend.calls(), ["delete gone"]);

        tx.send_replace(None);
        assert!(switch.list().await.is_err());
    }

    #[tokio::test]
    async fn an_unserved_class_answers_its_reason_and_a_missing_volume_is_unavailable_meanwhile() {
        let (tx, rx) = watch::channel(Some(Arc::new(FakeBackend::new())));
        let (why, unserved) = watch::channel(vec![(
            DeviceClassConfig::named("bad"),
            "/dev/vdc holds a foreign volume group".to_owned(),
        )]);
        let switch = Switch::new("node-a", rx).with_unserved(unserved);
        let new = |class: &str| NewVolume {
            name: "pvc-1".into(),
            class: class.into(),
            size: 64 << 20,
            lv_type: None,
            volume_mode: None,
            source: None,
            ephemeral: None,
        };
        let err = switch.create_volume(&new("bad")).await.unwrap_err();
        assert!(
            matches!(&err, BackendError::Unavailable(m)
                if m.contains("device class bad") && m.contains("foreign volume group")),
            "{err}"
        );
        let err = switch
            .capacity("bad", &Layout::default())
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::Unavailable(_)), "{err}");
        // The served classes work as before; a lookup of a volume not there is `None` (so that
        // CreateVolume can look its new volume up first).
        assert!(switch.get("elsewhere").await.unwrap().is_none());
        let made = switch.create_volume(&new("thin")).await.unwrap();
        assert_eq!(switch.get(&made.id).await.unwrap().unwrap().id, made.id);
        // A volume no served class holds may be in the unserved one: not deleted, not NOT_FOUND.
        for err in [
            switch.delete("elsewhere").await.unwrap_err(),
            switch.expand("elsewhere", 1 << 30).await.unwrap_err(),
        ] {
            assert!(
                matches!(&err, BackendError::Unavailable(m) if m.contains("bad: /dev/vdc")),
                "{err}"
            );
        }
        // Once every class is served, a missing volume is simply missing.
        why.send_replace(Vec::new());
        assert!(switch.get("elsewhere").await.unwrap().is_none());
        assert!(!switch.delete("elsewhere").await.unwrap());
        drop(tx);
    }

    /// The trait's defaults are those of a backend without shared classes: a `Switch` that did not
    /// forward these would advertise no shared segment in `NodeGetInfo`, refuse MULTI_NODE stages,
    /// skip a shared volume's exclusive activation and first-use zeroing, and never deactivate it
    /// at unstage.
    #[tokio::test]
    async fn forwards_the_shared_class_calls() {
        let (tx, rx) = watch::channel(None);
        let switch = Switch::new("node-a", rx);
        assert!(switch.joined_shared().await.is_empty());
        let backend = Arc::new(
            FakeBackend::new().with_shared("thick", lvms_core::config::SharedVolumeMode::Linear),
        );
        tx.send_replace(Some(backend.clone()));
        let volume = switch
            .create_volume(&NewVolume {
                name: "pvc-1".into(),
                class: "thick".into(),
                size: 64 << 20,
                lv_type: None,
                volume_mode: None,
                source: None,
                ephemeral: None,
            })
            .await
            .unwrap();

        assert_eq!(switch.joined_shared().await, ["thick"]);
        assert_eq!(
            switch.activate_for(&volume.id, true).await.unwrap(),
            volume.device
        );
        switch.release(&volume.id).await.unwrap();
        assert_eq!(
            backend.calls(),
            [
                "create_volume pvc-1".to_owned(),
                format!("activate_for {} multi_node=true", volume.id),
                format!("release {}", volume.id),
            ]
        );
    }

    /// Kubelet keeps the topology of its one `NodeGetInfo` at registration: the shared segments
    /// wait for the classes still joining, and for at most the bound when one never settles.
    #[tokio::test(start_paused = true)]
    async fn joined_shared_waits_for_the_classes_still_joining_at_most_the_bound() {
        let backend =
            FakeBackend::new().with_shared("thick", lvms_core::config::SharedVolumeMode::Linear);
        let (_tx, rx) = watch::channel(Some(Arc::new(backend)));
        let (settle, settling) = watch::channel(None);
        let switch = Arc::new(Switch::new("node-a", rx).with_settling(settling, SETTLE_WAIT));
        let asked = tokio::spawn({
            let switch = switch.clone();
            async move { switch.joined_shared().await }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!asked.is_finished(), "which classes join is not known yet");
        settle.send_replace(Some(BTreeSet::from(["thick".to_owned()])));
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!asked.is_finished(), "thick is still joining");
        settle.send_replace(Some(BTreeSet::new()));
        assert_eq!(asked.await.unwrap(), ["thick"]);

        settle.send_replace(Some(BTreeSet::from(["late".to_owned()])));
        let started = tokio::time::Instant::now();
        assert_eq!(switch.joined_shared().await, ["thick"]);
        assert_eq!(started.elapsed(), SETTLE_WAIT, "answered at the bound");

        let unbounded = Switch::new("node-a", watch::channel(None::<Arc<FakeBackend>>).1);
        let started = tokio::time::Instant::now();
        assert!(unbounded.joined_shared().await.is_empty());
        assert_eq!(
            started.elapsed(),
            Duration::ZERO,
            "no settling given: no wait"
        );
    }
}
