"""`--html DIR` (or `--html NAME.html`): a self-contained page per counterexample (inline CSS,
no script, no external asset) and an index page linking them.

A page shows, for the shrunk case: each rank's input rows as a grid, coloured by request (hue)
and by kind (prefill solid, decode light with a bar, padding hatched grey); the slot map beneath
each rank's rows; what each rank returned; and each rank's cache after the kernel, with wrong,
missing and unexpected slots highlighted. The invariant ID heads the page in a red banner.
"""

from __future__ import annotations

import html
import os

from pcpcheck.judge import race
from pcpcheck.judge.explain import label
from pcpcheck.render.report import cell, checked_ids, coverage_rows, not_applicable_notes
from pcpcheck.shared.case import describe
from pcpcheck.shared.results import Counterexample

BANNER = "#c8102e"  # the violated invariant's banner: tests look for this colour in a screenshot
KNOWN = "#f5b041"  # a known (baselined) violation's cell in the index's verdict table

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


def index_page(result, pages: list[tuple[str, Counterexample]]) -> str:
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
    """Write one page per counterexample and the index page; return their paths, the index's
    first. `path`: a directory (made if need be) for index.html and the pages, or the index page
    itself, NAME.html (html_page), with the pages beside it named NAME-counterexample-...
    (two indexes in one folder keep their own pages)."""
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
    index = os.path.join(directory, index_name)
    with open(index, "w", encoding="utf-8") as handle:
        handle.write(index_page(result, pages))
    return [index, *paths]
