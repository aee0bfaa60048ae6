"""Test cases for every PyTorch Geometric conv layer: build a layer, feed it, run it.

A parametrised test compares a subclass of a stock layer (an instrumented one) with the
stock class itself: the same constructor arguments (:attr:`Case.make`), the same
``state_dict`` (:func:`build_pair`), the same inputs (:attr:`Case.inputs`), and then
:func:`run` must give bit-identical outputs and gradients for both.

* :data:`CASES`: one or more cases per class of ``torch_geometric.nn.conv.__all__`` that
  exists in the installed PyG and can run here (a class missing in an older release, or a
  case needing a newer one, is simply absent);
* :data:`SKIP`: class name -> why that class cannot run here at all (abstract, an optional
  package missing, CUDA-only kernels), computed at import from what is installed.

All inputs are small (10 nodes, 8 features, 30 edges without self-loops, 16 output
channels), on the CPU, and come from a ``torch.Generator`` seeded with a constant, so every
call of ``case.inputs()`` returns equal tensors.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch_geometric
import torch_geometric.nn.conv as _conv
from torch.nn import Linear as Lin
from torch.nn import ReLU, Sequential
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor

from .helpers import gradients  # noqa: E402

__all__ = ["Case", "CASES", "SKIP", "run", "build_pair", "stock_class"]

#: The installed PyG release as a tuple, e.g. ``(2, 8, 1)``.
PYG_VERSION = tuple(int(p) for p in re.findall(r"\d+", torch_geometric.__version__)[:3])


@dataclass(frozen=True)
class Case:
    """One way of building and calling a layer of class ``torch_geometric.nn.conv.<name>``."""

    name: str  #: the class name in ``torch_geometric.nn.conv``, e.g. ``"SAGEConv"``
    id: str  #: a unique test id, e.g. ``"SAGEConv-bipartite"``
    make: Callable[[type], torch.nn.Module]  #: build a layer of the given class (or subclass)
    inputs: Callable[[], Tuple[tuple, dict]]  #: fresh, equal ``(args, kwargs)`` on every call
    grad_inputs: bool = True  #: whether floating-point input tensors should require grad
    sparse: bool = False  #: whether it needs torch_sparse (its tests carry the ``sparse`` mark)


# -- the data: one fixed random graph (and its variants), fresh tensors on every call ----------

N, F_IN, E, OUT, D = 10, 8, 30, 16, 4  # nodes, features, edges, output channels, edge_attr dim
NS, FS = 12, 6  # bipartite: source nodes and their features (the targets are the N nodes)
#: ``INSTRUMENTED_CONVS_CASES=cora`` (read at import): the graphs at Cora's size (2,708 nodes,
#: 10,556 edges; bipartite: 2,708 sources), for measurements (benchmarks/self_share.py); the
#: features keep their widths, the small extra graphs (hyperedges, meshes, types) their sizes.
SCALE = os.environ.get("INSTRUMENTED_CONVS_CASES", "small")
if SCALE == "cora":
    N, E, NS = 2708, 10556, 2708


def _edges(g: torch.Generator, n_src: int, n_dst: int, e: int, loops: bool = False) -> torch.Tensor:
    """``e`` distinct edges ``src -> dst`` (no self-loops unless ``loops``), sorted by source."""
    perm = torch.randperm(n_src * n_dst, generator=g)
    src, dst = perm // n_dst, perm % n_dst
    if not loops:
        perm = perm[src != dst]
    perm = perm[:e].sort().values
    return torch.stack([perm // n_dst, perm % n_dst])


class _Data:
    """Every tensor a case may use, drawn from one generator in a fixed order."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1234)
        randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
        self.x, self.x0 = randn(N, F_IN), randn(N, F_IN)
        self.edge_index = _edges(g, N, N, E)
        self.edge_weight = torch.rand(E, generator=g) + 0.5
        self.edge_attr = randn(E, D)
        self.edge_type = torch.randint(0, 3, (E,), generator=g)
        self.pos, self.normal = randn(N, 3), torch.nn.functional.normalize(randn(N, 3), dim=-1)
        self.x_src, self.bi_edge_index = randn(NS, FS), _edges(g, NS, N, E, loops=True)
        self.x_src8 = randn(NS, F_IN)  # bipartite sources with the targets' feature size
        self.neg_edge_index = _edges(g, N, N, 20)
        self.batch = torch.arange(N) * 2 // N  # two graphs of N / 2 nodes (5 at the small size)
        self.node_type = torch.arange(N) % 2
        self.x_seq = randn(N, 3, F_IN)  # DNAConv: the outputs of 3 earlier layers
        self.colors = torch.randint(0, 3, (N,), generator=g)  # WLConv
        # hypergraph: 4 hyperedges, node i in hyperedges i % 4 and (i // 3 + 1) % 4
        nodes = torch.arange(N).repeat(2)
        hyper = torch.cat([torch.arange(N) % 4, (torch.arange(N) // 3 + 1) % 4])
        self.hyperedge_index = torch.stack([nodes, hyper]).unique(dim=1)
        self.hyperedge_attr, self.hyperedge_weight = (
            randn(4, F_IN),
            torch.rand(4, generator=g) + 0.5,
        )
        # a MeshCNN edge adjacency: 12 mesh edges, 4 neighbouring edges each
        self.mesh_x = randn(12, F_IN)
        self.mesh_edge_index = torch.stack(
            [torch.arange(12).repeat_interleave(4), torch.randint(0, 12, (48,), generator=g)]
        )
        # heterogeneous graph: 10 papers (8 features), 6 authors (4 features)
        self.x_dict = {"paper": randn(N, F_IN), "author": randn(6, 4)}
        writes = _edges(g, 6, N, 15, loops=True)
        self.edge_index_dict = {
            ("paper", "cites", "paper"): _edges(g, N, N, 25),
            ("author", "writes", "paper"): writes,
            ("paper", "rev_writes", "author"): writes.flip(0),
        }

    def adj_t(self, weighted: bool = False, value: Any = None) -> SparseTensor:
        """The graph as a transposed ``torch_sparse.SparseTensor`` (optionally with values)."""
        row, col = self.edge_index
        value = self.edge_weight if weighted else value
        return SparseTensor(row=col, col=row, value=value, sparse_sizes=(N, N))

    def torch_sparse(self, layout: torch.layout = torch.sparse_coo) -> torch.Tensor:
        """The graph as a transposed ``torch.sparse`` adjacency (COO or CSR)."""
        from torch_geometric.utils import to_torch_coo_tensor

        adj = to_torch_coo_tensor(self.edge_index.flip(0), size=(N, N))
        return adj if layout == torch.sparse_coo else adj.to_sparse_csr()


_CACHED: List[_Data] = []


def _data() -> _Data:
    """Fresh data; at Cora's size the same data every time (drawing it takes ~1 s; the float
    tensors are new leaves anyway, :func:`run` detaches them)."""
    if SCALE != "cora":
        return _Data()
    if not _CACHED:
        _CACHED.append(_Data())
    return _CACHED[0]


METADATA = (["paper", "author"], list(_data().edge_index_dict))
HETERO_IN = {"paper": F_IN, "author": 4}


def _deg_hist() -> torch.Tensor:
    """PNAConv's in-degree histogram of the graph."""
    deg = torch.bincount(_data().edge_index[1], minlength=N)
    return torch.bincount(deg)


def _mlp(i: int, o: int, hidden: int = 16) -> torch.nn.Module:
    """A two-layer MLP ``i -> hidden -> o``."""
    return Sequential(Lin(i, hidden), ReLU(), Lin(hidden, o))


# -- the cases ---------------------------------------------------------------------------------

_ALL: List[Case] = []


def _case(
    name: str,
    tag: str,
    make: Callable[[type], torch.nn.Module],
    args: Callable[[_Data], tuple],
    kwargs: Callable[[_Data], dict] = None,
    since: Tuple[int, ...] = (0,),
    not_on: Tuple[int, int] = None,
    sparse: bool = False,
    grad_inputs: bool = True,
) -> None:
    """Add a case. ``since``: the first PyG release it runs on; ``not_on``: a minor line whose
    stock layer fails on it; ``sparse``: it needs torch_sparse (kept either way: its tests are
    marked ``sparse`` and skip, visibly, where torch_sparse is missing)."""
    if PYG_VERSION < since or PYG_VERSION[:2] == not_on:
        return

    def inputs() -> Tuple[tuple, dict]:
        d = _data()
        return tuple(args(d)), (kwargs(d) if kwargs else {})

    _ALL.append(Case(name, f"{name}-{tag}" if tag else name, make, inputs, grad_inputs, sparse))


# Arguments shared by many cases.
X_EI = lambda d: (d.x, d.edge_index)  # noqa: E731
X_EI_W = lambda d: (d.x, d.edge_index, d.edge_weight)  # noqa: E731
X_EI_A = lambda d: (d.x, d.edge_index, d.edge_attr)  # noqa: E731
X_EI_T = lambda d: (d.x, d.edge_index, d.edge_type)  # noqa: E731
X_ADJ = lambda d: (d.x, d.adj_t())  # noqa: E731
X_ADJ_W = lambda d: (d.x, d.adj_t(weighted=True))  # noqa: E731
BI = lambda d: ((d.x_src, d.x), d.bi_edge_index)  # noqa: E731
BI_SAME = lambda d: ((d.x_src8, d.x), d.bi_edge_index)  # noqa: E731  (same feature size)
X_POS = lambda d: (d.x, d.pos, d.edge_index)  # noqa: E731
X_SIGNED = lambda d: (d.x, d.edge_index, d.neg_edge_index)  # noqa: E731
X_X0 = lambda d: (d.x, d.x0, d.edge_index)  # noqa: E731
X_DICT = lambda d: (d.x_dict, d.edge_index_dict)  # noqa: E731
RET_ATT = lambda d: {"return_attention_weights": True}  # noqa: E731

# The most used layers, several inputs and options each.
_case("GCNConv", "", lambda c: c(F_IN, OUT), X_EI)
_case("GCNConv", "edge_weight", lambda c: c(F_IN, OUT, improved=True), X_EI_W)
_case("GCNConv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ_W, sparse=True)
_case("GCNConv", "torch_sparse_coo", lambda c: c(F_IN, OUT), lambda d: (d.x, d.torch_sparse()))
_case(
    "GCNConv",
    "cached-no-normalize",
    lambda c: c(F_IN, OUT, cached=True, normalize=False, add_self_loops=False),
    X_EI_W,
)
_case("SAGEConv", "", lambda c: c(F_IN, OUT), X_EI)
_case("SAGEConv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ, sparse=True)
_case(
    "SAGEConv",
    "torch_sparse_csr",
    lambda c: c(F_IN, OUT),
    lambda d: (d.x, d.torch_sparse(torch.sparse_csr)),
)
_case("SAGEConv", "bipartite", lambda c: c((FS, F_IN), OUT), BI)
_case("SAGEConv", "max", lambda c: c(F_IN, OUT, aggr="max"), X_EI)
_case("SAGEConv", "multi-aggr", lambda c: c(F_IN, OUT, aggr=["mean", "max", "std"]), X_EI)
_case("SAGEConv", "project-normalize", lambda c: c(F_IN, OUT, project=True, normalize=True), X_EI)
_case("SAGEConv", "lazy", lambda c: c((-1, -1), OUT), BI)
_case("GraphConv", "", lambda c: c(F_IN, OUT), X_EI_W)
_case("GraphConv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ_W, sparse=True)
_case("GraphConv", "bipartite", lambda c: c((FS, F_IN), OUT), BI)
_case("GraphConv", "mean", lambda c: c(F_IN, OUT, aggr="mean"), X_EI)
_case("GINConv", "", lambda c: c(_mlp(F_IN, OUT)), X_EI)
_case("GINConv", "adj_t", lambda c: c(_mlp(F_IN, OUT)), X_ADJ, sparse=True)
_case("GINConv", "bipartite", lambda c: c(_mlp(F_IN, OUT)), BI_SAME)
_case("GINConv", "train_eps", lambda c: c(_mlp(F_IN, OUT), eps=0.5, train_eps=True), X_EI)
_case("GINEConv", "edge_dim", lambda c: c(_mlp(F_IN, OUT), edge_dim=D, train_eps=True), X_EI_A)
_case(
    "GINEConv",
    "",
    lambda c: c(_mlp(F_IN, OUT)),
    lambda d: (d.x, d.edge_index, d.x0[d.edge_index[0]]),
)  # edge_attr of x's size
_case("GATConv", "", lambda c: c(F_IN, OUT), X_EI)
_case("GATConv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ, sparse=True)
_case("GATConv", "bipartite", lambda c: c((FS, F_IN), OUT, add_self_loops=False), BI)
_case("GATConv", "heads2-mean", lambda c: c(F_IN, OUT, heads=2, concat=False), X_EI)
_case("GATConv", "edge_dim", lambda c: c(F_IN, OUT, heads=2, edge_dim=D), X_EI_A)
_case("GATConv", "dropout", lambda c: c(F_IN, OUT, heads=2, dropout=0.5), X_EI)
_case("GATConv", "attention_weights", lambda c: c(F_IN, OUT, heads=2), X_EI, RET_ATT)
_case("GATConv", "attention_weights-adj_t", lambda c: c(F_IN, OUT), X_ADJ, RET_ATT, sparse=True)
_case("GATConv", "residual", lambda c: c(F_IN, OUT, heads=2, residual=True), X_EI, since=(2, 6))
_case("GATv2Conv", "", lambda c: c(F_IN, OUT), X_EI)
_case("GATv2Conv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ, sparse=True)
_case("GATv2Conv", "bipartite", lambda c: c((FS, F_IN), OUT, add_self_loops=False), BI)
_case("GATv2Conv", "edge_dim", lambda c: c(F_IN, OUT, heads=2, edge_dim=D), X_EI_A)
_case(
    "GATv2Conv",
    "share_weights-heads2-mean",
    lambda c: c(F_IN, OUT, heads=2, concat=False, share_weights=True),
    X_EI,
)
_case(
    "GATv2Conv",
    "attention_weights-dropout",
    lambda c: c(F_IN, OUT, heads=2, dropout=0.5),
    X_EI,
    RET_ATT,
)
_case("GATv2Conv", "residual", lambda c: c(F_IN, OUT, heads=2, residual=True), X_EI, since=(2, 6))
_case("TransformerConv", "", lambda c: c(F_IN, OUT, heads=2), X_EI)
_case("TransformerConv", "adj_t", lambda c: c(F_IN, OUT), X_ADJ, sparse=True)
_case("TransformerConv", "bipartite", lambda c: c((FS, F_IN), OUT), BI)
_case(
    "TransformerConv",
    "edge_dim-beta",
    lambda c: c(F_IN, OUT, heads=2, edge_dim=D, beta=True),
    X_EI_A,
)
_case(
    "TransformerConv",
    "heads2-mean-dropout",
    lambda c: c(F_IN, OUT, heads=2, concat=False, dropout=0.5),
    X_EI,
)
_case(
    "TransformerConv",
    "attention_weights",
    lambda c: c(F_IN, OUT, heads=2, root_weight=False),
    X_EI,
    RET_ATT,
)
_case("ChebConv", "", lambda c: c(F_IN, OUT, K=3), X_EI)
_case("ChebConv", "edge_weight", lambda c: c(F_IN, OUT, K=2), X_EI_W)
_case(
    "ChebConv",
    "rw-lambda_max",
    lambda c: c(F_IN, OUT, K=3, normalization="rw"),
    X_EI_W,
    lambda d: {"lambda_max": torch.tensor(1.8)},
)
_case(
    "ChebConv",
    "batch-lambda_max",
    lambda c: c(F_IN, OUT, K=2, normalization=None),
    X_EI_W,
    lambda d: {"batch": d.batch, "lambda_max": torch.tensor([1.5, 2.0])},
)

# Homogeneous graphs, plain or weighted edges.
_case("SimpleConv", "", lambda c: c("mean", combine_root="sum"), X_EI_W)
_case("SimpleConv", "self_loop", lambda c: c("max", combine_root="self_loop"), X_EI_W, since=(2, 4))
_case("SimpleConv", "cat", lambda c: c("sum", combine_root="cat"), X_EI)
_case("GatedGraphConv", "", lambda c: c(OUT, num_layers=2), X_EI_W)
_case("ResGatedGraphConv", "", lambda c: c(F_IN, OUT), X_EI)
_case("ResGatedGraphConv", "edge_dim", lambda c: c(F_IN, OUT, edge_dim=D), X_EI_A, since=(2, 4))
_case("AGNNConv", "", lambda c: c(requires_grad=True), X_EI)
_case("TAGConv", "", lambda c: c(F_IN, OUT, K=2), X_EI_W)
_case("ARMAConv", "", lambda c: c(F_IN, OUT, num_stacks=2, num_layers=2, dropout=0.25), X_EI_W)
_case("SGConv", "", lambda c: c(F_IN, OUT, K=2), X_EI_W)
_case("SSGConv", "", lambda c: c(F_IN, OUT, alpha=0.1, K=2), X_EI_W)
_case("APPNP", "", lambda c: c(K=3, alpha=0.1, dropout=0.2), X_EI_W)
_case("MFConv", "", lambda c: c(F_IN, OUT, max_degree=4), X_EI)
_case("DNAConv", "", lambda c: c(F_IN, heads=2, groups=2), lambda d: (d.x_seq, d.edge_index))
_case("FeaStConv", "", lambda c: c(F_IN, OUT, heads=2), X_EI)
_case("LEConv", "", lambda c: c(F_IN, OUT), X_EI_W)
_case("ClusterGCNConv", "", lambda c: c(F_IN, OUT, diag_lambda=0.5), X_EI)
_case(
    "GCN2Conv",
    "",
    lambda c: c(F_IN, alpha=0.1, theta=0.5, layer=1, shared_weights=False),
    lambda d: (d.x, d.x0, d.edge_index, d.edge_weight),
)
_case("FAConv", "", lambda c: c(F_IN, eps=0.2, dropout=0.1), X_X0)
_case("FAConv", "attention_weights", lambda c: c(F_IN), X_X0, RET_ATT)
_case(
    "EGConv",
    "",
    lambda c: c(F_IN, OUT, aggregators=["sum", "mean", "max", "symnorm"], num_heads=2, num_bases=2),
    X_EI,
)
_case("LGConv", "", lambda c: c(), X_EI_W)
_case("MixHopConv", "", lambda c: c(F_IN, OUT, powers=[0, 1, 2]), X_EI_W, since=(2, 4))
_case("WLConv", "", lambda c: c(), lambda d: (d.colors, d.edge_index))  # integer colours out
_case("WLConvContinuous", "", lambda c: c(), X_EI_W)
_case("SuperGATConv", "MX-sampled", lambda c: c(F_IN, OUT, heads=2, dropout=0.2), X_EI)
_case(
    "SuperGATConv",
    "SD-neg_edge_index",
    lambda c: c(F_IN, OUT, attention_type="SD", edge_sample_ratio=0.8),
    X_SIGNED,
)
_case("SignedConv", "first", lambda c: c(F_IN, OUT, first_aggr=True), X_SIGNED)
_case("SignedConv", "deeper", lambda c: c(F_IN // 2, OUT, first_aggr=False), X_SIGNED)
# PANConv builds a torch_sparse.SparseTensor from edge_index and returns one
_case("PANConv", "", lambda c: c(F_IN, OUT, filter_size=2), X_EI, sparse=True)
_case("EdgeConv", "", lambda c: c(_mlp(2 * F_IN, OUT)), X_EI)
_case("EdgeConv", "bipartite-mean", lambda c: c(_mlp(2 * F_IN, OUT), aggr="mean"), BI_SAME)

# Edge features.
_case("NNConv", "", lambda c: c(F_IN, OUT, _mlp(D, F_IN * OUT), aggr="mean"), X_EI_A)
_case("CGConv", "", lambda c: c(F_IN, dim=D), X_EI_A)
_case("CGConv", "batch_norm", lambda c: c(F_IN, dim=D, batch_norm=True), X_EI_A)
_case("GMMConv", "", lambda c: c(F_IN, OUT, dim=D, kernel_size=3), X_EI_A)
_case(
    "GMMConv",
    "separate_gaussians",
    lambda c: c(F_IN, OUT, dim=D, kernel_size=2, separate_gaussians=True),
    X_EI_A,
)
_case(
    "SplineConv",
    "",
    lambda c: c(F_IN, OUT, dim=2, kernel_size=3),  # pseudo-coordinates in [0, 1)
    lambda d: (d.x, d.edge_index, d.edge_weight.view(-1, 1).repeat(1, 2) % 1),
)
_case("PDNConv", "", lambda c: c(F_IN, OUT, edge_dim=D, hidden_channels=8), X_EI_A)
_case("GENConv", "softmax-edge_dim", lambda c: c(F_IN, OUT, learn_t=True, edge_dim=D), X_EI_A)
_case(
    "GENConv",
    "powermean-msg_norm",
    lambda c: c(
        F_IN, OUT, aggr="powermean", learn_p=True, msg_norm=True, learn_msg_scale=True, norm="layer"
    ),
    X_EI,
)
_case(
    "PNAConv",
    "",
    lambda c: c(
        F_IN,
        OUT,
        ["mean", "min", "max", "std"],
        ["identity", "amplification", "attenuation"],
        _deg_hist(),
        edge_dim=D,
        towers=2,
    ),
    X_EI_A,
)
# PyG 2.5's generated GeneralConv.propagate asserts edge_attr is not None.
_case("GeneralConv", "", lambda c: c(F_IN, OUT), X_EI, not_on=(2, 5))
_case("GeneralConv", "edge", lambda c: c(F_IN, OUT, in_edge_channels=D, aggr="mean"), X_EI_A)
_case(
    "GeneralConv",
    "attention-edge",
    lambda c: c(F_IN, OUT, in_edge_channels=D, heads=2, attention=True, skip_linear=True),
    X_EI_A,
)
_case(
    "HEATConv",
    "",
    lambda c: c(
        F_IN,
        OUT,
        num_node_types=2,
        num_edge_types=3,
        edge_type_emb_dim=4,
        edge_dim=D,
        edge_attr_emb_dim=4,
        heads=2,
    ),
    lambda d: (d.x, d.edge_index, d.node_type, d.edge_type, d.edge_attr),
)

# Relations (edge types).
_case("RGCNConv", "bases", lambda c: c(F_IN, OUT, num_relations=3, num_bases=2), X_EI_T)
_case("RGCNConv", "blocks", lambda c: c(F_IN, OUT, num_relations=3, num_blocks=2), X_EI_T)
_case(
    "RGCNConv",
    "featureless",
    lambda c: c(N, OUT, num_relations=3),
    lambda d: (None, d.edge_index, d.edge_type),
)
_case(
    "RGCNConv",
    "adj_t",
    lambda c: c(F_IN, OUT, num_relations=3),  # edge types as values
    lambda d: (d.x, d.adj_t(value=d.edge_type)),
    sparse=True,
)
_case("FastRGCNConv", "bases", lambda c: c(F_IN, OUT, num_relations=3, num_bases=2), X_EI_T)
_case("RGATConv", "", lambda c: c(F_IN, OUT, num_relations=3, heads=2), X_EI_T)
_case(
    "RGATConv",
    "within-edge_dim",
    lambda c: c(
        F_IN,
        OUT,
        num_relations=3,
        num_bases=2,
        edge_dim=D,
        attention_mechanism="within-relation",
        mod="additive",
    ),
    lambda d: (d.x, d.edge_index, d.edge_type, d.edge_attr),
)
_case("FiLMConv", "", lambda c: c(F_IN, OUT, num_relations=3), X_EI_T)

# Point clouds and meshes (positions, normals).
_case("PointNetConv", "", lambda c: c(_mlp(F_IN + 3, OUT), Lin(OUT, OUT)), X_POS)
_case("PointNetConv", "pos-only", lambda c: c(_mlp(3, OUT)), lambda d: (None, d.pos, d.edge_index))
_case(
    "PPFConv",
    "",
    lambda c: c(_mlp(F_IN + 4, OUT), Lin(OUT, OUT)),
    lambda d: (d.x, d.pos, d.normal, d.edge_index),
)
_case("PointTransformerConv", "", lambda c: c(F_IN, OUT), X_POS)
_case(
    "PointTransformerConv",
    "nns",
    lambda c: c(F_IN, OUT, pos_nn=_mlp(3, OUT), attn_nn=_mlp(OUT, OUT)),
    X_POS,
)
_case("PointGNNConv", "", lambda c: c(Lin(F_IN, 3), _mlp(3 + F_IN, F_IN), Lin(F_IN, F_IN)), X_POS)
_case(
    "GravNetConv",
    "",
    lambda c: c(F_IN, OUT, space_dimensions=3, propagate_dimensions=8, k=4),
    lambda d: (d.x, d.batch),
)
_case("DynamicEdgeConv", "", lambda c: c(_mlp(2 * F_IN, OUT), k=4), lambda d: (d.x, d.batch))
_case(
    "XConv",
    "",
    lambda c: c(F_IN, OUT, dim=3, kernel_size=4, hidden_channels=8),
    lambda d: (d.x, d.pos, d.batch),
)
_case("MeshCNNConv", "", lambda c: c(F_IN, OUT), lambda d: (d.mesh_x, d.mesh_edge_index))

# Hypergraphs.
_case(
    "HypergraphConv",
    "",
    lambda c: c(F_IN, OUT),
    lambda d: (d.x, d.hyperedge_index, d.hyperedge_weight),
)
_case(
    "HypergraphConv",
    "attention",
    lambda c: c(F_IN, OUT, use_attention=True, heads=2, dropout=0.2),
    lambda d: (d.x, d.hyperedge_index),
    lambda d: {"hyperedge_attr": d.hyperedge_attr},
)

# Heterogeneous graphs (dicts of node features and edge indices).
_case("HGTConv", "", lambda c: c(HETERO_IN, OUT, METADATA, heads=2), X_DICT)
_case("FastHGTConv", "", lambda c: c(HETERO_IN, OUT, METADATA, heads=2), X_DICT)  # PyG 2.3 only
_case("HANConv", "", lambda c: c(HETERO_IN, OUT, METADATA, heads=2, dropout=0.2), X_DICT)
_case(
    "HeteroConv",
    "sum",
    lambda c: c(
        {
            ("paper", "cites", "paper"): _conv.GCNConv(F_IN, OUT),
            ("author", "writes", "paper"): _conv.SAGEConv((4, F_IN), OUT),
            ("paper", "rev_writes", "author"): _conv.GATConv((F_IN, 4), OUT, add_self_loops=False),
        }
    ),
    X_DICT,
)
_case(
    "HeteroConv",
    "cat",
    lambda c: c(
        {
            ("paper", "cites", "paper"): _conv.GraphConv(F_IN, OUT),
            ("author", "writes", "paper"): _conv.GraphConv((4, F_IN), OUT),
            ("paper", "rev_writes", "author"): _conv.GATv2Conv(
                (F_IN, 4), OUT, add_self_loops=False
            ),
        },
        aggr="cat",
    ),
    X_DICT,
)

# Wrappers of another conv.
_case(
    "GPSConv",
    "",
    lambda c: c(F_IN, _conv.GINConv(_mlp(F_IN, F_IN)), heads=2, dropout=0.1),
    lambda d: (d.x, d.edge_index, d.batch),
)
_case(
    "GPSConv",
    "performer",
    lambda c: c(F_IN, _conv.GCNConv(F_IN, F_IN), heads=2, attn_type="performer"),
    lambda d: (d.x, d.edge_index, d.batch),
    since=(2, 4),
)
_case(
    "AntiSymmetricConv",
    "",
    lambda c: c(F_IN, _conv.GCNConv(F_IN, F_IN, bias=False), num_iters=2),
    X_EI,
)
_case("DirGNNConv", "", lambda c: c(_conv.SAGEConv(F_IN, OUT), alpha=0.3), X_EI)
_case("DirGNNConv", "gcn-no-root", lambda c: c(_conv.GCNConv(F_IN, OUT), root_weight=False), X_EI)


# -- what cannot run here ----------------------------------------------------------------------


def _cuda_only(package: str, what: str) -> str:
    """Why a layer built on CUDA-only kernels of ``package`` is skipped."""
    if importlib.util.find_spec(package) is None:
        return f"needs the optional package {package!r} ({what}, CUDA only), which is not installed"
    return f"{what}: CUDA-only kernels; these cases run on the CPU"


_OPTIONAL = ("GravNetConv", "DynamicEdgeConv", "XConv", "SplineConv")


def _skips() -> Dict[str, str]:
    """Class name -> why it cannot run here, in the order of ``__all__``."""
    skip = {
        "MessagePassing": "abstract base class of every conv layer; its subclasses are the cases"
    }
    for name in ("CuGraphSAGEConv", "CuGraphGATConv", "CuGraphRGCNConv"):
        skip[name] = _cuda_only("pylibcugraphops", "RAPIDS cugraph-ops")
    skip["FusedGATConv"] = _cuda_only("dgNN", "the dgNN fused GAT kernels")
    # Layers whose constructor raises ImportError without an optional package; PyG's message
    # names it (torch-cluster, torch-spline-conv, or pyg-lib>=0.6.0 since PyG 2.8). Only these
    # are built here: the first build of a class generates its propagate code (~50 ms).
    probed = set()
    for case in _ALL:
        if case.name not in _OPTIONAL or case.name in probed or not hasattr(_conv, case.name):
            continue
        probed.add(case.name)
        try:
            with torch.random.fork_rng(devices=[]):
                case.make(getattr(_conv, case.name))
        except ImportError as exc:
            skip[case.name] = (
                f"{exc} (optional package not installed; PyG {torch_geometric.__version__})"
            )
    return {name: skip[name] for name in _conv.__all__ if name in skip}


SKIP: Dict[str, str] = _skips()
CASES: List[Case] = [c for c in _ALL if c.name in _conv.__all__ and c.name not in SKIP]
assert len({c.id for c in CASES}) == len(CASES), "case ids must be unique"


# -- running a case ----------------------------------------------------------------------------


def stock_class(case: Case) -> type:
    """The stock PyG class the case is about."""
    return getattr(_conv, case.name)


def build_pair(case: Case, ours_cls: type) -> Tuple[torch.nn.Module, torch.nn.Module]:
    """``(stock, ours)``: both built by ``case.make`` after ``torch.manual_seed(0)``, ours then
    given the stock layer's ``state_dict``. Both stay in training mode: every training-mode
    random draw (dropout, edge dropout, negative sampling) is made deterministic by the seeds
    :func:`run` sets, so no case needs ``eval()``."""
    torch.manual_seed(0)
    stock = case.make(stock_class(case))
    torch.manual_seed(0)  # also equal whatever the state_dict does not hold
    ours = case.make(ours_cls)
    ours.load_state_dict(stock.state_dict())
    ours.train(stock.training)
    return stock, ours


def _prepare(obj: Any, grad: bool, leaves: List[torch.Tensor]) -> Any:
    """Inputs with every dense floating-point tensor a leaf requiring grad (when ``grad``)."""
    if isinstance(obj, torch.Tensor):
        if grad and obj.is_floating_point() and obj.layout == torch.strided:
            obj = obj.detach().requires_grad_(True)
            leaves.append(obj)
        return obj
    if isinstance(obj, (tuple, list)):
        return type(obj)(_prepare(o, grad, leaves) for o in obj)
    if isinstance(obj, dict):
        return {k: _prepare(v, grad, leaves) for k, v in obj.items()}
    return obj  # SparseTensor, None, numbers: left alone


def _flatten(obj: Any, key: str, out: Dict[str, torch.Tensor]) -> None:
    """Every tensor in ``obj`` (nested tuples, lists, dicts, sparse tensors) under ``key...``."""
    if obj is None:
        return
    if isinstance(obj, SparseTensor) and WITH_TORCH_SPARSE:
        row, col, value = obj.coo()
        for part, t in (("row", row), ("col", col), ("value", value)):
            _flatten(t, f"{key}.{part}", out)
    elif isinstance(obj, torch.Tensor) and obj.layout == torch.sparse_coo:
        _flatten(obj._indices(), f"{key}.indices", out)
        _flatten(obj._values(), f"{key}.values", out)
    elif isinstance(obj, torch.Tensor) and obj.layout == torch.sparse_csr:
        for part in ("crow_indices", "col_indices", "values"):
            _flatten(getattr(obj, part)(), f"{key}.{part}", out)
    elif isinstance(obj, torch.Tensor):
        out[key] = obj
    elif isinstance(obj, (tuple, list)):
        for i, o in enumerate(obj):
            _flatten(o, f"{key}.{i}", out)
    elif isinstance(obj, dict):
        for k, o in obj.items():
            _flatten(o, f"{key}.{'__'.join(k) if isinstance(k, tuple) else k}", out)
    else:
        raise TypeError(f"unexpected output type {type(obj).__name__} at {key}")


def run(module: torch.nn.Module, case: Case) -> Dict[str, torch.Tensor]:
    """Run forward + backward of ``module`` on ``case.inputs()``; return every tensor.

    The keys: ``out`` (or ``out.0``, ``out.1.value``, ``out.paper``... for tuples, lists,
    dicts and sparse tensors), ``grad.<parameter name>`` (``None`` grads skipped) and
    ``grad.input.<i>`` for the i-th floating-point input tensor (in the order of args, then
    kwargs, depth first) that required grad. The loss is, over the floating-point outputs
    that require grad, the sum of ``(out.float() * w).sum()`` with ``w`` a fixed
    ``linspace(-1, 1)`` of the output's shape. Torch's and Python's random generators are
    seeded with 0 right before forward (dropout; SuperGATConv's negative sampling uses
    ``random.sample``).
    """
    args, kwargs = case.inputs()
    leaves: List[torch.Tensor] = []
    args = _prepare(args, case.grad_inputs, leaves)
    kwargs = _prepare(kwargs, case.grad_inputs, leaves)
    module.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    random.seed(0)
    outputs: Dict[str, torch.Tensor] = {}
    _flatten(module(*args, **kwargs), "out", outputs)
    losses = [
        (o.float() * torch.linspace(-1, 1, o.numel()).view(o.shape)).sum()
        for o in outputs.values()
        if o.is_floating_point() and o.requires_grad
    ]
    if losses:
        torch.stack(losses).sum().backward()
    result = {k: v.detach() for k, v in outputs.items()}
    result.update(gradients(module, leaves))
    return result
