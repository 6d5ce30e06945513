//! The Controller service over a [`Backend`]: volumes, snapshots, clones, restores, expansion,
//! capacity and listing, with the CSI spec's idempotency and error codes.
//!
//! Idempotency comes from the disk: a volume's LV name is derived from the CO's name
//! ([`lvms_engine::ids`]), so a retried request finds what an earlier (possibly crashed) attempt made and
//! answers with it when it is compatible (same class, size within the requested range, same
//! source), `ALREADY_EXISTS` otherwise. Operations on one name or id run one at a time; a concurrent
//! second one gets `ABORTED` ([`lvms_engine::locks`]).

use std::{collections::HashMap, sync::Arc};

use lvms_core::lvattr::LvHealth;
use tonic::{Code, Request, Response, Status};

use crate::{
    DEVICE_CLASS_KEY, TOPOLOGY_NODE_KEY, chain,
    csi::{
        self, CapacityRange, ControllerExpandVolumeRequest, ControllerExpandVolumeResponse,
        ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse,
        ControllerGetVolumeRequest, ControllerGetVolumeResponse, ControllerModifyVolumeRequest,
        ControllerModifyVolumeResponse, ControllerPublishVolumeRequest,
        ControllerPublishVolumeResponse, ControllerServiceCapability,
        ControllerUnpublishVolumeRequest, ControllerUnpublishVolumeResponse, CreateSnapshotRequest,
        CreateSnapshotResponse, CreateVolumeRequest, CreateVolumeResponse, DeleteSnapshotRequest,
        DeleteSnapshotResponse, DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest,
        GetCapacityResponse, GetSnapshotRequest, GetSnapshotResponse, ListSnapshotsRequest,
        ListSnapshotsResponse, ListVolumesRequest, ListVolumesResponse, Snapshot, Topology,
        ValidateVolumeCapabilitiesRequest, ValidateVolumeCapabilitiesResponse, VolumeCapability,
        VolumeCondition, VolumeContentSource, controller_get_volume_response,
        controller_server::Controller,
        controller_service_capability::{self, rpc},
        list_snapshots_response, list_volumes_response, validate_volume_capabilities_response,
        volume_capability::{self, access_mode::Mode},
        volume_content_source,
    },
    params,
};
use lvms_engine::{
    backend::{
        Backend, BackendError, DeviceClassConfig, Layout, NewSnapshot, NewVolume, Source, Volume,
    },
    ids::{self, MAX_STRING_BYTES},
    locks::InFlight,
};

/// Size of a volume whose request names none (`capacity_range` absent or zero).
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;
/// The smallest XFS filesystem `mkfs.xfs` makes (xfsprogs 5.19 and later refuse smaller ones): an
/// xfs volume is made at least this big.
pub const MIN_XFS_SIZE: u64 = 300 << 20;
/// The largest volume this driver makes (1 EiB: sizes beyond any disk are a client error).
pub const MAX_VOLUME_SIZE: u64 = 1 << 60;

/// Every capability the Controller service advertises.
///
/// `GetSnapshot` is served but `GET_SNAPSHOT` is not advertised yet: csi-test v5.4.0's csi-sanity (the
/// conformance suite `cargo xtask sanity` runs) fails its `ControllerGetCapabilities` spec on any
/// capability it does not list, and it lists no `GET_SNAPSHOT` (v5.5.0 does, and adds GetSnapshot specs).
/// No sidecar lvms-rs deploys calls GetSnapshot.
pub const CAPABILITIES: [rpc::Type; 10] = [
    rpc::Type::CreateDeleteVolume,
    rpc::Type::GetCapacity,
    rpc::Type::ExpandVolume,
    rpc::Type::CreateDeleteSnapshot,
    rpc::Type::CloneVolume,
    rpc::Type::ListVolumes,
    rpc::Type::ListSnapshots,
    rpc::Type::GetVolume,
    rpc::Type::VolumeCondition,
    rpc::Type::SingleNodeMultiWriter,
];

/// An RPC's failure: the spec's code and a message that says what to do. Built by each RPC from its
/// own causes (so `NOT_FOUND` from the backend means "OK" to a delete and "no such source" to a
/// create); the whole cause chain is in the message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct RpcError {
    /// The gRPC code the spec asks for.
    pub code: Code,
    /// What went wrong, with its causes.
    pub message: String,
}

impl RpcError {
    fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    fn busy(key: &str) -> Self {
        Self::new(
            Code::Aborted,
            format!("an operation on {key} is in progress: retry when it has finished"),
        )
    }
}

impl From<RpcError> for Status {
    fn from(e: RpcError) -> Self {
        Status::new(e.code, e.message)
    }
}

