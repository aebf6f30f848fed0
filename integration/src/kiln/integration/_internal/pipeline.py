"""The backend's pipeline for one Dynamo graph.

capture record -> autograd_trace (inference) -> decomp (loop_level table) -> partition
(loopir-supported regions) -> loopir lower -> codegen by device. Anything loopir cannot take
stays an eager ATen call; a failing region runs eagerly as a whole; every such choice is
recorded in the `GraphReport`.
"""

from __future__ import annotations

import copy
import functools
import logging
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx as fx

from kiln import autograd_trace, capture, decomp, loopir, partition

from . import codegens
from .attention_masks import densify_attention_masks
from .comm_buckets import bucket_all_reduces
from .conv_batch_norm import fold_conv_batch_norms
from .debug import DebugDump
from .flatten import inline_regions
from .graph_cache import TrainingParts
from .graph_key import shape_guards
from .input_writes import (
    append_writebacks,
    drop_stored_writebacks,
    request_donations,
    request_input_writes,
)
from .lookup import Lookup
from .options import KilnOptions
from .output_aliases import view_mutated_inputs
from .output_layouts import keep_output_layouts
from .padded_linears import pad_linear_outputs
from .pooled_matmuls import pool_matmul_outputs
from .private_outputs import mark_private_outputs
from .progress import Stages
from .regions import RegionResults, compile_regions
from .report import FallbackNode, GraphReport

log = logging.getLogger(__name__)

