//! [`Switch`]: the node agent's CSI backend. The volume-group reconciler makes a new backend whenever the
//! set of ready device classes changes ([`crate::vg_reconciler::Context::backend`]); the CSI services
//! hold a `Switch`, which forwards every call to the backend of the moment. Before any class is ready
//! there is none: lookups answer `Unavailable` and `ready` is false, so `Probe` says not ready.

use std::sync::Arc;

use lvms_csi::backend::{
    Backend, BackendError, Capacity, ClassInfo, NewSnapshot, NewVolume, Result, Usage, Volume,
};
use tokio::sync::watch;

/// A [`Backend`] that forwards to the current backend of a `watch` channel.
pub struct Switch<B> {
    node: String,
    current: watch::Receiver<Option<Arc<B>>>,
}

impl<B> Switch<B> {
    pub fn new(node: impl Into<String>, current: watch::Receiver<Option<Arc<B>>>) -> Self {
        Self {
            node: node.into(),
            current,
        }
    }

    fn current(&self) -> Option<Arc<B>> {
        self.current.borrow().clone()
    }

    fn or_unavailable(&self) -> Result<Arc<B>> {
        self.current().ok_or_else(|| {
            BackendError::Unavailable(format!(
                "no device class is ready on node {} yet: see its LVMVolumeGroupNodeStatus",
                self.node
            ))
        })
    }
}

impl<B: Backend> Backend for Switch<B> {
    fn node_id(&self) -> &str {
        &self.node
    }

    fn classes(&self) -> Vec<ClassInfo> {
        self.current().map(|b| b.classes()).unwrap_or_default()
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
        self.or_unavailable()?.create_volume(req).await
    }

    async fn create_snapshot(&self, req: &NewSnapshot) -> Result<Volume> {
        self.or_unavailable()?.create_snapshot(req).await
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        self.or_unavailable()?.delete(id).await
    }

    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        self.or_unavailable()?.expand(id, size).await
    }

    async fn capacity(&self, class: &str) -> Result<Capacity> {
        self.or_unavailable()?.capacity(class).await
    }

    async fn activate(&self, id: &str) -> Result<String> {
        self.or_unavailable()?.activate(id).await
    }

    async fn activate_for(&self, id: &str, multi_node: bool) -> Result<String> {
        self.or_unavailable()?.activate_for(id, multi_node).await
    }

    async fn joined_shared(&self) -> Vec<String> {
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
}
