//! `cargo xtask installed`: lvms-rs installed as a user installs it, on two real nodes. The control
//! plane runs on the host ([`crate::cluster`]); each node is a VM, with Debian's containerd and
//! runc and the kubelet of the Kubernetes assets (`xtask/src/node.sh`), its images built as
//! tarballs and imported into node 1's disk before it boots ([`crate::images`]); node 2's disk is a
//! sparse copy of it. The snapshot CRDs are applied with the control plane, before its snapshot
//! controller starts. Then the e2e tests `installed::adopt::lvms_left_this_cluster`,
//! `installed::adopt::csi_driver_lvm::left_this_cluster` and
//! `installed::adopt::topolvm::left_this_cluster` build what an uninstalled LVMS, csi-driver-lvm
//! and TopoLVM leave on node 2, `kubectl apply` installs a kustomize overlay of `deploy/base` that
//! only names the local lvms-rs image, and the e2e tests `installed…` drive it: the takeover of
//! LVMS's and TopoLVM's state (ADR 0032) and of csi-driver-lvm's volumes (ADR 0033), an
//! `LVMCluster` to a pod writing its volume (ADR 0018), a shared LUN on both nodes.
//!
//! The two nodes ([`NODES`]), `lvms-node` and `lvms-node2`, each have a spare disk of their own
//! for a node-local class (`virtio-lvms0` on node 1, `virtio-lvms1` on node 2; node 2 has a second
//! one, `virtio-csilvm`, for csi-driver-lvm's volume group, and a third, `virtio-topolvm`, for a
//! plain TopoLVM install's) and both attach one
//! more disk image, the shared LUN (`virtio-lun0`, as `cargo xtask vm-shared` attaches it), with
//! a shared class's host services running (softdog, wdmd, sanlock, lvmlockd: node.sh). Both are
//! slirp guests at 10.0.2.15; each also has an address of its own that is its node IP
//! (10.99.0.N) and a pod subnet of its own (10.88.N.0/24), so the API server can tell them apart.
//!
//! What a cluster network would do is played by three small pieces: an iptables DNAT in each node
//! for the `kubernetes` Service, the API server's egress selector through an HTTP CONNECT proxy in
//! each node (`xtask guest-connect`) for the webhook's and kubelets' addresses, which this process
//! routes to the node whose node IP or pod subnet the request names ([`egress_node`]), and
//! `--enable-aggregator-routing` so the webhook's Service resolves to its pod's address. Nodes
//! never reach each other's pods.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};

use crate::{
    cluster, e2e, guest, images,
    report::Counts,
    turn::Turn,
    vm::{self, Disk, Kernel, RunningVm, VmSpec},
};

/// One test node: its Node name, its spare disk's serial, and its index `n` (1, 2), which names
/// its node IP (10.99.0.n) and pod subnet (10.88.n.0/24).
struct NodeSpec {
    name: &'static str,
    device: &'static str,
    n: u8,
}

impl NodeSpec {
    fn ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 99, 0, self.n)
    }

    fn pod_subnet(&self) -> String {
        format!("10.88.{}.0/24", self.n)
    }

    /// The by-id path of its spare disk in the VM.
    fn device_path(&self) -> String {
        format!("/dev/disk/by-id/virtio-{}", self.device)
    }
}

/// The test nodes; node 1 is the one the `installed` test pins its pods and its class to. Each
/// kubelet's client certificate is issued to `system:node:<name>`, as the Node authorizer requires.
const NODES: [NodeSpec; 2] = [
    NodeSpec {
        name: "lvms-node",
        device: "lvms0",
        n: 1,
    },
    NodeSpec {
        name: "lvms-node2",
        device: "lvms1",
        n: 2,
    },
];
/// The shared LUN both nodes attach (`/dev/disk/by-id/virtio-lun0` in both), as
/// [`crate::shared`] attaches it.
const LUN: &str = "lun0=3072";
/// The device-mapper map each node sees the LUN through (node.sh), as multipath would give it: the
/// class's path, and what the lost-path test switches to the error target (`lun-path lose`).
const LUN_MAP: &str = "lun0";

