"""PyG's ``GCNConv`` and ``gcn_norm`` with every internal step timed (the steps: docs/pyg.rst).

``forward`` is a copy of upstream's with steps around each part, calling upstream's own
functions. At import the installed PyG's code is checked against the fingerprints the copies
match (:data:`KNOWN`); where it differs, the layer warns once and runs upstream's code, timed
from outside (:data:`DETAILED`).
"""
import logging
from typing import Any, Dict, Optional

import torch
import torch_geometric
from torch import Tensor
from torch_geometric.nn.conv import GCNConv as _StockGCNConv
from torch_geometric.nn.conv import gcn_conv as _gcn_module
from torch_geometric.nn.conv.gcn_conv import gcn_norm as _stock_gcn_norm
from torch_geometric.typing import Adj, OptTensor, SparseTensor, torch_sparse
from torch_geometric.utils import (
    add_remaining_self_loops,
    is_torch_sparse_tensor,
    scatter,
    to_edge_index,
)
from torch_geometric.utils import add_self_loops as add_self_loops_fn
from torch_geometric.utils.num_nodes import maybe_num_nodes
from torch_geometric.utils.sparse import set_sparse_value

from ..core.compiler.dynamo import skip_frame
from ..core.settings import switches
from ..core.steps.step import Step, mark_outputs, recording
from ..layers.generic import install, runs_stock, uninstall
from ..layers.guard import guard, warn_fallback
from ..layers.statements.routes import Route
from . import signals
from .generic import DetailedPyG

__all__ = ["GCNConv", "gcn_norm", "DETAILED"]

logger = logging.getLogger(__name__)

# The steps of forward and gcn_norm, built once: both check recording() on entry and then
# enter these directly (a step() call per use would cost a function call and a lookup).
_GCN_NORM = Step("gcn_norm")
_LIN = Step("lin")
_PROPAGATE = Step("propagate")
_BIAS = Step("bias")
_FILL_VALUE = Step("fill_value")
_FILL_DIAG = Step("fill_diag")
_DEGREE = Step("degree")
_NORMALIZE = Step("normalize")
_ADD_SELF_LOOPS = Step("add_self_loops")
_TO_EDGE_INDEX = Step("to_edge_index")
_ADD_REMAINING_SELF_LOOPS = Step("add_remaining_self_loops")


# -- the copies: upstream's code (PyG 2.8.1) with `with <step>:` blocks, nothing else --------
# (gcn_norm here, GCNConv.forward as GCNConv._instrumented_forward)
# tests/test_guard.py strips the step blocks and compares the syntax tree with the installed
# upstream's; at import, _guard.guard() checks the installed upstream against the known
# fingerprints below and the layer falls back to upstream's own code where they differ.

