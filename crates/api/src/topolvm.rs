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
