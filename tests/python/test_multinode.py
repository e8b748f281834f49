"""(c) 2 daemons x 2 ranks (as two nodes: each daemon serves its own ranks and
the steps are agreed with PrepareStep/CommitStep over torch.distributed) equal
1 daemon x 4 ranks bit for bit."""
import tempfile

import pytest
import torch

import train_gpt
from conftest import Daemon


@pytest.fixture(scope="module")
def second_stratad():
    with tempfile.TemporaryDirectory(prefix="strata-py2-") as d:
        daemon = Daemon(d)
        yield daemon
        daemon.stop()


def test_two_daemons_equal_one_bit_for_bit(stratad, second_stratad, tmp_path):
    cfg = dict(train_gpt.DEFAULTS, steps=8, warmup=3, layers=1)
    one = train_gpt.run_mode("offload", cfg, stratad.socket, 4, str(tmp_path / "one"))
    two = train_gpt.run_mode("offload", cfg, [stratad.socket, second_stratad.socket], 4, str(tmp_path / "two"))
    assert one[0]["losses"] == two[0]["losses"]
    assert one[0]["losses"][-1] < one[0]["losses"][0]
    for rank in range(4):
        for name, p in one[rank]["params"].items():
            assert torch.equal(p, two[rank]["params"][name]), f"rank {rank} {name}"
