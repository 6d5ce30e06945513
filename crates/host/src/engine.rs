//! The node engine: converges this node's device classes. It observes the host, asks `core` for a plan,
//! executes the plan's actions and observes again, until the plan is empty (or failed). Every plan is
//! computed from what is on the machine, so an interrupted run is finished by the next one, and a run on a
//! converged node executes nothing. The node agent calls this for each `LVMVolumeGroup`.

use std::{collections::BTreeMap, future::Future};

use lvms_core::{
    config::{Claims, DeviceClassConfig},
    leave::{LocalStep, LocalVg, plan_local},
    model::{LogicalVolume, PhysicalVolume, VolumeGroup},
    plan::{
        Action, ClassPlan, ClassState, Observed, foreign_volumes, matched_by, plan_device_class,
    },
};
use serde::Serialize;

use crate::{
    Error, Result,
    class::LeaveReport,
    devices::Devices,
    lvm::{Lvm, PoolSize, ThinPoolSpec},
    runner::Runner,
};

/// Plans executed at most per converge: a fresh class needs two or three (volume group, thin pool, and
/// growing a pool lvm2 could not place at full size beside its metadata spare, ADR 0012); the rest is
/// headroom for a host that changes underneath us. Beyond that something keeps undoing our work.
pub const MAX_ROUNDS: usize = 5;

/// What the engine needs from the machine.
pub trait NodeHost: Send + Sync {
    /// Observes devices, LVM state and where each of `paths` resolves.
    fn observe(&self, paths: &[String]) -> impl Future<Output = Result<Observed>> + Send;
    /// Executes one planned action.
    fn execute(&self, action: &Action) -> impl Future<Output = Result<()>> + Send;
}

/// The outcome of converging one device class.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConvergeReport {
    pub device_class: String,
    /// Actions executed, in order.
    pub executed: Vec<Action>,
    /// The last plan: its device report and state (`Ready`, or `Failed` with the reason).
    pub plan: ClassPlan,
    /// The class's volume group and thin pool as observed at the end (absent when not built).
    pub volume_group: Option<VolumeGroup>,
    pub thin_pool: Option<LogicalVolume>,
    /// The volume group's logical volumes and physical volumes as last observed (for RAID health).
    #[serde(skip)]
    pub logical_volumes: Vec<LogicalVolume>,
    #[serde(skip)]
    pub physical_volumes: Vec<PhysicalVolume>,
    /// Logical volumes in the class's volume group that are not ours, by name (an adopted group's
    /// volumes, ADR 0023); never touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub foreign_volumes: Vec<String>,
}

impl ConvergeReport {
    /// Whether the class serves volumes: built (`Ready`), or a RAID class running on fewer
    /// devices (`Degraded`).
    pub fn is_ready(&self) -> bool {
        self.plan.state.serves()
    }
}

/// Converges one class: plan, execute, re-observe, until nothing is left to do.
pub async fn converge<H: NodeHost>(host: &H, class: &DeviceClassConfig) -> Result<ConvergeReport> {
    converge_among(host, class, &Claims::default()).await
}

