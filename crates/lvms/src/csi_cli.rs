//! `lvms csi <rpc>`: a small CSI client for any CSI endpoint (a Unix socket), for operators and the
//! demo. Each subcommand is one RPC; answers print as `key: value` lines (or JSON with `--output
//! json`), and `--output id` prints only the id a create returns.

use std::{collections::HashMap, path::PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use lvms_core::size::ByteSize;
use lvms_csi::csi::{
    CapacityRange, ControllerExpandVolumeRequest, ControllerGetVolumeRequest,
    CreateSnapshotRequest, CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest,
    GetCapacityRequest, GetPluginInfoRequest, ListSnapshotsRequest, ListVolumesRequest,
    NodeExpandVolumeRequest, NodeGetInfoRequest, NodeGetVolumeStatsRequest,
    NodePublishVolumeRequest, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, ProbeRequest, VolumeCapability, VolumeContentSource,
    controller_client::ControllerClient, identity_client::IdentityClient, node_client::NodeClient,
    volume_capability, volume_content_source,
};
use serde_json::{Value, json};

/// Where the driver listens, and how to print answers.
#[derive(Args)]
pub struct CsiArgs {
    /// The CSI endpoint: a Unix socket path (a `unix://` prefix is accepted).
    #[arg(long, env = "CSI_ENDPOINT", default_value = "/run/lvms/csi.sock")]
    endpoint: String,
    /// How to print the answer.
    #[arg(long, value_enum, default_value_t = CsiOutput::Text)]
    output: CsiOutput,
    #[command(subcommand)]
    rpc: Rpc,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum CsiOutput {
    /// `key: value` lines.
    Text,
    /// One JSON object.
    Json,
    /// Only the id (creates) or nothing.
    Id,
}

/// How a volume is accessed.
#[derive(Args, Clone)]
struct Access {
    /// Raw block access instead of a filesystem.
    #[arg(long)]
    block: bool,
    /// Filesystem for mount access (ext4 or xfs; the driver's default when empty).
    #[arg(long, default_value = "")]
    fs: String,
    /// Mount flags, repeatable.
    #[arg(long = "mount-flag")]
    mount_flags: Vec<String>,
    /// Access mode.
    #[arg(long, value_enum, default_value_t = Mode::SingleNodeWriter)]
    mode: Mode,
}

/// The CSI access modes this driver accepts, named as the spec names them.
#[allow(clippy::enum_variant_names)]
#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    SingleNodeWriter,
    SingleNodeReaderOnly,
    SingleNodeSingleWriter,
    SingleNodeMultiWriter,
    /// Block volumes of a shared linear class only.
    MultiNodeReaderOnly,
    MultiNodeSingleWriter,
    MultiNodeMultiWriter,
}

impl Access {
    fn capability(&self) -> VolumeCapability {
        use volume_capability::access_mode::Mode as M;
        let mode = match self.mode {
            Mode::SingleNodeWriter => M::SingleNodeWriter,
            Mode::SingleNodeReaderOnly => M::SingleNodeReaderOnly,
            Mode::SingleNodeSingleWriter => M::SingleNodeSingleWriter,
            Mode::SingleNodeMultiWriter => M::SingleNodeMultiWriter,
            Mode::MultiNodeReaderOnly => M::MultiNodeReaderOnly,
            Mode::MultiNodeSingleWriter => M::MultiNodeSingleWriter,
            Mode::MultiNodeMultiWriter => M::MultiNodeMultiWriter,
        };
        VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
            access_type: Some(if self.block {
                volume_capability::AccessType::Block(volume_capability::BlockVolume {})
            } else {
                volume_capability::AccessType::Mount(volume_capability::MountVolume {
                    fs_type: self.fs.clone(),
                    mount_flags: self.mount_flags.clone(),
                    volume_mount_group: String::new(),
                })
            }),
        }
    }
}

