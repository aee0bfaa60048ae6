"""README as a user's entry point: its first python block runs as written and prints a table;
every function, method, class, module, CLI subcommand and flag that README and docs/*.md name
exists; README's first screen stays short (first code, ``pip install``, dates, length).

Blocks that need Lightning, torchrun or a GPU are not run: their ``instrumented_convs`` names
are resolved (modules imported, attributes looked up, calls bound to their signatures).
Command lines are parsed by the package's own argparse parser, taken from
``commands/cli.py``'s ``main`` (not by running the console script, which exists only once the
package is installed).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import importlib
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from .helpers import ROOT

README = ROOT / "README.md"

#: README's limits (issue 53).
FIRST_CODE_LINE = 40
FIRST_PIP_LINE = 60
MOST_DATES = 3
MOST_CHARS = 12_500

#: The console script README types, and the module form that keeps working.
CONSOLE = "instrumented-convs"
COMMAND = re.compile(r"(?:\binstrumented-convs|(?:python3? )?-m instrumented_convs)\s+(.*)")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
SHELL_STOP = {"|", ">", ">>", "&&", "||", ";", "2>&1", "&"}


# --- reading markdown --------------------------------------------------------------------


@dataclass
class Block:
    """A fenced code block: its language, its text and the line its fence opens on."""

    lang: str
    code: str
    line: int


def blocks(text: str) -> List[Block]:
    """The fenced code blocks of a markdown text, in order."""
    out: List[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i + 1
        body: List[str] = []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        out.append(Block(lang.lower(), "\n".join(body), start))
        i += 1
    return out


def prose(text: str) -> str:
    """The text with its fenced blocks blanked (line numbers kept)."""
    lines, inside = text.splitlines(), False
    for i, line in enumerate(lines):
        if FENCE.match(line):
            inside = not inside
            lines[i] = ""
        elif inside:
            lines[i] = ""
    return "\n".join(lines)


def spans(text: str) -> List[Tuple[str, int]]:
    """The inline code spans outside fenced blocks, whitespace folded, with their line."""
    body = prose(text)
    return [
        (" ".join(m.group(1).split()), body.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r"`([^`]+)`", body)
    ]


# --- command lines -----------------------------------------------------------------------


class _Parser(BaseException):
    """Carries the parser out of ``main`` (a BaseException: no ``except Exception`` stops it)."""


def cli_parser() -> argparse.ArgumentParser:
    """The parser ``python -m instrumented_convs`` builds: its builder's (``build_parser``,
    which may return it with the commands), else the one ``main`` builds, caught as it parses."""
    from instrumented_convs.commands import cli

    for name in ("build_parser", "make_parser", "parser"):
        builder = getattr(cli, name, None)
        if callable(builder):
            try:
                built = builder()
            except TypeError:
                continue
            for part in built if isinstance(built, tuple) else (built,):
                if isinstance(part, argparse.ArgumentParser):
                    return part

    def grab(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parser(self)

    originals = {n: getattr(argparse.ArgumentParser, n) for n in ("parse_args", "parse_known_args")}
    for name in originals:
        setattr(argparse.ArgumentParser, name, grab)
    try:
        cli.main([])
    except _Parser as caught:
        return caught.args[0]
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)
    raise AssertionError("commands.cli.main built no parser")


def subcommands(parser: argparse.ArgumentParser) -> Dict[str, argparse.ArgumentParser]:
    """``{name: parser}`` of the parser's subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("the parser has no subcommands")


def command_lines(text: str) -> Iterator[Tuple[str, int]]:
    """Every ``instrumented-convs ...`` / ``python -m instrumented_convs ...`` command in a
    markdown text (code blocks and inline spans), continuation lines joined, with its line."""
    for block in blocks(text):
        joined = block.code.replace("\\\n", " ")
        for offset, line in enumerate(joined.splitlines()):
            if block.lang in ("python", "py"):
                continue
            m = COMMAND.search(line)
            if m:
                yield m.group(0), block.line + 1 + offset
    for span, line in spans(text):
        m = COMMAND.search(span)
        if m:
            yield m.group(0), line


