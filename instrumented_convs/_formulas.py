"""What one aten op costs: FLOPs, bytes read and bytes written, from its arguments' shapes.

The counters (:mod:`._counters`) call :func:`cost` with an op and its arguments and result.
The formulas count what the op must do at the least, the way a roofline model does:

- matrix products: ``mm``/``addmm``/``bmm``/``baddbmm``: ``2*n*k*m`` FLOPs per product (a
  multiply and an add each), ``addmm`` adds ``n*m`` for the added matrix; reads both
  operands (and the added one), writes the result once;
- sparse times dense (``torch.sparse.mm``, ``mm`` with a sparse operand, CSR or COO, the
  CSR ``spmm`` with a reduction PyG uses, and torch-sparse's ``spmm``): ``2*nnz*m`` FLOPs
  (per gradient in the backward); reads the sparse operand's indices and values and the
  dense rows, writes the result; building a sparse tensor from its parts is free;
- gathers (``index_select``, ``index``, ``gather``, ``embedding``): no FLOPs; read the
  gathered rows and the index, write the result;
- scatters (``scatter_add``, ``scatter_reduce``, ``index_add``, ``index_reduce``,
  ``scatter``): one FLOP per source element; read the source and the index, read and write
  the destination;
- ``segment_reduce`` and torch-scatter's ``segment_*_csr``: one FLOP per source element;
  read source and offsets, write the result;
- elementwise ops (``add``, ``mul``, ``relu``, ``exp``, ``where``, comparisons...): one FLOP
  per output element; read every tensor operand, write the result;
- reductions (``sum``, ``mean``, ``amax``, ``softmax``, ``log_softmax``...): one FLOP per
  input element (softmax: five); read the input, write the result;
- copies and factories (``clone``, ``copy_``, ``cat``, ``zeros``, ``ones``...): no FLOPs;
  copies read and write their bytes, factories write theirs;
- views and metadata (``view``, ``t``, ``expand``, ``select``, ``detach``...): free.

Anything else is *unknown*: the counters list it by name with its number of calls, never
count it as zero silently.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Optional, Tuple

import torch

__all__ = ["cost", "dgl_cost", "FREE", "Cost"]

Cost = Tuple[int, int, int]  # FLOPs, bytes read, bytes written


def _tensors(values: Iterable[Any]) -> Iterable[torch.Tensor]:
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from (t for t in v if isinstance(t, torch.Tensor))


def nbytes(t: torch.Tensor) -> int:
    """Bytes a tensor's elements take (a sparse tensor: its indices and values; a broadcast
    view: the elements it holds, not the ones it repeats)."""
    if t.layout == torch.sparse_coo:
        return nbytes(t._indices()) + nbytes(t._values())
    if t.layout in (torch.sparse_csr, torch.sparse_csc):
        idx = (t.crow_indices(), t.col_indices()) if t.layout == torch.sparse_csr else (
            t.ccol_indices(), t.row_indices())  # fmt: skip
        return sum(nbytes(i) for i in idx) + nbytes(t.values())
    # A broadcast view (stride 0, as ``expand`` makes) holds one element per distinct place.
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride:
            n *= size
    return n * t.element_size()


def _read(args: Any) -> int:
    return sum(nbytes(t) for t in _tensors(args))


def _out(out: Any) -> int:
    return sum(nbytes(t) for t in _tensors(out if isinstance(out, (list, tuple)) else (out,)))


def _numel(out: Any) -> int:
    return sum(t.numel() for t in _tensors(out if isinstance(out, (list, tuple)) else (out,)))


def _nnz(t: torch.Tensor) -> int:
    if t.layout == torch.sparse_coo:
        return t._nnz()
    if t.layout in (torch.sparse_csr, torch.sparse_csc):
        return t.values().numel()
    return t.numel()


def _mm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    a, b = args[0], args[1]
    if a.layout != torch.strided or b.layout != torch.strided:
        sparse, dense = (a, b) if a.layout != torch.strided else (b, a)
        return 2 * _nnz(sparse) * dense.shape[-1], _read(args[:2]), _out(out)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1], _read(args[:2]), _out(out)


def _addmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    flops, read, written = _mm(args[1:], kwargs, out)
    return flops + _numel(out), read + _read(args[:1]), written


def _spmm_reduce_backward(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``_sparse_mm_reduce_impl_backward(self, grad_out, weight, reduce, arg_out, mask)``:
    ``2*nnz*m`` FLOPs per gradient asked for (the sparse values', the dense operand's)."""
    sparse, grad = args[0], args[1]
    asked = sum(1 for m in (args[5] if len(args) > 5 else (True, True)) if m)
    return 2 * _nnz(sparse) * grad.shape[-1] * asked, _read(args[:3]), _out(out)


