//! The node status object over the in-memory API server (the disk side runs in the VM: `vm_agent`),
//! and shared classes over a fake [`SharedHost`].
#![allow(clippy::unwrap_used, clippy::expect_used)]

use lvms_core::config::VG_OWNER_TAG;
use lvms_core::shared::{
    Daemon, Daemons, SharedVg,
    leave::{LeaveAction, LeaveObserved, SharedLv},
};
use lvms_host::runner::RealRunner;
use lvms_testkit::{fake_api::FakeApi, fake_backend::FakeBackend};
use serde_json::{Value, json};

use super::*;

static RUNNER: RealRunner = RealRunner;
const PATH: &str =
    "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroupnodestatuses/node-a";

fn context(api: &FakeApi) -> Context<&'static RealRunner, FakeBackend> {
    Context::new(
        api.client("lvms"),
        "node-a",
        "lvms",
        RealNodeHost::new(&RUNNER),
        RealSharedHost::new(&RUNNER),
        Box::new(|_| FakeBackend::new()),
    )
}

fn entries(api: &FakeApi) -> Vec<(String, String)> {
    api.get(PATH).unwrap()["spec"]["nodeStatus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_owned(),
                e["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn ready(name: &str) -> VGStatus {
    VGStatus {
        name: name.into(),
        status: Some(VGStatusType::Ready),
        ..VGStatus::default()
    }
}

#[tokio::test]
async fn a_restarted_agent_keeps_reporting_the_classes_it_has_not_reconciled_yet() {
    let api = FakeApi::new();
    api.insert(
        PATH,
        json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroupNodeStatus",
               "metadata": {"name": "node-a", "namespace": "lvms"},
               "spec": {"nodeStatus": [{"name": "a", "status": "Progressing"},
                                       {"name": "b", "status": "Ready"}]}}),
    );
    let ctx = context(&api);
    ctx.load_node_status().await.unwrap();
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert_eq!(
        entries(&api),
        [("a".into(), "Ready".into()), ("b".into(), "Ready".into())]
    );
    let applied = api.requests().last().unwrap().clone();
    assert_eq!(
        applied.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert!(
        applied.query.contains("fieldManager=lvms-node"),
        "{}",
        applied.query
    );
    assert!(applied.query.contains("force=true"), "{}", applied.query);
    assert_eq!(
        applied.body["metadata"]["finalizers"],
        json!([NODE_STATUS_FINALIZER])
    );

    // Gone from this node: its entry goes; an unchanged status sends nothing.
    ctx.record("b", None, None).await.unwrap();
    assert_eq!(entries(&api), [("a".into(), "Ready".into())]);
    // The last class gone: the object says so, gives up its finalizer, and is deleted.
    ctx.record("a", None, None).await.unwrap();
    let requests = api.requests();
    let [.., emptied, deleted] = requests.as_slice() else {
        panic!("{requests:?}")
    };
    assert_eq!(emptied.body["spec"], json!({"nodeStatus": []}));
    assert_eq!(emptied.body["metadata"]["finalizers"], json!([]));
    assert_eq!(deleted.method, http::Method::DELETE);
    assert_eq!(api.get(PATH), None, "the node's status object is gone");
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert_eq!(entries(&api), [("a".into(), "Ready".into())]);
    api.clear_requests();
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert!(api.requests().is_empty());
}

#[tokio::test]
async fn the_backend_follows_the_ready_classes() {
    let api = FakeApi::new();
    let ctx = context(&api);
    let rx = ctx.backend();
    assert!(rx.borrow().is_none());
    let class = |name: &str| DeviceClassConfig::named(name);
    ctx.record("a", Some(ready("a")), Some(class("a")))
        .await
        .unwrap();
    assert!(rx.borrow().is_some(), "a ready class is served");
    ctx.record("a", Some(ready("a")), None).await.unwrap();
    assert!(rx.borrow().is_none(), "no ready class, no backend");
    let _: Value = api.get(PATH).unwrap();
}

#[test]
fn only_a_change_of_the_nodes_labels_looks_at_the_volume_groups_again() {
    let node = |labels: Value, rv: &str| -> Node {
        serde_json::from_value(json!({"metadata": {"name": "node-a", "labels": labels,
                                                   "resourceVersion": rv}}))
        .unwrap()
    };
    let last = std::sync::Mutex::new(None);
    assert!(
        labels_changed(&last, &node(json!({"a": "1"}), "1")),
        "first look"
    );
    assert!(
        !labels_changed(&last, &node(json!({"a": "1"}), "2")),
        "a status update"
    );
    assert!(labels_changed(&last, &node(json!({"a": "2"}), "3")));
    assert!(labels_changed(&last, &node(json!({}), "4")));
}

/// A host with one 10 GiB disk `/dev/vdb` carrying an ext4 signature. Every action fails except the
/// wipe, which clears the signature; each executed action is logged with whether the node status
/// object recorded the wipe at that moment.
struct WipeHost {
    api: FakeApi,
    signature: std::sync::Mutex<Option<String>>,
    executed: std::sync::Mutex<Vec<(HostAction, bool)>>,
}

impl WipeHost {
    fn new(api: &FakeApi) -> Self {
        Self {
            api: api.clone(),
            signature: std::sync::Mutex::new(Some("ext4".into())),
            executed: std::sync::Mutex::default(),
        }
    }

    fn executed(&self) -> Vec<(HostAction, bool)> {
        self.executed.lock().unwrap().clone()
    }
}

impl NodeHost for WipeHost {
    async fn observe(&self, paths: &[String]) -> lvms_host::Result<Observed> {
        let disk: lvms_core::model::BlockDevice = serde_json::from_value(json!({
            "name": "vdb", "kname": "vdb", "path": "/dev/vdb", "kind": "disk",
            "size": 10u64 << 30, "readOnly": false, "rotational": false,
            "fstype": *self.signature.lock().unwrap(),
            "mountpoints": [], "byId": [], "children": []}))
        .unwrap();
        Ok(Observed {
            devices: vec![disk],
            resolved: paths
                .iter()
                .map(|p| (p.clone(), Some("/dev/vdb".to_owned())))
                .collect(),
            ..Observed::default()
        })
    }

    async fn execute(&self, action: &HostAction) -> lvms_host::Result<()> {
        let recorded = self
            .api
            .get(PATH)
            .is_some_and(|s| s["spec"]["nodeStatus"][0]["wipedDevices"] == json!(["/dev/vdb"]));
        self.executed
            .lock()
            .unwrap()
            .push((action.clone(), recorded));
        match action {
            HostAction::WipeDevice { .. } => {
                *self.signature.lock().unwrap() = None;
                Ok(())
            }
            _ => Err(lvms_host::Error::InvalidArgument("stop here".into())),
        }
    }
}

fn force_wipe_class() -> DeviceClassConfig {
    let vg: LVMVolumeGroup = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "vg1", "namespace": "lvms"},
        "spec": {"deviceSelector": {"paths": ["/dev/vdb"],
                                    "forceWipeDevicesAndDestroyAllData": true}}}))
    .unwrap();
    volume_group::device_class_config(&vg).unwrap()
}

