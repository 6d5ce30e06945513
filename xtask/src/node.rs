//! `cargo xtask installed`: lvms-rs installed as a user installs it, on a real node. The control
//! plane runs on the host ([`crate::cluster`]); the node is the VM, with Debian's containerd and
//! runc and the kubelet of the Kubernetes assets (`xtask/src/node.sh`), its images built as
//! tarballs and imported into the node's disk before it boots ([`crate::images`]). Then `kubectl apply` of the snapshot CRDs and of a kustomize
//! overlay of `deploy/base` that only names the local lvms-rs image, and the e2e test
//! `installed` drives an `LVMCluster` to a pod writing its volume. ADR 0018.
//!
//! What a cluster network would do is played by three small pieces: an iptables DNAT in the node
//! for the `kubernetes` Service, the API server's egress selector through an HTTP CONNECT proxy in
//! the node (`xtask guest-connect`) for the webhook's and kubelet's addresses, and
//! `--enable-aggregator-routing` so the webhook's Service resolves to its pod's address.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

use crate::{
    cluster::{self, NODE_NAME},
    e2e, guest, images,
    report::Counts,
    vm::{self, VmSpec},
};

/// The node's disk for the `LVMCluster` (`/dev/disk/by-id/virtio-lvms0` in the VM).
const DEVICE_SERIAL: &str = "lvms0";
/// Guest ports: the command server and the API server's CONNECT proxy.
const EXEC_GUEST_PORT: u16 = guest::GUEST_PORT;
const CONNECT_GUEST_PORT: u16 = 7001;

/// The assets the node and the installed manifests need beside the control plane's.
fn needed_assets() -> Vec<&'static str> {
    let mut needed = vec!["kubelet", "pause"];
    needed.extend(images::SIDECARS.iter().map(|(bin, _)| *bin));
    needed
}

