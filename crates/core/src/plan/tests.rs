use std::slice::from_ref;

use proptest::prelude::*;

use super::*;
use crate::{
    config::{CSI_DRIVER_LVM_VG_NAME, DeviceSelector, Fstype},
    filter::{LVM_SIGNATURE, tests::disk, tests::part},
    model::DeviceKind,
};

const EXTENT: u64 = 4 * MIB;
const FOREIGN_VG: &str = "data";

// ---------------------------------------------------------------------------------------------------------
// Fixtures

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Clean,
    OrphanPv,
    Ext4,
    Partitioned,
    ForeignPv,
    Mounted,
    ReadOnly,
    KubeletLoop,
    Dm,
    Small,
}

impl Kind {
    const ALL: [Kind; 10] = [
        Kind::Clean,
        Kind::OrphanPv,
        Kind::Ext4,
        Kind::Partitioned,
        Kind::ForeignPv,
        Kind::Mounted,
        Kind::ReadOnly,
        Kind::KubeletLoop,
        Kind::Dm,
        Kind::Small,
    ];

    /// Whether the filter should accept a device of this kind.
    fn usable(self, force: bool) -> bool {
        match self {
            Kind::Clean | Kind::OrphanPv => true,
            Kind::Ext4 | Kind::Partitioned | Kind::ForeignPv => force,
            Kind::Mounted | Kind::ReadOnly | Kind::KubeletLoop | Kind::Dm | Kind::Small => false,
        }
    }
}

/// Builds an observed host device by device.
#[derive(Default)]
struct Host {
    obs: Observed,
    n: usize,
}

impl Host {
    /// Adds a device and returns the path to configure (a by-id link when `by_id`).
    fn add(&mut self, kind: Kind, size: u64, by_id: bool) -> String {
        self.n += 1;
        let i = self.n;
        let name = format!("vd{i}");
        let mut d = disk(&name, size);
        match kind {
            Kind::Clean => {}
            Kind::OrphanPv => {
                d.fstype = Some(LVM_SIGNATURE.into());
                self.obs.pvs.push(new_pv(&d.path, size, None));
            }
            Kind::Ext4 => d.fstype = Some("ext4".into()),
            Kind::Partitioned => {
                d.fstype = Some("gpt".into());
                let mut p1 = part(&format!("{name}p1"), size / 2);
                p1.fstype = Some("xfs".into());
                d.children = vec![p1, part(&format!("{name}p2"), size / 2)];
            }
            Kind::ForeignPv => {
                d.fstype = Some(LVM_SIGNATURE.into());
                self.obs.pvs.push(new_pv(&d.path, size, Some(FOREIGN_VG)));
                if !self.obs.vgs.iter().any(|v| v.name == FOREIGN_VG) {
                    let mut g = crate::filter::tests::vg(FOREIGN_VG, &[]);
                    g.attr = "wz--n-".into();
                    self.obs.vgs.push(g);
                }
            }
            Kind::Mounted => {
                d.fstype = Some("xfs".into());
                d.mountpoints = vec![format!("/mnt/{name}")];
            }
            Kind::ReadOnly => d.read_only = true,
            Kind::KubeletLoop => {
                d = BlockDevice {
                    kind: DeviceKind::Loop,
                    loop_backing_file: Some(format!(
                        "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pvc-{i}/dev/x"
                    )),
                    ..disk(&format!("loop{i}"), size)
                };
            }
            Kind::Dm => {
                d = BlockDevice {
                    name: format!("other-lv{i}"),
                    kname: format!("dm-{i}"),
                    path: format!("/dev/mapper/other-lv{i}"),
                    kind: DeviceKind::Lvm,
                    ..disk("x", size)
                };
                // /dev/mapper/* links resolve to /dev/dm-N.
                self.obs
                    .resolved
                    .insert(d.path.clone(), Some(format!("/dev/dm-{i}")));
                self.obs.devices.push(d.clone());
                return d.path;
            }
            Kind::Small => d.size = 512 * MIB,
        }
        let canonical = d.path.clone();
        let configured = if by_id {
            let link = format!("/dev/disk/by-id/virtio-serial{i}");
            d.by_id.push(link.clone());
            link
        } else {
            canonical.clone()
        };
        self.obs
            .resolved
            .insert(configured.clone(), Some(canonical.clone()));
        self.obs.resolved.insert(canonical, Some(d.path.clone()));
        self.obs.devices.push(d);
        configured
    }

    fn clean(&mut self, size: u64) -> String {
        self.add(Kind::Clean, size, false)
    }
}

fn new_pv(path: &str, dev_size: u64, vg: Option<&str>) -> PhysicalVolume {
    let size =
        round_down_to_extent(dev_size.saturating_sub(PV_METADATA_SIZE + MIB), EXTENT).unwrap();
    PhysicalVolume {
        name: path.into(),
        vg_name: vg.map(Into::into),
        uuid: format!("pv-{path}"),
        size,
        free: size,
        attr: if vg.is_some() { "a--" } else { "---" }.into(),
    }
}

fn class(name: &str, paths: &[String]) -> DeviceClassConfig {
    DeviceClassConfig {
        name: name.into(),
        device_selector: DeviceSelector {
            paths: paths.to_vec(),
            optional_paths: vec![],
            device_patterns: vec![],
            force_wipe_devices_and_destroy_all_data: false,
        },
        thin_pool_config: None,
        raid_config: None,
        default: false,
        fstype: Some(Fstype::Xfs),
        device_discovery_policy: DiscoveryPolicy::Static,
        access: Default::default(),
        adopt: None,
    }
}

fn thin_config() -> ThinPoolConfig {
    ThinPoolConfig {
        name: "thin-pool-1".into(),
        size_percent: 90,
        overprovision_ratio: 10,
        chunk_size_calculation_policy: CalculationPolicy::Static,
        chunk_size: None,
        metadata_size_calculation_policy: CalculationPolicy::Static,
        metadata_size: None,
    }
}

fn thin_class(name: &str, paths: &[String]) -> DeviceClassConfig {
    DeviceClassConfig {
        thin_pool_config: Some(thin_config()),
        ..class(name, paths)
    }
}

fn raid_class(name: &str, paths: &[String], raid_type: RaidType) -> DeviceClassConfig {
    DeviceClassConfig {
        raid_config: Some(RaidConfig {
            raid_type,
            mirrors: None,
            stripes: None,
            stripe_size: None,
        }),
        ..class(name, paths)
    }
}

fn failed_reason(plan: &ClassPlan) -> &str {
    match &plan.state {
        ClassState::Failed { reason } => reason,
        other => panic!(
            "expected Failed, got {other:?} with actions {:?}",
            plan.actions
        ),
    }
}

fn vg_of<'a>(obs: &'a Observed, name: &str) -> &'a VolumeGroup {
    obs.vgs
        .iter()
        .find(|v| v.name == name)
        .expect("volume group exists")
}

fn lv_of<'a>(obs: &'a Observed, vg: &str, name: &str) -> Option<&'a LogicalVolume> {
    obs.lvs.iter().find(|l| l.vg_name == vg && l.name == name)
}

// ---------------------------------------------------------------------------------------------------------
// A pure simulation of the executor: applies actions to an observation as LVM would, and panics on any
// action LVM would refuse or that would destroy something it must not.

fn device_mut<'a>(devices: &'a mut [BlockDevice], path: &str) -> Option<&'a mut BlockDevice> {
    for d in devices {
        if d.path == path || format!("/dev/{}", d.kname) == path {
            return Some(d);
        }
        if let Some(found) = device_mut(&mut d.children, path) {
            return Some(found);
        }
    }
    None
}

fn new_lv(vg: &str, name: &str, size: u64, attr: &str, segtype: &str) -> LogicalVolume {
    LogicalVolume {
        name: name.into(),
        vg_name: vg.into(),
        uuid: format!("lv-{vg}-{name}"),
        size,
        attr: attr.into(),
        segtype: segtype.into(),
        pool_lv: None,
        origin: None,
        data_percent: None,
        metadata_percent: None,
        metadata_size: None,
        sync_percent: None,
        tags: vec![],
        path: None,
        dm_path: None,
        stripes: None,
        stripe_size: None,
    }
}

fn add_pvs_to_vg(obs: &mut Observed, vg_name: &str, pvs: &[String]) -> u64 {
    let mut extents = 0;
    for path in pvs {
        let pv = obs
            .pvs
            .iter_mut()
            .find(|p| p.name == *path)
            .unwrap_or_else(|| panic!("vg{vg_name}: {path} is not an LVM physical volume"));
        assert!(
            pv.vg_name.is_none(),
            "{path} already belongs to {:?}",
            pv.vg_name
        );
        pv.vg_name = Some(vg_name.into());
        pv.attr = "a--".into();
        extents += pv.size / EXTENT;
    }
    extents
}

/// Free extents of each allocatable physical volume of `vg_name`.
fn pv_free_extents(obs: &Observed, vg_name: &str) -> Vec<u64> {
    obs.pvs
        .iter()
        .filter(|p| p.vg_name.as_deref() == Some(vg_name))
        .map(|p| p.free / EXTENT)
        .collect()
}

fn allocate(obs: &mut Observed, vg_name: &str, bytes: u64) {
    // Largest free physical volume first, as lvm2's normal policy does.
    let mut left = bytes;
    while left > 0 {
        let Some(pv) = obs
            .pvs
            .iter_mut()
            .filter(|p| p.vg_name.as_deref() == Some(vg_name) && p.free > 0)
            .max_by_key(|p| p.free)
        else {
            break;
        };
        let take = left.min(pv.free);
        pv.free -= take;
        left -= take;
    }
    let g = obs.vgs.iter_mut().find(|v| v.name == vg_name).unwrap();
    let extents = bytes / EXTENT;
    assert_eq!(
        bytes % EXTENT,
        0,
        "allocation of {bytes} is not whole extents"
    );
    assert!(
        g.free_count >= extents,
        "{vg_name}: needs {extents} extents, has {}",
        g.free_count
    );
    g.free_count -= extents;
    g.free = g.free_count * EXTENT;
    g.lv_count += 1;
}

/// Places `images` sub-volumes of `extents` each on different physical volumes of `vg_name`, the
/// emptiest first (as lvm2's `normal` policy would), each whole on one; panics when they do not fit.
fn allocate_images(obs: &mut Observed, vg_name: &str, images: u64, extents: u64) {
    let mut used = BTreeSet::new();
    for i in 0..images {
        let pv = obs
            .pvs
            .iter_mut()
            .filter(|p| p.vg_name.as_deref() == Some(vg_name) && !used.contains(&p.name))
            .max_by_key(|p| p.free)
            .unwrap_or_else(|| panic!("{vg_name}: no device left for image {i} of {images}"));
        assert!(
            pv.free >= extents * EXTENT,
            "{vg_name}: image {i} of {images} needs {extents} extents on one device, {} has {}",
            pv.name,
            pv.free / EXTENT
        );
        pv.free -= extents * EXTENT;
        used.insert(pv.name.clone());
    }
    let g = obs.vgs.iter_mut().find(|v| v.name == vg_name).unwrap();
    g.free_count -= images * extents;
    g.free = g.free_count * EXTENT;
    g.lv_count += 1;
}

