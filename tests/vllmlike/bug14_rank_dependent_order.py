"""vllmlike bug class 14 (a release's manager): the row order depends on the rank that computes
the layout (odd ranks put a request's tail chunk before its head), so the ranks' managers
disagree about each other's rows, and the expanded maps they build pair rows with the wrong
slots (#53573's shape: per-rank layouts diverging across ranks). LAYOUT.
"""

from tests.vllmlike.release.vllm.v1.worker.gpu.pcp_manager import PCPManager as _Release


class PCPManager(_Release):
    def _order(self, chunks, is_prefilling):
        tail_first = -1 if self.pcp_rank % 2 else 1  # BUG: the order differs across ranks
        return sorted(chunks, key=lambda c: (bool(is_prefilling[c[0]]), c[0], tail_first * c[1]))
