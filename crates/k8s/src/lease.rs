//! A `coordination.k8s.io/v1` Lease that one holder at a time holds: the creator Lease of a shared
//! class (which one node runs `vgcreate --shared`, `lvms_node::creator_lease`) and the leader Lease
//! of the operator's and the CSI controller's single-instance controllers ([`crate::leader`]) are
//! the same object under the same rule. [`decide`] is the whole rule; [`HeldLease`] carries it out:
//!
//! | Lease | step |
//! |---|---|
//! | absent | create it holding it (the API server lets exactly one create win: 409 for the others) |
//! | ours | renew: update `renewTime`, with the resourceVersion read |
//! | another's, `renewTime + leaseDurationSeconds` in the future | wait |
//! | another's and expired, or nobody's | take over: update with the resourceVersion read, so of two taking over at once one gets 409 |
//!
//! Expiry compares the holder's `renewTime` with the reader's clock: the holders' clocks must agree
//! to well within the margin the user of the Lease leaves (the creator Lease 60 s, the leader Lease
//! the difference between its duration and its renew deadline, see [`crate::leader`]).
//!
//! [`HeldLease::release`] hands a held Lease back (nobody holds it, expired now), so the next
//! holder need not wait for its duration.

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

/// What to do about the Lease, as [`decide`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is none: create it, holding it.
    Create,
    /// It is ours: renew it (update with this resourceVersion).
    Renew { resource_version: String },
    /// Another's and expired, or nobody's: take it over (update with this resourceVersion);
    /// `transitions` is the new `leaseTransitions`.
    TakeOver {
        resource_version: String,
        previous: Option<String>,
        transitions: i32,
    },
    /// Another holds it until `expires`.
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

/// The rule of the Lease for holder `me` at `now` (see the module documentation).
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

/// What [`HeldLease::try_hold`] ended with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holding {
    /// `me` holds the Lease (created, renewed or taken over now).
    Held,
    /// Another holds it until `expires`.
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

/// One Lease, as seen by one would-be holder.
#[derive(Clone)]
pub struct HeldLease {
    api: Api<Lease>,
    name: String,
    namespace: String,
    me: String,
    duration: Duration,
}

/// Reads and writes per [`HeldLease::try_hold`] before it gives up as [`Holding::Contended`].
const ATTEMPTS: usize = 3;

impl HeldLease {
    /// The Lease `name` in `namespace`, for holder `me`, lasting `duration` after each renewal.
    pub fn new(client: Client, namespace: &str, name: &str, me: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            me: me.to_owned(),
            duration,
        }
    }

    /// The same Lease with another duration (tests).
    pub fn with_duration(mut self, duration: Duration) -> Self {
        self.duration = duration;
        self
    }

    /// Who asks for the Lease.
    pub fn me(&self) -> &str {
        &self.me
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
                    tracing::info!(lease = %self.name, me = %self.me, previous = ?previous, "taking over an expired Lease");
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

    /// Hands the Lease back when `me` holds it: nobody holds it and it expired now (one second long,
    /// as client-go's leader election leaves it), so the next holder takes it over at once. A Lease
    /// another holds, or one changed since it was read, is left as it is.
    pub async fn release(&self) -> kube::Result<bool> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(false);
        };
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.me.as_str()) {
            return Ok(false);
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        match self.replace(&lease).await {
            Some(Ok(_)) => Ok(true),
            Some(Err(kube::Error::Api(s))) if s.code == 409 => Ok(false),
            Some(Err(e)) => Err(e),
            None => Ok(false),
        }
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
