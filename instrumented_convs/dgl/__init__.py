"""DGL layers with every internal step timed: a drop-in for every conv module.

``from instrumented_convs.dgl import GraphConv`` instead of ``from dgl.nn import
GraphConv``; nothing else changes. Every class subclasses the stock one (same constructor,
parameters, ``state_dict``, ``extra_repr``).

- ``GraphConv`` and ``EdgeWeightNorm`` (:mod:`.graphconv`): copies of upstream's forwards
  with a step around each part; :data:`DETAILED` says whether the installed DGL matches
  the copies (else upstream's forward runs as a generic layer runs it);
- every other module of ``dgl.nn.pytorch.conv`` (:mod:`.generic`): no copied code, DGL's
  message passing and kernels (:mod:`.kernels`) and the layer's own statements and calls
  as steps; :data:`NOT_INSTRUMENTED` names the classes left out, and why.
"""

from . import generic
from .graphconv import DETAILED, KNOWN, EdgeWeightNorm, GraphConv  # noqa: F401  (KNOWN)

__all__ = ["GraphConv", "EdgeWeightNorm", "DETAILED"]

# -- every other conv module of dgl.nn.pytorch.conv: generic layers (no copied code)
_GENERIC = generic.make_all(__name__, detailed=frozenset(__all__))
globals().update(_GENERIC)
__all__ += sorted(_GENERIC)
#: Conv classes of DGL with no instrumented version here, and why.
NOT_INSTRUMENTED = generic.NOT_INSTRUMENTED
