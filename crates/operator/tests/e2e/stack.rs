//! lvms-rs installed on the control plane of `cargo xtask e2e` the way `deploy/base` installs it, its
//! pods' processes run as processes: `lvms operator`, `lvms csi-controller` and the real CSI sidecars
//! on this machine under the operator's ServiceAccount, the node agent (`lvms node`) inside the test
//! VM on real LVM under vg-manager's, reaching the API server over the VM's user-mode network.
//!
//! Kubelet's part that no kubelet plays here is done by [`Stack`]: the Node object with a Ready
//! condition and a renewed node Lease, and the CSINode with what the agent's `NodeGetInfo` answers.
//! The stack is started by the first test that asks for it and shared by the others, one at a time
//! (each holds the [`stack`] guard).
//!
//! It needs what the harness passes: `LVMS_E2E_LVMS` (the lvms binary), `LVMS_E2E_VM` (the VM's
//! command server), `LVMS_E2E_VM_SERVER` (the API server as the VM reaches it), `LVMS_K8S_ASSETS`
//! (the sidecars) and `LVMS_E2E_WORK` (scratch). Without them the stack tests are skipped.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{
    api::{
        authentication::v1::TokenRequest,
        coordination::v1::Lease,
        core::v1::{Node, ServiceAccount},
        storage::v1::CSINode,
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::{MicroTime, Time},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery,
};
use lvms_testkit::guest::Guest;
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use crate::support::{self, MANAGER, eventually};

/// The namespace `deploy/base` installs into.
pub const NAMESPACE: &str = "lvms-system";
/// The Node the VM plays.
pub const NODE: &str = "lvms-e2e-vm";
/// The VM's disk for the `LVMCluster`.
pub const DEVICE: &str = "/dev/disk/by-id/virtio-e2e0";
/// Where the agent's files live in the VM (a tmpfs).
const GUEST_DIR: &str = "/run/lvms-e2e";
/// The CSI driver name of `deploy/base`.
pub const DRIVER: &str = lvms_api::DEFAULT_DRIVER_NAME;
/// Real LVM in a TCG VM and the sidecars' polling take longer than API round trips.
pub const SLOW: Duration = Duration::from_secs(300);

/// The test VM's command server ([`lvms_testkit::guest`], the one client every test uses), called
/// off the runtime's threads.
#[derive(Clone)]
pub struct Vm {
    guest: Guest,
}

impl Vm {
    /// The command server at `addr` (`host:port`).
    pub fn new(addr: String) -> Self {
        Self {
            guest: Guest::new("the VM", addr),
        }
    }

    /// Runs `cmd` with `sh -c` in the VM; (exit code, stdout + stderr). A command that starts a
    /// daemon must redirect its output and stdin (`> log 2>&1 < /dev/null &`).
    pub async fn sh_with(&self, cmd: &str, stdin: &str) -> (i64, String) {
        let (guest, cmd, stdin) = (self.guest.clone(), cmd.to_owned(), stdin.to_owned());
        let ran = tokio::task::spawn_blocking(move || guest.sh_with(&cmd, &stdin))
            .await
            .unwrap();
        (ran.code, ran.output())
    }

    pub async fn sh(&self, cmd: &str) -> (i64, String) {
        self.sh_with(cmd, "").await
    }

    /// Runs `cmd` in the VM and panics unless it exits 0; its output.
    pub async fn ok(&self, cmd: &str) -> String {
        let (code, out) = self.sh(cmd).await;
        assert_eq!(code, 0, "in the VM, `{cmd}` failed: {out}");
        out
    }

