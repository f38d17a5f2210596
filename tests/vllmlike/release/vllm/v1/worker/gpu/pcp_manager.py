"""vllmlike fixture: a release's PCP layout manager (pcpcheck's own code, written from
docs/semantics.md section 2 in vLLM's interface; not vLLM's code).

`_build_batch_layout` deals each rank its rows (split prefills head/tail, replicated requests on
every rank or, sharding, round robin), orders them (`_order`: decodes first), pads every rank to
W rows and sets the padded gather index, the KV write mask and the hidden restore index;
`_convert_to_gathered_slot_mappings` expands a (groups, N) global slot map to (groups, P*W).
The bug fixtures beside this tree subclass it and change one method.
"""

from dataclasses import dataclass

import numpy as np
import torch

from vllm.config import VllmConfig
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.block_table import BlockTables


@dataclass(frozen=True)
class RankSegment:
    global_batch_req_idx: int
    global_batch_slice: slice
    rank_local_batch_slice: slice

    @property
    def num_tokens(self) -> int:
        return self.global_batch_slice.stop - self.global_batch_slice.start


class PCPManager:
    def __init__(self, pcp_world_size: int, pcp_rank: int, device: torch.device,
                 shard_decode_requests: bool, block_tables: BlockTables | None = None,
                 dcp_world_size: int = 1, dcp_rank: int = 0, cp_interleave: int = 1) -> None:
        self.pcp_world_size = pcp_world_size
        self.pcp_rank = pcp_rank
        self.device = device
        self.shard_decode_requests = shard_decode_requests
        self.dcp_world_size = dcp_world_size
        self.dcp_rank = dcp_rank
        self.cp_interleave = cp_interleave
        self._padded_gather_idx = None
        self._gathered_kv_write_mask = None
        self._hidden_restore_idx = None

    @staticmethod
    def validate_config(vllm_config: VllmConfig, supports_mm_inputs: bool) -> None:
        """Every configuration pcpcheck draws is supported."""

    def replicated_requests(self, num_scheduled_tokens, is_prefilling) -> np.ndarray:
        """Decodes; with DCP also prefills too short to fill all 2P chunks."""
        lengths = np.asarray(num_scheduled_tokens, dtype=np.int64)
        chunks = 2 * self.pcp_world_size
        short = (chunks - 1) * -(-lengths // chunks) >= lengths
        return ~np.asarray(is_prefilling, dtype=bool) | ((self.dcp_world_size > 1) & short)

    def _rank_chunks(self, rank, num_scheduled_tokens, is_prefilling):
        """(request, query offset, length) of every chunk rank `rank` holds, in request order."""
        replicated = self.replicated_requests(num_scheduled_tokens, is_prefilling)
        chunks = 2 * self.pcp_world_size
        owner = 0
        for request, length in enumerate(int(n) for n in num_scheduled_tokens):
            if length == 0:
                continue
            if not replicated[request]:
                size = -(-length // chunks)
                for chunk in (rank, chunks - 1 - rank):
                    if chunk * size < length:
                        yield request, chunk * size, min(size, length - chunk * size)
            elif not self.shard_decode_requests:
                yield request, 0, length
            else:
                if owner % self.pcp_world_size == rank:
                    yield request, 0, length
                owner += 1

    def _order(self, chunks, is_prefilling):
        """A rank's rows: decodes first, then by request, head before tail."""
        return sorted(chunks, key=lambda c: (bool(is_prefilling[c[0]]), c[0], c[1]))

    def _build_batch_layout(self, num_scheduled_tokens, num_computed_tokens, is_prefilling,
                            query_start_loc_np, padded_num_tokens=None):
        size = self.pcp_world_size
        replicated = self.replicated_requests(num_scheduled_tokens, is_prefilling)
        segments_by_rank = []
        for rank in range(size):
            segments, row = [], 0
            for request, offset, length in self._order(
                    list(self._rank_chunks(rank, num_scheduled_tokens, is_prefilling)),
                    is_prefilling):
                start = int(query_start_loc_np[request]) + offset
                segments.append(RankSegment(request, slice(start, start + length),
                                            slice(row, row + length)))
                row += length
            segments_by_rank.append(segments)
        counts = [sum(s.num_tokens for s in segments) for segments in segments_by_rank]
        width = max(counts) if padded_num_tokens is None else padded_num_tokens
        if width < max(counts):
            raise ValueError(f"padded_num_tokens {width} < largest rank batch {max(counts)}")
        gather_idx = np.zeros(size * width, dtype=np.int64)
        write_mask = np.zeros(size * width, dtype=bool)
        restore = np.zeros(int(query_start_loc_np[-1]), dtype=np.int64)
        for rank, segments in enumerate(segments_by_rank):
            for segment in segments:
                rows = np.arange(segment.rank_local_batch_slice.start,
                                 segment.rank_local_batch_slice.stop) + rank * width
                gather_idx[rows] = np.arange(segment.global_batch_slice.start,
                                             segment.global_batch_slice.stop)
                sharded = self.shard_decode_requests and not is_prefilling[
                    segment.global_batch_req_idx]
                if replicated[segment.global_batch_req_idx] and not sharded and rank != 0:
                    continue  # rank 0 writes a replicated row
                write_mask[rows] = True
                restore[segment.global_batch_slice] = rows
        self._padded_gather_idx = async_tensor_h2d(gather_idx, device=self.device)
        self._gathered_kv_write_mask = async_tensor_h2d(write_mask, device=self.device)
        self._hidden_restore_idx = async_tensor_h2d(restore, device=self.device)
        return segments_by_rank, counts

    def _convert_to_gathered_slot_mappings(self, global_batch_slot_mappings):
        expanded = global_batch_slot_mappings.index_select(1, self._padded_gather_idx)
        return torch.where(self._gathered_kv_write_mask.unsqueeze(0), expanded,
                           torch.tensor(PAD_SLOT_ID, dtype=expanded.dtype))
