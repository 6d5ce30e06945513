//! The container images the test node runs, built locally as OCI image layouts in tar files that
//! `ctr images import` loads: no registry is reachable here (ADR 0018).
//!
//! - lvms-rs: a Debian bookworm rootfs made by `mmdebstrap` from the packages `deploy/Dockerfile`
//!   installs (cached by its package list), and a layer with the `lvms` binary; two variants
//!   (`e2e-a`, `e2e-b`) that differ by one file, so a DaemonSet can be rolled to a new image.
//! - The CSI sidecars and pause: one layer holding the static binary from the Kubernetes assets,
//!   tagged with the reference the manifests name (`registry.k8s.io/sig-storage/<name>:<version>`),
//!   so `deploy/base` and the rendered DaemonSet run unchanged.
//! - A workload image: Debian's static busybox with its applets.
//!
//! Layers are uncompressed tars written with sorted names, zero mtimes and owner 0, so an image's
//! digest changes only when its content does.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};
use serde_json::json;

/// An image of the layout and its size (the sum of its layers, uncompressed).
pub struct Image {
    pub reference: String,
    pub size: u64,
}

/// Every image, in one OCI layout tarred for one `ctr images import` (layers that images share,
/// as the two lvms-rs variants do, are read once).
pub struct Images {
    pub tar: PathBuf,
    pub images: Vec<Image>,
}

/// The lvms-rs image's packages: `deploy/Dockerfile`'s runtime stage.
///
/// What the agent calls from each: lvm2 `lvm` (every LVM command) and `dmsetup`;
/// thin-provisioning-tools `thin_check` (LVM runs it on thin pools); e2fsprogs `mkfs.ext4`,
/// `resize2fs`; xfsprogs `mkfs.xfs`, `xfs_growfs`; util-linux `lsblk`, `blkid`, `wipefs`; mount
/// `mount`, `umount`; sanlock `sanlock client` and lvm2-lockd `lvmlockctl`, clients of the host's
/// daemons for shared classes.
const LVMS_PACKAGES: &[&str] = &[
    "lvm2",
    "thin-provisioning-tools",
    "e2fsprogs",
    "xfsprogs",
    "util-linux",
    "mount",
    "sanlock",
    "lvm2-lockd",
];

/// The reference of the lvms-rs image variant `tag` (`e2e-a`, `e2e-b`).
pub fn lvms_reference(tag: &str) -> String {
    format!("localhost/lvms-rs/lvms:{tag}")
}

/// The workload image the test pods run.
pub const WORKLOAD: &str = "localhost/lvms-e2e/busybox:1";

/// The pause image containerd starts pod sandboxes with.
pub const PAUSE: &str = "registry.k8s.io/pause:3.10.2";

/// The sidecar binaries and the image reference each is tagged with (versions from
/// `../shared/k8s/README.md`, the tags `deploy/` and the operator's render default to).
pub const SIDECARS: &[(&str, &str)] = &[
    (
        "csi-provisioner",
        "registry.k8s.io/sig-storage/csi-provisioner:v6.3.0",
    ),
    (
        "csi-resizer",
        "registry.k8s.io/sig-storage/csi-resizer:v2.2.1",
    ),
    (
        "csi-snapshotter",
        "registry.k8s.io/sig-storage/csi-snapshotter:v8.6.0",
    ),
    (
        "csi-node-driver-registrar",
        "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0",
    ),
    (
        "livenessprobe",
        "registry.k8s.io/sig-storage/livenessprobe:v2.19.0",
    ),
];

/// Builds every image under `<repo>/target/images` from the unpacked Kubernetes `assets` and the
/// `lvms` binary.
pub fn build_all(repo: &Path, assets: &Path, lvms: &Path) -> Result<Images> {
    let out = repo.join("target/images");
    fs::create_dir_all(&out)?;
    let layout = fresh_dir(&out.join("layout"))?;
    let mut images = Vec::new();
    let mut manifests = Vec::new();
    let rootfs = debian_rootfs(&out)?;
    // The binary without its debug sections (the debug build's are most of its size).
    let stage = fresh_dir(&out.join("lvms.d"))?;
    fs::create_dir_all(stage.join("usr/local/bin"))?;
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(lvms)
        .arg(stage.join("usr/local/bin/lvms")))?;
    let lvms_layer = layer(&stage, &out.join("lvms-binary.tar"))?;
    for tag in ["e2e-a", "e2e-b"] {
        let stage = fresh_dir(&out.join(format!("build-{tag}.d")))?;
        fs::create_dir_all(stage.join("etc"))?;
        fs::write(stage.join("etc/lvms-image"), format!("{tag}\n"))?;
        let marker = layer(&stage, &out.join(format!("build-{tag}.tar")))?;
        images.push(image(
            &layout,
            &mut manifests,
            &lvms_reference(tag),
            &[rootfs.clone(), lvms_layer.clone(), marker],
            &Config {
                entrypoint: &["/usr/local/bin/lvms"],
                user: "65532:65532",
                env: &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
        )?);
    }
    for (bin, reference) in SIDECARS.iter().copied().chain([("pause", PAUSE)]) {
        let stage = fresh_dir(&out.join(format!("{bin}.d")))?;
        fs::copy(assets.join(bin), stage.join(bin))
            .with_context(|| format!("copying {bin} from {}", assets.display()))?;
        let entry = format!("/{bin}");
        let layer = layer(&stage, &out.join(format!("{bin}.tar")))?;
        images.push(image(
            &layout,
            &mut manifests,
            reference,
            &[layer],
            &Config {
                entrypoint: &[&entry],
                user: "",
                env: &[],
            },
        )?);
    }
    images.push(busybox(&out, &layout, &mut manifests)?);
    fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": manifests}))?,
    )?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let tar = out.join("images.oci.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&tar)
        .args(["oci-layout", "index.json", "blobs"]))?;
    fs::remove_dir_all(&layout)?;
    // The layers are in the image tar now; keep only it and the rootfs cache (CI's disk is small).
    for entry in fs::read_dir(&out)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".tar") && path != tar && !name.starts_with("rootfs-") {
            fs::remove_file(&path)?;
        }
    }
    Ok(Images { tar, images })
}

