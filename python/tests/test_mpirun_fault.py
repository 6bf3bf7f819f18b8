"""A failure across hosts under mpirun (python.mpirun_fault/2x2): a bad
shape on one rank raises mc2.Error on every rank, on both hosts. The job
then ends non-zero on purpose (a world that met a failure aborts the MPI
job at exit), so the test counts the ranks whose test passed."""
import os

import pytest
import torch

import mc2

R = int(os.environ["OMPI_COMM_WORLD_RANK"])


def test_a_bad_shape_on_one_rank_raises_on_every_rank():
    assert mc2.world().num_hosts() == 2
    t = torch.ones(10 if R == 0 else 11)
    with pytest.raises(mc2.Error) as e:
        mc2.all_reduce(t)
    print(f"rank {R} raised: {e.value}")
