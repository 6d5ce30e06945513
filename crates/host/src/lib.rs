//! The only crate of lvms-rs that touches the machine: a command [`runner`] (real and scripted fake),
//! [`lvm`] reports and mutations, block [`devices`] (lsblk, blkid, wipefs, sysfs), and filesystems
//! ([`fs`]: mkfs, grow, mount, mountinfo, statvfs).
//!
//! Everything that reaches a command line is validated first ([`validate`]); commands are argv vectors,
//! never shell strings.
#![forbid(unsafe_code)]

pub mod class;
pub mod devices;
pub mod engine;
pub mod error;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod fence;
pub mod fs;
pub mod lvm;
pub mod runner;
pub mod sanlock;
pub mod scope;
pub mod shared;
pub mod shell;
pub mod validate;

pub use error::{Error, Result};