    /// The names of the LVs in `vg`, sorted.
    pub async fn lvs(&self, vg: &str) -> Vec<String> {
        let out = self
            .ok(&format!(
                "lvm lvs --reportformat json -o lv_name {vg} 2>/dev/null"
            ))
            .await;
        let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        let mut names: Vec<String> = report["report"][0]["lv"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|lv| lv["lv_name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }
}

/// A process of the stack on this machine.
struct HostProcess {
    name: &'static str,
    command: Command,
    /// Arguments after the command's own, set by [`Stack::restart_with`].
    extra: Vec<String>,
    child: Option<Child>,
}

/// The running stack.
pub struct Stack {
    pub vm: Vm,
    pub work: PathBuf,
    /// The operator pod's containers, restarted when they exit (kubelet's `restartPolicy: Always`).
    processes: Arc<std::sync::Mutex<Vec<HostProcess>>>,
    lvms: PathBuf,
    guest_kubeconfig: String,
    /// The operator's `/metrics` port.
    pub operator_metrics: u16,
    /// The CSI controller's `/metrics` port.
    pub controller_metrics: u16,
    /// The agent's flags for changed-block tracking (its certificate, and the address the
    /// controller dials: the VM's forwarded port), when the harness forwards one.
    agent_metadata_args: String,
}

/// Waits for the Secret `name` of the namespace and writes its keys as files into `dir`, as
/// kubelet's secret volume would.
async fn mount_secret(client: &Client, name: &str, dir: &Path) {
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NAMESPACE);
    let secret = eventually(
        &format!("the operator makes the Secret {name}"),
        SLOW,
        || {
            let secrets = secrets.clone();
            async move {
                secrets
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?
                    .and_then(|s| s.data)
                    .filter(|d| d.contains_key("tls.crt"))
                    .ok_or_else(|| "not yet".to_owned())
            }
        },
    )
    .await;
    for (key, value) in secret {
        std::fs::write(dir.join(key), value.0).unwrap();
    }
}

static STACK: Mutex<Option<Stack>> = Mutex::const_new(None);

/// The harness's settings, when it runs the stack.
struct Env {
    lvms: PathBuf,
    vm: String,
    vm_server: String,
    assets: PathBuf,
    work: PathBuf,
    /// Host loopback address of the VM's changed-block tracking port.
    vm_metadata: Option<String>,
}

fn env() -> Option<Env> {
    let var = |k: &str| std::env::var_os(k).map(PathBuf::from);
    Some(Env {
        lvms: var("LVMS_E2E_LVMS")?,
        vm: std::env::var("LVMS_E2E_VM").ok()?,
        vm_server: std::env::var("LVMS_E2E_VM_SERVER").ok()?,
        assets: var("LVMS_K8S_ASSETS")?,
        work: var("LVMS_E2E_WORK")?,
        vm_metadata: std::env::var("LVMS_E2E_VM_METADATA").ok(),
    })
}

/// The stack, started on first use; `None` (the test is skipped) outside `cargo xtask e2e`. The
/// guard serialises the tests that use it.
pub async fn stack(test: &str) -> Option<MutexGuard<'static, Option<Stack>>> {
    if !support::enabled(test) {
        return None;
    }
    let Some(env) = env() else {
        eprintln!(
            "{test}: skipped (run by `cargo xtask e2e`, which starts the node VM and passes \
             LVMS_E2E_LVMS, LVMS_E2E_VM, LVMS_E2E_VM_SERVER, LVMS_K8S_ASSETS and LVMS_E2E_WORK)"
        );
        return None;
    };
    let mut guard = STACK.lock().await;
    if guard.is_none() {
        *guard = Some(Stack::start(env).await);
    }
    Some(guard)
}

/// A free port on loopback.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Server-side applies a manifest of any kind, found by discovery.
pub(crate) async fn apply(client: &Client, obj: &Value) {
    let api_version = obj["apiVersion"].as_str().unwrap();
    let kind = obj["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {api_version} {kind}: {e}"));
    let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
    let api: Api<DynamicObject> = match obj["metadata"]["namespace"].as_str() {
        Some(ns) if caps.scope == discovery::Scope::Namespaced => {
            Api::namespaced_with(client.clone(), ns, &resource)
        }
        _ => Api::all_with(client.clone(), &resource),
    };
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .unwrap_or_else(|e| panic!("the API server refused {kind} {name}: {e}"));
}