#[derive(Subcommand)]
enum Rpc {
    /// GetPluginInfo and Probe.
    Info,
    /// Probe: exit 0 when ready, 1 when not.
    Probe,
    /// CreateVolume.
    CreateVolume {
        #[arg(long)]
        name: String,
        /// Size, such as 1Gi.
        #[arg(long)]
        size: ByteSize,
        /// Device class (`topolvm.io/device-class`); the default class when absent.
        #[arg(long)]
        class: Option<String>,
        /// Restore from this snapshot id.
        #[arg(long, conflicts_with = "from_volume")]
        from_snapshot: Option<String>,
        /// Clone this volume id.
        #[arg(long)]
        from_volume: Option<String>,
        /// Extra parameters, `key=value`, repeatable.
        #[arg(long = "param", value_parser = key_value)]
        params: Vec<(String, String)>,
        #[command(flatten)]
        access: Access,
    },
    /// DeleteVolume.
    DeleteVolume { volume_id: String },
    /// ControllerGetVolume.
    GetVolume { volume_id: String },
    /// ListVolumes (every page).
    ListVolumes,
    /// CreateSnapshot.
    CreateSnapshot {
        #[arg(long)]
        name: String,
        #[arg(long)]
        source: String,
    },
    /// DeleteSnapshot.
    DeleteSnapshot { snapshot_id: String },
    /// ListSnapshots (every page).
    ListSnapshots {
        #[arg(long)]
        source: Option<String>,
    },
    /// GetCapacity of a class.
    Capacity {
        #[arg(long)]
        class: Option<String>,
    },
    /// ControllerExpandVolume.
    Expand {
        volume_id: String,
        #[arg(long)]
        size: ByteSize,
        #[arg(long)]
        block: bool,
    },
    /// NodeGetInfo.
    NodeInfo,
    /// NodeStageVolume.
    Stage {
        volume_id: String,
        #[arg(long)]
        staging_path: PathBuf,
        #[command(flatten)]
        access: Access,
    },
    /// NodeUnstageVolume.
    Unstage {
        volume_id: String,
        #[arg(long)]
        staging_path: PathBuf,
    },
    /// NodePublishVolume.
    Publish {
        volume_id: String,
        #[arg(long)]
        staging_path: PathBuf,
        #[arg(long)]
        target_path: PathBuf,
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        access: Access,
    },
    /// NodeUnpublishVolume.
    Unpublish {
        volume_id: String,
        #[arg(long)]
        target_path: PathBuf,
    },
    /// NodeGetVolumeStats.
    Stats {
        volume_id: String,
        #[arg(long)]
        path: PathBuf,
    },
    /// NodeExpandVolume.
    NodeExpand {
        volume_id: String,
        #[arg(long)]
        path: PathBuf,
        #[arg(long)]
        size: ByteSize,
        #[command(flatten)]
        access: Access,
    },
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

fn path(p: &std::path::Path) -> String {
    p.to_string_lossy().into_owned()
}

fn bytes(b: ByteSize) -> i64 {
    i64::try_from(b.0).unwrap_or(i64::MAX)
}

fn volume_json(v: &lvms_csi::csi::Volume) -> Value {
    let source = v
        .content_source
        .as_ref()
        .and_then(|s| s.r#type.as_ref())
        .map(|t| match t {
            volume_content_source::Type::Snapshot(s) => format!("snapshot {}", s.snapshot_id),
            volume_content_source::Type::Volume(v) => format!("volume {}", v.volume_id),
        });
    json!({
        "volume_id": v.volume_id,
        "capacity": ByteSize(v.capacity_bytes.unsigned_abs()).to_string(),
        "capacity_bytes": v.capacity_bytes,
        "device_class": v.volume_context.get(lvms_csi::DEVICE_CLASS_KEY),
        "node": v.accessible_topology.first().and_then(|t| t.segments.get(lvms_csi::TOPOLOGY_NODE_KEY)),
        "topology": v.accessible_topology.iter().map(|t| &t.segments).collect::<Vec<_>>(),
        "source": source,
    })
}

fn snapshot_json(s: &lvms_csi::csi::Snapshot) -> Value {
    json!({
        "snapshot_id": s.snapshot_id,
        "source_volume_id": s.source_volume_id,
        "size": ByteSize(s.size_bytes.unsigned_abs()).to_string(),
        "ready_to_use": s.ready_to_use,
        "creation_time": s.creation_time.as_ref().map(|t| t.seconds),
    })
}

fn print(output: CsiOutput, value: &Value) {
    match output {
        CsiOutput::Json => println!("{value}"),
        CsiOutput::Id => {
            if let Some(id) = value
                .get("volume_id")
                .or_else(|| value.get("snapshot_id"))
                .and_then(Value::as_str)
            {
                println!("{id}");
            }
        }
        CsiOutput::Text => print_text(value, ""),
    }
}

fn print_text(value: &Value, indent: &str) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::Null => {}
                    Value::Object(_) | Value::Array(_) => {
                        println!("{indent}{k}:");
                        print_text(v, &format!("{indent}  "));
                    }
                    Value::String(s) => println!("{indent}{k}: {s}"),
                    other => println!("{indent}{k}: {other}"),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                println!("{indent}-");
                print_text(item, &format!("{indent}  "));
            }
        }
        other => println!("{indent}{other}"),
    }
}

