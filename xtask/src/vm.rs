//! The test VM: a Debian kernel with the host's root filesystem as its root, so test binaries built on
//! the host run inside unchanged against a kernel that has device-mapper. Two machines run it
//! ([`Machine`]), from one [`VmSpec`]:
//!
//! - **user-mode Linux** (Debian's `user-mode-linux`: the same kernel source built as a host program):
//!   the root is the host's `/` over hostfs, disks are ubd devices. No instruction is emulated, so LVM
//!   runs several times faster than under TCG (ADR 0026). Guests without a network run here, on one
//!   CPU.
//! - **qemu** (TCG) booting Debian's kernel: the initramfs holds only busybox and the virtio/9p modules.
//!   Its `/init` mounts the host root over virtio-9p, moves `/dev`, `/proc` and `/sys` into it, mounts a
//!   tmpfs on `/run` and switches root.
//!
//! Either way PID 1 then runs the guest script named on the kernel command line (`lvms.script=`). The
//! guest script writes its exit status to a file beside it; the host reads that after the machine exits.
//! See docs/decisions/0002-real-lvm-in-a-qemu-vm.md and 0026-user-mode-linux-for-guests-without-a-network.md.

use std::{
    fmt::Write as _,
    fs,
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::relay::Relay;

/// Modules the initramfs loads (with their dependencies, in `modprobe --show-depends` order) before it can
/// mount the host root.
const INITRAMFS_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "9pnet_virtio", "9p"];

/// Modules the guest loads from the host's `/lib/modules` once it runs in the shared root.
const GUEST_MODULES: &[&str] = &[
    "virtio_blk",
    "dm_mod",
    "dm_thin_pool",
    "dm_snapshot",
    "dm_mirror",
    "dm_raid",
    "raid1",
    "raid10",
    "raid456",
    "xfs",
    "ext4",
    "loop",
];

/// Debian's user-mode Linux kernel (package user-mode-linux) and where its modules are.
const UML_BINARY: &str = "/usr/bin/linux.uml";
const UML_MODULES: &str = "/usr/lib/uml/modules";
/// slirp (package slirp): a user-mode guest's network.
const SLIRP: &str = "/usr/bin/slirp-fullbolt";

/// What runs a guest (ADR 0026).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// qemu with TCG, booting Debian's kernel: any number of vCPUs, user-mode networking.
    Qemu,
    /// Debian's user-mode Linux: one CPU, no emulated instructions; slirp's network, whose
    /// forwarded ports go over connections the guest opens ([`Relay`], ADR 0027).
    Uml,
}

impl Machine {
    /// `LVMS_VM_MACHINE` (`qemu` or `uml`) if set; else user-mode Linux when it is installed; else
    /// qemu. A user-mode guest has one CPU whatever `cpus` says: faster alone than a TCG guest on
    /// two (ADR 0026, 0027).
    fn for_host(kernel: &Kernel) -> Result<Self> {
        let wanted = std::env::var("LVMS_VM_MACHINE").ok();
        Self::choose(wanted.as_deref(), kernel.uml.is_some())
    }

    fn choose(wanted: Option<&str>, uml_installed: bool) -> Result<Self> {
        match wanted {
            Some("qemu") => Ok(Self::Qemu),
            Some("uml") if !uml_installed => {
                bail!("LVMS_VM_MACHINE=uml, but {UML_BINARY} is missing: install user-mode-linux")
            }
            Some("uml") => Ok(Self::Uml),
            Some(other) if !other.is_empty() => {
                bail!("LVMS_VM_MACHINE={other}: expected qemu or uml")
            }
            _ if uml_installed => Ok(Self::Uml),
            _ => Ok(Self::Qemu),
        }
    }
}

/// A disk attached to a VM as a virtio block device with a serial, so `/dev/disk/by-id/virtio-<serial>`
/// exists inside.
#[derive(Debug, Clone)]
pub struct Disk {
    /// virtio serial (at most 20 bytes).
    pub serial: String,
    /// Backing image (a sparse raw file).
    pub image: PathBuf,
    /// Attach without image locking and with `share-rw`, so a second VM can attach the same image
    /// (shared-VG mode).
    pub shared: bool,
    /// Attach read-only (lsblk shows RO=1 inside).
    pub readonly: bool,
}

