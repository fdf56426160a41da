"""Bad input raises ValueError naming what is wrong."""
from fractions import Fraction as F

import numpy as np
import pytest

from univer_theory import VERIFIERS, DirichletModel, DraftTree, TableModel, TreeShape, evaluate, tuple_law
from univer_theory.validation import Unsupported

TREE = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 1), vocab_size=3)
GOOD = np.full((3, 3), 1 / 3)


@pytest.mark.parametrize("target,draft,match", [
    (np.where(np.eye(3, dtype=bool), np.nan, 0.5), GOOD, "NaN"),
    (np.array([[1.2, -0.2, 0.0]] * 3), GOOD, "negative"),
    (np.full((3, 3), 0.3), GOOD, "sums to 0.9"),
    (np.array([[0.5, 0.5 + 1e-8, 0.0]] * 3), GOOD, r"off by \+1e-08, tolerance 1e-09"),   # SIMPLEX_ATOL = 1e-9
    (np.array([[0.5, 0.5 + 1e-10, 0.0]] * 3), GOOD, None),                                # within it: fine
    (np.array([[True, F(0), F(0)]] * 3, dtype=object), np.full((3, 3), F(1, 3), dtype=object), "holds a bool value"),
    (GOOD, np.array([[0.0, 0.5, 0.5]] + [[1 / 3] * 3] * 2), r"draft_probs\[0, 0\] = 0"),
    # the tree declares V = 3: rows of V = 4 were accepted (tokens in range), the declaration never read
    (np.full((3, 4), 0.25), np.full((3, 4), 0.25), "declares vocab_size 3 but the rows have V = 4"),
    (GOOD, np.full((3, 4), 0.25), "disagree"),
    (np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), "3 nodes"),
])
def test_bad_rows(target, draft, match):
    if match is None:
        VERIFIERS["tv"].law(TREE, target, draft, "iid")
        return
    with pytest.raises(ValueError, match=match):
        VERIFIERS["tv"].law(TREE, target, draft, "iid")


def test_token_out_of_vocab():
    tree = DraftTree(parent=(-1, 0), token=(-1, 5))
    with pytest.raises(ValueError, match="token 5"):
        VERIFIERS["rrs"].law(tree, np.full((2, 3), 1 / 3), np.full((2, 3), 1 / 3), "iid")


@pytest.mark.parametrize("parent,token,match", [
    ((), (), "empty"),
    ((0, 0), (-1, 1), "root"),
    ((-1, 2, 0), (-1, 0, 1), "node 1 has parent 2"),
    ((-1, 0, -1), (-1, 0, 1), "node 2 has parent -1"),
    ((-1, 0), (-1,), "token has 1 entries"),
    ((-1, 0), (-1, 7), "outside"),
    ((-1, 0.5), (-1, 1), r"parent\[1\] must be an integer, got 0.5"),
    ((-1, 0), (-1, True), r"token\[1\] must be an integer, got True"),
    ((-1, 0), (-1, np.bool_(True)), r"token\[1\] must be an integer"),
    ((-1, 0), (-1, 1.0), r"token\[1\] must be an integer, got 1.0"),
])
def test_malformed_tree(parent, token, match):
    with pytest.raises(ValueError, match=match):
        DraftTree(parent=parent, token=token, vocab_size=3)


@pytest.mark.parametrize("text,match", [
    ("((.)", "balanced"), ("2,x", "cannot read"), ("0", "positive"), ("(,,.)", "comma at position 1"),
    ("(.,)", "does not separate two children"), ("(.,,.)", "comma at position 2"), ("((),.)", "empty '\\(\\)'")])
def test_bad_shape(text, match):
    with pytest.raises(ValueError, match=match):
        TreeShape.parse(text)


