"""The FX ``node.meta`` keys kiln.decomp reads and writes.

Read
    ``val``            on placeholders: the FakeTensor (sizes may be SymInts) or scalar each
                       input is traced with; their fake mode is the mode decompose() traces
                       under. On get_attr nodes: reused as the attribute's fake value when it
                       belongs to that mode.
    ``example_value``  on placeholders, when ``val`` is absent (Dynamo's Torch IR graphs).
    ``stack_trace``    on every node (optional): carried to the nodes it decomposes into;
                       check_opset()/verify() quote its innermost frame in errors.
    (some keys)        torch's ``fx.traceback.preserve_node_meta`` copies ``stack_trace`` and
                       its own list of keys (``nn_module_stack``, ``source_fn_stack``,
                       ``custom``, ``partitioner_tag``, ``from_node``, ... see
                       ``torch.fx.proxy._COPY_META_FIELDS``) from a node to every node traced
                       while interpreting it. Other keys of call_function nodes are NOT
                       carried: a pass that tags nodes should put its tags in ``custom`` or
                       run after decompose().

Written (by decompose(), through make_fx)
    ``val``            on every node: FakeTensor / tuple of them / SymInt / scalar.
    ``tensor_meta``    on tensor nodes (torch's TensorMetadata), as make_fx writes it.
    placeholders       keep all their original meta; ``val``/``tensor_meta`` are refreshed.
    get_attr nodes     keep the original node's meta, plus ``val``.
    output values      a computed (non-view) output whose strides a decomposition changed
                       gets the input graph's output ``val`` (eager's layout, e.g. softmax's).
    decomposed values  a value an op of the table produced whose node recorded another dense
                       layout is cloned into that one (layouts.py): the ``val`` of its
                       node is eager's layout.
    ``original_aten``  may be set by make_fx on nodes emitted by a decomposition.
"""

READS = ("val", "example_value", "stack_trace")
WRITES = ("val", "tensor_meta")
