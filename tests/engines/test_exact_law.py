"""Exact laws through the adapters (enumeration, float64, tolerance 1e-12).

* SGLang's target-only procedure on its own coins: for every drafted tree, stored in a scrambled slot order, the
  coins are enumerated exactly — each coin the adapter reads is piecewise constant in its outcome, so one coin
  per cell of the partition its breakpoints cut (child running sums at each node, residual CDFs for the final
  coin) with the cell's length as weight covers the whole law — and the resulting law of (path tokens, Y) read
  from ``predicts`` / ``accept_index`` equals target-only's (``VERIFIERS["nss"].law``) tree by tree.
* Every lossless method through each adapter: every outcome (end node, Y) of the method's exact per-tree law on
  the batch the adapter builds (the law :func:`gpu.verify` samples, checked in tests/gpu) is written out by the
  adapter's output step and read back the way the engine reads it; averaged over all drafted trees (and vLLM's
  bonus draws) this is the target's law (``distance_to_target`` ≤ 1e-12).  (The vLLM adapter's leaf rows are
  stand-ins whose draw it replaces by the bonus token, so there the law's Y is replaced the same way.)  The same test fails for a mis-wired
  slot order and for swapped bonus tokens.
"""
import itertools

import numpy as np
import pytest
import torch

from gpu.engine import VerifyResult
from gpu.engines import sglang, vllm
from univer_theory import VERIFIERS, DirichletModel, TreeShape
from univer_theory.oracle import distance_to_target
from univer_theory.processes import enumerate_trees
from univer_theory.tolerance import worst_of

TOL = 1e-12
MODEL = DirichletModel(3, seed=7, similarity=0.3, concentration=0.6)


def scrambled(tree, seed):
    """SGLang storage of a DraftTree in a random slot order (root stays in slot 0): ``(ints dict, perm)`` with
    ``perm[v]`` = storage slot of node v."""
    N = tree.num_nodes
    perm = np.concatenate([[0], 1 + np.random.default_rng(seed).permutation(N - 1)])
    cand, first, nxt = np.zeros(N, int), -np.ones(N, int), -np.ones(N, int)
    for v in range(N):
        cand[perm[v]] = max(tree.token[v], 0)
        kids = tree.children[v]
        if kids:
            first[perm[v]] = perm[kids[0]]
        for a, b in zip(kids, kids[1:]):
            nxt[perm[a]] = perm[b]
    t = lambda x: torch.tensor(x)[None]
    return {"candidates": t(cand), "retrive_index": t(np.arange(N)), "retrive_next_token": t(first),
            "retrive_next_sibling": t(nxt)}, perm


def storage_rows(rows, perm):
    out = np.empty_like(rows)
    out[perm] = rows
    return torch.tensor(out)[None]


def cells(cuts):
    """Midpoints and lengths of the cells [0, 1) is cut into by ``cuts``."""
    c = np.unique(np.clip(np.concatenate([[0.0, 1.0], cuts]), 0, 1))
    lo, hi = c[:-1], c[1:]
    keep = hi > lo
    return (lo + hi)[keep] / 2, (hi - lo)[keep]


def coin_law(tree, p, perm, ints):
    """Law of (path tokens, Y) of :func:`sglang.verify_tree` with SGLang's coins, by exact coin enumeration."""
    N, V = p.shape
    internal = [v for v in range(N) if tree.children[v]]
    per_node = []
    for v in internal:
        seen, run, cuts = set(), 0.0, []
        for c in tree.children[v]:
            y = tree.token[c]
            if y not in seen:
                seen.add(y)
                run += p[v, y]
            cuts.append(run)
        per_node.append(cells(np.array(cuts)))
    final = []
    for v in range(N):
        for row in (p[v], np.where(np.isin(np.arange(V), [tree.token[c] for c in tree.children[v]]), 0, p[v])):
            if row.sum() > 0:
                final.append(np.cumsum(row) / row.sum())
    final = cells(np.concatenate(final))
    combos = list(itertools.product(*[range(len(m)) for m, _ in per_node], range(len(final[0]))))
    R = len(combos)
    U = torch.full((R, N), 0.5, dtype=torch.float64)
    Uf = torch.empty(R, dtype=torch.float64)
    w = np.ones(R)
    for r, combo in enumerate(combos):
        for (mid, length), v, k in zip(per_node, internal, combo):
            U[r, perm[v]] = mid[k]
            w[r] *= length[k]
        Uf[r] = final[0][combo[-1]]
        w[r] *= final[1][combo[-1]]
    rep = {k: x.expand(R, -1) for k, x in ints.items()}
    rep["retrive_index"] = torch.arange(R * N).view(R, N)
    out = sglang.verify_tree(**rep, target_probs=storage_rows(p, perm).expand(R, -1, -1), method="target-only",
                             uniform_samples=U, uniform_samples_for_final_sampling=Uf)
    law = {}
    for r in range(R):
        n = int(out.accept_token_num[r])
        emitted = out.predicts[out.accept_index[r, :n + 1].long()].tolist()
        law[tuple(emitted)] = law.get(tuple(emitted), 0.0) + w[r]
    return law


