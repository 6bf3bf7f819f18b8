"""A rank that dies makes every other rank's pending call raise mc2.Error
(peer_died or aborted: the death was seen, rather than a timeout expiring),
not hang."""
import os

import pytest
import torch
import torch.distributed as dist

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()


@pytest.mark.skipif(N == 1, reason="needs a peer to die")
def test_a_dead_rank_fails_the_others():
    dist.barrier()
    if R == N - 1:
        os._exit(0)  # dies without a word (exit status 0: the job goes on)
    with pytest.raises(mc2.Error) as e:
        dist.all_reduce(torch.ones(1 << 16))
    assert e.value.code in ("peer_died", "aborted"), e.value
