"""Jupyter: a real notebook executed by nbclient on an ipykernel (``%load_ext``,
``%%instrumented``, a summary shown as its page), then turned into HTML by nbconvert and
opened in headless Chromium: the page drew in its frame, the icicle and the table show."""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs.report import in_notebook

from .browser import count_colour, open_page, read_png, screenshot
from .helpers import integration

nbformat = integration("nbformat")
nbclient = integration("nbclient")
notebook = integration("instrumented_convs.notebook")
pytest.importorskip("torch_geometric")

BLUE, ORANGE, GREY = "#4e79a7", "#e07b1a", "#7f7f7f"  # page.js: forward, backward, regions
HEADER = "#f4f4f4"  # page.css: the table's header cells

SETUP = """\
import torch, torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.datasets import FakeDataset
torch.manual_seed(0)
data = FakeDataset(num_graphs=1, avg_num_nodes=100, num_channels=8, num_classes=3)[0]

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = GCNConv(8, 16), GCNConv(16, 3)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

model = Net()
opt = torch.optim.Adam(model.parameters(), lr=0.01)
# a stock step first: torch's first kernels start up here, not in the recorded cell, whose
# page the test reads by colour (a slow first call leaves the backward a sliver)
F.cross_entropy(model(data.x, data.edge_index), data.y).backward()
stock_call = torch.nn.Module.__call__
"""

TRAIN = """\
%%instrumented -o {saved} --var first
for epoch in range(5):
    opt.zero_grad()
    loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
    loss.backward()
    opt.step()
"""

RAISES = """\
%%instrumented --quiet --var second
model(data.x, data.edge_index)
raise ValueError("the cell's own error")
"""

CHECK = """\
import json
print(json.dumps({
    "stock": type(model.conv1).__module__,
    "unhooked": torch.nn.Module.__call__ is stock_call,
    "first": first.summary["forward/GCNConv"].count,
    "steps": first.summary["optimizer.step"].count,
    "second": [second.run["ended_by"], second.summary["forward/GCNConv"].count],
    "folder": str(first.folder),
}))
"""

MEMORY = """\
%%instrumented --quiet --memory --var third
for epoch in range(2):
    opt.zero_grad()
    F.cross_entropy(model(data.x, data.edge_index), data.y).backward()
    opt.step()
"""

MEMORY_CHECK = """\
import json, instrumented_convs as ic
row = third.summary["forward/GCNConv"]
print(json.dumps({
    "saved": row.saved_bytes, "calls": [row.mem_calls, row.count], "off": not ic.configure().memory,
    "columns": "Saved/call" in str(third.summary),
}))
"""


def _outputs(cell):
    return cell.get("outputs", [])


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """The notebook, executed: (notebook node, its folder)."""
    folder = tmp_path_factory.mktemp("nb")
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("%load_ext instrumented_convs"),
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(TRAIN.format(saved=folder / "saved")),
        nbformat.v4.new_code_cell(RAISES),
        nbformat.v4.new_code_cell(CHECK),
        nbformat.v4.new_code_cell("import instrumented_convs as ic\nic.registry.summary()"),
        nbformat.v4.new_code_cell(MEMORY),
        nbformat.v4.new_code_cell(MEMORY_CHECK),
    ]
    client = nbclient.NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    )
    client.execute()
    nbformat.write(nb, folder / "executed.ipynb")
    return nb, folder


def test_the_cell_magic_runs_the_cell_as_run_does_and_puts_the_layers_back(executed):
    nb, folder = executed
    errors = [
        o for c in nb.cells[:3] + nb.cells[4:] for o in _outputs(c) if o.output_type == "error"
    ]
    assert not errors, errors
    printed = "".join(o.get("text", "") for o in _outputs(nb.cells[4]) if o.output_type == "stream")
    got = json.loads(printed.strip().splitlines()[-1])
    assert got["stock"] == "torch_geometric.nn.conv.gcn_conv" and got["unhooked"]
    assert got["first"] == 5 * 2 and got["steps"] == 5
    assert got["second"] == ["raised", 2]  # the cell's error shown, its calls kept
    raised = [o for o in _outputs(nb.cells[3]) if o.output_type == "error"]
    assert raised and raised[0]["ename"] == "ValueError"
    assert not [o for o in _outputs(nb.cells[3]) if o.output_type == "display_data"]  # --quiet
    saved = json.loads((folder / "saved" / "run.json").read_text())
    assert got["folder"] == str(folder / "saved") and saved["target"] == "%%instrumented cell"
    assert (folder / "saved" / "page.html").exists() and (
        folder / "saved" / "trace.json.gz"
    ).exists()
    (shown,) = [o for o in _outputs(nb.cells[2]) if o.output_type == "display_data"]
    assert (
        "GCNConv" in shown["data"]["text/plain"] and "optimizer.step" in shown["data"]["text/plain"]
    )
    assert shown["data"]["text/html"].startswith("<iframe srcdoc=")