@pytest.mark.parametrize("process", ["iid", "topk"])
def test_sglang_coins_follow_target_only_law(process):
    """SGLang's procedure (with duplicate siblings counted once) has target-only's law on every tree; over the
    drafted trees the output is the target's law."""
    shape = TreeShape.parse("((.),(..))")
    total, worst = {}, 0.0
    for i, (tree, weight) in enumerate(enumerate_trees(MODEL, shape, process)):
        p, q = MODEL.node_probs(tree)
        ints, perm = scrambled(tree, i)
        got = coin_law(tree, p, perm, ints)
        want = VERIFIERS["nss"].law(tree, p, q, process)
        keys = set(got) | set(want)
        worst = worst_of(worst, *(abs(got.get(k, 0) - float(want.get(k, 0))) for k in keys))
        for k, v in got.items():
            total[k] = total.get(k, 0) + weight * v
    assert worst <= TOL, f"worst per-tree gap {worst:.3g}"
    assert distance_to_target(MODEL, total, shape.max_depth + 1) <= TOL


def test_sglang_coins_read_float32_rows_on_the_simplex():
    """A root with one child and float32 rows 9e-6 short of summing to 1 (valid within the float32 tolerance): the
    coins accepted the child iff ``c ≤ P(y)`` on the row as given, 6.3e-6 below the row's law ``P(y)/ΣP`` (what
    ``gpu.verify``'s rules read).  The coins are enumerated exactly, one per cell of the acceptance's cut points."""
    p32 = (torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]], dtype=torch.float64) * (1 - 9e-6)).float()[None]
    ints = dict(candidates=torch.tensor([[0, 0]]), retrive_index=torch.tensor([[0, 1]]),
                retrive_next_token=torch.tensor([[1, -1]]), retrive_next_sibling=torch.tensor([[-1, -1]]))
    row = p32[0, 0].double()
    want = float(row[0] / row.sum())
    cuts = np.unique([0.0, float(row[0]), want, 1.0])
    accepted = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        out = sglang.verify_tree(**ints, target_probs=p32, method="nss",
                                 uniform_samples=torch.tensor([[(lo + hi) / 2, 0.5]], dtype=torch.float64),
                                 uniform_samples_for_final_sampling=torch.tensor([0.5], dtype=torch.float64))
        accepted += (hi - lo) * (int(out.accept_token_num[0]) >= 1)
    assert abs(accepted - want) <= 1e-15


def cells_of(tree, law):
    """``[(end node, Y, prob)]`` of a per-tree law keyed by (path tokens…, Y) (any node with that path)."""
    node = {tree.path(u): u for u in range(tree.num_nodes)}
    return [(node[k[:-1]], k[-1], float(v)) for k, v in law.items()]


def one_result(tree, u, y, D):
    path = [u]
    while path[-1] > 0:
        path.append(tree.parent[path[-1]])
    path = path[::-1] + [-1] * (D + 1 - len(path))
    return VerifyResult(torch.tensor([path]), torch.tensor([len([x for x in path if x >= 0]) - 1]),
                        torch.tensor([y]))


def sglang_adapter_law(method, process, shape, break_order=False):
    total = {}
    for i, (tree, weight) in enumerate(enumerate_trees(MODEL, shape, process)):
        p, q = MODEL.node_probs(tree)
        ints, perm = scrambled(tree, i)
        batch, pr, qr, rows, order = sglang.tree_inputs(ints["candidates"], ints["retrive_next_token"],
                                                        ints["retrive_next_sibling"], storage_rows(p, perm),
                                                        storage_rows(q, perm))
        conv = batch.to_trees(3)[0]
        law = VERIFIERS[method].law(conv, pr[rows[0]].numpy(), qr[rows[0]].numpy(), process)
        if break_order:
            order = torch.arange(tree.num_nodes)[None]
        for u, y, prob in cells_of(conv, law):
            out = sglang.SGLangOutputs(torch.full((tree.num_nodes,), -1, dtype=torch.int32),
                                       torch.full((1, shape.max_depth + 1), -1, dtype=torch.int32),
                                       torch.zeros(1, dtype=torch.int32))
            sglang.fill_outputs(one_result(conv, u, y, batch.max_depth), order, ints["candidates"],
                                ints["retrive_index"], *out)
            emitted = tuple(out.predicts[out.accept_index[0, :int(out.accept_token_num[0]) + 1].long()].tolist())
            total[emitted] = total.get(emitted, 0) + weight * prob
    return distance_to_target(MODEL, total, shape.max_depth + 1)


