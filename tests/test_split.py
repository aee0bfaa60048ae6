"""A statement that calls steps and does work of its own, split
(instrumented_convs.layers.statements.split): the same results, evaluated in the same order,
temporaries let go as soon as used, the calls' steps where they always were and the work in a step
named after its source; and a function defined in the forward, and a forward under a decorator, with
steps too."""

from __future__ import annotations

import sys
import traceback

import pytest
import torch

from instrumented_convs import configure, registry
from instrumented_convs.layers import mark_outputs, step
from instrumented_convs.layers.statements.forward import with_steps
from instrumented_convs.layers.statements.routes import routes_of
from instrumented_convs.testing import depth

from .helpers import module_from

UPSTREAM = '''
import functools
import weakref

import torch
from torch import nn

LOG = []
REFS = []


def note(tag, value):
    LOG.append(tag)
    return value


def routed(x):
    LOG.append("routed")
    return x + 1


def apply(fn, x):
    LOG.append("apply")
    return fn(x)


class Child(nn.Module):
    def forward(self, x):
        LOG.append("child")
        out = x * 3
        REFS.append(weakref.ref(out))
        return out


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.child = Child()

    def forward(self, x, flag: bool = True):
        a = note("a", x * 2) + self.child(note("b", x + 1)) + note("c", x - 1)
        alive = REFS[-1]() is not None
        b = routed(x[x > 0].sum() * 2) - 1
        if (routed(a) > 0).any():
            b = b + 1
        c = self.child(a) if flag else a * 5
        d = routed(a).relu().clamp(min=0.5)
        e = torch.cat([note("d", a), self.child(b.expand_as(a))], dim=0)
        f = apply(self._half, c * 2)
        n = len(self._modules) * 1.0
        return (e * 2).sum(0) + d + f * n, alive

    def _half(self, x):
        LOG.append("half")
        return x / 2


class Nested(nn.Module):
    def forward(self, x):
        def scale(v, k):
            """A helper of the forward's own."""
            w = v * k
            return routed(w) + 1

        def gen(v):
            yield v * 2

        h = scale(x, 2.0)
        return h + next(gen(h))


class Failing(nn.Module):
    def forward(self, x):
        y = routed(x) * 2
        z = routed(y) + missing_name
        return z


class Walrus(nn.Module):
    def forward(self, x):
        y = routed(x) + (k := x * 2)
        return y * k


def counted(fn):
    calls = []

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    wrapper.calls = calls
    return wrapper


class Decorated(nn.Module):
    @counted
    def forward(self, x):
        return routed(x) * 2
'''

