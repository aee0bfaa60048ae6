"""What one op costs (FLOPs, bytes read, bytes written) from its arguments' shapes: the least
the op must do, as a roofline model counts it. The counters call :func:`cost`; an op with no
formula is *unknown*, listed by name, never counted as zero. The formulas, op by op:
docs/roofline.md.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

__all__ = [
    "cost",
    "dgl_cost",
    "nbytes",
    "storages",
    "tensors",
    "FREE",
    "FORMULAS",
    "EXTENSIONS",
    "Cost",
]

Cost = Tuple[int, int, int]  # FLOPs, bytes read, bytes written
Formula = Callable[[Any, Dict[str, Any], Any], Cost]


def tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    """The tensors among ``values``, and in the lists and tuples among them."""
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def storages(t: torch.Tensor) -> List[Any]:
    """The storages holding ``t``'s data (a sparse tensor's indices and values)."""
    if t.layout == torch.strided:
        return [t.untyped_storage()]
    if t.layout == torch.sparse_coo:
        return [t._indices().untyped_storage(), t._values().untyped_storage()]
    if t.layout == torch.sparse_csr:
        parts = (t.crow_indices(), t.col_indices(), t.values())
    elif t.layout == torch.sparse_csc:
        parts = (t.ccol_indices(), t.row_indices(), t.values())
    else:
        return []
    return [p.untyped_storage() for p in parts]


def nbytes(t: torch.Tensor) -> int:
    """Bytes a tensor's elements take (a sparse tensor: its indices and values; a broadcast
    view: the elements it holds, not the ones it repeats)."""
    if t.layout == torch.sparse_coo:
        return nbytes(t._indices()) + nbytes(t._values())
    if t.layout in (torch.sparse_csr, torch.sparse_csc):
        idx = (
            (t.crow_indices(), t.col_indices())
            if t.layout == torch.sparse_csr
            else (t.ccol_indices(), t.row_indices())
        )
        return sum(nbytes(i) for i in idx) + nbytes(t.values())
    n = 1  # a broadcast view (stride 0, as ``expand`` makes) holds one element per place
    for size, stride in zip(t.shape, t.stride()):
        if stride:
            n *= size
    return n * t.element_size()


def _read(args: Any) -> int:
    return sum(nbytes(t) for t in tensors(args))


def _out(out: Any) -> int:
    return _read(out if isinstance(out, (list, tuple)) else (out,))


def _numel(out: Any) -> int:
    return sum(t.numel() for t in tensors(out if isinstance(out, (list, tuple)) else (out,)))


def _nnz(t: torch.Tensor) -> int:
    return t._nnz() if t.layout != torch.strided else t.numel()


def _mm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``a @ b``: ``2*n*k*m`` dense; sparse ``a`` (n x k): ``2*nnz*m``; sparse ``b`` (k x m):
    ``2*nnz*n`` (each stored element meets every row of the dense ``a``); both sparse: two
    per pair of stored elements that meet (column ``j`` of ``a`` with row ``j`` of ``b``)."""
    a, b = args[0], args[1]
    sparse_a, sparse_b = a.layout != torch.strided, b.layout != torch.strided
    if sparse_a and sparse_b:
        flops = 2 * int((_per_index(a, 1, a.shape[1]) * _per_index(b, 0, b.shape[0])).sum())
    elif sparse_a or sparse_b:
        flops = 2 * _nnz(a) * b.shape[1] if sparse_a else 2 * _nnz(b) * a.shape[0]
    else:
        flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
    return flops, _read(args[:2]), _out(out)


