//! Two replicas of the real `lvms operator` binary, with the operator's ServiceAccount and the RBAC
//! of `deploy/base`, on the real API server: one leads (Lease `lvms-operator`), the other stands by
//! serving only its webhook and probes; a leader stopped gracefully hands the Lease back and is
//! replaced at once; a restarted replica stands by; the leader killed mid-deletion (waiting for a
//! node's cleanup) is replaced within the Lease's duration, and the new one finishes the deletion.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    coordination::v1::Lease, core::v1::ServiceAccount, rbac::v1::ClusterRoleBinding,
    storage::v1::StorageClass,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use lvms_api::{LVMCluster, LVMVolumeGroup, LVMVolumeGroupNodeStatus};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{
    stack::{apply, documents, free_port, token, token_kubeconfig},
    support::{self, TestNamespace, WAIT, eventually},
};

/// One replica of `lvms operator`: the process, its ports and log.
pub(crate) struct Replica {
    pub name: String,
    command: Command,
    metrics: u16,
    pub webhook: u16,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Replica {
    /// Replica `name` in namespace `ns`, its webhook certificate in `work/cert`, its kubeconfig
    /// `work/operator.kubeconfig` ([`operator_account`]), with `extra` arguments.
    pub fn new(
        lvms: &Path,
        work: &Path,
        name: &str,
        ns: &str,
        driver: &str,
        extra: &[String],
    ) -> Self {
        let (metrics, webhook) = (free_port(), free_port());
        let mut command = Command::new(lvms);
        command
            .args([
                "operator".to_owned(),
                "--image=ghcr.io/lvms-rs/lvms:e2e".to_owned(),
                format!("--driver-name={driver}"),
                format!("--webhook-cert-dir={}", work.join("cert").display()),
                format!("--webhook-port={webhook}"),
                format!("--metrics-port={metrics}"),
            ])
            .args(extra)
            .env("KUBECONFIG", work.join("operator.kubeconfig"))
            .env("NAMESPACE", ns)
            .env("POD_NAME", name)
            .env("LVMS_LOG", "info");
        Self {
            name: name.to_owned(),
            command,
            metrics,
            webhook,
            log: work.join(format!("{name}.log")),
            child: None,
        }
    }

    /// Starts (or restarts, as kubelet restarts a container) the process.
    pub fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.child = Some(
            self.command
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL: nothing is handed back.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then its exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        c.wait().unwrap()
    }

    async fn get(&self, path: &str) -> Result<String, String> {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics))
            .await
            .map_err(|e| e.to_string())?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out)
            .await
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    /// `lvms_operator_leader`'s value, once `/readyz` answers 200.
    async fn ready_and_leading(&self) -> Result<bool, String> {
        let ready = self.get("/readyz").await?;
        if !ready.starts_with("HTTP/1.0 200") && !ready.starts_with("HTTP/1.1 200") {
            return Err(format!("{} not ready: {ready}", self.name));
        }
        let metrics = self.get("/metrics").await?;
        Ok(metrics.lines().any(|l| l == "lvms_operator_leader 1"))
    }

    /// The LVMCluster reconciles this replica counted.
    async fn reconciles(&self) -> Result<u64, String> {
        self.reconciles_with("").await
    }

    /// The LVMCluster reconciles this replica counted that succeeded.
    pub async fn successful_reconciles(&self) -> Result<u64, String> {
        self.reconciles_with("result=\"success\"").await
    }

    /// The LVMCluster reconciles whose labels contain `labels`.
    async fn reconciles_with(&self, labels: &str) -> Result<u64, String> {
        let metrics = self.get("/metrics").await?;
        Ok(metrics
            .lines()
            .filter(|l| l.starts_with("lvms_operator_reconciles_total{controller=\"lvmcluster\""))
            .filter(|l| {
                l.split(' ')
                    .next()
                    .is_some_and(|name| name.contains(labels))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum())
    }

    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The ServiceAccount `lvms-operator` in `ns`, bound to `deploy/base`'s roles for the operator's
/// pod (the operator's and the CSI controller's), as the installation binds them in lvms-system;
/// returns the ClusterRoleBindings made (to delete).
pub(crate) async fn operator_account(client: &Client, ns: &str) -> Vec<String> {
    let mut bindings = Vec::new();
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "lvms-operator"}})).unwrap(),
        )
        .await
        .unwrap();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base");
    for file in ["rbac.yaml", "csi-controller-rbac.yaml"] {
        for mut doc in documents(&base.join(file)) {
            let kind = doc["kind"].as_str().unwrap().to_owned();
            match kind.as_str() {
                "Role" | "RoleBinding" => doc["metadata"]["namespace"] = json!(ns),
                // Bound under a name of this test's, to this test's account.
                "ClusterRoleBinding" => {
                    let name = format!("{}-{ns}", doc["metadata"]["name"].as_str().unwrap());
                    doc["metadata"]["name"] = json!(name);
                    bindings.push(name);
                }
                _ => {}
            }
            if let Some(subjects) = doc.get_mut("subjects").and_then(Value::as_array_mut) {
                for s in subjects {
                    s["namespace"] = json!(ns);
                }
            }
            apply(client, &doc).await;
        }
    }
    bindings
}

