"""Sweep helpers shared by the paper checks and the notebooks (no algorithm lives here: they call the library).

* exact toys — E[τ] of named verifiers (:func:`expected_lengths`), the bounds that frame UniVer
  (:func:`bounds`: CF, the value-aware oracle ``univer-va``, the global tree LP; theory.md §4.3, §6.4), and an
  audit of every node context UniVer meets (:func:`node_audit`: ρ, α, construction, α*(ρ) from the CondOT LP);
* real trees — the SmolLM2 pair loaded once per process (:func:`real_pair`), one paired accept-bench run
  (:func:`real_bench`) and its gains with confidence intervals (:func:`gain_rows`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solvers import cf_bound, condot_lp, global_tree_lp, value_aware_verifier
from univer_theory import VERIFIERS, Verifier, evaluate, tuple_law
from univer_theory.verifiers import BASELINE
from univer_theory.engine import NodeContext
from univer_theory.plans.choose import small_lp
from univer_theory.univer import make_univer_verifier


def alpha_star_guaranteed(process: str, k: int, support: int) -> bool:
    """Whether UniVer's automatic choice reaches α*(ρ) at a node by construction, decided from the node (its
    process, k and draft support size), not from the plan's label of itself: k = 1; i.i.d. children (the layout,
    theory.md §6.3 rule 2); topk and greedy (the fills); wor children on a support of exactly k tokens or within
    the LP's size (rule 1, :func:`univer_theory.plans.choose.small_lp`).  Elsewhere (wor on a larger support) rule
    3 where feasible, else PTS, the i.i.d. coupling or rules 7–8: feasible, near-optimal."""
    return k == 1 or process != "wor" or support == k or bool(small_lp(support, k))


#: Two-sided normal quantile of a 95% confidence interval.
Z95 = 1.959963984540054


#: Slack of ``E[τ] ≤ CF`` beyond CF's own stated tolerance: CF's node values are certified upper bounds
#: (docs/deviations.md items 75, 78), so only round-off remains (−1.6e-14 at worst on 1 700 fresh instances); the
#: slack of before, an absolute 1e-9, let a method sit 1.9% above CF at E[τ] = 3e-8 unnoticed.
BOUND_SLACK = 1e-12


def comparison_methods(process: str) -> tuple[str, ...]:
    """The lossless methods compared with UniVer on ``process`` trees: baseline, K-SEQ (iid only), TV, UniVer."""
    return (BASELINE[process],) + (("kseq",) if process == "iid" else ()) + ("tv", "univer")


@lru_cache(maxsize=None)
def univer_variant(construction: str = "auto", slot_rule: bool = True, shape_rule: bool = True) -> Verifier:
    """A UniVer variant (one instance per setting, so its plan cache is shared by every caller)."""
    return make_univer_verifier(construction, slot_rule, shape_rule)


def expected_lengths(model, shape, process: str, verifiers) -> dict[str, float]:
    """Exact E[τ] of each verifier (``{name: Verifier}`` or names of :data:`VERIFIERS`) on (model, shape, process)."""
    if not isinstance(verifiers, dict):
        verifiers = {name: VERIFIERS[name] for name in verifiers}
    return {name: float(evaluate(model, shape, process, v).expected_accepted) for name, v in verifiers.items()}


def bounds(model, shape, process: str, with_global: bool = True) -> dict[str, float]:
    """``{"cf", "cf_alpha_root", "cf_tolerance", "cf_margin", "univer-va", "global"}``: the conditional-framework
    optimum CF (§6.4), CF with an α*-optimal root (``CFResult.alpha_root_value``), how far its value may sit below
    and above the exact CF, the exact E[τ] of the value-aware oracle verifier built from it, and
    the global tree LP (§4.3; omitted when ``with_global`` is False).  Raises RuntimeError if a solver failed;
    a global LP that HiGHS solved but whose recheck exceeded its tolerance is kept, its message under
    ``"global_note"``."""
    cf = cf_bound(model, shape, process)
    if not cf.success:
        raise RuntimeError(f"bounds: cf_bound failed: {cf.message}")
    va = evaluate(model, shape, process, value_aware_verifier(model, shape, process, cf=cf))
    out = {"cf": cf.value, "cf_alpha_root": cf.alpha_root_value, "cf_tolerance": cf.tolerance,
           "cf_margin": cf.margin, "univer-va": float(va.expected_accepted)}
    if with_global:
        glob = global_tree_lp(model, shape, process)
        if not glob.success and glob.status != 4:
            raise RuntimeError(f"bounds: global_tree_lp failed: {glob.message}")
        out["global"] = glob.value
        if not glob.success:           # optimal, but our recheck found a violation above its tolerance: keep, say so
            out["global_note"] = glob.message
    return out


@dataclass(frozen=True)
class NodeRecord:
    """One internal-node context met by a verifier: skeleton node, prefix, scaling ρ, realised children S, the
    probability ``reach`` that the drafted tree produces this context, the size ``support`` of its draft row's
    support, the rule's trace info (``construction``, ``slot_rule`` and its own ``reported_alpha``), and what the
    weights it actually applied give over all tuples of the context: ``alpha = Σ_y a(y)`` and
    ``excess = max_y (a(y) − ρ p(y))``, and ``leak = max_y |a(y) + e(y) − ρ p(y)|`` with ``e`` the correction
    token's mass (:func:`emitted_mass`): the node's own step of the §6.1 losslessness proof (:func:`node_audit`)."""

    node: int
    prefix: tuple[int, ...]
    rho: float
    children: tuple[int, ...]
    reach: float
    support: int
    construction: str
    slot_rule: bool
    alpha: float
    reported_alpha: float
    excess: float
    leak: float


def applied_marginal(decisions, V: int) -> np.ndarray:
    """``a(y) = Σ_S Q_k(S) Σ_{j: S_j = y} w_j(S)`` from the decisions a rule made on every tuple of one context
    (``[(S, Q_k(S), NodeDecision)]``): the path continues through child j w.p. ``w_j = e_j s_j Π_{l<j}(1 − e_l s_l)``
    (entered w.p. ``e_j``, then its subtree succeeds w.p. its scaling ``s_j``, theory.md §6.1) — the weights applied,
    recomputed independently of the plan's own account of its marginal."""
    a = np.zeros(V)
    for S, qs, d in decisions:
        go = 1.0
        for y, e, s in zip(S, d.enter, d.scale):
            take = float(e) * float(s)
            a[int(y)] += float(qs) * go * take
            go *= 1.0 - take
    return a


