//! Every row of the plan's table, crash and retry cases, and the failure codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use lvms_api::topolvm::{LayoutType, LogicalVolumeSpec, VolumeLayout};
use lvms_core::{config::SharedVolumeMode, lvattr::LvHealth};

use super::*;

const GIB: u64 = 1 << 30;

fn object(name: &str, size: &str) -> LogicalVolume {
    let mut lv = LogicalVolume::new(
        name,
        LogicalVolumeSpec {
            name: name.into(),
            node_name: "node-a".into(),
            size: Quantity(size.into()),
            device_class: "thin".into(),
            ..LogicalVolumeSpec::default()
        },
    );
    lv.metadata.uid = Some(format!("uid-{name}"));
    lv
}

/// An object with our finalizer.
fn ours(name: &str, size: &str) -> LogicalVolume {
    let mut lv = object(name, size);
    lv.metadata.finalizers = Some(vec![LOGICAL_VOLUME_FINALIZER.into()]);
    lv
}

fn deleting(mut lv: LogicalVolume) -> LogicalVolume {
    lv.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    lv
}

fn volume(lv: &LogicalVolume, size: u64) -> Volume {
    let id = lv_name(lv);
    Volume {
        id: id.clone(),
        class: "thin".into(),
        size,
        name: Some(lv.spec.name.clone()),
        source: None,
        snapshot: is_snapshot(lv),
        thin: true,
        created: None,
        requested: None,
        health: LvHealth::Ok,
        device: format!("/dev/thin/{id}"),
        ephemeral: None,
        open: false,
    }
}

fn observed<'a>(found: Option<&'a Volume>, source: Option<&'a SourceState>) -> Observed<'a> {
    Observed {
        node: "node-a",
        default_class: Some("thin"),
        found,
        source,
        old_driver: None,
    }
}

fn ok_status(vol: &Volume) -> LogicalVolumeStatus {
    LogicalVolumeStatus {
        volume_id: vol.id.clone(),
        code: 0,
        message: String::new(),
        current_size: Some(Quantity(vol.size.to_string())),
    }
}

fn failure(step: Step) -> (i32, String) {
    match step {
        Step::WriteStatus(s) if s.code != 0 => (s.code, s.message),
        other => panic!("expected a failure status, got {other:?}"),
    }
}

#[test]
fn objects_of_other_nodes_are_left_alone() {
    let mut lv = ours("pvc-1", "1Gi");
    lv.spec.node_name = "node-b".into();
    assert_eq!(plan(&lv, &observed(None, None)), Step::Done);
    assert_eq!(plan(&deleting(lv), &observed(None, None)), Step::Done);
}

#[test]
fn the_finalizer_comes_before_anything_is_made() {
    let lv = object("pvc-1", "1Gi");
    assert_eq!(plan(&lv, &observed(None, None)), Step::AddFinalizer);
}

#[test]
fn a_new_object_creates_a_volume_named_from_the_csi_name() {
    let lv = ours("pvc-1", "1Gi");
    assert_eq!(
        plan(&lv, &observed(None, None)),
        Step::Create(NewVolume {
            name: "pvc-1".into(),
            class: "thin".into(),
            size: GIB,
            lv_type: None,
            volume_mode: None,
            source: None,
            ephemeral: None,
        })
    );
    assert_eq!(lv_name(&lv), ids::volume_lv_name("pvc-1"));
}

#[test]
fn an_empty_device_class_is_the_nodes_default_or_a_clear_failure() {
    let mut lv = ours("pvc-1", "1Gi");
    lv.spec.device_class.clear();
    let Step::Create(req) = plan(&lv, &observed(None, None)) else {
        panic!()
    };
    assert_eq!(req.class, "thin");
    let mut o = observed(None, None);
    o.default_class = None;
    let (code, msg) = failure(plan(&lv, &o));
    assert_eq!(code, Code::InvalidArgument as i32);
    assert!(msg.contains("spec.deviceClass"), "{msg}");
}

#[test]
fn the_lv_made_before_a_crash_is_recorded_not_made_again() {
    // Killed between lvcreate and the status write: the LV is there, the status empty.
    let lv = ours("pvc-1", "1Gi");
    let vol = volume(&lv, GIB);
    assert_eq!(
        plan(&lv, &observed(Some(&vol), None)),
        Step::WriteStatus(ok_status(&vol))
    );
    // Recorded: nothing more.
    let mut done = lv.clone();
    done.status = Some(ok_status(&vol));
    assert_eq!(plan(&done, &observed(Some(&vol), None)), Step::Done);
}

