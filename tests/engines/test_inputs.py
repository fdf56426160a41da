"""SGLang links in any slot order, malformed links and bad adapter inputs (each a ValueError naming what is
wrong)."""
import numpy as np
import pytest
import torch

import gpu
from gpu import TreeBatch
from gpu.engines import sglang_verify_tree, vllm_rejection_sample
from univer_theory import DraftTree


def random_tree(rng, N):
    parent = [-1] + [int(rng.integers(0, v)) for v in range(1, N)]
    return DraftTree(tuple(parent), (-1,) + tuple(int(x) for x in rng.integers(0, 5, N - 1)))


def nested(tree, u=0):
    """The ordered tree under u as nested (token, children…) tuples: equal iff same tree up to slot layout."""
    return (tree.token[u],) + tuple(nested(tree, c) for c in tree.children[u])


def links(tree, perm, N):
    """SGLang storage of ``tree`` (node v at slot perm[v]), padded to N slots."""
    first, nxt, tok = [-1] * N, [-1] * N, [-1] * N
    for v in range(tree.num_nodes):
        tok[perm[v]] = tree.token[v]
        kids = tree.children[v]
        if kids:
            first[perm[v]] = perm[kids[0]]
        for a, b in zip(kids, kids[1:]):
            nxt[perm[a]] = perm[b]
    return first, nxt, tok


def test_any_slot_order_gives_the_same_trees():
    """Random trees in random storage orders (ragged batch): the batch holds the original trees, ``order``
    maps its slots to storage, and a storage order that is already topological is kept as is."""
    rng = np.random.default_rng(0)
    trees = [random_tree(rng, n) for n in (1, 2, 5, 7, 8, 8)]
    N = 8
    rows = [links(t, [0] + list(1 + rng.permutation(t.num_nodes - 1)), N) for t in trees]
    first, nxt, tok = (torch.tensor([r[i] for r in rows]) for i in range(3))
    n = torch.tensor([t.num_nodes for t in trees])
    batch, order = TreeBatch.from_sglang(first, nxt, tok, n, return_order=True)
    assert [nested(t) for t in batch.to_trees()] == [nested(t) for t in trees]
    assert torch.equal(tok.gather(1, order), batch.token)
    same, same_order = TreeBatch.from_sglang(*TreeBatch.from_trees(trees).to_sglang(),
                                             TreeBatch.from_trees(trees).token, n, return_order=True)
    assert same.to_trees() == trees and torch.equal(same_order, torch.arange(N).expand(len(trees), N))


BAD = [
    ("out of range", [[1, -1, 3]], [[-1, -1, -1]], r"retrive_next_token\[0, 2\] = 3 .*\[-1, 3\)"),
    ("below -1", [[1, -1, -1]], [[-1, -2, -1]], r"retrive_next_sibling\[0, 1\] = -2"),
    ("reached twice", [[1, 2, -1]], [[-1, 2, -1]], r"retrive_next_token\[0, 1\] = 2 .*reached by more than one"),
    ("root targeted", [[1, 0, -1]], [[-1, 2, -1]], r"retrive_next_token\[0, 1\] = 0 .*root"),
    ("root sibling", [[1, -1, -1]], [[2, -1, -1]], r"retrive_next_sibling\[0, 0\] = 2 .*no siblings"),
    ("cycle", [[1, -1, -1, -1]], [[-1, -1, 3, 2]], r"retrive_next_sibling\[0, (2|3)\] = (3|2) .*cycle"),
    ("self loop", [[1, -1, 2]], [[-1, -1, -1]], r"retrive_next_token\[0, 2\] = 2 .*cycle"),
    ("unreached", [[1, -1, -1]], [[-1, -1, -1]], r"slot \[0, 2\] is reached by no link"),
]


@pytest.mark.parametrize("name, first, nxt, match", BAD, ids=[b[0] for b in BAD])
def test_malformed_links_name_array_and_slot(name, first, nxt, match):
    N = len(first[0])
    with pytest.raises(ValueError, match=match):
        TreeBatch.from_sglang(torch.tensor(first), torch.tensor(nxt), torch.tensor([[-1] + [0] * (N - 1)]))


def test_links_into_padding_are_rejected():
    with pytest.raises(ValueError, match=r"retrive_next_sibling\[0, 1\] = 2 .*valid slots"):
        TreeBatch.from_sglang(torch.tensor([[1, -1, -1]]), torch.tensor([[-1, 2, -1]]),
                              torch.tensor([[-1, 0, -1]]), torch.tensor([2]))


def sglang_case(N=3, V=4):
    ints = dict(candidates=torch.tensor([[9, 1, 2]]), retrive_index=torch.tensor([[0, 1, 2]]),
                retrive_next_token=torch.tensor([[2, -1, -1]]), retrive_next_sibling=torch.tensor([[-1, -1, 1]]))
    return ints, torch.full((1, N, V), 1 / V)


