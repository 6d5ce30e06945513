//! `cargo xtask deps`: the Debian packages the VM suite, the control plane and the demo need.

use std::{path::Path, process::Command};

use anyhow::{Result, bail};

use crate::vm;

/// Commands the VM suite and the tests need, and the Debian package that brings each.
const DEPS: &[(&str, &str)] = &[
    ("/usr/bin/qemu-system-x86_64", "qemu-system-x86"),
    // Guests run as user-mode Linux (ADR 0026, 0027).
    ("/usr/bin/linux.uml", "user-mode-linux"),
    // Their network, when they need one (ADR 0027).
    ("/usr/bin/slirp-fullbolt", "slirp"),
    ("/bin/busybox", "busybox-static"),
    ("/sbin/lvm", "lvm2"),
    ("/usr/sbin/thin_check", "thin-provisioning-tools"),
    ("/sbin/mkfs.xfs", "xfsprogs"),
    ("/sbin/mkfs.ext4", "e2fsprogs"),
    ("/usr/bin/cpio", "cpio"),
    ("/lib/systemd/systemd-udevd", "udev"),
    ("/sbin/sfdisk", "fdisk"),
    ("/sbin/modprobe", "kmod"),
    ("/usr/bin/etcd", "etcd-server"),
    ("/usr/bin/curl", "curl"),
    ("/usr/bin/xz", "xz-utils"),
    // Shared device classes: the lock daemons run in the guests as host services would.
    ("/usr/sbin/sanlock", "sanlock"),
    ("/usr/sbin/lvmlockd", "lvm2-lockd"),
    // The real node (`cargo xtask installed`): kubelet's container runtime, its CNI plugins and
    // iptables run in the guest; mmdebstrap builds the lvms image's Debian rootfs on the host.
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/bin/mmdebstrap", "mmdebstrap"),
    // pip installs the gRPC C-core client (grpcio) the CSI contract tests run.
    (
        "/usr/lib/python3/dist-packages/pip/__init__.py",
        "python3-pip",
    ),
];

/// Set for the phases `cargo xtask test` starts, which it has checked the packages for.
pub const CHECKED_ENV: &str = "LVMS_XTASK_DEPS_CHECKED";

/// Installs whatever of [`DEPS`] (and a kernel for the VM) is missing, once per task: the phases of
/// `cargo xtask test` inherit [`CHECKED_ENV`] and skip this.
pub fn ensure() -> Result<()> {
    if std::env::var_os(CHECKED_ENV).is_some() {
        return Ok(());
    }
    let mut missing: Vec<&str> = DEPS
        .iter()
        .filter(|(path, _)| !Path::new(path).exists())
        .map(|(_, pkg)| *pkg)
        .collect();
    if vm::kernel_version().is_err() {
        missing.push("linux-image-amd64");
    }
    if missing.is_empty() {
        println!("deps: all present");
        return Ok(());
    }
    println!("deps: installing {}", missing.join(" "));
    let status = Command::new("apt-get").arg("update").status()?;
    if !status.success() {
        bail!("apt-get update failed (run as root)");
    }
    let status = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    if !status.success() {
        bail!("apt-get install {} failed", missing.join(" "));
    }
    Ok(())
}