/// [`converge`] for a class beside others on the node: `others` are the devices the other classes
/// list or match, which a class never discovers or matches by pattern.
#[tracing::instrument(skip_all, fields(device_class = %class.name))]
pub async fn converge_among<H: NodeHost>(
    host: &H,
    class: &DeviceClassConfig,
    others: &Claims,
) -> Result<ConvergeReport> {
    let paths: Vec<String> = class
        .device_selector
        .paths
        .iter()
        .chain(&class.device_selector.optional_paths)
        .chain(&others.paths)
        .cloned()
        .collect();
    let mut executed = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let mut observed = host.observe(&paths).await?;
        let mut claimed: std::collections::BTreeSet<String> = others
            .paths
            .iter()
            .flat_map(|o| [Some(o.clone()), observed.resolved.get(o).cloned().flatten()])
            .flatten()
            .collect();
        if !others.patterns.is_empty() {
            claimed.extend(matched_by(&observed.devices, &others.patterns));
        }
        observed.claimed = claimed;
        let plan = plan_device_class(class, &observed);
        if plan.actions.is_empty() || matches!(plan.state, ClassState::Failed { .. }) {
            let volume_group = observed
                .vgs
                .iter()
                .find(|vg| vg.name == class.name)
                .cloned();
            let thin_pool = class.thin_pool_config.as_ref().and_then(|tp| {
                observed
                    .lvs
                    .iter()
                    .find(|lv| lv.vg_name == class.name && lv.name == tp.name)
                    .cloned()
            });
            let foreign_volumes = foreign_volumes(class, &observed);
            let logical_volumes = observed
                .lvs
                .into_iter()
                .filter(|lv| lv.vg_name == class.name)
                .collect();
            let physical_volumes = observed
                .pvs
                .into_iter()
                .filter(|pv| pv.vg_name.as_deref() == Some(class.name.as_str()))
                .collect();
            return Ok(ConvergeReport {
                device_class: class.name.clone(),
                executed,
                plan,
                volume_group,
                thin_pool,
                logical_volumes,
                physical_volumes,
                foreign_volumes,
            });
        }
        for action in plan.actions {
            tracing::info!(?action, "executing");
            host.execute(&action).await?;
            executed.push(action);
        }
    }
    Err(Error::NotConverged {
        device_class: class.name.clone(),
        rounds: MAX_ROUNDS,
    })
}

/// What leaving a node-local class needs from the machine.
pub trait LocalLeaveHost: Send + Sync {
    /// The class's volume group on this node, if there is one.
    fn observe_leave(&self, class: &str) -> impl Future<Output = Result<Option<LocalVg>>> + Send;
    /// Executes one planned step.
    fn execute_leave(&self, step: &LocalStep) -> impl Future<Output = Result<()>> + Send;
}

/// Leaves node-local class `class` on this node ([`lvms_core::leave::plan_local`]): plan, execute,
/// observe again, until the plan stops (`Left`, or `Refused` while something not ours remains).
#[tracing::instrument(skip_all, fields(device_class = %class.name))]
pub async fn leave<H: LocalLeaveHost>(
    host: &H,
    class: &DeviceClassConfig,
) -> Result<LeaveReport<LocalStep>> {
    let mut executed = Vec::new();
    for _ in 0..MAX_ROUNDS {
        let vg = host.observe_leave(&class.name).await?;
        let plan = plan_local(class, vg.as_ref());
        if plan.actions.is_empty() {
            return Ok(LeaveReport {
                device_class: class.name.clone(),
                executed,
                plan,
            });
        }
        for step in plan.actions {
            tracing::info!(?step, "executing");
            host.execute_leave(&step).await?;
            executed.push(step);
        }
    }
    Err(Error::NotConverged {
        device_class: class.name.clone(),
        rounds: MAX_ROUNDS,
    })
}

/// [`NodeHost`] on the real machine.
pub struct RealNodeHost<R> {
    lvm: Lvm<R>,
    devices: Devices<R>,
}

impl<R: Runner + Clone> RealNodeHost<R> {
    pub fn new(runner: R) -> Self {
        Self {
            lvm: Lvm::new(runner.clone()),
            devices: Devices::new(runner),
        }
    }
}

impl<R: Runner> RealNodeHost<R> {
    pub fn from_parts(lvm: Lvm<R>, devices: Devices<R>) -> Self {
        Self { lvm, devices }
    }

    pub fn lvm(&self) -> &Lvm<R> {
        &self.lvm
    }
}

impl<R: Runner> NodeHost for RealNodeHost<R> {
    async fn observe(&self, paths: &[String]) -> Result<Observed> {
        let mut resolved = BTreeMap::new();
        for path in paths {
            resolved.insert(path.clone(), self.devices.resolve_path(path).await);
        }
        Ok(Observed {
            devices: self.devices.discover().await?,
            pvs: self.lvm.pvs().await?,
            vgs: self.lvm.vgs().await?,
            // Hidden sub-volumes too: a RAID thin pool's health is its `[pool_tdata]`'s and
            // `[pool_tmeta]`'s.
            lvs: self.lvm.lvs_all().await?,
            resolved,
            wiped: Default::default(),
            claimed: Default::default(),
        })
    }