def test_sglang_adapter_input_errors():
    ints, p = sglang_case()
    with pytest.raises(ValueError, match="uniform_samples drive only"):
        sglang_verify_tree(**ints, target_probs=p, draft_probs=p, method="tv", uniform_samples=torch.rand(1, 3),
                           uniform_samples_for_final_sampling=torch.rand(1))
    with pytest.raises(ValueError, match="depth 1 but num_speculative_tokens = 1"):
        sglang_verify_tree(**ints, target_probs=p, num_speculative_tokens=1)
    with pytest.raises(ValueError, match="draft_probs must be"):
        sglang_verify_tree(**ints, target_probs=p, draft_probs=p[:, :2], method="tv")
    with pytest.raises(ValueError, match="unknown method"):
        sglang_verify_tree(**ints, target_probs=p, method="bv")
    for method in ("rrs", "rrsw", "tv", "univer"):     # uniform rows stood in for the draft's: a lossy output
        with pytest.raises(ValueError, match=f"method '{method}' reads the draft rows"):
            sglang_verify_tree(**ints, target_probs=p, method=method)
    bad = p.clone()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"target_probs row \[0, 0\] contains NaN"):
        sglang_verify_tree(**ints, target_probs=bad)
    q = p.clone()
    q[0, 0] = torch.tensor([0.5, 0.5, 0.0, 0.0])          # token 2 drafted with q = 0
    with pytest.raises(ValueError, match="draft_probs"):
        sglang_verify_tree(**ints, target_probs=p, draft_probs=q, method="rrs")
    for past in ([[0, 1, 7]], [[0, 1, 3]], [[3, 1, 2]]):       # 3: predicts' size itself, one past its end
        with pytest.raises(ValueError, match=r"retrive_index entries must lie in \[0, 3\)"):
            sglang_verify_tree(**{**ints, "retrive_index": torch.tensor(past)}, target_probs=p)
    with pytest.raises(ValueError, match="retrive_index entries must be distinct"):   # a slot overwrote another's
        sglang_verify_tree(**{**ints, "retrive_index": torch.tensor([[0, 1, 1]])}, target_probs=p)


