//! [`LocalBackend`] against real LVM inside the test VM: volumes, snapshots, restores and clones made,
//! found, grown and removed, checked independently with `lvm` and the block devices; capacity against
//! `vgs`/`lvs`; concurrent creates on one volume group; a restarted backend finding everything again.
//!
//! Every test builds its own loop disks (`Scratch`) and volume group. The tests sit in a module named
//! `vm_local` so `cargo xtask vm-test vm_local` selects them; on the host they show as ignored.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod vm_local {
    use std::{sync::Arc, time::Instant};

    use lvms_core::{
        capacity::{ThinPoolUsage, thin_capacity},
        config::RaidType,
    };
    use lvms_engine::{
        backend::{
            Backend, BackendError, DeviceClassConfig, Layout, NewSnapshot, NewVolume, Source,
            Volume,
        },
        ids,
        local::LocalBackend,
    };
    use lvms_host::{lvm::Lvm, shell::LvmShell};
    use lvms_testkit::{Scratch, lvs_field, sh, sh_status, vgs_field};

    const MIB: u64 = 1 << 20;
    const EXTENT: u64 = 4 * MIB;

    /// The backend as `lvms standalone` runs it: LVM commands in one long-lived shell process.
    fn backend(classes: Vec<DeviceClassConfig>) -> LocalBackend<LvmShell> {
        LocalBackend::new("vm-node", classes, Lvm::new(LvmShell::new()))
    }

    fn thin_class(vg: &str) -> DeviceClassConfig {
        DeviceClassConfig::named(vg)
            .with_thin_pool("pool", 10)
            .as_default()
    }

    fn thick_class(vg: &str) -> DeviceClassConfig {
        DeviceClassConfig::named(vg)
    }

    /// A volume group on the scratch disks, made with `lvm vgcreate`.
    fn sh_vg(s: &mut Scratch) -> String {
        let vg = s.vg_name();
        sh(&format!("lvm vgcreate -q {vg} {} 2>&1", s.disks.join(" ")));
        vg
    }

    /// A volume group with a thin pool `pool` of `pool_mib` MiB.
    fn sh_thin_vg(s: &mut Scratch, pool_mib: u64) -> String {
        let vg = sh_vg(s);
        sh(&format!(
            "lvm lvcreate -q -y --type thin-pool -L {pool_mib}m -n pool {vg} 2>&1"
        ));
        vg
    }

    fn lv_exists(vg: &str, lv: &str) -> bool {
        sh_status(&format!("lvm lvs {vg}/{lv} >/dev/null 2>&1")).0 == 0
    }

    fn tags(vg: &str, lv: &str) -> Vec<String> {
        lvs_field(vg, lv, "lv_tags")
            .split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The permission character of `lv_attr` (`w` or `r`; `lv_permissions` says "unknown" for an
    /// inactive LV).
    fn permission(vg: &str, lv: &str) -> char {
        lvs_field(vg, lv, "lv_attr").chars().nth(1).unwrap()
    }

    fn write_marker(dev: &str, text: &str) {
        sh(&format!(
            "printf '%s' '{text}' | dd of={dev} conv=fsync,notrunc status=none"
        ));
    }

    fn read_marker(dev: &str, len: usize) -> String {
        sh(&format!("head -c {len} {dev}"))
    }

    fn dev_size(dev: &str) -> u64 {
        sh(&format!("blockdev --getsize64 {dev}"))
            .trim()
            .parse()
            .unwrap()
    }

    fn req(name: &str, class: &str, size: u64) -> NewVolume {
        NewVolume {
            name: name.to_owned(),
            class: class.to_owned(),
            size,
            lv_type: None,
            volume_mode: None,
            source: None,
            ephemeral: None,
        }
    }

    fn restore_req(name: &str, class: &str, size: u64, source: Source) -> NewVolume {
        NewVolume {
            source: Some(source),
            ..req(name, class, size)
        }
    }

    fn by_id<'a>(vols: &'a [Volume], id: &str) -> &'a Volume {
        vols.iter()
            .find(|v| v.id == id)
            .unwrap_or_else(|| panic!("{id} not in {vols:?}"))
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn thin_volume_create_get_list_delete() {
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 512);
        let b = backend(vec![thin_class(&vg)]);
        assert!(b.ready().await.unwrap());

        let vol = b
            .create_volume(&req("pvc-a", &vg, 100 * MIB + 1))
            .await
            .unwrap();
        let id = ids::volume_lv_name("pvc-a");
        assert_eq!(vol.id, id);
        assert_eq!(vol.size, 104 * MIB, "rounded up to whole extents");
        assert!(vol.thin && !vol.snapshot);
        assert_eq!(vol.name.as_deref(), Some("pvc-a"));
        assert_eq!(vol.device, format!("/dev/{vg}/{id}"));
        assert!(!vol.health.is_abnormal(), "{:?}", vol.health);
        // Independently: a thin LV in the pool with our tags, active.
        assert_eq!(lvs_field(&vg, &id, "lv_size"), (104 * MIB).to_string());
        assert_eq!(lvs_field(&vg, &id, "segtype"), "thin");
        assert_eq!(lvs_field(&vg, &id, "pool_lv"), "pool");
        let t = tags(&vg, &id);
        assert!(t.contains(&ids::OWNER_TAG.to_owned()), "{t:?}");
        assert!(t.contains(&ids::name_tag("pvc-a")), "{t:?}");
        assert_eq!(dev_size(&vol.device), 104 * MIB);

        // Found, not made again.
        let again = b
            .create_volume(&req("pvc-a", &vg, 100 * MIB + 1))
            .await
            .unwrap();
        assert_eq!(again, vol);
        assert_eq!(b.get(&id).await.unwrap(), Some(vol.clone()));
        assert_eq!(b.list().await.unwrap(), vec![vol.clone()]);

        assert!(b.delete(&id).await.unwrap());
        assert!(!lv_exists(&vg, &id));
        assert!(!b.delete(&id).await.unwrap(), "already gone");
        assert_eq!(b.get(&id).await.unwrap(), None);
        assert!(b.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn thick_linear_and_striped_two_volumes() {
        let mut s = Scratch::new(2, 512);
        let vg = sh_vg(&mut s);
        let b = backend(vec![thick_class(&vg)]);

        let linear = b.create_volume(&req("lin", &vg, 64 * MIB)).await.unwrap();
        assert!(!linear.thin);
        assert_eq!(lvs_field(&vg, &linear.id, "segtype"), "linear");
        assert_eq!(linear.size, 64 * MIB);

        let striped_req = NewVolume {
            lv_type: Some(Layout::Striped {
                stripes: Some(2),
                stripe_size: None,
            }),
            ..req("str", &vg, 64 * MIB)
        };
        let striped = b.create_volume(&striped_req).await.unwrap();
        assert_eq!(lvs_field(&vg, &striped.id, "segtype"), "striped");
        assert_eq!(lvs_field(&vg, &striped.id, "stripes"), "2");
        assert_eq!(striped.size, 64 * MIB);
        assert_eq!(dev_size(&striped.device), 64 * MIB);

        let list = b.list().await.unwrap();
        assert_eq!(list.len(), 2);
        assert!(list.windows(2).all(|w| w[0].id < w[1].id), "sorted by id");

        // A thick class takes no snapshots.
        let err = b
            .create_snapshot(&NewSnapshot {
                name: "snap".into(),
                source_volume: linear.id.clone(),
            })
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::InvalidArgument(m) if m.contains(&vg)),
            "{err:?}"
        );
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn snapshot_restore_larger_and_clone_keep_the_data() {
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 512);
        let b = backend(vec![thin_class(&vg)]);

        let vol = b.create_volume(&req("pvc-a", &vg, 64 * MIB)).await.unwrap();
        write_marker(&vol.device, "before-snapshot");

        let snap = b
            .create_snapshot(&NewSnapshot {
                name: "snap-a".into(),
                source_volume: vol.id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(snap.id, ids::snapshot_lv_name("snap-a"));
        assert!(snap.snapshot && snap.thin);
        assert_eq!(snap.size, 64 * MIB);
        assert_eq!(snap.source, Some(Source::Volume(vol.id.clone())));
        assert!(snap.created.is_some());
        // Read-only, activation skipped, origin recorded by LVM.
        assert_eq!(permission(&vg, &snap.id), 'r');
        assert_eq!(
            lvs_field(&vg, &snap.id, "lv_skip_activation"),
            "skip activation"
        );
        assert_eq!(lvs_field(&vg, &snap.id, "origin"), vol.id);
        // Taken twice: found.
        let again = b
            .create_snapshot(&NewSnapshot {
                name: "snap-a".into(),
                source_volume: vol.id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(again, snap);

        write_marker(&vol.device, "after--snapshot");

        // Restore, larger than the snapshot.
        let restored = b
            .create_volume(&restore_req(
                "pvc-r",
                &vg,
                128 * MIB,
                Source::Snapshot(snap.id.clone()),
            ))
            .await
            .unwrap();
        assert_eq!(restored.size, 128 * MIB);
        assert_eq!(restored.source, Some(Source::Snapshot(snap.id.clone())));
        assert!(!restored.snapshot);
        assert_eq!(permission(&vg, &restored.id), 'w');
        let dev = b.activate(&restored.id).await.unwrap();
        assert_eq!(dev, restored.device);
        assert_eq!(dev_size(&dev), 128 * MIB);
        assert_eq!(read_marker(&dev, 15), "before-snapshot");
        // Activating again is fine.
        b.activate(&restored.id).await.unwrap();

        // Clone of the volume, same size.
        let clone = b
            .create_volume(&restore_req(
                "pvc-c",
                &vg,
                64 * MIB,
                Source::Volume(vol.id.clone()),
            ))
            .await
            .unwrap();
        assert_eq!(clone.size, 64 * MIB);
        let dev = b.activate(&clone.id).await.unwrap();
        assert_eq!(read_marker(&dev, 15), "after--snapshot");

        // Smaller than the source: refused.
        let err = b
            .create_volume(&restore_req(
                "pvc-small",
                &vg,
                32 * MIB,
                Source::Snapshot(snap.id.clone()),
            ))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::InvalidArgument(_)), "{err:?}");
        assert!(!lv_exists(&vg, &ids::volume_lv_name("pvc-small")));

        // The snapshot can be activated itself.
        let dev = b.activate(&snap.id).await.unwrap();
        assert_eq!(read_marker(&dev, 15), "before-snapshot");
        sh(&format!("lvm lvchange -an {vg}/{} 2>&1", snap.id));

        // The volume goes, its snapshot and clone stay and still restore.
        assert!(b.delete(&vol.id).await.unwrap());
        assert!(!lv_exists(&vg, &vol.id));
        assert!(b.get(&snap.id).await.unwrap().is_some());
        let again = b
            .create_volume(&restore_req(
                "pvc-r2",
                &vg,
                64 * MIB,
                Source::Snapshot(snap.id.clone()),
            ))
            .await
            .unwrap();
        let dev = b.activate(&again.id).await.unwrap();
        assert_eq!(read_marker(&dev, 15), "before-snapshot");
        assert!(b.delete(&snap.id).await.unwrap());
        assert!(!lv_exists(&vg, &snap.id));
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn expand_grows_thin_and_thick_volumes_to_whole_extents() {
        let mut s = Scratch::new(1, 1024);
        let thin_vg = sh_thin_vg(&mut s, 256);
        let mut s2 = Scratch::new(1, 512);
        let thick_vg = sh_vg(&mut s2);
        let b = backend(vec![thin_class(&thin_vg), thick_class(&thick_vg)]);

        for (name, vg) in [("grow-thin", &thin_vg), ("grow-thick", &thick_vg)] {
            let vol = b.create_volume(&req(name, vg, 64 * MIB)).await.unwrap();
            assert_eq!(&vol.class, vg);
            let size = b.expand(&vol.id, 100 * MIB + 1).await.unwrap();
            assert_eq!(size, 104 * MIB);
            assert_eq!(lvs_field(vg, &vol.id, "lv_size"), (104 * MIB).to_string());
            assert_eq!(dev_size(&vol.device), 104 * MIB);
            assert_eq!(b.get(&vol.id).await.unwrap().unwrap().size, 104 * MIB);
            // Smaller or equal: nothing to do.
            assert_eq!(b.expand(&vol.id, 64 * MIB).await.unwrap(), 104 * MIB);
        }
        let err = b
            .expand(&ids::volume_lv_name("missing"), MIB)
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn capacity_agrees_with_vgs_and_lvs() {
        let mut s = Scratch::new(1, 1024);
        let thin_vg = sh_thin_vg(&mut s, 256);
        let mut s2 = Scratch::new(1, 512);
        let thick_vg = sh_vg(&mut s2);
        let b = backend(vec![thin_class(&thin_vg), thick_class(&thick_vg)]);

        let thick = b.capacity(&thick_vg, &Layout::Linear).await.unwrap();
        let free: u64 = vgs_field(&thick_vg, "vg_free").parse().unwrap();
        let extent: u64 = vgs_field(&thick_vg, "vg_extent_size").parse().unwrap();
        assert_eq!(extent, EXTENT);
        assert_eq!(thick.available, free);
        assert_eq!(thick.maximum_volume_size, free);
        assert_eq!(thick.minimum_volume_size, EXTENT);
        // After a create the numbers follow at once (the report is taken again after a mutation).
        b.create_volume(&req("t", &thick_vg, 100 * MIB))
            .await
            .unwrap();
        let after = b.capacity(&thick_vg, &Layout::Linear).await.unwrap();
        assert_eq!(after.available, free - 100 * MIB);
        assert_eq!(
            after.available,
            vgs_field(&thick_vg, "vg_free").parse::<u64>().unwrap()
        );

        let vol = b
            .create_volume(&req("v", &thin_vg, 300 * MIB))
            .await
            .unwrap();
        write_marker(&vol.device, "some data");
        sh(&format!(
            "dd if=/dev/urandom of={} bs=1M count=20 conv=fsync status=none",
            vol.device
        ));
        // Usage changed behind the cache's back (writes): a fresh backend sees it now.
        let b = backend(vec![thin_class(&thin_vg), thick_class(&thick_vg)]);
        let thin = b.capacity(&thin_vg, &Layout::Linear).await.unwrap();
        let pool_size: u64 = lvs_field(&thin_vg, "pool", "lv_size").parse().unwrap();
        let data_percent: f64 = lvs_field(&thin_vg, "pool", "data_percent").parse().unwrap();
        assert!(data_percent > 0.0, "{data_percent}");
        let expected = thin_capacity(&ThinPoolUsage {
            pool_size,
            data_percent,
            virtual_used: 300 * MIB,
            overprovision_ratio: 10,
        });
        assert_eq!(thin.available, expected.available);
        assert_eq!(thin.available, 10 * pool_size - 300 * MIB);
        assert_eq!(thin.maximum_volume_size, thin.available / EXTENT * EXTENT);
        assert_eq!(thin.minimum_volume_size, EXTENT);

        // The numbers the node agent exports as metrics agree with vgs and lvs.
        let usage = b.usage(&thin_vg).await.unwrap().unwrap();
        assert_eq!(
            usage.vg_size,
            vgs_field(&thin_vg, "vg_size").parse::<u64>().unwrap()
        );
        assert_eq!(
            usage.vg_free,
            vgs_field(&thin_vg, "vg_free").parse::<u64>().unwrap()
        );
        let pool = usage.pool.unwrap();
        assert_eq!(pool.size, pool_size);
        assert_eq!(pool.data_percent, Some(data_percent));
        let meta: f64 = lvs_field(&thin_vg, "pool", "metadata_percent")
            .parse()
            .unwrap();
        assert_eq!(pool.metadata_percent, Some(meta));
        assert_eq!(pool.overprovisioned_available, thin.available);
        let thick_usage = b.usage(&thick_vg).await.unwrap().unwrap();
        assert_eq!(thick_usage.pool, None);
        assert_eq!(thick_usage.vg_free, free - 100 * MIB);

        // Beyond the overprovision ratio: refused before LVM is asked.
        let err = b
            .create_volume(&req("huge", &thin_vg, thin.available + EXTENT))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::InsufficientSpace(_)), "{err:?}");
        // Thick beyond the free space: LVM's answer, mapped.
        let err = b
            .create_volume(&req("huge", &thick_vg, 2 * free))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::InsufficientSpace(_)), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn concurrent_creates_on_one_volume_group_all_succeed() {
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 512);
        let b = Arc::new(backend(vec![thin_class(&vg)]));
        let started = Instant::now();
        let tasks: Vec<_> = (0..8)
            .map(|i| {
                let b = b.clone();
                let vg = vg.clone();
                tokio::spawn(async move {
                    b.create_volume(&req(&format!("c-{i}"), &vg, 16 * MIB))
                        .await
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        println!(
            "8 concurrent thin creates on one volume group: {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let list = b.list().await.unwrap();
        assert_eq!(list.len(), 8, "{list:?}");
        for i in 0..8 {
            let id = ids::volume_lv_name(&format!("c-{i}"));
            assert!(lv_exists(&vg, &id), "{id}");
            assert_eq!(by_id(&list, &id).name, Some(format!("c-{i}")));
        }
        // And concurrent deletes.
        let tasks: Vec<_> = list
            .iter()
            .map(|v| {
                let b = b.clone();
                let id = v.id.clone();
                tokio::spawn(async move { b.delete(&id).await })
            })
            .collect();
        for t in tasks {
            assert!(t.await.unwrap().unwrap());
        }
        assert!(b.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_restarted_backend_finds_every_volume_with_its_name_and_source() {
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 512);
        let classes = vec![thin_class(&vg)];
        let (vol, snap, restored, clone) = {
            let b = backend(classes.clone());
            let vol = b.create_volume(&req("pvc-a", &vg, 32 * MIB)).await.unwrap();
            let snap = b
                .create_snapshot(&NewSnapshot {
                    name: "snap-a".into(),
                    source_volume: vol.id.clone(),
                })
                .await
                .unwrap();
            let restored = b
                .create_volume(&restore_req(
                    "pvc-r",
                    &vg,
                    64 * MIB,
                    Source::Snapshot(snap.id.clone()),
                ))
                .await
                .unwrap();
            let clone = b
                .create_volume(&restore_req(
                    "pvc-c",
                    &vg,
                    32 * MIB,
                    Source::Volume(vol.id.clone()),
                ))
                .await
                .unwrap();
            (vol, snap, restored, clone)
        };

        let b = backend(classes);
        let list = b.list().await.unwrap();
        assert_eq!(list.len(), 4, "{list:?}");
        for (before, name) in [
            (&vol, "pvc-a"),
            (&snap, "snap-a"),
            (&restored, "pvc-r"),
            (&clone, "pvc-c"),
        ] {
            let found = by_id(&list, &before.id);
            assert_eq!(found.name.as_deref(), Some(name));
            assert_eq!(found.source, before.source);
            assert_eq!(found.snapshot, before.snapshot);
            assert_eq!(found.size, before.size);
            assert_eq!(found.created, before.created);
            assert_eq!(b.get(&before.id).await.unwrap().as_ref(), Some(found));
        }
        assert_eq!(
            by_id(&list, &restored.id).source,
            Some(Source::Snapshot(snap.id.clone()))
        );
        assert_eq!(
            by_id(&list, &clone.id).source,
            Some(Source::Volume(vol.id.clone()))
        );
        // A retried create after the restart finds the volume.
        let again = b
            .create_volume(&restore_req(
                "pvc-r",
                &vg,
                64 * MIB,
                Source::Snapshot(snap.id.clone()),
            ))
            .await
            .unwrap();
        assert_eq!(again.id, restored.id);
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_foreign_lv_with_our_name_is_a_conflict_and_never_removed() {
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 256);
        let id = ids::volume_lv_name("pvc-x");
        sh(&format!(
            "lvm lvcreate -q -y --type thin -V 16m --thinpool pool -n {id} {vg} 2>&1"
        ));
        let b = backend(vec![thin_class(&vg)]);
        let err = b
            .create_volume(&req("pvc-x", &vg, 16 * MIB))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Conflict(m) if m.contains(&id)),
            "{err:?}"
        );
        let err = b.delete(&id).await.unwrap_err();
        assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");
        assert!(lv_exists(&vg, &id));
        assert_eq!(b.get(&id).await.unwrap(), None);
        assert!(b.list().await.unwrap().is_empty());
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn ready_follows_the_volume_group_and_its_pool() {
        let mut s = Scratch::new(1, 512);
        let vg = s.vg_name();
        let b = backend(vec![thin_class(&vg)]);
        assert!(!b.ready().await.unwrap());
        let err = b.capacity(&vg, &Layout::Linear).await.unwrap_err();
        assert!(matches!(err, BackendError::Unavailable(_)), "{err:?}");
        sh(&format!("lvm vgcreate -q {vg} {} 2>&1", s.disks[0]));
        sh(&format!(
            "lvm lvcreate -q -y --type thin-pool -L 128m -n pool {vg} 2>&1"
        ));
        // A class that was not ready is looked at again after a few seconds.
        tokio::time::sleep(std::time::Duration::from_millis(5200)).await;
        assert!(b.ready().await.unwrap());
        assert!(b.capacity(&vg, &Layout::Linear).await.unwrap().available > 0);
    }
    /// For every layout a StorageClass may ask for, a volume of exactly the capacity reported for
    /// that layout is made, in a group whose devices have unequal free space; a layout needing more
    /// devices than the group has reports nothing and is refused naming the devices.
    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_volume_of_the_reported_maximum_is_made_in_every_layout() {
        let mut s = Scratch::new(4, 256);
        let vg = sh_vg(&mut s);
        // Unbalanced: the devices have 60, 150, 250 and 250 MiB or so free.
        for (size, disk) in [(192, 0), (100, 1)] {
            sh(&format!(
                "lvm lvcreate -q -y -L {size}m -n fill{disk} {vg} {} 2>&1",
                s.disks[disk]
            ));
        }
        let b = backend(vec![thick_class(&vg)]);
        let raid = |level, mirrors, stripes| Layout::Raid {
            level,
            mirrors,
            stripes,
            stripe_size: None,
            nosync: true,
            integrity: false,
        };
        let layouts = [
            (Layout::Linear, "linear"),
            (
                Layout::Striped {
                    stripes: None,
                    stripe_size: None,
                },
                "striped",
            ),
            (
                Layout::Striped {
                    stripes: Some(2),
                    stripe_size: Some(64 << 10),
                },
                "striped",
            ),
            (
                Layout::Mirror {
                    mirrors: 1,
                    nosync: true,
                    integrity: false,
                },
                "raid1",
            ),
            (
                Layout::Mirror {
                    mirrors: 1,
                    nosync: false,
                    integrity: true,
                },
                "raid1",
            ),
            (
                Layout::Raid {
                    level: RaidType::Raid1,
                    mirrors: Some(2),
                    stripes: None,
                    stripe_size: None,
                    nosync: false,
                    integrity: false,
                },
                "raid1",
            ),
            (raid(RaidType::Raid5, None, Some(2)), "raid5"),
            (raid(RaidType::Raid10, Some(1), Some(2)), "raid10"),
        ];
        for (i, (layout, segtype)) in layouts.into_iter().enumerate() {
            let cap = b.capacity(&vg, &layout).await.unwrap();
            let max = cap.maximum_volume_size;
            assert!(max >= 16 * MIB, "{layout:?}: {cap:?}");
            let free: u64 = vgs_field(&vg, "vg_free").parse().unwrap();
            let mut r = req(&format!("max-{i}"), &vg, max);
            r.lv_type = Some(layout);
            let vol = b
                .create_volume(&r)
                .await
                .unwrap_or_else(|e| panic!("{layout:?}: {max} bytes reported, then {e:?}"));
            let size: u64 = lvs_field(&vg, &vol.id, "lv_size").parse().unwrap();
            assert_eq!(size, max, "{layout:?}");
            assert!(
                lvs_field(&vg, &vol.id, "segtype").starts_with(segtype),
                "{layout:?}: {}",
                lvs_field(&vg, &vol.id, "segtype")
            );
            let left: u64 = vgs_field(&vg, "vg_free").parse().unwrap();
            println!(
                "layout {}: reported {} MiB, made {} MiB, group free {} MiB before, {} MiB after",
                layout.name(),
                max / MIB,
                size / MIB,
                free / MIB,
                left / MIB
            );
            assert!(b.delete(&vol.id).await.unwrap());
            assert_eq!(
                b.capacity(&vg, &layout).await.unwrap().maximum_volume_size,
                max
            );
        }
        let raid6 = raid(RaidType::Raid6, None, Some(3));
        assert_eq!(
            b.capacity(&vg, &raid6).await.unwrap().maximum_volume_size,
            0
        );
        let mut r = req("too-wide", &vg, 16 * MIB);
        r.lv_type = Some(raid6);
        let err = b.create_volume(&r).await.unwrap_err();
        assert!(
            matches!(&err, BackendError::InsufficientSpace(m) if m.contains("needs 5 LVM physical volumes") && m.contains("which has 4")),
            "{err:?}"
        );
    }

    // ---- volumes TopoLVM or LVMS made, taken over in place (ADR 0032) ----

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn a_volume_and_a_snapshot_topolvm_made_are_taken_over_in_place_and_served_as_ours() {
        use lvms_engine::backend::TakeOver;
        let mut s = Scratch::new(1, 1024);
        let vg = sh_thin_vg(&mut s, 512);
        let b = backend(vec![thin_class(&vg)]);
        // As TopoLVM's lvmd makes them (topolvm internal/lvmd/command/lvm.go): the LV named after
        // the LogicalVolume's UID, no tags; a snapshot `lvcreate -s -k n`, then `lvchange -p r`.
        let id = "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
        let snap_id = "7a2d3b5f-2c8e-4d2f-8b66-1f2e3d4c5b6a";
        sh(&format!(
            "lvm lvcreate -q -y -T {vg}/pool -n {id} -V 64m -W y 2>&1"
        ));
        write_marker(&format!("/dev/{vg}/{id}"), "topolvm-data!!!");
        sh(&format!(
            "lvm lvcreate -q -y -s -k n -n {snap_id} {vg}/{id} 2>&1 && \
             lvm lvchange -q -p r {vg}/{snap_id} 2>&1"
        ));
        write_marker(&format!("/dev/{vg}/{id}"), "after-their-snap");
        // Not ours yet: not served, not listed.
        assert!(b.get(id).await.unwrap().is_none());
        assert!(b.list().await.unwrap().is_empty());

        let req = |id: &str, name: &str, snapshot: bool| TakeOver {
            id: id.into(),
            class: vg.clone(),
            name: name.into(),
            snapshot,
            source: None,
            created: Some(1_700_000_000),
        };
        // A mismatch or a missing LV is named, and nothing is changed.
        let err = b
            .take_over(&req(snap_id, "pvc-wrong", false))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Conflict(m) if m.contains("read-only")),
            "{err:?}"
        );
        assert!(tags(&vg, snap_id).is_empty());
        let err = b
            .take_over(&req(
                "0a0b0c0d-0000-4000-8000-000000000009",
                "pvc-gone",
                false,
            ))
            .await
            .unwrap_err();
        assert!(matches!(err, BackendError::NotFound(_)), "{err:?}");

        // Taken over: the same LV, name, size and data, tagged ours.
        let vol = b.take_over(&req(id, "pvc-0d8e3f5c", false)).await.unwrap();
        assert_eq!(vol.id, id);
        assert_eq!(vol.name.as_deref(), Some("pvc-0d8e3f5c"));
        assert_eq!(vol.created, Some(1_700_000_000));
        assert!(vol.thin && !vol.snapshot);
        assert_eq!(vol.size, 64 * MIB);
        assert!(tags(&vg, id).contains(&"lvms".to_owned()));
        assert_eq!(read_marker(&vol.device, 16), "after-their-snap");
        assert_eq!(
            b.take_over(&req(id, "pvc-0d8e3f5c", false)).await.unwrap(),
            vol
        );
        let snap = b
            .take_over(&TakeOver {
                source: Some(Source::Volume(id.into())),
                ..req(snap_id, "snapshot-9a1b", true)
            })
            .await
            .unwrap();
        assert!(snap.snapshot);
        assert_eq!(snap.source, Some(Source::Volume(id.into())));

        // Served as ours: listed, grown, snapshotted, restored from their snapshot, removed.
        let ids: Vec<String> = b.list().await.unwrap().into_iter().map(|v| v.id).collect();
        assert_eq!(ids, [id, snap_id]);
        assert_eq!(b.expand(id, 96 * MIB).await.unwrap(), 96 * MIB);
        assert!(
            b.expand(snap_id, 96 * MIB).await.is_err(),
            "a snapshot does not grow"
        );
        let ours_snap = b
            .create_snapshot(&NewSnapshot {
                name: "snap-new".into(),
                source_volume: id.into(),
            })
            .await
            .unwrap();
        let restored = b
            .create_volume(&restore_req(
                "pvc-r",
                &vg,
                64 * MIB,
                Source::Snapshot(snap_id.into()),
            ))
            .await
            .unwrap();
        let dev = b.activate(&restored.id).await.unwrap();
        assert_eq!(read_marker(&dev, 15), "topolvm-data!!!");
        let dev = b.activate(&ours_snap.id).await.unwrap();
        assert_eq!(read_marker(&dev, 16), "after-their-snap");
        assert!(b.delete(snap_id).await.unwrap());
        assert!(b.delete(id).await.unwrap());
        assert!(!lv_exists(&vg, id) && !lv_exists(&vg, snap_id));
    }

    // ---- volumes csi-driver-lvm made, taken over in place (ADR 0033) ----

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn csi_driver_lvm_volumes_are_taken_over_only_by_an_adopting_class_and_then_served() {
        use lvms_core::config::Adopt;
        use lvms_engine::backend::TakeOver;
        let mut s = Scratch::new(2, 256);
        let vg = s.vg_name();
        // As csi-driver-lvm makes them (its pkg/lvm/lvm.go CreateVG and CreateLV): the group and
        // each LV tagged, the LV named after the PersistentVolume; a linear and a raid1 volume.
        let linear = "pvc-6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";
        let mirror = "pvc-7a2d3b5f-2c8e-4d2f-8b66-1f2e3d4c5b6a";
        let untagged = "pvc-0a0b0c0d-0000-4000-8000-000000000001";
        sh(&format!(
            "lvm vgcreate -q --addtag vg.metal-stack.io/csi-lvm-driver {vg} {disks} 2>&1 && \
             lvm lvcreate -q -y -W y -L 64m --addtag lv.metal-stack.io/csi-lvm-driver -n {linear} {vg} 2>&1 && \
             lvm lvcreate -q -y -W y -L 32m --type raid1 --mirrors 1 --nosync \
               --addtag lv.metal-stack.io/csi-lvm-driver -n {mirror} {vg} 2>&1 && \
             lvm lvcreate -q -y -W y -L 16m -n {untagged} {vg} 2>&1",
            disks = s.disks.join(" ")
        ));
        write_marker(&format!("/dev/{vg}/{linear}"), "csi-driver-lvm!");
        let req = |id: &str| TakeOver {
            id: id.into(),
            class: vg.clone(),
            name: id.into(),
            snapshot: false,
            source: None,
            created: None,
        };

        // A class that does not adopt csi-driver-lvm takes nothing over.
        let plain = backend(vec![thick_class(&vg)]);
        let err = plain.take_over(&req(linear)).await.unwrap_err();
        assert!(
            matches!(&err, BackendError::Conflict(m) if m.contains("adopt: csi-driver-lvm")),
            "{err:?}"
        );
        assert!(!tags(&vg, linear).contains(&"lvms".to_owned()));

        let mut class = thick_class(&vg);
        class.adopt = Some(Adopt::CsiDriverLvm);
        let b = backend(vec![class]);
        assert!(b.get(linear).await.unwrap().is_none(), "not ours yet");
        // An LV without csi-driver-lvm's tag is not csi-driver-lvm's.
        let err = b.take_over(&req(untagged)).await.unwrap_err();
        assert!(
            matches!(&err, BackendError::Conflict(m) if m.contains("lacks csi-driver-lvm's tag")),
            "{err:?}"
        );
        assert!(tags(&vg, untagged).is_empty());

        let vol = b.take_over(&req(linear)).await.unwrap();
        assert_eq!(
            (vol.id.as_str(), vol.name.as_deref()),
            (linear, Some(linear))
        );
        assert_eq!(vol.size, 64 * MIB);
        assert!(!vol.thin && !vol.snapshot);
        let mut got = tags(&vg, linear);
        got.sort();
        assert_eq!(
            got,
            [
                "lv.metal-stack.io/csi-lvm-driver".to_owned(),
                "lvms".to_owned(),
                ids::name_tag(linear)
            ]
        );
        assert_eq!(read_marker(&vol.device, 15), "csi-driver-lvm!");
        let raid = b.take_over(&req(mirror)).await.unwrap();
        assert_eq!(raid.size, 32 * MIB);

        // Served: found, grown, removed; never listed (no collector may see them).
        assert_eq!(b.get(linear).await.unwrap(), Some(vol.clone()));
        assert!(b.list().await.unwrap().is_empty());
        assert_eq!(b.expand(linear, 96 * MIB).await.unwrap(), 96 * MIB);
        assert_eq!(dev_size(&vol.device), 96 * MIB);
        assert_eq!(read_marker(&vol.device, 15), "csi-driver-lvm!");
        assert_eq!(b.expand(mirror, 48 * MIB).await.unwrap(), 48 * MIB);
        assert!(b.delete(linear).await.unwrap());
        assert!(b.delete(mirror).await.unwrap());
        assert!(!lv_exists(&vg, linear) && !lv_exists(&vg, mirror));
        assert!(lv_exists(&vg, untagged), "what was not taken over stays");
    }

    // ---- RAID thin pools (ADR 0031) ----

    fn raid_cfg(
        raid_type: RaidType,
        mirrors: Option<u32>,
        stripes: Option<u32>,
    ) -> lvms_core::config::RaidConfig {
        lvms_core::config::RaidConfig {
            raid_type,
            mirrors,
            stripes,
            stripe_size: None,
        }
    }

    /// A thin class over RAID `raid` on `paths`, its pool `size_percent` of what the layout
    /// holds, with 8 MiB of pool metadata (a small pool, so that filling it is quick).
    fn raid_thin_class(
        vg: &str,
        paths: &[String],
        raid: lvms_core::config::RaidConfig,
        ratio: u32,
        size_percent: u8,
    ) -> DeviceClassConfig {
        let mut class = DeviceClassConfig::named(vg)
            .with_thin_pool("pool", ratio)
            .as_default();
        class.device_selector.paths = paths.to_vec();
        class.raid_config = Some(raid);
        let tp = class.thin_pool_config.as_mut().unwrap();
        tp.size_percent = size_percent;
        tp.metadata_size_calculation_policy = lvms_core::config::CalculationPolicy::Static;
        tp.metadata_size = Some(lvms_core::size::ByteSize(8 * MIB));
        class
    }

    async fn build(class: &DeviceClassConfig) -> lvms_host::engine::ConvergeReport {
        static RUNNER: lvms_host::runner::RealRunner = lvms_host::runner::RealRunner;
        lvms_host::engine::converge(&lvms_host::engine::RealNodeHost::new(&RUNNER), class)
            .await
            .unwrap()
    }

    /// `lvs -a` field of a hidden sub-volume (`pool_tdata`), or of any LV.
    fn lvs_a(vg: &str, lv: &str, field: &str) -> String {
        sh(&format!(
            "lvm lvs -a --noheadings --nosuffix --units b -o {field} {vg}/{lv} 2>/dev/null"
        ))
        .trim()
        .to_owned()
    }

    /// Waits (up to 10 minutes) until the pool's data and metadata are in sync; returns how long.
    fn wait_pool_in_sync(vg: &str) -> std::time::Duration {
        let start = Instant::now();
        loop {
            let synced = ["pool_tdata", "pool_tmeta"]
                .iter()
                .all(|lv| lvs_a(vg, lv, "sync_percent") == "100.00");
            if synced {
                return start.elapsed();
            }
            assert!(start.elapsed().as_secs() < 600, "pool of {vg} not in sync");
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn raid_thin_pools_on_raid1_and_raid10_hold_what_they_report_and_serve_every_thin_operation()
     {
        for (raid, disks, percent, segtype) in [
            (raid_cfg(RaidType::Raid1, None, None), 2, 20, "raid1"),
            (
                raid_cfg(RaidType::Raid10, Some(1), Some(2)),
                4,
                10,
                "raid10",
            ),
        ] {
            let mut s = Scratch::new(disks, 1024);
            let vg = s.vg_name();
            let class = raid_thin_class(&vg, &s.disks, raid, 1, percent);
            let report = build(&class).await;
            assert!(report.is_ready(), "{segtype}: {:?}", report.plan.state);
            // The pool's data takes the layout, its metadata is raid1, the spare is there.
            assert_eq!(lvs_a(&vg, "pool", "segtype"), "thin-pool");
            assert_eq!(lvs_a(&vg, "pool_tdata", "segtype"), segtype);
            assert_eq!(lvs_a(&vg, "pool_tmeta", "segtype"), "raid1");
            assert_eq!(lvs_a(&vg, "lvol0_pmspare", "segtype"), "linear");
            assert!(
                !lv_exists(&vg, "pool_meta"),
                "the metadata LV joined the pool"
            );
            let sync = wait_pool_in_sync(&vg);

            // What is reported is what the layout holds, never the raw disks: ratio 1, an empty
            // pool offers its size, and a volume of that size is made and written to the end.
            let raw: u64 = vgs_field(&vg, "vg_size").parse().unwrap();
            let pool: u64 = lvs_a(&vg, "pool", "lv_size").parse().unwrap();
            // sizePercent of the mirrored half, whole extents.
            let half = raw * u64::from(percent) / 100 / 2;
            assert_eq!(pool, half - half % EXTENT, "{segtype}: pool of {raw}");
            let b = backend(vec![class.clone()]);
            let cap = b.capacity(&vg, &Layout::Linear).await.unwrap();
            assert_eq!(cap.available, pool, "{segtype}");
            let big = b
                .create_volume(&req("pvc-full", &vg, cap.maximum_volume_size))
                .await
                .unwrap();
            let started = Instant::now();
            sh(&format!(
                "dd if=/dev/zero of={} bs=4M count={} oflag=direct status=none",
                big.device,
                big.size / (4 * MIB)
            ));
            let filled: f64 = lvs_a(&vg, "pool", "data_percent").parse().unwrap();
            assert!(
                filled > 99.0,
                "{segtype}: pool {filled}% after filling the volume"
            );
            assert!(!b.get(&big.id).await.unwrap().unwrap().health.is_abnormal());
            eprintln!(
                "capacity {segtype}: {disks} disks of 1 GiB, sizePercent {percent}, volume group {} MiB, pool {} MiB \
                 (initial sync {:.1} s), GetCapacity {} MiB, made and filled {} MiB in {:.1} s",
                raw / MIB,
                pool / MIB,
                sync.as_secs_f64(),
                cap.available / MIB,
                big.size / MIB,
                started.elapsed().as_secs_f64()
            );
            assert!(b.delete(&big.id).await.unwrap());

            // Volume, snapshot, restore, clone and growth, with the data.
            let vol = b.create_volume(&req("pvc-a", &vg, 32 * MIB)).await.unwrap();
            assert!(vol.thin && lvs_field(&vg, &vol.id, "segtype") == "thin");
            write_marker(&vol.device, "before-snapshot");
            let snap = b
                .create_snapshot(&NewSnapshot {
                    name: "snap-a".into(),
                    source_volume: vol.id.clone(),
                })
                .await
                .unwrap();
            write_marker(&vol.device, "after--snapshot");
            let restored = b
                .create_volume(&restore_req(
                    "pvc-r",
                    &vg,
                    48 * MIB,
                    Source::Snapshot(snap.id.clone()),
                ))
                .await
                .unwrap();
            let dev = b.activate(&restored.id).await.unwrap();
            assert_eq!(read_marker(&dev, 15), "before-snapshot", "{segtype}");
            let clone = b
                .create_volume(&restore_req(
                    "pvc-c",
                    &vg,
                    32 * MIB,
                    Source::Volume(vol.id.clone()),
                ))
                .await
                .unwrap();
            let dev = b.activate(&clone.id).await.unwrap();
            assert_eq!(read_marker(&dev, 15), "after--snapshot", "{segtype}");
            assert_eq!(b.expand(&vol.id, 64 * MIB).await.unwrap(), 64 * MIB);
            assert_eq!(dev_size(&vol.device), 64 * MIB);
            assert_eq!(read_marker(&vol.device, 15), "after--snapshot");
            for v in b.list().await.unwrap() {
                assert!(!v.health.is_abnormal(), "{segtype}: {v:?}");
            }
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn raid_thin_pool_grows_with_the_class_every_image_on_its_own_disk() {
        let mut s = Scratch::new(4, 1024);
        let vg = s.vg_name();
        let mut class = raid_thin_class(
            &vg,
            &s.disks[..2],
            raid_cfg(RaidType::Raid1, None, None),
            10,
            20,
        );
        assert!(build(&class).await.is_ready());
        let before: u64 = lvs_a(&vg, "pool", "lv_size").parse().unwrap();
        class.device_selector.paths = s.disks.clone();
        let report = build(&class).await;
        assert!(report.is_ready(), "{:?}", report.plan.state);
        assert!(
            report
                .executed
                .iter()
                .any(|a| matches!(a, lvms_core::plan::Action::ExtendThinPool { .. })),
            "{:?}",
            report.executed
        );
        let raw: u64 = vgs_field(&vg, "vg_size").parse().unwrap();
        let after: u64 = lvs_a(&vg, "pool", "lv_size").parse().unwrap();
        let half = raw * 20 / 100 / 2;
        assert_eq!(after, half - half % EXTENT, "{before} -> {after} of {raw}");
        assert!(after > before);
        // Still two images of the same size, each on a disk of its own.
        assert_eq!(lvs_a(&vg, "pool_tdata", "segtype"), "raid1");
        for image in ["pool_tdata_rimage_0", "pool_tdata_rimage_1"] {
            assert_eq!(lvs_a(&vg, image, "lv_size"), after.to_string(), "{image}");
        }
        let devices = |image: &str| -> std::collections::BTreeSet<String> {
            lvs_a(&vg, image, "devices")
                .split(',')
                .map(|d| d.split('(').next().unwrap_or_default().to_owned())
                .collect()
        };
        let (a, b) = (
            devices("pool_tdata_rimage_0"),
            devices("pool_tdata_rimage_1"),
        );
        assert!(a.is_disjoint(&b), "{a:?} and {b:?} share a disk");
        wait_pool_in_sync(&vg);
    }

    /// Device-mapper maps over loop disks, as a multipath device is named: `/dev/mapper/<name>`
    /// (uuid `mpath-…`), 1 MiB into the disk so the raw loop device shows no LVM label. Switching a
    /// map to the error target fails that disk under LVM. Dropped: the group removed, the maps too.
    struct Maps {
        vg: String,
        names: Vec<String>,
    }

    impl Maps {
        fn new(vg: &str, disks: &[String]) -> Self {
            let names: Vec<String> = disks
                .iter()
                .map(|disk| {
                    let name = lvms_testkit::unique("rt");
                    sh(&format!(
                        "dmsetup create {name} -u mpath-{name} --table \
                         \"0 $(( $(blockdev --getsz {disk}) - 2048 )) linear {disk} 2048\" && \
                         udevadm settle 2>/dev/null; true"
                    ));
                    name
                })
                .collect();
            Self {
                vg: vg.to_owned(),
                names,
            }
        }

        fn path(&self, i: usize) -> String {
            format!("/dev/mapper/{}", self.names[i])
        }

        fn fail(&self, i: usize) {
            let name = &self.names[i];
            sh(&format!(
                "dmsetup suspend --noflush {name} && \
                 dmsetup load {name} --table \"0 $(blockdev --getsz /dev/mapper/{name}) error\" && \
                 dmsetup resume {name}"
            ));
        }
    }

    impl Drop for Maps {
        fn drop(&mut self) {
            let vg = &self.vg;
            let _ = sh_status(&format!(
                "lvm vgchange -an {vg} >/dev/null 2>&1; lvm vgremove -ff -y {vg} >/dev/null 2>&1; \
                 for m in {}; do dmsetup remove -f $m; done",
                self.names.join(" ")
            ));
        }
    }

    #[tokio::test]
    #[ignore = "real LVM: runs in the VM (cargo xtask vm-test)"]
    async fn raid1_thin_pool_keeps_writing_through_a_failed_disk_reports_it_and_comes_back_after_repair()
     {
        let mut s = Scratch::new(3, 1100);
        let vg = s.vg_name();
        let maps = Maps::new(&vg, &s.disks[..2]);
        let mut class = raid_thin_class(
            &vg,
            &[maps.path(0), maps.path(1)],
            raid_cfg(RaidType::Raid1, None, None),
            10,
            20,
        );
        let report = build(&class).await;
        assert!(report.is_ready(), "{:?}", report.plan.state);
        wait_pool_in_sync(&vg);
        // Every read takes a new report, so the volume's health is seen at once (a driver sees it
        // within its cache's TTL).
        let b = backend(vec![class.clone()]).with_cache_ttl(std::time::Duration::ZERO);
        let vol = b.create_volume(&req("pvc-w", &vg, 64 * MIB)).await.unwrap();
        sh("head -c 33554432 /dev/urandom > /tmp/lvms-raid-data");

        // The disk without the pool metadata spare fails while the volume is written.
        let spare_on = lvs_a(&vg, "lvol0_pmspare", "devices");
        let lost = if spare_on.contains(&maps.names[0]) {
            1
        } else {
            0
        };
        // 1 MiB at a time, 50 ms apart: about half is written after the disk fails.
        let mut writer = std::process::Command::new("sh")
            .args([
                "-c",
                &format!(
                    "for i in $(seq 0 31); do dd if=/tmp/lvms-raid-data of={} bs=1M count=1 \
                     skip=$i seek=$i oflag=direct status=none || exit 1; sleep 0.05; done",
                    vol.device
                ),
            ])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(800));
        assert!(
            writer.try_wait().unwrap().is_none(),
            "the writes ended too soon"
        );
        let t0 = Instant::now();
        maps.fail(lost);
        let out = writer.wait_with_output().unwrap();
        assert!(out.status.success(), "writes failed with a disk lost");
        let written = t0.elapsed();
        sh(&format!(
            "cmp -n 33554432 /tmp/lvms-raid-data {}",
            vol.device
        ));

        // The class is Degraded, still served, names the disk and the repair, and did nothing.
        let report = build(&class).await;
        let degraded = t0.elapsed();
        let lvms_core::plan::ClassState::Degraded { reason } = &report.plan.state else {
            panic!("expected Degraded, got {:?}", report.plan.state);
        };
        assert!(report.is_ready());
        assert!(report.executed.is_empty(), "{:?}", report.executed);
        for needle in [
            maps.path(lost).as_str(),
            &format!("lvconvert --repair {vg}/pool_tdata and {vg}/pool_tmeta"),
            &format!("vgreduce --removemissing {vg}"),
        ] {
            assert!(reason.contains(needle), "{needle:?} not in {reason}");
        }
        // What raidStatus is computed from: the pool's hidden data and metadata, partial.
        let lvm = Lvm::new(LvmShell::new());
        let all = lvm.lvs_all().await.unwrap();
        for part in ["[pool_tdata]", "[pool_tmeta]"] {
            let lv = all
                .iter()
                .find(|lv| lv.vg_name == vg && lv.name == part)
                .unwrap_or_else(|| panic!("{part} not in lvs -a"));
            assert_eq!(lv.segtype, "raid1");
            let attr = lvms_core::lvattr::LvAttr::parse(&lv.attr).unwrap();
            assert_eq!(
                attr.health(),
                lvms_core::lvattr::LvHealth::Partial,
                "{part}"
            );
        }
        // The volume says so (its VolumeCondition), and reads back what was written.
        let v = b.get(&vol.id).await.unwrap().unwrap();
        assert_eq!(v.health, lvms_core::lvattr::LvHealth::Partial);
        assert!(v.health.message().contains("_tdata and <pool>_tmeta"));
        sh(&format!(
            "sync; echo 3 > /proc/sys/vm/drop_caches; cmp -n 33554432 /tmp/lvms-raid-data {}",
            vol.device
        ));
        // Nothing new is made in it (LVM changes nothing in a partial group): said so, and no
        // capacity is offered.
        let err = b
            .create_volume(&req("pvc-during", &vg, 16 * MIB))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, BackendError::Unavailable(m) if m.contains("missing LVM physical volumes")),
            "{err:?}"
        );
        assert_eq!(b.capacity(&vg, &Layout::Linear).await.unwrap().available, 0);

        // A new disk, the repair the reason names, and the class is whole again.
        let t1 = Instant::now();
        let new = &s.disks[2];
        sh(&format!(
            "lvm pvcreate -q {new} 2>&1 && lvm vgextend -q {vg} {new} 2>&1 && \
             lvm lvconvert -y --repair {vg}/pool_tdata 2>&1 && \
             lvm lvconvert -y --repair {vg}/pool_tmeta 2>&1 && \
             lvm vgreduce --removemissing {vg} 2>&1"
        ));
        let repaired = t1.elapsed();
        let resync = wait_pool_in_sync(&vg);
        class.device_selector.paths = vec![maps.path(1 - lost), new.clone()];
        let report = build(&class).await;
        assert_eq!(report.plan.state, lvms_core::plan::ClassState::Ready);
        let v = b.get(&vol.id).await.unwrap().unwrap();
        assert_eq!(v.health, lvms_core::lvattr::LvHealth::Ok);
        assert!(b.capacity(&vg, &Layout::Linear).await.unwrap().available > 0);
        b.create_volume(&req("pvc-after", &vg, 16 * MIB))
            .await
            .unwrap();
        sh(&format!(
            "sync; echo 3 > /proc/sys/vm/drop_caches; cmp -n 33554432 /tmp/lvms-raid-data {}",
            vol.device
        ));
        sh("rm -f /tmp/lvms-raid-data");
        eprintln!(
            "degraded timeline: writes finished {:.1} s after the disk failed, class Degraded \
             reported at {:.1} s; repair commands {:.1} s, resync {:.1} s",
            written.as_secs_f64(),
            degraded.as_secs_f64(),
            repaired.as_secs_f64(),
            resync.as_secs_f64()
        );
        drop(maps);
    }
}
