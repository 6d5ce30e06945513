//! Puts the fence hook on the host (ADR 0028): the running `lvms` binary copied to the hook
//! directory (a host path the node pod mounts at the same path), then `lvmlockctl_kill_command`
//! pointed at it in the host's `lvmlocal.conf` when nothing else is configured
//! ([`lvms_core::shared::hook::plan`]). Both writes go to a temporary file first and are renamed
//! into place, so a kill hook that runs meanwhile finds the old binary or the new one, never half
//! of one.

use std::{
    io::{self, Read as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use lvms_core::shared::hook::{self, HookPlan};

use crate::{runner::Runner, sanlock};

pub use lvms_core::shared::hook::DEFAULT_DIR;

/// Where the hook goes and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceHook {
    /// The host directory for the binary (mounted at the same path in the node pod).
    pub dir: PathBuf,
    /// The binary to copy there: the running `lvms`.
    pub source: PathBuf,
    /// The host's LVM system directory (`/etc/lvm`).
    pub lvm_dir: PathBuf,
}

impl FenceHook {
    /// The hook in `dir`, copied from the running executable, configured in `/etc/lvm`.
    pub fn new(dir: impl Into<PathBuf>) -> io::Result<Self> {
        Ok(Self {
            dir: dir.into(),
            source: std::env::current_exe()?,
            lvm_dir: PathBuf::from("/etc/lvm"),
        })
    }

    /// The binary's path on the host.
    pub fn binary(&self) -> PathBuf {
        self.dir.join("lvms")
    }
}

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Installed {
    /// The binary is current and the host runs an lvms fence hook; `changed` lists what was
    /// written (the binary, the configuration), empty when nothing was.
    Done { changed: Vec<String> },
    /// The host's configuration names another hook (or cannot be edited safely): the message.
    Refused(String),
    /// A write failed: the message.
    Failed(String),
}

impl Installed {
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done { .. })
    }

    /// What to add to the class's fencing message, if anything.
    pub fn problem(&self) -> Option<&str> {
        match self {
            Self::Done { .. } => None,
            Self::Refused(m) | Self::Failed(m) => Some(m),
        }
    }
}

/// Copies the binary (when it differs), then writes the configuration the plan asks for. The
/// binary goes first, so the configuration never names a file that is not there.
pub async fn install<R: Runner>(runner: &R, hook: &FenceHook) -> Installed {
    let copied = match install_binary(hook) {
        Ok(copied) => copied,
        Err(why) => return Installed::Failed(why),
    };
    match configure(runner, hook).await {
        Installed::Done { mut changed } => {
            if copied {
                changed.insert(0, hook.binary().display().to_string());
            }
            Installed::Done { changed }
        }
        other => other,
    }
}

/// Copies the running binary to the hook directory unless the same bytes are there; whether it
/// copied, or why it could not.
pub fn install_binary(hook: &FenceHook) -> Result<bool, String> {
    let binary = hook.binary();
    copy_if_changed(&hook.source, &binary).map_err(|e| {
        format!(
            "the fence hook could not be copied to {}: {e}",
            binary.display()
        )
    })
}

/// Points `lvmlockctl_kill_command` at the hook binary when the host names no other command.
pub async fn configure<R: Runner>(runner: &R, hook: &FenceHook) -> Installed {
    let binary = hook.binary();
    let Some(kill_command) = sanlock::kill_command(runner).await else {
        return Installed::Failed(
            "`lvm config global/lvmlockctl_kill_command` failed: the fence hook's setting could \
             not be read"
                .to_owned(),
        );
    };
    let conf = hook.lvm_dir.join(hook::LOCAL_CONF);
    let current = match std::fs::read_to_string(&conf) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Installed::Failed(format!("reading {}: {e}", conf.display())),
    };
    match hook::plan(
        &kill_command,
        current.as_deref(),
        &binary.display().to_string(),
    ) {
        HookPlan::InPlace => Installed::Done { changed: vec![] },
        HookPlan::Refused(why) => Installed::Refused(why),
        HookPlan::Write(text) => match write_atomically(&conf, text.as_bytes(), 0o644) {
            Ok(()) => {
                tracing::info!(file = %conf.display(), binary = %binary.display(), "fence hook configured");
                Installed::Done {
                    changed: vec![conf.display().to_string()],
                }
            }
            Err(e) => Installed::Failed(format!("writing {}: {e}", conf.display())),
        },
    }
}

/// Copies `source` to `dest` (mode 0755) unless `dest` already has the same bytes; whether it
/// copied.
fn copy_if_changed(source: &Path, dest: &Path) -> io::Result<bool> {
    if same_content(source, dest)? {
        return Ok(false);
    }
    let bytes = std::fs::read(source)?;
    if let Some(dir) = dest.parent() {
        std::fs::create_dir_all(dir)?;
    }
    write_atomically(dest, &bytes, 0o755)?;
    tracing::info!(binary = %dest.display(), "fence hook binary installed");
    Ok(true)
}

