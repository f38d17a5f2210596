"""`--html DIR` (or `--html NAME.html`): a self-contained page per counterexample (inline CSS,
no script, no external asset) and an index page linking them.

A page shows, for the shrunk case: each rank's input rows as a grid, coloured by request (hue)
and by kind (prefill solid, decode light with a bar, padding hatched grey); the slot map beneath
each rank's rows; what each rank returned; and each rank's cache after the kernel, with wrong,
missing and unexpected slots highlighted. The invariant ID heads the page in a red banner.

For a release (`pcpcheck vllm`), a lines page shows each real file of the path table, its source
read again from the release (only where its sha256 is still the one the run read), each line of
its functions marked: green where a traced step ran it, red where none did; with
`--changed-against`, every changed line edged blue, one of a function no step ran orange.
"""

from __future__ import annotations

import html
import os

from pcpcheck.judge import race
from pcpcheck.judge.explain import label
from pcpcheck.render.changed_lines import elsewhere, no_step_ran, tried
from pcpcheck.render.report import (
    cell,
    checked_ids,
    coverage_rows,
    lines_traced,
    not_applicable_notes,
)
from pcpcheck.render.tree_report import sides_text
from pcpcheck.shared.case import describe
from pcpcheck.shared.changed import NOT_COUNTED, NOT_EXERCISED, PATH, RAN
from pcpcheck.shared.errors import SourceError
from pcpcheck.shared.results import Counterexample, TreeDiffResult
from pcpcheck.shared.source import from_spec

BANNER = "#c8102e"  # the violated invariant's banner: tests look for this colour in a screenshot
KNOWN = "#f5b041"  # a known (baselined) violation's cell in the index's verdict table
# the lines page: a line of a function that a step ran, and one that none did (tests look for
# these colours in a screenshot)
LINE_RUN = "#c6efc6"
LINE_NOT_RUN = "#f8c9c9"
LINE_NOT_EXERCISED = "#f5a623"  # --changed-against: a changed line of a function no step ran
LINE_CHANGED = "#1f4e9c"  # the edge of every changed line
# a changed line's row class and mark, by its reach (pcpcheck.shared.changed)
_CHANGED_ROW = {RAN: ("run changed", "+"), NOT_EXERCISED: ("unexercised changed", "!"),
                NOT_COUNTED: ("changed", "")}
FOLDED_LINES = 12  # a stretch of this many lines outside every function is folded away

