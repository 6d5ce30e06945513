//! Shared device classes on two nodes that see one LUN: two qemu VMs attach the same disk image
//! (`cargo xtask vm-shared`), each runs sanlock and lvmlockd as host services would, and `lvms`
//! runs in both. The tests run on the host and drive the guests through their command servers
//! (`LVMS_SHARED_NODES=127.0.0.1:<port>,127.0.0.1:<port>`); the host's filesystem is the guests'
//! root, so the config files written here are read there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use lvms_testkit::guest::{Guest, Ran};
use serde_json::Value;

/// The LUN both guests see.
const LUN: &str = "/dev/disk/by-id/virtio-lun0";
/// The class on it.
const CLASS: &str = "san";

/// A node: a guest's command server ([`lvms_testkit::guest`]).
struct Node {
    guest: Guest,
    name: &'static str,
}

impl Node {
    fn all() -> [Node; 2] {
        let nodes = std::env::var("LVMS_SHARED_NODES")
            .expect("LVMS_SHARED_NODES (run by cargo xtask vm-shared)");
        let mut it = nodes.split(',').map(str::to_owned);
        let mut node = |name: &'static str| Node {
            guest: Guest::new(name, it.next().expect("two nodes")),
            name,
        };
        [node("node1"), node("node2")]
    }

    fn sh(&self, cmd: &str) -> Ran {
        self.guest.sh(cmd)
    }

    #[track_caller]
    fn ok(&self, cmd: &str) -> String {
        self.guest.ok(cmd)
    }

    /// Starts sanlock (watchdog off: these tests do not fence) and lvmlockd, as their host
    /// services would, unless they run. lvmlockd's sanlock io timeout is the short one: these tests
    /// need the locks' behaviour, not their timing, and each lockspace join waits a few io
    /// timeouts (the fencing tests set theirs).
    fn start_lock_daemons(&self) {
        self.ok(&format!(
            "mkdir -p /run/sanlock /run/lvm; \
             sanlock client status >/dev/null 2>&1 || sanlock daemon -w 0 -U root -G root; \
             for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockctl --info >/dev/null 2>&1 || lvmlockd -g sanlock -o {SHORT_IO_TIMEOUT}; \
             for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockctl --info >/dev/null",
        ));
    }

    /// `lvms converge --output json` of `config`: (succeeded, the report of each class).
    fn converge(&self, config: &std::path::Path) -> (bool, Vec<Value>, String) {
        let r = self.sh(&format!(
            "LVMS_LOG=info {} converge --config {} --output json",
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

/// The tests other than `fencing_*` run sanlock without the watchdog, so their class opts out.
const UNFENCED: &str = "    sharedConfig:\n      watchdog: Disabled\n";

fn shared_config(host_id: u16, create: bool, local: bool) -> String {
    let mut s = format!(
        "shared:\n  hostId: {host_id}\n  createVolumeGroups: {create}\n\
         deviceClasses:\n  - name: {CLASS}\n    deviceAccessPolicy: shared\n    \
         deviceSelector:\n      paths: [{LUN}]\n{UNFENCED}"
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

// The tests share the two VMs and run in name order (one thread): t1 creates the volume group, the
// next ones use it.

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t1_two_nodes_create_the_shared_volume_group_once_and_both_join() {
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
        reason.contains("sanlock is not running")
            && reason.contains("systemctl enable --now sanlock"),
        "{reason}"
    );
    assert!(reason.contains("lvmlockd is not running"), "{reason}");
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

const SOCKET: &str = "/run/lvms-shared.sock";

impl Node {
    /// `lvms csi --endpoint SOCKET <args>`.
    fn csi(&self, args: &str) -> Ran {
        self.sh(&format!(
            "{} csi --endpoint {SOCKET} {args}",
            env!("CARGO_BIN_EXE_lvms")
        ))
    }

    #[track_caller]
    fn csi_ok(&self, args: &str) -> String {
        let r = self.csi(args);
        assert_eq!(
            r.code, 0,
            "{}: lvms csi {args}:\n{}\n{}",
            self.name, r.out, r.err
        );
        r.out.trim().to_owned()
    }

    /// Starts `lvms standalone` in the background and waits until it probes ready. A stage of a
    /// volume the other node holds is refused at once.
    fn start_standalone(&self, config: &std::path::Path) {
        self.start_standalone_waiting(config, 0);
    }

    /// [`Self::start_standalone`] whose stage of a volume the other node holds waits up to
    /// `stage_wait` seconds for its lock.
    fn start_standalone_waiting(&self, config: &std::path::Path, stage_wait: u64) {
        self.ok(&format!(
            "setsid {} standalone --config {} --endpoint {SOCKET} --node-id {} \
             --shared-stage-wait {stage_wait} >/run/lvms-standalone.log 2>&1 </dev/null &",
            env!("CARGO_BIN_EXE_lvms"),
            config.display(),
            self.name
        ));
        let deadline = Instant::now() + Duration::from_secs(300);
        while self.csi("probe").code != 0 {
            assert!(
                Instant::now() < deadline,
                "{}: lvms standalone not ready in 300 s:\n{}",
                self.name,
                self.sh("cat /run/lvms-standalone.log").out
            );
            std::thread::sleep(Duration::from_secs(2));
        }
    }

    fn stop_standalone(&self) {
        self.sh("pkill -f 'lvms standalone' ; sleep 1");
    }
}

/// Both nodes joined (t1 made the group; this only checks, so a test can run alone after it).
fn joined(n1: &Node, n2: &Node, dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let c1 = config(dir, "node1", &shared_config(1, true, false));
    let c2 = config(dir, "node2", &shared_config(2, false, false));
    for (n, c) in [(n1, &c1), (n2, &c2)] {
        n.start_lock_daemons();
        let (ok, reports, err) = n.converge(c);
        assert!(ok, "{}: {reports:?}\n{err}", n.name);
    }
    (c1, c2)
}

/// Both nodes joined and serving the class with `lvms standalone`.
fn serving() -> [Node; 2] {
    let [n1, n2] = Node::all();
    let dir = scratch();
    let (c1, c2) = joined(&n1, &n2, &dir);
    n1.start_standalone(&c1);
    n2.start_standalone(&c2);
    [n1, n2]
}

/// `lvm <sub>` with what every command on the class's volume group carries.
fn scoped(sub: &str) -> String {
    format!("lvm {sub} --config global/use_lvmlockd=1 --devicesfile lvms-{CLASS}.devices")
}

/// Writes `mib` MiB of random data to the start of `dev` (direct I/O); their sha256.
fn write_random(n: &Node, dev: &str, mib: u32) -> String {
    n.ok(&format!(
        "dd if=/dev/urandom of=/run/pattern bs=1M count={mib} status=none && \
         dd if=/run/pattern of={dev} bs=1M oflag=direct status=none && \
         sha256sum /run/pattern | cut -d' ' -f1"
    ))
    .trim()
    .to_owned()
}

/// The sha256 of the first `mib` MiB of `dev` (direct I/O).
fn read_sum(n: &Node, dev: &str, mib: u32) -> String {
    n.ok(&format!(
        "dd if={dev} bs=1M count={mib} iflag=direct status=none | sha256sum | cut -d' ' -f1"
    ))
    .trim()
    .to_owned()
}

fn device(id: &str) -> String {
    format!("/dev/{CLASS}/{id}")
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t2_a_volume_is_exclusive_to_the_node_that_stages_it_and_moves_with_its_data() {
    let [n1, n2] = serving();

    // A volume made on node 1 is seen on node 2, inactive on both.
    let made: Value = serde_json::from_str(
        &n1.csi_ok("--output json create-volume --name rwo --size 64Mi --class san --block"),
    )
    .unwrap();
    let id = made["volume_id"].as_str().unwrap().to_owned();
    // Accessible from every node that joined the class, not from node 1 only.
    let key = format!("shared.lvms.topolvm.io/{CLASS}");
    let segment: serde_json::Map<String, Value> =
        [(key.clone(), Value::from("true"))].into_iter().collect();
    assert_eq!(
        made["topology"],
        Value::Array(vec![Value::Object(segment)]),
        "{made}"
    );
    for n in [&n1, &n2] {
        let info: Value = serde_json::from_str(&n.csi_ok("--output json node-info")).unwrap();
        assert_eq!(info["topology"][&key], "true", "{}: {info}", n.name);
    }
    n2.csi_ok(&format!("get-volume {id}"));
    let attr = |n: &Node| {
        n.ok(&format!(
            "{} --noheadings -o lv_attr {CLASS}/{id}",
            scoped("lvs")
        ))
        .trim()
        .to_owned()
    };
    assert_eq!(attr(&n1).chars().nth(4), Some('-'), "created inactive");

    // Staged on node 1: exclusive there, refused on node 2.
    n1.csi_ok(&format!("stage {id} --staging-path /run/st --block"));
    assert_eq!(attr(&n1).chars().nth(4), Some('a'));
    // Data compared by checksum: the guests share the host's files over 9p with cache=loose, so a
    // file one guest writes can look stale to the other.
    let written = write_random(&n1, &device(&id), 4);
    let refused = n2.csi(&format!("stage {id} --staging-path /run/st --block"));
    assert_ne!(refused.code, 0);
    assert!(
        refused.err.contains("FailedPrecondition") && refused.err.contains("another node"),
        "{}",
        refused.err
    );

    // Unstaged on node 1 (deactivated), staged on node 2: the data moved with it.
    let t = Instant::now();
    n1.csi_ok(&format!("unstage {id} --staging-path /run/st"));
    assert_eq!(attr(&n1).chars().nth(4), Some('-'));
    n2.csi_ok(&format!("stage {id} --staging-path /run/st --block"));
    println!(
        "vm-shared: a linear volume moved from node 1 to node 2 (unstage + stage) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        read_sum(&n2, &device(&id), 4),
        written,
        "the data moved with the volume"
    );
    // Online growth through the node that holds it exclusively; node 1 cannot.
    let elsewhere = n1.csi(&format!("expand {id} --size 96Mi --block"));
    assert!(
        elsewhere.code != 0 && elsewhere.err.contains("FailedPrecondition"),
        "{}\n{}",
        elsewhere.out,
        elsewhere.err
    );
    n2.csi_ok(&format!("expand {id} --size 96Mi --block"));
    assert_eq!(
        n2.ok(&format!("blockdev --getsize64 {}", device(&id)))
            .trim(),
        (96u64 << 20).to_string()
    );
    n2.csi_ok(&format!("unstage {id} --staging-path /run/st"));

    // Its extents held the pattern; a new volume there is zeroed before anyone reads it
    // (wipePolicy Full, the default).
    n1.csi_ok(&format!("delete-volume {id}"));
    let id2 = n1.csi_ok("--output id create-volume --name fresh --size 64Mi --class san --block");
    n2.csi_ok(&format!("stage {id2} --staging-path /run/st --block"));
    n2.ok(&format!("cmp -n 67108864 {} /dev/zero", device(&id2)));
    n2.csi_ok(&format!("unstage {id2} --staging-path /run/st"));
    n2.csi_ok(&format!("delete-volume {id2}"));
    n1.stop_standalone();
    n2.stop_standalone();
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t3_a_multi_node_block_volume_is_active_on_both_nodes_and_filesystems_stay_single_node() {
    let [n1, n2] = serving();
    let rwx = "--block --mode multi-node-multi-writer";
    let id = n1.csi_ok(&format!(
        "--output id create-volume --name rwx --size 32Mi --class san {rwx}"
    ));
    n1.csi_ok(&format!("stage {id} --staging-path /run/st {rwx}"));
    n2.csi_ok(&format!("stage {id} --staging-path /run/st {rwx}"));
    let written = write_random(&n1, &device(&id), 2);
    assert_eq!(
        read_sum(&n2, &device(&id), 2),
        written,
        "node 2 reads what node 1 wrote"
    );
    // Growing it while both nodes hold it is FAILED_PRECONDITION naming the fix.
    let grow = n1.csi(&format!("expand {id} --size 64Mi --block"));
    assert!(
        grow.code != 0 && grow.err.contains("FailedPrecondition") && grow.err.contains("unstage"),
        "{}\n{}",
        grow.out,
        grow.err
    );
    let written = write_random(&n2, &device(&id), 2);
    assert_eq!(
        read_sum(&n1, &device(&id), 2),
        written,
        "and the other way round"
    );
    // Exclusive access is refused while both hold it shared.
    n1.csi_ok(&format!("unstage {id} --staging-path /run/st"));
    let refused = n1.csi(&format!("stage {id} --staging-path /run/st --block"));
    assert_ne!(refused.code, 0, "exclusive while node 2 holds it shared");
    n2.csi_ok(&format!("unstage {id} --staging-path /run/st"));
    n1.csi_ok(&format!("delete-volume {id}"));

    // A multi-node filesystem volume is INVALID_ARGUMENT.
    let r = n1.csi(
        "create-volume --name fs --size 300Mi --class san --fs xfs --mode multi-node-multi-writer",
    );
    assert!(
        r.err.contains("InvalidArgument") && r.err.contains("filesystem volumes are single-node"),
        "{}",
        r.err
    );
    n1.stop_standalone();
    n2.stop_standalone();
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t4_a_thin_volume_has_its_own_pool_moves_between_nodes_and_keeps_snapshots_and_clones_in_it() {
    let [n1, n2] = serving();
    let thin = "--param lvms.topolvm.io/volume-mode=thin";
    let lvs =
        |n: &Node, what: &str| n.ok(&format!("{} --noheadings -o {what} {CLASS}", scoped("lvs")));
    let id = n1.csi_ok(&format!(
        "--output id create-volume --name thin1 --size 64Mi --class san --block {thin}"
    ));
    let pool = format!("pool-{}", id.strip_prefix("csi-").unwrap());
    let listing = lvs(&n2, "lv_name,segtype,pool_lv,lv_attr");
    assert!(
        listing
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()[..3]
                == [id.as_str(), "thin", pool.as_str()]),
        "{listing}"
    );
    // A new thin volume reads as zeros whatever the LUN held (unprovisioned blocks, pool zeroing).
    n1.csi_ok(&format!("stage {id} --staging-path /run/st --block"));
    n1.ok(&format!("cmp -n 67108864 {} /dev/zero", device(&id)));
    let written = write_random(&n1, &device(&id), 4);
    // Staged on node 1 (its pool active there): node 2 is refused.
    let refused = n2.csi(&format!("stage {id} --staging-path /run/st --block"));
    assert!(
        refused.code != 0 && refused.err.contains("FailedPrecondition"),
        "{}",
        refused.err
    );
    // Multi-node access to a thin volume is refused before any LVM command.
    let rwx = n1.csi(&format!(
        "create-volume --name thin-rwx --size 64Mi --class san --block --mode multi-node-multi-writer {thin}"
    ));
    assert!(rwx.err.contains("InvalidArgument"), "{}", rwx.err);

    // A snapshot lives in the volume's pool; the pool grows to hold it.
    let snap = n1.csi_ok(&format!(
        "--output id create-snapshot --name s1 --source {id}"
    ));
    let listing = lvs(&n1, "lv_name,pool_lv");
    assert!(
        listing
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == [snap.as_str(), pool.as_str()]),
        "{listing}"
    );
    n1.csi_ok(&format!("unstage {id} --staging-path /run/st"));

    // Moved to node 2: unstage there, stage here; the data is intact.
    let t = Instant::now();
    n2.csi_ok(&format!("stage {id} --staging-path /run/st --block"));
    println!(
        "vm-shared: a thin volume moved from node 1 to node 2 (stage after unstage) in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(
        read_sum(&n2, &device(&id), 4),
        written,
        "the data moved with the volume"
    );
    // Grown online through node 2: pool and volume.
    n2.csi_ok(&format!("expand {id} --size 96Mi --block"));
    assert_eq!(
        n2.ok(&format!("blockdev --getsize64 {}", device(&id)))
            .trim(),
        (96u64 << 20).to_string()
    );
    n2.csi_ok(&format!("unstage {id} --staging-path /run/st"));

    // A clone of the snapshot, made on node 2, lives in the same pool and holds the data.
    let clone = n2.csi_ok(&format!(
        "--output id create-volume --name c1 --size 64Mi --class san --block --from-snapshot {snap}"
    ));
    n1.csi_ok(&format!("stage {clone} --staging-path /run/st2 --block"));
    assert_eq!(
        read_sum(&n1, &device(&clone), 4),
        written,
        "the clone holds the snapshot's data"
    );
    n1.csi_ok(&format!("unstage {clone} --staging-path /run/st2"));

    // Deleting them all removes the pool.
    n1.csi_ok(&format!("delete-volume {clone}"));
    n1.csi_ok(&format!("delete-snapshot {snap}"));
    n2.csi_ok(&format!("delete-volume {id}"));
    let left = lvs(&n1, "lv_name");
    assert!(!left.contains(&pool) && !left.contains(&id), "{left}");
    n1.stop_standalone();
    n2.stop_standalone();
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t5_the_manual_removal_in_docs_leaves_the_lun_blank_and_no_lockspace_on_either_node() {
    let [n1, n2] = Node::all();
    let dir = scratch();
    joined(&n1, &n2, &dir);
    // A volume is left on purpose: the manual path removes it with the group.
    n1.start_standalone(&dir.join("node1.yaml"));
    n1.csi_ok("create-volume --name left --size 16Mi --class san --block");
    n1.stop_standalone();
    // docs/shared-classes.md, "Removing a shared class by hand", step by step.
    let lvm = format!("--config global/use_lvmlockd=1 --devicesfile lvms-{CLASS}.devices");
    n2.ok(&format!("lvm vgchange {lvm} --lock-stop {CLASS}"));
    // sanlock on node 1 learns that node 2 left at its next lease renewal (every 2 × io timeout):
    // until then vgremove says the lockspace is not stopped on other hosts, and is tried again.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let r = n1.sh(&format!("lvm vgremove {lvm} --force {CLASS}"));
        if r.code == 0 {
            break;
        }
        assert!(
            r.err.contains("not stopped on other hosts") && Instant::now() < deadline,
            "node1: vgremove: {}\n{}",
            r.out,
            r.err
        );
        std::thread::sleep(Duration::from_secs(5));
    }
    // The group held the global lock: the PV, in no shared group now, is removed without lvmlockd.
    n1.ok(&format!(
        "lvm pvremove --config global/use_lvmlockd=0 --devicesfile lvms-{CLASS}.devices --yes {LUN}"
    ));
    for n in [&n1, &n2] {
        n.ok(&format!(
            "rm -f ${{LVM_SYSTEM_DIR:-/etc/lvm}}/devices/lvms-{CLASS}.devices"
        ));
    }
    for n in [&n1, &n2] {
        n.assert_blank();
    }
}

impl Node {
    /// `lvms leave --output json` of `config`: (exit code 0, the report).
    fn leave(&self, config: &std::path::Path) -> (bool, Value) {
        let r = self.sh(&format!(
            "{} leave --config {} --class {CLASS} --output json",
            env!("CARGO_BIN_EXE_lvms"),
            config.display()
        ));
        let report: Value = serde_json::from_str(&r.out)
            .unwrap_or_else(|e| panic!("{}: no JSON ({e}):\n{}\n{}", self.name, r.out, r.err));
        (r.code == 0, report)
    }

    /// No sanlock lockspace of the class on this node, and no signature on the LUN.
    #[track_caller]
    fn assert_blank(&self) {
        let lockspaces = self.ok("sanlock client status");
        assert!(
            !lockspaces.contains(&format!("lvm_{CLASS}")),
            "{}: {lockspaces}",
            self.name
        );
        let signatures = self.ok(&format!("wipefs --no-act {LUN}"));
        assert!(signatures.trim().is_empty(), "{}: {signatures}", self.name);
    }

    fn lockspace_started(&self) -> bool {
        self.ok("lvmlockctl --info")
            .contains(&format!("VG {CLASS} "))
    }
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared"]
fn t6_leaving_the_class_stops_both_lockspaces_and_the_remover_removes_the_group_once_it_is_empty() {
    let [n1, n2] = Node::all();
    let dir = scratch();
    // t5 left the LUN blank: node 1 (createVolumeGroups, the remover) makes the group again.
    let (c1, c2) = joined(&n1, &n2, &dir);
    n1.start_standalone(&c1);
    let id = n1.csi_ok("--output id create-volume --name kept --size 16Mi --class san --block");
    n1.stop_standalone();
    // An empty thin pool, as a thin volume's deletion can leave one when its removal fails.
    n1.ok(&format!(
        "{} && {}",
        scoped("lvcreate --type thin-pool --size 8Mi --name pool-left san"),
        scoped("lvchange --activate n san/pool-left")
    ));

    // A volume remains: every node refuses, names it, and keeps its lockspace.
    for (n, c) in [(&n1, &c1), (&n2, &c2)] {
        let (left, report) = n.leave(c);
        let (st, reason) = state(&report);
        assert!(
            !left && st == "refused" && reason.contains(&id) && !reason.contains("pool-left"),
            "{}: {report}",
            n.name
        );
        assert!(n.lockspace_started(), "{}", n.name);
    }
    n1.start_standalone(&c1);
    n1.csi_ok(&format!("delete-volume {id}"));
    n1.stop_standalone();

    // The remover goes first: it removes the empty pool, and vgremove waits for node 2.
    let (left, report) = n1.leave(&c1);
    let (st, reason) = state(&report);
    assert!(
        !left && st == "waiting" && reason.contains("other nodes"),
        "node1: {report}"
    );
    assert_eq!(actions(&report), ["removePool"], "node1: {report}");
    assert!(n1.lockspace_started());

    let (left, report) = n2.leave(&c2);
    assert!(left, "node2: {report}");
    assert_eq!(
        actions(&report),
        ["stopLockspace", "removeDevicesFile"],
        "node2: {report}"
    );
    assert!(!n2.lockspace_started());

    // sanlock on node 1 notices node 2's exit at a lease renewal; until then the remover waits.
    let since = Instant::now();
    let mut executed = Vec::new();
    loop {
        let (left, report) = n1.leave(&c1);
        executed.extend(actions(&report));
        if left {
            break;
        }
        let (st, _) = state(&report);
        assert!(
            st == "waiting" && since.elapsed() < Duration::from_secs(180),
            "node1: {report}"
        );
        std::thread::sleep(Duration::from_secs(5));
    }
    eprintln!(
        "the remover removed the group {:.1} s after node 2 left",
        since.elapsed().as_secs_f64()
    );
    assert_eq!(
        executed,
        [
            "removeVolumeGroup",
            "removePhysicalVolumes",
            "removeDevicesFile"
        ]
    );
    for n in [&n1, &n2] {
        assert!(!n.lockspace_started(), "{}", n.name);
        n.assert_blank();
        let listed = n.sh(&format!(
            "lvm lvmdevices --devicesfile lvms-{CLASS}.devices"
        ));
        assert!(
            !listed.out.contains("DEVNAME="),
            "{}: {}",
            n.name,
            listed.out
        );
    }
    // Leaving again changes nothing.
    for (n, c) in [(&n1, &c1), (&n2, &c2)] {
        let (left, report) = n.leave(c);
        assert!(left && actions(&report).is_empty(), "{}: {report}", n.name);
    }
}

// Fencing and failover (issue 13). Each `fencing_` test ends node 1 and gets a fresh pair of VMs
// and a fresh LUN from `cargo xtask vm-shared`. sanlock runs with the watchdog (softdog in the
// guests, petted by wdmd) and lvmlockctl runs `lvms fence` when node 1 loses its leases.

/// sanlock's io timeout in the power-loss test, which measures the failover budget (its default)
/// and the host-dead time it gives.
const IO_TIMEOUT: u64 = 10;
const HOST_DEAD: u64 = host_dead(IO_TIMEOUT);
/// The last renewal may precede a node's death by one renewal interval (2 × io timeout).
const EARLIEST_TAKEOVER: u64 = HOST_DEAD - 2 * IO_TIMEOUT;
/// The lost-path test checks the order of events (fenced, then taken over), not the budget: it
/// runs lvmlockd with a shorter io timeout, so it waits 8 × 5 s less; so do the shared-class
/// tests, which need no timing at all.
const SHORT_IO_TIMEOUT: u64 = 5;
/// How long node 2's stage waits in the power-loss test's restart check, which only needs the
/// refusal after a wait (the failover itself uses the default wait).
const REFUSAL_STAGE_WAIT: u64 = 10;

/// sanlock's host-dead time for an io timeout: 8 io timeouts without a renewal, then the
/// watchdog's 60 s.
const fn host_dead(io_timeout: u64) -> u64 {
    8 * io_timeout + 60
}
/// Node 1's path to the LUN in the lost-path test: a device-mapper map over it.
const LUN_MAP: &str = "/dev/mapper/lunpath";

impl Node {
    /// Starts wdmd on softdog (q35's iTCO watchdog may not reset the guest), sanlock with the
    /// watchdog and lvmlockd (wdmd needs /dev/shm), and points
    /// `lvmlockctl_kill_command` at `lvms fence`.
    fn start_fenced_lock_daemons(&self, io_timeout: u64) {
        self.ok(&format!(
            "mkdir -p /run/sanlock /run/lvm /run/wdmd; \
             modprobe softdog; test -e /dev/watchdog; \
             printf 'global {{\\n    lvmlockctl_kill_command = \"{} fence\"\\n}}\\n' \
               > /run/lvm-etc/lvmlocal.conf; \
             mkdir -p /dev/shm; mountpoint -q /dev/shm || mount -t tmpfs tmpfs /dev/shm; \
             soft=$(for d in /sys/class/watchdog/*; do \
               [ \"$(cat $d/identity)\" = 'Software Watchdog' ] && echo /dev/${{d##*/}}; done); \
             setsid wdmd -D -w $soft >/run/wdmd.log 2>&1 </dev/null & \
             for i in $(seq 50); do test -S /run/wdmd/wdmd.sock && break; sleep 0.2; done; \
             test -S /run/wdmd/wdmd.sock || {{ cat /run/wdmd.log; ls -l /run/wdmd /dev/watchdog*; \
               cat /sys/class/watchdog/*/identity; exit 1; }}; \
             sanlock daemon -U root -G root; \
             for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockd -g sanlock -o {io_timeout}; \
             for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done; \
             lvmlockctl --info >/dev/null",
            env!("CARGO_BIN_EXE_lvms")
        ));
        let hook = self.ok("lvm config --typeconfig full global/lvmlockctl_kill_command");
        assert!(hook.contains("lvms fence"), "{}: {hook}", self.name);
        let daemon = self.ok("sanlock client status -D | head -n 20");
        assert!(daemon.contains("use_watchdog=1"), "{}: {daemon}", self.name);
    }

    /// Whether the guest's command server answers (false once its machine is gone).
    fn alive(&self) -> bool {
        self.guest.alive()
    }
}

/// The machines' process ids (qemu or user-mode kernel) of the two guests.
fn machine_pids() -> [u32; 2] {
    let pids = std::env::var("LVMS_SHARED_PIDS").expect("LVMS_SHARED_PIDS (cargo xtask vm-shared)");
    let mut it = pids.split(',').map(|p| p.parse().unwrap());
    [it.next().unwrap(), it.next().unwrap()]
}

/// Both nodes joined with fencing armed (lvmlockd's sanlock io timeout `io_timeout`) and serving
/// the class; node 1 reaches the LUN through `node1_path`; node 2's stage of a volume node 1 holds
/// waits up to `node2_stage_wait` seconds. The nodes, and their configs.
fn fenced_serving(
    node1_path: &str,
    node2_stage_wait: u64,
    io_timeout: u64,
) -> ([Node; 2], [PathBuf; 2]) {
    let [n1, n2] = Node::all();
    let dir = scratch();
    let fenced = |id, create, path: &str| {
        shared_config(id, create, false)
            .replace(UNFENCED, "")
            .replace(LUN, path)
    };
    let c1 = config(&dir, "node1", &fenced(1, true, node1_path));
    let c2 = config(&dir, "node2", &fenced(2, false, LUN));
    for (n, c) in [(&n1, &c1), (&n2, &c2)] {
        n.start_fenced_lock_daemons(io_timeout);
        let r = n.sh(&format!(
            "LVMS_LOG=info {} converge --config {} --output json",
            env!("CARGO_BIN_EXE_lvms"),
            c.display()
        ));
        assert_eq!(
            r.code,
            0,
            "{}: converge failed:\n{}\n{}\nsanlock:\n{}\nwdmd:\n{}",
            n.name,
            r.out,
            r.err,
            n.sh("sanlock client log_dump | tail -n 40").out,
            n.sh("wdmd --dump 2>&1 | tail -n 20; ls -l /dev/watchdog* /run/wdmd")
                .out
        );
        // sanlock keeps lvmlockd's io timeout; the class says the default 10 s: the node reports
        // what sanlock keeps, and warns when the two differ.
        let report: serde_json::Value = serde_json::from_str(&r.out).unwrap();
        let fencing = &report[0]["fencing"];
        assert_eq!(fencing["renewals"]["ioTimeout"], io_timeout, "{fencing}");
        let message = fencing["verdict"]["message"].as_str().unwrap_or_default();
        assert_eq!(
            message.contains(&format!("io timeout {io_timeout} s")),
            io_timeout != 10,
            "{message}"
        );
    }
    n1.start_standalone(&c1);
    n2.start_standalone_waiting(&c2, node2_stage_wait);
    ([n1, n2], [c1, c2])
}

/// How node 2 got a volume node 1 held.
struct Takeover {
    /// After the event (`since`).
    at: Duration,
    /// NodeStage calls made, the last one succeeding.
    calls: u32,
    /// How long the last call took.
    last_call: Duration,
}

/// Node 2 tries to stage `id` every few seconds until it succeeds (at most `limit`); when, after
/// `since`.
fn stage_when_free(n2: &Node, id: &str, args: &str, since: Instant, limit: Duration) -> Takeover {
    let mut calls = 0;
    loop {
        calls += 1;
        let call = Instant::now();
        let r = n2.csi(&format!("stage {id} --staging-path /run/st-{id} {args}"));
        if r.code == 0 {
            return Takeover {
                at: since.elapsed(),
                calls,
                last_call: call.elapsed(),
            };
        }
        assert!(
            r.err.contains("FailedPrecondition") || r.err.contains("Unavailable"),
            "node 2's stage of {id} failed otherwise: {}",
            r.err
        );
        assert!(
            since.elapsed() < limit,
            "node 2 could not stage {id} within {limit:?}: {}",
            r.err
        );
        std::thread::sleep(Duration::from_secs(3));
    }
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared (a fresh pair: node 1 is killed)"]
fn fencing_power_loss_frees_the_volumes_after_the_host_dead_time_with_their_data() {
    let ([n1, n2], [_, c2]) = fenced_serving(LUN, REFUSAL_STAGE_WAIT, IO_TIMEOUT);
    let thin = "--param lvms.topolvm.io/volume-mode=thin";
    let linear_id =
        n1.csi_ok("--output id create-volume --name lin --size 64Mi --class san --block");
    let thin_id = n1.csi_ok(&format!(
        "--output id create-volume --name thin --size 64Mi --class san --block {thin}"
    ));
    let mut written = Vec::new();
    for id in [&linear_id, &thin_id] {
        n1.csi_ok(&format!("stage {id} --staging-path /run/st-{id} --block"));
        written.push(write_random(&n1, &device(id), 4));
    }

    // The agent restarts: the locks stay with the node, which is not fenced.
    let locks = |n: &Node| n.ok("lvmlockctl --info");
    let before = locks(&n1);
    n1.stop_standalone();
    let dir = scratch();
    n1.start_standalone(&config(
        &dir,
        "node1",
        &shared_config(1, true, false).replace(UNFENCED, ""),
    ));
    // Longer than a renewal interval, so a dropped lease would show.
    std::thread::sleep(Duration::from_secs(2 * IO_TIMEOUT + 5));
    // lvmlockd names LV locks by LV uuid: the linear volume's and the thin volume's pool's.
    let exclusive = |info: &str| -> Vec<String> {
        info.lines()
            .filter(|l| l.starts_with("LK LV ex"))
            .map(str::to_owned)
            .collect()
    };
    let after = locks(&n1);
    assert_eq!(exclusive(&before).len(), 2, "{before}");
    assert_eq!(
        exclusive(&after),
        exclusive(&before),
        "node 1 keeps both locks across the agent's restart:\n{after}"
    );
    // Node 2's stage waits and is refused: node 1 is alive and keeps the lock.
    let id = &linear_id;
    let refused = n2.csi(&format!("stage {id} --staging-path /run/st-{id} --block"));
    assert!(
        refused.code != 0
            && refused.err.contains("FailedPrecondition")
            && refused.err.contains("this stage waited"),
        "{}",
        refused.err
    );
    assert!(
        n1.sh("test -e /run/lvms/fenced-san").code != 0,
        "the restart fenced node 1"
    );
    assert_eq!(read_sum(&n1, &device(&linear_id), 4), written[0]);
    // For the failover, node 2's stages wait as long as they do by default.
    n2.stop_standalone();
    n2.start_standalone_waiting(&c2, lvms_engine::local::DEFAULT_SHARED_STAGE_WAIT.as_secs());

    // What sanlock says of the lockspace on node 2 (for the node agent's parsers).
    println!(
        "vm-shared: node 2's sanlock status:\n{}\nhost status:\n{}",
        n2.ok("sanlock client status -D"),
        n2.ok("sanlock client host_status -s lvm_san -D")
    );
    // Power loss.
    let [pid1, _] = machine_pids();
    let killed = Instant::now();
    lvms_testkit::guest::kill_machine(pid1);
    assert!(!n1.alive(), "node 1's machine is gone");

    // Node 2's stages wait in the call (the default 90 s), so the host-dead time is reached in
    // at most two calls, the last of which waits for the lock and then succeeds.
    let limit = Duration::from_secs(HOST_DEAD + 180);
    let linear = stage_when_free(&n2, &linear_id, "--block", killed, limit);
    let thin = stage_when_free(&n2, &thin_id, "--block", killed, limit);
    println!(
        "vm-shared: failover after power loss: linear volume usable on node 2 {:.0} s after the kill \
         ({} NodeStage calls, the last waiting {:.0} s), thin volume {:.0} s (budget: host dead \
         {HOST_DEAD} s after the last renewal, so {EARLIEST_TAKEOVER}–{HOST_DEAD} s after the kill)",
        linear.at.as_secs_f64(),
        linear.calls,
        linear.last_call.as_secs_f64(),
        thin.at.as_secs_f64()
    );
    assert!(
        linear.at >= Duration::from_secs(EARLIEST_TAKEOVER),
        "node 2 activated node 1's volume {:?} after the kill, before sanlock's host-dead time",
        linear.at
    );
    assert!(
        linear.calls <= 2 && linear.last_call >= Duration::from_secs(10),
        "node 2's stage did not wait for the lock: {} calls, the last {:?}",
        linear.calls,
        linear.last_call
    );
    assert_eq!(
        read_sum(&n2, &device(&linear_id), 4),
        written[0],
        "linear data intact"
    );
    assert_eq!(
        read_sum(&n2, &device(&thin_id), 4),
        written[1],
        "thin data intact"
    );
}

#[test]
#[ignore = "two VMs on one LUN: cargo xtask vm-shared (a fresh pair: node 1 is fenced)"]
fn fencing_a_lost_lun_path_stops_node_1_writing_before_node_2_takes_the_volume() {
    // Node 1 sees the LUN through a map the test can swap to the error target.
    let [n1, _] = Node::all();
    n1.ok(&format!(
        "dmsetup create lunpath --table \"0 $(blockdev --getsz {LUN}) linear $(readlink -f {LUN}) 0\""
    ));
    let ([n1, n2], [c1, _]) = fenced_serving(LUN_MAP, 0, SHORT_IO_TIMEOUT);
    let id = n1.csi_ok("--output id create-volume --name fs --size 128Mi --class san");
    let st = format!("/run/st-{id}");
    for n in [&n1, &n2] {
        n.ok(&format!("mkdir -p {st}"));
    }
    n1.csi_ok(&format!("stage {id} --staging-path {st} --fs ext4"));
    // A writer that counts the writes that reached the disk (fsync succeeded).
    n1.ok(&format!(
        "setsid sh -c 'i=0; while :; do dd if=/dev/urandom of={st}/f$((i % 8)) bs=64k count=4 \
         conv=fsync status=none 2>/dev/null && i=$((i+1)) && echo $i > /run/writes; sleep 0.2; done' \
         >/dev/null 2>&1 </dev/null &"
    ));
    std::thread::sleep(Duration::from_secs(5));
    let count = |n: &Node| {
        n.sh("cat /run/writes")
            .out
            .trim()
            .parse::<u64>()
            .unwrap_or(0)
    };
    assert!(count(&n1) > 0, "the writer writes");

    // The path is lost: node 1's map now fails every I/O, the lease area's included.
    n1.ok(&format!(
        "dmsetup suspend --noflush lunpath && \
         dmsetup load lunpath --table \"0 $(blockdev --getsz {LUN_MAP}) error\" && \
         dmsetup resume lunpath"
    ));
    let lost = Instant::now();
    let host_dead = host_dead(SHORT_IO_TIMEOUT);
    let limit = Duration::from_secs(host_dead + 180);
    // Watch node 1 (fenced by the hook, or reset by the watchdog) while node 2 tries the volume.
    let mut fenced: Option<(Duration, &str)> = None;
    let mut last_count = count(&n1);
    let took = loop {
        if fenced.is_none() {
            if !n1.alive() {
                fenced = Some((lost.elapsed(), "the watchdog reset node 1"));
            } else if n1.sh("test -e /run/lvms/fenced-san").code == 0 {
                fenced = Some((lost.elapsed(), "the kill hook fenced node 1"));
            } else {
                last_count = count(&n1);
            }
        }
        let r = n2.csi(&format!("stage {id} --staging-path {st} --fs ext4"));
        if r.code == 0 {
            break lost.elapsed();
        }
        assert!(
            lost.elapsed() < limit,
            "node 2 never got the volume: {}",
            r.err
        );
        std::thread::sleep(Duration::from_secs(3));
    };
    let (fenced_at, how) = fenced.expect("node 2 took the volume before node 1 was fenced");
    println!(
        "vm-shared: lost LUN path: {how} {:.0} s after the loss; node 2 staged the volume {:.0} s after \
         it (host dead {host_dead} s at lvmlockd's io timeout of {SHORT_IO_TIMEOUT} s)",
        fenced_at.as_secs_f64(),
        took.as_secs_f64()
    );
    assert!(fenced_at < took);
    if n1.alive() {
        let record = n1.ok("cat /run/lvms/fenced-san");
        assert!(record.contains("\"fenced\": true"), "{record}");
        // The node reports that it was fenced and does not serve the class.
        let (ok, reports, err) = n1.converge(&c1);
        let message = reports[0]["fencing"]["verdict"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(!ok && message.contains("was fenced"), "{reports:?}\n{err}");
        // The path comes back: nothing of node 1's reaches the disk any more.
        n1.ok(&format!(
            "dmsetup suspend --noflush lunpath && \
             dmsetup load lunpath --table \"0 $(blockdev --getsz {LUN_MAP}) linear $(readlink -f {LUN}) 0\" && \
             dmsetup resume lunpath"
        ));
        n1.sh("sync");
        let table = n1.ok(&format!(
            "dmsetup table {CLASS}-{} 2>&1 || true",
            id.replace('-', "--")
        ));
        assert!(
            table.trim().is_empty() || table.contains("error") || table.contains("No such device"),
            "node 1's volume still maps to the LUN: {table}"
        );
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(count(&n1), last_count, "node 1 wrote after it was fenced");
    }
    // Node 2 has the volume mounted (its journal replayed): it writes, unmounts, and the
    // filesystem checks clean.
    n2.ok(&format!("echo after > {st}/from-node-2 && sync"));
    n2.csi_ok(&format!("unstage {id} --staging-path {st}"));
    n2.csi_ok(&format!("stage {id} --staging-path {st} --block"));
    let fsck = n2.sh(&format!("fsck.ext4 -n -f {}", device(&id)));
    assert_eq!(fsck.code, 0, "fsck -n:\n{}\n{}", fsck.out, fsck.err);
    if !n1.alive() {
        return;
    }
    // Node 1 comes back by itself. While its fenced volume is still mounted it waits, saying so.
    let (ok, reports, _) = n1.converge(&c1);
    let said = serde_json::to_string(&reports).unwrap();
    assert!(!ok && said.contains("still open"), "{said}");
    assert_eq!(
        n1.sh("test -e /run/lvms/fenced-san").code,
        0,
        "still fenced"
    );
    // Its pod is gone and kubelet unmounted the volume: the next converge clears what the hook left
    // and joins again.
    // (`write[s]`: the pattern must not match this very command line.)
    n1.ok(&format!("pkill -f /run/write[s]; sleep 1; umount {st}"));
    let unmounted = Instant::now();
    let (ok, reports, err) = n1.converge(&c1);
    assert!(ok, "{reports:?}\n{err}");
    let steps: Vec<&str> = reports[0]["rejoined"]
        .as_array()
        .map(|s| s.iter().filter_map(|s| s["action"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(steps.last().copied(), Some("clearRecord"), "{reports:?}");
    assert!(
        steps.contains(&"removeDevice") && steps.contains(&"stopLockspace"),
        "{steps:?}"
    );
    assert_ne!(
        n1.sh("test -e /run/lvms/fenced-san").code,
        0,
        "the record is gone"
    );
    assert_eq!(
        reports[0]["plan"]["state"]["state"], "joined",
        "{reports:?}"
    );
    println!(
        "vm-shared: lost LUN path: node 1 joined again {:.0} s after its volume was unmounted",
        unmounted.elapsed().as_secs_f64()
    );
}
