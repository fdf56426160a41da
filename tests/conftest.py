"""Shared settings of the test suite."""
import os

from hypothesis import HealthCheck, settings

#: Suite-wide false-alarm budget of each goodness-of-fit test (Standards: ≤ 1e-3).
TEST_FAILURE_RATE = 1e-3

settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=10, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
