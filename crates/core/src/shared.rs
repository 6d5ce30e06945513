//! Shared-LUN device classes: every decision about a shared volume group on one node, as pure
//! functions. One volume group lives on LUNs that several nodes see; `lvmlockd` with `sanlock` keeps
//! their LVM metadata and activations apart. The node engine observes ([`Observed`]), asks
//! [`plan`] for the next step and executes it; the operator assigns sanlock host ids with
//! [`assign_host_ids`]. Fencing and failover (a later issue) add their decisions here, so that every
//! lock decision stays in one place.
//!
//! The steps on a node, in order (each is checked before the next):
//! 1. the host's `sanlock` and `lvmlockd` daemons run (host services: a daemon that died with a
//!    container would drop every lock) — otherwise `Failed`, with the command that fixes it;
//! 2. the node has a sanlock host id — otherwise `Waiting`;
//! 3. every configured LUN path exists — otherwise `Failed` with `devices_visible: false`;
//! 4. the class's devices file lists every LUN — otherwise add them (LVM then sees only these
//!    devices for the class, and the class's commands see no other device);
//! 5. the volume group exists — otherwise exactly one node (`may_create`) creates it, and only on
//!    LUNs that hold nothing (or an orphan LVM physical volume); the others wait for it;
//! 6. it is a sanlock volume group made by lvms-rs — otherwise `Failed`, nothing is touched;
//! 7. the node has started its lockspace — otherwise start it (retried with [`lock_start_delay`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::config::{DeviceClassConfig, VG_OWNER_TAG};

pub mod fencing;
pub mod hook;
pub mod leave;
pub mod rejoin;

/// Smallest sanlock host id.
pub const MIN_HOST_ID: u16 = 1;
/// Largest sanlock host id (sanlock's limit with 1 MiB lease alignment).
pub const MAX_HOST_ID: u16 = 2000;

/// The devices file of a shared class (a file name in `<LVM system dir>/devices/`, as
/// `lvm --devicesfile` takes it).
pub fn devices_file(class: &str) -> String {
    format!("lvms-{class}.devices")
}

/// Whether a daemon the shared classes need runs on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Daemon {
    Running,
    /// Its program is not installed.
    Missing,
    /// Installed, not running (or not answering); the text says what was seen.
    Stopped(String),
}

/// The two daemons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Daemons {
    pub sanlock: Daemon,
    pub lvmlockd: Daemon,
}

/// The volume group as a lockd-enabled LVM command sees it through the class's devices file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SharedVg {
    pub name: String,
    /// `sanlock`, `dlm` or empty (a local volume group).
    pub lock_type: String,
    pub tags: Vec<String>,
    /// Canonical paths of its physical volumes.
    pub pvs: Vec<String>,
}

/// Everything [`plan`] looks at, for one shared class on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    pub daemons: Daemons,
    /// This node's sanlock host id, when it has one.
    pub host_id: Option<u16>,
    /// Whether this node may create the volume group (holds the creator Lease, or standalone's
    /// `createVolumeGroups`).
    pub may_create: bool,
    /// Each configured path mapped to its canonical device path, `None` when it does not exist.
    pub resolved: BTreeMap<String, Option<String>>,
    /// Canonical device paths the class's devices file lists.
    pub devices_file: BTreeSet<String>,
    /// The class's volume group, when LVM sees it.
    pub vg: Option<SharedVg>,
    /// Canonical paths that are LVM physical volumes of no volume group.
    pub orphan_pvs: BTreeSet<String>,
    /// Signatures (lsblk `FSTYPE`, partition tables) on the LUNs, by canonical path.
    pub signatures: BTreeMap<String, String>,
    /// Whether this node's lvmlockd has the volume group's lockspace started.
    pub lockspace_started: bool,
}

/// One step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "camelCase")]
pub enum Action {
    /// `lvmdevices --devicesfile <file> --adddev <path>`.
    AddToDevicesFile { file: String, path: String },
    /// `vgcreate --shared` (which also starts this node's lockspace).
    CreateVolumeGroup {
        name: String,
        pvs: Vec<String>,
        tags: Vec<String>,
        host_id: u16,
    },
    /// `vgchange --lock-start`.
    StartLockspace { vg: String, host_id: u16 },
}

/// Where the class stands on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum State {
    /// The lockspace is joined: volumes can be made and activated here.
    Joined,
    /// Something else has to happen first (another node, the operator); not an error.
    Waiting { reason: String },
    /// Cannot go on until someone fixes what `reason` says.
    Failed { reason: String },
}

