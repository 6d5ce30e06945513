//! The install manifests, `deploy/base` (with the CRDs of `deploy/crds`): the operator's RBAC is
//! exactly the API calls it makes, the webhook configurations reach the webhook the operator
//! serves, and the Deployment runs it as the binary expects, with a locked-down container.
//!
//! The objects are `kubectl kustomize deploy/base` when kubectl is on `PATH`. Without kubectl (CI
//! has none) the kustomizations' `resources:` are followed here and the files parsed as they are;
//! that is why every namespaced object in `deploy/base` names its namespace even though the
//! kustomization sets it. `LVMS_REQUIRE_KUBECTL=1` turns a missing kubectl into a failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    io::ErrorKind,
    path::{Path, PathBuf},
    process::Command,
    sync::LazyLock,
};

use lvms_operator::{
    render::NODE_SERVICE_ACCOUNT,
    webhook::{MUTATE_PATH, VALIDATE_PATH},
};
use serde::Deserialize;
use serde_json::Value;

const NAMESPACE: &str = "lvms-system";
const OPERATOR: &str = "lvms-operator";
const WEBHOOK_SERVICE: &str = "lvms-webhook-service";
const WEBHOOK_CERT_SECRET: &str = "lvms-webhook-cert";
const WEBHOOK_PORT: i64 = 9443;
const METRICS_PORT: i64 = 8080;
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "lvms-provisioner");

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Scope {
    /// Granted by a ClusterRoleBinding: in every namespace, and cluster-scoped resources.
    Cluster,
    /// Granted by a RoleBinding in the operator's namespace.
    Namespace,
}

/// Every API call the operator makes, as `(group, resource, verbs, scope)`. Server-side apply of
/// an object that does not exist yet needs `create` besides `patch`.
const OPERATOR_PERMISSIONS: &[(&str, &str, &[&str], Scope)] = &[
    // The controller: the LVMCluster, its finalizer (merge patch), status (server-side apply),
    // owner references with blockOwnerDeletion (`<resource>/finalizers` update).
    (
        "lvm.topolvm.io",
        "lvmclusters",
        &["get", "list", "watch", "patch"],
        Scope::Namespace,
    ),
    (
        "lvm.topolvm.io",
        "lvmclusters/status",
        &["patch"],
        Scope::Namespace,
    ),
    (
        "lvm.topolvm.io",
        "lvmclusters/finalizers",
        &["update"],
        Scope::Namespace,
    ),
    // The webhook: "only one LVMCluster" counts the LVMClusters of every namespace.
    ("lvm.topolvm.io", "lvmclusters", &["list"], Scope::Cluster),
    (
        "lvm.topolvm.io",
        "lvmvolumegroups",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Namespace,
    ),
    (
        "lvm.topolvm.io",
        "lvmvolumegroupnodestatuses",
        &["get", "list", "watch", "patch", "delete"],
        Scope::Namespace,
    ),
    (
        "apps",
        "daemonsets",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Namespace,
    ),
    // kube-runtime's Recorder (events.k8s.io/v1): create, then patch a series.
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Namespace,
    ),
    (
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "csidrivers",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotclasses",
        &["get", "list", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    // patch: the out-of-service taint on a dead node of a shared class, when opted in
    // (src/controller/dead_nodes.rs).
    (
        "",
        "nodes",
        &["get", "list", "watch", "patch"],
        Scope::Cluster,
    ),
    // The LVMCluster's deletion counts claims and volumes; the eviction controller reads a claim,
    // its volume and node, and deletes the claim.
    (
        "",
        "persistentvolumeclaims",
        &["get", "list", "delete"],
        Scope::Cluster,
    ),
    ("", "persistentvolumes", &["get", "list"], Scope::Cluster),
    // Volumes of shared classes on gone nodes are handed to another node (src/handover.rs).
    (
        "topolvm.io",
        "logicalvolumes",
        &["list", "patch"],
        Scope::Cluster,
    ),
    // The eviction controller (src/controller/eviction.rs): every pod watched, the pod's
    // StatefulSet read, events on claims and StatefulSets in any namespace.
    // A dead node's pods whose volumes are all its dead shared class's are deleted
    // (src/controller/dead_nodes.rs).
    ("", "pods", &["list", "watch", "delete"], Scope::Cluster),
    ("apps", "statefulsets", &["get"], Scope::Cluster),
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Cluster,
    ),
    // The webhook's self-signed certificate (src/certificate.rs).
    ("", "secrets", &["get", "create", "patch"], Scope::Namespace),
    // The sanlock host ids of shared classes (src/host_ids.rs): read, create, conditional update.
    (
        "",
        "configmaps",
        &["get", "create", "update"],
        Scope::Namespace,
    ),
    // Leader election of the controllers (Lease lvms-operator, and lvms-csi-controller for the
    // CSI controller's collector): read, created, renewed, taken over and handed back by update.
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
        Scope::Namespace,
    ),
    (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
        &["get", "patch"],
        Scope::Cluster,
    ),
    (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
        &["get", "patch"],
        Scope::Cluster,
    ),
];