/// The serial of a disk spec `serial=MiB` (its by-id name in the guests).
fn serial(spec: &str) -> &str {
    spec.split_once('=').map_or(spec, |(serial, _)| serial)
}
/// The tests that build, before lvms-rs is installed, what an uninstalled LVMS, csi-driver-lvm and
/// TopoLVM leave behind.
const PRE_INSTALL_TESTS: [&str; 3] = [
    "installed::adopt::csi_driver_lvm::left_this_cluster",
    "installed::adopt::lvms_left_this_cluster",
    "installed::adopt::topolvm::left_this_cluster",
];
/// Node 2's second spare disk, where csi-driver-lvm's volume group is built (ADR 0033).
const CSI_LVM_DISK: &str = "csilvm=4096";
/// Node 2's third, where a plain TopoLVM install's volume group is built (ADR 0032).
const TOPOLVM_DISK: &str = "topolvm=2048";
/// Guest ports: the command server and the API server's CONNECT proxy.
const EXEC_GUEST_PORT: u16 = guest::GUEST_PORT;
const CONNECT_GUEST_PORT: u16 = 7001;

/// The host ports of one booted node's forwards.
#[derive(Clone, Copy)]
struct Ports {
    exec: u16,
    connect: u16,
}

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
    let ports = NODES
        .iter()
        .map(|_| {
            Ok(Ports {
                exec: cluster::free_port()?,
                connect: cluster::free_port()?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let egress = dir.join("egress-selector.yaml");
    // The API server speaks HTTP CONNECT without TLS only over a Unix socket: this process
    // forwards the socket to the nodes' proxies (forwarded ports), each request to its node's.
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
    forward_egress(&egress_socket, ports.iter().map(|p| p.connect).collect())?;
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
            nodes: NODES.iter().map(|n| n.name.to_owned()).collect(),
        },
    )?;
    let kubeconfig = control_plane.kubeconfig.clone();

    // The nodes' disks: node 1's state disk with the images imported, node 2's a sparse copy of
    // it (the import is most of a node disk's time); a spare disk each; the one shared LUN.
    let kernel = vm::prepare(repo)?;
    let disk_started = Instant::now();
    let state_disk = vm::disk(repo, "node=8192")?;
    images::node_disk(repo, &images, &state_disk.image)?;
    let mut lun = vm::disk(repo, LUN)?;
    lun.shared = true;
    let mut node_dirs = Vec::new();
    let mut vms = Vec::new();
    let mut specs = Vec::new();
    for (node, ports) in NODES.iter().zip(&ports) {
        let state = if node.n == 1 {
            state_disk.clone()
        } else {
            let image = vm::disks_dir(repo).join(format!("node{}.img", node.n));
            let status = Command::new("cp")
                .arg("--sparse=always")
                .arg(&state_disk.image)
                .arg(&image)
                .status()
                .context("running cp")?;
            if !status.success() {
                bail!("cp --sparse=always {} failed", state_disk.image.display());
            }
            Disk {
                image,
                ..state_disk.clone()
            }
        };
        let mut disks = vec![
            state,
            vm::disk(repo, &format!("{}=4096", node.device))?,
            lun.clone(),
        ];
        if node.n == 2 {
            disks.push(vm::disk(repo, CSI_LVM_DISK)?);
            disks.push(vm::disk(repo, TOPOLVM_DISK)?);
        }
        let node_dir = dir.join(if node.n == 1 {
            "node".to_owned()
        } else {
            format!("node{}", node.n)
        });
        fs::create_dir_all(&node_dir)?;
        fs::copy(pki.join("ca.crt"), node_dir.join("ca.crt"))?;
        let (crt, key) = control_plane.node_credentials(node.name);
        cluster::write_kubeconfig(
            &node_dir.join("kubelet.kubeconfig"),
            &format!("https://{}:{}", cluster::VM_HOST_ADDR, control_plane.port),
            &pki.join("ca.crt"),
            &crt,
            &key,
        )?;
        let spec =
            node_vm(repo, node, &node_dir, &assets, control_plane.port, *ports)?.disks(disks);
        vms.push(vm::start(repo, &kernel, spec.clone())?);
        specs.push(spec);
        node_dirs.push(node_dir);
    }
    println!(
        "installed: node disks ready and {} nodes booting after {:.0} s",
        NODES.len(),
        disk_started.elapsed().as_secs_f64()
    );
    for (ready, node) in wait_nodes_ready(&kubeconfig, &mut vms, &node_dirs)?
        .iter()
        .zip(&NODES)
    {
        println!(
            "installed: node {} Ready {:.0} s after boot",
            node.name,
            ready.as_secs_f64()
        );
    }

    let [node1, node2] = &NODES;
    let pids = vms
        .iter()
        .map(|vm| vm.pid().to_string())
        .collect::<Vec<_>>()
        .join(",");
    // The suite, with what it needs to know of the nodes.
    let suite_cmd = |applied_at: u128, reboot_dir: &Path| {
        let mut cmd = Command::new(&suite);
        cmd.args(["--ignored", "--test-threads=1", "--nocapture"])
            .env("KUBECONFIG", &kubeconfig)
            .env("LVMS_E2E_DEVICE", node1.device_path())
            .env("LVMS_E2E_POD_IMAGE", images::WORKLOAD)
            .env("LVMS_E2E_IMAGE", images::lvms_reference("e2e-a"))
            .env("LVMS_E2E_ROLL_IMAGE", images::lvms_reference("e2e-b"))
            .env("LVMS_E2E_NODE", node1.name)
            .env("LVMS_E2E_APPLIED_AT_MS", applied_at.to_string())
            .env("LVMS_E2E_VM", format!("127.0.0.1:{}", ports[0].exec))
            .env("LVMS_E2E_NODE2", node2.name)
            .env("LVMS_E2E_DEVICE2", node2.device_path())
            .env("LVMS_E2E_VM2", format!("127.0.0.1:{}", ports[1].exec))
            .env("LVMS_E2E_SHARED_DEVICE", format!("/dev/mapper/{LUN_MAP}"))
            .env(
                "LVMS_E2E_CSI_LVM_DEVICE",
                format!("/dev/disk/by-id/virtio-{}", serial(CSI_LVM_DISK)),
            )
            .env(
                "LVMS_E2E_TOPOLVM_DEVICE",
                format!("/dev/disk/by-id/virtio-{}", serial(TOPOLVM_DISK)),
            )
            // The failover test ends a node as a power loss would: its machine killed; then boots
            // it again through `reboots`.
            .env("LVMS_E2E_PIDS", &pids)
            .env("LVMS_E2E_REBOOT_DIR", reboot_dir);
        cmd
    };

    // The snapshot CRDs are a cluster's own (`cluster::start` applied them). What an uninstalled
    // LVMS leaves on node 2, which the installed lvms-rs takes over (`installed::adopt`, ADR
    // 0032); then lvms-rs with kubectl.
    let mut before = suite_cmd(0, &dir.join("reboot"));
    before.args(PRE_INSTALL_TESTS).arg("--exact");
    let (ok, _) = e2e::run_pass(repo, before, &dir.join("work"))?;
    if !ok {
        diagnose(&kubeconfig, &node_dirs);
        bail!(
            "installed: {} failed: the old drivers' state is not built",
            PRE_INSTALL_TESTS.join(" or ")
        );
    }
    let overlay = write_overlay(&dir)?;
    let applied_at = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    kubectl(&kubeconfig, &["apply", "-k", &p(overlay)])?;
    println!("installed: kubectl apply done");

    let reboots = Reboots::start(repo, kernel, specs, vms, dir.join("reboot"))?;
    // `installed::adopt` (LVMS's install taken over on node 2) and `installed::an_…` (the
    // node-local story on node 1); then, with the sanlock turn (`turn`: under `cargo xtask test`
    // the two-node phases run beside the first pass, never beside the second),
    // `installed_shared::` (one LUN on both nodes; it kills one and boots it again through
    // `reboots`).
    let mut local = suite_cmd(applied_at, &reboots.dir);
    local.arg("installed::");
    for test in PRE_INSTALL_TESTS {
        local.args(["--skip", test]);
    }
    let (local_ok, local_summary) = e2e::run_pass(repo, local, &dir.join("work"))?;
    let waited = Instant::now();
    let turn = Turn::take_from_env()?;
    if turn.is_some() {
        println!(
            "installed: the sanlock turn taken after {:.0} s",
            waited.elapsed().as_secs_f64()
        );
    }
    let mut shared = suite_cmd(applied_at, &reboots.dir);
    shared.arg("installed_shared::");
    let (shared_ok, shared_summary) = e2e::run_pass(repo, shared, &dir.join("work"))?;
    let ok = local_ok && shared_ok;
    if !ok {
        diagnose(&kubeconfig, &node_dirs);
    }
    let summaries: Vec<String> = local_summary.into_iter().chain(shared_summary).collect();
    if keep {
        println!(
            "installed: kept running (KUBECONFIG={}, LVMS_E2E_VM=127.0.0.1:{} on {}, \
             LVMS_E2E_VM2=127.0.0.1:{} on {}); interrupt to stop",
            kubeconfig.display(),
            ports[0].exec,
            node1.name,
            ports[1].exec,
            node2.name,
        );
        loop {
            thread::sleep(Duration::from_secs(3600));
        }
    }
    for p in &ports {
        guest::at(p.exec).poweroff();
    }
    for vm in reboots.stop() {
        let _ = vm.wait();
    }
    drop(turn);
    drop(control_plane);
    println!(
        "installed: finished in {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        if summaries.len() == 2 {
            summaries.join("; ")
        } else {
            "a pass printed no result (it crashed)".to_owned()
        }
    );
    println!("installed: {}", Counts::from_libtest(&summaries));
    Ok(if ok && summaries.len() == 2 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Boots a node again when the test asks, after it killed the node's machine (the rejoin after a
/// power loss): the test creates `<dir>/<n>` (n = 1, 2); this kills what is left of that machine,
/// waits for it to be gone, boots the node on the same disks (node.sh starts its services and
/// kubelet as at the first boot) and writes the new machine's process id to `<dir>/<n>.pid`.
struct Reboots {
    dir: PathBuf,
    vms: Arc<Mutex<Vec<Option<RunningVm>>>>,
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<()>,
}

impl Reboots {
    fn start(
        repo: &Path,
        kernel: Kernel,
        specs: Vec<VmSpec>,
        vms: Vec<RunningVm>,
        dir: PathBuf,
    ) -> Result<Self> {
        fs::create_dir_all(&dir)?;
        let vms = Arc::new(Mutex::new(vms.into_iter().map(Some).collect::<Vec<_>>()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (repo, dir, vms, stop) = (repo.to_owned(), dir.clone(), vms.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_secs(1));
                    for (i, spec) in specs.iter().enumerate() {
                        let request = dir.join((i + 1).to_string());
                        if fs::remove_file(&request).is_err() {
                            continue;
                        }
                        let mut vms = vms.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(mut old) = vms[i].take() {
                            old.kill();
                            let _ = old.wait();
                        }
                        // The old machine's relay lets its ports go from its accept threads, a
                        // moment after the machine is gone (a CI run found one still bound).
                        let until = Instant::now() + Duration::from_secs(30);
                        let mut booted = vm::start(&repo, &kernel, spec.clone());
                        while booted.is_err() && Instant::now() < until {
                            thread::sleep(Duration::from_millis(500));
                            booted = vm::start(&repo, &kernel, spec.clone());
                        }
                        match booted {
                            Ok(vm) => {
                                println!("installed: node {} booted again", i + 1);
                                let _ = fs::write(
                                    dir.join(format!("{}.pid", i + 1)),
                                    vm.pid().to_string(),
                                );
                                vms[i] = Some(vm);
                            }
                            Err(e) => println!("installed: booting node {} again: {e:#}", i + 1),
                        }
                    }
                }
            })
        };
        Ok(Self {
            dir,
            vms,
            stop,
            thread,
        })
    }

    /// Stops answering requests; the machines running now.
    fn stop(self) -> Vec<RunningVm> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let mut vms = self.vms.lock().unwrap_or_else(|e| e.into_inner());
        vms.drain(..).flatten().collect()
    }
}

