//! Scenario 1's rule table: every admission rule for `LVMCluster` once, on create and on update, as
//! the real API server answers it (schema and CEL first, then the webhook served by this process).
//!
//! Each rule has a valid object and an invalid twin. The valid one must be admitted without a
//! warning, so the refusal (or warning) of the twin comes from the difference. Rules 1 and 2 apply
//! on create only, 22–30 and 41–43 on update only; 3–21, 31–40 and 44–51 are checked on both (on update,
//! the valid twin is created and then replaced by the invalid one). Rule 38 (no wipe of a shared
//! volume group that exists) needs a node to report the volume group: the test creates an
//! `LVMVolumeGroupNodeStatus` that reports the shared class `san` ready.

use kube::{Api, Client, client::Body};
use lvms_api::{LVMCluster, LVMVolumeGroupNodeStatus};
use serde_json::{Value, json};

use crate::{
    support::{self, TestNamespace},
    webhook::Webhook,
};

/// What the API server must answer to the invalid twin.
#[derive(Clone, Copy, Debug)]
enum Expect {
    /// Refused, the message naming this field.
    Refused(&'static str),
    /// Admitted with a warning containing this.
    Warned(&'static str),
}

use Expect::{Refused, Warned};

/// One rule: its number, a valid spec's device classes and an invalid twin's.
struct Case {
    rule: u8,
    good: Value,
    bad: Value,
    expect: Expect,
    /// For rules 3–21: the update (old, new) that breaks the rule, when replacing `good` by `bad`
    /// would change an immutable field (refused for that first, by CEL).
    update: Option<(Value, Value)>,
}

fn case(rule: u8, good: Value, bad: Value, expect: Expect) -> Case {
    Case {
        rule,
        good,
        bad,
        expect,
        update: None,
    }
}

impl Case {
    /// Reaches `bad` on update by adding its classes, not default, to a cluster that had only
    /// the default class `keep`: create rules judge every class an update adds.
    fn by_adding(mut self) -> Self {
        let keep =
            json!({"name": "keep", "default": true, "deviceSelector": {"paths": ["/dev/sdz"]}});
        let mut new: Vec<Value> = self.bad.as_array().unwrap().clone();
        for class in &mut new {
            class["default"] = json!(false);
        }
        new.push(keep.clone());
        self.update = Some((json!([keep]), Value::Array(new)));
        self
    }

    /// Reaches `bad` on update from `bad` with another, mutable, `overprovisionRatio`.
    fn by_tweaking(mut self) -> Self {
        let mut old = self.bad.clone();
        old[0]["thinPoolConfig"]["overprovisionRatio"] = json!(5);
        self.update = Some((old, self.bad.clone()));
        self
    }

    /// The update (old, new) that breaks the rule.
    fn update(&self) -> (&Value, &Value) {
        match &self.update {
            Some((old, new)) => (old, new),
            None => (&self.good, &self.bad),
        }
    }
}

/// A default thin class `vg1` on `/dev/sdb`.
fn base() -> Value {
    json!({"name": "vg1", "default": true, "deviceSelector": {"paths": ["/dev/sdb"]},
           "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 90, "overprovisionRatio": 10}})
}

/// `base()` with `edit` applied.
fn with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut class = base();
    edit(&mut class);
    class
}

/// A default thick class `vg1` with `devices` paths and this RAID config.
fn raid(config: Value, devices: usize) -> Value {
    let paths: Vec<String> = (0..devices).map(|i| format!("/dev/vd{i}")).collect();
    json!({"name": "vg1", "default": true, "deviceSelector": {"paths": paths}, "raidConfig": config})
}

/// `raid()` with `base()`'s thin pool: a RAID thin pool (ADR 0031).
fn raid_thin(config: Value, devices: usize) -> Value {
    let mut class = raid(config, devices);
    class["thinPoolConfig"] = base()["thinPoolConfig"].clone();
    class
}

/// A second, thick class.
fn thick(name: &str, paths: &[&str]) -> Value {
    json!({"name": name, "deviceSelector": {"paths": paths}})
}

/// Rules 3–21: they judge one object, so they apply on create and on update.
fn object_rules() -> Vec<Case> {
    vec![
        case(
            3,
            json!([base(), thick("vg2", &["/dev/sdc"])]),
            json!([base(), {"name": "vg2", "default": true, "deviceSelector": {"paths": ["/dev/sdc"]}}]),
            Refused("spec.storage.deviceClasses[1].default"),
        ),
        case(
            3,
            json!([base()]),
            json!([with(|c| c["default"] = json!(false))]),
            Warned("no device class is marked default"),
        ),
        case(
            4,
            json!([base()]),
            json!([with(|c| c["thinPoolConfig"]["sizePercent"] = json!(95))]),
            Warned("sizePercent of device class \"vg1\" is 95%"),
        )
        .by_adding(),
        // A RAID thin pool is admitted (the valid twin) and keeps the RAID rules.
        case(
            5,
            json!([raid_thin(json!({"type": "raid1", "mirrors": 1}), 2)]),
            json!([raid_thin(json!({"type": "raid6"}), 4)]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        )
        .by_adding(),
        case(
            6,
            json!([raid(json!({"type": "raid5"}), 3)]),
            json!([raid(json!({"type": "raid5", "mirrors": 1}), 3)]),
            Refused("spec.storage.deviceClasses[0].raidConfig.mirrors"),
        )
        .by_adding(),
        case(
            7,
            json!([raid(json!({"type": "raid1", "mirrors": 1}), 2)]),
            json!([raid(
                json!({"type": "raid1", "mirrors": 1, "stripes": 2}),
                2
            )]),
            Refused("spec.storage.deviceClasses[0].raidConfig.stripes"),
        )
        .by_adding(),
        case(
            8,
            json!([raid(json!({"type": "raid5", "stripeSize": "64Ki"}), 3)]),
            json!([raid(json!({"type": "raid5", "stripeSize": "96Ki"}), 3)]),
            Refused("spec.storage.deviceClasses[0].raidConfig.stripeSize"),
        )
        .by_adding(),
        case(
            9,
            json!([raid(json!({"type": "raid1", "mirrors": 1}), 2)]),
            json!([{"name": "vg1", "default": true, "raidConfig": {"type": "raid1", "mirrors": 1}}]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        ),
        case(
            10,
            json!([raid(json!({"type": "raid6"}), 5)]),
            json!([raid(json!({"type": "raid6"}), 4)]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        ),
        case(
            11,
            json!([raid(json!({"type": "raid10", "mirrors": 1}), 4)]),
            json!([raid(json!({"type": "raid10", "mirrors": 1}), 5)]),
            Refused("spec.storage.deviceClasses[0].deviceSelector.paths"),
        ),
        case(
            12,
            json!([base()]),
            json!([with(
                |c| c["deviceSelector"] = json!({"forceWipeDevicesAndDestroyAllData": true})
            )]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        ),
        case(
            13,
            json!([base(), thick("vg2", &["/dev/sdc"])]),
            json!([base(), {"name": "vg2"}]),
            Refused("spec.storage.deviceClasses[1].deviceSelector"),
        ),
        case(
            14,
            json!([base()]),
            json!([with(|c| c["deviceSelector"]["paths"] = json!(["sdb"]))]),
            Refused("spec.storage.deviceClasses[0].deviceSelector.paths[0]"),
        ),
        case(
            15,
            json!([base(), thick("vg2", &["/dev/sdc"])]),
            json!([base(), thick("vg2", &["/dev/sdb"])]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.paths[0]"),
        ),
        case(
            16,
            json!([with(|c| c["fstype"] = json!("ext4"))]),
            json!([with(|c| c["fstype"] = json!("btrfs"))]),
            Refused("spec.storage.deviceClasses[0].fstype"),
        ),
        case(
            17,
            json!([with(|c| {
                c["thinPoolConfig"]["chunkSizeCalculationPolicy"] = json!("Static");
                c["thinPoolConfig"]["chunkSize"] = json!("128Ki");
            })]),
            json!([with(|c| {
                c["thinPoolConfig"]["chunkSizeCalculationPolicy"] = json!("Static");
                c["thinPoolConfig"]["chunkSize"] = json!("100Ki");
            })]),
            Refused("spec.storage.deviceClasses[0].thinPoolConfig.chunkSize"),
        ),
        case(
            18,
            json!([with(|c| {
                c["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Static");
                c["thinPoolConfig"]["metadataSize"] = json!("2Gi");
            })]),
            json!([with(|c| {
                c["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Host");
                c["thinPoolConfig"]["metadataSize"] = json!("2Gi");
            })]),
            Refused("spec.storage.deviceClasses[0].thinPoolConfig.metadataSize"),
        ),
        case(
            18,
            json!([base()]),
            json!([with(|c| {
                c["thinPoolConfig"]["metadataSizeCalculationPolicy"] = json!("Host");
                c["thinPoolConfig"]["metadataSize"] = json!("1Gi");
            })]),
            Warned("is ignored because metadataSizeCalculationPolicy is Host"),
        ),
        case(
            19,
            json!([with(|c| c["deviceDiscoveryPolicy"] = json!("Dynamic"))]),
            json!([with(|c| {
                c["deviceDiscoveryPolicy"] = json!("Dynamic");
                c.as_object_mut().unwrap().remove("deviceSelector");
            })]),
            Warned("uses deviceDiscoveryPolicy Dynamic without paths"),
        )
        .by_tweaking(),
        case(
            20,
            json!([with(|c| c["storageClassOptions"] =
                json!({"additionalParameters": {"example.com/x": "y"}}))]),
            json!([with(
                |c| c["storageClassOptions"] =
                    json!({"additionalParameters": {"topolvm.io/device-class": "y"}})
            )]),
            Refused(
                "spec.storage.deviceClasses[0].storageClassOptions.additionalParameters[topolvm.io/device-class]",
            ),
        )
        .by_adding(),
        case(
            21,
            json!([with(
                |c| c["storageClassOptions"] = json!({"additionalLabels": {"tier": "gold"}})
            )]),
            json!([with(
                |c| c["storageClassOptions"] = json!({"additionalLabels": {"tier": "gold!"}})
            )]),
            Refused("spec.storage.deviceClasses[0].storageClassOptions.additionalLabels[tier]"),
        ),
    ]
}

/// A shared LUN, by a name that is the same on every node.
const LUN: &str = "/dev/disk/by-id/wwn-0x5000c500a1b2c3d4";

/// The shared class `san` on [`LUN`], with `edit` applied.
fn shared(edit: impl FnOnce(&mut Value)) -> Value {
    let mut class = json!({"name": "san", "deviceAccessPolicy": "shared",
                           "deviceSelector": {"paths": [LUN]}});
    edit(&mut class);
    class
}

/// A class `m` that selects its devices by `patterns` only.
fn matching(patterns: &[&str]) -> Value {
    json!({"name": "m", "deviceSelector": {"devicePatterns": patterns}})
}

/// Rules 44–47: device patterns, judged on one object (on create and update; on update the class
/// is added).
fn pattern_rules() -> Vec<Case> {
    let good = || json!([base(), matching(&["/dev/nvme[0-9]n[0-9]"])]);
    vec![
        case(
            44,
            good(),
            json!([base(), matching(&["/dev/nvme[0-9]n[0-9]", "/dev/sd[b"])]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.devicePatterns[1]"),
        )
        .by_adding(),
        case(
            45,
            json!([base(), shared(|_| {})]),
            json!([
                base(),
                shared(|c| c["deviceSelector"]["devicePatterns"] = json!(["/dev/disk/by-id/wwn-*"]))
            ]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.devicePatterns"),
        )
        .by_adding(),
        case(
            46,
            good(),
            json!([base(), {"name": "m", "deviceSelector": {"devicePatterns": ["/dev/nvme*"],
                                      "forceWipeDevicesAndDestroyAllData": true}}]),
            Refused(
                "spec.storage.deviceClasses[1].deviceSelector.forceWipeDevicesAndDestroyAllData",
            ),
        )
        .by_adding(),
        case(
            47,
            good(),
            json!([base(), matching(&["/dev/nvme*", "/dev/sdc,/dev/nvme*"])]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.devicePatterns[1]"),
        )
        .by_adding(),
    ]
}

/// A thick class `c` on two devices with csi-driver-lvm's StorageClasses.
fn csi_driver_lvm(edit: impl FnOnce(&mut Value)) -> Value {
    let mut class = json!({"name": "c", "deviceSelector": {"paths": ["/dev/sdc", "/dev/sdd"]},
                           "csiDriverLVMStorageClasses": true});
    edit(&mut class);
    class
}

/// Rules 48–50: csi-driver-lvm's StorageClass names (on create and update; on update the class
/// is added).
fn csi_driver_lvm_rules() -> Vec<Case> {
    let good = || json!([base(), csi_driver_lvm(|_| {})]);
    vec![
        case(
            48,
            good(),
            json!([
                base(),
                csi_driver_lvm(|_| {}),
                csi_driver_lvm(|c| {
                    c["name"] = json!("d");
                    c["deviceSelector"]["paths"] = json!(["/dev/sde", "/dev/sdf"]);
                })
            ]),
            Refused("spec.storage.deviceClasses[2].csiDriverLVMStorageClasses"),
        )
        .by_adding(),
        case(
            49,
            good(),
            json!([
                base(),
                csi_driver_lvm(|c| c["thinPoolConfig"] = base()["thinPoolConfig"].clone())
            ]),
            Refused("spec.storage.deviceClasses[1].csiDriverLVMStorageClasses"),
        )
        .by_adding(),
        case(
            50,
            good(),
            json!([
                base(),
                csi_driver_lvm(|c| c["deviceSelector"]["paths"] = json!(["/dev/sdc"]))
            ]),
            Warned("need 2 or more LVM physical volumes"),
        )
        .by_adding(),
    ]
}

/// Rule 51: `adopt` only on a node-local class (on create and update; on update the class is
/// added).
fn adopt_rules() -> Vec<Case> {
    vec![
        case(
            51,
            json!([base(), {"name": "csi-lvm", "adopt": "csi-driver-lvm",
                            "deviceSelector": {"paths": ["/dev/sdc"]}}]),
            json!([base(), shared(|c| c["adopt"] = json!("csi-driver-lvm"))]),
            Refused("spec.storage.deviceClasses[1].adopt"),
        )
        .by_adding(),
        case(
            51,
            json!([base(), {"name": "ssd", "adopt": "topolvm",
                            "deviceSelector": {"paths": ["/dev/sdc"]}}]),
            json!([base(), shared(|c| c["adopt"] = json!("topolvm"))]),
            Refused("spec.storage.deviceClasses[1].adopt"),
        )
        .by_adding(),
    ]
}

/// A node selector for one host.
fn on(node: &str) -> Value {
    json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]})
}

/// Rules 31–40: shared device classes, judged on one object (on create and update). On update the
/// invalid class is added, so no rule comparing a class with its old self answers first.
fn shared_rules() -> Vec<Case> {
    let good = || json!([base(), shared(|_| {})]);
    vec![
        case(
            31,
            good(),
            json!([base(), shared(|c| {
                c.as_object_mut().unwrap().remove("deviceSelector");
            })]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.paths"),
        )
        .by_adding(),
        case(
            32,
            good(),
            json!([base(), shared(|c| c["deviceSelector"]["paths"] = json!(["/dev/sdc"]))]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.paths[0]"),
        )
        .by_adding(),
        case(
            33,
            good(),
            json!([base(), shared(|c| c["deviceSelector"]["optionalPaths"] =
                json!(["/dev/mapper/mpathb"]))]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.optionalPaths"),
        )
        .by_adding(),
        case(
            34,
            good(),
            json!([base(), shared(|c| {
                c["deviceSelector"]["paths"] = json!([LUN, "/dev/mapper/mpathb"]);
                c["raidConfig"] = json!({"type": "raid1", "mirrors": 1});
            })]),
            Refused("spec.storage.deviceClasses[1].raidConfig"),
        )
        .by_adding(),
        case(
            35,
            good(),
            json!([base(), shared(|c| c["thinPoolConfig"] =
                json!({"name": "tp", "overprovisionRatio": 10}))]),
            Refused("spec.storage.deviceClasses[1].thinPoolConfig"),
        )
        .by_adding(),
        case(
            36,
            json!([base(), shared(|c| c["deviceDiscoveryPolicy"] = json!("Static"))]),
            json!([base(), shared(|c| c["deviceDiscoveryPolicy"] = json!("Dynamic"))]),
            Refused("spec.storage.deviceClasses[1].deviceDiscoveryPolicy"),
        )
        .by_adding(),
        case(
            37,
            json!([base(), shared(|c| c["name"] = json!("s".repeat(63)))]),
            json!([base(), shared(|c| c["name"] = json!("s".repeat(64)))]),
            Refused("spec.storage.deviceClasses[1].name"),
        )
        .by_adding(),
        case(
            38,
            good(),
            json!([base(), shared(|c| c["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] =
                json!(true))]),
            Refused("spec.storage.deviceClasses[1].deviceSelector.forceWipeDevicesAndDestroyAllData"),
        )
        .by_adding(),
        case(
            39,
            json!([base(), shared(|c| c["sharedConfig"] =
                json!({"volumeMode": "Thin", "wipePolicy": "UnsafeFast", "ioTimeoutSeconds": 20}))]),
            json!([with(|c| c["sharedConfig"] = json!({"volumeMode": "Thin"}))]),
            Refused("spec.storage.deviceClasses[0].sharedConfig"),
        )
        .by_adding(),
        case(
            40,
            json!([base(), shared(|_| {}), {"name": "vg2", "nodeSelector": on("worker-9"),
                                            "deviceSelector": {"paths": ["/dev/sdc"]}}]),
            json!([base(), shared(|_| {}), {"name": "vg2", "nodeSelector": on("worker-9"),
                                            "deviceSelector": {"paths": [LUN]}}]),
            Refused("spec.storage.deviceClasses[2].deviceSelector.paths[0]"),
        )
        .by_adding(),
    ]
}

/// Rules 41–43: shared device classes, comparing an update with the object it replaces.
fn shared_update_rules() -> Vec<Case> {
    vec![
        case(
            41,
            json!([base(), shared(|_| {})]),
            json!([
                base(),
                shared(|c| c["deviceAccessPolicy"] = json!("nodeLocal"))
            ]),
            Refused("spec.storage.deviceClasses[1].deviceAccessPolicy"),
        ),
        case(
            42,
            json!([
                base(),
                shared(|c| c["sharedConfig"] = json!({"ioTimeoutSeconds": 20}))
            ]),
            json!([
                base(),
                shared(|c| c["sharedConfig"] = json!({"ioTimeoutSeconds": 30}))
            ]),
            Refused("spec.storage.deviceClasses[1].sharedConfig.ioTimeoutSeconds"),
        ),
        case(
            43,
            json!([base(), shared(|_| {})]),
            json!([
                base(),
                shared(|c| c["sharedConfig"] = json!({"volumeMode": "Thin"}))
            ]),
            Refused("spec.storage.deviceClasses[1].sharedConfig.volumeMode"),
        ),
    ]
}

/// Reports the shared class `san` ready on a node, so its volume group exists (rule 38).
async fn report_shared_volume_group(client: &Client, ns: &str) {
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), ns);
    let status: LVMVolumeGroupNodeStatus = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
        "metadata": {"name": "worker-0", "namespace": ns},
        "spec": {"nodeStatus": [{"name": "san", "status": "Ready", "devices": [LUN],
                                 "shared": {"devicesVisible": true, "lockspace": "Joined", "hostId": 1}}]},
    }))
    .unwrap();
    statuses.create(&Default::default(), &status).await.unwrap();
}

/// Rules 22–30: they compare an update with the object it replaces (`good` is the old spec).
fn update_rules() -> Vec<Case> {
    vec![
        case(
            22,
            json!([base()]),
            json!([with(
                |c| c["storageClassOptions"] = json!({"reclaimPolicy": "Retain"})
            )]),
            Refused("spec.storage.deviceClasses[0].storageClassOptions.reclaimPolicy"),
        ),
        case(
            22,
            json!([with(|c| c["fstype"] = json!("xfs"))]),
            json!([with(|c| c["fstype"] = json!("ext4"))]),
            Refused("spec.storage.deviceClasses[0].fstype"),
        ),
        case(
            23,
            json!([base(), thick("vg2", &["/dev/sdc"])]),
            json!([thick("vg2", &["/dev/sdc"])]),
            Refused("spec.storage.deviceClasses"),
        ),
        case(
            24,
            json!([base(), thick("vg2", &["/dev/sdc"])]),
            json!([base(), {"name": "vg2", "deviceSelector": {"paths": ["/dev/sdc"]},
                            "thinPoolConfig": {"name": "tp", "overprovisionRatio": 10}}]),
            Refused("spec.storage.deviceClasses[1].thinPoolConfig"),
        ),
        case(
            25,
            json!([base()]),
            json!([with(|c| c["thinPoolConfig"]["name"] = json!("thin-pool-2"))]),
            Refused("spec.storage.deviceClasses[0].thinPoolConfig.name"),
        ),
        case(
            26,
            json!([raid(json!({"type": "raid1", "mirrors": 1}), 3)]),
            json!([raid(json!({"type": "raid1", "mirrors": 2}), 3)]),
            Refused("spec.storage.deviceClasses[0].raidConfig"),
        ),
        case(
            26,
            json!([raid_thin(json!({"type": "raid1", "mirrors": 1}), 2)]),
            json!([raid_thin(json!({"type": "raid1", "mirrors": 1}), 2)
                .as_object()
                .map(|c| {
                    let mut c = c.clone();
                    c.remove("raidConfig");
                    c
                })]),
            Refused("spec.storage.deviceClasses[0].raidConfig"),
        ),
        case(
            24,
            json!([raid(json!({"type": "raid1", "mirrors": 1}), 2)]),
            json!([raid_thin(json!({"type": "raid1", "mirrors": 1}), 2)]),
            Refused("spec.storage.deviceClasses[0].thinPoolConfig"),
        ),
        case(
            27,
            json!([base()]),
            json!([with(
                |c| c["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-0"]}]}]})
            )]),
            Refused("spec.storage.deviceClasses[0].nodeSelector"),
        ),
        case(
            28,
            json!([base()]),
            json!([with(
                |c| c["deviceSelector"]["forceWipeDevicesAndDestroyAllData"] = json!(true)
            )]),
            Refused(
                "spec.storage.deviceClasses[0].deviceSelector.forceWipeDevicesAndDestroyAllData",
            ),
        ),
        case(
            29,
            json!([with(|c| {
                c.as_object_mut().unwrap().remove("deviceSelector");
            })]),
            json!([base()]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        ),
        case(
            30,
            json!([base()]),
            json!([with(|c| {
                c.as_object_mut().unwrap().remove("deviceSelector");
            })]),
            Refused("spec.storage.deviceClasses[0].deviceSelector"),
        ),
    ]
}

/// The API server's answer: HTTP status, message (or the object's JSON when admitted), and the
/// `Warning` headers' texts.
struct Answer {
    code: u16,
    text: String,
    warnings: Vec<String>,
}

impl Answer {
    fn admitted(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// A request for the LVMCluster `name` in `ns` (`PUT` when `resource_version` is given, else
/// `POST`), dry-run unless `commit`.
async fn send(
    client: &Client,
    ns: &str,
    name: &str,
    classes: &Value,
    resource_version: Option<&str>,
    commit: bool,
) -> Answer {
    let collection = format!("/apis/lvm.topolvm.io/v1alpha1/namespaces/{ns}/lvmclusters");
    let dry_run = if commit { "" } else { "?dryRun=All" };
    let mut metadata = json!({"name": name, "namespace": ns});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    let body = json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMCluster",
        "metadata": metadata,
        "spec": {"storage": {"deviceClasses": classes}},
    });
    let (method, uri) = match resource_version {
        Some(_) => ("PUT", format!("{collection}/{name}{dry_run}")),
        None => ("POST", format!("{collection}{dry_run}")),
    };
    let request = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&body).unwrap()))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let code = response.status().as_u16();
    // `299 - "<text>"`, the text's quotes escaped.
    let warnings = response
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| {
            let v = String::from_utf8_lossy(v.as_bytes());
            let text = v.strip_prefix("299 - \"").unwrap_or(&v);
            let text = text.strip_suffix('"').unwrap_or(text);
            text.replace("\\\"", "\"")
        })
        .collect();
    let bytes = response.into_body().collect_bytes().await.unwrap();
    let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let text = match value["kind"].as_str() {
        Some("Status") => value["message"].as_str().unwrap_or_default().to_owned(),
        _ => String::from_utf8_lossy(&bytes).into_owned(),
    };
    Answer {
        code,
        text,
        warnings,
    }
}

