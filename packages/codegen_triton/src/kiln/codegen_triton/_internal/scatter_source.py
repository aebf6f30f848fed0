"""Triton for loopir's `Scatter` nodes (scatter, scatter_add/reduce, index_put).

A scatter kernel holds one `Scatter` node; its runtime first copies the node's base into the
output (`kiln.loopir.codegen.scatter_bases`). Each program then takes RBLOCK source elements
(``rindex``, a grid over the source) and stores or combines each into the output at its
computed index, lanes whose index failed its range check masked off:

* ``store``: `tl.store` (duplicate indices: one of the values, unspecified, as in eager);
* bool ``sum``/``max`` (or) and ``prod``/``min`` (and): a store of True (False) where the value
  is True (False), whatever the order;
* integer ``sum``/``max``/``min``: `tl.atomic_add` / `tl.atomic_max` / `tl.atomic_min`, exact;
* float32/float64 ``sum``: `tl.atomic_add` (the order of the additions, so the rounding, may
  differ from run to run);
* every other case (products, float max/min with eager's NaN propagation, 16-bit floats): a
  compare-and-swap loop on the element's bits: read, combine in the compute dtype, swap in if
  the element still holds what was read, else retry with what it holds. Lanes with nothing
  left to do swap element 0 with itself (`tl.atomic_cas` takes no mask).

With ``SERIAL`` (the launcher sets it when `torch.are_deterministic_algorithms_enabled()`, and
always for int8/uint8/int16 accumulation, which has no atomics), one program walks the source
one element at a time, in order: reproducible, and eager's CPU order.
"""

from __future__ import annotations

import torch

from kiln.loopir import Kernel, Scatter

# the integer type of the same width, for the compare-and-swap loop
_BITS = {torch.float32: "tl.int32", torch.float64: "tl.int64", torch.float16: "tl.int16",
         torch.bfloat16: "tl.int16", torch.int32: "tl.int32", torch.int64: "tl.int64"}
_COMBINE = {"sum": "{0} + {1}", "prod": "{0} * {1}", "max": "kiln_device.maximum({0}, {1})",
            "min": "kiln_device.minimum({0}, {1})"}
_INTEGER_ATOMICS = {"sum": "tl.atomic_add", "max": "tl.atomic_max", "min": "tl.atomic_min"}


# int8/uint8/int16 have no atomics (nor compare-and-swap): their accumulating scatters run as
# one program walking the source in order (SERIAL), with a plain load, combine and store
SERIAL_ONLY = (torch.int8, torch.uint8, torch.int16)


def is_scatter_kernel(kernel: Kernel) -> bool:
    return any(isinstance(node.body, Scatter) for node in kernel.nodes)


def serial_only(kernel: Kernel) -> bool:
    """Whether the kernel's scatter must run SERIAL whatever the deterministic setting."""
    return any(isinstance(n.body, Scatter) and n.body.mode != "store" and n.spec.dtype in SERIAL_ONLY
               for n in kernel.nodes)


def prologue(widen: str) -> list[str]:
    """The program's first source element (``roffset``), before the node's loop."""
    return ["xmask = tl.full([1, 1], 1, tl.int1)",  # one outer point
            f"rbase = tl.arange(0, RBLOCK)[None, :]{widen}",
            f"rstart = tl.program_id(0){widen} * RBLOCK"]


def loop_header(rnumel: str) -> list[str]:
    """One chunk per program, or (SERIAL) one program over every chunk of one element."""
    return [f"rnumel = {rnumel}",
            "if SERIAL:",
            "    rstop = rnumel",
            "else:",
            "    rstop = RBLOCK",
            "for roffset in range(0, rstop, RBLOCK):",
            "    rindex = rstart + roffset + rbase",
            "    rmask = rindex < rnumel"]


def scatter_update(pointer: str, offset: str, value: str, mode: str, mask: str, dtype: torch.dtype,
                   element_type: str, compute_type: str) -> list[str]:
    """Statements storing or combining `value` into ``pointer + offset`` where `mask` holds."""
    where = f"{pointer} + {offset} + tl.zeros_like(rindex)"  # a block of pointers, even for a 0-d output
    value = f"tl.broadcast_to({value}, rindex.shape)"
    if mode == "store":
        return [f"tl.store({where}, {value}.to({element_type}), {mask})"]
    if dtype == torch.bool:
        sets = "True" if mode in ("sum", "max") else "False"
        test = "!= 0" if sets == "True" else "== 0"
        return [f"tl.store({where}, tl.full(rindex.shape, {sets}, tl.int1), {mask} & ({value} {test}))"]
    if dtype in SERIAL_ONLY:  # no 8/16-bit integer atomics: the launcher runs these serially
        combined = _COMBINE[mode].format(f"tl.load({where}, {mask})", f"{value}.to({element_type})")
        return [f"tl.store({where}, ({combined}).to({element_type}), {mask})"]
    if not dtype.is_floating_point and mode in _INTEGER_ATOMICS:
        return [f"{_INTEGER_ATOMICS[mode]}({where}, {value}.to({element_type}), {mask}, sem='relaxed')"]
    if dtype in (torch.float32, torch.float64) and mode == "sum":
        return [f"tl.atomic_add({where}, {value}.to({element_type}), {mask}, sem='relaxed')"]
    if dtype not in _BITS:
        raise NotImplementedError(f"a {mode} scatter into a {dtype} buffer")
    return _cas_loop(pointer, where, value, mode, mask, element_type, compute_type, _BITS[dtype])


def _cas_loop(pointer: str, where: str, value: str, mode: str, mask: str, element_type: str,
              compute_type: str, bits: str) -> list[str]:
    combine = _COMBINE[mode].format("cas_old.to(" + compute_type + ")", f"{value}.to({compute_type})")
    return ["cas_pending = " + mask,
            f"cas_ptr = tl.where(cas_pending, {where}, {pointer} + tl.zeros_like(rindex)).to("
            f"tl.pointer_type({bits}), bitcast=True)",
            f"cas_old = tl.load({where}, cas_pending)",
            "while tl.max(cas_pending.to(tl.int32)) > 0:",
            f"    cas_new = ({combine}).to({element_type})",
            f"    cas_expected = tl.where(cas_pending, cas_old.to({bits}, bitcast=True), 0)",
            f"    cas_desired = tl.where(cas_pending, cas_new.to({bits}, bitcast=True), cas_expected)",
            "    cas_seen = tl.atomic_cas(cas_ptr, cas_expected, cas_desired, sem='relaxed')",
            "    cas_pending = cas_pending & (cas_seen != cas_expected)",
            f"    cas_old = cas_seen.to({element_type}, bitcast=True)"]
