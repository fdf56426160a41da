"""``gpu.verify`` and ``gpu.expected_accepted_length`` called from several threads at once, as a serving engine's
thread pool would (torch and the compiled kernels release the GIL, so the calls interleave): each call, with its own
generator, gives what it gives alone — the rules' shared state (plan caches, the tie-break table, the skeleton
cache) is guarded (docs/deviations.md items 133–134)."""
import numpy as np
import torch

import gpu
from gpu.probs import probs_from_logits
from solvers import tie_break
from univer_theory import TreeShape

from ..threads import in_threads

# (shape, process, methods, V, draft top-m): uneven nodes (the slot rule at k = 3 and 4: its tie-break table grows
# to 81 and 1 024 roots), truncated drafts, whole rows
CASES = [("((.),(..),(.(.)))", "wor", ("univer",), 30, 8), ("((.),(..),(.(.)),.)", "iid", ("univer",), 30, 8),
         ("2,2", "wor", ("univer", "tv", "rrsw"), 40, None), ("3,1", "iid", ("univer", "tv", "rrs"), 60, None)]


def calls():
    """One closure a (case, method, seed): the drafted batch, its sampled path and E[τ | tree]."""
    out = []
    for i, (shape, process, methods, V, top) in enumerate(CASES):
        gen, sh = torch.Generator().manual_seed(i), TreeShape.parse(shape)
        q = probs_from_logits(2 * torch.randn(3, sh.num_nodes, V, generator=gen, dtype=torch.float64), 1.0, top=top)
        p = probs_from_logits(2 * torch.randn(3, sh.num_nodes, V, generator=gen, dtype=torch.float64), 1.5)
        batch, q = gpu.draft_tree(sh, q, process, 3, generator=gen)
        for method in methods:
            for seed in range(2):
                def call(batch=batch, p=p, q=q, process=process, method=method, seed=seed):
                    r = gpu.verify(batch, p, q, process, method, torch.Generator().manual_seed(seed))
                    e = gpu.expected_accepted_length(batch, p, q, process, method)
                    return [t.numpy().tobytes() for t in (r.accepted_nodes, r.num_accepted, r.next_token, e)]
                out.append(call)
    return out


def test_threads_get_what_sequential_calls_get(monkeypatch):
    work = calls()
    alone = [call() for call in work]
    monkeypatch.setattr(tie_break, "_roots", np.zeros(0))          # the threads grow the tie-break table anew
    got = {}

    def run(part):
        for i in range(part, 3 * len(work), 4):
            got.setdefault(i % len(work), []).append(work[i % len(work)]())
    errors = in_threads(run)
    assert not errors, errors
    assert all(out == alone[i] for i, outs in got.items() for out in outs) and len(got) == len(work)