def test_process_mismatches():
    p = np.full((3, 3), 1 / 3)
    dup = DraftTree(parent=(-1, 0, 0), token=(-1, 1, 1), vocab_size=3)
    with pytest.raises(ValueError, match="duplicate children"):
        VERIFIERS["rrsw"].law(dup, p, p, "wor")
    with pytest.raises(Unsupported, match="processes"):
        VERIFIERS["rrs"].law(TREE, p, p, "wor")
    with pytest.raises(ValueError, match="unknown process"):
        VERIFIERS["tv"].law(TREE, p, p, "beam")
    with pytest.raises(ValueError, match="only 2 tokens"):
        tuple_law(np.array([0.5, 0.5, 0.0]), 3, "wor")
    q = np.array([[0.5, 0.3, 0.2]] * 3)
    not_top = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 2), vocab_size=3)
    with pytest.raises(ValueError, match="top-2"):
        VERIFIERS["nss"].law(not_top, p, q, "topk")


def test_chain_only_and_rational_guards():
    p = np.full((3, 3), 1 / 3)
    with pytest.raises(Unsupported, match="chains only"):
        VERIFIERS["bv"].law(TREE, p, p, "iid")
    exact = np.array([[F(1, 3)] * 3] * 3, dtype=object)
    with pytest.raises(Unsupported, match="rational"):
        VERIFIERS["kseq"].law(TREE, exact, exact, "iid")


def test_mixed_exact_and_float_rejected():
    exact = np.array([[F(1, 3)] * 3] * 3, dtype=object)
    with pytest.raises(ValueError, match="both be exact"):
        VERIFIERS["tv"].law(TREE, exact, np.full((3, 3), 1 / 3), "iid")


def test_exact_node_plans_read_rho_exactly_and_one_mode():
    """An exact ρ was checked as a float: 1 + 10⁻³⁰ read as 1 (``tv_plan`` divided by zero, the fill plan's stop was
    above 1) and −10⁻⁴⁰⁰ as −0 (negative marginals); Fraction rows beside a float row, or a float ρ beside Fraction
    rows, gave plans of neither mode, where ``Verifier.law`` refuses the same mix."""
    from univer_theory.plans import build_plan, tv_plan
    p = np.array([F(1, 2), F(1, 4), F(1, 4)], dtype=object)
    q = np.array([F(1, 4), F(1, 4), F(1, 2)], dtype=object)
    plans = (lambda *a: tv_plan(*a, 2, "iid"), lambda *a: tv_plan(*a, 2, "wor"),
             lambda *a: build_plan("fill", *a, 2, "topk"), lambda *a: build_plan("tv", *a, 1, "iid"))
    for plan in plans:
        for rho in (1 + F(1, 10**30), -F(1, 10**400)):
            with pytest.raises(ValueError, match=r"rho must lie in \[0, 1\]"):
                plan(p, p, rho)
        for rows in ((p, q.astype(float)), (p.astype(float), q)):
            with pytest.raises(ValueError, match="both be exact"):
                plan(*rows, F(1, 2))
        with pytest.raises(ValueError, match="rho must be exact"):
            plan(p, q, 0.5)
        assert plan(p, q, 1).alpha == plan(p, q, F(1)).alpha        # the engine's root ρ is the int 1


def test_model_tables_validated(tmp_path):
    with pytest.raises(ValueError, match="root row"):
        TableModel(2, {(0,): [0.5, 0.5]}, {(): [0.5, 0.5]})
    with pytest.raises(ValueError, match="length 3, expected vocab 2"):
        TableModel(2, {(): [0.2, 0.3, 0.5]}, {(): [0.5, 0.5]})
    bad = tmp_path / "m.json"
    bad.write_text('{"vocab": 2, "target": {"": [0.5, 0.6]}, "draft": {"": [0.5, 0.5]}}')
    with pytest.raises(ValueError, match="sums to 1.1"):
        TableModel.from_json(bad)
    with pytest.raises(ValueError, match="similarity"):
        DirichletModel(3, similarity=1.5)
    bad.write_text('{"vocab": 2, "target": {"": [0.9, 0.1], "": [0.1, 0.9]}, "draft": {"": [0.5, 0.5]}}')
    with pytest.raises(ValueError, match="cannot read .*key '' appears twice"):   # json kept the last row
        TableModel.from_json(bad)


