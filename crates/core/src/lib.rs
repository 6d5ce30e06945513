//! Pure, synchronous logic of lvms-rs. Nothing here touches the machine: the `host` crate observes it and
//! executes the actions planned here.
#![forbid(unsafe_code)]

pub mod capacity;
pub mod config;
pub mod filter;
pub mod from_api;
pub mod glob;
pub mod layout;
pub mod leave;
pub mod lvattr;
pub mod model;
pub mod names;
pub mod plan;
pub mod pool_fit;
pub mod shared;
pub mod size;
pub mod webhook;