/// Every API call the node agent (`lvms node`, service account `vg-manager`) makes.
const NODE_PERMISSIONS: &[(&str, &str, &[&str], Scope)] = &[
    // The volume-group reconciler: which LVMVolumeGroups select this node. The capacity
    // publisher: its capacity annotations, merge-patched.
    // Watched (its own, by name) for label changes.
    (
        "",
        "nodes",
        &["get", "list", "watch", "patch"],
        Scope::Cluster,
    ),
    // The garbage collector: PersistentVolumes' handles; events about orphans (on the Node);
    // the pod an inline ephemeral volume was made for.
    ("", "persistentvolumes", &["list"], Scope::Cluster),
    ("", "pods", &["get"], Scope::Cluster),
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Cluster,
    ),
    // Watched, their per-node finalizer merge-patched.
    (
        "lvm.topolvm.io",
        "lvmvolumegroups",
        &["list", "watch", "patch"],
        Scope::Namespace,
    ),
    // The node's status object: read at start (a restarted agent keeps its entries), server-side
    // applied, deleted once the node serves no class.
    (
        "lvm.topolvm.io",
        "lvmvolumegroupnodestatuses",
        &["get", "create", "patch", "delete"],
        Scope::Namespace,
    ),
    // Shared classes: this node's sanlock host id (ConfigMap lvms-sanlock-host-ids, read and
    // watched), and the class's creator Lease (created, read, renewed or taken over by update).
    (
        "",
        "configmaps",
        &["get", "list", "watch"],
        Scope::Namespace,
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "create", "update"],
        Scope::Namespace,
    ),
    // The LogicalVolume reconciler: watched, sources read, finalizer merge-patched, status patched.
    (
        "topolvm.io",
        "logicalvolumes",
        &["get", "list", "watch", "patch"],
        Scope::Cluster,
    ),
    (
        "topolvm.io",
        "logicalvolumes/status",
        &["patch"],
        Scope::Cluster,
    ),
];

/// What the node pods' sidecars for csi-driver-lvm's volumes call (ADR 0033): a node-deployed
/// csi-provisioner and a leader-elected csi-resizer, their upstream RBAC less snapshot writes and
/// capacity objects.
const CSI_DRIVER_LVM_SIDECAR_PERMISSIONS: &[(&str, &str, &[&str], Scope)] = &[
    ("", "nodes", &["get", "list", "watch"], Scope::Cluster),
    (
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    (
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "update"],
        Scope::Cluster,
    ),
    (
        "",
        "persistentvolumeclaims/status",
        &["patch"],
        Scope::Cluster,
    ),
    (
        "",
        "events",
        &["list", "watch", "create", "update", "patch"],
        Scope::Cluster,
    ),
    ("", "pods", &["get", "list", "watch"], Scope::Cluster),
    (
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "csinodes",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "volumeattachments",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "volumeattributesclasses",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "list"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get", "list"],
        Scope::Cluster,
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "update", "delete"],
        Scope::Namespace,
    ),
];

/// Every API call of the CSI controller side of the operator's pod: `lvms csi-controller` and the
/// CSI sidecars (their upstream RBAC), granted to the operator's service account by their own roles.
const CSI_CONTROLLER_PERMISSIONS: &[(&str, &str, &[&str], Scope)] = &[
    (
        "topolvm.io",
        "logicalvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    ("", "nodes", &["get", "list", "watch"], Scope::Cluster),
    (
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
        Scope::Cluster,
    ),
    (
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "update"],
        Scope::Cluster,
    ),
    (
        "",
        "persistentvolumeclaims/status",
        &["patch"],
        Scope::Cluster,
    ),
    (
        "",
        "events",
        &["list", "watch", "create", "update", "patch"],
        Scope::Cluster,
    ),
    ("", "pods", &["get", "list", "watch"], Scope::Cluster),
    (
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "csinodes",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "volumeattachments",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "storage.k8s.io",
        "volumeattributesclasses",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "list"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotclasses",
        &["get", "list", "watch"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get", "list", "watch", "update", "patch"],
        Scope::Cluster,
    ),
    (
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents/status",
        &["update", "patch"],
        Scope::Cluster,
    ),
    (
        "coordination.k8s.io",
        "leases",
        &["get", "list", "watch", "create", "update", "delete"],
        Scope::Namespace,
    ),
    (
        "storage.k8s.io",
        "csistoragecapacities",
        &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ],
        Scope::Namespace,
    ),
    ("apps", "replicasets", &["get"], Scope::Namespace),
    // lvms csi-controller's garbage collector: events about unclaimed LogicalVolumes.
    (
        "events.k8s.io",
        "events",
        &["create", "patch"],
        Scope::Cluster,
    ),
];

type Permission = (String, String, String, Scope);

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn base_dir() -> PathBuf {
    workspace().join("deploy/base")
}

fn kubectl_required() -> bool {
    std::env::var("LVMS_REQUIRE_KUBECTL").is_ok_and(|v| v == "1")
}

/// `kubectl kustomize deploy/base`, or `None` when kubectl is not installed.
fn kubectl_kustomize() -> Option<String> {
    match Command::new("kubectl")
        .arg("kustomize")
        .arg(base_dir())
        .output()
    {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            assert!(
                !kubectl_required(),
                "LVMS_REQUIRE_KUBECTL=1 but kubectl is not on PATH"
            );
            None
        }
        Err(e) => panic!("cannot run kubectl: {e}"),
        Ok(out) => {
            assert!(
                out.status.success(),
                "`kubectl kustomize deploy/base` failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8(out.stdout).expect("kubectl prints UTF-8"))
        }
    }
}

static RENDERED: LazyLock<Option<String>> = LazyLock::new(kubectl_kustomize);

/// Every object of the base: rendered by kubectl if there is one, else read from the files.
static OBJECTS: LazyLock<Vec<Value>> = LazyLock::new(|| match RENDERED.as_deref() {
    Some(yaml) => parse_documents(yaml, "`kubectl kustomize deploy/base`"),
    None => {
        eprintln!("kubectl is not on PATH: checking the files of deploy/base as they are");
        read_kustomization(&base_dir())
    }
});

fn parse_documents(yaml: &str, origin: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin} is not valid YAML: {e}"))
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn read_yaml(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_documents(&text, &path.display().to_string())
}