/// The default mapping of a backend failure.
pub(crate) fn backend(e: BackendError) -> RpcError {
    let message = chain(&e);
    let code = match e {
        BackendError::NotFound(_) => Code::NotFound,
        BackendError::InvalidArgument(_) => Code::InvalidArgument,
        BackendError::InsufficientSpace(_) => Code::ResourceExhausted,
        BackendError::Conflict(_) => Code::AlreadyExists,
        BackendError::Unavailable(_) => Code::Unavailable,
        BackendError::Unsupported(_) | BackendError::Host(lvms_host::Error::InUse(_)) => {
            Code::FailedPrecondition
        }
        BackendError::Host(lvms_host::Error::Timeout { .. }) => Code::DeadlineExceeded,
        BackendError::Host(_) => Code::Internal,
    };
    RpcError::new(code, message)
}

fn require(field: &str, value: &str) -> Result<(), RpcError> {
    if value.is_empty() {
        return Err(RpcError::invalid(format!("{field} is required")));
    }
    if value.len() > MAX_STRING_BYTES {
        return Err(RpcError::invalid(format!(
            "{field} is {} bytes long: at most {MAX_STRING_BYTES} are allowed",
            value.len()
        )));
    }
    Ok(())
}

/// Checks one capability: an access type, a single-node access mode, a supported filesystem.
pub fn check_capability(cap: &VolumeCapability) -> Result<(), String> {
    check_capability_for(cap, None)
}

/// [`check_capability`] for a volume of `class`: a shared linear class's block volumes may also be
/// MULTI_NODE_* (RWX block, as KubeVirt live migration needs); filesystems are always single-node.
pub fn check_capability_for(
    cap: &VolumeCapability,
    class: Option<&DeviceClassConfig>,
) -> Result<(), String> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .ok_or("a volume capability has no access_mode")?;
    let block = matches!(
        cap.access_type,
        Some(volume_capability::AccessType::Block(_))
    );
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => {}
        Mode::Unknown => return Err("access mode UNKNOWN is not supported".to_owned()),
        other if class.is_some_and(DeviceClassConfig::multi_node) => {
            if !block {
                return Err(format!(
                    "access mode {} is not supported for a filesystem: filesystem volumes are \
                     single-node; use a block volume for multi-node access",
                    other.as_str_name()
                ));
            }
        }
        other if class.is_some_and(|c| c.shared().is_some()) => {
            return Err(format!(
                "access mode {} is not supported: thin volumes of shared device class {} are active \
                 on one node at a time; use a linear shared class for multi-node block volumes",
                other.as_str_name(),
                class.map_or("", |c| c.name.as_str())
            ));
        }
        other => {
            return Err(format!(
                "access mode {} is not supported: LVM volumes live on one node; use a SINGLE_NODE_* mode",
                other.as_str_name()
            ));
        }
    }
    match &cap.access_type {
        None => Err("a volume capability has neither mount nor block access".to_owned()),
        Some(volume_capability::AccessType::Block(_)) => Ok(()),
        Some(volume_capability::AccessType::Mount(m)) => {
            if m.fs_type.is_empty() || matches!(m.fs_type.as_str(), "ext4" | "xfs") {
                Ok(())
            } else {
                Err(format!(
                    "filesystem {:?} is not supported: use ext4 or xfs",
                    m.fs_type
                ))
            }
        }
    }
}

fn is_multi_node(cap: &VolumeCapability) -> bool {
    cap.access_mode.as_ref().is_some_and(|m| {
        matches!(
            Mode::try_from(m.mode),
            Ok(Mode::MultiNodeReaderOnly
                | Mode::MultiNodeSingleWriter
                | Mode::MultiNodeMultiWriter)
        )
    })
}

fn check_capabilities(
    caps: &[VolumeCapability],
    class: Option<&DeviceClassConfig>,
) -> Result<(), RpcError> {
    if caps.is_empty() {
        return Err(RpcError::invalid("volume_capabilities is required"));
    }
    caps.iter()
        .try_for_each(|c| check_capability_for(c, class))
        .map_err(RpcError::invalid)
}

