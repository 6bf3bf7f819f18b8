"""The torch.distributed backend "mc2" on 1-4 ranks (mc2 run): every call
against a reference computed from every rank's known input (each rank
builds all ranks' inputs from the rank number), sync and async, on
contiguous and non-contiguous tensors, and mc2's own Python calls.
"""
import time

import pytest
import torch
import torch.distributed as dist

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]


def data(rank, n=6, dtype=torch.float32):
    """Rank `rank`'s input: small integers, exact in every dtype."""
    x = (torch.arange(n) * (rank + 2) + rank) % 7 + 1
    return x.to(dtype)


def reference(op, dtype, n=6):
    xs = torch.stack([data(r, n, torch.float64) for r in range(N)])
    return {"sum": xs.sum(0), "max": xs.max(0).values, "min": xs.min(0).values,
            "prod": xs.prod(0)}[op].to(dtype)


def test_backend_is_mc2():
    assert dist.get_backend() == "mc2"
    assert isinstance(mc2.group_of(), mc2.Group) and mc2.group_of().size() == N


@pytest.mark.parametrize("dtype", FLOATS + INTS)
@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
def test_all_reduce(dtype, op):
    if op == "prod" and dtype in (torch.int8, torch.uint8):
        pytest.skip("the product of small integers overflows 8 bits")
    t = data(R, dtype=dtype)
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                           "min": dist.ReduceOp.MIN, "prod": dist.ReduceOp.PRODUCT}[op])
    assert torch.equal(t, reference(op, dtype))


def test_all_reduce_avg_and_bitwise():
    t = data(R, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t, reference("sum", torch.float64) / N)
    t = data(R, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.BXOR)
    want = torch.zeros(6, dtype=torch.int32)
    for r in range(N):
        want ^= data(r, dtype=torch.int32)
    assert torch.equal(t, want)


def test_all_reduce_non_contiguous_is_copied_back():
    base = torch.zeros(6, 3)
    view = base[:, 1]  # stride 3
    view.copy_(data(R))
    dist.all_reduce(view)
    assert torch.equal(base[:, 1], reference("sum", torch.float32))
    assert torch.equal(base[:, 0], torch.zeros(6)) and torch.equal(base[:, 2], torch.zeros(6))


def test_async_work_and_future():
    t = data(R, n=1 << 18)  # 1 MiB
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert work.wait()
    assert torch.equal(t, reference("sum", torch.float32, n=1 << 18))
    value = fut.wait()
    assert isinstance(value, list) and value[0] is t
    chained = dist.all_reduce(data(R), async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    assert torch.equal(chained.wait(), 2 * reference("sum", torch.float32))


def test_callback_may_wait_for_another_call():
    # As PowerSGD's hook does: a future's callback issues a call and waits.
    def then(f):
        inner = dist.all_reduce(f.value()[0].clone(), async_op=True).get_future()
        return inner.wait()[0]
    fut = dist.all_reduce(data(R, n=1 << 20), async_op=True).get_future().then(then)
    assert torch.equal(fut.wait(), N * reference("sum", torch.float32, n=1 << 20))


@pytest.mark.parametrize("root", [0, N - 1])
def test_broadcast_and_reduce(root):
    t = data(R, dtype=torch.float16)
    dist.broadcast(t, src=root)
    assert torch.equal(t, data(root, dtype=torch.float16))
    t = data(R, dtype=torch.int64)
    dist.reduce(t, dst=root)
    if R == root:
        assert torch.equal(t, reference("sum", torch.int64))
    else:
        assert torch.equal(t, data(R, dtype=torch.int64))


def test_all_gather_and_base():
    outs = [torch.empty(6, dtype=torch.bfloat16) for _ in range(N)]
    dist.all_gather(outs, data(R, dtype=torch.bfloat16))
    for r in range(N):
        assert torch.equal(outs[r], data(r, dtype=torch.bfloat16))
    out = torch.empty(N * 6, dtype=torch.int32)
    dist._all_gather_base(out, data(R, dtype=torch.int32))
    assert torch.equal(out, torch.cat([data(r, dtype=torch.int32) for r in range(N)]))


def test_all_gather_coalesced():
    # torch asks one dtype of every tensor; sizes may differ.
    ins = [data(R, 5), data(R, 3) * 10]
    outs = [[torch.empty(5), torch.empty(3)] for _ in range(N)]
    dist.all_gather_coalesced(outs, ins)
    for r in range(N):
        assert torch.equal(outs[r][0], data(r, 5))
        assert torch.equal(outs[r][1], data(r, 3) * 10)
    with pytest.raises(mc2.Error, match="output list"):
        dist.all_gather_coalesced([[torch.empty(5)] for _ in range(N)], ins)


def test_reduce_scatter_and_base():
    ins = [data(R, dtype=torch.float64) * (i + 1) for i in range(N)]
    out = torch.empty(6, dtype=torch.float64)
    dist.reduce_scatter(out, ins)
    assert torch.equal(out, reference("sum", torch.float64) * (R + 1))
    full = torch.cat(ins)
    out = torch.empty(6, dtype=torch.float64)
    dist._reduce_scatter_base(out, full)
    assert torch.equal(out, reference("sum", torch.float64) * (R + 1))


def test_all_to_all_single_with_splits():
    # Rank r sends (p + 1) rows of 2 to rank p, each row filled with 10 r + p.
    in_splits = [p + 1 for p in range(N)]
    rows = torch.cat([torch.full((p + 1, 2), 10.0 * R + p) for p in range(N)])
    out_splits = [R + 1] * N
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, rows, out_splits, in_splits)
    want = torch.cat([torch.full((R + 1, 2), 10.0 * s + R) for s in range(N)])
    assert torch.equal(out, want)