/// The node engine over `host` with the class's wipe record, as [`converge`] runs it.
async fn converge_class<H: NodeHost>(
    ctx: &Context<&'static RealRunner, FakeBackend>,
    host: &H,
    config: &DeviceClassConfig,
    others: &Claims,
) -> lvms_host::Result<ConvergeReport> {
    let host = ClassHost {
        inner: host,
        ctx,
        class: &config.name,
    };
    lvms_host::engine::converge_among(&host, config, others).await
}

#[tokio::test]
async fn a_wipe_is_recorded_before_it_runs_and_never_repeats_after_a_restart() {
    let api = FakeApi::new();
    let host = WipeHost::new(&api);
    let ctx = context(&api);
    let err = converge_class(&ctx, &host, &force_wipe_class(), &Claims::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("stop here"), "{err}");
    let executed = host.executed();
    assert_eq!(
        executed[0],
        (
            HostAction::WipeDevice {
                path: "/dev/vdb".into()
            },
            true
        ),
        "the record is on the API server before the wipe"
    );
    assert!(matches!(
        executed[1].0,
        HostAction::CreatePhysicalVolume { .. }
    ));

    // A later status of the class keeps the record.
    ctx.record("vg1", Some(ready("vg1")), None).await.unwrap();
    let status = api.get(PATH).unwrap();
    assert_eq!(
        status["spec"]["nodeStatus"][0]["wipedDevices"],
        json!(["/dev/vdb"])
    );

    // Someone writes a filesystem on the disk again; a restarted agent reads the record and refuses
    // to wipe it a second time.
    *host.signature.lock().unwrap() = Some("xfs".into());
    let ctx = context(&api);
    ctx.load_node_status().await.unwrap();
    let before = host.executed().len();
    let report = converge_class(&ctx, &host, &force_wipe_class(), &Claims::default())
        .await
        .unwrap();
    assert_eq!(host.executed().len(), before, "nothing executed");
    match &report.plan.state {
        lvms_core::plan::ClassState::Failed { reason } => {
            assert!(reason.contains("never wipes a device twice"), "{reason}");
        }
        s => panic!("{s:?}"),
    }
}