/// The size to make for `range`, rounded up to 1 MiB; its bounds checked.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, RpcError> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(RpcError::invalid(format!(
            "capacity_range is negative (required_bytes {required}, limit_bytes {limit})"
        )));
    }
    let (required, limit) = (required.unsigned_abs(), limit.unsigned_abs());
    if limit != 0 && required > limit {
        return Err(RpcError::invalid(format!(
            "capacity_range.required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    let wanted = if required == 0 {
        if limit == 0 {
            DEFAULT_VOLUME_SIZE
        } else {
            DEFAULT_VOLUME_SIZE.min(limit)
        }
    } else {
        required
    };
    let rounded = wanted.div_ceil(1 << 20).saturating_mul(1 << 20);
    if rounded > MAX_VOLUME_SIZE {
        return Err(RpcError::new(
            Code::OutOfRange,
            format!("{wanted} bytes is larger than any volume this driver makes (1 EiB)"),
        ));
    }
    if limit != 0 && rounded > limit {
        return Err(RpcError::new(
            Code::OutOfRange,
            format!(
                "capacity_range allows at most {limit} bytes, but volumes are made in whole MiB: \
                 the smallest fitting volume is {rounded} bytes"
            ),
        ));
    }
    Ok(rounded)
}

fn within(size: u64, range: Option<&CapacityRange>) -> bool {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    size >= required.unsigned_abs() && (limit == 0 || size <= limit.unsigned_abs())
}

fn as_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

fn condition(health: &LvHealth) -> VolumeCondition {
    let abnormal = *health != LvHealth::Ok;
    VolumeCondition {
        abnormal,
        message: if abnormal {
            format!("the logical volume reports {health:?}")
        } else {
            "healthy".to_owned()
        },
    }
}

fn content_source(source: Option<&Source>) -> Option<VolumeContentSource> {
    source.map(|s| VolumeContentSource {
        r#type: Some(match s {
            Source::Snapshot(id) => {
                volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                    snapshot_id: id.clone(),
                })
            }
            Source::Volume(id) => {
                volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                    volume_id: id.clone(),
                })
            }
        }),
    })
}

