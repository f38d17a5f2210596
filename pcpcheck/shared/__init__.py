"""What both sides of a process boundary import: the driver (search, judge, API) and the worker
(where a target runs). Data and its encoding only, never a verdict:

- errors.py: every error pcpcheck raises to its caller (one line each);
- defaults.py: every option's default, in one place;
- case.py: a case as data (the step, its tensors, the content of their rows) and its JSON;
- protocol.py: every operation between the driver and a worker, its request and its reply;
- wire.py: the bytes of a message, and tensors read as plain data;
- results.py: what the API returns (a CheckResult and its JSON), and the exit codes;
- source.py: where a vLLM release's files come from; step_inputs.py: what a step hands its
  manager; recording.py: the schema of steps recorded from a live vLLM;
- lifetime.py: processes that die with their parent.
"""
