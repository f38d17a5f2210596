"""What `pcpcheck check` prints while it runs: one line per regime when it ends and, on a
terminal only, that line live while the regime runs (cases, cases/s, violations so far)."""

from __future__ import annotations

import sys
import time

from pcpcheck import report
from pcpcheck.api import Progress, release_record

_REFRESH_S = 0.25


class LinePrinter(Progress):
    def __init__(self, stream=None, live: bool | None = None):
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self._shown = 0.0
        self._started: dict[str, float] = {}

    def started(self, target, options) -> None:
        if getattr(target, "release", None):  # a vLLM release: its files, model, stand-ins
            header = report.release_header(release_record(target), target.name, target.stand_ins)
            print("\n".join(header), file=self.stream, flush=True)
            return
        world = (f" ({options.backend}, world sizes {','.join(map(str, options.world_sizes))})"
                 if options.backend != "threads" and options.world_sizes else "")
        print(f"pcpcheck: checking {target.name}{world}", file=self.stream)
        if target.stand_ins:
            print(f"  stood in for: {', '.join(target.stand_ins)}", file=self.stream)
        self.stream.flush()

    def case(self, regime: str, result) -> None:
        if not self.live:
            return
        now = time.monotonic()
        started = self._started.setdefault(regime, now)
        if now - self._shown < _REFRESH_S:
            return
        self._shown = now
        violations = sum(result.violated.values())
        rate = result.cases / (now - started) if now > started else 0.0
        self.stream.write(f"\r\x1b[K  {regime:<12} {result.cases:>6} cases  {rate:5.0f} cases/s  "
                          f"{violations} violation(s) so far")
        self.stream.flush()

    def finished(self, summary) -> None:
        if self.live:
            self.stream.write("\r\x1b[K")
        if summary.not_applicable:
            print(f"  {summary.regime:<12} not applicable: {summary.not_applicable}",
                  file=self.stream, flush=True)
            return
        budget = "  (budget reached)" if summary.budget_reached else ""
        state = "VIOLATED" if any(c.violated for c in summary.invariants) else "holds"
        print(f"  {summary.regime:<12} {report.rates(summary)}  {state}{budget}",
              file=self.stream, flush=True)