/// Whether `a` and `b` hold the same bytes (false when `b` is missing).
fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let open_b = match std::fs::File::open(b) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    let open_a = std::fs::File::open(a)?;
    if open_a.metadata()?.len() != open_b.metadata()?.len() {
        return Ok(false);
    }
    let (mut ra, mut rb) = (io::BufReader::new(open_a), io::BufReader::new(open_b));
    let (mut ba, mut bb) = (vec![0u8; 1 << 16], vec![0u8; 1 << 16]);
    loop {
        let n = ra.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        rb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// Writes `bytes` to a temporary file beside `path`, syncs it, sets `mode` and renames it over
/// `path`.
fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::io::Write as _;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.lvms-new"));
    let result = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use lvms_core::shared::hook::{END, command};

    use super::*;
    use crate::fake::FakeRunner;

    const LVM_CONFIG: [&str; 5] = [
        "lvm",
        "config",
        "--typeconfig",
        "full",
        "global/lvmlockctl_kill_command",
    ];

    fn lvm_config_says(runner: &FakeRunner, value: &str) {
        runner
            .expect(&LVM_CONFIG)
            .stdout(format!("lvmlockctl_kill_command=\"{value}\"\n"));
    }

    fn setup() -> (tempfile::TempDir, FenceHook) {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("image-lvms");
        std::fs::write(&source, b"lvms v1").unwrap();
        std::fs::create_dir_all(dir.path().join("etc-lvm")).unwrap();
        let hook = FenceHook {
            dir: dir.path().join("var-lib-lvms/bin"),
            source,
            lvm_dir: dir.path().join("etc-lvm"),
        };
        (dir, hook)
    }

    #[tokio::test]
    async fn a_fresh_host_gets_the_binary_and_the_setting_and_a_rolled_image_its_new_binary() {
        let (_dir, hook) = setup();
        let runner = FakeRunner::new();
        lvm_config_says(&runner, "");
        let out = install(&runner, &hook).await;
        let binary = hook.binary();
        let conf = hook.lvm_dir.join("lvmlocal.conf");
        assert_eq!(
            out,
            Installed::Done {
                changed: vec![binary.display().to_string(), conf.display().to_string()]
            }
        );
        assert_eq!(std::fs::read(&binary).unwrap(), b"lvms v1");
        let mode = std::fs::metadata(&binary).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        let text = std::fs::read_to_string(&conf).unwrap();
        assert!(
            text.contains(&command(&binary.display().to_string())),
            "{text}"
        );
        assert!(text.trim_end().ends_with(END), "{text}");

        // Again with the setting in place: nothing written.
        lvm_config_says(&runner, &command(&binary.display().to_string()));
        assert_eq!(
            install(&runner, &hook).await,
            Installed::Done { changed: vec![] }
        );

        // A new image: the binary is replaced, the configuration left as it is.
        std::fs::write(&hook.source, b"lvms v2, longer").unwrap();
        lvm_config_says(&runner, &command(&binary.display().to_string()));
        assert_eq!(
            install(&runner, &hook).await,
            Installed::Done {
                changed: vec![binary.display().to_string()]
            }
        );
        assert_eq!(std::fs::read(&binary).unwrap(), b"lvms v2, longer");
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), text);
        let left: Vec<_> = std::fs::read_dir(&hook.dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
    }

    #[tokio::test]
    async fn another_hook_on_the_host_is_left_alone_and_reported() {
        let (_dir, hook) = setup();
        let conf = hook.lvm_dir.join("lvmlocal.conf");
        std::fs::write(&conf, "local {\n}\n").unwrap();
        let runner = FakeRunner::new();
        lvm_config_says(&runner, "/usr/sbin/site-fence");
        let out = install(&runner, &hook).await;
        let why = out.problem().expect("refused");
        assert!(why.contains("/usr/sbin/site-fence"), "{why}");
        assert!(!out.is_done());
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), "local {\n}\n");
    }

    #[tokio::test]
    async fn an_unreadable_setting_writes_no_configuration() {
        let (_dir, hook) = setup();
        let runner = FakeRunner::new();
        runner.expect(&LVM_CONFIG).fails(
            5,
            "  Configuration node global/lvmlockctl_kill_command not found",
        );
        let out = install(&runner, &hook).await;
        assert!(matches!(out, Installed::Failed(_)), "{out:?}");
        assert!(!hook.lvm_dir.join("lvmlocal.conf").exists());
    }
}
