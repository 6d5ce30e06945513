//! Shared device classes on two nodes that see one LUN: two qemu VMs attach the same disk image
//! (`cargo xtask vm-shared`), each runs sanlock and lvmlockd as host services would, and `lvms`
//! runs in both. The tests run on the host and drive the guests through their command servers
//! (`LVMS_SHARED_NODES=127.0.0.1:<port>,127.0.0.1:<port>`); the host's filesystem is the guests'
//! root, so the config files written here are read there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The LUN both guests see.
const LUN: &str = "/dev/disk/by-id/virtio-lun0";
/// The class on it.
const CLASS: &str = "san";

struct Node {
    addr: String,
    name: &'static str,
}

struct Ran {
    code: i64,
    out: String,
    err: String,
}

impl Node {
    fn all() -> [Node; 2] {
        let nodes = std::env::var("LVMS_SHARED_NODES")
            .expect("LVMS_SHARED_NODES (run by cargo xtask vm-shared)");
        let mut it = nodes.split(',').map(str::to_owned);
        [
            Node {
                addr: it.next().unwrap(),
                name: "node1",
            },
            Node {
                addr: it.next().expect("two nodes"),
                name: "node2",
            },
        ]
    }

    fn sh(&self, cmd: &str) -> Ran {
        let mut stream = TcpStream::connect(&self.addr).expect("the guest's command server");
        stream
            .set_read_timeout(Some(Duration::from_secs(600)))
            .unwrap();
        writeln!(stream, "{}", serde_json::json!({ "cmd": cmd })).unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).unwrap();
        let v: Value = serde_json::from_str(&reply).unwrap();
        Ran {
            code: v["code"].as_i64().unwrap(),
            out: v["out"].as_str().unwrap_or_default().to_owned(),
            err: v["err"].as_str().unwrap_or_default().to_owned(),
        }
    }

    #[track_caller]
    fn ok(&self, cmd: &str) -> String {
        let r = self.sh(cmd);
        assert_eq!(
            r.code, 0,
            "{}: `{cmd}` failed:\n{}\n{}",
            self.name, r.out, r.err
        );
        r.out
    }

    /// Starts sanlock (watchdog off: fencing is a later issue) and lvmlockd, as their host services
    /// would, unless they run.
    fn start_lock_daemons(&self) {
        self.ok(
            "mkdir -p /run/sanlock /run/lvm; \
             sanlock client status >/dev/null 2>&1 || sanlock daemon -w 0 -U root -G root; \
             for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockctl --info >/dev/null 2>&1 || lvmlockd -g sanlock; \
             for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockctl --info >/dev/null",
        );
    }

    /// `lvms converge --output json` of `config`: (succeeded, the report of each class).
    fn converge(&self, config: &std::path::Path) -> (bool, Vec<Value>, String) {
        let r = self.sh(&format!(
            "{} converge --config {} --output json",
            env!("CARGO_BIN_EXE_lvms"),
            config.display()
        ));
        let reports: Vec<Value> = serde_json::from_str(&r.out)
            .unwrap_or_else(|e| panic!("{}: no JSON ({e}):\n{}\n{}", self.name, r.out, r.err));
        (r.code == 0, reports, r.err)
    }
}

fn scratch() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/shared-vms")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn config(dir: &std::path::Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, body).unwrap();
    path
}

fn shared_config(host_id: u16, create: bool, local: bool) -> String {
    let mut s = format!(
        "shared:\n  hostId: {host_id}\n  createVolumeGroups: {create}\n\
         deviceClasses:\n  - name: {CLASS}\n    deviceAccessPolicy: shared\n    \
         deviceSelector:\n      paths: [{LUN}]\n"
    );
    if local {
        // A class without paths discovers the node's free disks: it must take the local disk and
        // never the LUN.
        s.push_str("  - name: local\n    default: true\n");
    }
    s
}

fn state(report: &Value) -> (&str, &str) {
    let plan = &report["plan"]["state"];
    (
        plan["state"].as_str().unwrap_or_default(),
        plan["reason"].as_str().unwrap_or_default(),
    )
}

