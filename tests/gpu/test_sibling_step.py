"""The sibling step ``[a·X̃ − b·Ỹ]_+`` of RRS, RRSw and TV (:func:`gpu.rules.sibling_step`): the CPU's compiled pass
(:func:`gpu.rules._sibling_host`) against torch's ops, the accelerator's (:func:`gpu.rules._sibling_device`), entry
by entry and sum by sum; then, with torch's ops on the CPU, the tests of the rules that take it — E[τ | T] against
the exact core, the walk's coins deciding as the whole rule, a residual that rounds away, rows of one token — run
again; and the rules' row state (``gpu.rules._Rows``) on selected rows against the same state on copies."""
import math

import numpy as np
import pytest
import torch

import gpu.rules
from gpu.rules import SIBLING_CHUNK, _sibling_device, _sibling_host

from . import test_confident_rows, test_exact, test_walk

EPS = np.finfo(np.float64).eps


def step_rows(V: int, seed: int):
    """``(x, y, a, b)``: 21 rows of V (sparse, peaky, uniform and zero ones), the scales of 5 steps — one row copied
    (``a = 1, b = 0``), the rest at random."""
    gen = torch.Generator().manual_seed(seed)
    x, y = (torch.rand(21, V, generator=gen, dtype=torch.float64) for _ in range(2))
    x[1::3] *= torch.rand(7, V, generator=gen, dtype=torch.float64) < 0.1               # sparse
    y[2::3] = torch.softmax(40 * y[2::3], -1)                                              # peaky
    x[4], y[5] = 0, 1.0 / V
    a = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5
    b = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5
    a[0], b[0] = 1, 0
    return x, y, a, b


@pytest.mark.parametrize("V", [1, 7, SIBLING_CHUNK - 1, SIBLING_CHUNK, SIBLING_CHUNK + 1, 3 * SIBLING_CHUNK + 17,
                               49152 + 3])
@pytest.mark.parametrize("selected", [False, True])
def test_the_compiled_step_is_torchs_step(V, selected):
    """Each entry within one rounding of the exact ``[a·x − b·y]_+`` and the same float in both forms (each rounds
    both products, then subtracts), and equal to the row where ``a = 1, b = 0`` (a copy); rows read by number
    (``selected``) or the leading ones; rows past the step's untouched; each mass the row's sum to the bound
    :data:`gpu.rules.SIBLING_CHUNK` states, against ``math.fsum`` of the row written."""
    x, y, a, b = step_rows(V, seed=V)
    rows = torch.tensor([9, 4, 20, 1, 5]) if selected else None
    host, device = (torch.full((7, V), math.nan, dtype=torch.float64) for _ in range(2))
    m_host = _sibling_host(x, rows, a, y, rows, b, host[:5])
    m_device = _sibling_device(x, rows, a, y, rows, b, device[:5])
    assert torch.isnan(host[5:]).all() and torch.isnan(device[5:]).all()
    X, Y = (z[:5] if rows is None else z[rows] for z in (x, y))
    ax, by = a[:, None] * X, b[:, None] * Y
    exact = np.maximum(ax.numpy().astype(np.longdouble) - (b[:, None].numpy().astype(np.longdouble)
                                                           * Y.numpy().astype(np.longdouble)), 0)
    bound = 2 * EPS * (ax.abs() + by.abs()).numpy()
    assert (np.abs(host[:5].numpy() - exact) <= bound).all()
    assert torch.equal(host[:5], device[:5])
    assert torch.equal(host[0], X[0]) and torch.equal(device[0], X[0])
    for r in range(5):
        row_sum = math.fsum(host[r].tolist())
        assert abs(m_host[r] - row_sum) <= (SIBLING_CHUNK / 8 + V / SIBLING_CHUNK + 1) * EPS * row_sum, r
        assert abs(m_host[r] - m_device[r]) <= 1e-13 * row_sum, r


