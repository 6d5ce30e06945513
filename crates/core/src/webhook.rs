//! The `LVMCluster` admission rules as pure functions: [`validate_create`], [`validate_update`] and
//! [`mutate_on_create`]. The operator's HTTPS handler decodes the AdmissionReview, gathers the
//! [`Context`] (its namespace, the other LVMClusters) and turns the [`Review`] into the response.
//!
//! Every error names the exact field (`spec.storage.deviceClasses[1].thinPoolConfig.chunkSize`, map
//! entries as `additionalLabels[key]`, as apimachinery's `field.Path` writes them) and says what is
//! wrong and how to fix it. All rules run, so one answer lists every problem.
//!
//! Rules (numbers as in the issue):
//! - create: 1 namespace, 2 a single LVMCluster, 3 one default class, 4 `sizePercent` above 90 warns,
//!   5–11 RAID (5: with `thinPoolConfig`, of the thin pool), 12–15 device paths, 16 fstype (enforced by the type, see below), 17 `chunkSize`,
//!   18 `metadataSize`, 19 Dynamic discovery without paths warns, 20–21 StorageClass options;
//! - update: rules 3–21 on the new object, then 22–30 comparing each class with the old class of
//!   the same name;
//! - shared device classes (`deviceAccessPolicy: shared`), on create and update: 31 `paths`
//!   required, 32 only stable paths (`/dev/disk/by-id/…`, `/dev/mapper/…`), 33 no
//!   `optionalPaths`, 34 no `raidConfig`, 35 no `thinPoolConfig`, 36 no `Dynamic` discovery, 37 a
//!   name of at most 63 characters, 38 no `forceWipeDevicesAndDestroyAllData` once the shared
//!   volume group exists; for every class, 39 `sharedConfig` only on a shared class and 40 a
//!   shared class's path in no other class, whatever the node selectors;
//! - shared device classes, on update: 41 `deviceAccessPolicy` cannot change between shared and
//!   node-local, 42 `sharedConfig.ioTimeoutSeconds` and 43 `sharedConfig.volumeMode` cannot change
//!   (effective values: unset means 10 and `Linear`);
//! - device patterns (`deviceSelector.devicePatterns`, ADR 0019), on create and update: 44 every
//!   pattern absolute under `/dev/` and valid glob syntax, 45 none on a shared class, 46 no
//!   `forceWipeDevicesAndDestroyAllData` on a class that lists no paths (matched devices are never
//!   wiped), 47 no pattern twice in a class or in two classes with the same node selector;
//! - csi-driver-lvm's StorageClass names (`csiDriverLVMStorageClasses`, ADR 0022), on create and
//!   update: 48 at most one class sets it (the names would collide), 49 only on a thick,
//!   node-local class without `raidConfig`, 50 a warning when the class's selector names fewer
//!   than 2 devices (striped and mirror volumes need 2);
//! - adopting another driver's volume group (`adopt`, ADR 0023), on create and update: 51 only on
//!   a node-local class.
//!
//! Decisions (also in the module's tests):
//! - Rule 16: `fstype` is [`lvms_api::DeviceFilesystemType`], so any value but `xfs`/`ext4` fails to
//!   deserialise (and the CRD's enum rejects it first); there is nothing left to check here.
//! - Rules 1 and 2 apply on create only, as in LVMS: an object's namespace cannot change, and
//!   checking for other LVMClusters on update would block finalizer removal on a duplicate that
//!   was created while the webhook was down, leaving it undeletable.
//! - An update that leaves `spec` unchanged (finalizers, labels, annotations) is always allowed,
//!   like the API server's validation ratcheting: stricter rules in a newer version never block
//!   the operator's metadata patches or the deletion of an object accepted earlier.
//! - Rule 18: `metadataSize` with the `Host` policy is rejected, except when it is exactly the
//!   documented default `1Gi`, which only warns that it is ignored: LVMS's own "all fields"
//!   example spells out `metadataSize: 1Gi` with `metadataSizeCalculationPolicy: Host`, and its
//!   manifests must be accepted unchanged.
//! - Rule 17: besides the 64Ki–1Gi bounds, `chunkSize` must be a multiple of 64Ki, as lvm2 requires
//!   of thin pool chunks (LVMS accepts other values and lvcreate then fails on the node).
//! - Rule 10: raid10's minimum is `stripes × (mirrors + 1)` with stripes defaulting to 2, which is
//!   the issue's `2(m+1)` unless `stripes` is set.
//! - Rule 15: classes share a node selector when their `nodeSelector`s are equal (both absent
//!   counts as equal), as LVMS compares them. Different selectors that happen to pick the same
//!   nodes cannot be seen here. Paths are compared as written; symlinks are not resolved.
//! - Rule 20 and 21 reject reserved keys (LVMS only warns that it ignores them); rule 22 is checked
//!   as "the effective `reclaimPolicy`, `volumeBindingMode`, `additionalParameters` and `fstype`
//!   cannot change", of which "options added later must equal today's defaults" is the case where
//!   the old class had no options. The CRD's CEL rules overlap; the webhook gives the same answer.
//! - Rule 28 compares the effective flag: absent and `false` are the same. On a shared class the
//!   flag may be turned off (never on): rule 38 asks for exactly that once the volume group exists,
//!   and a flag left on would have every node that joins later wipe the LUN it shares.
//! - Rules 31–43 (ADR 0015): `local` and unset mean `nodeLocal`. `fstype` is allowed on shared
//!   classes (filesystem volumes are single-node; multi-node access is block only). Rules 12, 13
//!   and 19 leave shared classes to rules 31 and 36, so each problem is named once; the mutating
//!   webhook does not add `deviceDiscoveryPolicy` to them. Rule 32 judges only paths rule 14
//!   accepts.
//! - Rule 38: the webhook cannot see LVM; [`Context::existing_shared_volume_groups`] holds the
//!   classes whose shared volume group a node has reported ([`existing_shared_volume_groups`]).
//!   The rule applies to every update that keeps the flag on, not only to the one that adds it,
//!   since the flag stays dangerous as long as it is set.
//! - Rule 40: a shared LUN is visible on every node, so it conflicts with any class naming the
//!   same path, whatever its `nodeSelector` (rule 15 compares classes with equal selectors only;
//!   this rule reports the rest). Paths are compared as written, as in rule 15.
//! - Rules 44–47: patterns count as naming devices for rules 12, 13, 29 and 30, so a class may
//!   select its devices by pattern only; rule 19 does not warn about `Dynamic` on such a class,
//!   which adds only devices its patterns match. Rule 47 compares patterns as written: two
//!   different patterns that match the same device are not seen here (the node reports the device
//!   as a member of the other class's volume group).
//! - Rules 48–50: the three StorageClasses are cluster-wide names, so rule 48 counts classes
//!   whatever their node selectors. Rule 49 refuses thin classes (thin volumes are linear only),
//!   RAID classes (whose `raidConfig` already fixes every volume's layout) and shared classes
//!   (linear or thin volumes on a LUN). Rule 50 warns only when the count is certain: a class
//!   that discovers its devices or has a pattern with a wildcard may well find 2 or more.

