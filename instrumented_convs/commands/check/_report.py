"""What ``check`` reports: a line per thing checked (PASS, FAIL or SKIPPED, with the reason
and the numbers), lines grouped into sections, sections into a report; the report renders
as one table per section and as JSON for a bug report. Nothing here imports from the package.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["PASS", "FAIL", "SKIPPED", "Line", "Section", "Report"]

PASS, FAIL, SKIPPED = "PASS", "FAIL", "SKIPPED"


@dataclass
class Line:
    """One thing checked: its name, its verdict, why (always for FAIL and SKIPPED) and the
    figures behind it (plain data, kept in the JSON)."""

    name: str
    status: str
    detail: str = ""
    data: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.status not in (PASS, FAIL, SKIPPED):
            raise ValueError(f"a line's status is PASS, FAIL or SKIPPED, not {self.status!r}")


@dataclass
class Section:
    """One section of the check: its title, what it compares, and its lines."""

    title: str
    about: str
    lines: List[Line] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str = "", /, **data: Any) -> Line:
        """Append a line and return it."""
        line = Line(name, status, detail, data)
        self.lines.append(line)
        return line

    @property
    def failed(self) -> bool:
        """Whether a line failed."""
        return any(line.status == FAIL for line in self.lines)

    def render(self, width: int = 100) -> str:
        """The section as a table: a line each, the verdict first."""
        out = [f"== {self.title}", _wrap(self.about, width, "   ")]
        name_w = min(max((len(line.name) for line in self.lines), default=4), 44)
        for line in self.lines:
            name = line.name if len(line.name) <= name_w else line.name[: name_w - 1] + "…"
            head = f"  {line.status:<7} {name:<{name_w}}  "
            out.append(head + _wrap(line.detail, width - len(head), " " * len(head)).lstrip())
        return "\n".join(out)


@dataclass
class Report:
    """The whole check: the sections in order, and where it ran."""

    device: str
    quick: bool
    sections: List[Section] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """Whether any line failed (the command's exit status is 1 then)."""
        return any(s.failed for s in self.sections)

    def counts(self) -> Dict[str, int]:
        """How many lines passed, failed and were skipped."""
        out = {PASS: 0, FAIL: 0, SKIPPED: 0}
        for s in self.sections:
            for line in s.lines:
                out[line.status] += 1
        return out

    def render(self) -> str:
        """Every section's table, then the verdict."""
        parts = [s.render() for s in self.sections]
        c = self.counts()
        verdict = "FAILED" if self.failed else "PASSED"
        parts.append(
            f"== {verdict}: {c[PASS]} passed, {c[FAIL]} failed, {c[SKIPPED]} skipped "
            f"(device {self.device}{', quick' if self.quick else ''})"
        )
        return "\n\n".join(parts)

    def to_json(self, extra: Optional[Dict[str, Any]] = None) -> str:
        """The report as JSON: every line with its figures, the host, the verdict."""
        doc = {
            "format": "instrumented_convs.commands.check",
            "version": 1,
            "device": self.device,
            "quick": self.quick,
            "host": platform.node(),
            "python": platform.python_version(),
            "passed": not self.failed,
            "counts": self.counts(),
            "sections": [
                {"title": s.title, "about": s.about, "lines": [asdict(x) for x in s.lines]}
                for s in self.sections
            ],
        }
        doc.update(extra or {})
        return json.dumps(doc, indent=1, default=str)


def _wrap(text: str, width: int, indent: str) -> str:
    """``text`` wrapped to ``width`` columns, continuation lines indented."""
    import textwrap

    if not text:
        return ""
    lines = textwrap.wrap(text, max(width, 30)) or [""]
    return indent + ("\n" + indent).join(lines)
