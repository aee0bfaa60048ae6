"""PyTorch Geometric layers with every internal step timed: a drop-in for every conv class,
``from instrumented_convs.pyg import GCNConv`` instead of ``from torch_geometric.nn import
GCNConv``. Each is a subclass of the stock layer (same constructor, parameters,
``state_dict`` and outputs): ``GCNConv`` a guarded copy of upstream's code with steps
(:mod:`.gcn`), every other class generic (:mod:`.generic`).
"""

from . import generic, hetero, trials  # noqa: F401  (trials: the advice's changes timed)
from .gcn import DETAILED, KNOWN, GCNConv, gcn_norm  # noqa: F401  (KNOWN: for tests, check)

__all__ = ["GCNConv", "gcn_norm", "DETAILED"]

# -- every other conv class of torch_geometric.nn.conv: generic layers (no copied code)
_GENERIC = generic.make_all(__name__, frozenset(__all__), through={"gcn_norm": gcn_norm})
globals().update(_GENERIC)
__all__ += sorted(_GENERIC)
#: Conv classes of PyG with no instrumented version here, and why.
NOT_INSTRUMENTED = generic.NOT_INSTRUMENTED

hetero.install()  # to_hetero's copies of our layers named after their relation
