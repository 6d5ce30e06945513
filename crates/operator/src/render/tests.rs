use serde::Serialize;
use serde_json::{Value, json};

use super::*;

const NS: &str = "openshift-lvm-storage";
const UID: &str = "0b7f6c7e-5d7a-4a83-9f2e-8c1f2b3a4d5e";
const IMAGE: &str = "quay.io/lvms-rs/lvms:test";

/// An `LVMCluster` as the API server returns it: the LVMS manifest `spec` plus name, namespace, uid.
fn cluster(spec_yaml: &str) -> LVMCluster {
    let yaml = format!(
        "apiVersion: lvm.topolvm.io/v1alpha1\nkind: LVMCluster\nmetadata:\n  name: my-lvmcluster\n  \
         namespace: {NS}\n  uid: {UID}\nspec:\n{}",
        indent(spec_yaml, 2)
    );
    serde_norway::from_str(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn indent(text: &str, by: usize) -> String {
    text.lines()
        .map(|l| format!("{}{l}\n", " ".repeat(by)))
        .collect()
}

fn cfg() -> RenderConfig {
    RenderConfig {
        snapshot_api_available: true,
        ..RenderConfig::new(NS, IMAGE)
    }
}

fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

fn yaml(text: &str) -> Value {
    serde_norway::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn ok(cluster: &LVMCluster, cfg: &RenderConfig) -> Rendered {
    render(cluster, cfg).unwrap_or_else(|e| panic!("{e}"))
}

fn err(cluster: &LVMCluster, cfg: &RenderConfig) -> RenderError {
    match render(cluster, cfg) {
        Ok(_) => panic!("rendered, expected an error"),
        Err(e) => e,
    }
}

const SINGLE_THIN: &str = "\
storage:
  deviceClasses:
  - name: vg1
    default: true
    fstype: xfs
    thinPoolConfig:
      name: thin-pool-1
      sizePercent: 90
      overprovisionRatio: 10
    deviceSelector:
      paths:
      - /dev/disk/by-path/pci-0000:87:00.0-nvme-1
      optionalPaths:
      - /dev/disk/by-path/pci-0000:88:00.0-nvme-1
";

/// The owned-by labels of the test cluster, as YAML lines at `indent`.
fn owned_by(indent_by: usize) -> String {
    indent(
        &format!(
            "owned-by.topolvm.io/name: my-lvmcluster\nowned-by.topolvm.io/namespace: {NS}\n\
             owned-by.topolvm.io/uid: {UID}\nowned-by.topolvm.io/group: lvm.topolvm.io\n\
             owned-by.topolvm.io/version: v1alpha1\nowned-by.topolvm.io/kind: LVMCluster"
        ),
        indent_by,
    )
}

fn owner_refs(indent_by: usize) -> String {
    indent(
        &format!(
            "ownerReferences:\n- apiVersion: lvm.topolvm.io/v1alpha1\n  kind: LVMCluster\n  \
             name: my-lvmcluster\n  uid: {UID}\n  controller: true\n  blockOwnerDeletion: true"
        ),
        indent_by,
    )
}

/// The node DaemonSet for the defaults; `affinity` is the YAML of `spec.template.spec.affinity`
/// (indented to 6), or empty for none.
fn expected_daemon_set(affinity: &str) -> Value {
    yaml(&format!(
        r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: vg-manager
  namespace: {NS}
  labels: &labels
    app.kubernetes.io/name: vg-manager
    app.kubernetes.io/component: vg-manager
    app.kubernetes.io/part-of: lvms-provisioner
    app.kubernetes.io/managed-by: lvms-operator
{owner}spec:
  selector:
    matchLabels: *labels
  template:
    metadata:
      labels: *labels
    spec:
      serviceAccountName: vg-manager
      hostIPC: true
      priorityClassName: system-node-critical
{affinity}      containers:
      - name: vg-manager
        image: {IMAGE}
        command: [lvms, node]
        env:
        - name: NODE_NAME
          valueFrom:
            fieldRef:
              fieldPath: spec.nodeName
        - name: NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
        - name: CSI_ENDPOINT
          value: unix:///csi/csi.sock
        - name: CSI_DRIVER_NAME
          value: topolvm.io
        - name: LVMS_FENCE_HOOK_DIR
          value: /var/lib/lvms/bin
        securityContext:
          privileged: true
          runAsUser: 0
        ports:
        - name: healthz
          containerPort: 9808
          protocol: TCP
        - name: metrics
          containerPort: 8081
          protocol: TCP
        livenessProbe:
          httpGet:
            path: /healthz
            port: healthz
          failureThreshold: 3
          initialDelaySeconds: 10
          timeoutSeconds: 3
          periodSeconds: 60
        resources:
          requests: {{cpu: 10m, memory: 48Mi}}
          limits: {{memory: 256Mi}}
        volumeMounts:
        - name: plugin-dir
          mountPath: /csi
        - name: kubelet-dir
          mountPath: /var/lib/kubelet
          mountPropagation: Bidirectional
        - name: device-dir
          mountPath: /dev
          mountPropagation: HostToContainer
        - name: run-lvm
          mountPath: /run/lvm
        - name: run-lock-lvm
          mountPath: /run/lock/lvm
        - name: run-sanlock
          mountPath: /run/sanlock
        - name: run-wdmd
          mountPath: /run/wdmd
        - name: run-lvms
          mountPath: /run/lvms
        - name: etc-lvm
          mountPath: /etc/lvm
        - name: run-udev
          mountPath: /run/udev
          mountPropagation: HostToContainer
        - name: sys
          mountPath: /sys
          mountPropagation: HostToContainer
        - name: fence-hook
          mountPath: /var/lib/lvms/bin
      - name: node-driver-registrar
        image: registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0
        args:
        - --csi-address=/csi/csi.sock
        - --kubelet-registration-path=/var/lib/kubelet/plugins/topolvm.io/csi.sock
        - --http-endpoint=:9809
        ports:
        - name: healthz-reg
          containerPort: 9809
          protocol: TCP
        livenessProbe:
          httpGet:
            path: /healthz
            port: healthz-reg
          failureThreshold: 3
          initialDelaySeconds: 10
          timeoutSeconds: 3
          periodSeconds: 60
        resources:
          requests: {{cpu: 10m, memory: 32Mi}}
          limits: {{memory: 128Mi}}
        volumeMounts:
        - name: plugin-dir
          mountPath: /csi
        - name: registration-dir
          mountPath: /registration
      - name: livenessprobe
        image: registry.k8s.io/sig-storage/livenessprobe:v2.19.0
        args:
        - --csi-address=/csi/csi.sock
        - --http-endpoint=:9808
        resources:
          requests: {{cpu: 10m, memory: 32Mi}}
          limits: {{memory: 128Mi}}
        volumeMounts:
        - name: plugin-dir
          mountPath: /csi
      volumes:
      - name: registration-dir
        hostPath:
          path: /var/lib/kubelet/plugins_registry/
          type: Directory
      - name: plugin-dir
        hostPath:
          path: /var/lib/kubelet/plugins/topolvm.io/
          type: DirectoryOrCreate
      - name: kubelet-dir
        hostPath:
          path: /var/lib/kubelet
          type: Directory
      - name: device-dir
        hostPath:
          path: /dev
          type: Directory
      - name: run-lvm
        hostPath:
          path: /run/lvm
          type: DirectoryOrCreate
      - name: run-lock-lvm
        hostPath:
          path: /run/lock/lvm
          type: DirectoryOrCreate
      - name: run-sanlock
        hostPath:
          path: /run/sanlock
          type: DirectoryOrCreate
      - name: run-wdmd
        hostPath:
          path: /run/wdmd
          type: DirectoryOrCreate
      - name: run-lvms
        hostPath:
          path: /run/lvms
          type: DirectoryOrCreate
      - name: etc-lvm
        hostPath:
          path: /etc/lvm
          type: DirectoryOrCreate
      - name: run-udev
        hostPath:
          path: /run/udev
      - name: sys
        hostPath:
          path: /sys
      - name: fence-hook
        hostPath:
          path: /var/lib/lvms/bin
          type: DirectoryOrCreate
"#,
        owner = owner_refs(2),
    ))
}

// ---------------------------------------------------------------------------------------------
// A single thin class: every object, field by field
// ---------------------------------------------------------------------------------------------

#[test]
fn single_thin_class_volume_group_copies_the_class() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(r.volume_groups.len(), 1);
    assert_eq!(
        json(&r.volume_groups[0]),
        yaml(&format!(
            r#"
apiVersion: lvm.topolvm.io/v1alpha1
kind: LVMVolumeGroup
metadata:
  name: vg1
  namespace: {NS}
  labels:
    app.kubernetes.io/name: lvms
    app.kubernetes.io/component: volume-group
    app.kubernetes.io/part-of: lvms-provisioner
    app.kubernetes.io/managed-by: lvms-operator
{owner}spec:
  default: true
  thinPoolConfig:
    name: thin-pool-1
    sizePercent: 90
    overprovisionRatio: 10
  deviceSelector:
    paths:
    - /dev/disk/by-path/pci-0000:87:00.0-nvme-1
    optionalPaths:
    - /dev/disk/by-path/pci-0000:88:00.0-nvme-1
"#,
            owner = owner_refs(2)
        ))
    );
}

#[test]
fn single_thin_class_storage_class() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(r.storage_classes.len(), 1);
    assert_eq!(
        json(&r.storage_classes[0]),
        yaml(&format!(
            r#"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: lvms-vg1
  annotations:
    description: Provides RWO and RWOP Filesystem & Block volumes
    storageclass.kubernetes.io/is-default-class: "true"
  labels:
    app.kubernetes.io/name: lvms
    app.kubernetes.io/component: storage-class
    app.kubernetes.io/part-of: lvms-provisioner
    app.kubernetes.io/managed-by: lvms-operator
{owned}provisioner: topolvm.io
parameters:
  topolvm.io/device-class: vg1
  csi.storage.k8s.io/fstype: xfs
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
"#,
            owned = owned_by(4)
        ))
    );
}

#[test]
fn single_thin_class_snapshot_class() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(r.snapshot_classes.len(), 1);
    assert_eq!(
        json(&r.snapshot_classes[0]),
        yaml(&format!(
            r#"
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: lvms-vg1
  annotations:
    snapshot.storage.kubernetes.io/is-default-class: "true"
  labels:
    app.kubernetes.io/name: lvms
    app.kubernetes.io/component: volume-snapshot-class
    app.kubernetes.io/part-of: lvms-provisioner
    app.kubernetes.io/managed-by: lvms-operator
{owned}driver: topolvm.io
deletionPolicy: Delete
"#,
            owned = owned_by(4)
        ))
    );
}

