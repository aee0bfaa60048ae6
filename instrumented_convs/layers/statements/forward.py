"""A generic layer's own code, statement by statement: what runs in no other step.

:func:`with_steps` gives a function computing exactly what the stock ``forward`` does, each
statement of tensor work in a step named after its source (``out = out + self.bias``), built
from the installed source. Line numbers are the file's: a traceback points into upstream's
source.
"""

from __future__ import annotations

import ast
import inspect
import logging
import operator
import types
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import torch

from ...core.frames.setup import setup
from ...core.steps.step import Step, relate
from .rewrite import RELATION, Wrap
from .split import TRUTH
from .statements import Known

__all__ = ["with_steps", "Own", "relation_step"]

logger = logging.getLogger(__name__)


def _same_code(a: types.CodeType, b: types.CodeType) -> bool:
    """Whether two code objects do the same (line numbers aside), nested code included."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_argcount) != (
        b.co_code,
        b.co_names,
        b.co_varnames,
        b.co_freevars,
        b.co_argcount,
    ):
        return False
    ca, cb = a.co_consts, b.co_consts
    if len(ca) != len(cb):
        return False
    for x, y in zip(ca, cb):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType)):
                return False
            if not _same_code(x, y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


#: Decorators of a ``forward`` that are made again around the new function (by their
#: source): torch's grad modes, which hold no state between calls.
_GRAD_MODES: Dict[str, Callable[[], Any]] = {
    "torch.no_grad()": lambda: torch.no_grad(),
    "torch.enable_grad()": lambda: torch.enable_grad(),
    "torch.inference_mode()": lambda: torch.inference_mode(),
}


def _cell_of(wrapper: Any, inner: Any) -> Optional[int]:
    """The index of the one cell of ``wrapper``'s closure that holds ``inner`` (a decorator
    made with ``functools.wraps``: PyG's ``disable_dynamic_shapes``), or None."""
    if not isinstance(wrapper, types.FunctionType):
        return None
    hits = []
    for i, cell in enumerate(wrapper.__closure__ or ()):
        try:
            if cell.cell_contents is inner:
                hits.append(i)
        except ValueError:  # an empty cell
            continue
    return hits[0] if len(hits) == 1 else None


def _rewrap(wrapper: types.FunctionType, inner: Any, new: Callable[..., Any]) -> Any:
    """``wrapper`` made again with ``new`` in the cell that held ``inner``: the decorator's
    own code and state, around ``new``."""
    i = _cell_of(wrapper, inner)
    cells = wrapper.__closure__ or ()
    closure = tuple(types.CellType(new) if j == i else c for j, c in enumerate(cells))
    out = types.FunctionType(
        wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__, closure
    )
    out.__kwdefaults__ = wrapper.__kwdefaults__
    out.__dict__.update(wrapper.__dict__)
    out.__qualname__, out.__doc__, out.__module__ = (
        wrapper.__qualname__,
        wrapper.__doc__,
        wrapper.__module__,
    )
    out.__wrapped__ = new  # type: ignore[attr-defined]
    return out


def _find(tree: ast.Module, qualname: str, line: int) -> Optional[ast.FunctionDef]:
    """The function defined at ``line`` under the classes ``qualname`` names."""
    *classes, name = qualname.split(".")
    body: List[ast.stmt] = tree.body
    for cls in classes:
        found = [n for n in body if isinstance(n, ast.ClassDef) and n.name == cls]
        if len(found) != 1:
            return None
        body = found[0].body
    hits = [
        n
        for n in body
        if isinstance(n, ast.FunctionDef)
        and n.name == name
        and (n.decorator_list[0].lineno if n.decorator_list else n.lineno) == line
    ]
    return hits[0] if len(hits) == 1 else None


def _code_of(code: types.CodeType, qualname: str, line: int) -> Optional[types.CodeType]:
    """The code object of the function ``qualname`` defined at ``line``, nested in ``code``."""
    name = qualname.rsplit(".", 1)[-1]
    todo = [code]
    while todo:
        c = todo.pop()
        for k in c.co_consts:
            if not isinstance(k, types.CodeType):
                continue
            if (k.co_name, k.co_firstlineno) == (name, line) and getattr(
                k, "co_qualname", qualname
            ) == qualname:
                return k
            todo.append(k)
    return None


def _enclose(tree: ast.Module, cls: ast.ClassDef, params: List[str]) -> str:
    """Put the top-level class ``cls`` inside ``def __ic_outer(<params>)`` where it stands, so
    that the steps are free variables of its methods; return the new qualname prefix."""
    outer = ast.FunctionDef(
        name="__ic_outer",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(arg=p) for p in params],
            vararg=None,
            kwonlyargs=[],
            kw_defaults=[],
            kwarg=None,
            defaults=[],
        ),
        body=[cls, ast.Return(value=ast.Constant(value=None))],
        decorator_list=[],
        returns=None,
    )
    if hasattr(ast, "TypeAlias"):  # pragma: no cover - Python 3.12+: type parameters
        outer.type_params = []
    ast.copy_location(outer, cls)
    tree.body[tree.body.index(cls)] = outer
    ast.fix_missing_locations(tree)
    return "__ic_outer.<locals>."


