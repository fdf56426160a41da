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