def is_training(example_inputs: Sequence[Any]) -> bool:
    """Grad mode is on and some input (parameters included) requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions, looked_up: Lookup,
                  on_backward: Callable[[GraphReport], None] | None = None, compiled_autograd: bool = False
                  ) -> tuple[torch.nn.Module, GraphReport]:
    """Compile one Dynamo graph the cache did not have (`looked_up`, from `lookup.look_up`);
    returns the module to run and what happened, and stores it in the cache.

    ``on_backward`` receives the report of a training graph's backward when it compiles (on the
    first backward call); ``compiled_autograd`` marks a backward pass compiled autograd handed over.
    """
    dump = DebugDump(options.debug_dir)
    index, stages, location, codegen, cache = (looked_up.index, looked_up.stages, looked_up.location,
                                               looked_up.codegen, looked_up.cache)
    check = options.verify or dump.enabled
    dump.write("dynamo", lambda: gm.print_readable(print_output=False), ".py")
    if check:
        capture.verify(gm)
    training = is_training(example_inputs)
    # before tracing picks an attention kernel (attention_masks.py); training: additive masks
    densify_attention_masks(gm, additive=training)
    pad_linear_outputs(gm)  # before tracing: the backward gets the padded gradient (padded_linears.py)
    guards = len(shape_guards(example_inputs))
    if training:
        forward: dict[str, Any] = {}  # the forward's module and report, for the cache entry

        def backward_report(results: RegionResults, backward_stages: Stages, backward: fx.GraphModule,
                            backward_aten: fx.GraphModule) -> None:
            report = _report(index, results, backward_stages, location, training=True, backward=True)
            backward_stages.summary()
            log.info("kiln: %s", report)
            if cache is not None and "report" in forward:  # the entry is whole once the backward compiled
                parts = TrainingParts(module.plan, forward["module"], backward, backward_aten, report)
                cache[0].store(cache[1], parts, forward["report"], gm, forward["added_guards"])
            if on_backward is not None:
                on_backward(report)

        module, compiled, forward["module"] = _compile_training(
            gm, example_inputs, options, codegen, dump, stages, check, backward_report,
            lambda: Stages(f"graph {index} backward", location))
    else:
        with stages.stage("autograd_trace"):
            aten = autograd_trace.trace_inference(gm, example_inputs)
            dump.write("aten", lambda: aten.print_readable(print_output=False), ".py")
            if check:
                autograd_trace.verify(aten)
            view_mutated_inputs(aten)  # after the check: its views follow the trailing write-backs
            fold_conv_batch_norms(aten)  # CPU conv + eval batch norm (+ ReLU): one oneDNN call
        module, compiled = compile_aten(aten, options, codegen, dump, stages, check)
    report = _report(index, compiled, stages, location, training=training, compiled_autograd=compiled_autograd)
    added_guards = len(shape_guards(example_inputs)) - guards
    if training:
        forward.update(report=report, added_guards=added_guards)
    elif cache is not None:
        with stages.stage("cache_store"):
            cache[0].store(cache[1], module, report, gm, added_guards)
    stages.summary()
    dump.write("report", str(report))
    log.info("kiln: %s", report)
    return module, report


def _report(index: int, compiled: RegionResults, stages: Stages, location: str | None, **kind: bool
            ) -> GraphReport:
    return GraphReport(
        index=index, compiled=True, reason=None,
        lowered_nodes=compiled.lowered, fallback_nodes=compiled.fallbacks,
        kernels=compiled.kernels, externs=compiled.externs, source=compiled.source, fusions=compiled.fusions,
        stage_seconds=tuple(stages.seconds), location=location, collectives=compiled.collectives, **kind)


def _compile_training(gm: fx.GraphModule, example_inputs: Sequence[Any], options: KilnOptions,
                      codegen: codegens.Selected, dump: DebugDump, stages: Stages, check: bool,
                      on_backward: Callable[[RegionResults, Stages, fx.GraphModule, fx.GraphModule], None],
                      backward_stages: Callable[[], Stages]
                      ) -> tuple[autograd_trace.AotCompiled, RegionResults, fx.GraphModule]:
    """Joint forward+backward trace, partitioned; each half compiled by the inference pipeline.
    Returns the runtime module, the forward's results and its compiled module.

    The forward is compiled now; the backward on the first backward call (its results, stages,
    compiled module and ATen graph go to `on_backward`: its report goes to the log and the
    debug dump, since `explain` has returned by then)."""
    forward = RegionResults()
    forward_module: list[fx.GraphModule] = []

    def compiler(label: str):
        def compile_half(aten: fx.GraphModule, _fake_inputs: Sequence[Any]) -> torch.nn.Module:
            dump.write(f"{label}_aten", lambda: aten.print_readable(print_output=False), ".py")
            # the forward compiles inside the joint trace's stage, so its stages nest under it
            half_stages = stages if label == "forward" else backward_stages()
            # mutated inputs autograd_trace lets the forward write: copy_ write-backs in the graph,
            # which a kernel may then do itself (`input_writes.py`)
            mutations = aten.meta.get(autograd_trace.INPUT_MUTATIONS, ())
            if mutations:
                aten, traced = fx.GraphModule(aten, copy.deepcopy(aten.graph)), aten
                aten.meta = dict(traced.meta)
            written = append_writebacks(aten, mutations)
            # outputs leave through an autograd.Function, where views could not be modified in place
            module, results = compile_aten(aten, options, codegen, dump, half_stages, check, prefix=f"{label}_",
                                           output_views=False)
            setattr(module, autograd_trace.WRITTEN_ATTRIBUTE, written)
            if label == "forward":
                forward.merge(results)
                forward_module.append(module)
            else:
                on_backward(results, half_stages, module, aten)
            return module
        return compile_half

    with stages.stage("autograd_trace"):
        module = autograd_trace.aot_compile(gm, example_inputs, fw_compiler=compiler("forward"),
                                            bw_compiler=compiler("backward"), partitioner=options.partitioner)
    return module, forward, forward_module[0]


def compile_aten(aten: fx.GraphModule, options: KilnOptions, codegen: codegens.Selected, dump: DebugDump,
                 stages: Stages, check: bool, prefix: str = "", output_views: bool = True
                 ) -> tuple[fx.GraphModule, RegionResults]:
    """decomp -> partition -> loopir -> codegen on a functional ATen graph (`output_views`: see
    `loopir.LowerOptions`)."""
    with stages.stage(f"{prefix}decomp"):
        decomposed = decompose_graph(aten, options, codegen)
        bucket_all_reduces(decomposed)  # DDP's python_reducer: one collective per bucket, not per gradient
        dump.write(f"{prefix}decomposed", lambda: decomposed.print_readable(print_output=False), ".py")
        if check:
            decomp.verify(decomposed)
    with stages.stage(f"{prefix}partition"):
        dtypes = loopir.SUPPORTED_DTYPES & codegen.codegen.capabilities.dtypes
        lowered_ops = loopir.supported_ops(options.lowerings)
        parted = partition_graph(decomposed, options, codegen)
        dump.write(f"{prefix}partitioned", lambda: parted.print_readable(print_output=False), ".py")
        dump.write(f"{prefix}partition_report", lambda: str(parted.meta.get("kiln_partition", "")))
        if check:
            partition.verify(parted)
    # a region that stores a mutated input's new value itself replaces its write-back copy_;
    # not when each region's first call is compared with eager's (`verify_calls`), which reads its inputs again
    writebacks = request_input_writes(parted) if not options.verify_calls else []
    if not options.verify_calls:  # outputs stored over inputs that die in their region
        request_donations(parted)
    mark_private_outputs(parted, aten.meta.get(autograd_trace.INTERNAL_OUTPUTS, ()))
    results = compile_regions(parted, codegen, dump, stages, check, options, prefix, output_views)
    drop_stored_writebacks(parted, writebacks, results.stored_inputs)
    results.fallbacks += _outside_nodes(parted, codegen, options, dtypes, lowered_ops)
    results.collectives += tuple(str(n.target) for n in parted.graph.nodes if partition.is_collective(n))
    module = inline_regions(parted)
    pool_matmul_outputs(module, codegen.codegen)  # resident outputs for ATen's matmuls too
    return module, results


def decompose_graph(aten: fx.GraphModule, options: KilnOptions, codegen: codegens.Selected) -> fx.GraphModule:
    """The decomp stage: `aten` with the loop-level table applied; its outputs keep the layouts of
    the ATen ops they decompose (`output_layouts.py`)."""
    epilogues = options.bias_epilogues
    if epilogues is None:
        epilogues = codegen.codegen.capabilities.bias_epilogues
    decomposed = decomp.decompose(aten, decomp.loop_level(bias_epilogues=epilogues))
    # Equal pure nodes merged: a value viewed again for each of its users (q/k/v projections of
    # one norm) would otherwise be computed once per view.
    if decomp.eliminate_common_subexpressions(decomposed.graph):
        decomposed.recompile()
    keep_output_layouts(aten, decomposed, options.lowerings)
    return decomposed


def partition_graph(decomposed: fx.GraphModule, options: KilnOptions, codegen: codegens.Selected) -> fx.GraphModule:
    """The partition stage: regions of what loopir lowers for `codegen` (submodules, eager ATen)."""
    dtypes = loopir.SUPPORTED_DTYPES & codegen.codegen.capabilities.dtypes
    # what a node reads counts too: a region input of another dtype is one its codegen must load
    supported = (partition.supports_ops(loopir.supported_ops(options.lowerings))
                 & partition.Supported(functools.partial(loopir.lowerable, lowerings=options.lowerings),
                                       "lowerings' own checks")
                 & partition.supports_dtypes(dtypes) & partition.Supported(_InputDtypes(dtypes), "input dtypes")
                 & partition.Supported(_OneDevice(decomposed.graph), "tensors on the graph's device"))
    return partition.partition(decomposed, supported, min_size=options.min_region_size)


def _outside_nodes(parted: fx.GraphModule, codegen: codegens.Selected, options: KilnOptions,
                  dtypes: frozenset[torch.dtype], lowered_ops: Any) -> tuple[FallbackNode, ...]:
    """Tensor-producing ATen nodes the partitioner left outside every region, with why.

    Size arithmetic (sym_size, operator.*) also stays outside but computes no tensor data, and
    collectives run on the communicator between regions by design (`GraphReport.collectives`). A
    node of an op loopir lowers that stays out only for a dtype its codegen lacks says so; with
    ``fallback=False`` that raises, naming the dtype, the codegen and the node.
    """
    report = parted.meta.get("kiln_partition")
    reasons = {u.name: u.reason for u in getattr(report, "outside", getattr(report, "unsupported", ()))}
    one_device = _OneDevice(parted.graph)
    fallbacks = []
    for node in parted.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or partition.is_collective(node):
            continue  # collectives are no fallback: they run on the communicator by design
        if not _produces_tensor(node.meta.get("val")):
            continue
        reason = reasons.get(node.name, "not supported by loopir")
        if reason == "not supported by predicate":
            missing = sorted({str(d).removeprefix("torch.") for d in _node_dtypes(node, inputs=True)} -
                             {str(d).removeprefix("torch.") for d in dtypes})
            if node.target in lowered_ops and missing:
                reason = (f"dtype {', '.join(missing)} is not supported by the {codegen.codegen.name} codegen "
                          f"(it handles {', '.join(sorted(str(d).removeprefix('torch.') for d in dtypes))})")
                if not options.fallback:
                    raise NotImplementedError(f"kiln: {loopir.node_location(node)}: {reason}; pass fallback=True to run "
                                              "it eagerly")
            elif not one_device(node):
                reason = "it reads or makes a CPU tensor in a graph of another device (kept with eager ATen)"
            else:
                reason = f"loopir has no lowering for {node.target}"
        fallbacks.append(FallbackNode(node.name, str(node.target), reason))
    return tuple(fallbacks)


class _OneDevice:
    """A partition predicate: every tensor `node` reads or makes lives on one device type, the
    graph's accelerator's when it has one (a CPU scalar in a GPU graph stays with eager ATen)."""

    def __init__(self, graph: fx.Graph) -> None:
        types = {v.device.type for n in graph.nodes if n.op == "placeholder" for v in _tensor_vals(n)}
        self.accelerator = next((t for t in sorted(types) if t != "cpu"), None)

    def __call__(self, node: fx.Node) -> bool:
        types = {v.device.type for n in (node, *node.all_input_nodes) for v in _tensor_vals(n)}
        return len(types) <= 1 and not (types == {"cpu"} and self.accelerator is not None)


def _tensor_vals(node: fx.Node) -> list[torch.Tensor]:
    val = node.meta.get("val")
    return [v for v in (val if isinstance(val, (tuple, list)) else (val,)) if isinstance(v, torch.Tensor)]


class _InputDtypes:
    """A partition predicate: every tensor `node` reads has one of `dtypes`."""

    def __init__(self, dtypes: frozenset[torch.dtype]) -> None:
        self.dtypes = dtypes

    def __call__(self, node: fx.Node) -> bool:
        return all(_node_dtypes(arg) <= self.dtypes for arg in node.all_input_nodes)


def _node_dtypes(node: fx.Node, inputs: bool = False) -> set[torch.dtype]:
    """Dtypes of the tensors `node` produces (and, with `inputs`, reads)."""
    vals = [node.meta.get("val")] + ([a.meta.get("val") for a in node.all_input_nodes] if inputs else [])
    found = set()
    for val in vals:
        for v in val if isinstance(val, (tuple, list)) else (val,):
            if isinstance(v, torch.Tensor):
                found.add(v.dtype)
    return found


def _produces_tensor(val: Any) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
