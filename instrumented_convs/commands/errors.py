"""What the commands do with an expected failure, and how their help reads.

A command raises :class:`UserError` where it finds a failure a person can act on (a missing
file, a run folder that is none, a flag out of range); the command line's entry prints it as
one or two lines and exits with its code (:func:`call`). ``INSTRUMENTED_CONVS_TRACEBACK=1``
shows the traceback instead, for a bug report. :class:`Parser` says a usage error the same way,
and :class:`HelpFormatter` shows every flag's default.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, NoReturn, Optional

__all__ = [
    "PROG",
    "TRACEBACK_ENV",
    "USAGE",
    "UserError",
    "Parser",
    "HelpFormatter",
    "call",
    "described",
    "error_note",
]

PROG = "python -m instrumented_convs"  #: how the help's usage and examples call the commands
TRACEBACK_ENV = "INSTRUMENTED_CONVS_TRACEBACK"  #: set to 1: a failure shows its traceback
USAGE = 2  #: the exit code of a usage error, as argparse's


class UserError(Exception):
    """An expected failure of a command: ``message`` names the file or flag and what to do;
    ``code`` is the exit code (:data:`USAGE` for a wrong flag or path)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _traceback_wanted() -> bool:
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "no", "false")


def call(name: str, main: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run the command ``name``'s ``main`` on ``args``; a :class:`UserError`, or an
    ``OSError`` (a file that cannot be read or written), becomes a line on stderr and the
    exit code, unless :data:`TRACEBACK_ENV` asks for the traceback."""
    try:
        return main(args)
    except (UserError, OSError) as e:
        if _traceback_wanted():
            raise
        if isinstance(e, UserError):
            message, code = str(e), e.code
        else:
            message, code = f"{e.filename or ''}: {e.strerror or e}".lstrip(": "), 1
        print(f"{name}: {message}", file=sys.stderr)
        if code == USAGE:
            print(f"{name}: see --help for its flags and examples", file=sys.stderr)
        return code


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors take two lines, the error and where to read
    more, rather than the whole usage (exit code 2, as argparse's); a flag its command does
    not know is that command's error."""

    _commands: Optional[argparse.Action] = None

    def add_subparsers(self, **kwargs: Any) -> Any:
        """The subparsers, remembered: a command's unknown flags are said as its own."""
        self._commands = super().add_subparsers(**kwargs)
        return self._commands

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        """As argparse's, with an unknown flag said by the command it was given to."""
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = getattr(parsed, "command", None)
            choices = getattr(self._commands, "choices", None) or {}
            where = choices.get(command, self)
            where.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def error(self, message: str) -> NoReturn:
        """Print the error and the way to the help; exit with :data:`USAGE`."""
        self.exit(USAGE, f"{self.prog}: {message}\nsee: {self.prog} --help\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description and epilog as written (examples keep their lines); every flag with a
    default other than None, False or empty says it, unless its help already does."""

    def _get_help_string(self, action: argparse.Action) -> Optional[str]:
        text = action.help or ""
        default = action.default
        if (
            default is None
            or default is False
            or default == argparse.SUPPRESS
            or (isinstance(default, (list, tuple)) and not default)
            or "default" in text
            or not action.option_strings
        ):
            return text
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
        return f"{text} (default: {str(shown).replace('%', '%%')})"


def described(what: str, *examples: str) -> str:
    """A command's description: what it does in a line or two, then its examples."""
    return "\n".join([what, "", "examples:", *(f"  {e}" for e in examples)])


def error_note() -> str:
    """What a failure prints, and how to see its traceback (the end of every epilog)."""
    return (
        "A failure prints a line naming the file or flag (exit code 2 for a wrong flag or path);\n"
        f"{TRACEBACK_ENV}=1 shows its traceback, for a bug report."
    )
