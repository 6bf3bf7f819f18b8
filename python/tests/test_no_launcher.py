"""A program started without a launcher (`python3 prog.py`): the calls mc2
controls raise mc2.Error saying how to start it, instead of torch's
"environment variable RANK expected". Run by python.no_launcher, one plain
process."""
import os

import pytest
import torch

for _v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
           "MASTER_PORT", "MC2_SHM_FDS", "MC2_RANK", "MC2_WORLD_SIZE"):
    os.environ.pop(_v, None)

import mc2  # noqa: E402


def check(e):
    assert e.value.code == "invalid_argument", e.value
    assert "mc2 run -n N" in str(e.value) and "torchrun" in str(e.value), str(e.value)


def test_init_process_group():
    with pytest.raises(mc2.Error) as e:
        mc2.init_process_group()
    check(e)
    assert "RANK" in e.value.message  # names what is missing
    assert not torch.distributed.is_initialized()


def test_world_and_init():
    with pytest.raises(mc2.Error) as e:
        mc2.world()
    check(e)
    with pytest.raises(mc2.Error) as e:
        mc2.init()
    check(e)


def test_calls_that_need_the_world():
    with pytest.raises(mc2.Error) as e:
        mc2.all_reduce(torch.ones(2))
    check(e)
    with pytest.raises(mc2.Error) as e:
        mc2.trace.start("unused-trace-dir")
    check(e)
    with pytest.raises(mc2.Error) as e:
        mc2.all_gather_matmul(torch.ones(2, 3), torch.ones(3, 4))
    check(e)
