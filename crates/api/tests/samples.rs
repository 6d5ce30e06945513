//! LVMS's own example manifests (tests/samples, sources noted in each file; the few written by us
//! say so) are accepted unchanged:
//! they deserialise into our types, serialise back to exactly the same JSON, satisfy the generated
//! schema's types, enums and bounds, and pass its CEL rules on create.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{cel_errors, sample, samples, schema, schema_violations};
use lvms_api::{
    ChunkSizeCalculationPolicy, DeviceDiscoveryPolicy, DeviceFilesystemType, LVMCluster,
    LVMStateType, LogicalVolume, MetadataSizePolicy, RaidType, ReclaimPolicy, SharedVolumeMode,
    VGStatusType, VolumeBindingMode, WipePolicy,
};
use serde_json::Value;

fn kind(value: &Value) -> &str {
    value["kind"].as_str().expect("sample has a kind")
}

fn round_trip(value: &Value) -> Value {
    match kind(value) {
        "LVMCluster" => {
            let typed: LVMCluster = serde_json::from_value(value.clone()).expect("deserialises");
            serde_json::to_value(typed).expect("serialises")
        }
        "LogicalVolume" => {
            let typed: LogicalVolume = serde_json::from_value(value.clone()).expect("deserialises");
            serde_json::to_value(typed).expect("serialises")
        }
        other => panic!("no type for kind {other}"),
    }
}

#[test]
fn there_are_samples_for_every_documented_layout() {
    let names: Vec<String> = samples().into_iter().map(|(n, _)| n).collect();
    for expected in [
        "lvmcluster_single_class_thin_pool.yaml",
        "lvmcluster_thin_pool_all_fields.yaml",
        "lvmcluster_multiple_classes_with_paths.yaml",
        "lvmcluster_raid1.yaml",
        "logicalvolume.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "missing sample {expected}"
        );
    }
}

#[test]
fn every_sample_round_trips_through_the_types_unchanged() {
    for (name, value) in samples() {
        let back = round_trip(&value);
        assert_eq!(back, value, "{name} changed in the round trip");
    }
}

#[test]
fn every_sample_satisfies_the_generated_schema() {
    for (name, value) in samples() {
        let violations = schema_violations(&schema(kind(&value)), &value);
        assert!(violations.is_empty(), "{name}: {violations:#?}");
    }
}