def test_seeds_are_one_32_bit_word():
    """Each prefix's stream is ``SeedSequence([seed, len(prefix), *prefix])``: a seed of 2^32 or more spans two
    words and reads as another seed's longer prefix (seed 2^32's root row was seed 0's row after token 0)."""
    from univer_theory import ConfidentModel

    for family in (DirichletModel, ConfidentModel):
        assert np.array_equal(family(3, seed=0).target((0,)), family(3, seed=0).target((0,)))
        assert not np.array_equal(family(3, seed=2 ** 32 - 1).target(()), family(3, seed=0).target((0,)))
        with pytest.raises(ValueError, match=f"^{family.__name__}: seed must be below 2\\^32"):
            family(3, seed=2 ** 32)


def test_exact_model_files_read_json_numbers_as_written(tmp_path):
    """In exact mode a JSON number is read from its text, as a string entry is: through float64, 1e-400 became 0
    (a target row [1e-400, 1] off the simplex was accepted as [0, 1]) and 20-digit entries that sum to 1 exactly
    as written were rounded.  Float mode reads the same numbers as floats."""
    from fractions import Fraction

    path = tmp_path / "m.json"
    path.write_text('{"vocab": 2, "target": {"": [1e-400, 1]}, "draft": {"": [0.5, 0.5]}}')
    with pytest.raises(ValueError, match="sums to"):
        TableModel.from_json(path, exact=True)
    path.write_text('{"vocab": 2, "target": {"": [0.10000000000000000001, 0.89999999999999999999]}, '
                    '"draft": {"": [0.5, 0.5]}}')
    exact = TableModel.from_json(path, exact=True).target(())
    assert list(exact) == [Fraction("0.10000000000000000001"), Fraction("0.89999999999999999999")]
    assert list(TableModel.from_json(path).target(())) == [0.1, 0.9]


def test_tree_vocab_declarations_agree_with_the_rows():
    """A tree without a declared vocab_size takes any V above its tokens; batching trees that declare different
    ones is refused (the batch keeps no vocab_size, the rows set V)."""
    torch = pytest.importorskip("torch")

    from gpu import TreeBatch, expected_accepted_length
    plain = DraftTree(parent=(-1, 0, 0), token=(-1, 0, 1))
    rows = np.full((3, 4), 0.25)
    assert VERIFIERS["tv"].expected_accepted_length(plain, rows, rows, "iid") > 0
    with pytest.raises(ValueError, match=r"declare different vocab_size values \[3, 5\]"):
        TreeBatch.from_trees([TREE, DraftTree((-1, 0), (-1, 1), vocab_size=5)])
    batch = TreeBatch.from_trees([TREE, plain])
    t = torch.tensor(np.stack([rows[:, :3] * 4 / 3] * 2))
    assert expected_accepted_length(batch, t, t, "iid", "tv").shape == (2,)


def test_to_fractions_keeps_the_support_or_refuses():
    """``to_fractions`` gave (1/2, 1/2, 0) for (.3, .3, .4) at denominator 2 — the largest entry dropped — and
    rounded rows off the simplex or with NaN into Fractions (or an OverflowError); each is a ValueError now."""
    from univer_theory import to_fractions
    assert [str(x) for x in to_fractions(np.array([.3, .3, .4]), 10)] == ["3/10", "3/10", "2/5"]
    for row, d, match in (([.3, .3, .4], 2, "too small for a row with 3 positive entries"),
                          ([.2] * 5, 4, "too small"), ([.5, .6], 1000, "sums to 1.1"),
                          ([1.5, -.5], 1000, "negative entry"), ([np.nan, .5], 1000, "NaN"),
                          ([.5, .5], 0, "denominator must be an integer ≥ 1"), ([.5, .5], 2.0, "integer ≥ 1")):
        with pytest.raises(ValueError, match=match):
            to_fractions(np.array(row), d)