/// The YAML documents of a file.
pub(crate) fn documents(path: &Path) -> Vec<Value> {
    use serde::Deserialize as _;
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// A kubeconfig for `server` with a bearer token, trusting `ca_pem`.
pub(crate) fn token_kubeconfig(server: &str, ca_pem: &[u8], token: &str) -> String {
    use base64::Engine as _;
    json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca_pem),
        }}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "sa"}}],
        "current-context": "e2e",
    })
    .to_string()
}

/// A token of ServiceAccount `name` in `namespace`, valid for two hours.
pub(crate) async fn token(client: &Client, namespace: &str, name: &str) -> String {
    let req: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 7200}
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("a token for ServiceAccount {name}: {e}"))
        .status
        .unwrap()
        .token
        .unwrap()
}

impl Stack {
    async fn start(env: Env) -> Self {
        let client = support::client().await;
        let work = env.work.clone();
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(work.join("logs")).unwrap();
        let vm = Vm::new(env.vm);

        // CRDs: lvms-rs's and the VolumeSnapshot ones.
        support::install_crds(&client).await;
        let crds = Api::<CustomResourceDefinition>::all(client.clone());
        for entry in std::fs::read_dir(env.assets.join("crds")).unwrap() {
            for doc in documents(&entry.unwrap().path()) {
                let crd: CustomResourceDefinition = serde_json::from_value(doc).unwrap();
                crds.patch(
                    &crd.name_any(),
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&crd),
                )
                .await
                .unwrap_or_else(|e| panic!("the API server refused CRD {}: {e}", crd.name_any()));
            }
        }

        // deploy/base but the operator's Deployment (its containers run below as processes); the
        // webhooks point at the operator on loopback by URL, trusting a CA made here. They judge
        // only lvms-system's LVMClusters: the other e2e tests run operators of their own, each
        // with its LVMCluster in its own namespace, which this webhook would rightly refuse.
        let webhook_port = free_port();
        let cert_dir = work.join("webhook-cert");
        std::fs::create_dir_all(&cert_dir).unwrap();
        let pair = lvms_operator::certificate::generate_for(&["127.0.0.1".to_owned()], "127.0.0.1")
            .unwrap();
        std::fs::write(cert_dir.join("tls.crt"), &pair.cert_pem).unwrap();
        std::fs::write(cert_dir.join("tls.key"), &pair.key_pem).unwrap();
        let ca_bundle = {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.encode(&pair.ca_pem)
        };
        let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base");
        for file in [
            "namespace.yaml",
            "service-accounts.yaml",
            "rbac.yaml",
            "node-rbac.yaml",
            "csi-controller-rbac.yaml",
            "webhook-service.yaml",
            "webhooks.yaml",
        ] {
            for mut doc in documents(&base.join(file)) {
                if let Some(hooks) = doc.get_mut("webhooks").and_then(Value::as_array_mut) {
                    for hook in hooks {
                        let path = hook["clientConfig"]["service"]["path"]
                            .as_str()
                            .unwrap()
                            .to_owned();
                        hook["namespaceSelector"] = json!({
                            "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE},
                        });
                        hook["clientConfig"] = json!({
                            "url": format!("https://127.0.0.1:{webhook_port}{path}"),
                            "caBundle": ca_bundle,
                        });
                    }
                }
                apply(&client, &doc).await;
            }
        }

        // Credentials of the pods' ServiceAccounts.
        let admin = kube::config::Kubeconfig::read().unwrap();
        let cluster = admin.clusters[0].cluster.as_ref().unwrap();
        let server = cluster.server.clone().unwrap();
        let ca_pem = std::fs::read(cluster.certificate_authority.as_ref().unwrap()).unwrap();
        let operator_kubeconfig = work.join("operator.kubeconfig");
        std::fs::write(
            &operator_kubeconfig,
            token_kubeconfig(
                &server,
                &ca_pem,
                &token(&client, NAMESPACE, "lvms-operator").await,
            ),
        )
        .unwrap();
        let guest_kubeconfig = token_kubeconfig(
            &env.vm_server,
            &ca_pem,
            &token(&client, NAMESPACE, "vg-manager").await,
        );

