"""Shared settings of the test suite: hypothesis profiles and the accepting G-test registry's check."""
import os

import pytest
from hypothesis import HealthCheck, settings

from .stats import ACCEPTING, accepting_calls, registry_key

#: Hypothesis profiles: examples per property.  ``standard`` is the default run, ``slow`` the long one
#: (``HYPOTHESIS_PROFILE=slow``; ≥ 200 examples per lossless property), ``dev`` a quick local one.  Under CI
#: (``CI=true``) the selected profile's derandomised twin ``<name>-ci`` is loaded: fixed examples, so a CI run
#: is reproducible.
PROFILES = {"standard": 25, "slow": 200, "dev": 10}
for _name, _examples in PROFILES.items():
    settings.register_profile(_name, max_examples=_examples, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile(f"{_name}-ci", settings.get_profile(_name), derandomize=True)


def hypothesis_profile(environ) -> str:
    """The profile a run with environment ``environ`` loads."""
    name = environ.get("HYPOTHESIS_PROFILE", "standard")
    return f"{name}-ci" if environ.get("CI", "").lower() == "true" and not name.endswith("-ci") else name


settings.load_profile(hypothesis_profile(os.environ))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A registered accepting test that passed without running exactly one accepting G-test fails."""
    outcome = yield
    report = outcome.get_result()
    if (report.when == "call" and report.passed and registry_key(item.nodeid) in ACCEPTING
            and accepting_calls(item.nodeid) != 1):
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} is registered in tests.stats.ACCEPTING but ran "
                           f"{accepting_calls(item.nodeid)} accepting G-tests (expected 1)")
