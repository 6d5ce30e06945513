//! The CSI Node service: stage (activate, format when blank, mount), publish (bind mounts, filesystem or
//! block), unpublish and unstage, stats with the volume's condition, and online filesystem growth.
//!
//! Every decision is read from `/proc/self/mountinfo` ([`table`]), never kept only in memory, so a
//! restarted driver answers retries as the one before it would have. Requests are checked before
//! anything runs ([`request`]).

pub mod request;
pub mod table;