def test_adapter_inputs_are_named_in_the_callers_coordinates():
    """An out-of-vocabulary candidate was named by the batch's reordered slot (``TreeBatch: tree 0 slot 2 …, token
    5``, where the caller's ``candidates[0, 1]`` held it), a vLLM draft token by its tree slot; link arrays that are
    not integer arrays were torch's own errors (``Could not infer dtype of NoneType``); a 2-D strided ``predicts``
    failed inside the write (``view size is not compatible``), after every check had passed; a bad row or a drafted
    token of draft probability 0 was named in ``gpu.verify``'s flat rows and the batch's slots."""
    ints, p = sglang_case()
    with pytest.raises(ValueError, match=r"candidates\[0, 1\] = 5 is outside the vocabulary \[0, 4\)"):
        sglang_verify_tree(**{**ints, "candidates": torch.tensor([[0, 5, 2]])}, target_probs=p)   # stored slot 1
    with pytest.raises(ValueError, match=r"candidates\[0, 1\] = -2 is outside the vocabulary \[0, 4\)"):
        sglang_verify_tree(**{**ints, "candidates": torch.tensor([[0, -2, 2]])}, target_probs=p)
    for name in ("retrive_next_token", "retrive_next_sibling"):
        with pytest.raises(ValueError, match=f"^sglang.verify_tree: {name} must be an integer array, got NoneType"):
            sglang_verify_tree(**{**ints, name: None}, target_probs=p)
    strided = torch.full((3, 2), -1, dtype=torch.int32)[:, :1]
    with pytest.raises(ValueError, match=r"predicts must be 1-D or contiguous .* \[3, 1\] tensor with strides"):
        sglang_verify_tree(**ints, target_probs=p, predicts=strided)
    base = torch.full((6,), -1, dtype=torch.int32)      # a 1-D strided buffer is written through its own view
    out = sglang_verify_tree(**ints, target_probs=p, predicts=base[::2], generator=torch.Generator().manual_seed(0))
    want = sglang_verify_tree(**ints, target_probs=p, generator=torch.Generator().manual_seed(0))
    assert torch.equal(base[::2], want.predicts) and (base[1::2] == -1).all()
    assert out.predicts.data_ptr() == base.data_ptr()
    with pytest.raises(ValueError, match=r"draft_token_ids\[1\] = -1 is outside the vocabulary \[0, 4\)"):
        vllm_rejection_sample(torch.tensor([1, -1]), torch.tensor([2]), None, torch.full((2, 4), 0.25),
                              torch.tensor([[3]]))
    # a bad row and a drafted token of draft probability 0 were named in gpu.verify's flat [B·N, V] rows and the
    # batch's slots (``verify: target_probs row [2]``, ``tree 0 node 1 … draft_probs[0, 2] = 0``)
    bad = p.clone()
    bad[0, 2, 1] = float("nan")
    coins = dict(method="nss", uniform_samples=torch.rand(1, 3), uniform_samples_for_final_sampling=torch.rand(1))
    for name, kwargs in (("target_probs", dict(target_probs=bad)), ("target_probs", dict(target_probs=bad, **coins)),
                         ("draft_probs", dict(target_probs=p, draft_probs=bad, method="univer"))):
        with pytest.raises(ValueError, match=rf"^sglang.verify_tree: {name} row \[0, 2\] contains NaN"):
            sglang_verify_tree(**ints, **kwargs)
    q = p.clone()
    q[0, 0, 2] = 0.0                # the root's row (stored slot 0) has q = 0 at candidates[0, 2] = 2
    q[0, 0] /= q[0, 0].sum()
    with pytest.raises(ValueError, match=r"candidates\[0, 2\] = 2 is drafted from slot 0's row, but "
                                         r"draft_probs\[0, 0, 2\] = 0"):
        sglang_verify_tree(**ints, target_probs=p, draft_probs=q, method="univer")
    chain = dict(candidates=torch.tensor([[0, 3, 1]]), retrive_index=torch.tensor([[0, 1, 2]]),   # 0 → 2 → 1
                 retrive_next_token=torch.tensor([[2, -1, 1]]), retrive_next_sibling=torch.tensor([[-1, -1, -1]]))
    q = p.clone()
    q[0, 2, 3] = 0.0                # stored slot 1 (token 3) is drafted from stored slot 2's row, the batch's node 1
    q[0, 2] /= q[0, 2].sum()
    with pytest.raises(ValueError, match=r"candidates\[0, 1\] = 3 is drafted from slot 2's row, but "
                                         r"draft_probs\[0, 2, 3\] = 0"):
        sglang_verify_tree(**chain, target_probs=p, draft_probs=q, method="univer")
    # a method-process pair the verifier does not cover was a bare NotImplementedError: it is a ValueError too now
    # (univer_theory.validation.Unsupported), as the input rule asks, and still a NotImplementedError
    for call in (lambda: sglang_verify_tree(**ints, target_probs=p, draft_probs=p, method="tv", process="topk"),
                 lambda: vllm_rejection_sample(torch.tensor([1, 2, 3, 0]), torch.tensor([4]),
                                               torch.full((4, 4), 0.25), torch.full((4, 4), 0.25),
                                               torch.tensor([[0, 0]]), method="rrs", num_drafts=2, process="wor")):
        for kind in (ValueError, NotImplementedError):
            with pytest.raises(kind, match="is defined for processes"):
                call()
    with pytest.raises(NotImplementedError, match="is defined for processes"):   # bad rows as well: still the pair
        sglang_verify_tree(**ints, target_probs=bad, draft_probs=p, method="tv", process="topk")
    # a node's rule (duplicate siblings without replacement, top-k children out of order) was named by the batch's
    # node ("tree 0 node 1", stored in slot 2), vLLM's chains by their tree; target rows one too many named only
    # draft_token_ids
    u = torch.full((4,), 0.25, dtype=torch.float64)
    root_2_then_1 = dict(retrive_index=torch.tensor([[0, 1, 2]]), retrive_next_token=torch.tensor([[2, -1, -1]]),
                         retrive_next_sibling=torch.tensor([[-1, -1, 1]]))         # the root's list: slot 2, slot 1
    rows = torch.stack([u, u, u])[None]
    with pytest.raises(ValueError, match=r"^sglang.verify_tree: candidates\[0, 2\] has a sibling with the same "
                                         r"token 3, impossible under process 'wor'"):
        sglang_verify_tree(torch.tensor([[0, 3, 3]]), **root_2_then_1, target_probs=rows, draft_probs=rows,
                           method="rrsw", process="wor")
    top = torch.stack([torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64), u, u])[None]
    with pytest.raises(ValueError, match=r"^sglang.verify_tree: candidates\[0, 2\] is child 0 of its parent with "
                                         r"token 2 .* child 0 must be token 0"):
        sglang_verify_tree(torch.tensor([[0, 0, 2]]), **root_2_then_1, target_probs=rows, draft_probs=top,
                           method="univer", process="topk")
    flat = torch.stack([u] * 4)
    with pytest.raises(ValueError, match=r"draft_token_ids\[2\] has a sibling with the same token 3"):
        vllm_rejection_sample(torch.tensor([0, 1, 3, 3]), torch.tensor([2, 4]), flat, flat,
                              torch.zeros(2, 2, dtype=torch.long), method="rrsw", num_drafts=2, process="wor")
    # a drafted token of draft probability 0, named by its draft_token_ids index and the row it was drawn from: in
    # request 1, in request 0 (whose offset is 0, not cu_num_draft_tokens[-1]), and a second chain's head, drawn
    # from the first chain's root row
    for t, row, cu, m in ((3, 3, [2, 4], 1), (1, 1, [2, 4], 1), (2, 0, [4], 2)):
        q = flat.clone()
        q[row, t] = 0.0
        q[row] /= q[row].sum()
        if m == 2:
            q[2] = q[0]                                       # both chains' heads are drafted from the root's row
        with pytest.raises(ValueError, match=rf"draft_token_ids\[{t}\] drafts token {t} but its parent's "
                                             rf"draft_probs\[{row}, {t}\] = 0"):
            vllm_rejection_sample(torch.tensor([0, 1, 2, 3]), torch.tensor(cu), q, flat,
                                  torch.zeros(len(cu), m, dtype=torch.long), method="tv", num_drafts=m)
    with pytest.raises(ValueError, match=r"draft_token_ids\[0\] has a sibling with the same token 3"):
        vllm_rejection_sample(torch.tensor([3, 3, 1, 2]), torch.tensor([2, 4]), flat, flat,
                              torch.zeros(2, 2, dtype=torch.long), method="rrsw", num_drafts=2, process="wor")
    with pytest.raises(ValueError, match=r"target_probs must hold one row per draft token, \[T, V\] = \[4, 4\] "
                                         r"\(draft_token_ids holds T = 4\), got \[5, 4\]"):
        vllm_rejection_sample(torch.tensor([0, 1, 3, 3]), torch.tensor([2, 4]), flat, torch.cat([flat, u[None]]),
                              torch.zeros(2, 2, dtype=torch.long), method="tv", num_drafts=2)


def test_vllm_adapter_input_errors():
    ids, cu, p = torch.tensor([1, 2]), torch.tensor([2]), torch.full((2, 4), 0.25)
    bonus = torch.tensor([[3]])
    with pytest.raises(ValueError, match="cu_num_draft_tokens"):
        vllm_rejection_sample(ids, torch.tensor([3]), None, p, bonus)
    with pytest.raises(ValueError, match="bonus_token_ids must lie"):
        vllm_rejection_sample(ids, cu, None, p, torch.tensor([[4]]))
    with pytest.raises(ValueError, match="'bv' needs draft_probs"):
        vllm_rejection_sample(ids, cu, None, p, bonus, method="bv")
    with pytest.raises(ValueError, match="verifies one chain"):
        vllm_rejection_sample(ids, cu, p, p, torch.tensor([[3, 3]]), method="sps", num_drafts=2)
    with pytest.raises(ValueError, match="multiple of num_drafts"):
        vllm_rejection_sample(torch.tensor([1, 2, 3]), torch.tensor([3]), torch.full((3, 4), 0.25),
                              torch.full((3, 4), 0.25), torch.tensor([[3, 3]]), method="rrs", num_drafts=2)
    with pytest.raises(ValueError, match=r"draft_token_ids\[1\] = 9 is outside the vocabulary \[0, 4\)"):
        vllm_rejection_sample(torch.tensor([1, 9]), cu, None, p, bonus)
    with pytest.raises(ValueError, match="max_spec_len"):
        vllm_rejection_sample(ids, cu, None, p, bonus, max_spec_len=1)