fn timestamp(unix_seconds: u64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: i64::try_from(unix_seconds).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

/// Pages `items` (sorted by id): `starting_token` is the id of the first entry to return.
pub fn page<T>(
    items: Vec<T>,
    id: impl Fn(&T) -> &str,
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<T>, String), RpcError> {
    if max_entries < 0 {
        return Err(RpcError::invalid(format!(
            "max_entries {max_entries} is negative"
        )));
    }
    let start = if starting_token.is_empty() {
        0
    } else {
        items
            .iter()
            .position(|i| id(i) == starting_token)
            .ok_or_else(|| {
                RpcError::new(
                    Code::Aborted,
                    format!(
                        "starting_token {starting_token:?} names no entry (it was removed): list again from the start"
                    ),
                )
            })?
    };
    let mut rest: Vec<T> = items.into_iter().skip(start).collect();
    let max = usize::try_from(max_entries).unwrap_or(usize::MAX);
    let next = if max > 0 && rest.len() > max {
        let next = id(&rest[max]).to_owned();
        rest.truncate(max);
        next
    } else {
        String::new()
    };
    Ok((rest, next))
}

/// The Controller service.
pub struct ControllerService<B> {
    backend: Arc<B>,
    in_flight: InFlight,
    capabilities: &'static [rpc::Type],
}

/// What the Controller service advertises for volumes served under csi-driver-lvm's name (ADR 0033):
/// DeleteVolume only. Expansion is the node's, as csi-driver-lvm does it, so external-resizer marks
/// the volume grown and kubelet's NodeExpandVolume grows the LV and the filesystem on its node.
pub const CSI_DRIVER_LVM_CAPABILITIES: [rpc::Type; 1] = [rpc::Type::CreateDeleteVolume];

impl<B: Backend> ControllerService<B> {
    /// The service over `backend`, advertising [`CAPABILITIES`].
    pub fn new(backend: Arc<B>) -> Self {
        Self {
            backend,
            in_flight: InFlight::default(),
            capabilities: &CAPABILITIES,
        }
    }

    /// The same service advertising only `capabilities` (the RPCs stay served).
    #[must_use]
    pub fn with_capabilities(mut self, capabilities: &'static [rpc::Type]) -> Self {
        self.capabilities = capabilities;
        self
    }

    fn class(&self, asked: Option<&str>) -> Result<DeviceClassConfig, RpcError> {
        let classes = self.backend.classes();
        // A class configured here that failed to converge answers its reason (UNAVAILABLE: it may
        // serve later), the default one too when none was asked for.
        let unserved = self.backend.unserved();
        if let Some((class, reason)) = unserved
            .iter()
            .find(|(c, _)| asked.map_or(c.default, |name| c.name == name))
        {
            return Err(backend(BackendError::class_not_ready(
                &class.name,
                self.backend.node_id(),
                reason,
            )));
        }
        let known = || {
            classes
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match asked {
            Some(name) => classes.iter().find(|c| c.name == name).cloned().ok_or_else(|| {
                RpcError::invalid(format!(
                    "device class {name:?} is not served on node {}: use one of {}",
                    self.backend.node_id(),
                    known()
                ))
            }),
            None => classes
                .iter()
                .find(|c| c.default)
                .or_else(|| (classes.len() == 1 && unserved.is_empty()).then(|| &classes[0]))
                .cloned()
                .ok_or_else(|| {
                    RpcError::invalid(format!(
                        "no device class named ({}) and no default class: set parameter {} to one of {}",
                        params::DEVICE_CLASS,
                        params::DEVICE_CLASS,
                        known()
                    ))
                }),
        }
    }

    fn topology(&self) -> Topology {
        Topology {
            segments: [(
                TOPOLOGY_NODE_KEY.to_owned(),
                self.backend.node_id().to_owned(),
            )]
            .into(),
        }
    }

    /// Where a volume of `class` is accessible from: this node, or for a shared class every node
    /// that joined it (`shared.lvms.topolvm.io/<class>: "true"`).
    fn topology_of(&self, class: &str) -> Topology {
        if self.is_shared(class) {
            Topology {
                segments: [(lvms_api::shared_topology_key(class), "true".to_owned())].into(),
            }
        } else {
            self.topology()
        }
    }

    fn is_shared(&self, class: &str) -> bool {
        self.backend
            .classes()
            .iter()
            .any(|c| c.name == class && c.shared().is_some())
    }

    /// Whether `segments` names this node (a segment without our key matches any node).
    fn is_here(&self, t: &Topology) -> bool {
        t.segments
            .get(TOPOLOGY_NODE_KEY)
            .is_none_or(|n| n == self.backend.node_id())
    }

    /// Whether a volume of `class` made here is accessible from `t`: [`Self::is_here`], or for a
    /// shared class a segment of the nodes that joined it.
    fn reaches(&self, t: &Topology, class: &str) -> bool {
        self.is_here(t)
            || (self.is_shared(class)
                && t.segments
                    .get(&lvms_api::shared_topology_key(class))
                    .is_some_and(|v| v == "true"))
    }

    fn claim(&self, keys: &[&str]) -> Result<lvms_engine::locks::Guard, RpcError> {
        self.in_flight
            .try_claim(keys)
            .map_err(|k| RpcError::busy(&k))
    }

    fn csi_volume(&self, v: &Volume) -> csi::Volume {
        csi::Volume {
            capacity_bytes: as_i64(v.size),
            volume_id: v.id.clone(),
            volume_context: [(DEVICE_CLASS_KEY.to_owned(), v.class.clone())].into(),
            content_source: content_source(v.source.as_ref()),
            accessible_topology: vec![self.topology_of(&v.class)],
        }
    }

    fn csi_snapshot(v: &Volume) -> Snapshot {
        Snapshot {
            size_bytes: as_i64(v.size),
            snapshot_id: v.id.clone(),
            source_volume_id: v
                .source
                .as_ref()
                .map(|s| s.id().to_owned())
                .unwrap_or_default(),
            creation_time: v.created.map(timestamp),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        }
    }

    async fn create_volume_inner(&self, req: CreateVolumeRequest) -> Result<csi::Volume, RpcError> {
        require("name", &req.name)?;
        // Multi-node modes depend on the class: those are checked once it is known.
        let single: Vec<VolumeCapability> = req
            .volume_capabilities
            .iter()
            .filter(|c| !is_multi_node(c))
            .cloned()
            .collect();
        if single.len() == req.volume_capabilities.len() {
            check_capabilities(&single, None)?;
        } else {
            single
                .iter()
                .try_for_each(check_capability)
                .map_err(RpcError::invalid)?;
        }
        let params = params::parse(&req.parameters).map_err(RpcError::invalid)?;
        let class = self.class(params.class.as_deref())?;
        if params.volume_mode.is_some() && class.shared().is_none() {
            return Err(RpcError::invalid(format!(
                "parameter {} applies to shared device classes only, and device class {} is not \
                 shared",
                params::VOLUME_MODE,
                class.name
            )));
        }
        let class = class.with_volume_mode(params.volume_mode);
        check_capabilities(&req.volume_capabilities, Some(&class))?;
        if let Some(req_topo) = &req.accessibility_requirements
            && !req_topo.requisite.is_empty()
            && !req_topo
                .requisite
                .iter()
                .any(|t| self.reaches(t, &class.name))
        {
            let shared = if class.shared().is_some() {
                format!(
                    ", nor the nodes of shared device class {} ({}: \"true\")",
                    class.name,
                    lvms_api::shared_topology_key(&class.name)
                )
            } else {
                String::new()
            };
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "the accessibility requirements do not include node {}, the only node this driver \
                     provisions on{shared}",
                    self.backend.node_id(),
                ),
            ));
        }
        let mut size = size_for(req.capacity_range.as_ref())?;
        // The filesystem the node will make: the request's, else the class's (see the Node service).
        fn mount(c: &VolumeCapability) -> Option<&str> {
            match &c.access_type {
                Some(volume_capability::AccessType::Mount(m)) => Some(m.fs_type.as_str()),
                _ => None,
            }
        }
        let asked_fs = params.fstype.as_deref().or_else(|| {
            req.volume_capabilities
                .iter()
                .filter_map(mount)
                .find(|fs| !fs.is_empty())
        });
        let xfs = match asked_fs {
            Some(fs) => fs == "xfs",
            None => {
                class.fstype == Some(lvms_core::config::Fstype::Xfs)
                    && req.volume_capabilities.iter().any(|c| mount(c).is_some())
            }
        };
        if xfs && size < MIN_XFS_SIZE {
            let limit = req.capacity_range.as_ref().map_or(0, |r| r.limit_bytes);
            if limit > 0 && limit.unsigned_abs() < MIN_XFS_SIZE {
                return Err(RpcError::new(
                    Code::OutOfRange,
                    format!(
                        "an xfs volume needs at least 300Mi (mkfs.xfs refuses smaller), but limit_bytes is \
                         {limit}: allow 300Mi or use ext4"
                    ),
                ));
            }
            size = MIN_XFS_SIZE;
        }
        let source = match req
            .volume_content_source
            .as_ref()
            .and_then(|s| s.r#type.as_ref())
        {
            None => None,
            Some(volume_content_source::Type::Snapshot(s)) => {
                require("volume_content_source.snapshot.snapshot_id", &s.snapshot_id)?;
                Some(Source::Snapshot(s.snapshot_id.clone()))
            }
            Some(volume_content_source::Type::Volume(v)) => {
                require("volume_content_source.volume.volume_id", &v.volume_id)?;
                Some(Source::Volume(v.volume_id.clone()))
            }
        };
        // A shared class's clone or restore is thin whatever the volume mode (it lives in its
        // source's pool): the backend checks that the source is a thin volume.
        if source.is_some() && !class.makes_thin() && class.shared().is_none() {
            return Err(RpcError::invalid(format!(
                "device class {} is thick: cloning and restoring from snapshots need a thin class (or \
                 volume mode thin on a shared class)",
                class.name
            )));
        }
        if params.lv_type.is_some() && class.thin_pool().is_some() {
            return Err(RpcError::invalid(format!(
                "parameter {} applies to thick classes only, and device class {} is thin",
                params::LV_TYPE,
                class.name
            )));
        }

        let id = ids::volume_lv_name(&req.name);
        let _guard = self.claim(&[&req.name, &id])?;
        if let Some(existing) = self.backend.get(&id).await.map_err(backend)? {
            let interrupted = source.is_some()
                && !existing.snapshot
                && existing.name.as_deref() == Some(req.name.as_str())
                && existing.class == class.name
                && existing.source == source
                && existing.requested == Some(size)
                && existing.size < size;
            if !interrupted {
                return self.compatible(&req, &class, source.as_ref(), existing);
            }
            // A crash between the thin snapshot and its extend: the backend finishes the extend.
            tracing::info!(volume_id = %id, "finishing an interrupted restore or clone");
        }
        if let Some(source) = &source {
            let found = self.backend.get(source.id()).await.map_err(backend)?;
            let kind_ok = match (source, &found) {
                (Source::Snapshot(_), Some(v)) => v.snapshot,
                (Source::Volume(_), Some(v)) => !v.snapshot,
                (_, None) => false,
            };
            let Some(src) = found.filter(|_| kind_ok) else {
                return Err(RpcError::new(
                    Code::NotFound,
                    format!("the content source {} does not exist", source.id()),
                ));
            };
            if src.class != class.name {
                return Err(RpcError::invalid(format!(
                    "the content source {} is in device class {}, not {}: a clone or restore stays in \
                     its source's class",
                    src.id, src.class, class.name
                )));
            }
            if size < src.size {
                return Err(RpcError::new(
                    Code::OutOfRange,
                    format!(
                        "the volume ({size} bytes) would be smaller than its source {} ({} bytes)",
                        src.id, src.size
                    ),
                ));
            }
        }
        let layout = params.lv_type.unwrap_or(class.layout());
        let capacity = self
            .backend
            .capacity(&class.name, &layout)
            .await
            .map_err(backend)?;
        // A thin clone shares its source's blocks but counts at its full virtual size, as LVM does.
        if size > capacity.available {
            let why = match capacity.devices {
                Some(devices) if devices < layout.devices_needed(devices) => format!(
                    ": a {} volume needs {} LVM physical volumes (disks) and the volume group has \
                     {devices}; add disks to the device class or ask for a layout that needs fewer",
                    layout.name(),
                    layout.devices_needed(devices)
                ),
                Some(_) => format!(" for a {} volume", layout.name()),
                None => String::new(),
            };
            return Err(RpcError::new(
                Code::ResourceExhausted,
                format!(
                    "device class {} on node {} has {} bytes available, {size} are needed{why}",
                    class.name,
                    self.backend.node_id(),
                    capacity.available
                ),
            ));
        }
        let made = self
            .backend
            .create_volume(&NewVolume {
                name: req.name.clone(),
                class: class.name.clone(),
                size,
                lv_type: params.lv_type,
                volume_mode: params.volume_mode,
                source: source.clone(),
                ephemeral: None,
            })
            .await
            .map_err(|e| match e {
                BackendError::NotFound(m) => RpcError::new(Code::NotFound, m),
                other => backend(other),
            })?;
        tracing::info!(volume_id = %made.id, device_class = %made.class, size = made.size, "volume created");
        Ok(self.csi_volume(&made))
    }

    fn compatible(
        &self,
        req: &CreateVolumeRequest,
        class: &DeviceClassConfig,
        source: Option<&Source>,
        existing: Volume,
    ) -> Result<csi::Volume, RpcError> {
        let mut differences = Vec::new();
        if existing.snapshot {
            differences.push("it is a snapshot".to_owned());
        }
        if existing.name.as_deref() != Some(req.name.as_str()) {
            differences.push("its LV belongs to another name".to_owned());
        }
        if existing.class != class.name {
            differences.push(format!("it is in device class {}", existing.class));
        }
        if !within(existing.size, req.capacity_range.as_ref()) {
            differences.push(format!(
                "its size is {} bytes, outside the requested range",
                existing.size
            ));
        }
        if existing.source.as_ref() != source {
            differences.push(format!(
                "its content source is {}",
                existing
                    .source
                    .as_ref()
                    .map_or("none".to_owned(), |s| s.id().to_owned())
            ));
        }
        if differences.is_empty() {
            Ok(self.csi_volume(&existing))
        } else {
            Err(RpcError::new(
                Code::AlreadyExists,
                format!(
                    "volume {:?} exists ({}) with other properties: {}",
                    req.name,
                    existing.id,
                    differences.join("; ")
                ),
            ))
        }
    }

    /// The volume (not a snapshot) with this id, or NOT_FOUND naming it as `what`.
    async fn existing_volume(&self, id: &str, what: &str) -> Result<Volume, RpcError> {
        let found = if ids::is_volume_id(id) || ids::is_taken_over_id(id) {
            self.backend
                .get(id)
                .await
                .map_err(backend)?
                .filter(|v| !v.snapshot)
        } else {
            None
        };
        found.ok_or_else(|| RpcError::new(Code::NotFound, format!("{what} {id} does not exist")))
    }

    /// The snapshots with id `snapshot_id` and of `source_volume_id` (an empty filter matches any), in
    /// the backend's order (by id): what `ListSnapshots` pages and `GetSnapshot` answers from.
    async fn snapshots(
        &self,
        snapshot_id: &str,
        source_volume_id: &str,
    ) -> Result<Vec<Volume>, RpcError> {
        Ok(self
            .backend
            .list()
            .await
            .map_err(backend)?
            .into_iter()
            .filter(|v| v.snapshot)
            .filter(|v| snapshot_id.is_empty() || v.id == snapshot_id)
            .filter(|v| {
                source_volume_id.is_empty()
                    || v.source.as_ref().map(Source::id) == Some(source_volume_id)
            })
            .collect())
    }

    async fn delete_inner(&self, id: &str, snapshot: bool) -> Result<(), RpcError> {
        let field = if snapshot { "snapshot_id" } else { "volume_id" };
        require(field, id)?;
        let ours = if snapshot {
            ids::is_snapshot_id(id)
        } else {
            ids::is_volume_id(id)
        };
        if !ours && !ids::is_taken_over_id(id) {
            // Not an id this driver hands out, so nothing of ours exists under it.
            return Ok(());
        }
        if !ours {
            // A taken-over id names a volume or a snapshot: only the kind asked for is removed.
            let kind = self
                .backend
                .get(id)
                .await
                .map_err(backend)?
                .map(|v| v.snapshot);
            if kind != Some(snapshot) {
                return Ok(());
            }
        }
        let _guard = self.claim(&[id])?;
        match self.backend.delete(id).await {
            Ok(removed) => {
                tracing::info!(volume_id = %id, removed, "deleted");
                Ok(())
            }
            Err(BackendError::NotFound(_)) => Ok(()),
            Err(BackendError::Host(lvms_host::Error::InUse(m))) => Err(RpcError::new(
                Code::FailedPrecondition,
                format!("{id} is in use ({m}): unpublish and unstage it first"),
            )),
            Err(e) => Err(backend(e)),
        }
    }
}

