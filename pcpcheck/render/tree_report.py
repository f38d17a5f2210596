"""A tree diff (`pcpcheck diff OLD NEW` for two vLLM trees, a TreeDiffResult) as text: a line
per regime (steps, how many differ and at which stage first, each side's violations), each
regime's smallest differing step per first stage with both sides' values side by side, each
side's counterexample where it violates, and the verdict with its exit code."""

from __future__ import annotations

from pcpcheck.shared.results import SIDES, RegimeTreeDiff, TreeDiffResult


def sides_text(regime: RegimeTreeDiff) -> str:
    """Each side's verdict over a regime's steps."""
    if not regime.violated:
        return "both hold every invariant"
    return "; ".join(f"{side} violates " + ", ".join(
        f"{invariant} ({steps} steps)" for s, invariant, steps in regime.violated if s == side)
        for side in SIDES if any(s == side for s, _, _ in regime.violated))


def verdict_text(result: TreeDiffResult) -> str:
    """The verdict in words, with its exit code."""
    if result.violated:
        sides = [side for side in SIDES
                 if any(s == side for regime in result.regimes for s, _, _ in regime.violated)]
        where = "both sides" if len(sides) == 2 else f"the {sides[0]} side"
        return f"an invariant is violated on {where} (exit {result.exit_code})"
    if result.differs:
        return f"the paths differ, both sides holding every invariant (exit {result.exit_code})"
    return ("no difference: the two paths agree at every stage on every step "
            f"(exit {result.exit_code})")


def regime_line(regime: RegimeTreeDiff) -> str:
    if regime.not_applicable:
        return f"  {regime.regime:<12} not applicable: {regime.not_applicable}"
    differ = ("the same at every stage" if not regime.differing else
              f"{regime.differing} differ, first at " + ", ".join(
                  f"{stage} ({steps})" for stage, steps in regime.first_stages))
    return f"  {regime.regime:<12} {regime.steps:>5} steps: {differ}; {sides_text(regime)}"


def _indented(text: str) -> list[str]:
    return ["    " + line for line in text.splitlines()]


def tree_diff_text(result: TreeDiffResult, with_regimes: bool = True) -> str:
    """The report (`with_regimes`: a line per regime first; a command prints those as each
    regime ends)."""
    lines = [regime_line(regime) for regime in result.regimes] if with_regimes else []
    lines += ["", f"old = vLLM {result.old_release} ({result.old})",
              f"new = vLLM {result.new_release} ({result.new})"]
    for regime in result.regimes:
        for number, step in enumerate(regime.differences):
            lines += ["", ("smallest differing step" if number == 0 else
                           f"smallest step first differing at {step.stage}") + f" ({regime.regime}):"]
            lines += _indented(step.report)
            if step.flaky:
                lines.append(f"    flaky: {step.flaky[1]} of {step.flaky[0]} replays differed "
                             "at this stage again")
            for side, report in (("old", step.old_report), ("new", step.new_report)):
                if report:
                    lines += [f"  {side}'s violation on this step:"] + _indented(report)
        for violation in regime.violations:
            other = SIDES[1 - SIDES.index(violation.side)]
            also = (f" ({other} violates {', '.join(violation.other_violations)} there too)"
                    if violation.other_violations else "")
            lines += ["", f"{violation.side} violates {violation.invariant} ({regime.regime}) "
                          f"on a step where the two paths agree{also}:"]
            lines += _indented(violation.report)
    lines += ["", verdict_text(result)]
    return "\n".join(lines)
