use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;

const NS: &str = "openshift-lvm-storage";

// ---------------------------------------------------------------------------------------------------------
// Fixtures and assertions

fn ctx() -> Context {
    Context {
        operator_namespace: NS.to_owned(),
        other_clusters: Vec::new(),
        existing_shared_volume_groups: BTreeSet::new(),
    }
}

fn cluster(classes: Value) -> LVMCluster {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "my-lvmcluster", "namespace": NS},
        "spec": {"storage": {"deviceClasses": classes}},
    }))
    .expect("fixture deserialises")
}

/// A valid thin class with explicit paths.
fn thin(name: &str, paths: &[&str]) -> Value {
    json!({
        "name": name,
        "deviceSelector": {"paths": paths},
        "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10},
    })
}

/// A valid default thin class `vg1` on `/dev/sdb`.
fn base() -> Value {
    let mut class = thin("vg1", &["/dev/sdb"]);
    class["default"] = json!(true);
    class
}

/// A default RAID class with `devices` paths.
fn raid(config: Value, devices: usize) -> Value {
    let paths: Vec<String> = (0..devices).map(|i| format!("/dev/vd{i}")).collect();
    json!({"name": "r", "default": true, "deviceSelector": {"paths": paths}, "raidConfig": config})
}

fn create(classes: Value) -> Review {
    validate_create(&cluster(classes), &ctx())
}

fn update(old: Value, new: Value) -> Review {
    validate_update(&cluster(old), &cluster(new), &ctx())
}

/// The review has exactly one error, at `field`, and its message contains every fragment (the
/// fragments name the fix).
#[track_caller]
fn assert_only_error(review: &Review, field: &str, fix: &[&str]) {
    assert_eq!(review.errors.len(), 1, "{:#?}", review.errors);
    assert!(!review.allowed());
    assert_error(review, field, fix);
}

/// Some error is at `field` with every fragment in its message.
#[track_caller]
fn assert_error(review: &Review, field: &str, fix: &[&str]) {
    let at: Vec<&FieldError> = review.errors.iter().filter(|e| e.field == field).collect();
    assert!(!at.is_empty(), "no error at {field}: {:#?}", review.errors);
    assert!(
        at.iter().any(|e| fix.iter().all(|f| e.message.contains(f))),
        "no error at {field} mentions {fix:?}: {at:#?}"
    );
}

#[track_caller]
fn assert_allowed(review: &Review) {
    assert!(review.allowed(), "{:#?}", review.errors);
}

#[track_caller]
fn assert_clean(review: &Review) {
    assert_allowed(review);
    assert!(review.warnings.is_empty(), "{:#?}", review.warnings);
}

/// Exactly one warning, containing every fragment.
#[track_caller]
fn assert_only_warning(review: &Review, fragments: &[&str]) {
    assert_allowed(review);
    assert_eq!(review.warnings.len(), 1, "{:#?}", review.warnings);
    for f in fragments {
        assert!(
            review.warnings[0].contains(f),
            "{:?} lacks {f:?}",
            review.warnings[0]
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// Baseline

#[test]
fn valid_single_thin_class_is_allowed_without_warnings() {
    assert_clean(&create(json!([base()])));
}

#[test]
fn review_is_allowed_only_without_errors() {
    let mut review = Review::default();
    review.warn("just so you know");
    assert!(review.allowed());
    review.error("spec", "broken: fix it");
    assert!(!review.allowed());
    assert_eq!(review.errors[0].to_string(), "spec: broken: fix it");
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut class = base();
    class["deviceSelector"]["paths"] = json!(["sdb"]);
    class["thinPoolConfig"]["chunkSize"] = json!("8Ki");
    let review = create(json!([class]));
    assert_eq!(review.errors.len(), 2, "{:#?}", review.errors);
}

// ---------------------------------------------------------------------------------------------------------
// Rules 1 and 2: namespace, single cluster

#[test]
fn cluster_outside_the_operator_namespace_is_rejected_at_metadata_namespace() {
    let mut c = cluster(json!([base()]));
    c.metadata.namespace = Some("default".to_owned());
    let review = validate_create(&c, &ctx());
    assert_only_error(
        &review,
        "metadata.namespace",
        &["\"default\"", "create it there", NS],
    );
}

#[test]
fn cluster_without_a_namespace_is_rejected_at_metadata_namespace() {
    let mut c = cluster(json!([base()]));
    c.metadata.namespace = None;
    assert_only_error(&validate_create(&c, &ctx()), "metadata.namespace", &[NS]);
}

#[test]
fn second_cluster_is_rejected_at_metadata_name() {
    let ctx = Context {
        other_clusters: vec![format!("{NS}/first")],
        ..ctx()
    };
    let review = validate_create(&cluster(json!([base()])), &ctx);
    assert_only_error(
        &review,
        "metadata.name",
        &[
            "openshift-lvm-storage/first",
            "add the device classes to the existing LVMCluster",
        ],
    );
}

#[test]
fn namespace_and_other_clusters_are_not_checked_on_update() {
    let old = cluster(json!([base()]));
    let mut new = old.clone();
    new.spec.storage.device_classes[0].storage_class_options = Some(StorageClassOptions {
        additional_labels: [("tier".to_owned(), "fast".to_owned())].into(),
        ..StorageClassOptions::default()
    });
    new.metadata.namespace = Some("elsewhere".to_owned());
    let ctx = Context {
        operator_namespace: NS.to_owned(),
        other_clusters: vec!["x/duplicate".to_owned()],
        ..ctx()
    };
    assert_clean(&validate_update(&old, &new, &ctx));
}

// ---------------------------------------------------------------------------------------------------------
// Rule 3: default class

#[test]
fn second_default_class_is_rejected_at_its_default_field() {
    let mut second = thin("vg2", &["/dev/sdc"]);
    second["default"] = json!(true);
    let review = create(json!([base(), thin("vg3", &["/dev/sdd"]), second]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].default",
        &["\"vg1\" already is", "set default: false"],
    );
}

#[test]
fn every_extra_default_class_is_rejected() {
    let mut b = thin("vg2", &["/dev/sdc"]);
    b["default"] = json!(true);
    let mut c = thin("vg3", &["/dev/sdd"]);
    c["default"] = json!(true);
    let review = create(json!([base(), b, c]));
    let fields: Vec<&str> = review.errors.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.storage.deviceClasses[1].default",
            "spec.storage.deviceClasses[2].default"
        ]
    );
}

#[test]
fn no_default_class_is_a_warning() {
    let review = create(json!([thin("vg1", &["/dev/sdb"])]));
    assert_only_warning(
        &review,
        &["no device class is marked default", "set default: true"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Rule 4: sizePercent

#[test]
fn size_percent_above_90_is_a_warning() {
    let mut class = base();
    class["thinPoolConfig"]["sizePercent"] = json!(95);
    assert_only_warning(
        &create(json!([class])),
        &["95%", "sizePercent at 90 or less"],
    );
}

#[test]
fn size_percent_of_90_or_unset_is_not_a_warning() {
    let mut class = base();
    class["thinPoolConfig"]
        .as_object_mut()
        .unwrap()
        .remove("sizePercent");
    assert_clean(&create(json!([class])));
}

// ---------------------------------------------------------------------------------------------------------
// Rules 5–11: RAID

#[test]
fn raid_with_thin_pool_is_a_raid_thin_pool_and_keeps_every_raid_and_thin_rule() {
    let mut class = raid(json!({"type": "raid1"}), 2);
    class["thinPoolConfig"] = json!({"name": "tp", "overprovisionRatio": 10});
    assert_clean(&create(json!([class.clone()])));
    // The RAID rules still apply: raid6 needs five devices.
    let mut ten = raid(json!({"type": "raid6"}), 4);
    ten["thinPoolConfig"] = class["thinPoolConfig"].clone();
    assert_only_error(
        &create(json!([ten])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &["raid6"],
    );
    // And the thin ones: a chunk size out of range is refused.
    class["thinPoolConfig"]["chunkSizeCalculationPolicy"] = json!("Static");
    class["thinPoolConfig"]["chunkSize"] = json!("2Gi");
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].thinPoolConfig.chunkSize",
        &[],
    );
}

#[test]
fn raid5_with_mirrors_is_rejected_at_raid_config_mirrors() {
    let review = create(json!([raid(json!({"type": "raid5", "mirrors": 1}), 3)]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.mirrors",
        &["not raid5", "remove mirrors"],
    );
}

#[test]
fn mirrors_are_allowed_for_raid1_and_raid10() {
    assert_clean(&create(json!([raid(
        json!({"type": "raid1", "mirrors": 2}),
        3
    )])));
    assert_clean(&create(json!([raid(
        json!({"type": "raid10", "mirrors": 1}),
        4
    )])));
}

#[test]
fn raid1_with_stripes_is_rejected_at_raid_config_stripes() {
    let review = create(json!([raid(json!({"type": "raid1", "stripes": 2}), 2)]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.stripes",
        &["remove stripes", "raid10"],
    );
}

#[test]
fn raid1_with_stripe_size_is_rejected_at_raid_config_stripe_size() {
    let review = create(json!([raid(
        json!({"type": "raid1", "stripeSize": "64Ki"}),
        2
    )]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.stripeSize",
        &["remove stripeSize"],
    );
}

#[test]
fn stripe_size_not_a_power_of_two_is_rejected_at_raid_config_stripe_size() {
    let review = create(json!([raid(
        json!({"type": "raid5", "stripeSize": "96Ki"}),
        3
    )]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.stripeSize",
        &["96Ki", "use a power of two"],
    );
}

#[test]
fn power_of_two_stripe_sizes_are_allowed() {
    for size in ["4Ki", "64Ki", "512Ki", "1Mi", "4096"] {
        let review = create(json!([raid(
            json!({"type": "raid5", "stripeSize": size}),
            3
        )]));
        assert_clean(&review);
    }
}

#[test]
fn unparsable_stripe_size_is_rejected_at_raid_config_stripe_size() {
    let review = create(json!([raid(
        json!({"type": "raid5", "stripeSize": "1.5Mi"}),
        3
    )]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.stripeSize",
        &["1.5Mi", "such as 128Ki"],
    );
}

#[test]
fn out_of_range_mirrors_and_stripes_are_rejected_even_though_the_schema_bounds_them() {
    let review = create(json!([raid(
        json!({"type": "raid10", "mirrors": 0, "stripes": 1}),
        8
    )]));
    assert_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.mirrors",
        &["set it to 1 or more"],
    );
    assert_error(
        &review,
        "spec.storage.deviceClasses[0].raidConfig.stripes",
        &["set it to 2 or more"],
    );
}

#[test]
fn raid_without_paths_is_rejected_at_device_selector() {
    let mut class = raid(json!({"type": "raid1"}), 0);
    class.as_object_mut().unwrap().remove("deviceSelector");
    let review = create(json!([class]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].deviceSelector",
        &["raid1 needs known devices", "list the devices"],
    );
}

#[test]
fn raid_minimum_device_counts() {
    let cases = [
        (json!({"type": "raid1"}), 2),
        (json!({"type": "raid1", "mirrors": 2}), 3),
        (json!({"type": "raid4"}), 3),
        (json!({"type": "raid5"}), 3),
        (json!({"type": "raid5", "stripes": 4}), 5),
        (json!({"type": "raid6"}), 5),
        (json!({"type": "raid6", "stripes": 2}), 4),
        (json!({"type": "raid10"}), 4),
        (json!({"type": "raid10", "mirrors": 2}), 6),
        (json!({"type": "raid10", "mirrors": 1, "stripes": 3}), 6),
    ];
    for (config, min) in cases {
        let config: RaidConfig = serde_json::from_value(config.clone()).unwrap();
        assert_eq!(raid_min_devices(&config), min, "{config:?}");
    }
}

#[test]
fn raid5_with_too_few_devices_is_rejected_at_device_selector() {
    let review = create(json!([raid(json!({"type": "raid5"}), 2)]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].deviceSelector",
        &[
            "raid5 with stripes 2 needs at least 3 devices",
            "lists 2",
            "add 1 device(s)",
        ],
    );
}

#[test]
fn raid10_with_too_few_devices_is_rejected_at_device_selector() {
    let review = create(json!([raid(json!({"type": "raid10", "mirrors": 2}), 3)]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].deviceSelector",
        &[
            "needs at least 6 devices",
            "add 3 device(s), or lower mirrors or stripes",
        ],
    );
}

#[test]
fn optional_paths_count_towards_the_raid_minimum() {
    let mut class = raid(json!({"type": "raid6"}), 3);
    class["deviceSelector"]["optionalPaths"] = json!(["/dev/vx", "/dev/vy"]);
    assert_clean(&create(json!([class])));
}

#[test]
fn raid10_with_paths_not_a_multiple_of_the_copies_is_rejected_at_device_selector_paths() {
    let review = create(json!([raid(json!({"type": "raid10", "mirrors": 1}), 5)]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].deviceSelector.paths",
        &["multiple of 2", "paths lists 5", "optionalPaths"],
    );
}

#[test]
fn raid10_with_optional_paths_may_have_any_device_count() {
    let mut class = raid(json!({"type": "raid10"}), 4);
    class["deviceSelector"]["optionalPaths"] = json!(["/dev/spare"]);
    assert_clean(&create(json!([class])));
}

// ---------------------------------------------------------------------------------------------------------
// Rules 12–15: device paths

#[test]
fn empty_device_selector_is_rejected_at_device_selector() {
    let mut class = base();
    class["deviceSelector"] = json!({"forceWipeDevicesAndDestroyAllData": true});
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &[
            "names no devices",
            "list them under deviceSelector.paths",
            "remove deviceSelector",
        ],
    );
}

#[test]
fn second_class_without_paths_is_rejected_at_its_device_selector() {
    let mut other = thin("vg2", &[]);
    other.as_object_mut().unwrap().remove("deviceSelector");
    let review = create(json!([base(), other]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[1].deviceSelector",
        &[
            "more than one device class",
            "add deviceSelector.paths",
            "\"vg2\"",
        ],
    );
}

#[test]
fn single_class_without_paths_is_a_warning() {
    let mut class = base();
    class.as_object_mut().unwrap().remove("deviceSelector");
    assert_only_warning(
        &create(json!([class])),
        &[
            "\"vg1\" names no devices",
            "list the devices under deviceSelector.paths",
        ],
    );
}

#[test]
fn optional_paths_alone_name_the_devices_of_a_class() {
    let mut other = thin("vg2", &[]);
    other["deviceSelector"] = json!({"optionalPaths": ["/dev/sdc"]});
    assert_clean(&create(json!([base(), other])));
}

#[test]
fn path_outside_dev_is_rejected_at_its_index() {
    let class = {
        let mut c = base();
        c["deviceSelector"]["paths"] = json!(["/dev/sdb", "sdc"]);
        c
    };
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].deviceSelector.paths[1]",
        &["\"sdc\"", "under /dev/"],
    );
}

#[test]
fn optional_path_outside_dev_is_rejected_at_its_index() {
    let mut class = base();
    class["deviceSelector"]["optionalPaths"] = json!(["/devices/sdc"]);
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].deviceSelector.optionalPaths[0]",
        &["under /dev/"],
    );
}

#[test]
fn bare_dev_directory_is_not_a_device_path() {
    let mut class = base();
    class["deviceSelector"]["paths"] = json!(["/dev/"]);
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].deviceSelector.paths[0]",
        &["/dev/disk/by-id/"],
    );
}

#[test]
fn path_listed_twice_in_a_class_is_rejected_at_the_second_occurrence() {
    let mut class = base();
    class["deviceSelector"]["optionalPaths"] = json!(["/dev/sdc", "/dev/sdb"]);
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].deviceSelector.optionalPaths[1]",
        &[
            "listed twice",
            "first at spec.storage.deviceClasses[0].deviceSelector.paths[0]",
            "remove the duplicate",
        ],
    );
}

