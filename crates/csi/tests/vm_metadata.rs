//! Changed-block tracking against real LVM, inside the test VM (`cargo xtask vm-test metadata_`): the
//! SnapshotMetadata service over [`LocalBackend`] on a real Unix socket, driven by the generated gRPC
//! client. Blocks the test writes to a thin volume between two snapshots are exactly what
//! `GetMetadataDelta` answers; what `GetMetadataAllocated` answers is exactly what was written and not
//! discarded; a backup made the way a backup tool makes one (the first snapshot whole, then only the
//! changed ranges of the second) is byte for byte the second snapshot; answers stay the same while
//! the origin keeps being written; wrong requests get the spec's codes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    io::{Read, Seek, SeekFrom, Write},
    sync::Arc,
    time::Instant,
};

use lvms_csi::{
    controller::ControllerService,
    csi::{
        BlockMetadataType, GetMetadataAllocatedRequest, GetMetadataDeltaRequest,
        GetPluginCapabilitiesRequest, controller_client::ControllerClient,
        identity_client::IdentityClient, plugin_capability,
        snapshot_metadata_client::SnapshotMetadataClient, volume_capability::access_mode::Mode,
    },
    identity::{Converged, IdentityService},
    server::{self, Services},
    snapshot_metadata::SnapshotMetadataService,
};
use lvms_engine::{backend::DeviceClassConfig, local::LocalBackend};
use lvms_host::{
    lvm::{Lvm, PoolSize, ThinPoolSpec},
    runner::RealRunner,
    shell::LvmShell,
};
use lvms_testkit::{
    Scratch,
    csi_requests::{block, create, in_class, snapshot},
    sh, unique,
};
use tonic::{Code, transport::Channel};

const CHUNK: u64 = 64 << 10;
const MIB: u64 = 1 << 20;

struct Driver {
    _scratch: Scratch,
    vg: String,
    controller: ControllerClient<Channel>,
    metadata: SnapshotMetadataClient<Channel>,
    identity: IdentityClient<Channel>,
    stop: tokio::sync::oneshot::Sender<()>,
}