use std::collections::BTreeSet;

use lvms_api::{
    ChunkSizeCalculationPolicy, DEFAULT_METADATA_SIZE, DeviceClass, DeviceDiscoveryPolicy,
    LVMCluster, LVMClusterSpec, LVMVolumeGroupNodeStatus, LockspaceState, MAX_CHUNK_SIZE,
    MAX_METADATA_SIZE, MIN_CHUNK_SIZE, MIN_METADATA_SIZE, MetadataSizePolicy,
    RESERVED_STORAGE_CLASS_PARAMETERS, RaidConfig, RaidType, StorageClassOptions, ThinPoolConfig,
    VGStatusType, is_reserved_storage_class_label, storage_class_name,
};
use serde_json::{Value, json};

use self::{shared::*, update::*};
use crate::size::{ByteSize, KIB};

pub use self::names::{is_dns1123_subdomain, label_value_problem, qualified_name_problem};

/// `sizePercent` above this leaves too little free space to grow the thin pool's metadata.
pub const MAX_RECOMMENDED_SIZE_PERCENT: i32 = 90;

/// lvm2 thin pool chunk sizes are multiples of this.
const CHUNK_SIZE_GRANULARITY: u64 = 64 * KIB;

/// Where a shared class's devices may be named: directories whose names are the same on every
/// node that sees the LUN.
pub const STABLE_DEVICE_DIRS: [&str; 2] = ["/dev/disk/by-id/", "/dev/mapper/"];

/// Longest name of a shared class: it becomes the name part of a label key (its topology key,
/// [`lvms_api::shared_topology_key`]).
pub const MAX_SHARED_CLASS_NAME: usize = 63;

/// One rejected field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.storage.deviceClasses[1].thinPoolConfig.chunkSize`.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// The answer to one admission request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Review {
    /// Why the request is denied; empty when it is allowed.
    pub errors: Vec<FieldError>,
    /// Shown to the user (kubectl prints them) whether or not the request is allowed.
    pub warnings: Vec<String>,
}

impl Review {
    /// Whether the request is allowed (no errors; warnings do not deny).
    pub fn allowed(&self) -> bool {
        self.errors.is_empty()
    }

    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError {
            field: field.into(),
            message: message.into(),
        });
    }

    fn warn(&mut self, warning: impl Into<String>) {
        self.warnings.push(warning.into());
    }
}

/// What the rules need to know beyond the object itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Context {
    /// The namespace the operator runs in; LVMClusters must live there.
    pub operator_namespace: String,
    /// `namespace/name` of the LVMClusters that already exist, excluding the one under review.
    pub other_clusters: Vec<String>,
    /// Device classes whose shared volume group some node has reported (rule 38); see
    /// [`existing_shared_volume_groups`].
    pub existing_shared_volume_groups: BTreeSet<String>,
}

