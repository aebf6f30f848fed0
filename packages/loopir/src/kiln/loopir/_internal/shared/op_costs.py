"""Which loop-body ops are cheap: read by loopir's recompute rule and, through
`kiln.loopir.codegen.ARITHMETIC_OPS`, by codegens weighing a loop's work (a module of its own:
a process loading compiled graphs from the cache imports no lowering through it)."""

# Ops of a few cycles per element on any target (a division is slower than a product, but a mean's
# `sum / n` sits in most centred values). Everything else (exp, log, tanh, sqrt, rsqrt, pow,
# special functions, and any op added to the protocol later) counts as costly.
ARITHMETIC = frozenset({
    "load", "constant", "index_expr", "to_dtype", "identity", "where",
    "add", "sub", "mul", "truediv", "reciprocal", "neg", "abs", "relu",
    "maximum", "minimum", "fmax", "fmin", "copysign",
    "sign", "signbit", "isnan", "isinf", "ceil", "floor", "trunc", "round",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or", "logical_xor",
    "bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift",
})