def test_apply_temperature_and_kseq_rho_star_refuse_rows_off_the_simplex():
    """Both public row functions passed bad rows through: ``apply_temperature`` returned an unnormalised row as it
    was at T = 1 (and normalised it at T = 1 + 1e-7), ``kseq_rho_star`` returned ρ* = 1 for NaN or negative rows and
    for k ≤ 0."""
    from univer_theory import apply_temperature, kseq_rho_star
    p, q = np.array([.5, .3, .2]), np.array([.2, .3, .5])
    for T in (0.5, 1.0, 2.0):
        with pytest.raises(ValueError, match="sums to 1.2"):
            apply_temperature(np.array([.5, .7]), T)
    with pytest.raises(ValueError, match="NaN"):
        apply_temperature(np.array([np.nan, .5]), 1.0)
    assert 1 <= kseq_rho_star(p, q, 2) <= 2
    for args, match in (((np.array([np.nan, .5, .5]), q, 2), "NaN"), ((-p, q, 2), "negative"),
                        ((p, q, 0), "k must be an integer ≥ 1"), ((p, q, 1.5), "k must be an integer"),
                        ((p, q[:2] / q[:2].sum(), 2), "differ"), ((p, q, np.array([2, 2])), "does not broadcast")):
        with pytest.raises(ValueError, match=match):
            kseq_rho_star(*args)


def test_kseq_acceptance_mass_refuses_what_kseq_rho_star_refuses():
    """It returned zeros for k = 0, negative masses for k = −1 or a negative row, NaN for ρ = 0 (a sibling of
    ``kseq_rho_star``, exported by ``solvers`` too); its errors named ``kseq_rho_star``, ρ = True was read as 1 and
    a ρ per row of the wrong length was numpy's broadcast error."""
    from univer_theory.verifiers import kseq_acceptance_mass
    p, q = np.array([.5, .3, .2]), np.array([.2, .3, .5])
    from univer_theory import kseq_rho_star
    rho = kseq_rho_star(p, q, 2)
    assert np.all(kseq_acceptance_mass(p, q, 2, rho) <= np.minimum(p, rho * q) + 1e-15)   # at ρ*: ≤ min(p, ρ*q)
    two = np.stack([p, p]), np.stack([q, q])
    for args, match in (((p, q, 0, 1.0), "k must be an integer ≥ 1"), ((p, q, 1.5, 1.0), "k must be"),
                        ((-p, q, 2, 1.0), "negative"), ((np.array([np.nan, .5, .5]), q, 2, 1.0), "NaN"),
                        ((p, q, 2, 0.0), "rho must be a finite number > 0"), ((p, q, 2, np.nan), "rho must be"),
                        ((p, q[:2] / q[:2].sum(), 2, 1.0), "differ"), ((p, q, 2, True), "rho must be"),
                        ((*two, 2, np.ones(3)), r"rho of shape \(3,\) does not broadcast to the rows \(2,\)")):
        with pytest.raises(ValueError, match="^kseq_acceptance_mass: .*" + match):    # its own name, not ρ*'s
            kseq_acceptance_mass(*args)


def test_temperature_must_be_one_real_number():
    """``check_temperature`` was a bare ``float(value)``: a tensor or array gave an unnamed error (or its first
    entry), ``None`` a TypeError, and ``"0.7"`` / ``True`` were read as 0.7 / 1."""
    from fractions import Fraction

    from univer_theory import TemperedModel
    from univer_theory.validation import check_temperature
    for value, want in ((0.7, 0.7), (0, 0.0), (np.float32(0.5), 0.5), (Fraction(1, 2), 0.5), (np.int64(2), 2.0)):
        assert check_temperature(value, "f") == want
    for bad, got in ((None, "NoneType None"), ("0.7", "str '0.7'"), (True, "bool True"),
                     (np.array([0.7]), "ndarray of shape \\[1\\]")):
        with pytest.raises(ValueError, match=f"^TemperedModel: temperature must be one real number, got {got}"):
            TemperedModel(DirichletModel(3, seed=0), bad)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature must be finite and ≥ 0"):
            check_temperature(bad, "f")


