//! The node agent's reconcilers against real LVM inside the test VM (`cargo xtask vm-test agent_`), with
//! the in-memory API server standing in for Kubernetes: the objects go through a real `kube::Client`,
//! the volumes through the same backend `lvms standalone` uses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod vm_agent {
    use std::sync::Arc;

    use http::{Method, StatusCode};
    use kube::runtime::controller::Action;
    use lvms_api::{LOGICAL_VOLUME_FINALIZER, LVMVolumeGroup, topolvm::LogicalVolume};
    use lvms_engine::{ids, local::LocalBackend};
    use lvms_host::{
        engine::RealNodeHost, lvm::Lvm, runner::RealRunner, shared::RealSharedHost, shell::LvmShell,
    };
    use lvms_node::{lv_reconciler, vg_reconciler};
    use lvms_testkit::{Scratch, fake_api::FakeApi, lvs_field, sh, sh_status, vgs_field};
    use serde_json::{Value, json};

    static RUNNER: RealRunner = RealRunner;
    const NODE: &str = "vm-node";
    const NS: &str = "lvms";
    const MIB: u64 = 1 << 20;

    type VgContext = vg_reconciler::Context<&'static RealRunner, LocalBackend<LvmShell>>;

    /// A node agent as it starts: nothing remembered, the backend made once classes are ready.
    fn agent(api: &FakeApi) -> Arc<VgContext> {
        Arc::new(vg_reconciler::Context::new(
            api.client(NS),
            NODE,
            NS,
            RealNodeHost::new(&RUNNER),
            RealSharedHost::new(&RUNNER),
            Box::new(|classes| LocalBackend::new(NODE, classes, Lvm::new(LvmShell::new()))),
        ))
    }

    fn lv_context(
        api: &FakeApi,
        agent: &VgContext,
    ) -> Arc<lv_reconciler::Context<LocalBackend<LvmShell>>> {
        Arc::new(lv_reconciler::Context {
            client: api.client(NS),
            node: NODE.into(),
            backend: agent.backend(),
            old_driver_socket: None,
        })
    }

    fn vg_path(name: &str) -> String {
        format!("/apis/lvm.topolvm.io/v1alpha1/namespaces/{NS}/lvmvolumegroups/{name}")
    }

    fn status_path() -> String {
        format!("/apis/lvm.topolvm.io/v1alpha1/namespaces/{NS}/lvmvolumegroupnodestatuses/{NODE}")
    }

    fn lv_path(name: &str) -> String {
        format!("/apis/topolvm.io/v1/logicalvolumes/{name}")
    }

    fn typed<K: serde::de::DeserializeOwned>(api: &FakeApi, path: &str) -> Arc<K> {
        Arc::new(serde_json::from_value(api.get(path).expect("object exists")).unwrap())
    }

    /// The class's entry in the node's status object.
    fn vg_entry(api: &FakeApi, class: &str) -> Option<Value> {
        api.get(&status_path()).and_then(|s| {
            s["spec"]["nodeStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == class)
                .cloned()
        })
    }

    /// The in-memory API server holding this node's `Node`.
    fn cluster() -> FakeApi {
        let api = FakeApi::new();
        api.insert(
            &format!("/api/v1/nodes/{NODE}"),
            json!({"apiVersion": "v1", "kind": "Node",
                   "metadata": {"name": NODE, "labels": {"kubernetes.io/hostname": NODE}}}),
        );
        api
    }

    /// Puts `LVMVolumeGroup` `class` with `spec`, keeping the metadata of the one already there.
    fn put_vg(api: &FakeApi, class: &str, spec: Value) {
        let metadata = api.get(&vg_path(class)).map_or_else(
            || json!({"name": class, "namespace": NS}),
            |v| v["metadata"].clone(),
        );
        api.insert(
            &vg_path(class),
            json!({"apiVersion": "lvm.topolvm.io/v1alpha1", "kind": "LVMVolumeGroup",
                   "metadata": metadata, "spec": spec}),
        );
    }

    /// One reconcile of `LVMVolumeGroup` `class` by `agent`.
    async fn reconcile_vg(api: &FakeApi, class: &str, agent: &Arc<VgContext>) -> Action {
        vg_reconciler::reconcile(typed::<LVMVolumeGroup>(api, &vg_path(class)), agent.clone())
            .await
            .unwrap()
    }

    /// Puts `LogicalVolume` `name` of `size` on this node and lets `agent` make it.
    async fn make_lv(api: &FakeApi, name: &str, size: &str, agent: &VgContext) {
        api.insert(
            &lv_path(name),
            json!({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                   "metadata": {"name": name},
                   "spec": {"name": name, "nodeName": NODE, "size": size}}),
        );
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(api, &lv_path(name)),
            lv_context(api, agent),
        )
        .await
        .unwrap();
    }

    /// Deletes `LogicalVolume` `name` and lets `agent` remove its LV and finalizer.
    async fn delete_lv(api: &FakeApi, name: &str, agent: &VgContext) {
        api.delete(&lv_path(name));
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(api, &lv_path(name)),
            lv_context(api, agent),
        )
        .await
        .unwrap();
        assert!(api.get(&lv_path(name)).is_none(), "{name} released");
    }

    fn assert_vg_gone(class: &str) {
        assert_ne!(
            sh_status(&format!("lvm vgs {class}")).0,
            0,
            "volume group {class} removed"
        );
    }

    /// The LV names in `vg`, hidden ones left out, sorted.
    fn lv_names(vg: &str) -> Vec<String> {
        let mut names: Vec<String> = sh(&format!("lvm lvs --noheadings -o lv_name {vg}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_builds_the_class_serves_a_volume_adopts_it_after_a_crash_and_cleans_up() {
        let mut s = Scratch::new(1, 1200);
        let class = s.vg_name();
        let disk = s.disks[0].clone();
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"deviceSelector": {"paths": [disk]},
                   "thinPoolConfig": {"name": "pool", "overprovisionRatio": 10},
                   "default": true}),
        );

        // The LVMVolumeGroup becomes a volume group with a thin pool and a Ready status.
        let agent1 = agent(&api);
        let action = reconcile_vg(&api, &class, &agent1).await;
        assert_eq!(
            action,
            Action::await_change(),
            "Static discovery: converge once"
        );
        assert!(vgs_field(&class, "vg_tags").contains("lvms"));
        assert!(lvs_field(&class, "pool", "lv_attr").starts_with('t'));
        let entry = vg_entry(&api, &class).expect("the node reports the class");
        assert_eq!(entry["status"], "Ready", "{entry}");
        assert_eq!(entry["devices"], json!([disk]));
        assert_eq!(
            api.get(&vg_path(&class)).unwrap()["metadata"]["finalizers"],
            json!([format!("cleanup.vgmanager.node.topolvm.io/{NODE}")])
        );
        assert_eq!(
            api.get(&status_path()).unwrap()["metadata"]["finalizers"],
            json!(["delete-protection.lvm.openshift.io"])
        );
        assert!(agent1.backend().borrow().is_some(), "the class is served");

        // A LogicalVolume of the default class; the agent dies after lvcreate, before the status.
        api.insert(
            &lv_path("pvc-a"),
            json!({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                   "metadata": {"name": "pvc-a"},
                   "spec": {"name": "pvc-a", "nodeName": NODE, "size": "64Mi"}}),
        );
        api.fail(
            Method::PATCH,
            &format!("{}/status", lv_path("pvc-a")),
            StatusCode::SERVICE_UNAVAILABLE,
            1,
        );
        let id = ids::volume_lv_name("pvc-a");
        let err = lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-a")),
            lv_context(&api, &agent1),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, lv_reconciler::Error::Kube { .. }), "{err}");
        assert_eq!(lvs_field(&class, &id, "lv_size"), (64 * MIB).to_string());
        assert!(api.get(&lv_path("pvc-a")).unwrap().get("status").is_none());
        drop(agent1);

        // A restarted agent converges without touching the disk again and records the LV it finds.
        let agent2 = agent(&api);
        reconcile_vg(&api, &class, &agent2).await;
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-a")),
            lv_context(&api, &agent2),
        )
        .await
        .unwrap();
        let lv = api.get(&lv_path("pvc-a")).unwrap();
        assert_eq!(lv["status"]["volumeID"], json!(id));
        assert_eq!(lv["status"]["currentSize"], json!((64 * MIB).to_string()));
        assert_eq!(
            lv["metadata"]["finalizers"],
            json!([LOGICAL_VOLUME_FINALIZER])
        );
        let mut want = vec!["pool".to_owned(), id.clone()];
        want.sort();
        assert_eq!(lv_names(&class), want, "no duplicate");

        // Growing spec.size grows the LV.
        let mut grown = api.get(&lv_path("pvc-a")).unwrap();
        grown["spec"]["size"] = json!("128Mi");
        api.insert(&lv_path("pvc-a"), grown);
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-a")),
            lv_context(&api, &agent2),
        )
        .await
        .unwrap();
        assert_eq!(lvs_field(&class, &id, "lv_size"), (128 * MIB).to_string());
        assert_eq!(
            api.get(&lv_path("pvc-a")).unwrap()["status"]["currentSize"],
            json!((128 * MIB).to_string())
        );

        // Deleting the LVMVolumeGroup while a volume remains keeps everything and says why.
        api.delete(&vg_path(&class));
        reconcile_vg(&api, &class, &agent2).await;
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Failed");
        let reason = entry["reason"].as_str().unwrap();
        assert!(
            reason.contains("ManualCleanupRequired") && reason.contains(&id),
            "{reason}"
        );
        assert!(api.get(&vg_path(&class)).is_some(), "the finalizer stays");

        // The volume can still be deleted; then cleanup removes pool, group and labels.
        delete_lv(&api, "pvc-a", &agent2).await;
        assert_eq!(lv_names(&class), ["pool"]);

        reconcile_vg(&api, &class, &agent2).await;
        assert_ne!(
            sh_status(&format!("lvm vgs {class}")).0,
            0,
            "volume group removed"
        );
        assert_ne!(sh_status(&format!("lvm pvs {disk}")).0, 0, "label wiped");
        assert!(
            api.get(&vg_path(&class)).is_none(),
            "finalizer removed, object gone"
        );
        assert_eq!(vg_entry(&api, &class), None);
        assert!(agent2.backend().borrow().is_none(), "nothing served");
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_force_wipes_a_device_once_and_never_again() {
        let mut s = Scratch::new(1, 1200);
        let class = s.vg_name();
        let disk = s.disks[0].clone();
        sh(&format!("mkfs.ext4 -q {disk} && udevadm settle"));
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"deviceSelector": {"paths": [disk], "forceWipeDevicesAndDestroyAllData": true}}),
        );

        // The ext4 signature is wiped, the wipe recorded, and the group built on the disk.
        let agent1 = agent(&api);
        reconcile_vg(&api, &class, &agent1).await;
        reconcile_vg(&api, &class, &agent1).await;
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Ready", "{entry}");
        assert_eq!(entry["wipedDevices"], json!([disk]), "{entry}");
        assert_eq!(vgs_field(&class, "pv_count").trim(), "1");

        // The group is taken apart behind the agent's back and a filesystem written on the disk.
        sh(&format!(
            "lvm vgremove -f {class} && lvm pvremove -y {disk} && mkfs.xfs -q -f {disk} && udevadm settle"
        ));
        // A restarted agent reads the record and leaves the data alone, saying why.
        let agent2 = agent(&api);
        agent2.load_node_status().await.unwrap();
        reconcile_vg(&api, &class, &agent2).await;
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Failed", "{entry}");
        assert!(
            entry["reason"]
                .as_str()
                .unwrap()
                .contains("never wipes a device twice"),
            "{entry}"
        );
        assert_eq!(entry["wipedDevices"], json!([disk]), "{entry}");
        assert_eq!(
            sh(&format!("blkid -p -o value -s TYPE {disk}")).trim(),
            "xfs",
            "the filesystem is still there"
        );
    }

    /// Removes volume group `vg` and the LVM labels of its devices when dropped, so a failed test
    /// leaves the VM's disks free for the next.
    struct Release(String);

    impl Drop for Release {
        fn drop(&mut self) {
            let vg = &self.0;
            let _ = sh_status(&format!(
                "pvs=$(lvm pvs --noheadings -o pv_name -S vg_name={vg}); \
                 lvm vgremove -ff -y {vg} >/dev/null 2>&1; \
                 for p in $pvs; do lvm pvremove -ff -y $p >/dev/null 2>&1; done"
            ));
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_without_paths_discovers_the_free_disks_and_leaves_the_rest() {
        // A blank loop device: not a whole disk, so never discovered.
        let s = Scratch::new(1, 1200);
        let class = "discovered".to_owned();
        let _release = Release(class.clone());
        // Every virtio disk and what it held before.
        let before: Vec<(String, String)> = sh("ls /dev/disk/by-id/ | grep '^virtio-' || true")
            .split_whitespace()
            .map(|link| {
                let dev = sh(&format!("readlink -f /dev/disk/by-id/{link}"))
                    .trim()
                    .to_owned();
                let sig = sh_status(&format!("blkid -p -o value -s TYPE {dev}"))
                    .1
                    .trim()
                    .to_owned();
                (dev, sig)
            })
            .collect();
        let clean = |serial: &str| {
            sh(&format!("readlink -f /dev/disk/by-id/virtio-{serial}"))
                .trim()
                .to_owned()
        };
        let (clean0, clean1) = (clean("clean0"), clean("clean1"));
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"thinPoolConfig": {"name": "pool", "overprovisionRatio": 2}}),
        );
        // Another class lists clean1 (by its by-id link): discovery leaves it to that class.
        put_vg(
            &api,
            "other",
            json!({"deviceSelector": {"paths": ["/dev/disk/by-id/virtio-clean1"]}}),
        );

        let agent1 = agent(&api);
        reconcile_vg(&api, &class, &agent1).await;
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Ready", "{entry}");
        assert_eq!(entry["deviceDiscoveryPolicy"], "RuntimeStatic", "{entry}");
        let members: Vec<String> = entry["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_owned())
            .collect();
        assert!(members.contains(&clean0), "{members:?}");
        assert!(
            !members.contains(&clean1),
            "listed by another class: {members:?}"
        );
        assert!(!members.contains(&s.disks[0]), "a loop device: {members:?}");
        for (dev, sig) in &before {
            if members.contains(dev) {
                assert_eq!(sig, "", "{dev} held {sig} and was taken");
            } else {
                let now = sh_status(&format!("blkid -p -o value -s TYPE {dev}")).1;
                assert_eq!(now.trim(), sig, "{dev} changed");
            }
        }
        assert!(lvs_field(&class, "pool", "lv_attr").starts_with('t'));
        // Every disk the class did not take is reported with its reasons, except clean1.
        let excluded = entry["excluded"].as_array().cloned().unwrap_or_default();
        assert!(
            excluded.iter().all(|e| e["name"] != json!(clean1)),
            "{entry}"
        );

        // Deleting the LVMVolumeGroup gives the disks back.
        api.delete(&vg_path(&class));
        reconcile_vg(&api, &class, &agent1).await;
        assert_vg_gone(&class);
        for dev in &members {
            assert_eq!(
                sh_status(&format!("blkid -p -o value -s TYPE {dev}"))
                    .1
                    .trim(),
                "",
                "{dev} released"
            );
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_takes_over_a_volume_topolvm_made_only_once_its_node_plugin_is_gone() {
        let mut s = Scratch::new(1, 1200);
        let class = s.vg_name();
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"deviceSelector": {"paths": [s.disks[0]]}, "default": true,
                   "thinPoolConfig": {"name": "thin-pool-1", "sizePercent": 50,
                                      "overprovisionRatio": 5}}),
        );
        let agent1 = agent(&api);
        reconcile_vg(&api, &class, &agent1).await;
        // As TopoLVM leaves it: the LV named after the object's UID with no tag, the object with
        // TopoLVM's finalizer, label and status (topolvm internal/controller/logicalvolume_controller.go).
        let uid = "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
        sh(&format!(
            "lvm lvcreate -q -y -T {class}/thin-pool-1 -n {uid} -V 64m -W y 2>&1 && \
             printf 'topolvm-data' | dd of=/dev/{class}/{uid} conv=fsync,notrunc status=none"
        ));
        api.insert(
            &lv_path("pvc-old"),
            json!({"apiVersion": "topolvm.io/v1", "kind": "LogicalVolume",
                   "metadata": {"name": "pvc-old", "uid": uid,
                                "finalizers": [LOGICAL_VOLUME_FINALIZER],
                                "creationTimestamp": "2026-01-01T00:00:00Z",
                                "labels": {"app.kubernetes.io/created-by": "topolvm-controller"}},
                   "spec": {"name": "pvc-old", "nodeName": NODE, "size": "64Mi",
                            "deviceClass": ""},
                   "status": {"volumeID": uid, "currentSize": "64Mi"}}),
        );
        // Their node plugin still answers on the node: nothing is taken over or changed.
        let dir = std::path::PathBuf::from(format!(
            "/run/lvms-old-driver-{}",
            lvms_testkit::unique("d")
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("csi-topolvm.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let ctx = Arc::new(lv_reconciler::Context {
            client: api.client(NS),
            node: NODE.into(),
            backend: agent1.backend(),
            old_driver_socket: Some(socket.clone()),
        });
        let before = api.get(&lv_path("pvc-old")).unwrap();
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-old")),
            ctx.clone(),
        )
        .await
        .unwrap();
        assert_eq!(lvs_field(&class, uid, "lv_tags"), "");
        assert_eq!(
            api.get(&lv_path("pvc-old")).unwrap(),
            before,
            "object untouched"
        );

        // Gone (its socket file left behind, nothing listening): taken over in place.
        drop(listener);
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-old")),
            ctx.clone(),
        )
        .await
        .unwrap();
        let tags = lvs_field(&class, uid, "lv_tags");
        assert!(tags.split(',').any(|t| t == "lvms"), "{tags}");
        let after = api.get(&lv_path("pvc-old")).unwrap();
        assert_eq!(after["status"]["volumeID"], uid, "{after}");
        assert!(after["status"]["code"].is_null(), "{after}");
        assert_eq!(
            sh(&format!("head -c 12 /dev/{class}/{uid}")),
            "topolvm-data"
        );
        // Served as ours from now on: grown through its object, then deleted with it.
        let mut grown = after.clone();
        grown["spec"]["size"] = json!("96Mi");
        api.insert(&lv_path("pvc-old"), grown);
        lv_reconciler::reconcile(
            typed::<LogicalVolume>(&api, &lv_path("pvc-old")),
            ctx.clone(),
        )
        .await
        .unwrap();
        assert_eq!(lvs_field(&class, uid, "lv_size"), (96 * MIB).to_string());
        delete_lv(&api, "pvc-old", &agent1).await;
        assert_ne!(
            sh_status(&format!("lvm lvs {class}/{uid}")).0,
            0,
            "LV removed"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        api.delete(&vg_path(&class));
        reconcile_vg(&api, &class, &agent1).await;
        assert_vg_gone(&class);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_raid_thin_class_makes_thin_volumes_and_reports_its_pools_health() {
        let mut s = Scratch::new(2, 1100);
        let class = s.vg_name();
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"deviceSelector": {"paths": [s.disks[0], s.disks[1]]},
                   "raidConfig": {"type": "raid1", "mirrors": 1},
                   "thinPoolConfig": {"name": "pool", "sizePercent": 20, "overprovisionRatio": 5,
                                      "metadataSizeCalculationPolicy": "Static",
                                      "metadataSize": "8Mi"},
                   "default": true}),
        );
        let agent1 = agent(&api);
        reconcile_vg(&api, &class, &agent1).await;
        sh(&format!(
            "for i in $(seq 1 120); do \
               p=$(lvm lvs -a --noheadings -o sync_percent {class}/pool_tdata {class}/pool_tmeta | tr -d ' ' | sort -u); \
               [ \"$p\" = 100.00 ] && break; sleep 1; done"
        ));
        assert_eq!(
            reconcile_vg(&api, &class, &agent1).await,
            Action::requeue(vg_reconciler::DYNAMIC_REQUEUE),
            "health is looked at again"
        );
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Ready", "{entry}");
        let raid = &entry["raidStatus"];
        assert_eq!(raid["status"], "Healthy", "{entry}");
        assert_eq!(raid["lvHealth"][0]["name"], "pool_tdata", "{entry}");
        assert_eq!(raid["lvHealth"][1]["name"], "pool_tmeta", "{entry}");
        assert_eq!(raid["lvHealth"][1]["raidType"], "raid1", "{entry}");
        assert_eq!(raid["minSyncPercent"], 100.0, "{entry}");

        // A LogicalVolume of the class becomes a thin volume in the RAID pool.
        make_lv(&api, "pvc-t", "64Mi", &agent1).await;
        let id = ids::volume_lv_name("pvc-t");
        assert_eq!(lvs_field(&class, &id, "segtype"), "thin");
        assert_eq!(lvs_field(&class, &id, "pool_lv"), "pool");

        delete_lv(&api, "pvc-t", &agent1).await;
        api.delete(&vg_path(&class));
        reconcile_vg(&api, &class, &agent1).await;
        assert_vg_gone(&class);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_raid_class_makes_raid_volumes_and_reports_their_health() {
        let mut s = Scratch::new(2, 1200);
        let class = s.vg_name();
        let api = cluster();
        put_vg(
            &api,
            &class,
            json!({"deviceSelector": {"paths": [s.disks[0], s.disks[1]]},
                   "raidConfig": {"type": "raid1", "mirrors": 1}, "default": true}),
        );
        let agent1 = agent(&api);
        assert_eq!(
            reconcile_vg(&api, &class, &agent1).await,
            Action::requeue(vg_reconciler::DYNAMIC_REQUEUE),
            "health is looked at again"
        );
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Ready", "{entry}");
        assert_eq!(entry["raidStatus"]["status"], "Healthy", "{entry}");
        assert_eq!(entry["raidStatus"]["memberCount"], 2, "{entry}");

        // A LogicalVolume of the class becomes a raid1 LV, as the class says.
        make_lv(&api, "pvc-r", "64Mi", &agent1).await;
        let id = ids::volume_lv_name("pvc-r");
        assert_eq!(lvs_field(&class, &id, "segtype"), "raid1");
        sh(&format!(
            "for i in $(seq 1 120); do \
               p=$(lvm lvs --noheadings -o sync_percent {class}/{id} | tr -d ' '); \
               [ \"$p\" = 100.00 ] && break; sleep 1; done"
        ));
        reconcile_vg(&api, &class, &agent1).await;
        let entry = vg_entry(&api, &class).unwrap();
        let raid = &entry["raidStatus"];
        assert_eq!(raid["status"], "Healthy", "{entry}");
        assert_eq!(raid["lvHealth"][0]["name"], json!(id), "{entry}");
        assert_eq!(raid["lvHealth"][0]["raidType"], "raid1", "{entry}");
        assert_eq!(raid["minSyncPercent"], 100.0, "{entry}");

        // Clean up: the volume, then the class.
        delete_lv(&api, "pvc-r", &agent1).await;
        api.delete(&vg_path(&class));
        reconcile_vg(&api, &class, &agent1).await;
        assert_vg_gone(&class);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn agent_takes_a_device_removed_from_the_spec_out_of_the_group() {
        let mut s = Scratch::new(2, 1200);
        let class = s.vg_name();
        let (a, b) = (s.disks[0].clone(), s.disks[1].clone());
        let api = cluster();
        put_vg(&api, &class, json!({"deviceSelector": {"paths": [a, b]}}));
        let agent1 = agent(&api);
        reconcile_vg(&api, &class, &agent1).await;
        assert_eq!(vgs_field(&class, "pv_count").trim(), "2");
        // A volume on the first device only, so the second holds nothing.
        sh(&format!("lvm lvcreate -q -y -L 64m -n keep {class} {a}"));

        put_vg(&api, &class, json!({"deviceSelector": {"paths": [a]}}));
        reconcile_vg(&api, &class, &agent1).await;
        let entry = vg_entry(&api, &class).unwrap();
        assert_eq!(entry["status"], "Ready", "{entry}");
        assert_eq!(entry["devices"], json!([a]), "{entry}");
        assert_eq!(vgs_field(&class, "pv_count").trim(), "1");
        assert_ne!(sh_status(&format!("lvm pvs {b}")).0, 0, "label removed");
        assert_eq!(lv_names(&class), ["keep"], "the volume is untouched");
    }
}