#[test]
fn single_thin_class_csi_driver() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(
        json(&r.csi_driver),
        yaml(&format!(
            r#"
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata:
  name: topolvm.io
  labels:
    app.kubernetes.io/name: lvms
    app.kubernetes.io/component: csi-driver
    app.kubernetes.io/part-of: lvms-provisioner
    app.kubernetes.io/managed-by: lvms-operator
{owned}spec:
  attachRequired: false
  podInfoOnMount: true
  storageCapacity: true
  fsGroupPolicy: File
  volumeLifecycleModes:
  - Persistent
  - Ephemeral
"#,
            owned = owned_by(4)
        ))
    );
}

#[test]
fn single_class_without_selector_daemon_set_has_no_affinity() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(json(&r.daemon_set), expected_daemon_set(""));
}

// ---------------------------------------------------------------------------------------------
// Several classes, node selectors, RAID, options
// ---------------------------------------------------------------------------------------------

const MULTI: &str = "\
tolerations:
- key: node-role.kubernetes.io/storage
  operator: Exists
  effect: NoSchedule
storage:
  deviceClasses:
  - name: fast
    default: true
    thinPoolConfig:
      name: pool
      overprovisionRatio: 5
    deviceSelector:
      paths: [/dev/nvme0n1]
    nodeSelector:
      nodeSelectorTerms:
      - matchExpressions:
        - key: disk
          operator: In
          values: [nvme]
  - name: bulk
    fstype: ext4
    deviceSelector:
      paths: [/dev/sdb]
    nodeSelector:
      nodeSelectorTerms:
      - matchExpressions:
        - key: disk
          operator: In
          values: [hdd]
      - matchExpressions:
        - key: disk
          operator: In
          values: [nvme]
      - matchFields:
        - key: metadata.name
          operator: In
          values: [worker-9]
