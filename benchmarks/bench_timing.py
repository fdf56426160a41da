"""Timing helpers the benchmark scripts share: every timed call is preceded by an untimed one (numba's cache load
or compile, lazy imports, solver and CUDA start-up are not timed, so no row is partly cold)."""
from __future__ import annotations

import time


def warm_timed(fn, warm=None):
    """``(fn(), seconds)`` of one call after one untimed call of ``warm`` (default ``fn``).  Where ``fn`` would hit a
    cache the untimed call filled (a plan's ``select`` memoises its tuples), ``warm`` makes the same call on a fresh
    object."""
    (warm or fn)()
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def repeated_times(calls: dict, repeat: int) -> dict:
    """``{name: [seconds] × repeat}``: every call of ``calls`` once untimed, then ``repeat`` rounds calling each in
    turn (interleaved, so a slow spell of a shared machine hits every call alike)."""
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times