/// The next steps and the state they lead from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub actions: Vec<Action>,
    pub state: State,
    /// Whether this node sees every LUN of the class.
    pub devices_visible: bool,
}

impl Plan {
    fn stop(state: State, devices_visible: bool) -> Self {
        Self {
            actions: Vec::new(),
            state,
            devices_visible,
        }
    }

    fn act(actions: Vec<Action>, reason: String) -> Self {
        Self {
            actions,
            state: State::Waiting { reason },
            devices_visible: true,
        }
    }
}

fn daemon_problem(name: &str, package: &str, daemon: &Daemon) -> Option<String> {
    match daemon {
        Daemon::Running => None,
        Daemon::Missing => Some(format!(
            "{name} is not installed on this host: install and start it as a host service \
             (Debian/Ubuntu: apt install {package} && systemctl enable --now {name}; RHCOS: the \
             ksan-storage extension); lvms-rs never runs a shared class without locking"
        )),
        Daemon::Stopped(seen) => Some(format!(
            "{name} is not running on this host ({seen}): start it as a host service \
             (systemctl enable --now {name})"
        )),
    }
}

/// The next steps for shared class `class` on this node. `class` must be shared.
pub fn plan(class: &DeviceClassConfig, observed: &Observed) -> Plan {
    let name = &class.name;
    let problems: Vec<String> = [
        daemon_problem("sanlock", "sanlock", &observed.daemons.sanlock),
        daemon_problem("lvmlockd", "lvm2-lockd", &observed.daemons.lvmlockd),
    ]
    .into_iter()
    .flatten()
    .collect();
    if !problems.is_empty() {
        return Plan::stop(
            State::Failed {
                reason: problems.join("; "),
            },
            observed.resolved.values().all(Option::is_some),
        );
    }
    let Some(host_id) = observed.host_id else {
        return Plan::stop(
            State::Waiting {
                reason:
                    "this node has no sanlock host id yet (the operator assigns one to every node \
                         of a shared class; standalone: set shared.hostId in the config)"
                        .to_owned(),
            },
            observed.resolved.values().all(Option::is_some),
        );
    };
    if !(MIN_HOST_ID..=MAX_HOST_ID).contains(&host_id) {
        return Plan::stop(
            State::Failed {
                reason: format!(
                    "sanlock host id {host_id} is out of range: it must be {MIN_HOST_ID}–{MAX_HOST_ID}"
                ),
            },
            true,
        );
    }
    let paths = &class.device_selector.paths;
    if paths.is_empty() {
        return Plan::stop(
            State::Failed {
                reason: "a shared class must list its LUNs in deviceSelector.paths".to_owned(),
            },
            false,
        );
    }
    let mut canonical = Vec::new();
    let mut missing = Vec::new();
    for p in paths {
        match observed.resolved.get(p).cloned().flatten() {
            Some(c) => canonical.push(c),
            None => missing.push(p.as_str()),
        }
    }
    if !missing.is_empty() {
        return Plan::stop(
            State::Failed {
                reason: format!(
                    "this node does not see {}: attach the LUN to this node (and check multipath), \
                     or leave the node out of the class's nodeSelector",
                    missing.join(", ")
                ),
            },
            false,
        );
    }
    let file = devices_file(name);
    let to_add: Vec<Action> = paths
        .iter()
        .zip(&canonical)
        .filter(|(_, c)| !observed.devices_file.contains(*c))
        .map(|(p, _)| Action::AddToDevicesFile {
            file: file.clone(),
            path: p.clone(),
        })
        .collect();
    if !to_add.is_empty() {
        return Plan::act(
            to_add,
            format!("adding the LUNs to the devices file {file}"),
        );
    }
    let Some(vg) = &observed.vg else {
        return plan_creation(name, &canonical, host_id, observed);
    };
    // `vgcreate --shared` writes the group before its lock type: a group tagged by lvms-rs with
    // none yet, seen by a node that does not create it, is another node's creation in progress.
    if vg.lock_type.is_empty() && vg.tags.iter().any(|t| t == VG_OWNER_TAG) && !observed.may_create
    {
        return Plan::stop(
            State::Waiting {
                reason: format!(
                    "waiting for the node that creates shared volume group {name} to finish it \
                     (it has no lock type yet)"
                ),
            },
            true,
        );
    }
    if vg.lock_type != "sanlock" {
        let kind = if vg.lock_type.is_empty() {
            "a local (not shared) volume group".to_owned()
        } else {
            format!("a volume group with lock type {}", vg.lock_type)
        };
        return Plan::stop(
            State::Failed {
                reason: format!(
                    "volume group {name} on {} is {kind}; lvms-rs uses only sanlock volume groups it \
                     made and converts none: remove it by hand or pick other LUNs",
                    vg.pvs.join(", ")
                ),
            },
            true,
        );
    }
    if !vg.tags.iter().any(|t| t == VG_OWNER_TAG) {
        return Plan::stop(
            State::Failed {
                reason: format!(
                    "shared volume group {name} was not made by lvms-rs (no {VG_OWNER_TAG:?} tag): \
                     tag it (vgchange --addtag {VG_OWNER_TAG} {name}) if it is meant for this class"
                ),
            },
            true,
        );
    }
    if !observed.lockspace_started {
        return Plan::act(
            vec![Action::StartLockspace {
                vg: name.clone(),
                host_id,
            }],
            format!("joining the lockspace of {name} with host id {host_id}"),
        );
    }
    Plan::stop(State::Joined, true)
}