/// The index in [`NODES`] of the node an HTTP CONNECT request line's destination is on: its node
/// IP (10.99.0.n) or an address of its pod subnet (10.88.n.0/24). Anything else goes to node 1,
/// whose proxy refuses or fails it as it would.
fn egress_node(request_line: &str) -> usize {
    let mut words = request_line.split_whitespace();
    let target = match (words.next(), words.next()) {
        (Some("CONNECT"), Some(target)) => target.parse::<SocketAddrV4>().ok(),
        _ => None,
    };
    let n = match target.map(|t| t.ip().octets()) {
        Some([10, 99, 0, n]) | Some([10, 88, n, _]) => n,
        _ => 1,
    };
    NODES.iter().position(|node| node.n == n).unwrap_or(0)
}

/// Accepts on the Unix socket `path` and joins each connection to the loopback TCP port of the
/// node [`egress_node`] picks from its request line (`ports[i]` for `NODES[i]`), in background
/// threads that live as long as the process.
fn forward_egress(path: &Path, ports: Vec<u16>) -> Result<()> {
    use std::os::unix::net::UnixListener;
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut unix) = conn else { continue };
            let ports = ports.clone();
            thread::spawn(move || {
                // The request line first (and whatever came with it, passed on as it is).
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.contains(&b'\n') && head.len() < 8192 {
                    match unix.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line_end = head.iter().position(|b| *b == b'\n').unwrap_or(head.len());
                let port = ports[egress_node(&String::from_utf8_lossy(&head[..line_end]))];
                let Ok(mut tcp) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                    return;
                };
                if tcp.write_all(&head).is_err() {
                    return;
                }
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

/// The VM of `node` (its disks still to be added): node.sh with the node's settings.
fn node_vm(
    repo: &Path,
    node: &NodeSpec,
    node_dir: &Path,
    assets: &Path,
    api_port: u16,
    ports: Ports,
) -> Result<VmSpec> {
    let xtask = std::env::current_exe().context("the xtask executable")?;
    let s = |v: &Path| v.display().to_string();
    // A user-mode guest (ADR 0027). Under qemu (LVMS_VM_MACHINE=qemu), two vCPUs even beside
    // another phase: on one, kubelet's liveness probes of the operator's and the node plugin's
    // containers time out and restart them (measured: the test failed).
    let vm_name = if node.n == 1 {
        "node".to_owned()
    } else {
        format!("node{}", node.n)
    };
    Ok(VmSpec::new(&vm_name, repo, "sh xtask/src/node.sh")
        .memory_mib(3072)
        .exact_cpus(2)
        .net(vec![
            (ports.exec, EXEC_GUEST_PORT),
            (ports.connect, CONNECT_GUEST_PORT),
        ])
        .env("NODE_DIR", s(node_dir))
        .env("NODE_DISK", "/dev/disk/by-id/virtio-node")
        .env(
            "NODE_LUN",
            format!("/dev/disk/by-id/virtio-{}", serial(LUN)),
        )
        .env("NODE_LUN_MAP", LUN_MAP)
        .env("NODE_NAME", node.name)
        .env("NODE_IP", node.ip().to_string())
        .env("POD_SUBNET", node.pod_subnet())
        .env("API_PORT", api_port.to_string())
        .env("KUBELET", s(&assets.join("kubelet")))
        .env("XTASK", s(&xtask))
        .env("EXEC_PORT", EXEC_GUEST_PORT.to_string())
        .env("CONNECT_PORT", CONNECT_GUEST_PORT.to_string())
        .timeout(Duration::from_secs(90 * 60)))
}

/// Waits for every node's Node to be Ready; the time each took from now (the nodes boot side by
/// side, just started).
fn wait_nodes_ready(
    kubeconfig: &Path,
    vms: &mut [vm::RunningVm],
    node_dirs: &[PathBuf],
) -> Result<Vec<Duration>> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(900);
    let mut ready: Vec<Option<Duration>> = vec![None; NODES.len()];
    loop {
        for (i, node) in NODES.iter().enumerate() {
            if ready[i].is_some() {
                continue;
            }
            if vms[i].exited()? {
                bail!(
                    "node {}'s VM stopped during its setup; see its console above and {}",
                    node.name,
                    node_dirs[i].join("logs").display()
                );
            }
            let status = kubectl(
                kubeconfig,
                &[
                    "get",
                    "node",
                    node.name,
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#,
                ],
            );
            if matches!(status.as_deref(), Ok("True")) {
                ready[i] = Some(started.elapsed());
            }
        }
        if let Some(all) = ready.iter().copied().collect::<Option<Vec<_>>>() {
            return Ok(all);
        }
        if Instant::now() > deadline {
            let late: Vec<String> = NODES
                .iter()
                .zip(&ready)
                .filter(|(_, r)| r.is_none())
                .map(|(n, _)| n.name.to_owned())
                .collect();
            bail!(
                "node(s) {} not Ready within 900 s; see the logs in {}",
                late.join(", "),
                node_dirs
                    .iter()
                    .map(|d| d.join("logs").display().to_string())
                    .collect::<Vec<_>>()
                    .join(" and ")
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

/// What a failed run leaves to read: nodes, pods, events, the nodes' logs.
fn diagnose(kubeconfig: &Path, node_dirs: &[PathBuf]) {
    for args in [
        &["get", "nodes", "-o", "wide"][..],
        &["get", "pods", "-A", "-o", "wide"][..],
        &["get", "events", "-A", "--sort-by=.lastTimestamp"][..],
        &["describe", "pods", "-n", "lvms-system"][..],
    ] {
        match kubectl(kubeconfig, args) {
            Ok(out) => println!("installed: kubectl {}:\n{out}", args.join(" ")),
            Err(e) => println!("installed: {e:#}"),
        }
    }
    for dir in node_dirs {
        println!(
            "installed: a node's logs (containerd, kubelet, proxy, lock daemons) are in {}",
            dir.join("logs").display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_requests_go_to_the_node_of_their_node_ip_or_pod_subnet() {
        assert_eq!(egress_node("CONNECT 10.99.0.1:10250 HTTP/1.1\r"), 0);
        assert_eq!(egress_node("CONNECT 10.99.0.2:10250 HTTP/1.1\r"), 1);
        assert_eq!(egress_node("CONNECT 10.88.1.7:9443 HTTP/1.1"), 0);
        assert_eq!(egress_node("CONNECT 10.88.2.7:9443 HTTP/1.1"), 1);
        // Anything else to node 1, whose proxy answers it as before.
        assert_eq!(egress_node("CONNECT 10.88.9.7:9443 HTTP/1.1"), 0);
        assert_eq!(egress_node("CONNECT lvms-node2:10250 HTTP/1.1"), 0);
        assert_eq!(egress_node("GET / HTTP/1.1"), 0);
    }
}
