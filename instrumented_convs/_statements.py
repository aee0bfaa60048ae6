"""Which statements of a ``forward`` are work of its own, what they are called, and how
they are put in steps: the syntax side of :mod:`._own` (see there). Nothing here imports
from the package.
"""

from __future__ import annotations

import ast
import builtins
from typing import Any, FrozenSet, List, Optional

__all__ = ["COMPUTING", "Wrap", "Known"]

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
    "cumprod flip roll lerp".split()
)

#: DGL's feature stores: writing or popping one is DGL's own bookkeeping, worth a step.
_STORES = frozenset({"srcdata", "dstdata", "ndata", "edata"})


def _is_store(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in _STORES


class _Shape(ast.NodeVisitor):
    """Whether a statement does work of its own, and whether it calls something timed."""

    def __init__(self, ctx: "Wrap") -> None:
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
        f = node.func
        root = f
        while isinstance(root, ast.Subscript):  # self.lins[1](x): self.lins
            root = root.value
        if isinstance(root, ast.Attribute):  # self.lin(x): self
            root = root.value
        if isinstance(root, ast.Name) and root.id == "self" and root is not f:
            self.calls_timed = True  # a child, a method, an activation (not self.mu.view())
        elif isinstance(f, ast.Name):
            if f.id in self.timed or f.id == "super" or f.id not in self.known:
                self.calls_timed = True  # routed, or a local that may hold a child: conv(x)
        elif isinstance(f, ast.Attribute):
            base = f.value
            if isinstance(base, ast.Name) and f"{base.id}.{f.attr}" in self.timed:
                self.calls_timed = True  # a routed module function: F.dropout
            elif f.attr in self.methods or f.attr == "forward":
                self.calls_timed = True  # graph.update_all, lin.forward(x) (a timed child)
            elif f.attr in COMPUTING or (_is_store(base) and f.attr in ("update", "pop")):
                self.work = True
        self.generic_visit(node)


def _label(stmt: ast.stmt) -> str:
    """What a statement's step is called: its source on one line (a block's first line),
    shortened (no slash: a step's path separator)."""
    text = ast.unparse(stmt)
    if not isinstance(stmt, _SIMPLE):
        text = text.split("\n", 1)[0]
    text = " ".join(text.split()).replace("/", "∕")
    return text if len(text) <= 48 else text[:47] + "…"


class Known:
    """Whether a name is a module global or a builtin (a call of anything else may be a
    call of a child module held in a local variable)."""

    def __init__(self, namespace: Any) -> None:
        self.namespace = namespace

    def __contains__(self, name: str) -> bool:
        return name in self.namespace or hasattr(builtins, name)


_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return)
#: Statements never wrapped: checks (cheap, or failing anyway).
_NEVER = (ast.Assert, ast.Raise)


class Wrap(ast.NodeTransformer):
    """Puts each statement of work of its own in ``with <free variable>:``."""

    def __init__(self, timed: FrozenSet[str], methods: FrozenSet[str], known: Any) -> None:
        #: What is timed already (see with_steps), and the global and builtin names.
        self.timed, self.methods, self.known = timed, methods, known
        self.names: List[str] = []
        self.top: Optional[ast.AST] = None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        if self.top is not None and node is not self.top:
            return node  # a nested def: its statements run when it is called, elsewhere
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, field, [self._statement(s) for s in block])
        for handler in getattr(node, "handlers", []) or []:
            self.generic_visit(handler)
        for case in getattr(node, "cases", []) or []:  # match statements (3.10+)
            self.generic_visit(case)
        return node

    def _statement(self, stmt: ast.stmt) -> ast.stmt:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, *_NEVER)):
            return stmt
        if isinstance(stmt, ast.If):  # by its test: an if whose test works is one block
            test = _Shape(self)
            test.visit(stmt.test)
            if not test.work or test.calls_timed:
                return self.visit(stmt)
        shape = _Shape(self)
        if isinstance(stmt, ast.AnnAssign):  # the annotation is not evaluated in a function
            shape.visit(stmt.target)
            if stmt.value is not None:
                shape.visit(stmt.value)
        else:
            shape.visit(stmt)
        if not shape.work:
            return stmt
        if shape.calls_timed:  # a block with steps inside: its own statements apart
            return stmt if isinstance(stmt, _SIMPLE) else self.visit(stmt)
        name = _label(stmt)
        n = sum(1 for x in self.names if x == name or x.startswith(name + " ("))
        self.names.append(name if not n else f"{name} ({n + 1})")
        var = ast.Name(id=f"_ic_step{len(self.names) - 1}_", ctx=ast.Load())
        return ast.copy_location(ast.With(items=[ast.withitem(context_expr=var)], body=[stmt]),
                                 stmt)  # fmt: skip