def test_vllm_chains_share_their_first_row():
    """With num_drafts > 1 every chain's first token is drawn at the request's one position: a chain whose first
    row differs from chain 0's (the copy the tree reads) is an error — e.g. chain 1's head drafted from a row with
    q = 0 at its token, which ran silently against chain 0's copy — and equal copies verify as before."""
    ids, cu, bonus = torch.tensor([1, 2, 0, 3, 0, 2]), torch.tensor([2, 6]), torch.tensor([[0, 1], [2, 3]])
    p = torch.full((6, 4), 0.25, dtype=torch.float64)
    q = p.clone()
    out = vllm_rejection_sample(ids, cu, q, p, bonus, torch.Generator().manual_seed(0), method="univer",
                                num_drafts=2, process="iid")
    assert out.shape == (2, 3)
    for name, row, bad in (("draft_probs", 4, [0.5, 0.25, 0.25, 0.0]), ("target_probs", 4, [0.5, 0.25, 0.25, 0.0]),
                           ("draft_probs", 4, [0.25, 0.25, 0.0, 0.5]), ("target_probs", 4, [0.25, 0.25, 0.0, 0.5])):
        bad_q, bad_p = q.clone(), p.clone()                 # (the last two differ past the first column only)
        (bad_q if name == "draft_probs" else bad_p)[row] = torch.tensor(bad, dtype=torch.float64)
        with pytest.raises(ValueError, match=rf"{name}\[4\] \(request 1, chain 1's first token\) differs from "
                                             r"chain 0's row 2"):
            vllm_rejection_sample(ids, cu, bad_q, bad_p, bonus, method="univer", num_drafts=2, process="iid")
    # three chains: every chain's head against chain 0's, chain 1's as well as the last one's
    ids, cu, bonus = torch.tensor([1, 2, 3, 0, 2, 1]), torch.tensor([6]), torch.tensor([[0, 1, 2]])
    p = torch.full((6, 4), 0.25, dtype=torch.float64)
    for row in (2, 4):
        bad_q = p.clone()
        bad_q[row] = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64)
        with pytest.raises(ValueError, match=rf"draft_probs\[{row}\] \(request 0, chain {row // 2}'s first token\)"):
            vllm_rejection_sample(ids, cu, bad_q, p, bonus, method="univer", num_drafts=3, process="iid")


def test_sglang_adapter_checks_indices_coins_and_buffers():
    """A float retrive_index, coins that are not uniforms in [0, 1] (or a final coin without the others) and output
    buffers that are not integer tensors on the inputs' device are ValueErrors — they were truncated, read or filled
    silently; so are bfloat16 / float16 coins (the kernel takes float32 ones): on a 2^-8 / 2^-11 grid, a child
    accepted iff ``c ≤ A`` is accepted w.p. A up to half a grid step (0.598 against A = 0.5977 in bfloat16), and a
    generator beside the coins (it was ignored)."""
    ints, p = sglang_case()
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="retrive_index must hold integers"):
        sglang_verify_tree(**{**ints, "retrive_index": torch.tensor([[0.0, 1.5, 2.7]])}, target_probs=p,
                           draft_probs=p, method="tv", generator=gen)
    for name, buf in (("predicts", torch.zeros(3)), ("accept_index", torch.zeros(1, 2)),
                      ("accept_token_num", torch.zeros(1, dtype=torch.int32, device="meta"))):
        with pytest.raises(ValueError, match=f"{name} must be an int32 or int64 tensor on cpu"):
            sglang_verify_tree(**ints, target_probs=p, draft_probs=p, method="tv", generator=gen, **{name: buf})
    coins = dict(uniform_samples=torch.full((1, 3), 0.5), uniform_samples_for_final_sampling=torch.tensor([0.5]))
    for bad, match in ((dict(uniform_samples=[[0.5, 0.5, 0.5]]), "must be a \\[B, N\\] = \\[1, 3\\] tensor"),
                       (dict(uniform_samples=torch.full((1, 3), float("nan"))), "uniform_samples has an entry outside"),
                       (dict(uniform_samples_for_final_sampling=torch.tensor([2.0])), "sampling has an entry outside"),
                       (dict(uniform_samples=torch.ones(1, 3, dtype=torch.long)), "must be a float tensor"),
                       (dict(uniform_samples=torch.full((1, 3), 0.5, dtype=torch.bfloat16)), "float32 or float64"),
                       (dict(uniform_samples_for_final_sampling=torch.tensor([0.5], dtype=torch.float16)),
                        "float32 or float64")):
        with pytest.raises(ValueError, match=match):
            sglang_verify_tree(**ints, target_probs=p, method="nss", **{**coins, **bad})
    with pytest.raises(ValueError, match="given without uniform_samples"):
        sglang_verify_tree(**ints, target_probs=p, method="nss", generator=gen,
                           uniform_samples_for_final_sampling=torch.tensor([0.3]))
    with pytest.raises(ValueError, match="a generator and uniform_samples given"):     # the generator was ignored
        sglang_verify_tree(**ints, target_probs=p, method="nss", generator=gen, **coins)


