"""FX meta keys the integration package reads and writes.

Reads: ``GraphModule.meta["kiln_partition"]`` (partition's report) on the partitioned graph,
``module.meta["kiln_cpp"]`` (codegen_cpp's artifacts) on compiled regions, and whatever the
stages read themselves (``node.meta["val"]``, ``stack_trace``).
Writes: nothing; reports are returned as `GraphReport`/`Report` records.
"""