def test_all_to_all_lists():
    ins = [torch.full((p + 1,), 100 * R + p, dtype=torch.int64) for p in range(N)]
    outs = [torch.empty(R + 1, dtype=torch.int64) for _ in range(N)]
    dist.all_to_all(outs, ins)
    for s in range(N):
        assert torch.equal(outs[s], torch.full((R + 1,), 100 * s + R, dtype=torch.int64))


def test_gather_and_scatter():
    root = N - 1
    lst = [torch.empty(6) for _ in range(N)] if R == root else None
    dist.gather(data(R), lst, dst=root)
    if R == root:
        for r in range(N):
            assert torch.equal(lst[r], data(r))
    out = torch.empty(6)
    dist.scatter(out, [data(r) * 3 for r in range(N)] if R == root else None, src=root)
    assert torch.equal(out, data(R) * 3)


def test_send_recv_ring_and_barrier():
    if N == 1:
        pytest.skip("needs two ranks")
    got = torch.empty(6, dtype=torch.float64)
    reqs = [dist.isend(data(R, dtype=torch.float64), (R + 1) % N),
            dist.irecv(got, (R - 1) % N)]
    for q in reqs:
        q.wait()
    assert torch.equal(got, data((R - 1) % N, dtype=torch.float64))
    dist.barrier()


def test_new_group_of_some_ranks():
    members = list(range(0, N, 2))  # the even ranks
    sub = dist.new_group(members)
    if R in members:
        t = data(R)
        dist.all_reduce(t, group=sub)
        assert torch.equal(t, sum(data(r) for r in members))
        assert mc2.group_of(sub).size() == len(members)


def test_mc2_calls_with_algorithms():
    for algo in ["auto", "ring", "direct"]:
        t = data(R, n=1000)
        h = mc2.all_reduce(t, op="max", async_op=True, algorithm=algo)
        h.wait()
        assert torch.equal(t, reference("max", torch.float32, n=1000))
    t = data(R)
    mc2.broadcast(t, src=0, algorithm="tree")
    assert torch.equal(t, data(0))
    with pytest.raises(mc2.Error, match="unknown algorithm 'bogus'"):
        mc2.all_reduce(t, algorithm="bogus")


def test_change_before_wait_is_detected():
    if N == 1:
        pytest.skip("needs a peer to make the call wait")
    t = data(R, n=1 << 20)
    if R == 0:
        time.sleep(0.3)  # rank 1's call cannot finish before rank 0 joins
        mc2.all_reduce(t)
        return
    h = mc2.all_reduce(t, async_op=True)
    t.add_(1)  # forbidden: the call is still running
    with pytest.raises(mc2.Error, match="modified in place while the call ran") as e:
        h.wait()
    assert e.value.code == "invalid_argument"
