//! [`CsiDriverLvmVolumes`]: the backend of the second CSI endpoint the node agent serves, under
//! metal-stack csi-driver-lvm's driver name, for the PersistentVolumes csi-driver-lvm made in a
//! group a class adopted (`adopt: csi-driver-lvm`, ADR 0033).
//!
//! It is a view of the node's one backend, not a second engine: it answers only csi-driver-lvm's
//! volume ids (`pvc-<UUID>`, [`ids::is_csi_driver_lvm_id`]), only in adopting classes, and takes
//! each volume over ([`Backend::take_over`]: tagged ours in place, nothing else changed) the first
//! time any call names it — kubelet's periodic `NodeGetVolumeStats` for a running pod does. Never
//! while csi-driver-lvm's own node plugin answers on its socket. It makes nothing new: new claims
//! go to lvms-rs's own StorageClasses.

use std::{path::PathBuf, sync::Arc};

use lvms_core::{config::Adopt, layout::FreeSpace};
use lvms_engine::{
    backend::{
        Backend, BackendError, Capacity, DeviceClassConfig, Layout, NewSnapshot, NewVolume, Result,
        TakeOver, Usage, Volume,
    },
    ids,
};

pub use lvms_core::config::{CSI_DRIVER_LVM_DRIVER_NAME, CSI_DRIVER_LVM_TOPOLOGY_KEY};

/// Where csi-driver-lvm's node plugin listens with its Helm chart's defaults (`kubeletPath`
/// `/var/lib/kubelet`, `storageClassStub` `csi-driver-lvm`; its `templates/daemonset.yaml`).
pub const DEFAULT_OLD_SOCKET: &str = "/var/lib/kubelet/plugins/csi-driver-lvm/csi.sock";

/// csi-driver-lvm's volumes of a node's adopting classes, over the node's backend `B`.
pub struct CsiDriverLvmVolumes<B> {
    inner: Arc<B>,
    /// csi-driver-lvm's node plugin socket: while something answers there, nothing is taken over.
    old_driver_socket: Option<PathBuf>,
}

impl<B: Backend> CsiDriverLvmVolumes<B> {
    pub fn new(inner: Arc<B>, old_driver_socket: Option<PathBuf>) -> Self {
        Self {
            inner,
            old_driver_socket,
        }
    }

    fn adopting(&self) -> Vec<DeviceClassConfig> {
        self.inner
            .classes()
            .into_iter()
            .filter(|c| c.adopt == Some(Adopt::CsiDriverLvm))
            .collect()
    }

    /// Takes over csi-driver-lvm's volume `id` from whichever adopting class holds it; `None`
    /// when none does.
    async fn take_over_existing(&self, id: &str) -> Result<Option<Volume>> {
        let classes = self.adopting();
        if classes.is_empty() {
            return Ok(None);
        }
        if let Some(path) = &self.old_driver_socket
            && let Some(why) = crate::lv_reconciler::old_driver_live(path).await
        {
            return Err(BackendError::Unavailable(format!(
                "volume {id} may be csi-driver-lvm's and csi-driver-lvm's node plugin still runs \
                 on node {} ({why}): nothing is taken over while it does; uninstall csi-driver-lvm \
                 (its DaemonSet) first",
                self.inner.node_id()
            )));
        }
        for class in classes {
            let req = TakeOver {
                id: id.to_owned(),
                class: class.name.clone(),
                // csi-driver-lvm's volume id is the CO's name for it.
                name: id.to_owned(),
                snapshot: false,
                source: None,
                created: None,
            };
            match self.inner.take_over(&req).await {
                Ok(volume) => {
                    tracing::info!(
                        volume = id,
                        class = %class.name,
                        "csi-driver-lvm's volume taken over in place"
                    );
                    return Ok(Some(volume));
                }
                Err(BackendError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The volume `id`, taken over first when need be; NotFound when no adopting class holds it.
    async fn existing(&self, id: &str) -> Result<Volume> {
        self.get(id).await?.ok_or_else(|| {
            BackendError::NotFound(format!(
                "volume {id} is not a csi-driver-lvm volume of an adopting class on node {}",
                self.inner.node_id()
            ))
        })
    }
}

/// Why nothing new is made under csi-driver-lvm's name.
fn makes_nothing(what: &str) -> BackendError {
    BackendError::InvalidArgument(format!(
        "lvms-rs serves csi-driver-lvm's existing volumes under {CSI_DRIVER_LVM_DRIVER_NAME} and \
         makes no new {what} there: use an lvms-rs StorageClass (lvms-<class>, provisioner \
         topolvm.io) and VolumeSnapshotClass instead (ADR 0033)"
    ))
}

impl<B: Backend> Backend for CsiDriverLvmVolumes<B> {
    fn node_id(&self) -> &str {
        self.inner.node_id()
    }

    /// The classes that adopt csi-driver-lvm's group: its volumes are in no other.
    fn classes(&self) -> Vec<DeviceClassConfig> {
        self.adopting()
    }

    async fn ready(&self) -> Result<bool> {
        self.inner.ready().await
    }

    async fn get(&self, id: &str) -> Result<Option<Volume>> {
        if !ids::is_csi_driver_lvm_id(id) {
            return Ok(None);
        }
        if let Some(volume) = self.inner.get(id).await? {
            return Ok(Some(volume));
        }
        self.take_over_existing(id).await
    }

    /// Nothing: csi-driver-lvm's volumes are recorded only by their PersistentVolumes, and no
    /// listing may offer them to a collector.
    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(Vec::new())
    }

    async fn create_volume(&self, _req: &NewVolume) -> Result<Volume> {
        Err(makes_nothing("volumes"))
    }

    async fn create_snapshot(&self, _req: &NewSnapshot) -> Result<Volume> {
        Err(makes_nothing("snapshots"))
    }

    async fn delete(&self, id: &str) -> Result<bool> {
        if self.get(id).await?.is_none() {
            return Ok(false);
        }
        self.inner.delete(id).await
    }

    async fn expand(&self, id: &str, size: u64) -> Result<u64> {
        self.existing(id).await?;
        self.inner.expand(id, size).await
    }

    async fn capacity(&self, class: &str, layout: &Layout) -> Result<Capacity> {
        self.inner.capacity(class, layout).await
    }

    async fn free_space(&self, class: &str) -> Result<Option<FreeSpace>> {
        self.inner.free_space(class).await
    }

    async fn activate(&self, id: &str) -> Result<String> {
        self.existing(id).await?;
        self.inner.activate(id).await
    }

    async fn activate_for(&self, id: &str, multi_node: bool) -> Result<String> {
        self.existing(id).await?;
        self.inner.activate_for(id, multi_node).await
    }

    async fn release(&self, id: &str) -> Result<()> {
        self.inner.release(id).await
    }

    async fn usage(&self, class: &str) -> Result<Option<Usage>> {
        self.inner.usage(class).await
    }

    async fn take_over(&self, req: &TakeOver) -> Result<Volume> {
        self.inner.take_over(req).await
    }
}

#[cfg(test)]
mod tests;
