"""kvdir's stand-in for the CPU build of `sgl_kernel` (it is not SGLang's package).

SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`) imports `*_cpu` torch ops from the CPU build of
sgl_kernel, which must be compiled from SGLang's sources; PyPI's `sglang-kernel` is a CUDA build
without them. For a plain dense Llama served with `--attention-backend torch_native` on a CPU
without Intel AMX, SGLang 0.5.23 calls only two of them:

- `assign_req_to_token_pool_cpu`: writes newly allocated KV slots into the request-to-token
  table;
- `copy_all_layer_kv_cache_cpu`: copies KV rows from one slot to another in every layer's
  buffer.

Both are written here in plain torch and Python. Any other name imports (SGLang imports many
at load time) but raises NotImplementedError when called, so an unexpected kernel shows up as
an error rather than as a wrong answer. `scripts/sglang-install.sh` puts this folder's parent on
the venv's path.
"""

import ctypes

__version__ = "0.0.0+kvdir.cpu.stand.in"


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset,
                                  out_cache_loc, pool_len):
    """For each request r (in order): req_to_token[row r, start..end] = the next end - start
    entries of out_cache_loc, which holds every request's slots one after the other."""
    del pool_len  # the table's row length; the slices below never exceed it
    rows = req_pool_indices.tolist()
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    taken = 0
    for row, start, end in zip(rows, starts, ends):
        count = end - start
        if count > 0:
            chunk = out_cache_loc[taken:taken + count]
            req_to_token[row, start:end] = chunk.to(req_to_token.dtype)
        taken += max(count, 0)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every KV buffer i (base address data_ptrs[i], strides[i] bytes per token slot):
    copies slot src_loc[j] onto slot tgt_loc[j] for each j, in order."""
    bases = data_ptrs.tolist()
    row_bytes = strides.tolist()
    targets = tgt_loc.tolist()
    sources = src_loc.tolist()
    for base, size in zip(bases, row_bytes):
        for target, source in zip(targets, sources):
            ctypes.memmove(base + target * size, base + source * size, size)


def _missing(name):
    def kernel(*_args, **_kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not in kvdir's CPU stand-in (scripts/sglang_cpu); "
            "only a dense model with --attention-backend torch_native is supported")

    kernel.__name__ = name
    return kernel


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)
