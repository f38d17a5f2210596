"""Every error pcpcheck raises to its caller; str(error) is one line for the user.

The command line exits 2 on each of ERRORS and says what it is in words (`pcpcheck.faces.cli`),
never with the class name. Both sides raise them: a worker reports a load failure by kind, and the
driver raises the same class (pcpcheck.shared.protocol.target_info). A failure of pcpcheck itself
(CheckerError, or any other exception out of the judge, the search or a report) is no verdict:
the command exits 3 with `internal_error_line`.
"""


class UsageError(ValueError):
    """Bad options or a malformed case given from outside."""


class LoadError(Exception):
    """A target could not be loaded."""


class SourceError(LoadError):
    """A vLLM SOURCE (release, wheel, checkout) cannot be resolved or read."""


class InterfaceDrift(LoadError):
    """A vLLM release lacks (or renamed) an internal pcpcheck drives."""


class WorkerError(Exception):
    """Worker processes could not start (not the target's doing: no target is loaded yet)."""


class CheckerError(Exception):
    """pcpcheck itself failed (not the target): a bug to report, never a verdict."""


# What the command line says before each message (the most specific class first): the errors of
# what pcpcheck was given (exit 2).
WHAT = ((UsageError, "usage error"), (SourceError, "cannot read the vLLM source"),
        (InterfaceDrift, "cannot drive this vLLM release"), (LoadError, "cannot load target"),
        (WorkerError, "rank processes failed"))
ERRORS = tuple(kind for kind, _ in WHAT)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def error_line(exc: Exception) -> str:
    """One of ERRORS as one line of words: "usage error: ...", "cannot load target: ..."."""
    what = next(text for kind, text in WHAT if isinstance(exc, kind))
    return f"{what}: {_first_line(exc)}"


def internal_error_line(exc: BaseException) -> str:
    """A failure of pcpcheck itself as one line: it says whose fault it is (never the target's,
    never a verdict) and what failed."""
    detail = _first_line(exc) if isinstance(exc, CheckerError) else (
        f"{type(exc).__name__}: {_first_line(exc)}")
    return (f"internal error, a fault of pcpcheck and not of the target (no verdict): {detail} "
            "(--traceback shows where; please report it)")