def _per_index(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """How many stored elements sparse ``t`` has at each index of dimension ``dim``."""
    if t.layout == torch.sparse_csr:
        return t.crow_indices().diff() if dim == 0 else torch.bincount(t.col_indices(), None, size)
    t = t if t.layout == torch.sparse_coo else t.to_sparse_coo()
    return torch.bincount(t._indices()[dim], minlength=size)


def _addmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``addmm(c, a, b)``, ``baddbmm``: the product, plus an add per result element."""
    flops, read, written = (_bmm if args[1].dim() == 3 else _mm)(args[1:], kwargs, out)
    return flops + _numel(out), read + _read(args[:1]), written


def _spmm_reduce_backward(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``_sparse_mm_reduce_impl_backward(self, grad_out, weight, reduce, arg_out, mask)``:
    ``2*nnz*m`` FLOPs per gradient asked for; reads the sparse operand, the gradient, the
    dense operand where the values' gradient is asked (``grad_out[i] . weight[j]``)."""
    sparse, grad, weight = args[0], args[1], args[2]
    mask = args[5] if len(args) > 5 else (True, True)
    read = _read((sparse, grad, weight if mask[0] else None, args[4]))
    return 2 * _nnz(sparse) * grad.shape[-1] * sum(map(bool, mask)), read, _out(out)


def _bmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    return 2 * args[0].numel() * args[1].shape[2], _read(args[:2]), _out(out)  # b*n*k by k*m


def _gather(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """Reads the gathered elements (as many as it writes) and the index."""
    index = [t for t in tensors(args[1:]) if not t.is_floating_point()]
    return 0, _out(out) + sum(nbytes(i) for i in index), _out(out)


def _scatter(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``scatter_add(self, dim, index, src)`` and kin: one FLOP per element of the source
    (the last tensor argument); reads the destination, the index and the source."""
    dest, *rest = tensors(args)
    return rest[-1].numel(), nbytes(dest) + sum(nbytes(t) for t in rest), _out(out)


def _scatter_copy(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``index_put_(self, indices, values, accumulate)``, ``index_copy``, ``scatter``: a copy
    (no FLOPs, the destination not read) unless it accumulates or reduces (then as above)."""
    if args[-1] is True or isinstance(args[-1], str) or {"accumulate", "reduce"} & set(kwargs):
        return _scatter(args, kwargs, out)
    _, *rest = tensors(args)
    return 0, sum(nbytes(t) for t in rest), _out(out)


def _nll_loss(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``nll_loss_forward(logp, target, weight, ...)``: per sample its picked value (and
    weight) read and summed (weighted: one more FLOP); writes the loss and total weight."""
    logp, target, weight = args[0], args[1], args[2] if len(args) > 2 else None
    n = target.numel()
    picked = n * logp.element_size() + (n * weight.element_size() if weight is not None else 0)
    return n * (2 if weight is not None else 1), nbytes(target) + picked, _out(out)


def _nll_loss_backward(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``nll_loss_backward(grad, logp, target, weight, _, _, total_weight)``: a FLOP a sample;
    reads those (a weight a sample), writes the whole zero-filled gradient."""
    grad, target, weight, total = args[0], args[2], args[3], args[6]
    picked = target.numel() * weight.element_size() if weight is not None else 0
    return target.numel(), _read((grad, target, total)) + picked, _out(out)


def _spmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """torch-sparse's ``spmm_sum(row, rowptr, col, value, colptr, csr2csc, mat)``,
    ``spmm_mean`` (``rowcount`` before ``colptr``; a division per result element too),
    ``spmm_min/max(rowptr, col, value, mat)``."""
    rowptr, col, value, mat = args if len(args) == 4 else (args[1], args[2], args[3], args[-1])
    flops = (2 if value is not None else 1) * col.numel() * (mat.numel() // mat.shape[-2])
    flops += _numel(out) if len(args) == 8 else 0  # spmm_mean's division
    return flops, _read((rowptr, col, value, mat)), _out(out)


# Formulas on one line: (args, kwargs, out) -> (FLOPs, bytes read, bytes written).
_elementwise: Formula = lambda a, k, o: (_numel(o), _read(list(a) + list(k.values())), _out(o))  # noqa: E731
_reduction: Formula = lambda a, k, o: (next(tensors(a)).numel(), _read(a[:1]), _out(o))  # noqa: E731
_segment: Formula = lambda a, k, o: (next(tensors(a)).numel(), _read(a), _out(o))  # noqa: E731
_softmax: Formula = lambda a, k, o: (5 * a[0].numel(), nbytes(a[0]), _out(o))  # noqa: E731
# its backward (grad, output, dim, dtype): output * (grad - sum(grad * output)), or for the
# log variant grad - exp(output) * sum(grad): four an element, the forward's output read too
_softmax_bw: Formula = lambda a, k, o: (4 * a[0].numel(), _read(a[:2]), _out(o))  # noqa: E731
_dropout: Formula = lambda a, k, o: (a[0].numel(), nbytes(a[0]), _out(o))  # noqa: E731
_copy: Formula = lambda a, k, o: (0, _read(a[:1]), _out(o))  # noqa: E731
_copy_into: Formula = lambda a, k, o: (0, _read(a[1:2]), _out(o))  # noqa: E731
_factory: Formula = lambda a, k, o: (0, 0, _out(o))  # noqa: E731
_cat: Formula = lambda a, k, o: (0, _read(a[0]), _out(o))  # noqa: E731
_bookkeeping: Formula = lambda a, k, o: (0, _read(a), _out(o))  # noqa: E731
_ext_gather: Formula = lambda a, k, o: (0, _out(o) + nbytes(a[1]), _out(o))  # noqa: E731


FREE = frozenset(
    """
view _unsafe_view reshape t transpose permute expand expand_as select slice unsqueeze squeeze
detach alias as_strided unbind split split_with_sizes narrow chunk lift_fresh _reshape_alias
view_as numel size stride is_same_size _to_copy_noop resolve_conj resolve_neg unfold
movedim flatten unflatten diagonal _indices _values indices values crow_indices col_indices
sym_size sym_stride sym_numel _nnz sparse_dim dense_dim is_coalesced _local_scalar_dense
empty empty_like empty_strided new_empty set_ record_stream
profiler._record_function_enter profiler._record_function_enter_new
profiler._record_function_exit
sparse_compressed_tensor _sparse_compressed_tensor_unsafe sparse_csr_tensor
_sparse_csr_tensor_unsafe sparse_coo_tensor _sparse_coo_tensor_unsafe
_sparse_coo_tensor_with_dims_and_tensors torch_sparse.cuda_version torch_scatter.cuda_version
""".split()
)

_ELEMENTWISE = """
add sub mul div true_divide floor_divide remainder pow neg abs exp exp2 expm1 log log1p log2
sqrt rsqrt reciprocal sigmoid tanh relu relu_ leaky_relu elu gelu silu hardtanh threshold
threshold_backward clamp clamp_min clamp_max where masked_fill eq ne lt le gt ge
logical_and logical_or logical_not bitwise_and bitwise_or bitwise_not maximum minimum sign
sigmoid_backward tanh_backward leaky_relu_backward elu_backward gelu_backward silu_backward
add_ sub_ mul_ div_ pow_ masked_fill_ clamp_ fill_ zero_ neg_ exp_ addcmul addcdiv lerp
addcmul_ addcdiv_ lerp_ sqrt_ rsqrt_ native_dropout_backward bernoulli_
bernoulli isnan isinf nan_to_num rand_like randn_like uniform_ normal_ _foreach_add
mse_loss square
""".split()
_REDUCTION = """
sum mean amax amin max min prod norm linalg_vector_norm argmax argmin any all var std
cumsum cumprod logsumexp count_nonzero var_mean std_mean
""".split()

#: The formulas of aten ops, by name (without the namespace).
FORMULAS: Dict[str, Formula] = {
    "mm": _mm,
    "addmm": _addmm,
    "bmm": _bmm,
    "baddbmm": _addmm,
    "_sparse_mm": _mm,
    "_sparse_addmm": _addmm,
    "_sparse_sparse_matmul": _mm,
    "_sparse_mm_reduce_impl": _mm,
    "_sparse_mm_reduce_impl_backward": _spmm_reduce_backward,
    "index_select": _gather,
    "index": _gather,
    "gather": _gather,
    "embedding": _gather,
    "take": _gather,
    "masked_select": _gather,
    "scatter_add": _scatter,
    "scatter_add_": _scatter,
    "scatter_reduce": _scatter,
    "scatter_reduce_": _scatter,
    "index_add": _scatter,
    "index_add_": _scatter,
    "index_reduce": _scatter,
    "index_reduce_": _scatter,
    "scatter": _scatter_copy,
    "scatter_": _scatter_copy,
    "index_put": _scatter_copy,
    "index_put_": _scatter_copy,
    "_index_put_impl_": _scatter_copy,
    "index_copy": _scatter_copy,
    "index_copy_": _scatter_copy,
    "segment_reduce": _segment,
    "_softmax": _softmax,
    "_log_softmax": _softmax,
    "_softmax_backward_data": _softmax_bw,
    "_log_softmax_backward_data": _softmax_bw,
    "native_dropout": _dropout,
    "nll_loss_forward": _nll_loss,
    "nll_loss_backward": _nll_loss_backward,
    "clone": _copy,
    "copy_": _copy_into,
    "_to_copy": _copy,
    "contiguous": _copy,
    "repeat": _copy,
    "cat": _cat,
    "stack": _cat,
    "zeros": _factory,
    "ones": _factory,
    "full": _factory,
    "zeros_like": _factory,
    "ones_like": _factory,
    "full_like": _factory,
    "arange": _factory,
    "new_zeros": _factory,
    "new_ones": _factory,
    "new_full": _factory,
    "scalar_tensor": _factory,
    "randn": _factory,
    "rand": _factory,
    "randint": _factory,
    "eye": _factory,
}
FORMULAS.update({name: _elementwise for name in _ELEMENTWISE})
FORMULAS.update({name: _reduction for name in _REDUCTION})

#: The formulas of torch-sparse's and torch-scatter's ops, by ``namespace.name``.
EXTENSIONS: Dict[str, Formula] = {
    "torch_sparse.spmm_sum": _spmm,
    "torch_sparse.spmm_min": _spmm,
    "torch_sparse.spmm_max": _spmm,
    "torch_sparse.spmm_mean": _spmm,
    "torch_sparse.ind2ptr": _bookkeeping,
    "torch_sparse.ptr2ind": _bookkeeping,
    "torch_sparse.non_diag_mask": _bookkeeping,
    "torch_scatter.gather_csr": _ext_gather,
    "torch_scatter.gather_coo": _ext_gather,
    "torch_scatter.scatter_mul": _segment,
}
for _kind in ("sum", "mean", "min", "max"):
    for _op in (f"segment_{_kind}_csr", f"segment_{_kind}_coo", f"scatter_{_kind}"):
        EXTENSIONS[f"torch_scatter.{_op}"] = _segment


def dgl_cost(name: str, args: Any, out: Any) -> Optional[Cost]:
    """DGL's fused kernels (outside torch's dispatcher): ``gspmm`` (``GSpMM.apply(gidx, op,
    reduce_op, X, Y)``: per edge and feature a FLOP for ``op`` unless it copies, one for the
    reduction), ``gsddmm`` (``GSDDMM.apply(gidx, op, X, Y, lhs, rhs)``: a FLOP per edge and
    feature, two for ``dot``); both read operands and the graph's indices (two per edge)
    once, write the result once. None for anything else (listed as unknown)."""
    try:
        gidx = args[0]
        e = int(gidx.num_edges(0))
        index = 2 * e * (4 if "32" in str(getattr(gidx, "dtype", "int64")) else 8)
        if name == "gspmm":
            op, x, y = args[1], args[3], args[4]
            per_edge = out.numel() // max(out.shape[0], 1)  # features per node of the result
            flops = e * per_edge * ((0 if op.startswith("copy") else 1) + 1)
            read = index + sum(nbytes(t) for t in (x, y) if t is not None)
            return flops, read, _out(out)
        if name == "gsddmm":
            op, x, y = args[1], args[2], args[3]
            per_edge = max(t.numel() // max(t.shape[0], 1) for t in (x, y) if t is not None)
            flops = e * per_edge * (2 if op == "dot" else 1)
            read = index + sum(nbytes(t) for t in (x, y) if t is not None)
            return flops, read, _out(out)
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return None
    return None


def cost(name: str, args: Any, kwargs: Dict[str, Any], out: Any) -> Optional[Cost]:
    """``(FLOPs, bytes read, bytes written)`` of op ``name`` (an aten op's name without its
    namespace, ``mm``; another namespace's with it, ``torch_sparse.spmm_sum``) on ``args``
    giving ``out``; ``(0, 0, 0)`` for a free op; None when no formula knows it (or it
    failed on these arguments)."""
    if name in FREE:
        return (0, 0, 0)
    formula = FORMULAS.get(name) or EXTENSIONS.get(name)
    if formula is None:
        return None
    try:
        flops, read, written = formula(args, kwargs, out)
    except (AttributeError, IndexError, TypeError, RuntimeError, StopIteration):
        return None
    return int(flops), int(read), int(written)