#[tokio::test]
async fn no_record_no_wipe() {
    let api = FakeApi::new();
    api.fail(
        http::Method::PATCH,
        PATH,
        http::StatusCode::INTERNAL_SERVER_ERROR,
        1,
    );
    let host = WipeHost::new(&api);
    let ctx = context(&api);
    let err = converge_class(&ctx, &host, &force_wipe_class(), &Claims::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, lvms_host::Error::WipeNotRecorded { ref device, .. } if device == "/dev/vdb"),
        "{err}"
    );
    assert!(host.executed().is_empty(), "{:?}", host.executed());
    // The failed record is not remembered either: the next try records, then wipes.
    converge_class(&ctx, &host, &force_wipe_class(), &Claims::default())
        .await
        .unwrap_err();
    assert_eq!(
        host.executed()[0],
        (
            HostAction::WipeDevice {
                path: "/dev/vdb".into()
            },
            true
        )
    );
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/lvms/leases/lvms-shared-create-san";
const HOST_IDS: &str = "/api/v1/namespaces/lvms/configmaps/lvms-sanlock-host-ids";
const SAN_VG: &str = "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/san";

fn shared_vg() -> LVMVolumeGroup {
    serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "san", "namespace": "lvms",
                     "finalizers": [lvms_api::node_cleanup_finalizer("node-a")]},
        "spec": {"deviceAccessPolicy": "shared",
                 "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x600a"]}}}))
    .unwrap()
}

fn host_ids(api: &FakeApi, data: Value) {
    api.insert(
        HOST_IDS,
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "lvms-sanlock-host-ids", "namespace": "lvms"},
               "data": data}),
    );
}

/// A host with both daemons running that sees the class's LUN as `/dev/sdx`, listed in the class's
/// devices file. `vgcreate` makes the volume group and starts the lockspace; lock-start starts it.
/// Each executed action is logged with the creator Lease's holder at that moment.
struct SanHost {
    api: FakeApi,
    vg: std::sync::Mutex<Option<SharedVg>>,
    lockspace: std::sync::Mutex<bool>,
    executed: std::sync::Mutex<Vec<(shared::Action, Option<String>)>>,
    /// Leaving: the group's logical volumes, whether other hosts still have the lockspace
    /// started, whether the devices file lists the LUN, the LUN's label once the group is gone,
    /// and every leave action tried.
    lvs: std::sync::Mutex<Vec<SharedLv>>,
    others_joined: std::sync::Mutex<bool>,
    devices_file: std::sync::Mutex<bool>,
    orphan_label: std::sync::Mutex<bool>,
    tried: std::sync::Mutex<Vec<LeaveAction>>,
}

/// The class's volume group as another node made it.
fn made_vg() -> SharedVg {
    SharedVg {
        name: "san".into(),
        lock_type: "sanlock".into(),
        tags: vec![VG_OWNER_TAG.into()],
        pvs: vec!["/dev/sdx".into()],
    }
}

impl SanHost {
    fn new(api: &FakeApi, vg_exists: bool) -> Self {
        Self {
            api: api.clone(),
            vg: std::sync::Mutex::new(vg_exists.then(made_vg)),
            lockspace: std::sync::Mutex::new(false),
            executed: std::sync::Mutex::default(),
            lvs: std::sync::Mutex::default(),
            others_joined: std::sync::Mutex::new(false),
            devices_file: std::sync::Mutex::new(true),
            orphan_label: std::sync::Mutex::new(false),
            tried: std::sync::Mutex::default(),
        }
    }

    fn tried(&self) -> Vec<LeaveAction> {
        self.tried.lock().unwrap().clone()
    }

    fn executed(&self) -> Vec<(shared::Action, Option<String>)> {
        self.executed.lock().unwrap().clone()
    }
}

