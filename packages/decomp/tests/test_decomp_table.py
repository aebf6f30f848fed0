"""DecompTable: mapping protocol, set algebra, keep semantics, provenance, immutability."""

import pytest
import torch
from torch._decomp import decomposition_table

from kiln.decomp import LOOP_LEVEL_OPS, DecompTable, core_aten, loop_level, register

aten = torch.ops.aten


def _fn_a(*args, **kwargs):
    return NotImplemented


def _fn_b(*args, **kwargs):
    return NotImplemented


def _table(ops, fn=_fn_a, provenance="user"):
    return DecompTable({op: fn for op in ops}, provenance=provenance)


def test_mapping_protocol_and_provenance():
    t = _table([aten.gelu.default, aten.silu.default], provenance="torch")
    assert len(t) == 2
    assert aten.gelu.default in t and aten.relu.default not in t
    assert t[aten.gelu.default] is _fn_a
    assert set(t) == {aten.gelu.default, aten.silu.default}
    assert t.provenance(aten.silu.default) == "torch"
    with pytest.raises(KeyError, match="aten.relu.default"):
        t.provenance(aten.relu.default)
    with pytest.raises(KeyError):
        t[aten.relu.default]


def test_constructor_validates_keys_values_and_provenance():
    with pytest.raises(TypeError, match="OpOverload"):
        DecompTable({aten.gelu: _fn_a})  # a packet is not a key
    with pytest.raises(TypeError, match="not callable"):
        DecompTable({aten.gelu.default: 3})
    with pytest.raises(ValueError, match="provenance"):
        DecompTable({aten.gelu.default: _fn_a}, provenance="mine")


def test_union_right_side_wins_and_keeps_provenance():
    a = _table([aten.gelu.default, aten.silu.default], _fn_a, "torch")
    b = _table([aten.silu.default, aten.elu.default], _fn_b, "kiln")
    u = a | b
    assert set(u) == {aten.gelu.default, aten.silu.default, aten.elu.default}
    assert u[aten.silu.default] is _fn_b and u.provenance(aten.silu.default) == "kiln"
    assert u[aten.gelu.default] is _fn_a and u.provenance(aten.gelu.default) == "torch"
    assert (b | a)[aten.silu.default] is _fn_a
    # operands unchanged
    assert a[aten.silu.default] is _fn_a and len(a) == 2 and len(b) == 2


def test_union_with_plain_dict_on_either_side():
    a = _table([aten.gelu.default], _fn_a, "torch")
    right = a | {aten.gelu.default: _fn_b}
    left = {aten.gelu.default: _fn_b} | a
    assert isinstance(right, DecompTable) and isinstance(left, DecompTable)
    assert right[aten.gelu.default] is _fn_b and right.provenance(aten.gelu.default) == "user"
    assert left[aten.gelu.default] is _fn_a and left.provenance(aten.gelu.default) == "torch"


def test_subtract_overloads_and_packets():
    t = _table([aten.add.Tensor, aten.add.Scalar, aten.gelu.default])
    assert set(t - [aten.add.Tensor]) == {aten.add.Scalar, aten.gelu.default}
    assert set(t - [aten.add]) == {aten.gelu.default}  # a packet removes every overload
    assert set(t - aten.gelu.default) == {aten.add.Tensor, aten.add.Scalar}
    with pytest.raises(TypeError, match="OpOverload"):
        t - ["gelu"]


def test_subtracted_op_can_come_back_but_kept_op_cannot():
    base = _table([aten.gelu.default, aten.silu.default], _fn_a)
    other = _table([aten.gelu.default, aten.silu.default], _fn_b)
    removed = base - [aten.gelu.default]
    assert aten.gelu.default in (removed | other)
    kept = base.keep([aten.gelu.default])
    assert aten.gelu.default not in kept
    assert kept.kept == frozenset({aten.gelu.default})
    assert aten.gelu.default not in (kept | other)  # kept on the left
    assert aten.gelu.default not in (other | kept)  # kept on the right
    assert (kept | other)[aten.silu.default] is _fn_b
    assert (kept | other).kept == frozenset({aten.gelu.default})


def test_keep_with_packet_and_only():
    t = _table([aten.add.Tensor, aten.add.Scalar, aten.gelu.default, aten.silu.default])
    kept = t.keep(aten.add)
    assert set(kept) == {aten.gelu.default, aten.silu.default}
    assert {aten.add.Tensor, aten.add.Scalar} <= kept.kept
    only = kept.only([aten.gelu.default, aten.elu.default])
    assert set(only) == {aten.gelu.default}
    assert only.kept == kept.kept


def test_register_returns_new_table_with_user_provenance():
    base = _table([aten.gelu.default], _fn_a, "torch")
    new = register(base, aten.silu.default)(_fn_b)
    assert aten.silu.default not in base
    assert new[aten.silu.default] is _fn_b and new.provenance(aten.silu.default) == "user"
    assert new.provenance(aten.gelu.default) == "torch"
    direct = register(base, aten.gelu.default, _fn_b)
    assert direct[aten.gelu.default] is _fn_b and direct.provenance(aten.gelu.default) == "user"
    packet = register(DecompTable(), aten.add, _fn_b)
    assert {aten.add.Tensor, aten.add.Scalar} <= set(packet)
    with pytest.raises(TypeError, match="DecompTable"):
        register({}, aten.gelu.default, _fn_b)


