//! The `lvms` binary against real LVM, inside the test VM (`cargo xtask vm-test lvms_`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use lvms_testkit::{Scratch, sh, sh_status};

fn lvms(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lvms"))
        .args(args)
        .output()
        .expect("run lvms");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn write_config(s: &mut Scratch, body: impl FnOnce(&str, &[String]) -> String) -> (String, String) {
    let vg = s.vg_name();
    let path = format!("/tmp/{vg}.yaml");
    std::fs::write(&path, body(&vg, &s.disks)).unwrap();
    (vg, path)
}

/// `lvms standalone` on `config` as node1, serving on `/run/<name>.sock` with its log in
/// `/run/<name>.log`, once its Probe answers ready (within `secs`). Returns its pid.
fn start_standalone(config: &str, name: &str, secs: u64) -> String {
    let pid = sh(&format!(
        "setsid {} standalone --config {config} --endpoint /run/{name}.sock --node-id node1 \
         >/run/{name}.log 2>&1 </dev/null & echo $!",
        env!("CARGO_BIN_EXE_lvms")
    ))
    .trim()
    .to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !csi(name, &["probe"]).0 {
        assert!(
            std::time::Instant::now() < deadline,
            "lvms standalone not ready in {secs} s:\n{}",
            sh(&format!("cat /run/{name}.log"))
        );
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    pid
}

/// `lvms csi` against the standalone driver [`start_standalone`] started as `name`.
fn csi(name: &str, args: &[&str]) -> (bool, String, String) {
    let socket = format!("/run/{name}.sock");
    let mut all = vec!["csi", "--endpoint", &socket];
    all.extend_from_slice(args);
    lvms(&all)
}

#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_converge_json_second_run_executes_nothing() {
    let mut s = Scratch::new(1, 1200);
    let (vg, config) = write_config(&mut s, |vg, disks| {
        format!(
            "deviceClasses:\n  - name: {vg}\n    deviceSelector:\n      paths: [{}]\n    \
             thinPoolConfig:\n      name: pool\n      overprovisionRatio: 10\n      metadataSize: 16Mi\n",
            disks[0]
        )
    });
    let (ok, out, err) = lvms(&["converge", "--config", &config, "--output", "json"]);
    assert!(ok, "{err}");
    let first: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(first[0]["deviceClass"], vg.as_str());
    assert_eq!(first[0]["plan"]["state"]["state"], "ready");
    let actions: Vec<&str> = first[0]["executed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "createPhysicalVolume",
            "createVolumeGroup",
            "createThinPool"
        ]
    );

    let (ok, out, err) = lvms(&["converge", "--config", &config, "--output", "json"]);
    assert!(ok, "{err}");
    let second: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(second[0]["executed"], serde_json::json!([]));
    assert_eq!(
        sh(&format!("lvm lvs --noheadings -o lv_name {vg}")).trim(),
        "pool"
    );
}

#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_leave_of_a_local_class_refuses_while_a_volume_remains_then_removes_group_and_labels() {
    let mut s = Scratch::new(1, 1200);
    let disk = s.disks[0].clone();
    let (vg, config) = write_config(&mut s, |vg, disks| {
        format!(
            "deviceClasses:\n  - name: {vg}\n    deviceSelector:\n      paths: [{}]\n    \
             thinPoolConfig:\n      name: pool\n      overprovisionRatio: 10\n      metadataSize: 16Mi\n",
            disks[0]
        )
    });
    let (ok, _, err) = lvms(&["converge", "--config", &config]);
    assert!(ok, "{err}");
    sh(&format!("lvm lvcreate -q -V 8m -T {vg}/pool -n vol1"));

    // A volume remains: nothing is removed, and the refusal names it.
    let (ok, out, err) = lvms(&["leave", "--config", &config, "--class", &vg]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("Refused: ManualCleanupRequired") && out.contains("vol1"),
        "{out}"
    );
    assert!(err.contains("not left yet"), "{err}");
    assert_eq!(sh_status(&format!("lvm lvs {vg}/vol1")).0, 0, "volume kept");

    // Once it is gone: pool, group and the disk's label go, in that order.
    sh(&format!("lvm lvremove -q -y {vg}/vol1"));
    let (ok, out, err) = lvms(&[
        "leave", "--config", &config, "--class", &vg, "--output", "json",
    ]);
    assert!(ok, "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["plan"]["state"]["state"], "left");
    let steps: Vec<&str> = report["executed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        ["removePool", "removeVolumeGroup", "removePhysicalVolumes"]
    );
    assert_ne!(sh_status(&format!("lvm vgs {vg}")).0, 0, "group removed");
    assert_ne!(sh_status(&format!("lvm pvs {disk}")).0, 0, "label removed");

    // Leaving again finds nothing to do.
    let (ok, out, err) = lvms(&["leave", "--config", &config, "--class", &vg]);
    assert!(ok, "{err}");
    assert!(
        out.contains("Left") && out.contains("actions: none"),
        "{out}"
    );
}