#[test]
fn a_larger_spec_size_expands_and_then_records_the_new_size() {
    let mut lv = ours("pvc-1", "2Gi");
    let vol = volume(&lv, GIB);
    lv.status = Some(ok_status(&vol));
    assert_eq!(
        plan(&lv, &observed(Some(&vol), None)),
        Step::Expand {
            volume_id: vol.id.clone(),
            size: 2 * GIB,
        }
    );
    let grown = volume(&lv, 2 * GIB);
    assert_eq!(
        plan(&lv, &observed(Some(&grown), None)),
        Step::WriteStatus(ok_status(&grown))
    );
    // A smaller spec never shrinks.
    let mut smaller = lv.clone();
    smaller.spec.size = Quantity("512Mi".into());
    smaller.status = Some(ok_status(&grown));
    assert_eq!(plan(&smaller, &observed(Some(&grown), None)), Step::Done);
}

#[test]
fn a_recorded_lv_that_vanished_is_not_found_and_never_remade() {
    let mut lv = ours("pvc-1", "1Gi");
    lv.status = Some(ok_status(&volume(&lv, GIB)));
    let (code, msg) = failure(plan(&lv, &observed(None, None)));
    assert_eq!(code, Code::NotFound as i32);
    assert!(msg.contains("missing"), "{msg}");
}

#[test]
fn a_recorded_failure_is_final() {
    let mut lv = ours("pvc-1", "1Gi");
    lv.status = Some(LogicalVolumeStatus {
        code: Code::ResourceExhausted as i32,
        message: "no room".into(),
        ..LogicalVolumeStatus::default()
    });
    assert_eq!(plan(&lv, &observed(None, None)), Step::Done);
}

#[test]
fn specs_the_agent_cannot_serve_fail_naming_the_field() {
    for (edit, field) in [
        (
            (|lv: &mut LogicalVolume| lv.spec.size = Quantity("0".into()))
                as fn(&mut LogicalVolume),
            "spec.size",
        ),
        (|lv| lv.spec.size = Quantity("lots".into()), "spec.size"),
        (
            |lv| lv.spec.lvcreate_option_class = "raid".into(),
            "spec.lvcreateOptionClass",
        ),
        (|lv| lv.spec.access_type = "ro".into(), "spec.accessType"),
        (
            |lv| {
                lv.spec.layout = Some(VolumeLayout {
                    layout_type: LayoutType::Linear,
                    mirrors: Some(1),
                    ..VolumeLayout::default()
                })
            },
            "spec.layout.mirrors",
        ),
        (
            |lv| {
                lv.spec.source = "src".into();
                lv.spec.access_type = "rx".into();
            },
            "spec.accessType",
        ),
    ] {
        let mut lv = ours("pvc-1", "1Gi");
        edit(&mut lv);
        let src = SourceState::Pending;
        let (code, msg) = failure(plan(&lv, &observed(None, Some(&src))));
        assert_eq!(code, Code::InvalidArgument as i32, "{msg}");
        assert!(msg.contains(field), "{field}: {msg}");
    }
}

#[test]
fn the_layout_on_the_object_is_the_layout_made() {
    let mut lv = ours("pvc-1", "1Gi");
    assert!(matches!(
        plan(&lv, &observed(None, None)),
        Step::Create(NewVolume { lv_type: None, .. })
    ));
    let mirror = Layout::Mirror {
        mirrors: 1,
        nosync: true,
        integrity: true,
    };
    lv.spec.layout = Some(mirror.to_api());
    match plan(&lv, &observed(None, None)) {
        Step::Create(req) => assert_eq!(req.lv_type, Some(mirror)),
        other => panic!("expected a create, got {other:?}"),
    }
}

#[test]
fn the_volume_mode_on_the_object_is_the_mode_made() {
    let mut lv = ours("pvc-1", "1Gi");
    assert!(matches!(
        plan(&lv, &observed(None, None)),
        Step::Create(NewVolume {
            volume_mode: None,
            ..
        })
    ));
    lv.spec.volume_mode = Some(lvms_api::SharedVolumeMode::Thin);
    match plan(&lv, &observed(None, None)) {
        Step::Create(req) => assert_eq!(req.volume_mode, Some(SharedVolumeMode::Thin)),
        other => panic!("expected a create, got {other:?}"),
    }
}

