"""Every default of pcpcheck's options, stated once: the API's keyword defaults, the command
line's (pcpcheck.faces.options) and the backends' read them from here."""

DEFAULT_MAX_EXAMPLES = 3000  # cases per regime of `pcpcheck check` and `diff`
DEFAULT_RELEASE_EXAMPLES = 1000  # steps per regime of `pcpcheck vllm` (each runs a release's manager)
DEFAULT_TIMEOUT = 10.0  # seconds a rank may take for one case before it counts as hung
DEFAULT_BACKEND = "threads"
DEFAULT_DEVICE = "cpu"
MIN_RANKS, MAX_RANKS = 2, 8  # the PCP sizes P drawn and hosted (a worker's status file holds 8)
DEFAULT_MAX_RANKS = MAX_RANKS
