"""Where a data loader was made: the lines of the user's code that built it (``train.py:42``,
and the lines that called that one), so that the loaders made at one place (a new one every
epoch) are one loader in the report, and two made by one helper function are told apart by
where it was called. Imports nothing from the package.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["made_at", "labels", "Site", "LIBRARIES"]

#: Packages whose frames are not where a loader was made (their loaders build a torch one;
#: ours wrap them). This project's study commands make loaders as a user's script does.
LIBRARIES = ("torch", "torch_geometric", "dgl", "instrumented_convs.workers")
DEPTH = 8  #: the user's frames kept of a loader's making

Site = Tuple[str, ...]  # "file.py:LINE" of the user's frames, innermost first


def _library(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in LIBRARIES)


def made_at(frame: Any, loader: Optional[Any] = None) -> Site:
    """The user's frames from ``frame`` outwards (``file.py:LINE``, innermost first): those
    that are neither a library's (:data:`LIBRARIES`) nor a constructor of ``loader`` itself
    (a subclass's ``__init__`` calling its base's); ``("?",)`` if none is."""
    out: List[str] = []
    while frame is not None and len(out) < DEPTH:
        module = str(frame.f_globals.get("__name__") or "")
        own_init = (
            loader is not None
            and frame.f_code.co_name == "__init__"
            and frame.f_locals.get("self") is loader
        )
        if not own_init and not _library(module):
            out.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
        frame = frame.f_back
    return tuple(out) or ("?",)


def _short(site: str, base: str) -> str:
    """``site``, its file left out when it is ``base``'s."""
    return "line " + site.rsplit(":", 1)[1] if site.rsplit(":", 1)[0] == base else site


def labels(kinds_sites: Sequence[Tuple[str, Site]]) -> List[str]:
    """Each loader's name: ``Kind at file.py:LINE``, the line that made it; loaders of one
    kind made at one line from different places (a helper function) add the first line
    where theirs differ: ``Kind at file.py:LINE from line 100``."""
    groups: Dict[Tuple[str, str], List[Site]] = {}
    for kind, site in kinds_sites:
        groups.setdefault((kind, site[0]), []).append(site)
    out = []
    for kind, site in kinds_sites:
        label = f"{kind} at {site[0]}"
        others = [s for s in groups[kind, site[0]] if s != site]
        if others:
            for i, part in enumerate(site[1:], 1):
                if any(len(s) <= i or s[i] != part for s in others):
                    label += f" from {_short(part, site[0].rsplit(':', 1)[0])}"
                    break
        out.append(label)
    return out
