//! Dev-only helpers for lvms-rs tests.
#![forbid(unsafe_code)]
