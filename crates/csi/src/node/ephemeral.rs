//! CSI inline ephemeral volumes (`volumeLifecycleModes: Ephemeral`, ADR 0021): kubelet calls
//! `NodePublishVolume` with no staging path and a volume context holding the pod's
//! `volumeAttributes` and [`EPHEMERAL`]` = "true"`; the node makes the LV then and removes it at
//! `NodeUnpublishVolume`.
//!
//! The attributes, as csi-driver-lvm reads them, plus the class our StorageClasses name:
//! - [`SIZE`]: a Kubernetes quantity, [`DEFAULT_SIZE`] (1Gi) when absent;
//! - [`params::CSI_DRIVER_LVM_TYPE`] (`linear`, `striped`, `mirror`) and every other layout
//!   parameter of a StorageClass ([`params::parse`]);
//! - [`params::FSTYPE`]: ext4 or xfs (the capability's `fs_type` wins when both are given);
//! - [`params::DEVICE_CLASS`]: the class, the default class when absent.
//!
//! The LV name is [`lvms_engine::ids::volume_lv_name`] of kubelet's volume id, so a retried publish finds
//! the LV an earlier one made; the LV carries [`lvms_engine::ids::EPHEMERAL_TAG`] and its pod's uid,
//! namespace and name.

use std::{collections::HashMap, io};

use lvms_core::{config::Fstype, size::ByteSize};
use lvms_engine::{
    backend::{Backend, BackendError, DeviceClassConfig, Layout, NewVolume, Volume},
    ids::EphemeralOwner,
};
use lvms_host::{
    fs::{find_mount_by_target, fstype_name},
    runner::Runner,
};

use super::{
    NodeService, PublishError, RequestError, UnpublishError, device_ids, prepare_target,
    refuse_to_hide, remove_target,
    request::{self, Access, Invalid, known_fstype},
    table::{self, Stage},
};
use crate::{
    csi::{
        NodePublishVolumeRequest, NodePublishVolumeResponse, NodeUnpublishVolumeRequest,
        NodeUnpublishVolumeResponse,
    },
    params,
};

/// The volume-context key kubelet sets to `"true"` for an inline ephemeral volume.
pub const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// The pod's uid (kubelet sends it with `podInfoOnMount: true`).
pub const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
/// The pod's namespace.
pub const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
/// The pod's name.
pub const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// The size attribute (csi-driver-lvm's name).
pub const SIZE: &str = "size";
/// The size of an ephemeral volume whose attributes name none.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// Whether a publish is of an inline ephemeral volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL).is_some_and(|v| v == "true")
}

/// An ephemeral volume's attributes, as understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attributes {
    /// Bytes (before rounding to extents).
    pub size: u64,
    /// The class asked for; `None`: the default class.
    pub class: Option<String>,
    /// The layout asked for; `None`: the class's.
    pub layout: Option<Layout>,
    /// The filesystem asked for; `None`: the class's, else the driver's default.
    pub fstype: Option<Fstype>,
    /// The pod it is made for.
    pub owner: EphemeralOwner,
}

/// Reads the volume context of an ephemeral publish; the error names the attribute.
pub fn parse(context: &HashMap<String, String>) -> Result<Attributes, String> {
    let size = match context.get(SIZE) {
        None => DEFAULT_SIZE,
        Some(v) => match v.parse::<ByteSize>() {
            Ok(ByteSize(0)) => {
                return Err(format!(
                    "volume attribute {SIZE}={v:?} is zero: ask for a size such as 1Gi"
                ));
            }
            Ok(ByteSize(n)) => n,
            Err(e) => return Err(format!("volume attribute {SIZE}: {e}")),
        },
    };
    let p = params::parse(context).map_err(|e| format!("volume attribute: {e}"))?;
    if p.volume_mode.is_some() {
        return Err(format!(
            "volume attribute {} does not apply to inline ephemeral volumes, which live on one \
             node: remove it",
            params::VOLUME_MODE
        ));
    }
    let fstype = p.fstype.as_deref().and_then(known_fstype);
    let get = |k: &str| context.get(k).cloned().unwrap_or_default();
    Ok(Attributes {
        size,
        class: p.class,
        layout: p.lv_type,
        fstype,
        owner: EphemeralOwner {
            pod_uid: get(POD_UID),
            pod_namespace: get(POD_NAMESPACE),
            pod_name: get(POD_NAME),
        },
    })
}