impl SharedHost for SanHost {
    async fn install_fence_hook(&self) -> Option<lvms_host::fence::install::Installed> {
        None
    }
    async fn observe(
        &self,
        class: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> lvms_host::Result<shared::Observed> {
        Ok(shared::Observed {
            daemons: Daemons {
                sanlock: Daemon::Running,
                lvmlockd: Daemon::Running,
            },
            host_id: node.map(|n| n.host_id),
            may_create: node.is_some_and(|n| n.create_volume_groups),
            resolved: class
                .device_selector
                .paths
                .iter()
                .map(|p| (p.clone(), Some("/dev/sdx".to_owned())))
                .collect(),
            devices_file: ["/dev/sdx".to_owned()].into(),
            vg: self.vg.lock().unwrap().clone(),
            orphan_pvs: BTreeSet::new(),
            signatures: BTreeMap::new(),
            lockspace_started: *self.lockspace.lock().unwrap(),
        })
    }

    async fn execute(&self, action: &shared::Action) -> lvms_host::Result<()> {
        let holder = self
            .api
            .get(LEASE)
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned));
        self.executed.lock().unwrap().push((action.clone(), holder));
        match action {
            shared::Action::CreateVolumeGroup {
                name, pvs, tags, ..
            } => {
                *self.vg.lock().unwrap() = Some(SharedVg {
                    name: name.clone(),
                    lock_type: "sanlock".into(),
                    tags: tags.clone(),
                    pvs: pvs.clone(),
                });
                *self.lockspace.lock().unwrap() = true;
            }
            shared::Action::StartLockspace { .. } => *self.lockspace.lock().unwrap() = true,
            shared::Action::AddToDevicesFile { .. } => {}
        }
        Ok(())
    }

    async fn pause(&self, _: Duration) {}
}

impl SharedLeaveHost for SanHost {
    async fn observe_leave(
        &self,
        _: &DeviceClassConfig,
        node: Option<&SharedNodeConfig>,
    ) -> lvms_host::Result<LeaveObserved> {
        let dev = || ["/dev/sdx".to_owned()].into_iter().collect();
        Ok(LeaveObserved {
            daemons: Daemons {
                sanlock: Daemon::Running,
                lvmlockd: Daemon::Running,
            },
            host_id: node.map(|n| n.host_id),
            remover: node.is_some_and(|n| n.create_volume_groups),
            undecided: None,
            devices_file: if *self.devices_file.lock().unwrap() {
                dev()
            } else {
                BTreeSet::new()
            },
            vg: self.vg.lock().unwrap().clone(),
            orphan_pvs: if *self.orphan_label.lock().unwrap() {
                dev()
            } else {
                BTreeSet::new()
            },
            lockspace_started: *self.lockspace.lock().unwrap(),
            lvs: self.lvs.lock().unwrap().clone(),
        })
    }

    async fn execute_leave(&self, action: &LeaveAction) -> lvms_host::Result<()> {
        self.tried.lock().unwrap().push(action.clone());
        match action {
            LeaveAction::StartLockspace { .. } => *self.lockspace.lock().unwrap() = true,
            LeaveAction::StopLockspace { .. } => *self.lockspace.lock().unwrap() = false,
            LeaveAction::RemovePool { pool, .. } => {
                self.lvs.lock().unwrap().retain(|l| &l.name != pool)
            }
            LeaveAction::RemoveVolumeGroup { .. } => {
                if *self.others_joined.lock().unwrap() {
                    return Err(lvms_host::Error::InUse(
                        "Lockspace for \"san\" not stopped on other hosts".into(),
                    ));
                }
                *self.vg.lock().unwrap() = None;
                *self.lockspace.lock().unwrap() = false;
                *self.orphan_label.lock().unwrap() = true;
            }
            LeaveAction::RemovePhysicalVolumes { .. } => *self.orphan_label.lock().unwrap() = false,
            LeaveAction::RemoveDevicesFile { .. } => *self.devices_file.lock().unwrap() = false,
        }
        Ok(())
    }
}

/// The shared class, being deleted, as the API server has it; a joined host of it.
fn leaving(api: &FakeApi, lvs: Vec<SharedLv>) -> (LVMVolumeGroup, SanHost) {
    let mut vg = shared_vg();
    vg.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    api.insert(SAN_VG, serde_json::to_value(&vg).unwrap());
    let vg: LVMVolumeGroup = serde_json::from_value(api.get(SAN_VG).unwrap()).unwrap();
    host_ids(api, json!({"node-a": "3", "node-b": "4"}));
    let host = SanHost::new(api, true);
    *host.lockspace.lock().unwrap() = true;
    *host.lvs.lock().unwrap() = lvs;
    (vg, host)
}

/// The class's finalizers; `Null` once none is left (the API server then drops the object, which
/// is being deleted).
fn san_finalizers(api: &FakeApi) -> Value {
    api.get(SAN_VG)
        .map_or(Value::Null, |vg| vg["metadata"]["finalizers"].clone())
}

fn lv(name: &str, segtype: &str, pool: Option<&str>) -> SharedLv {
    SharedLv {
        name: name.into(),
        segtype: segtype.into(),
        pool_lv: pool.map(str::to_owned),
    }
}