def check_command(command: str, subs: Dict[str, argparse.ArgumentParser]) -> Optional[str]:
    """What is wrong with a command line (an unknown subcommand or flag), or None."""
    m = COMMAND.search(command)
    assert m
    try:
        tokens = shlex.split(m.group(1), comments=True)
    except ValueError as e:
        return f"cannot split: {e}"
    tokens = [t.strip("[]").rstrip("),.;:") for t in tokens]  # prose's brackets and stops
    if not tokens:
        return None
    sub, rest = tokens[0], tokens[1:]
    if sub.startswith("-"):
        return None if sub in ("-h", "--help") else f"a flag before the subcommand: {sub}"
    if sub not in subs:
        return f"no subcommand {sub!r} (there are {', '.join(sorted(subs))})"
    options = subs[sub]._option_string_actions
    i = 0
    while i < len(rest):
        token = rest[i]
        if token in SHELL_STOP:
            break
        if token.startswith("-") and len(token) > 1:
            flag = token.split("=", 1)[0]
            action = options.get(flag)
            if action is None:
                return f"{sub} has no flag {flag}"
            takes = action.nargs != 0
            if flag == "-m" and sub == "run":
                break  # a module follows; the rest is its arguments
            i += 2 if takes and "=" not in token else 1
            continue
        if sub == "run":
            break  # the script: what follows is its own arguments
        i += 1
    return None


# --- python names ------------------------------------------------------------------------


@dataclass(frozen=True)
class Instance:
    """An object of ``cls`` that the text names but the checker cannot build."""

    cls: type


UNKNOWN = object()


def _instance_conventions() -> Dict[str, Any]:
    """Names README and the docs use for objects they do not build in the same block."""
    import instrumented_convs as ic
    from instrumented_convs.report import Summary

    face = {name: getattr(ic, name) for name in ic.__all__}
    return {
        **face,
        "ic": ic,
        "Summary": Summary,
        "instrumented_convs": ic,
        "summary": Instance(Summary),
        "merged": Instance(Summary),
    }


def _attribute(obj: Any, name: str) -> Any:
    """``obj.name`` for what the checker knows, KeyError if it does not exist."""
    if isinstance(obj, Instance):
        cls = obj.cls
        if hasattr(cls, name):
            return _member(cls, name)
        fields = set(getattr(cls, "__dataclass_fields__", {})) | set(
            getattr(cls, "__annotations__", {})
        )
        for base in cls.__mro__:
            fields |= set(getattr(base, "__slots__", ()) or ()) | _self_attributes(base)
        if name in fields:
            return UNKNOWN
        raise KeyError(name)
    if inspect.ismodule(obj) and not hasattr(obj, name):
        try:
            return importlib.import_module(f"{obj.__name__}.{name}")
        except ImportError:
            raise KeyError(name) from None
    if not hasattr(obj, name):
        raise KeyError(name)
    return getattr(obj, name)


def _self_attributes(cls: type) -> set:
    """The names a class's methods assign on ``self`` (instance attributes)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError, SyntaxError):
        return set()
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }


def _defined_in_source(module: str, name: str) -> bool:
    """Whether the file of ``module`` (which cannot be imported here: a third-party package it
    needs is missing) defines or imports ``name`` at its top level."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    tree = ast.parse(Path(spec.origin).read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def _third_party_missing(error: ImportError) -> bool:
    """Whether an import of our module failed for a package outside it (Lightning, say):
    a missing module not ours, or our own message that says what to install."""
    if "pip install" in str(error):
        return True
    cause = error
    while cause is not None:
        missing = getattr(cause, "name", None)
        if missing and missing.split(".")[0] != "instrumented_convs":
            return True
        cause = cause.__cause__ or cause.__context__
    return False


@dataclass(frozen=True)
class _Method:
    """A method looked up on a class, to be called on an instance."""

    function: Any


def _member(cls: type, name: str) -> Any:
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, (staticmethod, classmethod)):
        return getattr(cls, name)
    if isinstance(raw, property):
        return _returns(raw.fget)
    if inspect.isfunction(raw):
        return _Method(raw)
    return getattr(cls, name)


def _returns(function: Any) -> Any:
    """An :class:`Instance` of what ``function`` is annotated to return, or UNKNOWN."""
    target = function.function if isinstance(function, _Method) else function
    try:
        hint = typing.get_type_hints(target).get("return")
    except Exception:
        return UNKNOWN
    return Instance(hint) if isinstance(hint, type) and hint is not type(None) else UNKNOWN