#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_converge_exits_non_zero_and_explains_a_failed_class() {
    let mut s = Scratch::new(1, 1200);
    sh(&format!("mkfs.ext4 -q {}", s.disks[0]));
    let (_vg, config) = write_config(&mut s, |vg, disks| {
        format!(
            "deviceClasses:\n  - name: {vg}\n    deviceSelector:\n      paths: [{}]\n",
            disks[0]
        )
    });
    let (ok, out, err) = lvms(&["converge", "--config", &config]);
    assert!(!ok);
    assert!(out.contains("Failed"), "{out}");
    assert!(out.contains("forceWipeDevicesAndDestroyAllData"), "{out}");
    assert!(err.contains("not ready"), "{err}");
}

/// Issue 35: one class on a disk that holds a foreign volume group no longer keeps the healthy
/// class beside it from serving. The driver becomes ready, serves the healthy class, and answers a
/// call naming the failed class with its reason; the foreign group is left as it was.
#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_standalone_serves_its_ready_classes_and_answers_a_failed_ones_reason() {
    let mut s = Scratch::new(2, 1200);
    let foreign = s.vg_name();
    sh(&format!("lvm vgcreate -q {foreign} {} 2>&1", s.disks[1]));
    let bad = s.vg_name();
    let (good, config) = write_config(&mut s, |vg, disks| {
        format!(
            "deviceClasses:\n  - name: {vg}\n    default: true\n    deviceSelector:\n      \
             paths: [{}]\n  - name: {bad}\n    deviceSelector:\n      paths: [{}]\n",
            disks[0], disks[1]
        )
    });
    // Ready with one healthy class of two.
    let pid = start_standalone(&config, &good, 120);
    let csi = |args: &[&str]| csi(&good, args);
    let log = || sh(&format!("cat /run/{good}.log"));
    let (ok, id, err) = csi(&[
        "--output",
        "id",
        "create-volume",
        "--name",
        "healthy",
        "--size",
        "64Mi",
        "--class",
        &good,
    ]);
    assert!(ok, "{err}\n{}", log());
    assert!(
        sh(&format!("lvm lvs --noheadings -o lv_name {good}")).contains(id.trim()),
        "the volume is in the healthy class"
    );
    let (ok, out, err) = csi(&[
        "create-volume",
        "--name",
        "in-bad",
        "--size",
        "64Mi",
        "--class",
        &bad,
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("Unavailable")
            && err.contains(&format!("device class {bad} is not ready"))
            && err.contains(&format!("volume group {foreign}")),
        "the failed class's reason: {err}"
    );
    assert!(
        log().contains(&format!("not ready: {bad}")),
        "the log names the class not served:\n{}",
        log()
    );
    assert_eq!(
        sh(&format!("lvm vgs --noheadings -o lv_count {foreign}")).trim(),
        "0",
        "the foreign group is untouched"
    );
    let (ok, _, err) = csi(&["delete-volume", id.trim()]);
    assert!(ok, "{err}");
    sh(&format!("kill {pid}; sleep 1"));
}