/// The device classes whose volume group some node reports as existing, from the
/// `LVMVolumeGroupNodeStatus` objects: an entry with a `shared` sub-status whose lockspace is
/// `Joined`, or with status `Ready` or `Degraded`. (Rule 38 looks only at shared classes in it.)
pub fn existing_shared_volume_groups(statuses: &[LVMVolumeGroupNodeStatus]) -> BTreeSet<String> {
    statuses
        .iter()
        .flat_map(|s| &s.spec.lvm_vg_status)
        .filter(|vg| {
            vg.shared
                .as_ref()
                .is_some_and(|s| s.lockspace == LockspaceState::Joined)
                || matches!(
                    vg.status,
                    Some(VGStatusType::Ready | VGStatusType::Degraded)
                )
        })
        .filter(|vg| !vg.name.is_empty())
        .map(|vg| vg.name.clone())
        .collect()
}

/// Whether rule 38 needs [`Context::existing_shared_volume_groups`] for `cluster`: some shared
/// class asks for its devices to be wiped. The caller may skip listing node statuses otherwise.
pub fn needs_existing_shared_volume_groups(cluster: &LVMCluster) -> bool {
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .any(|c| c.is_shared() && force_wipe(c))
}

/// Rules 1–21 and 31–40 for a new `LVMCluster`.
pub fn validate_create(new: &LVMCluster, ctx: &Context) -> Review {
    let mut review = Review::default();
    check_namespace(new, ctx, &mut review);
    check_single_cluster(ctx, &mut review);
    check_spec(&new.spec, ctx, &mut review);
    review
}

/// Rules 3–21 and 31–40 on `new`, then rules 22–30 and 41–43 comparing it with `old`. An update
/// that leaves the spec unchanged is always allowed (see the module documentation).
pub fn validate_update(old: &LVMCluster, new: &LVMCluster, ctx: &Context) -> Review {
    let mut review = Review::default();
    if old.spec == new.spec {
        return review;
    }
    check_spec(&new.spec, ctx, &mut review);
    check_update(&old.spec, &new.spec, &mut review);
    review
}

