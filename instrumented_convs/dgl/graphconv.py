"""DGL's ``GraphConv`` and ``EdgeWeightNorm`` with every internal step timed (the steps:
docs/dgl.rst).

Each ``forward`` is a copy of upstream's with steps around each part. At import the
installed DGL's code is checked against the fingerprints the copies match (:data:`KNOWN`);
where it differs, the layer warns once and runs upstream's forward as a generic layer does
(:data:`DETAILED` says which copies run).
"""
import logging
from typing import Any, Dict

import dgl
import torch as th
from dgl import function as fn
from dgl.base import DGLError
from dgl.convert import block_to_graph
from dgl.heterograph import DGLBlock
from dgl.nn.pytorch import EdgeWeightNorm as _StockEdgeWeightNorm
from dgl.nn.pytorch import GraphConv as _StockGraphConv
from dgl.transforms import reverse
from dgl.utils import expand_as_pair

from ..core.compiler.dynamo import skip_frame
from ..core.meters import signals
from ..core.settings import switches
from ..core.steps.step import Step
from ..layers.generic import runs_stock
from ..layers.guard import guard, warn_fallback
from . import generic

__all__ = ["GraphConv", "EdgeWeightNorm", "DETAILED"]

logger = logging.getLogger(__name__)

# The steps of the forwards, built once: forward checks recording() on entry and then
# the copies enter these directly (a step() call per use would cost a call and a lookup).
_DEGREES = Step("degrees")
_POW = Step("pow")
_MUL = Step("mul")
_ZERO_IN_DEGREE_CHECK = Step("zero_in_degree_check")
_NORM_SRC = Step("norm_src")
_NORM_DST = Step("norm_dst")
_MATMUL = Step("matmul")
_UPDATE_ALL = Step("update_all")
_BIAS = Step("bias")
_ACTIVATION = Step("activation")
_POSITIVITY_CHECK = Step("positivity_check")
_INIT_WEIGHTS = Step("init_weights")
_OUT_WEIGHT = Step("out_weight")
_IN_WEIGHT = Step("in_weight")
_APPLY_EDGES = Step("apply_edges")
_EDGE_WEIGHT = Step("edge_weight")


# -- the copies: upstream's code (DGL 1.1.3 = 2.1.0) with `with <step>:` blocks, nothing else

def _instrumented_graph_conv_forward(self, graph, feat, weight=None, edge_weight=None):
    with graph.local_scope():
        if not self._allow_zero_in_degree:
            with _ZERO_IN_DEGREE_CHECK:
                if (graph.in_degrees() == 0).any():
                    raise DGLError(
                        "There are 0-in-degree nodes in the graph, "
                        "output for those nodes will be invalid. "
                        "This is harmful for some applications, "
                        "causing silent performance regression. "
                        "Adding self-loop on the input graph by "
                        "calling `g = dgl.add_self_loop(g)` will resolve "
                        "the issue. Setting ``allow_zero_in_degree`` "
                        "to be `True` when constructing this module will "
                        "suppress the check and let the code run."
                    )
        aggregate_fn = fn.copy_u("h", "m")
        if edge_weight is not None:
            with _EDGE_WEIGHT:
                assert edge_weight.shape[0] == graph.num_edges()
                graph.edata["_edge_weight"] = edge_weight
                aggregate_fn = fn.u_mul_e("h", "_edge_weight", "m")

        # (BarclayII) For RGCN on heterogeneous graphs we need to support GCN on bipartite.
        feat_src, feat_dst = expand_as_pair(feat, graph)
        if self._norm in ["left", "both"]:
            with _NORM_SRC:
                with _DEGREES:
                    degs = graph.out_degrees().to(feat_src).clamp(min=1)
                with _POW:
                    if self._norm == "both":
                        norm = th.pow(degs, -0.5)
                    else:
                        norm = 1.0 / degs
                with _MUL:
                    shp = norm.shape + (1,) * (feat_src.dim() - 1)
                    norm = th.reshape(norm, shp)
                    feat_src = feat_src * norm

        if weight is not None:
            if self.weight is not None:
                raise DGLError(
                    "External weight is provided while at the same time the"
                    " module has defined its own weight parameter. Please"
                    " create the module with flag weight=False."
                )
        else:
            weight = self.weight

        if self._in_feats > self._out_feats:
            # mult W first to reduce the feature size for aggregation.
            if weight is not None:
                with _MATMUL:
                    feat_src = th.matmul(feat_src, weight)
            with _UPDATE_ALL:
                graph.srcdata["h"] = feat_src
                graph.update_all(aggregate_fn, fn.sum(msg="m", out="h"))
                rst = graph.dstdata["h"]
        else:
            # aggregate first then mult W
            with _UPDATE_ALL:
                graph.srcdata["h"] = feat_src
                graph.update_all(aggregate_fn, fn.sum(msg="m", out="h"))
                rst = graph.dstdata["h"]
            if weight is not None:
                with _MATMUL:
                    rst = th.matmul(rst, weight)

        if self._norm in ["right", "both"]:
            with _NORM_DST:
                with _DEGREES:
                    degs = graph.in_degrees().to(feat_dst).clamp(min=1)
                with _POW:
                    if self._norm == "both":
                        norm = th.pow(degs, -0.5)
                    else:
                        norm = 1.0 / degs
                with _MUL:
                    shp = norm.shape + (1,) * (feat_dst.dim() - 1)
                    norm = th.reshape(norm, shp)
                    rst = rst * norm

        if self.bias is not None:
            with _BIAS:
                rst = rst + self.bias

        if self._activation is not None:
            with _ACTIVATION:
                rst = self._activation(rst)

        return rst