pub fn run(repo: &Path, keep: bool) -> Result<ExitCode> {
    let started = Instant::now();
    if Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_err()
    {
        bail!("kubectl is not on PATH: `cargo xtask installed` installs with `kubectl apply -k`");
    }
    let suite = e2e::suite(repo)?;
    let mut needed = cluster::CONTROL_PLANE.to_vec();
    needed.extend(needed_assets());
    let assets = cluster::assets(repo, &needed)?;
    let built = Instant::now();
    let images = images::build_all(repo, &assets, &crate::artifacts::lvms(repo))?;
    println!(
        "installed: {} images built in {:.0} s",
        images.images.len(),
        built.elapsed().as_secs_f64()
    );
    for image in &images.images {
        println!(
            "installed: image {} {:.1} MB",
            image.reference,
            image.size as f64 / 1e6
        );
    }

    let dir = repo.join("target/installed");
    if dir.exists() {
        fs::remove_dir_all(&dir)?;
    }
    fs::create_dir_all(&dir)?;
    let connect_port = cluster::free_port()?;
    let egress = dir.join("egress-selector.yaml");
    // The API server speaks HTTP CONNECT without TLS only over a Unix socket: this process
    // forwards the socket to the node's proxy (a forwarded port).
    let egress_socket = dir.join("egress.sock");
    fs::write(
        &egress,
        format!(
            "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\n\
             egressSelections:\n  - name: cluster\n    connection:\n      \
             proxyProtocol: HTTPConnect\n      transport:\n        uds:\n          \
             udsName: {}\n",
            egress_socket.display()
        ),
    )?;
    forward_unix_to_tcp(&egress_socket, connect_port)?;
    let cp_dir = dir.join("control-plane");
    let pki = cp_dir.join("pki");
    let p = |path: PathBuf| path.display().to_string();
    // The snapshot controller runs beside the control plane, as a cluster's add-on would.
    let (_, control_plane) = cluster::start(
        repo,
        &cp_dir,
        &needed_assets(),
        &cluster::Options {
            snapshot_controller: true,
            apiserver_args: vec![
                format!("--egress-selector-config-file={}", p(egress.clone())),
                "--enable-aggregator-routing=true".to_owned(),
                "--kubelet-preferred-address-types=InternalIP".to_owned(),
                format!("--kubelet-client-certificate={}", p(pki.join("admin.crt"))),
                format!("--kubelet-client-key={}", p(pki.join("admin.key"))),
            ],
            service_ca_publisher: true,
        },
    )?;
    let kubeconfig = control_plane.kubeconfig.clone();

    let pki = control_plane.pki.clone();
    let node_dir = dir.join("node");
    fs::create_dir_all(&node_dir)?;
    fs::copy(pki.join("ca.crt"), node_dir.join("ca.crt"))?;
    cluster::write_kubeconfig(
        &node_dir.join("kubelet.kubeconfig"),
        &format!("https://{}:{}", cluster::VM_HOST_ADDR, control_plane.port),
        &pki.join("ca.crt"),
        &pki.join("node.crt"),
        &pki.join("node.key"),
    )?;
    let exec_port = cluster::free_port()?;
    let mut node_vm = start_node(
        repo,
        &images,
        &node_dir,
        &assets,
        control_plane.port,
        exec_port,
        connect_port,
    )?;
    let node_ready = wait_node_ready(&kubeconfig, &mut node_vm, &node_dir)?;
    println!(
        "installed: node {NODE_NAME} Ready after {:.0} s",
        node_ready.as_secs_f64()
    );

    // Install: the snapshot CRDs (a cluster's own), then lvms-rs with kubectl.
    let overlay = write_overlay(&dir)?;
    let applied_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    kubectl(&kubeconfig, &["apply", "-f", &p(assets.join("crds"))])?;
    kubectl(&kubeconfig, &["apply", "-k", &p(overlay)])?;
    println!("installed: kubectl apply done");

    let mut cmd = Command::new(&suite);
    cmd.args([
        "installed::",
        "--ignored",
        "--test-threads=1",
        "--nocapture",
    ])
    .env("KUBECONFIG", &kubeconfig)
    .env(
        "LVMS_E2E_DEVICE",
        format!("/dev/disk/by-id/virtio-{DEVICE_SERIAL}"),
    )
    .env("LVMS_E2E_POD_IMAGE", images::WORKLOAD)
    .env("LVMS_E2E_IMAGE", images::lvms_reference("e2e-a"))
    .env("LVMS_E2E_ROLL_IMAGE", images::lvms_reference("e2e-b"))
    .env("LVMS_E2E_NODE", NODE_NAME)
    .env("LVMS_E2E_APPLIED_AT_MS", applied_at.to_string())
    .env("LVMS_E2E_VM", format!("127.0.0.1:{exec_port}"));
    let (ok, summary) = e2e::run_pass(repo, cmd, &dir.join("work"))?;
    if !ok {
        diagnose(&kubeconfig, &node_dir);
    }
    if keep {
        println!(
            "installed: kept running (KUBECONFIG={}, LVMS_E2E_VM=127.0.0.1:{exec_port}); \
             interrupt to stop",
            kubeconfig.display()
        );
        loop {
            thread::sleep(Duration::from_secs(3600));
        }
    }
    guest::at(exec_port).poweroff();
    let _ = node_vm.wait();
    drop(control_plane);
    println!(
        "installed: finished in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        summary
            .as_deref()
            .unwrap_or("the test printed no result (it crashed)")
    );
    println!("installed: {}", Counts::from_libtest(summary.as_slice()));
    Ok(if ok && summary.is_some() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Accepts on the Unix socket `path` and joins each connection to loopback TCP `port`, in
/// background threads that live as long as the process.
fn forward_unix_to_tcp(path: &Path, port: u16) -> Result<()> {
    use std::os::unix::net::UnixListener;
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut unix) = conn else { continue };
            thread::spawn(move || {
                let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                let (Ok(mut unix_w), Ok(mut tcp_r)) = (unix.try_clone(), tcp.try_clone()) else {
                    return;
                };
                let down = thread::spawn(move || {
                    let _ = std::io::copy(&mut tcp_r, &mut unix_w);
                    let _ = unix_w.shutdown(std::net::Shutdown::Write);
                });
                let _ = std::io::copy(&mut unix, &mut tcp);
                let _ = tcp.shutdown(std::net::Shutdown::Write);
                let _ = down.join();
            });
        }
    });
    Ok(())
}

