"""Test cases for every conv module of ``dgl.nn.pytorch.conv``: a table and a runner.

A parametrised test compares an instrumented subclass against the stock class::

    stock, ours = build_pair(case, OursCls)
    expected, got = run(stock, case), run(ours, case)   # equal keys, torch.equal tensors

:data:`CASES` holds one or more :class:`Case` per class of ``dgl.nn.pytorch.conv.__all__``
that this DGL has and that can run here (CPU, float32, small graphs with self-loops);
:data:`SKIP` names the classes that cannot, with the reason. Import this module only after
``pytest.importorskip("dgl")``: it imports dgl (with ``DGLBACKEND=pytorch``).

Every ``inputs()`` builds its graph and tensors afresh from generators seeded with constants,
so two calls return equal inputs. Every case runs bit-for-bit the same, run after run, on
CPU with DGL 1.1.3 and 2.1.0. Things to know about some stock layers:

* ``GroupRevRes`` frees its input features' storage in forward and rebuilds them (by
  inversion) in backward, and frees its output's storage in backward: :func:`run` clones
  outputs before ``backward``. It splits every extra forward argument along its last dim.
* ``TWIRLSUnfoldingAndAttention`` writes ``w``, ``deg``, ``h``... into the graph it is given
  (no ``local_scope``); ``TWIRLSConv`` does not (it works on a copy with self-loops).
* ``SGConv(cached=True)``, and ``TWIRLSConv`` with no MLP before its propagation, keep their
  first result on the module; ``HGTConv`` and ``RelGraphConv`` set ``self.presorted`` in
  forward; layers with BatchNorm (``EdgeConv``, ``PNAConv``, ``DGNConv``, ``TWIRLSConv``,
  ``GatedGCNConv``) update running stats. Layers stay in training mode, so dropout runs:
  :func:`run` seeds it.
* Stock bugs avoided: ``DenseChebConv`` without ``lambda_max`` calls ``torch.eig`` (gone in
  torch 2); ``EGATConv(bias=False)`` fails in ``reset_parameters``; ``DGNConv`` with no
  ``dir`` aggregator fails (its message reads ``eig_vec``); ``EGNNConv`` gives NaN
  coordinate gradients on self-loops (so its cases use :func:`loopless`).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

import torch
from torch import nn

os.environ.setdefault("DGLBACKEND", "pytorch")
import dgl  # noqa: E402
import dgl.nn.pytorch.conv as dglconv  # noqa: E402

from .helpers import gradients  # noqa: E402

__all__ = ["Case", "CASES", "SKIP", "EXTRA", "run", "build_pair", "stock_class"]


@dataclass(frozen=True)
class Case:
    """One way to build and call a conv layer of ``dgl.nn.pytorch.conv``."""

    name: str  #: class name in ``dgl.nn.pytorch.conv``, e.g. ``"SAGEConv"``
    id: str  #: unique test id, e.g. ``"SAGEConv-gcn"``
    make: Callable[[type], nn.Module]  #: build a layer of the given class (stock or subclass)
    inputs: Callable[[], Tuple[tuple, dict]]  #: fresh deterministic ``(args, kwargs)``
    grad_inputs: bool = True  #: make float input tensors leaves that require grad


# --------------------------------------------------------------------------- graphs and inputs
#: ``INSTRUMENTED_CONVS_CASES=cora`` (read at import) puts every graph at Cora's size (2,708
#: nodes, 10,556 edges, self-loops included; bipartite: 2,708 sources, 1,354 targets), for
#: measurements (benchmarks/self_share.py); the features keep their widths. The default:
#: N, E = 10, 40 (30 random edges plus a self-loop on every node), N_SRC, N_DST = 9, 6
#: (24 random edges plus one into every target).
SCALE = os.environ.get("INSTRUMENTED_CONVS_CASES", "small")
if SCALE == "cora":
    N, E, N_SRC, N_DST, BR = 2708, 10556, 2708, 1354, 3924
else:
    N, E, N_SRC, N_DST, BR = 10, 40, 9, 6, 24
R = E - N  # the random edges of graph() and loopless(); bigraph() has BR, plus N_DST


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _edges() -> Tuple[torch.Tensor, torch.Tensor]:
    g = _gen(0)
    src, dst = torch.randint(0, N, (R,), generator=g), torch.randint(0, N, (R,), generator=g)
    return torch.cat([src, torch.arange(N)]), torch.cat([dst, torch.arange(N)])


def graph() -> dgl.DGLGraph:
    """The homogeneous graph: N nodes, E edges, every node has a self-loop."""
    return dgl.graph(_edges(), num_nodes=N)


def loopless() -> dgl.DGLGraph:
    """N nodes, E edges, no self-loop: R random edges plus the ring i -> i+1."""
    g = _gen(0)
    src = torch.cat([torch.randint(0, N, (R,), generator=g), torch.arange(N)])
    step = torch.cat([torch.randint(1, N, (R,), generator=g), torch.ones(N, dtype=torch.long)])
    dst = (src + step) % N
    return dgl.graph((src, dst), num_nodes=N)


def bigraph() -> dgl.DGLGraph:
    """A uni-bipartite heterograph user -> game; every game has an in-edge."""
    g = _gen(0)
    src = torch.cat([torch.randint(0, N_SRC, (BR,), generator=g), torch.arange(N_DST)])
    dst = torch.cat([torch.randint(0, N_DST, (BR,), generator=g), torch.arange(N_DST)])
    return dgl.heterograph(
        {("user", "plays", "game"): (src, dst)}, num_nodes_dict={"user": N_SRC, "game": N_DST}
    )


def block() -> dgl.DGLGraph:
    """A message-flow block: all in-edges of nodes 0..N_DST-1 of :func:`graph`."""
    seeds = torch.arange(N_DST)
    return dgl.to_block(dgl.in_subgraph(graph(), seeds), dst_nodes=seeds)


def heterograph() -> dgl.DGLGraph:
    """Two node types and three relations, one within a type: ``HeteroGraphConv``'s input."""
    g = _gen(0)

    def edges(n_src: int, n_dst: int) -> Tuple[torch.Tensor, torch.Tensor]:
        src = torch.cat([torch.randint(0, n_src, (BR,), generator=g), torch.arange(n_src)])
        dst = torch.cat([torch.randint(0, n_dst, (BR,), generator=g), torch.arange(n_src) % n_dst])
        return src, dst

    plays, follows = edges(N_SRC, N_DST), edges(N_SRC, N_SRC)
    played = edges(N_DST, N_SRC)
    return dgl.heterograph(
        {
            ("user", "plays", "game"): plays,
            ("user", "follows", "user"): follows,
            ("game", "played-by", "user"): played,
        },
        num_nodes_dict={"user": N_SRC, "game": N_DST},
    )