#[test]
fn snapshots_restores_and_clones_follow_the_source() {
    let vol_src = SourceState::Ready {
        volume_id: ids::volume_lv_name("pvc-src"),
        snapshot: false,
    };
    let snap_src = SourceState::Ready {
        volume_id: ids::snapshot_lv_name("snap-1"),
        snapshot: true,
    };
    // A read-only snapshot of a volume.
    let mut snap = ours("snap-1", "1Gi");
    snap.spec.source = "pvc-src".into();
    snap.spec.access_type = "ro".into();
    assert_eq!(lv_name(&snap), ids::snapshot_lv_name("snap-1"));
    assert_eq!(
        plan(&snap, &observed(None, Some(&vol_src))),
        Step::Snapshot(NewSnapshot {
            name: "snap-1".into(),
            source_volume: ids::volume_lv_name("pvc-src"),
        })
    );
    // Not of a snapshot.
    let (code, _) = failure(plan(&snap, &observed(None, Some(&snap_src))));
    assert_eq!(code, Code::InvalidArgument as i32);
    // A restore (rw from a snapshot) and a clone (rw from a volume).
    let mut restore = ours("pvc-2", "2Gi");
    restore.spec.source = "snap-1".into();
    restore.spec.access_type = "rw".into();
    let Step::Create(req) = plan(&restore, &observed(None, Some(&snap_src))) else {
        panic!()
    };
    assert_eq!(
        req.source,
        Some(Source::Snapshot(ids::snapshot_lv_name("snap-1")))
    );
    assert_eq!(req.size, 2 * GIB);
    let Step::Create(req) = plan(&restore, &observed(None, Some(&vol_src))) else {
        panic!()
    };
    assert_eq!(
        req.source,
        Some(Source::Volume(ids::volume_lv_name("pvc-src")))
    );
    // A source without a volume yet waits; a missing one fails.
    assert!(matches!(
        plan(&restore, &observed(None, Some(&SourceState::Pending))),
        Step::Wait(_)
    ));
    let (code, msg) = failure(plan(&restore, &observed(None, Some(&SourceState::Missing))));
    assert_eq!(code, Code::NotFound as i32);
    assert!(msg.contains("snap-1"), "{msg}");
}

#[test]
fn a_snapshot_is_never_expanded() {
    let mut snap = ours("snap-1", "4Gi");
    snap.spec.source = "pvc-src".into();
    snap.spec.access_type = "ro".into();
    let vol = volume(&snap, GIB);
    assert_eq!(
        plan(&snap, &observed(Some(&vol), None)),
        Step::WriteStatus(ok_status(&vol))
    );
}

#[test]
fn deletion_removes_the_lv_then_the_finalizer() {
    let lv = deleting(ours("pvc-1", "1Gi"));
    let vol = volume(&lv, GIB);
    assert_eq!(
        plan(&lv, &observed(Some(&vol), None)),
        Step::Delete {
            volume_id: vol.id.clone()
        }
    );
    assert_eq!(plan(&lv, &observed(None, None)), Step::RemoveFinalizer);
    // Without our finalizer there is nothing left to do (and nothing is removed).
    let gone = deleting(object("pvc-1", "1Gi"));
    assert_eq!(plan(&gone, &observed(Some(&vol), None)), Step::Done);
}

#[test]
fn failures_map_to_codes_and_keep_what_an_expand_left() {
    let current = LogicalVolumeStatus {
        volume_id: "csi-x".into(),
        current_size: Some(Quantity("1073741824".into())),
        ..LogicalVolumeStatus::default()
    };
    let cases = [
        (
            BackendError::InsufficientSpace("full".into()),
            Some(Code::ResourceExhausted),
        ),
        (
            BackendError::InvalidArgument("bad".into()),
            Some(Code::InvalidArgument),
        ),
        (BackendError::NotFound("gone".into()), Some(Code::NotFound)),
        (
            BackendError::Conflict("taken".into()),
            Some(Code::AlreadyExists),
        ),
        (BackendError::Unavailable("later".into()), None),
    ];
    for (err, code) in cases {
        let got = failure_status(&err, &current);
        assert_eq!(
            got.as_ref().map(|s| s.code),
            code.map(|c| c as i32),
            "{err}"
        );
        if let Some(s) = got {
            assert_eq!(s.message, err.to_string());
            assert_eq!(s.volume_id, "csi-x");
            assert_eq!(s.current_size, current.current_size);
        }
    }
}