fn start_node(
    repo: &Path,
    images: &images::Images,
    node_dir: &Path,
    assets: &Path,
    api_port: u16,
    exec_port: u16,
    connect_port: u16,
) -> Result<vm::RunningVm> {
    let kernel = vm::prepare(repo)?;
    let disks = vm::disks(repo, &["node=8192", &format!("{DEVICE_SERIAL}=4096")])?;
    images::node_disk(repo, images, &disks[0].image)?;
    let xtask = std::env::current_exe().context("the xtask executable")?;
    let s = |v: &Path| v.display().to_string();
    // A user-mode guest (ADR 0027). Under qemu (LVMS_VM_MACHINE=qemu), two vCPUs even beside
    // another phase: on one, kubelet's liveness probes of the operator's and the node plugin's
    // containers time out and restart them (measured: the test failed).
    let spec = VmSpec::new("node", repo, "sh xtask/src/node.sh")
        .disks(disks)
        .memory_mib(3072)
        .exact_cpus(2)
        .net(vec![
            (exec_port, EXEC_GUEST_PORT),
            (connect_port, CONNECT_GUEST_PORT),
        ])
        .env("NODE_DIR", s(node_dir))
        .env("NODE_DISK", "/dev/disk/by-id/virtio-node")
        .env("NODE_NAME", NODE_NAME)
        .env("API_PORT", api_port.to_string())
        .env("KUBELET", s(&assets.join("kubelet")))
        .env("XTASK", s(&xtask))
        .env("EXEC_PORT", EXEC_GUEST_PORT.to_string())
        .env("CONNECT_PORT", CONNECT_GUEST_PORT.to_string())
        .timeout(Duration::from_secs(90 * 60));
    vm::start(repo, &kernel, spec)
}

/// Waits for the node's command server, then for its Node to be Ready; the time it took.
fn wait_node_ready(kubeconfig: &Path, vm: &mut vm::RunningVm, node_dir: &Path) -> Result<Duration> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    loop {
        if vm.exited()? {
            bail!(
                "the node VM stopped during its setup; see its console above and {}",
                node_dir.join("logs").display()
            );
        }
        let ready = kubectl(
            kubeconfig,
            &[
                "get",
                "node",
                NODE_NAME,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
            ],
        );
        if matches!(ready.as_deref(), Ok("True")) {
            return Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            bail!(
                "node {NODE_NAME} was not Ready within 900 s; see {}",
                node_dir.join("logs").display()
            );
        }
        thread::sleep(Duration::from_secs(2));
    }
}

/// The kustomize overlay a user with a private image would write: `deploy/base`, its lvms-rs image
/// renamed, and the operator's `LVMS_IMAGE` (the node agent's image) set to match.
fn write_overlay(dir: &Path) -> Result<PathBuf> {
    let overlay = dir.join("overlay");
    fs::create_dir_all(&overlay)?;
    // kustomize takes only relative paths: from target/installed/overlay.
    let base = "../../../deploy/base";
    if !overlay.join(base).join("kustomization.yaml").is_file() {
        bail!("{} is not deploy/base", overlay.join(base).display());
    }
    let image = images::lvms_reference("e2e-a");
    let (name, tag) = image.rsplit_once(':').context("image tag")?;
    fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  \
             - {base}\nimages:\n  - name: ghcr.io/lvms-rs/lvms\n    newName: {name}\n    \
             newTag: {tag}\npatches:\n  - path: lvms-image.yaml\n",
        ),
    )?;
    fs::write(
        overlay.join("lvms-image.yaml"),
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: lvms-operator\n  \
             namespace: lvms-system\nspec:\n  template:\n    spec:\n      containers:\n        \
             - name: operator\n          env:\n            - name: LVMS_IMAGE\n              \
             value: {image}\n"
        ),
    )?;
    Ok(overlay)
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(args)
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What a failed run leaves to read: pods, events, the node's logs.
fn diagnose(kubeconfig: &Path, node_dir: &Path) {
    for args in [
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        &["describe", "pods", "-n", "lvms-system"][..],
    ] {
        match kubectl(kubeconfig, args) {
            Ok(out) => println!("installed: kubectl {}:\n{out}", args.join(" ")),
            Err(e) => println!("installed: {e:#}"),
        }
    }
    println!(
        "installed: the node's logs (containerd, kubelet, proxy) are in {}",
        node_dir.join("logs").display()
    );
}
