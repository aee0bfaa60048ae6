"""The releases this package is known not to run with, named at import with what to do.

setup.cfg bounds no upper version (a bound is what pip's resolver downgrades a user's torch
to): a release known to break is listed here instead, and :func:`require` (at import of the
package) or :func:`dgl_import_error` (at import of ``instrumented_convs.dgl``) says so in
one line. Newer releases run: the private calls' canaries (:mod:`.private`) and the copies'
guards fall back where they changed.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

__all__ = ["key", "require", "dgl_import_error", "OLDEST_TORCH", "GRAPHBOLT_TORCH"]

#: The oldest torch this package runs on (setup.cfg's ``install_requires``).
OLDEST_TORCH = "2.2"
#: The torch releases dgl 2.x's graphbolt library is built for (dgl 2.1.0 ships 2.0.0 to
#: 2.2.1; dgl 2.0.0 fewer): on any other torch ``import dgl`` fails.
GRAPHBOLT_TORCH = ("2.0", "2.3")


def key(v: str) -> Tuple[int, ...]:
    """A release's number as a tuple to compare (``"2.14.1+cu130"`` -> ``(2, 14, 1)``)."""
    out = []
    for part in v.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def require(torch_version: Optional[str] = None) -> None:
    """Raise ImportError (one line: the version and what to do) where torch is older than
    this package runs on; a clone used from PYTHONPATH skips pip's own check."""
    v = torch_version or torch.__version__
    if key(v) < key(OLDEST_TORCH):
        raise ImportError(
            f"instrumented_convs needs torch {OLDEST_TORCH} or newer, this is torch {v}: "
            f"pip install 'torch>={OLDEST_TORCH}'"
        )


require()  # at import of the package (its first import): a torch too old, in one line


def dgl_import_error(
    exc: BaseException, dgl_version: Optional[str], torch_version: Optional[str] = None
) -> Optional[str]:
    """The one line to raise where ``import dgl`` failed with ``exc`` because dgl 2.x cannot
    load on this torch (its graphbolt library is built per torch release, and it needs
    torchdata's datapipes, which torchdata 0.10 dropped); None for any other failure."""
    tv = torch_version or torch.__version__
    if dgl_version is None or key(dgl_version) < (2,):
        return None
    low, high = GRAPHBOLT_TORCH
    off_range = not key(low) <= key(tv) < key(high)
    text = f"{type(exc).__name__}: {exc}"
    if not (off_range or "graphbolt" in text or "torchdata" in text):
        return None
    return (
        f"dgl {dgl_version} cannot load on torch {tv} (its graphbolt library is built for "
        f"torch {low} to 2.2, with torchdata<0.10): pip install 'dgl==1.1.3', which runs on "
        f"this torch"
    )