def test_tree_and_row_checks_at_their_boundaries():
    """A node that is its own parent (``path()`` would loop), a token equal to V (in the constructor and against the
    rows: a ValueError, not an IndexError), a negative entry however small, a confident tail of half the draft."""
    from univer_theory.models import ConfidentModel
    from univer_theory.validation import check_simplex
    for cls, args in ((TreeShape, ((-1, 0, 2),)), (DraftTree, ((-1, 0, 2), (-1, 0, 1)))):
        with pytest.raises(ValueError, match="parents must precede"):
            cls(*args)
    DraftTree((-1, 0), (-1, 2), vocab_size=3)
    with pytest.raises(ValueError, match="outside"):
        DraftTree((-1, 0), (-1, 3), vocab_size=3)
    rows = np.full((2, 3), 1 / 3)
    with pytest.raises(ValueError, match="outside"):
        VERIFIERS["tv"].law(DraftTree((-1, 0), (-1, 3)), rows, rows, "iid")
    check_simplex(np.array([0.5, 0.5, 0.0]), "t", "row")
    with pytest.raises(ValueError, match="negative entry"):
        check_simplex(np.array([0.5 + 1e-12, 0.5, -1e-12]), "t", "row")
    ConfidentModel(4, tail=0.49)
    for tail in (0.5, 0.7, 0.0, 1.0):
        with pytest.raises(ValueError, match="tail must lie in"):
            ConfidentModel(4, tail=tail)


def test_a_user_rules_malformed_decision_is_named():
    """A node rule's decision must give one enter and one scale entry per child, each in [0, 1], a stop in [0, 1]
    and a finite nonnegative [V] residual: a short tuple was cut short by zip and an entry above 1 read as a
    probability — the oracle then flagged a loss it could not name (``evaluate`` did not check at all, ``law`` did;
    a NaN residual gave a NaN law and E[τ], and ``expected_accepted_length`` the finite E[τ] of the rule it broke); a
    scalar entry was a TypeError."""
    import sympy
    from univer_theory import Verifier
    from univer_theory.engine import NodeDecision
    good = VERIFIERS["rrs"].rule

    def rule_with(**changes):
        def bad_rule(ctx):
            d = good(ctx)
            return "not a decision" if changes.get("kind") else NodeDecision(
                **{**{f: getattr(d, f) for f in ("enter", "scale", "stop", "residual")}, **changes})
        return Verifier("bad", bad_rule, ("iid",), "a malformed rule")

    for changes, match in (({"enter": (1.0,)}, "1 enter and 2 scale entries for 2 children"),
                           ({"scale": (1.0, 1.0, 1.0)}, "2 enter and 3 scale entries"),
                           ({"enter": (1.5, 0.2)}, r"enter 1.5 outside \[0, 1\]"),
                           ({"scale": (0.5, float("nan"))}, r"scale nan outside \[0, 1\]"),
                           ({"stop": -0.1}, r"stop -0.1 outside \[0, 1\]"),
                           ({"residual": np.ones(2) / 2}, r"a residual of shape \(2,\), not \[3\]"),
                           ({"residual": np.array([0.5, float("nan"), 0.5])},
                            r"residual entry nan \(token 1\) negative, infinite or NaN"),
                           ({"residual": np.array([1.25, -0.25, 0.0])},
                            r"residual entry -0.25 \(token 1\) negative, infinite or NaN"),
                           ({"residual": np.array([0.5, np.inf, 0.5])},
                            r"residual entry inf \(token 1\) negative, infinite or NaN"),
                           ({"residual": np.array(["a", "b", "c"])}, "a residual of <U1 entries, not numbers"),
                           ({"enter": (sympy.nan, 0.2)}, r"enter nan outside \[0, 1\]"),
                           ({"scale": (sympy.Symbol("s"), 1)}, r"scale s outside \[0, 1\]"),
                           ({"enter": 0.5}, "enter and scale must list one entry per child, got float and"),
                           ({"kind": 1}, "returned str at node 0, not a NodeDecision")):
        message = "node rule bad_rule" + (" at node 0: " if "kind" not in changes else " ") + match
        with pytest.raises(ValueError, match=message):
            rule_with(**changes).law(TREE, GOOD, GOOD, "iid")
        with pytest.raises(ValueError, match=message):                    # the oracle's enumeration checks it too
            evaluate(DirichletModel(3, seed=0), "2", "iid", rule_with(**changes))
    assert VERIFIERS["rrs"].law(TREE, GOOD, GOOD, "iid")                   # the rule itself passes


