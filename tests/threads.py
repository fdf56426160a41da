"""Running a test's work from several threads at once, switching between them often."""
import sys
import threading


def in_threads(work, parts: int = 4, interval: float = 1e-6) -> list[str]:
    """``work(part)`` for ``part`` in ``range(parts)``, each on its own thread, the interpreter switching threads
    every ``interval`` seconds (its default is 5 ms, which a short call rarely meets); the exceptions they raised,
    as reprs."""
    errors = []

    def run(part):
        try:
            work(part)
        except Exception as e:                                          # noqa: BLE001 — returned to the test
            errors.append(repr(e))
    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        threads = [threading.Thread(target=run, args=(part,)) for part in range(parts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    return errors
