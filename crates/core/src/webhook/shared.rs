//! Rules 31–40 and 44–51: shared device classes.

use super::*;

/// Whether `path` names a device by a name that is the same on every node (rule 32).
pub fn is_stable_device_path(path: &str) -> bool {
    STABLE_DEVICE_DIRS.iter().any(|dir| {
        path.strip_prefix(dir).is_some_and(|name| {
            !name.is_empty() && !name.contains('/') && name != "." && name != ".."
        })
    })
}

/// Rules 31–38 for one shared class.
pub(super) fn check_shared(class: &DeviceClass, at: &str, ctx: &Context, review: &mut Review) {
    let name = &class.name;
    let selector = class.device_selector.as_ref();
    let paths = selector.map(|s| s.paths.as_slice()).unwrap_or_default();

    // Rule 31.
    if paths.is_empty() {
        review.error(
            format!("{at}.deviceSelector.paths"),
            format!(
                "shared device class {name:?} lists no devices, and shared classes never discover \
                 them: list its LUNs under deviceSelector.paths by names that are the same on every \
                 node, such as /dev/disk/by-id/wwn-<id> or /dev/mapper/<multipath alias>"
            ),
        );
    }
    // Rule 32 (paths rule 14 refuses are left to it).
    for (j, path) in paths.iter().enumerate() {
        let under_dev = path.strip_prefix("/dev/").is_some_and(|p| !p.is_empty());
        if under_dev && !is_stable_device_path(path) {
            review.error(
                format!("{at}.deviceSelector.paths[{j}]"),
                format!(
                    "{path} may name another device on another node (names such as /dev/sdX, /dev/vdX \
                     or /dev/disk/by-path/... depend on the order and the port each node finds the LUN \
                     at), but every node of shared device class {name:?} must open the same LUN: name \
                     it under /dev/disk/by-id/ (for example its wwn-... link) or /dev/mapper/ (a \
                     multipath device)"
                ),
            );
        }
    }
    // Rule 33.
    if selector.is_some_and(|s| !s.optional_paths.is_empty()) {
        review.error(
            format!("{at}.deviceSelector.optionalPaths"),
            format!(
                "shared device class {name:?} has optionalPaths, but every node of a shared volume \
                 group must see the same devices: move the LUNs to deviceSelector.paths, or remove \
                 optionalPaths"
            ),
        );
    }
    // Rule 34.
    if class.raid_config.is_some() {
        review.error(
            format!("{at}.raidConfig"),
            format!(
                "shared device class {name:?} has raidConfig, but LVM RAID volumes cannot be active on \
                 more than one node: remove raidConfig and let the storage array provide redundancy, or \
                 use a node-local device class for RAID"
            ),
        );
    }
    // Rule 35.
    if class.thin_pool_config.is_some() {
        review.error(
            format!("{at}.thinPoolConfig"),
            format!(
                "shared device class {name:?} has thinPoolConfig, but a shared volume group has no \
                 class-wide thin pool (one pool would be active on one node only): remove \
                 thinPoolConfig, and set sharedConfig.volumeMode: Thin to give each volume its own thin \
                 pool"
            ),
        );
    }
    // Rule 36.
    if class.device_discovery_policy == Some(DeviceDiscoveryPolicy::Dynamic) {
        review.error(
            format!("{at}.deviceDiscoveryPolicy"),
            format!(
                "shared device class {name:?} has deviceDiscoveryPolicy Dynamic, but shared classes \
                 never discover devices (another node's LUNs would be claimed): remove \
                 deviceDiscoveryPolicy and list the LUNs under deviceSelector.paths"
            ),
        );
    }
    // Rule 37.
    if name.len() > MAX_SHARED_CLASS_NAME {
        review.error(
            format!("{at}.name"),
            format!(
                "the name of shared device class {name:?} has {} characters, but it becomes the name \
                 part of the topology label {}, which allows at most {MAX_SHARED_CLASS_NAME}: choose a \
                 shorter name",
                name.len(),
                lvms_api::shared_topology_key("<name>")
            ),
        );
    }
    // Rule 38.
    if force_wipe(class) && ctx.existing_shared_volume_groups.contains(name) {
        review.error(
            format!("{at}.deviceSelector.forceWipeDevicesAndDestroyAllData"),
            format!(
                "the shared volume group of device class {name:?} already exists (a node reports it), \
                 and wiping its LUNs would destroy it and every volume in it for all nodes: set \
                 forceWipeDevicesAndDestroyAllData: false or remove it"
            ),
        );
    }
}

/// Rule 40: a path of a shared class is in no other class, whatever the node selectors (equal
/// selectors are rule 15's).
pub(super) fn check_shared_paths_elsewhere(classes: &[DeviceClass], review: &mut Review) {
    for (k, later) in classes.iter().enumerate() {
        let at = class_path(k);
        for (field, path) in paths_with_fields(later, &at) {
            let earlier = classes[..k].iter().enumerate().find_map(|(i, c)| {
                let shared_pair = c.is_shared() || later.is_shared();
                let rule_15 = c.node_selector == later.node_selector;
                if !shared_pair || rule_15 {
                    return None;
                }
                paths_with_fields(c, &class_path(i))
                    .find(|(_, p)| *p == path)
                    .map(|(f, _)| (c, f))
            });
            if let Some((first, first_field)) = earlier {
                let shared = if later.is_shared() { later } else { first };
                review.error(
                    field,
                    format!(
                        "{path} is also in device class {:?} ({first_field}), and {:?} is shared: a \
                         shared LUN is seen by every node, so a class on any node would claim it too, \
                         whatever the nodeSelectors: remove it from one of the two classes",
                        first.name, shared.name
                    ),
                );
            }
        }
    }
}
