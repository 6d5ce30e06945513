//! The host crate's error type. Callers branch on the typed variants (`NotFound`, `AlreadyExists`,
//! `InsufficientSpace`, `InUse`, `SignatureExists`, `Timeout`); every variant's message carries the whole
//! cause (argv and complete stderr) so it can be shown to a user as is.

use std::{fmt, time::Duration};

use lvms_core::names::NameError;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A command line as a list of arguments, displayed the way a shell user would type it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argv(pub Vec<String>);

impl fmt::Display for Argv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, arg) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/-_.,:=+%@".contains(c));
            if plain {
                f.write_str(arg)?;
            } else {
                write!(f, "'{}'", arg.replace('\'', r"'\''"))?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A volume group or logical volume name that LVM would reject or misread.
    #[error(transparent)]
    InvalidName(#[from] NameError),

    /// A device path that is not a plain absolute `/dev/...` path.
    #[error("invalid device path {path:?}: {reason}")]
    InvalidDevicePath { path: String, reason: &'static str },

    /// Any other argument that cannot be put on a command line (a tag, a size, a mount path).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The program could not be started (not installed, not executable).
    #[error("could not start `{argv}`: {source}")]
    Spawn {
        argv: Argv,
        #[source]
        source: std::io::Error,
    },

    /// The program ran longer than its timeout and was killed.
    #[error("`{argv}` did not finish within {timeout:?} and was killed")]
    Timeout { argv: Argv, timeout: Duration },

    /// The object (volume group, logical volume, physical volume, device) does not exist.
    #[error("not found: {0}")]
    NotFound(String),

    /// The object to create exists already (with possibly different properties: look before you retry).
    #[error("already exists: {0}")]
    AlreadyExists(String),

    /// The volume group (or thin pool) has not enough free extents, or not on enough devices.
    #[error("insufficient space: {0}")]
    InsufficientSpace(String),

    /// The object is open, mounted, or still holds data that depends on it.
    #[error("in use: {0}")]
    InUse(String),

    /// The device carries a filesystem, partition table or other signature, and the operation refuses
    /// to destroy it. Wipe the device first (only when the user asked for it).
    #[error(
        "{device} has a {signature} signature: refusing to overwrite it; wipe the device first"
    )]
    SignatureExists { device: String, signature: String },

    /// What has to happen before a removal (the caller's record of it) failed, so the removal did
    /// not run.
    #[error("{step} did not run: {reason}")]
    NotPrepared { step: String, reason: String },

    /// A wipe was not done because the record that it happens (kept so a device is wiped only once)
    /// could not be written.
    #[error("{device} was not wiped: recording the wipe first failed: {reason}")]
    WipeNotRecorded { device: String, reason: String },

    /// `wipefs --all` ran but a signature is still there.
    #[error("{device} still has a {signature} signature after wipefs --all")]
    WipeIncomplete { device: String, signature: String },

    /// A command failed in a way callers do not branch on.
    #[error("`{argv}` failed with exit code {}: {stderr}", fmt_code(*.code))]
    CommandFailed {
        argv: Argv,
        code: Option<i32>,
        stderr: String,
    },

    /// A command succeeded but its output could not be understood.
    #[error("could not parse the output of `{argv}`: {detail}")]
    Parse { argv: Argv, detail: String },

    /// The node engine kept finding work after its maximum number of plan rounds: something keeps
    /// changing the host underneath it.
    #[error(
        "device class {device_class} did not converge after {rounds} plans: something keeps changing \
         the host (see the executed actions in the log)"
    )]
    NotConverged { device_class: String, rounds: usize },

    /// Reading sysfs, devfs or procfs, or a filesystem call, failed.
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

fn fmt_code(code: Option<i32>) -> String {
    code.map_or_else(|| "none (killed by a signal)".to_owned(), |c| c.to_string())
}

impl Error {
    pub(crate) fn io(path: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}
