"""`pcpcheck check` under torchrun: `python -m pcpcheck.torchrun [torchrun options] -- ARGS`
(the launcher, __main__.py) starts `pcpcheck.torchrun.rank` on every rank (rank.py): each parses
the check's arguments; rank 0 runs the check through the API on every rank (the transport is
pcpcheck.backends.torchrun) and alone prints; the other ranks serve it."""
