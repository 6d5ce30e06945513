//! The only crate of lvms-rs that touches the machine.
#![forbid(unsafe_code)]