";

#[test]
fn multi_class_affinity_is_the_union_of_the_node_selectors() {
    let r = ok(&cluster(MULTI), &cfg());
    let affinity = indent(
        "affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions:
        - key: disk
          operator: In
          values: [nvme]
      - matchExpressions:
        - key: disk
          operator: In
          values: [hdd]
      - matchFields:
        - key: metadata.name
          operator: In
          values: [worker-9]
tolerations:
- key: node-role.kubernetes.io/storage
  operator: Exists
  effect: NoSchedule",
        6,
    );
    assert_eq!(json(&r.daemon_set), expected_daemon_set(&affinity));
}

#[test]
fn multi_class_renders_one_of_each_per_class_in_spec_order() {
    let r = ok(&cluster(MULTI), &cfg());
    let names = |v: Vec<Option<String>>| v.into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(
        names(
            r.volume_groups
                .iter()
                .map(|o| o.metadata.name.clone())
                .collect()
        ),
        ["fast", "bulk"]
    );
    assert_eq!(
        names(
            r.storage_classes
                .iter()
                .map(|o| o.metadata.name.clone())
                .collect()
        ),
        ["lvms-fast", "lvms-bulk"]
    );
    // Only the thin class has a snapshot class.
    assert_eq!(
        names(
            r.snapshot_classes
                .iter()
                .map(|o| o.metadata.name.clone())
                .collect()
        ),
        ["lvms-fast"]
    );
}

#[test]
fn multi_class_volume_groups_carry_their_own_node_selector() {
    let r = ok(&cluster(MULTI), &cfg());
    let c = cluster(MULTI);
    for (vg, class) in r.volume_groups.iter().zip(&c.spec.storage.device_classes) {
        assert_eq!(vg.spec.node_selector, class.node_selector);
        assert_eq!(vg.spec.device_selector, class.device_selector);
        assert_eq!(vg.spec.thin_pool_config, class.thin_pool_config);
        assert_eq!(vg.spec.default, class.default);
    }
}

#[test]
fn multi_class_only_the_default_class_is_annotated_default() {
    let r = ok(&cluster(MULTI), &cfg());
    let bulk = &r.storage_classes[1];
    assert_eq!(
        json(&bulk.metadata.annotations),
        json!({"description": STORAGE_CLASS_DESCRIPTION})
    );
    assert_eq!(
        json(&bulk.parameters),
        json!({"topolvm.io/device-class": "bulk", "csi.storage.k8s.io/fstype": "ext4"})
    );
}

#[test]
fn one_class_without_node_selector_means_no_affinity() {
    let spec = "\
storage:
  deviceClasses:
  - name: a
    deviceSelector: {paths: [/dev/sdb]}
    nodeSelector:
      nodeSelectorTerms:
      - matchExpressions: [{key: disk, operator: Exists}]
  - name: b
    deviceSelector: {paths: [/dev/sdc]}
";
    let r = ok(&cluster(spec), &cfg());
    let pod = r.daemon_set.spec.and_then(|s| s.template.spec).unwrap();
    assert_eq!(pod.affinity, None);
    assert_eq!(pod.tolerations, None, "no tolerations in the spec");
}

#[test]
fn node_selector_union_is_none_without_classes_with_terms() {
    assert_eq!(node_selector_union(&[]), None);
}

const RAID_AND_THIN: &str = "\
storage:
  deviceClasses:
  - name: mirrored
    default: true
    raidConfig:
      type: raid1
      mirrors: 1
    deviceSelector:
      paths: [/dev/sdb, /dev/sdc]
  - name: thin
    thinPoolConfig:
      name: pool
      overprovisionRatio: 10
    deviceSelector:
      paths: [/dev/sdd]
";

#[test]
fn raid_class_has_no_snapshot_class() {
    let r = ok(&cluster(RAID_AND_THIN), &cfg());
    assert_eq!(r.snapshot_classes.len(), 1);
    let thin = &r.snapshot_classes[0];
    assert_eq!(thin.metadata.name.as_deref(), Some("lvms-thin"));
    // Not the default class: no default-snapshot-class annotation.
    assert_eq!(thin.metadata.annotations, None);
    assert_eq!(
        r.storage_classes.len(),
        2,
        "RAID classes still get a StorageClass"
    );
}

#[test]
fn raid_class_volume_group_copies_raid_config() {
    let r = ok(&cluster(RAID_AND_THIN), &cfg());
    assert_eq!(
        json(&r.volume_groups[0].spec),
        json!({
            "default": true,
            "raidConfig": {"type": "raid1", "mirrors": 1},
            "deviceSelector": {"paths": ["/dev/sdb", "/dev/sdc"]}
        })
    );
}

