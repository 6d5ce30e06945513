//! Builders of CSI requests for the tests that drive a Controller service through the generated client
//! (the CSI contract tests, the cluster controller's tests, the e2e folder).

use lvms_csi::{
    TOPOLOGY_NODE_KEY,
    csi::{
        CapacityRange, ControllerExpandVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest,
        Topology, TopologyRequirement, VolumeCapability, VolumeContentSource,
        volume_capability::{self, AccessMode, BlockVolume, MountVolume, access_mode::Mode},
        volume_content_source,
    },
};

/// A mount capability with filesystem `fs`.
pub fn mount(mode: Mode, fs: &str) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(volume_capability::AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..MountVolume::default()
        })),
    }
}

/// A block capability.
pub fn block(mode: Mode) -> VolumeCapability {
    VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(volume_capability::AccessType::Block(BlockVolume {})),
    }
}

pub fn range(required: i64, limit: i64) -> Option<CapacityRange> {
    Some(CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    })
}

/// A ControllerExpandVolume of volume `id` to at least `required` bytes, for a volume used as
/// `capability`.
pub fn expand(
    id: &str,
    required: i64,
    capability: Option<VolumeCapability>,
) -> ControllerExpandVolumeRequest {
    ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: range(required, 0),
        volume_capability: capability,
        ..ControllerExpandVolumeRequest::default()
    }
}

/// A CreateSnapshot `name` of volume `source`.
pub fn snapshot(source: &str, name: &str) -> CreateSnapshotRequest {
    CreateSnapshotRequest {
        source_volume_id: source.into(),
        name: name.into(),
        ..CreateSnapshotRequest::default()
    }
}

/// A CreateVolume of `size` bytes, mounted xfs, single-node writer.
pub fn create(name: &str, size: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        capacity_range: range(size, 0),
        volume_capabilities: vec![mount(Mode::SingleNodeWriter, "xfs")],
        ..CreateVolumeRequest::default()
    }
}

/// `req` in device class `class`.
pub fn in_class(mut req: CreateVolumeRequest, class: &str) -> CreateVolumeRequest {
    req.parameters
        .insert("topolvm.io/device-class".into(), class.into());
    req
}

/// `req` restored from snapshot `id`.
pub fn from_snapshot(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Snapshot(
            volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    });
    req
}

/// `req` cloned from volume `id`.
pub fn from_volume(mut req: CreateVolumeRequest, id: &str) -> CreateVolumeRequest {
    req.volume_content_source = Some(VolumeContentSource {
        r#type: Some(volume_content_source::Type::Volume(
            volume_content_source::VolumeSource {
                volume_id: id.into(),
            },
        )),
    });
    req
}

/// The topology segment of node `node`.
pub fn on(node: &str) -> Topology {
    Topology {
        segments: [(TOPOLOGY_NODE_KEY.to_owned(), node.to_owned())].into(),
    }
}

/// `req` required on `node` (requisite and preferred).
pub fn on_node(mut req: CreateVolumeRequest, node: &str) -> CreateVolumeRequest {
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![on(node)],
        preferred: vec![on(node)],
    });
    req
}