#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Names the VM's work directory and prefixes its console lines.
    pub name: String,
    pub disks: Vec<Disk>,
    pub memory_mib: u32,
    pub cpus: u32,
    /// User-mode networking: the guest gets 10.0.2.15 and reaches the host's loopback at 10.0.2.2.
    pub net: bool,
    /// With `net`: host loopback ports forwarded to guest ports, `(host, guest)`.
    pub forwards: Vec<(u16, u16)>,
    /// Shell commands run in the guest (after the standard prelude), from `cwd`.
    pub command: String,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
}

/// vCPUs a guest gets unless it asks for fewer: `LVMS_VM_CPUS` (`cargo xtask test` sets 1 while
/// two phases run side by side: a TCG guest is mostly one busy vCPU), else 2.
pub fn default_cpus() -> u32 {
    std::env::var("LVMS_VM_CPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(2)
}

impl VmSpec {
    /// A VM named `name` that runs `command` from the checkout `repo`: 2048 MiB, [`default_cpus`]
    /// vCPUs, no disks, no network, a 60-minute timeout.
    pub fn new(name: &str, repo: &Path, command: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            disks: Vec::new(),
            memory_mib: 2048,
            cpus: default_cpus(),
            net: false,
            forwards: Vec::new(),
            command: command.into(),
            cwd: repo.to_path_buf(),
            env: Vec::new(),
            timeout: Duration::from_secs(60 * 60),
        }
    }

    pub fn disks(mut self, disks: Vec<Disk>) -> Self {
        self.disks = disks;
        self
    }

    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// At most `cpus` vCPUs (fewer when [`default_cpus`] is lower).
    pub fn cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus.min(default_cpus());
        self
    }

    /// Exactly `cpus` vCPUs, whatever [`default_cpus`] says: for a guest whose own timeouts
    /// (kubelet's probes) fail on one busy vCPU.
    pub fn exact_cpus(mut self, cpus: u32) -> Self {
        self.cpus = cpus;
        self
    }

    /// User-mode networking with these `(host, guest)` port forwards.
    pub fn net(mut self, forwards: Vec<(u16, u16)>) -> Self {
        self.net = true;
        self.forwards = forwards;
        self
    }

    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The host's value of each of `keys` that is set, passed into the guest.
    pub fn env_from_host(mut self, keys: &[&str]) -> Self {
        for key in keys {
            if let Ok(v) = std::env::var(key) {
                self.env.push(((*key).into(), v));
            }
        }
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// A fresh sparse disk `SERIAL=SIZE_IN_MIB` of this process's run (`<target>/vm/disks-<pid>/`, so
/// runs side by side never share or truncate each other's images).
pub fn disk(repo: &Path, spec: &str) -> Result<Disk> {
    let (serial, mib) = spec
        .split_once('=')
        .context("a disk is SERIAL=SIZE_IN_MIB, e.g. --disk data0=2048")?;
    let size = mib.parse::<u64>().context("disk size in MiB")? * 1024 * 1024;
    let image = disks_dir(repo).join(format!("{serial}.img"));
    make_disk(&image, size)?;
    Ok(Disk {
        serial: serial.into(),
        image,
        shared: false,
        readonly: false,
    })
}

/// [`disk`] for each spec.
pub fn disks(repo: &Path, specs: &[&str]) -> Result<Vec<Disk>> {
    specs.iter().map(|s| disk(repo, s)).collect()
}

/// This process's disk images, removed when the task ends.
pub fn disks_dir(repo: &Path) -> PathBuf {
    vm_dir(repo).join(format!("disks-{}", std::process::id()))
}

/// Where VM artefacts live: `<target>/vm`.
pub fn vm_dir(repo: &Path) -> PathBuf {
    repo.join("target").join("vm")
}

/// The newest kernel that has both an image in /boot and modules in /lib/modules.
pub fn kernel_version() -> Result<String> {
    let modules = fs::read_dir("/lib/modules")
        .context("reading /lib/modules: install linux-image-amd64")?
        .filter_map(|e| e.ok())
        .filter(|e| {
            let v = e.file_name();
            Path::new(&format!("/boot/vmlinuz-{}", v.to_string_lossy())).exists()
        });
    newest(modules).context(
        "no kernel with both /boot/vmlinuz-<v> and /lib/modules/<v>: install linux-image-amd64",
    )
}

fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Module files to load, deduplicated, dependencies first.
fn module_files(version: &str, modules: &[&str]) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = Vec::new();
    for m in modules {
        let out = Command::new("modprobe")
            .args(["-S", version, "--show-depends", m])
            .output()
            .context("running modprobe --show-depends (package kmod)")?;
        if !out.status.success() {
            bail!(
                "modprobe --show-depends {m} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            // "insmod /lib/modules/<v>/kernel/…/x.ko " or "builtin x"
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = PathBuf::from(path.split_whitespace().next().unwrap_or_default());
                if !files.contains(&path) {
                    files.push(path);
                }
            }
        }
    }
    Ok(files)
}

