"""all_reduce of sparse COO tensors, computed as gloo computes it
(ProcessGroupGloo's AsyncSparseAllreduceWork), so the results are the same
bit for bit:

  1. the rank's tensors are summed and coalesced (CUDA ones on the host);
  2. every rank's metadata (dims, sizes, dtype, nnz) is all-gathered and must
     agree ("Sparse dimensions do not match" otherwise, on every rank);
  3. indices and values are all-gathered (allgatherv: nnz differs by rank);
  4. rank 0's sparse tensor + rank 1's + ... in rank order, then coalesce();
  5. the result is copied into every input tensor (coalesced, like gloo's).

Only ReduceOp.SUM, as gloo.  The three all-gathers run one after the other
in the calling thread (step 3 needs step 2's sizes); the Work returned is
already complete, also with async_op=True.
"""
import zlib

import torch

from . import _dtypes as D
from . import _lib

# metadata per rank: sparse_dim, dense_dim, nnz, a dtype code, then the sizes
_HEAD = 4
_MAX_DIMS = 64   # torch's limit on a tensor's dimensions


def _dtype_code(dtype):
    return zlib.crc32(str(dtype).encode())


def _metadata(t):
    m = torch.zeros(_HEAD + _MAX_DIMS, dtype=torch.int64)
    m[0], m[1], m[2], m[3] = t.sparse_dim(), t.dense_dim(), t._nnz(), _dtype_code(t.dtype)
    m[_HEAD:_HEAD + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
    return m


def _cumsum(values):
    out, acc = [], 0
    for v in values:
        out.append(acc)
        acc += v
    return out


def check_op(kind, factor):
    if kind != D._RT.SUM or factor is not None:
        raise RuntimeError("dshim: all_reduce: unsupported reduction operation (allreduce of sparse tensors only "
                           "works with ReduceOp.SUM, as with gloo)")


def check_layouts(tensors):
    layouts = {t.layout for t in tensors}
    if layouts != {torch.sparse_coo}:
        names = ", ".join(sorted(str(x) for x in layouts))
        raise RuntimeError(f"dshim: all_reduce: tensors of layout(s) {names}; a sparse all_reduce takes sparse "
                           f"COO tensors only (convert with .to_sparse() or .to_dense())")


def allreduce(pg, tensors, run):
    """`run(label, calls)` runs blocking dshim calls on pg's communicator."""
    lib = pg._dshim_lib
    n, me = pg.size(), pg.rank()
    with torch.no_grad():
        mine = tensors[0]
        for t in tensors[1:]:
            mine = mine + t
        mine = mine.coalesce()
        if mine.device.type != "cpu":
            mine = mine.to("cpu")
        meta = _metadata(mine)
        metas = torch.empty(n * meta.numel(), dtype=torch.int64)
        run("all_reduce (sparse metadata)",
            ((lib.dshim_allgather, (meta.data_ptr(), metas.data_ptr(), meta.numel() * 8, D.BYTES)),))
        metas = metas.view(n, -1)
        for r in range(n):
            if r != me and not torch.equal(torch.cat([metas[r, :2], metas[r, 3:]]),
                                           torch.cat([meta[:2], meta[3:]])):
                raise RuntimeError(f"Sparse dimensions do not match (dshim: all_reduce of a sparse tensor: rank {r} "
                                   f"has {_describe(metas[r])}, rank {me} {_describe(meta)})")
        sparse_dim = mine.sparse_dim()
        nnz = [int(metas[r, 2]) for r in range(n)]
        value_shape = list(mine.shape[sparse_dim:])
        dense_numel = 1
        for s in value_shape:
            dense_numel *= s
        indices = _gather(run, lib, "indices", mine.indices().contiguous(),
                          [k * sparse_dim for k in nnz], torch.int64)
        values = _gather(run, lib, "values", mine.values().contiguous(),
                         [k * dense_numel for k in nnz], mine.dtype)
        out = None
        for r, (off, k) in enumerate(zip(_cumsum(nnz), nnz)):
            idx = indices.narrow(0, off * sparse_dim, k * sparse_dim).reshape(sparse_dim, k)
            val = values.narrow(0, off * dense_numel, k * dense_numel).reshape([k] + value_shape)
            part = torch.sparse_coo_tensor(idx, val, mine.shape, dtype=mine.dtype)
            out = part if out is None else out + part
        out = out.coalesce()
        for t in tensors:
            t.copy_(out)


def _gather(run, lib, what, mine, counts, dtype):
    """All ranks' `mine` (counts[r] elements from rank r), concatenated."""
    out = torch.empty(sum(counts), dtype=dtype)
    if not sum(counts):
        return out   # every rank knows the counts: all skip together
    size = out.element_size()
    nbytes = [c * size for c in counts]
    run(f"all_reduce (sparse {what})",
        ((lib.dshim_allgatherv, (mine.data_ptr(), out.data_ptr(), _lib.size_array(nbytes),
                                 _lib.size_array(_cumsum(nbytes)), D.BYTES)),))
    return out


def _describe(m):
    sd, dd = int(m[0]), int(m[1])
    sizes = [int(x) for x in m[_HEAD:_HEAD + sd + dd]]
    return f"sizes {sizes} ({sd} sparse, {dd} dense dims, dtype code {int(m[3])})"
