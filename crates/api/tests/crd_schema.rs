//! The shape of the generated CRDs: names, scope, subresources, printer columns, enums, bounds,
//! defaults, list semantics and CEL rules; and what the CEL rules accept and reject.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{at, cel_errors, crd, rules, schema, schema_violations};
use serde_json::{Value, json};

// ------------------------------------------------------------------------------------------------
// Names, scope, subresources, printer columns
// ------------------------------------------------------------------------------------------------

#[test]
fn crds_have_lvms_and_topolvm_names_and_scopes() {
    for (kind, name, group, version, plural, scope) in [
        (
            "LVMCluster",
            "lvmclusters.lvm.topolvm.io",
            "lvm.topolvm.io",
            "v1alpha1",
            "lvmclusters",
            "Namespaced",
        ),
        (
            "LVMVolumeGroup",
            "lvmvolumegroups.lvm.topolvm.io",
            "lvm.topolvm.io",
            "v1alpha1",
            "lvmvolumegroups",
            "Namespaced",
        ),
        (
            "LVMVolumeGroupNodeStatus",
            "lvmvolumegroupnodestatuses.lvm.topolvm.io",
            "lvm.topolvm.io",
            "v1alpha1",
            "lvmvolumegroupnodestatuses",
            "Namespaced",
        ),
        (
            "LogicalVolume",
            "logicalvolumes.topolvm.io",
            "topolvm.io",
            "v1",
            "logicalvolumes",
            "Cluster",
        ),
    ] {
        let c = crd(kind);
        assert_eq!(c.metadata.name.as_deref(), Some(name));
        assert_eq!(c.spec.group, group);
        assert_eq!(c.spec.names.plural, plural);
        assert_eq!(
            c.spec.names.singular.as_deref(),
            Some(kind.to_lowercase().as_str())
        );
        assert_eq!(c.spec.scope, scope, "{kind}");
        let v = &c.spec.versions[0];
        assert_eq!(v.name, version);
        assert!(v.served && v.storage, "{kind} served and stored");
    }
}

#[test]
fn every_crd_has_the_status_subresource() {
    for kind in [
        "LVMCluster",
        "LVMVolumeGroup",
        "LVMVolumeGroupNodeStatus",
        "LogicalVolume",
    ] {
        let c = crd(kind);
        let sub = c.spec.versions[0]
            .subresources
            .as_ref()
            .expect("subresources");
        assert!(sub.status.is_some(), "{kind} has /status");
        assert!(sub.scale.is_none(), "{kind} has no /scale");
    }
}

#[test]
fn lvmcluster_prints_its_state_as_status_column() {
    let c = crd("LVMCluster");
    let cols = c.spec.versions[0]
        .additional_printer_columns
        .as_ref()
        .expect("columns");
    assert_eq!(cols.len(), 1);
    assert_eq!(cols[0].name, "Status");
    assert_eq!(cols[0].type_, "string");
    assert_eq!(cols[0].json_path, ".status.state");
}

