"""FX node.meta keys loopir reads and writes.

Reads (on the ATen graph given to `lower`):
  * ``meta["val"]``: FakeTensor (or SymInt / int) of every placeholder and call_function node:
    dtype, sizes and strides; required (`LoweringError` names a node without it). Size nodes
    of symbolic graphs (``aten.sym_size``/``sym_stride``/``sym_numel`` and ``operator``
    arithmetic on SymInts) are lowered from their ``meta["val"]`` expression alone.
  * ``meta["stack_trace"]``: optional; quoted in error messages so they point at user code.

Writes: nothing on the input graph. On the kernel graph's module: ``gm.meta["stored_inputs"]``,
{output position: input position} of the outputs whose kernels stored them into their inputs
(`LowerOptions.input_writes`; read it with `stored_positions(gm)`). The kernel graph's nodes are plain FX nodes whose targets
are `Kernel` objects, ATen extern ops, `strided_view`, `restrided_buffer`, `copied_view`, `ensure_layout`, `aten.sym_size`/`sym_stride` and
`operator`/`torch.sym_max`/`torch.sym_min` arithmetic on sizes; descriptions live on the
`KernelGraph` record, not in meta. Wrapper targets also include `ensure_layouts` (one layout
check for the inputs of known strides) and `stored_inputs` (the inputs written in place).
"""