SGLANG_CASES = [("nss", "topk"), ("nss", "iid"), ("rrs", "iid"), ("rrsw", "wor"), ("tv", "iid"), ("tv", "wor"),
                ("univer", "iid"), ("univer", "wor")]


@pytest.mark.parametrize("method, process", SGLANG_CASES, ids=[f"{m}-{p}" for m, p in SGLANG_CASES])
def test_sglang_adapter_gives_target_law(method, process):
    assert sglang_adapter_law(method, process, TreeShape.parse("((.),(..))")) <= TOL


def test_sglang_law_test_detects_a_wrong_slot_map():
    assert sglang_adapter_law("tv", "iid", TreeShape.parse("((.),(..))"), break_order=True) > 1e-3


def vllm_adapter_law(method, process, m, L, swap_bonus=False):
    """Target-law distance of :func:`vllm.rejection_sample`'s outputs: ``m`` chains of ``L`` tokens (argmax
    drafts when ``method`` is ``sps-argmax``), every bonus draw enumerated with its target probability."""
    chain = "(" * (L - 1) + "." + ")" * (L - 1)
    shape = TreeShape.parse("(" + ",".join([chain] * m) + ")")
    argmax = method == "sps-argmax"
    total = {}
    for tree, weight in enumerate_trees(MODEL, shape, "topk" if argmax else process):
        p, q = MODEL.node_probs(tree)
        heads = tree.children[0]
        chains = []
        for h in heads:                       # each chain's nodes, root child first
            nodes = [h]
            while tree.children[nodes[-1]]:
                nodes.append(tree.children[nodes[-1]][0])
            chains.append(nodes)
        ids = torch.tensor([tree.token[v] for c in chains for v in c])
        rows = [tree.parent[v] for c in chains for v in c]
        tp, dp = torch.tensor(p[rows]), None if argmax else torch.tensor(q[rows])
        leaves = [c[-1] for c in chains]
        for bonus in itertools.product(range(3), repeat=m):
            wb = np.prod([p[v, b] for v, b in zip(leaves, bonus)])
            if wb == 0:
                continue
            given = bonus[::-1] if swap_bonus else bonus
            batch, pr, qr, rows, lengths, bon = vllm.tree_inputs(ids, torch.tensor([len(ids)]), dp, tp,
                                                                 torch.tensor([given]), m)
            conv = batch.to_trees(3)[0]
            name = "nss" if argmax else vllm.METHODS[method]
            law = VERIFIERS[name].law(conv, pr[rows[0]].numpy(), qr[rows[0]].numpy(), "iid" if argmax else process)
            for u, y, prob in cells_of(conv, law):
                res = one_result(conv, u, y, batch.max_depth)
                out = vllm.output_tokens(batch, res, lengths, bon, L + 1)[0][0].tolist()
                emitted = tuple(out[:out.index(vllm.PLACEHOLDER_TOKEN_ID)] if vllm.PLACEHOLDER_TOKEN_ID in out else out)
                total[emitted] = total.get(emitted, 0) + weight * wb * prob
    return distance_to_target(MODEL, total, L + 1)


VLLM_CASES = [("sps", "iid", 1, 3), ("sps-argmax", None, 1, 3), ("bv", "iid", 1, 3), ("rrs", "iid", 2, 2),
              ("rrsw", "wor", 2, 2), ("tv", "iid", 2, 2), ("univer", "iid", 2, 2), ("univer", "wor", 2, 2)]


@pytest.mark.parametrize("method, process, m, L", VLLM_CASES, ids=[f"{c[0]}-{c[1]}-m{c[2]}" for c in VLLM_CASES])
def test_vllm_adapter_gives_target_law(method, process, m, L):
    assert vllm_adapter_law(method, process, m, L) <= TOL


def test_vllm_law_test_detects_swapped_bonus_tokens():
    assert vllm_adapter_law("univer", "iid", 2, 2, swap_bonus=True) > 1e-3