#[tokio::test]
async fn a_removed_shared_class_holding_volumes_names_them_keeps_its_lockspace_and_stays_served() {
    let api = FakeApi::new();
    let ctx = context(&api);
    let (vg, host) = leaving(
        &api,
        vec![
            lv("pool-1", "thin-pool", None),
            lv("vol-1", "thin", Some("pool-1")),
        ],
    );
    let apis: Api<LVMVolumeGroup> = Api::namespaced(api.client("lvms"), "lvms");
    let action = leave(&ctx, &host, &apis, &vg).await.unwrap();
    assert_eq!(action, Action::requeue(RETRY));
    let entry = api.get(PATH).unwrap()["spec"]["nodeStatus"][0].clone();
    assert_eq!(entry["status"], "Failed");
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("ManualCleanupRequired") && reason.contains("pool-1, vol-1"),
        "{reason}"
    );
    assert!(host.tried().is_empty(), "{:?}", host.tried());
    assert!(*host.lockspace.lock().unwrap());
    assert!(ctx.backend().borrow().is_some(), "still served");
    assert_eq!(
        requests_to(&api, LEASE),
        0,
        "no remover while volumes remain"
    );
    assert_eq!(
        san_finalizers(&api),
        json!([lvms_api::node_cleanup_finalizer("node-a")])
    );
}

#[tokio::test]
async fn a_node_that_does_not_hold_the_creator_lease_stops_its_lockspace_and_drops_its_finalizer() {
    let api = FakeApi::new();
    api.insert(
        LEASE,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lvms-shared-create-san", "namespace": "lvms"},
               "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 360,
                        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            k8s_openapi::jiff::Timestamp::now())}}),
    );
    let ctx = context(&api);
    let (vg, host) = leaving(&api, Vec::new());
    let apis: Api<LVMVolumeGroup> = Api::namespaced(api.client("lvms"), "lvms");
    let action = leave(&ctx, &host, &apis, &vg).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(
        host.tried(),
        [
            LeaveAction::StopLockspace { vg: "san".into() },
            LeaveAction::RemoveDevicesFile {
                file: "lvms-san.devices".into()
            },
        ]
    );
    assert!(
        host.vg.lock().unwrap().is_some(),
        "the group is node-b's to remove"
    );
    assert_eq!(san_finalizers(&api), Value::Null);
    assert!(ctx.backend().borrow().is_none());
}

#[tokio::test]
async fn the_lease_holder_removes_the_empty_group_once_the_others_left_then_drops_its_finalizer() {
    let api = FakeApi::new();
    let ctx = context(&api);
    let (vg, host) = leaving(&api, vec![lv("pool-9", "thin-pool", None)]);
    *host.others_joined.lock().unwrap() = true;
    let apis: Api<LVMVolumeGroup> = Api::namespaced(api.client("lvms"), "lvms");
    let action = leave(&ctx, &host, &apis, &vg).await.unwrap();
    assert_eq!(action, Action::requeue(SHARED_WAIT));
    assert_eq!(api.get(LEASE).unwrap()["spec"]["holderIdentity"], "node-a");
    let entry = api.get(PATH).unwrap()["spec"]["nodeStatus"][0].clone();
    assert_eq!(entry["status"], "Progressing");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("other nodes still have the lockspace"),
        "{entry}"
    );
    assert!(
        ctx.backend().borrow().is_none(),
        "not served while the group goes"
    );
    assert!(host.vg.lock().unwrap().is_some());
    assert!(san_finalizers(&api).is_array());

    *host.others_joined.lock().unwrap() = false;
    let vg: LVMVolumeGroup = serde_json::from_value(api.get(SAN_VG).unwrap()).unwrap();
    let action = leave(&ctx, &host, &apis, &vg).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(
        host.tried(),
        [
            LeaveAction::RemovePool {
                vg: "san".into(),
                pool: "pool-9".into()
            },
            LeaveAction::RemoveVolumeGroup { vg: "san".into() },
            LeaveAction::RemoveVolumeGroup { vg: "san".into() },
            LeaveAction::RemovePhysicalVolumes {
                file: "lvms-san.devices".into(),
                pvs: vec!["/dev/sdx".into()]
            },
            LeaveAction::RemoveDevicesFile {
                file: "lvms-san.devices".into()
            },
        ]
    );
    assert_eq!(san_finalizers(&api), Value::Null);
    let status = api.get(PATH).unwrap_or_default();
    assert!(
        !status.to_string().contains("\"san\""),
        "no entry for the class: {status}"
    );
}