def test_register_overrides_keep_on_the_same_table():
    kept = _table([aten.gelu.default]).keep([aten.gelu.default])
    again = register(kept, aten.gelu.default, _fn_b)
    assert again[aten.gelu.default] is _fn_b
    assert aten.gelu.default not in again.kept


def test_immutable():
    t = _table([aten.gelu.default])
    with pytest.raises(TypeError):
        t[aten.silu.default] = _fn_a
    with pytest.raises(TypeError):
        del t[aten.gelu.default]
    with pytest.raises(AttributeError, match="immutable"):
        t._entries = {}
    with pytest.raises(AttributeError, match="immutable"):
        t.extra = 1
    with pytest.raises(TypeError):
        t._entries[aten.silu.default] = (_fn_a, "user")
    assert not hasattr(t, "update") and not hasattr(t, "pop")


def test_hash_and_equality():
    a = _table([aten.gelu.default, aten.silu.default])
    b = _table([aten.silu.default, aten.gelu.default])
    assert a == b and hash(a) == hash(b)
    assert len({a, b}) == 1
    assert a != _table([aten.gelu.default, aten.silu.default], provenance="kiln")
    assert a != a.keep([aten.elu.default])  # same entries, different kept set
    assert a == {aten.gelu.default: _fn_a, aten.silu.default: _fn_a}
    assert a != _table([aten.gelu.default], _fn_b)


def test_listing_is_sorted_and_names_provenance():
    t = _table([aten.silu.default], provenance="torch") | _table([aten.abs.default], _fn_b)
    t = t.keep([aten.gelu.default])
    text = t.listing()
    lines = text.splitlines()
    assert lines[0].startswith("DecompTable: 2 entries (torch=1, user=1), 1 kept")
    assert lines[1].split() == ["aten.abs.default", "user"]
    assert lines[2].split() == ["aten.silu.default", "torch"]
    assert "aten.gelu.default" in lines[-1]
    assert str(t) == text
    assert "2 entries" in repr(t)


def test_builtin_tables_are_fresh_objects():
    assert core_aten() is not core_aten()
    assert loop_level() is not loop_level()
    assert core_aten() == core_aten() and hash(core_aten()) == hash(core_aten())
    assert loop_level() == loop_level()


def test_core_aten_matches_torch_aten_entries():
    core = core_aten()
    fixed = {aten.take.default}  # torch's entry cannot trace a 0-d index: kiln's replaces it
    assert all(core.provenance(op) == "torch" for op in core if op not in fixed)
    assert all(core.provenance(op) == "kiln" for op in fixed)
    assert all(op.namespace == "aten" for op in core)
    torch_core = torch._decomp.core_aten_decompositions()
    assert core[aten.silu.default] is torch_core[aten.silu.default]
    assert aten._softmax.default not in core  # Core ATen keeps _softmax whole


def test_loop_level_contents():
    ll = loop_level()
    assert not (set(ll) & LOOP_LEVEL_OPS)
    assert LOOP_LEVEL_OPS <= ll.kept
    for op in (aten.elu.default, aten.mish.default, aten.native_dropout.default):
        assert ll.provenance(op) == "torch" and ll[op] is decomposition_table[op]
    for op in (
        aten.var_mean.correction,
        aten.clamp.default,
        aten._softmax.default,
        aten.gelu.default,
        aten.native_layer_norm.default,
        aten.linear.default,
    ):
        assert ll.provenance(op) == "kiln"
    assert aten.mean.dim not in ll and aten.t.default not in ll
    # kept ops stay whole even when united with the table that decomposes them
    assert aten.t.default not in (ll | core_aten())


def test_loop_level_ops_content():
    assert all(isinstance(op, torch._ops.OpOverload) for op in LOOP_LEVEL_OPS)
    assert isinstance(LOOP_LEVEL_OPS, frozenset)
    expected = {
        aten.add.Tensor,
        aten.where.self,
        aten.mean.dim,
        aten.squeeze.dims,
        aten.select.int,
        aten.mm.default,
        aten.convolution.default,
        aten.cumsum.default,
        aten.topk.default,
        aten.sort.default,
    }
    assert expected <= LOOP_LEVEL_OPS
    assert aten.gelu.default not in LOOP_LEVEL_OPS


def test_opset_groups():
    from kiln.decomp import EXTERN_OPS
    from kiln.decomp._internal import opsets

    assert EXTERN_OPS == opsets.EXTERN_OPS and opsets.LOOP_LEVEL_OPS == LOOP_LEVEL_OPS
    assert not (opsets.LOOP_OPS & EXTERN_OPS)  # an op is a loop op or an extern, not both
    assert all(opsets.EXTERN_OPS_BY_GROUP[g] for g in opsets.EXTERN_GROUPS)
    assert {aten.mm.default, aten.convolution.default, aten.sort.default} <= EXTERN_OPS
    assert {aten.cat.default, aten.index.Tensor, aten.arange.start_step} <= opsets.LOOP_OPS
    # no op of the set is mutable: a loop-level graph is functional
    assert not [op for op in LOOP_LEVEL_OPS if op._schema.is_mutable]
