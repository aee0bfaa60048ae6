"""DGL layers with every internal step timed: ``GraphConv`` and ``EdgeWeightNorm``.

``from instrumented_convs.dgl import GraphConv`` instead of ``from dgl.nn import
GraphConv``; nothing else changes. Each class subclasses the stock one (same constructor,
parameters, ``state_dict``, ``extra_repr``); its ``forward`` is upstream's (identical from
DGL 1.1 through 2.4) with steps around each part. The steps of one ``GraphConv`` forward,
nested as they run::

    GraphConv
      zero_in_degree_check      (graph.in_degrees() == 0).any(): a device-to-host copy
      norm_src                  norm "left"/"both": source-side degree normalisation
        degrees                 graph.out_degrees().to(feat).clamp(min=1)
        pow                     degs ** -0.5 ("both") or 1 / degs ("left")
        mul                     feat_src * norm
      matmul                    feat @ W, before update_all when in_feats > out_feats ...
      update_all                message copy_u (or u_mul_e with edge_weight) + sum
      matmul                    ... or after it otherwise
      norm_dst                  norm "right"/"both": degrees, pow, mul on the destination side
      bias
      activation

While instrumentation is disabled, or while ``torch.compile`` traces the layer, ``forward``
runs the stock layer's code.
"""
from typing import Any, Optional

import torch as th
from dgl import function as fn
from dgl.base import DGLError
from dgl.convert import block_to_graph
from dgl.heterograph import DGLBlock
from dgl.nn.pytorch import EdgeWeightNorm as _StockEdgeWeightNorm
from dgl.nn.pytorch import GraphConv as _StockGraphConv
from dgl.transforms import reverse
from dgl.utils import expand_as_pair

from ._layers import instance_scope, layer_step, share_state
from ._step import Step, instrumenting

__all__ = ["GraphConv", "EdgeWeightNorm"]

# The steps of the forwards, built once: forward checks instrumenting() on entry and then
# enters these directly (a step() call per use would cost a function call and a lookup).
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
_OUT_WEIGHT = Step("out_weight")
_IN_WEIGHT = Step("in_weight")
_APPLY_EDGES = Step("apply_edges")


def _normalize(value: th.Tensor, like: th.Tensor, degrees_fn: Any, both: bool) -> th.Tensor:
    """Upstream's degree normalisation of one side, as degrees / pow / mul steps.

    Multiplies ``value`` by the norm; like upstream, the degrees take the dtype, device and
    rank of ``like`` (the side's input features), which differs from ``value`` on the
    destination side under autocast (``value`` is then the half-precision matmul output).
    """
    with _DEGREES:
        degs = degrees_fn().to(like).clamp(min=1)
    with _POW:
        if both:
            norm = th.pow(degs, -0.5)
        else:
            norm = 1.0 / degs
    with _MUL:
        shp = norm.shape + (1,) * (like.dim() - 1)
        norm = th.reshape(norm, shp)
        return value * norm