const SHARED: &str = "\
storage:
  deviceClasses:
  - name: vg1
    default: true
    deviceSelector:
      paths: [/dev/sdb]
    thinPoolConfig:
      name: thin-pool-1
      overprovisionRatio: 10
  - name: san
    deviceAccessPolicy: shared
    deviceSelector:
      paths: [/dev/disk/by-id/wwn-0x5000c500a1b2c3d4]
    sharedConfig:
      volumeMode: Thin
      wipePolicy: UnsafeFast
      ioTimeoutSeconds: 20
    storageClassOptions:
      additionalParameters:
        lvms.topolvm.io/volume-mode: linear
  - name: san-linear
    deviceAccessPolicy: shared
    deviceSelector:
      paths: [/dev/mapper/mpatha]
";

#[test]
fn shared_class_volume_group_copies_the_policy_and_shared_config() {
    let r = ok(&cluster(SHARED), &cfg());
    assert_eq!(
        json(&r.volume_groups[1].spec),
        json!({
            "deviceAccessPolicy": "shared",
            "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x5000c500a1b2c3d4"]},
            "sharedConfig": {"volumeMode": "Thin", "wipePolicy": "UnsafeFast", "ioTimeoutSeconds": 20}
        })
    );
    assert!(r.volume_groups[1].spec.is_shared());
    assert!(!r.volume_groups[0].spec.is_shared());
    assert_eq!(json(&r.volume_groups[2].spec)["sharedConfig"], Value::Null);
}

#[test]
fn shared_storage_class_carries_the_volume_mode_which_additional_parameters_cannot_override() {
    let r = ok(&cluster(SHARED), &cfg());
    let parameters = |i: usize| json(&r.storage_classes[i].parameters);
    assert_eq!(
        parameters(1),
        json!({
            "topolvm.io/device-class": "san",
            "csi.storage.k8s.io/fstype": "xfs",
            "lvms.topolvm.io/volume-mode": "thin"
        })
    );
    assert_eq!(parameters(2)["lvms.topolvm.io/volume-mode"], "linear");
    // A node-local class has no volume mode.
    assert_eq!(parameters(0)["lvms.topolvm.io/volume-mode"], Value::Null);
}

#[test]
fn without_snapshot_api_no_snapshot_classes_and_nothing_fails() {
    let cfg = RenderConfig {
        snapshot_api_available: false,
        ..cfg()
    };
    let r = ok(&cluster(SINGLE_THIN), &cfg);
    assert!(r.snapshot_classes.is_empty());
    assert_eq!(r.storage_classes.len(), 1);
}

const OPTIONS: &str = "\
storage:
  deviceClasses:
  - name: vg1
    default: true
    deviceDiscoveryPolicy: Dynamic
    storageClassOptions:
      reclaimPolicy: Retain
      volumeBindingMode: Immediate
      additionalParameters:
        topolvm.io/lvcreate-option-class: striped
        topolvm.io/device-class: other
        csi.storage.k8s.io/fstype: ext4
      additionalLabels:
        team: storage
        app.kubernetes.io/name: hijack
        app.kubernetes.io/managed-by: hijack
        owned-by.topolvm.io/uid: hijack
        owned-by.topolvm.io/extra: hijack
        app.kubernetes.io/instance: fast
";

#[test]
fn additional_parameters_and_labels_are_merged_and_never_override_ours() {
    let r = ok(&cluster(OPTIONS), &cfg());
    let sc = &r.storage_classes[0];
    assert_eq!(
        json(&sc.parameters),
        json!({
            "topolvm.io/lvcreate-option-class": "striped",
            "topolvm.io/device-class": "vg1",
            "csi.storage.k8s.io/fstype": "xfs"
        })
    );
    let expected = yaml(&format!(
        "team: storage\napp.kubernetes.io/instance: fast\napp.kubernetes.io/name: lvms\n\
         app.kubernetes.io/component: storage-class\napp.kubernetes.io/part-of: lvms-provisioner\n\
         app.kubernetes.io/managed-by: lvms-operator\n{}",
        owned_by(0)
    ));
    assert_eq!(json(&sc.metadata.labels), expected);
}

#[test]
fn storage_class_options_set_reclaim_policy_and_binding_mode() {
    let r = ok(&cluster(OPTIONS), &cfg());
    let sc = &r.storage_classes[0];
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
    assert_eq!(sc.allow_volume_expansion, Some(true));
}

#[test]
fn device_discovery_policy_is_copied_to_the_volume_group() {
    let r = ok(&cluster(OPTIONS), &cfg());
    assert_eq!(
        r.volume_groups[0].spec.device_discovery_policy,
        Some(lvms_api::DeviceDiscoveryPolicy::Dynamic)
    );
    // A thick class (no thin pool): no snapshot class.
    assert!(r.snapshot_classes.is_empty());
}

#[test]
fn an_existing_foreign_default_storage_class_keeps_ours_from_being_default() {
    let cfg = RenderConfig {
        existing_default_storage_class: Some("standard".into()),
        ..cfg()
    };
    let r = ok(&cluster(SINGLE_THIN), &cfg);
    assert_eq!(
        json(&r.storage_classes[0].metadata.annotations),
        json!({"description": STORAGE_CLASS_DESCRIPTION})
    );
}

