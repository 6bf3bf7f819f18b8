"""Python programs under mpirun, with no other launcher: 4 ranks on this
host that claim 2 hosts of 2 ranks each (MC2_HOSTNAME), so the job's world
spans hosts and its traffic between them goes through the net transport,
as on separate machines (python.mpirun/2x2 in tests.cmake).

A script written for torchrun runs unchanged: importing mc2 gives it
torchrun's variables from Open MPI's, and torch.distributed's default
env:// rendezvous meets on rank 0's store. Every result is checked against
a reference computed from every rank's known input.
"""
import os

import pytest
import torch
import torch.distributed as dist

import mc2

R, N = int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"])


def data(rank, n=6, dtype=torch.float32):
    x = (torch.arange(n) * (rank + 2) + rank) % 7 + 1
    return x.to(dtype)


def test_launcher_variables_come_from_open_mpi():
    assert mc2.launched_by_mpi() and not mc2.launched_by_mc2()
    assert os.environ["RANK"] == str(R) and os.environ["WORLD_SIZE"] == str(N)
    assert os.environ["LOCAL_RANK"] == os.environ["OMPI_COMM_WORLD_LOCAL_RANK"]
    assert "MASTER_ADDR" not in os.environ  # set by the rendezvous below


def test_mc2_world_spans_the_job():
    w = mc2.world()
    assert (w.rank(), w.size()) == (R, N)
    t = data(R, 1000)
    mc2.all_reduce(t)  # before torch.distributed: on mc2.world()
    assert torch.equal(t, sum(data(r, 1000) for r in range(N)))


def test_unchanged_init_process_group():
    dist.init_process_group("mc2")  # env://, no variables set by hand
    assert dist.get_backend() == "mc2"
    assert (dist.get_rank(), dist.get_world_size()) == (R, N)
    assert os.environ["MASTER_ADDR"] and int(os.environ["MASTER_PORT"]) > 0
    assert mc2.group_of().size() == N


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("n", [1, 7, 300_000])
def test_all_reduce_across_hosts(dtype, n):
    t = data(R, n, dtype)
    dist.all_reduce(t)
    ref = sum(data(r, n, torch.float64) for r in range(N)).to(dtype)
    assert torch.equal(t, ref)


def test_other_collectives_across_hosts():
    out = [torch.empty(5) for _ in range(N)]
    dist.all_gather(out, data(R, 5))
    for r in range(N):
        assert torch.equal(out[r], data(r, 5))
    t = data(R, 9)
    dist.broadcast(t, src=N - 1)
    assert torch.equal(t, data(N - 1, 9))
    full = torch.cat([data(R, 4) * (k + 1) for k in range(N)])
    mine = torch.empty(4)
    dist.reduce_scatter_tensor(mine, full) if hasattr(dist, "reduce_scatter_tensor") else \
        dist._reduce_scatter_base(mine, full)
    assert torch.equal(mine, sum(data(r, 4) for r in range(N)) * (R + 1))
    send = torch.arange(N * 3, dtype=torch.float32) + 100 * R
    recv = torch.empty(N * 3)
    dist.all_to_all_single(recv, send)
    for r in range(N):
        assert torch.equal(recv[3 * r:3 * r + 3], torch.arange(3 * R, 3 * R + 3) + 100.0 * r)
    got = torch.empty(6)
    reqs = [dist.isend(data(R), (R + 1) % N), dist.irecv(got, (R - 1) % N)]
    for q in reqs:
        q.wait()
    assert torch.equal(got, data((R - 1) % N))
    dist.barrier()


def test_fused_operator_across_hosts_equals_serial():
    torch.manual_seed(7)
    a = torch.randn(N * 8, 16)  # every rank builds the whole input
    b = torch.randn(16, 12)
    mine = a[R * 8:(R + 1) * 8].contiguous()
    out, gathered = mc2.ops.all_gather_matmul(mine, b, gather_output=True)
    assert torch.equal(gathered, a)
    serial, _ = mc2.ops.all_gather_matmul(mine, b, pipeline="serial")
    assert torch.equal(out, serial)  # every pipeline gives the serial bits
    assert torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_ddp_with_mc2_hook_across_hosts_equals_single_process():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    ref.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, mc2.ddp.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(N * 4, 8, generator=g), torch.randn(N * 4, 1, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x[R * 4:(R + 1) * 4]), y[R * 4:(R + 1) * 4]).backward()
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_topo_flat_and_hierarchical_give_the_same_bits():
    assert mc2.group_of().num_hosts() == 2
    g = torch.Generator().manual_seed(R)
    x = torch.randn(50_000, generator=g)
    flat, hier = x.clone(), x.clone()
    mc2.all_reduce(flat, topo="flat")
    mc2.all_reduce(hier, topo="hierarchical", async_op=True).wait()
    assert torch.equal(flat, hier)  # one canonical order across hosts
    ref = sum(torch.randn(50_000, generator=torch.Generator().manual_seed(r)).double()
              for r in range(N))
    assert torch.allclose(flat.double(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(mc2.Error, match="disagree"):
        mc2.all_reduce(x.clone(), topo="flat", algorithm="hierarchical")
    with pytest.raises(mc2.Error, match="unknown topo"):
        mc2.all_reduce(x.clone(), topo="ring")