    async fn execute(&self, action: &Action) -> Result<()> {
        match action {
            Action::WipeDevice { path } => self.devices.wipe(path).await,
            Action::CreatePhysicalVolume {
                path,
                metadata_size,
            } => self.lvm.pv_create(path, Some(*metadata_size)).await,
            Action::CreateVolumeGroup { name, pvs, tags } => {
                self.lvm.vg_create(name, pvs, tags).await
            }
            Action::ExtendVolumeGroup { name, pvs } => self.lvm.vg_extend(name, pvs).await,
            Action::CreateThinPool {
                vg,
                name,
                data_size,
                chunk_size,
                metadata_size,
                zero,
                raid,
            } => {
                let spec = ThinPoolSpec {
                    vg: vg.clone(),
                    name: name.clone(),
                    size: PoolSize::Bytes(*data_size),
                    chunk_size: *chunk_size,
                    metadata_size: *metadata_size,
                    zero: *zero,
                };
                match raid {
                    Some(raid) => self.lvm.thin_pool_create_raid(&spec, raid).await,
                    None => self.lvm.thin_pool_create(&spec).await,
                }
            }
            Action::ExtendThinPool {
                vg,
                name,
                data_size,
            } => self.lvm.thin_pool_extend(vg, name, *data_size).await,
            Action::ReduceVolumeGroup { name, pvs } => self.lvm.vg_reduce(name, pvs).await,
            Action::RemovePhysicalVolume { path } => self.lvm.pv_remove(path).await,
            Action::AdoptVolumeGroup { name, tag } => self.lvm.vg_add_tag(name, tag).await,
        }
    }
}

impl<R: Runner> LocalLeaveHost for RealNodeHost<R> {
    async fn observe_leave(&self, class: &str) -> Result<Option<LocalVg>> {
        let Some(vg) = self.lvm.vg(class).await? else {
            return Ok(None);
        };
        let lvs = self.lvm.lvs(Some(class)).await?;
        let pvs = self.lvm.pvs().await?;
        Ok(Some(LocalVg {
            tags: vg.tags,
            lvs: lvs
                .into_iter()
                .map(|lv| lv.name)
                .filter(|n| !n.starts_with('['))
                .collect(),
            pvs: pvs
                .into_iter()
                .filter(|pv| pv.vg_name.as_deref() == Some(class))
                .map(|pv| pv.name)
                .collect(),
        }))
    }