/// The `resources:` of `dir/kustomization.yaml`, directories followed, files parsed.
fn kustomization_resources(dir: &Path) -> Vec<PathBuf> {
    let kustomization = read_yaml(&dir.join("kustomization.yaml"));
    let [kustomization] = kustomization.as_slice() else {
        panic!("{}/kustomization.yaml is not one document", dir.display());
    };
    kustomization["resources"]
        .as_array()
        .unwrap_or_else(|| panic!("{}/kustomization.yaml has no resources", dir.display()))
        .iter()
        .map(|r| dir.join(r.as_str().expect("a resource is a path")))
        .collect()
}

fn read_kustomization(dir: &Path) -> Vec<Value> {
    kustomization_resources(dir)
        .iter()
        .flat_map(|path| {
            if path.is_dir() {
                read_kustomization(path)
            } else {
                read_yaml(path)
            }
        })
        .collect()
}

fn objects() -> &'static [Value] {
    &OBJECTS
}

fn describe(obj: &Value) -> String {
    let ns = obj["metadata"]["namespace"]
        .as_str()
        .map_or_else(String::new, |ns| format!("{ns}/"));
    format!(
        "{} {ns}{}",
        obj["kind"].as_str().unwrap_or("?"),
        obj["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn all_of<'a>(kind: &'a str) -> impl Iterator<Item = &'static Value> + 'a {
    objects().iter().filter(move |o| o["kind"] == kind)
}

/// The one object of `kind` named `name` (in `lvms-system` if `namespaced`).
fn find(kind: &str, name: &str, namespaced: bool) -> &'static Value {
    let found: Vec<&Value> = all_of(kind)
        .filter(|o| o["metadata"]["name"] == name)
        .filter(|o| !namespaced || o["metadata"]["namespace"] == NAMESPACE)
        .collect();
    match found.as_slice() {
        [one] => one,
        _ => panic!(
            "expected one {kind} {name}{}, found {}; the manifests hold: {:?}",
            if namespaced { " in lvms-system" } else { "" },
            found.len(),
            objects().iter().map(describe).collect::<Vec<_>>()
        ),
    }
}

/// The string at JSON `pointer` in `obj`, or a failure naming the object and the field.
fn str_at<'a>(obj: &'a Value, pointer: &str) -> &'a str {
    obj.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{}: {pointer} is not a string", describe(obj)))
}

fn at<'a>(obj: &'a Value, pointer: &str) -> &'a Value {
    obj.pointer(pointer)
        .unwrap_or_else(|| panic!("{}: {pointer} is missing", describe(obj)))
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn deployment() -> &'static Value {
    find("Deployment", OPERATOR, true)
}

fn container(name: &str) -> &'static Value {
    let deploy = deployment();
    at(deploy, "/spec/template/spec/containers")
        .as_array()
        .expect("containers is a list")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{}: no container {name}", describe(deploy)))
}

fn operator_container() -> &'static Value {
    container("operator")
}

/// The container port `port` (a number or a port name) stands for.
fn container_port(port: &Value) -> i64 {
    if let Some(number) = port.as_i64() {
        return number;
    }
    let name = port.as_str().expect("a port is a number or a name");
    let container = operator_container();
    container["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == name)
        .and_then(|p| p["containerPort"].as_i64())
        .unwrap_or_else(|| panic!("the operator container has no port named {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> &'a Value {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("the operator container has no env {name}"))
}

/// What the roles bound to service account `account` of the namespace grant.
fn grants(account: &str) -> BTreeSet<Permission> {
    let mut granted = BTreeSet::new();
    let bindings = all_of("ClusterRoleBinding").chain(all_of("RoleBinding"));
    for binding in bindings.filter(|b| binds(b, account)) {
        let scope = if binding["kind"] == "ClusterRoleBinding" {
            Scope::Cluster
        } else {
            assert_eq!(
                binding["metadata"]["namespace"],
                NAMESPACE,
                "{} binds {account} outside its namespace",
                describe(binding)
            );
            Scope::Namespace
        };
        let role_kind = str_at(binding, "/roleRef/kind");
        let role = find(
            role_kind,
            str_at(binding, "/roleRef/name"),
            role_kind == "Role",
        );
        assert!(
            role.get("aggregationRule").is_none(),
            "{}: an aggregated role grants what other roles say",
            describe(role)
        );
        for rule in role["rules"].as_array().into_iter().flatten() {
            for field in ["resourceNames", "nonResourceURLs"] {
                assert!(
                    rule.get(field).is_none(),
                    "{}: {field} is not modelled by this test's table: {rule}",
                    describe(role)
                );
            }
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        granted.insert((group.into(), resource.into(), verb.into(), scope));
                    }
                }
            }
        }
    }
    granted
}

fn binds(binding: &Value, account: &str) -> bool {
    binding["subjects"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| {
            s["kind"] == "ServiceAccount" && s["name"] == account && s["namespace"] == NAMESPACE
        })
    })
}

fn expected_grants(table: &[(&str, &str, &[&str], Scope)]) -> BTreeSet<Permission> {
    table
        .iter()
        .flat_map(|(group, resource, verbs, scope)| {
            verbs
                .iter()
                .map(move |verb| ((*group).into(), (*resource).into(), (*verb).into(), *scope))
        })
        .collect()
}

fn show(permissions: &BTreeSet<&Permission>) -> String {
    permissions
        .iter()
        .map(|(group, resource, verb, scope)| {
            let group = if group.is_empty() { "core" } else { group };
            format!("\n  {verb} {group}/{resource} ({scope:?})")
        })
        .collect()
}

