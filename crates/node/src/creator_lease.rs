//! The creator Lease of a shared device class: which one node runs `vgcreate --shared` (LVM does not
//! protect the first one; two nodes creating on the same LUNs would each write a volume group).
//!
//! One `coordination.k8s.io/v1` Lease per class, [`lvms_api::shared_creator_lease_name`], in the
//! agent's namespace, `holderIdentity` the node's name. [`decide`] is the whole rule; [`CreatorLease`]
//! carries it out:
//!
//! | Lease | step |
//! |---|---|
//! | absent | create it holding it (the API server lets exactly one create win: 409 for the others) |
//! | ours | renew: update `renewTime`, with the resourceVersion read |
//! | another node's, `renewTime + leaseDurationSeconds` in the future | wait |
//! | another node's and expired, or nobody's | take over: update with the resourceVersion read, so of two nodes taking over at once one gets 409 |
//!
//! A node asks for the Lease only while its next step would be `vgcreate` (see
//! [`crate::volume_group::needs_creator`]), at the end of the observation the plan reads, so the
//! renewal is immediately before the command. The Lease lasts [`DURATION`], longer than `vgcreate
//! --shared` may run ([`lvms_host::scope::LOCK_TIMEOUT`]), so nobody takes it over while the holder's
//! command runs. Expiry compares the holder's `renewTime` with the reader's clock: node clocks must
//! agree to well within the margin (60 s).
//!
//! Once the volume group exists nobody asks for the Lease again, and it is left to expire rather than
//! deleted: a node whose observation began before the group was made may still ask for it, and must
//! then find it held (by the creator, which needs no second `vgcreate`) rather than free. The stale
//! object costs nothing; a class made again under the same name takes it over once expired.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::{SignedDuration, Timestamp},
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};

/// How long a creator Lease lasts after each renewal: `vgcreate --shared`'s timeout and a minute.
pub const DURATION: Duration = Duration::from_secs(lvms_host::scope::LOCK_TIMEOUT.as_secs() + 60);

/// What to do about the Lease, as [`decide`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, holding it.
    Create,
    /// It is ours: renew it (update with this resourceVersion).
    Renew { resource_version: String },
    /// Another node's and expired, or nobody's: take it over (update with this resourceVersion);
    /// `transitions` is the new `leaseTransitions`.
    TakeOver {
        resource_version: String,
        previous: Option<String>,
        transitions: i32,
    },
    /// Another node holds it until `expires`.
    Wait { holder: String, expires: Timestamp },
}

/// When `lease` stops being valid: its `renewTime` (else `acquireTime`) plus its
/// `leaseDurationSeconds`; `None` when it has neither time or no duration (never valid).
pub fn expiry(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    let since = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let secs = spec.lease_duration_seconds.filter(|s| *s > 0)?;
    Some(
        since
            .checked_add(SignedDuration::from_secs(i64::from(secs)))
            .unwrap_or(Timestamp::MAX),
    )
}

/// The rule of the creator Lease for node `me` at `now` (see the module documentation).
pub fn decide(lease: Option<&Lease>, me: &str, now: Timestamp) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let resource_version = lease.metadata.resource_version.clone().unwrap_or_default();
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.filter(|h| !h.is_empty());
    if holder.as_deref() == Some(me) {
        return Decision::Renew { resource_version };
    }
    if let (Some(holder), Some(expires)) = (&holder, expiry(lease))
        && expires > now
    {
        return Decision::Wait {
            holder: holder.clone(),
            expires,
        };
    }
    Decision::TakeOver {
        resource_version,
        previous: holder,
        transitions: spec.lease_transitions.unwrap_or(0).saturating_add(1),
    }
}

/// What [`CreatorLease::try_hold`] ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// This node holds the Lease (created, renewed or taken over now).
    Held,
    /// Another node holds it until `expires`.
    Other { holder: String, expires: Timestamp },
    /// Every attempt lost a race with another writer (or the Lease read had no resourceVersion to
    /// update it with).
    Contended,
}

impl Holding {
    pub fn is_held(&self) -> bool {
        *self == Self::Held
    }
}

/// The creator Lease of one shared class, as seen by one node.
#[derive(Clone)]
pub struct CreatorLease {
    api: Api<Lease>,
    name: String,
    namespace: String,
    me: String,
    duration: Duration,
}

/// Reads and writes per [`CreatorLease::try_hold`] before it gives up as [`Holding::Contended`].
const ATTEMPTS: usize = 3;

impl CreatorLease {
    /// The Lease of class `class` in `namespace`, for node `me`, lasting [`DURATION`].
    pub fn new(client: Client, namespace: &str, class: &str, me: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: lvms_api::shared_creator_lease_name(class),
            namespace: namespace.to_owned(),
            me: me.to_owned(),
            duration: DURATION,
        }
    }

    /// The same Lease with another duration (tests).
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn spec(&self, now: Timestamp, acquired: Option<MicroTime>, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.me.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs().max(1)).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Reads the Lease and creates, renews or takes it over when [`decide`] says so; a write that
    /// loses a race (409) reads again.
    pub async fn try_hold(&self) -> kube::Result<Holding> {
        for _ in 0..ATTEMPTS {
            let current = self.api.get_opt(&self.name).await?;
            let now = Timestamp::now();
            let written = match decide(current.as_ref(), &self.me, now) {
                Decision::Wait { holder, expires } => {
                    return Ok(Holding::Other { holder, expires });
                }
                Decision::Create => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(self.name.clone()),
                            namespace: Some(self.namespace.clone()),
                            ..ObjectMeta::default()
                        },
                        spec: Some(self.spec(now, None, 0)),
                    };
                    Some(self.api.create(&PostParams::default(), &lease).await)
                }
                Decision::Renew { resource_version } => {
                    let mut lease = current.unwrap_or_default();
                    let spec = lease.spec.take().unwrap_or_default();
                    lease.metadata.resource_version = Some(resource_version);
                    lease.spec = Some(self.spec(
                        now,
                        spec.acquire_time,
                        spec.lease_transitions.unwrap_or(0),
                    ));
                    self.replace(&lease).await
                }
                Decision::TakeOver {
                    resource_version,
                    previous,
                    transitions,
                } => {
                    tracing::info!(lease = %self.name, previous = ?previous, "taking over an expired creator Lease");
                    let mut lease = current.unwrap_or_default();
                    lease.metadata.resource_version = Some(resource_version);
                    lease.spec = Some(self.spec(now, None, transitions));
                    self.replace(&lease).await
                }
            };
            match written {
                None => return Ok(Holding::Contended),
                Some(Ok(_)) => return Ok(Holding::Held),
                // Created or changed by someone else since it was read: read again.
                Some(Err(kube::Error::Api(s))) if s.code == 409 => continue,
                Some(Err(e)) => return Err(e),
            }
        }
        Ok(Holding::Contended)
    }

    /// Updates the Lease on the condition that it is still at the resourceVersion it carries (never
    /// without one: that update would be unconditional).
    async fn replace(&self, lease: &Lease) -> Option<kube::Result<Lease>> {
        let read = lease.metadata.resource_version.as_deref();
        if read.is_none_or(str::is_empty) {
            return None;
        }
        Some(
            self.api
                .replace(&self.name, &PostParams::default(), lease)
                .await,
        )
    }
}

#[cfg(test)]
mod tests;
