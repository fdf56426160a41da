"""``gpu.verify`` under ``torch.compile`` and the size of its intermediates (issue: no host sync inside a level,
memory near the inputs' size).

* ``torch.compile(gpu.verify, dynamic=True)`` samples what eager ``gpu.verify`` samples (same generator
  seeds; but where a uniform falls within round-off of a probability: inductor may sum a torch rule's rows in another
  order, an ulp) on an iid and a wor batch of UniVer, with the default backend (inductor: the torch code between the
  level rules' host reads is generated and compiled, ~40 s cold on 2 cores) and with ``"eager"`` (dynamo's
  tracing and graph breaks alone).
* The largest torch tensor allocated by one UniVer verification of a wide wor node (six children: PTS's walk,
  the iid coupling over the 32 multisets of its Bell(6) = 203 virtual draws, the layout's tuple integrals) stays
  within a few times the input rows — the tuple integrals are chunked (``univer_theory.plans.layout.TUPLE_CHUNK``);
  before, they formed ``[tuples, k, groups, nodes]`` arrays (≈ 50 MB here against 0.9 MB of rows).  numpy buffers
  (PTS's walk on the CPU) are not seen by the dispatch mode; their size is bounded by
  ``univer_theory.plans.clocks.WALK_BYTES``.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import gpu
from gpu import draft_tree
from univer_theory import TreeShape

from .helpers import on_device


def rows(shape, V, seed):
    """Two trees' rows ``[2, N, V]``: Zipf targets (``p ∝ rank^{-1.1}``, a random permutation per row) and drafts
    near them (``q ∝ p·e^{0.8 z}``), so that the layout's blocks hold most of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    N = shape.num_nodes
    perm = torch.argsort(torch.rand(2, N, V, generator=g), dim=-1)
    log_p = torch.log_softmax(-1.1 * torch.log(torch.arange(1, V + 1, dtype=torch.float64))[perm], -1)
    q = torch.softmax(log_p + 0.8 * torch.randn(2, N, V, generator=g, dtype=torch.float64), -1)
    return log_p.exp(), q


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_compiled_verify_samples_as_eager(backend):
    check_compiled_as_eager("cpu", backend)


def check_compiled_as_eager(device, backend: str):
    """``torch.compile(gpu.verify, dynamic=True, backend=backend)`` draws what eager draws on ``device``."""
    shape = TreeShape.parse("(...)")
    p, q = rows(shape, 40, 0)
    compiled = torch.compile(gpu.verify, dynamic=True, backend=backend)
    for process in ("iid", "wor"):
        batch, q_rows = draft_tree(shape, q, process, 2, torch.Generator().manual_seed(1))
        batch, p_dev, q_rows = on_device(device, batch, p, q_rows)
        want = gpu.verify(batch, p_dev, q_rows, process, "univer", torch.Generator(device=device).manual_seed(2))
        got = compiled(batch, p_dev, q_rows, process, "univer", torch.Generator(device=device).manual_seed(2))
        for name in ("accepted_nodes", "num_accepted", "next_token"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (process, name)


class LargestTensor(TorchDispatchMode):
    """Bytes of the largest tensor any torch op returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for x in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(x, torch.Tensor):
                self.largest = max(self.largest, x.numel() * x.element_size())
        return out


def test_wide_wor_node_allocates_near_its_inputs():
    shape = TreeShape.parse("(......)")
    V = 8192
    p, q = rows(shape, V, 3)
    batch, q_rows = draft_tree(shape, q[:1], "wor", 1, torch.Generator().manual_seed(4))
    inputs = 2 * p[:1].numel() * p.element_size()
    with LargestTensor() as mode:
        gpu.verify(batch, p[:1], q_rows, "wor", "univer", torch.Generator().manual_seed(5), validate=False)
    assert mode.largest <= 4 * inputs, (mode.largest, inputs)
