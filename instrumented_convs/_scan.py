"""What a layer's ``forward`` calls that can be timed from outside: the functions it reads
through its module's globals (for :class:`._route.Routes`) and its own helper methods
(timed like children), found in its bytecode. Nothing here imports from the package.
"""

from __future__ import annotations

import dis
import types
from typing import Any, Callable, Dict, FrozenSet, List, Tuple

__all__ = ["scan", "helpers", "torch_function", "any_function"]


#: Predicates, checks and helpers that do no work worth a step (name prefixes).
_CHEAP = ("is_", "check_", "maybe_", "_", "expand_as_pair", "dgl_warning", "warn")

#: Functions of ``torch`` that are not worth a step: views and reshapes (no data moves),
#: tensors from Python data or filled with a constant, grad modes, types and devices.
_TORCH_CHEAP = frozenset(
    "reshape view flatten unflatten squeeze unsqueeze transpose permute t narrow chunk split "
    "tensor_split unbind movedim select expand broadcast_to as_strided tensor as_tensor "
    "from_numpy no_grad enable_grad inference_mode device finfo iinfo numel jit ops "
    "empty empty_like get_default_dtype set_grad_enabled is_grad_enabled arange zeros ones "
    "zeros_like ones_like full full_like".split()
)


def torch_function(name: str) -> bool:
    """Whether a function ``torch.<name>`` that a forward calls is worth a step of its own."""
    return name not in _TORCH_CHEAP and not name.startswith(_CHEAP)


def any_function(name: str) -> bool:
    """Whether a function of a module (``F.<name>``) is worth a step: all but helpers."""
    return not name.startswith(_CHEAP)


#: Methods a layer's forward may call on itself that are never its own steps.
_NOT_HELPERS = frozenset({"forward", "__call__", "_call_impl", "_wrapped_call_impl"})


def helpers(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` that ``fn`` (its ``forward``) calls on ``self`` and that the
    stock class or a parent of it defines, below the ``base`` classes (``torch.nn.Module``,
    PyG's ``MessagePassing``): ChebConv's ``__norm__``, SuperGATConv's
    ``negative_sampling``... Each is timed as a step named after it, as children are."""
    out: List[str] = []
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    code = getattr(fn, "__code__", None)
    codes = [code] if code is not None else []
    while codes:
        c = codes.pop()
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        ins = list(dis.get_instructions(c))
        for op, nxt in zip(ins, ins[1:]):
            if op.opname not in ("LOAD_FAST", "LOAD_DEREF") or op.argval != "self":
                continue
            # a call of a method (3.11: LOAD_METHOD; 3.12+: LOAD_ATTR marked as a method
            # load), not a bound method handed on as a value (GroupRevRes's self._forward)
            if nxt.opname != "LOAD_METHOD" and not (
                nxt.opname == "LOAD_ATTR" and "NULL|self" in (nxt.argrepr or "")
            ):
                continue
            name = nxt.argval
            if name in _NOT_HELPERS or name in out:
                continue
            owner = next((k for k in stock.__mro__ if name in k.__dict__), None)
            if owner in owners and isinstance(owner.__dict__[name], types.FunctionType):
                out.append(name)
    return tuple(out)


def scan(
    fn: Callable[..., Any],
    namespace: Dict[str, Any],
    packages: Tuple[str, ...],
    modules: Dict[str, Callable[[str], bool]],
    skip: FrozenSet[str] = frozenset(),
) -> Tuple[Tuple[str, ...], Dict[str, Tuple[str, ...]]]:
    """What ``fn`` (a ``forward``) calls through ``namespace`` that :class:`Routes` can time.

    Functions: globals that are functions of ``packages`` (``("torch_geometric",)``), but
    cheap predicates and helpers and the names in ``skip`` (timed otherwise). Attributes:
    for a global that is a module named in ``modules`` (by its real name,
    ``"torch.nn.functional"``), the functions the code reads of it that
    ``modules[name](attribute)`` accepts. Nested code (comprehensions) included.
    """
    functions: List[str] = []
    attributes: Dict[str, List[str]] = {}
    codes = [getattr(fn, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        ins = list(dis.get_instructions(code))
        for i, op in enumerate(ins):
            if op.opname != "LOAD_GLOBAL":
                continue
            name = op.argval
            value = namespace.get(name)
            if isinstance(value, types.ModuleType):
                accept = modules.get(value.__name__)
                nxt = ins[i + 1] if i + 1 < len(ins) else None
                if accept and nxt is not None and nxt.opname in ("LOAD_ATTR", "LOAD_METHOD"):
                    attr = nxt.argval
                    v = getattr(value, attr, None)
                    if callable(v) and not isinstance(v, type) and accept(attr):
                        attributes.setdefault(name, [])
                        if attr not in attributes[name]:
                            attributes[name].append(attr)
            elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType)):
                owner = getattr(value, "__module__", None) or ""
                if (
                    owner.split(".")[0] in packages
                    and not name.startswith(_CHEAP)
                    and name not in skip
                ):
                    if name not in functions:
                        functions.append(name)
    return tuple(functions), {k: tuple(v) for k, v in attributes.items()}
