"""Every conv layer of PyG and DGL, instrumented: equal to the stock layer, steps recorded.

The cases (constructor arguments and inputs per class) are in ``conv_cases_pyg.py`` and
``conv_cases_dgl.py``; each is run on the real stock class and on ours, and outputs and
gradients must be bit-identical. Classes that cannot run here are listed there (``SKIP``)
with the reason.
"""

from __future__ import annotations

import copy
import functools
import importlib
import pickle
from typing import Any, Dict, List, Tuple

import pytest
import torch

import instrumented_convs as ic
from instrumented_convs import registry
from instrumented_convs.layers.generic import GenericLayer

_STOCK_MODULES = {"pyg": "torch_geometric.nn.conv", "dgl": "dgl.nn.pytorch.conv"}


def _load(framework: str) -> Tuple[Any, Any, Any]:
    """(our module, the stock conv module, the cases module), or Nones without the framework."""
    try:
        ours = importlib.import_module(f"instrumented_convs.{framework}")
        stock = importlib.import_module(_STOCK_MODULES[framework])
        cases = importlib.import_module(f"tests.conv_cases_{framework}")
    except ImportError:
        return None, None, None
    return ours, stock, cases


FRAMEWORKS = {fw: _load(fw) for fw in _STOCK_MODULES}
PARAMS = [
    pytest.param(
        fw,
        case,
        id=f"{fw}-{case.id}",
        marks=[pytest.mark.sparse] if getattr(case, "sparse", False) else [],
    )
    for fw, (_, _, cases) in FRAMEWORKS.items()
    if cases is not None
    for case in cases.CASES
]


def _classes(fw: str, name: str) -> Tuple[type, type]:
    ours, stock, cases = FRAMEWORKS[fw]
    extra = getattr(cases, "EXTRA", {})  # classes outside the conv module (HeteroGraphConv)
    return (extra[name] if name in extra else getattr(stock, name)), getattr(ours, name)


def _assert_same(ref: Dict[str, torch.Tensor], got: Dict[str, torch.Tensor]) -> None:
    assert list(got) == list(ref)
    for key, value in ref.items():
        assert torch.equal(value, got[key]), key


def _run(cases: Any, layer: torch.nn.Module, case: Any) -> Dict[str, torch.Tensor]:
    """``cases.run`` with fresh gradients (layers in a test may share parameters)."""
    for p in layer.parameters():
        p.grad = None
    return cases.run(layer, case)


def _children(layer: torch.nn.Module) -> List[Tuple[str, torch.nn.Module]]:
    from instrumented_convs.layers.relations import child_names

    named = [(n.replace("/", "|"), c) for n, c, _ in child_names(layer)]
    return [(n, c) for n, c in named if n not in GenericLayer._ic_skip]


def _repr(layer: torch.nn.Module) -> Any:
    try:
        return repr(layer)
    except Exception as e:  # noqa: BLE001
        return type(e)


def _count_calls(layer: torch.nn.Module) -> Dict[str, List[int]]:
    """Count the calls of each child of a stock layer during its forward (the steps ours
    must record; GroupRevRes calls its children again in backward, outside any forward)."""
    counts: Dict[str, List[int]] = {}
    running = [False]
    for name, child in _children(layer):
        c = counts.setdefault(name, [0])

        # also sees direct child.forward() calls; chains to ours where the child is shared
        # (PyG's act=Sigmoid() default argument is one module for every layer)
        def counted(*args, c=c, child=child, prev=child.__dict__.get("forward"), **kwargs):
            c[0] += running[0]
            return (prev or functools.partial(type(child).forward, child))(*args, **kwargs)

        child.forward = counted
    layer.register_forward_pre_hook(lambda m, a: running.__setitem__(0, True))
    layer.register_forward_hook(lambda m, a, r: running.__setitem__(0, False))
    return counts


def _propagate_calls(layer: torch.nn.Module) -> List[int]:
    calls = [0]
    hook = getattr(layer, "register_propagate_forward_pre_hook", None)
    if hook is not None:
        hook(lambda m, inputs: calls.__setitem__(0, calls[0] + 1))
    return calls


def _forward_count(summary: Any, name: str, phase: str = "forward") -> int:
    return sum(r.count for r in summary.rows if r.step == name and r.phase == phase)


@pytest.mark.parametrize("fw,case", PARAMS)
def test_matches_stock_and_records_its_steps(fw, case):
    stock_cls, ours_cls = _classes(fw, case.name)
    cases = FRAMEWORKS[fw][2]
    assert issubclass(ours_cls, stock_cls) and ours_cls is not stock_cls
    stock, ours = cases.build_pair(case, ours_cls)
    assert isinstance(ours, stock_cls)
    assert list(ours.state_dict()) == list(stock.state_dict())
    assert _repr(ours) == _repr(stock)  # or the same error (DGL's GCN2Conv has a broken repr)
    calls = _count_calls(stock)
    propagations = _propagate_calls(stock)
    ref = _run(cases, stock, case)
    registry.reset()
    got = _run(cases, ours, case)
    _assert_same(ref, got)
    s = registry.summary()
    assert s[case.name].count >= 1 and s[case.name].errors == 0
    if any(k.startswith("grad.") for k in got):  # a backward ran: the layer's backward row
        assert any(r.name == case.name and r.phase == "backward" for r in s.rows), s
    if isinstance(ours, GenericLayer):
        for child, (n,) in calls.items():
            assert _forward_count(s, child) == n, (child, s)
        if propagations[0]:
            assert _forward_count(s, "propagate") == propagations[0], s
            assert _forward_count(s, "collect") + _forward_count(s, "message_and_aggregate") >= 1, s