def _instrumented_gcn_norm(  # noqa: F811
    edge_index: Adj,
    edge_weight: OptTensor = None,
    num_nodes: Optional[int] = None,
    improved: bool = False,
    add_self_loops: bool = True,
    flow: str = "source_to_target",
    dtype: Optional[torch.dtype] = None,
):
    fill_value = 2. if improved else 1.

    if isinstance(edge_index, SparseTensor):
        assert edge_index.size(0) == edge_index.size(1)

        adj_t = edge_index

        if not adj_t.has_value():
            with _FILL_VALUE:
                adj_t = adj_t.fill_value(1., dtype=dtype)
        if add_self_loops:
            with _FILL_DIAG:
                adj_t = torch_sparse.fill_diag(adj_t, fill_value)

        with _DEGREE:
            deg = torch_sparse.sum(adj_t, dim=1)
        with _NORMALIZE:
            deg_inv_sqrt = deg.pow_(-0.5)
            deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0.)
            adj_t = torch_sparse.mul(adj_t, deg_inv_sqrt.view(-1, 1))
            adj_t = torch_sparse.mul(adj_t, deg_inv_sqrt.view(1, -1))

        return adj_t

    if is_torch_sparse_tensor(edge_index):
        assert edge_index.size(0) == edge_index.size(1)

        if edge_index.layout == torch.sparse_csc:
            raise NotImplementedError("Sparse CSC matrices are not yet "
                                      "supported in 'gcn_norm'")

        adj_t = edge_index
        if add_self_loops:
            with _ADD_SELF_LOOPS:
                adj_t, _ = add_self_loops_fn(adj_t, None, fill_value, num_nodes)

        with _TO_EDGE_INDEX:
            edge_index, value = to_edge_index(adj_t)
        col, row = edge_index[0], edge_index[1]

        with _DEGREE:
            deg = scatter(value, col, 0, dim_size=num_nodes, reduce='sum')
        with _NORMALIZE:
            deg_inv_sqrt = deg.pow_(-0.5)
            deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
            value = deg_inv_sqrt[row] * value * deg_inv_sqrt[col]

            return set_sparse_value(adj_t, value), None

    assert flow in ['source_to_target', 'target_to_source']
    num_nodes = maybe_num_nodes(edge_index, num_nodes)

    if add_self_loops:
        with _ADD_REMAINING_SELF_LOOPS:
            edge_index, edge_weight = add_remaining_self_loops(
                edge_index, edge_weight, fill_value, num_nodes)

    with _DEGREE:
        if edge_weight is None:
            edge_weight = torch.ones((edge_index.size(1), ), dtype=dtype,
                                     device=edge_index.device)

        row, col = edge_index[0], edge_index[1]
        idx = col if flow == 'source_to_target' else row
        deg = scatter(edge_weight, idx, dim=0, dim_size=num_nodes, reduce='sum')
    with _NORMALIZE:
        deg_inv_sqrt = deg.pow_(-0.5)
        deg_inv_sqrt.masked_fill_(deg_inv_sqrt == float('inf'), 0)
        edge_weight = deg_inv_sqrt[row] * edge_weight * deg_inv_sqrt[col]

    return edge_index, edge_weight


#: Fingerprints of the upstream functions our copies match (see layers.guard.fingerprint), and
#: the PyG releases they were seen in.
KNOWN: Dict[str, Dict[str, str]] = {
    "gcn_norm": {"5d72ad43712542ad": "2.3.1 2.4.0 2.5.3 2.6.1 2.7.0 2.8.1"},
    "GCNConv.forward": {"d720b5fbf312ce02": "2.5.3 2.6.1 2.7.0 2.8.1"},
}

_GUARDS = (
    guard("gcn_norm", _stock_gcn_norm, KNOWN["gcn_norm"], globals()),
    guard("GCNConv.forward", _StockGCNConv.forward, KNOWN["GCNConv.forward"], globals(),
          replaced=("gcn_norm",)),
)
_GCN_NORM_OK, _FORWARD_OK = (g.ok for g in _GUARDS)
#: Whether each copied upstream function runs instrumented (True) or falls back to
#: upstream's own code (False: the installed PyG differs from the copy).
DETAILED: Dict[str, bool] = {g.name: g.ok for g in _GUARDS}
warn_fallback(logger, "GCNConv", "torch_geometric", torch_geometric.__version__, list(_GUARDS),
              "its parts are timed from outside, the bias in its own time"
              if not _FORWARD_OK else "gcn_norm is one step")


def gcn_norm(
    edge_index: Adj,
    edge_weight: OptTensor = None,
    num_nodes: Optional[int] = None,
    improved: bool = False,
    add_self_loops: bool = True,
    flow: str = "source_to_target",
    dtype: Optional[torch.dtype] = None,
) -> Any:
    """Upstream ``torch_geometric.nn.conv.gcn_conv.gcn_norm``, with a step per part."""
    if not recording() or not _GCN_NORM_OK:
        return _stock_gcn_norm(edge_index, edge_weight, num_nodes, improved, add_self_loops,
                               flow, dtype)
    return _instrumented_gcn_norm(edge_index, edge_weight, num_nodes, improved, add_self_loops,
                                  flow, dtype)


def _timed_gcn_norm(original: Any, *args: Any, **kwargs: Any) -> Any:
    """``gcn_norm`` as upstream's forward calls it in a fallback call: ours, in its step."""
    with _GCN_NORM:
        return gcn_norm(*args, **kwargs)