def emitted_mass(decisions, V: int) -> np.ndarray:
    """``e(y) = Σ_S Q_k(S) Π_j (1 − e_j s_j) · f(S) · R_S(y)``: the mass with which the node itself succeeds and
    emits ``y`` from its residual once every child failed (theory.md §6.1: ``a(y) + e(y) = ρ p(y)`` is the node's
    step of the losslessness proof) — from the decisions' own stop and residual, not the plan's marginal."""
    e = np.zeros(V)
    for S, qs, d in decisions:
        none = float(qs)
        for en, s in zip(d.enter, d.scale):
            none *= 1.0 - float(en) * float(s)
        e += none * float(d.stop) * np.asarray(d.residual, dtype=np.float64)
    return e


def node_audit(model, shape, process: str, verifier: Verifier) -> list[NodeRecord]:
    """Every internal-node context of every tree of (model, shape, process), with the verifier's trace info and
    the acceptance its applied weights give (:func:`applied_marginal`).

    A node's decision depends only on its ancestors' tuples (the scalings are handed down), so recursing over
    (skeleton node, prefix, ρ, S) visits each distinct context once instead of once per enumerated tree —
    the same set of contexts as ``Verifier.trace`` over :func:`~univer_theory.enumerate_trees`, and each
    ``reach`` is the total probability of the trees containing it.
    """
    records: list[NodeRecord] = []

    def rec(u: int, prefix: tuple, rho: float, reach: float) -> None:
        kids = shape.children[u]
        if not kids:
            return
        p, q = model.target(prefix), model.draft(prefix)
        keys = tuple(shape.subtree_keys[c] for c in kids)
        decisions = [(S, qs, verifier.rule(NodeContext(rho, p, q, S, process, keys, prefix)))
                     for S, qs in tuple_law(q, len(kids), process)]
        a = applied_marginal(decisions, len(p))
        c = float(rho) * np.asarray(p, dtype=np.float64)
        alpha, excess = float(a.sum()), float(np.max(a - c))
        leak = float(np.max(np.abs(a + emitted_mass(decisions, len(p)) - c)))
        for S, qs, d in decisions:
            records.append(NodeRecord(u, prefix, float(rho), tuple(int(y) for y in S), reach * float(qs),
                                      int(np.count_nonzero(np.asarray(q, dtype=np.float64))),
                                      d.info.get("construction", verifier.name), bool(d.info.get("slot_rule")),
                                      alpha, float(d.info["alpha"]), excess, leak))
            for c, y, s in zip(kids, S, d.scale):
                rec(c, prefix + (int(y),), s, reach * float(qs))

    rec(0, (), 1.0, 1.0)
    return records


