"""What both sides of a process boundary import: the driver (search, judge, API) and the worker
(where a target runs). Data and its encoding only, never a verdict:

- errors.py: every error pcpcheck raises to its caller (one line each);
- case.py: a case as data (the step, its tensors, the content of their rows) and its JSON;
- messages.py: what crosses to a worker and back (targets, cases, each rank's raw outputs);
- wire.py: the bytes of a message, and tensors read as plain data.
"""