#[test]
fn configuration_flows_into_driver_paths_and_images() {
    let cfg = RenderConfig {
        driver_name: "lvm.example.com".into(),
        kubelet_dir: "/var/lib/k0s/kubelet/".into(),
        node_driver_registrar_image: "mirror.local/registrar:v1".into(),
        livenessprobe_image: "mirror.local/liveness:v1".into(),
        node_command: vec!["/usr/bin/lvms".into(), "node".into()],
        priority_class_name: "storage-critical".into(),
        fence_hook_dir: Some("/opt/lvms/bin".into()),
        ..cfg()
    };
    let r = ok(&cluster(SINGLE_THIN), &cfg);
    assert_eq!(
        r.csi_driver.metadata.name.as_deref(),
        Some("lvm.example.com")
    );
    assert_eq!(r.storage_classes[0].provisioner, "lvm.example.com");
    assert_eq!(r.snapshot_classes[0].driver, "lvm.example.com");

    let pod = json(&r.daemon_set)["spec"]["template"]["spec"].take();
    assert_eq!(pod["priorityClassName"], "storage-critical");
    assert_eq!(
        pod["containers"][0]["command"],
        json!(["/usr/bin/lvms", "node"])
    );
    assert_eq!(
        pod["containers"][0]["env"][3],
        json!({"name": "CSI_DRIVER_NAME", "value": "lvm.example.com"})
    );
    assert_eq!(
        pod["containers"][0]["volumeMounts"][1],
        json!({"name": "kubelet-dir", "mountPath": "/var/lib/k0s/kubelet", "mountPropagation": "Bidirectional"})
    );
    assert_eq!(pod["containers"][1]["image"], "mirror.local/registrar:v1");
    assert_eq!(
        pod["containers"][1]["args"][1],
        "--kubelet-registration-path=/var/lib/k0s/kubelet/plugins/lvm.example.com/csi.sock"
    );
    assert_eq!(pod["containers"][2]["image"], "mirror.local/liveness:v1");
    assert_eq!(
        pod["volumes"],
        json!([
            {"name": "registration-dir", "hostPath": {"path": "/var/lib/k0s/kubelet/plugins_registry/", "type": "Directory"}},
            {"name": "plugin-dir", "hostPath": {"path": "/var/lib/k0s/kubelet/plugins/lvm.example.com/", "type": "DirectoryOrCreate"}},
            {"name": "kubelet-dir", "hostPath": {"path": "/var/lib/k0s/kubelet", "type": "Directory"}},
            {"name": "device-dir", "hostPath": {"path": "/dev", "type": "Directory"}},
            {"name": "run-lvm", "hostPath": {"path": "/run/lvm", "type": "DirectoryOrCreate"}},
            {"name": "run-lock-lvm", "hostPath": {"path": "/run/lock/lvm", "type": "DirectoryOrCreate"}},
            {"name": "run-sanlock", "hostPath": {"path": "/run/sanlock", "type": "DirectoryOrCreate"}},
            {"name": "run-wdmd", "hostPath": {"path": "/run/wdmd", "type": "DirectoryOrCreate"}},
            {"name": "run-lvms", "hostPath": {"path": "/run/lvms", "type": "DirectoryOrCreate"}},
            {"name": "etc-lvm", "hostPath": {"path": "/etc/lvm", "type": "DirectoryOrCreate"}},
            {"name": "run-udev", "hostPath": {"path": "/run/udev"}},
            {"name": "sys", "hostPath": {"path": "/sys"}},
            {"name": "fence-hook", "hostPath": {"path": "/opt/lvms/bin", "type": "DirectoryOrCreate"}},
        ])
    );
    assert_eq!(
        pod["containers"][0]["env"][4],
        json!({"name": "LVMS_FENCE_HOOK_DIR", "value": "/opt/lvms/bin"})
    );
}

#[test]
fn a_fence_hook_installed_by_hand_mounts_no_hook_directory_and_a_bad_one_is_refused() {
    let by_hand = RenderConfig {
        fence_hook_dir: None,
        ..cfg()
    };
    let pod =
        json(&ok(&cluster(SINGLE_THIN), &by_hand).daemon_set)["spec"]["template"]["spec"].take();
    assert_eq!(
        pod["containers"][0]["env"][4],
        json!({"name": "LVMS_FENCE_HOOK_DIR", "value": ""})
    );
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!names(&pod["volumes"]).contains(&"fence-hook".to_owned()));
    assert!(!names(&pod["containers"][0]["volumeMounts"]).contains(&"fence-hook".to_owned()));

    let relative = RenderConfig {
        fence_hook_dir: Some("var/lib/lvms".into()),
        ..cfg()
    };
    let e = err(&cluster(SINGLE_THIN), &relative).to_string();
    assert!(e.contains("fence_hook_dir"), "{e}");
    assert!(e.contains("/var/lib/lvms/bin"), "{e}");
}

#[test]
fn with_changed_block_tracking_the_agents_mount_its_secret_and_know_their_address() {
    let off =
        json(&ok(&cluster(SINGLE_THIN), &cfg()).daemon_set)["spec"]["template"]["spec"].take();
    let on_cfg = RenderConfig {
        snapshot_metadata_secret: Some("lvms-snapshot-metadata-cert".into()),
        ..cfg()
    };
    let on =
        json(&ok(&cluster(SINGLE_THIN), &on_cfg).daemon_set)["spec"]["template"]["spec"].take();
    let env = |pod: &Value| pod["containers"][0]["env"].as_array().unwrap().clone();
    assert!(
        !env(&off)
            .iter()
            .any(|e| e["name"] == "LVMS_SNAPSHOT_METADATA_CERT_DIR")
    );
    let on_env = env(&on);
    assert!(
        on_env.contains(&json!({"name": "LVMS_SNAPSHOT_METADATA_CERT_DIR",
                                    "value": "/etc/lvms/snapshot-metadata-cert"}))
    );
    assert!(on_env.contains(&json!({"name": "POD_IP",
                                    "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})));
    assert!(
        on["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "snapshot-metadata-cert",
                              "mountPath": "/etc/lvms/snapshot-metadata-cert", "readOnly": true}))
    );
    assert!(
        on["volumes"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "snapshot-metadata-cert",
                    "secret": {"secretName": "lvms-snapshot-metadata-cert", "optional": true}}))
    );
}

