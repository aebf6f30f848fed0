"""FX node.meta / GraphModule.meta keys codegen_triton reads and writes.

Reads: nothing from node.meta; everything comes from loopir's `KernelGraph` records.
Writes: ``module.meta["kiln_triton"]`` on the GraphModule `compile` returns: a
`TritonArtifacts` (generated source, its path in the cache, cache hit, seconds, kernel names).
"""
