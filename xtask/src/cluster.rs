//! A throwaway Kubernetes control plane on loopback, as envtest starts one: etcd (Debian's
//! `etcd-server`), kube-apiserver with RBAC and a service-account issuer, kube-controller-manager
//! and kube-scheduler, with certificates made per run and an admin kubeconfig written.
//!
//! The binaries come from a directory of unpacked assets ([`assets`]): `$LVMS_K8S_ASSETS`, else
//! `$KUBEBUILDER_ASSETS` when it holds a kube-apiserver, else `../shared/k8s/*.xz` beside the
//! checkout unpacked into `target/k8s`. Every process is killed when the [`ControlPlane`] is
//! dropped, so nothing is left running.

use std::{
    fs,
    net::{Ipv4Addr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The control-plane binaries a run needs in the assets directory.
pub const CONTROL_PLANE: &[&str] = &[
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
];

/// The address the test VM reaches the host's loopback at (user-mode networking); the API
/// server's certificate names it so the node agent in the VM can verify it.
pub const VM_HOST_ADDR: &str = "10.0.2.2";

/// The directory of unpacked Kubernetes binaries, unpacking `../shared/k8s` when no directory is
/// named. `needed` are the binaries that must be in it.
pub fn assets(repo: &Path, needed: &[&str]) -> Result<PathBuf> {
    let named = std::env::var_os("LVMS_K8S_ASSETS")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("KUBEBUILDER_ASSETS")
                .map(PathBuf::from)
                .filter(|d| d.join("kube-apiserver").exists())
        });
    let dir = match named {
        Some(dir) => dir,
        None => unpack_shared(repo)?,
    };
    for bin in needed {
        if !dir.join(bin).is_file() {
            bail!(
                "{} has no {bin}: set LVMS_K8S_ASSETS to a directory of the Kubernetes and CSI \
                 sidecar binaries (../shared/k8s/README.md lists them)",
                dir.display()
            );
        }
    }
    Ok(dir)
}

/// Unpacks every `*.xz` of `<repo>/../shared/k8s` into `<repo>/target/k8s` (once: a binary already
/// there, newer than its archive, is kept) and copies its `crds/`.
fn unpack_shared(repo: &Path) -> Result<PathBuf> {
    let shared = repo.join("../shared/k8s");
    let out = repo.join("target/k8s");
    let entries = fs::read_dir(&shared).with_context(|| {
        format!(
            "no Kubernetes binaries: {} is missing; set LVMS_K8S_ASSETS to a directory holding \
             kube-apiserver, kube-controller-manager, kube-scheduler and the CSI sidecars",
            shared.display()
        )
    })?;
    fs::create_dir_all(&out)?;
    for entry in entries {
        let path = entry?.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".xz"))
        else {
            continue;
        };
        let target = out.join(name);
        let fresh = match (fs::metadata(&target), fs::metadata(&path)) {
            (Ok(t), Ok(a)) => t.modified()? >= a.modified()? && t.len() > 0,
            _ => false,
        };
        if fresh {
            continue;
        }
        // Per process: tasks started side by side may unpack at the same time.
        let partial = out.join(format!("{name}.partial-{}", std::process::id()));
        let status = Command::new("xz")
            .arg("-dc")
            .arg(&path)
            .stdout(fs::File::create(&partial)?)
            .status()
            .context("running xz (package xz-utils)")?;
        if !status.success() {
            bail!("xz -dc {} failed", path.display());
        }
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&partial, fs::Permissions::from_mode(0o755))?;
        fs::rename(&partial, &target)?;
    }
    let crds = shared.join("crds");
    if crds.is_dir() {
        fs::create_dir_all(out.join("crds"))?;
        for entry in fs::read_dir(&crds)? {
            let path = entry?.path();
            if let Some(name) = path.file_name() {
                let partial = out.join("crds").join(format!(
                    ".{}-{}",
                    name.to_string_lossy(),
                    std::process::id()
                ));
                fs::copy(&path, &partial)?;
                fs::rename(&partial, out.join("crds").join(name))?;
            }
        }
    }
    Ok(out)
}