/// An object as TopoLVM's node leaves it: the LV is named after the object's UID, recorded in
/// status.volumeID (topolvm internal/controller/logicalvolume_controller.go).
fn theirs(name: &str) -> LogicalVolume {
    let mut lv = ours(name, "1Gi");
    lv.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_700_000_000).unwrap()));
    lv.status = Some(LogicalVolumeStatus {
        volume_id: "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a".into(),
        code: 0,
        message: String::new(),
        current_size: Some(Quantity("1Gi".into())),
    });
    lv
}

const THEIR_ID: &str = "6f1c2a4e-1b7d-4c1e-9a55-0e1f2d3c4b5a";

#[test]
fn an_object_topolvm_or_lvms_made_is_taken_over_in_place() {
    let lv = theirs("pvc-0d8e3f5c");
    assert_eq!(lv_name(&lv), THEIR_ID, "its LV keeps its name");
    assert_eq!(
        plan(&lv, &observed(None, None)),
        Step::TakeOver(TakeOver {
            id: THEIR_ID.into(),
            class: "thin".into(),
            name: "pvc-0d8e3f5c".into(),
            snapshot: false,
            source: None,
            created: Some(1_700_000_000),
        })
    );
    // An empty spec.deviceClass is the node's default class, as TopoLVM reads it.
    let mut default = theirs("pvc-d");
    default.spec.device_class = String::new();
    assert!(matches!(
        plan(&default, &observed(None, None)),
        Step::TakeOver(TakeOver { ref class, .. }) if class == "thin"
    ));
    // A snapshot, with its source's id.
    let mut snap = theirs("snapshot-9a1b");
    snap.spec.source = "pvc-0d8e3f5c".into();
    snap.spec.access_type = "ro".into();
    let src = SourceState::Ready {
        volume_id: "0a0b0c0d-0000-4000-8000-000000000001".into(),
        snapshot: false,
    };
    match plan(&snap, &observed(None, Some(&src))) {
        Step::TakeOver(t) => {
            assert!(t.snapshot);
            assert_eq!(
                t.source,
                Some(Source::Volume(
                    "0a0b0c0d-0000-4000-8000-000000000001".into()
                ))
            );
        }
        other => panic!("{other:?}"),
    }
    // Being deleted: taken over first (then deleted as ours), not released with its LV left.
    assert!(matches!(
        plan(&deleting(theirs("pvc-x")), &observed(None, None)),
        Step::TakeOver(_)
    ));
    // Once taken over, it is served as any volume: nothing more to take over.
    let mut vol = volume(&lv, GIB);
    vol.id = THEIR_ID.into();
    assert!(matches!(
        plan(&lv, &observed(Some(&vol), None)),
        Step::WriteStatus(LogicalVolumeStatus { ref volume_id, code: 0, .. }) if volume_id == THEIR_ID
    ));
    assert_eq!(
        plan(&deleting(lv.clone()), &observed(Some(&vol), None)),
        Step::Delete {
            volume_id: THEIR_ID.into()
        }
    );
}

#[test]
fn nothing_is_taken_over_while_their_node_plugin_is_live_and_unknown_ids_are_left_alone() {
    let lv = theirs("pvc-0d8e3f5c");
    let live = Observed {
        old_driver: Some("/csi/node/csi-topolvm.sock accepts connections"),
        ..observed(None, None)
    };
    match plan(&lv, &live) {
        Step::OldDriverLive(why) => {
            assert!(why.contains(THEIR_ID), "{why}");
            assert!(
                why.contains("csi-topolvm.sock accepts connections"),
                "{why}"
            );
            assert!(why.contains("remove its DaemonSet first"), "{why}");
        }
        other => panic!("expected OldDriverLive, got {other:?}"),
    }
    // Being deleted while it runs: left to it (its finalizer is its own to release).
    assert!(matches!(plan(&deleting(lv), &live), Step::OldDriverLive(_)));
    // An id neither ours nor a UUID: left alone, its status untouched.
    let mut odd = ours("pvc-odd", "1Gi");
    odd.status = Some(LogicalVolumeStatus {
        volume_id: "LV_Made_By_Hand".into(),
        ..LogicalVolumeStatus::default()
    });
    assert!(matches!(
        plan(&odd, &observed(None, None)),
        Step::Foreign(_)
    ));
    // One of ours whose LV is gone is still reported NOT_FOUND.
    let mut gone = ours("pvc-b", "1Gi");
    gone.status = Some(LogicalVolumeStatus {
        volume_id: lv_name(&gone),
        ..LogicalVolumeStatus::default()
    });
    assert!(matches!(
        plan(&gone, &observed(None, None)),
        Step::WriteStatus(LogicalVolumeStatus { code, .. }) if code == Code::NotFound as i32
    ));
}