#[test]
fn namespaced_objects_have_owner_references_cluster_scoped_ones_owned_by_labels() {
    let r = ok(&cluster(MULTI), &cfg());
    let c = cluster(MULTI);
    let reference = owner_reference(&c, &cfg()).unwrap();
    let labels = owned_by_labels(&c, &cfg()).unwrap();
    for meta in r
        .volume_groups
        .iter()
        .map(|o| &o.metadata)
        .chain([&r.daemon_set.metadata])
    {
        assert_eq!(meta.namespace.as_deref(), Some(NS));
        assert_eq!(meta.owner_references, Some(vec![reference.clone()]));
        let l = meta.labels.clone().unwrap_or_default();
        assert!(
            l.keys().all(|k| !k.starts_with("owned-by.topolvm.io/")),
            "{l:?}"
        );
    }
    for meta in r
        .storage_classes
        .iter()
        .map(|o| &o.metadata)
        .chain(r.snapshot_classes.iter().map(|o| &o.metadata))
        .chain([&r.csi_driver.metadata])
    {
        assert_eq!(meta.namespace, None);
        assert_eq!(meta.owner_references, None);
        let l = meta.labels.clone().unwrap_or_default();
        for (k, v) in &labels {
            assert_eq!(l.get(k), Some(v), "{k}");
        }
        for k in [
            LABEL_APP_NAME,
            LABEL_APP_COMPONENT,
            LABEL_APP_PART_OF,
            LABEL_APP_MANAGED_BY,
        ] {
            assert!(l.contains_key(k), "{k}");
        }
    }
}

#[test]
fn rendering_twice_gives_the_same_objects() {
    let c = cluster(MULTI);
    assert_eq!(ok(&c, &cfg()), ok(&c, &cfg()));
}