/// `work/operator.kubeconfig`: the API server, with a token of `ns`'s `lvms-operator`.
pub(crate) async fn write_operator_kubeconfig(client: &Client, ns: &str, work: &Path) {
    let admin = kube::config::Kubeconfig::read().unwrap();
    let cluster = admin.clusters[0].cluster.as_ref().unwrap();
    let ca_pem = std::fs::read(cluster.certificate_authority.as_ref().unwrap()).unwrap();
    std::fs::write(
        work.join("operator.kubeconfig"),
        token_kubeconfig(
            cluster.server.as_ref().unwrap(),
            &ca_pem,
            &token(client, ns, "lvms-operator").await,
        ),
    )
    .unwrap();
}

/// What a test of `lvms operator` processes starts from: the binary, a namespace with the
/// operator's ServiceAccount and RBAC ([`operator_account`]), and a work directory holding its
/// kubeconfig; `None` (the test skipped) outside `cargo xtask e2e`.
pub(crate) struct OperatorSetup {
    pub lvms: PathBuf,
    pub client: Client,
    pub sfx: String,
    pub ns: TestNamespace,
    pub work: PathBuf,
    bindings: Vec<String>,
}

impl OperatorSetup {
    pub async fn new(test: &str, prefix: &str) -> Option<Self> {
        if !support::enabled(test) {
            return None;
        }
        let Some(lvms) = std::env::var_os("LVMS_E2E_LVMS").map(PathBuf::from) else {
            eprintln!("{test}: skipped (needs LVMS_E2E_LVMS, the lvms binary: `cargo xtask e2e`)");
            return None;
        };
        let client = support::client().await;
        support::install_crds(&client).await;
        let sfx = support::suffix();
        let ns = TestNamespace::create(&client, &format!("lvms-e2e-{prefix}-{sfx}"), &[]).await;
        let work = std::env::var_os("LVMS_E2E_WORK")
            .map_or_else(std::env::temp_dir, PathBuf::from)
            .join(format!("{prefix}-{sfx}"));
        std::fs::create_dir_all(work.join("cert")).unwrap();
        let bindings = operator_account(&client, &ns.name).await;
        write_operator_kubeconfig(&client, &ns.name, &work).await;
        Some(Self {
            lvms,
            client,
            sfx,
            ns,
            work,
            bindings,
        })
    }

    /// Deletes the ClusterRoleBindings and the namespace.
    pub async fn delete(self) {
        let crbs = Api::<ClusterRoleBinding>::all(self.client.clone());
        for b in &self.bindings {
            let _ = crbs.delete(b, &DeleteParams::default()).await;
        }
        self.ns.delete().await;
    }
}

/// Waits until `who` holds the leader Lease; its `leaseTransitions` then.
async fn wait_leader(leases: &Api<Lease>, who: &str) -> i32 {
    eventually(&format!("{who} leads"), WAIT, || async {
        let (h, t) = holder(leases).await?;
        (h == who).then_some(t).ok_or(format!("held by {h:?}"))
    })
    .await
}