#[test]
fn operator_is_granted_every_api_call_it_makes() {
    let mut expected = expected_grants(OPERATOR_PERMISSIONS);
    expected.extend(expected_grants(CSI_CONTROLLER_PERMISSIONS));
    let granted = grants(OPERATOR);
    let missing: BTreeSet<&Permission> = expected.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "the operator's roles do not grant:{}",
        show(&missing)
    );
}

#[test]
fn operator_is_granted_nothing_beyond_the_api_calls_it_makes() {
    let mut expected = expected_grants(OPERATOR_PERMISSIONS);
    expected.extend(expected_grants(CSI_CONTROLLER_PERMISSIONS));
    let granted = grants(OPERATOR);
    let extra: BTreeSet<&Permission> = granted.difference(&expected).collect();
    assert!(
        extra.is_empty(),
        "the operator's roles grant more than it uses:{}",
        show(&extra)
    );
}

#[test]
fn node_agent_is_granted_exactly_the_api_calls_it_makes() {
    let mut expected = expected_grants(NODE_PERMISSIONS);
    expected.extend(expected_grants(CSI_DRIVER_LVM_SIDECAR_PERMISSIONS));
    let granted = grants(NODE_SERVICE_ACCOUNT);
    let missing: BTreeSet<&Permission> = expected.difference(&granted).collect();
    let extra: BTreeSet<&Permission> = granted.difference(&expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the node agent's roles lack:{}\nand grant beyond its calls:{}",
        show(&missing),
        show(&extra)
    );
}

#[test]
fn the_operator_pod_runs_the_csi_controller_with_the_standard_sidecars_on_one_socket() {
    let socket = "/run/csi/csi.sock";
    let ctrl = container("csi-controller");
    assert_eq!(strings(&ctrl["args"]), ["csi-controller"]);
    assert_eq!(
        str_at(env(ctrl, "CSI_ENDPOINT"), "/value"),
        format!("unix://{socket}")
    );
    for (name, required) in [
        (
            "csi-provisioner",
            &[
                "--enable-capacity",
                "--strict-topology",
                "--extra-create-metadata",
            ][..],
        ),
        ("csi-resizer", &[][..]),
        ("csi-snapshotter", &[][..]),
        ("livenessprobe", &[][..]),
    ] {
        let c = container(name);
        let args = strings(&c["args"]);
        assert!(
            args.contains(&format!("--csi-address={socket}").as_str()),
            "{name}: {args:?}"
        );
        for flag in required {
            assert!(args.contains(flag), "{name} lacks {flag}: {args:?}");
        }
        let image = str_at(c, "/image");
        assert!(
            image.starts_with("registry.k8s.io/sig-storage/"),
            "{name}: {image}"
        );
    }
    // --enable-capacity needs the pod's namespace and name.
    let provisioner = container("csi-provisioner");
    for var in ["NAMESPACE", "POD_NAME"] {
        assert!(env(provisioner, var).get("valueFrom").is_some(), "{var}");
    }
    // Every one of them mounts the socket's directory.
    let containers = at(deployment(), "/spec/template/spec/containers")
        .as_array()
        .unwrap();
    for c in containers.iter().filter(|c| c["name"] != "operator") {
        let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| m["name"] == "socket-dir" && m["mountPath"] == "/run/csi"),
            "{} does not mount the socket directory",
            c["name"]
        );
    }
}

#[test]
fn rbac_rules_use_no_wildcards() {
    for role in all_of("ClusterRole").chain(all_of("Role")) {
        for rule in role["rules"].as_array().into_iter().flatten() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                assert!(
                    !strings(&rule[field]).iter().any(|s| s.contains('*')),
                    "{}: wildcard in {field}: {rule}",
                    describe(role)
                );
            }
        }
    }
}

#[test]
fn service_accounts_of_the_operator_and_the_node_agent_exist() {
    find("ServiceAccount", OPERATOR, true);
    // The node DaemonSet the operator renders runs as this account; without it no pod is admitted.
    find("ServiceAccount", NODE_SERVICE_ACCOUNT, true);
    assert_eq!(
        str_at(deployment(), "/spec/template/spec/serviceAccountName"),
        OPERATOR
    );
}

/// The one webhook of the one `kind` configuration: LVMClusters on `operations`, at `path` of the
/// webhook Service, answering fast and failing closed.
fn check_webhook(kind: &str, path: &str, operations: &[&str]) {
    let configs: Vec<&Value> = all_of(kind).collect();
    let [config] = configs.as_slice() else {
        panic!("expected one {kind}, found {}", configs.len());
    };
    let webhooks = at(config, "/webhooks").as_array().expect("a list");
    let [webhook] = webhooks.as_slice() else {
        panic!("{}: expected one webhook", describe(config));
    };
    let what = describe(config);
    let rules = webhook["rules"].as_array().expect("rules is a list");
    let [rule] = rules.as_slice() else {
        panic!("{what}: expected one rule");
    };
    assert_eq!(strings(&rule["apiGroups"]), ["lvm.topolvm.io"], "{what}");
    assert_eq!(strings(&rule["apiVersions"]), ["v1alpha1"], "{what}");
    assert_eq!(strings(&rule["resources"]), ["lvmclusters"], "{what}");
    assert_eq!(strings(&rule["operations"]), operations, "{what}");

    let service = &webhook["clientConfig"]["service"];
    assert_eq!(service["path"], path, "{what}: path");
    assert_eq!(service["name"], WEBHOOK_SERVICE, "{what}: service");
    assert_eq!(service["namespace"], NAMESPACE, "{what}: service");
    assert_eq!(service["port"], 443, "{what}: service port");
    assert!(
        webhook["clientConfig"].get("url").is_none(),
        "{what}: url and service exclude each other"
    );
    assert_eq!(
        strings(&webhook["admissionReviewVersions"]),
        ["v1"],
        "{what}"
    );
    assert_eq!(webhook["sideEffects"], "None", "{what}");
    assert_eq!(webhook["failurePolicy"], "Fail", "{what}");
    assert_eq!(webhook["timeoutSeconds"], 10, "{what}");
}

