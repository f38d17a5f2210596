"""vllmlike bug class 15 (a release's manager): the DCP test for a prefill too short to fill all
2P chunks is off by one (`>` for `>=`), so a prefill whose chunks exactly drop the last one (P=2,
q=3) is split instead of replicated on every rank. LAYOUT.
"""

import numpy as np

from tests.vllmlike.release.vllm.v1.worker.gpu.pcp_manager import PCPManager as _Release


class PCPManager(_Release):
    def replicated_requests(self, num_scheduled_tokens, is_prefilling):
        lengths = np.asarray(num_scheduled_tokens, dtype=np.int64)
        chunks = 2 * self.pcp_world_size
        short = (chunks - 1) * -(-lengths // chunks) > lengths  # BUG: off by one (>= is right)
        return ~np.asarray(is_prefilling, dtype=bool) | ((self.dcp_world_size > 1) & short)