@pytest.mark.parametrize("off", [2.2e-16, 1e-15, 5e-10])
def test_rows_a_little_above_one_are_verified_exactly(off):
    """A row that validation accepts (its sum within 1e-9 of 1) may hold an entry 1 + off: every verifier decides
    it — NSS's enter probability p(y) is clamped at 1, as the batched twin's (it was refused as ``enter
    1.0000000000000002 outside [0, 1]``), and the residual ``p`` that RRS, RRSw, SpS and TV hand back when
    ``[p − q]_+`` rounds to 0 is a valid residual (item 130's first bound above 1 refused it) — and the certain
    token is accepted.  (Every verifier and process that drafts a one-child tree: SpecHub's two distinct children
    need two tokens.)"""
    from univer_theory import DraftTree, TreeShape, context_free
    rows = np.array([[1 + off, 0.0, 0.0]] * 2)
    model = context_free(rows[0], rows[0].copy())
    for name, v in VERIFIERS.items():
        for process in v.processes:
            if not v.supports(TreeShape.parse("1"), process):       # SpecHub: two distinct children, not on one token
                continue
            assert v.expected_accepted_length(DraftTree((-1, 0), (-1, 0)), rows, rows.copy(), process) == 1, name
            assert abs(evaluate(model, "1", process, v).expected_accepted - 1) <= 4 * off, (name, process)  # Q(T)


def test_an_object_row_names_the_value_it_cannot_take():
    """An object row holding a sympy Rational (or None, a string) said it "mixes Fractions with Half values" where
    it held no Fraction at all."""
    import sympy

    from univer_theory.validation import as_prob_array
    for row, kind in (([sympy.Rational(1, 2), sympy.Rational(1, 2)], "Half value 1/2"),
                      (np.array([0.5, None], dtype=object), "float value 0.5"),
                      (np.array(["a", "b"], dtype=object), "str value 'a'")):
        with pytest.raises(ValueError, match=f"w: row holds a {kind} among objects: the exact mode takes Fractions"):
            as_prob_array(row, "w", "row")


def test_a_float_in_an_exact_decision_is_named():
    """On rows of Fractions a rule declared rational (``Verifier``'s default) must decide in Fractions: RRS with its
    coins scaled by 1 − 1e-14 in floats turned E[τ] and the distance into floats and passed as lossless (3.0e-15
    below the float tolerance; the same rule in Fractions: lossy), without a word."""
    from dataclasses import replace
    from fractions import Fraction

    from univer_theory import Verifier
    from univer_theory.engine import NodeDecision
    rrs = VERIFIERS["rrs"].rule

    def scaled(factor):
        def rule(ctx):
            d = rrs(ctx)
            return NodeDecision(tuple(factor(a) for a in d.enter), d.scale, d.stop, d.residual)
        return Verifier("scaled", rule, ("iid",), "RRS with shrunk coins")

    model = DirichletModel(4, seed=0, exact=True)
    with pytest.raises(ValueError, match=r"node rule rule at node 0: enter 0\.99999999999999 is a float in exact "
                                         r"mode .*rational=False"):
        evaluate(model, "2", "iid", scaled(lambda a: float(a) * (1 - 1e-14)))
    exact = evaluate(model, "2", "iid", scaled(lambda a: a * (1 - Fraction(1, 10 ** 14))))
    assert isinstance(exact.expected_accepted, Fraction) and not exact.lossless
    assert evaluate(model, "2", "iid", VERIFIERS["rrs"]).lossless
    # every entry of a decision, on both of the exact core's paths: the law enumeration (evaluate) and a tree's own
    # law and E[τ] (Verifier.law / expected_accepted_length, through engine.allocate)
    floats = {"enter": lambda d: replace(d, enter=tuple(float(a) for a in d.enter)),
              "scale": lambda d: replace(d, scale=tuple(float(a) for a in d.scale)),
              "stop": lambda d: replace(d, stop=float(d.stop)),
              "residual entry": lambda d: replace(d, residual=np.array([float(r) for r in d.residual], dtype=object))}
    tree = DraftTree((-1, 0, 0), (-1, 1, 2))
    p, q = model.node_probs(tree)
    for what, edit in floats.items():
        verifier = Verifier("floats", lambda ctx, edit=edit: edit(rrs(ctx)), ("iid",), f"RRS with a float {what}")
        for call in (lambda: evaluate(model, "2", "iid", verifier),
                     lambda: verifier.law(tree, p, q, "iid"),
                     lambda: verifier.expected_accepted_length(tree, p, q, "iid")):
            with pytest.raises(ValueError, match=rf"node rule <lambda> at node 0: {what} .* is a float in exact mode"):
                call()


