//! The node status object over the in-memory API server (the disk side runs in the VM: `vm_agent`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    let class = |name: &str| ClassInfo {
        name: name.into(),
        thin_pool: None,
        overprovision_ratio: 1,
        default: false,
        layout: lvms_csi::backend::LvType::Linear,
        fstype: None,
        shared: None,
    };
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

#[tokio::test]
async fn a_wipe_is_recorded_before_it_runs_and_never_repeats_after_a_restart() {
    let api = FakeApi::new();
    let host = WipeHost::new(&api);
    let ctx = context(&api);
    let err = converge_class(&ctx, &host, &force_wipe_class(), &[])
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
    let report = converge_class(&ctx, &host, &force_wipe_class(), &[])
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
    let err = converge_class(&ctx, &host, &force_wipe_class(), &[])
        .await
        .unwrap_err();
    assert!(
        matches!(err, lvms_host::Error::WipeNotRecorded { ref device, .. } if device == "/dev/vdb"),
        "{err}"
    );
    assert!(host.executed().is_empty(), "{:?}", host.executed());
    // The failed record is not remembered either: the next try records, then wipes.
    converge_class(&ctx, &host, &force_wipe_class(), &[])
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

#[tokio::test]
async fn a_shared_class_is_reported_as_not_served_and_no_command_runs() {
    let api = FakeApi::new();
    api.insert(
        "/api/v1/nodes/node-a",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"}}),
    );
    let vg: LVMVolumeGroup = serde_json::from_value(json!({
        "apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
        "metadata": {"name": "san", "namespace": "lvms",
                     "finalizers": [lvms_api::node_cleanup_finalizer("node-a")]},
        "spec": {"deviceAccessPolicy": "shared",
                 "deviceSelector": {"paths": ["/dev/disk/by-id/wwn-0x600a"]}}}))
    .unwrap();
    api.insert(
        "/apis/lvm.topolvm.io/v1alpha1/namespaces/lvms/lvmvolumegroups/san",
        serde_json::to_value(&vg).unwrap(),
    );
    let config = volume_group::device_class_config(&vg).unwrap();
    assert!(
        config.is_shared(),
        "the policy reaches the node engine's config"
    );
    // A runner that expects nothing: any command the agent ran would panic.
    let fake = lvms_host::fake::FakeRunner::new();
    let ctx = Arc::new(Context::new(
        api.client("lvms"),
        "node-a",
        "lvms",
        RealNodeHost::new(fake.clone()),
        Box::new(|_| FakeBackend::new()),
    ));
    reconcile(Arc::new(vg), ctx).await.unwrap();
    assert!(fake.calls().is_empty());
    let status = api.get(PATH).unwrap();
    let entry = &status["spec"]["nodeStatus"][0];
    assert_eq!(entry["name"], "san");
    assert_eq!(entry["status"], "Failed");
    assert_eq!(entry["shared"]["lockspace"], "NotJoined");
    assert!(
        entry["reason"]
            .as_str()
            .unwrap()
            .contains("leaves the LUN untouched"),
        "{entry}"
    );
}
