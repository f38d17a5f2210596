"""The judge, in the driver: where a verdict is made. A case is prepared here, run on a backend's
workers, observed from their plain-data reports and judged by the spec's predicates; the worker
never judges.

- run.py: the one path of a case (prepare -> run -> observe -> judge);
- prepare.py: every rank's inputs and expected cache, from the reference;
- observe.py: one rank's report at the index level (rows decoded to labels, caches written by
  the spec's kernel rule);
- verdict.py: the registry's predicates on an observation;
- release_case.py: a vLLM release's case (its ranks' layouts against the reference: LAYOUT);
- coverage.py: the branches and layout features a case exercised;
- compare.py: `pcpcheck diff`'s finding; baseline.py: known violations;
- explain.py: a judged case in words (the counterexample report).
"""