def test_exact_rows_keep_their_own_order_where_float64_ties_them():
    """Fraction entries 1e-20 apart round to one float64: T = 0 took the first of them as the greedy token (TV's
    E[τ] 1/10 instead of 9/10 over its drafts; 0 instead of 1 on the target's token), and the topk sampler drafted children the exact core then refused ("do not begin
    with the top-2 draft tokens").  Both read the exact rows' own order now."""
    from fractions import Fraction

    from univer_theory import sample_tree
    from univer_theory.models import apply_temperature, context_free

    eps = Fraction(1, 10 ** 20)
    row = np.array([Fraction(1, 2) - eps, Fraction(1, 2) + eps], dtype=object)
    assert list(apply_temperature(row, 0)) == [0, 1]
    q = np.array([Fraction(1, 10), Fraction(9, 10)], dtype=object)
    tree = DraftTree((-1, 0), (-1, 1))
    assert VERIFIERS["tv"].expected_accepted_length(tree, apply_temperature(row, 0)[None].repeat(2, 0),
                                                    np.stack([q, q]), "iid") == 1     # the target's token
    q3 = np.array([Fraction(1, 4), Fraction(3, 8) - eps, Fraction(3, 8) + eps], dtype=object)
    model = context_free(np.array([Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)], dtype=object), q3)
    for seed in range(3):
        drafted = sample_tree(model, TreeShape.parse("2"), "topk", np.random.default_rng(seed))
        assert drafted.child_tokens(0) == (2, 1)
        VERIFIERS["nss"].sample(drafted, *model.node_probs(drafted), "topk", np.random.default_rng(seed))


def test_to_fractions_takes_any_denominator():
    """Counts went through int64: a denominator of 2^63 or more overflowed (an OverflowError)."""
    from univer_theory.models import to_fractions

    for denominator in (10 ** 19, 2 ** 64, 10 ** 400):      # 10^400: row·denominator overflowed a float
        row = to_fractions(np.array([0.25, 0.75]), denominator)
        assert sum(row) == 1 and all(x.denominator <= denominator for x in row)
    assert to_fractions(np.array([0.1, 0.9]), 10 ** 400)[0] == F(int(F(0.1) * 10 ** 400), 10 ** 400)   # exact floor
    with pytest.raises(ValueError, match=r"to_fractions: the input must be one row \[V\], got shape \(2, 2\)"):
        to_fractions(np.full((2, 2), 0.5))


