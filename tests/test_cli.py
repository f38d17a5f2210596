"""The command line: bad arguments and bad targets end in exit 2 and one clear line."""

from __future__ import annotations

import subprocess

import pytest

from pcpcheck.cli import main


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
    (["check", "impl", "--replay", "{not json"], "--replay is not a case printed by pcpcheck"),
    (["check", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["diff", "impl"], "the following arguments are required: new"),
])
def test_usage_errors_exit_2_with_one_line(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in _one_line_error(capsys)


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


def test_replay_of_a_holding_case_exits_0(capsys):
    case = ('{"batch":{"regime":"sharded","pcp_size":2,"requests":[{"num_tokens":2,'
            '"prefilling":true,"context_len":0,"blocks":[0,1]}],"block_size":1,"interleave":1,'
            '"graph_size":0,"dp_pad":0,"pad_slot_map":false,"num_decode_tokens":null},'
            '"tensors":[{"trailing":[4],"dtype":"bfloat16"}]}')
    assert main(["check", "impl", "--replay", case]) == 0
    assert "replayed case holds" in capsys.readouterr().out