_STYLE = f"""
body {{ font-family: sans-serif; margin: 16px; color: #222; background: #fff; }}
.banner {{ background: {BANNER}; color: #fff; padding: 18px 24px; font-size: 40px;
          font-weight: bold; letter-spacing: 1px; }}
.banner small {{ font-size: 18px; font-weight: normal; }}
h2 {{ font-size: 18px; margin: 22px 0 6px; }}
table.grid {{ border-collapse: separate; border-spacing: 2px; }}
table.grid th {{ font-weight: normal; font-size: 12px; color: #555; text-align: right;
                padding-right: 6px; white-space: nowrap; }}
table.grid td {{ min-width: 34px; height: 24px; text-align: center; font-size: 12px;
                font-family: monospace; border-radius: 3px; }}
td.pad {{ background: repeating-linear-gradient(45deg, #ccc, #ccc 4px, #e6e6e6 4px, #e6e6e6 8px);
          color: #555; }}
td.decode {{ border-left: 5px solid #222; }}
td.none {{ background: #f4f4f4; color: #aaa; }}
td.slot {{ background: #eef3fb; }}
td.slot.neg {{ background: #f4f4f4; color: #999; }}
td.wrong {{ outline: 3px solid {BANNER}; }}
td.missing {{ background: #fff; outline: 3px dashed #e07000; color: #e07000; }}
td.unexpected {{ outline: 3px dotted #7b2cbf; }}
.legend span {{ display: inline-block; padding: 2px 8px; margin-right: 8px; font-size: 12px; }}
pre {{ background: #f7f7f7; padding: 8px; font-size: 12px; white-space: pre-wrap; }}
.rank {{ margin-bottom: 14px; }}
.note {{ font-size: 13px; color: #444; }}
table.streams {{ border-collapse: collapse; font-family: monospace; font-size: 12px; }}
table.streams th {{ background: #eee; padding: 4px 10px; text-align: left; }}
table.streams td {{ padding: 2px 10px; border-left: 2px solid #ddd; min-width: 260px; }}
table.streams td.host {{ color: #666; font-style: italic; text-align: center; }}
table.streams td.first, span.first {{ background: #fde2b8; outline: 3px solid #e07000; }}
table.streams td.second, span.second {{ background: #f8d0d6; outline: 3px solid {BANNER}; }}
.edge {{ color: {BANNER}; font-weight: bold; }}
table.verdict td {{ padding: 0 8px; text-align: right; }}
table.verdict td.fail, span.fail {{ background: {BANNER}; color: #fff; font-weight: bold; }}
table.verdict td.known, span.known {{ background: {KNOWN}; color: #222; font-weight: bold; }}
span.fail, span.known {{ padding: 0 4px; }}
table.verdict td.na {{ color: #999; }}
table.verdict td.na a {{ color: inherit; }}
table.source {{ border-collapse: collapse; font-family: monospace; font-size: 12px; }}
table.source td {{ padding: 0 6px; white-space: pre; }}
table.source td.n {{ color: #888; text-align: right; user-select: none; }}
table.source td.mark {{ font-weight: bold; text-align: center; }}
table.source tr.run td {{ background: {LINE_RUN}; }}
table.source tr.notrun td {{ background: {LINE_NOT_RUN}; }}
span.run {{ background: {LINE_RUN}; padding: 0 4px; }}
span.notrun {{ background: {LINE_NOT_RUN}; padding: 0 4px; }}
table.source tr.unexercised td {{ background: {LINE_NOT_EXERCISED}; }}
table.source tr.changed td.n {{ border-left: 5px solid {LINE_CHANGED}; color: #222; }}
span.unexercised {{ background: {LINE_NOT_EXERCISED}; padding: 0 4px; }}
span.changed {{ border-left: 5px solid {LINE_CHANGED}; padding: 0 4px; }}
"""


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head>"
            f"<body>{body}</body></html>\n")


def _requests_of(case) -> dict[int, tuple[int, bool]]:
    """token -> (request index, prefilling)."""
    owners, token = {}, 0
    for index, request in enumerate(case.batch.requests):
        for _ in range(request.num_tokens):
            owners[token] = (index, request.prefilling)
            token += 1
    return owners


def _row_cell(value: int, owners, extra: str = "") -> str:
    """One row label as a coloured cell."""
    if value < 0 or value not in owners:
        return f'<td class="pad {extra}" title="padding">{html.escape(label(value))}</td>'
    request, prefilling = owners[value]
    hue = (request * 67 + 200) % 360
    shade = "55%" if prefilling else "80%"
    kind = "prefill" if prefilling else "decode"
    return (f'<td class="{kind} {extra}" style="background: hsl({hue}, 65%, {shade})" '
            f'title="request {request}, {kind}">{label(value)}</td>')


def _slot_cells(slots) -> str:
    return "".join(f'<td class="slot{" neg" if int(s) < 0 else ""}">{int(s)}</td>' for s in slots)


def _legend(case, owners) -> str:
    items = []
    for index, request in enumerate(case.batch.requests):
        kind = "prefill" if request.prefilling else "decode"
        hue = (index * 67 + 200) % 360
        shade = "55%" if request.prefilling else "80%"
        bar = "border-left: 5px solid #222;" if not request.prefilling else ""
        items.append(f'<span style="background: hsl({hue}, 65%, {shade}); {bar}">request {index}: '
                     f'{kind}, {request.num_tokens} token(s)</span>')
    items.append('<span class="pad" style="background: repeating-linear-gradient(45deg, #ccc, '
                 '#ccc 4px, #e6e6e6 4px, #e6e6e6 8px)">padding</span>')
    items.append(f'<span style="outline: 3px solid {BANNER}">wrong row in slot</span>')
    items.append('<span style="outline: 3px dashed #e07000">expected, not written</span>')
    items.append('<span style="outline: 3px dotted #7b2cbf">written, not expected</span>')
    return '<div class="legend">' + "".join(items) + "</div>"


