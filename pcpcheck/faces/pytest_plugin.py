"""pcpcheck's pytest plugin (entry point `pytest11`), for a host suite that checks its gather or
a whole vLLM PCP path.

    pytest --pcp-target path/to/pcp.py [--pcp-target mypkg.pcp:gather] [--pcp-regime sharded]
    python -m pytest --pcp-only --pcp-vllm .        # in a vLLM checkout: its whole PCP path
    python -m pytest --pcp-only --pcp-target vllm/v1/attention/ops/pcp.py   # its gather alone

Each target becomes one test item per regime x invariant (`REPLICA[draft-mixed]`): it passes,
fails with the counterexample as its message, is skipped where the invariant does not apply, or
xfails when `--pcp-baseline` lists it. The check of a target runs once, on its first item. A
`--pcp-vllm` source (a checkout, a wheel, a release: what `pcpcheck vllm` takes) is judged as
`pcpcheck vllm` judges it, so its items include LAYOUT, the manager's layout.
`--pcp-changed-against BASE` lists, after the run, which lines each `--pcp-vllm` source changes
against BASE and which of them no step ran, in the terminal summary and, where
`$GITHUB_STEP_SUMMARY` is set, in GitHub's job summary (information: no item fails for it).

The `pcpcheck` fixture runs `pcpcheck.check` for a custom test:

    def test_my_gather(pcpcheck):
        result = pcpcheck("mypkg.pcp:gather", regimes=("sharded",))
        assert result.holds, [c.report for c in result.new_violations]

`--pcp-only` runs pcpcheck's items alone, whatever the directory's own pytest set-up: no
`conftest.py` is loaded, no test file collected, and the `addopts` of its pytest configuration
are dropped (a vLLM checkout's test files need GPU packages, and its settings are for its suite).

Both take the host suite's hypothesis profile (max_examples, derandomize) and its
`--hypothesis-seed`. Without --pcp-target or --pcp-vllm the plugin adds only its options and the
fixture: pcpcheck is not even imported. Nothing outlives a check: its rank threads or processes
end with it.
"""

from __future__ import annotations

import os
import random
from typing import cast

import pytest


def pytest_addoption(parser) -> None:
    group = parser.getgroup("pcpcheck", "pcpcheck: check a vLLM PCP KV-cache gather")
    group.addoption("--pcp-target", action="append", default=[], metavar="TARGET",
                    help="a pcp.py file, module:function or impl to check (repeatable)")
    group.addoption("--pcp-vllm", action="append", default=[], metavar="SOURCE",
                    help="a vLLM checkout ('.'), wheel or release whose whole PCP path to check, "
                         "as `pcpcheck vllm SOURCE` (repeatable)")
    group.addoption("--pcp-regime", action="append", default=[], metavar="REGIME",
                    help="regime to check, repeatable (default: all)")
    group.addoption("--pcp-max-examples", type=int, metavar="N",
                    help="cases per regime (default: the hypothesis profile's max_examples)")
    group.addoption("--pcp-budget", type=float, metavar="SECONDS",
                    help="wall-clock limit per target across regimes")
    group.addoption("--pcp-baseline", metavar="FILE",
                    help="known violations, one 'REGIME INVARIANT' per line: they xfail")
    group.addoption("--pcp-function", metavar="NAME", help="the gather's name in each target")
    group.addoption("--pcp-only", action="store_true",
                    help="run pcpcheck's items alone: no conftest.py, no test file, no ini addopts")
    group.addoption("--pcp-changed-against", metavar="BASE",
                    help="with --pcp-vllm: list the lines each source changes against BASE (a git "
                         "revision of the checkout, or a second tree) and which of them ran, as "
                         "`pcpcheck vllm --changed-against`: in the terminal summary, and "
                         "appended to $GITHUB_STEP_SUMMARY where it is set")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook loads the initial conftest.py files
def pytest_load_initial_conftests(early_config, args: list[str]) -> None:
    if not early_config.known_args_namespace.pcp_only:
        return
    early_config.known_args_namespace.noconftest = True
    # the ini's addopts stand first in args, the one list pytest parses the options from next
    addopts = early_config.getini("addopts")
    if addopts and args[:len(addopts)] == addopts:
        del args[:len(addopts)]


def pytest_ignore_collect(collection_path, config) -> bool | None:
    return True if config.getoption("pcp_only") else None


def _host_options(config) -> dict:
    """max_examples and seed as the host suite's hypothesis settings say."""
    from hypothesis import settings
    profile = cast(settings, settings.default)  # None only while hypothesis is importing
    seed = config.getoption("hypothesis_seed", default=None)
    if seed is not None:
        seed = int(seed)
    elif not profile.derandomize:  # a random run, reported with its seed so it can be repeated
        seed = random.getrandbits(32)
    max_examples = config.getoption("pcp_max_examples") or profile.max_examples
    return {"max_examples": max_examples, "seed": seed}


@pytest.fixture
def pcpcheck(request):
    """`pcpcheck(target, **options) -> CheckResult`, with the host's hypothesis settings."""
    from pcpcheck.api import check

    def run(target, **options):
        return check(target, **{**_host_options(request.config), **options})

    return run