const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /newroot
$B mount -t proc proc /proc
# A user-mode kernel restarts itself on reboot (a watchdog's reset): power off instead, as qemu's
# -no-reboot does.
[ -e "@WORK@/booted" ] && echo o > /proc/sysrq-trigger
: > "@WORK@/booted"
$B mount -t sysfs sysfs /sys
$B mount -t devtmpfs devtmpfs /dev
for m in $($B cat /modules.order); do $B insmod "/modules/$m" 2>/dev/null; done
script=""
for arg in $($B cat /proc/cmdline); do
  case "$arg" in lvms.script=*) script="${arg#lvms.script=}" ;; esac
done
if ! $B mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000,cache=loose hostroot /newroot; then
  echo "lvms-vm: cannot mount the host root over 9p"
  echo o > /proc/sysrq-trigger
fi
$B mount --move /dev /newroot/dev
$B mount --move /proc /newroot/proc
$B mount --move /sys /newroot/sys
$B mount -t tmpfs -o mode=0755 tmpfs /newroot/run
# switch_root, not chroot: udevadm refuses to act when PID 1's root differs from its own. The guest
# script powers the VM off itself.
exec $B switch_root /newroot /bin/sh "$script"
"#;

/// Builds `<vm_dir>/initramfs-<version>.cpio` (uncompressed newc; a few MiB).
pub fn build_initramfs(repo: &Path, version: &str) -> Result<PathBuf> {
    let dir = vm_dir(repo);
    let out = dir.join(format!("initramfs-{version}.cpio"));
    // Phases that run side by side each prepare the kernel: build under names of this process's
    // own and rename, so no VM boots a half-written archive.
    let pid = std::process::id();
    let stage = dir.join(format!("initramfs-{version}.{pid}.d"));
    let partial = dir.join(format!("initramfs-{version}.cpio.{pid}"));
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    fs::create_dir_all(stage.join("bin"))?;
    fs::create_dir_all(stage.join("modules"))?;
    fs::copy("/bin/busybox", stage.join("bin/busybox"))
        .context("copying /bin/busybox: install busybox-static")?;
    let mut order = String::new();
    for (i, file) in module_files(version, INITRAMFS_MODULES)?.iter().enumerate() {
        let name = format!(
            "{i:02}-{}",
            file.file_name().unwrap_or_default().to_string_lossy()
        );
        fs::copy(file, stage.join("modules").join(&name))
            .with_context(|| format!("copying {}", file.display()))?;
        writeln!(order, "{name}")?;
    }
    fs::write(stage.join("modules.order"), order)?;
    fs::write(stage.join("init"), INIT)?;
    fs::set_permissions(stage.join("init"), fs::Permissions::from_mode(0o755))?;

    let list = Command::new("find")
        .arg(".")
        .current_dir(&stage)
        .output()
        .context("find")?;
    let mut cpio = Command::new("cpio")
        .args(["-o", "-H", "newc", "--quiet"])
        .current_dir(&stage)
        .stdin(Stdio::piped())
        .stdout(fs::File::create(&partial)?)
        .spawn()
        .context("running cpio: install cpio")?;
    cpio.stdin
        .take()
        .context("cpio stdin")?
        .write_all(&list.stdout)?;
    if !cpio.wait()?.success() {
        bail!("cpio failed building {}", out.display());
    }
    fs::remove_dir_all(&stage)?;
    fs::rename(&partial, &out)?;
    Ok(out)
}