#[tonic::async_trait]
impl<B: Backend> Controller for ControllerService<B> {
    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name))]
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let volume = self.create_volume_inner(request.into_inner()).await?;
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    #[tracing::instrument(skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.delete_inner(&request.get_ref().volume_id, false)
            .await?;
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        _request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerPublishVolume: local volumes need no attach (PUBLISH_UNPUBLISH_VOLUME is not offered)",
        ))
    }

    async fn controller_unpublish_volume(
        &self,
        _request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerUnpublishVolume: local volumes need no detach (PUBLISH_UNPUBLISH_VOLUME is not offered)",
        ))
    }

    #[tracing::instrument(skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(RpcError::invalid("volume_capabilities is required").into());
        }
        self.existing_volume(&req.volume_id, "volume").await?;
        if let Err(e) = params::parse(&req.parameters) {
            return Ok(Response::new(ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: e,
            }));
        }
        let problems: Vec<String> = req
            .volume_capabilities
            .iter()
            .filter_map(|c| check_capability(c).err())
            .collect();
        Ok(Response::new(if problems.is_empty() {
            ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: HashMap::new(),
                }),
                message: String::new(),
            }
        } else {
            ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: problems.join("; "),
            }
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        let req = request.into_inner();
        let volumes: Vec<Volume> = self
            .backend
            .list()
            .await
            .map_err(backend)?
            .into_iter()
            // Inline ephemeral volumes belong to their pod's node, not to the CO's volumes.
            .filter(|v| !v.snapshot && v.ephemeral.is_none())
            .collect();
        let (page, next_token) = page(
            volumes,
            |v| v.id.as_str(),
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(Response::new(ListVolumesResponse {
            entries: page
                .iter()
                .map(|v| list_volumes_response::Entry {
                    volume: Some(self.csi_volume(v)),
                    status: Some(list_volumes_response::VolumeStatus {
                        published_node_ids: Vec::new(),
                        volume_condition: Some(condition(&v.health)),
                    }),
                })
                .collect(),
            next_token,
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        let req = request.into_inner();
        req.volume_capabilities
            .iter()
            .try_for_each(check_capability)
            .map_err(RpcError::invalid)?;
        let params = params::parse(&req.parameters).map_err(RpcError::invalid)?;
        let class = self.class(params.class.as_deref())?;
        if params.lv_type.is_some() && class.thin_pool().is_some() {
            return Err(RpcError::invalid(format!(
                "the layout parameters apply to thick classes only, and device class {} is thin",
                class.name
            ))
            .into());
        }
        let layout = params.lv_type.unwrap_or(class.layout());
        let class = class.name;
        // A shared class's capacity is the volume group's, for every node that joined it.
        let elsewhere = req
            .accessible_topology
            .as_ref()
            .is_some_and(|t| !self.reaches(t, &class));
        if elsewhere {
            return Ok(Response::new(GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            }));
        }
        let c = self
            .backend
            .capacity(&class, &layout)
            .await
            .map_err(backend)?;
        Ok(Response::new(GetCapacityResponse {
            available_capacity: as_i64(c.available),
            maximum_volume_size: Some(as_i64(c.maximum_volume_size)),
            minimum_volume_size: Some(as_i64(c.minimum_volume_size)),
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: self
                .capabilities
                .iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(name = %request.get_ref().name, volume_id = %request.get_ref().source_volume_id))]
    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        let req = request.into_inner();
        require("name", &req.name)?;
        require("source_volume_id", &req.source_volume_id)?;
        let id = ids::snapshot_lv_name(&req.name);
        let _guard = self.claim(&[&req.name, &id, &req.source_volume_id])?;
        if let Some(existing) = self.backend.get(&id).await.map_err(backend)? {
            let same_source =
                existing.source.as_ref().map(Source::id) == Some(req.source_volume_id.as_str());
            if existing.snapshot
                && existing.name.as_deref() == Some(req.name.as_str())
                && same_source
            {
                return Ok(Response::new(CreateSnapshotResponse {
                    snapshot: Some(Self::csi_snapshot(&existing)),
                }));
            }
            return Err(RpcError::new(
                Code::AlreadyExists,
                format!(
                    "snapshot {:?} exists ({id}) of another source volume ({})",
                    req.name,
                    existing.source.as_ref().map_or("none", Source::id)
                ),
            )
            .into());
        }
        let source = self
            .existing_volume(&req.source_volume_id, "source volume")
            .await?;
        let class = self.class(Some(&source.class))?;
        // A shared class's volume may be thin (its own pool): the backend looks at the volume.
        if class.thin_pool().is_none() && class.shared().is_none() {
            return Err(RpcError::invalid(format!(
                "volume {} is in thick device class {}: snapshots need a thin class",
                source.id, class.name
            ))
            .into());
        }
        let made = self
            .backend
            .create_snapshot(&NewSnapshot {
                name: req.name.clone(),
                source_volume: source.id.clone(),
            })
            .await
            .map_err(backend)?;
        tracing::info!(snapshot_id = %made.id, "snapshot created");
        Ok(Response::new(CreateSnapshotResponse {
            snapshot: Some(Self::csi_snapshot(&made)),
        }))
    }

    #[tracing::instrument(skip_all, fields(snapshot_id = %request.get_ref().snapshot_id))]
    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        self.delete_inner(&request.get_ref().snapshot_id, true)
            .await?;
        Ok(Response::new(DeleteSnapshotResponse {}))
    }

    #[tracing::instrument(skip_all)]
    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        let req = request.into_inner();
        let snapshots = self
            .snapshots(&req.snapshot_id, &req.source_volume_id)
            .await?;
        let (page, next_token) = page(
            snapshots,
            |v| v.id.as_str(),
            req.max_entries,
            &req.starting_token,
        )?;
        Ok(Response::new(ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|v| list_snapshots_response::Entry {
                    snapshot: Some(Self::csi_snapshot(v)),
                })
                .collect(),
            next_token,
        }))
    }

    #[tracing::instrument(skip_all, fields(snapshot_id = %request.get_ref().snapshot_id))]
    async fn get_snapshot(
        &self,
        request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        let req = request.into_inner();
        require("snapshot_id", &req.snapshot_id)?;
        let snapshot = self
            .snapshots(&req.snapshot_id, "")
            .await?
            .first()
            .map(Self::csi_snapshot)
            .ok_or_else(|| {
                RpcError::new(
                    Code::NotFound,
                    format!("snapshot {} does not exist", req.snapshot_id),
                )
            })?;
        Ok(Response::new(GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    #[tracing::instrument(skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        let Some(range) = req.capacity_range.as_ref() else {
            return Err(RpcError::invalid("capacity_range is required").into());
        };
        if range.required_bytes <= 0 && range.limit_bytes <= 0 {
            return Err(RpcError::invalid(
                "capacity_range names no size: set required_bytes to the new size",
            )
            .into());
        }
        if let Some(cap) = &req.volume_capability {
            check_capability(cap).map_err(RpcError::invalid)?;
        }
        let size = size_for(Some(range))?;
        let _guard = self.claim(&[&req.volume_id])?;
        let volume = self.existing_volume(&req.volume_id, "volume").await?;
        let block = matches!(
            req.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(volume_capability::AccessType::Block(_))
        );
        let new_size = if volume.size >= size {
            volume.size
        } else {
            // The raw free space: LVM refuses a RAID volume's growth that its copies do not fit.
            let c = self
                .backend
                .capacity(&volume.class, &Layout::Linear)
                .await
                .map_err(backend)?;
            let delta = size - volume.size;
            if delta > c.available {
                return Err(RpcError::new(
                    Code::ResourceExhausted,
                    format!(
                        "device class {} has {} bytes available, growing {} by {delta} needs more",
                        volume.class, c.available, volume.id
                    ),
                )
                .into());
            }
            self.backend
                .expand(&volume.id, size)
                .await
                .map_err(backend)?
        };
        Ok(Response::new(ControllerExpandVolumeResponse {
            capacity_bytes: as_i64(new_size),
            node_expansion_required: !block,
        }))
    }

    #[tracing::instrument(skip_all, fields(volume_id = %request.get_ref().volume_id))]
    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        let req = request.into_inner();
        require("volume_id", &req.volume_id)?;
        let v = self.existing_volume(&req.volume_id, "volume").await?;
        Ok(Response::new(ControllerGetVolumeResponse {
            volume: Some(self.csi_volume(&v)),
            status: Some(controller_get_volume_response::VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: Some(condition(&v.health)),
            }),
        }))
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerModifyVolume: MODIFY_VOLUME is not offered",
        ))
    }
}