/// Checks `answer` against `expect`; the problem, if any. Prints who answered what.
fn judge(answer: &Answer, expect: Expect) -> Result<(), String> {
    let by = if answer.text.contains("denied the request") {
        "the webhook"
    } else {
        "the API server's validation"
    };
    match expect {
        Refused(_) => println!("  {} by {by}: {}", answer.code, answer.text),
        Warned(_) => println!("  {}, warned: {:?}", answer.code, answer.warnings),
    }
    match expect {
        Refused(field) if answer.admitted() => {
            Err(format!("admitted; expected refusal at {field}"))
        }
        // "<field>: <message>", as the webhook and the API server's validation write it.
        Refused(field) if !answer.text.contains(&format!("{field}:")) => {
            Err(format!("refused without naming {field}: {}", answer.text))
        }
        Warned(fragment) if !answer.admitted() => Err(format!(
            "refused; expected a warning about {fragment}: {}",
            answer.text
        )),
        Warned(fragment) if !answer.warnings.iter().any(|w| w.contains(fragment)) => Err(format!(
            "admitted without a warning about {fragment}: {:?}",
            answer.warnings
        )),
        _ => Ok(()),
    }
}

/// Creates `good` for real, then dry-runs its replacement by `bad`; deletes it again.
async fn update(client: &Client, ns: &str, name: &str, good: &Value, bad: &Value) -> Answer {
    let created = send(client, ns, name, good, None, true).await;
    assert!(created.admitted(), "creating {good}: {}", created.text);
    let created: Value = serde_json::from_str(&created.text).unwrap();
    let rv = created["metadata"]["resourceVersion"].as_str().unwrap();
    let answer = send(client, ns, name, bad, Some(rv), false).await;
    delete(client, ns, name).await;
    answer
}

