"""The one implementation of a node formula (:mod:`univer_theory.nx`) run on the CPU in numpy.

A level's rows on the CPU are small once it is planned on its drafted support (:mod:`gpu.support`:
``[R, m + 1]`` with m the draft's support), and then every operation costs its call overhead — about 5 µs in torch,
about 1 µs in numpy, on the same single thread.  :func:`on_host` calls a function written against the array
namespace on numpy views of CPU tensors (no copy) and turns its results back into tensors (no copy); on an
accelerator the tensors pass through unchanged.  The floats are numpy's: its sums are pairwise where torch's are
vectorised, so results may differ from a torch run in the last bits (the exact core runs the same numpy code).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch


#: Leaves that hold no array (returned as they are, without the container checks; numpy scalars, which subclass
#: some of these, are arrays to :func:`_convert` and checked before).
_PLAIN = (str, int, float, bool, type(None))
#: Leaves that hold no tensor (skipped by :func:`_devices`).
_LEAVES = (np.ndarray, np.generic, *_PLAIN)


@functools.lru_cache(maxsize=None)
def _field_names(cls) -> tuple[str, ...] | None:
    """The field names of a dataclass type, None for any other type (cached: ``dataclasses.fields`` builds them
    on every call)."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


def _convert(x, leaf):
    """``x`` with ``leaf`` applied to every array inside tuples, named tuples, dicts and dataclasses."""
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)):
        return leaf(x)
    if isinstance(x, _PLAIN):
        return x
    if isinstance(x, tuple):
        values = [v if isinstance(v, _PLAIN) else _convert(v, leaf) for v in x]
        return type(x)(*values) if hasattr(x, "_fields") else tuple(values)
    if isinstance(x, dict):
        return {key: _convert(v, leaf) for key, v in x.items()}
    names = _field_names(type(x))
    if names is not None:
        return dataclasses.replace(x, **{name: _convert(getattr(x, name), leaf) for name in names})
    return leaf(x)


def _numpy(x):
    return x.numpy() if isinstance(x, torch.Tensor) else x


def _tensor(x):
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.as_tensor(x) if isinstance(x, np.generic) else x


def _devices(x, out: set | None = None) -> set:
    """The device types of the tensors inside ``x`` (tuples, named tuples, dicts, dataclasses), added to ``out``."""
    out = set() if out is None else out
    if isinstance(x, torch.Tensor):
        out.add(x.device.type)
    elif isinstance(x, tuple):
        for v in x:
            if not isinstance(v, _LEAVES):
                _devices(v, out)
    elif isinstance(x, dict):
        _devices(tuple(x.values()), out)
    elif (names := _field_names(type(x))) is not None:
        _devices(tuple(getattr(x, name) for name in names), out)
    return out


def device_kind(x) -> str:
    """``"cpu"`` for a numpy array or a CPU tensor, ``"accelerator"`` otherwise (what a rule's chunk sizes and
    algorithm choices are keyed by)."""
    return "cpu" if not isinstance(x, torch.Tensor) or x.device.type == "cpu" else "accelerator"


def on_host(fn, *args):
    """``fn(*args)`` on numpy views when every tensor among the arguments (also inside tuples, dicts and
    dataclasses) is on the CPU, its results back as tensors; ``fn(*args)`` itself otherwise — on an accelerator,
    and without any tensor (numpy in, numpy out: a host function calling another)."""
    if _devices(args) != {"cpu"}:
        return fn(*args)
    return _numpy_call(fn, args)


@torch.compiler.disable
def _numpy_call(fn, args):
    """The host branch of :func:`on_host`, left out of ``torch.compile``'s graphs (it runs numpy, eagerly)."""
    return _convert(fn(*_convert(args, _numpy)), _tensor)