_ROUTE = Route(_gcn_module, "gcn_norm", _timed_gcn_norm)


class GCNConv(DetailedPyG, _StockGCNConv):
    """``torch_geometric.nn.GCNConv`` with its internal steps timed (a true drop-in): the
    graph convolutional operator from the `"Semi-supervised Classification with Graph
    Convolutional Networks" <https://arxiv.org/abs/1609.02907>`_ paper."""

    # PyG generates ``propagate`` from this class's *source*: it finds the call
    # ``self.propagate(...)`` after stripping comments with a regex that also eats the rest
    # of any line holding a hash sign. So: no hash sign inside strings of this class, and
    # no mention of that call in its strings before the real one.

    _ic_stock = _StockGCNConv
    _ic_kind = "step" if _FORWARD_OK else "upstream"

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        """The stock forward, with its steps recorded (docs/pyg.rst lists them)."""
        if runs_stock(self) or not isinstance(x, Tensor):
            return super().forward(x, edge_index, edge_weight)
        if switches.advise:
            inputs = ((x, edge_index, edge_weight), {})
            signals.note_call(self, edge_index, edge_weight, x.size(self.node_dim), inputs)
        if not _FORWARD_OK:
            return self._upstream_forward(x, edge_index, edge_weight)
        undo = install(self, children=False)  # PyG's collect, message, aggregate... as steps
        try:
            with self._ic_step(x.device):
                return mark_outputs(self._instrumented_forward(x, edge_index, edge_weight))
        finally:
            uninstall(undo)

    def _upstream_forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor) -> Tensor:
        """The fallback: upstream's forward in the layer's step (kind ``upstream``), its parts
        timed from outside (``gcn_norm`` routed, ``lin``, message passing; see the top)."""
        undo = install(self, children=True, methods=self._ic_fallback_methods)
        try:
            with self._ic_step(x.device), _ROUTE.active():
                return mark_outputs(super().forward(x, edge_index, edge_weight))
        finally:
            uninstall(undo)

    # The copy of upstream's GCNConv.forward. It stays in this class: PyG reads the call of
    # propagate and its type comment from the source of the class, cached by class name
    # (ours is GCNConv too), so it never reads them from the stock class.
    def _instrumented_forward(self, x: Tensor, edge_index: Adj,
                              edge_weight: OptTensor = None) -> Tensor:

        if isinstance(x, (tuple, list)):
            raise ValueError(f"'{self.__class__.__name__}' received a tuple "
                             f"of node features as input while this layer "
                             f"does not support bipartite message passing. "
                             f"Please try other layers such as 'SAGEConv' or "
                             f"'GraphConv' instead")

        if self.normalize:
            if isinstance(edge_index, Tensor):
                cache = self._cached_edge_index
                if cache is None:
                    with _GCN_NORM:
                        edge_index, edge_weight = gcn_norm(  # yapf: disable
                            edge_index, edge_weight, x.size(self.node_dim),
                            self.improved, self.add_self_loops, self.flow, x.dtype)
                    if self.cached:
                        self._cached_edge_index = (edge_index, edge_weight)
                else:
                    edge_index, edge_weight = cache[0], cache[1]

            elif isinstance(edge_index, SparseTensor):
                cache = self._cached_adj_t
                if cache is None:
                    with _GCN_NORM:
                        edge_index = gcn_norm(  # yapf: disable
                            edge_index, edge_weight, x.size(self.node_dim),
                            self.improved, self.add_self_loops, self.flow, x.dtype)
                    if self.cached:
                        self._cached_adj_t = edge_index
                else:
                    edge_index = cache

        with _LIN:
            x = self.lin(x)

        # propagate_type: (x: Tensor, edge_weight: OptTensor)
        with _PROPAGATE:
            out = self.propagate(edge_index, x=x, edge_weight=edge_weight)

        if self.bias is not None:
            with _BIAS:
                out = out + self.bias

        return out


skip_frame(GCNConv.forward)  # called after a graph break: Dynamo compiles the stock frame
