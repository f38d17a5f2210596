"""The command line: bad arguments and bad targets end in exit 2 and one clear line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import given

from pcpcheck.faces.cli import main
from pcpcheck.search.draw import cases
from pcpcheck.shared.case import Case


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("argv, fragment", [
    (["check", "does/not/exist.py"], "does/not/exist.py: no such file"),
    (["check", "--regime", "sideways"], "invalid choice: 'sideways'"),
    (["check", "--max-ranks", "9"], "--max-ranks must be between 2 and 8"),
    (["check", "--max-examples", "0"], "must be at least 1"),
    (["check", "--timeout", "-1"], "--timeout must be positive"),
    (["check", "impl", "--replay", "{not json"], "--replay is not a well-formed case: not JSON"),
    (["check", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["diff", "impl"], "the following arguments are required: NEW"),
    (["chek", "impl"], "unknown command 'chek': did you mean 'check'?"),
    (["--max-exampels", "5"], "unknown option '--max-exampels': did you mean '--max-examples'?"),
    (["check", "impl", "--max-exampels=5"], "unknown option '--max-exampels': did you mean "
                                            "'--max-examples'?"),
    (["diff", "a.py", "b.py", "--regimes", "dcp"], "unknown option '--regimes': did you mean "
                                                   "'--regime'?"),
    (["vllm", "0.33.0", "--jsno", "out.json"], "unknown option '--jsno': did you mean '--json'?"),
    (["merge", "a.json", "--sumary", "s.md"], "unknown option '--sumary': did you mean "
                                              "'--summary'?"),
    (["--verison"], "unknown option '--verison': did you mean '--version'?"),
    (["vllm", "no/such/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"],
     "no/such/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl: no such file or directory"),
])
def test_usage_errors_exit_2_with_one_line(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in _one_line_error(capsys)


def test_an_option_prefix_is_still_the_option_it_starts():
    """argparse takes an unambiguous prefix (allow_abbrev): the typo check leaves it be."""
    from pcpcheck.faces.options import parse
    assert parse(["--max-ex", "5"]).max_examples == 5
    assert parse(["vllm", "0.33.0", "--max-ex=7"]).max_examples == 7


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU torch can use")
def test_device_cuda_without_a_gpu_is_a_usage_error_not_a_violation(capsys):
    assert main(["check", "impl", "--device", "cuda", "--max-examples", "10"]) == 2
    assert _one_line_error(capsys).startswith("pcpcheck: usage error: --device cuda: torch ")


def test_json_to_stdout_leaves_stdout_to_the_json_alone(capsys):
    assert main(["check", "impl", "--max-examples", "10", "--regime", "replicated",
                 "--json", "-"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["verdicts"] == {"replicated": "holds"}
    assert "every invariant holds" in captured.err
    assert not Path("-").exists()


def test_help_says_every_default_and_what_diff_compares(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    assert "hung (default 10.0)" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["diff", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "OLD the version" in text and "NEW the changed version" in text


def test_file_that_is_not_a_gather(tmp_path, capsys):
    path = tmp_path / "helpers.py"
    path.write_text("def unrelated():\n    return 1\n")
    assert main(["check", str(path)]) == 2
    assert "_gather_prefill_cache_inputs" in _one_line_error(capsys)


def test_syntax_error_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "pcp.py"
    path.write_text("def _gather_prefill_cache_inputs(:\n")
    assert main(["check", str(path)]) == 2
    line = _one_line_error(capsys)
    assert "pcp.py" in line and ":1" in line


def test_unknown_function(capsys):
    assert main(["check", "impl", "--function", "nope"]) == 2
    assert "nope" in _one_line_error(capsys)


def test_console_script_usage_error_has_no_traceback(tmp_path):
    run = subprocess.run(["pcpcheck", "check", str(tmp_path / "missing.py")],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


CASE = ('{"batch":{"regime":"sharded","pcp_size":2,"requests":[{"num_tokens":2,'
        '"prefilling":true,"context_len":0,"blocks":[0,1]}],"block_size":1,"interleave":1,'
        '"graph_size":0,"dp_pad":0,"pad_slot_map":false,"num_decode_tokens":null},'
        '"tensors":[{"trailing":[4],"dtype":"bfloat16"}]}')


def test_replay_of_a_holding_case_exits_0(pcpcheck_check, capsys):
    assert pcpcheck_check(["impl", "--replay", CASE]) == 0
    assert "replayed case holds" in capsys.readouterr().out


def _edited(edit) -> str:
    case = json.loads(CASE)
    edit(case["batch"], case)
    return json.dumps(case)


def _second_request(blocks):
    return lambda batch, case: batch["requests"].append(
        {"num_tokens": 2, "prefilling": True, "context_len": 0, "blocks": blocks})


# Each breaks one precondition of the spec (or the case format): before validation these gave
# tracebacks (exit 1) or false violations of the bundled, correct implementation.
MALFORMED_REPLAYS = [
    (lambda b, c: b.update(regime="sideways"), "unknown regime 'sideways'"),
    (lambda b, c: c["tensors"][0].update(dtype="float64"), "tensor 0: unknown dtype 'float64'"),
    (lambda b, c: b.update(pcp_size=9), "pcp_size must be a whole number between 2 and 8, got 9"),
    (lambda b, c: b.update(pcp_size=1), "pcp_size must be a whole number between 2 and 8, got 1"),
    (lambda b, c: b.update(pcp_size=True), "pcp_size must be a whole number between 2 and 8"),
    (lambda b, c: c.update(tensors=[]), "tensors must hold 1 to 8 tensors, got 0"),
    (_second_request([1, 2]), "WF_SLOTS: block 1 is in request 0 and in request 1"),
    (_second_request([2]), "WF_SLOTS: request 1 has no block for position 1"),
    (lambda b, c: b["requests"][0].update(blocks=[0, 0]), "WF_SLOTS: block 0 is in request 0 and in request 0"),
    (lambda b, c: b.update(block_size=0), "block_size must be a whole number at least 1, got 0"),
    (lambda b, c: c["tensors"][0].update(trailing=[1]), "tensor 0: a row of 2 bytes"),
    (lambda b, c: (b["requests"][0].update(num_tokens=4, blocks=[0, 1, 2, 3]),
                   b.update(graph_size=1)), "WF_WIDTH: graph size 1 below max_r n_r = 2"),
    (lambda b, c: b.update(regime="draft"), "WF_LAYOUT: draft regimes hold decodes only"),
    (lambda b, c: b.update(regime="draft-mixed", num_decode_tokens=2), "WF_LAYOUT: draft-mixed"),
    (lambda b, c: b.update(num_decode_tokens=1), "num_decode_tokens is given by the layout"),
    (lambda b, c: b.update(interleave=2), "interleave 2 applies to the dcp regime only"),
    (lambda b, c: b.update(dp_pad=1), "dp_pad and pad_slot_map apply to the draft regimes only"),
    (lambda b, c: b.pop("requests"), "batch: missing requests"),
    (lambda b, c: b.update(speed=3), "batch: unknown field speed"),
    (lambda b, c: b["requests"][0].update(num_tokens=-1), "request 0: num_tokens must be"),
    (lambda b, c: c.update(tensors={"trailing": [4]}), "tensors must be a list"),
]


@pytest.mark.parametrize("edit, fragment", MALFORMED_REPLAYS,
                         ids=[fragment[:40] for _, fragment in MALFORMED_REPLAYS])
def test_malformed_replay_exits_2_with_one_line(edit, fragment, capsys):
    assert main(["check", "impl", "--replay", _edited(edit)]) == 2
    line = _one_line_error(capsys)
    assert line.startswith("pcpcheck: usage error: --replay is not a well-formed case: ")
    assert fragment in line


@pytest.mark.parametrize("text", ["[]", "null", '{"batch": 1, "tensors": []}', "3"])
def test_replay_that_is_not_a_case_object(text, capsys):
    assert main(["check", "impl", "--replay", text]) == 2
    assert "--replay is not a well-formed case" in _one_line_error(capsys)


def test_replay_writes_the_json_verdict(tmp_path, pcpcheck_check):
    path = tmp_path / "verdict.json"
    bug = Path(__file__).parent / "zoo" / "bug04_truncated_slots.py"
    code = pcpcheck_check([bug, "--replay", CASE, "--json", path])
    verdict = json.loads(path.read_text())
    assert (code, verdict["verdict"]) == (1, "violated")
    assert verdict["counterexamples"][0]["case"] == json.loads(CASE)
    assert verdict["counterexamples"][0]["invariant"] == "REPLICA"


@given(case=cases())
def test_every_drawn_case_is_well_formed_and_round_trips(case):
    """Validation rejects nothing the search draws (processes read every case through it)."""
    assert Case.from_json(case.to_json()) == case


def _boom(*args, **kwargs):
    raise ValueError("forced inside pcpcheck")


@pytest.mark.parametrize("where", ["pcpcheck.judge.run.judge", "pcpcheck.judge.coverage.exercised",
                                   "pcpcheck.render.report.result_text"])
def test_a_failure_inside_pcpcheck_exits_3_with_one_line_never_a_verdict(where, monkeypatch, capsys):
    """The judge, the coverage count or the report failing is pcpcheck's fault: exit 3 (not 1,
    a violation, nor 2, bad input) and one line saying so; --traceback adds where."""
    monkeypatch.setattr(where, _boom)
    argv = ["check", "impl", "--regime", "replicated", "--max-examples", "5", "--jobs", "1"]
    assert main(argv) == 3
    line = _one_line_error(capsys)
    assert line.startswith("pcpcheck: internal error, a fault of pcpcheck and not of the target")
    assert "ValueError: forced inside pcpcheck" in line
    assert main([*argv, "--traceback"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "_boom" in err
