"""Mutation run over the judge and the predicates: each mutant removes or weakens one check; every
mutant must make at least one test fail. Prints one line per mutant: the test that killed it, or
SURVIVED. Exit 1 if any survived.

    python scripts/mutate_judge.py            # every mutant
    python scripts/mutate_judge.py returns    # the mutants whose name contains "returns"

Each mutant runs in a scratch copy of the tree (the worktree is never modified). Tests run in
stages, cheapest first; a mutant killed by one stage skips the rest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (name, file, text, replacement): the text must occur exactly once.
MUTANTS = [
    ("returns always holds", "spec/invariants.py",
     "return all(error is None for error in errors)", "return True"),
    ("collective ignores incomplete collectives", "spec/invariants.py",
     "    if any(entry[0] == INCOMPLETE for trace in traces for entry in trace):\n        return False\n", ""),
    ("collective always holds", "spec/invariants.py",
     "return all(trace == traces[0] for trace in traces)", "return True"),
    ("no_input_mutation always holds", "spec/invariants.py", "return before == after", "return True"),
    ("length ignores row count", "spec/invariants.py",
     "if any(len(tensor_rows) < num_slots for tensor_rows in rows):", "if False:"),
    ("length ignores row alignment", "spec/invariants.py",
     "return all(tensor_rows[:num_slots] == rows[0][:num_slots] for tensor_rows in rows)", "return True"),
    ("uniqueness always holds", "spec/invariants.py",
     "return len(set(written)) == len(written)", "return True"),
    ("uniqueness ignores slot 0", "spec/invariants.py",
     "written = [slot for slot in slots if slot >= 0]", "written = [slot for slot in slots if slot > 0]"),
    ("pad_hygiene always holds", "spec/invariants.py",
     "        if slot >= 0 and label < 0:\n            return False\n", ""),
    ("pad_hygiene ignores slot 0", "spec/invariants.py",
     "if slot >= 0 and label < 0:", "if slot > 0 and label < 0:"),
    ("pad_hygiene ignores rows past the end", "spec/invariants.py",
     "label = rows[k] if k < len(rows) else NO_ROW", "label = rows[k] if k < len(rows) else 0"),
    ("pad_hygiene ignores NO_ROW", "spec/invariants.py",
     "if slot >= 0 and label < 0:", "if slot >= 0 and label < 0 and label != NO_ROW:"),
    ("pairing always holds", "spec/invariants.py",
     "if slot >= 0 and k < len(rows) and rows[k] >= 0 and owner.get(slot) != rows[k]:", "if False:"),
    ("pairing only checks the slot is owned", "spec/invariants.py",
     "owner.get(slot) != rows[k]:", "slot not in owner:"),
    ("replica always holds", "spec/invariants.py",
     "return all(cache == expected for cache in caches)", "return True"),
    ("replica checks rank 0 only", "spec/invariants.py",
     "return all(cache == expected for cache in caches)", "return caches[0] == expected"),
    ("shard ignores caches", "spec/invariants.py",
     "any(caches[r] != owned[r] for r in range(len(owned)))", "False"),
    ("shard ignores coverage", "spec/invariants.py",
     "return sorted(covered) == sorted(tokens)", "return True"),
    ("registry drops PAIRING", "spec/registry.py",
     "    Invariant(PAIRING, inv.pairing,", "    Invariant(PAIRING + '', lambda *a: True,"),
    ("registry: REPLICA not in draft-mixed", "spec/registry.py",
     "_D1 = tuple(regime for regime in REGIMES if regime != DCP)",
     "_D1 = tuple(regime for regime in REGIMES if regime not in (DCP, 'draft-mixed'))"),
    ("registry: SHARD applies nowhere", "spec/registry.py",
     "blame=_cache_differs),\n)",
     "blame=_cache_differs),\n)[:-1] + (Invariant(SHARD, inv.shard, GLOBAL_PER_TENSOR, (),"
     " lambda step, k: ()),)"),
    ("evaluate: per-tensor checks only tensor 0", "spec/registry.py",
     "tensors = range(step.num_tensors) if entry.scope == PER_TENSOR else (None,)",
     "tensors = range(min(1, step.num_tensors)) if entry.scope == PER_TENSOR else (None,)"),
    ("evaluate: global failures not recorded", "spec/registry.py",
     "failed.setdefault(entry.id, set()).update(entry.blame(step, *unit))", "pass"),
    ("evaluate: counts every applicable ID, ran or not", "spec/registry.py",
     "        if units:\n            ran.append(entry.id)", "        ran.append(entry.id)"),
    ("evaluate: output checks on ranks that did not return", "spec/registry.py",
     "if step.ranks[r].returned or not entry.needs_output]", "]"),
    ("evaluate: skips ranks > 0", "spec/registry.py",
     "            units = [(r, k) for r in ranks for k in tensors",
     "            units = [(r, k) for r in ranks[:1] for k in tensors"),
    ("blame: caches blame no rank", "spec/registry.py",
     "return [r for r, cache in enumerate(_caches(step, tensor)) if cache != step.expected[r]]",
     "return []"),
    ("blame: collective blames every rank", "spec/registry.py",
     "if trace != common or any(entry[0] == inv.INCOMPLETE for entry in trace)]", "]"),
    ("judge: violations not reported", "pcpcheck/judge/verdict.py",
     "return [Violation(i, ranks) for i, ranks in failed.items()], ran", "return [], ran"),
    ("judge: real tokens include padding", "pcpcheck/judge/verdict.py",
     "prepared.labels[prepared.labels >= 0].tolist()", "prepared.labels.tolist()"),
    ("malformed: slot dtype and device not checked", "pcpcheck/judge/observe.py",
     "if slots.dtype != slot_dtype or slots.device != device:", "if False:"),
    ("malformed: slot dtype checked, device not", "pcpcheck/judge/observe.py",
     "if slots.dtype != slot_dtype or slots.device != device:", "if slots.dtype != slot_dtype:"),
    ("malformed: tensor dtype and shape not checked", "pcpcheck/judge/observe.py",
     "if tensor.dtype != spec.torch_dtype or tuple(tensor.shape[1:]) != spec.trailing:", "if False:"),
    ("malformed: tensor shape checked, dtype not", "pcpcheck/judge/observe.py",
     "if tensor.dtype != spec.torch_dtype or tuple(tensor.shape[1:]) != spec.trailing:",
     "if tuple(tensor.shape[1:]) != spec.trailing:"),
    ("malformed: tensor dtype checked, shape not", "pcpcheck/judge/observe.py",
     "if tensor.dtype != spec.torch_dtype or tuple(tensor.shape[1:]) != spec.trailing:",
     "if tensor.dtype != spec.torch_dtype:"),
    ("malformed: tensor count not checked", "pcpcheck/judge/observe.py",
     "    if len(tensors) != len(specs):\n", "    if False:\n"),
]

# Stages, cheapest first; each a pytest argument list.
STAGES = [
    ["tests/test_spec_model.py", "tests/test_zoo.py", "-k",
     "predicate or registry or every_invariant or pinned or bug08 or call_line or model_satisfies"
     " or even_with"],
    ["tests/test_project.py", "tests/test_hostile.py"],
    ["tests/test_zoo.py", "tests/test_cli.py", "tests/test_agreement.py", "tests/test_runner.py"],
    ["tests/test_crosshair.py", "tests/test_procs.py"],
]


def scratch_copy() -> Path:
    """The tracked and untracked-not-ignored files of the tree, in a temporary directory, with
    the statements' import names (pyproject's package-dir) as links to their folders, so that
    PYTHONPATH=that directory imports the mutant and not the installed tree."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    target = Path(tempfile.mkdtemp(prefix="mutant-"))
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    for name, folder in (("pcpcheck_spec", "spec"), ("pcpcheck_reference", "reference"),
                         ("pcpcheck_impl", "impl")):
        (target / name).symlink_to(folder)
    return target


def run_mutant(name: str, path: str, text: str, replacement: str) -> str:
    tree = scratch_copy()
    try:
        file = tree / path
        source = file.read_text()
        if source.count(text) != 1:
            return f"BAD MUTANT (text found {source.count(text)} times)"
        file.write_text(source.replace(text, replacement))
        env = {**os.environ, "PYTHONPATH": str(tree), "CI": "true"}
        for stage in STAGES:
            run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-rf",
                                  "-p", "no:cacheprovider", *stage], cwd=tree, env=env,
                                 capture_output=True, text=True)
            if run.returncode != 0:
                failed = re.findall(r"^FAILED (\S+)", run.stdout, re.M)
                return "killed by " + (failed[0] if failed else run.stdout.strip().splitlines()[-1])
        return "SURVIVED"
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or any(a in m[0] for a in argv)]
    survived = 0
    for name, path, text, replacement in chosen:
        started = time.perf_counter()
        verdict = run_mutant(name, path, text, replacement)
        survived += not verdict.startswith("killed")
        print(f"{name:<55} {verdict}  ({time.perf_counter() - started:.0f} s)", flush=True)
    print(f"{len(chosen) - survived}/{len(chosen)} mutants killed")
    return 1 if survived else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