#[test]
fn path_in_two_classes_without_node_selectors_is_rejected_at_the_later_class() {
    let review = create(json!([base(), thin("vg2", &["/dev/sdc", "/dev/sdb"])]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[1].deviceSelector.paths[1]",
        &[
            "also in device class \"vg1\"",
            "remove it from one of the two classes",
        ],
    );
}

#[test]
fn path_in_two_classes_with_equal_node_selectors_is_rejected() {
    let selector = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "disk", "operator": "In", "values": ["ssd"]}]}]});
    let mut a = base();
    a["nodeSelector"] = selector.clone();
    let mut b = thin("vg2", &["/dev/sdb"]);
    b["nodeSelector"] = selector;
    assert_only_error(
        &create(json!([a, b])),
        "spec.storage.deviceClasses[1].deviceSelector.paths[0]",
        &["same nodeSelector"],
    );
}

#[test]
fn path_in_two_classes_with_different_node_selectors_is_allowed() {
    let on = |value: &str| {
        json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "disk", "operator": "In", "values": [value]}]}]})
    };
    let mut a = base();
    a["nodeSelector"] = on("ssd");
    let mut b = thin("vg2", &["/dev/sdb"]);
    b["nodeSelector"] = on("hdd");
    assert_clean(&create(json!([a, b])));
    // One selected, one not: different selectors, even though they may pick the same nodes.
    let mut c = thin("vg3", &["/dev/sdb"]);
    c["nodeSelector"] = on("nvme");
    assert_clean(&create(json!([base(), c])));
}

// ---------------------------------------------------------------------------------------------------------
// Rule 16: fstype

#[test]
fn unsupported_fstype_is_unrepresentable_and_fails_to_deserialise() {
    // The type admits only xfs and ext4 (and the CRD's enum rejects the rest before the webhook
    // runs), so rule 16 needs no check of its own.
    let mut class = base();
    class["fstype"] = json!("btrfs");
    let result = serde_json::from_value::<LVMCluster>(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": NS},
        "spec": {"storage": {"deviceClasses": [class]}},
    }));
    let err = result
        .expect_err("btrfs is not a DeviceFilesystemType")
        .to_string();
    assert!(err.contains("btrfs"), "{err}");
    for fstype in ["xfs", "ext4"] {
        let mut class = base();
        class["fstype"] = json!(fstype);
        assert_clean(&create(json!([class])));
    }
}

// ---------------------------------------------------------------------------------------------------------
// Rule 17: chunkSize

fn with_pool(field: &str, value: Value) -> Value {
    let mut class = base();
    class["thinPoolConfig"][field] = value;
    class
}

#[test]
fn chunk_size_with_host_policy_is_rejected_at_chunk_size() {
    let mut class = with_pool("chunkSize", json!("128Ki"));
    class["thinPoolConfig"]["chunkSizeCalculationPolicy"] = json!("Host");
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].thinPoolConfig.chunkSize",
        &[
            "policy is Host",
            "remove chunkSize",
            "chunkSizeCalculationPolicy: Static",
        ],
    );
}