def test_sglang_coins_never_read_the_root_candidate():
    """The root slot's candidate is the last verified token, not verified: SGLang's coin procedure ends without
    reading it (it indexed the target row with it, an IndexError for an id ≥ V), as the generator path does."""
    ints, p = sglang_case()
    coins = dict(uniform_samples=torch.full((1, 3), 0.1), uniform_samples_for_final_sampling=torch.tensor([0.5]))
    outs = [sglang_verify_tree(**{**ints, "candidates": torch.tensor([[root, 1, 2]])}, target_probs=p, method="nss",
                               **coins) for root in (0, 9, -7)]
    assert outs[0].accept_token_num.tolist() == [1]        # a leaf accepted: the walk ends past the tree
    for out in outs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(out, outs[0]))


def test_vllm_adapter_checks_shapes_counts_and_buffers():
    """bonus_token_ids must be [B, num_drafts] (a transposed [num_drafts, B] was reshaped: requests got each other's
    bonus tokens), num_drafts an int ≥ 1 (0 with sps / bv was told to use another method), accepted_draft an
    integer [B] tensor, target_probs float rows even without drafts, and an empty batch a ValueError."""
    V = 4
    ids, cu = torch.tensor([1, 2, 1, 2, 1, 2]), torch.tensor([2, 4, 6])          # B = 3 requests, 2 chains of 1
    p = torch.nn.functional.one_hot(torch.ones(6, dtype=torch.long), V).double()
    q = torch.full((6, V), 0.25, dtype=torch.float64)
    bonus = torch.tensor([[3, 0], [2, 0], [1, 0]])
    out = vllm_rejection_sample(ids, cu, q, p, bonus, torch.Generator().manual_seed(0), method="univer", num_drafts=2)
    assert out.tolist() == [[1, 3], [1, 2], [1, 1]]                             # chain 0 accepted, its bonus
    with pytest.raises(ValueError, match=r"bonus_token_ids \[B, num_drafts\] = \[3, 2\], got .*\[2, 3\]"):
        vllm_rejection_sample(ids, cu, q, p, bonus.T.contiguous(), method="univer", num_drafts=2)
    for m in (1.5, True, "2"):
        with pytest.raises(ValueError, match="num_drafts must be an int"):
            vllm_rejection_sample(ids, cu, q, p, bonus, method="univer", num_drafts=m)
    for method in ("sps", "bv"):                       # not "verifies one chain; use rrs … for num_drafts = 0"
        with pytest.raises(ValueError, match="num_drafts must be an int ≥ 1, got 0"):
            vllm_rejection_sample(ids, cu, q, p, bonus, method=method, num_drafts=0)
    for acc, match in ((torch.zeros(4, dtype=torch.long), r"accepted_draft must be \[B\] = \[3\]"),
                       (torch.zeros(3), "accepted_draft must be an int32 or int64 tensor")):
        with pytest.raises(ValueError, match=match):
            vllm_rejection_sample(ids, cu, q, p, bonus, method="univer", num_drafts=2, accepted_draft=acc)
    with pytest.raises(ValueError, match="cu_num_draft_tokens \\[B ≥ 1\\]"):
        vllm_rejection_sample(ids[:0], torch.tensor([], dtype=torch.long), None, p[:0],
                              torch.zeros(0, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="target_probs must be float32 or float64"):
        vllm_rejection_sample(ids[:0], torch.tensor([0]), None, torch.zeros(0, V, dtype=torch.long),
                              torch.tensor([[3]]))


def test_vllm_process_defaults_to_the_methods_own():
    """``process`` defaults to ``wor`` for rrsw (as the SGLang adapter's), ``iid`` otherwise; with one chain each
    node has one child, where iid and wor are one law, so any method takes either (``sps`` with ``wor`` raised)."""
    ids, cu = torch.tensor([1, 2, 0, 3]), torch.tensor([4])
    p = torch.full((4, 4), 0.25, dtype=torch.float64)
    run = lambda bonus, **kw: vllm_rejection_sample(ids, cu, p, p, torch.tensor([bonus]),
                                                    torch.Generator().manual_seed(0), **kw)
    assert torch.equal(run([0, 1], method="rrsw", num_drafts=2), run([0, 1], method="rrsw", num_drafts=2,
                                                                      process="wor"))
    assert torch.equal(run([1], method="sps", process="wor"), run([1], method="sps"))
    assert torch.equal(vllm_rejection_sample(ids, cu, p, p, torch.tensor([1]), torch.Generator().manual_seed(0)),
                       run([1], method="sps"))                                   # one chain: bonus [B] as [B, 1]
    with pytest.raises(ValueError, match="unknown process 'topk'"):
        run([0, 1], method="tv", num_drafts=2, process="topk")


def test_adapter_sizes_and_dtypes_a_serving_engineer_gets_wrong():
    """Each was accepted or a deep error: SGLang's ``num_speculative_tokens`` ignored beside a wider
    ``accept_index`` (a drafted token accepted at S = 1), a list ``accept_index`` an AttributeError, bfloat16 rows
    with ``validate=False`` a KeyError inside the support scan; vLLM's ``max_spec_len = 3.7`` a width of 4."""
    p = torch.tensor([[[0., 1.], [.5, .5]]])
    c, ri, nt, ns = torch.tensor([[0, 1]]), torch.tensor([[0, 1]]), torch.tensor([[1, -1]]), torch.tensor([[-1, -1]])
    wide = torch.full((1, 4), -1, dtype=torch.int32)
    out = sglang_verify_tree(c, ri, nt, ns, p, p, method="tv", accept_index=wide)      # S from the buffer: fine
    assert out.accept_token_num.tolist() == [1]
    for kwargs, match in (({"num_speculative_tokens": 1, "accept_index": wide}, "they are the same S"),
                          ({"accept_index": [[-1, -1]]}, "accept_index must be an int32 or int64 tensor"),
                          ({"num_speculative_tokens": 2.0}, "num_speculative_tokens must be an int ≥ 1")):
        with pytest.raises(ValueError, match=match):
            sglang_verify_tree(c, ri, nt, ns, p, p, method="tv", **kwargs)
    with pytest.raises(ValueError, match="float32 or float64 of one dtype, got torch.bfloat16"):
        sglang_verify_tree(c, ri, nt, ns, p.bfloat16(), p.bfloat16(), method="tv", validate=False)
    with pytest.raises(ValueError, match="float32 or float64 of one dtype, got torch.bfloat16"):   # the coin path too
        sglang_verify_tree(c, ri, nt, ns, p.bfloat16(), method="target-only", validate=False,
                           uniform_samples=torch.tensor([[0.5, 0.5]]),
                           uniform_samples_for_final_sampling=torch.tensor([0.5]))
    ids, cu, bonus = torch.tensor([1]), torch.tensor([1]), torch.tensor([0])
    rows = torch.tensor([[.5, .5]])                 # one row per drafted token
    assert vllm_rejection_sample(ids, cu, rows, rows, bonus, max_spec_len=3).shape == (1, 4)
    for bad in (3.7, "4", True, -1):
        with pytest.raises(ValueError, match="max_spec_len must be an int ≥ 0"):
            vllm_rejection_sample(ids, cu, rows, rows, bonus, max_spec_len=bad)


def test_float32_rows_from_logits_pass_the_adapters_own_check():
    """torch's float32 softmax sums in float32: a V = 49 152 row with a flat tail came 1.7e-5 short, past
    ``SIMPLEX_TOL``, so ``sample_children``, ``gpu.verify`` and both adapters refused the rows ``probs_from_logits``
    had made; it normalises in float64 now.  ``support_floor`` refuses its own bad arguments."""
    from gpu.probs import SIMPLEX_TOL, check_rows, probs_from_logits, support_floor
    z = torch.full((1, 49_152), -4.0)
    z[0, :7] = torch.tensor([9.0, 8.5, 8.0, 7.0, 6.5, 5.0, 3.0])
    for logits in (z, z.bfloat16()):
        q = probs_from_logits(logits)
        assert q.dtype == torch.float32 and abs(float(q.double().sum()) - 1) <= 1e-6 < SIMPLEX_TOL[torch.float32]
        check_rows("test", "q", q)
    q = probs_from_logits(z[:, :3])
    for args, match in (((q, z[:, :3], 4), "s must be an int in"), ((q, z[:, :3], 0), "s must be"),
                        ((q, z[:, :2], 1), "logits of their shape"), ((q.long(), z[:, :3], 1), "float32 / float64")):
        with pytest.raises(ValueError, match=match):
            support_floor(*args)
    assert torch.equal(support_floor(q, z[:, :3], np.int64(2)), support_floor(q, z[:, :3], 2))


def test_an_engines_own_float32_softmax_rows_are_verified_as_their_laws():
    """torch's float32 softmax (vLLM's ``compute_probs``, SGLang's sampling branch) sums in float32: ten tokens at
    logit 12 over a flat tail at V = 49 152 came 1.6e-4 short of 1, and both adapters refused the engine's own
    rows (``SIMPLEX_TOL`` 1e-5).  The adapters take float32 rows within the bound ``V·2^-24`` on a float32 sum's
    rounding and verify their float64 renormalisation (:func:`gpu.probs.engine_rows`; rows within ``SIMPLEX_TOL``
    in place); a row off by more is refused."""
    from gpu.probs import engine_rows
    V = 49_152
    logits = torch.zeros(3, V)
    logits[:, :10] = 12.0
    rows = torch.softmax(logits, dim=-1)
    assert 1e-5 < 1 - float(rows[0].double().sum()) < V * 2.0 ** -24
    law = engine_rows(rows)
    assert law.dtype == torch.float32 and (law.double().sum(-1) - 1).abs().max() <= 6e-8
    torch.testing.assert_close(law.double(), rows.double() / rows.double().sum(-1, keepdim=True), rtol=6e-8, atol=0)
    for as_is in (rows.double(), gpu.probs_from_logits(logits)):      # float64, and float32 within SIMPLEX_TOL
        assert engine_rows(as_is) is as_is                                # used in place, no copy
    ids, cu = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    # beyond min(V·2^-24, ENGINE_SUM_CAP = 1e-3) — a top-p row never renormalised — a row is left for the check
    short = gpu.probs_from_logits(logits[:2]) * torch.tensor([[1 - 5e-4], [1 - 2e-3]])
    kept = engine_rows(short)
    assert abs(float(kept[0].double().sum()) - 1) <= 6e-8 and torch.equal(kept[1], short[1])
    with pytest.raises(ValueError, match=r"target_probs row \[1\] does not sum to 1"):
        vllm_rejection_sample(ids, cu, short, short, torch.tensor([[3]]), method="sps")
    draft = gpu.probs_from_logits(logits + 0.5 * torch.randn(3, V, generator=torch.Generator().manual_seed(0)))
    g = torch.Generator().manual_seed(0)
    links = (torch.tensor([[0, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]]),
             torch.tensor([[-1, 2, -1]]))
    for q in (draft, rows):                                  # the engine's own float32 rows as drafts too
        for method in ("sps", "bv"):
            out = vllm_rejection_sample(ids, cu, q[:2], rows[:2], torch.tensor([[3]]), g, method=method)
            assert out.shape == (1, 3)
        for method in ("rrs", "tv"):
            out = sglang_verify_tree(*links, rows[None], q[None], method=method, process="iid", generator=g)
            assert out.accept_token_num.shape == (1,)
    # SGLang's coin path reads the renormalised rows: a coin between a child's raw and renormalised mass takes it
    raw = float(rows[0, 0])
    law = raw / float(rows[0].double().sum())
    coin = (raw + law) / 2
    out = sglang_verify_tree(*links, rows[None], None, method="nss", uniform_samples=torch.tensor([[coin, coin, 0.5]]),
                             uniform_samples_for_final_sampling=torch.tensor([0.5]))
    assert out.accept_index.tolist() == [[0, 1]]
    bad = torch.full((1, 3, 4), 0.25, dtype=torch.float64)
    bad[0, 0] = torch.tensor([0.1, 0.1, 0.1, 0.2])                # float64 rows on the coin path are checked too
    with pytest.raises(ValueError, match="does not sum to 1"):
        sglang_verify_tree(*links, bad, None, method="nss", uniform_samples=torch.tensor([[0.5, 0.5, 0.5]]),
                           uniform_samples_for_final_sampling=torch.tensor([0.5]))


def test_engine_rows_renormalise_only_within_a_float32_sums_rounding():
    """Below the cap the window is ``V·2^-24`` (the rounding a float32 sum of V terms can have): at V = 1 000 (6e-5) a
    float32 row 5e-4 short of 1 is no rounding but a truncated row, left as it is, and the adapters refuse it (a
    window of ENGINE_SUM_CAP alone renormalised it and verified against another law)."""
    from gpu.probs import engine_rows
    V = 1000
    short = gpu.probs_from_logits(torch.randn(2, V, generator=torch.Generator().manual_seed(0))) * (1 - 5e-4)
    assert V * 2.0 ** -24 < 1 - float(short[0].double().sum()) < 1e-3
    assert engine_rows(short) is short
    ids, cu = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"target_probs row \[0\] does not sum to 1"):
        vllm_rejection_sample(ids, cu, short, short, torch.tensor([[3]]), method="sps")


