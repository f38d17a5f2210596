import sys

try:
    from pcpcheck.faces.cli import command
except KeyboardInterrupt:  # Ctrl-C in the few milliseconds before command() handles it
    print("pcpcheck: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(command())
