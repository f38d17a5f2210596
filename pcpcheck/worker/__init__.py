"""The worker side: the only code that imports and calls a target (or a vLLM release's code),
in processes forked by the driver's fork server. It holds neither the judge nor the driver's
transport (tests/test_layers.py): what it sends back is plain data (pcpcheck.shared.protocol).

- main.py: the worker process (its messages, the status and capture files);
- hosts.py: what it executes: a gather target's ranks (greenlets or one rank of a process
  group) and a vLLM release's steps;
- runner.py: P ranks as greenlets, with a real all_gather between them;
- process_group.py: the group a rank sees on a real process group (gloo, nccl, torchrun);
- rankctx.py: which group the calling rank belongs to;
- loader.py, standins.py: a target loaded without vLLM installed;
- release_code.py (a release's PCP path loaded, its capabilities, its manager laid out),
  release_step.py (one rank's step), release_batch.py (its partition_batch: a rank's local
  batch), release_kernels.py (its block tables and slot kernel under
  triton's interpreter), release_interpreter.py (that interpreter made cheaper, computing what
  triton's own computes), release_excerpts.py (single functions cut from modules too big to load),
  release_paths.py (the path table: which stage ran the release's own code).
"""
