"""Subnormal floats as zero inside a compiled kernel (x86-64's MXCSR flush-to-zero and denormals-are-zero bits).

An x86 core takes a microcode assist, ~100 cycles, for every arithmetic operation that reads or produces a
subnormal float64 (``|x| < 2^-1022 ≈ 2.2e-308``).  PTS's priority walk
(:func:`univer_theory.plans.clocks.thinning_walk`) carries products of clock factors ``e^{−qT}`` that decay
through the subnormal range at the largest times before they reach an exact 0, and about 1% of its polynomial
lanes sit there at V = 49 152: the assists made its compiled passes ~2.5× slower.  :func:`flushed` sets both bits around such a kernel (the
calling thread's floating-point state, restored afterwards, also on an exception): every subnormal input or
result is then 0, a change below ``2^-1022`` of each operation's result.  Elsewhere (another architecture) it
does nothing.
"""
from __future__ import annotations

import platform
from contextlib import contextmanager

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

#: MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6) bits.
FLUSH_BITS = 0x8040
#: Whether this machine's floating-point control has those bits (x86-64).
HAS_FLUSH = platform.machine().lower() in ("x86_64", "amd64")


@intrinsic
def _update_mxcsr(typingctx, keep, bits):
    """Set MXCSR to ``(old & keep) | bits`` in one step and return ``old`` (x86-64 only)."""
    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i8p])
        store = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.stmxcsr")
        load = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse.ldmxcsr")
        slot = cgutils.alloca_once(builder, i32)
        builder.call(store, [builder.bitcast(slot, i8p)])
        old = builder.load(slot)
        builder.store(builder.or_(builder.and_(old, args[0]), args[1]), slot)
        builder.call(load, [builder.bitcast(slot, i8p)])
        return old
    return types.uint32(types.uint32, types.uint32), codegen


@numba.njit(cache=True)
def _update(keep, bits):  # pragma: no cover - compiled
    return _update_mxcsr(keep, bits)


@contextmanager
def flushed(on: bool = True):
    """Run the block with subnormal floats read and written as 0 (module docstring) when ``on`` and the machine
    has the control bits; the previous state is restored on the way out."""
    if not (on and HAS_FLUSH):
        yield
        return
    old = _update(np.uint32(0xFFFFFFFF), np.uint32(FLUSH_BITS))
    try:
        yield
    finally:
        _update(np.uint32(0), old)
