"""Which clock a step uses: CUDA events on a CUDA device (or at the top level once CUDA is
initialised), else the CPU clock."""

from __future__ import annotations

from typing import Any, Optional

import torch

_cuda_seen = False  # becomes True once CUDA is initialised in this process


def auto_cuda() -> bool:
    """Whether a top-level step with no device should use the CUDA clock (CUDA initialised)."""
    global _cuda_seen
    if not _cuda_seen:
        _cuda_seen = torch.cuda.is_initialized()
    return _cuda_seen


def device_is_cuda(device: Any) -> Optional[bool]:
    """Whether ``device`` (a ``torch.device``, string or index) is a CUDA device; None: unknown."""
    if device is None:
        return None
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return torch.device(device).type == "cuda"


def device_index(device: Any) -> Optional[int]:
    """The index of a CUDA ``device`` (None: the current device)."""
    if isinstance(device, int):
        return device
    d = device if isinstance(device, torch.device) else torch.device(device)
    return d.index