def _cache_row(observation, rank: int, owners) -> str:
    expected = observation.prepared.expected[rank]
    view = observation.ranks[rank]
    actual = view.caches[0] if view.caches else {}
    cells = []
    for slot in sorted(set(expected) | set(actual)):
        want, got = expected.get(slot), actual.get(slot)
        if got is None:
            cells.append(f'<td class="missing" title="slot {slot}: expected {label(want)}, '
                         f'not written">{slot}:{label(want)}?</td>')
            continue
        state = "" if want == got else ("unexpected" if want is None else "wrong")
        cell = _row_cell(got, owners, state)
        cells.append(cell.replace(">" + label(got) + "<", f">{slot}:{label(got)}<", 1))
    return "".join(cells) or '<td class="none">empty</td>'


def counterexample_page(counterexample, target: str) -> str:
    """The page of one counterexample (of a CheckResult)."""
    title = f"{counterexample.invariant} violated on rank(s) {list(counterexample.ranks)}"
    body = [f'<div class="banner" id="invariant">{counterexample.invariant} '
            f"<small>violated on rank(s) {list(counterexample.ranks)}, regime "
            f"{html.escape(counterexample.regime)}</small></div>",
            f'<p class="note">target {html.escape(target)}</p>']
    others = counterexample.violations[1:]
    if others:
        body.append('<p class="note">also violated: ' + "; ".join(
            f"{v.invariant} on {list(v.ranks)}" for v in others) + "</p>")
    observation = counterexample.observation
    if observation is not None:
        if counterexample.invariant in race.ASYNC_IDS:
            body.append(_streams(observation, counterexample.invariant, counterexample.ranks[0]))
        body.append(_grids(observation))
    body.append("<h2>Report</h2><pre>" + html.escape(counterexample.report) + "</pre>")
    return _page(title, "".join(body))


def _streams(observation, invariant: str, rank: int) -> str:
    """A rank's stream trace, one column per stream, the two entries of the race marked and
    the missing edge said (pcpcheck.judge.race: what the predicate found)."""
    found = race.of(observation, invariant, rank)
    if found is None:
        return ""
    trace = observation.ranks[rank].streams
    num_inputs = len(observation.prepared.case.tensors) + 1
    order = sorted({entry[1] for entry in trace if entry[1] >= 0})
    rows = []
    for line in race.lines(trace, found, num_inputs):
        text = html.escape(line.label)
        if line.stream < 0:
            rows.append(f'<tr><td class="host" colspan="{len(order)}">host: {text}</td></tr>')
            continue
        cells = "".join(f'<td class="{line.mark}" id="entry-{line.first}">{text}</td>'
                        if stream == line.stream else "<td></td>" for stream in order)
        rows.append(f"<tr>{cells}</tr>")
    head = "".join(f"<th>{html.escape(race.stream_name(stream))}</th>" for stream in order)
    edge = race.missing_edge(found, trace)
    return (f"<h2>Streams of rank {rank}</h2>"
            f'<p class="note">{html.escape(found.why)}</p>'
            + (f'<p class="edge" id="missing-edge">{html.escape(edge)}</p>' if edge else "")
            + '<p class="note"><span class="first">orange</span>: the access that must come '
              'first; <span class="second">red</span>: the one not ordered after it</p>'
            f'<table class="streams" id="streams"><tr>{head}</tr>{"".join(rows)}</table>')


