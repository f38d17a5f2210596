"""The worker side: the only code that imports and calls a target (or a vLLM release's code),
in processes forked by the driver's fork server. It holds neither the judge nor the driver's
transport (tests/test_layers.py): what it sends back is plain data (pcpcheck.shared.messages).

- main.py: the worker process (loading, cases, the status and capture files);
- runner.py: P ranks as greenlets, with a real all_gather between them;
- process_group.py: the group a rank sees on a real process group (gloo, nccl, torchrun);
- rankctx.py: which group the calling rank belongs to;
- loader.py, standins.py: a target loaded without vLLM installed.
"""