/// JSONPatch operations for a new `LVMCluster`: a device class with neither a discovery policy nor
/// explicit paths gets `deviceDiscoveryPolicy: Static`, so devices attached later are not claimed.
pub fn mutate_on_create(cluster: &LVMCluster) -> Vec<Value> {
    cluster
        .spec
        .storage
        .device_classes
        .iter()
        .enumerate()
        .filter(|(_, class)| {
            class.device_discovery_policy.is_none() && !has_paths(class) && !class.is_shared()
        })
        .map(|(i, _)| {
            json!({
                "op": "add",
                "path": format!("/spec/storage/deviceClasses/{i}/deviceDiscoveryPolicy"),
                "value": DeviceDiscoveryPolicy::Static.as_str(),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Create rules
// ---------------------------------------------------------------------------------------------

fn class_path(i: usize) -> String {
    format!("spec.storage.deviceClasses[{i}]")
}

fn has_paths(class: &DeviceClass) -> bool {
    class.all_paths().next().is_some()
}

fn has_patterns(class: &DeviceClass) -> bool {
    class
        .device_selector
        .as_ref()
        .is_some_and(|s| !s.device_patterns.is_empty())
}

/// Whether the class names its devices, by path or by pattern (else it discovers them).
fn names_devices(class: &DeviceClass) -> bool {
    has_paths(class) || has_patterns(class)
}

/// The effective `forceWipeDevicesAndDestroyAllData`: absent is `false`.
fn force_wipe(class: &DeviceClass) -> bool {
    class
        .device_selector
        .as_ref()
        .and_then(|s| s.force_wipe_devices_and_destroy_all_data)
        .unwrap_or(false)
}

/// Rule 1.
fn check_namespace(cluster: &LVMCluster, ctx: &Context, review: &mut Review) {
    let namespace = cluster.metadata.namespace.as_deref().unwrap_or_default();
    if namespace != ctx.operator_namespace {
        review.error(
            "metadata.namespace",
            format!(
                "the LVMCluster is in namespace {namespace:?}, but LVMClusters are only supported in the \
                 operator's namespace {:?}: create it there (metadata.namespace: {})",
                ctx.operator_namespace, ctx.operator_namespace
            ),
        );
    }
}

/// Rule 2.
fn check_single_cluster(ctx: &Context, review: &mut Review) {
    if !ctx.other_clusters.is_empty() {
        review.error(
            "metadata.name",
            format!(
                "only one LVMCluster may exist and {} already does: add the device classes to the \
                 existing LVMCluster instead, or delete it first",
                ctx.other_clusters.join(", ")
            ),
        );
    }
}

/// Rules 3–21 (16 is enforced by the type), 31–40 and 44–51.
fn check_spec(spec: &LVMClusterSpec, ctx: &Context, review: &mut Review) {
    let classes = &spec.storage.device_classes;
    check_defaults(classes, review);
    check_paths_are_given(classes, review);
    for (i, class) in classes.iter().enumerate() {
        let at = class_path(i);
        if class.is_shared() {
            check_shared(class, &at, ctx, review);
            // Rule 51.
            if let Some(adopt) = class.adopt {
                review.error(
                    format!("{at}.adopt"),
                    format!(
                        "adopt: {adopt} takes over the volume group another driver made on one \
                         node's own disks, and device class {:?} is shared: set adopt on a \
                         node-local class (deviceAccessPolicy unset or nodeLocal), or remove it",
                        class.name
                    ),
                );
            }
        } else if class.shared_config.is_some() {
            // Rule 39.
            review.error(
                format!("{at}.sharedConfig"),
                format!(
                    "sharedConfig applies only to shared device classes, and device class {:?} is \
                     node-local: set deviceAccessPolicy: shared or remove sharedConfig",
                    class.name
                ),
            );
        }
        if let Some(pool) = &class.thin_pool_config {
            check_thin_pool(class, pool, &at, review);
        }
        if let Some(raid) = &class.raid_config {
            check_raid(class, raid, &at, review);
        }
        check_path_syntax(class, &at, review);
        check_patterns(class, &at, review);
        check_discovery_policy(class, review);
        if let Some(options) = &class.storage_class_options {
            check_storage_class_options(options, &at, review);
        }
    }
    check_duplicate_paths(classes, review);
    check_duplicate_patterns(classes, review);
    check_csi_driver_lvm_storage_classes(classes, review);
    check_shared_paths_elsewhere(classes, review);
}

/// Rule 3.
fn check_defaults(classes: &[DeviceClass], review: &mut Review) {
    let mut first: Option<&str> = None;
    for (i, class) in classes.iter().enumerate().filter(|(_, c)| c.default) {
        match first {
            None => first = Some(&class.name),
            Some(first) => review.error(
                format!("{}.default", class_path(i)),
                format!(
                    "device class {:?} is marked default, but {first:?} already is and only one device \
                     class may be the default: set default: false on all but one of them",
                    class.name
                ),
            ),
        }
    }
    if first.is_none() && !classes.is_empty() {
        review.warn(
            "no device class is marked default: PVCs must name an lvms-<device class> StorageClass \
             explicitly unless another StorageClass is the cluster default; set default: true on one \
             device class to make its StorageClass the default",
        );
    }
}

/// Rules 12 and 13 (shared classes are rule 31's).
fn check_paths_are_given(classes: &[DeviceClass], review: &mut Review) {
    for (i, class) in classes.iter().enumerate() {
        if class.is_shared() {
            continue;
        }
        let at = class_path(i);
        match &class.device_selector {
            Some(selector)
                if selector.paths.is_empty()
                    && selector.optional_paths.is_empty()
                    && selector.device_patterns.is_empty() =>
            {
                review.error(
                    format!("{at}.deviceSelector"),
                    format!(
                        "the deviceSelector of device class {:?} names no devices: list them under \
                         deviceSelector.paths or deviceSelector.optionalPaths, match them with \
                         deviceSelector.devicePatterns, or remove deviceSelector to let the operator \
                         discover unused devices",
                        class.name
                    ),
                );
            }
            Some(_) => {}
            None if classes.len() > 1 => review.error(
                format!("{at}.deviceSelector"),
                format!(
                    "with more than one device class every class must name its devices, or the classes \
                     would compete for the same discovered disks: add deviceSelector.paths (or \
                     optionalPaths, or devicePatterns) to device class {:?}",
                    class.name
                ),
            ),
            None => review.warn(format!(
                "device class {:?} names no devices: every unused supported device on the selected nodes \
                 is used (discovery policy {}); this is not recommended for production, list the devices \
                 under deviceSelector.paths instead",
                class.name,
                class
                    .device_discovery_policy
                    .unwrap_or(DeviceDiscoveryPolicy::Static)
            )),
        }
    }
}

/// Parses a quantity, reporting an unparsable one at `field`.
fn parse_size(quantity: &str, field: &str, review: &mut Review) -> Option<u64> {
    match quantity.parse::<ByteSize>() {
        Ok(size) => Some(size.0),
        Err(e) => {
            review.error(field, e.to_string());
            None
        }
    }
}

fn size_of(literal: &str) -> u64 {
    literal.parse::<ByteSize>().map(|s| s.0).unwrap_or_default()
}

/// Rules 4, 17 and 18.
fn check_thin_pool(class: &DeviceClass, pool: &ThinPoolConfig, at: &str, review: &mut Review) {
    let at = format!("{at}.thinPoolConfig");
    let percent = pool.size_percent_or_default();
    if percent > MAX_RECOMMENDED_SIZE_PERCENT {
        review.warn(format!(
            "thinPoolConfig.sizePercent of device class {:?} is {percent}%, above \
             {MAX_RECOMMENDED_SIZE_PERCENT}%: the thin pool's metadata can only grow into free space of \
             the volume group, so once it fills up it cannot be extended; keep sizePercent at \
             {MAX_RECOMMENDED_SIZE_PERCENT} or less unless you are sure the metadata never needs to grow",
            class.name
        ));
    }

    if let Some(chunk) = &pool.chunk_size {
        let field = format!("{at}.chunkSize");
        if pool.chunk_size_policy_or_default() == ChunkSizeCalculationPolicy::Host {
            review.error(
                field,
                "chunkSize is only used with chunkSizeCalculationPolicy Static, but the policy is Host \
                 (lvm2 chooses the chunk size): remove chunkSize, or set chunkSizeCalculationPolicy: Static",
            );
        } else if let Some(bytes) = parse_size(&chunk.0, &field, review) {
            if bytes < size_of(MIN_CHUNK_SIZE) || bytes > size_of(MAX_CHUNK_SIZE) {
                review.error(
                    field,
                    format!(
                        "chunkSize {} is outside the range lvm2 accepts: use a size between \
                         {MIN_CHUNK_SIZE} and {MAX_CHUNK_SIZE}, such as 128Ki",
                        chunk.0
                    ),
                );
            } else if !bytes.is_multiple_of(CHUNK_SIZE_GRANULARITY) {
                review.error(
                    field,
                    format!(
                        "chunkSize {} is not a multiple of 64Ki, which lvm2 requires of thin pool chunks: \
                         use a multiple of 64Ki such as 64Ki, 128Ki or 256Ki",
                        chunk.0
                    ),
                );
            }
        }
    }

    let field = format!("{at}.metadataSize");
    match (pool.metadata_size_policy_or_default(), &pool.metadata_size) {
        (MetadataSizePolicy::Host, Some(size)) => {
            let ignored = size.0.parse::<ByteSize>().ok().map(|s| s.0);
            if ignored == Some(size_of(DEFAULT_METADATA_SIZE)) {
                review.warn(format!(
                    "thinPoolConfig.metadataSize of device class {:?} is ignored because \
                     metadataSizeCalculationPolicy is Host (lvm2 sizes the metadata): remove metadataSize, \
                     or set metadataSizeCalculationPolicy: Static to use it",
                    class.name
                ));
            } else {
                review.error(
                    field,
                    "metadataSize is only used with metadataSizeCalculationPolicy Static, but the policy is \
                     Host (lvm2 sizes the metadata): remove metadataSize, or set \
                     metadataSizeCalculationPolicy: Static",
                );
            }
        }
        (MetadataSizePolicy::Static, None) => review.warn(format!(
            "thinPoolConfig.metadataSize of device class {:?} is unset with metadataSizeCalculationPolicy \
             Static: {DEFAULT_METADATA_SIZE} is used; set metadataSize to choose another size",
            class.name
        )),
        (MetadataSizePolicy::Static, Some(size)) => {
            if let Some(bytes) = parse_size(&size.0, &field, review)
                && (bytes < size_of(MIN_METADATA_SIZE) || bytes > size_of(MAX_METADATA_SIZE))
            {
                review.error(
                    field,
                    format!(
                        "metadataSize {} is outside the range lvm2 accepts: use a size between \
                         {MIN_METADATA_SIZE} and {MAX_METADATA_SIZE}, such as {DEFAULT_METADATA_SIZE}",
                        size.0
                    ),
                );
            }
        }
        (MetadataSizePolicy::Host, None) => {}
    }
}

/// The effective mirror count of a RAID level that mirrors, or `None`.
fn mirrors(raid: &RaidConfig) -> Option<i64> {
    match raid.raid_type {
        RaidType::Raid1 | RaidType::Raid10 => Some(i64::from(raid.mirrors.unwrap_or(1).max(1))),
        RaidType::Raid4 | RaidType::Raid5 | RaidType::Raid6 => None,
    }
}

/// The effective stripe count of a RAID level that stripes, or `None`.
fn stripes(raid: &RaidConfig) -> Option<i64> {
    let default = match raid.raid_type {
        RaidType::Raid1 => return None,
        RaidType::Raid4 | RaidType::Raid5 | RaidType::Raid10 => 2,
        RaidType::Raid6 => 3,
    };
    Some(i64::from(raid.stripes.unwrap_or(default).max(2)))
}

/// The fewest devices a RAID layout needs (rule 10).
pub fn raid_min_devices(raid: &RaidConfig) -> i64 {
    let m = mirrors(raid).unwrap_or(1);
    let s = stripes(raid).unwrap_or(2);
    match raid.raid_type {
        RaidType::Raid1 => m.saturating_add(1),
        RaidType::Raid4 | RaidType::Raid5 => s.saturating_add(1),
        RaidType::Raid6 => s.saturating_add(2),
        RaidType::Raid10 => s.saturating_mul(m.saturating_add(1)),
    }
}

/// Rules 5–11: the RAID layout of a thick class's volumes, or of a thin class's pool (rule 5).
fn check_raid(class: &DeviceClass, raid: &RaidConfig, at: &str, review: &mut Review) {
    let kind = raid.raid_type;
    let raid_at = format!("{at}.raidConfig");
    // Rule 5 (ADR 0031): with a thinPoolConfig, raidConfig is the layout of the thin pool's data
    // (and its metadata is raid1), so every rule here and every thin pool rule applies to the pair.

    match (raid.mirrors, mirrors(raid)) {
        (Some(_), None) => review.error(
            format!("{raid_at}.mirrors"),
            format!(
                "mirrors applies only to raid1 and raid10, not {kind} (whose redundancy is parity): remove \
                 mirrors, or choose raid1 or raid10"
            ),
        ),
        (Some(m), Some(_)) if m < 1 => review.error(
            format!("{raid_at}.mirrors"),
            format!("mirrors is {m}: set it to 1 or more (the number of extra copies)"),
        ),
        _ => {}
    }

    if kind == RaidType::Raid1 {
        if raid.stripes.is_some() {
            review.error(
                format!("{raid_at}.stripes"),
                "raid1 does not stripe: remove stripes, or choose raid10 to stripe across mirrors",
            );
        }
        if raid.stripe_size.is_some() {
            review.error(
                format!("{raid_at}.stripeSize"),
                "raid1 does not stripe: remove stripeSize, or choose raid10 to stripe across mirrors",
            );
        }
    } else {
        if let Some(s) = raid.stripes.filter(|s| *s < 2) {
            review.error(
                format!("{raid_at}.stripes"),
                format!("stripes is {s}: set it to 2 or more"),
            );
        }
        if let Some(size) = &raid.stripe_size {
            let field = format!("{raid_at}.stripeSize");
            if let Some(bytes) = parse_size(&size.0, &field, review)
                && !bytes.is_power_of_two()
            {
                review.error(
                    field,
                    format!(
                        "stripeSize {} is not a power of two: use a power of two such as 64Ki, 128Ki or \
                         512Ki",
                        size.0
                    ),
                );
            }
        }
    }

    let selector_at = format!("{at}.deviceSelector");
    let devices = class.all_paths().count();
    if devices == 0 {
        review.error(
            &selector_at,
            format!(
                "{kind} needs known devices, since LVM places each RAID image on a different physical \
                 volume: list the devices of device class {:?} under deviceSelector.paths or \
                 deviceSelector.optionalPaths",
                class.name
            ),
        );
        return;
    }
    let min = raid_min_devices(raid);
    let count = i64::try_from(devices).unwrap_or(i64::MAX);
    if count < min {
        review.error(
            &selector_at,
            format!(
                "{kind}{} needs at least {min} devices, but deviceSelector lists {count} (paths and \
                 optionalPaths together): add {} device(s), or lower {}",
                layout(raid),
                min - count,
                match kind {
                    RaidType::Raid1 => "mirrors",
                    RaidType::Raid10 => "mirrors or stripes",
                    _ => "stripes",
                }
            ),
        );
    }
    if kind == RaidType::Raid10
        && class
            .device_selector
            .as_ref()
            .is_some_and(|s| s.optional_paths.is_empty())
    {
        let copies = mirrors(raid).unwrap_or(1).saturating_add(1);
        if count % copies != 0 {
            review.error(
                format!("{selector_at}.paths"),
                format!(
                    "raid10 keeps {copies} copies of the data, so its device count must be a multiple of \
                     {copies}, but paths lists {count}: add or remove paths to reach a multiple of {copies}, \
                     or list spare devices under optionalPaths"
                ),
            );
        }
    }
}

/// ` with mirrors 2, stripes 3` for the settings that shape the layout.
fn layout(raid: &RaidConfig) -> String {
    let mut parts = Vec::new();
    if let Some(m) = mirrors(raid) {
        parts.push(format!("mirrors {m}"));
    }
    if let Some(s) = stripes(raid) {
        parts.push(format!("stripes {s}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" with {}", parts.join(", "))
    }
}

/// Every path of a class with its field path: required paths, then optional paths.
fn paths_with_fields<'a, 'b>(
    class: &'a DeviceClass,
    at: &'b str,
) -> impl Iterator<Item = (String, &'a str)> + use<'a, 'b> {
    class.device_selector.iter().flat_map(move |s| {
        let required = s
            .paths
            .iter()
            .enumerate()
            .map(move |(j, p)| (format!("{at}.deviceSelector.paths[{j}]"), p.as_str()));
        let optional = s.optional_paths.iter().enumerate().map(move |(j, p)| {
            (
                format!("{at}.deviceSelector.optionalPaths[{j}]"),
                p.as_str(),
            )
        });
        required.chain(optional)
    })
}

/// Rule 14.
fn check_path_syntax(class: &DeviceClass, at: &str, review: &mut Review) {
    for (field, path) in paths_with_fields(class, at) {
        if path.strip_prefix("/dev/").is_none_or(str::is_empty) {
            review.error(
                field,
                format!(
                    "{path:?} is not a device path: write the absolute path of the device under /dev/, \
                     such as /dev/sdb or (stable across reboots) /dev/disk/by-id/<id>"
                ),
            );
        }
    }
}

/// Rules 44–46.
fn check_patterns(class: &DeviceClass, at: &str, review: &mut Review) {
    let Some(selector) = class.device_selector.as_ref() else {
        return;
    };
    if selector.device_patterns.is_empty() {
        return;
    }
    let name = &class.name;
    // Rule 44.
    for (j, item) in selector.device_patterns.iter().enumerate() {
        if let Err(e) = crate::glob::parse_device_patterns(item) {
            review.error(format!("{at}.deviceSelector.devicePatterns[{j}]"), e);
        }
    }
    // Rule 45.
    if class.is_shared() {
        review.error(
            format!("{at}.deviceSelector.devicePatterns"),
            format!(
                "shared device class {name:?} has devicePatterns, but every node of a shared volume \
                 group must open exactly the same LUNs: list them under deviceSelector.paths by names \
                 that are the same on every node (/dev/disk/by-id/wwn-<id>, /dev/mapper/<alias>), and \
                 remove devicePatterns"
            ),
        );
    }
    // Rule 46.
    if !has_paths(class) && force_wipe(class) {
        review.error(
            format!("{at}.deviceSelector.forceWipeDevicesAndDestroyAllData"),
            format!(
                "device class {name:?} selects its devices by pattern only, and devices matched by a \
                 pattern are never wiped (a pattern can match more than meant): list the devices to \
                 wipe under deviceSelector.paths, or remove forceWipeDevicesAndDestroyAllData"
            ),
        );
    }
}

/// Rule 47.
fn check_duplicate_patterns(classes: &[DeviceClass], review: &mut Review) {
    let mut seen: Vec<(usize, &str, String)> = Vec::new();
    for (i, class) in classes.iter().enumerate() {
        let Some(selector) = class.device_selector.as_ref() else {
            continue;
        };
        for (j, item) in selector.device_patterns.iter().enumerate() {
            let field = format!("{}.deviceSelector.devicePatterns[{j}]", class_path(i));
            for pattern in crate::glob::split(item)
                .into_iter()
                .filter(|p| !p.is_empty())
            {
                let earlier = seen.iter().find(|(c, p, _)| {
                    *p == pattern && (*c == i || classes[*c].node_selector == class.node_selector)
                });
                match earlier {
                    Some((c, _, first)) if *c == i => review.error(
                        field.clone(),
                        format!(
                            "pattern {pattern} is listed twice in device class {:?} (first at \
                             {first}): remove the duplicate",
                            class.name
                        ),
                    ),
                    Some((c, _, first)) => review.error(
                        field.clone(),
                        format!(
                            "pattern {pattern} is also in device class {:?} ({first}), which has the \
                             same nodeSelector, and a device can belong to only one volume group: \
                             remove it from one of the two classes",
                            classes[*c].name
                        ),
                    ),
                    None => seen.push((i, pattern, field.clone())),
                }
            }
        }
    }
}

/// Rules 48–50.
fn check_csi_driver_lvm_storage_classes(classes: &[DeviceClass], review: &mut Review) {
    let opted_in: Vec<(usize, &DeviceClass)> = classes
        .iter()
        .enumerate()
        .filter(|(_, c)| c.csi_driver_lvm_storage_classes)
        .collect();
    // Rule 48.
    if opted_in.len() > 1 {
        let names = opted_in
            .iter()
            .map(|(_, c)| format!("{:?}", c.name))
            .collect::<Vec<_>>()
            .join(", ");
        for (i, _) in &opted_in[1..] {
            review.error(
                format!("{}.csiDriverLVMStorageClasses", class_path(*i)),
                format!(
                    "csiDriverLVMStorageClasses is set on device classes {names}, but it renders the \
                     StorageClasses csi-driver-lvm-linear, csi-driver-lvm-striped and \
                     csi-driver-lvm-mirror, which exist once per cluster: set it on one device \
                     class only"
                ),
            );
        }
    }
    for (i, class) in opted_in {
        let at = format!("{}.csiDriverLVMStorageClasses", class_path(i));
        let name = &class.name;
        // Rule 49.
        let mut why = Vec::new();
        if class.thin_pool_config.is_some() {
            why.push(
                "it has a thinPoolConfig, and thin volumes are linear only, so the striped and \
                 mirror StorageClasses could never provision",
            );
        }
        if class.raid_config.is_some() {
            why.push(
                "it has a raidConfig, which already fixes the layout of every volume of the class",
            );
        }
        if class.is_shared() {
            why.push(
                "it is shared, and volumes on shared LUNs are linear or thin, never striped or \
                 mirrored per node",
            );
        }
        if !why.is_empty() {
            review.error(
                at.clone(),
                format!(
                    "csi-driver-lvm's StorageClasses need a thick, node-local device class without \
                     raidConfig, and device class {name:?} is not: {}; set \
                     csiDriverLVMStorageClasses on such a class, or remove it",
                    why.join("; ")
                ),
            );
        }
        // Rule 50.
        if let Some(count) = fixed_device_count(class)
            && count < 2
        {
            review.warn(format!(
                "{at}: device class {name:?} names {count} device{} in its deviceSelector, but \
                 volumes of csi-driver-lvm-striped and csi-driver-lvm-mirror need 2 or more LVM \
                 physical volumes on the node and are refused where there are fewer: name at \
                 least 2 devices (paths, optionalPaths or devicePatterns) to use them",
                if count == 1 { "" } else { "s" }
            ));
        }
    }
}

/// How many devices a class's selector can yield at most, when that is known: every device is
/// named by a path or by a pattern without wildcards. `None` for a class that discovers its
/// devices or has a pattern with wildcards.
fn fixed_device_count(class: &DeviceClass) -> Option<usize> {
    if !names_devices(class) {
        return None;
    }
    let mut names: BTreeSet<&str> = class.all_paths().collect();
    for item in class
        .device_selector
        .iter()
        .flat_map(|s| s.device_patterns.iter())
    {
        for pattern in crate::glob::split(item)
            .into_iter()
            .filter(|p| !p.is_empty())
        {
            if crate::glob::has_meta(pattern) {
                return None;
            }
            names.insert(pattern);
        }
    }
    Some(names.len())
}

/// Rule 15.
fn check_duplicate_paths(classes: &[DeviceClass], review: &mut Review) {
    struct Seen<'a> {
        class: usize,
        path: &'a str,
        field: String,
    }
    let mut seen: Vec<Seen<'_>> = Vec::new();
    for (i, class) in classes.iter().enumerate() {
        let at = class_path(i);
        for (field, path) in paths_with_fields(class, &at) {
            let earlier = seen.iter().find(|s| {
                s.path == path
                    && (s.class == i || classes[s.class].node_selector == class.node_selector)
            });
            match earlier {
                Some(first) if first.class == i => review.error(
                    field,
                    format!(
                        "{path} is listed twice in device class {:?} (first at {}): remove the duplicate",
                        class.name, first.field
                    ),
                ),
                Some(first) => review.error(
                    field,
                    format!(
                        "{path} is also in device class {:?} ({}), which has the same nodeSelector, and a \
                         device can belong to only one volume group: remove it from one of the two classes",
                        classes[first.class].name, first.field
                    ),
                ),
                None => seen.push(Seen {
                    class: i,
                    path,
                    field,
                }),
            }
        }
    }
}

/// Rule 19 (shared classes are rule 36's).
fn check_discovery_policy(class: &DeviceClass, review: &mut Review) {
    if class.device_discovery_policy == Some(DeviceDiscoveryPolicy::Dynamic)
        && !names_devices(class)
        && !class.is_shared()
    {
        review.warn(format!(
            "device class {:?} uses deviceDiscoveryPolicy Dynamic without paths: every unused device that \
             appears later on a selected node is added to its volume group; set deviceDiscoveryPolicy: \
             Static, or list the devices under deviceSelector.paths, if devices attached later must be \
             left alone",
            class.name
        ));
    }
}

/// Rules 20 and 21.
fn check_storage_class_options(options: &StorageClassOptions, at: &str, review: &mut Review) {
    let at = format!("{at}.storageClassOptions");
    for key in options.additional_parameters.keys() {
        let field = format!("{at}.additionalParameters[{key}]");
        if key.is_empty() {
            review.error(
                field,
                "a StorageClass parameter needs a name: give the entry a non-empty key or remove it",
            );
        } else if RESERVED_STORAGE_CLASS_PARAMETERS.contains(&key.as_str()) {
            let source = match key.as_str() {
                lvms_api::FSTYPE_PARAMETER => "the device class's fstype",
                lvms_api::VOLUME_MODE_PARAMETER => {
                    "sharedConfig.volumeMode (on shared device classes)"
                }
                _ => "the device class's name",
            };
            review.error(
                field,
                format!(
                    "{key} is set by the operator from {source} and cannot be overridden: remove it from \
                     additionalParameters"
                ),
            );
        }
    }
    for (key, value) in &options.additional_labels {
        let field = format!("{at}.additionalLabels[{key}]");
        if let Some(problem) = qualified_name_problem(key) {
            review.error(
                field,
                format!(
                    "{key:?} is not a valid label key ({problem}): use an optional DNS subdomain prefix of \
                     at most 253 characters and '/', then a name of at most 63 letters, digits, '-', '_' \
                     or '.' that starts and ends with a letter or digit, such as example.com/tier"
                ),
            );
        } else if is_reserved_storage_class_label(key) {
            review.error(
                field,
                format!(
                    "{key} is set by the operator on the StorageClasses it manages and cannot be \
                     overridden: choose another key"
                ),
            );
        } else if let Some(problem) = label_value_problem(value) {
            review.error(
                field,
                format!(
                    "{value:?} is not a valid label value ({problem}): use at most 63 letters, digits, \
                     '-', '_' or '.', starting and ending with a letter or digit, or an empty value"
                ),
            );
        }
    }
}

mod names;
mod shared;
#[cfg(test)]
mod tests;
mod update;