fn apply(obs: &mut Observed, actions: &[Action]) {
    for action in actions {
        match action {
            Action::ReduceVolumeGroup { name, pvs } => {
                for path in pvs {
                    let pv = obs.pvs.iter_mut().find(|p| p.name == *path).unwrap();
                    assert_eq!(pv.vg_name.as_deref(), Some(name.as_str()));
                    assert_eq!(pv.free, pv.size, "vgreduce of {path}, which holds data");
                    pv.vg_name = None;
                    let extents = pv.size / EXTENT;
                    let g = obs.vgs.iter_mut().find(|v| v.name == *name).unwrap();
                    assert!(g.free_count >= extents);
                    g.free_count -= extents;
                    g.extent_count -= extents;
                    g.free = g.free_count * EXTENT;
                    g.size = g.extent_count * EXTENT;
                    g.pv_count -= 1;
                }
            }
            Action::AdoptVolumeGroup { name, tag } => {
                let g = obs.vgs.iter_mut().find(|v| v.name == *name).unwrap();
                assert!(!g.tags.contains(tag), "{name} adopted twice");
                g.tags.push(tag.clone());
            }
            Action::RemovePhysicalVolume { path } => {
                let pv = obs.pvs.iter().find(|p| p.name == *path).unwrap();
                assert_eq!(pv.vg_name, None, "pvremove of {path} in a group");
                obs.pvs.retain(|p| p.name != *path);
                device_mut(&mut obs.devices, path).unwrap().fstype = None;
            }
            Action::WipeDevice { path } => {
                if let Some(pv) = obs.pvs.iter().find(|p| p.name == *path) {
                    let vg = pv.vg_name.clone().unwrap_or_default();
                    let owned = obs
                        .vgs
                        .iter()
                        .any(|g| g.name == vg && g.tags.iter().any(|t| t == VG_OWNER_TAG));
                    assert!(
                        !owned,
                        "wiped {path}, a physical volume of our volume group {vg}"
                    );
                }
                obs.pvs.retain(|p| p.name != *path);
                let d = device_mut(&mut obs.devices, path).expect("wiped device exists");
                assert!(!d.read_only && d.mountpoints.is_empty(), "wiped {path}");
                assert!(
                    d.children
                        .iter()
                        .all(|c| c.mountpoints.is_empty() && c.children.is_empty())
                );
                d.fstype = None;
                d.children.clear();
            }
            Action::CreatePhysicalVolume {
                path,
                metadata_size,
            } => {
                assert_eq!(*metadata_size, PV_METADATA_SIZE);
                assert!(
                    obs.pvs.iter().all(|p| p.name != *path),
                    "pvcreate on existing PV {path}"
                );
                let d = device_mut(&mut obs.devices, path).expect("pvcreate device exists");
                assert!(
                    d.fstype.is_none(),
                    "pvcreate on {path} with signature {:?}",
                    d.fstype
                );
                assert!(d.children.is_empty() && d.mountpoints.is_empty() && !d.read_only);
                d.fstype = Some(LVM_SIGNATURE.into());
                let size = d.size;
                obs.pvs.push(new_pv(path, size, None));
            }
            Action::CreateVolumeGroup { name, pvs, tags } => {
                assert!(
                    obs.vgs.iter().all(|v| v.name != *name),
                    "vgcreate of existing {name}"
                );
                assert!(!pvs.is_empty());
                assert_eq!(tags, &vec![VG_OWNER_TAG.to_owned()]);
                let extents = add_pvs_to_vg(obs, name, pvs);
                obs.vgs.push(VolumeGroup {
                    name: name.clone(),
                    uuid: format!("vg-{name}"),
                    size: extents * EXTENT,
                    free: extents * EXTENT,
                    extent_size: EXTENT,
                    extent_count: extents,
                    free_count: extents,
                    pv_count: pvs.len() as u64,
                    lv_count: 0,
                    tags: tags.clone(),
                    attr: "wz--n-".into(),
                    mda_free: PV_METADATA_SIZE / 2,
                    mda_size: PV_METADATA_SIZE,
                });
            }
            Action::ExtendVolumeGroup { name, pvs } => {
                let extents = add_pvs_to_vg(obs, name, pvs);
                let g = obs
                    .vgs
                    .iter_mut()
                    .find(|v| v.name == *name)
                    .expect("vgextend of missing vg");
                assert!(g.tags.iter().any(|t| t == VG_OWNER_TAG));
                g.extent_count += extents;
                g.free_count += extents;
                g.size = g.extent_count * EXTENT;
                g.free = g.free_count * EXTENT;
                g.pv_count += pvs.len() as u64;
            }
            Action::CreateThinPool {
                vg,
                name,
                data_size,
                chunk_size,
                metadata_size,
                zero,
                raid: Some(raid),
            } => {
                assert!(*zero);
                assert!(*chunk_size == Some(DEFAULT_CHUNK_SIZE) || chunk_size.is_none());
                let meta = metadata_size.expect("a RAID pool's metadata size is given");
                let meta = round_up_to_extent(meta, EXTENT).unwrap();
                let layout = crate::layout::Layout::of_raid_config(&raid.data);
                let (images, stripes) = layout.images(0).unwrap();
                let data_extents = data_size.div_ceil(EXTENT).div_ceil(stripes);
                if lv_of(obs, vg, name).is_none() {
                    allocate_images(obs, vg, images, data_extents + 1);
                }
                allocate_images(
                    obs,
                    vg,
                    u64::from(raid.metadata_mirrors) + 1,
                    meta / EXTENT + 1,
                );
                let spare = lv_of(obs, vg, "[lvol0_pmspare]").map_or(0, |l| l.size);
                if spare < meta {
                    assert_eq!(spare, 0, "simulation does not grow spares");
                    allocate_images(obs, vg, 1, meta / EXTENT);
                    obs.lvs
                        .push(new_lv(vg, "[lvol0_pmspare]", meta, "ewi-------", "linear"));
                }
                obs.lvs
                    .retain(|lv| !(lv.vg_name == *vg && lv.name == *name));
                let mut pool = new_lv(vg, name, *data_size, "twi-a-tz--", "thin-pool");
                pool.metadata_size = Some(meta);
                pool.data_percent = Some(0.0);
                obs.lvs.push(pool);
                let mut tdata = new_lv(
                    vg,
                    &format!("[{name}_tdata]"),
                    *data_size,
                    "rwi-aor---",
                    raid.data.raid_type.as_lvm(),
                );
                tdata.stripes = Some(images);
                tdata.stripe_size = Some(stripes);
                obs.lvs.push(tdata);
                obs.lvs.push(new_lv(
                    vg,
                    &format!("[{name}_tmeta]"),
                    meta,
                    "ewi-aor---",
                    "raid1",
                ));
            }
            Action::CreateThinPool {
                vg,
                name,
                data_size,
                chunk_size,
                metadata_size,
                zero,
                raid: None,
            } => {
                assert!(*zero);
                assert!(lv_of(obs, vg, name).is_none(), "pool {name} created twice");
                let meta = metadata_size
                    .unwrap_or_else(|| thin_pool_metadata_estimate(*data_size, *chunk_size));
                let meta = round_up_to_extent(meta, EXTENT).unwrap();
                let spare = lv_of(obs, vg, "[lvol0_pmspare]").map_or(0, |l| l.size);
                let pv_free = pv_free_extents(obs, vg);
                if !pv_free.is_empty() {
                    let new_spare = meta.saturating_sub(spare);
                    assert!(
                        crate::pool_fit::tests::always_created(
                            &pv_free,
                            data_size / EXTENT,
                            meta / EXTENT,
                            new_spare / EXTENT
                        ),
                        "lvm2 could not place pool {name} ({data_size} of data, {meta} of metadata and \
                         {new_spare} of spare) on {pv_free:?}"
                    );
                }
                allocate(obs, vg, *data_size);
                allocate(obs, vg, meta);
                if spare < meta {
                    assert_eq!(spare, 0, "simulation does not grow spares");
                    allocate(obs, vg, meta);
                    obs.lvs
                        .push(new_lv(vg, "[lvol0_pmspare]", meta, "ewi-------", "linear"));
                }
                let mut pool = new_lv(vg, name, *data_size, "twi-a-tz--", "thin-pool");
                pool.metadata_size = Some(meta);
                pool.data_percent = Some(0.0);
                obs.lvs.push(pool);
                obs.lvs.push(new_lv(
                    vg,
                    &format!("[{name}_tdata]"),
                    *data_size,
                    "Twi-ao----",
                    "linear",
                ));
                obs.lvs.push(new_lv(
                    vg,
                    &format!("[{name}_tmeta]"),
                    meta,
                    "ewi-ao----",
                    "linear",
                ));
            }
            Action::ExtendThinPool {
                vg,
                name,
                data_size,
            } => {
                let current = lv_of(obs, vg, name).expect("extended pool exists").size;
                assert!(
                    *data_size > current,
                    "extend {name} from {current} to {data_size}"
                );
                // The simulation keeps a RAID pool's images and data stripes on its `_tdata`.
                let tdata = lv_of(obs, vg, &format!("[{name}_tdata]"));
                match tdata.and_then(|t| t.stripes.zip(t.stripe_size)) {
                    Some((images, stripes)) => {
                        let grow = (data_size - current).div_ceil(EXTENT).div_ceil(stripes);
                        allocate_images(obs, vg, images, grow);
                    }
                    None => allocate(obs, vg, data_size - current),
                }
                for lv in obs.lvs.iter_mut() {
                    if lv.vg_name == *vg
                        && (lv.name == *name || lv.name == format!("[{name}_tdata]"))
                    {
                        lv.size = *data_size;
                    }
                }
            }
        }
    }
}

/// One observe → plan → apply round.
fn step(class: &DeviceClassConfig, obs: &mut Observed) {
    let plan = plan_device_class(class, obs);
    apply(obs, &plan.actions);
}

/// Runs observe → plan → apply until a plan has no actions; returns every plan made. Panics when that
/// takes more than three rounds with actions.
fn converge(class: &DeviceClassConfig, obs: &mut Observed) -> Vec<ClassPlan> {
    let mut plans = Vec::new();
    for _ in 0..4 {
        let plan = plan_device_class(class, obs);
        let done = plan.actions.is_empty();
        apply(obs, &plan.actions);
        plans.push(plan);
        if done {
            return plans;
        }
    }
    panic!("no fixpoint within 3 rounds: {plans:#?}");
}

fn action_paths(action: &Action) -> Vec<&str> {
    match action {
        Action::WipeDevice { path } | Action::CreatePhysicalVolume { path, .. } => vec![path],
        Action::CreateVolumeGroup { pvs, .. } | Action::ExtendVolumeGroup { pvs, .. } => {
            pvs.iter().map(String::as_str).collect()
        }
        Action::ReduceVolumeGroup { pvs, .. } => pvs.iter().map(String::as_str).collect(),
        Action::RemovePhysicalVolume { path } => vec![path],
        Action::CreateThinPool { .. }
        | Action::ExtendThinPool { .. }
        | Action::AdoptVolumeGroup { .. } => vec![],
    }
}

fn assert_wipes_only_waived(plan: &ClassPlan) {
    for action in &plan.actions {
        if let Action::WipeDevice { path } = action {
            let report = plan
                .devices
                .iter()
                .find(|d| d.canonical_path.as_deref() == Some(path.as_str()))
                .expect("wiped device is configured");
            match &report.verdict {
                DeviceVerdict::Usable { waived } => {
                    assert!(!waived.is_empty(), "{path} wiped without need");
                    assert!(waived.iter().all(ExclusionReason::waivable_by_force_wipe));
                }
                other => panic!("{path} wiped with verdict {other:?}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Building a class from scratch

#[test]
fn fresh_disks_get_physical_volumes_and_a_tagged_vg_but_no_pool_yet() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.add(Kind::Clean, 20 * GIB, true);
    let plan = plan_device_class(&thin_class("vg1", &[a.clone(), b]), &host.obs);
    assert_eq!(plan.state, ClassState::Progressing);
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: a.clone(),
                metadata_size: PV_METADATA_SIZE
            },
            Action::CreatePhysicalVolume {
                path: "/dev/vd2".into(),
                metadata_size: PV_METADATA_SIZE
            },
            Action::CreateVolumeGroup {
                name: "vg1".into(),
                pvs: vec![a, "/dev/vd2".into()],
                tags: vec!["lvms".into()]
            },
        ]
    );
    assert_eq!(plan.devices[1].path, "/dev/disk/by-id/virtio-serial2");
    assert_eq!(plan.devices[1].canonical_path.as_deref(), Some("/dev/vd2"));
    assert!(
        plan.devices
            .iter()
            .all(|d| d.verdict == DeviceVerdict::Usable { waived: vec![] })
    );
}

#[test]
fn pv_metadata_area_holds_more_than_two_thousand_volumes() {
    // ~290 bytes of VG metadata per LV; LVM keeps two copies of the metadata in the area (old + new).
    const { assert!(PV_METADATA_SIZE / 2 / 290 >= 2_000) };
}

#[test]
fn existing_vg_gets_a_thin_pool_of_size_percent_with_static_defaults() {
    let mut host = Host::default();
    let a = host.clean(100 * GIB);
    let class = thin_class("vg1", &[a]);
    step(&class, &mut host.obs);
    let vg = vg_of(&host.obs, "vg1").clone();
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(plan.state, ClassState::Progressing);
    assert_eq!(plan.devices[0].verdict, DeviceVerdict::Member);
    let expected = round_down_to_extent(vg.size * 90 / 100, EXTENT).unwrap();
    assert_eq!(
        plan.actions,
        vec![Action::CreateThinPool {
            vg: "vg1".into(),
            name: "thin-pool-1".into(),
            data_size: expected,
            chunk_size: Some(DEFAULT_CHUNK_SIZE),
            metadata_size: Some(DEFAULT_METADATA_SIZE),
            zero: true,
            raid: None,
        }]
    );
}

#[test]
fn thin_pool_is_capped_to_leave_room_for_metadata_and_its_spare() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let mut class = thin_class("vg1", &[a]);
    class.thin_pool_config.as_mut().unwrap().size_percent = 100;
    step(&class, &mut host.obs);
    let free = vg_of(&host.obs, "vg1").free;
    let plan = plan_device_class(&class, &host.obs);
    let Action::CreateThinPool { data_size, .. } = plan.actions[0] else {
        panic!("{plan:?}")
    };
    assert_eq!(data_size, free - 2 * GIB);
    apply(&mut host.obs, &plan.actions);
    assert_eq!(vg_of(&host.obs, "vg1").free, 0);
    let again = plan_device_class(&class, &host.obs);
    assert_eq!(again.state, ClassState::Ready);
    assert!(again.actions.is_empty());
}