B_SRC = block().num_src_nodes()  # source nodes of block()
BI_E = N_DST + BR  # edges of bigraph()


def adjacency() -> torch.Tensor:
    """The dense (N, N) adjacency of :func:`graph` (``adj[src, dst]``, multi-edges counted)."""
    src, dst = _edges()
    return torch.zeros(N, N).index_put_((src, dst), torch.ones(E), accumulate=True)


def _ints(n: int, high: int, seed: int = 3, *, sort: bool = False) -> Callable[[], torch.Tensor]:
    def draw():
        t = torch.randint(0, high, (n,), generator=_gen(seed))
        return t.sort().values if sort else t

    return draw


def _pos(*shape: int, seed: int = 2) -> Callable[[], torch.Tensor]:
    """Positive values in [0.1, 1.1) (edge weights, distances)."""
    return lambda: torch.rand(*shape, generator=_gen(seed)) + 0.1


def _on(make_graph: Any, *specs: Any, **kwargs: Any) -> Callable[[], Tuple[tuple, dict]]:
    """``inputs`` for ``forward(make_graph(), *specs, **kwargs)`` (no graph if ``make_graph``
    is None): a tuple spec becomes a ``randn`` tensor of that shape (one generator seeded 1,
    in order), a list a tuple of those, a callable is called, anything else passes as is."""

    def inputs():
        gen = _gen(1)

        def value(spec):
            if isinstance(spec, tuple):
                return torch.randn(*spec, generator=gen)
            if isinstance(spec, list):
                return tuple(value(s) for s in spec)
            return spec() if callable(spec) else spec

        args = (make_graph(),) if make_graph is not None else ()
        return args + tuple(value(s) for s in specs), {k: value(v) for k, v in kwargs.items()}

    return inputs