/// The guest script: a prelude that makes the guest look like a node (modules, udev, an LVM config on
/// tmpfs so nothing of the host's /etc/lvm is touched), then the command; its status goes to `exit-code`.
/// `relay`: the host loopback port of a user-mode guest's [`Relay`] (its forwarded ports).
fn guest_script(
    spec: &VmSpec,
    machine: Machine,
    repo: &Path,
    work: &Path,
    relay: Option<u16>,
) -> String {
    let mut s =
        String::from("export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
    s.push_str("export HOME=/root LC_ALL=C TMPDIR=/tmp LVM_SYSTEM_DIR=/run/lvm-etc LVMS_IN_VM=1\n");
    for (k, v) in &spec.env {
        let _ = writeln!(s, "export {k}={}", shell_quote(v));
    }
    // The guest's /tmp is a tmpfs (loop-device images, sockets and mounts need a local filesystem,
    // not 9p). A checkout under /tmp would vanish behind it: keep the host's /tmp reachable and
    // bind the checkout back at its own path.
    let _ = writeln!(s, "repo={}", shell_quote(&repo.to_string_lossy()));
    s.push_str(
        r#"case "$repo" in
/tmp/*)
  mkdir -p /run/lvms-host-tmp && mount --bind /tmp /run/lvms-host-tmp
  mount -t tmpfs -o mode=1777 tmpfs /tmp
  mkdir -p "$repo" && mount --bind "/run/lvms-host-tmp/${repo#/tmp/}" "$repo" ;;
*)
  mount -t tmpfs -o mode=1777 tmpfs /tmp ;;
esac
"#,
    );
    s.push_str(
        r#"mkdir -p /run/lock /run/lvm /run/lvm-etc/backup /run/lvm-etc/archive /run/udev
cat > /run/lvm-etc/lvm.conf <<'LVMCONF'
devices {
    obtain_device_list_from_udev = 0
}
global {
    # No autoactivation from udev events: Debian's 69-lvm.rules would run `vgchange -aay` (there is
    # no systemd here) when a PV appears on a loop disk, which can reactivate an LV a test has just
    # deactivated.
    event_activation = 0
}
backup {
    backup_dir = "/run/lvm-etc/backup"
    archive_dir = "/run/lvm-etc/archive"
}
LVMCONF
"#,
    );
    let modules = GUEST_MODULES.iter().filter(|m| match machine {
        Machine::Qemu => true,
        // ubd is built into the user-mode kernel.
        Machine::Uml => **m != "virtio_blk",
    });
    let _ = writeln!(
        s,
        "modprobe -a {} 2>/dev/null",
        modules.copied().collect::<Vec<_>>().join(" ")
    );
    if machine == Machine::Uml {
        // What Debian's rules give virtio disks (the by-id link, ID_SERIAL for lsblk's SERIAL), for
        // ubd disks with a serial: the tests and their configurations name disks the same way on
        // either machine.
        s.push_str(
            r#"mkdir -p /run/udev/rules.d
cat > /run/udev/rules.d/60-lvms-ubd.rules <<'RULES'
KERNEL=="ubd*", ENV{DEVTYPE}=="disk", ATTR{serial}=="?*", ENV{ID_SERIAL}="$attr{serial}", SYMLINK+="disk/by-id/virtio-$attr{serial}"
KERNEL=="ubd*", ENV{DEVTYPE}=="partition", ATTRS{serial}=="?*", SYMLINK+="disk/by-id/virtio-$attr{serial}-part%n"
RULES
"#,
        );
    }
    // udev only for block devices: their /dev/disk/by-id links and device-mapper's events. The
    // modules the guest needs are loaded above by name; a trigger of every subsystem would load
    // dozens more (kvm, crypto, sound, ahci), which took about 25 s of each boot under TCG.
    s.push_str(
        r#"/lib/systemd/systemd-udevd --daemon
udevadm trigger --action=add --subsystem-match=block
udevadm settle --timeout=30 >/dev/null 2>&1
"#,
    );
    match (spec.net, machine) {
        (false, _) => {}
        (true, Machine::Qemu) => s.push_str(
            // udev renames eth0 (enp0s…): take whichever interface is not loopback.
            "modprobe virtio_net 2>/dev/null\nudevadm settle --timeout=30 >/dev/null 2>&1\n\
             ifc=$(ls /sys/class/net | grep -v '^lo$' | head -n 1)\nbusybox ip link set lo up\n\
             busybox ip link set \"$ifc\" up\nbusybox ip addr add 10.0.2.15/24 dev \"$ifc\"\n\
             busybox ip route add default via 10.0.2.2\n",
        ),
        // slirp's SLIP link: no ARP, so the default route is the link itself.
        (true, Machine::Uml) => s.push_str(
            "busybox ip link set lo up\nbusybox ip link set eth0 up\n\
             busybox ip addr add 10.0.2.15/24 dev eth0\nbusybox ip route add default dev eth0\n",
        ),
    }
    if let Some(port) = relay {
        let xtask = std::env::current_exe().unwrap_or_default();
        let _ = writeln!(
            s,
            "{} guest-relay 10.0.2.2:{port} </dev/null >/dev/null 2>&1 &",
            shell_quote(&xtask.to_string_lossy())
        );
    }
    // Where a guest's CPU goes: with LVMS_VM_ACCT=DIR on the host, the kernel's process
    // accounting records every process the guest ran (`sa -f DIR/<vm>.pacct` sums them; package
    // acct on the host).
    let acct = std::env::var("LVMS_VM_ACCT").ok().filter(|d| !d.is_empty());
    if acct.is_some() {
        s.push_str(": > /run/pacct && accton /run/pacct\n");
    }
    // PID 1 must never exit (the kernel would panic): a failed `cd` is reported as status 97.
    let _ = writeln!(
        s,
        "if cd {cwd}; then ( {} ); status=$?; else echo \"lvms-vm: the guest cannot enter {cwd}\"; status=97; fi",
        spec.command,
        cwd = shell_quote(&spec.cwd.to_string_lossy()),
    );
    let _ = writeln!(
        s,
        "echo $status > {}",
        shell_quote(&work.join("exit-code").to_string_lossy())
    );
    if let Some(dir) = acct {
        let _ = writeln!(
            s,
            "accton off; mkdir -p {dir} && cp /run/pacct {dir}/{}.pacct",
            work.file_name().unwrap_or_default().to_string_lossy(),
            dir = shell_quote(&dir)
        );
    }
    s.push_str("sync\necho o > /proc/sysrq-trigger\nwhile :; do sleep 1 2>/dev/null; done\n");
    s
}

/// Drops terminal escape sequences (`ESC [ … letter`, `ESC c`) and carriage returns from a console line.
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for n in chars.by_ref() {
                        if n.is_ascii_alphabetic() {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

pub fn shell_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

/// A VM that has been started.
pub struct RunningVm {
    spec: VmSpec,
    work: PathBuf,
    child: Child,
    console: thread::JoinHandle<Vec<String>>,
    started: Instant,
    /// A user-mode guest's forwarded ports, while it runs.
    _relay: Option<Relay>,
}

#[derive(Debug)]
pub struct VmOutcome {
    /// The guest command's exit status; `None` when the guest died or timed out before writing it.
    pub exit_code: Option<i32>,
    pub elapsed: Duration,
    /// libtest's `test result: …` lines printed in the guest.
    pub test_summaries: Vec<String>,
}

/// Creates (or recreates, sparse) a disk image.
pub fn make_disk(path: &Path, size: u64) -> Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.set_len(size)?;
    Ok(())
}

/// TCG unless `LVMS_VM_KVM=1`: /dev/kvm exists on these machines but a guest under it never got past the
/// firmware (measured: 10 minutes of host CPU, no kernel output), so KVM is opt-in.
fn accel() -> &'static str {
    if std::env::var_os("LVMS_VM_KVM").is_some_and(|v| v == "1") {
        "kvm"
    } else {
        "tcg"
    }
}

/// The kernels the VMs boot: qemu's with its initramfs (built once per run), and the user-mode
/// kernel's module version when user-mode-linux is installed.
pub struct Kernel {
    pub version: String,
    pub initramfs: PathBuf,
    pub uml: Option<String>,
}

pub fn prepare(repo: &Path) -> Result<Kernel> {
    let version = kernel_version()?;
    let initramfs = build_initramfs(repo, &version)?;
    Ok(Kernel {
        version,
        initramfs,
        uml: uml_version(),
    })
}

/// The version of Debian's user-mode kernel (its modules' directory), if it is installed.
pub fn uml_version() -> Option<String> {
    if !Path::new(UML_BINARY).exists() {
        return None;
    }
    newest(fs::read_dir(UML_MODULES).ok()?.filter_map(|e| e.ok()))
}

/// The highest version among the names of `entries`.
fn newest(entries: impl Iterator<Item = fs::DirEntry>) -> Option<String> {
    entries
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .max_by_key(|v| version_key(v))
}

/// PID 1 of a user-mode guest: the mounts the qemu guest's initramfs makes (the root is already
/// the host's `/`, over hostfs), and Debian's user-mode modules where modprobe looks for them.
const UML_INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t proc proc /proc
# A user-mode kernel restarts itself on reboot (a watchdog's reset): power off instead, as qemu's
# -no-reboot does.
[ -e "@WORK@/booted" ] && echo o > /proc/sysrq-trigger
: > "@WORK@/booted"
$B mount -t sysfs sysfs /sys
$B mount -t tmpfs -o mode=0755 tmpfs /run
$B mount -t tmpfs tmpfs /lib/modules
$B mkdir /lib/modules/@VERSION@
$B mount --bind @MODULES@/@VERSION@ /lib/modules/@VERSION@
exec /bin/sh "@SCRIPT@"
"#;

pub fn start(repo: &Path, kernel: &Kernel, spec: VmSpec) -> Result<RunningVm> {
    let machine = Machine::for_host(kernel)?;
    let work = vm_dir(repo).join(format!("{}-{}", spec.name, std::process::id()));
    if work.exists() {
        fs::remove_dir_all(&work)?;
    }
    fs::create_dir_all(&work)?;
    // A user-mode guest's forwarded ports are connections it opens to the host (ADR 0027).
    let relay = match machine {
        Machine::Uml if !spec.forwards.is_empty() => Some(Relay::start(&spec.forwards)?),
        _ => None,
    };
    let script = work.join("guest.sh");
    fs::write(
        &script,
        guest_script(&spec, machine, repo, &work, relay.as_ref().map(Relay::port)),
    )?;
    let mut cmd = match machine {
        Machine::Qemu => qemu_command(&spec, kernel, &script),
        Machine::Uml => uml_command(&spec, kernel, &script, &work)?,
    };
    cmd.stdin(Stdio::null()).stdout(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| match machine {
        Machine::Qemu => "starting qemu-system-x86_64: install qemu-system-x86",
        Machine::Uml => "starting linux.uml: install user-mode-linux",
    })?;
    let stdout = child.stdout.take().context("the guest's console")?;
    // Forward the console (without the firmware's terminal escapes) and keep libtest's summary lines.
    let console = thread::spawn(move || {
        let mut summaries = Vec::new();
        let mut out = std::io::stdout();
        for line in BufReader::new(stdout).split(b'\n').map_while(|l| l.ok()) {
            let line = strip_escapes(&String::from_utf8_lossy(&line));
            let _ = writeln!(out, "{line}");
            if line.starts_with("test result: ") {
                summaries.push(line);
            }
        }
        summaries
    });
    Ok(RunningVm {
        spec,
        work,
        child,
        console,
        started: Instant::now(),
        _relay: relay,
    })
}

impl RunningVm {
    /// Kills the machine: qemu, or the user-mode kernel and the host processes it runs its
    /// guest's processes in (its children). The machine stays in this task's process group, so an
    /// interrupt of the task reaches it as before.
    pub fn kill(&mut self) {
        lvms_testkit::guest::kill_machine(self.child.id());
        let _ = self.child.kill();
    }

    /// The machine's process id (qemu's, or the user-mode kernel's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the machine has exited (the guest powered off or died).
    pub fn exited(&mut self) -> Result<bool> {
        Ok(self.child.try_wait()?.is_some())
    }

    /// Waits for the guest to power off (or kills it at the spec's timeout).
    pub fn wait(mut self) -> Result<VmOutcome> {
        loop {
            if self.child.try_wait()?.is_some() {
                break;
            }
            if self.started.elapsed() > self.spec.timeout {
                eprintln!(
                    "lvms-vm[{}]: timed out after {:?}; killing it",
                    self.spec.name, self.spec.timeout
                );
                self.kill();
                let _ = self.child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let exit_code = fs::read_to_string(self.work.join("exit-code"))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let _ = fs::remove_dir_all(&self.work);
        let test_summaries = self.console.join().unwrap_or_default();
        Ok(VmOutcome {
            exit_code,
            elapsed: self.started.elapsed(),
            test_summaries,
        })
    }
}

/// qemu (TCG) booting Debian's kernel with the host root over virtio-9p.
fn qemu_command(spec: &VmSpec, kernel: &Kernel, script: &Path) -> Command {
    let Kernel {
        version, initramfs, ..
    } = kernel;
    let mut cmd = Command::new("qemu-system-x86_64");
    cmd.args(["-machine", &format!("q35,accel={}", accel())])
        .args(["-cpu", "max", "-m", &spec.memory_mib.to_string()])
        .args(["-smp", &spec.cpus.to_string()])
        .args([
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
            "-serial",
            "stdio",
        ])
        .args(["-nodefaults"])
        .args(["-kernel", &format!("/boot/vmlinuz-{version}")])
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            &format!(
                "console=ttyS0 quiet loglevel=3 panic=-1 lvms.script={}",
                script.display()
            ),
        ])
        .args([
            "-virtfs",
            "local,path=/,mount_tag=hostroot,security_model=passthrough,id=hr,multidevs=remap",
        ]);
    for (i, d) in spec.disks.iter().enumerate() {
        let locking = if d.shared { ",file.locking=off" } else { "" };
        let share = if d.shared { ",share-rw=on" } else { "" };
        let ro = if d.readonly { ",readonly=on" } else { "" };
        cmd.arg("-drive").arg(format!(
            "file={},if=none,id=d{i},format=raw,cache=writeback{locking}{ro}",
            d.image.display()
        ));
        cmd.arg("-device").arg(format!(
            "virtio-blk-pci,drive=d{i},serial={}{share}",
            d.serial
        ));
    }
    if spec.net {
        let mut netdev = String::from("user,id=n0");
        for (host, guest) in &spec.forwards {
            let _ = write!(netdev, ",hostfwd=tcp:127.0.0.1:{host}-:{guest}");
        }
        cmd.args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"]);
    }
    cmd
}

/// Debian's user-mode Linux with the host root over hostfs; disks are ubd devices (at most 8) with
/// their serials, which the guest's udev rule links as `/dev/disk/by-id/virtio-<serial>` as qemu's
/// virtio disks are.
fn uml_command(spec: &VmSpec, kernel: &Kernel, script: &Path, work: &Path) -> Result<Command> {
    let version = kernel
        .uml
        .as_deref()
        .context("user-mode-linux is not installed")?;
    if spec.disks.len() > 8 {
        bail!(
            "VM {}: {} disks, but a user-mode guest has at most 8 (LVMS_VM_MACHINE=qemu)",
            spec.name,
            spec.disks.len()
        );
    }
    let init = work.join("init");
    fs::write(
        &init,
        UML_INIT
            .replace("@VERSION@", version)
            .replace("@MODULES@", UML_MODULES)
            .replace("@SCRIPT@", &script.to_string_lossy())
            .replace("@WORK@", &work.to_string_lossy()),
    )?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    let mut cmd = Command::new(UML_BINARY);
    cmd.arg(format!("mem={}M", spec.memory_mib))
        // root= names no block device: util-linux reads it to resolve the root's source, and the
        // default (98:0, ubda) would show the first disk as mounted on `/`.
        .args(["root=hostfs", "rootfstype=hostfs", "rootflags=/", "rw"])
        .arg(format!("init={}", init.display()))
        // Its pid file and management socket in the work directory, not in ~/.uml.
        .arg(format!("uml_dir={}", work.display()))
        .arg(format!("umid={}", spec.name))
        .args([
            "con=null",
            "con0=null,fd:1",
            "ssl=null",
            "quiet",
            "loglevel=3",
        ])
        .arg(format!("lvms.script={}", script.display()));
    for (i, d) in spec.disks.iter().enumerate() {
        // r: read-only; c: no file locking, so a second guest can attach the image.
        let flags = format!(
            "{}{}",
            if d.readonly { "r" } else { "" },
            if d.shared { "c" } else { "" }
        );
        cmd.arg(format!("ubd{i}{flags}={},,{}", d.image.display(), d.serial));
    }
    if spec.net {
        // User-mode networking, as qemu's: the guest is 10.0.2.15, the host's loopback 10.0.2.2.
        cmd.arg(format!("eth0=slirp,,{SLIRP}"));
    }
    Ok(cmd)
}

/// Starts every VM, then waits for all of them (for tests that need two nodes on one shared disk).
pub fn run_all(repo: &Path, specs: Vec<VmSpec>) -> Result<Vec<VmOutcome>> {
    let kernel = prepare(repo)?;
    let running: Vec<RunningVm> = specs
        .into_iter()
        .map(|s| start(repo, &kernel, s))
        .collect::<Result<_>>()?;
    running.into_iter().map(RunningVm::wait).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_escapes_keeps_text_and_drops_colours_and_resets() {
        assert_eq!(
            strip_escapes("test x ... \u{1b}[32mok\u{1b}[0m\r"),
            "test x ... ok"
        );
        assert_eq!(
            strip_escapes("\u{1b}c\u{1b}[?7l\u{1b}[2JBooting"),
            "Booting"
        );
        assert_eq!(strip_escapes("plain"), "plain");
    }

    #[test]
    fn guests_run_as_user_mode_linux_when_it_is_installed_unless_the_user_says_qemu() {
        assert_eq!(Machine::choose(None, true).unwrap(), Machine::Uml);
        assert_eq!(Machine::choose(Some(""), true).unwrap(), Machine::Uml);
        assert_eq!(Machine::choose(None, false).unwrap(), Machine::Qemu);
        assert_eq!(Machine::choose(Some("qemu"), true).unwrap(), Machine::Qemu);
        assert_eq!(Machine::choose(Some("uml"), true).unwrap(), Machine::Uml);
        let missing = Machine::choose(Some("uml"), false).unwrap_err();
        assert!(
            missing.to_string().contains("install user-mode-linux"),
            "{missing}"
        );
        let typo = Machine::choose(Some("kvm"), true).unwrap_err();
        assert!(typo.to_string().contains("expected qemu or uml"), "{typo}");
    }

    #[test]
    fn a_user_mode_guest_gets_its_disks_as_ubd_devices_with_serials_and_flags() {
        let work = std::env::temp_dir().join(format!("lvms-uml-cmd-{}", std::process::id()));
        fs::create_dir_all(&work).unwrap();
        let disk = |serial: &str, shared, readonly| Disk {
            serial: serial.into(),
            image: PathBuf::from(format!("/img/{serial}.img")),
            shared,
            readonly,
        };
        let spec = VmSpec::new("t", Path::new("/repo"), "true")
            .memory_mib(512)
            .disks(vec![
                disk("a", false, false),
                disk("lun", true, false),
                disk("ro", false, true),
            ]);
        let kernel = Kernel {
            version: "k".into(),
            initramfs: PathBuf::new(),
            uml: Some("6.1.1".into()),
        };
        let cmd = uml_command(&spec, &kernel, &work.join("guest.sh"), &work).unwrap();
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        for want in [
            "mem=512M",
            "root=hostfs",
            "ubd0=/img/a.img,,a",
            "ubd1c=/img/lun.img,,lun",
            "ubd2r=/img/ro.img,,ro",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} not in {args:?}");
        }
        let init = fs::read_to_string(work.join("init")).unwrap();
        assert!(
            init.contains("/usr/lib/uml/modules/6.1.1 /lib/modules/6.1.1"),
            "{init}"
        );
        assert!(init.contains(&format!(
            "exec /bin/sh \"{}\"",
            work.join("guest.sh").display()
        )));

        let nine = VmSpec::new("t", Path::new("/repo"), "true")
            .disks((0..9).map(|i| disk(&i.to_string(), false, false)).collect());
        let err = uml_command(&nine, &kernel, &work.join("guest.sh"), &work).unwrap_err();
        assert!(err.to_string().contains("at most 8"), "{err}");
        let _ = fs::remove_dir_all(&work);
    }
}