#[test]
fn configured_chunk_and_metadata_sizes_are_used() {
    let mut host = Host::default();
    let a = host.clean(50 * GIB);
    let mut class = thin_class("vg1", &[a]);
    let tp = class.thin_pool_config.as_mut().unwrap();
    tp.chunk_size = Some(ByteSize(256 * KIB));
    tp.metadata_size = Some(ByteSize(512 * MIB));
    let plans = converge(&class, &mut host.obs);
    let Action::CreateThinPool {
        chunk_size,
        metadata_size,
        ..
    } = plans[1].actions[0]
    else {
        panic!("{plans:?}")
    };
    assert_eq!(chunk_size, Some(256 * KIB));
    assert_eq!(metadata_size, Some(512 * MIB));
}

#[test]
fn host_policies_leave_chunk_and_metadata_to_lvm_but_still_reserve_room() {
    let mut host = Host::default();
    let a = host.clean(20 * GIB);
    let mut class = thin_class("vg1", &[a]);
    let tp = class.thin_pool_config.as_mut().unwrap();
    tp.size_percent = 100;
    tp.chunk_size_calculation_policy = CalculationPolicy::Host;
    tp.metadata_size_calculation_policy = CalculationPolicy::Host;
    let plans = converge(&class, &mut host.obs);
    let Action::CreateThinPool {
        data_size,
        chunk_size,
        metadata_size,
        ..
    } = plans[1].actions[0]
    else {
        panic!("{plans:?}")
    };
    assert_eq!((chunk_size, metadata_size), (None, None));
    let vg_size = vg_of(&host.obs, "vg1").size;
    // 20 GiB of data at 64 KiB chunks needs 20 MiB of metadata (above the floor), twice.
    assert_eq!(data_size, vg_size - 2 * 20 * MIB);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
}

#[test]
fn host_metadata_policy_gives_small_pools_room_for_four_thousand_volumes() {
    // ~4 KiB of pool metadata per thin volume.
    const { assert!(MIN_HOST_METADATA_SIZE / (4 * KIB) >= 4_000) };
    let plan_for = |disk: u64| {
        let mut host = Host::default();
        let a = host.clean(disk);
        let mut class = thin_class("vg1", &[a]);
        let tp = class.thin_pool_config.as_mut().unwrap();
        tp.metadata_size_calculation_policy = CalculationPolicy::Host;
        let plans = converge(&class, &mut host.obs);
        let Some(Action::CreateThinPool {
            data_size,
            metadata_size,
            ..
        }) = plans.get(1).and_then(|p| p.actions.first())
        else {
            panic!("{disk}: {plans:#?}")
        };
        assert_eq!(plans.last().unwrap().state, ClassState::Ready);
        (*data_size, *metadata_size)
    };
    // 4 GiB: LVM would pick 4 MiB (~1,000 volumes); the floor applies.
    assert_eq!(plan_for(4 * GIB).1, Some(MIN_HOST_METADATA_SIZE));
    // 100 GiB: LVM's own choice (90 MiB) is larger than the floor and is left to LVM.
    assert_eq!(plan_for(100 * GIB).1, None);
}

#[test]
fn metadata_estimate_follows_lvm_bounds() {
    assert_eq!(thin_pool_metadata_estimate(0, None), 2 * MIB);
    assert_eq!(thin_pool_metadata_estimate(100 * GIB, None), 100 * MIB);
    assert_eq!(
        thin_pool_metadata_estimate(100 * crate::size::TIB, None),
        128 * MIB
    );
    assert_eq!(thin_pool_metadata_estimate(GIB, Some(128 * KIB)), 2 * MIB);
    assert_eq!(
        thin_pool_metadata_estimate(1024 * crate::size::TIB, Some(64 * KIB)),
        16 * GIB
    );
    assert_eq!(thin_pool_metadata_estimate(u64::MAX, Some(0)), 16 * GIB);
}

#[test]
fn vg_too_small_for_metadata_and_spare_fails_naming_the_sizes_and_the_fix() {
    let mut host = Host::default();
    let a = host.clean(2 * GIB);
    let class = thin_class("vg1", &[a]);
    let plans = converge(&class, &mut host.obs);
    let last = plans.last().unwrap();
    let reason = failed_reason(last);
    for part in [
        "1836Mi of data was requested (thinPoolConfig.sizePercent 90%)",
        "metadata (1Gi, thinPoolConfig.metadataSize)",
        "spare (1Gi)",
        "2040Mi free (2040Mi on its one LVM physical volume)",
        "lower thinPoolConfig.metadataSize, or add devices",
    ] {
        assert!(reason.contains(part), "{part:?} not in {reason}");
    }
    assert!(last.actions.is_empty());
}

#[test]
fn two_2gib_disks_with_default_metadata_get_a_pool_lvm_can_place_then_grow_it_into_the_rest() {
    // The issue's case: lvcreate --size 2130706432b (all free extents but metadata and spare) aborted
    // lvm2. The spare takes 1 GiB of one disk; the metadata then fits only on the other, behind the data.
    let mut host = Host::default();
    let paths = vec![host.clean(2 * GIB), host.clean(2 * GIB)];
    let class = thin_class("vg1", &paths);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    let Action::CreateThinPool {
        data_size,
        metadata_size,
        ..
    } = plans[1].actions[0]
    else {
        panic!("{plans:#?}")
    };
    assert_eq!(metadata_size, Some(GIB));
    assert_eq!(data_size, 2040 * MIB - GIB);
    // The next round grows the data into the rest: extending places no metadata.
    assert_eq!(
        plans[2].actions,
        vec![Action::ExtendThinPool {
            vg: "vg1".into(),
            name: "thin-pool-1".into(),
            data_size: 2 * 2040 * MIB - 2 * GIB
        }]
    );
    assert_eq!(plans.len(), 4);
    assert_eq!(vg_of(&host.obs, "vg1").free_count, 0);
}

#[test]
fn three_2gib_disks_with_default_metadata_use_every_free_extent() {
    let mut host = Host::default();
    let paths = vec![
        host.clean(2 * GIB),
        host.clean(2 * GIB),
        host.clean(2 * GIB),
    ];
    let plans = converge(&thin_class("vg1", &paths), &mut host.obs);
    let Action::CreateThinPool { data_size, .. } = plans[1].actions[0] else {
        panic!("{plans:#?}")
    };
    assert_eq!(data_size, 3 * 2040 * MIB - 2 * GIB);
    assert_eq!(vg_of(&host.obs, "vg1").free_count, 0);
}

#[test]
fn a_thin_pool_in_the_group_means_its_spare_exists_and_is_not_reserved_again() {
    let mut host = Host::default();
    let paths = vec![host.clean(2 * GIB), host.clean(2 * GIB)];
    let class = thin_class("vg1", &paths);
    step(&class, &mut host.obs);
    let mut other = new_lv("vg1", "other", 4 * EXTENT, "twi-a-tz--", "thin-pool");
    other.metadata_size = Some(GIB);
    host.obs.lvs.push(other);
    let plan = plan_device_class(&class, &host.obs);
    let Action::CreateThinPool { data_size, .. } = plan.actions[0] else {
        panic!("{plan:#?}")
    };
    // Metadata on one disk, data on the rest: only the metadata is reserved.
    assert_eq!(data_size, 2 * 2040 * MIB - GIB);
}

#[test]
fn size_percent_below_one_extent_fails() {
    let mut g = crate::filter::tests::vg("vg1", &[VG_OWNER_TAG]);
    g.size = 8 * MIB;
    g.extent_count = 2;
    g.free_count = 2;
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    host.obs.pvs.push(new_pv(&a, 10 * GIB, Some("vg1")));
    host.obs.vgs.push(g);
    let mut class = thin_class("vg1", &[a]);
    class.thin_pool_config.as_mut().unwrap().size_percent = 10;
    let plan = plan_device_class(&class, &host.obs);
    assert!(failed_reason(&plan).contains("less than one extent"));
    assert!(plan.actions.is_empty());
}

#[test]
fn converged_class_is_ready_and_plans_nothing_again() {
    let mut host = Host::default();
    let paths = vec![host.clean(10 * GIB), host.clean(10 * GIB)];
    let class = thin_class("vg1", &paths);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.len(), 3, "vg, then pool, then nothing");
    assert_eq!(plans[2].state, ClassState::Ready);
    for _ in 0..3 {
        let p = plan_device_class(&class, &host.obs);
        assert!(p.actions.is_empty());
        assert_eq!(p.state, ClassState::Ready);
        assert!(p.devices.iter().all(|d| d.verdict == DeviceVerdict::Member));
    }
    assert!(lv_of(&host.obs, "vg1", "thin-pool-1").is_some());
}

#[test]
fn thick_class_is_ready_once_the_vg_exists() {
    let mut host = Host::default();
    let class = class("vg1", &[host.clean(10 * GIB)]);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.len(), 2);
    assert_eq!(plans[1].state, ClassState::Ready);
    assert!(host.obs.lvs.is_empty(), "no pool for a thick class");
}

// ---------------------------------------------------------------------------------------------------------
// Growing

#[test]
fn new_device_extends_our_vg_then_the_pool_grows() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let mut class = thin_class("vg1", &[a]);
    converge(&class, &mut host.obs);
    let before = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap().size;

    let b = host.clean(10 * GIB);
    class.device_selector.paths.push(b.clone());
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(plan.state, ClassState::Progressing);
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: b.clone(),
                metadata_size: PV_METADATA_SIZE
            },
            Action::ExtendVolumeGroup {
                name: "vg1".into(),
                pvs: vec![b]
            },
        ],
        "the pool waits for the next observation"
    );
    apply(&mut host.obs, &plan.actions);

    let plan = plan_device_class(&class, &host.obs);
    let vg = vg_of(&host.obs, "vg1");
    let target = round_down_to_extent(vg.size * 90 / 100, EXTENT).unwrap();
    assert_eq!(
        plan.actions,
        vec![Action::ExtendThinPool {
            vg: "vg1".into(),
            name: "thin-pool-1".into(),
            data_size: target
        }]
    );
    assert!(target > before);
    apply(&mut host.obs, &plan.actions);
    assert_eq!(
        plan_device_class(&class, &host.obs).state,
        ClassState::Ready
    );
}

#[test]
fn pool_extension_is_capped_by_free_space() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let mut class = thin_class("vg1", from_ref(&a));
    class.thin_pool_config.as_mut().unwrap().size_percent = 100;
    converge(&class, &mut host.obs);
    // At 100 % the pool's target includes the space its metadata took: growth is bounded by free space.
    class.device_selector.paths.push(host.clean(10 * GIB));
    step(&class, &mut host.obs);
    let pool = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap().size;
    let vg = vg_of(&host.obs, "vg1").clone();
    let plan = plan_device_class(&class, &host.obs);
    let Action::ExtendThinPool { data_size, .. } = plan.actions[0] else {
        panic!("{plan:?}")
    };
    assert!(data_size < vg.size, "below the 100 % target");
    assert_eq!(data_size, pool + vg.free);
    apply(&mut host.obs, &plan.actions);
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.state, ClassState::Ready);
}

#[test]
fn pool_one_extent_below_target_is_extended_and_at_target_is_ready() {
    let mut host = Host::default();
    let class = thin_class("vg1", &[host.clean(100 * GIB)]);
    converge(&class, &mut host.obs);
    let target = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap().size;
    assert_eq!(
        plan_device_class(&class, &host.obs).state,
        ClassState::Ready
    );
    // Observe the pool one extent smaller (and that extent free).
    for lv in host.obs.lvs.iter_mut().filter(|l| l.name == "thin-pool-1") {
        lv.size -= EXTENT;
    }
    let g = host.obs.vgs.iter_mut().find(|v| v.name == "vg1").unwrap();
    g.free_count += 1;
    g.free += EXTENT;
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(
        plan.actions,
        vec![Action::ExtendThinPool {
            vg: "vg1".into(),
            name: "thin-pool-1".into(),
            data_size: target
        }]
    );
}

#[test]
fn pool_larger_than_target_is_never_shrunk() {
    let mut host = Host::default();
    let mut class = thin_class("vg1", &[host.clean(10 * GIB)]);
    converge(&class, &mut host.obs);
    class.thin_pool_config.as_mut().unwrap().size_percent = 10;
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.state, ClassState::Ready);
}

#[test]
fn orphan_physical_volume_is_reused_without_pvcreate() {
    let mut host = Host::default();
    let a = host.add(Kind::OrphanPv, 10 * GIB, false);
    let plan = plan_device_class(&class("vg1", from_ref(&a)), &host.obs);
    assert_eq!(
        plan.actions,
        vec![Action::CreateVolumeGroup {
            name: "vg1".into(),
            pvs: vec![a],
            tags: vec![VG_OWNER_TAG.into()]
        }]
    );
}

#[test]
fn interrupted_run_resumes_from_what_was_done() {
    let mut host = Host::default();
    let a = host.add(Kind::Ext4, 10 * GIB, false);
    let mut class = thin_class("vg1", from_ref(&a));
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    // Only the wipe and the pvcreate ran before a crash.
    apply(&mut host.obs, &plan.actions[..2]);
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(
        plan.actions,
        vec![Action::CreateVolumeGroup {
            name: "vg1".into(),
            pvs: vec![a],
            tags: vec![VG_OWNER_TAG.into()]
        }]
    );
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
}