def _bind(function: Any, call: ast.Call) -> Optional[str]:
    """Why the call's arguments do not fit the function's signature, or None."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(
        k.arg is None for k in call.keywords
    ):
        return None
    target = function.function if isinstance(function, _Method) else function
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    args = [None] * (len(call.args) + isinstance(function, _Method))
    try:
        signature.bind(*args, **{k.arg: None for k in call.keywords})
    except TypeError as e:
        return str(e)
    return None


class Names:
    """Resolves the ``instrumented_convs`` names of one piece of Python."""

    def __init__(self, conventions: Dict[str, Any]):
        self.bound: Dict[str, Any] = dict(conventions)
        self.errors: List[Tuple[int, str]] = []

    def check(self, tree: ast.AST, line: int = 0) -> List[Tuple[int, str]]:
        nodes = sorted(
            (n for n in ast.walk(tree) if hasattr(n, "lineno")),
            key=lambda n: (n.lineno, n.col_offset),
        )
        for node in nodes:
            where = line + node.lineno
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._import(node, where)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name):
                    value = self.value(node.value, where)
                    if value is UNKNOWN:
                        self.bound.pop(target.id, None)
                    else:
                        self.bound[target.id] = value
            elif isinstance(node, (ast.Attribute, ast.Call)):
                self.value(node, where)
        return self.errors

    def _import(self, node: ast.AST, where: int) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "instrumented_convs":
                    self.bound.pop((alias.asname or alias.name).split(".")[0], None)
                    continue  # third-party: not ours to check
                try:
                    module = importlib.import_module(alias.name)
                except ImportError as e:
                    self.errors.append((where, f"import {alias.name}: {e}"))
                    continue
                if alias.asname:
                    self.bound[alias.asname] = module
                else:
                    self.bound["instrumented_convs"] = importlib.import_module("instrumented_convs")
            return
        assert isinstance(node, ast.ImportFrom)
        if not node.module or node.module.split(".")[0] != "instrumented_convs":
            for alias in node.names:
                self.bound.pop(alias.asname or alias.name, None)
            return
        try:
            module = importlib.import_module(node.module)
        except ImportError as e:
            # A module that needs a package this environment lacks (Lightning): its names
            # are looked up in its source instead.
            if not _third_party_missing(e) or importlib.util.find_spec(node.module) is None:
                self.errors.append((where, f"from {node.module} import ...: {e}"))
                return
            for alias in node.names:
                self.bound.pop(alias.asname or alias.name, None)
                if not _defined_in_source(node.module, alias.name):
                    self.errors.append((where, f"{node.module} defines no {alias.name!r}"))
            return
        for alias in node.names:
            try:
                self.bound[alias.asname or alias.name] = _attribute(module, alias.name)
            except KeyError:
                self.errors.append((where, f"{node.module} has no {alias.name!r}"))

    def value(self, node: ast.AST, where: int) -> Any:
        """What an expression is, as far as the checker knows (UNKNOWN where it does not);
        errors noted on the way."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id, UNKNOWN)
        if isinstance(node, ast.Attribute):
            base = self.value(node.value, where)
            if base is UNKNOWN or isinstance(base, _Method):
                return UNKNOWN
            try:
                return _attribute(base, node.attr)
            except KeyError:
                self._error(where, f"{ast.unparse(node)}: no attribute {node.attr!r}")
                return UNKNOWN
        if isinstance(node, ast.Call):
            function = self.value(node.func, where)
            if function is UNKNOWN or isinstance(function, Instance):
                return UNKNOWN
            why = _bind(function, node)
            if why:
                self._error(where, f"{ast.unparse(node)}: {why}")
            if inspect.isclass(function):
                return Instance(function)
            return _returns(function)
        return UNKNOWN

    def _error(self, where: int, message: str) -> None:
        if (where, message) not in self.errors:
            self.errors.append((where, message))


def python_source(code: str) -> Tuple[Optional[str], str]:
    """``(source, why not)``: the block with IPython's magic lines dropped, or None and why."""
    lines = [line for line in code.splitlines() if not line.lstrip().startswith("%")]
    source = "\n".join(lines)
    try:
        ast.parse(source)
    except SyntaxError as e:
        return None, f"not Python: {e.msg}"
    return source, ""


