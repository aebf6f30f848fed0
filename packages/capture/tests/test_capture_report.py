import torch

from kiln.capture import capture
from kiln.capture._internal.breaks import DEFAULT_HINT_RULES, hint_for


def breaks_on_print(x):
    y = torch.sin(x)
    print("kiln-capture-test: breaks_on_print")
    return torch.cos(y) + 1


def no_break(x):
    return torch.tanh(x)


def test_report_lists_graphs_ops_and_break_with_source(line_of):
    result = capture(breaks_on_print, torch.randn(3))
    text = result.report()
    lineno = line_of(breaks_on_print, 'print("')
    assert text.startswith("kiln.capture report: breaks_on_print (mode=dynamo)\n")
    assert "2 graphs, 1 graph break\n" in text
    assert "graph 0: 1 op (torch IR)" in text and "1 x torch.sin" in text
    assert "graph 1: 2 ops (torch IR)" in text and "1 x torch.cos" in text
    assert f"graph break 1: {result.breaks[0].reason}\n" in text
    assert f"at {__file__}:{lineno} in breaks_on_print\n" in text
    assert '    print("kiln-capture-test: breaks_on_print")\n' in text
    assert "  hint: remove the print" in text


def test_report_of_a_clean_function_has_no_break_section():
    text = capture(no_break, torch.randn(3)).report()
    assert "1 graph, 0 graph breaks" in text
    assert "graph break 1" not in text
    assert "1 x torch.tanh" in text


def test_hint_rules_cover_common_breaks():
    where_hint = hint_for("generic_jump TensorVariable()", "if x.sum() > 0:", DEFAULT_HINT_RULES)
    assert "torch.where" in where_hint and "torch.cond" in where_hint
    item_hint = hint_for("Unsupported Tensor.item() call", "n = x.item()", DEFAULT_HINT_RULES)
    assert "capture_scalar_outputs" in item_hint
    assert "print" in hint_for("unknown", 'print("x")', DEFAULT_HINT_RULES)


def test_hint_falls_back_to_dynamos_own_useful_hint():
    detail = "Some new break\n  Hint: Please report an issue to PyTorch.\n  Hint: Do the thing."
    assert hint_for(detail, "", DEFAULT_HINT_RULES) == "Do the thing."
    assert hint_for("Some new break\n  Hint: Please report an issue to PyTorch.", "", ()) is None
