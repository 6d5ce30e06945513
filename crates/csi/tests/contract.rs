//! The Identity and Controller services on a real Unix socket, driven by the generated gRPC client:
//! the CSI spec's idempotency and error-code rules, one table or test per rule.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{os::unix::fs::PermissionsExt, sync::Arc, time::Duration};

use common::{Driver, EXTENT, FakeBackend, NODE};
use lvms_csi::{
    csi::{
        ControllerExpandVolumeRequest, ControllerGetVolumeRequest, ControllerPublishVolumeRequest,
        CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest,
        GetCapacityRequest, GetPluginCapabilitiesRequest, GetPluginInfoRequest, GetSnapshotRequest,
        ListSnapshotsRequest, ListVolumesRequest, ProbeRequest, Topology, TopologyRequirement,
        ValidateVolumeCapabilitiesRequest, VolumeCapability, controller_service_capability,
        plugin_capability, volume_capability::access_mode::Mode, volume_content_source,
    },
    server,
};
use lvms_engine::{backend::DeviceClassConfig, ids};
use lvms_testkit::csi_requests::{
    block, create, from_snapshot, from_volume, in_class, mount, range,
};
use tonic::Code;

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

fn code<T: std::fmt::Debug>(r: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match r {
        Ok(r) => panic!("expected an error, got {r:?}"),
        Err(s) => (s.code(), s.message().to_owned()),
    }
}