def _bmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    a, b = args[0], args[1]
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2], _read(args[:2]), _out(out)


def _baddbmm(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    flops, read, written = _bmm(args[1:], kwargs, out)
    return flops + _numel(out), read + _read(args[:1]), written


def _gather(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """Reads the gathered elements (as many as it writes) and the index."""
    index = [t for t in _tensors(args[1:]) if not t.is_floating_point()]
    return 0, _out(out) + sum(nbytes(i) for i in index), _out(out)


def _scatter(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``scatter_add(self, dim, index, src)`` and kin: one FLOP per source element."""
    tensors = list(_tensors(args))
    dest, rest = tensors[0], tensors[1:]
    src = [t for t in rest if t.is_floating_point() or t.is_complex()]
    flops = sum(t.numel() for t in src) if src else sum(t.numel() for t in rest)
    return flops, nbytes(dest) + sum(nbytes(t) for t in rest), _out(out)


def _spmm_torch_sparse(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """torch-sparse's ``spmm_sum/mean(row, rowptr, col, value, ..., mat)`` and
    ``spmm_min/max(rowptr, col, value, mat)``: ``2*nnz*m`` FLOPs."""
    col = args[2] if len(args) > 4 else args[1]
    mat = args[-1]
    return 2 * col.numel() * mat.shape[-1], _read(args), _out(out)


def _scatter_src(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """torch-scatter's ``scatter_*(src, index, dim, out, dim_size)``: a FLOP per source."""
    return args[0].numel(), _read(args), _out(out)


def _segment(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    src = next(_tensors(args))
    return src.numel(), _read(args), _out(out)


def _elementwise(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    return _numel(out), _read(list(args) + list(kwargs.values())), _out(out)


def _reduction(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    src = next(_tensors(args), None)
    return (0 if src is None else src.numel()), _read(args[:1]), _out(out)


def _softmax(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    src = args[0]
    return 5 * src.numel(), nbytes(src), _out(out)


def _copy(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``clone``, ``_to_copy``, ``contiguous``, ``repeat``: read the tensor, write the copy."""
    return 0, _read(args[:1]), _out(out)


def _copy_into(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    """``copy_(self, src)``: read the source, write the destination."""
    return 0, _read(args[1:2]), _out(out)


def _factory(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    return 0, 0, _out(out)


def _cat(args: Any, kwargs: Dict[str, Any], out: Any) -> Cost:
    return 0, _read(args[0]), _out(out)


FREE = frozenset(
    """
view _unsafe_view reshape t transpose permute expand expand_as select slice unsqueeze squeeze
detach alias as_strided unbind split split_with_sizes narrow chunk lift_fresh _reshape_alias
view_as numel size stride is_same_size _to_copy_noop resolve_conj resolve_neg unfold
movedim flatten unflatten diagonal _indices _values indices values crow_indices col_indices
sym_size sym_stride sym_numel _nnz sparse_dim dense_dim is_coalesced _local_scalar_dense
empty empty_like empty_strided new_empty set_ record_stream
_record_function_enter _record_function_enter_new _record_function_exit
sparse_compressed_tensor _sparse_compressed_tensor_unsafe sparse_csr_tensor
_sparse_csr_tensor_unsafe sparse_coo_tensor _sparse_coo_tensor_unsafe
_sparse_coo_tensor_with_dims_and_tensors
""".split()
)

_ELEMENTWISE = """
add sub mul div true_divide floor_divide remainder pow neg abs exp exp2 expm1 log log1p log2
sqrt rsqrt reciprocal sigmoid tanh relu relu_ leaky_relu elu gelu silu hardtanh threshold
threshold_backward clamp clamp_min clamp_max where masked_fill eq ne lt le gt ge
logical_and logical_or logical_not bitwise_and bitwise_or bitwise_not maximum minimum sign
sigmoid_backward tanh_backward leaky_relu_backward elu_backward gelu_backward silu_backward
add_ sub_ mul_ div_ pow_ masked_fill_ clamp_ fill_ zero_ neg_ exp_ addcmul addcdiv lerp
addcmul_ addcdiv_ lerp_ sqrt_ rsqrt_ native_dropout native_dropout_backward bernoulli_
bernoulli isnan isinf nan_to_num rand_like randn_like uniform_ normal_ _foreach_add
mse_loss nll_loss_forward nll_loss_backward square
""".split()
_REDUCTION = """
sum mean amax amin max min prod norm linalg_vector_norm argmax argmin any all var std
cumsum cumprod logsumexp count_nonzero var_mean std_mean
""".split()

FORMULAS: Dict[str, Callable[[Any, Dict[str, Any], Any], Cost]] = {
    "mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm,
    "_sparse_mm": _mm, "_sparse_addmm": _addmm, "_sparse_sparse_matmul": _mm,
    "_sparse_mm_reduce_impl": _mm, "_sparse_mm_reduce_impl_backward": _spmm_reduce_backward,
    "index_select": _gather, "index": _gather, "gather": _gather, "embedding": _gather,
    "take": _gather, "masked_select": _gather,
    "scatter_add": _scatter, "scatter_add_": _scatter, "scatter_reduce": _scatter,
    "scatter_reduce_": _scatter, "index_add": _scatter, "index_add_": _scatter,
    "index_reduce": _scatter, "index_reduce_": _scatter, "scatter": _scatter,
    "scatter_": _scatter, "index_put": _scatter, "index_put_": _scatter,
    "_index_put_impl_": _scatter, "index_copy": _scatter, "index_copy_": _scatter,
    "segment_reduce": _segment, "segment_sum_csr": _segment, "segment_mean_csr": _segment,
    "segment_min_csr": _segment, "segment_max_csr": _segment, "gather_csr": _segment,
    "spmm_sum": _spmm_torch_sparse, "spmm_mean": _spmm_torch_sparse,
    "spmm_min": _spmm_torch_sparse, "spmm_max": _spmm_torch_sparse,
    "scatter_sum": _scatter_src, "scatter_mean": _scatter_src, "scatter_max": _scatter_src,
    "scatter_min": _scatter_src, "scatter_mul": _scatter_src,
    "_softmax": _softmax, "_log_softmax": _softmax, "_softmax_backward_data": _softmax,
    "_log_softmax_backward_data": _softmax,
    "clone": _copy, "copy_": _copy_into, "_to_copy": _copy, "contiguous": _copy, "repeat": _copy,
    "cat": _cat, "stack": _cat, "zeros": _factory, "ones": _factory, "full": _factory,
    "zeros_like": _factory, "ones_like": _factory, "full_like": _factory, "arange": _factory,
    "new_zeros": _factory, "new_ones": _factory, "new_full": _factory, "scalar_tensor": _factory,
    "randn": _factory, "rand": _factory, "randint": _factory, "eye": _factory,
}  # fmt: skip
FORMULAS.update({name: _elementwise for name in _ELEMENTWISE})
FORMULAS.update({name: _reduction for name in _REDUCTION})


def _dgl_edges(gidx: Any) -> int:
    return int(gidx.num_edges(0))


def dgl_cost(name: str, args: Any, out: Any) -> Optional[Cost]:
    """DGL's fused kernels, which run outside torch's dispatcher: ``gspmm`` (``GSpMM.apply(
    gidx, op, reduce_op, X, Y)``: per edge and feature one FLOP for ``op`` unless it copies,
    one for the reduction) and ``gsddmm`` (``GSDDMM.apply(gidx, op, X, Y, lhs, rhs)``: one
    FLOP per edge and feature, two for ``dot``). Both write the result once, read operands
    once and the graph's indices (two per edge), as the sparse products of the aten formulas
    do: the traffic a fused kernel cannot avoid. None for anything else (listed as unknown)."""
    try:
        gidx = args[0]
        e = _dgl_edges(gidx)
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
    """``(FLOPs, bytes read, bytes written)`` of op ``name`` (an aten overload packet's
    name, without namespace) on ``args`` giving ``out``; ``(0, 0, 0)`` for a free op; None
    when no formula knows it (or it failed on these arguments)."""
    if name in FREE:
        return (0, 0, 0)
    formula = FORMULAS.get(name)
    if formula is None:
        return None
    try:
        flops, read, written = formula(args, kwargs, out)
    except (AttributeError, IndexError, TypeError, RuntimeError, StopIteration):
        return None
    return int(flops), int(read), int(written)
