"""vllmlike era fixture (a release's manager): its validate_config rejects speculative decoding,
as vLLM 0.26-0.29 do, so the draft regimes are not applicable to it (never violations)."""

from tests.vllmlike.release.vllm.v1.worker.gpu.pcp_manager import PCPManager as _Release


class PCPManager(_Release):
    @staticmethod
    def validate_config(vllm_config, supports_mm_inputs):
        if vllm_config.speculative_config is not None:
            raise NotImplementedError("this release's PCP does not support speculative decoding")
