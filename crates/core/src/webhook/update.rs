//! Rules 22–30 and 41–43: what an update may change.

use super::*;

/// Rules 22–30.
pub(super) fn check_update(old: &LVMClusterSpec, new: &LVMClusterSpec, review: &mut Review) {
    let old_classes = &old.storage.device_classes;
    let new_classes = &new.storage.device_classes;

    // Rule 23.
    if new_classes.is_empty() {
        review.error(
            "spec.storage.deviceClasses",
            "at least one device class must remain: keep a device class, or delete the LVMCluster to \
             remove all storage",
        );
    }
    for removed in old_classes
        .iter()
        .filter(|o| o.default && !new_classes.iter().any(|n| n.name == o.name))
    {
        review.error(
            "spec.storage.deviceClasses",
            format!(
                "device class {:?} is the default and cannot be removed: first make another class the \
                 default (default: true there, default: false on {:?}) in its own update, then remove it",
                removed.name, removed.name
            ),
        );
    }

    for (i, class) in new_classes.iter().enumerate() {
        if let Some(before) = old_classes.iter().find(|o| o.name == class.name) {
            check_class_update(before, class, &class_path(i), review);
        }
    }
}

/// Rules 22, 24–30 and 41–43 for one class that exists in both versions.
pub(super) fn check_class_update(
    old: &DeviceClass,
    new: &DeviceClass,
    at: &str,
    review: &mut Review,
) {
    check_storage_class_update(old, new, at, review);
    check_thin_pool_update(old, new, at, review);
    check_shared_update(old, new, at, review);

    // Rule 26.
    if old.raid_config != new.raid_config {
        let what = match (&old.raid_config, &new.raid_config) {
            (None, _) => {
                "cannot be added to an existing device class: remove raidConfig, or add a new \
                          device class with RAID"
                    .to_owned()
            }
            (Some(_), None) => {
                "cannot be removed from an existing device class, whose volumes are RAID \
                                volumes: restore raidConfig as it was"
                    .to_owned()
            }
            (Some(before), Some(_)) => format!(
                "cannot change on an existing device class, whose volumes already have this layout: restore \
                 it as it was ({}{}), or add a new device class with the new layout",
                before.raid_type,
                layout(before)
            ),
        };
        review.error(format!("{at}.raidConfig"), format!("raidConfig {what}"));
    }

    // Rule 27.
    if old.node_selector != new.node_selector {
        review.error(
            format!("{at}.nodeSelector"),
            "nodeSelector cannot change, since volume groups already exist on the selected nodes: restore \
             the previous nodeSelector, or add a new device class for other nodes",
        );
    }

    // Rule 28 (a shared class may turn the flag off, see the module documentation).
    let turned_off_on_shared = new.is_shared() && !force_wipe(new);
    if force_wipe(old) != force_wipe(new) && !turned_off_on_shared {
        review.error(
            format!("{at}.deviceSelector.forceWipeDevicesAndDestroyAllData"),
            format!(
                "forceWipeDevicesAndDestroyAllData cannot change after the device class is created: set it \
                 back to {}",
                force_wipe(old)
            ),
        );
    }

    // Rules 29 and 30 (patterns name devices as paths do).
    match (names_devices(old), names_devices(new)) {
        (false, true) => review.error(
            format!("{at}.deviceSelector"),
            format!(
                "device class {:?} was created without paths, so its devices are discovered on each node, \
                 and paths or patterns cannot be added later: remove deviceSelector, or add a new device \
                 class with these paths",
                new.name
            ),
        ),
        (true, false) => review.error(
            format!("{at}.deviceSelector"),
            format!(
                "device class {:?} had device paths or patterns and cannot lose all of them: keep at \
                 least one of its paths, optionalPaths or devicePatterns",
                new.name
            ),
        ),
        _ => {}
    }
}

