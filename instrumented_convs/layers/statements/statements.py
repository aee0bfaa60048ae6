"""Which statements of a ``forward`` are work of its own, what they are called, and how
they are put in steps: the syntax side of :mod:`.forward` (see there). Nothing here imports
from the package.
"""

from __future__ import annotations

import ast
import builtins
import types
from typing import Any, FrozenSet, List

__all__ = [
    "COMPUTING",
    "Known",
    "Shape",
    "call_kind",
    "label",
    "SIMPLE",
    "NEVER",
    "wrap",
    "shorten",
    "STEP",
    "WORK",
    "OTHER",
]

#: Tensor methods that compute (a call of one marks a statement as work of its own).
COMPUTING = frozenset(
    "sum mean max min prod std var norm softmax log_softmax exp log sqrt rsqrt pow abs "
    "relu sigmoid tanh clamp clamp_ clip masked_fill masked_fill_ mul mul_ add add_ div "
    "div_ sub sub_ matmul mm bmm addmm index_select index_add index_add_ index_fill "
    "scatter scatter_ scatter_add scatter_add_ scatter_reduce gather cumsum sort argsort "
    "topk unique nonzero float double half to contiguous clone repeat repeat_interleave "
    "dot einsum neg reciprocal fill_ zero_ copy_ any all where bincount argmax argmin "
    "leaky_relu elu dropout normalize cat stack new_zeros new_ones new_full index_copy "
    "index_copy_ index_put index_put_ masked_scatter masked_select outer mv addmv baddbmm "
    "cumprod flip roll lerp "
    # free in the forward, not in the backward: a reshape copies a gradient that is not
    # contiguous, an expand's sums, a split's or a narrow's is a copy into zeros
    "view reshape expand expand_as split chunk narrow".split()
)

#: DGL's feature stores: writing or popping one is DGL's own bookkeeping, worth a step.
_STORES = frozenset({"srcdata", "dstdata", "ndata", "edata"})


def _is_store(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in _STORES


class Shape(ast.NodeVisitor):
    """Whether a statement does work of its own, and whether it calls something timed."""

    def __init__(self, ctx: Any) -> None:
        self.timed, self.methods, self.known = ctx.timed, ctx.methods, ctx.known
        self.work = self.calls_timed = False

    def visit_FunctionDef(self, node: ast.AST) -> None:  # a nested def runs later: not here
        return

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def visit_BinOp(self, node: ast.BinOp) -> None:
        self.work = True
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if not isinstance(node.op, ast.Not) and not isinstance(node.operand, ast.Constant):
            self.work = True
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if not all(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
            self.work = True
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_store(node.value):  # graph.ndata["h"] (read or written)
            self.work = True
        elif any(isinstance(n, (ast.Name, ast.Call, ast.Subscript)) for n in ast.walk(node.slice)):
            self.work = True  # indexing by a tensor: a gather (or a cheap view: no matter)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        kind = call_kind(node, self.timed, self.methods, self.known)
        if kind == STEP:
            self.calls_timed = True
        elif kind == WORK:
            self.work = True
        self.generic_visit(node)


#: What a call is (:func:`call_kind`).
STEP, WORK, OTHER = "step", "work", "other"


def call_kind(node: ast.Call, timed: FrozenSet[str], methods: FrozenSet[str], known: Any) -> str:
    """What a call is, its arguments aside: :data:`STEP` (a step already, or it may run
    steps: a child, a method or callable of ``self``, a routed function, a method in
    ``methods``, ``super()``, a local that may hold a child, a function given the layer or
    its attributes), :data:`WORK` (the layer's own: a tensor method that computes, DGL's
    feature stores' ``update``/``pop``) or :data:`OTHER`."""
    f = node.func
    root = f
    while isinstance(root, ast.Subscript):  # self.lins[1](x): self.lins
        root = root.value
    if isinstance(root, ast.Attribute):  # self.lin(x): self
        root = root.value
    if isinstance(root, ast.Name) and root.id == "self" and root is not f:
        return STEP  # a child, a method, an activation (not self.mu.view())
    names = getattr(known, "namespace", {})
    if isinstance(f, ast.Call) and isinstance(f.func, ast.Name) and f.func.id in names:
        return WORK  # a module made and run here: EdgeWeightNorm("both")(graph, w)
    if isinstance(f, ast.Name):
        if f.id in timed or f.id == "super" or f.id not in known:
            return STEP  # routed, or a local that may hold a child: conv(x)
        if f.id not in names and f.id not in _CALLERS:
            return OTHER  # a builtin that calls nothing it is given: len(self.hashmap)
    elif isinstance(f, ast.Attribute):
        base = f.value
        glob = isinstance(base, ast.Name) and base.id in names
        if glob and f"{base.id}.{f.attr}" in timed:
            return STEP  # a routed module function: F.dropout
        if f.attr in methods or f.attr == "forward":
            return STEP  # graph.update_all, lin.forward(x) (a timed child)
        if glob and base.id in getattr(known, "modules", ()):
            return _given_self(node)  # not routed: fn.sum("m", "h"), torch.zeros(n)
        if f.attr in COMPUTING or (_is_store(base) and f.attr in ("update", "pop")):
            return WORK
        if not glob:
            return OTHER  # a method of a value: h.view(self.heads, -1)
    return _given_self(node)


#: Builtins that call what they are given.
_CALLERS = frozenset({"map", "filter", "sorted", "min", "max"})


def _given_self(node: ast.Call) -> str:
    """A call of anything else: :data:`STEP` (it may run steps) if it is given the layer or
    one of its attributes (``Function.apply(self._forward, ...)``, ``checkpoint(self.conv,
    x)``), else :data:`OTHER`."""
    for a in (*node.args, *(k.value for k in node.keywords)):
        v = a.value if isinstance(a, ast.Starred) else a
        while isinstance(v, ast.Attribute):
            v = v.value
        if isinstance(v, ast.Name) and v.id == "self":
            return STEP
    return OTHER


def label(stmt: ast.AST) -> str:
    """What a statement's step is called: its source on one line (a block's first line),
    shortened (no slash: a step's path separator)."""
    text = ast.unparse(stmt)
    if isinstance(stmt, ast.stmt) and not isinstance(stmt, SIMPLE):
        text = text.split("\n", 1)[0]
    return shorten(" ".join(text.split()).replace("/", "∕"))


def shorten(text: str) -> str:
    """A step's name: at most 48 characters (``…`` at the end where cut)."""
    return text if len(text) <= 48 else text[:47] + "…"


class Known:
    """Whether a name is a module global or a builtin (a call of anything else may be a
    call of a child module held in a local variable)."""

    def __init__(self, namespace: Any) -> None:
        self.namespace = namespace

    def __contains__(self, name: str) -> bool:
        return name in self.namespace or hasattr(builtins, name)

    @property
    def modules(self) -> FrozenSet[str]:
        """The global names that hold modules (``F``, ``th``, DGL's ``fn``)."""
        return frozenset(k for k, v in self.namespace.items() if isinstance(v, types.ModuleType))


SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)
#: Statements never wrapped: checks (cheap, or failing anyway).
NEVER = (ast.Assert, ast.Raise)


def wrap(var: ast.expr, body: List[ast.stmt], where: ast.stmt) -> ast.stmt:
    """``with var: <body>``, at ``where``'s position."""
    return ast.copy_location(ast.With(items=[ast.withitem(context_expr=var)], body=body), where)
