"""vllmlike bug class 13 (a release's manager): each rank's rows in request order, not decodes
first, so a prefill chunk can stand before a decode: the decode rows are not a prefix of the
local batch (the kernel's nd then counts only the leading ones). LAYOUT.
"""

from tests.vllmlike.release.vllm.v1.worker.gpu.pcp_manager import PCPManager as _Release


class PCPManager(_Release):
    def _order(self, chunks, is_prefilling):
        return sorted(chunks, key=lambda c: (c[0], c[1]))  # BUG: is_prefilling not in the key