def with_steps(
    stock: type, timed: FrozenSet[str], methods: FrozenSet[str] = frozenset()
) -> Optional[Callable[..., Any]]:
    """``stock.forward`` with its own statements of work in steps, or None where that cannot
    be made safely (then the stock ``forward`` runs as it is): it is made from the installed
    source only if that compiles to the code that runs (same bytecode, constants and names),
    and not for a forward defined in a function or under more than one decorator.

    ``timed``: global names (``add_self_loops``) and ``module.function`` names
    (``F.dropout``) that are steps already; ``methods``: method names of arguments that are
    (DGL's ``update_all``). The whole module's source is compiled (twice: as it is, to
    check it is the code that runs, and changed), so call it once per class, when needed.
    """
    fn = stock.forward
    fn = getattr(fn, "__wrapped__", fn)  # under a decorator (made again around ours, below)
    if not isinstance(fn, types.FunctionType) or hasattr(fn, "__wrapped__"):
        return None
    code, qualname = fn.__code__, fn.__qualname__
    if (
        "<locals>" in qualname
        or qualname.count(".") != 1
        or set(code.co_freevars) - {"__class__"}
        or code.co_flags & (inspect.CO_GENERATOR | inspect.CO_COROUTINE)
    ):
        return None
    try:
        filename = inspect.getsourcefile(fn) or code.co_filename
        with open(filename, encoding="utf-8") as f:
            source = f.read()
        tree = ast.parse(source, filename)
        line = code.co_firstlineno  # a decorated function's: its first decorator's
        fn_ast = _find(tree, qualname, line)
        if fn_ast is None:
            return None
        decorators = fn_ast.decorator_list
        if len(decorators) > 1 or (fn is stock.forward) != (not decorators):
            return None
        mode = _GRAD_MODES.get(ast.unparse(decorators[0])) if decorators else None
        if decorators and mode is None and _cell_of(stock.forward, fn) is None:
            return None  # a decorator whose wrapper cannot be made again around ours
        same = _code_of(compile(tree, filename, "exec", dont_inherit=True), qualname, line)
        if same is None or not _same_code(same, code):
            logger.debug("%s.forward: its source is not the code that runs", stock.__name__)
            return None
        wrap = Wrap(timed, methods, Known(fn.__globals__))
        wrap.top = fn_ast
        wrap.visit(fn_ast)
        if not wrap.names and not wrap.relations:
            return None
        params = [f"_ic_step{i}_" for i in range(len(wrap.names))]  # (no __: mangled)
        params += [TRUTH] if wrap.truth else []
        params += [RELATION] if wrap.relations else []
        owner = qualname.split(".")[0]
        cls_ast = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner)
        prefix = _enclose(tree, cls_ast, params)
        new = _code_of(compile(tree, filename, "exec", dont_inherit=True), prefix + qualname, line)
        if new is None:
            return None
    except (OSError, TypeError, SyntaxError, ValueError, StopIteration) as e:
        logger.debug("%s.forward: its own statements are not timed: %s", stock.__name__, e)
        return None
    cells = {
        "__class__": fn.__closure__[code.co_freevars.index("__class__")]
        if "__class__" in code.co_freevars
        else None
    }
    cells.update((p, types.CellType(Step(n))) for p, n in zip(params, wrap.names))
    cells[TRUTH] = types.CellType(operator.truth)
    cells[RELATION] = types.CellType(relation_step)
    if set(new.co_freevars) - set(cells):  # the class's own name, say: a local of the enclosure
        logger.debug("%s.forward: free names %s", stock.__name__, new.co_freevars)
        return None
    closure = tuple(cells[name] for name in new.co_freevars)
    out = types.FunctionType(new, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__qualname__, out.__doc__, out.__module__ = qualname, fn.__doc__, fn.__module__
    if mode is not None:
        out = mode()(out)  # torch.no_grad() again, as the class had it
    elif decorators:
        out = _rewrap(stock.forward, fn, out)  # the same wrapper, calling ours
    out._ic_steps = tuple(wrap.names)  # type: ignore[attr-defined]
    return out


class Own:
    """The code a generic layer's forward runs: the stock ``forward``, or the same code with its
    own statements in steps (:func:`.forward.with_steps`), made at the first instrumented call
    (it compiles the class's module; thread-safe: a race makes it twice, equal)."""

    __slots__ = ("stock", "timed", "methods", "fn")

    def __init__(self, stock: type, timed: FrozenSet[str], methods: FrozenSet[str]) -> None:
        """For ``stock``, with what is timed otherwise (see :func:`.forward.with_steps`)."""
        self.stock, self.timed, self.methods = stock, timed, methods
        self.fn: Optional[Callable[..., Any]] = None

    def resolve(self) -> Callable[..., Any]:
        """The function to run (made once)."""
        if self.fn is None:
            with setup():  # the tool's one-time work: out of the user's rows
                try:
                    made = with_steps(self.stock, self.timed, self.methods)
                except Exception as e:  # noqa: BLE001 - never the layer's error: the stock code
                    logger.debug("%s.forward: not made with steps: %r", self.stock.__name__, e)
                    made = None
            self.fn = made or self.stock.forward
        return self.fn

    @property
    def steps(self) -> Tuple[str, ...]:
        """The names of the statements' steps (none: the stock forward runs as it is)."""
        return getattr(self.resolve(), "_ic_steps", ())


def relation_step(layer: Any, index: Any) -> Step:
    """The step of one iteration of a layer's loop over its relations (RGCN's ``for i in
    range(self.num_relations)``): ``relation``, in the scope ``<layer's scope>.<i>`` of the
    relation ``str(i)``, made once per layer scope and relation (kept with the layer's own
    steps, in its ``_ic_steps``)."""
    steps = layer.__dict__.setdefault("_ic_steps", {})
    key = ("relation", layer._ic_scope, index)
    step = steps.get(key)
    if step is None:
        scope = f"{layer._ic_scope}.{index}"
        relate(scope, str(index))
        step = steps[key] = Step("relation", scope)
    return step