#[test]
fn validating_webhook_sends_creates_and_updates_to_the_operators_validate_path() {
    check_webhook(
        "ValidatingWebhookConfiguration",
        VALIDATE_PATH,
        &["CREATE", "UPDATE"],
    );
}

#[test]
fn mutating_webhook_sends_creates_to_the_operators_mutate_path() {
    check_webhook("MutatingWebhookConfiguration", MUTATE_PATH, &["CREATE"]);
}

#[test]
fn webhook_service_reaches_the_operator_pods_on_the_webhook_port() {
    let service = find("Service", WEBHOOK_SERVICE, true);
    let ports = at(service, "/spec/ports").as_array().expect("a list");
    let port = ports
        .iter()
        .find(|p| p["port"] == 443)
        .unwrap_or_else(|| panic!("{}: no port 443", describe(service)));
    assert_eq!(
        container_port(&port["targetPort"]),
        WEBHOOK_PORT,
        "{}: targetPort",
        describe(service)
    );
    assert_eq!(
        container_port(&Value::from("webhook")),
        WEBHOOK_PORT,
        "the container's webhook port is the binary's default --webhook-port"
    );

    let selector = at(service, "/spec/selector")
        .as_object()
        .expect("an object");
    assert!(!selector.is_empty(), "{}: no selector", describe(service));
    let pod_labels = at(deployment(), "/spec/template/metadata/labels");
    for (key, value) in selector {
        assert_eq!(
            &pod_labels[key],
            value,
            "{} selects {key}={value}; the operator's pods are labelled {pod_labels}",
            describe(service)
        );
    }
    assert_eq!(pod_labels["app.kubernetes.io/name"], OPERATOR);
}

#[test]
fn operator_probes_hit_healthz_and_readyz_on_the_metrics_port() {
    let container = operator_container();
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &container[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}: {}", container[probe]);
        assert_eq!(
            container_port(&get["port"]),
            METRICS_PORT,
            "{probe}: {}",
            container[probe]
        );
        assert!(
            get.get("scheme").is_none_or(|s| s == "HTTP"),
            "{probe}: the metrics port is plain HTTP: {}",
            container[probe]
        );
    }
}

#[test]
fn operator_container_runs_unprivileged_with_a_read_only_root() {
    let container = operator_container();
    let sc = &container["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "securityContext: {sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "securityContext: {sc}");
    assert_eq!(
        sc["allowPrivilegeEscalation"], false,
        "securityContext: {sc}"
    );
    assert_eq!(
        strings(&sc["capabilities"]["drop"]),
        ["ALL"],
        "securityContext: {sc}"
    );
    assert!(
        sc["capabilities"].get("add").is_none(),
        "securityContext: {sc}"
    );
    assert_eq!(
        sc["seccompProfile"]["type"], "RuntimeDefault",
        "securityContext: {sc}"
    );
    assert_ne!(sc["privileged"], true, "securityContext: {sc}");
}

#[test]
fn operator_reads_the_webhook_certificate_from_the_mounted_secret() {
    let container = operator_container();
    let cert_dir = str_at(env(container, "WEBHOOK_CERT_DIR"), "/value");
    let volumes = at(deployment(), "/spec/template/spec/volumes")
        .as_array()
        .expect("a list");
    let volume = volumes
        .iter()
        .find(|v| v["secret"]["secretName"] == WEBHOOK_CERT_SECRET)
        .unwrap_or_else(|| panic!("no volume from the Secret {WEBHOOK_CERT_SECRET}"));
    let mount = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("volume {} is not mounted", volume["name"]));
    assert_eq!(mount["mountPath"], cert_dir, "WEBHOOK_CERT_DIR vs mount");
    assert_eq!(mount["readOnly"], true, "{mount}");
}

#[test]
fn operator_learns_its_namespace_pod_name_and_node_image_from_its_env() {
    let container = operator_container();
    assert_eq!(strings(&container["args"]), ["operator"]);
    for (name, field) in [
        ("NAMESPACE", "metadata.namespace"),
        ("POD_NAME", "metadata.name"),
    ] {
        assert_eq!(
            str_at(env(container, name), "/valueFrom/fieldRef/fieldPath"),
            field,
            "env {name}"
        );
    }
    assert_eq!(
        str_at(env(container, "LVMS_IMAGE"), "/value"),
        str_at(container, "/image"),
        "the node agent runs the operator's image"
    );
}

#[test]
fn two_replicas_elect_a_leader_spread_over_nodes_and_one_at_a_time_may_be_disrupted() {
    let deploy = deployment();
    assert_eq!(at(deploy, "/spec/replicas"), 2);
    let labels = at(deploy, "/spec/selector/matchLabels");
    // Both containers that run controllers once per cluster name themselves in their Lease, and
    // neither turns leader election off.
    for name in ["operator", "csi-controller"] {
        let c = container(name);
        assert_eq!(
            str_at(env(c, "POD_NAME"), "/valueFrom/fieldRef/fieldPath"),
            "metadata.name",
            "{name}"
        );
        assert!(
            c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|e| e["name"] != "LVMS_LEADER_ELECTION"),
            "{name} elects a leader"
        );
    }
    let spread = at(
        deploy,
        "/spec/template/spec/affinity/podAntiAffinity/preferredDuringSchedulingIgnoredDuringExecution/0/podAffinityTerm",
    );
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&spread["labelSelector"]["matchLabels"], labels);
    let budget = find("PodDisruptionBudget", OPERATOR, true);
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(budget["spec"]["maxUnavailable"], 1);
}