    async fn execute_leave(&self, step: &LocalStep) -> Result<()> {
        match step {
            LocalStep::RemovePool { vg, pool } => self.lvm.lv_remove(vg, pool).await,
            LocalStep::RemoveVolumeGroup { vg } => self.lvm.vg_remove(vg).await,
            LocalStep::RemovePhysicalVolumes { pvs } => {
                for pv in pvs {
                    self.lvm.pv_remove(pv).await?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use lvms_core::{
        config::{DeviceSelector, Fstype, ThinPoolConfig, VG_OWNER_TAG},
        leave::LeaveState,
        model::{BlockDevice, DeviceKind, PhysicalVolume},
        size::{GIB, MIB},
    };

    use super::*;

    const EXTENT: u64 = 4 * MIB;

    fn disk(name: &str, size: u64) -> BlockDevice {
        BlockDevice {
            name: name.into(),
            kname: name.into(),
            path: format!("/dev/{name}"),
            kind: DeviceKind::Disk,
            size,
            read_only: false,
            state: Some("running".into()),
            partlabel: None,
            fstype: None,
            rotational: false,
            serial: None,
            model: None,
            mountpoints: vec![],
            by_id: vec![],
            loop_backing_file: None,
            children: vec![],
        }
    }

    /// A host that applies actions to an in-memory model the way LVM would, and counts them.
    struct SimHost {
        state: Mutex<Observed>,
        /// Fail the nth execute call (0-based), to interrupt a run.
        fail_at: Mutex<Option<usize>>,
        calls: Mutex<usize>,
    }

    impl SimHost {
        fn new(devices: Vec<BlockDevice>) -> Self {
            let resolved = devices
                .iter()
                .map(|d| (d.path.clone(), Some(d.path.clone())))
                .collect();
            Self {
                state: Mutex::new(Observed {
                    devices,
                    pvs: vec![],
                    vgs: vec![],
                    lvs: vec![],
                    resolved,
                    wiped: Default::default(),
                    claimed: Default::default(),
                }),
                fail_at: Mutex::new(None),
                calls: Mutex::new(0),
            }
        }
    }

    impl LocalLeaveHost for SimHost {
        async fn observe_leave(&self, class: &str) -> Result<Option<LocalVg>> {
            let state = self.state.lock().unwrap();
            Ok(state
                .vgs
                .iter()
                .find(|vg| vg.name == class)
                .map(|vg| LocalVg {
                    tags: vg.tags.clone(),
                    lvs: state
                        .lvs
                        .iter()
                        .filter(|lv| lv.vg_name == class)
                        .map(|lv| lv.name.clone())
                        .collect(),
                    pvs: state
                        .pvs
                        .iter()
                        .filter(|pv| pv.vg_name.as_deref() == Some(class))
                        .map(|pv| pv.name.clone())
                        .collect(),
                }))
        }

        async fn execute_leave(&self, step: &LocalStep) -> Result<()> {
            let mut state = self.state.lock().unwrap();
            match step {
                LocalStep::RemovePool { vg, pool } => {
                    state
                        .lvs
                        .retain(|lv| !(lv.vg_name == *vg && lv.name == *pool));
                }
                LocalStep::RemoveVolumeGroup { vg } => {
                    assert!(
                        !state.lvs.iter().any(|lv| lv.vg_name == *vg),
                        "vgremove of a group with volumes"
                    );
                    state.vgs.retain(|g| g.name != *vg);
                    for pv in state
                        .pvs
                        .iter_mut()
                        .filter(|pv| pv.vg_name.as_deref() == Some(vg))
                    {
                        pv.vg_name = None;
                    }
                }
                LocalStep::RemovePhysicalVolumes { pvs } => {
                    // `pvremove` wipes the label: the disk is blank again.
                    state.pvs.retain(|pv| !pvs.contains(&pv.name));
                    for d in state.devices.iter_mut().filter(|d| pvs.contains(&d.path)) {
                        d.fstype = None;
                    }
                }
            }
            Ok(())
        }
    }

    impl NodeHost for SimHost {
        async fn observe(&self, _paths: &[String]) -> Result<Observed> {
            Ok(self.state.lock().unwrap().clone())
        }

        async fn execute(&self, action: &Action) -> Result<()> {
            let mut calls = self.calls.lock().unwrap();
            if *self.fail_at.lock().unwrap() == Some(*calls) {
                *calls += 1;
                return Err(Error::NotConverged {
                    device_class: "interrupted".into(),
                    rounds: 0,
                });
            }
            *calls += 1;
            let mut s = self.state.lock().unwrap();
            let size_of = |s: &Observed, path: &str| {
                s.devices
                    .iter()
                    .find(|d| d.path == path)
                    .map(|d| d.size)
                    .unwrap()
            };
            match action {
                Action::CreatePhysicalVolume { path, .. } => {
                    let size = size_of(&s, path) - EXTENT;
                    s.pvs.push(PhysicalVolume {
                        name: path.clone(),
                        vg_name: None,
                        uuid: path.clone(),
                        size,
                        free: size,
                        attr: "---".into(),
                    });
                    for d in &mut s.devices {
                        if &d.path == path {
                            d.fstype = Some("LVM2_member".into());
                        }
                    }
                }
                Action::CreateVolumeGroup { name, pvs, tags } => {
                    let mut size = 0;
                    for pv in &mut s.pvs {
                        if pvs.contains(&pv.name) {
                            pv.vg_name = Some(name.clone());
                            size += pv.size;
                        }
                    }
                    s.vgs.push(VolumeGroup {
                        name: name.clone(),
                        uuid: name.clone(),
                        size,
                        free: size,
                        extent_size: EXTENT,
                        extent_count: size / EXTENT,
                        free_count: size / EXTENT,
                        pv_count: pvs.len() as u64,
                        lv_count: 0,
                        tags: tags.clone(),
                        attr: "wz--n-".into(),
                        mda_free: MIB,
                        mda_size: 4 * MIB,
                    });
                }
                Action::CreateThinPool {
                    vg,
                    name,
                    data_size,
                    metadata_size,
                    ..
                } => {
                    let used = data_size + 2 * metadata_size.unwrap_or(0);
                    let g = s.vgs.iter_mut().find(|g| &g.name == vg).unwrap();
                    g.free -= used;
                    g.free_count = g.free / EXTENT;
                    s.lvs.push(LogicalVolume {
                        name: name.clone(),
                        vg_name: vg.clone(),
                        uuid: name.clone(),
                        size: *data_size,
                        attr: "twi-a-tz--".into(),
                        segtype: "thin-pool".into(),
                        pool_lv: None,
                        origin: None,
                        data_percent: Some(0.0),
                        metadata_percent: Some(1.0),
                        metadata_size: *metadata_size,
                        sync_percent: None,
                        tags: vec![],
                        path: None,
                        dm_path: None,
                        stripes: Some(1),
                        stripe_size: Some(0),
                    });
                }
                other => panic!("unexpected action in this scenario: {other:?}"),
            }
            Ok(())
        }
    }

    fn thin_class(paths: &[&str]) -> DeviceClassConfig {
        DeviceClassConfig {
            name: "vg1".into(),
            device_selector: DeviceSelector {
                paths: paths.iter().map(|p| p.to_string()).collect(),
                ..Default::default()
            },
            thin_pool_config: Some(ThinPoolConfig {
                name: "pool".into(),
                size_percent: 90,
                overprovision_ratio: 10,
                chunk_size_calculation_policy: Default::default(),
                chunk_size: None,
                metadata_size_calculation_policy: Default::default(),
                metadata_size: Some(lvms_core::size::ByteSize(16 * MIB)),
            }),
            raid_config: None,
            device_discovery_policy: Default::default(),
            access: Default::default(),
            adopt: None,
            default: true,
            fstype: Some(Fstype::Xfs),
        }
    }

    fn block_on<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn converge_builds_volume_group_then_thin_pool_and_second_run_does_nothing() {
        let host = SimHost::new(vec![disk("vdb", 2 * GIB), disk("vdc", 2 * GIB)]);
        let class = thin_class(&["/dev/vdb", "/dev/vdc"]);

        let first = block_on(converge(&host, &class)).unwrap();
        assert!(first.is_ready(), "{:?}", first.plan.state);
        let kinds: Vec<&str> = first
            .executed
            .iter()
            .map(|a| match a {
                Action::CreatePhysicalVolume { .. } => "pvcreate",
                Action::CreateVolumeGroup { .. } => "vgcreate",
                Action::CreateThinPool { .. } => "thinpool",
                _ => "other",
            })
            .collect();
        assert_eq!(kinds, ["pvcreate", "pvcreate", "vgcreate", "thinpool"]);
        let vg = first.volume_group.unwrap();
        assert_eq!(vg.tags, [VG_OWNER_TAG]);
        assert!(first.thin_pool.is_some());

        let second = block_on(converge(&host, &class)).unwrap();
        assert!(second.is_ready());
        assert!(second.executed.is_empty(), "{:?}", second.executed);
    }

    #[test]
    fn converge_after_an_interrupted_run_finishes_without_repeating_work() {
        let host = SimHost::new(vec![disk("vdb", 2 * GIB), disk("vdc", 2 * GIB)]);
        *host.fail_at.lock().unwrap() = Some(2); // pvcreate, pvcreate, then vgcreate fails
        let class = thin_class(&["/dev/vdb", "/dev/vdc"]);
        assert!(block_on(converge(&host, &class)).is_err());

        let report = block_on(converge(&host, &class)).unwrap();
        assert!(report.is_ready());
        assert!(
            !report
                .executed
                .iter()
                .any(|a| matches!(a, Action::CreatePhysicalVolume { .. })),
            "physical volumes made before the interruption are reused: {:?}",
            report.executed
        );
    }

    #[test]
    fn converge_reports_failed_class_and_executes_nothing() {
        let mut ext4 = disk("vdb", 2 * GIB);
        ext4.fstype = Some("ext4".into());
        let host = SimHost::new(vec![ext4]);
        let report = block_on(converge(&host, &thin_class(&["/dev/vdb"]))).unwrap();
        assert!(report.executed.is_empty());
        match &report.plan.state {
            ClassState::Failed { reason } => assert!(reason.contains("/dev/vdb"), "{reason}"),
            other => panic!("expected Failed, got {other:?}"),
        }
        assert_eq!(*host.calls.lock().unwrap(), 0);
    }

    /// A host whose state never changes: the engine must give up rather than loop.
    struct StuckHost(SimHost);

    impl NodeHost for StuckHost {
        async fn observe(&self, paths: &[String]) -> Result<Observed> {
            self.0.observe(paths).await
        }
        async fn execute(&self, _action: &Action) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn converge_gives_up_when_actions_have_no_effect() {
        let host = StuckHost(SimHost::new(vec![disk("vdb", 2 * GIB)]));
        let err = block_on(converge(&host, &thin_class(&["/dev/vdb"]))).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotConverged {
                    rounds: MAX_ROUNDS,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn leave_removes_an_empty_class_to_the_bare_disks_and_converge_builds_it_again() {
        let host = SimHost::new(vec![disk("vdb", 2 * GIB), disk("vdc", 2 * GIB)]);
        let class = thin_class(&["/dev/vdb", "/dev/vdc"]);
        assert!(block_on(converge(&host, &class)).unwrap().is_ready());
        let report = block_on(leave(&host, &class)).unwrap();
        assert!(report.has_left(), "{:?}", report.plan);
        let steps: Vec<&str> = report
            .executed
            .iter()
            .map(|s| match s {
                LocalStep::RemovePool { .. } => "pool",
                LocalStep::RemoveVolumeGroup { .. } => "vg",
                LocalStep::RemovePhysicalVolumes { .. } => "pvs",
            })
            .collect();
        assert_eq!(steps, ["pool", "vg", "pvs"]);
        {
            let state = host.state.lock().unwrap();
            assert!(state.vgs.is_empty() && state.lvs.is_empty() && state.pvs.is_empty());
        }
        // Leaving again does nothing; converging again starts over.
        assert!(block_on(leave(&host, &class)).unwrap().executed.is_empty());
        assert!(block_on(converge(&host, &class)).unwrap().is_ready());
    }

    #[test]
    fn leave_refuses_while_a_volume_remains_and_removes_nothing() {
        let host = SimHost::new(vec![disk("vdb", 2 * GIB)]);
        let class = thin_class(&["/dev/vdb"]);
        assert!(block_on(converge(&host, &class)).unwrap().is_ready());
        let mut volume = host.state.lock().unwrap().lvs[0].clone();
        volume.name = "pvc-1".into();
        host.state.lock().unwrap().lvs.push(volume);
        let report = block_on(leave(&host, &class)).unwrap();
        assert!(report.executed.is_empty());
        assert!(
            matches!(&report.plan.state, LeaveState::Refused { reason } if reason.contains("pvc-1")),
            "{:?}",
            report.plan.state
        );
        assert_eq!(host.state.lock().unwrap().vgs.len(), 1);
    }
}