/// A free TCP port on loopback (bound and released; good enough for one run).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// PEM files of one run's PKI.
struct Pki {
    ca_crt: PathBuf,
    ca_key: PathBuf,
    serving_crt: PathBuf,
    serving_key: PathBuf,
    admin_crt: PathBuf,
    admin_key: PathBuf,
    sa_key: PathBuf,
    sa_pub: PathBuf,
}

/// Options of [`start`] beyond the defaults of the e2e suite.
#[derive(Default)]
pub struct Options {
    /// Run the snapshot controller beside the control plane, as a cluster's add-on would (it
    /// must be among the assets).
    pub snapshot_controller: bool,
    /// More kube-apiserver flags (`--name=value`).
    pub apiserver_args: Vec<String>,
    /// Keep the OpenShift fork's `service-ca-certificate-publisher-controller` on: it writes the
    /// `openshift-service-ca.crt` ConfigMap every pod's service-account volume needs on a kubelet
    /// of this fork (off for the suite, which runs no kubelet).
    pub service_ca_publisher: bool,
    /// The names of the nodes whose kubelets join (`cargo xtask installed`): each gets a client
    /// certificate for `system:node:<name>` in group `system:nodes`, as the Node authorizer
    /// requires ([`ControlPlane::node_credentials`]).
    pub nodes: Vec<String>,
}

fn write_pki(dir: &Path, nodes: &[String]) -> Result<Pki> {
    let err = |e: rcgen::Error| anyhow::anyhow!("making certificates: {e}");
    fs::create_dir_all(dir)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "lvms e2e CA");
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca_key_pem = ca_key.serialize_pem();
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(err)?;

    let mut serving = CertificateParams::new(vec![
        "127.0.0.1".to_owned(),
        VM_HOST_ADDR.to_owned(),
        "10.0.0.1".to_owned(),
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
    ])
    .map_err(err)?;
    serving
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let serving_key = KeyPair::generate().map_err(err)?;
    let serving_cert = serving.signed_by(&serving_key, &ca).map_err(err)?;

    let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    admin.distinguished_name.push(DnType::CommonName, "admin");
    admin
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let admin_key = KeyPair::generate().map_err(err)?;
    let admin_cert = admin.signed_by(&admin_key, &ca).map_err(err)?;

    let sa_key = KeyPair::generate().map_err(err)?;

    // The test nodes' kubelets (`cargo xtask installed`).
    for name in nodes {
        let mut node = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        node.distinguished_name
            .push(DnType::CommonName, format!("system:node:{name}"));
        node.distinguished_name
            .push(DnType::OrganizationName, "system:nodes");
        node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let node_key = KeyPair::generate().map_err(err)?;
        let node_cert = node.signed_by(&node_key, &ca).map_err(err)?;
        let (crt, key) = node_files(dir, name);
        fs::write(crt, node_cert.pem())?;
        fs::write(key, node_key.serialize_pem())?;
    }

    let pki = Pki {
        ca_crt: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        serving_crt: dir.join("apiserver.crt"),
        serving_key: dir.join("apiserver.key"),
        admin_crt: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
    };
    fs::write(&pki.ca_crt, ca.pem())?;
    fs::write(&pki.ca_key, ca_key_pem)?;
    fs::write(&pki.serving_crt, serving_cert.pem())?;
    fs::write(&pki.serving_key, serving_key.serialize_pem())?;
    fs::write(&pki.admin_crt, admin_cert.pem())?;
    fs::write(&pki.admin_key, admin_key.serialize_pem())?;
    fs::write(&pki.sa_key, sa_key.serialize_pem())?;
    fs::write(&pki.sa_pub, sa_key.public_key_pem())?;
    Ok(pki)
}

/// Where node `name`'s client certificate and key are in the PKI directory `dir`.
fn node_files(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("node-{name}.crt")),
        dir.join(format!("node-{name}.key")),
    )
}