#[test]
fn manifests_hold_the_crds_and_put_every_namespaced_object_in_lvms_system() {
    let expected: BTreeSet<String> = lvms_api::crd::all()
        .expect("CRDs render")
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect();
    let found: BTreeSet<String> = all_of("CustomResourceDefinition")
        .map(|crd| str_at(crd, "/metadata/name").to_owned())
        .collect();
    assert_eq!(found, expected, "CRDs in the manifests vs the types");
    assert_eq!(expected.len(), 4);

    let namespace = find("Namespace", NAMESPACE, false);
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
        "the node DaemonSet is privileged"
    );

    let cluster_scoped = [
        "Namespace",
        "CustomResourceDefinition",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ];
    for obj in objects() {
        let kind = str_at(obj, "/kind");
        if cluster_scoped.contains(&kind) {
            assert!(
                obj["metadata"].get("namespace").is_none(),
                "{} is cluster-scoped but has a namespace",
                describe(obj)
            );
        } else {
            assert_eq!(
                obj["metadata"]["namespace"],
                NAMESPACE,
                "{} is not in lvms-system",
                describe(obj)
            );
        }
    }
}

#[test]
fn kubectl_kustomize_renders_the_base_with_the_part_of_label() {
    let Some(rendered) = RENDERED.as_deref() else {
        eprintln!("skipped: kubectl is not on PATH (LVMS_REQUIRE_KUBECTL=1 makes this a failure)");
        return;
    };
    let objects = parse_documents(rendered, "`kubectl kustomize deploy/base`");
    assert!(!objects.is_empty());
    for obj in &objects {
        assert_eq!(
            obj["metadata"]["labels"][PART_OF.0],
            PART_OF.1,
            "{}",
            describe(obj)
        );
    }
    // The common label must not reach selectors: the Service would select nothing it had not
    // before, and a Deployment's selector is immutable.
    assert!(
        deployment()["spec"]["selector"]["matchLabels"]
            .get(PART_OF.0)
            .is_none()
    );
    assert!(
        find("Service", WEBHOOK_SERVICE, true)["spec"]["selector"]
            .get(PART_OF.0)
            .is_none()
    );
}

#[test]
fn kustomizations_list_every_manifest_file() {
    for dir in [base_dir(), workspace().join("deploy/crds")] {
        let listed: BTreeSet<PathBuf> = kustomization_resources(&dir).into_iter().collect();
        for entry in std::fs::read_dir(&dir).expect("the directory exists") {
            let path = entry.expect("a directory entry").path();
            let is_yaml = path.extension().is_some_and(|e| e == "yaml" || e == "yml");
            if is_yaml && path.file_name().is_some_and(|n| n != "kustomization.yaml") {
                assert!(
                    listed.contains(&path),
                    "{} is not in the resources of {}/kustomization.yaml",
                    path.display(),
                    dir.display()
                );
            }
        }
    }
}

