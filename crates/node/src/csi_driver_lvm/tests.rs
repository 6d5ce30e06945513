#![allow(clippy::unwrap_used)]

use lvms_core::lvattr::LvHealth;
use lvms_testkit::fake_backend::FakeBackend;

use super::*;

const ID: &str = "pvc-6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";

fn foreign(id: &str, class: &str) -> Volume {
    Volume {
        id: id.to_owned(),
        class: class.to_owned(),
        size: 64 << 20,
        name: None,
        source: None,
        snapshot: false,
        thin: false,
        created: None,
        requested: None,
        health: LvHealth::Ok,
        device: format!("/dev/{class}/{id}"),
        ephemeral: None,
        open: false,
    }
}

/// The thick class adopts csi-driver-lvm's group, which holds `ID`.
fn adopting() -> Arc<FakeBackend> {
    let backend = FakeBackend::new().with_adopt("thick", Adopt::CsiDriverLvm);
    backend.add_foreign(foreign(ID, "thick"));
    Arc::new(backend)
}

/// A new 64 MiB volume in the thick class.
fn thick_volume(name: &str) -> NewVolume {
    NewVolume {
        name: name.into(),
        class: "thick".into(),
        size: 64 << 20,
        lv_type: None,
        volume_mode: None,
        source: None,
        ephemeral: None,
    }
}

fn take_overs(backend: &FakeBackend) -> usize {
    backend
        .calls()
        .iter()
        .filter(|c| c.starts_with("take_over"))
        .count()
}

#[tokio::test]
async fn a_volume_is_taken_over_the_first_time_a_call_names_it_then_served_and_deleted() {
    let backend = adopting();
    let volumes = CsiDriverLvmVolumes::new(backend.clone(), None);
    assert_eq!(
        volumes
            .classes()
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>(),
        ["thick"],
        "only the adopting class"
    );

    let got = volumes.get(ID).await.unwrap().expect("taken over");
    assert_eq!((got.id.as_str(), got.name.as_deref()), (ID, Some(ID)));
    assert!(backend.state.lock().unwrap().foreign.is_empty());
    volumes.get(ID).await.unwrap().unwrap();
    volumes.activate(ID).await.unwrap();
    assert_eq!(take_overs(&backend), 1, "once: {:?}", backend.calls());
    assert!(
        volumes.list().await.unwrap().is_empty(),
        "no collector sees it"
    );

    assert_eq!(volumes.expand(ID, 128 << 20).await.unwrap(), 128 << 20);
    assert!(volumes.delete(ID).await.unwrap());
    assert!(!volumes.delete(ID).await.unwrap(), "already gone");
    assert!(volumes.get(ID).await.unwrap().is_none());
}

#[tokio::test]
async fn only_csi_driver_lvm_ids_in_adopting_classes_are_answered() {
    // lvms-rs's own volumes and TopoLVM's ids are not served under csi-driver-lvm's name.
    let backend = adopting();
    let ours = backend.create_volume(&thick_volume("pvc-1")).await.unwrap();
    let volumes = CsiDriverLvmVolumes::new(backend.clone(), None);
    for id in [ours.id.as_str(), "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a"] {
        assert!(volumes.get(id).await.unwrap().is_none(), "{id}");
        assert!(!volumes.delete(id).await.unwrap(), "{id}");
    }
    assert!(backend.get(&ours.id).await.unwrap().is_some(), "kept");

    // Without an adopting class nothing is taken over, even a volume of that shape.
    let plain = Arc::new(FakeBackend::new());
    plain.add_foreign(foreign(ID, "thick"));
    let volumes = CsiDriverLvmVolumes::new(plain.clone(), None);
    assert!(volumes.get(ID).await.unwrap().is_none());
    assert!(matches!(
        volumes.expand(ID, 1 << 30).await.unwrap_err(),
        BackendError::NotFound(_)
    ));
    assert_eq!(take_overs(&plain), 0);
    assert_eq!(plain.state.lock().unwrap().foreign.len(), 1);
}

#[tokio::test]
async fn nothing_is_taken_over_while_csi_driver_lvm_answers_on_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let backend = adopting();
    let volumes = CsiDriverLvmVolumes::new(backend.clone(), Some(socket.clone()));

    let err = volumes.get(ID).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Unavailable(ref m)
            if m.contains("still runs") && m.contains(&socket.display().to_string())),
        "{err}"
    );
    assert!(volumes.delete(ID).await.is_err(), "nor deleted");
    assert_eq!(take_overs(&backend), 0);

    // Its socket left behind with nobody listening is no obstacle.
    drop(listener);
    assert!(socket.exists());
    volumes.get(ID).await.unwrap().expect("taken over");
}

#[tokio::test]
async fn nothing_new_is_made_under_csi_driver_lvms_name() {
    let volumes = CsiDriverLvmVolumes::new(adopting(), None);
    let err = volumes
        .create_volume(&thick_volume("pvc-2"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::InvalidArgument(ref m) if m.contains("lvms-<class>")),
        "{err}"
    );
}