/// Reconciles the shared class once over `host`; the class's entry in the node status object.
async fn reconcile_san(
    api: &FakeApi,
    ctx: &Context<&'static RealRunner, FakeBackend>,
    host: &SanHost,
) -> (Action, Value) {
    let vg = shared_vg();
    let config = volume_group::device_class_config(&vg).unwrap();
    assert!(config.is_shared(), "the policy reaches the engine's config");
    let apis: Api<LVMVolumeGroup> = Api::namespaced(api.client("lvms"), "lvms");
    let node: Node = serde_json::from_value(json!({"metadata": {"name": "node-a"}})).unwrap();
    let action = converge(ctx, &ctx.host, host, &apis, &vg, &node, &config)
        .await
        .unwrap();
    let status = api.get(PATH).unwrap();
    (action, status["spec"]["nodeStatus"][0].clone())
}

fn requests_to(api: &FakeApi, path: &str) -> usize {
    api.requests()
        .iter()
        .filter(|r| r.path.starts_with(path))
        .count()
}

#[tokio::test]
async fn a_shared_class_waits_for_the_operator_to_assign_a_host_id_and_never_guesses_one() {
    let api = FakeApi::new();
    let ctx = context(&api);
    let host = SanHost::new(&api, false);
    for record in [
        None,
        Some(json!({"node-b": "1"})),
        Some(json!({"node-a": "0"})),
    ] {
        if let Some(data) = record {
            host_ids(&api, data);
        }
        let (action, entry) = reconcile_san(&api, &ctx, &host).await;
        assert_eq!(action, Action::requeue(SHARED_WAIT));
        assert_eq!(entry["status"], "Progressing");
        let reason = entry["reason"].as_str().unwrap();
        assert!(
            reason.contains("the operator has not assigned this node")
                && reason.contains("lvms/lvms-sanlock-host-ids"),
            "{reason}"
        );
        assert_eq!(entry["shared"]["lockspace"], "NotJoined");
        assert_eq!(entry["shared"]["reason"], reason);
        assert!(entry["shared"].get("hostId").is_none(), "{entry}");
        assert_eq!(entry["shared"]["ioTimeoutSeconds"], 10);
    }
    assert!(host.executed().is_empty());
    assert_eq!(requests_to(&api, LEASE), 0, "no host id, no creator Lease");
    assert!(ctx.backend().borrow().is_none(), "not served");
}

#[tokio::test]
async fn a_node_that_does_not_hold_the_creator_lease_waits_for_the_volume_group() {
    let api = FakeApi::new();
    host_ids(&api, json!({"node-a": "3", "node-b": "1"}));
    api.insert(
        LEASE,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lvms-shared-create-san", "namespace": "lvms"},
               "spec": {"holderIdentity": "node-b", "leaseDurationSeconds": 360,
                        "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                            k8s_openapi::jiff::Timestamp::now())}}),
    );
    let before = api.get(LEASE).unwrap();
    let ctx = context(&api);
    let host = SanHost::new(&api, false);
    let (action, entry) = reconcile_san(&api, &ctx, &host).await;
    assert_eq!(action, Action::requeue(SHARED_WAIT));
    assert_eq!(entry["status"], "Progressing");
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.contains("waiting for the node that creates shared volume group san")
            && reason.contains("node node-b holds the creator Lease lvms-shared-create-san"),
        "{reason}"
    );
    assert_eq!(entry["shared"]["hostId"], 3);
    assert_eq!(entry["shared"]["devicesVisible"], true);
    assert!(host.executed().is_empty(), "{:?}", host.executed());
    assert_eq!(api.get(LEASE), Some(before), "node-b's Lease is untouched");

    // node-b made the group: this node joins, and asks for no Lease.
    *host.vg.lock().unwrap() = Some(made_vg());
    api.clear_requests();
    let (action, entry) = reconcile_san(&api, &ctx, &host).await;
    assert_eq!(entry["status"], "Ready", "{entry}");
    assert_eq!(entry["shared"]["lockspace"], "Joined");
    assert_eq!(action, Action::requeue(DYNAMIC_REQUEUE));
    assert!(matches!(
        host.executed().as_slice(),
        [(shared::Action::StartLockspace { host_id: 3, .. }, _)]
    ));
    assert_eq!(requests_to(&api, LEASE), 0);
}

