"""Count what the prose rules of the package watch, so a change can be measured against them.

For the package ``instrumented_convs`` under a tree (default: this repository) it prints
modules per folder, module docstring word counts, dates in code, the longest function
bodies and the stale module or function names in the C files' comments.
``tests/test_prose.py`` imports these functions, so the test and the figures agree.

    python scripts/prose_counts.py [ROOT]
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib.util
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PKG = "instrumented_convs"
#: The source files that dates must stay out of.
CODE_SUFFIXES = (".py", ".c", ".h")

_MONTH = (
    r"Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"
)
#: A date: 2026-11-26, or a month and a year ("Nov 2026", "November 26, 2026").
DATE = re.compile(
    rf"\b(?:19|20)\d\d-[01]\d-[0-3]\d\b|\b(?:{_MONTH})\.?\s+(?:[0-3]?\d,?\s+)?(?:19|20)\d\d\b"
)


def package_dir(root: Path) -> Path:
    """The package folder under ``root``."""
    return Path(root) / PKG


def modules(root: Path) -> Dict[str, Path]:
    """Every module of the package under ``root``: dotted name -> path (a package is its
    ``__init__.py``)."""
    out = {}
    for path in sorted(package_dir(root).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def folder_counts(root: Path) -> Dict[str, int]:
    """Modules (``.py`` files, ``__init__.py`` included) per folder of the package, keyed by
    the folder's path relative to ``root``."""
    counts: Counter = Counter()
    for path in package_dir(root).rglob("*.py"):
        counts[path.parent.relative_to(root).as_posix()] += 1
    return dict(sorted(counts.items()))


def docstring_words(root: Path) -> Dict[str, Optional[int]]:
    """Module -> the word count of its docstring (whitespace-separated words), or None for a
    module without one."""
    out: Dict[str, Optional[int]] = {}
    for name, path in modules(root).items():
        doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)), clean=True)
        out[name] = None if doc is None else len(doc.split())
    return out


def docstring_median(words: Dict[str, Optional[int]]) -> float:
    """The median word count over the modules that have a docstring (0 when none has)."""
    counted = [n for n in words.values() if n is not None]
    return statistics.median(counted) if counted else 0


def code_files(root: Path) -> Iterator[Path]:
    """The package's ``.py``, ``.c`` and ``.h`` files, sorted."""
    for path in sorted(package_dir(root).rglob("*")):
        if path.suffix in CODE_SUFFIXES and path.is_file():
            yield path


def dates_in_code(root: Path) -> List[Tuple[str, int, str]]:
    """Every date in the package's code files: (path relative to ``root``, line, the date)."""
    out = []
    for path in code_files(root):
        for no, line in enumerate(path.read_text().splitlines(), 1):
            for m in DATE.finditer(line):
                out.append((path.relative_to(root).as_posix(), no, m.group()))
    return out


def body_lines(fn: ast.AST) -> int:
    """The lines of a function's body after its docstring: from the first statement after the
    docstring to the function's last line, blank and comment lines included (a nested
    function counts in its parent too); 0 for a body that is only a docstring."""
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            body = body[1:]
    if not body:
        return 0
    return fn.end_lineno - body[0].lineno + 1


def function_bodies(root: Path) -> List[Tuple[int, str]]:
    """Every function and method of the package as (body lines, ``module:qualname:line``),
    longest first; body lines as :func:`body_lines` measures them."""
    out = []
    for name, path in modules(root).items():

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    qual = prefix + child.name
                    out.append((body_lines(child), f"{name}:{qual}:{child.lineno}"))
                    walk(child, qual + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, prefix + child.name + ".")
                else:
                    walk(child, prefix)

        walk(ast.parse(path.read_text(), filename=str(path)), "")
    return sorted(out, key=lambda t: (-t[0], t[1]))


# --- names in the C files' comments -------------------------------------------------------


def c_files(root: Path) -> List[Path]:
    """The C sources and headers of the package's native fast path."""
    native = package_dir(root) / "core" / "native"
    return sorted(p for p in native.glob("*") if p.suffix in (".c", ".h"))


