"""A statement that calls steps and does work of its own, split in the order Python runs it
(:class:`Split`), so that the calls keep their own steps and the work gets one: the syntax side
of :mod:`.forward` for such statements. Imports nothing from the package but
:mod:`.statements`.
"""

from __future__ import annotations

import ast
import copy
import re
from typing import Any, List, Optional, Tuple

from .statements import STEP, call_kind, label, shorten, wrap

__all__ = ["Split", "TRUTH"]

#: The free variable holding ``operator.truth`` (an ``if``'s test, computed apart).
TRUTH = "_ic_bool_"
#: The names of temporaries (see :meth:`.rewrite.Wrap.temp`).
_TEMP = re.compile(r"_ic_t[0-9]+_$")

#: Kinds of the statements a split makes: a call of a step (in no step of ours), work of
#: the statement's own (in its step), and neither (a load, a ``del``: kept with either).
_TIMED, _WORK, _PLAIN = "timed", "work", "plain"


class _Cannot(Exception):
    """The statement is left as it is."""


class Split:
    """Splits one statement; ``ctx`` (a :class:`.rewrite.Wrap`) names steps and temporaries.

    ``rst = self.fc_self(h_self) + h_neigh`` runs as::

        _ic_t0_ = self.fc_self(h_self)          # the child's step, where it always was
        with <step "rst = self.fc_self(h_self) + h_neigh">:
            rst = _ic_t0_ + h_neigh
            del _ic_t0_

    Work Python runs before a step's call (its arguments, an operand left of it) goes into a
    temporary first, in a step named after its source. The order of evaluation is Python's
    but for loads of local names and constants, which no call can change: nothing runs
    twice or is skipped, errors come from the same place, and each temporary is deleted
    after its one use. What cannot be split (``and``/``or``, comprehensions, f-strings) is
    computed as it is, in no step; a statement with ``:=``, ``super()``, a step in a target
    or an augmented assignment to anything but a name is left alone.
    """

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        #: (kind, statement, step name; for a conditional expression's ``if``, its two
        #: branches' splits) in the order they run
        self.items: List[Tuple[str, ast.stmt, Any]] = []
        self.where: ast.AST = ast.Pass()  #: the statement split (for line numbers)
        self.name = ""  #: its step's name

    # -- statements ----------------------------------------------------------------------
    def statement(self, stmt: ast.stmt) -> Optional[List[ast.stmt]]:
        """``stmt`` (an assignment, an expression or a ``return``) split, or None."""
        if self._refuse(stmt):
            return None
        name = self.name = label(stmt)
        self.where = stmt
        stmt = copy.deepcopy(stmt)  # the original stays as it was if this fails
        try:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if any(self._steps_in(t) for t in targets) or stmt.value is None:
                    return None
            elif isinstance(stmt, ast.AugAssign):
                if not isinstance(stmt.target, ast.Name):
                    return None  # x[i] += ... reads x[i] before the value
            elif not isinstance(stmt, (ast.Expr, ast.Return)) or stmt.value is None:
                return None
            stmt.value = self.expr(stmt.value)
        except _Cannot:
            return None
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Name):
            self._delete(stmt.value)  # a step's result, unused: only let go of it
        else:
            self._emit(stmt, name)
        return self._grouped()

    def test(self, node: ast.If) -> Optional[List[ast.stmt]]:
        """``node`` with its test computed before it (split), or None; the ``if`` is last."""
        if self._refuse(node.test):
            return None
        name = self.name = label(node)
        self.where = node
        try:
            test = self.expr(copy.deepcopy(node.test))
        except _Cannot:
            return None
        self.ctx.truth = True
        flag = self.ctx.temp()
        call = ast.Call(ast.Name(TRUTH, ast.Load()), [test], [])
        self._emit(ast.Assign([ast.Name(flag, ast.Store())], call), name)
        node.test = ast.Name(flag, ast.Load())
        return self._grouped() + [node]

    # -- expressions ---------------------------------------------------------------------
    def expr(self, node: ast.expr) -> ast.expr:
        """``node`` to evaluate where it stands, its steps' calls computed before it."""
        if not self._steps_in(node):
            return node
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.BinOp):
            node.left, node.right = self._ordered([node.left, node.right])
        elif isinstance(node, ast.UnaryOp):
            node.operand = self.expr(node.operand)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            node.left, node.comparators[0] = self._ordered([node.left, node.comparators[0]])
        elif isinstance(node, ast.Attribute):
            node.value = self.expr(node.value)
        elif isinstance(node, ast.Subscript):
            node.value, node.slice = self._ordered([node.value, node.slice])
        elif isinstance(node, ast.Slice):
            node.lower, node.upper, node.step = self._ordered([node.lower, node.upper, node.step])
        elif isinstance(node, (ast.Tuple, ast.List)):
            node.elts = self._ordered(node.elts)
        elif isinstance(node, ast.Starred):
            node.value = self.expr(node.value)
        elif isinstance(node, ast.IfExp):
            return self._if_expression(node)
        else:  # and/or, a comprehension...: computed as it is, in no step
            return self._temp(node, None, _TIMED)
        return node

    def _call(self, node: ast.Call) -> ast.expr:
        is_step = call_kind(node, self.ctx.timed, self.ctx.methods, self.ctx.known) == STEP
        args = [a.value if isinstance(a, ast.Starred) else a for a in node.args]
        values = [node.func, *args, *(k.value for k in node.keywords)]
        # A step's arguments that work are computed before it, in a step of their own.
        last = max((i for i, v in enumerate(values) if self._work(v)), default=0) if is_step else 0
        values = self._ordered(values, last, call=True)
        node.func = values[0]
        new_args = []
        for a, v in zip(node.args, values[1 : 1 + len(args)]):
            if isinstance(a, ast.Starred):
                a.value, v = v, a
            new_args.append(v)
        node.args = new_args
        for k, v in zip(node.keywords, values[1 + len(args) :]):
            k.value = v
        return self._temp(node, None, _TIMED) if is_step else node

    def _ordered(self, nodes: List[Any], last: int = 0, call: bool = False) -> List[Any]:
        """``nodes``, evaluated in this order: each before the last one with a step in it
        (and, if ``last``, each up to ``nodes[last]``) is computed now, unless it is a local
        name or a constant; with ``call``, ``nodes[0]`` is a called function: never apart."""
        steps = [i for i, n in enumerate(nodes) if n is not None and self._steps_in(n)]
        upto = max(steps[-1] if steps else -1, last)
        out = []
        for i, n in enumerate(nodes):
            if n is None or i > upto:
                out.append(n)
                continue
            source = label(n)
            n = self.expr(n)
            apart = i < upto or (last > 0 and i == last)
            if apart and not (call and i == 0) and not isinstance(n, (ast.Name, ast.Constant)):
                n = self._temp(n, source, _WORK if self._work(n) else _PLAIN)
            out.append(n)
        return out

    def _if_expression(self, node: ast.IfExp) -> ast.expr:
        """``a if t else b`` with a step in it, as ``if t: tmp = a`` / ``else: tmp = b``."""
        test = self.expr(node.test)
        if not isinstance(test, (ast.Name, ast.Constant)):
            test = self._temp(test, label(node.test), _WORK if self._work(test) else _PLAIN)
        name = self.ctx.temp()
        branches = []
        for branch in (node.body, node.orelse):
            inner = Split(self.ctx)
            inner.where = self.where
            inner.name = label(branch)
            source = label(branch)
            value = inner.expr(branch)
            inner._emit(ast.Assign([ast.Name(name, ast.Store())], value), source)
            branches.append(inner)
        self.items.append((_TIMED, ast.If(test, [], []), branches))  # made by _grouped
        self._delete(test)
        return ast.Name(name, ast.Load())

    # -- what is made -----------------------------------------------------------------------
    def _temp(self, value: ast.expr, name: Optional[str], kind: str) -> ast.Name:
        """``value`` computed into a new temporary now (a statement of ``kind``)."""
        if _has_slice(value):
            raise _Cannot  # x[a:b, ...] parts cannot stand alone
        temp = self.ctx.temp()
        stmt = ast.copy_location(ast.Assign([ast.Name(temp, ast.Store())], value), self.where)
        self.items.append((kind, stmt, name))
        self._delete(value)
        return ast.Name(temp, ast.Load())

    def _emit(self, stmt: ast.stmt, name: str) -> None:
        """The statement's last part: its step's if it works (``name``), else in none."""
        stmt = ast.copy_location(stmt, self.where)
        self.items.append((_WORK if self._work(stmt) else _PLAIN, stmt, name))
        if not isinstance(stmt, ast.Return):
            self._delete(stmt)

    def _delete(self, used: ast.AST) -> None:
        """``del`` the temporaries that ``used`` reads (each is read once)."""
        temps = [
            n.id
            for n in ast.walk(used)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and _TEMP.match(n.id)
        ]
        if temps:
            targets = [ast.Name(t, ast.Del()) for t in temps]
            stmt = ast.copy_location(ast.Delete(targets), self.where)
            self.items.append((_PLAIN, stmt, None))

    def _grouped(self) -> List[ast.stmt]:
        """The statements made, each run of work (with the loads and deletions around it) in
        a step named after what it computes: the statement (its last part), or the sources
        of the parts computed before a call (``a * b, c + d``)."""
        out: List[ast.stmt] = []
        run: List[Tuple[str, ast.stmt, Optional[str]]] = []

        def flush() -> None:
            names = [n for kind, _, n in run if kind == _WORK]
            body = [stmt for _, stmt, _ in run]
            if names:
                name = names[-1] if names[-1] == self.name else ", ".join(names)
                out.append(wrap(self.ctx.step(shorten(name)), body, body[0]))
            else:
                out.extend(body)
            run.clear()

        for kind, stmt, extra in self.items:
            if kind == _TIMED:
                flush()
                if isinstance(stmt, ast.If):  # a conditional expression's branches
                    stmt.body, stmt.orelse = (b._grouped() for b in extra)
                    ast.copy_location(stmt, self.where)
                out.append(stmt)
            else:
                run.append((kind, stmt, extra))
        flush()
        return out

    # -- questions -------------------------------------------------------------------------
    def _refuse(self, node: ast.AST) -> bool:
        """Whether a statement is left as it is: ``:=`` (a name changing inside it), or
        ``super()`` (kept in its expression)."""
        return any(
            isinstance(n, ast.NamedExpr) or (isinstance(n, ast.Name) and n.id == "super")
            for n in ast.walk(node)
        )

    def _steps_in(self, node: ast.AST) -> bool:
        return self.ctx.shape(node).calls_timed

    def _work(self, node: ast.AST) -> bool:
        return self.ctx.shape(node).work


def _has_slice(node: ast.AST) -> bool:
    """Whether ``node`` is a slice, or a tuple of subscripts holding one (``[:, mask]``)."""
    if isinstance(node, ast.Slice):
        return True
    return isinstance(node, ast.Tuple) and any(isinstance(e, ast.Slice) for e in node.elts)