async fn volume_id(d: &mut Driver, req: CreateVolumeRequest) -> String {
    d.controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

async fn snapshot_id(d: &mut Driver, name: &str, source: &str) -> String {
    d.controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: source.into(),
            name: name.into(),
            ..CreateSnapshotRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
        .snapshot_id
}

// Identity

#[tokio::test]
async fn identity_names_the_driver_and_advertises_controller_topology_and_online_expansion() {
    let mut d = Driver::start().await;
    let info = d
        .identity
        .get_plugin_info(GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "topolvm.io");
    assert!(!info.vendor_version.is_empty());
    let caps = d
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let services: Vec<i32> = caps
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert_eq!(
        services,
        [
            plugin_capability::service::Type::ControllerService as i32,
            plugin_capability::service::Type::VolumeAccessibilityConstraints as i32
        ]
    );
    assert!(caps.iter().any(|c| matches!(
        &c.r#type,
        Some(plugin_capability::Type::VolumeExpansion(e))
            if e.r#type == plugin_capability::volume_expansion::Type::Online as i32
    )));
}

/// The oldest grpcio whose C-core sends the percent-encoded socket path as `:authority` for a `unix:`
/// target (grpc/grpc#33571); older ones, Debian 12's python3-grpcio 1.51 among them, send `localhost`.
const C_CORE_MIN: (u32, u32) = (1, 57);

/// A directory holding grpcio from PyPI (at least [`C_CORE_MIN`]) for Debian's `/usr/bin/python3`,
/// installed with pip (python3-pip, `cargo xtask deps`) under the target directory on first use.
/// `Err` says why there is none.
fn c_core_client() -> Result<std::path::PathBuf, String> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("c-core-client");
    let version = || {
        std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import grpc; print(grpc.__version__)"])
            .env("PYTHONPATH", &dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let new_enough = |v: &str| {
        let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= C_CORE_MIN
    };
    if version().is_some_and(|v| new_enough(&v) && dir.join("grpc").exists()) {
        return Ok(dir);
    }
    let out = std::process::Command::new("/usr/bin/python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .args(["--upgrade", "--target"])
        .arg(&dir)
        .arg(format!("grpcio>={}.{}", C_CORE_MIN.0, C_CORE_MIN.1))
        .output()
        .map_err(|e| format!("running /usr/bin/python3 -m pip: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pip install grpcio failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    match version() {
        Some(v) if new_enough(&v) => Ok(dir),
        other => Err(format!("grpcio {other:?} after pip install")),
    }
}

#[tokio::test]
async fn a_grpc_c_core_client_sending_its_default_unix_authority_is_served() {
    let pythonpath = match c_core_client() {
        Ok(dir) => dir,
        Err(why) => {
            // CI has pip and PyPI; elsewhere say what is missing rather than fail.
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("skipped: no gRPC C-core client: {why}");
            return;
        }
    };
    let d = Driver::start().await;
    d.converged.set(true);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/c_core/probe.py");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(&d.socket)
            .env("PYTHONPATH", &pythonpath)
            .output(),
    )
    .await
    .expect("the C-core client finished within a minute")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the C-core client failed ({}):\n{stdout}{stderr}",
        out.status
    );
    // ready: BoolValue{value: true} is field 1 holding field 1 = 1.
    assert!(stdout.contains("probe 0a020801"), "{stdout}");
    assert!(stdout.contains("name topolvm.io"), "{stdout}");
}

#[tokio::test]
async fn probe_is_ready_only_once_the_classes_converged() {
    let mut d = Driver::start().await;
    let ready = |r: lvms_csi::csi::ProbeResponse| r.ready;
    assert_eq!(
        ready(
            d.identity
                .probe(ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
        ),
        Some(false)
    );
    d.converged.set(true);
    assert_eq!(
        ready(
            d.identity
                .probe(ProbeRequest {})
                .await
                .unwrap()
                .into_inner()
        ),
        Some(true)
    );
}

#[tokio::test]
async fn controller_advertises_exactly_the_issue_capabilities_and_no_publish() {
    use controller_service_capability::rpc::Type;
    let mut d = Driver::start().await;
    let caps: Vec<i32> = d
        .controller
        .controller_get_capabilities(lvms_csi::csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .iter()
        .filter_map(|c| {
            c.r#type
                .as_ref()
                .map(|controller_service_capability::Type::Rpc(r)| r.r#type)
        })
        .collect();
    for t in [
        Type::CreateDeleteVolume,
        Type::GetCapacity,
        Type::ExpandVolume,
        Type::CreateDeleteSnapshot,
        Type::CloneVolume,
        Type::ListVolumes,
        Type::ListSnapshots,
        Type::GetVolume,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ] {
        assert!(caps.contains(&(t as i32)), "{t:?} missing");
    }
    assert!(!caps.contains(&(Type::PublishUnpublishVolume as i32)));
    assert!(!caps.contains(&(Type::ModifyVolume as i32)));
    // Served, not advertised while csi-sanity v5.4.0 rejects it (see `controller::CAPABILITIES`).
    assert!(!caps.contains(&(Type::GetSnapshot as i32)));
    assert_eq!(caps.len(), 10);
    let (c, _) = code(
        d.controller
            .controller_publish_volume(ControllerPublishVolumeRequest::default())
            .await,
    );
    assert_eq!(c, Code::Unimplemented);
    let (c, _) = code(
        d.controller
            .controller_modify_volume(lvms_csi::csi::ControllerModifyVolumeRequest::default())
            .await,
    );
    assert_eq!(c, Code::Unimplemented);
    // GetSnapshot is served (for when GET_SNAPSHOT is advertised): an unknown id is NOT_FOUND.
    let (c, m) = code(
        d.controller
            .get_snapshot(GetSnapshotRequest {
                snapshot_id: ids::snapshot_lv_name("gone"),
                ..GetSnapshotRequest::default()
            })
            .await,
    );
    assert_eq!(c, Code::NotFound, "{m}");
}

#[tokio::test]
async fn the_group_controller_and_snapshot_metadata_services_are_not_served() {
    use lvms_csi::csi::{
        GetMetadataAllocatedRequest, GroupControllerGetCapabilitiesRequest,
        group_controller_client::GroupControllerClient,
        snapshot_metadata_client::SnapshotMetadataClient,
    };
    let d = Driver::start().await;
    let channel = server::connect(&d.socket).await.unwrap();
    let (c, m) = code(
        SnapshotMetadataClient::new(channel.clone())
            .get_metadata_allocated(GetMetadataAllocatedRequest::default())
            .await,
    );
    assert_eq!(c, Code::Unimplemented, "{m}");
    let (c, m) = code(
        GroupControllerClient::new(channel)
            .group_controller_get_capabilities(GroupControllerGetCapabilitiesRequest {})
            .await,
    );
    assert_eq!(c, Code::Unimplemented, "{m}");
}

// CreateVolume: arguments

#[tokio::test]
async fn create_volume_rejects_missing_and_hostile_fields_with_invalid_argument() {
    let mut d = Driver::start().await;
    let long = "x".repeat(129);
    let mut no_caps = create("a", GIB);
    no_caps.volume_capabilities.clear();
    let mut no_mode = create("a", GIB);
    no_mode.volume_capabilities[0].access_mode = None;
    let mut no_type = create("a", GIB);
    no_type.volume_capabilities[0].access_type = None;
    let mut multi = create("a", GIB);
    multi.volume_capabilities = vec![mount(Mode::MultiNodeMultiWriter, "xfs")];
    let mut btrfs = create("a", GIB);
    btrfs.volume_capabilities = vec![mount(Mode::SingleNodeWriter, "btrfs")];
    let mut bad_param = create("a", GIB);
    bad_param
        .parameters
        .insert("lvms.topolvm.io/lv-type".into(), "raid0".into());
    let mut negative = create("a", GIB);
    negative.capacity_range = range(-1, 0);
    let mut inverted = create("a", GIB);
    inverted.capacity_range = range(2 * GIB, GIB);
    let mut layout_on_thin = create("a", GIB);
    layout_on_thin
        .parameters
        .insert("lvms.topolvm.io/lv-type".into(), "linear".into());
    for (what, req, needle) in [
        ("empty name", create("", GIB), "name is required"),
        ("long name", create(&long, GIB), "at most 128"),
        (
            "no capabilities",
            no_caps,
            "volume_capabilities is required",
        ),
        ("no access mode", no_mode, "no access_mode"),
        ("no access type", no_type, "neither mount nor block"),
        ("multi-node mode", multi, "MULTI_NODE_MULTI_WRITER"),
        ("unsupported fs", btrfs, "btrfs"),
        ("bad parameter", bad_param, "raid0"),
        ("negative size", negative, "negative"),
        ("required over limit", inverted, "exceeds limit_bytes"),
        (
            "unknown class",
            in_class(create("a", GIB), "nope"),
            "\"nope\"",
        ),
        (
            "layout on a thin class",
            layout_on_thin,
            "thick classes only",
        ),
        (
            "clone on a thick class",
            from_volume(
                in_class(create("a", GIB), "thick"),
                &ids::volume_lv_name("x"),
            ),
            "device class thick is thick",
        ),
    ] {
        let (c, m) = code(d.controller.create_volume(req).await);
        assert_eq!(c, Code::InvalidArgument, "{what}: {m}");
        assert!(m.contains(needle), "{what}: {m}");
    }
    assert!(d.backend.calls().is_empty(), "{:?}", d.backend.calls());
}

#[tokio::test]
async fn absurd_sizes_are_out_of_range() {
    let mut d = Driver::start().await;
    let (c, m) = code(d.controller.create_volume(create("a", i64::MAX)).await);
    assert_eq!(c, Code::OutOfRange, "{m}");
    // A limit below the next whole MiB cannot be met.
    let mut req = create("b", MIB + 1);
    req.capacity_range = range(MIB + 1, MIB + 2);
    let (c, m) = code(d.controller.create_volume(req).await);
    assert_eq!(c, Code::OutOfRange, "{m}");
}

#[tokio::test]
async fn hostile_names_are_mapped_never_passed_raw() {
    let mut d = Driver::start().await;
    for name in [
        "../../etc/passwd",
        "a b; rm -rf /",
        "--force",
        "vg/lv",
        "naïve",
    ] {
        let id = volume_id(&mut d, create(name, 64 * MIB)).await;
        assert!(ids::is_volume_id(&id), "{name} -> {id}");
        assert!(!id.contains(name));
        assert!(id.len() <= 128);
    }
}

#[tokio::test]
async fn create_volume_without_size_or_topology_makes_a_default_volume_on_this_node() {
    let mut d = Driver::start().await;
    let mut req = create("a", 0);
    req.capacity_range = None;
    let v = d
        .controller
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, GIB);
    assert_eq!(v.accessible_topology.len(), 1);
    assert_eq!(
        v.accessible_topology[0]
            .segments
            .get("topology.topolvm.io/node")
            .map(String::as_str),
        Some(NODE)
    );
    assert_eq!(
        v.volume_context
            .get("topolvm.io/device-class")
            .map(String::as_str),
        Some("thin"),
        "the default class"
    );
}

#[tokio::test]
async fn create_volume_honours_accessibility_requirements() {
    let mut d = Driver::start().await;
    let topo = |node: &str| Topology {
        segments: [("topology.topolvm.io/node".to_owned(), node.to_owned())].into(),
    };
    let mut elsewhere = create("a", GIB);
    elsewhere.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topo("node-b")],
        preferred: vec![topo("node-b")],
    });
    let (c, m) = code(d.controller.create_volume(elsewhere).await);
    assert_eq!(c, Code::ResourceExhausted, "{m}");
    let mut here = create("a", GIB);
    here.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![topo("node-b"), topo(NODE)],
        preferred: vec![topo(NODE)],
    });
    d.controller.create_volume(here).await.unwrap();
}

