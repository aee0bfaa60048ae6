"""PyTorch Geometric layers with every internal step timed: a drop-in for every conv class.

``from instrumented_convs.pyg import GCNConv`` instead of ``from torch_geometric.nn import
GCNConv``; nothing else changes. Every class is a subclass of the stock layer, with the
same constructor, parameters, ``state_dict``, ``repr`` and outputs.

- ``GCNConv`` and ``gcn_norm`` (:mod:`.gcn`): copies of upstream's code with a step around
  each part (the steps of the study); :data:`DETAILED` says whether the installed PyG
  matches the copies (else upstream's code runs, timed from outside);
- every other class of ``torch_geometric.nn.conv`` (:mod:`.generic`): no copied code, PyG's
  message passing and the layer's own statements and calls as steps;
  :data:`NOT_INSTRUMENTED` names the classes left out, and why.
"""

from . import generic
from .gcn import DETAILED, KNOWN, GCNConv, gcn_norm  # noqa: F401  (KNOWN: for tests, check)

__all__ = ["GCNConv", "gcn_norm", "DETAILED"]

# -- every other conv class of torch_geometric.nn.conv: generic layers (no copied code)
_GENERIC = generic.make_all(__name__, frozenset(__all__), through={"gcn_norm": gcn_norm})
globals().update(_GENERIC)
__all__ += sorted(_GENERIC)
#: Conv classes of PyG with no instrumented version here, and why.
NOT_INSTRUMENTED = generic.NOT_INSTRUMENTED
