//! One device class on this node, whatever its kind: [`converge`] takes it to its desired state and
//! [`leave`] removes it, each choosing the class's engine once from its
//! [`Access`](lvms_core::config::Access): the local engine ([`crate::engine`]) for a class on this
//! node's disks, the shared one ([`crate::shared`]) for a class on LUNs several nodes see. Both
//! engines plan in `core`, execute here, and observe again until the plan stops.

use lvms_core::{
    config::{Access, Claims, DeviceClassConfig, SharedNodeConfig},
    leave::{LeavePlan, LeaveState, LocalStep},
    shared::leave::LeaveAction,
};
use serde::Serialize;

use crate::{
    Result,
    engine::{self, ConvergeReport, LocalLeaveHost, NodeHost},
    shared::{self, SharedHost, SharedLeaveHost, SharedReport},
};

/// The machine as both engines see it: `local` for node-local classes, `shared` for shared ones.
pub struct Hosts<L, S> {
    pub local: L,
    pub shared: S,
}

/// What converging one class came to, in its engine's own report.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Converged {
    Local(Box<ConvergeReport>),
    Shared(Box<SharedReport>),
}

impl Converged {
    /// Whether the class can serve volumes on this node.
    pub fn is_ready(&self) -> bool {
        match self {
            Self::Local(r) => r.is_ready(),
            Self::Shared(r) => r.is_ready(),
        }
    }

    /// Why the class cannot serve volumes on this node, as its plan says (`None`: it can).
    pub fn not_ready_reason(&self) -> Option<String> {
        use lvms_core::{plan::ClassState, shared::State};
        if self.is_ready() {
            return None;
        }
        Some(match self {
            Self::Local(r) => match &r.plan.state {
                ClassState::Failed { reason } | ClassState::Degraded { reason } => reason.clone(),
                ClassState::Progressing | ClassState::Ready => {
                    "its volume group is still being made".to_owned()
                }
            },
            Self::Shared(r) => {
                let state = match &r.plan.state {
                    State::Failed { reason } | State::Waiting { reason } => reason.clone(),
                    State::Joined => "its lockspace is joined but not usable yet".to_owned(),
                };
                match r.fencing.as_ref().map(|f| f.verdict.message.as_str()) {
                    Some(m) if !m.is_empty() => format!("{state} (fencing: {m})"),
                    _ => state,
                }
            }
        })
    }
}

/// Converges `class` on this node. A node-local class never discovers or matches the devices in
/// `others` (what the other classes list or match); a shared class takes part as `node` says
/// (its sanlock host id; `None`: it cannot join).
pub async fn converge<L: NodeHost, S: SharedHost>(
    hosts: &Hosts<L, S>,
    class: &DeviceClassConfig,
    others: &Claims,
    node: Option<&SharedNodeConfig>,
) -> Result<Converged> {
    Ok(match class.access {
        Access::NodeLocal => Converged::Local(Box::new(
            engine::converge_among(&hosts.local, class, others).await?,
        )),
        Access::Shared(_) => Converged::Shared(Box::new(
            shared::converge(&hosts.shared, class, node).await?,
        )),
    })
}

/// What leaving one class ended with: the steps executed (of the class kind's step type `A`), in
/// order, and the last plan.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaveReport<A> {
    pub device_class: String,
    pub executed: Vec<A>,
    pub plan: LeavePlan<A>,
}

impl<A> LeaveReport<A> {
    /// Whether nothing of the class is left on this node.
    pub fn has_left(&self) -> bool {
        self.plan.state == LeaveState::Left
    }
}

/// What leaving one class came to, in its engine's own report.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Left {
    Local(LeaveReport<LocalStep>),
    Shared(LeaveReport<LeaveAction>),
}

impl Left {
    /// Where leaving stands.
    pub fn state(&self) -> &LeaveState {
        match self {
            Self::Local(r) => &r.plan.state,
            Self::Shared(r) => &r.plan.state,
        }
    }

    /// Whether nothing of the class is left on this node.
    pub fn has_left(&self) -> bool {
        *self.state() == LeaveState::Left
    }

    /// How many steps ran.
    pub fn executed(&self) -> usize {
        match self {
            Self::Local(r) => r.executed.len(),
            Self::Shared(r) => r.executed.len(),
        }
    }
}

/// Leaves `class` on this node: a node-local class's empty volume group of ours is removed; a
/// shared class's lockspace stops, and its remover removes the group (see
/// [`lvms_core::shared::leave`]).
pub async fn leave<L: LocalLeaveHost, S: SharedLeaveHost>(
    hosts: &Hosts<L, S>,
    class: &DeviceClassConfig,
    node: Option<&SharedNodeConfig>,
) -> Result<Left> {
    Ok(match class.access {
        Access::NodeLocal => Left::Local(engine::leave(&hosts.local, class).await?),
        Access::Shared(_) => Left::Shared(shared::leave(&hosts.shared, class, node).await?),
    })
}