def _grids(observation) -> str:
    prepared = observation.prepared
    case = prepared.case
    owners = _requests_of(case)
    parts = [f'<p class="note">{html.escape(describe(case))}</p>', _legend(case, owners),
             "<h2>Input rows per rank, and the slot map beneath</h2>"]
    for rank in range(prepared.size):
        rows = "".join(_row_cell(int(v), owners) for v in prepared.tokens[rank])
        parts.append(f'<table class="grid rank"><tr><th>rank {rank} rows</th>{rows}</tr>'
                     f'<tr><th>slot map (nd={prepared.nds[rank]})</th>'
                     f"{_slot_cells(prepared.slot_maps[rank])}</tr></table>")
    parts.append("<h2>What each rank returned</h2>")
    for rank, view in enumerate(observation.ranks):
        if view.error:
            returned = f'<td class="none">error: {html.escape(view.error)}</td>'
            slots = ""
        elif not view.returned:
            returned, slots = '<td class="none">no output: the call did not complete</td>', ""
        else:
            returned = "".join(_row_cell(v, owners) for v in view.rows[0]) or '<td class="none">no rows</td>'
            slots = _slot_cells(view.slots)
        parts.append(f'<table class="grid rank"><tr><th>rank {rank} rows</th>{returned}</tr>'
                     f"<tr><th>slots</th>{slots}</tr></table>")
        if view.trace:
            parts.append('<p class="note">collectives: ' + html.escape(
                "; ".join(" ".join(map(str, e)) for e in view.trace)) + "</p>")
    parts.append("<h2>Each rank's cache after the kernel (slot:row)</h2>")
    for rank in range(prepared.size):
        parts.append(f'<table class="grid rank"><tr><th>rank {rank} cache</th>'
                     f"{_cache_row(observation, rank, owners)}</tr></table>")
    return "".join(parts)


def lines_page(result) -> str:
    """A release's path files (result.release.lines), each line of their functions marked: run
    on a traced step, or on none."""
    record = result.release
    source = from_spec({"kind": record.kind, "location": record.location,
                        "release": record.release})
    hashes = dict(record.files)
    body = ['<div class="banner" style="background: #2e7d32">Lines run '
            f"<small>{html.escape(result.target_name)}</small></div>",
            '<p class="note"><span class="run">+ green</span>: a line of a function that a traced '
            'step ran; <span class="notrun">x red</span>: a line of a function that no traced step '
            "ran; unmarked: outside every function's body (it runs at import) or not a statement"
            "</p>",
            f'<p class="note">lines run: {html.escape(lines_traced(record))}</p>',
            *_changed_notes(result), _lines_table(record.lines, "")]
    changed = {entry.file: {line.line: reach for line, reach in entry.lines}
               for entry in record.changed() if entry.where == PATH}
    for number, entry in enumerate(record.lines, 1):
        body.append(f'<h2 id="file-{number}">{html.escape(entry.file)} <small>'
                    f"{len(entry.run)}/{len(entry.functions)} lines run</small></h2>")
        try:
            text = source.read(entry.file)
            why = "" if source.hashes[entry.file] == hashes.get(entry.file) else (
                f"{entry.file} changed since the run read it")
        except SourceError as exc:
            why = str(exc)
        if why:  # never marks on a text other than the one that ran
            body.append(f'<p class="note">source not shown: {html.escape(why)}; lines run: '
                        f'{", ".join(map(str, entry.run)) or "none"}</p>')
            continue
        body.append(_source_table(number, text, set(entry.run), set(entry.functions),
                                  changed.get(entry.file, {})))
    return _page(f"pcpcheck: lines run, {result.target_name}", "".join(body))


def _changed_notes(result) -> list[str]:
    """--changed-against on the lines page: what its marks say, and the changed files it does
    not show (the text report's words, pcpcheck.render.changed_lines)."""
    changes = result.release.changes
    if changes is None:
        return []
    return [f'<p class="note" id="changed">Changed against {html.escape(changes.against)} '
            f"({html.escape(changes.base)}): every changed line has a "
            '<span class="changed">blue edge</span>; <span class="unexercised">! orange</span>: '
            "a changed line of a function that no step ran (not exercised), "
            f"{html.escape(no_step_ran(result.release))}; tried: {html.escape(tried(result))}; "
            "a changed line unmarked otherwise is no statement or outside every function's "
            "body (no claim)</p>",
            *(f'<p class="note">{html.escape(line)}</p>' for line in elsewhere(result.release))]