#[test]
fn chunk_size_outside_64ki_to_1gi_is_rejected_at_chunk_size() {
    for size in ["32Ki", "2Gi", "0"] {
        assert_only_error(
            &create(json!([with_pool("chunkSize", json!(size))])),
            "spec.storage.deviceClasses[0].thinPoolConfig.chunkSize",
            &[size, "between 64Ki and 1Gi"],
        );
    }
}

#[test]
fn chunk_size_bounds_are_inclusive() {
    for size in ["64Ki", "128Ki", "1Gi", "65536"] {
        assert_clean(&create(json!([with_pool("chunkSize", json!(size))])));
    }
}

#[test]
fn chunk_size_not_a_multiple_of_64ki_is_rejected_at_chunk_size() {
    assert_only_error(
        &create(json!([with_pool("chunkSize", json!("100Ki"))])),
        "spec.storage.deviceClasses[0].thinPoolConfig.chunkSize",
        &["not a multiple of 64Ki", "use a multiple of 64Ki"],
    );
}

#[test]
fn unparsable_chunk_size_is_rejected_at_chunk_size() {
    assert_only_error(
        &create(json!([with_pool("chunkSize", json!("big"))])),
        "spec.storage.deviceClasses[0].thinPoolConfig.chunkSize",
        &["\"big\"", "such as 128Ki"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Rule 18: metadataSize

#[test]
fn metadata_size_with_host_policy_is_rejected_at_metadata_size() {
    for policy in [json!("Host"), Value::Null] {
        let mut class = with_pool("metadataSize", json!("512Mi"));
        if !policy.is_null() {
            class["thinPoolConfig"]["metadataSizeCalculationPolicy"] = policy;
        }
        assert_only_error(
            &create(json!([class])),
            "spec.storage.deviceClasses[0].thinPoolConfig.metadataSize",
            &[
                "policy is Host",
                "remove metadataSize",
                "metadataSizeCalculationPolicy: Static",
            ],
        );
    }
}

#[test]
fn default_metadata_size_with_host_policy_only_warns_that_it_is_ignored() {
    let mut class = with_pool("metadataSize", json!("1Gi"));
    class["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Host");
    assert_only_warning(
        &create(json!([class])),
        &["is ignored", "remove metadataSize"],
    );
}

#[test]
fn static_metadata_policy_without_size_warns_that_1gi_is_used() {
    let class = with_pool("metadataSizeCalculationPolicy", json!("Static"));
    assert_only_warning(
        &create(json!([class])),
        &["1Gi is used", "set metadataSize"],
    );
}

#[test]
fn metadata_size_outside_2mi_to_16gi_is_rejected_at_metadata_size() {
    for size in ["1Mi", "17Gi"] {
        let mut class = with_pool("metadataSize", json!(size));
        class["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Static");
        assert_only_error(
            &create(json!([class])),
            "spec.storage.deviceClasses[0].thinPoolConfig.metadataSize",
            &[size, "between 2Mi and 16Gi"],
        );
    }
    for size in ["2Mi", "16Gi"] {
        let mut class = with_pool("metadataSize", json!(size));
        class["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Static");
        assert_clean(&create(json!([class])));
    }
}

#[test]
fn unparsable_metadata_size_is_rejected_at_metadata_size() {
    let mut class = with_pool("metadataSize", json!("1e9"));
    class["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Static");
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].thinPoolConfig.metadataSize",
        &["\"1e9\"", "such as 128Ki"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Rule 19: discovery policy

#[test]
fn dynamic_discovery_without_paths_is_a_warning() {
    let mut class = base();
    class.as_object_mut().unwrap().remove("deviceSelector");
    class["deviceDiscoveryPolicy"] = json!("Dynamic");
    let review = create(json!([class]));
    assert_allowed(&review);
    assert!(
        review
            .warnings
            .iter()
            .any(|w| w.contains("Dynamic without paths")
                && w.contains("set deviceDiscoveryPolicy: Static")),
        "{:#?}",
        review.warnings
    );
}

#[test]
fn dynamic_discovery_with_paths_is_not_a_warning() {
    let mut class = base();
    class["deviceDiscoveryPolicy"] = json!("Dynamic");
    assert_clean(&create(json!([class])));
}

// ---------------------------------------------------------------------------------------------------------
// Rules 20 and 21: StorageClass options

fn with_options(options: Value) -> Value {
    let mut class = base();
    class["storageClassOptions"] = options;
    class
}

#[test]
fn empty_parameter_key_is_rejected_at_its_entry() {
    let review = create(json!([with_options(
        json!({"additionalParameters": {"": "x"}})
    )]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].storageClassOptions.additionalParameters[]",
        &["non-empty key or remove it"],
    );
}

#[test]
fn reserved_parameters_are_rejected_at_their_entry() {
    for (key, source) in [
        ("topolvm.io/device-class", "name"),
        ("csi.storage.k8s.io/fstype", "fstype"),
    ] {
        let review = create(json!([with_options(
            json!({"additionalParameters": {key: "x"}})
        )]));
        assert_only_error(
            &review,
            &format!(
                "spec.storage.deviceClasses[0].storageClassOptions.additionalParameters[{key}]"
            ),
            &[source, "remove it from additionalParameters"],
        );
    }
}

#[test]
fn ordinary_parameters_are_allowed() {
    let review = create(json!([with_options(
        json!({"additionalParameters": {"custom-key": "custom-value", "example.com/x": ""}})
    )]));
    assert_clean(&review);
}

#[test]
fn invalid_label_keys_are_rejected_at_their_entry() {
    let long_name = "a".repeat(64);
    let long_prefix = format!("{}/a", "a".repeat(254));
    for key in [
        "-team",
        "team-",
        "a/b/c",
        "/team",
        "Example.com/team",
        "example.com/",
        "has space",
        long_name.as_str(),
        long_prefix.as_str(),
    ] {
        let review = create(json!([with_options(
            json!({"additionalLabels": {key: "x"}})
        )]));
        assert_only_error(
            &review,
            &format!("spec.storage.deviceClasses[0].storageClassOptions.additionalLabels[{key}]"),
            &["not a valid label key", "such as example.com/tier"],
        );
    }
}

#[test]
fn invalid_label_values_are_rejected_at_their_entry() {
    for value in ["-x", "x_", "a b", &"v".repeat(64)] {
        let review = create(json!([with_options(
            json!({"additionalLabels": {"tier": value}})
        )]));
        assert_only_error(
            &review,
            "spec.storage.deviceClasses[0].storageClassOptions.additionalLabels[tier]",
            &["not a valid label value", "or an empty value"],
        );
    }
}

#[test]
fn reserved_labels_are_rejected_at_their_entry() {
    for key in [
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/part-of",
        "app.kubernetes.io/name",
        "app.kubernetes.io/component",
        "owned-by.topolvm.io/name",
        "owned-by.topolvm.io/anything",
    ] {
        let review = create(json!([with_options(
            json!({"additionalLabels": {key: "x"}})
        )]));
        assert_only_error(
            &review,
            &format!("spec.storage.deviceClasses[0].storageClassOptions.additionalLabels[{key}]"),
            &["set by the operator", "choose another key"],
        );
    }
}

#[test]
fn valid_labels_are_allowed() {
    let review = create(json!([with_options(json!({"additionalLabels": {
        "tier": "fast",
        "team": "",
        "example.com/cost-center": "A_1.b-2",
        "app.kubernetes.io/instance": "lvms",
        "x": "y",
    }}))]));
    assert_clean(&review);
}

const K8S_NAME: &str = "^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$";
const K8S_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// apimachinery's IsQualifiedName, written with its regexes.
fn k8s_is_qualified_name(key: &str) -> bool {
    let name = regex::Regex::new(K8S_NAME).unwrap();
    let subdomain = regex::Regex::new(K8S_SUBDOMAIN).unwrap();
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, n) = match parts.as_slice() {
        [n] => (None, *n),
        [p, n] => (Some(*p), *n),
        _ => return false,
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !subdomain.is_match(p))
    {
        return false;
    }
    !n.is_empty() && n.len() <= 63 && name.is_match(n)
}

fn k8s_is_label_value(value: &str) -> bool {
    let name = regex::Regex::new(K8S_NAME).unwrap();
    value.len() <= 63 && (value.is_empty() || name.is_match(value))
}

proptest! {
    #[test]
    fn qualified_name_check_agrees_with_kubernetes(key in "[a-zA-Z0-9._/ -]{0,12}") {
        prop_assert_eq!(qualified_name_problem(&key).is_none(), k8s_is_qualified_name(&key));
    }

    #[test]
    fn label_value_check_agrees_with_kubernetes(value in "[a-zA-Z0-9._/ -]{0,12}|[a-z]{60,66}") {
        prop_assert_eq!(label_value_problem(&value).is_none(), k8s_is_label_value(&value));
    }
}

// ---------------------------------------------------------------------------------------------------------
// RAID device counts, as a property

fn raid_config() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1..4i32).prop_map(|m| json!({"type": "raid1", "mirrors": m})),
        (2..6i32).prop_map(|s| json!({"type": "raid4", "stripes": s})),
        (2..6i32).prop_map(|s| json!({"type": "raid5", "stripes": s})),
        (2..6i32).prop_map(|s| json!({"type": "raid6", "stripes": s})),
        (1..3i32, 2..4i32).prop_map(|(m, s)| json!({"type": "raid10", "mirrors": m, "stripes": s})),
        Just(json!({"type": "raid6"})),
        Just(json!({"type": "raid10"})),
    ]
}

