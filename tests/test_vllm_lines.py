"""`pcpcheck vllm` says which lines of the path's files its steps ran
(pcpcheck.worker.release_lines): per real file of the path table, `N/M lines run` in the report,
each line in the JSON (`release.lines`), the source marked on the HTML's lines page.

The checkout is built at test time from the 0.34.0 wheel (nothing of vLLM is committed), with a
function no step calls added to its gather file. The recorder itself is tested first on a small
tree of two files whose ranks switch (greenlets) inside a collective.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import types
from collections import Counter
from pathlib import Path

import pytest
import torch

from pcpcheck.api import check_release
from pcpcheck.api.merge import merge
from pcpcheck.render.html import LINE_NOT_RUN, LINE_RUN, write_html
from pcpcheck.render.report import result_text
from pcpcheck.shared.results import CheckResult
from pcpcheck.shared.source import GATHERS, Source
from pcpcheck.worker.rankctx import current_group
from pcpcheck.worker.release_lines import LineRecorder
from pcpcheck.worker.runner import ThreadRunner
from pcpcheck_spec.names import DCP, SHARDED
from tests.test_api import _schema, conforms
from tests.test_html import _browse, decode_png
from tests.test_vllm_kernels import checkout

pytestmark = pytest.mark.xdist_group("vllm_0_34_0_wheel")

GATHER = GATHERS[0]
UNCALLED = "pcpcheck_uncalled"
UNCALLED_FUNCTION = (f"\n\ndef {UNCALLED}(values):\n"
                     "    doubled = [value * 2 for value in values]\n"
                     "    return sum(doubled)\n")

# Two files of a tree. Rank 0 runs `first.before` while rank 1 runs `second.after`, each waiting
# in the same collective halfway: a tracer with one call stack for every greenlet credits the line
# rank 0 runs after the switch (first.py line 4) to second.py, whose line 4 no rank ran.
FIRST = """def before(value):
    doubled = value * 2
    gathered = all_gather(doubled)
    return gathered + 1


def never():
    return 0


LOADED = 1
"""
SECOND = """def after(value):
    tripled = value * 3
    if value < 0:
        return -1
    gathered = all_gather(tripled)
    return gathered - 1
"""


def _body(text: str, name: str) -> list[int]:
    """The lines of function `name`'s statements (its docstring left out)."""
    node = next(n for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.FunctionDef) and n.name == name)
    body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    return [s.lineno for s in body]


def _all_gather(value: int) -> int:
    """The rank's group's all_gather of one number, summed."""
    return int(current_group().all_gather(torch.tensor([value])).sum())


def _tree(root: Path) -> tuple[Source, dict[str, types.ModuleType]]:
    """FIRST and SECOND as vllm/first.py and vllm/second.py of a checkout, each executed under its
    file's name, as a release's modules are."""
    modules = {}
    for name, text in (("first", FIRST), ("second", SECOND)):
        path = root / "vllm" / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        module = types.ModuleType(f"tree_{name}")
        module.__file__, module.all_gather = str(path), _all_gather
        exec(compile(text, str(path), "exec"), module.__dict__)
        modules[name] = module
    return Source(kind="checkout", location=str(root), release="test"), modules


def test_the_lines_each_greenlet_rank_runs_are_credited_to_their_own_file(tmp_path):
    source, modules = _tree(tmp_path)
    recorder = LineRecorder(source, ["vllm/first.py", "vllm/second.py"])

    def rank(index: int) -> int:
        return modules["first"].before(1) if index == 0 else modules["second"].after(1)

    with recorder.step():
        outcomes = ThreadRunner().run(2, rank)
    assert [o.value for o in outcomes] == [6, 4]  # 2 + 3 gathered and summed
    assert recorder.take() == {"vllm/first.py": [2, 3, 4], "vllm/second.py": [2, 3, 5, 6]}
    # what counts: the statements inside functions, never the module's own (run at import)
    assert recorder.functions["vllm/first.py"] == {2, 3, 4, 8}
    with recorder.step():
        ThreadRunner().run(2, rank)
    assert recorder.take() == {}  # a line is sent once


def test_steps_are_traced_while_they_run_new_lines_then_ever_more_rarely(tmp_path):
    source, modules = _tree(tmp_path)
    recorder = LineRecorder(source, ["vllm/first.py"])
    same, new = (lambda: modules["first"].before(1)), modules["first"].never
    traced = []
    for function in [same] * 11 + [new, same]:
        with recorder.step():
            ThreadRunner().run(1, lambda rank: function())
        recorder.take()
        traced.append(recorder.traced)
    # no new line after the first step: 1, 2, then 4 steps left out; the 12th step's new line
    # has the next one traced
    assert traced == [True, True, False, True, False, False, True, False, False, False, False,
                      True, True]