// CreateVolume: idempotency

#[tokio::test]
async fn create_volume_same_name_compatible_request_returns_the_same_volume() {
    let mut d = Driver::start().await;
    let first = volume_id(&mut d, create("pvc-1", GIB)).await;
    let again = volume_id(&mut d, create("pvc-1", GIB)).await;
    assert_eq!(first, again);
    // A range the existing volume satisfies is compatible too.
    let mut wider = create("pvc-1", GIB / 2);
    wider.capacity_range = range(GIB / 2, 2 * GIB);
    assert_eq!(volume_id(&mut d, wider).await, first);
    let creates = d
        .backend
        .calls()
        .iter()
        .filter(|c| c.starts_with("create_volume"))
        .count();
    assert_eq!(creates, 1, "looked before creating");
}

#[tokio::test]
async fn create_volume_same_name_different_size_is_already_exists() {
    let mut d = Driver::start().await;
    volume_id(&mut d, create("pvc-1", GIB)).await;
    let (c, m) = code(d.controller.create_volume(create("pvc-1", 2 * GIB)).await);
    assert_eq!(c, Code::AlreadyExists, "{m}");
    assert!(m.contains("outside the requested range"), "{m}");
    let (c, m) = code(
        d.controller
            .create_volume(in_class(create("pvc-1", GIB), "thick"))
            .await,
    );
    assert_eq!(c, Code::AlreadyExists, "{m}");
    assert!(m.contains("device class thin"), "{m}");
}

