"""Shapes that disagree across ranks raise mc2.Error('mismatch') on every
rank (the world is broken afterwards: one test per job)."""
import pytest
import torch
import torch.distributed as dist

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()


@pytest.mark.skipif(N == 1, reason="needs ranks that disagree")
def test_sizes_that_disagree_fail_every_rank():
    t = torch.ones(100 + R)
    with pytest.raises(mc2.Error) as e:
        dist.all_reduce(t)
    assert e.value.code in ("mismatch", "aborted")
    assert e.value.op == "all_reduce"
