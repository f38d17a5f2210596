"""What a worker executes: a host per loaded target, each loading its target and running its
cases on the ranks the worker hosts.

- `GatherHost`: a gather implementation, one instance per rank (the file executed once per
  rank, under distinct module names: module globals are never shared between ranks); its cases
  run on every rank as greenlets (`threads`) or on this process's one rank of a
  torch.distributed group (`gloo`, `nccl`, `torchrun`).
- `ReleaseHost`: a vLLM release's PCP path; its steps run on every rank as greenlets, each rank
  laying the step out with its own PCPManager (pcpcheck.worker.release_step), the lines of the
  path's files they run recorded (pcpcheck.worker.release_lines).

`load(request, worker)` gives the host and the reply to send (loaded, or load_error); a host's
`run(case)` gives each hosted rank's report (pcpcheck.shared.protocol) and its blobs, and its
`lines_run()` after it what the case ran of the path's lines (a release's; None for a gather).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict

from pcpcheck.shared import protocol
from pcpcheck.shared.errors import LoadError
from pcpcheck.shared.protocol import FINISHED, RELEASE, RUNNING, WAITING
from pcpcheck.worker import deployment
from pcpcheck.worker.runner import CollectiveAborted, RankOutcome


def load(request: protocol.LoadRequest, worker) -> tuple[GatherHost | ReleaseHost | None, dict]:
    """The host of a load request (None if it failed) and the reply the driver gets. The worker
    lives in the deployment from its first load on (pcpcheck.worker.deployment)."""
    deployment.enter(worker.device)
    if request.function == RELEASE:
        return ReleaseHost.load(request, worker)
    return GatherHost.load(request, worker)


class GatherHost:
    """A gather target, one instance per rank the worker hosts."""

    def __init__(self, copies: list, worker):
        self.copies = copies
        self.worker = worker

    @classmethod
    def load(cls, request: protocol.LoadRequest, worker) -> tuple[GatherHost | None, dict]:
        from pcpcheck.worker.loader import load_target
        try:
            copies = [load_target(request.source, request.function or None)
                      for _ in range(request.copies)]
        except LoadError as exc:
            return None, protocol.load_error_reply(str(exc))
        except BaseException as exc:  # noqa: BLE001 - a target's import may raise anything
            return None, protocol.load_error_reply(
                f"{request.source}: loading failed: {type(exc).__name__}: {exc}"[:300])
        first = copies[0]
        return cls(copies, worker), protocol.loaded_reply(
            name=first.name, stand_ins=first.stand_ins, accepts_shard=first.accepts_shard,
            function_name=first.function_name,
            protocol=first.protocol.__name__ if first.protocol is not None else "",
            async_order=first.async_order, streams=first.uses_streams)

    def lines_run(self) -> None:
        return None  # a gather's lines are not recorded: a release's path table names its files

    def run(self, case: protocol.CaseRequest) -> tuple[list[dict], list]:
        if self.worker.adapter is None:
            return self._every_rank(case)
        return self._one_rank(case)

    def _every_rank(self, case: protocol.CaseRequest) -> tuple[list[dict], list]:
        """Every rank of the case as greenlets, a real all_gather between them."""
        from pcpcheck.worker.rankctx import current_group
        worker = self.worker
        inputs = [protocol.rank_inputs(case, rank, worker.device) for rank in range(case.size)]
        ranges: list[list] = [[] for _ in range(case.size)]
        streams: list[list | None] = [None] * case.size

        def call(rank: int):
            tensors, slots, nd, _ = inputs[rank]
            with deployment.on_rank():
                return self._call(rank, case, tensors, slots, nd, current_group(), streams)

        with self._judged(case):
            outcomes = worker.threads.run(case.size, call, worker.on_switch(ranges))
        blobs: list = []
        results = []
        for rank in range(case.size):
            outcomes[rank].streams = streams[rank]
            results.append(protocol.encode_rank(rank, outcomes[rank], inputs[rank],
                                                worker.capture.text(ranges[rank]), blobs,
                                                sent=inputs[rank][3]))
        return results, blobs

    def _asynchronous(self, case: protocol.CaseRequest) -> bool:
        """The step's streams are judged (pcpcheck.worker.async_step): the target's asynchronous
        protocol runs (decodes are sharded), or its gather's file uses the stream API."""
        first = self.copies[0]
        return (first.protocol is not None and case.shard) or first.uses_streams

    def _judged(self, case: protocol.CaseRequest):
        """The step's stream trace judged: an asynchronous step's."""
        return deployment.judged(self.worker.device) if self._asynchronous(case) \
            else contextlib.nullcontext()

    def _call(self, slot: int, case: protocol.CaseRequest, tensors, slots, nd, group,
              streams: list) -> object:
        """The hosted rank's call: the gather, or the step through the asynchronous protocol
        (its stream trace into streams[slot])."""
        copy = self.copies[slot]
        if not self._asynchronous(case):
            return copy.call(tensors, slots, nd, case.shard, group=group)
        from pcpcheck.worker import async_step
        value, streams[slot] = async_step.run_step(
            copy, tensors, slots, nd, case.shard, case.header["counts"],
            bool(case.header.get("capturing")), group)
        return value

    def _one_rank(self, case: protocol.CaseRequest) -> tuple[list[dict], list]:
        """This process's rank of a torch.distributed group (its CheckedGroup keeps the ranks'
        collectives aligned, and says when the group failed: poisoned)."""
        from pcpcheck.worker.process_group import CheckedGroup
        worker = self.worker
        rank = worker.adapter.rank_in_group
        inputs = protocol.rank_inputs(case, 0, worker.device)
        outcome = RankOutcome()

        def on_wait(waiting: bool) -> None:
            worker.status.switch(rank, WAITING if waiting else RUNNING)

        group = CheckedGroup(worker.adapter, worker.device, outcome.trace, on_wait, worker.count,
                             worker.poisoned)
        streams: list[list | None] = [None]
        worker.status.switch(rank, RUNNING)
        try:
            with self._judged(case), deployment.on_rank():
                outcome.value = self._call(0, case, inputs[0], inputs[1], inputs[2], group,
                                           streams)
            outcome.streams = streams[0]
        except CollectiveAborted:
            pass  # recorded in the trace
        except BaseException as exc:  # noqa: BLE001 - a target may raise anything, even SystemExit
            outcome.record_error(exc)
        worker.status.switch(rank, FINISHED)
        worker.poisoned = group.poisoned
        end = worker.capture.mark()
        blobs: list = []
        result = protocol.encode_rank(rank, outcome, inputs, worker.capture.text([(0, end)]),
                                      blobs, sent=inputs[3])
        result["poisoned"] = group.poisoned
        return [result], blobs