fn plan_creation(name: &str, canonical: &[String], host_id: u16, observed: &Observed) -> Plan {
    let used: Vec<String> = canonical
        .iter()
        .filter(|c| !observed.orphan_pvs.contains(*c))
        .filter_map(|c| observed.signatures.get(c).map(|s| format!("{c} ({s})")))
        .collect();
    if !observed.may_create {
        let reason = if used.is_empty() {
            format!("waiting for the node that creates shared volume group {name}")
        } else {
            format!(
                "waiting for shared volume group {name}: {} already holds data, which the creating \
                 node is finishing or which is not an lvms-rs volume group",
                used.join(", ")
            )
        };
        return Plan::stop(State::Waiting { reason }, true);
    }
    if !used.is_empty() {
        return Plan::stop(
            State::Failed {
                reason: format!(
                    "refusing to create shared volume group {name}: {} already holds data, and no \
                     volume group of that name is on it; if the data is not needed, wipe the LUN by hand \
                     (wipefs --all) on one node",
                    used.join(", ")
                ),
            },
            true,
        );
    }
    Plan::act(
        vec![Action::CreateVolumeGroup {
            name: name.to_owned(),
            pvs: canonical.to_vec(),
            tags: vec![VG_OWNER_TAG.to_owned()],
            host_id,
        }],
        format!("creating shared volume group {name}"),
    )
}

/// How long to wait before lock-start attempt `attempt` (1 is the first retry), or `None` when the
/// attempts of one converge are used up. The first try on a second host can fail while the lock
/// LV's device node appears; after an unclean shutdown sanlock may take minutes, which later
/// converges cover.
pub fn lock_start_delay(attempt: u32) -> Option<Duration> {
    const DELAYS: [u64; 5] = [1, 2, 5, 10, 20];
    DELAYS
        .get(attempt.checked_sub(1)? as usize)
        .map(|s| Duration::from_secs(*s))
}

/// The outcome of [`assign_host_ids`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostIds {
    /// Every node's host id after the change.
    pub ids: BTreeMap<String, u16>,
    /// Nodes given an id now.
    pub added: Vec<(String, u16)>,
    /// Entries dropped because their node is gone and its host is dead (see [`Release`]).
    pub released: Vec<(String, u16)>,
    /// Entries of nodes that are gone but whose ids are kept: gone too recently, or still live.
    pub held: Vec<(String, u16)>,
    /// When each node that is gone and still holds an id was first seen gone (Unix seconds): the
    /// record to write back.
    pub gone_since: BTreeMap<String, i64>,
    /// The earliest time (Unix seconds) a held id may be released, when that is known: the caller
    /// looks again then. Ids held because they are live have no time.
    pub release_at: Option<i64>,
    /// Entries that were invalid (out of range, or an id another node already had) and were
    /// replaced, with the old value.
    pub replaced: Vec<(String, String)>,
    /// Nodes that need an id when none is left.
    pub exhausted: Vec<String>,
}

impl HostIds {
    /// Whether the record must be written back, given the `gone_since` it was read with.
    pub fn changed(&self, read_gone_since: &BTreeMap<String, i64>) -> bool {
        !(self.added.is_empty() && self.released.is_empty() && self.replaced.is_empty())
            || self.gone_since != *read_gone_since
    }
}