def test_sglang_coins_never_accept_a_child_the_target_cannot_emit():
    """SGLang's rule takes child j iff its coin ≤ ``A_j = Σ_{l≤j} P(y_l)``: a coin of exactly 0 (a float32
    ``torch.rand`` draws it with probability 2^-24) accepted a first child with P(y) = 0 (a top-k target's removed
    token) and emitted it.  A child with P(y) = 0 is never taken; the next child is, as on a coin of 2^-24."""
    logits = torch.randn(1, 3, 8, generator=torch.Generator().manual_seed(0))
    target = gpu.probs_from_logits(logits, 1.0, top=4)
    bad, good = int((target[0, 0] == 0).nonzero()[0]), int(target[0, 0].argmax())
    for coin in (0.0, 2.0 ** -24):
        out = sglang_verify_tree(torch.tensor([[0, bad, good]]), torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]]),
                                 torch.tensor([[-1, 2, -1]]), target, None, method="nss",
                                 uniform_samples=torch.tensor([[coin, 0.5, 0.5]]),
                                 uniform_samples_for_final_sampling=torch.tensor([0.5]))
        assert out.accept_index.tolist()[0][:2] == [0, 2] and float(target[0, 0, int(out.predicts[0])]) > 0


def test_output_buffers_narrower_than_int32_are_refused():
    """An int16 ``predicts`` wrapped token 33 000 to −32 536, a uint8 ``accepted_draft`` the −1 of "nothing
    accepted" to 255, silently: the buffers filled in place must be int32 / int64."""
    V = 40_000
    p = torch.zeros(1, 2, V, dtype=torch.float64)
    p[0, 0, 33_000] = p[0, 1, 35_000] = 1
    links = dict(candidates=torch.tensor([[0, 33_000]]), retrive_index=torch.tensor([[0, 1]]),
                 retrive_next_token=torch.tensor([[1, -1]]), retrive_next_sibling=torch.tensor([[-1, -1]]))
    gen = torch.Generator().manual_seed(0)
    out = sglang_verify_tree(**links, target_probs=p, draft_probs=p, method="tv", generator=gen,
                             predicts=torch.full((2,), -1, dtype=torch.int32))
    assert out.predicts.tolist() == [33_000, 35_000]
    for dtype in (torch.int16, torch.int8, torch.uint8):
        with pytest.raises(ValueError, match=f"predicts must be an int32 or int64 tensor on cpu, got dtype {dtype}"):
            sglang_verify_tree(**links, target_probs=p, draft_probs=p, method="tv", generator=gen,
                               predicts=torch.full((2,), 0, dtype=dtype))
    q = torch.full((1, 5), 0.2, dtype=torch.float64)
    target = torch.tensor([[0.0, 1, 0, 0, 0]], dtype=torch.float64)
    narrow = torch.zeros(1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="accepted_draft must be an int32 or int64 tensor on cpu, got dtype torch.uint8"
                       " on cpu"):
        vllm_rejection_sample([3], [1], q, target, [2], gen, method="bv", accepted_draft=narrow)