#[tokio::test]
async fn the_node_holding_the_creator_lease_creates_the_volume_group_joins_and_serves_it() {
    let api = FakeApi::new();
    host_ids(&api, json!({"node-a": "3"}));
    let ctx = context(&api);
    let rx = ctx.backend();
    let host = SanHost::new(&api, false);
    let (action, entry) = reconcile_san(&api, &ctx, &host).await;
    let executed = host.executed();
    assert_eq!(
        executed,
        [(
            shared::Action::CreateVolumeGroup {
                name: "san".into(),
                pvs: vec!["/dev/sdx".into()],
                tags: vec![VG_OWNER_TAG.into()],
                host_id: 3,
            },
            Some("node-a".to_owned())
        )],
        "created once, while node-a held the Lease"
    );
    assert_eq!(entry["status"], "Ready", "{entry}");
    assert_eq!(entry["reason"], Value::Null);
    assert_eq!(
        entry["shared"],
        json!({"devicesVisible": true, "lockspace": "Joined", "hostId": 3,
               "ioTimeoutSeconds": 10})
    );
    assert_eq!(action, Action::requeue(DYNAMIC_REQUEUE));
    let served = rx.borrow().clone();
    assert!(served.is_some(), "a joined class is served");
    // Left to expire (see creator_lease): the holder renews it no more once the group exists.
    api.clear_requests();
    reconcile_san(&api, &ctx, &host).await;
    assert_eq!(requests_to(&api, LEASE), 0);
    assert_eq!(api.get(LEASE).unwrap()["spec"]["holderIdentity"], "node-a");
}

#[tokio::test]
async fn a_creator_whose_lease_another_node_took_over_does_not_create() {
    let api = FakeApi::new();
    host_ids(&api, json!({"node-a": "3"}));
    let ctx = context(&api);
    let host = SanHost::new(&api, false);
    // The holder's renewal is refused (someone wrote the Lease since it was read, every time).
    api.insert(
        LEASE,
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": "lvms-shared-create-san", "namespace": "lvms"},
               "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 360,
                        "renewTime": "2020-01-01T00:00:00.000000Z"}}),
    );
    api.fail(http::Method::PUT, LEASE, http::StatusCode::CONFLICT, 100);
    let (action, entry) = reconcile_san(&api, &ctx, &host).await;
    assert!(host.executed().is_empty(), "{:?}", host.executed());
    assert_eq!(action, Action::requeue(SHARED_WAIT));
    assert_eq!(entry["status"], "Progressing");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("changed under every attempt"),
        "{entry}"
    );
}

#[tokio::test]
async fn missing_lock_daemons_fail_the_class_naming_both_and_the_start_command() {
    let api = FakeApi::new();
    api.insert(
        "/api/v1/nodes/node-a",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    );
    let vg = shared_vg();
    api.insert(SAN_VG, serde_json::to_value(&vg).unwrap());
    host_ids(&api, json!({"node-a": "3"}));
    // The real host over a scripted runner: sanlock is not installed and lvmlockd has no socket;
    // nothing else may run.
    let fake = lvms_host::fake::FakeRunner::new();
    fake.expect(&["sanlock", "client", "status"]).spawn_fails();
    let ctx = Arc::new(Context::new(
        api.client("lvms"),
        "node-a",
        "lvms",
        RealNodeHost::new(fake.clone()),
        RealSharedHost::new(fake.clone()),
        Box::new(|_| FakeBackend::new()),
    ));
    let action = reconcile(Arc::new(vg), ctx.clone()).await.unwrap();
    fake.assert_done();
    assert_eq!(action, Action::requeue(RETRY));
    let entry = api.get(PATH).unwrap()["spec"]["nodeStatus"][0].clone();
    assert_eq!(entry["name"], "san");
    assert_eq!(entry["status"], "Failed");
    assert_eq!(entry["shared"]["lockspace"], "NotJoined");
    let reason = entry["reason"].as_str().unwrap();
    for word in [
        "sanlock is not installed",
        "lvmlockd is not running",
        "systemctl enable --now sanlock",
        "systemctl enable --now lvmlockd",
    ] {
        assert!(reason.contains(word), "{word:?} missing from {reason}");
    }
    assert_eq!(requests_to(&api, LEASE), 0);
    assert!(ctx.backend().borrow().is_none());
}

#[test]
fn only_a_change_of_this_nodes_host_id_entry_looks_at_the_shared_classes_again() {
    let record = |data: Value| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": "lvms-sanlock-host-ids"}, "data": data}))
            .unwrap()
    };
    let last = std::sync::Mutex::new(None);
    assert!(
        host_id_entry_changed(&last, &record(json!({})), "node-a"),
        "first look"
    );
    assert!(!host_id_entry_changed(
        &last,
        &record(json!({"node-b": "1"})),
        "node-a"
    ));
    assert!(host_id_entry_changed(
        &last,
        &record(json!({"node-a": "2"})),
        "node-a"
    ));
    assert!(!host_id_entry_changed(
        &last,
        &record(json!({"node-a": "2", "node-c": "3"})),
        "node-a"
    ));
}