/// A running control plane; dropping it kills its processes.
pub struct ControlPlane {
    /// The admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// The API server's port on loopback (and on [`VM_HOST_ADDR`] inside the VM).
    pub port: u16,
    /// The API server's audit log: every request's metadata (user, user agent, verb, resource).
    pub audit_log: PathBuf,
    /// The run's certificates: `ca.crt`, `admin.{crt,key}`, `node-<name>.{crt,key}` (each of
    /// [`Options::nodes`]).
    pub pki: PathBuf,
    processes: Vec<(&'static str, Child)>,
    dir: PathBuf,
}

/// The one way every task (e2e, installed, cluster) starts a control plane: the assets directory
/// (holding `needed` beside the control plane's own binaries) and a control plane with state and
/// logs under `dir` (emptied first).
pub fn start(
    repo: &Path,
    dir: &Path,
    needed: &[&str],
    options: &Options,
) -> Result<(PathBuf, ControlPlane)> {
    let mut all: Vec<&str> = CONTROL_PLANE.to_vec();
    all.extend(needed);
    if options.snapshot_controller {
        all.push("snapshot-controller");
    }
    let assets = assets(repo, &all)?;
    let mut control_plane = ControlPlane::start(dir, &assets, options)?;
    if options.snapshot_controller {
        let kubeconfig = control_plane.kubeconfig.clone();
        // Its CRDs first: it exits when they are not there within 30 s of its start, which a
        // harness that applies them after booting nodes misses (it did: no VolumeSnapshot of the
        // installed test was ever handled).
        let out = Command::new("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["apply", "--server-side", "-f"])
            .arg(assets.join("crds"))
            .output()
            .context("running kubectl to apply the snapshot CRDs")?;
        if !out.status.success() {
            bail!(
                "kubectl apply of {} failed: {}",
                assets.join("crds").display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        control_plane.spawn(
            "snapshot-controller",
            Command::new(assets.join("snapshot-controller"))
                .arg(format!("--kubeconfig={}", kubeconfig.display()))
                .arg("--leader-election=false"),
        )?;
    }
    Ok((assets, control_plane))
}

impl ControlPlane {
    /// Starts etcd, the API server (waiting for `/readyz`), the controller-manager and the
    /// scheduler, with state and logs under `dir` (emptied first).
    fn start(dir: &Path, assets: &Path, options: &Options) -> Result<Self> {
        if dir.exists() {
            fs::remove_dir_all(dir)?;
        }
        fs::create_dir_all(dir.join("logs"))?;
        let started = Instant::now();
        let pki = write_pki(&dir.join("pki"), &options.nodes)?;
        let port = free_port()?;
        let etcd_port = free_port()?;
        let etcd_peer = free_port()?;
        let kubeconfig = dir.join("admin.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &format!("https://127.0.0.1:{port}"),
            &pki.ca_crt,
            &pki.admin_crt,
            &pki.admin_key,
        )?;
        let mut cp = Self {
            kubeconfig: kubeconfig.clone(),
            port,
            audit_log: dir.join("logs/audit.log"),
            pki: dir.join("pki"),
            processes: Vec::new(),
            dir: dir.to_path_buf(),
        };
        let mut etcd = Command::new("etcd");
        etcd.arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://127.0.0.1:{etcd_port}"))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"
            ))
            .arg(format!(
                "--initial-cluster=default=http://127.0.0.1:{etcd_peer}"
            ))
            .arg("--unsafe-no-fsync");
        cp.spawn("etcd", &mut etcd)?;
        let p = |path: &Path| path.display().to_string();
        // Every request's metadata, for counting what a component asks of the API server.
        let audit_policy = dir.join("audit-policy.yaml");
        fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
             rules:\n  - level: Metadata\n",
        )?;
        let mut apiserver = Command::new(assets.join("kube-apiserver"));
        apiserver.args([
            format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
            "--bind-address=127.0.0.1".to_owned(),
            "--advertise-address=127.0.0.1".to_owned(),
            format!("--secure-port={port}"),
            "--endpoint-reconciler-type=none".to_owned(),
            format!("--cert-dir={}", p(&dir.join("pki"))),
            format!("--tls-cert-file={}", p(&pki.serving_crt)),
            format!("--tls-private-key-file={}", p(&pki.serving_key)),
            format!("--client-ca-file={}", p(&pki.ca_crt)),
            "--service-account-issuer=https://kubernetes.default.svc".to_owned(),
            format!("--service-account-key-file={}", p(&pki.sa_pub)),
            format!("--service-account-signing-key-file={}", p(&pki.sa_key)),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
            "--allow-privileged=true".to_owned(),
            format!("--audit-policy-file={}", p(&audit_policy)),
            format!("--audit-log-path={}", p(&cp.audit_log)),
        ]);
        apiserver.args(&options.apiserver_args);
        cp.spawn("kube-apiserver", &mut apiserver)?;
        cp.wait_ready(Duration::from_secs(120))?;
        let kc = p(&kubeconfig);
        let mut kcm = Command::new(assets.join("kube-controller-manager"));
        kcm.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
            if options.service_ca_publisher {
                "--controllers=*".to_owned()
            } else {
                "--controllers=*,-service-ca-certificate-publisher-controller".to_owned()
            },
            format!("--service-account-private-key-file={}", p(&pki.sa_key)),
            format!("--root-ca-file={}", p(&pki.ca_crt)),
            format!("--cluster-signing-cert-file={}", p(&pki.ca_crt)),
            format!("--cluster-signing-key-file={}", p(&pki.ca_key)),
            "--use-service-account-credentials=true".to_owned(),
            format!("--flex-volume-plugin-dir={}", p(&dir.join("flex"))),
            format!("--cert-dir={}", p(&dir.join("kcm-certs"))),
            "--leader-elect=false".to_owned(),
        ]);
        cp.spawn("kube-controller-manager", &mut kcm)?;
        let mut scheduler = Command::new(assets.join("kube-scheduler"));
        scheduler.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".to_owned(),
            format!("--secure-port={}", free_port()?),
            format!("--cert-dir={}", p(&dir.join("scheduler-certs"))),
            "--leader-elect=false".to_owned(),
        ]);
        cp.spawn("kube-scheduler", &mut scheduler)?;
        println!(
            "e2e: control plane on https://127.0.0.1:{port} ready in {:.1} s (logs in {})",
            started.elapsed().as_secs_f64(),
            dir.join("logs").display()
        );
        Ok(cp)
    }

    /// The client certificate and key of node `name`'s kubelet (one of [`Options::nodes`]).
    pub fn node_credentials(&self, name: &str) -> (PathBuf, PathBuf) {
        node_files(&self.pki, name)
    }

    /// Starts a process that lives and dies with the control plane (its log in `logs/<name>.log`).
    pub fn spawn(&mut self, name: &'static str, cmd: &mut Command) -> Result<()> {
        let log = fs::File::create(self.dir.join("logs").join(format!("{name}.log")))?;
        let child = cmd
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| {
                if name == "etcd" {
                    "starting etcd: install etcd-server".to_owned()
                } else {
                    format!("starting {name}")
                }
            })?;
        self.processes.push((name, child));
        Ok(())
    }

    /// Polls `/readyz` with the admin credentials until it answers `ok`.
    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let pki = self.dir.join("pki");
        loop {
            for (name, child) in &mut self.processes {
                if let Some(status) = child.try_wait()? {
                    bail!(
                        "{name} exited ({status}) while the control plane started; see {}",
                        self.dir.join("logs").join(format!("{name}.log")).display()
                    );
                }
            }
            let out = Command::new("curl")
                .args(["-sS", "--max-time", "5", "--cacert"])
                .arg(pki.join("ca.crt"))
                .arg("--cert")
                .arg(pki.join("admin.crt"))
                .arg("--key")
                .arg(pki.join("admin.key"))
                .arg(format!("https://127.0.0.1:{}/readyz", self.port))
                .output()
                .context("running curl (package curl)")?;
            if out.status.success() && out.stdout == b"ok" {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the API server was not ready within {timeout:?}: {}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            thread::sleep(Duration::from_millis(500));
        }
    }

    /// Kills every process (the scheduler and controller-manager first, etcd last).
    pub fn stop(&mut self) {
        while let Some((_, mut child)) = self.processes.pop() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a kubeconfig for `server` with a client certificate.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    crt: &Path,
    key: &Path,
) -> Result<()> {
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {
            "server": server,
            "certificate-authority": ca,
        }}],
        "users": [{"name": "admin", "user": {
            "client-certificate": crt,
            "client-key": key,
        }}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
        "current-context": "e2e",
    });
    // JSON is YAML.
    fs::write(path, serde_json::to_vec_pretty(&kubeconfig)?)?;
    Ok(())
}
