//! The SnapshotMetadata service (CSI v1.11+, changed-block tracking): the allocated ranges of a
//! snapshot and the ranges changed between two snapshots of one volume, streamed, over a
//! [`Backend`] ([`Backend::allocated`], [`Backend::changed`]; ADR 0039).
//!
//! Ranges are sent `VARIABLE_LENGTH`: each is a run of the thin pool's chunks (64 KiB by default),
//! adjacent chunks merged into one range, so a 1 GiB volume with one contiguous write is one range
//! instead of 16,384 fixed-size ones. Every stream has at least one message (one with no range when
//! nothing is allocated or changed), so the client always learns the volume's capacity.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::{
    controller::{RpcError, backend},
    csi::{
        BlockMetadata, BlockMetadataType, GetMetadataAllocatedRequest,
        GetMetadataAllocatedResponse, GetMetadataDeltaRequest, GetMetadataDeltaResponse,
        snapshot_metadata_server::SnapshotMetadata,
    },
};
use lvms_engine::backend::{Backend, BlockRanges};

/// Ranges per message when the client does not ask for a number.
pub const DEFAULT_MAX_RESULTS: usize = 1024;

/// The SnapshotMetadata service.
pub struct SnapshotMetadataService<B> {
    backend: Arc<B>,
}

impl<B: Backend> SnapshotMetadataService<B> {
    pub fn new(backend: Arc<B>) -> Self {
        Self { backend }
    }
}

/// The arguments both calls share, checked.
fn window(starting_offset: i64, max_results: i32) -> Result<(u64, usize), RpcError> {
    let start = u64::try_from(starting_offset).map_err(|_| {
        RpcError::invalid(format!(
            "starting_offset is {starting_offset}: it must be 0 or more"
        ))
    })?;
    let max = match usize::try_from(max_results) {
        Ok(0) => DEFAULT_MAX_RESULTS,
        Ok(n) => n,
        Err(_) => {
            return Err(RpcError::invalid(format!(
                "max_results is {max_results}: it must be 0 (the driver chooses) or more"
            )));
        }
    };
    Ok((start, max))
}

/// The pages of `ranges` from `start` on, `max` ranges each; at least one page.
fn pages(
    what: &str,
    ranges: BlockRanges,
    start: u64,
    max: usize,
) -> Result<(i64, Vec<Vec<BlockMetadata>>), RpcError> {
    if start >= ranges.volume_size {
        return Err(RpcError {
            code: tonic::Code::OutOfRange,
            message: format!(
                "starting_offset {start} is not before the end of {what}, which holds {} bytes",
                ranges.volume_size
            ),
        });
    }
    let capacity = i64::try_from(ranges.volume_size)
        .map_err(|_| RpcError::invalid(format!("{what} is larger than the protocol can say")))?;
    let kept: Vec<BlockMetadata> = ranges
        .ranges
        .into_iter()
        .filter(|&(offset, length)| offset + length > start)
        .map(|(offset, length)| BlockMetadata {
            // Both are below the capacity, which fits.
            byte_offset: i64::try_from(offset).unwrap_or(i64::MAX),
            size_bytes: i64::try_from(length).unwrap_or(i64::MAX),
        })
        .collect();
    let mut pages: Vec<Vec<BlockMetadata>> = kept.chunks(max).map(<[_]>::to_vec).collect();
    if pages.is_empty() {
        pages.push(Vec::new());
    }
    Ok((capacity, pages))
}

fn required(field: &str, value: &str) -> Result<(), RpcError> {
    if value.is_empty() {
        return Err(RpcError::invalid(format!("{field} is required")));
    }
    Ok(())
}

type Stream<T> = tokio_stream::Iter<std::vec::IntoIter<Result<T, Status>>>;

/// One message per page, each made by `message`.
fn stream<T>(
    pages: Vec<Vec<BlockMetadata>>,
    message: impl Fn(Vec<BlockMetadata>) -> T,
) -> Response<Stream<T>> {
    let messages: Vec<_> = pages.into_iter().map(|p| Ok(message(p))).collect();
    Response::new(tokio_stream::iter(messages))
}

#[tonic::async_trait]
impl<B: Backend> SnapshotMetadata for SnapshotMetadataService<B> {
    type GetMetadataAllocatedStream = Stream<GetMetadataAllocatedResponse>;
    type GetMetadataDeltaStream = Stream<GetMetadataDeltaResponse>;