/// A layer tar of `stage` and its sha256 (uncompressed: its digest is its diff id).
#[derive(Clone)]
struct Layer {
    tar: PathBuf,
    sha256: String,
}

struct Config<'a> {
    entrypoint: &'a [&'a str],
    user: &'a str,
    env: &'a [&'a str],
}

fn fresh_dir(dir: &Path) -> Result<PathBuf> {
    if dir.exists() {
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    Ok(dir.to_path_buf())
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", path.display());
    }
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

fn layer(stage: &Path, tar: &Path) -> Result<Layer> {
    run(Command::new("tar")
        .args([
            "--sort=name",
            "--mtime=@0",
            "--owner=0",
            "--group=0",
            "--numeric-owner",
            "-C",
        ])
        .arg(stage)
        .arg("-cf")
        .arg(tar)
        .arg("."))?;
    fs::remove_dir_all(stage)?;
    Ok(Layer {
        tar: tar.to_path_buf(),
        sha256: sha256(tar)?,
    })
}

/// What the image leaves out of what [`LVMS_PACKAGES`] pull in, as `deploy/Dockerfile` does:
/// Python and ICU (xfsprogs's `xfs_scrub`, never run), Perl beyond perl-base (usrmerge's), apt's
/// lists. 205 MB of files become 87 MB; every tool the agent calls still runs.
const LVMS_TRIM: &str = "cd \"$1\" && rm -rf usr/lib/python3 usr/lib/python3.11 usr/bin/python3* \
     usr/share/perl usr/lib/x86_64-linux-gnu/perl usr/lib/x86_64-linux-gnu/libperl.so* \
     usr/lib/x86_64-linux-gnu/libicu* usr/share/icu usr/sbin/xfs_scrub usr/sbin/xfs_scrub_all \
     var/lib/apt/lists/*";

/// Debian bookworm with [`LVMS_PACKAGES`], less [`LVMS_TRIM`], as a layer tar; rebuilt only when
/// either changes (mmdebstrap fetches from Debian's mirror, about 25 s).
fn debian_rootfs(out: &Path) -> Result<Layer> {
    let packages = LVMS_PACKAGES.join(",");
    let key = &sha256_of_str(out, &format!("{packages}\n{LVMS_TRIM}"))?[..12];
    let tar = out.join(format!("rootfs-{key}.tar"));
    if !tar.exists() {
        let partial = out.join(format!("rootfs-{key}.partial.tar"));
        run(Command::new("mmdebstrap")
            .args([
                "--quiet",
                "--variant=essential",
                "--include",
                &packages,
                "--dpkgopt=path-exclude=/usr/share/man/*",
                "--dpkgopt=path-exclude=/usr/share/doc/*",
                "--dpkgopt=path-exclude=/usr/share/locale/*",
                "--dpkgopt=path-exclude=/usr/share/info/*",
            ])
            .arg(format!("--customize-hook={LVMS_TRIM}"))
            .arg("bookworm")
            .arg(&partial)
            .arg("http://deb.debian.org/debian"))
        .context("mmdebstrap (package mmdebstrap; runs as root)")?;
        fs::rename(&partial, &tar)?;
    }
    Ok(Layer {
        sha256: sha256(&tar)?,
        tar,
    })
}

fn sha256_of_str(dir: &Path, s: &str) -> Result<String> {
    let path = dir.join("key.txt");
    fs::write(&path, s)?;
    let sum = sha256(&path)?;
    fs::remove_file(&path)?;
    Ok(sum)
}

/// `/bin/busybox` with a link per applet.
fn busybox(out: &Path, layout: &Path, manifests: &mut Vec<serde_json::Value>) -> Result<Image> {
    let stage = fresh_dir(&out.join("busybox.d"))?;
    fs::create_dir_all(stage.join("bin"))?;
    fs::copy("/bin/busybox", stage.join("bin/busybox"))
        .context("copying /bin/busybox (package busybox-static)")?;
    let list = Command::new("/bin/busybox").arg("--list").output()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.contains('/') {
            std::os::unix::fs::symlink("busybox", stage.join("bin").join(applet))?;
        }
    }
    fs::create_dir_all(stage.join("tmp"))?;
    let layer = layer(&stage, &out.join("busybox.tar"))?;
    image(
        layout,
        manifests,
        WORKLOAD,
        &[layer],
        &Config {
            entrypoint: &["/bin/sh"],
            user: "",
            env: &["PATH=/bin"],
        },
    )
}

