"""Which statements of a ``forward`` get steps, and the transformer that puts them in: the
syntax side of :mod:`.forward` (see there), with :mod:`.statements` (what a statement does)
and :mod:`.split` (a statement that calls steps and does work of its own). Nothing here
imports from the package but those two.
"""

from __future__ import annotations

import ast
from typing import Any, FrozenSet, List, Optional

from .split import Split
from .statements import NEVER, SIMPLE, Shape, label, wrap

__all__ = ["Wrap", "RELATION"]

#: The free variable of the function that gives a relation's step (``relation_step(layer, i)``).
RELATION = "_ic_relation_"


class Wrap(ast.NodeTransformer):
    """Puts each statement of work of its own in ``with <free variable>:`` (a statement that
    also calls steps is split first: :class:`.split.Split`), and the body of each function
    defined in the forward in a step named after it."""

    def __init__(self, timed: FrozenSet[str], methods: FrozenSet[str], known: Any) -> None:
        #: What is timed already (see with_steps), and the global and builtin names.
        self.timed, self.methods, self.known = timed, methods, known
        self.names: List[str] = []  #: the steps' names, in the order of their variables
        self.temps = 0  #: temporaries made by splitting statements
        self.truth = False  #: whether ``operator.truth`` is used (:data:`.split.TRUTH`)
        self.relations = False  #: whether a loop over relations is a step each (RELATION)
        self.top: Optional[ast.AST] = None

    def visit_FunctionDef(self, node: ast.FunctionDef) -> Any:
        if self.top is not None and node is not self.top:
            return node  # a nested def: see _statement
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_ClassDef = visit_Lambda = visit_FunctionDef

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, field, [new for s in block for new in self._statement(s)])
        for handler in getattr(node, "handlers", []) or []:
            self.generic_visit(handler)
        for case in getattr(node, "cases", []) or []:  # match statements (3.10+)
            self.generic_visit(case)
        return node

    def shape(self, node: ast.AST) -> Shape:
        """What ``node`` does (see :class:`Shape`)."""
        shape = Shape(self)
        if isinstance(node, ast.AnnAssign):  # the annotation is not evaluated in a function
            shape.visit(node.target)
            if node.value is not None:
                shape.visit(node.value)
        else:
            shape.visit(node)
        return shape

    def step(self, name: str) -> ast.Name:
        """The variable of a new step named ``name`` (``name (2)`` for a second one)."""
        n = sum(1 for x in self.names if x == name or x.startswith(name + " ("))
        self.names.append(name if not n else f"{name} ({n + 1})")
        return ast.Name(id=f"_ic_step{len(self.names) - 1}_", ctx=ast.Load())

    def temp(self) -> str:
        """The name of a new temporary (a local of the forward)."""
        self.temps += 1
        return f"_ic_t{self.temps - 1}_"

    def _relation_loop(self, stmt: ast.stmt) -> Optional[str]:
        """The loop variable of ``for i in range(self.num_relations):`` (RGCN's loop over
        edge types, ``self`` the forward's first argument), else None."""
        top = self.top
        if not isinstance(stmt, ast.For) or not isinstance(stmt.target, ast.Name):
            return None
        it = stmt.iter
        if not (
            isinstance(top, ast.FunctionDef)
            and top.args.args
            and isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id == "range"
            and len(it.args) == 1
            and not it.keywords
            and isinstance(it.args[0], ast.Attribute)
            and it.args[0].attr == "num_relations"
            and isinstance(it.args[0].value, ast.Name)
            and it.args[0].value.id == top.args.args[0].arg
        ):
            return None
        return stmt.target.id

    def _statement(self, stmt: ast.stmt) -> List[ast.stmt]:
        index = self._relation_loop(stmt)
        if index is not None:  # each iteration a step of its relation, its statements inside
            self.generic_visit(stmt)
            layer = ast.Name(self.top.args.args[0].arg, ast.Load())  # type: ignore[union-attr]
            loop = ast.Name(index, ast.Load())
            call = ast.Call(ast.Name(RELATION, ast.Load()), [layer, loop], [])
            stmt.body = [wrap(call, stmt.body, stmt.body[0])]  # type: ignore[arg-type]
            self.relations = True
            return [stmt]
        if isinstance(stmt, ast.FunctionDef):
            return [self._function(stmt)]
        if isinstance(stmt, (ast.AsyncFunctionDef, ast.ClassDef, *NEVER)):
            return [stmt]
        if isinstance(stmt, ast.If):  # by its test: an if whose test works is one block
            test = self.shape(stmt.test)
            if test.work and test.calls_timed:
                split = Split(self).test(stmt)
                if split is not None:
                    return split[:-1] + [self.visit(split[-1])]
            if not test.work or test.calls_timed:
                return [self.visit(stmt)]
        shape = self.shape(stmt)
        if not shape.work:
            return [stmt]
        if shape.calls_timed:  # steps inside: its own work apart (split), or a block's
            if isinstance(stmt, SIMPLE):
                return Split(self).statement(stmt) or [stmt]
            return [self.visit(stmt)]
        return [wrap(self.step(label(stmt)), [stmt], stmt)]

    def _function(self, node: ast.FunctionDef) -> ast.FunctionDef:
        """A function defined in the forward (DGL ChebConv's ``unnLaplacian``, a message
        function): its statements as in the forward, its body in a step named after it."""
        if node.decorator_list or _suspends(node):
            return node  # a decorator may run it elsewhere; a generator runs in pieces
        self.generic_visit(node)
        head = []
        body = list(node.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            head.append(body.pop(0))  # the docstring
        while body and isinstance(body[0], (ast.Global, ast.Nonlocal)):
            head.append(body.pop(0))
        if body:
            node.body = head + [wrap(self.step(node.name), body, body[0])]
        return node


def _suspends(node: ast.FunctionDef) -> bool:
    """Whether a function yields or awaits (nested definitions aside)."""
    todo = list(node.body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))
    return False
