//! The Container Storage Interface, package `csi.v1`, generated from the vendored `proto/csi.proto`
//! (version and sha256 in `proto/VERSION.md`): messages, `*_server` traits and `*_client` clients for
//! the Identity, Controller, GroupController, SnapshotMetadata and Node services (lvms-rs serves Identity,
//! Controller and Node).

/// `csi.v1`.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used,
    rustdoc::all
)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
}

#[cfg(test)]
mod tests {
    use sha2::{Digest, Sha256};

    /// The sha256 recorded in `proto/VERSION.md`.
    const RECORDED_SHA256: &str =
        "5b81236a3809f3ff0b877ff9b82215d0b74a8e291d7f3ec6ee1a44f537c0f86a";

    #[test]
    fn vendored_proto_matches_the_recorded_sha256() {
        let bytes = include_bytes!("../proto/csi.proto");
        let got = format!("{:x}", Sha256::digest(bytes));
        assert_eq!(
            got, RECORDED_SHA256,
            "csi.proto changed: update proto/VERSION.md"
        );
        let record = include_str!("../proto/VERSION.md");
        assert!(
            record.contains(RECORDED_SHA256),
            "VERSION.md records another sha256"
        );
    }

    #[test]
    fn generated_types_carry_the_spec_fields_lvms_uses() {
        use super::v1::{
            ControllerServiceCapability, GetSnapshotRequest, GetSnapshotResponse,
            NodeServiceCapability, PluginCapability, Snapshot, VolumeCapability,
            controller_service_capability, node_service_capability, plugin_capability,
            volume_capability,
        };
        // Capabilities lvms-rs advertises exist with their spec numbers.
        assert_eq!(
            controller_service_capability::rpc::Type::CreateDeleteVolume as i32,
            1
        );
        assert_eq!(
            controller_service_capability::rpc::Type::GetVolume as i32,
            12
        );
        assert_eq!(
            controller_service_capability::rpc::Type::VolumeCondition as i32,
            11
        );
        assert_eq!(
            controller_service_capability::rpc::Type::SingleNodeMultiWriter as i32,
            13
        );
        // v1.12.0: GET_SNAPSHOT = 15, and ControllerGetSnapshot's messages.
        assert_eq!(
            controller_service_capability::rpc::Type::GetSnapshot as i32,
            15
        );
        let _ = GetSnapshotRequest {
            snapshot_id: String::new(),
            secrets: Default::default(),
        };
        let _ = GetSnapshotResponse {
            snapshot: Some(Snapshot::default()),
        };
        assert_eq!(
            node_service_capability::rpc::Type::VolumeCondition as i32,
            4
        );
        assert_eq!(
            node_service_capability::rpc::Type::SingleNodeMultiWriter as i32,
            5
        );
        assert_eq!(
            plugin_capability::service::Type::VolumeAccessibilityConstraints as i32,
            2
        );
        assert_eq!(
            volume_capability::access_mode::Mode::SingleNodeSingleWriter as i32,
            6
        );
        let _ = (
            ControllerServiceCapability::default(),
            NodeServiceCapability::default(),
            PluginCapability::default(),
            VolumeCapability::default(),
        );
    }
}
