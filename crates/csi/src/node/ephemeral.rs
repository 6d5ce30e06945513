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

use std::collections::HashMap;

use lvms_core::{config::Fstype, size::ByteSize};

use super::request::known_fstype;
use crate::params;
use lvms_engine::{backend::Layout, ids::EphemeralOwner};

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
