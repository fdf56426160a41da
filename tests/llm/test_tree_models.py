"""Real model pair: tree-attention scoring equals sequential decoding; the drafts are what their specs say."""
import numpy as np
import pytest
import torch

from gpu.llm.decode import start_caches, tree_step
from gpu.llm.models import build_draft
from gpu.llm.quantize import rtn_quantize
from gpu.llm.tree_draft import tree_shape

pytestmark = pytest.mark.llm

#: fp32 tolerance on logits, tree forward vs sequential forward.  Both run the same fp32 weights on the same
#: prefix; only the reduction order differs (different matmul / attention shapes, masked softmax over a longer
#: key set), which moves logits of magnitude ~20 by ~1e-5 after 30 layers (measured ≤ 6e-5).  1e-3 is ~20× that
#: and still ~1e-3 of a typical top-2 logit gap.
LOGIT_ATOL = 1e-3
#: Same comparison on the draft's probability rows (differences of softmax outputs are ≤ the logit error).
PROB_ATOL = 1e-4


@torch.inference_mode()
def _sequential_logits(model, ids):
    return model(torch.tensor([ids])).logits[0, -1]


@pytest.mark.parametrize("spec,process", [("binary:2", "wor"), ("((..),.)", "iid")])
def test_tree_logits_match_sequential_decoding(fp32_pair, prompt_ids, spec, process):
    """The decoder's step (:func:`gpu.llm.decode.tree_step`) after a first step whose tree was dropped except
    its node 1 (moved into place): every node's target logits, and every internal node's draft row, equal
    sequential decoding of that node's prefix — the dropped scratch entries are invisible."""
    pair = fp32_pair
    shape = tree_shape(spec)
    gen = torch.Generator().manual_seed(3)
    t_cache, d_cache, root, pending = start_caches(pair, [prompt_ids])
    first = tree_step(t_cache, d_cache, root, pending, shape, process, 1.0, gen)
    first.commit(t_cache, d_cache, [[1]])
    y = 100                                   # the next step's root token, as if Y = 100 had been drawn
    context = prompt_ids + [int(first.batch.token[0, 1]), y]
    assert int(t_cache.lengths[0]) == len(context) - 1 and t_cache.size == len(context) - 1
    step = tree_step(t_cache, d_cache, [y], [first.unfed(0, [1]) + [y]], shape, process, 1.0, gen)
    tree = step.batch.to_trees(pair.vocab_size)[0]
    assert tree.shape == shape
    for u in range(tree.num_nodes):
        ids = context + list(tree.path(u))
        err = float((step.target_logits[0, u] - _sequential_logits(pair.target, ids)).abs().max())
        assert err <= LOGIT_ATOL, f"node {u}: tree logits differ from sequential by {err:.2e}"
        if shape.children[u]:                 # leaves: no draft forward (nothing is drafted from them)
            q_seq = torch.softmax(_sequential_logits(pair.draft, ids).double(), -1)
            err_q = float((step.draft_probs[0, u] - q_seq).abs().max())
            assert err_q <= PROB_ATOL, f"node {u}: draft row differs from sequential by {err_q:.2e}"


def test_early_exit_draft_is_first_layers_norm_head(pair, prompt_ids):
    draft = build_draft(pair.target, "early:6")
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        hidden = pair.target(ids, output_hidden_states=True).hidden_states[6][0, -1]
        expect = pair.target.lm_head(pair.target.model.norm(hidden))
        got = draft(ids).logits[0, -1]
    assert float((got - expect).abs().max()) <= LOGIT_ATOL
    assert len(pair.target.model.layers) == 30, "building the draft must not truncate the target"


def test_rtn_draft_quantises_decoder_projections_only(pair):
    """rtn:4:128 runs its decoder projections and its head as packed int4 (PackedLinear) computing x Ŵᵀ with
    Ŵ = rtn_quantize(W) up to bf16 rounding; the embedding and norms are the target's own."""
    from gpu.llm.quantize import PackedLinear

    t_layer, d_layer = pair.target.model.layers[7], pair.draft.model.layers[7]
    x = torch.randn(3, 1536, generator=torch.Generator().manual_seed(0))
    for name in ("self_attn.q_proj", "mlp.down_proj"):
        lin, packed = t_layer.get_submodule(name), d_layer.get_submodule(name)
        assert isinstance(packed, PackedLinear)
        xi = x[:, :lin.in_features]
        ref = xi @ rtn_quantize(lin.weight, 4, 128).t()
        with torch.inference_mode():
            out = packed(xi)
        err = float((out - ref).abs().max())
        assert err <= 2e-2 * float(ref.abs().max())
        assert float((out - xi @ lin.weight.detach().t()).abs().max()) > err, "the draft is not the quantised weight"
    assert isinstance(pair.draft.lm_head, PackedLinear)
    assert torch.equal(pair.draft.model.embed_tokens.weight, pair.target.model.embed_tokens.weight)
    assert torch.equal(pair.draft.model.norm.weight, pair.target.model.norm.weight)