def test_rows_that_require_grad_verify_as_their_detached_values():
    """Rows from a model run outside ``no_grad`` (or ``nn.Parameter`` rows) raised torch's "Can't call numpy() on
    Tensor that requires grad" from the host path of both adapters; they are read detached."""
    ints, _ = sglang_case()
    p = torch.softmax(torch.randn(1, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
    grad = p.clone().requires_grad_(True)
    runs = [sglang_verify_tree(**ints, target_probs=x, draft_probs=x, method=m,
                               generator=torch.Generator().manual_seed(3))
            for m in ("univer", "rrsw") for x in (p, grad)]
    for plain, tracked in zip(runs[::2], runs[1::2]):
        assert all(torch.equal(a, b) for a, b in zip(plain, tracked))
    rows = torch.tensor([[.5, .3, .2]], dtype=torch.float64)
    tracked_rows = rows.clone().requires_grad_(True)
    out = [vllm_rejection_sample([1], [1], x, x, [0], torch.Generator().manual_seed(1), method="univer")
           for x in (rows, tracked_rows)]
    assert torch.equal(out[0], out[1])


def test_a_coin_equal_to_the_running_sum_accepts_and_a_last_request_without_drafts_gets_its_bonus():
    """SGLang's kernel accepts child y_j iff coin ≤ A_j (a coin equal to the running sum accepts: coin for coin with
    the kernel); a vLLM batch whose last request drafted nothing (``cu = [2, 2]``) returns that request's bonus
    token (its empty slice starts past the rows; it reads row 0)."""
    from gpu.engines import sglang
    cand, ridx = torch.tensor([[0, 1]]), torch.tensor([[0, 1]])
    first, sib = torch.tensor([[1, -1]]), torch.tensor([[-1, -1]])
    p = torch.tensor([[[0.5, 0.5], [0.25, 0.75]]], dtype=torch.float32)
    for coin, accepted in ((0.5, 1), (0.5000001, 0)):          # A_1 = p(1) = 0.5
        out = sglang.verify_tree(cand, ridx, first, sib, p, method="target-only",
                                 uniform_samples=torch.tensor([[coin, 0.0]]),
                                 uniform_samples_for_final_sampling=torch.tensor([0.0]))
        assert out.accept_token_num.tolist() == [accepted] and out.accept_index.tolist()[0][:accepted + 1] == \
            [0, 1][:accepted + 1], (coin, out)
    rows = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.1, 0.2, 0.3, 0.4]])
    out = vllm_rejection_sample(torch.tensor([1, 2]), torch.tensor([2, 2]), rows.clone(), rows, torch.tensor([3, 1]),
                                torch.Generator().manual_seed(0), method="sps")
    assert out.shape == (2, 3) and out[1].tolist() == [1, -1, -1]


