//! The creator Lease of a shared device class: which one node runs `vgcreate --shared` (LVM does not
//! protect the first one; two nodes creating on the same LUNs would each write a volume group).
//!
//! One [`lvms_k8s::lease::HeldLease`] per class, [`lvms_api::shared_creator_lease_name`], in the
//! agent's namespace, held by the node's name, under the rule of [`lvms_k8s::lease`].
//!
//! A node asks for the Lease only while its next step would be `vgcreate` (see
//! [`crate::volume_group::needs_creator`]), at the end of the observation the plan reads, so the
//! renewal is immediately before the command. The Lease lasts [`DURATION`], longer than `vgcreate
//! --shared` may run ([`lvms_host::scope::LOCK_TIMEOUT`]), so nobody takes it over while the holder's
//! command runs. Node clocks must agree to well within the margin (60 s).
//!
//! Once the volume group exists nobody asks for the Lease again, and it is left to expire rather than
//! deleted: a node whose observation began before the group was made may still ask for it, and must
//! then find it held (by the creator, which needs no second `vgcreate`) rather than free. The stale
//! object costs nothing; a class made again under the same name takes it over once expired.

use std::time::Duration;

use kube::Client;
pub use lvms_k8s::lease::{HeldLease as CreatorLease, Holding};

/// How long a creator Lease lasts after each renewal: `vgcreate --shared`'s timeout and a minute.
pub const DURATION: Duration = Duration::from_secs(lvms_host::scope::LOCK_TIMEOUT.as_secs() + 60);

/// The creator Lease of class `class` in `namespace`, for node `me`, lasting [`DURATION`].
pub fn creator_lease(client: Client, namespace: &str, class: &str, me: &str) -> CreatorLease {
    CreatorLease::new(
        client,
        namespace,
        &lvms_api::shared_creator_lease_name(class),
        me,
        DURATION,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_outlasts_vgcreate() {
        assert!(DURATION > lvms_host::scope::LOCK_TIMEOUT + Duration::from_secs(30));
    }
}
