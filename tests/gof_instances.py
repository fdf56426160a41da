"""The instances of the Monte Carlo (G-test) sampler tests, shared by the exact-core and the batched ones.

Found by a search (V = 3, seeded Dirichlet models, every token assignment of two 6/5-node trees) for instances
where the exact law of every bug-zoo variant is far, in χ²-distance, from the law of every lossless method —
in particular each TV / RRS variant from its own original.  The powers the tests assert certify the choice.
"""
from univer_theory import DirichletModel, DraftTree

MODELS = {"iid": DirichletModel(3, seed=7, similarity=0.3, concentration=0.5),
          "wor": DirichletModel(3, seed=21, similarity=0.3)}
MODELS["topk"] = MODELS["greedy"] = MODELS["wor"]
TREES = {
    "iid": DraftTree(parent=(-1, 0, 0, 0, 1, 1, 2), token=(-1, 1, 0, 1, 2, 2, 0), vocab_size=3),  # duplicate 1
    "wor": DraftTree(parent=(-1, 0, 0, 1, 1, 2), token=(-1, 0, 2, 2, 1, 1), vocab_size=3),
}
#: A chain under the wor model (one child per node); TV-deepest-first equals TV on every chain.
CHAIN = DraftTree.chain((2, 0, 2), vocab_size=3)


def instance(process):
    """``(model, tree)`` of a process; for topk / greedy the root's children are the model's top-2 / top-1 and
    the third token, and the first child's children its top-2."""
    model = MODELS[process]
    if process in TREES:
        return model, TREES[process]
    top = lambda s: sorted(range(3), key=lambda x: (-model.draft(s)[x], x))
    a, b, c = top(())
    return model, DraftTree((-1, 0, 0, 1, 1), (-1, a, b if process == "topk" else c, *top((a,))[:2]), vocab_size=3)