@pytest.fixture(scope="module")
def checked(wheel_0_34, tmp_path_factory):
    """The 0.34.0 checkout, its gather file with a function no step calls, checked: (its root, the
    result)."""
    root = checkout(wheel_0_34, tmp_path_factory.mktemp("lines") / "checkout")
    gather = root / GATHER
    gather.write_text(gather.read_text() + UNCALLED_FUNCTION)
    return root, check_release(root, regimes=(SHARDED, DCP), max_examples=40, max_ranks=2)


def _lines(result) -> dict[str, dict[str, list[int]]]:
    return json.loads(result.to_json())["release"]["lines"]


@pytest.mark.kernels
def test_the_report_says_how_many_lines_of_each_real_file_ran(checked):
    _, result = checked
    text = result_text(result)
    real = list(dict.fromkeys(s.file for s in result.release.paths if s.status == "real"))
    assert GATHER in real and len(real) >= 5, real  # the gather and wrapper share one file
    for relpath in real:
        counts = re.findall(re.escape(relpath) + r"  (\d+)/(\d+) lines run  ", text)
        assert len(counts) == 1, (relpath, text)  # a file shared by two stages: once
        run, functions = map(int, counts[0])
        assert 0 < run <= functions, (relpath, run, functions)
    assert set(_lines(result)) == set(real)


@pytest.mark.kernels
def test_a_function_no_step_calls_is_listed_not_run(checked):
    root, result = checked
    lines = _lines(result)[GATHER]
    uncalled = _body((root / GATHER).read_text(), UNCALLED)
    assert set(uncalled) <= set(lines["functions"])
    assert not set(uncalled) & set(lines["run"])
    assert lines["run"]  # while the rest of the file ran


@pytest.mark.kernels
def test_the_json_lists_the_first_statement_of_the_gather_run(checked):
    root, result = checked
    first = _body((root / GATHER).read_text(), "_gather_prefill_cache_inputs")[0]
    assert first in _lines(result)[GATHER]["run"]
    document = json.loads(result.to_json())
    assert conforms(document, _schema("pcpcheck check result")) == []
    assert 0 < document["release"]["lines_traced"] <= document["release"]["lines_steps"]
    again = CheckResult.from_json(result.to_json())  # the JSON round trip keeps every line
    assert again.release == result.release


@pytest.mark.kernels
def test_a_merge_lists_the_lines_any_part_ran(checked):
    _, result = checked
    record = result.release
    gather = next(entry for entry in record.lines if entry.file == GATHER)
    halves = (gather.run[::2], gather.run[1::2])
    parts = [dataclasses.replace(
        result, options=dataclasses.replace(result.options, shard=(k + 1, 2)),
        release=dataclasses.replace(record, lines=(dataclasses.replace(gather, run=half),)))
        for k, half in enumerate(halves)]
    merged = merge(parts).release
    assert merged.lines == (gather,)
    assert merged.lines_steps == 2 * record.lines_steps


def _row_classes(dom: str) -> dict[int, str]:
    """line -> the class of its row ("run", "notrun", "" unmarked) on a rendered lines page of
    one file."""
    return {int(line): kind for kind, line in
            re.findall(r'<tr class="(\w*)"><td class="n">(\d+)</td>', dom)}


@pytest.mark.kernels
def test_the_html_marks_the_lines_run_and_not_run(checked, tmp_path):
    root, result = checked
    gather = next(entry for entry in result.release.lines if entry.file == GATHER)
    alone = dataclasses.replace(result, release=dataclasses.replace(result.release,
                                                                    lines=(gather,)))
    pages = write_html(str(tmp_path / "html"), alone)
    page = next(Path(p) for p in pages if p.endswith("lines.html"))
    assert 'href="lines.html#file-1"' in Path(pages[0]).read_text()  # the index links it
    dom = _browse(page, tmp_path, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = _row_classes(dom.stdout)
    text = (root / GATHER).read_text()
    assert rows[_body(text, "_gather_prefill_cache_inputs")[0]] == "run"
    assert {rows[line] for line in _body(text, UNCALLED)} == {"notrun"}
    assert f"{len(gather.run)}/{len(gather.functions)} lines run" in dom.stdout

    # drawn: the first screen shows the gather's first lines, rows run and a row not run (its
    # draft branch, which no sharded or dcp step takes), each far wider than the legend's swatch
    shot = _browse(page, tmp_path, f"--screenshot={tmp_path / 'lines.png'}")
    assert shot.returncode == 0, shot.stderr[-2000:]
    _, _, pixels = decode_png((tmp_path / "lines.png").read_bytes())
    drawn = Counter(row[i:i + 3] for row in pixels for i in range(0, len(row), 3))
    for colour in (LINE_RUN, LINE_NOT_RUN):
        assert drawn[bytes(int(colour[i:i + 2], 16) for i in (1, 3, 5))] > 5000, colour