/// Runs one RPC against the endpoint; the process exits non-zero with the gRPC code and message when
/// the driver refuses.
pub async fn run(args: CsiArgs) -> Result<()> {
    let socket = args
        .endpoint
        .strip_prefix("unix://")
        .unwrap_or(&args.endpoint)
        .to_owned();
    let channel = lvms_csi::server::connect(&socket)
        .await
        .with_context(|| format!("connecting to the CSI endpoint {socket}"))?;
    let mut identity = IdentityClient::new(channel.clone());
    let mut controller = ControllerClient::new(channel.clone());
    let mut node = NodeClient::new(channel);
    let status = |rpc: &'static str| {
        move |s: tonic::Status| anyhow::anyhow!("{rpc}: {:?}: {}", s.code(), s.message())
    };
    let out = args.output;
    match args.rpc {
        Rpc::Info => {
            let info = identity
                .get_plugin_info(GetPluginInfoRequest {})
                .await
                .map_err(status("GetPluginInfo"))?
                .into_inner();
            let ready = identity
                .probe(ProbeRequest {})
                .await
                .map_err(status("Probe"))?
                .into_inner()
                .ready;
            print(
                out,
                &json!({"name": info.name, "version": info.vendor_version, "ready": ready}),
            );
        }
        Rpc::Probe => {
            let ready = identity
                .probe(ProbeRequest {})
                .await
                .map_err(status("Probe"))?
                .into_inner()
                .ready
                .unwrap_or(false);
            print(out, &json!({ "ready": ready }));
            if !ready {
                std::process::exit(1);
            }
        }
        Rpc::CreateVolume {
            name,
            size,
            class,
            from_snapshot,
            from_volume,
            params,
            access,
        } => {
            let mut parameters: HashMap<String, String> = params.into_iter().collect();
            if let Some(class) = class {
                parameters.insert(lvms_csi::params::DEVICE_CLASS.to_owned(), class);
            }
            let source = from_snapshot
                .map(|id| {
                    volume_content_source::Type::Snapshot(volume_content_source::SnapshotSource {
                        snapshot_id: id,
                    })
                })
                .or_else(|| {
                    from_volume.map(|id| {
                        volume_content_source::Type::Volume(volume_content_source::VolumeSource {
                            volume_id: id,
                        })
                    })
                });
            let v = controller
                .create_volume(CreateVolumeRequest {
                    name,
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes(size),
                        limit_bytes: 0,
                    }),
                    volume_capabilities: vec![access.capability()],
                    parameters,
                    volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
                    ..CreateVolumeRequest::default()
                })
                .await
                .map_err(status("CreateVolume"))?
                .into_inner()
                .volume
                .context("CreateVolume answered without a volume")?;
            print(out, &volume_json(&v));
        }
        Rpc::DeleteVolume { volume_id } => {
            controller
                .delete_volume(DeleteVolumeRequest {
                    volume_id: volume_id.clone(),
                    ..DeleteVolumeRequest::default()
                })
                .await
                .map_err(status("DeleteVolume"))?;
            print(out, &json!({ "deleted": volume_id }));
        }
        Rpc::GetVolume { volume_id } => {
            let r = controller
                .controller_get_volume(ControllerGetVolumeRequest { volume_id })
                .await
                .map_err(status("ControllerGetVolume"))?
                .into_inner();
            let mut v = r.volume.as_ref().map(volume_json).unwrap_or(Value::Null);
            if let (Some(obj), Some(c)) =
                (v.as_object_mut(), r.status.and_then(|s| s.volume_condition))
            {
                obj.insert("abnormal".into(), json!(c.abnormal));
                obj.insert("condition".into(), json!(c.message));
            }
            print(out, &v);
        }
        Rpc::ListVolumes => {
            let mut all = Vec::new();
            let mut token = String::new();
            loop {
                let page = controller
                    .list_volumes(ListVolumesRequest {
                        max_entries: 100,
                        starting_token: token,
                    })
                    .await
                    .map_err(status("ListVolumes"))?
                    .into_inner();
                all.extend(
                    page.entries
                        .iter()
                        .filter_map(|e| e.volume.as_ref())
                        .map(volume_json),
                );
                if page.next_token.is_empty() {
                    break;
                }
                token = page.next_token;
            }
            print(out, &json!({ "volumes": all }));
        }
        Rpc::CreateSnapshot { name, source } => {
            let s = controller
                .create_snapshot(CreateSnapshotRequest {
                    source_volume_id: source,
                    name,
                    ..CreateSnapshotRequest::default()
                })
                .await
                .map_err(status("CreateSnapshot"))?
                .into_inner()
                .snapshot
                .context("CreateSnapshot answered without a snapshot")?;
            print(out, &snapshot_json(&s));
        }
        Rpc::DeleteSnapshot { snapshot_id } => {
            controller
                .delete_snapshot(DeleteSnapshotRequest {
                    snapshot_id: snapshot_id.clone(),
                    ..DeleteSnapshotRequest::default()
                })
                .await
                .map_err(status("DeleteSnapshot"))?;
            print(out, &json!({ "deleted": snapshot_id }));
        }
        Rpc::ListSnapshots { source } => {
            let r = controller
                .list_snapshots(ListSnapshotsRequest {
                    source_volume_id: source.unwrap_or_default(),
                    ..ListSnapshotsRequest::default()
                })
                .await
                .map_err(status("ListSnapshots"))?
                .into_inner();
            let all: Vec<Value> = r
                .entries
                .iter()
                .filter_map(|e| e.snapshot.as_ref())
                .map(snapshot_json)
                .collect();
            print(out, &json!({ "snapshots": all }));
        }
        Rpc::Capacity { class } => {
            let r = controller
                .get_capacity(GetCapacityRequest {
                    parameters: class
                        .map(|c| (lvms_csi::params::DEVICE_CLASS.to_owned(), c))
                        .into_iter()
                        .collect(),
                    ..GetCapacityRequest::default()
                })
                .await
                .map_err(status("GetCapacity"))?
                .into_inner();
            let size = |b: i64| ByteSize(b.unsigned_abs()).to_string();
            print(
                out,
                &json!({
                    "available": size(r.available_capacity),
                    "maximum_volume_size": r.maximum_volume_size.map(size),
                    "minimum_volume_size": r.minimum_volume_size.map(size),
                }),
            );
        }
        Rpc::Expand {
            volume_id,
            size,
            block,
        } => {
            let access = Access {
                block,
                fs: String::new(),
                mount_flags: Vec::new(),
                mode: Mode::SingleNodeWriter,
            };
            let r = controller
                .controller_expand_volume(ControllerExpandVolumeRequest {
                    volume_id,
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes(size),
                        limit_bytes: 0,
                    }),
                    volume_capability: Some(access.capability()),
                    ..ControllerExpandVolumeRequest::default()
                })
                .await
                .map_err(status("ControllerExpandVolume"))?
                .into_inner();
            print(
                out,
                &json!({
                    "capacity": ByteSize(r.capacity_bytes.unsigned_abs()).to_string(),
                    "node_expansion_required": r.node_expansion_required,
                }),
            );
        }
        Rpc::NodeInfo => {
            let r = node
                .node_get_info(NodeGetInfoRequest {})
                .await
                .map_err(status("NodeGetInfo"))?
                .into_inner();
            print(
                out,
                &json!({
                    "node_id": r.node_id,
                    "topology": r.accessible_topology.map(|t| t.segments),
                }),
            );
        }
        Rpc::Stage {
            volume_id,
            staging_path,
            access,
        } => {
            node.node_stage_volume(NodeStageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path(&staging_path),
                volume_capability: Some(access.capability()),
                ..NodeStageVolumeRequest::default()
            })
            .await
            .map_err(status("NodeStageVolume"))?;
            print(
                out,
                &json!({"staged": volume_id, "at": path(&staging_path)}),
            );
        }
        Rpc::Unstage {
            volume_id,
            staging_path,
        } => {
            node.node_unstage_volume(NodeUnstageVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path(&staging_path),
            })
            .await
            .map_err(status("NodeUnstageVolume"))?;
            print(out, &json!({ "unstaged": volume_id }));
        }
        Rpc::Publish {
            volume_id,
            staging_path,
            target_path,
            readonly,
            access,
        } => {
            node.node_publish_volume(NodePublishVolumeRequest {
                volume_id: volume_id.clone(),
                staging_target_path: path(&staging_path),
                target_path: path(&target_path),
                volume_capability: Some(access.capability()),
                readonly,
                ..NodePublishVolumeRequest::default()
            })
            .await
            .map_err(status("NodePublishVolume"))?;
            print(
                out,
                &json!({"published": volume_id, "at": path(&target_path)}),
            );
        }
        Rpc::Unpublish {
            volume_id,
            target_path,
        } => {
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: volume_id.clone(),
                target_path: path(&target_path),
            })
            .await
            .map_err(status("NodeUnpublishVolume"))?;
            print(out, &json!({ "unpublished": volume_id }));
        }
        Rpc::Stats { volume_id, path: p } => {
            let r = node
                .node_get_volume_stats(NodeGetVolumeStatsRequest {
                    volume_id,
                    volume_path: path(&p),
                    staging_target_path: String::new(),
                })
                .await
                .map_err(status("NodeGetVolumeStats"))?
                .into_inner();
            let usage: Vec<Value> = r
                .usage
                .iter()
                .map(|u| {
                    let unit = if u.unit == 2 { "inodes" } else { "bytes" };
                    json!({"unit": unit, "total": u.total, "used": u.used, "available": u.available})
                })
                .collect();
            print(
                out,
                &json!({
                    "usage": usage,
                    "abnormal": r.volume_condition.as_ref().map(|c| c.abnormal),
                    "condition": r.volume_condition.map(|c| c.message),
                }),
            );
        }
        Rpc::NodeExpand {
            volume_id,
            path: p,
            size,
            access,
        } => {
            let r = node
                .node_expand_volume(NodeExpandVolumeRequest {
                    volume_id,
                    volume_path: path(&p),
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes(size),
                        limit_bytes: 0,
                    }),
                    staging_target_path: String::new(),
                    volume_capability: Some(access.capability()),
                    secrets: HashMap::new(),
                })
                .await
                .map_err(status("NodeExpandVolume"))?
                .into_inner();
            print(
                out,
                &json!({"capacity": ByteSize(r.capacity_bytes.unsigned_abs()).to_string()}),
            );
        }
    }
    Ok(())
}
