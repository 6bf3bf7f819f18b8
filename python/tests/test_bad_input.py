"""Bad input raises mc2.Error on every rank, never hangs. The last test
breaks the world (a mismatch does, docs/errors.md), so it comes last; the
fault tests with other causes are test_bad_shapes.py and test_dead_rank.py.
"""
import pytest
import torch
import torch.distributed as dist

import mc2

mc2.init_process_group()
R, N = dist.get_rank(), dist.get_world_size()


def test_unsupported_dtype_everywhere_leaves_the_group_usable():
    t = torch.ones(4, dtype=torch.int16)
    with pytest.raises(mc2.Error, match="int16|Short") as e:
        dist.all_reduce(t)
    assert e.value.code == "invalid_argument" and e.value.op == "all_reduce"
    t = torch.ones(4)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((4,), float(N)))


def test_bad_arguments_name_the_cause():
    with pytest.raises(mc2.Error, match="split sizes add up to 5"):
        dist.all_to_all_single(torch.empty(4 * N), torch.empty(4 * N), None, [5] + [0] * (N - 1))
    with pytest.raises(mc2.Error, match=f"root {N} is not a rank of the group of {N}"):
        dist.scatter(torch.empty(2), None, src=N)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((2,), float(N)))


@pytest.mark.skipif(N == 1, reason="needs ranks that disagree")
def test_wrong_dtype_on_one_rank_fails_every_rank():
    t = torch.ones(4, dtype=torch.int16 if R == N - 1 else torch.float32)
    with pytest.raises(mc2.Error) as e:
        dist.all_reduce(t)
    if R == N - 1:
        assert e.value.code == "invalid_argument"
    else:
        assert e.value.code in ("mismatch", "aborted")
