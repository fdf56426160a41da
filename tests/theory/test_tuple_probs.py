"""The one float Q_k(S) (univer_theory.processes.tuple_probs / wor_tuple_probs) against the exact enumeration
``tuple_law`` on Fraction rows, including confident rows where ``1 − Σ drawn`` cancels."""
from fractions import Fraction

import numpy as np
import pytest

from univer_theory.processes import tuple_law, tuple_probs

torch = pytest.importorskip("torch")        # the torch side of the comparison

#: Below float64's smallest normal number a product of 1e-300 tail masses underflows whatever the form.
TINY = Fraction(float(np.finfo(np.float64).tiny))
CONFIDENT = [
    np.array([1 - 11e-16, 1e-16, 3e-16, 7e-16, 0.0]),                  # the top holds all but 1.1e-15
    np.array([1.0, 1e-300, 3e-300, 2e-300]),                           # a 1e-300 tail below the top's ulp
]


def _rows():
    rng = np.random.default_rng(16)
    rows = [rng.dirichlet(np.full(V, a)) for V, a in ((4, 1.0), (5, 0.3), (6, 0.1), (6, 2.0))]
    rows.append(np.array([0.25, 0.0, 0.5, 0.0, 0.25]))                 # zeros inside the row
    return rows + CONFIDENT


def _exact(q, k, process):
    """Ordered tuples and their exact Q_k (the Fraction row of the float row's values)."""
    law = tuple_law(np.array([Fraction(x) for x in q], dtype=object), k, process)
    return np.array([S for S, _ in law], dtype=np.int64), [pr for _, pr in law]


def _old_one_minus_used(q, S):
    """The known-bad variant: ``Π q(y_i)/(1 − Σ_{l<i} q(y_l))``, 0 once the drawn mass reaches 1."""
    pr, used = 1.0, 0.0
    for y in S:
        if used >= 1.0:
            return 0.0
        pr *= q[y] / (1.0 - used)
        used += q[y]
    return pr


@pytest.mark.parametrize("process", ["iid", "wor"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_tuple_probs_match_the_exact_enumeration(process, k):
    for q in _rows():
        tuples, exact = _exact(q, k, process)
        for got in (tuple_probs(q, tuples, process),
                    tuple_probs(torch.tensor(q), torch.tensor(tuples), process).numpy()):
            for S, g, e in zip(tuples, got, exact):
                assert abs(Fraction(float(g)) - e) <= Fraction(1, 10 ** 15) * e + TINY, (q, S, g, float(e))


@pytest.mark.parametrize("k", [2, 3])
def test_one_minus_used_is_wrong_on_confident_rows(k):
    """Where the old ``1 − used`` form is off, the one function is right to 1e-15."""
    for q in CONFIDENT:
        tuples, exact = _exact(q, k, "wor")
        got = tuple_probs(q, tuples, "wor")
        old = np.array([_old_one_minus_used(q, S) for S in tuples])
        rel = lambda x: max(abs(Fraction(float(v)) - e) / e for v, e in zip(x, exact) if e > TINY)   # noqa: E731
        assert rel(got) <= Fraction(1, 10 ** 15)
        assert rel(old) > Fraction(1, 200)          # 0.9 % off on the first row, 100 % (0) on the 1e-300 tail


def test_tuple_probs_batched_rows_and_orderings():
    """Batch axes ``[R, T, k]``: each row's orderings of one set (the slot rule's class), rows of any mass."""
    qs = np.stack([np.pad(q, (0, 6 - q.size)) for q in _rows()])
    S = np.array([[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]])
    tuples = np.broadcast_to(S, (qs.shape[0],) + S.shape)
    got = tuple_probs(qs, tuples, "wor")
    for r, q in enumerate(qs):
        law = dict(tuple_law(np.array([Fraction(x) for x in q], dtype=object), 3, "wor"))
        want = [law.get(tuple(t), 0) for t in S.tolist()]
        assert all(abs(Fraction(float(g)) - w) <= Fraction(1, 10 ** 15) * w + TINY for g, w in zip(got[r], want))


def test_tuple_probs_rejects_unknown_process():
    with pytest.raises(ValueError, match="process"):
        tuple_probs(np.array([0.5, 0.5]), np.array([[0, 1]]), "topk")


@pytest.mark.parametrize("process", ["iid", "wor", "topk", "greedy", "hub"])
def test_tuple_count_is_the_length_of_the_enumeration(process):
    """The closed form the CLI sizes an enumeration with, against the tuples ``tuple_law`` lists, on rows with
    zeros inside (support below V) and every k the process allows."""
    from univer_theory.processes import tuple_count
    for q in _rows():
        support = int(np.count_nonzero(q))
        for k in ([2] if process == "hub" else range(1, min(support, 4) + 1)):
            assert tuple_count(support, k, process) == len(tuple_law(q, k, process)), (q, k)