def c_comments(src: str) -> List[Tuple[int, str]]:
    """The comments of C source ``src``: (line where each starts, its text); string and
    character literals are skipped."""
    out, i, line, n = [], 0, 1, len(src)
    while i < n:
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j
            out.append((line, src[i + 2 : j]))
            line += src.count("\n", i, j + 2)
            i = j + 2
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append((line, src[i + 2 : j]))
            i = j
        elif src[i] in "\"'":
            j = i + 1
            while j < n and src[j] != src[i] and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            line += src.count("\n", i, j + 1)
            i = j + 1
        else:
            line += src[i] == "\n"
            i += 1
    return out


#: A C doc string: a type's ``tp_doc``, or the last field of a method table's row.
_C_DOC = re.compile(
    r'(?:\.tp_doc\s*=\s*|\{\s*"\w+"\s*,[^{};"]*,\s*)(?P<doc>(?:"(?:[^"\\\n]|\\.)*"\s*)+)[,}]'
)


def c_prose(src: str) -> List[Tuple[int, str]]:
    """The prose of C source ``src``: its comments (:func:`c_comments`) and its doc strings
    (types' ``tp_doc``, the method tables' docs), as (line, text)."""
    out = c_comments(src)
    for m in _C_DOC.finditer(src):
        text = "".join(re.findall(r'"((?:[^"\\\n]|\\.)*)"', m.group("doc")))
        out.append((src.count("\n", 0, m.start("doc")) + 1, text))
    return sorted(out)


#: What a comment's reference looks like: a path to a Python file (``core/steps/step.py``,
#: ``stepbase.py``), a C file (``_speedups_hook.c``), a dotted name (``module.function``,
#: ``Class.method``, ``_clock.on_set()``), a private name after "see" (``see _backward``:
#: a module), or another bare private name (``_stepbase``: a module or a name the package
#: or the C code defines).
REF = re.compile(
    r"(?P<path>\b[\w/]*\w\.py\b)"
    r"|(?P<cfile>\b\w+\.[ch]\b)"
    r"|(?P<dotted>\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?"
    r"|(?P<see>(?<=see )_[a-z]\w*\b)(?![.(\w])"
    r"|(?P<bare>(?<![\w.])_[a-z]\w*\b)(?![.(\w])"
)