#[test]
fn the_image_carries_the_node_tools_and_runs_lvms() {
    let dockerfile = std::fs::read_to_string(workspace().join("deploy/Dockerfile"))
        .expect("deploy/Dockerfile exists");
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(
        stages.len(),
        2,
        "a build stage and a runtime stage: {stages:?}"
    );
    assert!(stages[1].contains("debian:bookworm"), "{}", stages[1]);
    let install = dockerfile
        .split("apt-get install")
        .nth(1)
        .expect("the runtime stage installs packages");
    let install = install.split("&&").next().unwrap_or_default();
    for tool in [
        "lvm2",
        "thin-provisioning-tools",
        "e2fsprogs",
        "xfsprogs",
        "util-linux",
        // The clients of the host's lock daemons, for shared classes (ADR 0016).
        "sanlock",
        "lvm2-lockd",
    ] {
        assert!(
            install.split_whitespace().any(|w| w == tool),
            "the image lacks {tool}"
        );
    }
    assert!(dockerfile.contains("COPY --from=build /out/lvms /usr/local/bin/lvms"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/lvms"]"#));
}

/// Renders a chart template with `namespace` and the chart's default image, as Helm would for the only
/// expressions the generated chart uses.
fn render_template(text: &str, namespace: &str, repository: &str, tag: &str) -> String {
    let out = text
        .replace("{{ .Release.Namespace }}", namespace)
        .replace("{{ .Values.image.repository }}", repository)
        .replace("{{ .Values.image.tag }}", tag);
    assert!(
        !out.contains("{{"),
        "a template expression this test does not model:\n{out}"
    );
    out
}

#[test]
fn the_helm_chart_holds_the_objects_of_the_kustomize_base() {
    let Some(rendered) = RENDERED.as_deref() else {
        eprintln!("skipped: kubectl is not on PATH (LVMS_REQUIRE_KUBECTL=1 makes this a failure)");
        return;
    };
    let chart = workspace().join("deploy/helm/lvms");
    let values: Value = serde_norway::from_str(
        &std::fs::read_to_string(chart.join("values.yaml")).expect("values.yaml"),
    )
    .expect("values.yaml parses");
    let (repository, tag) = (
        str_at(&values, "/image/repository"),
        str_at(&values, "/image/tag"),
    );
    let mut from_chart = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(chart.join("templates")).expect("templates/") {
        let path = entry.expect("an entry").path();
        let text = render_template(
            &std::fs::read_to_string(&path).expect("a template"),
            NAMESPACE,
            repository,
            tag,
        );
        for obj in parse_documents(&text, &path.display().to_string()) {
            assert!(
                from_chart.insert(describe(&obj), obj).is_none(),
                "{} twice",
                path.display()
            );
        }
    }
    let from_base: std::collections::BTreeMap<String, Value> =
        parse_documents(rendered, "`kubectl kustomize deploy/base`")
            .into_iter()
            .filter(|o| o["kind"] != "Namespace" && o["kind"] != "CustomResourceDefinition")
            .map(|o| (describe(&o), o))
            .collect();
    assert_eq!(
        from_chart.keys().collect::<Vec<_>>(),
        from_base.keys().collect::<Vec<_>>(),
        "regenerate the chart: cargo xtask helm"
    );
    for (key, obj) in &from_base {
        assert_eq!(
            &from_chart[key], obj,
            "{key} differs: regenerate the chart with cargo xtask helm"
        );
    }
    // The CRDs, unchanged.
    let crds = |dir: &Path| -> std::collections::BTreeMap<String, String> {
        std::fs::read_dir(dir)
            .expect("a CRD directory")
            .map(|e| e.expect("an entry").path())
            .filter(|p| {
                p.extension().is_some_and(|e| e == "yaml")
                    && p.file_name().is_some_and(|n| n != "kustomization.yaml")
            })
            .map(|p| {
                (
                    p.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned(),
                    std::fs::read_to_string(&p).expect("a CRD file"),
                )
            })
            .collect()
    };
    assert_eq!(
        crds(&chart.join("crds")),
        crds(&workspace().join("deploy/crds")),
        "regenerate the chart: cargo xtask helm"
    );
}

#[test]
fn the_sample_lvmclusters_pass_the_admission_rules() {
    for sample in ["lvmcluster.yaml", "lvmcluster-shared.yaml"] {
        let path = workspace().join("deploy/samples").join(sample);
        let cluster: lvms_api::LVMCluster =
            serde_norway::from_str(&std::fs::read_to_string(&path).expect("the sample exists"))
                .expect("the sample is an LVMCluster");
        assert_eq!(
            cluster.metadata.namespace.as_deref(),
            Some(NAMESPACE),
            "{sample}"
        );
        let review = lvms_core::webhook::validate_create(
            &cluster,
            &lvms_core::webhook::Context {
                operator_namespace: NAMESPACE.to_owned(),
                ..Default::default()
            },
        );
        assert!(review.errors.is_empty(), "{sample}: {:?}", review.errors);
        assert!(
            review.warnings.is_empty(),
            "{sample}: {:?}",
            review.warnings
        );
    }
}

#[test]
fn the_pod_monitors_select_the_pods_and_ports_that_serve_metrics() {
    let path = workspace().join("deploy/monitoring/podmonitors.yaml");
    let monitors = read_yaml(&path);
    let mut cluster: lvms_api::LVMCluster = serde_norway::from_str(
        &std::fs::read_to_string(workspace().join("deploy/samples/lvmcluster.yaml")).unwrap(),
    )
    .unwrap();
    // As the API server would have it.
    cluster.metadata.uid = Some("uid-1".into());
    let rendered = lvms_operator::render::render(
        &cluster,
        &lvms_operator::render::RenderConfig::new(NAMESPACE, "ghcr.io/lvms-rs/lvms:test"),
    )
    .expect("the sample renders");
    let daemon_set = serde_json::to_value(&rendered.daemon_set).unwrap();
    let pods = [("lvms-node", &daemon_set), ("lvms-operator", deployment())];
    for (name, workload) in pods {
        let monitor = monitors
            .iter()
            .find(|m| m["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("PodMonitor {name}"));
        let labels = at(workload, "/spec/template/metadata/labels");
        for (k, v) in at(monitor, "/spec/selector/matchLabels")
            .as_object()
            .unwrap()
        {
            assert_eq!(&labels[k], v, "{name}: pods lack {k}={v}");
        }
        let ports: Vec<&str> = at(workload, "/spec/template/spec/containers")
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .filter_map(|p| p["name"].as_str())
            .collect();
        for endpoint in at(monitor, "/spec/podMetricsEndpoints").as_array().unwrap() {
            let port = endpoint["port"].as_str().unwrap();
            assert!(ports.contains(&port), "{name}: no port {port} in {ports:?}");
        }
    }
}

/// `kubectl kustomize` of an overlay of `deploy/base` with `component`, written under the
/// workspace's `target/` (kustomize loads only paths below or beside an overlay, never absolute
/// ones); `None` without kubectl.
fn with_component(component: &str) -> Option<Vec<Value>> {
    let overlay = workspace().join(format!("target/manifests-{component}"));
    std::fs::create_dir_all(&overlay).expect("target/ is writable");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "resources: [../../deploy/base]\ncomponents: [../../deploy/components/{component}]\n"
        ),
    )
    .expect("writing the overlay");
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
    {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            assert!(!kubectl_required(), "LVMS_REQUIRE_KUBECTL=1 but no kubectl");
            return None;
        }
        other => other.expect("running kubectl"),
    };
    assert!(
        out.status.success(),
        "kustomize with {component}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(parse_documents(
        &String::from_utf8(out.stdout).expect("UTF-8"),
        component,
    ))
}

fn annotation<'a>(objects: &'a [Value], kind: &str, name: &str, key: &str) -> &'a Value {
    let obj = objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    &obj["metadata"]["annotations"][key]
}