/// When the id of a node that is gone may be released: only once its host is dead as sanlock
/// counts it, so that no other node joins a lockspace with an id a live host still renews.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Release {
    /// Now, Unix seconds.
    pub now: i64,
    /// When each gone node was first seen gone (Unix seconds), as recorded.
    pub gone_since: BTreeMap<String, i64>,
    /// How long a node must have been gone: the largest `host_dead_seconds` over the shared
    /// classes (sanlock's host-dead time, 8 × the I/O timeout + 60 s).
    pub host_dead_seconds: i64,
    /// The host ids some node's sanlock still sees renewing in a shared class's lockspace; `None`
    /// when that could not be read, which releases nothing.
    pub live: Option<BTreeSet<u16>>,
}

impl Release {
    /// How long a gone node's id is kept at least, given the I/O timeouts (seconds) of the shared
    /// classes: the longest sanlock host-dead time among them, `8 × timeout + 60` (sanlock's
    /// `timeouts.h`; the 60 s are the watchdog's fire timeout). With no class, the default 10 s
    /// timeout's 140 s.
    pub fn host_dead_seconds_for(io_timeouts: impl IntoIterator<Item = i32>) -> i64 {
        io_timeouts
            .into_iter()
            .map(|n| 8 * i64::from(n) + 60)
            .max()
            .unwrap_or(8 * 10 + 60)
    }

    /// Whether `id`, of a node gone since `since`, may be released now.
    fn may_release(&self, since: i64, id: u16) -> bool {
        self.now.saturating_sub(since) >= self.host_dead_seconds
            && self.live.as_ref().is_some_and(|live| !live.contains(&id))
    }
}

/// Assigns sanlock host ids: `current` is the record as stored (node → id text), `needing` the
/// nodes of shared classes, `present` every node that exists. An id stays with its node for as long
/// as the node exists (whether or not it still needs one) and is never given to another node in the
/// same step. New nodes get the lowest free ids, in name order. Ids are never derived from names or
/// addresses: two nodes can never collide.
///
/// A node that is gone keeps its id (held, recorded in `gone_since` from the first step that sees
/// it gone) until both: it has been gone for `release.host_dead_seconds`, and no node sees its id
/// live (`release.live`; a machine whose Node object was deleted may still run sanlock). Then the
/// id is released. A node that comes back before keeps its id, and its `gone_since` is dropped.
///
/// Two writers that both read the same record and both add a node would pick the same id: the
/// caller writes the result with the record's resourceVersion and starts over on a conflict.
pub fn assign_host_ids(
    current: &BTreeMap<String, String>,
    needing: &BTreeSet<String>,
    present: &BTreeSet<String>,
    release: &Release,
) -> HostIds {
    let mut out = HostIds::default();
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    let mut needs_new: BTreeSet<String> = BTreeSet::new();
    for (node, text) in current {
        let parsed = text
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|id| (MIN_HOST_ID..=MAX_HOST_ID).contains(id));
        if !present.contains(node) {
            if let Some(id) = parsed {
                let first = taken.insert(id);
                let since = release.gone_since.get(node).copied().unwrap_or(release.now);
                // A duplicate of an id kept for another node is dropped as well.
                if release.may_release(since, id) || !first {
                    out.released.push((node.clone(), id));
                } else {
                    out.ids.insert(node.clone(), id);
                    out.held.push((node.clone(), id));
                    out.gone_since.insert(node.clone(), since);
                    let at = since.saturating_add(release.host_dead_seconds);
                    if at > release.now {
                        out.release_at = Some(out.release_at.map_or(at, |t| t.min(at)));
                    }
                }
            }
            continue;
        }
        match parsed {
            Some(id) if taken.insert(id) => {
                out.ids.insert(node.clone(), id);
            }
            _ => {
                out.replaced.push((node.clone(), text.clone()));
                needs_new.insert(node.clone());
            }
        }
    }
    for node in needing {
        if present.contains(node) && !out.ids.contains_key(node) {
            needs_new.insert(node.clone());
        }
    }
    let mut free = (MIN_HOST_ID..=MAX_HOST_ID).filter(|id| !taken.contains(id));
    for node in needs_new {
        match free.next() {
            Some(id) => {
                out.ids.insert(node.clone(), id);
                out.added.push((node, id));
            }
            None => out.exhausted.push(node),
        }
    }
    out
}

#[cfg(test)]
mod tests;