def test_sglang_coins_read_float64_rows_on_the_simplex_in_place():
    """A float64 row 5e-10 short of 1 (valid) whose two children cover its support: a root coin in (ΣP, 1] rejected
    both and emitted token V − 1, of p = 0 (a 5e-10 law gap); the coins read it on the simplex, so the second child
    is taken.  The walk reads the input rows in place, float32 and float64 (it copied float32 rows whole into a
    float64 ``[B, N, V]``, twice their bytes)."""
    from gpu.engines import sglang
    p = torch.tensor([[[0.5, 0.5 - 5e-10, 0.0, 0.0], [0.25] * 4, [0.25] * 4]], dtype=torch.float64)
    links = (torch.tensor([[0, 0, 1]]), torch.tensor([[0, 1, 2]]), torch.tensor([[1, -1, -1]]),
             torch.tensor([[-1, 2, -1]]))
    for coin in (1 - 1e-10, 1.0):
        out = sglang.verify_tree(*links, p, method="target-only",
                                 uniform_samples=torch.tensor([[coin, 0.5, 0.5]], dtype=torch.float64),
                                 uniform_samples_for_final_sampling=torch.tensor([0.5], dtype=torch.float64))
        assert out.accept_index.tolist()[0][:2] == [0, 2] and out.accept_token_num.tolist() == [1], (coin, out)
    seen, real = [], sglang.target_only_coins
    sglang_coins = lambda *a: seen.append(a[3]) or real(*a)           # noqa: E731
    for rows in (p, p.float()):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sglang, "target_only_coins", sglang_coins)
            sglang.verify_tree(*links, rows, method="target-only", uniform_samples=torch.full((1, 3), 0.5),
                               uniform_samples_for_final_sampling=torch.tensor([0.5]))
        assert seen.pop().untyped_storage().data_ptr() == rows.untyped_storage().data_ptr()


def test_sglang_final_coin_of_one_gives_a_token_of_positive_residual_mass():
    """A final coin of exactly 1 (a uniform in [0, 1]) reads past the residual's CDF: Y is the last token of positive
    residual mass, not token V − 1 (here of p = 0)."""
    from gpu.engines import sglang
    cand, ridx = torch.tensor([[0, 1]]), torch.tensor([[0, 1]])
    first, sib = torch.tensor([[1, -1]]), torch.tensor([[-1, -1]])
    p = torch.tensor([[[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]], dtype=torch.float64)
    for final in (0.0, 0.5, 1.0):               # child 1 rejected (coin 0.9 > 0.5): the residual is token 2 alone
        out = sglang.verify_tree(cand, ridx, first, sib, p, method="target-only",
                                 uniform_samples=torch.tensor([[0.9, 0.0]], dtype=torch.float64),
                                 uniform_samples_for_final_sampling=torch.tensor([final], dtype=torch.float64))
        assert out.accept_token_num.tolist() == [0] and out.predicts[0].item() == 2, (final, out)


def test_sglang_coin_of_one_takes_the_last_child_covering_the_support():
    """A float64 row on the simplex whose normalised entries sum, in the children's order, to 1 − 2^-53: a root coin
    of 1 (a valid coin) rejected all three children, which cover the support, and emitted a rejected token (of
    residual mass 0); the last untried token of positive mass is taken on any coin."""
    from gpu.engines import sglang
    r = torch.tensor([0.41840707345002665, 0.38659096795350134, 0.19500195859647212], dtype=torch.float64)
    p = torch.stack([r] + [torch.full((3,), 1 / 3, dtype=torch.float64)] * 3)[None]
    links = (torch.tensor([[0, 2, 0, 1]]), torch.tensor([[0, 1, 2, 3]]), torch.tensor([[1, -1, -1, -1]]),
             torch.tensor([[-1, 2, 3, -1]]))
    out = sglang.verify_tree(*links, p, method="nss", uniform_samples=torch.tensor([[1.0, 0.5, 0.5, 0.5]]),
                             uniform_samples_for_final_sampling=torch.tensor([0.5]))
    assert out.accept_token_num.tolist() == [1] and out.accept_index.tolist()[0][:2] == [0, 3], out
