"""vLLM's seeded requests (``sampling_metadata.generators``: request index → its own generator): a seeded
request's output is the one it gets verified alone with that generator — whatever else is in the batch, and
wherever it sits in it — so a seed reproduces a request's tokens, as in vLLM; the other requests draw from the
batch's generator and get what they get verified together without the seeded ones.  Without ``generators`` the
same comparison does differ (the batch's coins are drawn for the whole batch), so the test can fail."""
import numpy as np
import pytest
import torch

from gpu.engines import vllm_rejection_sample

V, M = 6, 2                                     # vocabulary, chains per request


def requests(seed: int, B: int):
    """``B`` requests of ``M`` chains each, chain length 0–3 (a request without drafts included): per request
    ``(draft ids [M·L], draft rows, target rows [M·L, V], bonus [M])``; a chain's first rows are chain 0's, its
    heads distinct."""
    rng = np.random.default_rng(seed)
    out = []
    for b in range(B):
        L = int(rng.integers(0, 4)) if b else 0
        q = rng.dirichlet(np.full(V, 0.7), size=(M, L))
        p = rng.dirichlet(np.full(V, 0.7), size=(M, L))
        if L:
            q[:, 0], p[:, 0] = q[0, 0], p[0, 0]                                # the request's one position
        ids = np.array([[rng.choice(V, p=q[c, i]) for i in range(L)] for c in range(M)]).reshape(M, L)
        if L:                                                  # distinct heads: a wor draw, read by every process
            ids[:, 0] = rng.choice(V, size=M, replace=False, p=q[0, 0])
        out.append((torch.tensor(ids.reshape(-1), dtype=torch.long), torch.tensor(q.reshape(-1, V)),
                    torch.tensor(p.reshape(-1, V)), torch.tensor(rng.integers(0, V, M))))
    return out


def run(reqs, method, generator=None, generators=None):
    ids, q, p, bonus = (torch.cat([r[i] for r in reqs]) if i < 3 else torch.stack([r[i] for r in reqs])
                        for i in range(4))
    cu = torch.cumsum(torch.tensor([len(r[0]) for r in reqs]), 0)
    q, p = q.reshape(-1, V), p.reshape(-1, V)
    return vllm_rejection_sample(ids, cu, q, p, bonus, generator, method=method, num_drafts=M, max_spec_len=3,
                                 generators=generators)


@pytest.mark.parametrize("method", ["univer", "tv", "rrsw"])
def test_a_seeded_request_gets_its_own_tokens_in_any_batch(method):
    differs = 0
    for seed in range(12):
        reqs = requests(seed, 5)
        b = 1 + seed % 4                                       # the seeded request, at several places
        alone = run([reqs[b]], method, torch.Generator().manual_seed(100 + seed))[0]
        others = [i for i in range(5) if i != b]
        rest = run([reqs[i] for i in others], method, torch.Generator().manual_seed(seed))
        for order in (list(range(5)), [b] + others):             # the others keep their order: their coins too
            at = order.index(b)
            out = run([reqs[i] for i in order], method, torch.Generator().manual_seed(seed),
                      {at: torch.Generator().manual_seed(100 + seed)})
            assert torch.equal(out[at], alone), (seed, order)
            assert torch.equal(out[[j for j in range(5) if j != at]], rest), (seed, order)
        plain = run(reqs, method, torch.Generator().manual_seed(100 + seed))
        differs += not torch.equal(plain[b], alone)
    assert differs > 0                                         # without generators the batch moves its coins


def test_every_request_seeded_leaves_the_batch_generator_alone():
    reqs = requests(3, 4)
    gen = torch.Generator().manual_seed(5)
    state = gen.get_state()
    seeded = {b: torch.Generator().manual_seed(b) for b in range(4)}
    before = {b: g.get_state() for b, g in seeded.items()}
    out = run(reqs, "univer", gen, seeded)
    assert torch.equal(gen.get_state(), state)
    assert all(not torch.equal(g.get_state(), before[b]) for b, g in seeded.items() if len(reqs[b][0]))
    for b in range(4):
        assert torch.equal(out[b], run([reqs[b]], "univer", torch.Generator().manual_seed(b))[0])


def test_a_seeded_request_without_drafts_draws_no_coin():
    """A seeded request without draft tokens drew no coin alone but its one-node tree's coins in a batch beside
    requests with drafts: its generator's state, and so its next step's tokens, depended on the batch it was in
    (168 of 200 seeds).  It draws none in either now, as in vLLM, and emits its bonus token."""
    reqs = requests(7, 4)
    assert len(reqs[0][0]) == 0 and any(len(r[0]) for r in reqs[1:])
    outs = []
    for batch in ([reqs[0]], reqs):
        g = torch.Generator().manual_seed(11)
        state = g.get_state()
        outs.append(run(batch, "univer", torch.Generator().manual_seed(1), {0: g})[0])
        assert torch.equal(g.get_state(), state), len(batch)
    assert torch.equal(outs[0], outs[1]) and int(outs[0][0]) == int(reqs[0][3][0])


@pytest.mark.parametrize("generators, match", [
    ({4: torch.Generator()}, r"generators' key 4 is not a request index in \[0, 4\)"),
    ({-1: torch.Generator()}, r"generators' key -1"),
    ({True: torch.Generator()}, r"generators' key True"),
    ({0: 7}, r"generators\[0\] must be a torch.Generator, got int"),
    ({1: None}, r"generators\[1\] must be a torch.Generator, got NoneType"),        # a seeded request has one
    ([torch.Generator()], "generators must map request indices to torch.Generator, got list"),
    ([], "generators must map request indices to torch.Generator, got list"),       # an empty one too
    (0, "generators must map request indices to torch.Generator, got int"),
])
def test_bad_generators_are_named(generators, match):
    with pytest.raises(ValueError, match=match):
        run(requests(0, 4), "tv", torch.Generator(), generators)