/// A class configured but failed to converge (standalone's degraded serving, ADR 0034): a request
/// naming it, or naming no class while it is the default, is UNAVAILABLE with its reason; the
/// served classes are used as before.
#[tokio::test]
async fn a_class_that_is_not_served_answers_its_reason_and_the_others_serve() {
    let why = "/dev/vdc is an LVM physical volume of volume group old";
    let backend = FakeBackend::new().with_unserved(DeviceClassConfig::named("bad"), why);
    let mut d = Driver::start_with(Arc::new(backend)).await;
    let (c, m) = code(
        d.controller
            .create_volume(in_class(create("pvc-1", GIB), "bad"))
            .await,
    );
    assert_eq!(c, Code::Unavailable, "{m}");
    assert!(
        m.contains("device class bad is not ready") && m.contains(why),
        "{m}"
    );
    volume_id(&mut d, in_class(create("pvc-2", GIB), "thick")).await;

    // The default class is the one not served (the fake's served `thin` says default too; a
    // configuration has one default, and the one not served is asked about first).
    let default_down =
        FakeBackend::new().with_unserved(DeviceClassConfig::named("fast").as_default(), why);
    let mut d = Driver::start_with(Arc::new(default_down)).await;
    let (c, m) = code(d.controller.create_volume(create("pvc-3", GIB)).await);
    assert_eq!(c, Code::Unavailable, "{m}");
    assert!(m.contains("device class fast"), "{m}");
}

#[tokio::test]
async fn concurrent_operations_on_one_volume_get_aborted() {
    let backend = Arc::new(FakeBackend::new());
    backend.state.lock().unwrap().create_delay = Duration::from_millis(400);
    let d = Driver::start_with(backend).await;
    let (mut a, mut b) = (d.controller.clone(), d.controller.clone());
    let first = tokio::spawn(async move { a.create_volume(create("pvc-1", GIB)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (c, m) = code(b.create_volume(create("pvc-1", GIB)).await);
    assert_eq!(c, Code::Aborted, "{m}");
    first.await.unwrap().unwrap();
    // Once the first finished, the retry succeeds with the same volume.
    b.create_volume(create("pvc-1", GIB)).await.unwrap();
}

#[tokio::test]
async fn create_volume_beyond_the_space_is_resource_exhausted() {
    let mut d = Driver::start().await;
    // Thin: ratio 2 over a 4 GiB pool.
    volume_id(&mut d, create("big", 8 * GIB - 4 * MIB)).await;
    let (c, m) = code(d.controller.create_volume(create("more", 8 * MIB)).await);
    assert_eq!(c, Code::ResourceExhausted, "{m}");
    assert!(m.contains("device class thin"), "{m}");
    // Thick: 1 GiB free.
    let (c, m) = code(
        d.controller
            .create_volume(in_class(create("thick-big", 2 * GIB), "thick"))
            .await,
    );
    assert_eq!(c, Code::ResourceExhausted, "{m}");
}

// Snapshots, clones, restores

#[tokio::test]
async fn snapshots_restores_and_clones_follow_the_spec() {
    let mut d = Driver::start().await;
    let vol = volume_id(&mut d, create("pvc-1", GIB)).await;
    let snap = snapshot_id(&mut d, "snap-1", &vol).await;
    assert!(ids::is_snapshot_id(&snap));
    // Same name, same source: the same snapshot.
    assert_eq!(snapshot_id(&mut d, "snap-1", &vol).await, snap);
    // Same name, another source: ALREADY_EXISTS.
    let other = volume_id(&mut d, create("pvc-2", GIB)).await;
    let (c, m) = code(
        d.controller
            .create_snapshot(CreateSnapshotRequest {
                source_volume_id: other.clone(),
                name: "snap-1".into(),
                ..CreateSnapshotRequest::default()
            })
            .await,
    );
    assert_eq!(c, Code::AlreadyExists, "{m}");

    // A restore may be larger than its source, not smaller.
    let restored = d
        .controller
        .create_volume(from_snapshot(create("restore", 2 * GIB), &snap))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.capacity_bytes, 2 * GIB);
    assert!(matches!(
        restored.content_source.and_then(|s| s.r#type),
        Some(volume_content_source::Type::Snapshot(s)) if s.snapshot_id == snap
    ));
    let (c, m) = code(
        d.controller
            .create_volume(from_snapshot(create("small", GIB / 2), &snap))
            .await,
    );
    assert_eq!(c, Code::OutOfRange, "{m}");
    // Same name, another source: ALREADY_EXISTS.
    let (c, m) = code(
        d.controller
            .create_volume(from_volume(create("restore", 2 * GIB), &vol))
            .await,
    );
    assert_eq!(c, Code::AlreadyExists, "{m}");
    // Clone.
    volume_id(&mut d, from_volume(create("clone", GIB), &vol)).await;
    // Missing sources are NOT_FOUND.
    let (c, _) = code(
        d.controller
            .create_volume(from_snapshot(
                create("x", GIB),
                &ids::snapshot_lv_name("gone"),
            ))
            .await,
    );
    assert_eq!(c, Code::NotFound);
    let (c, _) = code(
        d.controller
            .create_volume(from_volume(create("y", GIB), "not-an-id"))
            .await,
    );
    assert_eq!(c, Code::NotFound);
    // A snapshot id is not a volume source.
    let (c, _) = code(
        d.controller
            .create_volume(from_volume(create("z", GIB), &snap))
            .await,
    );
    assert_eq!(c, Code::NotFound);
}

#[tokio::test]
async fn snapshot_errors_name_the_field_the_source_or_the_class() {
    let mut d = Driver::start().await;
    let thick = volume_id(&mut d, in_class(create("t", GIB / 4), "thick")).await;
    for (req, want, needle) in [
        (
            CreateSnapshotRequest {
                source_volume_id: thick.clone(),
                name: String::new(),
                ..CreateSnapshotRequest::default()
            },
            Code::InvalidArgument,
            "name is required",
        ),
        (
            CreateSnapshotRequest {
                source_volume_id: String::new(),
                name: "s".into(),
                ..CreateSnapshotRequest::default()
            },
            Code::InvalidArgument,
            "source_volume_id is required",
        ),
        (
            CreateSnapshotRequest {
                source_volume_id: ids::volume_lv_name("gone"),
                name: "s".into(),
                ..CreateSnapshotRequest::default()
            },
            Code::NotFound,
            "does not exist",
        ),
        (
            CreateSnapshotRequest {
                source_volume_id: thick.clone(),
                name: "s".into(),
                ..CreateSnapshotRequest::default()
            },
            Code::InvalidArgument,
            "thick device class thick",
        ),
    ] {
        let (c, m) = code(d.controller.create_snapshot(req).await);
        assert_eq!((c, m.contains(needle)), (want, true), "{m}");
    }
}

// Deletion

#[tokio::test]
async fn delete_of_a_missing_volume_or_snapshot_is_ok_and_empty_ids_are_invalid() {
    let mut d = Driver::start().await;
    let vol = volume_id(&mut d, create("pvc-1", GIB)).await;
    let snap = snapshot_id(&mut d, "s", &vol).await;
    for _ in 0..2 {
        d.controller
            .delete_snapshot(DeleteSnapshotRequest {
                snapshot_id: snap.clone(),
                ..DeleteSnapshotRequest::default()
            })
            .await
            .unwrap();
        d.controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: vol.clone(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
    }
    d.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: "never-existed".into(),
            ..DeleteVolumeRequest::default()
        })
        .await
        .unwrap();
    let (c, _) = code(
        d.controller
            .delete_volume(DeleteVolumeRequest::default())
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    let (c, _) = code(
        d.controller
            .delete_snapshot(DeleteSnapshotRequest::default())
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    // DeleteVolume never removes a snapshot, nor DeleteSnapshot a volume.
    let vol = volume_id(&mut d, create("pvc-2", GIB)).await;
    let snap = snapshot_id(&mut d, "s2", &vol).await;
    d.controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: snap.clone(),
            ..DeleteVolumeRequest::default()
        })
        .await
        .unwrap();
    d.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: vol.clone(),
            ..DeleteSnapshotRequest::default()
        })
        .await
        .unwrap();
    let left = d.backend.state.lock().unwrap().volumes.len();
    assert_eq!(left, 2);
}