#[test]
fn volume_snapshot_class_round_trips_with_api_version_and_kind() {
    let r = ok(&cluster(SINGLE_THIN), &cfg());
    let vsc = &r.snapshot_classes[0];
    let value = json(vsc);
    assert_eq!(value["apiVersion"], "snapshot.storage.k8s.io/v1");
    assert_eq!(value["kind"], "VolumeSnapshotClass");
    let back: VolumeSnapshotClass = serde_json::from_value(value).unwrap();
    assert_eq!(&back, vsc);
    assert_eq!(
        <VolumeSnapshotClass as k8s_openapi::Resource>::URL_PATH_SEGMENT,
        "volumesnapshotclasses"
    );
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn cluster_without_name_or_uid_is_refused() {
    let mut c = cluster(SINGLE_THIN);
    c.metadata.uid = None;
    let e = err(&c, &cfg());
    assert_eq!(
        e,
        RenderError::MissingUid {
            name: "my-lvmcluster".into()
        }
    );
    assert!(e.to_string().contains("metadata.uid"), "{e}");

    c.metadata.name = Some(String::new());
    let e = err(&c, &cfg());
    assert_eq!(e, RenderError::MissingName);
    assert!(e.to_string().contains("metadata.name"), "{e}");
}

#[test]
fn cluster_in_another_namespace_is_refused() {
    let mut c = cluster(SINGLE_THIN);
    c.metadata.namespace = Some("default".into());
    let e = err(&c, &cfg());
    assert_eq!(
        e,
        RenderError::WrongNamespace {
            name: "my-lvmcluster".into(),
            found: Some("default".into()),
            expected: NS.into()
        }
    );
    assert!(
        e.to_string()
            .contains(&format!("create the LVMCluster in \"{NS}\"")),
        "{e}"
    );
    c.metadata.namespace = None;
    assert!(matches!(
        err(&c, &cfg()),
        RenderError::WrongNamespace { found: None, .. }
    ));
}

#[test]
fn device_class_problems_name_the_field() {
    let e = err(&cluster("storage: {}\n"), &cfg());
    assert_eq!(e, RenderError::NoDeviceClasses);
    assert!(e.to_string().contains("spec.storage.deviceClasses"), "{e}");

    let dup = "storage:\n  deviceClasses:\n  - name: a\n  - name: b\n  - name: a\n";
    let e = err(&cluster(dup), &cfg());
    assert_eq!(
        e,
        RenderError::DuplicateDeviceClass {
            index: 2,
            name: "a".into()
        }
    );
    assert!(
        e.to_string()
            .starts_with("spec.storage.deviceClasses[2].name"),
        "{e}"
    );

    let unnamed = "storage:\n  deviceClasses:\n  - name: a\n  - name: \"\"\n";
    assert_eq!(
        err(&cluster(unnamed), &cfg()),
        RenderError::UnnamedDeviceClass { index: 1 }
    );

    let empty_selector =
        "storage:\n  deviceClasses:\n  - name: a\n    nodeSelector:\n      nodeSelectorTerms: []\n";
    let e = err(&cluster(empty_selector), &cfg());
    assert_eq!(
        e,
        RenderError::EmptyNodeSelector {
            index: 0,
            name: "a".into()
        }
    );
    assert!(
        e.to_string().contains("deviceClasses[0].nodeSelector"),
        "{e}"
    );
}

#[test]
fn unusable_configuration_is_refused_naming_the_field() {
    let c = cluster(SINGLE_THIN);
    let cases: Vec<(RenderConfig, &str)> = vec![
        (
            RenderConfig {
                namespace: String::new(),
                ..cfg()
            },
            "namespace",
        ),
        (
            RenderConfig {
                driver_name: String::new(),
                ..cfg()
            },
            "driver_name",
        ),
        (
            RenderConfig {
                driver_name: "Topolvm.IO".into(),
                ..cfg()
            },
            "driver_name",
        ),
        (
            RenderConfig {
                driver_name: "-x".into(),
                ..cfg()
            },
            "driver_name",
        ),
        (
            RenderConfig {
                driver_name: "a".repeat(64),
                ..cfg()
            },
            "driver_name",
        ),
        (
            // An empty label: not a DNS subdomain.
            RenderConfig {
                driver_name: "lvm..example.com".into(),
                ..cfg()
            },
            "driver_name",
        ),
        (
            RenderConfig {
                image: " ".into(),
                ..cfg()
            },
            "image",
        ),
        (
            RenderConfig {
                node_driver_registrar_image: String::new(),
                ..cfg()
            },
            "node_driver_registrar_image",
        ),
        (
            RenderConfig {
                livenessprobe_image: String::new(),
                ..cfg()
            },
            "livenessprobe_image",
        ),
        (
            RenderConfig {
                node_command: vec![],
                ..cfg()
            },
            "node_command",
        ),
        (
            RenderConfig {
                kubelet_dir: "var/lib/kubelet".into(),
                ..cfg()
            },
            "kubelet_dir",
        ),
        (
            RenderConfig {
                kubelet_dir: "/".into(),
                ..cfg()
            },
            "kubelet_dir",
        ),
        (
            RenderConfig {
                priority_class_name: String::new(),
                ..cfg()
            },
            "priority_class_name",
        ),
    ];
    for (cfg, field) in cases {
        match render(&c, &cfg) {
            Err(RenderError::Config { field: f, problem }) => {
                assert_eq!(f, field, "{problem}");
                assert!(!problem.is_empty());
            }
            other => panic!("{field}: expected a config error, got {other:?}"),
        }
    }
}

#[test]
fn default_config_uses_the_upstream_defaults() {
    let cfg = RenderConfig::new(NS, IMAGE);
    assert_eq!(cfg.driver_name, "topolvm.io");
    assert_eq!(cfg.kubelet_dir, "/var/lib/kubelet");
    assert_eq!(cfg.plugin_dir(), "/var/lib/kubelet/plugins/topolvm.io/");
    assert_eq!(cfg.registration_dir(), "/var/lib/kubelet/plugins_registry/");
    assert_eq!(
        cfg.kubelet_registration_path(),
        "/var/lib/kubelet/plugins/topolvm.io/csi.sock"
    );
    assert!(!cfg.snapshot_api_available);
    assert_eq!(cfg.existing_default_storage_class, None);
}

const CSI_DRIVER_LVM: &str = "\
storage:
  deviceClasses:
  - name: fast
    default: true
    fstype: ext4
    csiDriverLVMStorageClasses: true
    deviceSelector:
      paths: [/dev/nvme0n1, /dev/nvme1n1]
    storageClassOptions:
      reclaimPolicy: Retain
      volumeBindingMode: Immediate
      additionalParameters:
        example.com/tier: gold
  - name: bulk
    deviceSelector:
      paths: [/dev/sdb]
";

fn storage_class_names(r: &Rendered) -> Vec<String> {
    r.storage_classes
        .iter()
        .filter_map(|sc| sc.metadata.name.clone())
        .collect()
}

#[test]
fn csi_driver_lvm_storage_classes_are_copies_of_the_class_storage_class_with_its_type() {
    let r = ok(&cluster(CSI_DRIVER_LVM), &cfg());
    assert_eq!(
        storage_class_names(&r),
        [
            "lvms-fast",
            "csi-driver-lvm-linear",
            "csi-driver-lvm-striped",
            "csi-driver-lvm-mirror",
            "lvms-bulk"
        ]
    );
    let own = json(&r.storage_classes[0]);
    for (sc, ty) in r.storage_classes[1..4]
        .iter()
        .zip(["linear", "striped", "mirror"])
    {
        let mut expected = own.clone();
        expected["metadata"]["name"] = json!(format!("csi-driver-lvm-{ty}"));
        // Only the class's own StorageClass is the cluster default.
        expected["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove("storageclass.kubernetes.io/is-default-class");
        expected["parameters"]["type"] = json!(ty);
        assert_eq!(json(sc), expected, "{ty}");
    }
    assert_eq!(
        json(&r.storage_classes[3].parameters),
        json!({
            "topolvm.io/device-class": "fast",
            "csi.storage.k8s.io/fstype": "ext4",
            "example.com/tier": "gold",
            "type": "mirror",
        })
    );
    let mirror = &r.storage_classes[3];
    assert_eq!(mirror.provisioner, "topolvm.io");
    assert_eq!(mirror.reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(mirror.volume_binding_mode.as_deref(), Some("Immediate"));
    assert_eq!(mirror.allow_volume_expansion, Some(true));
    // Owned and labelled like the class's own StorageClass, so stale-object cleanup finds them.
    assert_eq!(mirror.metadata.labels, r.storage_classes[0].metadata.labels);
    assert_eq!(
        mirror.metadata.labels.as_ref().unwrap()[LABEL_OWNED_BY_NAME],
        "my-lvmcluster"
    );
}

#[test]
fn csi_driver_lvm_storage_classes_are_not_rendered_when_the_flag_is_off() {
    let r = ok(&cluster(MULTI), &cfg());
    assert!(
        storage_class_names(&r)
            .iter()
            .all(|n| !n.starts_with("csi-driver-lvm")),
        "{:?}",
        storage_class_names(&r)
    );
}

#[test]
fn turning_csi_driver_lvm_storage_classes_off_drops_them_from_what_is_rendered() {
    // The reconciler deletes every StorageClass with our owned-by labels that is not rendered
    // (controller test `stale_csi_driver_lvm_storage_class_is_deleted`).
    let mut c = cluster(CSI_DRIVER_LVM);
    assert_eq!(ok(&c, &cfg()).storage_classes.len(), 5);
    c.spec.storage.device_classes[0].csi_driver_lvm_storage_classes = false;
    assert_eq!(
        storage_class_names(&ok(&c, &cfg())),
        ["lvms-fast", "lvms-bulk"]
    );
}

#[test]
fn device_class_storage_class_names_list_every_rendered_name() {
    let c = cluster(CSI_DRIVER_LVM);
    let r = ok(&c, &cfg());
    let from_api: Vec<String> = c.spec.storage.storage_class_names().collect();
    assert_eq!(from_api, storage_class_names(&r));
}

#[test]
fn raid_thin_class_renders_like_a_thin_class_with_its_raid_config_on_the_volume_group() {
    let r = ok(
        &cluster(
            "\
storage:
  deviceClasses:
  - name: vg1
    default: true
    deviceSelector:
      paths: [/dev/sdb, /dev/sdc]
    raidConfig:
      type: raid1
    thinPoolConfig:
      name: thin-pool-1
      sizePercent: 90
      overprovisionRatio: 10
",
        ),
        &cfg(),
    );
    // Snapshots and clones: a VolumeSnapshotClass, as for any thin class.
    assert_eq!(r.snapshot_classes.len(), 1);
    assert_eq!(json(&r.snapshot_classes[0])["metadata"]["name"], "lvms-vg1");
    // Its StorageClass names no volume layout: the RAID is the pool's.
    let sc = json(&r.storage_classes[0]);
    assert_eq!(sc["allowVolumeExpansion"], true, "{sc}");
    assert!(
        sc["parameters"]
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.contains("lv-type")),
        "{sc}"
    );
    // The node agent gets both configs.
    let vg = json(&r.volume_groups[0]);
    assert_eq!(vg["spec"]["raidConfig"]["type"], "raid1", "{vg}");
    assert_eq!(vg["spec"]["thinPoolConfig"]["name"], "thin-pool-1", "{vg}");
}

#[test]
fn every_container_of_the_node_daemon_set_requests_cpu_and_memory_and_has_a_memory_limit() {
    let spec = format!(
        "{SINGLE_THIN}  - name: csi-lvm\n    adopt: csi-driver-lvm\n    deviceSelector:\n      \
         devicePatterns: [\"/dev/nvme[0-9]n1\"]\n"
    );
    let r = ok(&cluster(&spec), &cfg());
    let pod = json(&r.daemon_set)["spec"]["template"]["spec"].take();
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 6, "the agent and five sidecars");
    for c in containers {
        let r = &c["resources"];
        for (path, what) in [
            ("/requests/cpu", "a CPU request"),
            ("/requests/memory", "a memory request"),
            ("/limits/memory", "a memory limit"),
        ] {
            assert!(r.pointer(path).is_some(), "{} lacks {what}: {r}", c["name"]);
        }
        assert!(
            r.pointer("/limits/cpu").is_none(),
            "{}: no CPU limit",
            c["name"]
        );
    }
}

#[test]
fn a_class_adopting_csi_driver_lvm_renders_its_csi_driver_and_the_sidecars_of_its_volumes() {
    let plain = ok(&cluster(SINGLE_THIN), &cfg());
    assert_eq!(plain.csi_driver_lvm, None);
    let plain_pod = json(&plain.daemon_set)["spec"]["template"]["spec"].take();
    assert_eq!(plain_pod["containers"].as_array().unwrap().len(), 3);

    let spec = format!(
        "{SINGLE_THIN}  - name: csi-lvm\n    adopt: csi-driver-lvm\n    deviceSelector:\n      \
         devicePatterns: [\"/dev/nvme[0-9]n1\"]\n"
    );
    let r = ok(&cluster(&spec), &cfg());
    let driver = json(&r.csi_driver_lvm.expect("rendered"));
    assert_eq!(driver["metadata"]["name"], "lvm.csi.metal-stack.io");
    assert_eq!(
        driver["metadata"]["labels"]["owned-by.topolvm.io/uid"], UID,
        "ours, so the operator may delete it again"
    );
    assert_eq!(
        driver["spec"],
        json!({"attachRequired": false, "podInfoOnMount": true, "storageCapacity": false,
               "volumeLifecycleModes": ["Persistent"]})
    );

    let pod = json(&r.daemon_set)["spec"]["template"]["spec"].take();
    let containers = pod["containers"].as_array().unwrap();
    let by_name = |name: &str| {
        containers
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}: {containers:?}"))
    };
    let env = &by_name("vg-manager")["env"];
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "LVMS_CSI_DRIVER_LVM_ENDPOINT",
            "value": "unix:///csi-driver-lvm/csi.sock"})),
        "{env}"
    );
    assert!(
        env.as_array()
            .unwrap()
            .contains(&json!({"name": "LVMS_CSI_DRIVER_LVM_OLD_SOCKET",
            "value": "/var/lib/kubelet/plugins/csi-driver-lvm/csi.sock"})),
        "{env}"
    );
    assert_eq!(
        by_name("csi-driver-lvm-registrar")["args"],
        json!([
            "--csi-address=/csi-driver-lvm/csi.sock",
            "--kubelet-registration-path=/var/lib/kubelet/plugins/lvm.csi.metal-stack.io/csi.sock"
        ])
    );
    let provisioner = by_name("csi-driver-lvm-provisioner");
    assert_eq!(provisioner["image"], DEFAULT_CSI_PROVISIONER_IMAGE);
    assert!(
        provisioner["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--node-deployment")),
        "{provisioner}"
    );
    assert_eq!(provisioner["env"][0]["name"], "NODE_NAME");
    let resizer = by_name("csi-driver-lvm-resizer");
    assert_eq!(resizer["image"], DEFAULT_CSI_RESIZER_IMAGE);
    assert!(
        resizer["args"]
            .as_array()
            .unwrap()
            .contains(&json!("--leader-election")),
        "{resizer}"
    );
    assert!(
        pod["volumes"].as_array().unwrap().contains(&json!({
            "name": "csi-driver-lvm-plugin-dir",
            "hostPath": {"path": "/var/lib/kubelet/plugins/lvm.csi.metal-stack.io",
                         "type": "DirectoryOrCreate"}})),
        "{}",
        pod["volumes"]
    );
    // lvms-rs's own socket, registration and sidecars are unchanged.
    assert_eq!(
        containers
            .iter()
            .take(3)
            .map(|c| c["name"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["vg-manager", "node-driver-registrar", "livenessprobe"]
    );
}
