"""The faces: what a user runs. Each parses its arguments, calls the API (pcpcheck.api) and
renders what it returns (pcpcheck.render); none computes a verdict of its own.

- cli.py: the `pcpcheck` command's process (Ctrl-C, errors as one line, exit codes);
- commands.py: `pcpcheck check|diff|vllm` on parsed arguments, shared by the command and by
  torchrun's rank 0;
- options.py: the one argument parser (imports nothing heavy: --version and --help at once);
- pytest_plugin.py: an item per regime x invariant in a host suite;
- torchrun.py, torchrun_rank.py: `python -m pcpcheck.faces.torchrun` (torchrun's launcher,
  in-process) and every torchrun process's entry.
"""