# --------------------------------------------------------------------------- the table
_relu = torch.relu
X, X16 = (N, 8), (N, 16)  # node features of graph()
XB, XB8 = [(N_SRC, 8), (N_DST, 5)], [(N_SRC, 8), (N_DST, 8)]  # (src, dst) features of bigraph()
EW = _pos(E)  # positive edge weights of graph()
_C: List[Case] = []


def _case(name: str, tag: str, make: Callable[[type], nn.Module], inputs, grad_inputs: bool = True):
    _C.append(Case(name, f"{name}-{tag}", make, inputs, grad_inputs))


# GraphConv / EdgeWeightNorm
for norm in ["both", "left", "right", "none"]:
    _case("GraphConv", norm, lambda c, n=norm: c(8, 16, norm=n, activation=_relu), _on(graph, X))
_case("GraphConv", "edge_weight", lambda c: c(8, 16), _on(graph, X, edge_weight=EW))
_case(
    "GraphConv",
    "edge_weight-none",
    lambda c: c(16, 8, norm="none"),
    _on(graph, X16, edge_weight=(E,)),
)
_case(
    "GraphConv", "external_weight", lambda c: c(8, 16, weight=False), _on(graph, X, weight=(8, 16))
)
_case("GraphConv", "bipartite", lambda c: c(8, 16, norm="right"), _on(bigraph, XB8))
_case("GraphConv", "block", lambda c: c(8, 4, bias=False), _on(block, (B_SRC, 8)))
for norm in ["both", "right", "left"]:
    _case("EdgeWeightNorm", norm, lambda c, n=norm: c(norm=n), _on(graph, EW))
_case("EdgeWeightNorm", "eps", lambda c: c(norm="right", eps=0.5), _on(bigraph, _pos(BI_E)))

# SAGEConv
for agg in ["mean", "gcn", "pool", "lstm"]:
    _case("SAGEConv", agg, lambda c, a=agg: c(8, 16, a, activation=_relu), _on(graph, X))
    d = 8 if agg == "gcn" else 6  # gcn adds dst features to the neighbours' mean
    _case(
        "SAGEConv",
        f"{agg}-block",
        lambda c, a=agg, d=d: c((8, d), 16, a),
        _on(block, [(B_SRC, 8), (N_DST, d)]),
    )
_case(
    "SAGEConv",
    "mean-dropout-norm",
    lambda c: c(8, 16, "mean", feat_drop=0.3, norm=nn.LayerNorm(16)),
    _on(graph, X),
)
_case("SAGEConv", "mean-edge_weight", lambda c: c(8, 16, "mean"), _on(graph, X, edge_weight=EW))
_case(
    "SAGEConv",
    "pool-edge_weight",
    lambda c: c(8, 4, "pool", bias=False),
    _on(graph, X, edge_weight=EW),
)