#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_devices_reports_usable_disks_and_excluded_decoys_with_reasons() {
    let s = Scratch::new(2, 1200);
    sh(&format!("mkfs.xfs -q {}", s.disks[1]));
    let (ok, out, err) = lvms(&["devices", "--output", "json"]);
    assert!(ok, "{err}");
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let find = |path: &str| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["device"]["path"] == path)
            .unwrap_or_else(|| panic!("{path} missing from {out}"))
            .clone()
    };
    assert_eq!(find(&s.disks[0])["verdict"]["verdict"], "usable");
    let excluded = find(&s.disks[1]);
    assert_eq!(excluded["verdict"]["verdict"], "excluded");
    assert_eq!(
        excluded["verdict"]["reasons"][0]["code"],
        "filesystemSignature"
    );
    // The read-only virtio decoy is reported with its by-id link.
    let ro = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| {
            r["device"]["byId"]
                .as_array()
                .is_some_and(|ids| ids.iter().any(|i| i == "/dev/disk/by-id/virtio-decoy-ro"))
        })
        .expect("decoy-ro listed");
    assert!(
        ro["verdict"]["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["code"] == "readOnly")
    );
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

/// `lvm <sub>` on the shared volume group `vg`, with lvmlockd and its devices file.
fn lvm_shared(vg: &str, sub: &str, args: &str) -> String {
    sh(&format!(
        "lvm {sub} --config global/use_lvmlockd=1 --devicesfile lvms-{vg}.devices {args}"
    ))
}

/// The bytes of `dev` at `offset` (`len` of them, read past the page cache).
fn read_at(dev: &str, offset: u64, len: usize) -> Vec<u8> {
    let out = Command::new("dd")
        .args([
            &format!("if={dev}"),
            "bs=4096",
            &format!("skip={}", offset / 4096),
            "count=1",
            "iflag=direct",
            "status=none",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "dd of {dev} at {offset}");
    out.stdout[..len].to_vec()
}

fn write_at(dev: &str, offset: u64, data: &str) {
    sh(&format!(
        "printf '%-4096s' '{data}' | dd of={dev} bs=4096 seek={} count=1 oflag=direct status=none",
        offset / 4096
    ));
}

/// A `wipePolicy: Full` linear volume of a shared class (sanlock and lvmlockd in this VM, as the
/// csi-sanity shared mode runs them), staged with a zeroing record pre-set as a crash leaves it: the
/// stage zeroes from the record to the end and not below it (which a zeroing restarted from byte 0
/// would), then drops both tags. The record is 64 MiB short of the end, so that the guest zeroes
/// little: its loop disk is a file in tmpfs, which cannot zero a range in place, so the kernel may
/// write zero pages, into the guest's memory.
#[test]
#[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
fn lvms_shared_stage_resumes_an_interrupted_zeroing_from_its_record() {
    let started = std::time::Instant::now();
    let mut s = Scratch::new(1, 2600);
    sh("mkdir -p /run/sanlock /run/lvm; \
        sanlock client status >/dev/null 2>&1 || sanlock daemon -w 0 -U root -G root; \
        for i in $(seq 50); do sanlock client status >/dev/null 2>&1 && break; sleep 0.2; done; \
        lvmlockctl --info >/dev/null 2>&1 || lvmlockd -g sanlock; \
        for i in $(seq 50); do lvmlockctl --info >/dev/null 2>&1 && break; sleep 0.2; done; \
        lvmlockctl --info >/dev/null");
    let (vg, config) = write_config(&mut s, |vg, disks| {
        format!(
            "shared:\n  hostId: 1\n  createVolumeGroups: true\ndeviceClasses:\n  - name: {vg}\n    \
             default: true\n    deviceAccessPolicy: shared\n    deviceSelector:\n      paths: [{}]\n    \
             sharedConfig:\n      watchdog: Disabled\n",
            disks[0]
        )
    });
    let (ok, out, err) = lvms(&["converge", "--config", &config, "--output", "json"]);
    assert!(ok, "{out}\n{err}");
    let pid = start_standalone(&config, &vg, 300);
    let csi = |args: &[&str]| csi(&vg, args);

    let (ok, id, err) = csi(&[
        "--output",
        "id",
        "create-volume",
        "--name",
        "zero",
        "--size",
        "2Gi",
        "--block",
    ]);
    assert!(ok, "{err}");
    let id = id.trim().to_owned();
    let lv = format!("{vg}/{id}");
    let dev = format!("/dev/{lv}");
    let tags = |lv: &str| lvm_shared(&vg, "lvs", &format!("--noheadings -o lv_tags {lv}"));
    assert!(tags(&lv).contains("lvms.unwiped"), "{}", tags(&lv));

    // Old data right below the record, right above it, and in the last block; then the record.
    lvm_shared(&vg, "lvchange", &format!("--activate ey {lv}"));
    let record = 2 * GIB - 64 * MIB;
    let marks = [
        (record - 4096, "kept"),
        (record, "old-1"),
        (2 * GIB - 4096, "old-2"),
    ];
    for (offset, text) in marks {
        write_at(&dev, offset, text);
    }
    lvm_shared(&vg, "lvchange", &format!("--activate n {lv}"));
    lvm_shared(
        &vg,
        "lvchange",
        &format!("--addtag lvms.wiped-to={record} {lv}"),
    );

    let stage = format!("/run/{vg}-st");
    let t = std::time::Instant::now();
    let (ok, _, err) = csi(&["stage", &id, "--staging-path", &stage, "--block"]);
    assert!(ok, "{err}\n{}", sh(&format!("cat /run/{vg}.log")));
    eprintln!(
        "vm-cli: the resumed zeroing of 64 MiB staged in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    assert_eq!(
        read_at(&dev, record - 4096, 4),
        b"kept",
        "below the record: untouched"
    );
    for (offset, _) in &marks[1..] {
        assert!(
            read_at(&dev, *offset, 4096).iter().all(|b| *b == 0),
            "at {offset}: not zeroed"
        );
    }
    let after = tags(&lv);
    assert!(
        !after.contains("lvms.unwiped") && !after.contains("lvms.wiped-to"),
        "{after}"
    );

    let (ok, _, err) = csi(&["unstage", &id, "--staging-path", &stage]);
    assert!(ok, "{err}");
    let (ok, _, err) = csi(&["delete-volume", &id]);
    assert!(ok, "{err}");
    sh(&format!("kill {pid}; sleep 1"));
    // Scratch's cleanup does not see a shared group: remove it here (which stops its lockspace).
    let _ = lvms_testkit::sh_status(&format!(
        "lvm vgremove --config global/use_lvmlockd=1 --devicesfile lvms-{vg}.devices -y {vg}"
    ));
    eprintln!(
        "vm-cli: shared zeroing test took {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