def test_the_exported_notebook_shows_the_page_drawn_in_its_frame(executed, tmp_path):
    nb, folder = executed
    from nbconvert import HTMLExporter

    shared = Path(nbclient.__file__).resolve().parents[1] / "share" / "jupyter"
    if shared.is_dir():  # (a --target install keeps nbconvert's templates beside it)
        os.environ["JUPYTER_PATH"] = str(shared)
    body, _ = HTMLExporter().from_notebook_node(nb)
    page = tmp_path / "notebook.html"
    page.write_text(body)
    dom, _ = open_page(page)
    # Both pages drew and hid the text table beside their frame (the frame's script ran)
    hidden = re.findall(r'<pre class="instrumented-convs-text"([^>]*)>', dom)
    assert len(hidden) == 2 and all("display: none" in h for h in hidden), hidden
    width, height, rows = read_png(screenshot(page, tmp_path / "shot.png", (1200, 2400)))
    # (the bars' widths are measured shares: backward's has read 783 to 2,000+ pixels)
    assert count_colour(rows, BLUE) > 5_000 and count_colour(rows, ORANGE) > 200
    assert count_colour(rows, GREY) > 2_000  # the regions: forward, backward, optimizer.step
    assert count_colour(rows, HEADER) > 10_000  # the tables' header rows


def test_where_a_viewer_strips_frames_and_scripts_the_text_table_remains():
    from instrumented_convs.pyg import GCNConv

    GCNConv(4, 4)(torch.randn(5, 4), torch.tensor([[0, 1], [1, 2]]))
    summary = ic.registry.summary()
    out = summary._repr_html_()
    stripped = re.sub(r"<iframe.*?</iframe>", "", out, flags=re.S)  # as a static viewer does
    assert html.unescape(re.sub(r"<[^>]+>", "", stripped)).strip() == summary.table().strip()
    document = html.unescape(re.search(r'srcdoc="([^"]*)"', out).group(1))
    assert document.startswith("<!DOCTYPE html>") and "frameElement" in document
    assert '"' not in re.search(r'srcdoc="([^"]*)"', out).group(1)  # escaped: one attribute
    pretty = []
    summary._repr_pretty_(type("P", (), {"text": lambda self, t: pretty.append(t)})(), False)
    assert pretty == [summary.table()]


def test_a_saved_run_loads_as_its_page_with_its_command(executed):
    _, folder = executed
    run = notebook.load(folder / "saved")
    assert run.summary["forward/GCNConv"].count == 10 and run.folder == folder / "saved"
    page = html.unescape(run._repr_html_())
    assert "%%instrumented -o" in page and "versions" in page
    assert repr(run).startswith("NotebookRun('%%instrumented cell'")
    assert in_notebook("<html><body></body></html>", "t").endswith(
        '<pre class="instrumented-convs-text">t</pre>'
    )


def test_the_cell_magic_records_memory_when_asked_and_turns_it_off_after(executed):
    nb, _ = executed
    errors = [o for c in nb.cells[6:] for o in _outputs(c) if o.output_type == "error"]
    assert not errors, errors
    printed = "".join(o.get("text", "") for o in _outputs(nb.cells[7]) if o.output_type == "stream")
    got = json.loads(printed.strip().splitlines()[-1])
    assert got["saved"] > 0 and got["calls"] == [2 * 2, 2 * 2]
    assert got["off"] and got["columns"]