class ReleaseHost:
    """A vLLM release (`pcpcheck vllm`): its manager and gather executed here, its capabilities
    read from its code."""

    def __init__(self, spec: dict, worker, lines):
        self.spec = spec
        self.worker = worker
        self.lines = lines  # a release_lines.LineRecorder of the path table's real files

    @classmethod
    def load(cls, request: protocol.LoadRequest, worker) -> tuple[ReleaseHost | None, dict]:
        from pcpcheck.shared.changed import CHANGED_LINES
        from pcpcheck.worker.release_code import release_from_spec
        from pcpcheck.worker.release_lines import LineRecorder
        spec = json.loads(request.source)
        watch = spec.pop(CHANGED_LINES, None)  # the release itself, loaded once, is the spec's
        try:
            release = release_from_spec(spec)
            lines = LineRecorder(release.source, [stage["file"] for stage in release.paths or ()
                                                  if stage["status"] == "real"], watch=watch)
        except BaseException as exc:  # noqa: BLE001 - SourceError, InterfaceDrift, anything else
            kind = type(exc).__name__
            text = str(exc).splitlines()[0] if str(exc) else kind
            if kind not in ("InterfaceDrift", "SourceError", "LoadError"):
                text = f"loading the release failed: {kind}: {text}"
            return None, protocol.load_error_reply(text[:500], kind)
        return cls(spec, worker, lines), protocol.loaded_reply(
            name=release.name, stand_ins=release.stand_ins,
            accepts_shard=release.caps.gather_shard, function_name=release.gather.function_name,
            release={"release": release.source.release, "source": release.source.spec(),
                     "files": release.files, "adapted": list(release.adapted),
                     "caps": asdict(release.caps), "paths": release.paths,
                     "functions": {relpath: sorted(numbers)
                                   for relpath, numbers in lines.functions.items()}})

    def run(self, case: protocol.CaseRequest) -> tuple[list[dict], list]:
        """The step on every rank as greenlets: rank_step lays it out with the rank's own
        PCPManager and calls the release's entry; the layout goes back as plain data."""
        from pcpcheck.worker.release_step import rank_step
        step_json = case.step
        assert step_json is not None  # a release's cases carry their step (protocol.case_request)
        worker = self.worker
        ranges: list[list] = [[] for _ in range(case.size)]

        def step(rank: int):
            with deployment.on_rank():
                return rank_step(step_json, self.spec, rank)

        with self.lines.step():
            outcomes = worker.threads.run(case.size, step, worker.on_switch(ranges))
        blobs: list = []
        results = [protocol.encode_release_rank(rank, outcome, worker.capture.text(ranges[rank]),
                                                blobs) for rank, outcome in enumerate(outcomes)]
        return results, blobs

    def lines_run(self) -> dict:
        return {"traced": self.lines.traced, "run": self.lines.take()}