/// The Node service's side of inline ephemeral volumes: publish makes the LV, unpublish removes it.
impl<B: Backend, R: Runner> NodeService<B, R> {
    /// The inline ephemeral volume the CO calls `id` (an id this driver never hands out), if its LV
    /// is on this node.
    pub(super) async fn ephemeral_volume(&self, id: &str) -> Result<Option<Volume>, RequestError> {
        if lvms_engine::ids::is_volume_id(id) || lvms_engine::ids::is_taken_over_id(id) {
            return Ok(None);
        }
        let lv = lvms_engine::ids::volume_lv_name(id);
        Ok(self
            .backend
            .get(&lv)
            .await
            .map_err(|source| RequestError::Lookup { id: lv, source })?
            .filter(|v| v.ephemeral.is_some()))
    }

    /// The class of an inline ephemeral volume: the one its attributes name, else the default class,
    /// else the only class.
    pub(super) fn ephemeral_class(
        &self,
        asked: Option<&str>,
    ) -> Result<DeviceClassConfig, PublishError> {
        let classes = self.backend.classes();
        if classes.is_empty() {
            return Err(PublishError::Ephemeral {
                step: "choosing a device class for",
                id: String::new(),
                source: BackendError::Unavailable(format!(
                    "no device class is ready on node {} yet",
                    self.backend.node_id()
                )),
            });
        }
        let names = || {
            classes
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let found = match asked {
            Some(name) => classes.iter().find(|c| c.name == name).ok_or_else(|| {
                format!(
                    "volume attribute {}={name:?} names no device class of node {}: use one of {}",
                    crate::params::DEVICE_CLASS,
                    self.backend.node_id(),
                    names()
                )
            }),
            None => classes
                .iter()
                .find(|c| c.default)
                .or_else(|| classes.first().filter(|_| classes.len() == 1))
                .ok_or_else(|| {
                    format!(
                        "no volume attribute {} and no default device class: set it to one of {}",
                        crate::params::DEVICE_CLASS,
                        names()
                    )
                }),
        }
        .map_err(Invalid::Argument)?;
        if found.shared().is_some() {
            return Err(Invalid::Argument(format!(
                "volume attribute {}: device class {} is shared, and inline ephemeral volumes live \
                 on one node's own disks: use a local class",
                crate::params::DEVICE_CLASS,
                found.name
            ))
            .into());
        }
        Ok(found.clone())
    }

    /// `NodePublishVolume` of an inline ephemeral volume ([`ephemeral`]): makes its LV (or finds the
    /// one an earlier call made), formats it when blank and mounts it at the target. No staging.
    pub(super) async fn publish_ephemeral(
        &self,
        req: &NodePublishVolumeRequest,
        cap: &request::Capability,
    ) -> Result<NodePublishVolumeResponse, PublishError> {
        let Access::Mount {
            fstype: asked,
            flags,
        } = &cap.access
        else {
            return Err(Invalid::Argument(
                "inline ephemeral volumes are filesystems: block access is not supported"
                    .to_owned(),
            )
            .into());
        };
        let attrs = parse(&req.volume_context).map_err(Invalid::Argument)?;
        let class = self.ephemeral_class(attrs.class.as_deref())?;
        let target = req.target_path.as_str();
        let readonly = req.readonly || cap.reader_only();
        let _guard = self
            .in_flight
            .try_claim(&[&req.volume_id])
            .map_err(RequestError::Busy)?;
        let failed = |step: &'static str| {
            let id = req.volume_id.clone();
            move |source| PublishError::Ephemeral { step, id, source }
        };
        // Before any volume is made: a target not mounted yet must hold nothing a mount would hide.
        // Making and activating the LV mounts nothing, so this mount table serves the decision below.
        let mounts = self.mounts().await?;
        if find_mount_by_target(&mounts, target).is_none() {
            refuse_to_hide("target path", target).await?;
        }
        let vol = self
            .backend
            .create_volume(&NewVolume {
                name: req.volume_id.clone(),
                class: class.name.clone(),
                size: attrs.size,
                lv_type: attrs.layout,
                volume_mode: None,
                source: None,
                ephemeral: Some(attrs.owner),
            })
            .await
            .map_err(failed("creating"))?;
        if vol.ephemeral.is_none() {
            return Err(PublishError::Incompatible(format!(
                "LV {} of volume {} exists and is not an inline ephemeral volume",
                vol.id, req.volume_id
            )));
        }
        let device = self
            .backend
            .activate(&vol.id)
            .await
            .map_err(failed("activating"))?;
        let ids = device_ids(&device)?.ok_or_else(|| RequestError::Device {
            device: device.clone(),
            source: io::Error::new(io::ErrorKind::NotFound, "no such device after activation"),
        })?;
        let wanted = asked.or(attrs.fstype);
        match table::decide_stage(&mounts, &ids, target, wanted.map(fstype_name), readonly) {
            Stage::Incompatible(m) => return Err(PublishError::Incompatible(m)),
            Stage::AlreadyStaged => {
                tracing::debug!(device, "ephemeral volume already published");
                return Ok(NodePublishVolumeResponse {});
            }
            Stage::Mount => {}
        }
        let host = |step: &'static str| {
            let device = device.clone();
            move |source| PublishError::Host {
                step,
                device,
                source,
            }
        };
        let (fstype, blank) = match self.fs.detect_fs(&device).await.map_err(host("probing"))? {
            None => (
                wanted.unwrap_or_else(|| self.fstype_of_class(&class.name)),
                true,
            ),
            Some(sig) => match (known_fstype(&sig), wanted) {
                (Some(have), Some(want)) if have != want => {
                    return Err(PublishError::Incompatible(format!(
                        "inline ephemeral volume {} has a {sig} filesystem, not the {} asked for",
                        req.volume_id,
                        fstype_name(want)
                    )));
                }
                (Some(have), _) => (have, false),
                (None, _) => {
                    return Err(PublishError::Incompatible(format!(
                        "{device} has a {sig} signature, which is neither ext4 nor xfs"
                    )));
                }
            },
        };
        if blank {
            tracing::info!(device, fstype = fstype_name(fstype), "formatting");
            self.fs
                .mkfs(&device, fstype)
                .await
                .map_err(host("formatting"))?;
        }
        let created = prepare_target(target, false).await?;
        if let Err(e) = self
            .fs
            .mount(&device, target, fstype, flags, readonly)
            .await
        {
            if created && let Err(e) = remove_target(target).await {
                tracing::warn!(error = %e, "could not remove the target after a failed mount");
            }
            return Err(host("mounting")(e));
        }
        tracing::info!(
            device,
            lv = %vol.id,
            device_class = %class.name,
            fstype = fstype_name(fstype),
            readonly,
            "inline ephemeral volume published"
        );
        Ok(NodePublishVolumeResponse {})
    }

    /// `NodeUnpublishVolume` of an id this driver never hands out: the CO's id of an inline
    /// ephemeral volume. Unmounts it, removes the target, then removes the LV (in that order, so a
    /// retry after a crash finds what is left). With no LV of that id, a target with nothing mounted
    /// is removed and the call succeeds: the volume was unpublished before.
    pub(super) async fn unpublish_ephemeral(
        &self,
        req: &NodeUnpublishVolumeRequest,
    ) -> Result<NodeUnpublishVolumeResponse, UnpublishError> {
        let target = req.target_path.as_str();
        let lv = lvms_engine::ids::volume_lv_name(&req.volume_id);
        let _guard = self
            .in_flight
            .try_claim(&[&req.volume_id])
            .map_err(RequestError::Busy)?;
        let vol = self
            .backend
            .get(&lv)
            .await
            .map_err(|source| RequestError::Lookup {
                id: lv.clone(),
                source,
            })?;
        match vol {
            Some(vol) if vol.ephemeral.is_none() => Err(RequestError::NotFound(format!(
                "volume {:?} is not a volume of this driver",
                req.volume_id
            ))
            .into()),
            Some(vol) => {
                self.unmount_target(target, &vol).await?;
                self.backend.delete(&vol.id).await.map_err(|source| {
                    UnpublishError::RemoveEphemeral {
                        id: vol.id.clone(),
                        source,
                    }
                })?;
                tracing::info!(lv = %vol.id, "inline ephemeral volume unpublished and removed");
                Ok(NodeUnpublishVolumeResponse {})
            }
            None => {
                self.unmount_target(target, None).await?;
                tracing::info!("unpublished (no LV of this id)");
                Ok(NodeUnpublishVolumeResponse {})
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(kv: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = kv
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        m.insert(EPHEMERAL.into(), "true".into());
        m.insert(POD_UID.into(), "uid-1".into());
        m.insert(POD_NAMESPACE.into(), "default".into());
        m.insert(POD_NAME.into(), "app".into());
        m.insert(
            "csi.storage.k8s.io/serviceAccount.name".into(),
            "default".into(),
        );
        m
    }

    #[test]
    fn only_ephemeral_true_is_ephemeral() {
        assert!(is_ephemeral(&ctx(&[])));
        assert!(!is_ephemeral(&HashMap::new()));
        assert!(!is_ephemeral(&HashMap::from([(
            EPHEMERAL.to_owned(),
            "false".to_owned()
        )])));
    }

    #[test]
    fn defaults_are_one_gibibyte_in_the_default_class_with_its_layout_and_filesystem() {
        let a = parse(&ctx(&[])).unwrap();
        assert_eq!(
            a,
            Attributes {
                size: DEFAULT_SIZE,
                class: None,
                layout: None,
                fstype: None,
                owner: EphemeralOwner {
                    pod_uid: "uid-1".into(),
                    pod_namespace: "default".into(),
                    pod_name: "app".into(),
                },
            }
        );
    }

    #[test]
    fn csi_driver_lvm_attributes_and_our_class_parse() {
        let a = parse(&ctx(&[
            (SIZE, "20Mi"),
            ("type", "mirror"),
            (params::FSTYPE, "xfs"),
            (params::DEVICE_CLASS, "ssd"),
        ]))
        .unwrap();
        assert_eq!(a.size, 20 << 20);
        assert_eq!(a.class.as_deref(), Some("ssd"));
        assert_eq!(a.fstype, Some(Fstype::Xfs));
        assert!(matches!(a.layout, Some(Layout::Mirror { mirrors: 1, .. })));
        let a = parse(&ctx(&[("type", "striped")])).unwrap();
        assert!(matches!(a.layout, Some(Layout::Striped { .. })));
    }

    #[test]
    fn each_bad_attribute_is_named() {
        for (kv, named) in [
            ((SIZE, "lots"), SIZE),
            ((SIZE, "0"), SIZE),
            ((SIZE, "-1Gi"), SIZE),
            (("type", "raid7"), "type"),
            ((params::FSTYPE, "btrfs"), params::FSTYPE),
            ((params::DEVICE_CLASS, ""), params::DEVICE_CLASS),
            ((params::VOLUME_MODE, "thin"), params::VOLUME_MODE),
            (("lvms.topolvm.io/stripez", "2"), "lvms.topolvm.io/stripez"),
        ] {
            let err = parse(&ctx(&[kv])).unwrap_err();
            assert!(err.contains(named), "{kv:?}: {err}");
        }
    }
}