/// Adds an image to the OCI layout `layout`: its blobs, and its manifest's descriptor (named
/// `reference`) to `manifests`, the layout's index.
fn image(
    layout: &Path,
    manifests: &mut Vec<serde_json::Value>,
    reference: &str,
    layers: &[Layer],
    cfg: &Config<'_>,
) -> Result<Image> {
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    let mut descriptors = Vec::new();
    let mut size = 0;
    for l in layers {
        let len = fs::metadata(&l.tar)?.len();
        size += len;
        let blob_path = blobs.join(&l.sha256);
        // Hard links, not copies: the layers are hundreds of MB (removed once the image tar holds them).
        if !blob_path.exists() {
            fs::hard_link(&l.tar, blob_path)?;
        }
        descriptors.push(json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{}", l.sha256),
            "size": len,
        }));
    }
    let mut config = json!({
        "Entrypoint": cfg.entrypoint,
        "Env": cfg.env,
        "WorkingDir": "/",
    });
    if !cfg.user.is_empty() {
        config["User"] = json!(cfg.user);
    }
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| format!("sha256:{}", l.sha256)).collect::<Vec<_>>(),
        },
    });
    let config = blob(&blobs, &serde_json::to_vec(&config)?)?;
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", config.0),
            "size": config.1,
        },
        "layers": descriptors,
    });
    let manifest = blob(&blobs, &serde_json::to_vec(&manifest)?)?;
    manifests.push(json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": format!("sha256:{}", manifest.0),
        "size": manifest.1,
        "annotations": {
            "io.containerd.image.name": reference,
            "org.opencontainers.image.ref.name": reference,
        },
    }));
    Ok(Image {
        reference: reference.to_owned(),
        size,
    })
}

/// Writes `data` as a blob; its sha256 and size.
fn blob(blobs: &Path, data: &[u8]) -> Result<(String, usize)> {
    let tmp = blobs.join("incoming");
    fs::write(&tmp, data)?;
    let sum = sha256(&tmp)?;
    fs::rename(&tmp, blobs.join(&sum))?;
    Ok((sum, data.len()))
}

/// Makes the node's disk image `disk` an ext4 filesystem whose `containerd/` is a containerd root
/// holding every image of `images`, imported and unpacked by the host's containerd (Debian's, the
/// binary the node runs; overlayfs snapshots, as the node's config names). Importing in the guest
/// took about four minutes of its two busy vCPUs under TCG; here it takes seconds (ADR 0018).
pub fn node_disk(repo: &Path, images: &Images, disk: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let work = fresh_dir(&repo.join("target/installed/node-disk"))?;
    let fs_root = work.join("fs");
    let root = fs_root.join("containerd");
    let state = work.join("state");
    fs::create_dir_all(&root)?;
    fs::create_dir_all(&state)?;
    // A socket path under 108 bytes wherever the checkout is.
    let socket = PathBuf::from(format!(
        "/run/lvms-xtask-containerd-{}.sock",
        std::process::id()
    ));
    let config = work.join("containerd.toml");
    fs::write(
        &config,
        format!(
            "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{socket}\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{opt}\"\n",
            root = root.display(),
            state = state.display(),
            socket = socket.display(),
            opt = work.join("opt").display(),
        ),
    )?;
    let log = fs::File::create(work.join("containerd.log"))?;
    let mut containerd = Command::new("containerd")
        .arg("--config")
        .arg(&config)
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting containerd (package containerd)")?;
    let ctr = |args: &[&str]| {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address").arg(&socket).args(args);
        cmd
    };
    let imported = (|| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !ctr(&["version"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()?
            .success()
        {
            if std::time::Instant::now() > deadline {
                bail!(
                    "the host's containerd did not start; see {}",
                    work.join("containerd.log").display()
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        run(ctr(&["-n", "k8s.io", "images", "import"]).arg(&images.tar))
    })();
    let _ = Command::new("kill")
        .arg(containerd.id().to_string())
        .status();
    let _ = containerd.wait();
    let _ = fs::remove_file(&socket);
    let _ = fs::remove_file(socket.with_extension("sock.ttrpc"));
    imported?;
    // The snapshots are mounted no more: the tree is plain files, xattrs and whiteouts, which
    // `mkfs.ext4 -d` copies into the image as they are.
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&fs_root)
        .arg(disk))?;
    fs::remove_dir_all(&work)?;
    println!(
        "installed: the node's disk holds the imported images ({:.0} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