#[test]
fn schemas_are_structural_without_nullable() {
    for kind in [
        "LVMCluster",
        "LVMVolumeGroup",
        "LVMVolumeGroupNodeStatus",
        "LogicalVolume",
    ] {
        let text = serde_json::to_string(&schema(kind)).expect("serialises");
        assert!(!text.contains("\"nullable\""), "{kind} has nullable");
        assert!(!text.contains("\"$ref\""), "{kind} has $ref");
        assert!(
            !text.contains("anyOf") && !text.contains("oneOf"),
            "{kind} has anyOf/oneOf"
        );
        assert!(
            !text.contains("null]") && !text.contains("null,"),
            "{kind} lists null"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Enums, bounds, defaults
// ------------------------------------------------------------------------------------------------

const CLASS: &str = "spec.storage.deviceClasses.[]";

fn enum_of(node: &Value) -> Vec<&str> {
    node["enum"]
        .as_array()
        .expect("enum")
        .iter()
        .map(|v| v.as_str().expect("string value"))
        .collect()
}

#[test]
fn lvmcluster_enums_match_lvms() {
    let s = schema("LVMCluster");
    for (path, values) in [
        ("fstype", vec!["xfs", "ext4"]),
        ("deviceDiscoveryPolicy", vec!["Static", "Dynamic"]),
        (
            "thinPoolConfig.chunkSizeCalculationPolicy",
            vec!["Host", "Static"],
        ),
        (
            "thinPoolConfig.metadataSizeCalculationPolicy",
            vec!["Host", "Static"],
        ),
        (
            "raidConfig.type",
            vec!["raid1", "raid4", "raid5", "raid6", "raid10"],
        ),
        (
            "storageClassOptions.reclaimPolicy",
            vec!["Delete", "Retain"],
        ),
        (
            "storageClassOptions.volumeBindingMode",
            vec!["WaitForFirstConsumer", "Immediate"],
        ),
    ] {
        assert_eq!(
            enum_of(at(&s, &format!("{CLASS}.{path}"))),
            values,
            "{path}"
        );
    }
    assert_eq!(
        enum_of(at(&s, "status.state")),
        ["Progressing", "Ready", "Failed", "Degraded", "Unknown"]
    );
    assert_eq!(
        enum_of(at(&s, "status.deviceClassStatuses.[].nodeStatus.[].status")),
        ["Progressing", "Ready", "Failed", "Degraded"]
    );
}

#[test]
fn node_status_enums_match_lvms() {
    let s = schema("LVMVolumeGroupNodeStatus");
    let vg = at(&s, "spec.nodeStatus.[]");
    assert_eq!(
        enum_of(at(vg, "status")),
        ["Progressing", "Ready", "Failed", "Degraded"]
    );
    assert_eq!(
        enum_of(at(vg, "deviceDiscoveryPolicy")),
        ["Preconfigured", "RuntimeDynamic", "RuntimeStatic"]
    );
    assert_eq!(at(vg, "deviceDiscoveryPolicy")["default"], "RuntimeStatic");
    assert_eq!(
        enum_of(at(vg, "raidStatus.status")),
        ["Healthy", "Degraded", "Failed"]
    );
    assert_eq!(
        at(vg, "excluded.[]")["required"],
        json!(["name", "reasons"])
    );
    assert_eq!(
        enum_of(at(vg, "shared.lockspace")),
        ["Joined", "Joining", "NotJoined"]
    );
    for (field, type_) in [
        ("devicesVisible", "boolean"),
        ("hostId", "integer"),
        ("ioTimeoutSeconds", "integer"),
        ("reason", "string"),
    ] {
        assert_eq!(at(vg, &format!("shared.{field}"))["type"], type_, "{field}");
    }
}

#[test]
fn shared_class_fields_and_bounds() {
    let s = schema("LVMCluster");
    assert_eq!(
        enum_of(at(&s, &format!("{CLASS}.deviceAccessPolicy"))),
        ["nodeLocal", "local", "shared"]
    );
    let shared = at(&s, &format!("{CLASS}.sharedConfig"));
    assert_eq!(enum_of(at(shared, "volumeMode")), ["Linear", "Thin"]);
    assert_eq!(enum_of(at(shared, "wipePolicy")), ["Full", "UnsafeFast"]);
    let timeout = at(shared, "ioTimeoutSeconds");
    assert_eq!(
        (timeout["minimum"].as_f64(), timeout["maximum"].as_f64()),
        (Some(5.0), Some(60.0))
    );
    // Unset stays unset: the accessors give the defaults, the CEL rules compare effective values.
    for field in ["volumeMode", "wipePolicy", "ioTimeoutSeconds"] {
        assert!(at(shared, field).get("default").is_none(), "{field}");
    }
    assert_eq!(
        at(&s, "status.deviceClassStatuses.[].joinedNodes")["items"]["type"],
        "string"
    );
    let vg = schema("LVMVolumeGroup");
    assert_eq!(
        enum_of(at(&vg, "spec.deviceAccessPolicy")),
        ["nodeLocal", "local", "shared"]
    );
    assert_eq!(
        at(&vg, "spec.sharedConfig.ioTimeoutSeconds")["maximum"].as_f64(),
        Some(60.0)
    );
}

#[test]
fn the_cel_defaults_are_the_api_defaults() {
    let s = schema("LVMCluster");
    let class_rules = rules(at(&s, CLASS));
    let timeout = class_rules
        .iter()
        .find(|r| r.contains("ioTimeoutSeconds"))
        .expect("ioTimeoutSeconds rule");
    assert!(
        timeout.contains(&format!(": {}) ==", lvms_api::DEFAULT_IO_TIMEOUT_SECONDS)),
        "{timeout}"
    );
    let mode = class_rules
        .iter()
        .find(|r| r.contains("volumeMode"))
        .expect("volumeMode rule");
    assert!(
        mode.contains(&format!("'{}'", lvms_api::SharedVolumeMode::default())),
        "{mode}"
    );
}

#[test]
fn device_class_name_is_a_dns_label_of_at_most_245_characters() {
    let s = schema("LVMCluster");
    let name = at(&s, &format!("{CLASS}.name"));
    assert_eq!(name["minLength"], 1);
    assert_eq!(name["maxLength"], 245);
    assert_eq!(name["pattern"], "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
    assert_eq!(at(&s, CLASS)["required"], json!(["name"]));
}

#[test]
fn thin_pool_bounds_and_defaults_match_lvms() {
    let s = schema("LVMCluster");
    let pool = at(&s, &format!("{CLASS}.thinPoolConfig"));
    assert_eq!(pool["required"], json!(["name", "overprovisionRatio"]));
    let size = at(pool, "sizePercent");
    assert_eq!(
        (size["minimum"].as_f64(), size["maximum"].as_f64()),
        (Some(10.0), Some(100.0))
    );
    assert_eq!(size["default"], 90);
    let ratio = at(pool, "overprovisionRatio");
    assert_eq!(
        (ratio["minimum"].as_f64(), ratio["maximum"].as_f64()),
        (Some(1.0), Some(100.0))
    );
    assert_eq!(at(pool, "chunkSizeCalculationPolicy")["default"], "Static");
    assert_eq!(at(pool, "metadataSizeCalculationPolicy")["default"], "Host");
    for q in ["chunkSize", "metadataSize"] {
        assert_eq!(
            at(pool, q)["x-kubernetes-int-or-string"],
            true,
            "{q} is a quantity"
        );
    }
}

#[test]
fn raid_bounds_match_lvms() {
    let s = schema("LVMCluster");
    let raid = at(&s, &format!("{CLASS}.raidConfig"));
    assert_eq!(raid["required"], json!(["type"]));
    assert_eq!(at(raid, "mirrors")["minimum"].as_f64(), Some(1.0));
    assert_eq!(at(raid, "stripes")["minimum"].as_f64(), Some(2.0));
    assert_eq!(at(raid, "stripeSize")["x-kubernetes-int-or-string"], true);
}

#[test]
fn fstype_defaults_to_xfs_and_storage_class_maps_hold_at_most_16_entries() {
    let s = schema("LVMCluster");
    assert_eq!(at(&s, &format!("{CLASS}.fstype"))["default"], "xfs");
    for map in ["additionalParameters", "additionalLabels"] {
        let node = at(&s, &format!("{CLASS}.storageClassOptions.{map}"));
        assert_eq!(node["maxProperties"], 16, "{map}");
        assert_eq!(node["additionalProperties"]["type"], "string", "{map}");
    }
}

#[test]
fn device_classes_are_a_map_list_keyed_by_name_with_at_most_64_entries() {
    let s = schema("LVMCluster");
    let list = at(&s, "spec.storage.deviceClasses");
    assert_eq!(list["x-kubernetes-list-type"], "map");
    assert_eq!(list["x-kubernetes-list-map-keys"], json!(["name"]));
    assert_eq!(list["maxItems"], 64);
}

#[test]
fn logical_volume_requires_name_node_and_size() {
    let s = schema("LogicalVolume");
    assert_eq!(
        at(&s, "spec")["required"],
        json!(["name", "nodeName", "size"])
    );
    assert_eq!(at(&s, "spec.size")["x-kubernetes-int-or-string"], true);
    assert_eq!(
        at(&s, "status.currentSize")["x-kubernetes-int-or-string"],
        true
    );
    assert_eq!(at(&s, "status.code")["type"], "integer");
    for field in ["deviceClass", "lvcreateOptionClass", "source", "accessType"] {
        assert_eq!(
            at(&s, &format!("spec.{field}"))["type"],
            "string",
            "{field}"
        );
    }
    assert_eq!(at(&s, "status.volumeID")["type"], "string");
}

#[test]
fn schema_rejects_out_of_bounds_values() {
    let s = schema("LVMCluster");
    let base = json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster", "metadata": {"name": "c"},
        "spec": {"storage": {"deviceClasses": [{"name": "vg1",
            "thinPoolConfig": {"name": "tp", "overprovisionRatio": 10}}]}}});
    assert!(schema_violations(&s, &base).is_empty());
    for (path, bad) in [
        ("/thinPoolConfig/sizePercent", json!(9)),
        ("/thinPoolConfig/sizePercent", json!(101)),
        ("/thinPoolConfig/overprovisionRatio", json!(0)),
        ("/thinPoolConfig/overprovisionRatio", json!(101)),
        ("/name", json!("VG_1")),
        ("/name", json!("")),
        ("/fstype", json!("btrfs")),
    ] {
        let mut v = base.clone();
        let (parent, key) = path.rsplit_once('/').expect("path");
        v.pointer_mut(&format!("/spec/storage/deviceClasses/0{parent}"))
            .and_then(Value::as_object_mut)
            .expect("parent object")
            .insert(key.to_owned(), bad.clone());
        assert!(
            !schema_violations(&s, &v).is_empty(),
            "{path} = {bad} accepted"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// CEL rules: where they sit
// ------------------------------------------------------------------------------------------------

#[test]
fn cel_rules_sit_on_the_device_class_and_its_fstype() {
    let s = schema("LVMCluster");
    let class_rules = rules(at(&s, CLASS));
    assert_eq!(class_rules.len(), 7, "{class_rules:#?}");
    for field in [
        "raidConfig",
        "reclaimPolicy",
        "volumeBindingMode",
        "additionalParameters",
        "deviceAccessPolicy",
        "ioTimeoutSeconds",
        "volumeMode",
    ] {
        assert!(
            class_rules
                .iter()
                .any(|r| r.contains(field) && r.contains("oldSelf")),
            "no transition rule for {field}"
        );
    }
    assert_eq!(
        rules(at(&s, &format!("{CLASS}.fstype"))),
        ["self == oldSelf"]
    );
    let field_paths: Vec<&str> = at(&s, CLASS)["x-kubernetes-validations"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| r["fieldPath"].as_str().expect("fieldPath"))
        .collect();
    assert_eq!(
        field_paths,
        [
            ".raidConfig",
            ".storageClassOptions.reclaimPolicy",
            ".storageClassOptions.volumeBindingMode",
            ".storageClassOptions.additionalParameters",
            ".deviceAccessPolicy",
            ".sharedConfig.ioTimeoutSeconds",
            ".sharedConfig.volumeMode",
        ]
    );
}

#[test]
fn no_other_cel_rules_than_the_documented_ones() {
    fn count(v: &Value) -> usize {
        match v {
            Value::Object(m) => {
                m.get("x-kubernetes-validations")
                    .and_then(Value::as_array)
                    .map_or(0, Vec::len)
                    + m.values().map(count).sum::<usize>()
            }
            Value::Array(a) => a.iter().map(count).sum(),
            _ => 0,
        }
    }
    assert_eq!(count(&schema("LVMCluster")), 8);
    assert_eq!(count(&schema("LVMVolumeGroup")), 0);
    assert_eq!(count(&schema("LVMVolumeGroupNodeStatus")), 0);
    assert_eq!(count(&schema("LogicalVolume")), 0);
}

#[test]
fn transition_rules_only_sit_under_correlatable_lists() {
    // The API server only evaluates oldSelf where old and new values correlate: not under atomic
    // or set lists. Every rule using oldSelf must have only map lists among its ancestors.
    fn walk(v: &Value, under_uncorrelatable_list: bool, path: &str, bad: &mut Vec<String>) {
        let Some(m) = v.as_object() else { return };
        if under_uncorrelatable_list && rules(v).iter().any(|r| r.contains("oldSelf")) {
            bad.push(path.to_owned());
        }
        if let Some(props) = m.get("properties").and_then(Value::as_object) {
            for (k, sub) in props {
                walk(sub, under_uncorrelatable_list, &format!("{path}.{k}"), bad);
            }
        }
        if let Some(items) = m.get("items") {
            let map_list = m.get("x-kubernetes-list-type") == Some(&json!("map"));
            walk(
                items,
                under_uncorrelatable_list || !map_list,
                &format!("{path}[]"),
                bad,
            );
        }
        if let Some(extra) = m.get("additionalProperties") {
            walk(
                extra,
                under_uncorrelatable_list,
                &format!("{path}{{}}"),
                bad,
            );
        }
    }
    for kind in ["LVMCluster", "LVMVolumeGroup"] {
        let mut bad = Vec::new();
        walk(&schema(kind), false, "", &mut bad);
        assert!(
            bad.is_empty(),
            "{kind}: transition rules under non-map lists: {bad:?}"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// CEL rules: what they accept and reject (evaluated client-side with kube-cel)
// ------------------------------------------------------------------------------------------------

fn cluster(class: Value) -> Value {
    json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": {"name": "c", "namespace": "lvms"},
        "spec": {"storage": {"deviceClasses": [class]}}})
}

fn thin(extra: Value) -> Value {
    let mut class = json!({"name": "vg1", "deviceSelector": {"paths": ["/dev/vdb"]},
        "thinPoolConfig": {"name": "tp", "overprovisionRatio": 10}});
    if let (Some(c), Some(e)) = (class.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    class
}

fn update_errors(old_class: Value, new_class: Value) -> Vec<String> {
    cel_errors("LVMCluster", &cluster(new_class), Some(&cluster(old_class)))
}

fn assert_rejected_with(errors: &[String], needle: &str) {
    assert!(
        errors.iter().any(|e| e.contains(needle)),
        "expected an error about {needle}, got {errors:?}"
    );
}

#[test]
fn create_accepts_any_valid_class() {
    let class = thin(
        json!({"fstype": "ext4", "storageClassOptions": {"reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate", "additionalParameters": {"k": "v"}}}),
    );
    assert!(cel_errors("LVMCluster", &cluster(class), None).is_empty());
}

#[test]
fn fstype_change_is_rejected() {
    let errors = update_errors(
        thin(json!({"fstype": "xfs"})),
        thin(json!({"fstype": "ext4"})),
    );
    assert_rejected_with(&errors, "fstype is immutable");
}

#[test]
fn fstype_unchanged_or_defaulted_is_accepted() {
    assert!(
        update_errors(
            thin(json!({"fstype": "ext4"})),
            thin(json!({"fstype": "ext4"}))
        )
        .is_empty()
    );
    // absent means the default xfs on both sides
    assert!(update_errors(thin(json!({})), thin(json!({"fstype": "xfs"}))).is_empty());
}

#[test]
fn removing_fstype_set_to_ext4_is_rejected_as_it_becomes_xfs() {
    let errors = update_errors(thin(json!({"fstype": "ext4"})), thin(json!({})));
    assert_rejected_with(&errors, "fstype is immutable");
}

fn raid(config: Value) -> Value {
    json!({"name": "r1", "deviceSelector": {"paths": ["/dev/vdb", "/dev/vdc", "/dev/vdd"]}, "raidConfig": config})
}

#[test]
fn raid_config_change_is_rejected() {
    let errors = update_errors(
        raid(json!({"type": "raid1"})),
        raid(json!({"type": "raid5"})),
    );
    assert_rejected_with(&errors, "raidConfig is immutable");
    let errors = update_errors(
        raid(json!({"type": "raid1", "mirrors": 1})),
        raid(json!({"type": "raid1", "mirrors": 2})),
    );
    assert_rejected_with(&errors, "raidConfig is immutable");
}

#[test]
fn raid_config_cannot_be_added_or_removed() {
    let plain = json!({"name": "r1", "deviceSelector": {"paths": ["/dev/vdb", "/dev/vdc"]}});
    assert_rejected_with(
        &update_errors(plain.clone(), raid(json!({"type": "raid1"}))),
        "raidConfig is immutable",
    );
    assert_rejected_with(
        &update_errors(raid(json!({"type": "raid1"})), plain),
        "raidConfig is immutable",
    );
}

#[test]
fn raid_class_may_gain_paths() {
    let mut grown = raid(json!({"type": "raid1"}));
    grown["deviceSelector"]["paths"] = json!(["/dev/vdb", "/dev/vdc", "/dev/vdd", "/dev/vde"]);
    assert!(update_errors(raid(json!({"type": "raid1"})), grown).is_empty());
}

fn sco(options: Value) -> Value {
    thin(json!({"storageClassOptions": options}))
}

#[test]
fn reclaim_policy_change_is_rejected() {
    let errors = update_errors(
        sco(json!({"reclaimPolicy": "Delete"})),
        sco(json!({"reclaimPolicy": "Retain"})),
    );
    assert_rejected_with(&errors, "reclaimPolicy is immutable");
    let errors = update_errors(sco(json!({"reclaimPolicy": "Retain"})), sco(json!({})));
    assert_rejected_with(&errors, "reclaimPolicy is immutable");
}

#[test]
fn reclaim_policy_may_be_spelled_out_as_its_default() {
    assert!(update_errors(thin(json!({})), sco(json!({"reclaimPolicy": "Delete"}))).is_empty());
    assert!(update_errors(sco(json!({"reclaimPolicy": "Delete"})), thin(json!({}))).is_empty());
}

#[test]
fn storage_class_options_added_later_must_keep_the_defaults() {
    assert_rejected_with(
        &update_errors(thin(json!({})), sco(json!({"reclaimPolicy": "Retain"}))),
        "reclaimPolicy is immutable",
    );
    assert_rejected_with(
        &update_errors(
            thin(json!({})),
            sco(json!({"volumeBindingMode": "Immediate"})),
        ),
        "volumeBindingMode is immutable",
    );
    assert_rejected_with(
        &update_errors(
            thin(json!({})),
            sco(json!({"additionalParameters": {"k": "v"}})),
        ),
        "additionalParameters is immutable",
    );
}

#[test]
fn volume_binding_mode_change_is_rejected() {
    let errors = update_errors(
        sco(json!({"volumeBindingMode": "WaitForFirstConsumer"})),
        sco(json!({"volumeBindingMode": "Immediate"})),
    );
    assert_rejected_with(&errors, "volumeBindingMode is immutable");
}

#[test]
fn additional_parameters_change_or_removal_is_rejected() {
    let old = sco(json!({"additionalParameters": {"k": "v"}}));
    assert_rejected_with(
        &update_errors(
            old.clone(),
            sco(json!({"additionalParameters": {"k": "w"}})),
        ),
        "additionalParameters is immutable",
    );
    assert_rejected_with(
        &update_errors(
            old.clone(),
            sco(json!({"additionalParameters": {"k": "v", "x": "y"}})),
        ),
        "additionalParameters is immutable",
    );
    assert_rejected_with(
        &update_errors(old, sco(json!({}))),
        "additionalParameters is immutable",
    );
}

#[test]
fn additional_labels_may_change() {
    let errors = update_errors(
        sco(json!({"reclaimPolicy": "Retain", "additionalLabels": {"team": "a"}})),
        sco(json!({"reclaimPolicy": "Retain", "additionalLabels": {"team": "b", "env": "prod"}})),
    );
    assert!(errors.is_empty(), "{errors:?}");
}

#[test]
fn overprovision_ratio_may_change() {
    let mut new = thin(json!({}));
    new["thinPoolConfig"]["overprovisionRatio"] = json!(20);
    assert!(update_errors(thin(json!({})), new).is_empty());
}

#[test]
fn a_new_class_added_on_update_is_not_compared_with_anything() {
    let old = cluster(thin(json!({})));
    let mut new = old.clone();
    new["spec"]["storage"]["deviceClasses"]
        .as_array_mut()
        .expect("list")
        .push(raid(json!({"type": "raid1"})));
    assert!(cel_errors("LVMCluster", &new, Some(&old)).is_empty());
}

fn shared(extra: Value) -> Value {
    let mut class = json!({"name": "san", "deviceAccessPolicy": "shared",
        "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x1"]}});
    if let (Some(c), Some(e)) = (class.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    class
}

fn without_policy(mut class: Value) -> Value {
    class
        .as_object_mut()
        .expect("object")
        .remove("deviceAccessPolicy");
    class
}

#[test]
fn unset_access_policy_cannot_become_shared() {
    let old = without_policy(shared(json!({})));
    assert_rejected_with(
        &update_errors(old, shared(json!({}))),
        "deviceAccessPolicy cannot change between shared and nodeLocal",
    );
}

#[test]
fn shared_cannot_become_node_local_in_any_spelling() {
    for new in [
        without_policy(shared(json!({}))),
        shared(json!({"deviceAccessPolicy": "local"})),
        shared(json!({"deviceAccessPolicy": "nodeLocal"})),
    ] {
        assert_rejected_with(
            &update_errors(shared(json!({})), new),
            "remove the device class and add a new one",
        );
    }
}

#[test]
fn local_node_local_and_unset_are_the_same_policy() {
    let spellings = [
        without_policy(shared(json!({}))),
        shared(json!({"deviceAccessPolicy": "local"})),
        shared(json!({"deviceAccessPolicy": "nodeLocal"})),
    ];
    for old in &spellings {
        for new in &spellings {
            let errors = update_errors(old.clone(), new.clone());
            assert!(errors.is_empty(), "{old} -> {new}: {errors:?}");
        }
    }
}

#[test]
fn io_timeout_change_is_rejected_and_unset_means_ten() {
    let timeout = |t: Value| shared(json!({"sharedConfig": {"ioTimeoutSeconds": t}}));
    assert_rejected_with(
        &update_errors(timeout(json!(10)), timeout(json!(20))),
        "sharedConfig.ioTimeoutSeconds is immutable",
    );
    assert_rejected_with(
        &update_errors(shared(json!({})), timeout(json!(20))),
        "sharedConfig.ioTimeoutSeconds is immutable",
    );
    assert!(update_errors(shared(json!({})), timeout(json!(10))).is_empty());
    assert!(update_errors(timeout(json!(10)), shared(json!({"sharedConfig": {}}))).is_empty());
}

#[test]
fn volume_mode_change_is_rejected_and_wipe_policy_may_change() {
    let config = |c: Value| shared(json!({"sharedConfig": c}));
    assert_rejected_with(
        &update_errors(shared(json!({})), config(json!({"volumeMode": "Thin"}))),
        "sharedConfig.volumeMode is immutable",
    );
    assert!(update_errors(shared(json!({})), config(json!({"volumeMode": "Linear"}))).is_empty());
    assert!(
        update_errors(
            config(json!({"wipePolicy": "Full"})),
            config(json!({"wipePolicy": "UnsafeFast"}))
        )
        .is_empty()
    );
}

#[test]
fn a_shared_class_added_on_update_is_not_compared_with_anything() {
    let old = cluster(thin(json!({})));
    let mut new = old.clone();
    new["spec"]["storage"]["deviceClasses"]
        .as_array_mut()
        .expect("list")
        .push(shared(json!({"sharedConfig": {"ioTimeoutSeconds": 30}})));
    assert!(cel_errors("LVMCluster", &new, Some(&old)).is_empty());
}

#[test]
fn io_timeout_range_is_enforced_by_the_schema() {
    let s = schema("LVMCluster");
    for (timeout, ok) in [(4, false), (5, true), (10, true), (60, true), (61, false)] {
        let v = cluster(shared(
            json!({"sharedConfig": {"ioTimeoutSeconds": timeout}}),
        ));
        assert_eq!(
            schema_violations(&s, &v).is_empty(),
            ok,
            "ioTimeoutSeconds {timeout}: {:?}",
            schema_violations(&s, &v)
        );
    }
    let bad_policy = cluster(shared(json!({"deviceAccessPolicy": "Shared"})));
    assert!(!schema_violations(&s, &bad_policy).is_empty());
}

#[test]
fn lvm_volume_group_takes_raid_with_a_thin_pool() {
    let vg = |spec: Value| {
        json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
            "metadata": {"name": "vg1", "namespace": "lvms"}, "spec": spec})
    };
    let both = vg(
        json!({"raidConfig": {"type": "raid1"}, "thinPoolConfig": {"name": "tp", "overprovisionRatio": 1}}),
    );
    // A RAID thin pool (ADR 0031).
    assert!(cel_errors("LVMVolumeGroup", &both, None).is_empty());
    assert!(
        cel_errors(
            "LVMVolumeGroup",
            &vg(json!({"raidConfig": {"type": "raid1"}})),
            None
        )
        .is_empty()
    );
    assert!(
        cel_errors(
            "LVMVolumeGroup",
            &vg(json!({"thinPoolConfig": {"name": "tp", "overprovisionRatio": 1}})),
            None
        )
        .is_empty()
    );
}
