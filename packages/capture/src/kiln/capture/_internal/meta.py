"""FX ``node.meta`` keys that kiln.capture reads and writes.

Reads
-----
``stack_trace`` (str)
    The user source of a node, as Dynamo and torch.export record it: a traceback-like text
    of ``File "<path>", line <n>, in <function>`` entries, each followed by the code line.
    Read by :func:`kiln.capture.CapturedGraph.from_backend` to locate the user code a graph
    came from (``CapturedGraph.source``).
``example_value`` (FakeTensor, SymInt, ...)
    Dynamo's fake value of a node. :func:`kiln.capture.verify` requires it (or ``val``) on
    every placeholder and every call node whose result is used.
``val`` (FakeTensor, SymInt, ...)
    torch.export's fake value of a node; accepted by :func:`kiln.capture.verify` in place of
    ``example_value``.

Also read, outside ``node.meta``: the ``_dynamo_source`` attribute Dynamo sets on
placeholders (``L['x']``), kept as ``CapturedGraph.input_sources``; and
``gm.meta["dynamo_compile_id"]``, kept as ``CapturedGraph.compile_id``.

Writes
------
Nothing while capturing. Captured graphs are handed on exactly as Dynamo or torch.export
built them; the facts kiln.capture derives (source location, graph break, compile id,
recompiles) live on the ``CapturedGraph`` and ``Capture`` records, not in the graph.

``save`` reads every key of every ``node.meta`` (and ``gm.meta``) and keeps those whose
values are data: ``stack_trace``, ``example_value``/``val`` (fake values, with symbolic
sizes), ``nn_module_stack``, ``source_fn_stack``, ``tensor_dict``, ``creation_timestamp``,
... Keys holding other objects (Dynamo's ``grapharg``) are dropped and counted in the file
(``dropped_meta``). ``load`` writes the kept keys back: fake values are rebuilt in a new
``FakeTensorMode``; classes and functions named in metadata come back as the objects when
they live under a trusted module (``torch``, ...), else as their ``module.qualname`` text.
"""

STACK_TRACE = "stack_trace"
EXAMPLE_VALUE = "example_value"
VAL = "val"

#: Keys that carry a node's fake value, in the order they are looked up.
VALUE_KEYS = (EXAMPLE_VALUE, VAL)


def node_value(meta: dict) -> tuple[bool, object]:
    """Return ``(found, value)`` for the first fake-value key present in ``meta``."""
    for key in VALUE_KEYS:
        if key in meta:
            return True, meta[key]
    return False, None
