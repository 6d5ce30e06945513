//! `topolvm.io/v1`: `LogicalVolume`, TopoLVM's request from the CSI controller to one node.
//!
//! Kept wire-compatible with TopoLVM so the controller-to-node path stays interchangeable.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn is_zero(code: &i32) -> bool {
    *code == 0
}

/// A logical volume to create on one node. The LV on disk is named after the object's UID; the
/// node agent records it in `status.volumeID`.
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "topolvm.io",
    version = "v1",
    kind = "LogicalVolume",
    plural = "logicalvolumes",
    status = "LogicalVolumeStatus",
    derive = "PartialEq",
    selectable = ".spec.nodeName",
    doc = "LogicalVolume is the Schema for the logicalvolumes API"
)]
#[serde(rename_all = "camelCase")]
pub struct LogicalVolumeSpec {
    /// Requested name (the CSI volume name).
    pub name: String,
    /// Node to create the volume on.
    pub node_name: String,
    /// Requested size.
    pub size: Quantity,
    /// Device class; the default class when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device_class: String,
    /// lvcreate option class (TopoLVM); none when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lvcreate_option_class: String,
    /// Name of the source `LogicalVolume` of a snapshot or clone.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// `ro` for a snapshot, `rw` for a restore or clone; only with `source`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access_type: String,
    /// How a thick volume lays out its extents (lvms-rs; TopoLVM has no such field): from the
    /// StorageClass's layout parameters. Absent: the device class's layout (linear, or its
    /// `raidConfig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<VolumeLayout>,
    /// A shared class's volume: `Linear` or `Thin` (lvms-rs; TopoLVM has no such field), from the
    /// StorageClass parameter `lvms.topolvm.io/volume-mode`. Absent: the class's
    /// `sharedConfig.volumeMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<crate::SharedVolumeMode>,
}

/// A thick volume's layout (`spec.layout`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeLayout {
    /// The segment type.
    #[serde(rename = "type")]
    pub layout_type: LayoutType,
    /// Striped: the stripe count (absent: one per LVM physical volume of the group); raid4/5/6
    /// and raid10: the data stripes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub stripes: Option<u32>,
    /// Striped and RAID: the stripe size, a power of two of at least 4Ki.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_size: Option<Quantity>,
    /// Mirror, raid1 and raid10: extra copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub mirrors: Option<u32>,
    /// Mirror and RAID: skip the initial synchronisation (`lvcreate --nosync`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub nosync: bool,
    /// Mirror and RAID: dm-integrity under each image (`lvcreate --raidintegrity y`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub integrity: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The segment type of a thick volume.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LayoutType {
    #[default]
    Linear,
    Striped,
    /// raid1 with one extra copy unless `mirrors` says otherwise.
    Mirror,
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

/// Observed state of a `LogicalVolume`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
pub struct LogicalVolumeStatus {
    /// The volume's ID (the LV name on disk); set once the LV exists.
    #[serde(rename = "volumeID", default, skip_serializing_if = "String::is_empty")]
    pub volume_id: String,
    /// gRPC status code of the last operation (0, omitted, when it succeeded).
    #[serde(default, skip_serializing_if = "is_zero")]
    #[schemars(range(min = 0))]
    pub code: i32,
    /// Error message of the last operation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Size of the LV on disk.
    #[serde(
        rename = "currentSize",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub current_size: Option<Quantity>,
}