proptest! {
    #[test]
    fn raid_device_count_error_starts_exactly_below_the_minimum(config in raid_config(), required in 1usize..8, optional in 0usize..8) {
        let mut class = raid(config.clone(), required);
        let spares: Vec<String> = (0..optional).map(|i| format!("/dev/spare{i}")).collect();
        class["deviceSelector"]["optionalPaths"] = json!(spares);
        let review = create(json!([class]));
        let min = raid_min_devices(&serde_json::from_value(config).unwrap());
        let count_error = review.errors.iter().any(|e| e.field == "spec.storage.deviceClasses[0].deviceSelector");
        prop_assert_eq!(count_error, ((required + optional) as i64) < min, "{:#?}", review.errors);
    }
}

// ---------------------------------------------------------------------------------------------------------
// Update rules 22–30

#[test]
fn update_applies_the_create_rules_to_the_new_object() {
    let mut new = base();
    new["deviceSelector"]["paths"] = json!(["/dev/sdb", "sdc"]);
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].deviceSelector.paths[1]",
        &["under /dev/"],
    );
}

#[test]
fn added_class_gets_only_the_create_rules() {
    let mut added = thin("vg2", &["/dev/sdc"]);
    added["raidConfig"] = json!({"type": "raid1"});
    added.as_object_mut().unwrap().remove("thinPoolConfig");
    added["deviceSelector"]["paths"] = json!(["/dev/sdc", "/dev/sdd"]);
    assert_clean(&update(json!([base()]), json!([base(), added])));
}

#[test]
fn update_that_leaves_the_spec_unchanged_is_allowed_even_if_the_rules_reject_it() {
    // E.g. the operator removing its finalizer from an object an older version accepted.
    let mut class = base();
    class["thinPoolConfig"]["chunkSize"] = json!("100Ki");
    let old = cluster(json!([class]));
    let mut new = old.clone();
    new.metadata.finalizers = Some(vec![]);
    assert!(!validate_create(&old, &ctx()).allowed());
    assert_clean(&validate_update(&old, &new, &ctx()));
}

#[test]
fn storage_class_options_added_later_with_the_defaults_are_allowed() {
    let new = with_options(json!({
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "WaitForFirstConsumer",
        "additionalLabels": {"tier": "fast"},
    }));
    assert_clean(&update(json!([base()]), json!([new])));
}

#[test]
fn storage_class_options_added_later_with_retain_is_rejected_at_reclaim_policy() {
    let new = with_options(json!({"reclaimPolicy": "Retain"}));
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].storageClassOptions.reclaimPolicy",
        &[
            "added to an existing device class",
            "set reclaimPolicy: Delete",
            "delete and recreate",
        ],
    );
}

#[test]
fn storage_class_options_added_later_with_immediate_binding_is_rejected_at_volume_binding_mode() {
    let new = with_options(json!({"volumeBindingMode": "Immediate"}));
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].storageClassOptions.volumeBindingMode",
        &["set volumeBindingMode: WaitForFirstConsumer"],
    );
}

#[test]
fn storage_class_options_added_later_with_parameters_is_rejected_at_additional_parameters() {
    let new = with_options(json!({"additionalParameters": {"k": "v"}}));
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].storageClassOptions.additionalParameters",
        &["no additional parameters: remove additionalParameters"],
    );
}

#[test]
fn storage_class_parameters_cannot_change_later() {
    let old = with_options(json!({"reclaimPolicy": "Retain", "additionalParameters": {"k": "v"}}));
    let new = with_options(json!({"additionalParameters": {"k": "w"}}));
    let review = update(json!([old]), json!([new]));
    assert_error(
        &review,
        "spec.storage.deviceClasses[0].storageClassOptions.reclaimPolicy",
        &["set reclaimPolicy: Retain"],
    );
    assert_error(
        &review,
        "spec.storage.deviceClasses[0].storageClassOptions.additionalParameters",
        &["restore them"],
    );
    assert_eq!(review.errors.len(), 2);
}

#[test]
fn additional_labels_may_change() {
    let old = with_options(json!({"additionalLabels": {"tier": "fast"}}));
    let new = with_options(json!({"additionalLabels": {"tier": "slow", "team": "a"}}));
    assert_clean(&update(json!([old]), json!([new])));
}

#[test]
fn fstype_change_is_rejected_at_fstype() {
    let mut new = base();
    new["fstype"] = json!("ext4");
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].fstype",
        &["set fstype: xfs"],
    );
    let mut explicit = base();
    explicit["fstype"] = json!("xfs");
    assert_clean(&update(json!([base()]), json!([explicit])));
}

#[test]
fn removing_every_class_is_rejected_at_device_classes() {
    let mut old = base();
    old["default"] = json!(false);
    let review = update(json!([old]), json!([]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses",
        &[
            "at least one device class must remain",
            "delete the LVMCluster",
        ],
    );
}

#[test]
fn removing_the_default_class_is_rejected_at_device_classes() {
    let review = update(
        json!([base(), thin("vg2", &["/dev/sdc"])]),
        json!([thin("vg2", &["/dev/sdc"])]),
    );
    assert_only_error(
        &review,
        "spec.storage.deviceClasses",
        &[
            "\"vg1\" is the default",
            "first make another class the default",
        ],
    );
}

#[test]
fn removing_a_class_that_is_not_the_default_is_allowed() {
    assert_clean(&update(
        json!([base(), thin("vg2", &["/dev/sdc"])]),
        json!([base()]),
    ));
}

#[test]
fn moving_the_default_to_another_class_is_allowed() {
    let mut old_default = base();
    old_default["default"] = json!(false);
    let mut new_default = thin("vg2", &["/dev/sdc"]);
    new_default["default"] = json!(true);
    assert_clean(&update(
        json!([base(), thin("vg2", &["/dev/sdc"])]),
        json!([old_default, new_default]),
    ));
}

#[test]
fn adding_thin_pool_config_is_rejected_at_thin_pool_config() {
    let mut old = base();
    old.as_object_mut().unwrap().remove("thinPoolConfig");
    assert_only_error(
        &update(json!([old]), json!([base()])),
        "spec.storage.deviceClasses[0].thinPoolConfig",
        &["cannot be added", "remove thinPoolConfig"],
    );
}

#[test]
fn removing_thin_pool_config_is_rejected_at_thin_pool_config() {
    let mut new = base();
    new.as_object_mut().unwrap().remove("thinPoolConfig");
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].thinPoolConfig",
        &[
            "cannot be removed",
            "restore it as it was (name \"thin-pool-1\")",
        ],
    );
}

#[test]
fn immutable_thin_pool_fields_are_rejected_at_their_field() {
    let cases = [
        ("name", json!("other"), "set it back to \"thin-pool-1\""),
        ("sizePercent", json!(80), "set it back to 90"),
        (
            "chunkSizeCalculationPolicy",
            json!("Host"),
            "set it back to Static",
        ),
        (
            "chunkSize",
            json!("256Ki"),
            "remove it again (unset means 128Ki)",
        ),
    ];
    for (field, value, fix) in cases {
        let review = update(json!([base()]), json!([with_pool(field, value)]));
        assert_only_error(
            &review,
            &format!("spec.storage.deviceClasses[0].thinPoolConfig.{field}"),
            &["cannot change once the thin pool exists", fix],
        );
    }
}

#[test]
fn overprovision_ratio_may_change() {
    assert_clean(&update(
        json!([base()]),
        json!([with_pool("overprovisionRatio", json!(20))]),
    ));
}

#[test]
fn writing_out_a_thin_pool_default_is_not_a_change() {
    assert_clean(&update(
        json!([base()]),
        json!([with_pool("chunkSize", json!("128Ki"))]),
    ));
    let mut no_percent = base();
    no_percent["thinPoolConfig"]
        .as_object_mut()
        .unwrap()
        .remove("sizePercent");
    assert_clean(&update(json!([no_percent]), json!([base()])));
}

fn static_metadata(size: Option<&str>) -> Value {
    let mut class = with_pool("metadataSizeCalculationPolicy", json!("Static"));
    if let Some(size) = size {
        class["thinPoolConfig"]["metadataSize"] = json!(size);
    }
    class
}

#[test]
fn shrinking_static_metadata_size_is_rejected_at_metadata_size() {
    let review = update(
        json!([static_metadata(Some("2Gi"))]),
        json!([static_metadata(Some("1Gi"))]),
    );
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].thinPoolConfig.metadataSize",
        &["cannot shrink", "set metadataSize to 2Gi or more"],
    );
    // Unset means 1Gi.
    let review = update(
        json!([static_metadata(None)]),
        json!([static_metadata(Some("512Mi"))]),
    );
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[0].thinPoolConfig.metadataSize",
        &["1Gi or more"],
    );
}

#[test]
fn growing_static_metadata_size_is_allowed() {
    let review = update(
        json!([static_metadata(None)]),
        json!([static_metadata(Some("2Gi"))]),
    );
    assert_clean(&review);
}