// Listing and getting

#[tokio::test]
async fn list_volumes_pages_with_tokens_and_reports_conditions() {
    let mut d = Driver::start().await;
    let mut ids: Vec<String> = Vec::new();
    for i in 0..5 {
        ids.push(volume_id(&mut d, create(&format!("pvc-{i}"), 64 * MIB)).await);
    }
    snapshot_id(&mut d, "not-listed", &ids[0]).await;
    ids.sort();
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = d
            .controller
            .list_volumes(ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        for e in &page.entries {
            seen.push(e.volume.as_ref().unwrap().volume_id.clone());
            let cond = e
                .status
                .as_ref()
                .unwrap()
                .volume_condition
                .as_ref()
                .unwrap();
            assert!(!cond.abnormal);
        }
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    assert_eq!(seen, ids);
    let (c, _) = code(
        d.controller
            .list_volumes(ListVolumesRequest {
                max_entries: 0,
                starting_token: "bogus".into(),
            })
            .await,
    );
    assert_eq!(c, Code::Aborted);
    let (c, _) = code(
        d.controller
            .list_volumes(ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new(),
            })
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
}

#[tokio::test]
async fn list_snapshots_filters_by_id_and_source() {
    let mut d = Driver::start().await;
    let a = volume_id(&mut d, create("a", 64 * MIB)).await;
    let b = volume_id(&mut d, create("b", 64 * MIB)).await;
    let sa = snapshot_id(&mut d, "sa", &a).await;
    let sb = snapshot_id(&mut d, "sb", &b).await;
    let list = |d: &mut Driver, req: ListSnapshotsRequest| {
        let mut c = d.controller.clone();
        async move {
            c.list_snapshots(req)
                .await
                .unwrap()
                .into_inner()
                .entries
                .into_iter()
                .map(|e| e.snapshot.unwrap())
                .collect::<Vec<_>>()
        }
    };
    let all = list(&mut d, ListSnapshotsRequest::default()).await;
    assert_eq!(all.len(), 2);
    let by_source = list(
        &mut d,
        ListSnapshotsRequest {
            source_volume_id: b.clone(),
            ..ListSnapshotsRequest::default()
        },
    )
    .await;
    assert_eq!(by_source.len(), 1);
    assert_eq!(by_source[0].snapshot_id, sb);
    assert_eq!(by_source[0].source_volume_id, b);
    assert!(by_source[0].ready_to_use && by_source[0].creation_time.is_some());
    let by_id = list(
        &mut d,
        ListSnapshotsRequest {
            snapshot_id: sa.clone(),
            ..ListSnapshotsRequest::default()
        },
    )
    .await;
    assert_eq!(by_id.len(), 1);
    assert_eq!(by_id[0].source_volume_id, a);
    let none = list(
        &mut d,
        ListSnapshotsRequest {
            snapshot_id: "unknown".into(),
            ..ListSnapshotsRequest::default()
        },
    )
    .await;
    assert!(none.is_empty());
}

#[tokio::test]
async fn get_snapshot_answers_what_list_snapshots_lists_for_the_id() {
    let mut d = Driver::start().await;
    let vol = volume_id(&mut d, create("a", GIB)).await;
    let made = d
        .controller
        .create_snapshot(CreateSnapshotRequest {
            source_volume_id: vol.clone(),
            name: "sa".into(),
            ..CreateSnapshotRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    snapshot_id(&mut d, "other", &vol).await;
    let get = |d: &mut Driver, id: &str| {
        let mut c = d.controller.clone();
        let req = GetSnapshotRequest {
            snapshot_id: id.into(),
            ..GetSnapshotRequest::default()
        };
        async move { c.get_snapshot(req).await }
    };
    let got = get(&mut d, &made.snapshot_id)
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got.snapshot_id, made.snapshot_id);
    assert_eq!(got.source_volume_id, vol);
    assert_eq!(got.size_bytes, GIB);
    assert!(got.ready_to_use && got.creation_time.is_some());
    assert_eq!(got, made);
    let listed = d
        .controller
        .list_snapshots(ListSnapshotsRequest {
            snapshot_id: made.snapshot_id.clone(),
            ..ListSnapshotsRequest::default()
        })
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].snapshot.as_ref(), Some(&got));

    for (id, want, needle) in [
        (
            String::new(),
            Code::InvalidArgument,
            "snapshot_id is required",
        ),
        ("x".repeat(129), Code::InvalidArgument, "at most 128"),
        (
            ids::snapshot_lv_name("gone"),
            Code::NotFound,
            "does not exist",
        ),
        ("not-an-id".to_owned(), Code::NotFound, "does not exist"),
        // A volume is not a snapshot.
        (vol.clone(), Code::NotFound, "does not exist"),
    ] {
        let (c, m) = code(get(&mut d, &id).await);
        assert_eq!((c, m.contains(needle)), (want, true), "{id}: {m}");
    }

    d.controller
        .delete_snapshot(DeleteSnapshotRequest {
            snapshot_id: made.snapshot_id.clone(),
            ..DeleteSnapshotRequest::default()
        })
        .await
        .unwrap();
    let (c, m) = code(get(&mut d, &made.snapshot_id).await);
    assert_eq!(c, Code::NotFound, "{m}");
}