TIMED = frozenset({"routed", "torch.cat"})


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A module of our own standing for an upstream one, imported from its file."""
    yield from module_from(UPSTREAM, "ic_fake_split", tmp_path, monkeypatch)


def _run(fn, layer, *args, **kwargs):
    """``fn`` in a step, with ``routed`` and ``torch.cat`` routed through steps (as the
    generic layers route upstream's functions: instrumented_convs.layers.statements.routes)."""
    routes = routes_of(sys.modules[type(layer).__module__].__dict__)
    routes.add(("routed",), {"torch": ("cat",)})
    with step("Layer"), routes:
        return mark_outputs(fn(layer, *args, **kwargs))


def test_split_statements_compute_the_same_in_the_same_order_and_let_go_at_once(upstream):
    configure(backward_every=1)
    fn = with_steps(upstream.Layer, TIMED)
    torch.manual_seed(0)
    layer = upstream.Layer()
    for flag in (True, False):
        x = torch.randn(3, 4, requires_grad=True)
        upstream.LOG.clear()
        expected, alive = upstream.Layer.forward(layer, x, flag)
        stock_log = list(upstream.LOG)
        (gx,) = torch.autograd.grad(expected.sum(), x)
        upstream.LOG.clear()
        x.grad = None
        got, alive_here = _run(fn, layer, x, flag)
        got.sum().backward()
        assert upstream.LOG == stock_log  # every call, in the same order
        assert torch.equal(got, expected) and torch.equal(x.grad, gx)
        # the child's output, used once by the statement, is gone after it in both
        assert alive is alive_here is False
    assert depth() == 0


def test_the_work_around_steps_is_in_steps_named_after_its_source(upstream):
    configure(backward_every=1)
    fn = with_steps(upstream.Layer, TIMED)
    assert fn._ic_steps == (
        "note('a', x * 2), note('b', x + 1)",  # computed before the child is called
        "a = note('a', x * 2) + self.child(note('b', x +…",  # the additions after it
        "x[x > 0].sum() * 2",  # a routed call's argument, computed before it
        "b = routed(x[x > 0].sum() * 2) - 1",  # the subtraction after it
        "if (routed(a) > 0).any():",  # the test's work, after routed(a)
        "b = b + 1",
        "a * 5",  # a conditional expression's branch (the other calls the child)
        "d = routed(a).relu().clamp(min=0.5)",
        "b.expand_as(a)",  # free forward, a sum in the backward: computed before the child
        "c * 2",  # the argument of a function given the layer's method
        "n = len(self._modules) * 1.0",  # a builtin given the layer's attribute: work
        "return ((e * 2).sum(0) + d + f * n, alive)",
    )
    layer = upstream.Layer()
    for flag in (True, False):
        out, _ = _run(fn, layer, torch.randn(3, 4, requires_grad=True), flag)
        out.sum().backward()
    rows = {r.name: r.count for r in registry.summary().rows if r.phase == "forward"}
    # the calls' steps stay where they were: under the layer, not under a statement
    assert rows["Layer/routed"] == 6 and rows["Layer/cat"] == 2
    assert not any(p.endswith(("/routed", "/cat")) for p in rows if p.count("/") > 1)
    assert rows["Layer/a * 5"] == 1 and rows["Layer/if (routed(a) > 0).any():"] == 2
    # apply(self._half, ...) may run the layer's steps: no statement step around it
    assert not any(p.startswith("Layer/f = ") for p in rows)
    assert rows["Layer/n = len(self._modules) * 1.0"] == 2
    backward = {r.name for r in registry.summary().rows if r.phase == "backward"}
    assert "Layer/a = note('a', x * 2) + self.child(note('b', x +…" in backward
    assert "Layer/return ((e * 2).sum(0) + d + f * n, alive)" in backward


def test_a_function_defined_in_the_forward_is_a_step_with_its_own_statements(upstream):
    fn = with_steps(upstream.Nested, TIMED)
    x = torch.randn(2, requires_grad=True)
    expected = upstream.Nested.forward(upstream.Nested(), x)
    assert torch.equal(_run(fn, upstream.Nested(), x), expected)
    rows = [r.name for r in registry.summary().rows if r.phase == "forward"]
    assert rows == [
        "Layer",
        "Layer/scale",
        "Layer/scale/w = v * k",
        "Layer/scale/routed",
        "Layer/scale/return routed(w) + 1",
        "Layer/return h + next(gen(h))",  # the generator runs in pieces: not a step
    ]


def test_an_error_in_a_split_statement_comes_from_upstreams_line_with_stacks_balanced(upstream):
    fn = with_steps(upstream.Failing, TIMED)
    with pytest.raises(NameError) as info:
        _run(fn, upstream.Failing(), torch.ones(2))
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    line = UPSTREAM.splitlines().index("        z = routed(y) + missing_name") + 1
    assert (frame.filename, frame.lineno) == (str(upstream.path), line)
    assert depth() == 0
    rows = {r.name: (r.count, r.errors) for r in registry.summary().rows}
    assert rows["Layer/z = routed(y) + missing_name"] == (1, 1)
    assert rows["Layer/routed"] == (2, 0) and rows["Layer/y = routed(x) * 2"] == (1, 0)


def test_a_statement_with_a_walrus_is_left_as_it_is(upstream):
    fn = with_steps(upstream.Walrus, TIMED)
    assert fn._ic_steps == ("return y * k",)
    x = torch.randn(2)
    assert torch.equal(_run(fn, upstream.Walrus(), x), upstream.Walrus.forward(None, x))


def test_a_decorators_wrapper_is_made_again_around_the_forward_with_steps(upstream):
    fn = with_steps(upstream.Decorated, TIMED)
    assert fn._ic_steps == ("return routed(x) * 2",)
    calls = upstream.Decorated.forward.calls
    x = torch.ones(2)
    assert torch.equal(_run(fn, upstream.Decorated(), x), 2 * (x + 1))
    assert len(calls) == 1  # the decorator's own code ran, with its own state
    rows = [r.name for r in registry.summary().rows]
    assert rows == ["Layer", "Layer/routed", "Layer/return routed(x) * 2"]
