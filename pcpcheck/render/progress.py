"""What `pcpcheck check` prints while it runs: one line per regime when it ends and, on a
terminal, that line live while the regime runs (cases, cases/s, violations so far). A rank that
runs a second or more on one case is said, with what the search is doing ("rank 1 has run 4 s of
its 10 s timeout (shrinking, attempt 3)"): live on a terminal, once per wait in a log. In a log a
regime that runs long also says how far it got every PROGRESS_EVERY_S, with its slowest call."""

from __future__ import annotations

import sys
import time

from pcpcheck.api import Progress, release_record
from pcpcheck.render import report
from pcpcheck.shared.results import unreached

_REFRESH_S = 0.25
PROGRESS_EVERY_S = 30.0  # a log's line for a regime still running, this often
SLOW_CALL = 0.1  # a regime line names its slowest call when it took this share of the timeout


class LinePrinter(Progress):
    def __init__(self, stream=None, live: bool | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._shown = 0.0
        self._started: dict[str, float] = {}
        self._waits: set[tuple] = set()  # (regime, phase) a log has said is waiting
        self._timeout = 0.0

    def started(self, target, options) -> None:
        self._timeout = options.timeout
        if getattr(target, "release", None):  # a vLLM release: its provenance follows the verdict
            print(report.release_title(release_record(target), target.name)
                  + "\n  (files read, path table, stand-ins and adaptations: after the verdict)",
                  file=self.stream, flush=True)
            return
        world = (f" ({options.backend}, world sizes {','.join(map(str, options.world_sizes))})"
                 if options.backend != "threads" and options.world_sizes else "")
        print(f"pcpcheck: checking {target.name}{world}", file=self.stream)
        if target.stand_ins:
            print(f"  stood in for: {', '.join(target.stand_ins)}", file=self.stream)
        self.stream.flush()

    def case(self, regime: str, result) -> None:
        now = time.monotonic()
        started = self._started.setdefault(regime, now)
        if now - self._shown < (_REFRESH_S if self.live else PROGRESS_EVERY_S):
            return
        if not self.live and now - started < PROGRESS_EVERY_S:
            return
        self._shown = now
        violations = sum(result.violated.values())
        rate = result.cases / (now - started) if now > started else 0.0
        text = (f"  {regime:<12} {result.cases:>6} cases  {rate:5.0f} cases/s  {violations} "
                f"violation(s) so far; slowest call {result.slowest_call:.2f} s")
        if self.live:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
        else:
            print(text, file=self.stream, flush=True)

    def waiting(self, regime: str, rank: int, seconds: float, timeout: float, phase: str) -> None:
        text = f"  {regime:<12} rank {rank} has run {seconds:.0f} s of its {timeout:g} s timeout ({phase})"
        if self.live:
            self.stream.write("\r\x1b[K" + text)
            self.stream.flush()
        elif (regime, phase) not in self._waits:
            self._waits.add((regime, phase))
            print(text + "; waiting for it", file=self.stream, flush=True)

    def finished(self, summary) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        if summary.not_applicable:
            print(f"  {summary.regime:<12} {unreached(summary.not_applicable, 'not applicable: ')}",
                  file=self.stream, flush=True)
            return
        budget = "  (budget reached)" if summary.budget_reached else ""
        state = "VIOLATED" if any(c.violated for c in summary.invariants) else "holds"
        slow = ""
        if self._timeout and summary.slowest_call >= SLOW_CALL * self._timeout:
            slow = (f"  (calls: slowest {summary.slowest_call:.2f} s, mean {summary.mean_call:.2f} s, "
                    f"of a {self._timeout:g} s timeout)")
        print(f"  {summary.regime:<12} {report.rates(summary)}  {state}{budget}{slow}",
              file=self.stream, flush=True)