/// `NodeGetInfo` waits on `settling` (see `crate::switch`): it starts from the shared classes whose
/// LVMVolumeGroup selects this node and follows each class's status from then on.
#[tokio::test]
async fn settling_lists_the_shared_classes_this_node_is_still_joining() {
    let api = FakeApi::new();
    api.insert(
        "/api/v1/nodes/node-a",
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "node-a", "labels": {"zone": "a"}}}),
    );
    api.insert(SAN_VG, serde_json::to_value(shared_vg()).unwrap());
    let mut elsewhere = shared_vg();
    elsewhere.metadata.name = Some("far".into());
    elsewhere.spec.node_selector = serde_json::from_value(json!({"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]}]}))
    .unwrap();
    api.insert(
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/far",
        serde_json::to_value(elsewhere).unwrap(),
    );
    api.insert(
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/local",
        json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
               "metadata": {"name": "local", "namespace": "lvms"}, "spec": {}}),
    );
    let ctx = context(&api);
    let settling = ctx.settling();
    let pending = || settling.borrow().clone();
    assert_eq!(pending(), None, "unknown until the first look");
    ctx.seed_settling().await;
    assert_eq!(pending(), Some(BTreeSet::from(["san".to_owned()])));

    let shared = |status: VGStatusType| VGStatus {
        name: "san".into(),
        status: Some(status),
        shared: Some(Box::default()),
        ..VGStatus::default()
    };
    ctx.record("san", Some(shared(VGStatusType::Progressing)), None)
        .await
        .unwrap();
    assert_eq!(pending(), Some(BTreeSet::from(["san".to_owned()])));
    ctx.record("san", Some(shared(VGStatusType::Ready)), None)
        .await
        .unwrap();
    assert_eq!(pending(), Some(BTreeSet::new()), "joined: settled");
    ctx.record("local", Some(ready("local")), None)
        .await
        .unwrap();
    assert_eq!(pending(), Some(BTreeSet::new()), "local classes never wait");
    // A class added (or joined again) later waits again; failed or gone, it has settled.
    ctx.record("san", Some(shared(VGStatusType::Progressing)), None)
        .await
        .unwrap();
    assert_eq!(pending(), Some(BTreeSet::from(["san".to_owned()])));
    ctx.record("san", Some(shared(VGStatusType::Failed)), None)
        .await
        .unwrap();
    assert_eq!(pending(), Some(BTreeSet::new()));
    ctx.record("san", Some(shared(VGStatusType::Progressing)), None)
        .await
        .unwrap();
    ctx.record("san", None, None).await.unwrap();
    assert_eq!(pending(), Some(BTreeSet::new()));
}

#[tokio::test]
async fn settling_waits_for_nothing_when_the_volume_groups_cannot_be_read() {
    let api = FakeApi::new();
    let ctx = context(&api);
    ctx.seed_settling().await;
    assert_eq!(*ctx.settling().borrow(), Some(BTreeSet::new()));
}

/// A class new to the node is `Progressing` with its lockspace `Joining` while the join runs (so
/// `NodeGetInfo` waits for it); once reported, it is not set back to `Joining` at the next look.
#[tokio::test]
async fn a_class_new_to_the_node_reports_joining_before_the_join_runs() {
    let api = FakeApi::new();
    host_ids(&api, json!({"node-a": "3"}));
    let ctx = context(&api);
    ctx.seed_settling().await;
    let host = SanHost::new(&api, true);
    let (_, entry) = reconcile_san(&api, &ctx, &host).await;
    assert_eq!(entry["status"], "Ready", "{entry}");
    let applied: Vec<Value> = api
        .requests()
        .iter()
        .filter(|r| r.path == PATH && r.method == http::Method::PATCH)
        .map(|r| r.body["spec"]["nodeStatus"][0].clone())
        .collect();
    let [joining, joined] = applied.as_slice() else {
        panic!("{applied:?}")
    };
    assert_eq!(joining["status"], "Progressing");
    assert_eq!(joining["reason"], "joining shared volume group san");
    assert_eq!(
        joining["shared"],
        json!({"lockspace": "Joining", "hostId": 3, "ioTimeoutSeconds": 10,
               "reason": "joining shared volume group san"})
    );
    assert_eq!(joined["shared"]["lockspace"], "Joined");
    assert_eq!(*ctx.settling().borrow(), Some(BTreeSet::new()));

    api.clear_requests();
    reconcile_san(&api, &ctx, &host).await;
    assert_eq!(
        requests_to(&api, PATH),
        0,
        "joined and unchanged: nothing written"
    );
}
