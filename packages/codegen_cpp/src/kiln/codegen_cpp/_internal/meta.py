"""FX node.meta / GraphModule.meta keys codegen_cpp reads and writes.

Reads: nothing from node.meta; everything comes from loopir's `KernelGraph` records.
Writes: ``module.meta["kiln_cpp"]`` on the returned GraphModule: a `CppArtifacts`
(generated source, its path in the cache, the shared library, cache hit, seconds).
"""