fn self_signed_env(objects: &[Value]) -> &Value {
    let deploy = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the Deployment");
    let operator = deploy["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == "operator")
        .expect("the operator container");
    &env(operator, "LVMS_SELF_SIGNED_WEBHOOK_CERT")["value"]
}

#[test]
fn the_cert_manager_component_hands_the_certificate_and_its_injection_to_cert_manager() {
    let Some(objects) = with_component("cert-manager") else {
        return;
    };
    assert_eq!(self_signed_env(&objects), "false");
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", "lvms-validating-webhook"),
        ("MutatingWebhookConfiguration", "lvms-mutating-webhook"),
    ] {
        assert_eq!(
            annotation(&objects, kind, name, "cert-manager.io/inject-ca-from"),
            &format!("{NAMESPACE}/{WEBHOOK_CERT_SECRET}")
        );
    }
    let cert = objects
        .iter()
        .find(|o| o["kind"] == "Certificate")
        .expect("a Certificate");
    assert_eq!(cert["metadata"]["namespace"], NAMESPACE);
    assert_eq!(
        cert["metadata"]["name"], WEBHOOK_CERT_SECRET,
        "inject-ca-from names it"
    );
    assert_eq!(cert["spec"]["secretName"], WEBHOOK_CERT_SECRET);
    assert!(
        strings(&cert["spec"]["dnsNames"])
            .contains(&format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc").as_str())
    );
    let issuer = objects
        .iter()
        .find(|o| o["kind"] == "Issuer")
        .expect("an Issuer");
    assert_eq!(
        cert["spec"]["issuerRef"]["name"],
        issuer["metadata"]["name"]
    );
}

#[test]
fn the_openshift_component_hands_the_certificate_and_its_injection_to_the_service_ca() {
    let Some(objects) = with_component("openshift-service-ca") else {
        return;
    };
    assert_eq!(self_signed_env(&objects), "false");
    assert_eq!(
        annotation(
            &objects,
            "Service",
            WEBHOOK_SERVICE,
            "service.beta.openshift.io/serving-cert-secret-name"
        ),
        WEBHOOK_CERT_SECRET
    );
    for (kind, name) in [
        ("ValidatingWebhookConfiguration", "lvms-validating-webhook"),
        ("MutatingWebhookConfiguration", "lvms-mutating-webhook"),
    ] {
        assert_eq!(
            annotation(
                &objects,
                kind,
                name,
                "service.beta.openshift.io/inject-cabundle"
            ),
            "true"
        );
    }
}

#[test]
fn the_snapshot_metadata_component_runs_the_sidecar_beside_the_controller_with_one_certificate() {
    use lvms_operator::certificate::{
        SNAPSHOT_METADATA_PORT, SNAPSHOT_METADATA_SECRET, SNAPSHOT_METADATA_SERVICE,
    };
    let Some(objects) = with_component("snapshot-metadata") else {
        return;
    };
    let deploy = objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the Deployment");
    let pod = &deploy["spec"]["template"]["spec"];
    let container = |name: &str| {
        pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}"))
    };
    assert_eq!(
        env(container("operator"), "LVMS_SNAPSHOT_METADATA")["value"],
        "true"
    );
    let cert_dir = "/etc/lvms/snapshot-metadata-cert";
    assert_eq!(
        env(
            container("csi-controller"),
            "LVMS_SNAPSHOT_METADATA_CERT_DIR"
        )["value"],
        cert_dir
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == SNAPSHOT_METADATA_SECRET)
        .expect("a volume of the operator's Secret");
    assert_eq!(
        volume["secret"]["optional"], true,
        "the operator makes it after the pod starts"
    );
    let sidecar = container("csi-snapshot-metadata");
    for name in ["csi-controller", "csi-snapshot-metadata"] {
        let mounts = container(name)["volumeMounts"].as_array().unwrap().clone();
        assert!(
            mounts
                .iter()
                .any(|m| m["name"] == volume["name"] && m["mountPath"] == cert_dir),
            "{name} does not mount the certificate"
        );
    }
    let args = strings(&sidecar["args"]);
    for arg in [
        "--csi-address=/run/csi/csi.sock".to_owned(),
        format!("--tls-cert={cert_dir}/tls.crt"),
        format!("--tls-key={cert_dir}/tls.key"),
        // The operator's SnapshotMetadataService names the driver as the audience.
        format!("--audience={}", lvms_api::DEFAULT_DRIVER_NAME),
    ] {
        assert!(args.contains(&arg.as_str()), "{arg} not in {args:?}");
    }
    // Its HTTP endpoint takes no port another container of the pod listens on.
    let http = args
        .iter()
        .find_map(|a| a.strip_prefix("--http-endpoint=:"))
        .expect("an --http-endpoint (its default :8080 is the operator's metrics port)");
    let ports: Vec<i64> = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["containerPort"].as_i64().unwrap())
        .collect();
    assert!(
        !ports.contains(&http.parse().unwrap()),
        "{http} in {ports:?}"
    );
    // The Service the SnapshotMetadataService's default address names reaches the sidecar.
    let service = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == SNAPSHOT_METADATA_SERVICE)
        .expect("the sidecar's Service");
    let port = &service["spec"]["ports"][0];
    assert_eq!(port["port"], i64::from(SNAPSHOT_METADATA_PORT));
    let target = port["targetPort"].as_str().unwrap();
    assert!(
        sidecar["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == target
                && args.contains(&format!("--port={}", p["containerPort"]).as_str())),
        "the Service's {target} is not the sidecar's --port"
    );
    // The operator pod's account may publish the SnapshotMetadataService and check clients.
    let role = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole" && o["metadata"]["name"] == "lvms-snapshot-metadata")
        .expect("the component's ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    for (resource, verb) in [
        ("snapshotmetadataservices", "patch"),
        ("snapshotmetadataservices", "create"),
        ("tokenreviews", "create"),
        ("subjectaccessreviews", "create"),
    ] {
        assert!(
            rules
                .iter()
                .any(|r| strings(&r["resources"]).contains(&resource)
                    && strings(&r["verbs"]).contains(&verb)),
            "{verb} {resource}"
        );
    }
}