@pytest.hookimpl(tryfirst=True)  # before -k / -m deselect, so they apply to these items too
def pytest_collection_modifyitems(session, config, items) -> None:
    sources = [(TargetCollector, "pcpcheck", target)
               for target in dict.fromkeys(config.getoption("pcp_target"))]
    sources += [(ReleaseCollector, "pcpcheck-vllm", source)
                for source in dict.fromkeys(config.getoption("pcp_vllm"))]
    names: set[str] = set()
    for kind, prefix, target in sources:
        # no "/" or "[" in a node id (pytest reads a path, JUnit a parameter into them): the
        # file or folder name ("." as the folder's own), made unique
        stripped = target.rstrip("/\\")
        label = os.path.basename(os.path.abspath(stripped) if stripped in ("", ".") else stripped) \
            or target
        name, index = f"{prefix}:{label}", 1
        while name in names:
            index += 1
            name = f"{prefix}:{label}-{index}"
        names.add(name)
        # collected as pytest collects a file: its report counts the items (the terminal's
        # "collected N items", JUnit, xdist) and a failure to collect is reported, not raised
        collector = kind.from_parent(session, name=name, nodeid=name, target=target)
        config.stash.setdefault(_COLLECTORS, []).append(collector)
        report = collector.ihook.pytest_make_collect_report(collector=collector)
        collector.ihook.pytest_collectreport(report=report)
        items.extend(node for node in report.result if isinstance(node, pytest.Item))


_COLLECTORS = pytest.StashKey[list]()  # every target's collector, for the terminal summary


def pytest_terminal_summary(terminalreporter, config) -> None:
    """--pcp-changed-against: each checked source's changed lines, which ran and which no step
    did (pcpcheck.render.changed_lines), never a verdict: the items hold those."""
    results = [collector._result for collector in config.stash.get(_COLLECTORS, [])
               if collector._result is not None and collector._result.release is not None
               and collector._result.release.changes is not None]
    if not results:
        return
    from pcpcheck.render.changed_lines import changed_markdown, changed_text
    for result in results:
        terminalreporter.write_sep("=", f"pcpcheck: changed lines of {result.target}")
        for line in changed_text(result)[1:]:  # its section's leading blank line dropped
            terminalreporter.write_line(line)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # GitHub's job summary, as the Action's `pcpcheck vllm --summary` fills it
        with open(summary, "a", encoding="utf-8") as handle:
            for result in results:
                handle.write(f"### pcpcheck: {result.target_name}\n"
                             + "\n".join(changed_markdown(result)) + "\n")


class CheckFailed(Exception):
    """A regime x invariant item's failure: the message is the counterexample report."""


class TargetCollector(pytest.Collector):
    """One target: its items, and the check they share (run once, on first use)."""

    def __init__(self, *, target: str, **kwargs):
        super().__init__(**kwargs)
        self.target = target
        self._result = None
        self._error: str | None = None

    def ids(self) -> tuple[str, ...]:
        from pcpcheck_spec.registry import GATHER_IDS
        return GATHER_IDS

    def collect(self):
        from pcpcheck_spec.names import DEFAULT_REGIMES
        regimes = tuple(dict.fromkeys(self.config.getoption("pcp_regime"))) or DEFAULT_REGIMES
        for regime in regimes:
            for invariant in self.ids():
                yield CheckItem.from_parent(self, name=f"{invariant}[{regime}]",
                                            regime=regime, invariant=invariant)

    def check(self, **options):
        from pcpcheck.api import check
        return check(self.target, **options, function=self.config.getoption("pcp_function"))

    def result(self):
        if self._result is None and self._error is None:
            from pcpcheck.shared.errors import ERRORS, CheckerError, error_line, internal_error_line
            config = self.config
            regimes = tuple(dict.fromkeys(config.getoption("pcp_regime"))) or None
            try:
                self._result = self.check(**_host_options(config),
                                          **({"regimes": regimes} if regimes else {}),
                                          budget_s=config.getoption("pcp_budget"),
                                          baseline=config.getoption("pcp_baseline"))
            except ERRORS as exc:
                self._error = f"pcpcheck cannot check {self.target}: {error_line(exc)}"
            except CheckerError as exc:  # pcpcheck's own failure, named as such: no verdict
                self._error = f"pcpcheck cannot check {self.target}: {internal_error_line(exc)}"
        if self._error is not None:
            raise CheckFailed(self._error)
        return self._result


class ReleaseCollector(TargetCollector):
    """A vLLM tree, wheel or release: its whole PCP path, judged as `pcpcheck vllm` judges it."""

    def ids(self) -> tuple[str, ...]:
        from pcpcheck_spec.registry import RELEASE_IDS
        return RELEASE_IDS

    def check(self, **options):
        from pcpcheck.api import check_release
        return check_release(self.target, **options,
                             changed_against=self.config.getoption("pcp_changed_against"))


class CheckItem(pytest.Item):
    def __init__(self, *, regime: str, invariant: str, **kwargs):
        super().__init__(**kwargs)
        self.regime, self.invariant = regime, invariant

    def runtest(self) -> None:
        result = cast(TargetCollector, self.parent).result()  # it made this item
        state, counterexample = result.outcome(self.regime, self.invariant)
        if state in ("n/a", "known"):
            from pcpcheck.render.junit import skip_reason
            why = skip_reason(result, result.summary(self.regime), self.invariant, state)
            (pytest.skip if state == "n/a" else pytest.xfail)(why)
        if state == "failed":
            seed = "" if result.options.seed is None else \
                f" (seed {result.options.seed}: --hypothesis-seed={result.options.seed})"
            if counterexample is None:
                raise CheckFailed(f"{self.invariant} violated in regime {self.regime}{seed}")
            cited = "" if counterexample.invariant == self.invariant else \
                f"{self.invariant} violated only together with {counterexample.invariant}:\n"
            raise CheckFailed(f"{cited}{counterexample.report}{seed}")

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CheckFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"pcpcheck {self.parent.target} {self.invariant} [{self.regime}]"