        // Changed-block tracking (ADR 0039), as deploy/components/snapshot-metadata sets it up:
        // its RBAC; the operator makes the Secret (for the sidecar's address on loopback too) and
        // the SnapshotMetadataService; its files are written below where the pods would mount it.
        let metadata_cert = work.join("snapshot-metadata-cert");
        std::fs::create_dir_all(&metadata_cert).unwrap();
        let sidecar_port = free_port();
        if env.vm_metadata.is_some() {
            let component = base.join("../components/snapshot-metadata/rbac.yaml");
            for doc in documents(&component) {
                apply(&client, &doc).await;
            }
        }

        // The operator pod's containers.
        let socket = work.join("csi/csi.sock");
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let sock = socket.display().to_string();
        let operator_metrics = free_port();
        let controller_metrics = free_port();
        let mut processes = Vec::new();
        let lvms = |args: &[String]| {
            let mut c = Command::new(&env.lvms);
            c.args(args)
                .env("KUBECONFIG", &operator_kubeconfig)
                .env("NAMESPACE", NAMESPACE)
                .env("LVMS_LOG", "info");
            c
        };
        let mut operator_args = vec![
            "operator".into(),
            "--image=ghcr.io/lvms-rs/lvms:e2e".into(),
            format!("--webhook-cert-dir={}", cert_dir.display()),
            format!("--webhook-port={webhook_port}"),
            format!("--metrics-port={operator_metrics}"),
        ];
        if env.vm_metadata.is_some() {
            operator_args.push("--snapshot-metadata".into());
            operator_args.push(format!(
                "--snapshot-metadata-address=127.0.0.1:{sidecar_port}"
            ));
        }
        processes.push(HostProcess::new("operator", lvms(&operator_args)));
        let mut controller_args = vec![
            "csi-controller".into(),
            format!("--endpoint=unix://{sock}"),
            format!("--metrics-port={controller_metrics}"),
        ];
        if env.vm_metadata.is_some() {
            controller_args.push(format!(
                "--snapshot-metadata-cert-dir={}",
                metadata_cert.display()
            ));
        }
        processes.push(HostProcess::new("csi-controller", lvms(&controller_args)));
        let sidecar = |name: &str, args: &[&str]| {
            let mut c = Command::new(env.assets.join(name));
            c.arg(format!("--csi-address={sock}"))
                .arg(format!("--kubeconfig={}", operator_kubeconfig.display()))
                .arg("--leader-election=false")
                .args(args)
                .env("NAMESPACE", NAMESPACE)
                .env("POD_NAME", "lvms-operator-e2e");
            c
        };
        processes.push(HostProcess::new(
            "csi-provisioner",
            sidecar(
                "csi-provisioner",
                &[
                    "--enable-capacity",
                    // No pod owns the capacity objects here.
                    "--capacity-ownerref-level=-1",
                    "--capacity-poll-interval=10s",
                    "--strict-topology",
                    "--extra-create-metadata",
                    "--timeout=120s",
                ],
            ),
        ));
        processes.push(HostProcess::new(
            "csi-resizer",
            sidecar("csi-resizer", &["--timeout=120s"]),
        ));
        processes.push(HostProcess::new(
            "csi-snapshotter",
            sidecar(
                "csi-snapshotter",
                &["--extra-create-metadata", "--timeout=120s"],
            ),
        ));
        if env.vm_metadata.is_some() {
            // The sidecar has no leader election: one per controller pod.
            let mut c = Command::new(env.assets.join("csi-snapshot-metadata"));
            c.arg(format!("--csi-address={sock}"))
                .arg(format!("--kubeconfig={}", operator_kubeconfig.display()))
                .arg(format!(
                    "--tls-cert={}",
                    metadata_cert.join("tls.crt").display()
                ))
                .arg(format!(
                    "--tls-key={}",
                    metadata_cert.join("tls.key").display()
                ))
                .arg(format!("--port={sidecar_port}"))
                .arg(format!("--audience={DRIVER}"))
                .arg(format!("--http-endpoint=127.0.0.1:{}", free_port()));
            processes.push(HostProcess::new("csi-snapshot-metadata", c));
        }
        let mut snapshot_controller = Command::new(env.assets.join("snapshot-controller"));
        snapshot_controller
            .arg(format!(
                "--kubeconfig={}",
                std::env::var("KUBECONFIG").unwrap()
            ))
            .arg("--leader-election=false");
        processes.push(HostProcess::new("snapshot-controller", snapshot_controller));