class _Names:
    """What the package defines, read from its source with ``ast`` (nothing is imported)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.mods = modules(self.root)
        self.top: Dict[str, Set[str]] = {}
        self.classes: Dict[str, Dict[str, Set[str]]] = {}
        for name, path in self.mods.items():
            tree = ast.parse(path.read_text(), filename=str(path))
            self.top[name] = _top_names(tree)
            self.classes[name] = _class_members(tree)
        self.all_classes: Dict[str, Set[str]] = {}
        for members in self.classes.values():
            for cls, names in members.items():
                self.all_classes.setdefault(cls, set()).update(names)
        self.bases: Dict[str, Set[str]] = {}
        for name, path in self.mods.items():
            for cls in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(cls, ast.ClassDef):
                    self.bases.setdefault(cls.name, set()).update(
                        b.id if isinstance(b, ast.Name) else b.attr
                        for b in cls.bases
                        if isinstance(b, (ast.Name, ast.Attribute))
                    )
        self.every_name = set().union(*self.top.values(), *self.all_classes.values())
        self.short: Dict[str, List[str]] = {}
        for name in self.mods:
            self.short.setdefault(name.rsplit(".", 1)[-1], []).append(name)
        self.short.setdefault("_speedups", []).append("_speedups")  # the C extension
        srcs = [p.read_text() for p in c_files(self.root)]
        self.c_names = {p.name for p in c_files(self.root)}
        #: The native module's functions (its method tables) and its types' names.
        self.native_funcs = set(
            re.findall(r'\{\s*"(\w+)"\s*,\s*\(?\s*(?:PyCFunction)?', "\n".join(srcs))
        )
        #: The C types (their structs) -> their fields, and the names of the method tables'
        #: rows (any type's methods count for every type).
        self.c_types: Dict[str, Set[str]] = {}
        for body, name in re.findall(
            r"typedef\s+struct\s*\w*\s*\{(.*?)\}\s*(\w+)\s*;", "\n".join(srcs), re.S
        ):
            body = re.sub(r"/\*.*?\*/", " ", body, flags=re.S)
            self.c_types[name] = set(re.findall(r"(\w+)\s*(?:\[[^\]]*\])?\s*[,;]", body))
        code = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:[^"\\\n]|\\.)*"', " ", "\n".join(srcs), flags=re.S)
        self.c_idents = set(re.findall(r"\b\w+\b", code))  # the C code's names, not its prose

    def has_member(self, cls: str, attr: str, seen: Optional[Set[str]] = None) -> bool:
        """Whether class ``cls`` (any of that name in the package) or one of its bases has
        ``attr``; a C type's attributes are its struct's fields and the methods of the C
        files' tables."""
        seen = set() if seen is None else seen
        if cls in seen:
            return False
        seen.add(cls)
        if attr in self.all_classes.get(cls, ()) or attr in self.c_types.get(cls, ()):
            return True
        if cls in self.c_types and attr in self.native_funcs:
            return True
        return any(self.has_member(b, attr, seen) for b in self.bases.get(cls, ()))

    def attr_ok(self, module: str, parts: List[str]) -> bool:
        """Whether ``parts`` name an attribute of ``module`` (a top-level name, or a member of
        one of its classes), the rest members of that class."""
        if not parts:
            return True
        if module.endswith("._speedups") or module == "_speedups":
            return parts[0] in self.native_funcs or parts[0] in self.c_types
        head = parts[0]
        members = self.classes.get(module, {})
        if head in members:
            return len(parts) == 1 or parts[1] in members[head] or self.has_member(head, parts[1])
        if head in self.top.get(module, ()):
            return True
        return any(head in names for names in members.values())

    def module_ok(self, module: str, rest: List[str]) -> bool:
        """Whether ``rest`` resolves under ``module``: its submodules first, then attributes."""
        while rest and f"{module}.{rest[0]}" in self.mods:
            module = f"{module}.{rest[0]}"
            rest = rest[1:]
        if rest and rest[0] == "_speedups" and module.endswith(".native"):
            return self.attr_ok("_speedups", rest[1:])
        return self.attr_ok(module, rest)

    def stale(self, kind: str, text: str) -> bool:
        """Whether the reference ``text`` (of ``REF``'s group ``kind``) names nothing that
        exists; a reference outside the package (``time.perf_counter_ns``, ``self.fn``) is
        not stale."""
        if kind == "path":
            if text.endswith("__init__.py") and "/" not in text:
                return False
            if "/" in text:
                return not (
                    (self.root / text).is_file() or (package_dir(self.root) / text).is_file()
                )
            return text[:-3] not in self.short
        if kind == "cfile":
            return text not in self.c_names and text not in ("Python.h", "structmember.h")
        if kind == "see":
            return text not in self.short
        if kind == "bare":
            return not (text in self.short or text in self.every_name or text in self.c_idents)
        parts = text.split(".")
        head, rest = parts[0], parts[1:]
        if head == PKG:
            return not self.module_ok(PKG, rest)
        if head == "_speedups":
            return not self.attr_ok("_speedups", rest)
        if head in self.short:
            return not any(self.module_ok(m, rest) for m in self.short[head])
        if head in self.all_classes or head in self.c_types:
            return not self.has_member(head, rest[0])
        if head.startswith("_"):
            return True  # a private module's name, as the flat layout had them
        if head[:1].isupper():
            return True  # a class the package does not define
        return False  # a local variable, the standard library, a builtin's method