# GATConv / GATv2Conv / DotGatConv / AGNNConv
_case("GATConv", "heads", lambda c: c(8, 6, num_heads=3), _on(graph, X))
_case(
    "GATConv",
    "residual-attention",
    lambda c: c(8, 6, 3, residual=True, activation=_relu),
    _on(graph, X, get_attention=True),
)
_case("GATConv", "dropout", lambda c: c(8, 6, 2, feat_drop=0.2, attn_drop=0.3), _on(graph, X))
_case(
    "GATConv",
    "bipartite",
    lambda c: c((8, 5), 6, 2, residual=True),
    _on(bigraph, XB, get_attention=True),
)
_case("GATConv", "block", lambda c: c(8, 6, 2, residual=True), _on(block, (B_SRC, 8)))
_case("GATConv", "edge_weight", lambda c: c(8, 6, 2, bias=False), _on(graph, X, edge_weight=EW))
_case("GATv2Conv", "heads", lambda c: c(8, 6, 3, activation=_relu), _on(graph, X))
_case(
    "GATv2Conv",
    "share-residual-attention",
    lambda c: c(8, 6, 2, residual=True, share_weights=True),
    _on(graph, X, get_attention=True),
)
_case(
    "GATv2Conv",
    "bipartite-dropout",
    lambda c: c((8, 5), 6, 2, feat_drop=0.2, attn_drop=0.2, residual=True),
    _on(bigraph, XB),
)
_case("DotGatConv", "heads", lambda c: c(8, 6, 3), _on(graph, X, get_attention=True))
_case("DotGatConv", "bipartite", lambda c: c((8, 5), 6, 2), _on(bigraph, XB))
_case("AGNNConv", "learn_beta", lambda c: c(init_beta=0.5), _on(graph, X))
_case("AGNNConv", "bipartite", lambda c: c(learn_beta=False), _on(bigraph, XB8))

# GINConv / GINEConv
for agg in ["sum", "max", "mean"]:
    _case("GINConv", f"linear-{agg}", lambda c, a=agg: c(nn.Linear(8, 16), a), _on(graph, X))
_case(
    "GINConv",
    "learn_eps",
    lambda c: c(nn.Linear(8, 16), "sum", init_eps=0.1, learn_eps=True, activation=_relu),
    _on(graph, X),
)
_case("GINConv", "edge_weight", lambda c: c(None, "sum"), _on(graph, X, edge_weight=EW))
_case(
    "GINConv", "bipartite", lambda c: c(nn.Linear(8, 4), "mean", learn_eps=True), _on(bigraph, XB8)
)
_case("GINEConv", "linear", lambda c: c(nn.Linear(8, 16)), _on(graph, X, (E, 8)))
_case(
    "GINEConv",
    "learn_eps",
    lambda c: c(nn.Linear(8, 16), init_eps=0.2, learn_eps=True),
    _on(graph, X, (E, 8)),
)

# Polynomial / propagation filters
_case("TAGConv", "k2", lambda c: c(8, 16, k=2, activation=_relu), _on(graph, X))
_case("TAGConv", "edge_weight", lambda c: c(8, 16, k=3, bias=False), _on(graph, X, edge_weight=EW))
_case("SGConv", "k2", lambda c: c(8, 16, k=2), _on(graph, X))
_case(
    "SGConv",
    "edge_weight-norm",
    lambda c: c(8, 16, k=3, norm=nn.LayerNorm(8)),
    _on(graph, X, edge_weight=EW),
)
# Cached layers keep their first result on the module; with inputs requiring grad, a second
# run on the same module would backpropagate through the first run's freed graph.
_case("SGConv", "cached", lambda c: c(8, 16, k=2, cached=True), _on(graph, X), grad_inputs=False)
_case("APPNPConv", "k3", lambda c: c(k=3, alpha=0.1), _on(graph, X))
_case("APPNPConv", "edge_drop", lambda c: c(k=2, alpha=0.2, edge_drop=0.3), _on(graph, X))
_case("APPNPConv", "edge_weight", lambda c: c(k=2, alpha=0.2), _on(graph, X, edge_weight=EW))
_case("ChebConv", "default_lambda", lambda c: c(8, 16, k=3), _on(graph, X))
_case(
    "ChebConv",
    "lambda_list",
    lambda c: c(8, 16, k=2, activation=None),
    _on(graph, X, lambda_max=lambda: [1.7]),
)
_case(
    "ChebConv",
    "lambda_tensor",
    lambda c: c(8, 16, k=4, bias=False),
    _on(graph, X, lambda_max=lambda: torch.tensor([1.9])),
)
_case(
    "GCN2Conv",
    "project",
    lambda c: c(8, layer=2, alpha=0.2, lambda_=1.0, activation=_relu),
    _on(graph, X, X),
)
_case(
    "GCN2Conv",
    "shared-edge_weight",
    lambda c: c(8, layer=1, project_initial_features=False),
    _on(graph, X, X, edge_weight=EW),
)