#[tokio::test]
async fn get_volume_and_validate_capabilities_need_an_existing_volume() {
    let mut d = Driver::start().await;
    let (c, _) = code(
        d.controller
            .controller_get_volume(ControllerGetVolumeRequest {
                volume_id: ids::volume_lv_name("gone"),
            })
            .await,
    );
    assert_eq!(c, Code::NotFound);
    let id = volume_id(&mut d, create("a", GIB)).await;
    let got = d
        .controller
        .controller_get_volume(ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.volume.unwrap().capacity_bytes, GIB);
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);

    let validate = |caps: Vec<VolumeCapability>, id: &str| ValidateVolumeCapabilitiesRequest {
        volume_id: id.into(),
        volume_capabilities: caps,
        ..ValidateVolumeCapabilitiesRequest::default()
    };
    let ok = d
        .controller
        .validate_volume_capabilities(validate(vec![block(Mode::SingleNodeWriter)], &id))
        .await
        .unwrap()
        .into_inner();
    assert!(ok.confirmed.is_some());
    let no = d
        .controller
        .validate_volume_capabilities(validate(vec![mount(Mode::MultiNodeReaderOnly, "")], &id))
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());
    assert!(
        no.message.contains("MULTI_NODE_READER_ONLY"),
        "{}",
        no.message
    );
    let (c, _) = code(
        d.controller
            .validate_volume_capabilities(validate(vec![block(Mode::SingleNodeWriter)], "gone"))
            .await,
    );
    assert_eq!(c, Code::NotFound);
    let (c, _) = code(
        d.controller
            .validate_volume_capabilities(validate(vec![], &id))
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
}

// Capacity

