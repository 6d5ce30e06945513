//! Leader election: of the replicas of a role, the one holding a [`HeldLease`] runs the work that
//! must run once per cluster (the operator's controllers, the CSI controller's garbage collector);
//! the others stand by, serving what every replica serves (the admission webhook, CSI calls).
//!
//! The rule is client-go's, with its default timings ([`Timings::DEFAULT`]):
//! - standing by, a replica asks for the Lease every `retry`; it gets it once the leader's last
//!   renewal is `duration` old (or at once when the leader handed it back);
//! - leading, it renews every `retry`; when no renewal has succeeded for `renew_deadline` it stops
//!   leading ([`Lost`]: the caller ends the process, and its restart stands by again), and at once
//!   when it finds another holding the Lease. The leader
//!   stops acting `duration − renew_deadline` before anyone may take over, the margin for the two
//!   clocks (see [`crate::lease`]);
//! - when its work ends (the process is stopping) it hands the Lease back
//!   ([`HeldLease::release`]), so the next leader starts within one `retry`.
//!
//! A leader that dies without handing back (killed, its node lost) is replaced within `duration +
//! retry` of its last renewal.

use std::time::{Duration, Instant};

use crate::lease::{HeldLease, Holding};

/// How long a Lease lasts, how long a leader keeps trying to renew it, and how often anyone asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub duration: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
}

impl Timings {
    /// client-go's leader election defaults: 15 s, 10 s, 2 s.
    pub const DEFAULT: Self = Self {
        duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry: Duration::from_secs(2),
    };

    /// The leader Lease `name` in `namespace` for replica `me`, lasting [`Timings::duration`].
    pub fn lease(&self, client: kube::Client, namespace: &str, name: &str, me: &str) -> HeldLease {
        HeldLease::new(client, namespace, name, me, self.duration)
    }
}

/// Leadership was lost: no renewal of `lease` succeeded for `for_` (at least the renew deadline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub lease: String,
    pub for_: Duration,
    pub last_error: String,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "lost the leader Lease {}: not renewed for {:.1} s ({})",
            self.lease,
            self.for_.as_secs_f64(),
            self.last_error
        )
    }
}

impl std::error::Error for Lost {}

/// Stands by until `lease` is held, then runs `work` while renewing it; returns `Ok` when `stop`
/// completes before leading, or when `work` ends (it should end on the same stop), after handing
/// the Lease back; `Err(Lost)` when renewing failed for the renew deadline (`work` is dropped then,
/// mid-step: what it does must be safe to stop anywhere, as for a killed process). `leading` is
/// called once, when leadership starts.
pub async fn lead<W, S>(
    lease: &HeldLease,
    timings: Timings,
    work: W,
    stop: S,
    leading: impl FnOnce(),
) -> Result<(), Lost>
where
    W: Future<Output = ()>,
    S: Future<Output = ()>,
{
    let name = lease.name().to_owned();
    let me = lease.me().to_owned();
    tokio::pin!(stop);
    let mut said: Option<String> = None;
    loop {
        let step = tokio::time::timeout(timings.renew_deadline, lease.try_hold()).await;
        match step {
            Ok(Ok(Holding::Held)) => break,
            Ok(Ok(Holding::Other { holder, expires })) => {
                if said.as_deref() != Some(holder.as_str()) {
                    tracing::info!(lease = %name, %me, leader = %holder, %expires, "standing by");
                    said = Some(holder);
                }
            }
            Ok(Ok(Holding::Contended)) => {}
            Ok(Err(e)) => tracing::warn!(lease = %name, error = %e, "asking for the leader Lease"),
            Err(_) => tracing::warn!(lease = %name, "asking for the leader Lease timed out"),
        }
        tokio::select! {
            () = &mut stop => return Ok(()),
            () = tokio::time::sleep(timings.retry) => {}
        }
    }
    tracing::info!(lease = %name, %me, "leading");
    leading();
    let mut renewed = Instant::now();
    tokio::pin!(work);
    loop {
        tokio::select! {
            () = &mut work => break,
            () = tokio::time::sleep(timings.retry) => {
                let left = timings.renew_deadline.saturating_sub(renewed.elapsed());
                let error = match tokio::time::timeout(left, lease.try_hold()).await {
                    Ok(Ok(Holding::Held)) => {
                        renewed = Instant::now();
                        continue;
                    }
                    // Taken over (this leader's renewals were late, or the clocks disagree):
                    // another leads already.
                    Ok(Ok(Holding::Other { holder, .. })) => {
                        return Err(Lost {
                            lease: name,
                            for_: renewed.elapsed(),
                            last_error: format!("{holder} holds it now"),
                        });
                    }
                    Ok(Ok(Holding::Contended)) => "every write conflicted".to_owned(),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "the API server did not answer".to_owned(),
                };
                let for_ = renewed.elapsed();
                if for_ >= timings.renew_deadline {
                    return Err(Lost { lease: name, for_, last_error: error });
                }
                tracing::warn!(lease = %name, %error, "renewing the leader Lease failed; trying again");
            }
        }
    }
    match lease.release().await {
        Ok(true) => tracing::info!(lease = %name, "handed the leader Lease back"),
        Ok(false) => {}
        Err(e) => tracing::warn!(lease = %name, error = %e, "handing the leader Lease back"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
