//! Dev-only helpers for lvms-rs tests that run inside the test VM (`cargo xtask vm-test`): scratch disks on
//! loop devices, scratch volume-group names, and a shell helper for setting up and checking the machine
//! independently of the code under test; the test VM's command protocol ([`guest`]), which xtask uses
//! too (without the default `full` feature, which brings the in-memory API server and the fakes).
#![forbid(unsafe_code)]
// Test scaffolding: a failed setup step should stop the test loudly.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

#[cfg(feature = "full")]
pub mod csi_requests;
#[cfg(feature = "full")]
pub mod fake_api;
#[cfg(feature = "full")]
pub mod fake_backend;
pub mod guest;

/// True inside the test VM (the guest script exports `LVMS_IN_VM=1`).
pub fn in_vm() -> bool {
    std::env::var("LVMS_IN_VM").is_ok_and(|v| v == "1")
}

/// Panics unless running in the VM: VM tests must never run against a developer's real disks.
pub fn require_vm() {
    assert!(
        in_vm(),
        "this test drives real LVM and runs only inside the test VM: use `cargo xtask vm-test`"
    );
}

/// Runs a shell command for test setup or verification; panics with its output when it fails.
pub fn sh(cmd: &str) -> String {
    let out = sh_status(cmd);
    assert!(out.0 == 0, "`{cmd}` failed ({}):\n{}", out.0, out.1);
    out.1
}

/// Runs a shell command and returns (exit status, stdout + stderr), without judging it.
pub fn sh_status(cmd: &str) -> (i32, String) {
    let out = Command::new("sh")
        .args(["-c", cmd])
        .output()
        .unwrap_or_else(|e| panic!("cannot run sh for `{cmd}`: {e}"));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// One `lvs` field of `vg/lv`, sizes in bytes (`lvm lvs --units b --nosuffix`), read independently of the
/// code under test.
pub fn lvs_field(vg: &str, lv: &str, field: &str) -> String {
    sh(&format!(
        "lvm lvs --noheadings --units b --nosuffix -o {field} {vg}/{lv} 2>/dev/null"
    ))
    .trim()
    .to_owned()
}

/// One `vgs` field of `vg`, sizes in bytes.
pub fn vgs_field(vg: &str, field: &str) -> String {
    sh(&format!(
        "lvm vgs --noheadings --units b --nosuffix -o {field} {vg} 2>/dev/null"
    ))
    .trim()
    .to_owned()
}

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A unique name with the given prefix, valid as an LVM name (`t1vg3`).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id() % 10_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Sparse files on the guest's tmpfs attached as loop devices. Dropping it removes every volume group on
/// them (forcefully: test data only), detaches the loop devices and deletes the files.
pub struct Scratch {
    pub disks: Vec<String>,
    files: Vec<PathBuf>,
    /// Volume groups to remove on drop.
    pub vgs: Vec<String>,
}

impl Scratch {
    /// `count` loop disks of `size_mib` MiB each.
    pub fn new(count: usize, size_mib: u64) -> Self {
        require_vm();
        std::fs::create_dir_all("/tmp/lvms-scratch").expect("scratch dir");
        let mut s = Scratch {
            disks: vec![],
            files: vec![],
            vgs: vec![],
        };
        for _ in 0..count {
            let file = PathBuf::from(format!("/tmp/lvms-scratch/{}.img", unique("d")));
            let f = std::fs::File::create(&file).expect("scratch file");
            f.set_len(size_mib * 1024 * 1024).expect("sparse size");
            let dev = sh(&format!("losetup --find --show {}", file.display()))
                .trim()
                .to_owned();
            s.disks.push(dev);
            s.files.push(file);
        }
        s
    }

    /// A fresh volume-group name removed on drop.
    pub fn vg_name(&mut self) -> String {
        let name = unique("tvg");
        self.vgs.push(name.clone());
        name
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for vg in &self.vgs {
            let _ = sh_status(&format!(
                "for m in $(awk '$5 ~ \"^/run/lvms-mnt/\" {{print $5}}' /proc/self/mountinfo | sort -r); do umount -l $m; done; \
                 lvm vgchange -an {vg} >/dev/null 2>&1; lvm vgremove -ff -y {vg} >/dev/null 2>&1"
            ));
        }
        for (dev, file) in self.disks.iter().zip(&self.files) {
            let _ = sh_status(&format!(
                "lvm pvremove -ff -y {dev} >/dev/null 2>&1; losetup -d {dev}"
            ));
            let _ = std::fs::remove_file(file);
        }
    }
}