// ---------------------------------------------------------------------------------------------------------
// Refusals

#[test]
fn vg_with_our_name_but_without_our_tag_is_failed_and_untouched() {
    let mut host = Host::default();
    let a = host.add(Kind::ForeignPv, 10 * GIB, false);
    let b = host.clean(10 * GIB);
    let mut class = thin_class(FOREIGN_VG, &[a, b]);
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("volume group data exists and is not ours"),
        "{reason}"
    );
    assert!(reason.contains("vgchange --addtag lvms data"), "{reason}");
    assert!(plan.actions.is_empty());
}

#[test]
fn existing_lv_with_the_pool_name_that_is_not_a_thin_pool_fails() {
    let mut host = Host::default();
    let class = thin_class("vg1", &[host.clean(10 * GIB)]);
    step(&class, &mut host.obs);
    host.obs
        .lvs
        .push(new_lv("vg1", "thin-pool-1", GIB, "-wi-a-----", "linear"));
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("vg1/thin-pool-1 exists and is not a thin pool"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());
}

#[test]
fn pool_name_conflict_stops_the_class_before_the_vg_grows() {
    let mut host = Host::default();
    let mut class = thin_class("vg1", &[host.clean(10 * GIB)]);
    step(&class, &mut host.obs);
    host.obs
        .lvs
        .push(new_lv("vg1", "thin-pool-1", GIB, "-wi-a-----", "linear"));
    class.device_selector.paths.push(host.clean(10 * GIB));
    let plan = plan_device_class(&class, &host.obs);
    assert!(failed_reason(&plan).contains("is not a thin pool"));
    assert!(plan.actions.is_empty());
}

#[test]
fn thin_pool_named_like_ours_in_another_vg_does_not_count() {
    let mut host = Host::default();
    let class = thin_class("vg1", &[host.clean(10 * GIB)]);
    step(&class, &mut host.obs);
    host.obs.lvs.push(new_lv(
        "other",
        "thin-pool-1",
        GIB,
        "twi-a-tz--",
        "thin-pool",
    ));
    let plan = plan_device_class(&class, &host.obs);
    assert!(matches!(plan.actions[..], [Action::CreateThinPool { .. }]));
}

#[test]
fn each_decoy_as_a_required_path_fails_the_class_with_no_actions() {
    for kind in Kind::ALL {
        for force in [false, true] {
            if kind.usable(force) {
                continue;
            }
            let mut host = Host::default();
            let good = host.clean(10 * GIB);
            let bad = host.add(kind, 10 * GIB, false);
            let mut class = thin_class("vg1", &[good, bad.clone()]);
            class
                .device_selector
                .force_wipe_devices_and_destroy_all_data = force;
            let plan = plan_device_class(&class, &host.obs);
            let reason = failed_reason(&plan);
            assert!(plan.actions.is_empty(), "{kind:?}: {plan:?}");
            assert!(reason.contains(&bad), "{kind:?}: {reason}");
            assert!(reason.contains("deviceSelector.paths"), "{reason}");
            assert!(
                matches!(plan.devices[1].verdict, DeviceVerdict::Excluded { .. }),
                "{kind:?}"
            );
        }
    }
}

#[test]
fn failure_names_every_bad_device_and_every_reason() {
    let mut host = Host::default();
    let mut d = disk("sdx", 10 * GIB);
    d.read_only = true;
    d.fstype = Some("ext4".into());
    d.mountpoints = vec!["/data".into()];
    host.obs
        .resolved
        .insert(d.path.clone(), Some(d.path.clone()));
    host.obs.devices.push(d);
    host.obs
        .resolved
        .insert("/dev/disk/by-id/gone".into(), None);
    let class = class("vg1", &["/dev/sdx".into(), "/dev/disk/by-id/gone".into()]);
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    for needle in [
        "/dev/sdx is read-only",
        "existing signature (ext4)",
        "mounted (/dev/sdx on /data)",
        "gone does not exist",
    ] {
        assert!(reason.contains(needle), "missing {needle:?} in {reason}");
    }
    assert_eq!(plan.devices[1].verdict, DeviceVerdict::Missing);
    assert_eq!(plan.devices[1].canonical_path, None);
}

#[test]
fn path_missing_from_the_resolution_map_is_missing() {
    let host = Host::default();
    let plan = plan_device_class(&class("vg1", &["/dev/nope".into()]), &host.obs);
    assert_eq!(plan.devices[0].verdict, DeviceVerdict::Missing);
    assert!(failed_reason(&plan).contains("/dev/nope does not exist"));
}

#[test]
fn decoys_as_optional_paths_are_reported_and_never_touched() {
    for force in [false, true] {
        let mut host = Host::default();
        let good = host.clean(10 * GIB);
        let decoys: Vec<(Kind, String)> = Kind::ALL
            .iter()
            .filter(|k| **k != Kind::Clean && **k != Kind::OrphanPv)
            .map(|k| (*k, host.add(*k, 10 * GIB, false)))
            .collect();
        let mut class = thin_class("vg1", from_ref(&good));
        class.device_selector.optional_paths = decoys.iter().map(|(_, p)| p.clone()).collect();
        class
            .device_selector
            .force_wipe_devices_and_destroy_all_data = force;
        let initial = plan_device_class(&class, &host.obs);
        let plans = converge(&class, &mut host.obs);
        assert_eq!(plans.last().unwrap().state, ClassState::Ready);
        let touched: BTreeSet<String> = plans
            .iter()
            .flat_map(|p| p.actions.iter().flat_map(action_paths))
            .map(str::to_owned)
            .collect();
        for (kind, path) in &decoys {
            let report = initial.devices.iter().find(|d| d.path == *path).unwrap();
            let canonical = report.canonical_path.clone().unwrap();
            assert_eq!(
                touched.contains(&canonical),
                kind.usable(force),
                "{kind:?} force={force}"
            );
            if !kind.usable(force) {
                assert!(
                    matches!(report.verdict, DeviceVerdict::Excluded { .. }),
                    "{kind:?}"
                );
            }
        }
        assert!(touched.contains(&good));
        plans.iter().for_each(assert_wipes_only_waived);
    }
}

#[test]
fn force_wipe_wipes_exactly_the_waivable_devices_then_pvcreates_them() {
    let mut host = Host::default();
    let ext4 = host.add(Kind::Ext4, 10 * GIB, false);
    let parted = host.add(Kind::Partitioned, 10 * GIB, false);
    let foreign = host.add(Kind::ForeignPv, 10 * GIB, false);
    let clean = host.clean(10 * GIB);
    let mut class = class(
        "vg1",
        &[ext4.clone(), parted.clone(), foreign.clone(), clean.clone()],
    );
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    let pvcreate = |p: &String| Action::CreatePhysicalVolume {
        path: p.clone(),
        metadata_size: PV_METADATA_SIZE,
    };
    assert_eq!(
        plan.actions,
        vec![
            Action::WipeDevice { path: ext4.clone() },
            Action::WipeDevice {
                path: parted.clone()
            },
            Action::WipeDevice {
                path: foreign.clone()
            },
            pvcreate(&ext4),
            pvcreate(&parted),
            pvcreate(&foreign),
            pvcreate(&clean),
            Action::CreateVolumeGroup {
                name: "vg1".into(),
                pvs: vec![ext4, parted, foreign, clean],
                tags: vec![VG_OWNER_TAG.into()]
            },
        ]
    );
    assert_wipes_only_waived(&plan);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
}

#[test]
fn force_wipe_wipes_a_device_once_and_refuses_it_when_it_holds_data_again() {
    let mut host = Host::default();
    let ext4 = host.add(Kind::Ext4, 10 * GIB, false);
    let other = host.add(Kind::Ext4, 10 * GIB, false);
    let mut class = class("vg1", from_ref(&ext4));
    class.device_selector.optional_paths = vec![other.clone()];
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    // Recorded as wiped before: `ext4` holds a signature again, so it is refused and nothing is done.
    host.obs.wiped = [ext4.clone()].into();
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    match &plan.devices[0].verdict {
        DeviceVerdict::Excluded { reasons } => {
            assert_eq!(
                reasons
                    .iter()
                    .map(ExclusionReason::code)
                    .collect::<Vec<_>>(),
                ["filesystemSignature", "wipedOnce"]
            );
        }
        v => panic!("{v:?}"),
    }
    let reason = failed_reason(&plan);
    assert!(reason.contains("never wipes a device twice"), "{reason}");
    assert!(reason.contains(&ext4), "{reason}");
    // A device not in the record is still wiped once.
    class.device_selector.paths = vec![other.clone()];
    class.device_selector.optional_paths.clear();
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(plan.actions[0], Action::WipeDevice { path: other });
    // Without force-wipe the record changes nothing: the signature alone excludes.
    class.device_selector.paths = vec![ext4];
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = false;
    match &plan_device_class(&class, &host.obs).devices[0].verdict {
        DeviceVerdict::Excluded { reasons } => {
            assert_eq!(
                reasons
                    .iter()
                    .map(ExclusionReason::code)
                    .collect::<Vec<_>>(),
                ["filesystemSignature"]
            );
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn force_wipe_never_wipes_members_of_our_vg() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let mut class = thin_class("vg1", &[a]);
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plans = converge(&class, &mut host.obs);
    assert!(
        plans
            .iter()
            .flat_map(|p| &p.actions)
            .all(|a| !matches!(a, Action::WipeDevice { .. }))
    );
    // Our pool's LVs now sit on the disk, mounted by pods: still a member, never wiped.
    let d = device_mut(&mut host.obs.devices, "/dev/vd1").unwrap();
    d.children.push(BlockDevice {
        kname: "dm-9".into(),
        path: "/dev/mapper/vg1-pvc".into(),
        kind: DeviceKind::Lvm,
        mountpoints: vec!["/var/lib/kubelet/pods/p/volumes/x".into()],
        ..disk("vg1-pvc", GIB)
    });
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty());
    assert_eq!(plan.devices[0].verdict, DeviceVerdict::Member);
    assert_eq!(plan.state, ClassState::Ready);
}

#[test]
fn optional_only_class_needs_one_usable_device() {
    let mut host = Host::default();
    let bad = host.add(Kind::Mounted, 10 * GIB, false);
    let gone = "/dev/disk/by-id/absent".to_owned();
    let mut class = class("vg1", &[]);
    class.device_selector.optional_paths = vec![bad.clone(), gone.clone()];
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    assert!(reason.contains("optionalPaths"), "{reason}");
    assert!(reason.contains(&bad) && reason.contains(&gone), "{reason}");

    let good = host.clean(10 * GIB);
    class.device_selector.optional_paths.push(good.clone());
    let plans = converge(&class, &mut host.obs);
    let last = plans.last().unwrap();
    assert_eq!(last.state, ClassState::Ready);
    assert!(last.devices.iter().all(|d| d.optional));
    assert!(matches!(
        last.devices[0].verdict,
        DeviceVerdict::Excluded { .. }
    ));
    assert_eq!(last.devices[1].verdict, DeviceVerdict::Missing);
    assert_eq!(last.devices[2].verdict, DeviceVerdict::Member);
}

#[test]
fn same_device_through_two_paths_is_used_once() {
    let mut host = Host::default();
    let link = host.add(Kind::Clean, 10 * GIB, true);
    let class_ = class("vg1", &[link.clone(), "/dev/vd1".into()]);
    let mut class_b = class_.clone();
    class_b.device_selector.optional_paths = vec![link];
    let plan = plan_device_class(&class_b, &host.obs);
    assert_eq!(
        plan.devices.len(),
        2,
        "a path listed twice is reported once"
    );
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: "/dev/vd1".into(),
                metadata_size: PV_METADATA_SIZE
            },
            Action::CreateVolumeGroup {
                name: "vg1".into(),
                pvs: vec!["/dev/vd1".into()],
                tags: vec![VG_OWNER_TAG.into()]
            },
        ]
    );
    assert!(!plan.devices[0].optional);
}

#[test]
fn disk_and_its_own_partition_both_configured_fail() {
    let mut host = Host::default();
    let parted = host.add(Kind::Partitioned, 10 * GIB, false);
    host.obs
        .resolved
        .insert("/dev/vd1p2".into(), Some("/dev/vd1p2".into()));
    let mut class = class("vg1", &[parted, "/dev/vd1p2".into()]);
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    assert!(failed_reason(&plan).contains("/dev/vd1p2 is part of /dev/vd1"));
    assert!(plan.actions.is_empty());
}

#[test]
fn partition_of_a_disk_is_usable_on_its_own() {
    let mut host = Host::default();
    host.add(Kind::Partitioned, 20 * GIB, false);
    host.obs
        .resolved
        .insert("/dev/vd1p2".into(), Some("/dev/vd1p2".into()));
    let class = class("vg1", &["/dev/vd1p2".into()]);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    assert_eq!(plans[0].actions.len(), 2);
}