        // The operator first: the others mount what it makes.
        processes[0].start(&work);
        if env.vm_metadata.is_some() {
            mount_secret(
                &client,
                lvms_operator::certificate::SNAPSHOT_METADATA_SECRET,
                &metadata_cert,
            )
            .await;
        }
        for p in processes.iter_mut().skip(1) {
            p.start(&work);
        }
        let processes = Arc::new(std::sync::Mutex::new(processes));
        std::thread::spawn({
            let processes = Arc::downgrade(&processes);
            let work = work.clone();
            move || supervise(&processes, &work)
        });
        let mut stack = Self {
            vm,
            work,
            processes,
            lvms: env.lvms.clone(),
            guest_kubeconfig,
            operator_metrics,
            controller_metrics,
            agent_metadata_args: env
                .vm_metadata
                .as_ref()
                .map(|address| {
                    format!(
                        "--snapshot-metadata-cert-dir {} --snapshot-metadata-address {address}",
                        metadata_cert.display()
                    )
                })
                .unwrap_or_default(),
        };
        stack.wait_operator_ready().await;

        std::thread::spawn(heartbeat);
        stack.register_kubelet(&client).await;
        stack
    }

    /// Kubelet's part: the Node (Ready), then the agent, then the CSINode from its NodeGetInfo. Run
    /// again after the Node was deleted, it is the machine joining again.
    pub async fn register_kubelet(&self, client: &Client) {
        register_node(client).await;
        self.start_agent().await;
        self.register_driver(client).await;
    }

    /// Kubelet's plugin registration: the agent's `NodeGetInfo` becomes the Node's topology labels
    /// and the CSINode's driver entry; its topology is returned. Kubelet asks only when the driver
    /// registers, so a topology that changed later (a shared class joined or left, ADR 0016) reaches
    /// the API when this runs again, as after the plugin's deregistration and registration.
    pub async fn register_driver(&self, client: &Client) -> BTreeMap<String, String> {
        let info = self.node_info().await;
        let node_id = info["node_id"].as_str().unwrap().to_owned();
        let topology: BTreeMap<String, String> =
            serde_json::from_value(info["topology"].clone()).unwrap();
        let labels: BTreeMap<String, String> = topology.clone();
        Api::<Node>::all(client.clone())
            .patch(
                NODE,
                &PatchParams::apply("lvms-e2e-kubelet").force(),
                &Patch::Apply(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": NODE, "labels": labels},
                })),
            )
            .await
            .unwrap();
        let csi_node: CSINode = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
            "metadata": {"name": NODE},
            "spec": {"drivers": [{
                "name": DRIVER, "nodeID": node_id,
                "topologyKeys": topology.keys().collect::<Vec<_>>(),
            }]},
        }))
        .unwrap();
        let csi_nodes = Api::<CSINode>::all(client.clone());
        // A driver's entry cannot change in place (the API server says "field is immutable"):
        // kubelet removes it when the plugin goes and adds it when it registers again.
        let changed = csi_nodes.get_opt(NODE).await.unwrap().is_some_and(|old| {
            old.spec
                .drivers
                .iter()
                .any(|d| d.name == DRIVER && *d != csi_node.spec.drivers[0])
        });
        if changed {
            csi_nodes
                .patch(
                    NODE,
                    &PatchParams::apply("lvms-e2e-kubelet").force(),
                    &Patch::Apply(json!({
                        "apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                        "metadata": {"name": NODE}, "spec": {"drivers": []},
                    })),
                )
                .await
                .unwrap_or_else(|e| panic!("removing the driver from the CSINode: {e}"));
        }
        csi_nodes
            .patch(
                NODE,
                &PatchParams::apply("lvms-e2e-kubelet").force(),
                &Patch::Apply(&csi_node),
            )
            .await
            .unwrap_or_else(|e| panic!("the API server refused the CSINode: {e}"));
        topology
    }

    /// Waits for the operator's `/readyz`, as the pod's readinessProbe does.
    async fn wait_operator_ready(&mut self) {
        let port = self.operator_metrics;
        eventually("the operator's /readyz answers 200", SLOW, || async move {
            let out = tokio::process::Command::new("curl")
                .args(["-s", "-o", "/dev/null", "-w", "%{http_code}"])
                .arg(format!("http://127.0.0.1:{port}/readyz"))
                .output()
                .await
                .map_err(|e| e.to_string())?;
            let code = String::from_utf8_lossy(&out.stdout).to_string();
            (code == "200").then_some(()).ok_or(code)
        })
        .await;
    }

    /// Kills the host process `name` (`operator`, `csi-controller`, a sidecar) with SIGKILL and
    /// starts it again, as a crashed container is restarted.
    pub fn kill_and_restart(&mut self, name: &str) {
        let mut processes = self.processes.lock().unwrap();
        let p = processes
            .iter_mut()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no process {name}"));
        if let Some(mut child) = p.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        p.start(&self.work);
    }

    /// The pid of the host process `name`, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        let processes = self.processes.lock().unwrap();
        processes
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.child.as_ref())
            .map(Child::id)
    }

    /// Restarts the host process `name` with `extra` after its usual arguments (none: as it was
    /// started), as a Deployment rolled out with new flags.
    pub fn restart_with(&mut self, name: &str, extra: &[&str]) {
        {
            let mut processes = self.processes.lock().unwrap();
            let p = processes
                .iter_mut()
                .find(|p| p.name == name)
                .unwrap_or_else(|| panic!("no process {name}"));
            p.extra = extra.iter().map(|&a| a.to_owned()).collect();
        }
        self.kill_and_restart(name);
    }

    /// Kills the VM's node agent with SIGKILL, if one runs (as a crashed container).
    pub async fn kill_agent(&self) {
        // The bracket keeps pkill from matching this command's own shell.
        self.vm
            .sh("pkill -9 -f '[ ]node --metrics-port 8081'; \
                 while pgrep -f '[ ]node --metrics-port 8081' >/dev/null; do sleep 0.2; done")
            .await;
    }

    /// Starts `lvms node` in the VM (the DaemonSet pod's container), replacing one that runs.
    pub async fn start_agent(&self) {
        self.start_agent_with(&[]).await;
    }

    /// [`Self::start_agent`] with `extra` arguments after the usual ones.
    pub async fn start_agent_with(&self, extra: &[&str]) {
        self.kill_agent().await;
        let (code, out) = self
            .vm
            .sh_with(
                &format!("mkdir -p {GUEST_DIR} && cat > {GUEST_DIR}/kubeconfig"),
                &self.guest_kubeconfig,
            )
            .await;
        assert_eq!(code, 0, "{out}");
        self.vm
            .ok(&format!(
                "cd {GUEST_DIR} && NODE_NAME={NODE} NAMESPACE={NAMESPACE} \
                 KUBECONFIG={GUEST_DIR}/kubeconfig CSI_ENDPOINT=unix://{GUEST_DIR}/csi.sock \
                 RUST_LOG=info setsid {} node --metrics-port 8081 {} {} >> {GUEST_DIR}/node.log 2>&1 \
                 < /dev/null &",
                self.lvms.display(),
                self.agent_metadata_args,
                extra.join(" ")
            ))
            .await;
    }

    /// The agent's `NodeGetInfo`, once its socket answers.
    async fn node_info(&self) -> Value {
        let vm = self.vm.clone();
        let cmd = format!(
            "{} csi --endpoint {GUEST_DIR}/csi.sock --output json node-info",
            self.lvms.display()
        );
        eventually("the node agent answers NodeGetInfo", SLOW, || {
            let vm = vm.clone();
            let cmd = cmd.clone();
            async move {
                let (code, out) = vm.sh(&cmd).await;
                if code != 0 {
                    return Err(out);
                }
                serde_json::from_str::<Value>(&out).map_err(|e| format!("{e}: {out}"))
            }
        })
        .await
    }

    /// The last lines of the agent's log in the VM.
    pub async fn agent_log(&self) -> String {
        self.vm
            .sh(&format!("tail -n 40 {GUEST_DIR}/node.log"))
            .await
            .1
    }
}