    #[tracing::instrument(skip_all, fields(snapshot = %request.get_ref().snapshot_id))]
    async fn get_metadata_allocated(
        &self,
        request: Request<GetMetadataAllocatedRequest>,
    ) -> Result<Response<Self::GetMetadataAllocatedStream>, Status> {
        let req = request.into_inner();
        required("snapshot_id", &req.snapshot_id)?;
        let (start, max) = window(req.starting_offset, req.max_results)?;
        let ranges = self
            .backend
            .allocated(&req.snapshot_id)
            .await
            .map_err(backend)?;
        let what = format!("snapshot {}", req.snapshot_id);
        let (capacity, pages) = pages(&what, ranges, start, max)?;
        Ok(stream(pages, |block_metadata| {
            GetMetadataAllocatedResponse {
                block_metadata_type: BlockMetadataType::VariableLength as i32,
                volume_capacity_bytes: capacity,
                block_metadata,
            }
        }))
    }

    #[tracing::instrument(skip_all, fields(base = %request.get_ref().base_snapshot_id, target = %request.get_ref().target_snapshot_id))]
    async fn get_metadata_delta(
        &self,
        request: Request<GetMetadataDeltaRequest>,
    ) -> Result<Response<Self::GetMetadataDeltaStream>, Status> {
        let req = request.into_inner();
        required("base_snapshot_id", &req.base_snapshot_id)?;
        required("target_snapshot_id", &req.target_snapshot_id)?;
        if req.base_snapshot_id == req.target_snapshot_id {
            return Err(RpcError::invalid(format!(
                "base_snapshot_id and target_snapshot_id are both {}: a delta is between two \
                 snapshots",
                req.base_snapshot_id
            ))
            .into());
        }
        let (start, max) = window(req.starting_offset, req.max_results)?;
        let ranges = self
            .backend
            .changed(&req.base_snapshot_id, &req.target_snapshot_id)
            .await
            .map_err(backend)?;
        let what = format!("snapshot {}", req.target_snapshot_id);
        let (capacity, pages) = pages(&what, ranges, start, max)?;
        Ok(stream(pages, |block_metadata| GetMetadataDeltaResponse {
            block_metadata_type: BlockMetadataType::VariableLength as i32,
            volume_capacity_bytes: capacity,
            block_metadata,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges() -> BlockRanges {
        BlockRanges {
            volume_size: 1 << 20,
            ranges: vec![(0, 4096), (65536, 131_072), (524_288, 65536)],
        }
    }

    #[test]
    fn pages_hold_at_most_max_results_ranges() {
        let (capacity, pages) = pages("s", ranges(), 0, 2).unwrap();
        assert_eq!(capacity, 1 << 20);
        assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), vec![2, 1]);
        assert_eq!(pages[1][0].byte_offset, 524_288);
    }

    #[test]
    fn no_range_ending_at_or_before_the_starting_offset_is_sent() {
        // 65536 + 131072 = 196608: a start inside the second range keeps it, one at its end drops it.
        let (_, inside) = pages("s", ranges(), 100_000, 10).unwrap();
        assert_eq!(inside[0].len(), 2);
        assert_eq!(inside[0][0].byte_offset, 65536);
        let (_, after) = pages("s", ranges(), 196_608, 10).unwrap();
        assert_eq!(after[0].len(), 1);
        assert_eq!(after[0][0].byte_offset, 524_288);
    }

    #[test]
    fn nothing_to_send_is_still_one_message_with_the_capacity() {
        let (capacity, pages) = pages("s", ranges(), 600_000, 10).unwrap();
        assert_eq!((capacity, pages.len(), pages[0].len()), (1 << 20, 1, 0));
    }

    #[test]
    fn a_start_at_or_past_the_end_is_out_of_range_and_bad_arguments_are_named() {
        let e = pages("snapshot s", ranges(), 1 << 20, 10).unwrap_err();
        assert_eq!(e.code, tonic::Code::OutOfRange);
        assert!(e.message.contains("snapshot s"), "{}", e.message);
        let e = window(-1, 0).unwrap_err();
        assert!(e.message.contains("starting_offset"), "{}", e.message);
        let e = window(0, -5).unwrap_err();
        assert!(e.message.contains("max_results"), "{}", e.message);
        assert_eq!(window(0, 0).unwrap(), (0, DEFAULT_MAX_RESULTS));
    }
}