# Edge features, pseudo-coordinates, distances
for agg in ["mean", "sum", "max"]:
    _case(
        "NNConv",
        agg,
        lambda c, a=agg: c(8, 6, nn.Linear(4, 48), a, residual=(a == "mean")),
        _on(graph, X, (E, 4)),
    )
_case(
    "NNConv",
    "bipartite",
    lambda c: c((8, 5), 6, nn.Linear(4, 48), "sum", residual=True),
    _on(bigraph, XB, (BI_E, 4)),
)
for agg in ["sum", "mean", "max"]:
    _case(
        "GMMConv",
        agg,
        lambda c, a=agg: c(8, 16, 3, 4, aggregator_type=a, residual=(a == "sum")),
        _on(graph, X, (E, 3)),
    )
_case("CFConv", "homogeneous", lambda c: c(8, 4, 12, 6), _on(graph, X, (E, 4)))
_case("CFConv", "bipartite", lambda c: c(8, 4, 12, 6), _on(bigraph, XB8, (BI_E, 4)))
# (EGATConv(bias=False) fails in DGL 1.1.3 and 2.1.0: reset_parameters inits a None bias)
_case(
    "EGATConv",
    "attention",
    lambda c: c(8, 4, 6, 5, num_heads=3),
    _on(graph, X, (E, 4), get_attention=True),
)
_case("EGATConv", "edge_weight", lambda c: c(8, 4, 6, 5, 2), _on(graph, X, (E, 4), edge_weight=EW))
_case("EGATConv", "bipartite", lambda c: c((8, 5), 4, 6, 5, 2), _on(bigraph, XB, (BI_E, 4)))
_case(
    "EdgeGATConv",
    "attention",
    lambda c: c(8, 4, 6, num_heads=3),
    _on(graph, X, (E, 4), get_attention=True),
)
_case(
    "EdgeGATConv",
    "dropout-no_residual",
    lambda c: c(8, 4, 6, 2, feat_drop=0.2, attn_drop=0.2, residual=False, activation=_relu),
    _on(graph, X, (E, 4)),
)
_case("EdgeGATConv", "bipartite", lambda c: c((8, 5), 4, 6, 2), _on(bigraph, XB, (BI_E, 4)))
_case("EdgeConv", "plain", lambda c: c(8, 16), _on(graph, X))
_case("EdgeConv", "batch_norm", lambda c: c(8, 16, batch_norm=True), _on(graph, X))
_case("EdgeConv", "bipartite", lambda c: c(8, 6), _on(bigraph, XB8))
_T = torch.tensor
_case(
    "AtomicConv",
    "features_to_use",  # atom types compared with features_to_use: no grad to them
    lambda c: c(
        _T([2.0, 3.0, 4.0]),
        _T([0.5, 1.0, 1.5]),
        _T([1.0, 0.5, 2.0]),
        features_to_use=_T([1.0, 6.0, 8.0]),
    ),
    _on(graph, lambda: _T([1.0, 6.0, 8.0, 7.0])[_ints(N, 4)()].unsqueeze(1), _pos(E, 1)),
)
_case(
    "AtomicConv",
    "plain",
    lambda c: c(_T([1.5, 2.5]), _T([0.5, 1.0]), _T([1.0, 2.0])),
    _on(graph, (N, 1), _pos(E, 1)),
)
# EGNNConv on a self-loop: |x_i - x_i| = 0 and d sqrt(0) makes the coordinates' grad NaN
_case(
    "EGNNConv",
    "edge_feat",
    lambda c: c(8, 12, 6, edge_feat_size=3),
    _on(loopless, X, (N, 3), (E, 3)),
)
_case("EGNNConv", "plain", lambda c: c(8, 12, 6), _on(loopless, X, (N, 3)))