async fn holder(leases: &Api<Lease>) -> Result<(String, i32), String> {
    let lease = leases
        .get_opt(lvms_operator::LEADER_LEASE)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no Lease yet")?;
    let spec = lease.spec.unwrap_or_default();
    Ok((
        spec.holder_identity.unwrap_or_default(),
        spec.lease_transitions.unwrap_or_default(),
    ))
}

#[tokio::test]
async fn of_two_operator_replicas_one_leads_and_the_other_takes_over_when_it_dies_or_stops() {
    let Some(setup) = OperatorSetup::new(
        "of_two_operator_replicas_one_leads_and_the_other_takes_over_when_it_dies_or_stops",
        "ha",
    )
    .await
    else {
        return;
    };
    let (client, sfx, ns, work) = (&setup.client, &setup.sfx, &setup.ns, &setup.work);
    let pair =
        lvms_operator::certificate::generate_for(&["127.0.0.1".to_owned()], "127.0.0.1").unwrap();
    std::fs::write(work.join("cert/tls.crt"), &pair.cert_pem).unwrap();
    std::fs::write(work.join("cert/tls.key"), &pair.key_pem).unwrap();

    let driver = format!("{sfx}.ha.topolvm.io");
    let mut replicas = [
        Replica::new(&setup.lvms, work, "replica-a", &ns.name, &driver, &[]),
        Replica::new(&setup.lvms, work, "replica-b", &ns.name, &driver, &[]),
    ];
    for r in &mut replicas {
        r.start();
    }
    let leases = Api::<Lease>::namespaced(client.clone(), &ns.name);
    let (first, _) = eventually("one replica leads", WAIT, || async {
        holder(&leases).await.and_then(|(h, t)| {
            if h.is_empty() {
                Err("nobody".into())
            } else {
                Ok((h, t))
            }
        })
    })
    .await;
    let (leader, standby) = if first == "replica-a" { (0, 1) } else { (1, 0) };
    // Both are ready (both serve the webhook); only the leader says it leads.
    for (i, leads) in [(leader, true), (standby, false)] {
        let r = &replicas[i];
        let seen = eventually(&format!("{} ready", r.name), WAIT, || r.ready_and_leading()).await;
        assert_eq!(seen, leads, "{}: {}", r.name, r.tail());
    }

    // An LVMCluster, made Ready by the leader from the nodes' statuses.
    let pool = format!("ha-{sfx}");
    let nodes = [
        format!("lvms-e2e-{sfx}-ha-a"),
        format!("lvms-e2e-{sfx}-ha-b"),
    ];
    for n in &nodes {
        support::create_node(client, n, &[("lvms-e2e/pool", &pool)]).await;
    }
    let classes = [format!("t{sfx}"), format!("k{sfx}")];
    let selector = json!({"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "lvms-e2e/pool", "operator": "In", "values": [pool]}
    ]}]});
    let lvmcluster: LVMCluster = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1",
        "kind": "LVMCluster",
        "metadata": {"name": "ha", "namespace": ns.name},
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "storage": {"deviceClasses": [
                {"name": classes[0], "default": true, "nodeSelector": selector,
                 "deviceSelector": {"paths": ["/dev/sdb"]},
                 "thinPoolConfig": {"name": "thin-pool-1", "overprovisionRatio": 10}},
                {"name": classes[1], "nodeSelector": selector,
                 "deviceSelector": {"paths": ["/dev/sdc"]}}
            ]}
        }
    }))
    .unwrap();
    let clusters = Api::<LVMCluster>::namespaced(client.clone(), &ns.name);
    let vgs = Api::<LVMVolumeGroup>::namespaced(client.clone(), &ns.name);
    let scs = Api::<StorageClass>::all(client.clone());
    let standby_reconciles = replicas[standby].reconciles().await.unwrap();
    clusters
        .create(&PostParams::default(), &lvmcluster)
        .await
        .unwrap();
    let statuses = Api::<LVMVolumeGroupNodeStatus>::namespaced(client.clone(), &ns.name);
    for node in &nodes {
        let status: Value = json!({
            "apiVersion": "lvm.topolvm.io/v1alpha1",
            "kind": "LVMVolumeGroupNodeStatus",
            "metadata": {"name": node, "namespace": ns.name},
            "spec": {"nodeStatus": classes.iter().map(|class| json!({
                "name": class, "status": "Ready", "devices": ["/dev/sdb"],
                "deviceDiscoveryPolicy": "RuntimeStatic",
            })).collect::<Vec<_>>()},
        });
        statuses
            .create(
                &PostParams::default(),
                &serde_json::from_value(status).unwrap(),
            )
            .await
            .unwrap();
    }
    support::wait_cluster_ready(&clusters, "ha", WAIT).await;
    for class in &classes {
        assert!(
            scs.get_opt(&format!("lvms-{class}"))
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(
        replicas[standby].reconciles().await.unwrap(),
        standby_reconciles,
        "the standby reconciled nothing while the other led"
    );

    // The leader stopped (SIGTERM, as a drain or an upgrade stops it) hands the Lease back: the
    // other takes over within its retry rather than the Lease's duration.
    let status = replicas[leader].terminate();
    let stopped = Instant::now();
    assert!(status.success(), "{status}: {}", replicas[leader].tail());
    let transitions = wait_leader(&leases, &replicas[standby].name).await;
    let handed = stopped.elapsed();
    println!(
        "leader: {} took over {:.1} s after {}'s graceful stop",
        replicas[standby].name,
        handed.as_secs_f64(),
        replicas[leader].name
    );
    assert!(handed < Duration::from_secs(10), "{handed:?}");
    assert_eq!(transitions, 1);
    assert!(
        eventually("the new leader says so", WAIT, || replicas[standby]
            .ready_and_leading())
        .await,
        "{}",
        replicas[standby].tail()
    );
    // The stopped replica restarts (as kubelet restarts its container) and stands by.
    replicas[leader].start();
    let leads = eventually("the restarted replica is ready", WAIT, || {
        replicas[leader].ready_and_leading()
    })
    .await;
    assert!(!leads, "{}", replicas[leader].tail());
    let (leader, standby) = (standby, leader);

    // The cluster deleted while a node still cleans up (its finalizer on a group, as its agent
    // holds it): the leader deletes the groups and StorageClasses and waits. Killed then
    // (SIGKILL: nothing handed back), the other takes over once the Lease expired and finishes
    // the deletion when the node lets go.
    let finalizer = lvms_api::node_cleanup_finalizer(&nodes[0]);
    vgs.patch(
        &classes[0],
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": [finalizer]}})),
    )
    .await
    .unwrap();
    clusters
        .delete("ha", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the leader waits for the node's cleanup", WAIT, || async {
        let vg = vgs
            .get_opt(&classes[0])
            .await
            .map_err(|e| e.to_string())?
            .ok_or("gone")?;
        let sc_gone = scs
            .get_opt(&format!("lvms-{}", classes[1]))
            .await
            .map_err(|e| e.to_string())?
            .is_none();
        (vg.metadata.deletion_timestamp.is_some() && sc_gone)
            .then_some(())
            .ok_or("not yet deleting".to_owned())
    })
    .await;
    replicas[leader].kill();
    let killed = Instant::now();
    let transitions = wait_leader(&leases, &replicas[standby].name).await;
    let took = killed.elapsed();
    println!(
        "leader: {} took over {:.1} s after {} was killed mid-deletion",
        replicas[standby].name,
        took.as_secs_f64(),
        replicas[leader].name
    );
    assert_eq!(transitions, 2);
    // The Lease's 15 s after the last renewal (at most one 2 s retry before the kill), the
    // standby's 2 s retry, and the poll.
    assert!(took < Duration::from_secs(15 + 2 + 2 + 3), "{took:?}");
    assert!(
        clusters.get_opt("ha").await.unwrap().is_some(),
        "the cluster waits for the node"
    );
    vgs.patch(
        &classes[0],
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    support::wait_cluster_gone(&clusters, "ha", WAIT).await;
    for class in &classes {
        assert!(
            scs.get_opt(&format!("lvms-{class}"))
                .await
                .unwrap()
                .is_none()
        );
        assert!(vgs.get_opt(class).await.unwrap().is_none());
    }
    for r in &mut replicas {
        r.kill();
    }
    for n in &nodes {
        support::delete_node(client, n).await;
    }
    setup.delete().await;
}