def test_model_file_exponents_with_digit_separators_are_bounded(tmp_path):
    """Fraction reads digit separators, the exponent guard did not: "1e-5_00" loaded, and "1e-9_999_999" took
    10 s to read (the 1e±400 guard exists to keep such integers from being built)."""
    import json

    path = tmp_path / "m.json"
    for entry in ("1e-5_00", "1e-9_999_999"):
        path.write_text(json.dumps({"vocab": 2, "target": {"": [entry, 1]}, "draft": {"": [0.5, 0.5]}}))
        with pytest.raises(ValueError, match="beyond 1e±400"):
            TableModel.from_json(path, exact=True)


def test_rows_within_the_simplex_tolerance_are_read_on_the_simplex():
    """Rows are accepted within ``SIMPLEX_ATOL`` of summing to 1, but the oracle compared each method's output with
    the rows as given: 10-decimal rows (Σ = 1 − 1e-10) made every lossless method lossy (distance ~2e-10).  The
    exact core reads a float row off 1 by more than ``ROW_SUM_ROUNDOFF`` divided by its sum: 12-decimal rows too
    (Σ = 1 − 1e-12, ~10·ROW_SUM_ROUNDOFF; a distance ~3e-12 were they read as given)."""
    shape = TreeShape.parse("2,1")
    for third in ([0.3333333333] * 3, [0.333333333333] * 3):
        model = TableModel(3, {(): third, (0,): third, (1,): third, (2,): third},
                           {(): [0.5, 0.3, 0.2], (0,): third, (1,): third, (2,): third})
        for name in ("rrs", "tv", "univer", "gr", "kseq"):
            res = evaluate(model, shape, "iid", VERIFIERS[name])
            assert res.lossless and res.distance <= 1e-15, (third[0], name, res.distance)


@pytest.mark.parametrize("call,match", [
    (lambda: TreeShape.parse("2_2"), r"cannot read shape '2_2'"),          # int() read it as 22 children
    (lambda: TreeShape.parse("+2"), r"cannot read shape '\+2'"),
    (lambda: TreeShape.parse(None), r"TreeShape.parse: expected a shape's text"),
    (lambda: TreeShape.uniform(2), r"TreeShape.uniform: branching must be a non-empty list"),
    (lambda: DraftTree.chain(5), r"DraftTree.chain: tokens"),
    (lambda: DirichletModel(3, similarity="x"), r"DirichletModel: similarity must be a real number"),
    (lambda: __import__("univer_theory").TemperedModel("not a model", 0.5),
     r"TemperedModel: model must be a univer_theory Model"),
    (lambda: VERIFIERS["tv"].sample(DraftTree.chain([0]), np.full((2, 2), 0.5), np.full((2, 2), 0.5), "iid", None),
     r"tv.sample: rng"),
    (lambda: __import__("univer_theory").get_verifier(["tv"]), r"unknown"),
    (lambda: __import__("univer_theory.oracle").oracle.distance_to_target(DirichletModel(2, seed=0), {(5,): 1.0}, 1),
     r"distance_to_target: output \(5,\) has a token outside \[0, 2\)"),
    (lambda: __import__("univer_theory.models").models.apply_temperature(np.full((2, 2), 0.5), 2.0),
     r"apply_temperature: the input must be one row \[V\]"),
])
def test_misused_api_names_what_is_wrong(call, match):
    """Each was a TypeError / AttributeError / IndexError deep inside, or a silent misreading (``'2_2'`` as 22
    children, ``apply_temperature`` over a batch's flattened rows)."""
    with pytest.raises(ValueError, match=match):
        call()


def test_shape_text_is_read_everywhere_a_shape_is():
    """Shape text worked in ``evaluate`` but was an AttributeError in ``enumerate_trees`` / ``count_trees`` /
    ``DraftTree.from_shape``; ``tuple_law`` took no list row."""
    from univer_theory.processes import count_trees, enumerate_trees

    model = DirichletModel(3, seed=0)
    assert count_trees(model, "2", "wor") == len(list(enumerate_trees(model, "2", "wor"))) == 6
    assert DraftTree.from_shape("2", [0, 1]).token == (-1, 0, 1)
    assert len(tuple_law([0.5, 0.5], 2, "wor")) == 2