# Relational / heterogeneous (integer type tensors)
_case(
    "GatedGraphConv",
    "etypes",
    lambda c: c(8, 16, n_steps=3, n_etypes=3),
    _on(graph, X, _ints(E, 3)),
)
_case("GatedGraphConv", "single", lambda c: c(16, 16, 2, 1, bias=False), _on(graph, X16))
_case(
    "RelGraphConv",
    "basis",
    lambda c: c(8, 16, 3, regularizer="basis", num_bases=2, activation=_relu),
    _on(graph, X, _ints(E, 3)),
)
_case(
    "RelGraphConv",
    "bdd-norm",
    lambda c: c(8, 16, 3, regularizer="bdd", num_bases=4, layer_norm=True, dropout=0.2),
    _on(graph, X, _ints(E, 3), (E, 1)),
)
_case(
    "RelGraphConv",
    "none-presorted",
    lambda c: c(8, 6, 3, self_loop=False),
    _on(graph, X, _ints(E, 3, sort=True), presorted=True),
)
_case(
    "HGTConv",
    "norm",
    lambda c: c(8, 4, 2, num_ntypes=3, num_etypes=4, use_norm=True),
    _on(graph, X, _ints(N, 3, seed=4), _ints(E, 4)),
)
_case(
    "HGTConv",
    "residual_w-presorted",
    lambda c: c(6, 4, 2, 2, 3, dropout=0.0),
    _on(graph, (N, 6), _ints(N, 2, seed=4, sort=True), _ints(E, 3, sort=True), presorted=True),
)

# Principal neighbourhood aggregation
_PNA = ["mean", "max", "min", "sum", "std", "var", "moment3"]
_SCALERS = ["identity", "amplification", "attenuation"]
_case(
    "PNAConv",
    "towers-edge_feat",
    lambda c: c(8, 8, _PNA, _SCALERS, 2.5, dropout=0.2, num_towers=2, edge_feat_size=3),
    _on(graph, X, (E, 3)),
)
_case(
    "PNAConv",
    "plain",
    lambda c: c(8, 6, ["mean", "max", "moment4"], ["identity"], 1.5),
    _on(graph, X),
)
_case(
    "DGNConv",
    "dir-towers-edge_feat",
    lambda c: c(
        8,
        8,
        ["dir1-av", "dir1-dx", "dir2-av", "sum"],
        _SCALERS[:2],
        2.5,
        num_towers=2,
        edge_feat_size=3,
    ),
    _on(graph, X, (E, 3), eig_vec=(N, 2)),
)
# (with no "dir" aggregator, DGNConv in DGL 1.1.3 and 2.1.0 fails: its message reads eig_vec)
_case(
    "DGNConv",
    "dx-max",
    lambda c: c(8, 6, ["dir1-dx", "max"], ["attenuation"], 2.0),
    _on(graph, X, eig_vec=(N, 1)),
)

# Dense (adjacency-matrix inputs; DenseChebConv always gets lambda_max)
_case("DenseGraphConv", "both", lambda c: c(8, 16, activation=_relu), _on(None, adjacency, X))
_case(
    "DenseGraphConv", "left", lambda c: c(8, 16, norm="left", bias=False), _on(None, adjacency, X)
)
_case("DenseSAGEConv", "plain", lambda c: c(8, 16), _on(None, adjacency, X))
_case(
    "DenseSAGEConv",
    "dropout-norm",
    lambda c: c(8, 16, feat_drop=0.3, norm=nn.LayerNorm(16), activation=_relu),
    _on(None, adjacency, X),
)
_case("DenseChebConv", "k3", lambda c: c(8, 16, k=3), _on(None, adjacency, X, 2.0))
_case(
    "DenseChebConv",
    "k2-tensor",
    lambda c: c(8, 16, k=2, bias=False),
    _on(None, adjacency, X, lambda: torch.tensor(1.6)),
)

