"""The exact-core test grid: shapes × processes × small vocabularies, with float and Fraction models."""
from univer_theory import DirichletModel, TreeShape

SHAPES = ["1,1,1", "2,2", "3,1", "2,1,2"]
PROCESSES = ["iid", "wor", "topk"]


def grid(vocabs=(3, 4), seeds=(0,), exact=False):
    """``(id, model, shape, process)`` for every grid point; V = 5 only on the cheap shapes."""
    for V in vocabs:
        for seed in seeds:
            model = DirichletModel(V, seed=seed, similarity=0.4, concentration=0.8, exact=exact)
            for shape in SHAPES:
                for process in PROCESSES:
                    yield f"V{V}-s{seed}-{shape}-{process}", model, TreeShape.parse(shape), process