impl HostProcess {
    fn new(name: &'static str, command: Command) -> Self {
        Self {
            name,
            command,
            extra: Vec::new(),
            child: None,
        }
    }

    fn start(&mut self, work: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(work.join("logs").join(format!("{}.log", self.name)))
            .unwrap();
        let mut command = Command::new(self.command.get_program());
        command.args(self.command.get_args()).args(&self.extra);
        for (key, value) in self.command.get_envs() {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.name));
        self.child = Some(child);
    }
}

/// Restarts whichever process exited (the sidecars exit when they lose the CSI socket, as when
/// the CSI controller is killed), once a second, until the stack is gone.
fn supervise(processes: &std::sync::Weak<std::sync::Mutex<Vec<HostProcess>>>, work: &Path) {
    while let Some(processes) = processes.upgrade() {
        for p in processes.lock().unwrap().iter_mut() {
            let exited = p
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                eprintln!("e2e stack: {} exited; restarting it", p.name);
                p.start(work);
            }
        }
        drop(processes);
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Creates the Node the VM plays, Ready, with what a 2-CPU kubelet would report.
async fn register_node(client: &Client) {
    let nodes = Api::<Node>::all(client.clone());
    nodes
        .patch(
            NODE,
            &PatchParams::apply("lvms-e2e-kubelet").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "labels": {
                    "kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux",
                    support::E2E_LABEL: "true",
                }},
            })),
        )
        .await
        .unwrap();
    set_node_ready(client)
        .await
        .unwrap_or_else(|e| panic!("writing the Node's status: {e}"));
}