# TWIRLS
_case(
    "TWIRLSConv",
    "attention",
    lambda c: c(8, 6, 12, 4, attention=True, use_eta=True, dropout=0.1),
    _on(graph, X),
)
_case(
    "TWIRLSConv",
    "batch_norm-noprecond",
    lambda c: c(
        8,
        6,
        12,
        3,
        num_mlp_before=2,
        norm="batch",
        precond=False,
        attn_bef=True,
        attention=True,
        attn_dropout=0.2,
        inp_dropout=0.1,
    ),
    _on(graph, X),
)
_case(
    "TWIRLSConv",
    "cacheable",
    lambda c: c(8, 6, 12, 2, num_mlp_before=0, alp=0.5),
    _on(graph, X),
    grad_inputs=False,
)
_case(
    "TWIRLSUnfoldingAndAttention",
    "attention",
    lambda c: c(8, alp=0, lam=1, prop_step=4, attn_aft=2, use_eta=True, init_att=True),
    _on(graph, X),
)
_case(
    "TWIRLSUnfoldingAndAttention",
    "noprecond",
    lambda c: c(8, 0.5, 2, 3, attn_aft=1, T=5.0, attn_dropout=0.2, precond=False),
    _on(graph, X),
)

# Wrappers
_case("GroupRevRes", "graphconv", lambda c: c(dglconv.GraphConv(4, 4), groups=2), _on(graph, X))
# extra args are split along their last dim like the features: edge features (E, 9) for GINE
_case(
    "GroupRevRes",
    "gineconv-edge_feat",
    lambda c: c(dglconv.GINEConv(nn.Linear(3, 3), learn_eps=True), groups=3),
    _on(graph, (N, 9), (E, 9)),
)

# Only in newer DGL (2.x)
_case("GatedGCNConv", "residual", lambda c: c(8, 8, 8, dropout=0.2), _on(graph, X, (E, 8)))
_case("GatedGCNConv", "plain", lambda c: c(8, 4, 6, batch_norm=False), _on(graph, X, (E, 4)))


# HeteroGraphConv (dgl.nn, not a conv module: EXTRA), a module per relation
def _hetero_inputs() -> Tuple[tuple, dict]:
    gen = _gen(1)
    feats = {
        "user": torch.randn(N_SRC, 8, generator=gen),
        "game": torch.randn(N_DST, 8, generator=gen),
    }
    return (heterograph(), feats), {}


def _per_relation(keys: Tuple[Any, ...]) -> Callable[[], Dict[Any, nn.Module]]:
    def mods():
        convs = [dglconv.GraphConv(8, 4), dglconv.SAGEConv(8, 4, "mean"), dglconv.GraphConv(8, 4)]
        return dict(zip(keys, convs))

    return mods


_ETYPES = ("plays", "follows", "played-by")
_CANONICAL = (("user", "plays", "game"), ("user", "follows", "user"), ("game", "played-by", "user"))
for agg in ["sum", "stack"]:
    _case(
        "HeteroGraphConv",
        agg,
        lambda c, a=agg: c(_per_relation(_ETYPES)(), aggregate=a),
        _hetero_inputs,
    )
_case(
    "HeteroGraphConv",
    "canonical",
    lambda c: c(_per_relation(_CANONICAL)(), aggregate="mean"),
    _hetero_inputs,
)

#: Classes of ``dgl.nn`` outside its conv module that get a case: their stock class.
EXTRA: Dict[str, type] = {"HeteroGraphConv": dgl.nn.pytorch.HeteroGraphConv}

SKIP: Dict[str, str] = {}
for _name in ("CuGraphGATConv", "CuGraphRelGraphConv", "CuGraphSAGEConv"):
    if _name not in dglconv.__all__:
        continue
    if not getattr(sys.modules[getattr(dglconv, _name).__module__], "HAS_PYLIBCUGRAPHOPS", False):
        SKIP[_name] = (
            "needs pylibcugraphops (not installed: the constructor raises "
            "ModuleNotFoundError) and a CUDA GPU"
        )
    elif not torch.cuda.is_available():
        SKIP[_name] = "needs a CUDA GPU (cugraph-ops kernels have no CPU path)"
    else:
        SKIP[_name] = "no case: cugraph-ops kernels are CUDA-only and this table runs on CPU"