def test_the_compiled_step_reads_only_the_rows_it_is_given():
    """Rows read by number from a tensor holding others between them, NaN everywhere else: no NaN reaches the step,
    and a wrong row would show (each row its own scale of one pattern)."""
    V = 300
    x = torch.full((12, V), math.nan, dtype=torch.float64)
    y = torch.full((12, V), math.nan, dtype=torch.float64)
    rows = torch.tensor([11, 0, 6])
    base = torch.linspace(0, 1, V, dtype=torch.float64)
    x[rows] = base * torch.tensor([[2.0], [4.0], [8.0]], dtype=torch.float64)    # exact: x − y rounds once
    y[rows] = base
    out = torch.empty(3, V, dtype=torch.float64)
    one = torch.ones(3, dtype=torch.float64)
    mass = _sibling_host(x, rows, one, y, rows, one, out)
    assert torch.equal(out, base * torch.tensor([[1.0], [3.0], [7.0]], dtype=torch.float64))
    assert mass.tolist() == pytest.approx([k * base.sum().item() for k in (1, 3, 7)], rel=1e-14)


@pytest.fixture
def torch_step(monkeypatch):
    """Torch's ops for the sibling step on the CPU too, counting the steps taken."""
    calls = []

    def device(*args):
        calls.append(1)
        return _sibling_device(*args)
    monkeypatch.setattr(gpu.rules, "_sibling_host", device)
    yield
    assert calls, "no sibling step ran: the test exercised nothing of torch's step"


@pytest.mark.parametrize("method, process", [("rrs", "iid"), ("rrsw", "wor"), ("tv", "iid"), ("tv", "wor")])
def test_torch_step_against_the_exact_core(torch_step, method, process):
    test_exact.check_against_exact_core(method, process, 6, "cpu")


@pytest.mark.parametrize("method, process", [("rrs", "iid"), ("rrsw", "wor")])
def test_torch_step_coins_decide_as_the_whole_rule(torch_step, method, process):
    test_walk.test_coins_decide_as_the_whole_rule(method, process, torch.float64)


@pytest.mark.parametrize("method", ["rrs", "rrsw"])
def test_torch_step_residual_that_rounds_away_is_the_target(torch_step, method):
    test_exact.test_a_residual_that_rounds_away_is_the_target(method)


@pytest.mark.parametrize("process", ["iid", "wor"])
def test_torch_step_on_rows_of_one_token_matches_the_core(torch_step, process):
    test_confident_rows.test_rejection_steps_on_rows_of_one_token_match_the_core(process)


def test_selected_rows_step_keep_restore_and_stitch_as_copies():
    """``_Rows`` on rows selected from a larger tensor (the walk's) against the same state built on copies: a step
    over fewer rows than it holds (the rest stay as selected), ``keep`` re-selecting written rows, ``restore``, ``at``
    and ``rows`` — each the floats of the copies' state, the input never written."""
    gen = torch.Generator().manual_seed(7)
    X, Y = (torch.rand(9, 300, generator=gen, dtype=torch.float64) for _ in range(2))
    X0, Y0 = X.clone(), Y.clone()
    sel = torch.tensor([4, 0, 8, 2, 6])
    lazy = gpu.rules._Rows(X, sel=sel), gpu.rules._Rows(Y, sel=sel)
    copied = gpu.rules._Rows(X[sel]), gpu.rules._Rows(Y[sel])
    a, b = torch.rand(5, generator=gen, dtype=torch.float64) + 0.5, torch.rand(5, generator=gen, dtype=torch.float64)
    tokens = torch.tensor([3, 7, 299, 0, 150])
    masses = []
    for P, Q in (lazy, copied):
        m1 = P.subtract(a[:3], b[:3], Q)                    # three of five rows
        P.restore(torch.tensor([False, True, False]))
        first = P.rows().clone()
        P.keep(torch.tensor([2, 0, 3]))
        Q.keep(torch.tensor([2, 0, 3]))
        m2 = P.subtract(a[:3], b[:3], Q)
        masses.append((m1, m2, first, P.rows(), P.at(tokens[:3]), Q.at(tokens[:3])))
    for got, want in zip(*masses):
        assert torch.equal(got, want)
    assert torch.equal(X, X0) and torch.equal(Y, Y0)
    assert torch.equal(masses[0][2][1], X[0]) and torch.equal(masses[0][2][3:], X[sel[3:]])
