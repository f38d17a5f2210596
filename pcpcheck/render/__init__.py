"""The renderings of a result (pcpcheck.shared.results), as pytest's reporting plugins render
what the core hands them: they read a CheckResult and compute no verdict of their own.

- report.py: the text report the commands print; progress.py: what prints while a check runs;
- outputs.py: every file a command writes (--json, --junit, --summary, --html, --repro-dir),
  checked before the run and written after it; html.py, junit.py, summary.py, repro.py.
"""
