import re

import torch

from kiln.capture import CaptureSession, capture


def negative_branch(x):
    y = torch.sin(x) * 2
    if y.sum() < 0:
        return y - 1
    return y + 1


def recompiled(x):
    return torch.tanh(x) + 1


def anchors_and_links(page):
    ids = set(re.findall(r"id='([^']+)'", page))
    links = set(re.findall(r"href='#([^']+)'", page))
    return ids, links


def test_page_is_self_contained_and_every_link_has_a_target(tmp_path):
    result = capture(negative_branch, -torch.ones(3))
    path = result.to_html(tmp_path / "sub" / "report.html")
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<script" not in page and "<link" not in page and "src=" not in page
    ids, links = anchors_and_links(page)
    assert links and links <= ids


def test_break_is_highlighted_at_its_source_line(tmp_path, line_of):
    result = capture(negative_branch, -torch.ones(3))
    page = result.to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    lineno = line_of(negative_branch, "if y.sum() < 0")
    assert "<div class='card break' id='break-1'>" in page
    # the break links to its line in the source excerpt, which is marked as a break
    (file_id,) = re.findall(rf"<a href='#src-(\d+)-{lineno}'[^>]*>[^<]*</a></p>", page)[:1]
    row = re.search(rf"<tr id='src-{file_id}-{lineno}' class='(\w*)'>.*?</tr>", page)
    assert row is not None and row.group(1) == "break"
    assert "if y.sum() &lt; 0:" in row.group(0)  # code is escaped
    # the graph that the break ended links back to the break
    assert "ended by <a href='#break-1'>graph break 1</a>" in page


def test_graph_code_lines_link_to_the_user_lines_of_their_nodes(tmp_path, line_of):
    result = capture(negative_branch, -torch.ones(3))
    page = result.to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    sin_row = next(line for line in page.splitlines() if "sin = torch.sin(" in line)
    assert f"-{line_of(negative_branch, 'torch.sin')}'" in sin_row
    assert "y = torch.sin(x) * 2" in sin_row


def test_recompiles_section_links_the_guard_and_the_new_graph(tmp_path):
    with CaptureSession() as session:
        compiled = session.compile(recompiled)
        compiled(torch.randn(3))
        compiled(torch.randn(3, dtype=torch.float64))
    page = session.result().to_html(tmp_path / "report.html").read_text(encoding="utf-8")
    assert "<div class='card recompile' id='recompile-1'>" in page
    assert "dtype mismatch" in page and "produced <a href='#graph-1'>graph 1</a>" in page
    ids, links = anchors_and_links(page)
    assert links <= ids
