"""mc2's timeline tracing from Python (docs/tracing.md): record what every
rank spends its time on, and read it with `mc2 trace report|plot|merge DIR`.

    mc2.trace.start("/tmp/trace")          # this rank's world must exist
    for step in range(steps):
        mc2.trace.mark_step(step)          # per-step breakdown in the report
        with mc2.trace.span("attention"):  # torch compute between mc2 calls
            ...
        loss.backward()                    # mc2's calls record themselves
    mc2.trace.stop()                       # writes DIR/rank-<r>.trace.json

While recording, every mc2 collective (the torch.distributed backend's
calls, DDP's bucket all-reduces, mc2's own calls) and every fused
operator records its spans, as in C++. Torch's own computation is not
seen by mc2: wrap what should count as compute in span() (the report
counts unrecorded time as free time). MC2_TRACE=DIR turns recording on
for the whole run instead, from the world's start.
"""
import contextlib

from . import _C, _world

__all__ = ["start", "stop", "flush", "enabled", "mark_step", "end_step", "span",
           "set_thread_name"]


def start(directory):
    """Starts recording into `directory` (created if missing), dropping what
    an earlier start recorded. The process's mc2 world must exist (it gives
    the spans their rank): it is made now if needed, as by mc2.world()."""
    _world.world()
    _C.trace_enable(str(directory))


def stop():
    """Stops recording and writes this rank's file, DIR/rank-<r>.trace.json
    (everything since start()). Without a start() it does nothing."""
    if _C.trace_enabled():
        _C.trace_disable()
        _C.trace_flush()


def flush():
    """Writes the file of what was recorded so far (recording goes on)."""
    _C.trace_flush()


def enabled():
    """Whether spans are being recorded now."""
    return _C.trace_enabled()


def mark_step(step):
    """Marks the start of step `step` (and the end of the previous one):
    `mc2 trace report` breaks the time down per step."""
    _C.trace_mark_step(int(step))


def end_step():
    """Ends the current step without starting another."""
    _C.trace_end_step()


@contextlib.contextmanager
def span(name, category="compute", flops=0, bytes=0):
    """Records the time spent in the `with` block as a span on the calling
    thread: category "compute" (work the communication should hide behind),
    "comm", "wait" or "host"; flops and bytes are shown in its args. The
    span is recorded when the block ends, also when it raises."""
    start_ns = _C.trace_now_ns()
    try:
        yield
    finally:
        _C.trace_record(name, category, start_ns, int(flops), int(bytes))


def set_thread_name(name):
    """Names the calling thread in the trace."""
    _C.trace_set_thread_name(str(name))