def _instrumented_edge_weight_norm_forward(self, graph, edge_weight):
    with graph.local_scope():
        if isinstance(graph, DGLBlock):
            graph = block_to_graph(graph)
        if len(edge_weight.shape) > 1:
            raise DGLError(
                "Currently the normalization is only defined "
                "on scalar edge weight. Please customize the "
                "normalization for your high-dimensional weights."
            )
        with _POSITIVITY_CHECK:
            if self._norm == "both" and th.any(edge_weight <= 0).item():
                raise DGLError(
                    'Non-positive edge weight detected with `norm="both"`. '
                    "This leads to square root of zero or negative values."
                )

        dev = graph.device
        dtype = edge_weight.dtype
        with _INIT_WEIGHTS:
            graph.srcdata["_src_out_w"] = th.ones(
                graph.number_of_src_nodes(), dtype=dtype, device=dev
            )
            graph.dstdata["_dst_in_w"] = th.ones(
                graph.number_of_dst_nodes(), dtype=dtype, device=dev
            )
            graph.edata["_edge_w"] = edge_weight

        if self._norm == "both":
            with _OUT_WEIGHT:
                reversed_g = reverse(graph)
                reversed_g.edata["_edge_w"] = edge_weight
                reversed_g.update_all(
                    fn.copy_e("_edge_w", "m"), fn.sum("m", "out_weight")
                )
                degs = reversed_g.dstdata["out_weight"] + self._eps
                norm = th.pow(degs, -0.5)
                graph.srcdata["_src_out_w"] = norm

        if self._norm != "none":
            with _IN_WEIGHT:
                graph.update_all(
                    fn.copy_e("_edge_w", "m"), fn.sum("m", "in_weight")
                )
                degs = graph.dstdata["in_weight"] + self._eps
                if self._norm == "both":
                    norm = th.pow(degs, -0.5)
                else:
                    norm = 1.0 / degs
                graph.dstdata["_dst_in_w"] = norm

        with _APPLY_EDGES:
            graph.apply_edges(
                lambda e: {
                    "_norm_edge_weights": e.src["_src_out_w"]
                    * e.dst["_dst_in_w"]
                    * e.data["_edge_w"]
                }
            )
        return graph.edata["_norm_edge_weights"]


#: Fingerprints of the upstream functions our copies match (see layers.guard.fingerprint), and
#: the DGL releases they were seen in.
KNOWN: Dict[str, Dict[str, str]] = {
    "GraphConv.forward": {"25e6e4ca7a413ce0": "1.1.3 2.1.0"},
    "EdgeWeightNorm.forward": {"6d68aa194122c72b": "1.1.3 2.1.0"},
}

_GUARDS = {
    "GraphConv": guard("GraphConv.forward", _StockGraphConv.forward, KNOWN["GraphConv.forward"],
                       globals()),
    "EdgeWeightNorm": guard("EdgeWeightNorm.forward", _StockEdgeWeightNorm.forward,
                            KNOWN["EdgeWeightNorm.forward"], globals()),
}
_GRAPH_CONV_OK = _GUARDS["GraphConv"].ok
_EDGE_WEIGHT_NORM_OK = _GUARDS["EdgeWeightNorm"].ok
#: Whether each copied upstream function runs instrumented (True) or falls back to
#: upstream's own code (False: the installed DGL differs from the copy).
DETAILED: Dict[str, bool] = {g.name: g.ok for g in _GUARDS.values()}
_FALLBACK_TIMED = "DGL's calls, the functions and statements of upstream's forward, as steps"
for _layer, _guarded in _GUARDS.items():
    warn_fallback(logger, _layer, "dgl", dgl.__version__, [_guarded], _FALLBACK_TIMED)


