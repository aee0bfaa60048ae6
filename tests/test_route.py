"""Routing upstream module globals through steps during a call: this thread only, put back."""

from __future__ import annotations

import sys
import threading
import types

import pytest
import torch

from instrumented_convs import registry
from instrumented_convs.layers import Step, step
from instrumented_convs.layers.contract import Timed
from instrumented_convs.layers.statements.routes import (
    Route,
    any_function,
    helpers,
    routes_of,
    scan,
    torch_function,
)


def _module():
    def f(x):
        return x + 1

    return types.SimpleNamespace(f=f), f


def test_the_route_is_in_place_only_during_blocks_and_calls_inside_on_this_thread():
    mod, original = _module()
    seen = []
    route = Route(mod, "f", lambda orig, x: seen.append(x) or orig(x) * 10)
    assert mod.f is original
    with route.active():
        assert mod.f is route
        assert mod.f(1) == 20 and seen == [1]
        with route.active():  # nested: still routed, and after the inner block too
            assert mod.f(2) == 30
        assert mod.f is route
    assert mod.f is original and mod.f(1) == 2


def test_another_thread_gets_the_original_while_a_block_is_open():
    mod, original = _module()
    route = Route(mod, "f", lambda orig, x: -1)
    inside, outside, done = threading.Event(), threading.Event(), []

    def other():
        inside.wait(10)
        done.append(mod.f(5))  # routed in the module, but not within a block here
        outside.set()

    t = threading.Thread(target=other)
    t.start()
    with route.active():
        inside.set()
        outside.wait(10)
        assert mod.f(5) == -1
    t.join(10)
    assert done == [6] and mod.f is original


def test_two_threads_in_blocks_put_the_original_back_when_the_last_leaves():
    mod, original = _module()
    route = Route(mod, "f", lambda orig, x: orig(x) * 10)
    first_in, second_out = threading.Event(), threading.Event()
    got = []

    def first():
        with route.active():
            first_in.set()
            second_out.wait(10)
            got.append(mod.f(1))  # still routed: this thread's block is open

    t = threading.Thread(target=first)
    t.start()
    first_in.wait(10)
    with route.active():
        got.append(mod.f(2))
    second_out.set()
    t.join(10)
    assert got == [30, 20] and mod.f is original


def test_an_exception_in_the_block_puts_the_original_back():
    mod, original = _module()
    route = Route(mod, "f", lambda orig, x: 0)
    with pytest.raises(KeyError):
        with route.active():
            raise KeyError("x")
    assert mod.f is original and mod.f(1) == 2


# -- Routes: a module's functions and F.<function> as steps while a layer of it runs ----------

MODULE = """
import torch
import torch.nn.functional as F


def helper(x):
    return x * 2


def is_ready(x):
    return True


class Layer(torch.nn.Module):
    def forward(self, x):
        h = helper(x)
        return F.relu(F.dropout(h, p=0.0)) + torch.cat([h, h]).sum()
"""