#[test]
fn raid_config_change_is_rejected_at_raid_config() {
    let old = raid(json!({"type": "raid1"}), 3);
    let cases = [
        (
            raid(json!({"type": "raid5"}), 3),
            "restore it as it was (raid1 with mirrors 1)",
        ),
        (
            raid(json!({"type": "raid1", "mirrors": 2}), 3),
            "cannot change",
        ),
    ];
    for (new, fix) in cases {
        assert_only_error(
            &update(json!([old.clone()]), json!([new])),
            "spec.storage.deviceClasses[0].raidConfig",
            &[fix],
        );
    }
    let mut plain = old.clone();
    plain.as_object_mut().unwrap().remove("raidConfig");
    assert_only_error(
        &update(json!([old.clone()]), json!([plain.clone()])),
        "spec.storage.deviceClasses[0].raidConfig",
        &["cannot be removed", "restore raidConfig"],
    );
    assert_only_error(
        &update(json!([plain]), json!([old])),
        "spec.storage.deviceClasses[0].raidConfig",
        &["cannot be added", "remove raidConfig"],
    );
}

#[test]
fn node_selector_change_is_rejected_at_node_selector() {
    let mut new = base();
    new["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "disk", "operator": "In", "values": ["ssd"]}]}]});
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].nodeSelector",
        &["cannot change", "restore the previous nodeSelector"],
    );
}

#[test]
fn force_wipe_change_is_rejected_at_its_field() {
    let mut new = base();
    new["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(true);
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].deviceSelector.forceWipeDevicesAndDestroyAllData",
        &["set it back to false"],
    );
}