class GraphConv(generic.Detailed, _StockGraphConv):
    """``dgl.nn.GraphConv`` with its internal steps timed (a true drop-in)."""

    _ic_stock = _StockGraphConv
    _ic_kind = "step" if _GRAPH_CONV_OK else "upstream"
    if not _GRAPH_CONV_OK:  # what the fallback times (see generic.fallback)
        _ic_fallback = generic.fallback(_StockGraphConv, __name__)
        _ic_methods, _ic_handed = _ic_fallback._ic_methods, _ic_fallback._ic_handed

    def forward(self, graph: Any, feat: Any, weight: Any = None,
                edge_weight: Any = None) -> th.Tensor:
        """The stock forward, with its steps recorded (docs/dgl.rst lists them)."""
        if runs_stock(self):
            return super().forward(graph, feat, weight=weight, edge_weight=edge_weight)
        if switches.advise:
            inputs = ((graph, feat), {"weight": weight, "edge_weight": edge_weight})
            if not signals.again(self, inputs, graph, graph._graph, edge_weight):
                key = signals.graph_key(graph, graph._graph, edge_weight)
                signals.note(self, "dgl", key, graph, _options, _checks,
                             (graph, graph._graph, edge_weight), inputs,
                             fresh=_formats_to_make(graph), same_as=_same_structure)
        if not _GRAPH_CONV_OK:
            return self._ic_fallback.forward(self, graph, feat, weight, edge_weight)
        return self._ic_run(graph, _instrumented_graph_conv_forward, feat, weight, edge_weight)


def _options(layer: Any) -> Dict[str, Any]:
    """What the advice reads of a GraphConv (core.meters.signals), at its first call."""
    return {"options": {"in_feats": layer._in_feats, "out_feats": layer._out_feats,
                        "norm": layer._norm, "allow_zero_in_degree": layer._allow_zero_in_degree}}


def _checks(graph: Any) -> Dict[str, Any]:
    """What the advice reads of a GraphConv's last graph, at the end."""
    return {"nodes": int(graph.num_dst_nodes()),
            "zero_in_degree_nodes": int((graph.in_degrees() == 0).sum())}


#: DGL's own lookup of the formats a graph has made (one FFI call, where ``formats()`` makes
#: two and a dict: docs/performance.md); ``formats()`` where it is gone.
_CREATED = getattr(dgl.heterograph_index, "_CAPI_DGLHeteroGetCreatedFormats", None)


def _formats_to_make(graph: Any) -> bool:
    """Whether a graph has sparse formats still to make (its first message passing makes
    them): read on a call given a graph not seen at the call before."""
    try:
        if _CREATED is not None:
            return len(_CREATED(graph._graph)) < 3  # (of COO, CSR and CSC)
        return bool(graph.formats()["not created"])
    except Exception:  # (a graph-like object without DGL's formats)
        return False


def _same_structure(a: Any, b: Any) -> bool:
    """Whether two graphs have the same nodes and edges, in the same order (a graph made
    anew, the same): read once, when the signals are."""
    if (a.num_src_nodes(), a.num_dst_nodes(), a.num_edges()) != (
        b.num_src_nodes(), b.num_dst_nodes(), b.num_edges()
    ):
        return False
    (us, vs), (ub, vb) = a.edges(), b.edges()
    return bool(th.equal(us, ub) and th.equal(vs, vb))


class EdgeWeightNorm(generic.Detailed, _StockEdgeWeightNorm):
    """``dgl.nn.EdgeWeightNorm`` with its steps timed (run it before ``GraphConv``)."""

    _ic_stock = _StockEdgeWeightNorm
    _ic_kind = "step" if _EDGE_WEIGHT_NORM_OK else "upstream"
    if not _EDGE_WEIGHT_NORM_OK:  # what the fallback times (see generic.fallback)
        _ic_fallback = generic.fallback(_StockEdgeWeightNorm, __name__)
        _ic_methods, _ic_handed = _ic_fallback._ic_methods, _ic_fallback._ic_handed

    def forward(self, graph: Any, edge_weight: th.Tensor) -> th.Tensor:
        """The stock forward with steps: positivity_check, init_weights, out_weight, in_weight,
        apply_edges."""
        if runs_stock(self):
            return super().forward(graph, edge_weight)
        if not _EDGE_WEIGHT_NORM_OK:
            return self._ic_fallback.forward(self, graph, edge_weight)
        return self._ic_run(graph, _instrumented_edge_weight_norm_forward, edge_weight)


# Called eagerly after a graph break inside a compiled call: Dynamo compiles the stock frame.
for _layer in (GraphConv, EdgeWeightNorm):
    skip_frame(_layer.forward)
