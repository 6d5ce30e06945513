//! The lock scope of an LVM command: how it reaches a volume group. The command layer ([`crate::lvm`])
//! and the shared classes' own commands ([`crate::shared`]) both take it from here, so neither
//! imports the other for it.

use std::time::Duration;

use lvms_core::shared::devices_file;

/// The timeout of a command that may wait for lvmlockd's locks: lock-start and `vgcreate --shared`
/// wait for sanlock to acquire the host's lease, 20 s to 3 min (measured 23–30 s in the test VM).
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(300);

/// How an LVM command reaches its volume group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockScope {
    /// This host's LVM alone: the system devices file, no lvmlockd.
    Local,
    /// A shared class's: lvmlockd, the class's own devices file, and the sanlock host id where the
    /// command needs one (`vgcreate --shared`, the first lock start).
    Shared { class: String, host_id: Option<u16> },
}

impl LockScope {
    pub fn shared(class: &str, host_id: Option<u16>) -> Self {
        Self::Shared {
            class: class.to_owned(),
            host_id,
        }
    }

    /// The arguments that go right after the LVM subcommand (none for [`LockScope::Local`]).
    pub fn args(&self) -> Vec<String> {
        let Self::Shared { class, host_id } = self else {
            return Vec::new();
        };
        let mut config = "global/use_lvmlockd=1".to_owned();
        if let Some(id) = host_id {
            config.push_str(&format!(" local/host_id={id}"));
        }
        vec![
            "--config".to_owned(),
            config,
            "--devicesfile".to_owned(),
            devices_file(class),
        ]
    }

    /// The command's timeout: `local` for this host's own LVM, [`LOCK_TIMEOUT`] under lvmlockd.
    pub fn timeout(&self, local: Duration) -> Duration {
        match self {
            Self::Local => local,
            Self::Shared { .. } => LOCK_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_scope_names_lvmlockd_the_class_devices_file_and_the_host_id_when_given() {
        assert_eq!(
            LockScope::shared("san", Some(7)).args(),
            [
                "--config",
                "global/use_lvmlockd=1 local/host_id=7",
                "--devicesfile",
                &devices_file("san"),
            ]
        );
        assert_eq!(
            LockScope::shared("san", None).args()[1],
            "global/use_lvmlockd=1"
        );
        assert!(LockScope::Local.args().is_empty());
        let local = Duration::from_secs(30);
        assert_eq!(LockScope::Local.timeout(local), local);
        assert_eq!(LockScope::shared("san", None).timeout(local), LOCK_TIMEOUT);
    }
}
