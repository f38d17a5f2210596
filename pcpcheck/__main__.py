from pcpcheck.cli import command

raise SystemExit(command())
