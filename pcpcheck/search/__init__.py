"""The search, in the driver: cases drawn (or every step of a scope enumerated) per regime,
streamed through the judge (pcpcheck.judge.run), violations shrunk and replayed.

- engine.py: the random search, generate then shrink (hypothesis);
- exhaustive.py: every step within a scope (scope.py), smallest first;
- draw.py: drawing a case from choices, and checking one given from outside;
- reduce.py: greedy reductions; minimize.py: what follows a counterexample (scan, replay);
- jobs.py: regimes searched by several driver processes (--jobs);
- release_search.py: a vLLM release's search, in its own batch order;
- step_replay.py: steps recorded from a live vLLM replayed and compared (--steps).
"""