fn actions(report: &Value) -> Vec<String> {
    report["executed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| a["action"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn two_nodes_create_the_shared_volume_group_once_and_both_join() {
    let [n1, n2] = Node::all();
    let dir = scratch();
    let c1 = config(&dir, "node1", &shared_config(1, true, true));
    let c2 = config(&dir, "node2", &shared_config(2, false, false));

    // Without the lock daemons nothing is touched, and the report says how to start them.
    let (ok, reports, _) = n2.converge(&c2);
    assert!(!ok);
    let (s, reason) = state(&reports[0]);
    assert_eq!(s, "failed", "{reports:?}");
    assert!(
        reason.contains("systemctl enable --now sanlock")
            && reason.contains("never runs a shared class without locking")
            || reason.contains("is not running"),
        "{reason}"
    );
    assert!(actions(&reports[0]).is_empty());

    n1.start_lock_daemons();
    n2.start_lock_daemons();

    // Node 2 may not create the volume group: it waits, having only listed the LUN in its devices file.
    let (ok, reports, _) = n2.converge(&c2);
    assert!(!ok);
    let (s, reason) = state(&reports[0]);
    assert_eq!(s, "waiting", "{reports:?}");
    assert!(
        reason.contains("waiting for the node that creates"),
        "{reason}"
    );
    assert_eq!(actions(&reports[0]), ["addToDevicesFile"]);
    assert_eq!(n2.sh("lvmlockctl --info").out.trim(), "");

    // Node 1 creates it (and its local class takes the local disk, not the LUN).
    let t = Instant::now();
    let (ok, reports, err) = n1.converge(&c1);
    let created = t.elapsed();
    assert!(ok, "{reports:?}\n{err}");
    assert_eq!(state(&reports[0]).0, "joined");
    assert_eq!(
        actions(&reports[0]),
        ["addToDevicesFile", "createVolumeGroup"]
    );
    let local = &reports[1];
    assert_eq!(local["plan"]["state"]["state"], "ready", "{local}");
    let members: Vec<&str> = local["plan"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["verdict"]["verdict"] == "member" || d["verdict"]["verdict"] == "usable")
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    assert!(
        !members.is_empty()
            && members
                .iter()
                .all(|p| !p.contains("lun0") && *p != "/dev/vda"),
        "the local class must take only the local disk: {local}"
    );
    let info = n1.ok("lvmlockctl --info");
    assert!(
        info.contains(&format!("VG {CLASS} lock_type=sanlock")),
        "{info}"
    );
    let status = n1.ok("sanlock client status");
    assert!(
        status.contains(&format!("s lvm_{CLASS}:1:")),
        "host id 1: {status}"
    );

    // Node 2 joins the existing group with its own host id.
    let t = Instant::now();
    let (ok, reports, err) = n2.converge(&c2);
    let joined = t.elapsed();
    assert!(ok, "{reports:?}\n{err}");
    assert_eq!(state(&reports[0]).0, "joined");
    assert_eq!(actions(&reports[0]), ["startLockspace"]);
    let status = n2.ok("sanlock client status");
    assert!(
        status.contains(&format!("s lvm_{CLASS}:2:")),
        "host id 2: {status}"
    );
    let failures = reports[0]["lockStartFailures"]
        .as_array()
        .map_or(0, Vec::len);
    println!(
        "vm-shared: node 1 created and joined in {:.1} s; node 2 joined in {:.1} s ({failures} failed lock-start attempts first)",
        created.as_secs_f64(),
        joined.as_secs_f64()
    );

    // Converged: nothing more to do on either.
    for (n, c) in [(&n1, &c1), (&n2, &c2)] {
        let (ok, reports, err) = n.converge(c);
        assert!(ok, "{err}");
        assert!(actions(&reports[0]).is_empty(), "{}: {reports:?}", n.name);
    }

    // The volume group seen without lvmlockd (as local classes look): invisible, so never claimed.
    let plain = n2.ok("lvm vgs --reportformat json -o vg_name");
    assert!(!plain.contains(CLASS), "{plain}");
}
