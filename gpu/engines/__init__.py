"""gpu.engines — every gpu verifier behind a serving engine's own verification contract (docs/engines.md).

* :func:`sglang_verify_tree` (:mod:`gpu.engines.sglang`): SGLang's EAGLE tree verification
  (``tree_speculative_sampling_target_only``'s tensors in, ``predicts`` / ``accept_index`` /
  ``accept_token_num`` out), methods nss (= target-only), rrs, rrsw, tv, univer;
* :func:`vllm_rejection_sample` (:mod:`gpu.engines.vllm`): vLLM's ``RejectionSampler`` (flattened drafts in,
  ``output_token_ids`` out), methods sps, bv, and rrs / rrsw / tv / univer for several drafts per request.

Both convert the engine's tensors to a :class:`gpu.TreeBatch` with rows, run :func:`gpu.verify` and write the
result back in the engine's layout, on the inputs' device.
"""
from .sglang import SGLangOutputs, verify_tree as sglang_verify_tree
from .vllm import PLACEHOLDER_TOKEN_ID, rejection_sample as vllm_rejection_sample

__all__ = ["PLACEHOLDER_TOKEN_ID", "SGLangOutputs", "sglang_verify_tree", "vllm_rejection_sample"]