def _top_names(tree: ast.Module) -> Set[str]:
    """The names a module binds at its top level (not inside functions or classes, but inside
    ``if``/``try``/``with``), plus those functions declare ``global``."""
    names: Set[str] = set()

    def bind(target: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def visit(stmts: List[ast.stmt]) -> None:
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(st.name)
            elif isinstance(st, ast.Assign):
                for t in st.targets:
                    bind(t)
            elif isinstance(st, (ast.AnnAssign, ast.AugAssign)):
                bind(st.target)
            elif isinstance(st, (ast.Import, ast.ImportFrom)):
                for a in st.names:
                    names.add((a.asname or a.name).split(".")[0])
            elif isinstance(st, (ast.For, ast.AsyncFor)):
                bind(st.target)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(getattr(st, field, []) or [])
            for h in getattr(st, "handlers", []) or []:
                visit(h.body)

    visit(tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            names.update(node.names)
    return names


def _class_members(tree: ast.Module) -> Dict[str, Set[str]]:
    """Class name -> the names its body binds, its ``__slots__`` and the ``self.X`` its
    methods assign (every class of the module, nested ones included)."""
    out: Dict[str, Set[str]] = {}
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        members = out.setdefault(cls.name, set())
        for st in cls.body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                members.add(st.name)
            elif isinstance(st, (ast.Assign, ast.AnnAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        members.add(t.id)
                        if t.id == "__slots__" and st.value is not None:
                            for c in ast.walk(st.value):
                                if isinstance(c, ast.Constant) and isinstance(c.value, str):
                                    members.add(c.value)
        for node in ast.walk(cls):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    members.add(node.attr)
    return out


def _external(head: str) -> bool:
    """Whether ``head`` names a builtin or an importable module outside the package."""
    if hasattr(builtins, head):
        return True
    try:
        return importlib.util.find_spec(head) is not None
    except (ImportError, ValueError):
        return False


def stale_c_names(root: Path) -> List[Tuple[str, int, str]]:
    """The names in the prose of the native C files (comments and doc strings) that look like
    references to a module, a file or a function and resolve to nothing in the package:
    (file relative to ``root``, line, the name)."""
    names = _Names(root)
    out = []
    for path in c_files(root):
        for line, text in c_prose(path.read_text()):
            for m in REF.finditer(text):
                kind = m.lastgroup
                ref = m.group(kind)
                if (
                    kind == "dotted"
                    and _external(ref.split(".")[0])
                    and ref.split(".")[0] not in names.short
                ):
                    continue
                if names.stale(kind, ref):
                    at = line + text.count("\n", 0, m.start())
                    out.append((path.relative_to(root).as_posix(), at, ref))
    return out


def report(root: Path) -> str:
    """The figures for the tree at ``root``, as text."""
    root = Path(root)
    lines = [f"tree: {root}"]
    folders = folder_counts(root)
    top = max(folders.items(), key=lambda kv: kv[1])
    total = sum(folders.values())
    lines.append(
        f"\nmodules per folder (.py, __init__ included): {total} in all; max {top[1]} ({top[0]})"
    )
    for folder, n in folders.items():
        lines.append(f"  {n:3d}  {folder}")
    words = docstring_words(root)
    counted = {m: n for m, n in words.items() if n is not None}
    longest = max(counted.items(), key=lambda kv: kv[1]) if counted else ("-", 0)
    over60 = sum(n > 60 for n in counted.values())
    over200 = sum(n > 200 for n in counted.values())
    lines.append(
        f"\nmodule docstrings (words): median {docstring_median(words):g} over {len(counted)} "
        f"modules with one ({len(words) - len(counted)} without); longest {longest[1]} "
        f"({longest[0]}); over 60: {over60}; over 200: {over200}"
    )
    for m, n in sorted(counted.items(), key=lambda kv: -kv[1]):
        if n > 60:
            lines.append(f"  {n:4d}  {m}")
    dates = dates_in_code(root)
    lines.append(f"\ndates in code (.py/.c/.h of the package): {len(dates)}")
    lines += [f"  {f}:{no}: {d}" for f, no, d in dates]
    bodies = function_bodies(root)
    lines.append(
        "\nlongest function bodies (lines after the docstring to the last line, "
        f"blank and comment lines included): over 100 lines: {sum(n > 100 for n, _ in bodies)}"
    )
    lines += [f"  {n:4d}  {where}" for n, where in bodies[:5]]
    stale = stale_c_names(root)
    lines.append(f"\nstale names in the C files' comments: {len(stale)}")
    lines += [f"  {f}:{no}: {ref}" for f, no, ref in stale]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "root", nargs="?", default=str(ROOT), help="the tree's root (default: this repository)"
    )
    print(report(Path(parser.parse_args(argv).root)))


if __name__ == "__main__":
    main()
