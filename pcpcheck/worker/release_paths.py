"""The path table of a release: for each stage of a step's PCP KV path (semantics section 10),
whether the release's own code runs it (`real`, its file and sha256) or pcpcheck's restatement
stands in (`modeled`, and why). Built in the worker when it loads the release
(pcpcheck.worker.release_code), sent to the driver as plain data, printed in the report's header and
carried in the JSON (`release.paths`)."""

from __future__ import annotations

from pcpcheck.shared.protocol import (
    BATCH_ORDER,
    CACHE_WRITE,
    GATHER_STAGE,
    MANAGER_STAGE,
    SLOT_MAPPING,
    WRAPPER,
)
from pcpcheck.shared.protocol import SPLIT as SPLIT_STAGE
from pcpcheck.shared.source import MANAGER
from pcpcheck.worker.release_batch import PARTITION
from pcpcheck.worker.release_builder import BUILDER
from pcpcheck.worker.release_excerpts import BACKEND_UTILS, MODEL_RUNNER, SORT, SPLIT, SPLIT_FLAGS
from pcpcheck.worker.release_kernels import BLOCK_TABLE


def path_table(source, gather_path: str, unkerneled: str, has_wrappers: bool, unsorted: str,
               unsplit: str, dummies: bool = False, unpartitioned: str = "",
               draft_sites: list[str] | None = None, built_at: tuple[str, ...] = ()
               ) -> list[dict]:
    """Per stage: `real` (the release's file and its sha256 run it; `reason` says where it does
    not reach) or `modeled` (pcpcheck's restatement; `reason` says why). The `un...` arguments
    say why a stage is not the release's ("" where it is); `draft_sites`: the speculators'
    slot-map calls that lay draft steps out (pcpcheck.worker.release_draft), where they run;
    `built_at`: the model runner's calls of the manager's builder (release_builder), where it
    builds the managers."""
    def real(stage, relpath, scope=""):
        return {"stage": stage, "status": "real", "file": relpath,
                "sha256": source.hashes.get(relpath, ""), "reason": scope}

    def modeled(stage, reason):
        return {"stage": stage, "status": "modeled", "file": None, "sha256": None,
                "reason": reason}

    expanded_only = ("expanded regimes; a later draft step runs on the global batch, which no "
                     "manager lays out")
    flags = ", ".join(f"{key}={value}" for key, value in SPLIT_FLAGS.items())
    drafts = (f"draft steps through the speculators' own call ({', '.join(draft_sites)})"
              if draft_sites else "draft steps take the reference's unexpanded map")
    kernel_scope = ("every step of the expanded regimes, through the manager's "
                    f"prepare_slot_mappings; {drafts}"
                    + ("; graph padding rows given as a dummy request (idx_mapping -1)"
                       if dummies else ""))
    return [
        real(BATCH_ORDER, MODEL_RUNNER, f"{SORT} alone, with a decode query length of 1")
        if not unsorted else modeled(BATCH_ORDER, f"{unsorted}: 0.33's sort key "
                                                  "(pcpcheck.search.release_search.release_order)"),
        real(SLOT_MAPPING, BLOCK_TABLE, kernel_scope) if not unkerneled else modeled(
            SLOT_MAPPING, f"{unkerneled}: the reference formula (semantics section 3)"),
        real(MANAGER_STAGE, MANAGER, (
            f"built by {BUILDER} as the model runner calls it ({', '.join(built_at)}); "
            if built_at else "") + (
            f"{PARTITION} builds each rank's local batch (the gather's rows; the split's "
            f"boundaries and prefilling flags) through its _build_batch_layout; {expanded_only}"
            if not unpartitioned else f"_build_batch_layout alone ({PARTITION} not run: "
                                      f"{unpartitioned}); {expanded_only}")),
        real(SPLIT_STAGE, BACKEND_UTILS, f"{SPLIT} alone, with the MLA builder's defaults "
                                         f"under PCP: {flags}; expanded regimes (a draft "
                                         "step's nd is its regime's: spec/SPEC.md)")
        if not unsplit else modeled(SPLIT_STAGE, f"{unsplit}: the rank's leading decode rows"),
        real(WRAPPER, gather_path, "called as its layers call it: one tensor through the "
                                   "indexer's (k cut to the slot map's tokens first, as "
                                   "sparse_attn_indexer.py does: restated), two through the "
                                   "MLA latent cache's") if has_wrappers else modeled(
            WRAPPER, f"not reached: {gather_path} has no wrapper, cases call the gather"),
        real(GATHER_STAGE, gather_path),
        modeled(CACHE_WRITE, "a C op (concat_and_cache_mla), not run on CPU: the kernel rule of "
                             "semantics section 4 (spec.model.write)"),
    ]


__all__ = ["path_table"]