def test_the_float_rtn_draft_quantises_the_head_as_the_packed_one_does(pair, prompt_ids):
    """The float form of an RTN draft (every device but the CPU) kept the target's tied head, and the target was
    de-quantised from a Q4_1 GGUF (4-bit min/max groups of 32 columns), so RTN 4-bit groups of 32 reproduce its
    decoder projections exactly: ``rtn:4:32`` off the CPU was the target itself (q = p).  Its head is quantised
    (and untied) as in the packed form now: the draft's rows differ from the target's."""
    from gpu.llm.quantize import quantize_linear_layers

    target = pair.target
    proj = target.model.layers[0].self_attn.q_proj.weight.detach()
    assert torch.equal(rtn_quantize(proj, 4, 32), proj)             # the identity that made the draft the target
    draft = quantize_linear_layers(target, 4, 32)
    head = target.get_output_embeddings().weight.detach()
    assert torch.equal(draft.lm_head.weight, rtn_quantize(head, 4, 32))
    assert torch.equal(draft.model.embed_tokens.weight, target.model.embed_tokens.weight)   # untied, kept
    ids = torch.tensor([prompt_ids])
    with torch.inference_mode():
        p = torch.softmax(target(ids).logits[0, -1].double(), -1)
        q = torch.softmax(draft(ids).logits[0, -1].double(), -1)
    assert float((p - q).abs().sum()) / 2 > 1e-3                   # a draft, not the target


def test_draft_spec_errors(pair, tmp_path):
    for bad in ("rtn:4", "rtn:0:32", "rtn:16:128", "rtn:1:32", "early:0", "early:30", "lora:1", "hf:/no/such/folder",
                f"hf:{tmp_path}", "hf:"):
        with pytest.raises(ValueError, match="build_draft"):
            build_draft(pair.target, bad)


def test_an_hf_draft_with_another_vocabulary_of_the_same_size_is_refused(pair, tmp_path, monkeypatch):
    """``hf:DIR`` compared ``config.vocab_size`` only: a folder whose tokenizer swaps two ids ("Ġsea" and "Ġthe"
    mean each other's token) was accepted, the draft scoring other tokens than the ids say.  Its saved tokenizer
    is now compared with the target's; the same tokenizer, or none, passes."""
    import json

    from transformers import LlamaConfig

    import gpu.llm.models as models

    LlamaConfig(vocab_size=pair.target.config.vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=1).save_pretrained(tmp_path)
    monkeypatch.setattr(models, "build_draft", lambda target, spec: pair.draft)    # no draft to build here
    monkeypatch.setattr(models, "load_target", lambda device, use_cache: (pair.target, pair.tokenizer))
    assert models.load_pair(f"hf:{tmp_path}").draft is pair.draft                   # no tokenizer saved
    pair.tokenizer.save_pretrained(tmp_path)
    assert models.load_pair(f"hf:{tmp_path}").draft is pair.draft                   # the target's own
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["Ġsea"], vocab["Ġthe"] = vocab["Ġthe"], vocab["Ġsea"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="load_pair: the draft's tokenizer in .* is not the target's: token 'Ġ"):
        models.load_pair(f"hf:{tmp_path}")