for _name in sorted(set(dglconv.__all__) - {c.name for c in _C} - set(SKIP)):
    SKIP[_name] = f"no case in tests/conv_cases_dgl.py for this class of DGL {dgl.__version__}"

#: The cases of the classes this DGL has, less those in SKIP.
CASES: List[Case] = [
    c for c in _C if (c.name in dglconv.__all__ or c.name in EXTRA) and c.name not in SKIP
]
assert len({c.id for c in CASES}) == len(CASES), "duplicate case ids"
del _name, norm, agg, d


# --------------------------------------------------------------------------- runner
def stock_class(case: Case) -> type:
    """The stock class of ``case``: ``dgl.nn.pytorch.conv.<case.name>`` (or :data:`EXTRA`'s)."""
    return EXTRA[case.name] if case.name in EXTRA else getattr(dglconv, case.name)


def build_pair(case: Case, ours_cls: type) -> Tuple[nn.Module, nn.Module]:
    """``(stock, ours)``: the stock layer built after ``torch.manual_seed(0)``, and one of
    ``ours_cls`` with the stock layer's state dict loaded and the same train/eval mode."""
    torch.manual_seed(0)
    stock = case.make(stock_class(case))
    ours = case.make(ours_cls)
    ours.load_state_dict(stock.state_dict())
    ours.train(stock.training)
    return stock, ours


def _requiring_grad(obj: Any, leaves: List[torch.Tensor]) -> Any:
    """``obj`` with every float tensor (in tuples, lists, dicts) replaced by a leaf that
    requires grad, appended to ``leaves`` in traversal order (dicts in key order)."""
    if isinstance(obj, torch.Tensor) and obj.is_floating_point():
        leaf = obj.detach().requires_grad_()
        leaves.append(leaf)
        return leaf
    if isinstance(obj, (tuple, list)):
        return type(obj)(_requiring_grad(o, leaves) for o in obj)
    if isinstance(obj, dict):
        return {k: _requiring_grad(obj[k], leaves) for k in sorted(obj, key=str)}
    return obj


def _tensors(obj: Any) -> List[torch.Tensor]:
    """The tensors in ``obj`` (nested tuples/lists/dicts; dicts in key order)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for k in sorted(obj, key=str) for t in _tensors(obj[k])]
    return []


def _weight(t: torch.Tensor) -> torch.Tensor:
    """A fixed, non-uniform loss weight shaped like ``t``."""
    return torch.linspace(-1.0, 2.0, t.numel(), device=t.device).reshape(t.shape)


def run(module: nn.Module, case: Case) -> Dict[str, torch.Tensor]:
    """Forward and backward of ``module`` on ``case.inputs()``.

    Float input tensors become leaves requiring grad (if ``case.grad_inputs``);
    ``torch.manual_seed(0)`` comes right before forward; the loss is the sum over float
    outputs requiring grad of ``(out.float() * w).sum()`` with a fixed weight ``w``.
    Returns clones of every output tensor (``out.<i>``), of the grad of every parameter that
    got one (``grad.<name>``) and of every float input's grad (``grad.input.<i>``, numbered
    over the float inputs in order: args, then kwargs by name).
    """
    args, kwargs = case.inputs()
    leaves: List[torch.Tensor] = []
    if case.grad_inputs:
        args = _requiring_grad(args, leaves)
        kwargs = _requiring_grad(kwargs, leaves)
    torch.manual_seed(0)
    outs = _tensors(module(*args, **kwargs))
    result = {f"out.{i}": o.detach().clone() for i, o in enumerate(outs)}
    terms = [
        (o.float() * _weight(o)).sum() for o in outs if o.is_floating_point() and o.requires_grad
    ]
    if terms:
        torch.stack(terms).sum().backward()
    result.update(gradients(module, leaves))
    return result
