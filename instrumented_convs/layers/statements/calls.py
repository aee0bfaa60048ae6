"""What a layer's ``forward`` calls that can be timed from outside: the functions it reads
through its module's globals (for :class:`._route.Routes`) and its own helper methods
(timed like children), found in its bytecode. Nothing here imports from the package.
"""

from __future__ import annotations

import dis
import types
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Tuple

__all__ = ["scan", "helpers", "handed", "torch_function", "any_function"]


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


def _self_loads(fn: Callable[..., Any]) -> Iterator[Tuple[str, bool, List[Any]]]:
    """Each ``self.<name>`` that ``fn`` reads (nested code included): the name, whether it is
    read to be called as a method (3.11: LOAD_METHOD; 3.12+: LOAD_ATTR marked as a method
    load; not a bound method handed on as a value, as GroupRevRes's ``self._forward``), and
    the two instructions after the read."""
    code = getattr(fn, "__code__", None)
    codes = [code] if code is not None else []
    while codes:
        c = codes.pop()
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        ins = list(dis.get_instructions(c))
        for i, (op, nxt) in enumerate(zip(ins, ins[1:])):
            if op.opname not in ("LOAD_FAST", "LOAD_DEREF") or op.argval != "self":
                continue
            called = nxt.opname == "LOAD_METHOD" or (
                nxt.opname == "LOAD_ATTR" and "NULL|self" in (nxt.argrepr or "")
            )
            if called or nxt.opname == "LOAD_ATTR":
                yield nxt.argval, called, ins[i + 2 : i + 4]


def _own_method(stock: type, owners: List[type], name: str) -> bool:
    """Whether ``name`` is a function that one of ``owners`` (classes of ``stock``) defines."""
    owner = next((k for k in stock.__mro__ if name in k.__dict__), None)
    return owner in owners and isinstance(owner.__dict__[name], types.FunctionType)


def helpers(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` that ``fn`` (its ``forward``) calls on ``self`` and that the
    stock class or a parent of it defines, below the ``base`` classes (``torch.nn.Module``,
    PyG's ``MessagePassing``): ChebConv's ``__norm__``, SuperGATConv's
    ``negative_sampling``... and the attributes it calls that no class defines, held by the
    instance (DGL's ``self.activation``, ``self._activation``: a function given to the
    constructor), where the forward reads them only to call them or to test them (``is
    None``, truth): a step, at each call, only when the instance holds a callable (a child
    module is a step already). Each is timed as a step named after it, as children are."""
    out: List[str] = []
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    classes = {n for k in stock.__mro__ for n in k.__dict__}
    tested: Dict[str, bool] = {}  # attributes read as values: only tested (True) or used
    for name, called, after in _self_loads(fn):
        if not called:
            tested[name] = tested.get(name, True) and _tested(after)
        elif name not in _NOT_HELPERS and name not in out:
            if name not in classes or _own_method(stock, owners, name):
                out.append(name)
    return tuple(n for n in out if n in classes or tested.get(n, True))


def handed(stock: type, fn: Callable[..., Any], base: Tuple[type, ...]) -> Tuple[str, ...]:
    """The methods of ``stock`` (below ``base``, as :func:`helpers`) that ``fn`` reads from
    ``self`` as values, to hand on: GroupRevRes's ``self._forward``, given to an autograd
    Function that calls it in the forward and again in the backward."""
    owners = [k for k in stock.__mro__ if k not in base and k is not object]
    out: List[str] = []
    for name, called, after in _self_loads(fn):
        if not called and name not in out and not _tested(after):
            if _own_method(stock, owners, name):
                out.append(name)
    return tuple(out)


def _tested(after: List[dis.Instruction]) -> bool:
    """Whether a value just read is only tested: ``is None``, ``is not None``, truth."""
    if not after:
        return False
    first = after[0].opname
    if first.startswith("POP_JUMP") or first in ("JUMP_IF_FALSE_OR_POP", "JUMP_IF_TRUE_OR_POP"):
        return True  # if self.act:, if self.act is None: (3.12: POP_JUMP_IF_NONE)
    return (
        first == "LOAD_CONST"
        and after[0].argval is None
        and len(after) > 1
        and after[1].opname in ("IS_OP", "COMPARE_OP")
    )


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