def alpha_star_lp(model, record: NodeRecord, process: str, cache: dict) -> float:
    """α*(ρ) of the record's node from the CondOT(ρ) LP (:func:`solvers.condot_lp`), cached by (prefix, ρ, k);
    exactly 0 at ρ = 0 (``a ≤ ρp = 0``), where the LP's answer is its tolerance (1e-12)."""
    key = (record.prefix, record.rho, len(record.children))
    if record.rho == 0:
        return 0.0
    if key not in cache:
        res = condot_lp(model.target(record.prefix), model.draft(record.prefix), record.rho,
                        len(record.children), process)
        if not res.success:
            raise RuntimeError(f"alpha_star_lp: CondOT LP failed at prefix {record.prefix}: {res.message}")
        cache[key] = res.value
    return cache[key]


# ----------------------------------------------------------------------------------------------- real trees
@lru_cache(maxsize=1)
def real_pair():
    """The SmolLM2 target and its default draft, loaded once per process."""
    from gpu.llm.models import DEFAULT_DRAFT, load_pair

    return load_pair(DEFAULT_DRAFT)


def missing_batched(methods) -> list[str]:
    """Methods that have no batched verifier in :mod:`gpu` (too slow at V = 49 152 on the exact core)."""
    from gpu import METHODS

    return [m for m in methods if m not in METHODS]


def real_prompts(sets, per_set: int | None):
    """The first ``per_set`` prompts of each named set (round-robin over its categories), concatenated."""
    from gpu.llm.prompts import load_prompts

    return [p for name in sets for p in load_prompts(name, per_set)]


def real_bench(prompts, tree: str, methods, temperature: float, positions: int, seed: int = 0,
               process: str = "wor", progress: bool = False):
    """One paired accept-bench run (:func:`gpu.llm.accept_bench.accept_bench`) on the shared SmolLM2 pair."""
    from gpu.llm.accept_bench import accept_bench
    from gpu.llm.tree_draft import tree_shape

    return accept_bench(real_pair(), list(prompts), tree_shape(tree), process, methods, temperature, positions,
                        seed, progress=progress)


def subset_stats(result, keep) -> dict:
    """Pooled accept-bench statistics (``summary()["all"]``) of the records whose category satisfies ``keep``."""
    from dataclasses import replace

    return replace(result, records=tuple(r for r in result.records if keep(r.category))).summary()["all"]


def gain_interval(stats: dict, z: float = Z95, key: str = "gain") -> tuple[float, float, float]:
    """``(gain, low, high)`` of one method's accept-bench statistics: ``key ± z·<key>_se`` (``gain``: on E[τ];
    ``gain_per_forward``: on tokens per forward E[τ] + 1); NaN bounds when the standard error is undefined,
    e.g. a single prompt."""
    g, se = stats[key], stats.get(f"{key}_se")
    if se is None or not math.isfinite(se):
        return g, math.nan, math.nan
    return g, g - z * se, g + z * se


def gain_rows(bench_json: dict, method: str, z: float = Z95) -> list[dict]:
    """Per category (and ``"all"``) of an accept-bench JSON object: prompts, positions, the baseline's and the
    method's acceptance length (tokens per target forward, E[τ] + 1: ``baseline_length``, ``method_length``) and
    E[τ] (``baseline``, ``method``), and the method's gain over the baseline with its ``z``-interval on each —
    ``gain_per_forward`` (``pf_low``, ``pf_high``) and ``gain`` on E[τ] (``low``, ``high``)."""
    base = bench_json["baseline"]
    if base is None:
        raise ValueError("gain_rows: the accept-bench run has no baseline method, so there is no gain")
    groups = dict(bench_json["categories"])
    groups["all"] = {**bench_json["methods"], "prompts": sum(c["prompts"] for c in groups.values()),
                     "positions": sum(c["positions"] for c in groups.values())}
    rows = []
    for cat, entry in groups.items():
        pf, pf_lo, pf_hi = gain_interval(entry[method], z, key="gain_per_forward")
        g, lo, hi = gain_interval(entry[method], z)
        rows.append({"category": cat, "prompts": entry["prompts"], "positions": entry["positions"],
                     "baseline_length": entry[base]["acceptance_length"],
                     "method_length": entry[method]["acceptance_length"],
                     "baseline": entry[base]["expected_accepted"], "method": entry[method]["expected_accepted"],
                     "gain_per_forward": pf, "pf_low": pf_lo, "pf_high": pf_hi, "gain": g, "low": lo, "high": hi})
    return rows