def python_errors(text: str, inline: bool) -> Tuple[List[Tuple[int, str]], List[str]]:
    """Unresolved names in the python blocks of a markdown text (and, with ``inline``, in its
    inline spans that parse as Python), and the blocks skipped with why."""
    errors: List[Tuple[int, str]] = []
    skipped: List[str] = []
    conventions = _instance_conventions()
    for block in blocks(text):
        if block.lang not in ("python", "py"):
            continue
        source, why = python_source(block.code)
        if source is None:
            skipped.append(f"line {block.line}: {why}")
            continue
        errors += Names(conventions).check(ast.parse(source), block.line)
    if inline:
        for span, line in spans(text):
            if "(" not in span and "." not in span:
                continue  # a bare word: no call or attribute to check
            try:
                tree = ast.parse(span, mode="eval")
            except SyntaxError:
                continue  # prose in backticks (a command, a path, a shape)
            errors += [(line, msg) for _, msg in Names(conventions).check(tree)]
    return errors, skipped


# --- (a) README's first python block runs ------------------------------------------------


TITLE = re.compile(r"^--- (.+?) \(times in \w+\) -+$", re.M)


def test_readme_first_python_block_runs_as_written(tmp_path):
    """It runs as written and prints a table of the same steps, under the same title, as
    the output README shows after it (in an environment with PyG: the example's)."""
    pytest.importorskip("torch_geometric")
    bs = blocks(README.read_text())
    first = next(i for i, b in enumerate(bs) if b.lang == "python")
    script = tmp_path / "first.py"
    script.write_text(bs[first].code + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DGLBACKEND": "pytorch"}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    title = TITLE.search(out)
    assert title, out[-2000:]
    for row in ("GCNConv", "propagate", "GCNConv [backward]", "optimizer.step"):
        assert re.search(rf"^\s*- {re.escape(row)}\s+\|", out, re.M), (row, out[-2000:])
    assert "Frac.: share of the total" in out, out[-2000:]
    shown = bs[first + 1].code
    assert shown.lstrip().startswith(title.group(0)[:30]), (title.group(0), shown[:200])
    rows = re.findall(r"^\s*- (.+?)\s+\|", shown, re.M)
    missing = [r for r in rows if not re.search(rf"^\s*- {re.escape(r)}\s+\|", out, re.M)]
    assert rows and not missing, f"README shows rows the block does not print: {missing}"


# --- (b) every name and flag exists ------------------------------------------------------


def _markdown_files() -> List[Path]:
    return [README] + sorted((ROOT / "docs").glob("*.md"))


@pytest.fixture(scope="module")
def subs() -> Dict[str, argparse.ArgumentParser]:
    return subcommands(cli_parser())


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_command_lines_name_subcommands_and_flags_that_exist(path, subs):
    text = path.read_text()
    wrong = []
    for command, line in command_lines(text):
        why = check_command(command, subs)
        if why:
            wrong.append(f"{path.name}:{line}: {command!r}: {why}")
    assert not wrong, "\n".join(wrong)


def test_readme_names_its_commands_by_the_console_script():
    text = README.read_text()
    commands = [c for c, _ in command_lines(text)]
    assert sum(c.startswith(CONSOLE) for c in commands) >= 3, commands
    module_form = [c for c in commands if "-m instrumented_convs" in c]
    assert len(module_form) == 1, f"the python -m form once, not {module_form}"


def test_the_console_script_readme_types_is_declared():
    """setup.cfg declares ``instrumented-convs`` as a console script of the CLI's main."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = cfg.get("options.entry_points", "console_scripts", fallback="")
    scripts = dict(
        (part.strip() for part in line.split("=", 1))
        for line in declared.strip().splitlines()
        if "=" in line
    )
    assert CONSOLE in scripts, f"setup.cfg declares no console script {CONSOLE!r}: {scripts}"
    module, _, name = scripts[CONSOLE].partition(":")
    assert callable(getattr(importlib.import_module(module), name)), scripts[CONSOLE]


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_python_names_resolve(path):
    """Every ``instrumented_convs`` import, attribute and call in the python blocks (and, in
    README, its inline code) exists and fits its signature. Third-party names are not
    checked: they are not ours, and their packages are not all in this environment."""
    errors, skipped = python_errors(path.read_text(), inline=path == README)
    assert not errors, "\n".join(f"{path.name}:{line}: {msg}" for line, msg in errors)
    if path == README:
        assert not skipped, skipped


def test_readme_paths_and_environment_variables_exist():
    text = README.read_text()
    missing = [
        p
        for p in re.findall(r"\]\(([^)#\s]+)\)", text)
        + re.findall(r"\b((?:docs|examples|scripts|benchmarks|requirements)/[\w./-]*\w)", text)
        if "://" not in p and "_build" not in p and not (ROOT / p).exists()
    ]
    assert not missing, f"README names files that do not exist: {missing}"
    examples = re.findall(r"`((?:\w+)\.py)`", text)
    missing = [e for e in examples if e != "train.py" and e != "first.py"]
    missing = [e for e in missing if not (ROOT / "examples" / e).exists()]
    assert not missing, f"README names examples that do not exist: {missing}"
    source = "\n".join(
        p.read_text(errors="replace")
        for p in [*(ROOT / "instrumented_convs").rglob("*.py"), *(ROOT / "scripts").glob("*.sh")]
    )
    unknown = sorted(
        set(re.findall(r"INSTRUMENTED_CONVS_\w+", text))
        - set(re.findall(r"INSTRUMENTED_CONVS_\w+", source))
    )
    assert not unknown, f"README names environment variables nothing reads: {unknown}"


# --- (c) README's limits -----------------------------------------------------------------


def test_readme_first_screen_and_length():
    text = README.read_text()
    lines = text.splitlines()
    first_code = next(i for i, line in enumerate(lines, 1) if FENCE.match(line))
    assert first_code <= FIRST_CODE_LINE, f"first code at line {first_code}"
    first_pip = next(i for i, line in enumerate(lines, 1) if "pip install" in line)
    assert first_pip <= FIRST_PIP_LINE, f"first pip install at line {first_pip}"
    picture = next((i for i, line in enumerate(lines, 1) if "![" in line), None)
    assert picture is not None and picture < first_code, "the picture before the first code"
    assert len(text) <= MOST_CHARS, f"README is {len(text):,} characters"


def test_readme_dates_are_few_and_in_the_cost_table():
    lines = README.read_text().splitlines()
    dated = [(i, line) for i, line in enumerate(lines, 1) if DATE.search(line)]
    count = sum(len(DATE.findall(line)) for _, line in dated)
    assert count <= MOST_DATES, f"{count} dates: {[i for i, _ in dated]}"
    outside = [i for i, line in dated if not line.startswith("|")]
    assert not outside, f"dates outside the cost table, lines {outside}"


# --- the checks see what they look for ---------------------------------------------------


def test_the_checks_find_what_is_wrong(subs):
    """Planted mistakes are found (so a passing check is not a blind one)."""
    text = (
        "Run `instrumented-convs view RUN --nope` or:\n\n"
        "```bash\n"
        "instrumented-convs run --warmup 2 train.py --epochs 5   # fine: the script's flags\n"
        "python -m instrumented_convs runn train.py\n"
        "instrumented-convs diff a b \\\n    --fail-abov 5\n"
        "```\n\n"
        "```python\n"
        "from instrumented_convs import registry, nothing_here\n"
        "import instrumented_convs as ic\n"
        "s = registry.summary(bye='layer')\n"
        "s.to_csvv()\n"
        "ic.configure(enabled=False).nope\n"
        "```\n\n"
        "and `registry.summary().by_rankk()`.\n"
    )
    found = {
        c.split()[1 if c.startswith(CONSOLE) else 3]: check_command(c, subs)
        for c, _ in command_lines(text)
    }
    assert found["run"] is None, found
    assert "runn" in found["runn"], found
    assert "--fail-abov" in found["diff"], found
    assert "--nope" in found["view"], found
    errors, _ = python_errors(text, inline=True)
    messages = " ".join(msg for _, msg in errors)
    for planted in ("nothing_here", "bye", "to_csvv", "nope", "by_rankk"):
        assert planted in messages, (planted, errors)
    assert not python_errors(
        "```python\nfrom instrumented_convs import registry\n"
        "registry.summary(by='layer').to_json()\n```\n",
        inline=True,
    )[0]
