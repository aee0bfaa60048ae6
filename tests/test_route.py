"""Routing an upstream module global during a fallback call: this thread only, put back."""

from __future__ import annotations

import threading
import types

import pytest

from instrumented_convs._route import Route


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
