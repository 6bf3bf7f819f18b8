"""Compressed all-reduces from Python (docs/python.md, "Compression"): the
schemes of mc2's gradient middleware (docs/grad.md) for one call, over the
same C++ exchanges (mc2::CompressedAllReduce):

    mc2.all_reduce(t, op="avg", compression="bf16")
    c = mc2.Compressor("topk", topk_ratio=0.01)      # keeps residuals
    c.all_reduce(grad, key="w")                       # error feedback per key

Schemes: "none"; "f16" / "bf16" (16 bits on the wire, summed in f32, the
result rounded once); "threshold" (|x| >= threshold travels as (index,
value) pairs); "topk" (the ceil(topk_ratio x n) largest |x| travel as
pairs). Float32 tensors, op "sum" or "avg".

Error feedback (threshold, topk) needs a residual that lives from one call
to the next: what a rank did not send is kept and added to its tensor of
the next call (sent + new residual == tensor + old residual, exactly).
mc2.all_reduce takes it as `residual=` (a float32 tensor of the tensor's
size, updated when the call returns, even an asynchronous one); a
Compressor owns one per key, made zero on a key's first call.
"""
from . import _C
from .collectives import _done, _pg, invalid_argument

SCHEMES = ("none", "f16", "bf16", "threshold", "topk")
_SPARSE = ("threshold", "topk")


def _check_options(op, scheme, threshold, topk_ratio):
    if scheme not in SCHEMES:
        raise invalid_argument(op, f"unknown compression '{scheme}' ({', '.join(SCHEMES)})")
    if scheme == "threshold" and not (isinstance(threshold, (int, float)) and 0 <= threshold
                                      < float("inf")):
        raise invalid_argument(op, f"threshold must be finite and >= 0, got {threshold!r}")
    if scheme == "topk" and not (isinstance(topk_ratio, (int, float)) and 0 < topk_ratio <= 1):
        raise invalid_argument(op, f"topk_ratio must be in (0, 1], got {topk_ratio!r}")


def all_reduce_compressed(tensor, op, scheme, threshold, topk_ratio, residual, segments, group):
    """Issues the compressed all-reduce; returns (Work, stats) with stats the
    bytes it moves: {"dense_bytes", "wire_bytes", "sent_elements"}."""
    if op not in ("sum", "avg"):
        raise invalid_argument("all_reduce", f"a compressed all_reduce takes op 'sum' or 'avg', "
                               f"not '{op}'")
    _check_options("all_reduce", scheme, threshold, topk_ratio)
    return _C._all_reduce_compressed(_pg(group), tensor, op, scheme, float(threshold),
                                     float(topk_ratio), residual, list(segments or []))


class Compressor:
    """Compressed all-reduces that keep an error-feedback residual per key.

    Compressor(scheme, threshold=1e-6, topk_ratio=0.01, error_feedback=True,
    op="avg", group=None). all_reduce(tensor, key, async_op=False,
    segments=None) reduces `tensor` in place with the residual of `key` (any
    hashable: a name, a parameter); every rank uses the same keys in the
    same order. segments: the first element of each part of the tensor
    top-k selects from separately (e.g. each parameter of a flat bucket).
    A key keeps its size: a call with another size raises
    mc2.Error('invalid_argument').

    wire_bytes and dense_bytes add up, over the calls, the bytes one rank
    receives with the scheme and with an uncompressed all-reduce
    (bandwidth-optimal schedules, as GradSync's stats count them).
    """

    def __init__(self, scheme, threshold=1e-6, topk_ratio=0.01, error_feedback=True, op="avg",
                 group=None):
        _check_options("Compressor", scheme, threshold, topk_ratio)
        if op not in ("sum", "avg"):
            raise invalid_argument("Compressor", f"op must be 'sum' or 'avg', not '{op}'")
        self.scheme, self.threshold, self.topk_ratio = scheme, threshold, topk_ratio
        self.error_feedback = bool(error_feedback) and scheme in _SPARSE
        self.op, self.group = op, group
        self._residuals = {}
        self.calls = 0
        self.wire_bytes = 0
        self.dense_bytes = 0

    def residual(self, key, numel=None, like=None):
        """The residual of `key` (None without error feedback). With numel,
        made zero on first use (float32, like `like`'s device) and checked
        to hold numel elements."""
        if not self.error_feedback:
            return None
        r = self._residuals.get(key)
        if numel is None:
            return r
        if r is None:
            import torch
            r = torch.zeros(numel, dtype=torch.float32)
            self._residuals[key] = r
        elif r.numel() != numel:
            raise invalid_argument("Compressor.all_reduce", f"key {key!r} has a residual of "
                                   f"{r.numel()} elements; this tensor has {numel}")
        return r

    def reset(self):
        """Forgets every residual (the next calls start from zero)."""
        self._residuals.clear()

    def all_reduce(self, tensor, key, async_op=False, segments=None):
        residual = self.residual(key, tensor.numel())
        work, stats = all_reduce_compressed(tensor, self.op, self.scheme, self.threshold,
                                            self.topk_ratio, residual, segments, self.group)
        self._count(stats)
        return _done(work, async_op)

    def _count(self, stats):
        self.calls += 1
        self.wire_bytes += stats["wire_bytes"]
        self.dense_bytes += stats["dense_bytes"]