/// Deletes the LVMCluster `name` (nothing holds it: no operator watches this namespace).
async fn delete(client: &Client, ns: &str, name: &str) {
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), ns);
    clusters.delete(name, &Default::default()).await.unwrap();
    support::wait_cluster_gone(&clusters, name, support::WAIT).await;
}

#[tokio::test]
async fn webhook_and_cel_refuse_every_rule_on_create_and_update_naming_the_field() {
    if !support::enabled("webhook_and_cel_refuse_every_rule_on_create_and_update_naming_the_field")
    {
        return;
    }
    let client = support::client().await;
    support::install_crds(&client).await;
    let sfx = support::suffix();
    let selector = [("lvms-e2e/webhook", sfx.as_str())];
    let ns = TestNamespace::create(&client, &format!("lvms-e2e-rules-{sfx}"), &selector).await;
    let other = TestNamespace::create(&client, &format!("lvms-e2e-rules-{sfx}-o"), &selector).await;
    let webhook = Webhook::start(&client, &ns.name, &sfx).await;
    webhook.wait_called(&ns.name).await;
    report_shared_volume_group(&client, &ns.name).await;

    let mut problems = Vec::new();
    let mut covered = std::collections::BTreeSet::new();
    let mut note = |rule: u8, when: &str, result: Result<(), String>| {
        println!(
            "rule {rule} on {when}: {}",
            if result.is_ok() {
                "as expected"
            } else {
                "NOT as expected"
            }
        );
        covered.insert((rule, when.to_owned()));
        if let Err(why) = result {
            problems.push(format!("rule {rule} on {when}: {why}"));
        }
    };

    // Rule 1: only in the operator's namespace; rule 2: a single LVMCluster.
    let classes = json!([base()]);
    let outside = send(&client, &other.name, "a", &classes, None, false).await;
    note(1, "create", judge(&outside, Refused("metadata.namespace")));
    let first = send(&client, &ns.name, "first", &classes, None, true).await;
    assert!(first.admitted(), "{}", first.text);
    let second = send(&client, &ns.name, "second", &classes, None, false).await;
    note(2, "create", judge(&second, Refused("metadata.name")));
    delete(&client, &ns.name, "first").await;

    let name = "my-lvmcluster";
    for c in object_rules()
        .into_iter()
        .chain(shared_rules())
        .chain(pattern_rules())
        .chain(csi_driver_lvm_rules())
        .chain(adopt_rules())
    {
        let good = send(&client, &ns.name, name, &c.good, None, false).await;
        let clean = if !good.admitted() {
            Err(format!(
                "the valid twin {} was refused: {}",
                c.good, good.text
            ))
        } else if !good.warnings.is_empty() {
            Err(format!(
                "the valid twin {} warned: {:?}",
                c.good, good.warnings
            ))
        } else {
            Ok(())
        };
        note(c.rule, "create (valid twin)", clean);
        let bad = send(&client, &ns.name, name, &c.bad, None, false).await;
        note(c.rule, "create", judge(&bad, c.expect));
        let (old, new) = c.update();
        let bad = update(&client, &ns.name, name, old, new).await;
        note(c.rule, "update", judge(&bad, c.expect));
    }
    for c in update_rules().into_iter().chain(shared_update_rules()) {
        let bad = update(&client, &ns.name, name, &c.good, &c.bad).await;
        note(c.rule, "update", judge(&bad, c.expect));
        // The same spec is fine on create: only the change is refused.
        let fresh = send(&client, &ns.name, name, &c.bad, None, false).await;
        note(
            c.rule,
            "create of the updated spec",
            if fresh.admitted() {
                Ok(())
            } else {
                Err(format!("refused: {}", fresh.text))
            },
        );
    }

    for rule in 1..=51u8 {
        let on = |when: &str| covered.contains(&(rule, when.to_owned()));
        let expected: &[&str] = match rule {
            1 | 2 => &["create"],
            3..=21 | 31..=40 | 44..=51 => &["create", "update"],
            _ => &["update"],
        };
        for when in expected {
            assert!(on(when), "rule {rule} is not checked on {when}");
        }
    }
    webhook.unregister().await;
    ns.delete().await;
    other.delete().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
