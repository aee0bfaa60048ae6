"""The skips each CI environment expects (:mod:`tests.skips` fails a run on any other): by
the label scripts/test.sh gives a run in ``INSTRUMENTED_CONVS_SKIPS``, regular expressions
that a skip's ``path: reason`` (as ``-rs`` shows it, no line number) must match whole."""

from __future__ import annotations

from typing import Dict, List

#: No GPU on the CI machine: the CUDA tests (their fakes run everywhere).
_NO_GPU = [r"tests/[a-z_]+\.py: needs a CUDA GPU"]
#: Lightning, TensorBoard and Jupyter are installed in the integrations environment alone.
_NO_INTEGRATIONS = [
    r"tests/helpers\.py: (IPython|lightning|nbformat|tensorboard|torchmetrics|nbclient)"
    r" is not installed \(scripts/env\.sh integrations\)",
    r"tests/test_layering\.py: could not import '(IPython|lightning)': .*",
]
#: torch-sparse is built beside the checks; its tests run last, marked ``sparse``.
_NO_SPARSE = [r"tests/[a-z_]+\.py: needs torch-sparse \(scripts/env\.sh sparse\): .*"]
#: Bad-input cases that an input kind cannot express.
_INPUT_KINDS = [
    r"tests/test_pyg\.py: a SparseTensor cannot hold an out-of-range index",
    r"tests/test_pyg\.py: not an edge_index",
]
#: The main environment's nvtx is newer than the oldest admitted (the DGL one's).
_NVTX = [r"tests/test_nvtx\.py: nvtx <= 0\.2\.11 has no DummyDomain"]

EXPECTED: Dict[str, List[str]] = {
    # torch 2.14.1, PyG 2.8.1, DGL 1.1.3: the main suite and the files beside it
    "main": _NO_GPU + _NO_INTEGRATIONS + _NVTX,
    # the same, the Python twin of the C fast path
    "pure": _NO_GPU
    + _NO_INTEGRATIONS
    + _NVTX
    + [
        r"tests/test_speedups\.py: the C extension is not in use",
        r"tests/test_speedups\.py: the Python twin is in use: entry\.REDUCTIONS alone",
    ],
    # the integrations' folder over main
    "integrations": _NO_GPU,
    # PyG 2.3 to 2.7 over main (requirements/pyg-matrix.txt)
    "pyg-matrix": _NO_GPU
    + _NO_INTEGRATIONS
    + _NO_SPARSE
    + _NVTX
    + _INPUT_KINDS
    + [
        r"tests/test_guard\.py: a PyG release of the version matrix",
        r"tests/test_guard\.py: the installed release already runs upstream's code: .*",
        r"tests/test_generic\.py: to_hetero fails with this PyG and torch: .*",
        r"tests/test_generic\.py: PyG < 2\.5 (scripts only layers made \.jittable\(\), stock or "
        r"ours|has only the written propagate)",
        r"tests/test_all_convs\.py: docs/layers\.md was generated with another torch_geometric "
        r"than .*",
    ],
    # the sparse-marked tests, torch-sparse built
    "sparse": _NO_GPU + _NO_INTEGRATIONS + _INPUT_KINDS,
    # torch 2.2.1, DGL 2.1.0, nvtx 0.2.17, no PyG, no matplotlib
    "dgl2": _NO_GPU
    + _NO_INTEGRATIONS
    + _NO_SPARSE
    + [
        r"tests/[a-z_]+\.py: needs torch_geometric",
        r"tests/[a-z_]+\.py: could not import '(torch_geometric|torch_geometric\.nn|"
        r"instrumented_convs\.pyg|matplotlib)': .*",
        r"tests/test_all_convs\.py: docs/layers\.md was generated with another dgl than .*",
        r"tests/test_compiled\.py: this torch has no compile callbacks .*",
        r"tests/test_compiled\.py: this torch's Dynamo cannot compile the stock DGL model .*",
        r"tests/test_corners\.py: this torch has no torch\.compiler\.set_stance",
        r"tests/test_memory\.py: torch < 2\.4 cannot tell whose hooks are on top",
        r"tests/test_memory\.py: torch\.compile skips frames under any dispatch mode before .*",
    ],
}