/// Rules 41–43.
pub(super) fn check_shared_update(
    old: &DeviceClass,
    new: &DeviceClass,
    at: &str,
    review: &mut Review,
) {
    let name = &new.name;
    if old.is_shared() != new.is_shared() {
        let (was, now) = if old.is_shared() {
            ("shared", "nodeLocal")
        } else {
            ("nodeLocal", "shared")
        };
        review.error(
            format!("{at}.deviceAccessPolicy"),
            format!(
                "device class {name:?} is {was} (unset and local mean nodeLocal) and cannot become \
                 {now}, since its volume groups are already made one way: restore deviceAccessPolicy, \
                 or remove the device class and add a new one under another name"
            ),
        );
        return;
    }
    if !new.is_shared() {
        return;
    }
    let (before, after) = (
        old.shared_config_or_default(),
        new.shared_config_or_default(),
    );
    let (was, now) = (
        before.io_timeout_seconds_or_default(),
        after.io_timeout_seconds_or_default(),
    );
    if was != now {
        review.error(
            format!("{at}.sharedConfig.ioTimeoutSeconds"),
            format!(
                "the sanlock lockspace of shared device class {name:?} was made with an I/O timeout of \
                 {was} seconds, which cannot change: set ioTimeoutSeconds: {was} (unset means {}), or \
                 remove the device class and add a new one under another name",
                lvms_api::DEFAULT_IO_TIMEOUT_SECONDS
            ),
        );
    }
    let (was, now) = (
        before.volume_mode_or_default(),
        after.volume_mode_or_default(),
    );
    if was != now {
        review.error(
            format!("{at}.sharedConfig.volumeMode"),
            format!(
                "StorageClass {} was created with volume mode {was}, and StorageClass parameters cannot \
                 change: set volumeMode: {was} (unset means Linear); to change it, delete and recreate \
                 the LVMCluster",
                storage_class_name(name)
            ),
        );
    }
}

/// Rule 22: what the StorageClass was created with cannot change, since StorageClasses are
/// immutable; options added to an existing class must therefore equal the defaults.
pub(super) fn check_storage_class_update(
    old: &DeviceClass,
    new: &DeviceClass,
    at: &str,
    review: &mut Review,
) {
    let default_options = StorageClassOptions::default();
    let before = old
        .storage_class_options
        .as_ref()
        .unwrap_or(&default_options);
    let after = new
        .storage_class_options
        .as_ref()
        .unwrap_or(&default_options);
    let class = storage_class_name(&new.name);
    let added = if old.storage_class_options.is_none() && new.storage_class_options.is_some() {
        "storageClassOptions added to an existing device class must keep the values its StorageClass was \
         created with (the defaults); "
    } else {
        ""
    };
    let recreate = "to change it, delete and recreate the LVMCluster";

    let (old_policy, new_policy) = (
        before.reclaim_policy_or_default(),
        after.reclaim_policy_or_default(),
    );
    if old_policy != new_policy {
        review.error(
            format!("{at}.storageClassOptions.reclaimPolicy"),
            format!(
                "{added}StorageClass {class} was created with reclaimPolicy {old_policy}, and a \
                 StorageClass cannot change it: set reclaimPolicy: {old_policy}; {recreate}"
            ),
        );
    }
    let (old_mode, new_mode) = (
        before.volume_binding_mode_or_default(),
        after.volume_binding_mode_or_default(),
    );
    if old_mode != new_mode {
        review.error(
            format!("{at}.storageClassOptions.volumeBindingMode"),
            format!(
                "{added}StorageClass {class} was created with volumeBindingMode {old_mode}, and a \
                 StorageClass cannot change it: set volumeBindingMode: {old_mode}; {recreate}"
            ),
        );
    }
    if before.additional_parameters != after.additional_parameters {
        let was = if before.additional_parameters.is_empty() {
            "no additional parameters: remove additionalParameters".to_owned()
        } else {
            format!(
                "additionalParameters {:?}: restore them",
                before.additional_parameters
            )
        };
        review.error(
            format!("{at}.storageClassOptions.additionalParameters"),
            format!(
                "{added}StorageClass {class} was created with {was}, since StorageClass parameters cannot \
                 change; {recreate}"
            ),
        );
    }
    let (old_fs, new_fs) = (old.fstype_or_default(), new.fstype_or_default());
    if old_fs != new_fs {
        review.error(
            format!("{at}.fstype"),
            format!(
                "StorageClass {class} was created with fstype {old_fs}, and StorageClass parameters cannot \
                 change: set fstype: {old_fs}; {recreate}"
            ),
        );
    }
}

