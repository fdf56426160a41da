"""The tie-break table shared by HiGHS' and the compiled simplex's LPs, under concurrent growth."""
import threading
import types

import numpy as np

from solvers import tie_break


def test_prime_roots_is_exact_and_read_only():
    """``frac(√P_i)`` of the first primes, one table grown as needed and never written."""
    primes = np.array([2, 3, 5, 7, 11, 13, 17, 19, 23, 29], dtype=np.float64)
    first = tie_break.prime_roots(10)
    assert np.array_equal(first, np.sqrt(primes) - np.floor(np.sqrt(primes))) and not first.flags.writeable
    assert np.array_equal(tie_break.prime_roots(5000)[:10], first) and tie_break.prime_roots(5000).size == 5000


def test_two_threads_growing_the_table_each_get_their_count(monkeypatch):
    """Thread A (81 roots, a k = 3 node) and B (1 024, the slot rule at k = 4) both find the table empty; A's
    smaller table stored between B's store and B's return gave B 128 roots, and the slot rule "cannot reshape
    array of size 128".  Forced here by pausing the threads (A mid-build until B has stored, B after its store
    until A has stored), each pause given up after a second: the table is now grown under a lock and each call
    returns the table it read."""
    b_stored, a_stored = threading.Event(), threading.Event()

    class Stored(np.ndarray):
        def setflags(self, *a, **k):                  # right after a thread's table is formed
            super().setflags(*a, **k)
            if threading.current_thread().name == "B":
                b_stored.set()
                a_stored.wait(1)
            else:
                a_stored.set()

    def sqrt(x):
        if threading.current_thread().name == "A":
            b_stored.wait(1)
        return np.sqrt(x)
    paused = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    paused.floor, paused.sqrt = (lambda x: np.floor(x).view(Stored)), sqrt
    monkeypatch.setattr(tie_break, "np", paused)
    monkeypatch.setattr(tie_break, "_roots", np.zeros(0))
    sizes = {}
    threads = [threading.Thread(target=lambda n=n, c=c: sizes.update({n: tie_break.prime_roots(c).size}), name=n)
               for n, c in (("A", 81), ("B", 1024))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes == {"A": 81, "B": 1024}, sizes


class Builds:
    """Counts the table's builds (one ``np.sqrt`` each) and holds thread A's build until ``release`` is set (or a
    second has passed)."""

    def __init__(self, monkeypatch):
        self.count, self.release = 0, threading.Event()

        def sqrt(x):
            self.count += 1
            if threading.current_thread().name == "A":
                self.release.wait(1)
            return np.sqrt(x)
        counted = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
        counted.sqrt = sqrt
        monkeypatch.setattr(tie_break, "np", counted)
        monkeypatch.setattr(tie_break, "_roots", np.zeros(0))


def race(monkeypatch, a_count: int, b_count: int):
    """A starts building its table; B asks while A builds (and releases A once answered)."""
    builds, sizes = Builds(monkeypatch), {}

    def call(name, count):
        sizes[name] = tie_break.prime_roots(count).size
        if name == "B":
            builds.release.set()
    a = threading.Thread(target=call, args=("A", a_count), name="A")
    b = threading.Thread(target=call, args=("B", b_count), name="B")
    a.start()
    while builds.count == 0:                          # until A is building
        pass
    b.start()
    a.join()
    b.join()
    return sizes, builds.count


def test_the_table_never_shrinks_under_a_race(monkeypatch):
    """Without the lock A's smaller table, stored last, replaced B's."""
    sizes, _ = race(monkeypatch, 81, 1024)
    assert sizes == {"A": 81, "B": 1024} and tie_break._roots.size >= 1024, tie_break._roots.size


def test_a_table_grown_meanwhile_is_not_built_again(monkeypatch):
    """B, waiting on the lock while A built a larger table, reads A's (the check is made again under the lock)."""
    sizes, builds = race(monkeypatch, 1024, 81)
    assert sizes == {"A": 1024, "B": 81} and builds == 1 and tie_break._roots.size >= 1024


def test_the_table_is_kept_doubled_and_read_without_the_lock(monkeypatch):
    builds = Builds(monkeypatch)
    tie_break.prime_roots(100)
    tie_break.prime_roots(101)
    assert tie_break._roots.size >= 200 and builds.count == 2               # kept, and grown geometrically

    class NoLock:
        def __enter__(self):
            raise AssertionError("the lock taken where the table was large enough")

        def __exit__(self, *a):
            pass
    monkeypatch.setattr(tie_break, "_roots_lock", NoLock())
    assert tie_break.prime_roots(150).size == 150 and builds.count == 2