@pytest.fixture
def upstream(tmp_path, monkeypatch):
    """A module of our own standing for an upstream one (imported from a file)."""
    import importlib

    (tmp_path / "ic_fake_upstream.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("ic_fake_upstream")
    yield mod
    sys.modules.pop("ic_fake_upstream", None)


def _vocabulary():
    return (("ic_fake_upstream",), {"torch.nn.functional": any_function, "torch": torch_function})


def test_scan_finds_module_functions_and_module_attributes_but_not_cheap_ones(upstream):
    ns = upstream.__dict__
    functions, attributes = scan(upstream.Layer.forward, ns, *_vocabulary())
    assert functions == ("helper",)
    assert attributes == {"F": ("relu", "dropout"), "torch": ("cat",)}
    assert "is_ready" not in functions  # a predicate: never worth a step


def test_routes_time_on_this_thread_inside_blocks_only_and_put_everything_back(upstream):
    ns = upstream.__dict__
    originals = dict(ns)
    routes = routes_of(ns)
    assert routes is routes_of(ns)  # one per namespace
    routes.add(*scan(upstream.Layer.forward, ns, *_vocabulary()))
    assert routes.timed == {"helper", "F.relu", "F.dropout", "torch.cat"}
    layer, x = upstream.Layer(), torch.randn(3)
    expected = layer(x)
    with step("Layer"):
        with routes:
            assert ns["F"] is not originals["F"] and ns["F"].linear is torch.nn.functional.linear
            got = layer(x)
    assert torch.equal(got, expected)
    assert {k: v for k, v in ns.items() if k in originals} == originals
    names = [r.name for r in registry.summary().rows if r.phase == "forward"]
    assert names == ["Layer", "Layer/helper", "Layer/dropout", "Layer/relu", "Layer/cat"]
    registry.reset()
    layer(x)  # outside a block: the module's own functions, nothing recorded
    assert registry.summary().rows == []


def test_another_thread_runs_the_originals_untimed_while_routed(upstream):
    ns = upstream.__dict__
    routes = routes_of(ns)
    routes.add(*scan(upstream.Layer.forward, ns, *_vocabulary()))
    inside, done = threading.Event(), threading.Event()

    def other():
        inside.wait(10)
        upstream.Layer()(torch.randn(2))  # sees the wrappers, runs them untimed
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with step("Layer"), routes:
        inside.set()
        assert done.wait(10)
    t.join()
    assert [r.name for r in registry.summary().rows] == ["Layer"]


def test_an_exception_inside_puts_the_originals_back_and_through_replaces_a_function(upstream):
    ns = upstream.__dict__
    helper = ns["helper"]
    routes = routes_of(ns)
    routes.add(("helper",), through={"helper": lambda x: x * 3})
    with pytest.raises(RuntimeError, match="boom"):
        with routes:
            assert ns["helper"](torch.ones(1)).item() == 3.0
            raise RuntimeError("boom")
    assert ns["helper"] is helper
    with routes:
        with pytest.raises(RuntimeError, match="cannot change"):
            routes.add(("is_ready",))


def test_helpers_are_the_classes_own_methods_that_forward_calls_on_self():
    class Base(torch.nn.Module):
        def shared(self, x):
            return x

    class Layer(Base):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def _prep(self, x):
            return x * 2

        def unused(self, x):
            return x

        def forward(self, x):
            x = self._prep(self.shared(x))
            self.train(self.training)  # torch.nn.Module's own: never a step
            keep = [self.unused]  # handed on, not called here: no step (it may run later)
            return [self.lin(v) for v in (x,)] + keep  # a child, in nested code

    # (lin: called on self, defined by no class: an attribute, timed only where the
    # instance holds a callable that is no child module; see the test below)
    assert helpers(Layer, Layer.forward, (torch.nn.Module,)) == ("_prep", "shared", "lin")
    assert helpers(Layer, Layer.forward, (Base, torch.nn.Module)) == ("_prep", "lin")


def test_a_callable_the_instance_holds_is_a_step_where_forward_only_calls_or_tests_it():
    """DGL's ``activation=``: a function on the instance, timed as a step named after the
    attribute while the forward runs; not where the forward hands it on (it may run later),
    nor where the instance holds None; a child module stays a child (one step)."""
    from instrumented_convs.layers import generic

    class Layer(torch.nn.Module):
        def __init__(self, act=None):
            super().__init__()
            self.act, self.given, self.norm = act, torch.tanh, torch.nn.Identity()

        def forward(self, x):
            if self.act is not None:
                x = self.act(x)
            if self.given:
                x = self.given(x)
            keep = [self.given]  # handed on as a value: never a step
            return self.norm(x), keep

    assert helpers(Layer, Layer.forward, (torch.nn.Module,)) == ("act", "norm")
    methods = tuple((n, Step(n)) for n in ("act", "norm"))
    for act, timed in ((torch.relu, True), (None, False)):
        layer = Layer(act)
        undo = generic.install(layer, children=False, methods=methods)
        try:
            assert (type(layer.__dict__.get("act")) is Timed) == timed
            assert "norm" not in layer.__dict__  # a child: timed as one, not as a method
        finally:
            generic.uninstall(undo)
        assert layer.act is act and "norm" not in layer.__dict__


def test_a_routed_name_rebound_after_import_is_the_one_called(upstream, monkeypatch):
    ns = upstream.__dict__
    routes = routes_of(ns)
    routes.add(*scan(upstream.Layer.forward, ns, *_vocabulary()))
    layer, x = upstream.Layer(), torch.ones(2)
    # patches made after the routes were built: what the stock layer calls now
    monkeypatch.setitem(ns, "helper", lambda v: v * 5)
    monkeypatch.setattr(torch.nn.functional, "dropout", lambda h, p: h * 7)
    expected = layer(x)
    assert expected[0].item() == 35.0 + 20.0
    with step("Layer"), routes:
        got = layer(x)
    assert torch.equal(got, expected)


def test_through_on_another_thread_runs_the_original_untimed(upstream):
    ns = upstream.__dict__
    original = ns["helper"]
    routes = routes_of(ns)
    routes.add(("helper",), through={"helper": lambda x: x * 3})
    inside, seen = threading.Event(), []

    def other():
        inside.wait(10)
        seen.append(ns["helper"](torch.ones(1)).item())  # the wrapper, untimed: the original

    t = threading.Thread(target=other)
    t.start()
    with routes:
        inside.set()
        t.join()
    assert seen == [original(torch.ones(1)).item()] == [2.0]
    assert [r.name for r in registry.summary().rows] == []


def test_a_name_rebound_while_routed_is_left_as_rebound_and_a_missing_one_skipped(upstream):
    ns = upstream.__dict__
    routes = routes_of(ns)
    routes.add(("helper", "is_ready"))
    patched = lambda x: x  # noqa: E731
    with routes:
        ns["helper"] = patched  # someone patches meanwhile (mock.patch on another thread)
    assert ns["helper"] is patched  # not overwritten by our restore
    del ns["is_ready"]
    with routes:  # a name gone: nothing routed for it, nothing fails
        assert "is_ready" not in ns
    assert "is_ready" not in ns and ns["helper"] is patched
