//! The `lvms` binary against real LVM, inside the test VM (`cargo xtask vm-test lvms_`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use lvms_testkit::{Scratch, sh};

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