class GraphConv(_StockGraphConv):
    """``dgl.nn.GraphConv`` with its internal steps timed (a true drop-in)."""

    def __init__(
        self,
        in_feats: int,
        out_feats: int,
        norm: str = "both",
        weight: bool = True,
        bias: bool = True,
        activation: Optional[Any] = None,
        allow_zero_in_degree: bool = False,
    ) -> None:
        """Same arguments as the stock layer; the instance gets its own default scope."""
        super().__init__(in_feats, out_feats, norm=norm, weight=weight, bias=bias,
                         activation=activation, allow_zero_in_degree=allow_zero_in_degree)
        self._ic_scope = instance_scope("GraphConv")

    def forward(self, graph: Any, feat: Any, weight: Optional[th.Tensor] = None,
                edge_weight: Optional[th.Tensor] = None) -> th.Tensor:
        """The stock forward, with the steps of the module docstring recorded."""
        if not instrumenting():
            return super().forward(graph, feat, weight=weight, edge_weight=edge_weight)
        with layer_step(self, "GraphConv", graph.device):
            with graph.local_scope():
                if not self._allow_zero_in_degree:
                    with _ZERO_IN_DEGREE_CHECK:
                        has_zero = bool((graph.in_degrees() == 0).any())
                    if has_zero:
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
                    assert edge_weight.shape[0] == graph.num_edges()
                    graph.edata["_edge_weight"] = edge_weight
                    aggregate_fn = fn.u_mul_e("h", "_edge_weight", "m")

                feat_src, feat_dst = expand_as_pair(feat, graph)
                if self._norm in ["left", "both"]:
                    with _NORM_SRC:
                        feat_src = _normalize(feat_src, feat_src, graph.out_degrees, self._norm == "both")

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
                    graph.srcdata["h"] = feat_src
                    with _UPDATE_ALL:
                        graph.update_all(aggregate_fn, fn.sum(msg="m", out="h"))
                    rst = graph.dstdata["h"]
                else:
                    # aggregate first then mult W
                    graph.srcdata["h"] = feat_src
                    with _UPDATE_ALL:
                        graph.update_all(aggregate_fn, fn.sum(msg="m", out="h"))
                    rst = graph.dstdata["h"]
                    if weight is not None:
                        with _MATMUL:
                            rst = th.matmul(rst, weight)

                if self._norm in ["right", "both"]:
                    with _NORM_DST:
                        rst = _normalize(rst, feat_dst, graph.in_degrees, self._norm == "both")

                if self.bias is not None:
                    with _BIAS:
                        rst = rst + self.bias

                if self._activation is not None:
                    with _ACTIVATION:
                        rst = self._activation(rst)

                return rst

    def to_stock(self) -> _StockGraphConv:
        """A stock ``dgl.nn.GraphConv`` sharing this layer's parameters."""
        stock = _StockGraphConv(self._in_feats, self._out_feats, norm=self._norm,
                                weight=self.weight is not None, bias=self.bias is not None,
                                activation=self._activation,
                                allow_zero_in_degree=self._allow_zero_in_degree)
        return share_state(self, stock, ("weight", "bias"))

    @classmethod
    def from_stock(cls, layer: _StockGraphConv) -> "GraphConv":
        """An instrumented layer sharing the parameters of a stock ``GraphConv``."""
        ours = cls(layer._in_feats, layer._out_feats, norm=layer._norm,
                   weight=layer.weight is not None, bias=layer.bias is not None,
                   activation=layer._activation,
                   allow_zero_in_degree=layer._allow_zero_in_degree)
        return share_state(layer, ours, ("weight", "bias"))


class EdgeWeightNorm(_StockEdgeWeightNorm):
    """``dgl.nn.EdgeWeightNorm`` with its steps timed (run it before ``GraphConv``)."""

    def __init__(self, norm: str = "both", eps: float = 0.0) -> None:
        """Same arguments as the stock module."""
        super().__init__(norm=norm, eps=eps)
        self._ic_scope = instance_scope("EdgeWeightNorm")

    def forward(self, graph: Any, edge_weight: th.Tensor) -> th.Tensor:
        """The stock forward with steps: positivity_check, out_weight, in_weight, apply_edges."""
        if not instrumenting():
            return super().forward(graph, edge_weight)
        with layer_step(self, "EdgeWeightNorm", graph.device):
            with graph.local_scope():
                if isinstance(graph, DGLBlock):
                    graph = block_to_graph(graph)
                if len(edge_weight.shape) > 1:
                    raise DGLError(
                        "Currently the normalization is only defined "
                        "on scalar edge weight. Please customize the "
                        "normalization for your high-dimensional weights."
                    )
                if self._norm == "both":
                    with _POSITIVITY_CHECK:
                        non_positive = th.any(edge_weight <= 0).item()
                    if non_positive:
                        raise DGLError(
                            'Non-positive edge weight detected with `norm="both"`. '
                            "This leads to square root of zero or negative values."
                        )

                dev = graph.device
                dtype = edge_weight.dtype
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