def _lines_table(lines, page: str) -> str:
    """Each real file of the path, its lines run, linked to its source on the lines `page`."""
    rows = "".join(f'<tr><th><a href="{html.escape(page)}#file-{number}">'
                   f"{html.escape(entry.file)}</a></th>"
                   f"<td>{len(entry.run)}/{len(entry.functions)}</td></tr>"
                   for number, entry in enumerate(lines, 1))
    return (f'<table class="grid verdict" id="lines-run"><tr><th></th><th>lines run</th></tr>'
            f"{rows}</table>")


def _source_table(number: int, text: str, run: set[int], functions: set[int],
                  changed: dict[int, str] | None = None) -> str:
    """A file's lines, marked; a stretch of FOLDED_LINES or more without a line of a function
    or a changed line (`changed`: line -> its reach) (imports, module constants, a docstring)
    folded away, a click opens it."""
    rows: list[tuple[str, int]] = []  # (a row, its first line)
    unmarked: list[tuple[str, int]] = []

    def fold() -> None:
        if len(unmarked) < FOLDED_LINES:
            rows.extend(unmarked)
        else:
            first, last = unmarked[0][1], unmarked[-1][1]
            rows.append(("<tr><td colspan=\"3\"><details><summary>lines "
                         f"{first}-{last}: outside every function</summary><table "
                         f'class="source">{"".join(row for row, _ in unmarked)}</table>'
                         "</details></td></tr>", first))
        unmarked.clear()

    for line, code in enumerate(text.splitlines(), 1):
        kind, mark = (("run", "+") if line in run else ("notrun", "x") if line in functions
                      else ("", ""))
        if changed and line in changed:
            kind, mark = _CHANGED_ROW[changed[line]]
        row = (f'<tr class="{kind}"><td class="n">{line}</td><td class="mark">{mark}</td>'
               f"<td>{html.escape(code)}</td></tr>", line)
        if kind:
            fold()
            rows.append(row)
        else:
            unmarked.append(row)
    fold()
    return (f'<table class="source" id="source-{number}">{"".join(row for row, _ in rows)}'
            "</table>")


def index_page(result, pages: list[tuple[str, Counterexample]],
               lines_page_name: str | None = None) -> str:
    """The index: the verdict, a link per counterexample page, the verdict and coverage tables,
    and a release's lines run per path file, linked to its place on `lines_page_name`."""
    verdict = "holds" if result.holds else "VIOLATED"
    body = [f'<div class="banner" style="background: {"#2e7d32" if result.holds else BANNER}">'
            f"pcpcheck: {verdict} <small>{html.escape(result.target_name)}</small></div>",
            f'<p class="note">pcpcheck {html.escape(result.version)}, target '
            f"{html.escape(result.target)}</p>"]
    if pages:
        body.append("<h2>Counterexamples</h2><ul>")
        for filename, c in pages:
            known = " (known, baselined)" if c.known else ""
            body.append(f'<li><a href="{html.escape(filename)}">{c.invariant}</a> on rank(s) '
                        f"{list(c.ranks)}, regime {html.escape(c.regime)}{known}</li>")
        body.append("</ul>")
    header = "".join(f"<th>{html.escape(s.regime)}</th>" for s in result.regimes)
    ids = checked_ids(result)
    marks, notes = not_applicable_notes(result, ids)
    rows = []
    for invariant in ids:
        cells = []
        for summary in result.regimes:
            count = summary.count(invariant)
            cells.append(_verdict_cell(result, summary.regime, invariant, count,
                                       marks.get((summary.regime, invariant))))
        rows.append(f"<tr><th>{invariant}</th>{''.join(cells)}</tr>")
    cases = "".join(f"<td>{s.cases}</td>" for s in result.regimes)
    body.append(f'<h2>Verdict per regime</h2><table class="grid verdict" id="verdict">'
                f"<tr><th></th>{header}</tr><tr><th>cases</th>{cases}</tr>{''.join(rows)}</table>")
    body += [f'<p class="note" id="note-{number}">{html.escape(note)}</p>'
             for number, note in enumerate(notes, 1)]
    if any(s.violated for s in result.regimes):  # what the colours of its FAIL cells say
        body.append('<p class="note"><span class="fail">red</span>: a violation that fails the run; '
                    '<span class="known">amber</span>: a known one, listed in the baseline</p>')
    covered, coverage = coverage_rows(result.regimes)
    if covered:  # what the cases exercised, 0 where none did, n/a where none could (the report's)
        lines = "".join(f"<tr><th>{html.escape(name)}</th>"
                        + "".join(f"<td>{text}</td>" for text in cells) + "</tr>"
                        for name, cells in coverage)
        head = "".join(f"<th>{html.escape(s.regime)}</th>" for s in covered)
        body.append(f'<h2>Coverage (cases)</h2><table class="grid"><tr><th></th>{head}</tr>'
                    f"{lines}</table>")
    if lines_page_name is not None:
        body.append("<h2>Lines run (the path's files)</h2>"
                    + _lines_table(result.release.lines, lines_page_name))
    return _page(f"pcpcheck: {result.target_name}", "".join(body))