def tv_root_alpha_wor_pair(p, q):
    """TV's acceptance rate α at the root (ρ = 1) for k = 2 wor children, in O(V log V).

    Child 1 is entered w.p. ``s_1 = min(1, p/q)``; then ``D = [p − q]_+``, ``R = ΣD``, ``r = 1`` and the draft
    is renormalised without y_1, so child 2 is entered w.p. ``min(1, D(y_2)(1 − q_1)/(R q(y_2)))``:
    ``α = Σ_{y_1} q_1 [s_1 + (1 − s_1) Σ_{y_2≠y_1} q_2 min(t, D_2/(R q_2))]`` with ``t = 1/(1 − q_1)``; the inner
    sum over all y_2 is read off prefix sums of the tokens sorted by ``D/(Rq)`` (then y_2 = y_1 is removed)."""
    s1 = np.minimum(1.0, p / q)
    D = np.maximum(p - q, 0.0)
    R = D.sum()
    ratio = D / (R * q)
    order = np.argsort(ratio)
    r_sorted = ratio[order]
    below = np.concatenate([[0.0], np.cumsum((D / R)[order])])              # Σ_{ratio < t} D/R
    above = np.concatenate([np.cumsum(q[order][::-1])[::-1], [0.0]])        # Σ_{ratio ≥ t} q
    t = 1.0 / (1.0 - q)
    m = np.searchsorted(r_sorted, t, side="left")
    inner = below[m] + t * above[m] - q * np.minimum(t, ratio)
    return float((q * (s1 + (1.0 - s1) * inner)).sum())


@pytest.mark.parametrize("process,k", [("iid", 3), ("wor", 2)])
def test_univer_root_acceptance_at_least_tv(pair, prompt_ids, process, k):
    """Per node, UniVer's plan attains α*(ρ) (theory.md §6.2; wor: rule 3 when feasible, else PTS / the iid
    coupling, near-optimal), so at the root (ρ = 1) its acceptance rate α = Σ_y a(y) is at least TV's — on
    real rows.  TV's α: the closed-form i.i.d. marginal (§6.3 rule 6) / :func:`tv_root_alpha_wor_pair`."""
    from univer_theory import DraftTree, VERIFIERS
    from univer_theory.plans.tv_plan import tv_plan

    t_root, d_root = (_sequential_logits(m, prompt_ids) for m in (pair.target, pair.draft))
    p = torch.softmax(t_root.double(), -1).numpy()
    q = torch.softmax(d_root.double(), -1).numpy()
    tokens = torch.multinomial(torch.from_numpy(q), k, replacement=process == "iid",
                               generator=torch.Generator().manual_seed(4))
    tree = DraftTree((-1,) + (0,) * k, (-1, *tokens.tolist()), pair.vocab_size)
    rows_p = np.stack([p] * (k + 1))
    rows_q = np.stack([q] * (k + 1))
    alpha_univer = VERIFIERS["univer"].trace(tree, rows_p, rows_q, process)[0]["alpha"]
    alpha_tv = tv_plan(p, q, 1.0, k, "iid").alpha if process == "iid" else tv_root_alpha_wor_pair(p, q)
    assert alpha_univer >= alpha_tv - 1e-12, (alpha_univer, alpha_tv)


def test_loaded_target_equals_the_gguf_weights(pair):
    """Whether read from the GGUF file or from the fp32 cache, the target's weights are the GGUF's Q4_1
    tensors de-quantised exactly (checked on the embedding and one MLP projection, read with ``gguf``)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from gpu.llm.models import gguf_path

    tensors = {t.name: t for t in GGUFReader(gguf_path()).tensors}
    for name, weight in (("token_embd.weight", pair.target.model.embed_tokens.weight),
                         ("blk.3.ffn_down.weight", pair.target.model.layers[3].mlp.down_proj.weight)):
        t = tensors[name]
        ref = torch.from_numpy(np.asarray(dequantize(t.data, t.tensor_type))).reshape(weight.shape)
        assert torch.equal(weight.detach(), ref.to(weight.dtype)), name


def test_loading_needs_no_network_and_leaves_the_users_environment_alone(tmp_path):
    """``gpu.llm`` set ``HF_HUB_OFFLINE=1`` in the user's whole process on import; every load now passes
    ``local_files_only``.  In a fresh interpreter without the offline variables and with the hub pointed at a
    closed port, the target loads from the GGUF file (an empty cache) and from its fp32 cache, and the environment
    is as it was."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", UNIVER_CACHE_DIR=str(tmp_path))
    code = ("import os\nfrom gpu.llm.models import load_target\n"
            "for _ in range(2):\n    model, tok = load_target()\n"
            "print(os.environ.get('HF_HUB_OFFLINE'), model.config.vocab_size)\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["None", "49152"], run.stdout