#[tokio::test]
async fn get_capacity_reports_per_class_and_zero_for_other_nodes() {
    let mut d = Driver::start().await;
    let cap = |class: &str, node: Option<&str>| GetCapacityRequest {
        parameters: [("topolvm.io/device-class".to_owned(), class.to_owned())].into(),
        accessible_topology: node.map(|n| Topology {
            segments: [("topology.topolvm.io/node".to_owned(), n.to_owned())].into(),
        }),
        ..GetCapacityRequest::default()
    };
    let thin = d
        .controller
        .get_capacity(cap("thin", Some(NODE)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        thin.available_capacity,
        8 * GIB,
        "ratio 2 over a 4 GiB pool"
    );
    assert_eq!(thin.minimum_volume_size, Some(EXTENT as i64));
    volume_id(&mut d, create("a", GIB)).await;
    let thin = d
        .controller
        .get_capacity(cap("thin", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(thin.available_capacity, 7 * GIB);
    let thick = d
        .controller
        .get_capacity(cap("thick", None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(thick.available_capacity, GIB);
    assert_eq!(thick.maximum_volume_size, Some(GIB));
    let other = d
        .controller
        .get_capacity(cap("thin", Some("node-b")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.available_capacity, 0);
    let (c, m) = code(d.controller.get_capacity(cap("nope", None)).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    let default = d
        .controller
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        default.available_capacity,
        7 * GIB,
        "no parameters: the default class"
    );
}

// Expansion

#[tokio::test]
async fn controller_expand_grows_is_idempotent_and_asks_for_node_expansion_for_filesystems() {
    let mut d = Driver::start().await;
    let id = volume_id(&mut d, create("a", GIB)).await;
    let expand =
        |id: &str, size: i64, cap: Option<VolumeCapability>| ControllerExpandVolumeRequest {
            volume_id: id.into(),
            capacity_range: range(size, 0),
            volume_capability: cap,
            ..ControllerExpandVolumeRequest::default()
        };
    let r = d
        .controller
        .controller_expand_volume(expand(
            &id,
            GIB + GIB / 2,
            Some(mount(Mode::SingleNodeWriter, "xfs")),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, GIB + GIB / 2);
    assert!(r.node_expansion_required);
    // Again, and smaller: the current size, nothing done.
    let calls = d.backend.calls().len();
    for size in [GIB + GIB / 2, GIB] {
        let r = d
            .controller
            .controller_expand_volume(expand(&id, size, None))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.capacity_bytes, GIB + GIB / 2);
    }
    assert_eq!(d.backend.calls().len(), calls);
    let blk = volume_id(&mut d, create("blk", 64 * MIB)).await;
    let r = d
        .controller
        .controller_expand_volume(expand(&blk, 128 * MIB, Some(block(Mode::SingleNodeWriter))))
        .await
        .unwrap()
        .into_inner();
    assert!(!r.node_expansion_required);

    let (c, _) = code(
        d.controller
            .controller_expand_volume(expand(&ids::volume_lv_name("gone"), GIB, None))
            .await,
    );
    assert_eq!(c, Code::NotFound);
    let mut no_range = expand(&id, GIB, None);
    no_range.capacity_range = None;
    let (c, _) = code(d.controller.controller_expand_volume(no_range).await);
    assert_eq!(c, Code::InvalidArgument);
    let (c, _) = code(
        d.controller
            .controller_expand_volume(expand(&id, 0, None))
            .await,
    );
    assert_eq!(c, Code::InvalidArgument);
    let (c, m) = code(
        d.controller
            .controller_expand_volume(expand(&id, 16 * GIB, None))
            .await,
    );
    assert_eq!(c, Code::ResourceExhausted, "{m}");
}

// The socket

#[tokio::test]
async fn socket_is_owner_only_and_a_stale_one_is_replaced_but_a_file_is_not() {
    let d = Driver::start().await;
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let socket = d.socket.clone();
    let dir = d.dir().to_owned();
    d.stop();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The stopped server's socket file is stale: bind replaces it.
    server::bind(&socket).unwrap();
    let file = dir.join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let err = server::bind(&file).unwrap_err();
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[tokio::test]
async fn a_restore_interrupted_before_its_extend_is_finished_by_the_retry_but_a_new_size_is_already_exists()
 {
    let mut d = Driver::start().await;
    let vol = volume_id(&mut d, create("pvc-1", GIB)).await;
    let snap = snapshot_id(&mut d, "snap-1", &vol).await;
    let restored = volume_id(&mut d, from_snapshot(create("restore", 2 * GIB), &snap)).await;
    // The crash: the thin snapshot exists at the source's size, the extend never ran.
    d.backend
        .state
        .lock()
        .unwrap()
        .volumes
        .get_mut(&restored)
        .unwrap()
        .size = GIB as u64;
    let again = d
        .controller
        .create_volume(from_snapshot(create("restore", 2 * GIB), &snap))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        (again.volume_id.as_str(), again.capacity_bytes),
        (restored.as_str(), 2 * GIB)
    );
    // Another size for the same name is still a conflict.
    let (c, m) = code(
        d.controller
            .create_volume(from_snapshot(create("restore", 3 * GIB), &snap))
            .await,
    );
    assert_eq!(c, Code::AlreadyExists, "{m}");
}

#[tokio::test]
async fn xfs_volumes_are_made_at_least_300mi_and_a_lower_limit_is_out_of_range() {
    let mut d = Driver::start().await;
    let v = d
        .controller
        .create_volume(create("small-xfs", 64 * MIB))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 300 * MIB);
    let mut ext4 = create("small-ext4", 64 * MIB);
    ext4.volume_capabilities = vec![mount(Mode::SingleNodeWriter, "ext4")];
    let v = d
        .controller
        .create_volume(ext4)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(v.capacity_bytes, 64 * MIB);
    let mut capped = create("capped-xfs", 64 * MIB);
    capped.capacity_range = range(64 * MIB, 128 * MIB);
    let (c, m) = code(d.controller.create_volume(capped).await);
    assert_eq!(c, Code::OutOfRange, "{m}");
    assert!(m.contains("300Mi"), "{m}");
}

#[tokio::test]
async fn without_a_requested_fstype_the_class_fstype_decides_the_xfs_minimum() {
    use lvms_core::config::Fstype;
    let backend = FakeBackend::new()
        .with_fstype("thin", Fstype::Xfs)
        .with_fstype("thick", Fstype::Ext4);
    let mut d = Driver::start_with(Arc::new(backend)).await;
    let size = |v: lvms_csi::csi::CreateVolumeResponse| v.volume.unwrap().capacity_bytes;
    // (name, class, capability fs_type) -> capacity of a 64Mi request.
    for (name, class, fs, want) in [
        ("thin-class-xfs", "thin", "", 300 * MIB),
        ("thick-class-ext4", "thick", "", 64 * MIB),
        ("thick-class-asked-xfs", "thick", "xfs", 300 * MIB),
        ("thin-class-asked-ext4", "thin", "ext4", 64 * MIB),
    ] {
        let mut req = in_class(create(name, 64 * MIB), class);
        req.volume_capabilities = vec![mount(Mode::SingleNodeWriter, fs)];
        let got = size(d.controller.create_volume(req).await.unwrap().into_inner());
        assert_eq!(got, want, "{name}");
    }
    let mut blk = in_class(create("thin-class-block", 64 * MIB), "thin");
    blk.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
    let got = size(d.controller.create_volume(blk).await.unwrap().into_inner());
    assert_eq!(got, 64 * MIB, "a block volume has no filesystem");
}

// Shared classes

fn shared_segment() -> Topology {
    Topology {
        segments: [("shared.lvms.topolvm.io/thick".to_owned(), "true".to_owned())].into(),
    }
}

fn node_segment(node: &str) -> Topology {
    Topology {
        segments: [("topology.topolvm.io/node".to_owned(), node.to_owned())].into(),
    }
}

async fn shared_driver(mode: lvms_core::config::SharedVolumeMode) -> Driver {
    Driver::start_with(Arc::new(FakeBackend::new().with_shared("thick", mode))).await
}

#[tokio::test]
async fn a_shared_class_volume_is_accessible_from_every_joined_node_and_so_is_its_capacity() {
    let mut d = shared_driver(lvms_core::config::SharedVolumeMode::Linear).await;
    let vol = d
        .controller
        .create_volume(in_class(create("s1", GIB / 4), "thick"))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(vol.accessible_topology, vec![shared_segment()]);

    // Another node's segment with the class's key is this class's nodes; another node alone is not.
    let mut other = node_segment("node-b");
    other.segments.extend(shared_segment().segments);
    let mut req = in_class(create("s2", GIB / 4), "thick");
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![other.clone()],
        preferred: vec![other.clone()],
    });
    d.controller.create_volume(req).await.unwrap();
    let mut req = in_class(create("s3", GIB / 4), "thick");
    req.accessibility_requirements = Some(TopologyRequirement {
        requisite: vec![node_segment("node-b")],
        preferred: vec![],
    });
    let (c, m) = code(d.controller.create_volume(req).await);
    assert_eq!(c, Code::ResourceExhausted, "{m}");
    assert!(m.contains("shared.lvms.topolvm.io/thick"), "{m}");

    let capacity = |t: Topology| GetCapacityRequest {
        parameters: [("topolvm.io/device-class".to_owned(), "thick".to_owned())].into(),
        accessible_topology: Some(t),
        ..GetCapacityRequest::default()
    };
    let joined = d
        .controller
        .get_capacity(capacity(shared_segment()))
        .await
        .unwrap();
    assert!(joined.into_inner().available_capacity > 0);
    let elsewhere = d
        .controller
        .get_capacity(capacity(node_segment("node-b")))
        .await
        .unwrap();
    assert_eq!(elsewhere.into_inner().available_capacity, 0);
}

#[tokio::test]
async fn the_volume_mode_parameter_decides_multi_node_access_and_needs_a_shared_class() {
    let mut d = shared_driver(lvms_core::config::SharedVolumeMode::Linear).await;
    let rwx = |name: &str, mode: Option<&str>| {
        let mut req = in_class(create(name, GIB / 4), "thick");
        req.volume_capabilities = vec![block(Mode::MultiNodeMultiWriter)];
        if let Some(m) = mode {
            req.parameters
                .insert("lvms.topolvm.io/volume-mode".into(), m.into());
        }
        req
    };
    d.controller
        .create_volume(rwx("linear", None))
        .await
        .unwrap();
    d.controller
        .create_volume(rwx("linear2", Some("linear")))
        .await
        .unwrap();
    let (c, m) = code(d.controller.create_volume(rwx("thin", Some("thin"))).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(m.contains("one node at a time"), "{m}");

    let mut req = create("local", GIB / 4);
    req.parameters
        .insert("lvms.topolvm.io/volume-mode".into(), "thin".into());
    let (c, m) = code(d.controller.create_volume(req).await);
    assert_eq!(c, Code::InvalidArgument, "{m}");
    assert!(
        m.contains("lvms.topolvm.io/volume-mode") && m.contains("not shared"),
        "{m}"
    );
}