def _verdict_cell(result, regime: str, invariant: str, count, note: int | None) -> str:
    """One cell of the index's verdict table, the terminal's text, marked by its outcome
    (CheckResult.outcome): a new violation red, a known one amber, n/a grey with a link to the
    footnote giving its reason."""
    state, _ = result.outcome(regime, invariant)
    text = cell(count.checked, count.violated)
    if state == "failed":
        return f'<td class="fail" title="violated: fails the run">{text}</td>'
    if state == "known":
        return (f'<td class="known" title="known violation, listed in '
                f'{html.escape(result.baseline.path)}">{text}</td>')
    if state == "n/a":
        link = "" if note is None else f' <a href="#note-{note}">[{note}]</a>'
        return f'<td class="na">{text}{link}</td>'
    return f"<td>{text}</td>"


def html_page(path: str) -> bool:
    """`--html NAME.html` names the index page itself, the other pages beside it; any other
    path is the directory of them all."""
    return path.lower().endswith(".html")


def write_html(path: str, result) -> list[str]:
    """Write one page per counterexample, a release's lines page (lines_page) and the index
    page; return their paths, the index's first. `path`: a directory (made if need be) for
    index.html and the pages, or the index page itself, NAME.html (html_page), with the pages
    beside it named NAME-counterexample-..., NAME-lines.html (two indexes in one folder keep
    their own pages). A TreeDiffResult: its one page (write_tree_diff_html)."""
    if isinstance(result, TreeDiffResult):
        return write_tree_diff_html(path, result)
    if html_page(path):
        directory, index_name = os.path.split(path)
        prefix = os.path.splitext(index_name)[0] + "-"
    else:
        directory, index_name, prefix = path, "index.html", ""
        os.makedirs(directory, exist_ok=True)
    pages, paths = [], []
    for number, counterexample in enumerate(result.counterexamples, 1):
        filename = (f"{prefix}counterexample-{number}-{counterexample.invariant}-"
                    f"{counterexample.regime}.html")
        page = os.path.join(directory, filename)
        with open(page, "w", encoding="utf-8") as handle:
            handle.write(counterexample_page(counterexample, result.target))
        pages.append((filename, counterexample))
        paths.append(page)
    lines_name = None
    if result.release is not None and result.release.lines:
        lines_name = f"{prefix}lines.html"
        paths.append(os.path.join(directory, lines_name))
        with open(paths[-1], "w", encoding="utf-8") as handle:
            handle.write(lines_page(result))
    index = os.path.join(directory, index_name)
    with open(index, "w", encoding="utf-8") as handle:
        handle.write(index_page(result, pages, lines_name))
    return [index, *paths]


# --- a tree diff (`pcpcheck diff OLD NEW` for two vLLM trees) ---------------------------------------

DIFFERENT_BANNER = "#e07000"  # the banner of a tree diff whose paths differ, both sides holding
_TREE_BANNERS = {"same": ("no difference", "#2e7d32"),
                 "different": ("DIFFERENT", DIFFERENT_BANNER), "violated": ("VIOLATED", BANNER)}