#[test]
fn partial_vg_fails() {
    let mut host = Host::default();
    let class = class("vg1", &[host.clean(10 * GIB)]);
    converge(&class, &mut host.obs);
    host.obs.vgs[0].attr = "wz-pn-".into();
    let plan = plan_device_class(&class, &host.obs);
    assert!(failed_reason(&plan).contains("vgreduce --removemissing vg1"));
}

// ---------------------------------------------------------------------------------------------------------
// Configuration errors

#[test]
fn invalid_names_and_settings_fail_without_actions() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let mut cases: Vec<(DeviceClassConfig, &str)> = Vec::new();
    cases.push((class("-bad", from_ref(&a)), "device class name"));
    let mut c = class("vg1", &[]);
    c.device_selector.force_wipe_devices_and_destroy_all_data = true;
    cases.push((c, "without device paths"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().name = "pool_tmeta".into();
    cases.push((c, "thinPoolConfig.name"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().size_percent = 5;
    cases.push((c, "thinPoolConfig.sizePercent"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().size_percent = 101;
    cases.push((c, "thinPoolConfig.sizePercent"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().chunk_size = Some(ByteSize(100 * KIB));
    cases.push((c, "thinPoolConfig.chunkSize"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().chunk_size = Some(ByteSize(2 * GIB));
    cases.push((c, "thinPoolConfig.chunkSize"));
    let mut c = thin_class("vg1", from_ref(&a));
    let tp = c.thin_pool_config.as_mut().unwrap();
    tp.chunk_size_calculation_policy = CalculationPolicy::Host;
    tp.chunk_size = Some(ByteSize(128 * KIB));
    cases.push((c, "chunkSizeCalculationPolicy is Host"));
    let mut c = thin_class("vg1", from_ref(&a));
    let tp = c.thin_pool_config.as_mut().unwrap();
    tp.metadata_size_calculation_policy = CalculationPolicy::Host;
    tp.metadata_size = Some(ByteSize(GIB));
    cases.push((c, "metadataSizeCalculationPolicy is Host"));
    let mut c = thin_class("vg1", from_ref(&a));
    c.thin_pool_config.as_mut().unwrap().metadata_size = Some(ByteSize(0));
    cases.push((c, "thinPoolConfig.metadataSize is 0"));

    for (class, needle) in cases {
        let plan = plan_device_class(&class, &host.obs);
        let reason = failed_reason(&plan);
        assert!(reason.contains(needle), "{needle:?} not in {reason:?}");
        assert!(plan.actions.is_empty());
    }
}

// ---------------------------------------------------------------------------------------------------------
// RAID

#[test]
fn raid_minimum_device_counts() {
    let r = |raid_type, mirrors, stripes| RaidConfig {
        raid_type,
        mirrors,
        stripes,
        stripe_size: None,
    };
    assert_eq!(raid_min_devices(&r(RaidType::Raid1, None, None)), 2);
    assert_eq!(raid_min_devices(&r(RaidType::Raid1, Some(2), None)), 3);
    assert_eq!(raid_min_devices(&r(RaidType::Raid4, None, None)), 3);
    assert_eq!(raid_min_devices(&r(RaidType::Raid5, None, Some(4))), 5);
    assert_eq!(raid_min_devices(&r(RaidType::Raid6, None, None)), 5);
    assert_eq!(raid_min_devices(&r(RaidType::Raid6, None, Some(4))), 6);
    assert_eq!(raid_min_devices(&r(RaidType::Raid10, None, None)), 4);
    assert_eq!(raid_min_devices(&r(RaidType::Raid10, Some(2), None)), 6);
    assert_eq!(raid_min_devices(&r(RaidType::Raid10, None, Some(3))), 6);
    assert_eq!(
        raid_min_devices(&r(RaidType::Raid1, Some(u32::MAX), None)),
        u64::from(u32::MAX) + 1
    );
}

#[test]
fn raid_class_with_too_few_usable_devices_fails() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.add(Kind::Mounted, 10 * GIB, false);
    let mut class = raid_class("vg1", &[a], RaidType::Raid1);
    class.device_selector.optional_paths = vec![b];
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("raid1 with 2 devices at least, but only 1 usable"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());
}

#[test]
fn raid_class_gets_only_the_volume_group() {
    let mut host = Host::default();
    let paths: Vec<String> = (0..5).map(|_| host.clean(10 * GIB)).collect();
    for raid_type in [
        RaidType::Raid1,
        RaidType::Raid5,
        RaidType::Raid6,
        RaidType::Raid10,
    ] {
        let mut obs = host.obs.clone();
        let class = raid_class("vg1", &paths, raid_type);
        let plans = converge(&class, &mut obs);
        assert_eq!(
            plans.last().unwrap().state,
            ClassState::Ready,
            "{raid_type:?}"
        );
        assert!(obs.lvs.is_empty());
        assert!(
            plans
                .iter()
                .flat_map(|p| &p.actions)
                .all(|a| !matches!(a, Action::CreateThinPool { .. }))
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// Serialisation

#[test]
fn actions_and_reports_serialise_in_camel_case() {
    let a = Action::CreateThinPool {
        vg: "vg1".into(),
        name: "p".into(),
        data_size: GIB,
        chunk_size: None,
        metadata_size: Some(GIB),
        zero: true,
        raid: None,
    };
    let v = serde_json::to_value(&a).unwrap();
    assert!(v.get("raid").is_none(), "{v}");
    assert_eq!(v["action"], "createThinPool");
    assert_eq!(v["dataSize"], GIB);
    assert_eq!(v["metadataSize"], GIB);
    assert!(v["chunkSize"].is_null());
    let v = serde_json::to_value(Action::CreatePhysicalVolume {
        path: "/dev/x".into(),
        metadata_size: PV_METADATA_SIZE,
    })
    .unwrap();
    assert_eq!(v["action"], "createPhysicalVolume");
    assert_eq!(v["metadataSize"], PV_METADATA_SIZE);

    let mut host = Host::default();
    let bad = host.add(Kind::Ext4, 10 * GIB, false);
    let plan = plan_device_class(&class("vg1", &[bad]), &host.obs);
    let v = serde_json::to_value(&plan).unwrap();
    assert_eq!(v["state"]["state"], "failed");
    assert_eq!(v["devices"][0]["verdict"]["verdict"], "excluded");
    assert_eq!(
        v["devices"][0]["verdict"]["reasons"][0]["code"],
        "filesystemSignature"
    );
    assert_eq!(v["devices"][0]["canonicalPath"], "/dev/vd1");
    let back: ClassPlan = serde_json::from_value(v).unwrap();
    assert_eq!(back, plan);
}

// ---------------------------------------------------------------------------------------------------------
// Property: any host converges in at most three rounds, never touches a decoy, and then stays put.

#[derive(Debug, Clone)]
struct DeviceSpec {
    kind: Kind,
    size_gib: u64,
    optional: bool,
    by_id: bool,
}

fn device_spec() -> impl Strategy<Value = DeviceSpec> {
    (
        // Clean disks weighted up so that about half the hosts can be built.
        prop_oneof![2 => Just(Kind::Clean), 3 => prop::sample::select(Kind::ALL.to_vec())],
        4u64..64,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(kind, size_gib, optional, by_id)| DeviceSpec {
            kind,
            size_gib,
            optional,
            by_id,
        })
}

#[derive(Debug, Clone, Copy)]
enum Layout {
    Thick,
    Thin {
        size_percent: u8,
        host_chunk: bool,
        host_metadata: bool,
    },
    Raid1,
}

fn layout() -> impl Strategy<Value = Layout> {
    prop_oneof![
        Just(Layout::Thick),
        (10u8..=100, any::<bool>(), any::<bool>()).prop_map(
            |(size_percent, host_chunk, host_metadata)| {
                Layout::Thin {
                    size_percent,
                    host_chunk,
                    host_metadata,
                }
            }
        ),
        Just(Layout::Raid1),
    ]
}

fn build_class(
    layout: Layout,
    paths: Vec<String>,
    optional: Vec<String>,
    force: bool,
) -> DeviceClassConfig {
    let mut c = class("vg1", &paths);
    c.device_selector.optional_paths = optional;
    c.device_selector.force_wipe_devices_and_destroy_all_data = force;
    match layout {
        Layout::Thick => {}
        Layout::Thin {
            size_percent,
            host_chunk,
            host_metadata,
        } => {
            let mut tp = thin_config();
            tp.size_percent = size_percent;
            if host_chunk {
                tp.chunk_size_calculation_policy = CalculationPolicy::Host;
            }
            if host_metadata {
                tp.metadata_size_calculation_policy = CalculationPolicy::Host;
            }
            c.thin_pool_config = Some(tp);
        }
        Layout::Raid1 => {
            c.raid_config = Some(RaidConfig {
                raid_type: RaidType::Raid1,
                mirrors: None,
                stripes: None,
                stripe_size: None,
            });
        }
    }
    c
}

/// Checks one converge run: decoys untouched, wipes waived, a failed plan has no actions, the fixpoint
/// is stable, and the final state is as expected.
fn check_run(
    class: &DeviceClassConfig,
    obs: &mut Observed,
    usable_canonical: &BTreeSet<String>,
    expect_ready: bool,
) -> Result<Vec<ClassPlan>, TestCaseError> {
    let plans = converge(class, obs);
    prop_assert!(plans.len() <= 4);
    for plan in &plans {
        if matches!(plan.state, ClassState::Failed { .. }) {
            prop_assert!(plan.actions.is_empty());
        }
        for action in &plan.actions {
            for path in action_paths(action) {
                prop_assert!(
                    usable_canonical.contains(path),
                    "{path} touched by {action:?}"
                );
            }
        }
        assert_wipes_only_waived(plan);
    }
    let last = plans.last().unwrap().clone();
    for _ in 0..2 {
        let again = plan_device_class(class, obs);
        prop_assert!(again.actions.is_empty());
        prop_assert_eq!(&again, &last);
    }
    if expect_ready {
        prop_assert_eq!(&last.state, &ClassState::Ready, "{:#?}", plans);
        for d in last.devices.iter().filter(|d| !d.optional) {
            prop_assert_eq!(&d.verdict, &DeviceVerdict::Member);
        }
        if let Some(tp) = &class.thin_pool_config {
            let pool = lv_of(obs, "vg1", &tp.name).expect("pool exists when ready");
            let vg = vg_of(obs, "vg1");
            prop_assert!(pool.size >= EXTENT);
            prop_assert!(pool.size <= vg.size * u64::from(tp.size_percent) / 100);
        }
    } else {
        prop_assert!(
            matches!(last.state, ClassState::Failed { .. }),
            "{:#?}",
            last
        );
        prop_assert_eq!(plans.len(), 1, "a failing class never acts");
    }
    Ok(plans)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The executor simulation checks every CreateThinPool against lvm2's allocation
    /// (`pool_fit::tests::always_created`): a planned pool always fits the group it was planned for.
    #[test]
    fn a_planned_thin_pool_always_fits_its_group_or_the_class_fails_saying_why(
        disks_mib in prop::collection::vec(1100u64..12_000, 1..=4),
        metadata_mib in prop_oneof![Just(None), (2u64..3_000).prop_map(Some)],
        size_percent in 10u8..=100,
    ) {
        let mut host = Host::default();
        let paths: Vec<String> = disks_mib.iter().map(|m| host.clean(m * MIB)).collect();
        let mut class = thin_class("vg1", &paths);
        let tp = class.thin_pool_config.as_mut().unwrap();
        tp.size_percent = size_percent;
        tp.metadata_size = metadata_mib.map(|m| ByteSize(m * MIB));
        let plans = converge(&class, &mut host.obs);
        let last = plans.last().unwrap();
        match &last.state {
            ClassState::Ready => {
                let pool = lv_of(&host.obs, "vg1", "thin-pool-1").expect("pool exists when ready");
                let vg = vg_of(&host.obs, "vg1");
                prop_assert!(pool.size <= vg.size * u64::from(size_percent) / 100);
            }
            ClassState::Failed { reason } => {
                prop_assert!(reason.contains("does not fit"), "{}", reason);
                prop_assert!(lv_of(&host.obs, "vg1", "thin-pool-1").is_none());
            }
            other => prop_assert!(false, "not converged: {:?} {:#?}", other, plans),
        }
    }

    #[test]
    fn any_host_converges_within_three_rounds_and_never_touches_decoys(
        specs in prop::collection::vec(device_spec(), 1..7),
        layout in layout(),
        force in any::<bool>(),
        extra_gib in 4u64..64,
    ) {
        let mut host = Host::default();
        let mut paths = Vec::new();
        let mut optional = Vec::new();
        let mut usable = BTreeSet::new();
        let mut mandatory_ok = true;
        let mut selected = 0u64;
        for spec in &specs {
            let path = host.add(spec.kind, spec.size_gib * GIB, spec.by_id);
            let canonical = host.obs.resolved[&path].clone().unwrap();
            let ok = spec.kind.usable(force);
            if ok {
                usable.insert(canonical);
                selected += 1;
            }
            if spec.optional {
                optional.push(path);
            } else {
                mandatory_ok &= ok;
                paths.push(path);
            }
        }
        let raid_ok = !matches!(layout, Layout::Raid1) || selected >= 2;
        let expect_ready = mandatory_ok && selected > 0 && raid_ok;
        let class = build_class(layout, paths.clone(), optional.clone(), force);
        let mut obs = host.obs.clone();
        check_run(&class, &mut obs, &usable, expect_ready)?;

        if expect_ready {
            // A disk added later: extend the VG, then the pool, and settle again.
            let pool_before = class
                .thin_pool_config
                .as_ref()
                .and_then(|tp| lv_of(&obs, "vg1", &tp.name))
                .map(|l| l.size);
            host.obs = obs;
            let new = host.clean(extra_gib * GIB);
            usable.insert(new.clone());
            let mut paths = paths;
            paths.push(new);
            let class = build_class(layout, paths, optional, force);
            let mut obs = host.obs.clone();
            let plans = check_run(&class, &mut obs, &usable, true)?;
            let extends = matches!(plans[0].actions.last(), Some(Action::ExtendVolumeGroup { .. }));
            prop_assert!(extends, "{:?}", plans[0]);
            if let (Some(before), Some(tp)) = (pool_before, &class.thin_pool_config) {
                prop_assert!(lv_of(&obs, "vg1", &tp.name).unwrap().size >= before);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Discovery: a class without device paths

/// Codes of a report's exclusion reasons, by path.
fn excluded(plan: &ClassPlan) -> BTreeMap<String, Vec<&'static str>> {
    plan.devices
        .iter()
        .filter_map(|d| match &d.verdict {
            DeviceVerdict::Excluded { reasons } => Some((
                d.path.clone(),
                reasons.iter().map(ExclusionReason::code).collect(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_class_without_paths_takes_every_free_whole_disk_and_nothing_else() {
    let mut host = Host::default();
    let paths: BTreeMap<Kind, String> = Kind::ALL
        .iter()
        .map(|k| (*k, host.add(*k, 10 * GIB, false)))
        .collect();
    let zram = BlockDevice {
        kname: "zram0".into(),
        path: "/dev/zram0".into(),
        ..disk("zram0", 10 * GIB)
    };
    host.obs.devices.push(zram);
    let listed_elsewhere = host.clean(10 * GIB);
    host.obs.claimed = [listed_elsewhere.clone()].into();
    let mut class = thin_class("vg1", &[]);
    class.device_discovery_policy = DiscoveryPolicy::Dynamic;

    let plan = plan_device_class(&class, &host.obs);
    let clean = paths[&Kind::Clean].clone();
    let orphan = paths[&Kind::OrphanPv].clone();
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: clean.clone(),
                metadata_size: PV_METADATA_SIZE,
            },
            Action::CreateVolumeGroup {
                name: "vg1".into(),
                pvs: vec![clean.clone(), orphan.clone()],
                tags: vec![VG_OWNER_TAG.into()],
            },
        ]
    );
    // Every other whole disk is reported with its reasons; loop and device-mapper devices, zram and
    // the disk another class lists are not considered at all.
    let reported: Vec<&str> = plan.devices.iter().map(|d| d.path.as_str()).collect();
    assert!(!reported.contains(&"/dev/zram0"), "{reported:?}");
    assert!(
        !reported.contains(&listed_elsewhere.as_str()),
        "{reported:?}"
    );
    assert!(
        !reported.contains(&paths[&Kind::Dm].as_str()),
        "{reported:?}"
    );
    assert!(plan.devices.iter().all(|d| d.optional));
    let excluded = excluded(&plan);
    for (kind, codes) in [
        (Kind::Ext4, vec!["filesystemSignature"]),
        (
            Kind::Partitioned,
            vec!["hasChildren", "filesystemSignature"],
        ),
        (Kind::ForeignPv, vec!["physicalVolumeInOtherVg"]),
        (Kind::ReadOnly, vec!["readOnly"]),
        (Kind::Small, vec!["tooSmall"]),
    ] {
        assert_eq!(excluded.get(&paths[&kind]), Some(&codes), "{kind:?}");
    }
    assert!(excluded[&paths[&Kind::Mounted]].contains(&"mounted"));
    assert_wipes_only_waived(&plan);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
}

#[test]
fn static_discovery_stops_once_the_group_exists_and_dynamic_adds_later_disks() {
    let mut host = Host::default();
    let first = host.clean(10 * GIB);
    let mut class = thin_class("vg1", &[]);
    assert_eq!(class.device_discovery_policy, DiscoveryPolicy::Static);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    assert_eq!(vg_of(&host.obs, "vg1").pv_count, 1);

    // A disk attached later: Static leaves it alone and reports only its member disk.
    let later = host.clean(10 * GIB);
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.state, ClassState::Ready);
    assert_eq!(
        plan.devices
            .iter()
            .map(|d| (d.path.as_str(), d.verdict.clone()))
            .collect::<Vec<_>>(),
        [(first.as_str(), DeviceVerdict::Member)]
    );

    // Dynamic adds it.
    class.device_discovery_policy = DiscoveryPolicy::Dynamic;
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: later.clone(),
                metadata_size: PV_METADATA_SIZE,
            },
            Action::ExtendVolumeGroup {
                name: "vg1".into(),
                pvs: vec![later],
            },
        ]
    );
}

#[test]
fn discovery_that_finds_no_free_disk_fails_with_the_reasons_and_the_fix() {
    let mut host = Host::default();
    let ext4 = host.add(Kind::Ext4, 10 * GIB, false);
    let plan = plan_device_class(&thin_class("vg1", &[]), &host.obs);
    assert!(plan.actions.is_empty());
    let reason = failed_reason(&plan);
    assert!(reason.contains("lists no device paths"), "{reason}");
    assert!(reason.contains(&ext4), "{reason}");
    assert!(reason.contains("deviceSelector.paths"), "{reason}");

    // Force-wipe needs paths: a discovered disk is never wiped.
    let mut class = thin_class("vg1", &[]);
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty());
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("forceWipeDevicesAndDestroyAllData without device paths"),
        "{reason}"
    );
}

// ---------------------------------------------------------------------------------------------------------
// Device patterns

fn pattern_class(name: &str, patterns: &[&str]) -> DeviceClassConfig {
    let mut class = thin_class(name, &[]);
    class.device_selector.device_patterns = patterns.iter().map(|p| (*p).to_owned()).collect();
    class
}

#[test]
fn a_pattern_that_matches_every_decoy_takes_only_the_usable_devices_and_names_itself() {
    let mut host = Host::default();
    let paths: BTreeMap<Kind, String> = Kind::ALL
        .iter()
        .map(|k| (*k, host.add(*k, 10 * GIB, false)))
        .collect();
    // `/dev/vd*` matches every disk of the fixture (vdN), its partitions (vdNp1) too.
    let class = pattern_class("vg1", &["/dev/vd*"]);
    let plan = plan_device_class(&class, &host.obs);
    let clean = paths[&Kind::Clean].clone();
    let orphan = paths[&Kind::OrphanPv].clone();
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: clean.clone(),
                metadata_size: PV_METADATA_SIZE,
            },
            Action::CreateVolumeGroup {
                name: "vg1".into(),
                pvs: vec![clean.clone(), orphan],
                tags: vec![VG_OWNER_TAG.into()],
            },
        ]
    );
    assert_wipes_only_waived(&plan);
    let excluded = excluded(&plan);
    for kind in [
        Kind::Ext4,
        Kind::Partitioned,
        Kind::ForeignPv,
        Kind::Mounted,
        Kind::ReadOnly,
        Kind::Small,
    ] {
        assert!(
            excluded.contains_key(&paths[&kind]),
            "{kind:?}: {excluded:?}"
        );
    }
    // The partitions of the partitioned disk match too, but a pattern that matches a disk takes
    // none of its partitions, not even the blank one.
    let partitioned = paths[&Kind::Partitioned].clone();
    assert_eq!(
        excluded[&format!("{partitioned}p1")],
        ["filesystemSignature", "partitionOfMatchedDisk"]
    );
    assert_eq!(
        excluded[&format!("{partitioned}p2")],
        ["partitionOfMatchedDisk"]
    );
    // Every report names the pattern; messages carry it.
    for d in &plan.devices {
        assert_eq!(d.pattern.as_deref(), Some("/dev/vd*"), "{d:?}");
        assert!(d.optional);
    }
    let ext4 = plan
        .devices
        .iter()
        .find(|d| d.path == paths[&Kind::Ext4])
        .unwrap();
    assert!(
        ext4.problems()
            .contains("matched by devicePatterns /dev/vd*"),
        "{}",
        ext4.problems()
    );
    // The loop and device-mapper devices do not match `/dev/vd*`.
    assert!(
        !plan
            .devices
            .iter()
            .any(|d| d.path == paths[&Kind::Dm] || d.path == paths[&Kind::KubeletLoop]),
        "{:?}",
        plan.devices
    );
}

#[test]
fn patterns_match_by_id_links_and_partitions_and_report_the_name_that_matched() {
    let mut host = Host::default();
    let by_id = host.add(Kind::Clean, 10 * GIB, true);
    let other = host.clean(10 * GIB);
    let mut partitioned = disk("sdz", 20 * GIB);
    partitioned.fstype = Some("gpt".into());
    partitioned.children = vec![part("sdz1", 10 * GIB), part("sdz2", 10 * GIB)];
    host.obs.devices.push(partitioned);

    let class = pattern_class(
        "vg1",
        &[
            "/dev/disk/by-id/virtio-serial*",
            "/dev/sdz2 , /dev/nomatch[0-9]",
        ],
    );
    let plan = plan_device_class(&class, &host.obs);
    let reports: Vec<(&str, Option<&str>, Option<&str>)> = plan
        .devices
        .iter()
        .map(|d| {
            (
                d.path.as_str(),
                d.canonical_path.as_deref(),
                d.pattern.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        reports,
        [
            (
                by_id.as_str(),
                Some("/dev/vd1"),
                Some("/dev/disk/by-id/virtio-serial*")
            ),
            ("/dev/sdz2", Some("/dev/sdz2"), Some("/dev/sdz2")),
        ],
        "{other} matches no pattern"
    );
    assert_eq!(
        plan.actions.last(),
        Some(&Action::CreateVolumeGroup {
            name: "vg1".into(),
            pvs: vec!["/dev/vd1".into(), "/dev/sdz2".into()],
            tags: vec![VG_OWNER_TAG.into()],
        })
    );
}

#[test]
fn static_patterns_stop_once_the_group_exists_dynamic_adds_later_matches_and_members_stay() {
    let mut host = Host::default();
    let first = host.clean(10 * GIB);
    let mut class = pattern_class("vg1", &["/dev/vd*"]);
    assert_eq!(class.device_discovery_policy, DiscoveryPolicy::Static);
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);

    let later = host.clean(10 * GIB);
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(
        plan.devices
            .iter()
            .map(|d| (d.path.as_str(), d.verdict.clone()))
            .collect::<Vec<_>>(),
        [(first.as_str(), DeviceVerdict::Member)]
    );

    class.device_discovery_policy = DiscoveryPolicy::Dynamic;
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: later.clone(),
                metadata_size: PV_METADATA_SIZE,
            },
            Action::ExtendVolumeGroup {
                name: "vg1".into(),
                pvs: vec![later.clone()],
            },
        ]
    );

    // A pattern that no longer matches the member: it stays in the group, reported without a
    // pattern, and nothing is reduced.
    let class = pattern_class("vg1", &["/dev/sd*"]);
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.state, ClassState::Ready);
    assert_eq!(
        plan.devices
            .iter()
            .map(|d| (d.path.as_str(), d.pattern.as_deref(), d.verdict.clone()))
            .collect::<Vec<_>>(),
        [(first.as_str(), None, DeviceVerdict::Member)]
    );
}

#[test]
fn patterns_combine_with_paths_skip_what_other_classes_claim_and_never_wipe() {
    let mut host = Host::default();
    let ext4 = host.add(Kind::Ext4, 10 * GIB, false);
    let listed = host.clean(10 * GIB);
    let claimed = host.clean(10 * GIB);
    let matched = host.clean(10 * GIB);
    host.obs.claimed = [claimed.clone()].into();
    let mut class = pattern_class("vg1", &["/dev/vd*"]);
    class.device_selector.paths = vec![listed.clone(), ext4.clone()];
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    // The listed ext4 disk is wiped (force-wipe applies to paths); nothing matched is.
    assert_eq!(plan.actions[0], Action::WipeDevice { path: ext4.clone() });
    assert_eq!(
        plan.actions.last(),
        Some(&Action::CreateVolumeGroup {
            name: "vg1".into(),
            pvs: vec![listed.clone(), ext4.clone(), matched.clone()],
            tags: vec![VG_OWNER_TAG.into()],
        })
    );
    let reported: Vec<(&str, Option<&str>)> = plan
        .devices
        .iter()
        .map(|d| (d.path.as_str(), d.pattern.as_deref()))
        .collect();
    assert_eq!(
        reported,
        [
            (listed.as_str(), None),
            (ext4.as_str(), None),
            (matched.as_str(), Some("/dev/vd*")),
        ],
        "listed devices are reported once, as paths; {claimed} is another class's"
    );

    // What other classes match is claimed.
    assert_eq!(
        matched_by(&host.obs.devices, &["/dev/vd[34]".to_owned()]),
        BTreeSet::from([claimed, matched])
    );
}

#[test]
fn patterns_that_select_nothing_usable_or_do_not_compile_fail_the_class_naming_them() {
    let mut host = Host::default();
    let ext4 = host.add(Kind::Ext4, 10 * GIB, false);
    let plan = plan_device_class(&pattern_class("vg1", &["/dev/vd*"]), &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("no device that deviceSelector.devicePatterns (/dev/vd*) matches"),
        "{reason}"
    );
    assert!(reason.contains(&ext4), "{reason}");

    let plan = plan_device_class(&pattern_class("vg1", &["/dev/nvme*"]), &host.obs);
    assert!(
        failed_reason(&plan).contains("nothing matched on this node"),
        "{}",
        failed_reason(&plan)
    );

    let plan = plan_device_class(&pattern_class("vg1", &["/dev/sd[b"]), &host.obs);
    assert!(plan.actions.is_empty());
    assert!(
        failed_reason(&plan)
            .contains("deviceSelector.devicePatterns: \"/dev/sd[b\" is not a valid pattern"),
        "{}",
        failed_reason(&plan)
    );

    let mut class = pattern_class("vg1", &["/dev/vd*"]);
    class
        .device_selector
        .force_wipe_devices_and_destroy_all_data = true;
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty());
    assert!(
        failed_reason(&plan).contains("pattern-matched disks are never wiped"),
        "{}",
        failed_reason(&plan)
    );
}

// ---------------------------------------------------------------------------------------------------------
// A device removed from the configuration

#[test]
fn a_path_removed_from_the_spec_leaves_the_group_when_it_holds_no_data() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    let two = class("vg1", &[a.clone(), b.clone()]);
    converge(&two, &mut host.obs);
    assert_eq!(vg_of(&host.obs, "vg1").pv_count, 2);

    let one = class("vg1", from_ref(&a));
    let plan = plan_device_class(&one, &host.obs);
    assert_eq!(
        plan.actions,
        vec![
            Action::ReduceVolumeGroup {
                name: "vg1".into(),
                pvs: vec![b.clone()],
            },
            Action::RemovePhysicalVolume { path: b.clone() },
        ]
    );
    let plans = converge(&one, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    assert_eq!(vg_of(&host.obs, "vg1").pv_count, 1);
    assert!(host.obs.pvs.iter().all(|p| p.name != b), "label removed");
}

#[test]
fn a_removed_path_that_holds_data_is_kept_and_reported_with_the_fix() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    converge(&thin_class("vg1", &[a.clone(), b.clone()]), &mut host.obs);
    // The pool spans both devices.
    host.obs.pvs.iter_mut().find(|p| p.name == b).unwrap().free = GIB;
    let plan = plan_device_class(&thin_class("vg1", from_ref(&a)), &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert_eq!(plan.state, ClassState::Ready, "the class keeps serving");
    let kept = plan.devices.iter().find(|d| d.path == b).unwrap();
    match &kept.verdict {
        DeviceVerdict::Retained { reason } => {
            assert!(reason.contains("pvmove"), "{reason}");
            assert!(reason.contains("no longer listed"), "{reason}");
        }
        v => panic!("{v:?}"),
    }
}

#[test]
fn a_replaced_path_is_added_before_the_old_one_leaves_and_the_pool_waits() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    converge(&class("vg1", from_ref(&a)), &mut host.obs);
    let plan = plan_device_class(&class("vg1", from_ref(&b)), &host.obs);
    assert_eq!(
        plan.actions,
        vec![
            Action::CreatePhysicalVolume {
                path: b.clone(),
                metadata_size: PV_METADATA_SIZE,
            },
            Action::ExtendVolumeGroup {
                name: "vg1".into(),
                pvs: vec![b.clone()],
            },
            Action::ReduceVolumeGroup {
                name: "vg1".into(),
                pvs: vec![a.clone()],
            },
            Action::RemovePhysicalVolume { path: a },
        ]
    );
    // A thin class plans no pool change in the round that removes a device.
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    converge(&class("vg1", &[a.clone(), b.clone()]), &mut host.obs);
    let plan = plan_device_class(&thin_class("vg1", from_ref(&a)), &host.obs);
    assert!(
        plan.actions.iter().all(|x| !matches!(
            x,
            Action::CreateThinPool { .. } | Action::ExtendThinPool { .. }
        )),
        "{:?}",
        plan.actions
    );
    let plans = converge(&thin_class("vg1", from_ref(&a)), &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    assert!(lv_of(&host.obs, "vg1", "thin-pool-1").is_some());
}

// ---------------------------------------------------------------------------------------------------------
// Adopting csi-driver-lvm's volume group (ADR 0023)

/// A node as csi-driver-lvm leaves it: volume group `csi-lvm` tagged `vg_tags` over two disks, with
/// a linear and a mirror volume of its own (tagged as csi-driver-lvm tags them) and a third disk
/// that is blank. Returns the host and the three disks' paths.
fn csi_driver_lvm_host(vg_tags: &[&str]) -> (Host, Vec<String>) {
    let mut host = Host::default();
    let disks: Vec<String> = (0..3).map(|_| host.clean(10 * GIB)).collect();
    for path in &disks[..2] {
        device_mut(&mut host.obs.devices, path).unwrap().fstype = Some(LVM_SIGNATURE.into());
        host.obs.pvs.push(new_pv(path, 10 * GIB, None));
    }
    let extents = add_pvs_to_vg(&mut host.obs, CSI_DRIVER_LVM_VG_NAME, &disks[..2]);
    let mut g = crate::filter::tests::vg(CSI_DRIVER_LVM_VG_NAME, vg_tags);
    g.extent_count = extents;
    g.free_count = extents;
    g.size = extents * EXTENT;
    g.free = g.size;
    g.pv_count = 2;
    host.obs.vgs.push(g);
    allocate(&mut host.obs, CSI_DRIVER_LVM_VG_NAME, GIB);
    allocate(&mut host.obs, CSI_DRIVER_LVM_VG_NAME, 2 * GIB);
    for (name, segtype) in [("pvc-1111", "linear"), ("pvc-2222", "raid1")] {
        let mut lv = new_lv(CSI_DRIVER_LVM_VG_NAME, name, GIB, "-wi-a-----", segtype);
        lv.tags = vec![crate::config::CSI_DRIVER_LVM_LV_TAG.into()];
        host.obs.lvs.push(lv);
    }
    (host, disks)
}

fn adopting(paths: &[String]) -> DeviceClassConfig {
    let mut class = class(CSI_DRIVER_LVM_VG_NAME, &[]);
    class.device_selector.optional_paths = paths.to_vec();
    class.adopt = Some(crate::config::Adopt::CsiDriverLvm);
    class
}

#[test]
fn adopt_tags_csi_driver_lvm_group_ours_and_nothing_else_then_is_ready() {
    let (mut host, disks) = csi_driver_lvm_host(&[CSI_DRIVER_LVM_VG_TAG]);
    let class = adopting(&disks[..2]);
    let before = host.obs.clone();
    let plans = converge(&class, &mut host.obs);
    assert_eq!(
        plans[0].actions,
        [Action::AdoptVolumeGroup {
            name: "csi-lvm".into(),
            tag: VG_OWNER_TAG.into()
        }]
    );
    assert_eq!(plans.len(), 2, "{plans:#?}");
    assert_eq!(plans[1].state, ClassState::Ready);
    // Nothing but the tag changed: no wipe, no pvcreate, no volume touched.
    assert_eq!(host.obs.pvs, before.pvs);
    assert_eq!(host.obs.lvs, before.lvs);
    assert_eq!(
        vg_of(&host.obs, "csi-lvm").tags,
        [CSI_DRIVER_LVM_VG_TAG, VG_OWNER_TAG]
    );
    assert!(
        plans[1]
            .devices
            .iter()
            .all(|d| d.verdict == DeviceVerdict::Member),
        "{:#?}",
        plans[1].devices
    );
    assert_eq!(foreign_volumes(&class, &host.obs), ["pvc-1111", "pvc-2222"]);
}

#[test]
fn adopted_group_grows_with_a_listed_blank_disk_and_keeps_its_volumes() {
    let (mut host, disks) = csi_driver_lvm_host(&[CSI_DRIVER_LVM_VG_TAG]);
    let class = adopting(&disks);
    let plans = converge(&class, &mut host.obs);
    assert!(
        plans.iter().flat_map(|p| &p.actions).all(|a| !matches!(
            a,
            Action::WipeDevice { .. } | Action::ReduceVolumeGroup { .. }
        )),
        "{plans:#?}"
    );
    assert_eq!(vg_of(&host.obs, "csi-lvm").pv_count, 3);
    assert_eq!(host.obs.lvs.len(), 2);
}

#[test]
fn adopt_refuses_a_group_without_csi_driver_lvm_tag_and_touches_nothing() {
    let (host, disks) = csi_driver_lvm_host(&["someone-else"]);
    let plan = plan_device_class(&adopting(&disks[..2]), &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("not made by csi-driver-lvm")
            && reason.contains("vg.metal-stack.io/csi-lvm-driver")
            && reason.contains("tags someone-else"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());
}

#[test]
fn adopt_never_creates_a_missing_group() {
    let mut host = Host::default();
    let disks = vec![host.clean(10 * GIB), host.clean(10 * GIB)];
    let plan = plan_device_class(&adopting(&disks), &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("no volume group csi-lvm to adopt") && reason.contains("remove adopt"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());
}

/// TopoLVM's lvmd uses a group the admin made and never tags (ADR 0032): `adopt: topolvm` takes
/// the untagged group of the class's name, and nothing else changes.
#[test]
fn adopt_topolvm_tags_an_untagged_group_ours_and_nothing_else() {
    let (mut host, disks) = csi_driver_lvm_host(&[]);
    let mut class = adopting(&disks[..2]);
    class.adopt = Some(crate::config::Adopt::TopoLvm);
    let before = host.obs.clone();
    let plans = converge(&class, &mut host.obs);
    assert_eq!(
        plans[0].actions,
        [Action::AdoptVolumeGroup {
            name: "csi-lvm".into(),
            tag: VG_OWNER_TAG.into()
        }]
    );
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    assert_eq!(host.obs.pvs, before.pvs);
    assert_eq!(host.obs.lvs, before.lvs);
    assert_eq!(vg_of(&host.obs, "csi-lvm").tags, [VG_OWNER_TAG]);

    // Not a group another driver marked as its own.
    let (host, disks) = csi_driver_lvm_host(&[CSI_DRIVER_LVM_VG_TAG]);
    let mut class = adopting(&disks[..2]);
    class.adopt = Some(crate::config::Adopt::TopoLvm);
    let plan = plan_device_class(&class, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("not made by topolvm") && reason.contains("use adopt: csi-driver-lvm"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());

    // Without adopt, an untagged group is refused and adopt: topolvm named as a fix.
    let (host, disks) = csi_driver_lvm_host(&[]);
    let mut plain = adopting(&disks[..2]);
    plain.adopt = None;
    let plan = plan_device_class(&plain, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("vgchange --addtag lvms") && reason.contains("set adopt: topolvm"),
        "{reason}"
    );
}

#[test]
fn without_adopt_a_csi_driver_lvm_group_is_refused_and_the_fix_named() {
    let (host, disks) = csi_driver_lvm_host(&[CSI_DRIVER_LVM_VG_TAG]);
    let mut plain = adopting(&disks[..2]);
    plain.adopt = None;
    let plan = plan_device_class(&plain, &host.obs);
    let reason = failed_reason(&plan);
    assert!(
        reason.contains("is not ours") && reason.contains("set adopt: csi-driver-lvm"),
        "{reason}"
    );
    assert!(plan.actions.is_empty());
    // Another class listing those disks does not take them either: the safety filter excludes
    // another group's LVM physical volumes.
    let other = class("vg1", &disks[..2]);
    let plan = plan_device_class(&other, &host.obs);
    assert!(plan.actions.is_empty(), "{:#?}", plan.actions);
    assert!(
        failed_reason(&plan).contains("csi-lvm"),
        "{}",
        failed_reason(&plan)
    );
}

#[test]
fn foreign_volumes_are_the_untagged_ones_except_the_thin_pool() {
    let mut host = Host::default();
    let class = thin_class("vg1", &[host.clean(10 * GIB)]);
    converge(&class, &mut host.obs);
    let mut ours = new_lv("vg1", "csi-abc", GIB, "Vwi-a-tz--", "thin");
    ours.tags = vec![VG_OWNER_TAG.into()];
    host.obs.lvs.push(ours);
    host.obs
        .lvs
        .push(new_lv("vg1", "by-hand", GIB, "-wi-a-----", "linear"));
    host.obs
        .lvs
        .push(new_lv("other", "elsewhere", GIB, "-wi-a-----", "linear"));
    assert_eq!(foreign_volumes(&class, &host.obs), ["by-hand"]);
}

#[test]
fn a_multipath_device_named_by_path_becomes_a_physical_volume_but_one_matched_by_a_pattern_does_not()
 {
    let mut host = Host::default();
    let mpath = BlockDevice {
        name: "mpatha".into(),
        kname: "dm-9".into(),
        path: "/dev/mapper/mpatha".into(),
        kind: DeviceKind::Mpath,
        ..disk("mpatha", 10 * GIB)
    };
    host.obs
        .resolved
        .insert(mpath.path.clone(), Some("/dev/dm-9".into()));
    host.obs.devices.push(mpath);
    let plan = plan_device_class(&class("san", &["/dev/mapper/mpatha".into()]), &host.obs);
    assert_eq!(plan.state, ClassState::Progressing, "{plan:?}");
    assert_eq!(
        plan.actions[0],
        Action::CreatePhysicalVolume {
            path: "/dev/dm-9".into(),
            metadata_size: PV_METADATA_SIZE
        },
        "the canonical path, as for any device"
    );
    let mut by_pattern = class("san", &[]);
    by_pattern.device_selector.device_patterns = vec!["/dev/mapper/mpath*".into()];
    let plan = plan_device_class(&by_pattern, &host.obs);
    assert!(
        !plan
            .actions
            .iter()
            .any(|a| matches!(a, Action::CreatePhysicalVolume { .. })),
        "{plan:?}"
    );
}

// ---------------------------------------------------------------------------------------------------------
// RAID thin pools (ADR 0031)

fn raid_thin_class(paths: &[String], raid: RaidConfig) -> DeviceClassConfig {
    DeviceClassConfig {
        raid_config: Some(raid),
        thin_pool_config: Some(thin_config()),
        ..class("vg1", paths)
    }
}

fn raid(raid_type: RaidType, mirrors: Option<u32>, stripes: Option<u32>) -> RaidConfig {
    RaidConfig {
        raid_type,
        mirrors,
        stripes,
        stripe_size: None,
    }
}

fn create_pool(plan: &ClassPlan) -> (u64, Option<u64>, Option<PoolRaid>) {
    match plan.actions.as_slice() {
        [
            Action::CreateThinPool {
                data_size,
                metadata_size,
                raid,
                ..
            },
        ] => (*data_size, *metadata_size, raid.clone()),
        other => panic!("expected one CreateThinPool, got {other:?}"),
    }
}

#[test]
fn metadata_is_raid1_with_as_many_copies_as_the_data_level_survives_losses() {
    let cases = [
        (raid(RaidType::Raid1, None, None), 1),
        (raid(RaidType::Raid1, Some(2), None), 2),
        (raid(RaidType::Raid10, None, None), 1),
        (raid(RaidType::Raid10, Some(2), Some(2)), 2),
        (raid(RaidType::Raid4, None, None), 1),
        (raid(RaidType::Raid5, None, Some(4)), 1),
        (raid(RaidType::Raid6, None, None), 2),
    ];
    for (r, mirrors) in cases {
        assert_eq!(metadata_mirrors(&r), mirrors, "{r:?}");
        assert_eq!(PoolRaid::of(&r).metadata_mirrors, mirrors);
    }
}

#[test]
fn raid1_thin_class_on_two_disks_gets_a_pool_of_size_percent_of_half_the_group() {
    let mut host = Host::default();
    let paths = [host.clean(10 * GIB), host.clean(10 * GIB)];
    let mut class = raid_thin_class(&paths, raid(RaidType::Raid1, None, None));
    class.thin_pool_config.as_mut().unwrap().size_percent = 70;
    step(&class, &mut host.obs);
    let vg = vg_of(&host.obs, "vg1").clone();
    let plan = plan_device_class(&class, &host.obs);
    assert_eq!(plan.state, ClassState::Progressing);
    let (data, metadata, pool_raid) = create_pool(&plan);
    // 70 % of the mirrored capacity (half the group), whole extents.
    assert_eq!(
        data,
        round_down_to_extent(vg.size * 70 / 100 / 2, EXTENT).unwrap()
    );
    assert_eq!(metadata, Some(DEFAULT_METADATA_SIZE));
    assert_eq!(
        pool_raid,
        Some(PoolRaid {
            data: raid(RaidType::Raid1, None, None),
            metadata_mirrors: 1
        })
    );
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    let pool = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap();
    assert_eq!(pool.size, data);
}

#[test]
fn raid_pool_target_is_size_percent_of_what_the_layout_holds() {
    let mut host = Host::default();
    let paths: Vec<String> = (0..6).map(|_| host.clean(10 * GIB)).collect();
    let raw = {
        let mut obs = host.obs.clone();
        step(&class("vg1", &paths), &mut obs);
        vg_of(&obs, "vg1").size
    };
    // (layout, data stripes, images)
    let cases = [
        (raid(RaidType::Raid1, Some(2), None), 1, 3),
        (raid(RaidType::Raid10, None, None), 2, 4),
        (raid(RaidType::Raid5, None, None), 2, 3),
        (raid(RaidType::Raid5, None, Some(5)), 5, 6),
        (raid(RaidType::Raid6, None, None), 3, 5),
    ];
    for (r, stripes, images) in cases {
        let mut obs = host.obs.clone();
        let mut class = raid_thin_class(&paths, r.clone());
        class.thin_pool_config.as_mut().unwrap().size_percent = 30;
        step(&class, &mut obs);
        let (data, _, _) = create_pool(&plan_device_class(&class, &obs));
        let expected = round_down_to_extent(raw * 30 * stripes / 100 / images, EXTENT).unwrap();
        assert_eq!(data, expected, "{r:?}");
        let plans = converge(&class, &mut obs);
        assert_eq!(plans.last().unwrap().state, ClassState::Ready, "{r:?}");
    }
}

#[test]
fn raid_pool_at_100_percent_is_capped_so_lvm_can_place_every_image() {
    let mut host = Host::default();
    let paths = [host.clean(2 * GIB), host.clean(2 * GIB)];
    let mut class = raid_thin_class(&paths, raid(RaidType::Raid1, None, None));
    let tp = class.thin_pool_config.as_mut().unwrap();
    tp.size_percent = 100;
    tp.metadata_size = Some(ByteSize(64 * MIB));
    // The simulation panics when an image does not fit on its device.
    let plans = converge(&class, &mut host.obs);
    assert_eq!(plans.last().unwrap().state, ClassState::Ready);
    let pool = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap();
    let per_disk = pv_free_extents(&host.obs, "vg1");
    assert!(pool.size > GIB / 2, "{}", pool.size);
    assert!(
        per_disk.iter().all(|f| *f < 2 * GIB / EXTENT),
        "{per_disk:?}"
    );
}

#[test]
fn raid_pool_that_cannot_fit_its_metadata_images_fails_naming_the_layout_and_the_fix() {
    let mut host = Host::default();
    let paths = [host.clean(GIB), host.clean(GIB)];
    let class = raid_thin_class(&paths, raid(RaidType::Raid1, None, None));
    // 1 GiB of default metadata per image and its spare cannot sit on 1 GiB disks.
    let plans = converge(&class, &mut host.obs);
    let reason = failed_reason(plans.last().unwrap());
    for needle in [
        "does not fit volume group vg1 as raid1",
        "each of the 2 devices",
        "lower thinPoolConfig.metadataSize",
    ] {
        assert!(reason.contains(needle), "{needle:?} not in {reason}");
    }
    assert!(lv_of(&host.obs, "vg1", "thin-pool-1").is_none());
}

#[test]
fn raid_pool_grows_once_every_image_has_room_on_new_devices() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    let mut class = raid_thin_class(&[a.clone(), b.clone()], raid(RaidType::Raid1, None, None));
    converge(&class, &mut host.obs);
    let before = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap().size;
    let c = host.clean(10 * GIB);
    let d = host.clean(10 * GIB);
    class.device_selector.paths = vec![a, b, c, d];
    let plans = converge(&class, &mut host.obs);
    assert!(
        plans.iter().any(|p| p
            .actions
            .iter()
            .any(|a| matches!(a, Action::ExtendThinPool { .. }))),
        "{plans:#?}"
    );
    let after = lv_of(&host.obs, "vg1", "thin-pool-1").unwrap().size;
    let vg = vg_of(&host.obs, "vg1");
    assert!(after > before, "{before} -> {after}");
    assert!(after <= vg.size * 90 / 100 / 2, "{after} of {}", vg.size);
}

#[test]
fn half_made_raid_pool_is_finished_not_refused() {
    let mut host = Host::default();
    let paths = [host.clean(10 * GIB), host.clean(10 * GIB)];
    let class = raid_thin_class(&paths, raid(RaidType::Raid1, None, None));
    step(&class, &mut host.obs);
    // The node stopped after `lvcreate --type raid1 … thin-pool-1`.
    let mut data = new_lv("vg1", "thin-pool-1", 3 * GIB, "rwi-a-r---", "raid1");
    data.stripes = Some(2);
    data.stripe_size = Some(1);
    host.obs.lvs.push(data);
    let plan = plan_device_class(&class, &host.obs);
    let (size, metadata, pool_raid) = create_pool(&plan);
    assert_eq!(size, 3 * GIB);
    assert!(metadata.is_some() && pool_raid.is_some());
    // The pool's parts are not reported as someone else's volumes.
    let mut meta = new_lv("vg1", "thin-pool-1_meta", GIB, "rwi-a-r---", "raid1");
    meta.tags.clear();
    host.obs.lvs.push(meta);
    assert!(foreign_volumes(&class, &host.obs).is_empty());

    // The same LV under a class without RAID is not its pool, nor is a linear one under RAID.
    let plan = plan_device_class(&thin_class("vg1", &paths), &host.obs);
    assert!(failed_reason(&plan).contains("is not a thin pool"));
    host.obs.lvs.retain(|lv| lv.name != "thin-pool-1");
    host.obs
        .lvs
        .push(new_lv("vg1", "thin-pool-1", GIB, "-wi-a-----", "linear"));
    let plan = plan_device_class(&class, &host.obs);
    assert!(failed_reason(&plan).contains("is not a thin pool (segment type linear)"));
}

#[test]
fn pool_metadata_lv_of_a_class_without_raid_is_foreign() {
    let mut host = Host::default();
    let paths = [host.clean(10 * GIB)];
    let class = thin_class("vg1", &paths);
    converge(&class, &mut host.obs);
    host.obs.lvs.push(new_lv(
        "vg1",
        "thin-pool-1_meta",
        GIB,
        "-wi-a-----",
        "linear",
    ));
    assert_eq!(foreign_volumes(&class, &host.obs), ["thin-pool-1_meta"]);
}

fn lose_disk(obs: &mut Observed, path: &str) {
    let pv = obs.pvs.iter_mut().find(|p| p.name == path).unwrap();
    pv.name = "[unknown]".into();
    pv.uuid = "wsj5Wc-lost".into();
    pv.attr = "a-m".into();
    obs.vgs[0].attr = "wz-pn-".into();
    obs.devices.retain(|d| d.path != path);
    obs.resolved.insert(path.to_owned(), None);
}

#[test]
fn raid_class_that_lost_a_disk_is_degraded_names_the_disk_and_the_repair_and_touches_nothing() {
    let mut host = Host::default();
    let a = host.clean(10 * GIB);
    let b = host.clean(10 * GIB);
    let class = raid_thin_class(&[a, b.clone()], raid(RaidType::Raid1, None, None));
    converge(&class, &mut host.obs);
    lose_disk(&mut host.obs, &b);
    let plan = plan_device_class(&class, &host.obs);
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
    assert!(plan.state.serves());
    let ClassState::Degraded { reason } = &plan.state else {
        panic!("expected Degraded, got {:?}", plan.state);
    };
    for needle in [
        "missing 1 of its LVM physical volumes (uuid wsj5Wc-lost)",
        &b,
        "lvconvert --repair vg1/thin-pool-1_tdata and vg1/thin-pool-1_tmeta",
        "vgreduce --removemissing vg1",
        "lvchange --refresh vg1",
        "removes and wipes nothing",
    ] {
        assert!(reason.contains(needle), "{needle:?} not in {reason}");
    }

    // A thick RAID class names its RAID volumes instead; a class without RAID is failed.
    let mut thick = class.clone();
    thick.thin_pool_config = None;
    match plan_device_class(&thick, &host.obs).state {
        ClassState::Degraded { reason } => {
            assert!(
                reason.contains("lvconvert --repair each RAID volume of vg1"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    let mut plain = thick;
    plain.raid_config = None;
    let plan = plan_device_class(&plain, &host.obs);
    assert!(failed_reason(&plan).contains("vgreduce --removemissing vg1"));
    assert!(!plan.state.serves());
}
