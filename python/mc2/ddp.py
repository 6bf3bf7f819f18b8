"""A DistributedDataParallel communication hook that runs the gradient
buckets' all-reduces on mc2, in place in mc2's symmetric heap:

    model = DistributedDataParallel(module, gradient_as_bucket_view=True)
    model.register_comm_hook(state, mc2.ddp.allreduce_hook)

state: None (mc2's default process group, mc2.collectives.
default_process_group(): the default group when torch.distributed was
initialised with "mc2", else a group over mc2.world()), or a process group
of the mc2 backend. Each bucket is averaged over the group's ranks (the
all-reduce's "avg": the sum, then one division), as DDP's own all-reduce
does, so the model trains as with DDP's default. DDP itself may run on any
backend (e.g. gloo for its set-up) while the gradients move through mc2.

At a bucket's first all-reduce the hook moves the bucket's storage into
the symmetric heap (one copy, collective over the group; DDP's rebuilt
buckets move at their first all-reduce too): DDP keeps using the same
storage at its new address, and every later all-reduce reads and writes
it in place, where peers read it directly, instead of passing it through
mc2's scratch in windows of a few MiB with a handshake each. With
gradient_as_bucket_view=True the parameters' gradients are views into the
buckets, so nothing is copied in or out either. The buckets take heap
space (the model's gradient bytes; `mc2 run --heap`, MC2_HEAP_BYTES): a
bucket that finds a rank's heap full stays where it is, on every rank
alike, and is all-reduced from there. Moving changes the address only:
a numpy array or data_ptr() taken from a gradient view before the move
keeps the old, freed memory.
"""
from . import _C
from .collectives import default_process_group, invalid_argument


def allreduce_hook(state, bucket):
    pg = default_process_group() if state is None else state
    if not isinstance(pg, _C.ProcessGroupMC2):
        raise invalid_argument("ddp.allreduce_hook", "state must be None or a process group of "
                               f"the mc2 backend, not {type(pg).__name__}")
    fut = _C._all_reduce_bucket(pg, bucket.buffer(), "avg").get_future()
    return fut.then(lambda f: f.value()[0])


class CompressionState:
    """The state of mc2.ddp.compressed_hook: a compression scheme for the
    gradient buckets and the error-feedback residuals.

        state = mc2.ddp.CompressionState(scheme="topk", topk_ratio=0.01)
        model.register_comm_hook(state, mc2.ddp.compressed_hook)

    scheme: "none", "f16", "bf16", "threshold" or "topk" (mc2.compression);
    threshold, topk_ratio: the sparse schemes' parameters; error_feedback:
    threshold and topk keep what a rank did not send and add it to the next
    step's gradient; warmup_steps: that many first steps are all-reduced
    uncompressed (the early gradients are the ones compression hurts most;
    DDP also rebuilds its buckets after the first step). process_group: as
    for allreduce_hook (None: mc2's default).

    The residuals are kept per parameter, not per bucket, so they survive
    DDP's rebuild of its buckets: a bucket's residual is its parameters'
    residuals one after the other, as its buffer holds their gradients.
    Top-k selects in each parameter separately (as GradSync does).
    Each bucket is averaged over the ranks. steps counts the steps (the
    last bucket of each), wire_bytes and dense_bytes the bytes one rank
    received with the scheme and would have uncompressed (mc2.Compressor).
    """

    def __init__(self, process_group=None, scheme="bf16", threshold=1e-6, topk_ratio=0.01,
                 error_feedback=True, warmup_steps=0):
        from .compression import Compressor
        if process_group is not None and not isinstance(process_group, _C.ProcessGroupMC2):
            raise invalid_argument("ddp.CompressionState", "process_group must be None or a "
                                   "process group of the mc2 backend, not "
                                   f"{type(process_group).__name__}")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise invalid_argument("ddp.CompressionState",
                                   f"warmup_steps must be an int >= 0, got {warmup_steps!r}")
        self.process_group = process_group
        self.compressor = Compressor(scheme, threshold, topk_ratio, error_feedback, "avg",
                                     process_group)
        self.warmup_steps = warmup_steps
        self.steps = 0

    @property
    def scheme(self):
        return self.compressor.scheme

    @property
    def wire_bytes(self):
        return self.compressor.wire_bytes

    @property
    def dense_bytes(self):
        return self.compressor.dense_bytes


def compressed_hook(state, bucket):
    """The DDP communication hook of CompressionState: the bucket's
    gradients averaged over the ranks with the state's compression."""
    if not isinstance(state, CompressionState):
        raise invalid_argument("ddp.compressed_hook", "state must be an mc2.ddp.CompressionState, "
                               f"not {type(state).__name__}")
    from .compression import all_reduce_compressed
    import torch
    c = state.compressor
    buf = bucket.buffer()
    scheme = c.scheme if state.steps >= state.warmup_steps else "none"
    if bucket.is_last():
        state.steps += 1
    if scheme == "none":
        pg = default_process_group() if state.process_group is None else state.process_group
        # Counted as the compressed exchanges count a dense all-reduce.
        n = pg.size()
        dense = 2 * (n - 1) * buf.numel() * buf.element_size() // n
        c._count({"wire_bytes": dense, "dense_bytes": dense})
        fut = _C._all_reduce_bucket(pg, buf, "avg").get_future()
        return fut.then(lambda f: f.value()[0])
    params = bucket.parameters()
    starts, n = [], 0
    for p in params:
        starts.append(n)
        n += p.numel()
    if n != buf.numel():
        raise invalid_argument("ddp.compressed_hook", f"the bucket holds {buf.numel()} elements, "
                               f"its parameters {n}")
    residual = None
    if c.error_feedback:
        parts = [c.residual(p, p.numel()) for p in params]
        residual = parts[0] if len(parts) == 1 else torch.cat(parts)
    # Empty parameters start where the next one does: top-k's parts must
    # have distinct starts.
    segments = sorted(set(s for s in starts if s < n)) or [0]
    work, stats = all_reduce_compressed(buf, "avg", scheme, c.threshold, c.topk_ratio, residual,
                                        segments, state.process_group)
    if residual is not None and len(parts) > 1:
        # The call updated the flat residual before returning.
        for part, s in zip(parts, starts):
            part.copy_(residual[s:s + part.numel()])
    c._count(stats)
    return work.get_future().then(lambda f: f.value()[0])