def tree_diff_page(result) -> str:
    """A TreeDiffResult's page: the verdict, a row per regime, and each differing step's first
    differing stage with both sides' values side by side, rank by rank."""
    word, colour = _TREE_BANNERS[result.verdict]
    old, new = f"vLLM {result.old_release}", f"vLLM {result.new_release}"
    body = [f'<div class="banner" id="verdict" style="background: {colour}">{word} '
            f"<small>old {html.escape(old)}, new {html.escape(new)}</small></div>",
            f'<p class="note">old = {html.escape(old)} ({html.escape(result.old)})<br>'
            f"new = {html.escape(new)} ({html.escape(result.new)})<br>pcpcheck "
            f"{html.escape(result.version)}, exit {result.exit_code}</p>"]
    rows = []
    for regime in result.regimes:
        if regime.not_applicable:
            rows.append(f'<tr><th>{html.escape(regime.regime)}</th><td class="na" colspan="4">'
                        f"not applicable: {html.escape(regime.not_applicable)}</td></tr>")
            continue
        first = ", ".join(f"{stage} ({steps})" for stage, steps in regime.first_stages) or "-"
        sides = html.escape(sides_text(regime))
        marked = ' class="fail"' if regime.violated else ""
        rows.append(f"<tr><th>{html.escape(regime.regime)}</th><td>{regime.steps}</td>"
                    f"<td>{regime.differing}</td><td>{html.escape(first)}</td>"
                    f"<td{marked}>{sides}</td></tr>")
    body.append('<h2>Per regime</h2><table class="grid verdict" id="regimes"><tr><th></th>'
                "<th>steps</th><th>differ</th><th>first differing stage</th><th>invariants</th>"
                f"</tr>{''.join(rows)}</table>")
    for regime in result.regimes:
        for number, step in enumerate(regime.differences, 1):
            body.append(_differing_step(regime.regime, number, step))
        for violation in regime.violations:
            also = (f" (the other side violates {', '.join(violation.other_violations)} too)"
                    if violation.other_violations else "")
            body.append(f"<h2>{html.escape(regime.regime)}: {violation.side} violates "
                        f"{violation.invariant} where the paths agree{html.escape(also)}</h2>"
                        f"<pre>{html.escape(violation.report)}</pre>")
    return _page(f"pcpcheck diff: {old} vs {new}", "".join(body))


def _differing_step(regime: str, number: int, step) -> str:
    """One differing step: its batch, each side's verdict, the stage side by side."""
    def verdict(violated) -> str:
        if not violated:
            return "holds every invariant"
        return f'<span class="fail">violates {html.escape(", ".join(violated))}</span>'

    cells = "".join(f"<tr><th>rank {rank.rank}</th><td>{html.escape(rank.old)}</td>"
                    f"<td>{html.escape(rank.new)}</td></tr>" for rank in step.ranks)
    parts = [f'<h2 id="difference-{html.escape(regime)}-{number}">{html.escape(regime)}: first '
             f"difference at {html.escape(step.stage)}</h2>",
             f'<p class="note">{html.escape(step.batch)}<br>old {verdict(step.old_violations)}; '
             f"new {verdict(step.new_violations)}</p>",
             f'<table class="grid verdict sides" style="font-family: monospace"><tr><th></th>'
             f"<th>old</th><th>new</th></tr>{cells}</table>",
             f"<pre>{html.escape(step.report)}</pre>"]
    for side, report in (("old", step.old_report), ("new", step.new_report)):
        if report:
            parts.append(f"<p class=\"note\">{side}'s violation on this step:</p>"
                         f"<pre>{html.escape(report)}</pre>")
    return "".join(parts)


def write_tree_diff_html(path: str, result) -> list[str]:
    """A TreeDiffResult's page: `path` a directory (index.html in it) or the page itself."""
    if html_page(path):
        index = path
    else:
        os.makedirs(path, exist_ok=True)
        index = os.path.join(path, "index.html")
    with open(index, "w", encoding="utf-8") as handle:
        handle.write(tree_diff_page(result))
    return [index]
