"""A layer's own statements as steps (instrumented_convs.layers.statements.forward): the same
results, the steps named after the statements, forward and backward, and no new code where the
source is not the code that runs."""

from __future__ import annotations

import importlib
import sys
import traceback

import pytest
import torch

from instrumented_convs import configure, registry
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.layers.statements.forward import with_steps
from instrumented_convs.testing import depth

from .helpers import module_from

UPSTREAM = '''
import torch
from torch import nn


def helper(x):
    return x + 1


class Base(nn.Module):
    def forward(self, x):
        return x


class Layer(Base):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.__secret = 2.0

    def forward(self, x, scale: float = 3.0, *, shift=None):
        """The layer's forward."""
        h = self.lin(x)
        a = (h * scale).sum(dim=-1)
        b: torch.Tensor = a * self.__secret
        if shift is not None:
            b = b + shift
        for _ in range(3):
            b = b * 1.5
        out = super().forward(b)
        c = helper(out)
        return c - 1


class Failing(nn.Module):
    def forward(self, x):
        y = x * 2
        z = y + missing_name
        return z


class NoGrad(nn.Module):
    @torch.no_grad()
    def forward(self, x):
        return x * 2


def _other(fn):
    return fn


class Decorated(nn.Module):
    @_other
    def forward(self, x):
        return x * 2
'''


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A module of our own standing for an upstream one, imported from its file."""
    yield from module_from(UPSTREAM, "ic_fake_layers", tmp_path, monkeypatch)


def _run(fn, layer, *args, **kwargs):
    with step("Layer"):
        return mark_outputs(fn(layer, *args, **kwargs))


def test_the_same_results_with_a_step_per_statement_of_work_forward_and_backward(upstream):
    configure(backward_every=1)
    fn = with_steps(upstream.Layer, frozenset())
    assert fn._ic_steps == (
        "a = (h * scale).sum(dim=-1)",
        "b: torch.Tensor = a * self.__secret",
        "b = b + shift",
        "for _ in range(3):",
        "return c - 1",
    )
    assert fn.__doc__ == "The layer's forward." and fn.__defaults__ == (3.0,)
    torch.manual_seed(0)
    layer = upstream.Layer()
    for kwargs in ({}, {"scale": 0.5, "shift": torch.ones(2)}):
        x = torch.randn(2, 4, requires_grad=True)
        expected = upstream.Layer.forward(layer, x, **kwargs)
        (gx,) = torch.autograd.grad(expected.sum(), x)
        got = _run(fn, layer, x, **kwargs)
        got.sum().backward()
        assert torch.equal(got, expected) and torch.equal(x.grad, gx)
    s = registry.summary()
    forward = {r.name: r.count for r in s.rows if r.phase == "forward"}
    assert forward == {
        "Layer": 2,
        "Layer/a = (h * scale).sum(dim=-1)": 2,
        "Layer/b: torch.Tensor = a * self.__secret": 2,
        "Layer/b = b + shift": 1,
        "Layer/for _ in range(3):": 2,  # a loop with no step inside: one step, not three
        "Layer/return c - 1": 2,
    }
    backward = {r.name for r in s.rows if r.phase == "backward"}
    assert "Layer/a = (h * scale).sum(dim=-1)" in backward
    assert "Layer/for _ in range(3):" in backward


def test_an_exception_in_a_statement_keeps_upstreams_line_and_balanced_stacks(upstream):
    fn = with_steps(upstream.Failing, frozenset())
    assert fn._ic_steps == ("y = x * 2", "z = y + missing_name")
    with pytest.raises(NameError) as info:
        _run(fn, upstream.Failing(), torch.ones(2))
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    line = UPSTREAM.splitlines().index("        z = y + missing_name") + 1
    assert (frame.filename, frame.lineno) == (str(upstream.path), line)
    assert depth() == 0
    rows = {r.name: r.errors for r in registry.summary().rows}
    assert rows["Layer/z = y + missing_name"] == 1 and rows["Layer/y = x * 2"] == 0


def test_a_grad_mode_decorator_is_made_again_and_others_are_left_alone(upstream):
    fn = with_steps(upstream.NoGrad, frozenset())
    x = torch.ones(2, requires_grad=True)
    assert fn._ic_steps == ("return x * 2",) and not fn(upstream.NoGrad(), x).requires_grad
    assert with_steps(upstream.Decorated, frozenset()) is None


def test_no_new_code_where_the_source_is_not_the_code_that_runs(upstream):
    assert with_steps(upstream.Layer, frozenset()) is not None
    text = upstream.path.read_text().replace("b = b * 1.5", "b = b * 2.5")
    upstream.path.write_text(text)  # the file changed after import
    assert with_steps(upstream.Layer, frozenset()) is None


def test_timed_calls_are_left_to_their_own_steps(upstream):
    # helper timed (routed): a statement that only calls it is no step; one that also
    # works is split: the call first, in no step of the statement's, then the work in it
    fn = with_steps(upstream.Layer, frozenset({"helper"}))
    assert "return c - 1" in fn._ic_steps and "c = helper(out)" not in fn._ic_steps
    src = UPSTREAM.replace("c = helper(out)", "c = helper(out) * 2")
    assert "c = helper(out) * 2" in with_steps_of(src, frozenset({"helper"}))
    assert "c = helper(out) * 2" in with_steps_of(src, frozenset())


def with_steps_of(source: str, timed: frozenset) -> tuple:
    """The steps of ``Layer.forward`` in a module made of ``source``."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ic_fake_layers_2.py"
        path.write_text(source)
        sys.path.insert(0, d)
        try:
            mod = importlib.import_module("ic_fake_layers_2")
            return with_steps(mod.Layer, timed)._ic_steps
        finally:
            sys.path.remove(d)
            sys.modules.pop("ic_fake_layers_2", None)


def test_a_method_of_a_parameter_is_work_a_call_of_a_child_or_method_is_not():
    src = UPSTREAM.replace(
        "a = (h * scale).sum(dim=-1)", "a = (h * self.lin.weight.sum()).sum(dim=-1)"
    ).replace("c = helper(out)", "c = helper(out) + self.lins[0](out) + Base.forward(self, out)")
    steps = with_steps_of(src, frozenset())
    assert "a = (h * self.lin.weight.sum()).sum(dim=-1)" in steps  # a tensor's method
    # self.lins[0](...): a child; Base.forward(self, ...): given the layer, it may run
    # steps; helper(out) + ...: their sum, the statement's own work, is its step
    assert [s for s in steps if s.startswith("c = ")] == [
        "c = helper(out) + self.lins[0](out) + Base.forw…"
    ]


def test_a_forward_naming_its_own_class_runs_as_it_is():
    src = UPSTREAM.replace("c = helper(out)", "c = helper(out) if isinstance(self, Layer) else out")
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "ic_fake_layers_3.py").write_text(src)
        sys.path.insert(0, d)
        try:
            mod = importlib.import_module("ic_fake_layers_3")
            assert with_steps(mod.Layer, frozenset()) is None  # the class: a free name
        finally:
            sys.path.remove(d)
            sys.modules.pop("ic_fake_layers_3", None)