/// Writes the Node's Ready condition; fails while the Node does not exist (deleted by a test).
async fn set_node_ready(client: &Client) -> Result<Node, kube::Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let capacity = json!({"cpu": "2", "memory": "2Gi", "pods": "110"});
    Api::<Node>::all(client.clone())
        .patch_status(
            NODE,
            &PatchParams::apply("lvms-e2e-kubelet").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE},
                "status": {
                    "capacity": capacity, "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "message": "played by the e2e harness",
                                    "lastHeartbeatTime": now, "lastTransitionTime": now}],
                },
            })),
        )
        .await
}

/// Renews the node's Lease and Ready condition every 10 s, as kubelet does (while the Node exists), on a runtime of its own
/// (the tests' runtimes come and go).
fn heartbeat() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = support::client().await;
        let leases = Api::<Lease>::namespaced(client.clone(), "kube-node-lease");
        loop {
            let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
            let _ = leases
                .patch(
                    NODE,
                    &PatchParams::apply("lvms-e2e-kubelet").force(),
                    &Patch::Apply(json!({
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": NODE, "namespace": "kube-node-lease"},
                        "spec": {"holderIdentity": NODE, "leaseDurationSeconds": 40,
                                 "renewTime": now},
                    })),
                )
                .await;
            let _ = set_node_ready(&client).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
    });
}

/// The `ApiResource` of a kind served by the API server (for objects without Rust types).
pub async fn resource(client: &Client, group: &str, version: &str, kind: &str) -> ApiResource {
    discovery::pinned_kind(client, &GroupVersionKind::gvk(group, version, kind))
        .await
        .unwrap_or_else(|e| panic!("discovering {group}/{version} {kind}: {e}"))
        .0
}