@pytest.mark.parametrize("fw,case", PARAMS)
def test_instrument_converts_a_stock_layer_in_place_and_back(fw, case):
    stock_cls, ours_cls = _classes(fw, case.name)
    cases = FRAMEWORKS[fw][2]
    layer, ref = cases.build_pair(case, stock_cls)
    params = [id(p) for p in layer.parameters()]
    keys = list(layer.state_dict())
    training = layer.training
    assert ic.instrument(layer) is layer
    ic.instrument(layer)  # twice: harmless
    assert type(layer) is ours_cls
    assert [id(p) for p in layer.parameters()] == params and list(layer.state_dict()) == keys
    assert layer.training == training
    registry.reset()
    _assert_same(_run(cases, ref, case), _run(cases, layer, case))
    assert registry.summary()[case.name].count >= 1
    ic.uninstrument(layer)
    assert type(layer) is stock_cls
    from instrumented_convs.layers.contract import Timed

    ours_left = [n for n, v in layer.__dict__.items() if n.startswith("_ic_") or type(v) is Timed]
    assert not ours_left, ours_left  # nothing of ours left, detailed layer or generic
    registry.reset()
    _assert_same(_run(cases, ref, case), _run(cases, layer, case))
    assert len(registry.summary()) == 0, registry.summary()


@pytest.mark.parametrize("fw", [fw for fw, mods in FRAMEWORKS.items() if mods[0] is not None])
def test_every_conv_class_is_instrumented_or_listed_with_a_reason(fw):
    ours, stock, cases = FRAMEWORKS[fw]
    tested = {c.name for c in cases.CASES}
    for name in stock.__all__:
        if name in ours.NOT_INSTRUMENTED:
            assert name not in ours.__all__ and ours.NOT_INSTRUMENTED[name]
            continue
        assert name in ours.__all__, name
        assert issubclass(getattr(ours, name), getattr(stock, name))
        assert (name in tested) != (name in cases.SKIP), f"{name}: tested or skipped with a reason"
        assert name not in cases.SKIP or cases.SKIP[name]
    for name, cls in getattr(cases, "EXTRA", {}).items():  # beyond the conv module: tested
        assert name in ours.__all__ and issubclass(getattr(ours, name), cls) and name in tested


@pytest.mark.parametrize(
    "fw,case",
    [p for p in PARAMS if p.values[1].id in ("SAGEConv", "GATConv", "GINConv", "SAGEConv-mean")][
        :6
    ],
)
def test_pickle_and_deepcopy_keep_the_steps(fw, case):
    _, ours_cls = _classes(fw, case.name)
    cases = FRAMEWORKS[fw][2]
    _, ours = cases.build_pair(case, ours_cls)
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert type(clone) is ours_cls
        registry.reset()
        _assert_same(_run(cases, ours, case), _run(cases, clone, case))
        assert registry.summary()[case.name].count == 2


@pytest.mark.parametrize(
    "fw,case",
    [
        p
        for p in PARAMS
        if p.values[1].id
        in (
            "SAGEConv",
            "GATConv",
            "GINConv",
            "SAGEConv-mean",
            "GCNConv",
            "GCNConv-edge_weight",
            "GraphConv",
        )
    ],
)
def test_to_stock_and_from_stock_share_parameters(fw, case):
    """One conversion for detailed layers (GCNConv, DGL's GraphConv) and generic ones."""
    stock_cls, ours_cls = _classes(fw, case.name)
    cases = FRAMEWORKS[fw][2]
    stock, ours = cases.build_pair(case, ours_cls)
    back = ours.to_stock()
    assert type(back) is stock_cls
    assert set(back.__dict__) == set(stock.__dict__)  # nothing of ours on the stock copy
    with pytest.raises(TypeError):
        ours_cls.from_stock(ours)  # takes a stock layer, not one of ours
    assert [id(p) for p in back.parameters()] == [id(p) for p in ours.parameters()]
    again = ours_cls.from_stock(stock)
    assert [id(p) for p in again.parameters()] == [id(p) for p in stock.parameters()]
    registry.reset()
    _assert_same(_run(cases, stock, case), _run(cases, back, case))
    assert len(registry.summary()) == 0  # neither the stock layer nor the stock copy records
    _assert_same(_run(cases, stock, case), _run(cases, again, case))
    assert registry.summary()[case.name].count == 1


@pytest.mark.parametrize("fw", [fw for fw, mods in FRAMEWORKS.items() if mods[0] is not None])
def test_the_layers_page_lists_every_class(fw):
    from pathlib import Path

    package = {"pyg": "torch_geometric", "dgl": "dgl"}[fw]
    version = importlib.import_module(package).__version__
    text = (Path(__file__).resolve().parents[1] / "docs" / "layers.md").read_text()
    if f" {version} (`" not in text:
        pytest.skip(f"docs/layers.md was generated with another {package} than {version}")
    for name in FRAMEWORKS[fw][1].__all__:
        assert f"| {name} |" in text, f"docs/layers.md lacks {name}: run scripts/layer_docs.py"