/// The effective chunk size in bytes (`None` under the Host policy), or the raw quantity when it
/// does not parse (the create rules report that).
pub(super) fn effective_chunk_size(pool: &ThinPoolConfig) -> Option<Result<u64, String>> {
    match pool.chunk_size_policy_or_default() {
        ChunkSizeCalculationPolicy::Host => None,
        ChunkSizeCalculationPolicy::Static => {
            let q = pool
                .chunk_size
                .as_ref()
                .map_or(lvms_api::DEFAULT_CHUNK_SIZE, |q| q.0.as_str());
            Some(q.parse::<ByteSize>().map(|s| s.0).map_err(|_| q.to_owned()))
        }
    }
}

/// Rules 24 and 25.
pub(super) fn check_thin_pool_update(
    old: &DeviceClass,
    new: &DeviceClass,
    at: &str,
    review: &mut Review,
) {
    let at = format!("{at}.thinPoolConfig");
    let (before, after) = match (&old.thin_pool_config, &new.thin_pool_config) {
        (None, None) => return,
        (Some(before), None) => {
            review.error(
                at,
                format!(
                    "thinPoolConfig cannot be removed from an existing device class, whose thin pool and \
                     volumes exist on the nodes: restore it as it was (name {:?}), or add a new device \
                     class for thick volumes",
                    before.name
                ),
            );
            return;
        }
        (None, Some(_)) => {
            review.error(
                at,
                "thinPoolConfig cannot be added to an existing device class, whose volume group already \
                 holds thick volumes: remove thinPoolConfig, or add a new device class with a thin pool",
            );
            return;
        }
        (Some(before), Some(after)) => (before, after),
    };

    let immutable = |field: &str, restore: &str| {
        format!(
            "thinPoolConfig.{field} cannot change once the thin pool exists: {restore}, or add a new device \
             class with the new setting"
        )
    };
    if before.name != after.name {
        review.error(
            format!("{at}.name"),
            immutable("name", &format!("set it back to {:?}", before.name)),
        );
    }
    if before.size_percent_or_default() != after.size_percent_or_default() {
        review.error(
            format!("{at}.sizePercent"),
            immutable(
                "sizePercent",
                &format!("set it back to {}", before.size_percent_or_default()),
            ),
        );
    }
    let (old_policy, new_policy) = (
        before.chunk_size_policy_or_default(),
        after.chunk_size_policy_or_default(),
    );
    if old_policy != new_policy {
        review.error(
            format!("{at}.chunkSizeCalculationPolicy"),
            immutable(
                "chunkSizeCalculationPolicy",
                &format!("set it back to {old_policy}"),
            ),
        );
    } else if effective_chunk_size(before) != effective_chunk_size(after) {
        let restore = before.chunk_size.as_ref().map_or_else(
            || {
                format!(
                    "remove it again (unset means {})",
                    lvms_api::DEFAULT_CHUNK_SIZE
                )
            },
            |q| format!("set it back to {}", q.0),
        );
        review.error(format!("{at}.chunkSize"), immutable("chunkSize", &restore));
    }

    // Rule 25.
    let metadata = |pool: &ThinPoolConfig| {
        pool.metadata_size
            .as_ref()
            .map_or(DEFAULT_METADATA_SIZE, |q| q.0.as_str())
            .parse::<ByteSize>()
            .ok()
    };
    if before.metadata_size_policy_or_default() == MetadataSizePolicy::Static
        && after.metadata_size_policy_or_default() == MetadataSizePolicy::Static
        && let (Some(was), Some(now)) = (metadata(before), metadata(after))
        && now < was
    {
        review.error(
            format!("{at}.metadataSize"),
            format!(
                "the thin pool's metadata cannot shrink: it is {was} now, so set metadataSize to {was} or \
                 more"
            ),
        );
    }
}