#[test]
fn writing_out_force_wipe_false_is_not_a_change() {
    let mut new = base();
    new["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(false);
    assert_clean(&update(json!([base()]), json!([new])));
}

#[test]
fn adding_paths_to_a_class_created_without_paths_is_rejected_at_device_selector() {
    let mut old = base();
    old.as_object_mut().unwrap().remove("deviceSelector");
    old["deviceDiscoveryPolicy"] = json!("Static");
    let mut new = base();
    new["deviceDiscoveryPolicy"] = json!("Static");
    assert_only_error(
        &update(json!([old]), json!([new])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &["created without paths", "remove deviceSelector"],
    );
}

#[test]
fn removing_every_path_of_a_class_is_rejected_at_device_selector() {
    let mut new = base();
    new.as_object_mut().unwrap().remove("deviceSelector");
    assert_only_error(
        &update(json!([base()]), json!([new])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &["cannot lose all of them", "keep at least one"],
    );
}

#[test]
fn adding_and_removing_some_paths_is_allowed() {
    let mut old = base();
    old["deviceSelector"]["paths"] = json!(["/dev/sdb", "/dev/sdc"]);
    let mut new = base();
    new["deviceSelector"] = json!({"paths": ["/dev/sdc"], "optionalPaths": ["/dev/sdd"]});
    assert_clean(&update(json!([old]), json!([new])));
}

// ---------------------------------------------------------------------------------------------------------
// Rules 31–43: shared device classes

const LUN: &str = "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4";
const LUN_2: &str = "/dev/mapper/mpathb";

/// A valid shared class on `paths`.
fn shared(name: &str, paths: &[&str]) -> Value {
    json!({"name": name, "deviceAccessPolicy": "shared", "deviceSelector": {"paths": paths}})
}

/// `base()` and the shared class `san` on [`LUN`], with `edit` applied to `san`.
fn with_shared(edit: impl FnOnce(&mut Value)) -> Value {
    let mut class = shared("san", &[LUN]);
    edit(&mut class);
    json!([base(), class])
}

const SAN: &str = "spec.storage.deviceClasses[1]";

fn shared_ctx(classes: &[&str]) -> Context {
    Context {
        existing_shared_volume_groups: classes.iter().map(|c| (*c).to_owned()).collect(),
        ..ctx()
    }
}

#[test]
fn valid_shared_class_next_to_a_local_one_is_allowed_without_warnings() {
    assert_clean(&create(with_shared(|_| {})));
    assert_clean(&create(json!([base(), shared("san", &[LUN, LUN_2])])));
}

#[test]
fn shared_class_with_every_shared_config_field_and_an_fstype_is_allowed() {
    assert_clean(&create(with_shared(|c| {
        c["fstype"] = json!("ext4");
        c["default"] = json!(false);
        c["deviceDiscoveryPolicy"] = json!("Static");
        c["sharedConfig"] =
            json!({"volumeMode": "Thin", "wipePolicy": "UnsafeFast", "ioTimeoutSeconds": 20});
    })));
}

#[test]
fn local_and_node_local_classes_are_not_shared_and_keep_the_local_rules() {
    for policy in ["local", "nodeLocal"] {
        let mut class = base();
        class["deviceAccessPolicy"] = json!(policy);
        assert_clean(&create(json!([class])));
        // Rule 32 does not apply: /dev/sdb is fine for a node-local class.
    }
}

#[test]
fn rule_31_shared_class_without_paths_is_rejected_at_device_selector_paths() {
    for edit in [json!(null), json!({}), json!({"paths": []})] {
        let review = create(with_shared(|c| {
            if edit.is_null() {
                c.as_object_mut().unwrap().remove("deviceSelector");
            } else {
                c["deviceSelector"] = edit.clone();
            }
        }));
        assert_only_error(
            &review,
            &format!("{SAN}.deviceSelector.paths"),
            &["never discover", "deviceSelector.paths", "/dev/disk/by-id/"],
        );
    }
}

#[test]
fn rule_32_unstable_shared_paths_are_rejected_at_their_index() {
    for path in [
        "/dev/sdc",
        "/dev/vdb",
        "/dev/nvme0n1",
        "/dev/disk/by-path/pci-0000:00:1f.2-ata-1",
        "/dev/disk/by-id/",
        "/dev/disk/by-id/../../sdc",
        "/dev/mapper/",
    ] {
        let review = create(with_shared(|c| {
            c["deviceSelector"]["paths"] = json!([LUN, path]);
        }));
        assert_only_error(
            &review,
            &format!("{SAN}.deviceSelector.paths[1]"),
            &[path, "/dev/disk/by-id/", "/dev/mapper/"],
        );
    }
}

#[test]
fn rule_32_leaves_paths_outside_dev_to_rule_14() {
    let review = create(with_shared(|c| {
        c["deviceSelector"]["paths"] = json!(["sdc"])
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.deviceSelector.paths[0]"),
        &["under /dev/"],
    );
}

#[test]
fn stable_device_paths_are_by_id_and_mapper_names() {
    assert!(is_stable_device_path(LUN));
    assert!(is_stable_device_path(
        "/dev/mapper/3600a098038303053453f463045494c6b"
    ));
    assert!(!is_stable_device_path("/dev/disk/by-uuid/1234"));
    assert!(!is_stable_device_path("/dev/mapper/a/b"));
    assert!(!is_stable_device_path("/dev/disk/by-id/.."));
    assert!(!is_stable_device_path("/dev/mapper/."));
}

#[test]
fn rule_33_shared_class_with_optional_paths_is_rejected_at_optional_paths() {
    let review = create(with_shared(|c| {
        c["deviceSelector"]["optionalPaths"] = json!([LUN_2]);
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.deviceSelector.optionalPaths"),
        &["same devices", "remove optionalPaths"],
    );
}

#[test]
fn rule_34_shared_class_with_raid_is_rejected_at_raid_config() {
    let review = create(with_shared(|c| {
        c["deviceSelector"]["paths"] = json!([LUN, LUN_2]);
        c["raidConfig"] = json!({"type": "raid1", "mirrors": 1});
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.raidConfig"),
        &["more than one node", "remove raidConfig"],
    );
}

#[test]
fn rule_35_shared_class_with_a_thin_pool_is_rejected_at_thin_pool_config() {
    let review = create(with_shared(|c| {
        c["thinPoolConfig"] = json!({"name": "tp", "overprovisionRatio": 10});
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.thinPoolConfig"),
        &["remove thinPoolConfig", "sharedConfig.volumeMode: Thin"],
    );
}

#[test]
fn rule_36_shared_class_with_dynamic_discovery_is_rejected_at_its_policy() {
    let review = create(with_shared(|c| {
        c["deviceDiscoveryPolicy"] = json!("Dynamic")
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.deviceDiscoveryPolicy"),
        &["never discover", "remove deviceDiscoveryPolicy"],
    );
}

#[test]
fn rule_37_shared_class_name_longer_than_63_is_rejected_at_name() {
    let ok = "s".repeat(63);
    assert_clean(&create(with_shared(|c| c["name"] = json!(ok))));
    let long = "s".repeat(64);
    let review = create(with_shared(|c| c["name"] = json!(long)));
    assert_only_error(
        &review,
        &format!("{SAN}.name"),
        &["64 characters", "shared.lvms.topolvm.io/", "shorter name"],
    );
    // A node-local class may keep its longer name.
    let mut local = thin(&long, &["/dev/sdc"]);
    local["thinPoolConfig"]["name"] = json!("tp");
    assert_clean(&create(json!([base(), local])));
}

fn force_wipe_shared() -> Value {
    with_shared(|c| c["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(true))
}

const FORCE_WIPE_FIELD: &str =
    "spec.storage.deviceClasses[1].deviceSelector.forceWipeDevicesAndDestroyAllData";

#[test]
fn rule_38_force_wipe_on_a_new_shared_volume_group_is_allowed() {
    // No node reports the volume group yet (or only another class's).
    let review = validate_create(&cluster(force_wipe_shared()), &shared_ctx(&["other"]));
    assert_clean(&review);
}

#[test]
fn rule_38_force_wipe_once_the_shared_volume_group_exists_is_rejected_on_create_and_update() {
    let ctx = shared_ctx(&["san"]);
    let review = validate_create(&cluster(force_wipe_shared()), &ctx);
    assert_only_error(
        &review,
        FORCE_WIPE_FIELD,
        &["already exists", "forceWipeDevicesAndDestroyAllData: false"],
    );
    // An update that keeps the flag on, changing something else.
    let old = cluster(force_wipe_shared());
    let mut new_classes = force_wipe_shared();
    new_classes[1]["sharedConfig"] = json!({"wipePolicy": "UnsafeFast"});
    let review = validate_update(&old, &cluster(new_classes), &ctx);
    assert_only_error(&review, FORCE_WIPE_FIELD, &["already exists"]);
    // Without the flag the same classes are fine.
    assert_clean(&validate_create(&cluster(with_shared(|_| {})), &ctx));
}

#[test]
fn rule_38_force_wipe_may_be_turned_off_on_a_shared_class_but_not_on() {
    let existing = shared_ctx(&["san"]);
    let off =
        with_shared(|c| c["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(false));
    assert_clean(&validate_update(
        &cluster(force_wipe_shared()),
        &cluster(off),
        &existing,
    ));
    let plain = with_shared(|_| {});
    assert_clean(&validate_update(
        &cluster(force_wipe_shared()),
        &cluster(plain.clone()),
        &existing,
    ));
    // Turning it on is still rule 28.
    assert_only_error(
        &validate_update(&cluster(plain), &cluster(force_wipe_shared()), &ctx()),
        FORCE_WIPE_FIELD,
        &["cannot change"],
    );
}

#[test]
fn rule_38_needs_the_node_statuses_only_for_a_shared_class_that_wipes() {
    assert!(needs_existing_shared_volume_groups(&cluster(
        force_wipe_shared()
    )));
    assert!(!needs_existing_shared_volume_groups(&cluster(with_shared(
        |_| {}
    ))));
    let mut local = base();
    local["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(true);
    assert!(!needs_existing_shared_volume_groups(&cluster(json!([
        local
    ]))));
}

#[test]
fn existing_shared_volume_groups_are_joined_or_ready_or_degraded_reports() {
    let report = |node: &str, vgs: Value| -> LVMVolumeGroupNodeStatus {
        serde_json::from_value(json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": NS},
            "spec": {"nodeStatus": vgs},
        }))
        .unwrap()
    };
    let statuses = [
        report(
            "n1",
            json!([
                {"name": "joined", "status": "Progressing", "shared": {"lockspace": "Joined"}},
                {"name": "joining", "status": "Progressing", "shared": {"lockspace": "Joining"}},
                {"name": "ready", "status": "Ready"},
            ]),
        ),
        report(
            "n2",
            json!([
                {"name": "degraded", "status": "Degraded"},
                {"name": "failed", "status": "Failed", "shared": {"lockspace": "NotJoined"}},
                {"name": "joining", "status": "Progressing"},
                {"name": "unreported"},
            ]),
        ),
    ];
    let set = existing_shared_volume_groups(&statuses);
    assert_eq!(
        set.iter().map(String::as_str).collect::<Vec<_>>(),
        ["degraded", "joined", "ready"]
    );
}

#[test]
fn rule_39_shared_config_on_a_node_local_class_is_rejected_at_shared_config() {
    for policy in [None, Some("local"), Some("nodeLocal")] {
        let mut class = base();
        if let Some(policy) = policy {
            class["deviceAccessPolicy"] = json!(policy);
        }
        class["sharedConfig"] = json!({"volumeMode": "Thin"});
        assert_only_error(
            &create(json!([class])),
            "spec.storage.deviceClasses[0].sharedConfig",
            &["set deviceAccessPolicy: shared or remove sharedConfig"],
        );
    }
}

#[test]
fn rule_40_a_shared_path_in_another_class_is_rejected_whatever_the_node_selectors() {
    let on = |node: &str| {
        json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]})
    };
    // The local class comes first, on another node.
    let mut local = thin("local", &[LUN]);
    local["nodeSelector"] = on("worker-9");
    let review = create(json!([base(), local, shared("san", &[LUN])]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].deviceSelector.paths[0]",
        &[
            "also in device class \"local\"",
            "\"san\" is shared",
            "remove it from one",
        ],
    );
    // The shared class comes first; the local class lists it as an optional path.
    let mut local = thin("local", &["/dev/sdc"]);
    local["nodeSelector"] = on("worker-9");
    local["deviceSelector"]["optionalPaths"] = json!([LUN]);
    let review = create(json!([base(), shared("san", &[LUN]), local]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].deviceSelector.optionalPaths[0]",
        &["also in device class \"san\""],
    );
    // Two shared classes on one LUN, with different node selectors.
    let mut other = shared("san2", &[LUN]);
    other["nodeSelector"] = on("worker-9");
    let review = create(json!([base(), shared("san", &[LUN]), other]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].deviceSelector.paths[0]",
        &["also in device class \"san\""],
    );
    // Equal node selectors: rule 15 answers, once.
    let review = create(json!([
        base(),
        shared("san", &[LUN]),
        shared("san2", &[LUN])
    ]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].deviceSelector.paths[0]",
        &["same nodeSelector"],
    );
    // Distinct paths are fine.
    let mut local = thin("local", &["/dev/sdc"]);
    local["nodeSelector"] = on("worker-9");
    assert_clean(&create(json!([base(), shared("san", &[LUN]), local])));
}

#[test]
fn rule_41_access_policy_change_between_shared_and_node_local_is_rejected() {
    let field = format!("{SAN}.deviceAccessPolicy");
    let mut local = shared("san", &[LUN]);
    local.as_object_mut().unwrap().remove("deviceAccessPolicy");
    for policy in [None, Some("local"), Some("nodeLocal")] {
        let mut before = local.clone();
        if let Some(p) = policy {
            before["deviceAccessPolicy"] = json!(p);
        }
        assert_only_error(
            &update(
                json!([base(), before.clone()]),
                json!([base(), shared("san", &[LUN])]),
            ),
            &field,
            &[
                "is nodeLocal",
                "cannot become shared",
                "remove the device class and add a new one",
            ],
        );
        assert_only_error(
            &update(
                json!([base(), shared("san", &[LUN])]),
                json!([base(), before]),
            ),
            &field,
            &["is shared", "cannot become nodeLocal"],
        );
    }
}

#[test]
fn rule_41_spelling_node_local_another_way_is_not_a_change() {
    let mut class = base();
    class["deviceAccessPolicy"] = json!("local");
    let mut now = base();
    now["deviceAccessPolicy"] = json!("nodeLocal");
    assert_clean(&update(json!([class.clone()]), json!([now.clone()])));
    assert_clean(&update(json!([base()]), json!([class])));
    assert_clean(&update(json!([now]), json!([base()])));
}

#[test]
fn rule_42_io_timeout_change_is_rejected_at_its_field() {
    let field = format!("{SAN}.sharedConfig.ioTimeoutSeconds");
    let timeout = |t: Option<i32>| {
        with_shared(|c| {
            if let Some(t) = t {
                c["sharedConfig"] = json!({"ioTimeoutSeconds": t});
            }
        })
    };
    assert_only_error(
        &update(timeout(Some(20)), timeout(Some(30))),
        &field,
        &["20 seconds", "ioTimeoutSeconds: 20"],
    );
    assert_only_error(
        &update(timeout(None), timeout(Some(30))),
        &field,
        &["10 seconds", "ioTimeoutSeconds: 10"],
    );
    // Writing out the default is not a change; nor is another mutable field.
    assert_clean(&update(timeout(None), timeout(Some(10))));
    let mut wipe = timeout(Some(20));
    wipe[1]["sharedConfig"]["wipePolicy"] = json!("UnsafeFast");
    assert_clean(&update(timeout(Some(20)), wipe));
}

#[test]
fn rule_43_volume_mode_change_is_rejected_at_its_field() {
    let mode = |m: Option<&str>| {
        with_shared(|c| {
            if let Some(m) = m {
                c["sharedConfig"] = json!({"volumeMode": m});
            }
        })
    };
    assert_only_error(
        &update(mode(None), mode(Some("Thin"))),
        &format!("{SAN}.sharedConfig.volumeMode"),
        &["lvms-san", "volumeMode: Linear"],
    );
    assert_clean(&update(mode(None), mode(Some("Linear"))));
}

proptest! {
    #[test]
    fn a_shared_path_under_dev_is_accepted_exactly_when_it_is_a_by_id_or_mapper_name(
        dir in prop_oneof![
            Just("disk/by-id/"), Just("mapper/"), Just("disk/by-path/"), Just("disk/by-uuid/"),
            Just(""), Just("disk/")
        ],
        name in "[a-z0-9:._-]{1,20}(/[a-z0-9]{1,4})?",
    ) {
        let path = format!("/dev/{dir}{name}");
        let review = create(with_shared(|c| c["deviceSelector"]["paths"] = json!([path.clone()])));
        let stable = matches!(dir, "disk/by-id/" | "mapper/") && !name.contains('/') && name != "." && name != "..";
        prop_assert_eq!(review.allowed(), stable, "{}: {:#?}", path, review.errors);
        if !stable {
            let field = format!("{SAN}.deviceSelector.paths[0]");
            prop_assert!(review.errors.iter().all(|e| e.field == field), "{:#?}", review.errors);
        }
    }
}

#[test]
fn shared_classes_are_not_given_a_discovery_policy_by_the_mutating_webhook() {
    let mut class = shared("san", &[]);
    class.as_object_mut().unwrap().remove("deviceSelector");
    assert!(mutate_on_create(&cluster(json!([class]))).is_empty());
}

#[test]
fn the_volume_mode_parameter_is_reserved() {
    let review = create(with_shared(|c| {
        c["storageClassOptions"] =
            json!({"additionalParameters": {"lvms.topolvm.io/volume-mode": "thin"}});
    }));
    assert_only_error(
        &review,
        &format!("{SAN}.storageClassOptions.additionalParameters[lvms.topolvm.io/volume-mode]"),
        &["sharedConfig.volumeMode", "remove it"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Mutation

#[test]
fn class_without_policy_or_paths_gets_static_discovery() {
    let mut bare = thin("vg2", &[]);
    bare.as_object_mut().unwrap().remove("deviceSelector");
    let ops = mutate_on_create(&cluster(json!([base(), bare])));
    assert_eq!(
        ops,
        [
            json!({"op": "add", "path": "/spec/storage/deviceClasses/1/deviceDiscoveryPolicy", "value": "Static"})
        ]
    );
}

#[test]
fn class_with_a_policy_or_paths_is_not_mutated() {
    let mut dynamic = thin("vg2", &[]);
    dynamic.as_object_mut().unwrap().remove("deviceSelector");
    dynamic["deviceDiscoveryPolicy"] = json!("Dynamic");
    let mut optional_only = thin("vg3", &[]);
    optional_only["deviceSelector"] = json!({"optionalPaths": ["/dev/sdx"]});
    assert!(mutate_on_create(&cluster(json!([base(), dynamic, optional_only]))).is_empty());
}

/// Applies `add` operations whose parent exists (all `mutate_on_create` emits).
fn apply(mut doc: Value, ops: &[Value]) -> Value {
    for op in ops {
        assert_eq!(op["op"], "add");
        let path = op["path"].as_str().unwrap();
        let (parent, key) = path.rsplit_once('/').unwrap();
        doc.pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .unwrap_or_else(|| panic!("no parent object at {parent}"))
            .insert(key.to_owned(), op["value"].clone());
    }
    doc
}

#[test]
fn mutation_patches_apply_and_are_idempotent() {
    let mut a = base();
    a.as_object_mut().unwrap().remove("deviceSelector");
    let before = cluster(json!([a]));
    let ops = mutate_on_create(&before);
    assert_eq!(ops.len(), 1);
    let after: LVMCluster =
        serde_json::from_value(apply(serde_json::to_value(&before).unwrap(), &ops)).unwrap();
    assert_eq!(
        after.spec.storage.device_classes[0].device_discovery_policy,
        Some(DeviceDiscoveryPolicy::Static)
    );
    assert!(mutate_on_create(&after).is_empty());
}

// ---------------------------------------------------------------------------------------------------------
// LVMS samples

fn samples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../api/tests/samples")
}

/// Placeholders of LVMS's RAID test plan, filled as a user would.
fn fill_placeholders(text: &str) -> String {
    (0..8)
        .fold(text.to_owned(), |t, i| {
            t.replace(&format!("$LOOP{i}"), &format!("/dev/loop{i}"))
        })
        .replace("$NODE", "worker-0")
}

/// Every `lvmcluster_*.yaml` sample except the status-only one, as (file name, text).
fn lvmcluster_samples() -> Vec<(String, String)> {
    let mut samples: Vec<(String, String)> = std::fs::read_dir(samples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            (name.starts_with("lvmcluster_") && name.ends_with(".yaml"))
                .then(|| (name, std::fs::read_to_string(&p).unwrap()))
        })
        .collect();
    samples.sort();
    samples
}

fn parse_sample(text: &str) -> LVMCluster {
    let mut cluster: LVMCluster = serde_norway::from_str(text).unwrap();
    // `kubectl apply -n <operator namespace>` fills in a namespace the manifest leaves out.
    cluster
        .metadata
        .namespace
        .get_or_insert_with(|| NS.to_owned());
    cluster
}

#[test]
fn every_lvms_sample_passes_validate_create() {
    let mut checked = Vec::new();
    for (name, text) in lvmcluster_samples() {
        let cluster = parse_sample(&fill_placeholders(&text));
        if cluster.status.is_some() && cluster.spec.storage.device_classes.is_empty() {
            continue; // status-only: an example of a status, not of a configuration
        }
        let review = validate_create(&cluster, &ctx());
        assert!(review.allowed(), "{name}: {:#?}", review.errors);
        checked.push(name);
    }
    assert_eq!(
        checked,
        [
            "lvmcluster_csi_driver_lvm.yaml",
            "lvmcluster_multiple_classes_with_paths.yaml",
            "lvmcluster_raid1.yaml",
            "lvmcluster_raid10_all_fields.yaml",
            "lvmcluster_shared.yaml",
            "lvmcluster_single_class_thin_pool.yaml",
            "lvmcluster_static_discovery.yaml",
            "lvmcluster_storage_class_options_all.yaml",
            "lvmcluster_thin_pool_all_fields.yaml",
        ]
    );
}

#[test]
fn unfilled_placeholders_in_samples_are_rejected_only_as_paths() {
    let mut with_placeholders = 0;
    for (name, text) in lvmcluster_samples() {
        if !text.contains("$LOOP") {
            continue;
        }
        with_placeholders += 1;
        let review = validate_create(&parse_sample(&text), &ctx());
        assert!(!review.allowed(), "{name}");
        for e in &review.errors {
            assert!(e.field.contains(".deviceSelector.paths["), "{name}: {e}");
            assert!(e.message.contains("under /dev/"), "{name}: {e}");
        }
    }
    assert_eq!(with_placeholders, 2);
}

#[test]
fn samples_survive_mutation_and_an_unchanged_reapply() {
    for (name, text) in lvmcluster_samples() {
        let cluster = parse_sample(&fill_placeholders(&text));
        let mutated: LVMCluster = serde_json::from_value(apply(
            serde_json::to_value(&cluster).unwrap(),
            &mutate_on_create(&cluster),
        ))
        .unwrap();
        for class in &mutated.spec.storage.device_classes {
            assert!(
                has_paths(class) || class.device_discovery_policy.is_some(),
                "{name}: {}",
                class.name
            );
        }
        assert_clean(&validate_update(&mutated, &mutated, &ctx()));
    }
}

#[test]
fn thin_pool_all_fields_sample_only_warns_about_its_ignored_metadata_size() {
    let text = std::fs::read_to_string(samples_dir().join("lvmcluster_thin_pool_all_fields.yaml"))
        .unwrap();
    let review = validate_create(&parse_sample(&text), &ctx());
    assert_only_warning(
        &review,
        &["metadataSize of device class \"vg1\" is ignored"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Device patterns (rules 44–47; patterns in rules 12, 13, 19, 29 and 30)

/// A valid thin class that selects its devices by `patterns` only.
fn matching(name: &str, patterns: &[&str]) -> Value {
    let mut class = thin(name, &[]);
    class["deviceSelector"] = json!({"devicePatterns": patterns});
    class
}

#[test]
fn patterns_alone_name_the_devices_of_a_class_even_beside_others() {
    assert_clean(&create(json!([
        base(),
        matching(
            "nvme",
            &[
                "/dev/nvme[0-9]n[0-9]",
                "/dev/disk/by-id/nvme-*,/dev/sd[c-f]"
            ]
        ),
    ])));
}

#[test]
fn a_pattern_that_is_not_absolute_under_dev_or_does_not_compile_is_rejected_at_its_index() {
    for (pattern, fix) in [
        (
            "nvme*",
            &["\"nvme*\" is not a device pattern", "under /dev/"][..],
        ),
        ("/dev/", &["is not a device pattern"][..]),
        ("/sys/block/*", &["under /dev/"][..]),
        (
            "/dev/sd[b",
            &[
                "\"/dev/sd[b\" is not a valid pattern",
                "not closed by ]",
                "character 7",
            ][..],
        ),
        ("/dev/sd[z-a]", &["below its start", "[a-z]"][..]),
        ("/dev/sdb,,/dev/sdc", &["empty pattern", "extra comma"][..]),
    ] {
        let review = create(json!([base(), matching("m", &["/dev/nvme*", pattern])]));
        assert_only_error(
            &review,
            "spec.storage.deviceClasses[1].deviceSelector.devicePatterns[1]",
            fix,
        );
    }
}

#[test]
fn a_shared_class_with_patterns_is_rejected_at_device_patterns() {
    let review = create(json!([base(), {
        "name": "san",
        "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"], "devicePatterns": ["/dev/disk/by-id/wwn-*"]},
    }]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[1].deviceSelector.devicePatterns",
        &[
            "shared device class \"san\"",
            "same LUNs",
            "remove devicePatterns",
        ],
    );
}

#[test]
fn force_wipe_on_a_class_that_only_matches_patterns_is_rejected_but_allowed_with_paths() {
    let mut class = matching("m", &["/dev/nvme*"]);
    class["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(true);
    assert_only_error(
        &create(json!([base(), class.clone()])),
        "spec.storage.deviceClasses[1].deviceSelector.forceWipeDevicesAndDestroyAllData",
        &[
            "never wiped",
            "list the devices to wipe under deviceSelector.paths",
        ],
    );
    class["deviceSelector"]["paths"] = json!(["/dev/sdz"]);
    assert_clean(&create(json!([base(), class])));
}

#[test]
fn a_pattern_twice_in_a_class_or_in_two_classes_on_the_same_nodes_is_rejected() {
    let review = create(json!([
        base(),
        matching("m", &["/dev/nvme*", "/dev/sdc, /dev/nvme*"]),
    ]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[1].deviceSelector.devicePatterns[1]",
        &[
            "pattern /dev/nvme* is listed twice",
            "first at spec.storage.deviceClasses[1].deviceSelector.devicePatterns[0]",
        ],
    );
    let review = create(json!([
        base(),
        matching("a", &["/dev/nvme*"]),
        matching("b", &["/dev/nvme*"])
    ]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].deviceSelector.devicePatterns[0]",
        &["also in device class \"a\"", "same nodeSelector"],
    );
    let mut elsewhere = matching("b", &["/dev/nvme*"]);
    elsewhere["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "disk", "operator": "In", "values": ["nvme"]}]}]});
    assert_clean(&create(json!([
        base(),
        matching("a", &["/dev/nvme*"]),
        elsewhere
    ])));
}

#[test]
fn dynamic_policy_on_a_pattern_class_is_not_a_warning() {
    let mut class = matching("m", &["/dev/nvme*"]);
    class["deviceDiscoveryPolicy"] = json!("Dynamic");
    assert_clean(&create(json!([base(), class])));
}

#[test]
fn a_pattern_class_gets_the_static_policy_on_create_as_a_discovering_class_does() {
    let ops = mutate_on_create(&cluster(json!([base(), matching("m", &["/dev/nvme*"])])));
    assert_eq!(
        ops,
        [
            json!({"op": "add", "path": "/spec/storage/deviceClasses/1/deviceDiscoveryPolicy",
                "value": "Static"})
        ]
    );
}

#[test]
fn patterns_count_as_devices_when_a_class_is_updated() {
    // Paths may give way to patterns, and patterns to paths.
    let with_paths = thin("m", &["/dev/sdc"]);
    let with_patterns = matching("m", &["/dev/sd[c-f]"]);
    assert_clean(&update(
        json!([base(), with_paths.clone()]),
        json!([base(), with_patterns.clone()]),
    ));
    assert_clean(&update(
        json!([base(), with_patterns.clone()]),
        json!([base(), with_paths]),
    ));
    // A class that matched devices cannot lose every pattern and path.
    let mut emptied = with_patterns.clone();
    emptied.as_object_mut().unwrap().remove("deviceSelector");
    assert_error(
        &update(json!([with_patterns.clone()]), json!([emptied.clone()])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &["cannot lose all of them", "devicePatterns"],
    );
    // A discovering class cannot start matching patterns.
    assert_error(
        &update(json!([emptied]), json!([with_patterns])),
        "spec.storage.deviceClasses[0].deviceSelector",
        &["paths or patterns cannot be added later"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// csi-driver-lvm's StorageClass names (rules 48–50)

/// A valid thick class on `paths` with csi-driver-lvm's StorageClasses.
fn csi_driver_lvm(name: &str, paths: &[&str]) -> Value {
    json!({
        "name": name,
        "deviceSelector": {"paths": paths},
        "csiDriverLVMStorageClasses": true,
    })
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_thick_local_class_with_two_devices_is_allowed() {
    assert_clean(&create(json!([
        base(),
        csi_driver_lvm("fast", &["/dev/sdc", "/dev/sdd"])
    ])));
    let mut patterns = matching("fast", &["/dev/nvme[0-9]n1"]);
    patterns.as_object_mut().unwrap().remove("thinPoolConfig");
    patterns["csiDriverLVMStorageClasses"] = json!(true);
    assert_clean(&create(json!([base(), patterns])));
}

#[test]
fn csi_driver_lvm_storage_classes_on_two_classes_is_rejected_naming_both() {
    let review = create(json!([
        base(),
        csi_driver_lvm("a", &["/dev/sdc", "/dev/sdd"]),
        csi_driver_lvm("b", &["/dev/sde", "/dev/sdf"]),
    ]));
    assert_only_error(
        &review,
        "spec.storage.deviceClasses[2].csiDriverLVMStorageClasses",
        &[
            "\"a\", \"b\"",
            "csi-driver-lvm-linear",
            "one device class only",
        ],
    );
}

#[test]
fn csi_driver_lvm_storage_classes_on_two_classes_with_different_node_selectors_is_rejected() {
    let mut a = csi_driver_lvm("a", &["/dev/sdc", "/dev/sdd"]);
    a["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "zone", "operator": "In", "values": ["a"]}]}]});
    let review = create(json!([
        base(),
        a,
        csi_driver_lvm("b", &["/dev/sde", "/dev/sdf"])
    ]));
    assert_error(
        &review,
        "spec.storage.deviceClasses[2].csiDriverLVMStorageClasses",
        &["\"a\", \"b\""],
    );
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_thin_class_is_rejected_saying_why() {
    let mut class = thin("fast", &["/dev/sdc", "/dev/sdd"]);
    class["csiDriverLVMStorageClasses"] = json!(true);
    assert_only_error(
        &create(json!([base(), class])),
        "spec.storage.deviceClasses[1].csiDriverLVMStorageClasses",
        &["thick, node-local", "thinPoolConfig", "linear only"],
    );
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_raid_class_is_rejected_saying_why() {
    let mut class = raid(json!({"type": "raid1", "mirrors": 1}), 2);
    class["csiDriverLVMStorageClasses"] = json!(true);
    assert_only_error(
        &create(json!([class])),
        "spec.storage.deviceClasses[0].csiDriverLVMStorageClasses",
        &["raidConfig", "already fixes the layout"],
    );
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_shared_class_is_rejected_saying_why() {
    let class = json!({
        "name": "san",
        "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1", "/dev/disk/by-id/wwn-0x2"]},
        "csiDriverLVMStorageClasses": true,
    });
    assert_only_error(
        &create(json!([base(), class])),
        "spec.storage.deviceClasses[1].csiDriverLVMStorageClasses",
        &["it is shared", "node-local"],
    );
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_class_naming_one_device_warns() {
    let review = create(json!([base(), csi_driver_lvm("fast", &["/dev/sdc"])]));
    assert_only_warning(
        &review,
        &[
            "spec.storage.deviceClasses[1].csiDriverLVMStorageClasses",
            "names 1 device ",
            "2 or more",
        ],
    );
    // A literal pattern counts as one named device, and the same device twice counts once.
    let mut class = csi_driver_lvm("fast", &["/dev/sdc"]);
    class["deviceSelector"]["devicePatterns"] = json!(["/dev/sdc"]);
    let review = create(json!([base(), class]));
    assert_eq!(review.warnings.len(), 1, "{:#?}", review.warnings);
    // One path plus an optional path is two.
    let mut class = csi_driver_lvm("fast", &["/dev/sdc"]);
    class["deviceSelector"]["optionalPaths"] = json!(["/dev/sdd"]);
    assert_clean(&create(json!([base(), class])));
}

#[test]
fn csi_driver_lvm_storage_classes_on_a_discovering_or_wildcard_class_does_not_warn() {
    let discovering = json!({"name": "fast", "default": true, "csiDriverLVMStorageClasses": true,
        "deviceDiscoveryPolicy": "Static"});
    let review = create(json!([discovering]));
    assert_allowed(&review);
    // Only the usual warning about a class that names no devices, not rule 50's.
    assert!(
        review
            .warnings
            .iter()
            .all(|w| !w.contains("csiDriverLVMStorageClasses")),
        "{:#?}",
        review.warnings
    );
    let mut class = csi_driver_lvm("fast", &[]);
    class["deviceSelector"] = json!({"devicePatterns": ["/dev/sd[c-d]"]});
    assert_clean(&create(json!([base(), class])));
}

#[test]
fn csi_driver_lvm_storage_classes_rules_apply_on_update_and_the_flag_may_be_turned_off() {
    let on = csi_driver_lvm("fast", &["/dev/sdc", "/dev/sdd"]);
    let mut off = on.clone();
    off["csiDriverLVMStorageClasses"] = json!(false);
    assert_clean(&update(
        json!([base(), on.clone()]),
        json!([base(), off.clone()]),
    ));
    assert_clean(&update(json!([base(), off]), json!([base(), on.clone()])));
    let mut other = base();
    other["csiDriverLVMStorageClasses"] = json!(true);
    let review = update(json!([base(), on.clone()]), json!([other, on]));
    assert_error(
        &review,
        "spec.storage.deviceClasses[1].csiDriverLVMStorageClasses",
        &["\"vg1\", \"fast\""],
    );
    assert_error(
        &review,
        "spec.storage.deviceClasses[0].csiDriverLVMStorageClasses",
        &["thinPoolConfig"],
    );
}

// ---------------------------------------------------------------------------------------------------------
// Adopting csi-driver-lvm's volume group (rule 51)

#[test]
fn adopt_on_a_node_local_class_is_allowed() {
    let class = json!({"name": "csi-lvm", "adopt": "csi-driver-lvm",
        "deviceSelector": {"devicePatterns": ["/dev/nvme[0-9]n[0-9]"]}});
    assert_clean(&create(json!([base(), class.clone()])));
    let mut local = class;
    local["deviceAccessPolicy"] = json!("nodeLocal");
    assert_clean(&create(json!([base(), local])));
}

#[test]
fn adopt_on_a_shared_class_is_rejected_naming_the_field() {
    let class = json!({
        "name": "san",
        "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]},
        "adopt": "csi-driver-lvm",
    });
    assert_only_error(
        &create(json!([base(), class.clone()])),
        "spec.storage.deviceClasses[1].adopt",
        &["adopt: csi-driver-lvm", "\"san\" is shared", "node-local"],
    );
    let mut without = class.clone();
    without.as_object_mut().unwrap().remove("adopt");
    assert_error(
        &update(json!([base(), without]), json!([base(), class])),
        "spec.storage.deviceClasses[1].adopt",
        &["node-local"],
    );
}
