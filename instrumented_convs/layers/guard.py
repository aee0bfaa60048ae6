"""Guards for the upstream code the detailed layers copy: a copy must be upstream plus steps,
nothing else, and follow upstream when it changes.

:func:`fingerprint` hashes a function's normalised syntax tree, steps stripped; :func:`guard`
checks the installed upstream function at import. On a mismatch the layer warns once and runs
upstream's code in its step: coarser timing, same numbers.
"""

from __future__ import annotations

import ast
import builtins
import copy
import hashlib
import inspect
import logging
import textwrap
from typing import Any, Callable, Dict, Iterable, List, Optional, Set

__all__ = ["Guard", "fingerprint", "function_tree", "global_names", "guard", "warn_fallback"]


def function_tree(fn: Callable[..., Any]) -> ast.FunctionDef:
    """The syntax tree of ``fn``'s definition, parsed from its source file."""
    fn = inspect.unwrap(fn)
    source = textwrap.dedent(inspect.getsource(fn))
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node  # type: ignore[return-value]
    raise TypeError(f"no function definition in the source of {fn!r}")


class _Normalise(ast.NodeTransformer):
    """Drops what does not change a function's computation; optionally strips step blocks."""

    def __init__(self, is_step: Optional[Callable[[ast.expr], bool]]) -> None:
        self.is_step = is_step

    def visit_With(self, node: ast.With) -> Any:
        self.generic_visit(node)
        if self.is_step is not None and all(
            item.optional_vars is None and self.is_step(item.context_expr) for item in node.items
        ):
            return node.body  # the step's body, spliced into the enclosing block
        return node

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        node.type_comment = None
        return node


def _normalised(
    tree: ast.FunctionDef, is_step: Optional[Callable[[ast.expr], bool]]
) -> ast.FunctionDef:
    tree = copy.deepcopy(tree)
    tree.name = "_"
    tree.decorator_list = []
    tree.returns = None
    tree.type_comment = None
    body = tree.body
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:] or [ast.Pass()]
    tree.body = body
    return _Normalise(is_step).visit(tree)


def fingerprint(fn: Any, steps: Optional[Callable[[ast.expr], bool]] = None) -> str:
    """A short hash of ``fn``'s normalised syntax tree (``fn`` a function or its tree).

    ``steps(expr)`` says whether a ``with`` item is one of our steps; those ``with``
    statements are replaced by their bodies before hashing.
    """
    tree = fn if isinstance(fn, ast.AST) else function_tree(fn)
    dump = _canonical(_normalised(tree, steps))  # type: ignore[arg-type]
    return hashlib.sha256(dump.encode()).hexdigest()[:16]


#: Fields that Python versions add or fill differently and that change no computation:
#: ``type_params`` (3.12, empty on a plain function), ``type_comment``, a constant's ``kind``.
_UNSTABLE_FIELDS = frozenset({"type_params", "type_comment", "kind"})


def _canonical(node: Any) -> str:
    """``node`` as text, the same on every Python this package supports (3.9 and newer).

    ``ast.dump`` is not: Python 3.12 writes ``type_params=[]`` into every function and 3.13
    leaves out empty fields, so a hash of it differs from one Python to the next (seen on
    the GPU machine's Python 3.12: every copy fell back to upstream's code). Here every
    node is its type and its fields in ``_fields`` order, without the fields that are
    ``None`` or empty and without :data:`_UNSTABLE_FIELDS`."""
    if isinstance(node, ast.AST):
        parts = []
        for name in node._fields:
            if name in _UNSTABLE_FIELDS:
                continue
            value = getattr(node, name, None)
            if value is None or (isinstance(value, list) and not value):
                continue
            parts.append(f"{name}={_canonical(value)}")
        return f"{type(node).__name__}({', '.join(parts)})"
    if isinstance(node, list):
        return "[" + ", ".join(_canonical(x) for x in node) + "]"
    return repr(node)


def global_names(tree: ast.FunctionDef) -> Set[str]:
    """The names ``tree`` reads that are not bound inside it: globals or builtins."""
    bound: Set[str] = set()
    loaded: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
    return loaded - bound


class Guard:
    """One copied upstream function and whether the installed upstream still matches it."""

    __slots__ = ("name", "ok", "reason", "fingerprint")

    def __init__(self, name: str, ok: bool, reason: str, fingerprint: Optional[str]) -> None:
        """``ok`` means the copy may run; ``reason`` says why not."""
        self.name = name
        self.ok = ok
        self.reason = reason
        self.fingerprint = fingerprint

    def __bool__(self) -> bool:
        """Whether the copy may run."""
        return self.ok

    def __repr__(self) -> str:
        """``Guard('name', ok=..., reason=...)``."""
        return f"Guard({self.name!r}, ok={self.ok}, reason={self.reason!r})"


def guard(
    name: str,
    upstream: Callable[..., Any],
    known: Dict[str, str],
    ours: Dict[str, Any],
    replaced: Iterable[str] = (),
) -> Guard:
    """Check the installed ``upstream`` function against the copy of it in our module.

    ``known`` maps the fingerprints our copy matches to the upstream versions they were
    seen in; ``ours`` is our module's globals, where every global name the upstream
    function reads must be the very object upstream's module binds (``replaced`` names are
    ours on purpose: an instrumented function standing for upstream's).
    """
    try:
        tree = function_tree(upstream)
    except (OSError, TypeError) as exc:
        return Guard(name, False, f"its source cannot be read ({exc})", None)
    fp = fingerprint(tree)
    if fp not in known:
        return Guard(name, False, f"its code differs from the copy (fingerprint {fp})", fp)
    theirs = getattr(inspect.unwrap(upstream), "__globals__", {})
    skip = set(replaced)
    for n in sorted(global_names(_normalised(tree, None)) - skip):
        mine, other = ours.get(n, _MISSING), theirs.get(n, _MISSING)
        if other is _MISSING and hasattr(builtins, n):
            other = getattr(builtins, n)
        if mine is _MISSING and hasattr(builtins, n):
            mine = getattr(builtins, n)
        if mine is _MISSING or mine is not other:
            return Guard(name, False, f"the name {n!r} it reads is not upstream's object", fp)
    return Guard(name, True, "", fp)


_MISSING = object()


def warn_fallback(
    logger: logging.Logger,
    layer: str,
    package: str,
    version: str,
    guards: List[Guard],
    timed: Optional[str] = None,
) -> None:
    """Log the one warning of a layer whose copies do not match the installed upstream;
    ``timed`` says what is still timed (default: only the layer's own step)."""
    failed = [g for g in guards if not g.ok]
    if not failed:
        return
    details = "; ".join(f"{g.name}: {g.reason}" for g in failed)
    timed = timed or f"its internal steps are not recorded, only the {layer} step"
    logger.warning(
        "instrumented_convs: %s runs upstream's own code under %s %s (%s): %s (coarser "
        "timing, exact results).",
        layer,
        package,
        version,
        details,
        timed,
    )
