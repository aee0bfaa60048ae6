"""DGL layers with every internal step timed: a drop-in for every conv module,
``from instrumented_convs.dgl import GraphConv`` instead of ``from dgl.nn import GraphConv``.
Each subclasses the stock one (same constructor, parameters, ``state_dict``): ``GraphConv``
and ``EdgeWeightNorm`` are guarded copies of upstream's forwards with steps
(:mod:`.graphconv`), every other module generic (:mod:`.generic`), ``HeteroGraphConv`` too.
"""

from importlib.metadata import PackageNotFoundError as _Missing
from importlib.metadata import version as _version

try:
    import dgl as _dgl  # noqa: F401
except Exception as _exc:  # dgl 2.x on a torch its graphbolt was not built for: one line
    from ..core.native.versions import dgl_import_error

    try:
        _line = dgl_import_error(_exc, _version("dgl"))
    except _Missing:
        _line = None
    if _line is None:
        raise
    raise ImportError(_line) from None

from . import generic, trials  # noqa: E402, F401  (trials: the advice's changes timed)
from .graphconv import DETAILED, KNOWN, EdgeWeightNorm, GraphConv  # noqa: F401, E402

__all__ = ["GraphConv", "EdgeWeightNorm", "DETAILED"]

# -- every other conv module of dgl.nn.pytorch.conv: generic layers (no copied code)
_GENERIC = generic.make_all(__name__, detailed=frozenset(__all__))
globals().update(_GENERIC)
__all__ += sorted(_GENERIC)
#: Conv classes of DGL with no instrumented version here, and why.
NOT_INSTRUMENTED = generic.NOT_INSTRUMENTED

# -- DGL's module per relation of a heterograph (dgl.nn.HeteroGraphConv), generic too: the
# slicing of each relation's graph and the aggregation across relations are its steps, each
# relation's module a step of that relation (layers.relations).
HeteroGraphConv = generic.hetero_graph_conv(__name__)
__all__ += ["HeteroGraphConv"]
