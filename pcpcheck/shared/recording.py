"""The recorded-step schema (docs/record.md): one JSON line per PCP rank and step (and, once the
rank's gather returned, a small `outputs` line carrying its outputs' sha256), written by the
recorder plugin inside vLLM (pcpcheck.vllm_plugin) and read by `pcpcheck vllm SOURCE --steps`
(pcpcheck.search.step_replay). Both sides use this module, so the schema has one statement.

`parse_line(text, where)` returns the line's record as a dict, well typed, or raises UsageError
naming `where` (FILE:LINE) and the problem: the reader exits 2 on a malformed recording.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from pcpcheck.shared.errors import UsageError

SCHEMA = "pcpcheck.step/1"
TARGET, DRAFT_STEP = "target", "draft"  # a step's kind: the expanded PCP step or a later draft step
OUTPUTS = "outputs"  # the line after a step's gather returned: the sha256 of its outputs

# field -> type, for the line and for each request
_LINE_INTS = ("step", "rank", "pcp_size", "dcp_size", "dcp_rank", "block_size", "interleave",
              "graph_size", "dp_pad")
_REQUEST_INTS = ("scheduled", "computed", "draft_tokens", "first_block")
_RELEASE_FIELDS = ("slot_mapping", "num_decode_tokens", "sha256")
_OUTPUTS_INTS = ("step", "rank", "dcp_rank")


def _whole(value: object, name: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
    return value


def _keys(data: object, name: str, required: tuple[str, ...], optional: tuple[str, ...] = ()
          ) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{name} must be an object, got {type(data).__name__}")
    missing = [key for key in required if key not in data]
    unknown = sorted(set(data) - set(required) - set(optional))
    if missing:
        raise ValueError(f"{name}: missing {', '.join(missing)}")
    if unknown:
        raise ValueError(f"{name}: unknown field {', '.join(unknown)}")
    return data


def _sha256(value: object, name: str) -> str:
    if not (isinstance(value, str) and len(value) == 64
            and all(c in "0123456789abcdef" for c in value)):
        raise ValueError(f"{name} must be 64 lowercase hex digits, got {value!r}")
    return value


def _outputs(data: dict[str, Any]) -> dict[str, Any]:
    _keys(data, "outputs line", ("schema", "kind", *_OUTPUTS_INTS, "sha256"))
    if data["schema"] != SCHEMA:
        raise ValueError(f"schema {data['schema']!r} is not {SCHEMA!r}")
    for key in _OUTPUTS_INTS:
        _whole(data[key], key)
    _sha256(data["sha256"], "sha256")
    return data


def _record(data: object) -> dict[str, Any]:
    if isinstance(data, dict) and data.get("kind") == OUTPUTS:
        return _outputs(data)
    data = _keys(data, "line", ("schema", *_LINE_INTS, "shard_decode_requests", "kind",
                                "requests", "release"))
    if data["schema"] != SCHEMA:
        raise ValueError(f"schema {data['schema']!r} is not {SCHEMA!r}")
    for key in _LINE_INTS:
        _whole(data[key], key, 1 if key in ("pcp_size", "dcp_size", "block_size", "interleave")
               else 0)
    if data["rank"] >= data["pcp_size"] or data["dcp_rank"] >= data["dcp_size"]:
        raise ValueError(f"rank {data['rank']} / dcp_rank {data['dcp_rank']} outside pcp_size "
                         f"{data['pcp_size']} / dcp_size {data['dcp_size']}")
    if not isinstance(data["shard_decode_requests"], bool):
        raise ValueError("shard_decode_requests must be true or false")
    if data["kind"] not in (TARGET, DRAFT_STEP):
        raise ValueError(f"kind must be {TARGET!r}, {DRAFT_STEP!r} or {OUTPUTS!r}, "
                         f"got {data['kind']!r}")
    if not isinstance(data["requests"], list):
        raise ValueError("requests must be a list")
    for i, request in enumerate(data["requests"]):
        _keys(request, f"request {i}", (*_REQUEST_INTS, "prefilling", "block_ids"))
        for key in _REQUEST_INTS:
            _whole(request[key], f"request {i}: {key}")
        if not isinstance(request["prefilling"], bool):
            raise ValueError(f"request {i}: prefilling must be true or false")
        groups = request["block_ids"]
        if not (isinstance(groups, list) and groups and all(isinstance(g, list) for g in groups)):
            raise ValueError(f"request {i}: block_ids must be a non-empty list of lists (one per "
                             "KV-cache group)")
        for g, group in enumerate(groups):
            for block in group:  # null: a block this DCP rank owns no token of
                if block is not None:
                    _whole(block, f"request {i}: block_ids[{g}]")
    release = _keys(data["release"], "release", _RELEASE_FIELDS[:2], _RELEASE_FIELDS[2:])
    if not isinstance(release["slot_mapping"], list):
        raise ValueError("release: slot_mapping must be a list")
    for slot in release["slot_mapping"]:
        _whole(slot, "release: slot_mapping entry", -1)
    _whole(release["num_decode_tokens"], "release: num_decode_tokens")
    if "sha256" in release:
        for key, value in _keys(release["sha256"], "release: sha256", (), ("inputs",)).items():
            _sha256(value, f"release: sha256: {key}")
    return data


def parse_line(text: str, where: str) -> dict[str, Any]:
    """One recorded line as a well-typed dict; UsageError '{where}: problem' otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not a JSON line ({exc.msg}; truncated?)") from None
    try:
        return _record(data)
    except ValueError as exc:
        raise UsageError(f"{where}: {exc}") from None


def read_lines(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[str, dict[str, Any]]]:
    """Every record of the recording files, in order, with its FILE:LINE."""
    records = []
    for path in paths:
        try:
            handle = open(path, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        with handle:
            for number, text in enumerate(handle, 1):
                if text.strip():
                    where = f"{path}:{number}"
                    records.append((where, parse_line(text, where)))
    return records


def outputs_line(step: int, rank: int, dcp_rank: int, sha256: str) -> str:
    """The JSON line of one rank's gather outputs (the recorder writes it after the gather)."""
    return json.dumps({"schema": SCHEMA, "kind": OUTPUTS, "step": step, "rank": rank,
                       "dcp_rank": dcp_rank, "sha256": sha256}, separators=(",", ":"))


def step_line(check: bool = True, **fields: object) -> str:
    """The JSON line of one rank's step (the recorder's writer), checked against the schema
    unless check=False (the recorder checks its first line: a check costs more than the rest)."""
    text = json.dumps({"schema": SCHEMA, **fields}, separators=(",", ":"))
    if check:
        _record(json.loads(text))
    return text
