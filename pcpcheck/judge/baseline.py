"""Known violations (`--baseline FILE`), after array-api-tests' xfails file: one
`REGIME INVARIANT` per line, `#` starts a comment. A listed violation does not fail the run; a
listed one that no longer occurs is reported so the file can shrink."""

from __future__ import annotations

from dataclasses import dataclass

from pcpcheck.shared.errors import UsageError
from pcpcheck_spec.names import REGIMES
from pcpcheck_spec.registry import IDS


@dataclass(frozen=True)
class Baseline:
    path: str | None
    entries: tuple[tuple[str, str], ...]  # (regime, invariant), in file order


def parse_baseline(text: str, path: str = "<baseline>") -> Baseline:
    """Raises ValueError naming the file, line and the problem."""
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        if len(words) != 2:
            raise ValueError(f"{where}: expected 'REGIME INVARIANT', got {line.strip()!r}")
        regime, invariant = words
        if regime not in REGIMES:
            raise ValueError(f"{where}: unknown regime {regime!r} (one of {', '.join(REGIMES)})")
        if invariant not in IDS:
            raise ValueError(f"{where}: unknown invariant {invariant!r} (one of {', '.join(IDS)})")
        if (regime, invariant) not in entries:
            entries.append((regime, invariant))
    return Baseline(path, tuple(entries))


def load_baseline(path: str) -> Baseline:
    """Raises UsageError (one line) if the file cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--baseline {path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return parse_baseline(text, path)
    except ValueError as exc:
        raise UsageError(f"--baseline {exc}") from None
