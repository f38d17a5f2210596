"""Hypothesis profiles: `ci` (deterministic, what CI runs), `dev` (quick, random), `thorough`.

Picked by HYPOTHESIS_PROFILE; under CI=true the default is `ci`, else `dev`.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=200,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=30,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", deadline=None, max_examples=2000,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def runner():
    """One thread runner for the session: rank threads stay alive across cases."""
    from pcpcheck.runner import ThreadRunner

    return ThreadRunner(timeout=20.0)