/// A volume group on one loop disk of `disk_mib` with a thin pool of 64 KiB chunks, and the driver
/// serving it as `lvms standalone` does.
async fn start(disk_mib: u64) -> Driver {
    let mut scratch = Scratch::new(1, disk_mib);
    let vg = scratch.vg_name();
    let lvm = Lvm::new(Arc::new(RealRunner));
    lvm.pv_create(&scratch.disks[0], None).await.unwrap();
    lvm.vg_create(&vg, &scratch.disks, &["lvms".into()])
        .await
        .unwrap();
    lvm.thin_pool_create(&ThinPoolSpec {
        vg: vg.clone(),
        name: "pool".into(),
        size: PoolSize::PercentFree(90),
        chunk_size: Some(CHUNK),
        metadata_size: None,
        zero: false,
    })
    .await
    .unwrap();
    let backend = Arc::new(LocalBackend::new(
        "vm-node",
        vec![DeviceClassConfig::named(&vg).with_thin_pool("pool", 4)],
        Lvm::new(Arc::new(LvmShell::new())),
    ));
    let converged = Converged::default();
    converged.set(true);
    let dir = format!("/run/lvms-sock/{}", unique("md"));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = std::path::PathBuf::from(format!("{dir}/csi.sock"));
    let listener = server::bind(&socket).unwrap();
    let services: Services<_, lvms_csi::server::NoNode> = Services {
        identity: IdentityService::new("topolvm.io", true, backend.clone(), converged)
            .with_snapshot_metadata(),
        controller: Some(ControllerService::new(backend.clone())),
        node: None,
        snapshot_metadata: Some(SnapshotMetadataService::new(backend)),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        server::serve(listener, services, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let channel = server::connect(&socket).await.unwrap();
    Driver {
        _scratch: scratch,
        vg,
        controller: ControllerClient::new(channel.clone()),
        metadata: SnapshotMetadataClient::new(channel.clone()),
        identity: IdentityClient::new(channel),
        stop,
    }
}

impl Driver {
    async fn volume(&mut self, name: &str, size: u64) -> String {
        let mut req = in_class(create(name, size as i64), &self.vg);
        req.volume_capabilities = vec![block(Mode::SingleNodeWriter)];
        let id = self
            .controller
            .create_volume(req)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id;
        sh(&format!("lvm lvchange -ay {}/{id}", self.vg));
        id
    }

    async fn snapshot(&mut self, volume: &str, name: &str) -> String {
        let id = self
            .controller
            .create_snapshot(snapshot(volume, name))
            .await
            .unwrap()
            .into_inner()
            .snapshot
            .unwrap()
            .snapshot_id;
        sh(&format!("lvm lvchange -ay -K {}/{id}", self.vg));
        id
    }

    fn device(&self, id: &str) -> String {
        format!("/dev/{}/{id}", self.vg)
    }

    /// Every range of a delta, through pages of at most `max` ranges, checked against the spec's
    /// rules on the way (one type and capacity, increasing, apart, none ending before `start`).
    async fn delta(
        &mut self,
        base: &str,
        target: &str,
        start: i64,
        max: i32,
    ) -> Result<(u64, Vec<(u64, u64)>), tonic::Status> {
        let stream = self
            .metadata
            .get_metadata_delta(GetMetadataDeltaRequest {
                base_snapshot_id: base.into(),
                target_snapshot_id: target.into(),
                starting_offset: start,
                max_results: max,
                ..GetMetadataDeltaRequest::default()
            })
            .await?
            .into_inner();
        let pages = collect(stream, |m| {
            (
                m.block_metadata_type,
                m.volume_capacity_bytes,
                m.block_metadata,
            )
        })
        .await?;
        Ok(checked(pages, start, max))
    }

    async fn allocated(
        &mut self,
        id: &str,
        start: i64,
    ) -> Result<(u64, Vec<(u64, u64)>), tonic::Status> {
        let stream = self
            .metadata
            .get_metadata_allocated(GetMetadataAllocatedRequest {
                snapshot_id: id.into(),
                starting_offset: start,
                max_results: 0,
                ..GetMetadataAllocatedRequest::default()
            })
            .await?
            .into_inner();
        let pages = collect(stream, |m| {
            (
                m.block_metadata_type,
                m.volume_capacity_bytes,
                m.block_metadata,
            )
        })
        .await?;
        Ok(checked(pages, start, 0))
    }
}

type Page = (i32, i64, Vec<lvms_csi::csi::BlockMetadata>);

/// Every message of a response stream, as pages.
async fn collect<T>(
    mut stream: tonic::Streaming<T>,
    page: fn(T) -> Page,
) -> Result<Vec<Page>, tonic::Status> {
    let mut pages = Vec::new();
    while let Some(m) = stream.message().await? {
        pages.push(page(m));
    }
    Ok(pages)
}

fn checked(pages: Vec<Page>, start: i64, max: i32) -> (u64, Vec<(u64, u64)>) {
    assert!(!pages.is_empty(), "a stream with no message");
    let capacity = pages[0].1;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (kind, cap, list) in pages {
        assert_eq!(kind, BlockMetadataType::VariableLength as i32);
        assert_eq!(cap, capacity, "the capacity changed mid-stream");
        if max > 0 {
            assert!(
                list.len() <= max as usize,
                "{} ranges in a page of {max}",
                list.len()
            );
        }
        for b in list {
            assert!(b.size_bytes > 0);
            assert!(
                b.byte_offset + b.size_bytes > start,
                "a range ends before starting_offset"
            );
            if let Some(&(o, l)) = ranges.last() {
                assert!(
                    o + l <= b.byte_offset as u64,
                    "ranges overlap or go backwards"
                );
            }
            ranges.push((b.byte_offset as u64, b.size_bytes as u64));
        }
    }
    (capacity as u64, ranges)
}

/// The chunks a list of byte ranges covers.
fn chunks(ranges: &[(u64, u64)]) -> BTreeSet<u64> {
    ranges
        .iter()
        .flat_map(|&(o, l)| (o / CHUNK)..(o + l).div_ceil(CHUNK))
        .collect()
}

/// Writes `len` bytes at `offset` of `dev`, a pattern that names the offset and `round`, synced.
fn write(dev: &str, offset: u64, len: u64, round: u8) {
    let mut f = std::fs::OpenOptions::new().write(true).open(dev).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let data: Vec<u8> = (0..len)
        .map(|i| ((offset + i) as u8) ^ round ^ ((offset + i) >> 16) as u8)
        .collect();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
}

fn read_all(path: &str) -> Vec<u8> {
    let mut data = Vec::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_end(&mut data)
        .unwrap();
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test VM (cargo xtask vm-test metadata_)"]
async fn metadata_delta_is_exactly_the_chunks_written_between_two_snapshots() {
    let mut d = start(512).await;
    let caps = d
        .identity
        .get_plugin_capabilities(GetPluginCapabilitiesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    assert!(caps.iter().any(|c| matches!(
        &c.r#type,
        Some(plugin_capability::Type::Service(s))
            if s.r#type == plugin_capability::service::Type::SnapshotMetadataService as i32
    )));

    let size = 64 * MIB;
    let vol = d.volume("cbt-a", size).await;
    let dev = d.device(&vol);
    // Before the first snapshot: chunks 2–4, 20, and a partial write inside chunk 40.
    let first: Vec<(u64, u64)> = vec![
        (2 * CHUNK, 3 * CHUNK),
        (20 * CHUNK, CHUNK),
        (40 * CHUNK + 100, 4000),
    ];
    for &(o, l) in &first {
        write(&dev, o, l, 1);
    }
    let s1 = d.snapshot(&vol, "cbt-s1").await;
    // Between them: one chunk rewritten (3), writes across chunk edges (9–11, the last chunk), a
    // partial write (chunk 500), and chunk 20 discarded.
    let second: Vec<(u64, u64)> = vec![
        (3 * CHUNK, CHUNK),
        (10 * CHUNK - 512, CHUNK + 1024),
        (500 * CHUNK + 4096, 512),
        (size - CHUNK, CHUNK),
    ];
    for &(o, l) in &second {
        write(&dev, o, l, 2);
    }
    sh(&format!("blkdiscard -o {} -l {CHUNK} {dev}", 20 * CHUNK));
    let s2 = d.snapshot(&vol, "cbt-s2").await;

    let mut expected_changed = chunks(&second);
    expected_changed.insert(20);
    let (capacity, delta) = d.delta(&s1, &s2, 0, 2).await.unwrap();
    assert_eq!(capacity, size);
    assert_eq!(chunks(&delta), expected_changed, "delta {delta:?}");

    let mut expected_mapped = chunks(&first);
    expected_mapped.extend(chunks(&second));
    expected_mapped.remove(&20);
    let (_, allocated) = d.allocated(&s2, 0).await.unwrap();
    assert_eq!(
        chunks(&allocated),
        expected_mapped,
        "allocated {allocated:?}"
    );
    let (_, allocated_first) = d.allocated(&s1, 0).await.unwrap();
    assert_eq!(chunks(&allocated_first), chunks(&first));

    // A resumed call: nothing that ends at or before the offset; the range it falls in is kept.
    let resume = (10 * CHUNK + 10) as i64;
    let (_, rest) = d.delta(&s1, &s2, resume, 0).await.unwrap();
    assert_eq!(rest.first().map(|r| r.0), Some(9 * CHUNK), "{rest:?}");
    assert_eq!(
        chunks(&rest),
        expected_changed
            .iter()
            .copied()
            .filter(|&c| c >= 9)
            .collect()
    );

    // The backup tool's loop: the first snapshot whole, then the changed ranges of the second.
    let mut image = read_all(&d.device(&s1));
    let mut target = std::fs::File::open(d.device(&s2)).unwrap();
    for &(o, l) in &delta {
        let mut buf = vec![0; l as usize];
        target.seek(SeekFrom::Start(o)).unwrap();
        target.read_exact(&mut buf).unwrap();
        image[o as usize..(o + l) as usize].copy_from_slice(&buf);
    }
    assert!(
        image == read_all(&d.device(&s2)),
        "the rebuilt image differs from the second snapshot"
    );

    // Wrong requests.
    let other = d.volume("cbt-b", 16 * MIB).await;
    let s3 = d.snapshot(&other, "cbt-s3").await;
    let e = d.delta(&s1, &s3, 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("not of the same volume"),
        "{}",
        e.message()
    );
    let e = d.delta(&s1, "snapshot-nothere", 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = d.allocated(&vol, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "a volume's id: {e:?}");
    assert!(e.message().contains("not a snapshot"), "{}", e.message());
    let e = d.allocated(&s2, size as i64).await.unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange, "{e:?}");
    let e = d.delta(&s2, &s2, 0, 0).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let status = sh(&format!("dmsetup status {}-pool-tpool", d.vg));
    assert_eq!(
        status.split_whitespace().nth(6),
        Some("-"),
        "a metadata snapshot was left held: {status}"
    );
    let _ = d.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test VM (cargo xtask vm-test metadata_)"]
async fn metadata_answers_stay_the_same_while_the_origin_is_written() {
    let mut d = start(512).await;
    let size = 64 * MIB;
    let vol = d.volume("cbt-busy", size).await;
    let dev = d.device(&vol);
    for c in (0..64).step_by(3) {
        write(&dev, c * CHUNK, CHUNK, 1);
    }
    let s1 = d.snapshot(&vol, "cbt-busy-1").await;
    for c in (0..64).step_by(5) {
        write(&dev, c * CHUNK, 512, 2);
    }
    let s2 = d.snapshot(&vol, "cbt-busy-2").await;
    let quiet = d.delta(&s1, &s2, 0, 0).await.unwrap();
    let quiet_allocated = d.allocated(&s2, 0).await.unwrap();
    assert_eq!(chunks(&quiet.1), (0..64).step_by(5).collect());

    // A writer maps new chunks of the origin (the pool's metadata changes under the reads) and
    // another snapshot is taken and removed meanwhile.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (dev, stop) = (dev.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                write(&dev, (n * 7 % 1024) * CHUNK, CHUNK, 3 + (n % 200) as u8);
                n += 1;
            }
            n
        })
    };
    for round in 0..4 {
        assert_eq!(
            d.delta(&s1, &s2, 0, 0).await.unwrap(),
            quiet,
            "round {round}"
        );
        assert_eq!(
            d.allocated(&s2, 0).await.unwrap(),
            quiet_allocated,
            "round {round}"
        );
        let extra = d.snapshot(&vol, &format!("cbt-busy-x{round}")).await;
        let started = Instant::now();
        let (_, moving) = d.delta(&s2, &extra, 0, 0).await.unwrap();
        eprintln!(
            "delta against a snapshot of the busy origin: {} ranges in {:?}",
            moving.len(),
            started.elapsed()
        );
        d.controller
            .delete_snapshot(lvms_csi::csi::DeleteSnapshotRequest {
                snapshot_id: extra,
                ..Default::default()
            })
            .await
            .unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(writes > 0, "the writer never wrote");
    let _ = d.stop.send(());
}