#[test]
fn every_sample_passes_the_cel_rules_on_create() {
    for (name, value) in samples() {
        let errors = cel_errors(kind(&value), &value, None);
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
}

#[test]
fn every_sample_passes_the_cel_rules_when_reapplied_unchanged() {
    for (name, value) in samples() {
        let errors = cel_errors(kind(&value), &value, Some(&value));
        assert!(errors.is_empty(), "{name}: {errors:?}");
    }
}

fn cluster(name: &str) -> LVMCluster {
    serde_json::from_value(sample(name)).expect("deserialises")
}

#[test]
fn single_class_sample_reads_defaults_where_fields_are_absent() {
    let c = cluster("lvmcluster_single_class_thin_pool.yaml");
    let class = &c.spec.storage.device_classes[0];
    assert_eq!(class.name, "vg1");
    assert!(class.default);
    assert_eq!(class.fstype_or_default(), DeviceFilesystemType::Xfs);
    assert!(class.device_selector.is_none());
    let pool = class.thin_pool_config.as_ref().expect("thin pool");
    assert_eq!(pool.size_percent_or_default(), 90);
    assert_eq!(pool.overprovision_ratio, 10);
    assert_eq!(
        pool.chunk_size_policy_or_default(),
        ChunkSizeCalculationPolicy::Static
    );
    assert_eq!(
        pool.metadata_size_policy_or_default(),
        MetadataSizePolicy::Host
    );
}

#[test]
fn full_thin_pool_sample_reads_every_field() {
    let c = cluster("lvmcluster_thin_pool_all_fields.yaml");
    assert_eq!(c.spec.tolerations[0].key.as_deref(), Some("xyz"));
    let class = &c.spec.storage.device_classes[0];
    assert_eq!(class.filesystem_type, Some(DeviceFilesystemType::Ext4));
    let sel = class.device_selector.as_ref().expect("selector");
    assert_eq!(sel.paths.len(), 2);
    assert_eq!(sel.optional_paths.len(), 2);
    assert_eq!(sel.force_wipe_devices_and_destroy_all_data, Some(true));
    assert_eq!(class.all_paths().count(), 4);
    let pool = class.thin_pool_config.as_ref().expect("thin pool");
    assert_eq!(
        pool.chunk_size.as_ref().map(|q| q.0.as_str()),
        Some("128Ki")
    );
    assert_eq!(
        pool.metadata_size.as_ref().map(|q| q.0.as_str()),
        Some("1Gi")
    );
    let terms = &class
        .node_selector
        .as_ref()
        .expect("node selector")
        .node_selector_terms;
    assert_eq!(
        terms[0].match_expressions.as_ref().expect("expressions")[0].key,
        "mykey"
    );
}

#[test]
fn multiple_classes_sample_keeps_per_class_paths_and_options() {
    let c = cluster("lvmcluster_multiple_classes_with_paths.yaml");
    let classes = &c.spec.storage.device_classes;
    assert_eq!(classes.len(), 2);
    assert_eq!(classes[0].all_paths().collect::<Vec<_>>(), ["/dev/nvme0n1"]);
    assert_eq!(classes[1].all_paths().collect::<Vec<_>>(), ["/dev/sda"]);
    let archive = classes[1].storage_class_options.as_ref().expect("options");
    assert_eq!(archive.reclaim_policy_or_default(), ReclaimPolicy::Retain);
    assert_eq!(
        archive.volume_binding_mode_or_default(),
        VolumeBindingMode::WaitForFirstConsumer
    );
    assert_eq!(archive.additional_labels["tier"], "archive");
}

#[test]
fn raid_samples_read_the_raid_layout() {
    let c = cluster("lvmcluster_raid1.yaml");
    let class = &c.spec.storage.device_classes[0];
    let raid = class.raid_config.as_ref().expect("raid");
    assert_eq!(raid.raid_type, RaidType::Raid1);
    assert_eq!((raid.mirrors, raid.stripes), (None, None));
    assert!(class.thin_pool_config.is_none());

    let c = cluster("lvmcluster_raid10_all_fields.yaml");
    let raid = c.spec.storage.device_classes[0]
        .raid_config
        .clone()
        .expect("raid");
    assert_eq!(raid.raid_type, RaidType::Raid10);
    assert_eq!((raid.mirrors, raid.stripes), (Some(1), Some(2)));
    assert_eq!(raid.stripe_size.map(|q| q.0), Some("512Ki".to_owned()));
}

#[test]
fn discovery_policy_sample_reads_the_policy() {
    let c = cluster("lvmcluster_static_discovery.yaml");
    assert_eq!(
        c.spec.storage.device_classes[0].device_discovery_policy,
        Some(DeviceDiscoveryPolicy::Static)
    );
}

#[test]
fn shared_sample_reads_the_policy_and_shared_config() {
    let c = cluster("lvmcluster_shared.yaml");
    let [local, san] = c.spec.storage.device_classes.as_slice() else {
        panic!("two classes");
    };
    assert!(!local.is_shared());
    assert!(san.is_shared());
    let config = san.shared_config_or_default();
    assert_eq!(config.volume_mode_or_default(), SharedVolumeMode::Linear);
    assert_eq!(config.wipe_policy_or_default(), WipePolicy::Full);
    assert_eq!(config.io_timeout_seconds_or_default(), 10);
    assert_eq!(san.all_paths().count(), 2);
}

#[test]
fn status_sample_reads_state_and_node_status() {
    let c = cluster("lvmcluster_status.yaml");
    let status = c.status.expect("status");
    assert_eq!(status.state, Some(LVMStateType::Failed));
    let node = &status.device_class_statuses[0].node_status[0];
    assert_eq!(node.node, "my-node-1.example.com");
    assert_eq!(node.vg_status.status, Some(VGStatusType::Failed));
    assert_eq!(
        node.vg_status.reason,
        "no available devices found for volume group"
    );
}

#[test]
fn logical_volume_sample_reads_snapshot_fields() {
    let lv: LogicalVolume =
        serde_json::from_value(sample("logicalvolume.yaml")).expect("deserialises");
    assert_eq!(lv.spec.node_name, "worker-0");
    assert_eq!(lv.spec.access_type, "ro");
    let status = lv.status.expect("status");
    assert_eq!(status.code, 0);
    assert_eq!(status.current_size.map(|q| q.0), Some("1Gi".to_owned()));
}

#[test]
fn a_manifest_with_an_unknown_enum_value_does_not_deserialise() {
    let mut value = sample("lvmcluster_single_class_thin_pool.yaml");
    value["spec"]["storage"]["deviceClasses"][0]["fstype"] = "btrfs".into();
    assert!(serde_json::from_value::<LVMCluster>(value.clone()).is_err());
    let violations = schema_violations(&schema("LVMCluster"), &value);
    assert_eq!(violations.len(), 1, "{violations:?}");
}
