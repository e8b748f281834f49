"""The device tier through the Python binding (strata._native): a job with a
device budget maps the daemon's emulated arena read-only, acquire_places
refuses a job without a budget, and park_job / resume_job check the job."""
import os
import tempfile

import pytest
import torch

from conftest import Daemon
from strata import StrataError, connect

INFINITY = ('{"zero_optimization": {"stage": 3}, '
            '"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}')


@pytest.fixture(scope="module")
def device_daemon():
    with tempfile.TemporaryDirectory(prefix="strata-py-dev-") as d:
        nvme = os.path.join(d, "nvme")
        os.makedirs(nvme)
        daemon = Daemon(d, ["--nvme_path", nvme, "--nvme_capacity", "256MiB", "--device_capacity", "256KiB"])
        yield daemon
        daemon.stop()
        assert daemon.proc.returncode == 0, daemon.log_text()


def test_a_job_with_a_device_budget_maps_the_arena_read_only(device_daemon):
    client = connect(device_daemon.socket)
    client.create_job("with-device", 1, mode="infinity", deepspeed_config_json=INFINITY,
                      device_budget_bytes=96 << 10)
    session = client.attach("with-device", 0)
    session.register_tensors([("w", 4096, 0)], [])
    arena = memoryview(session.device_arena())
    assert arena.readonly
    # The job's own arena (exactly its budget), not the daemon's whole device
    # capacity.
    assert arena.nbytes == 96 << 10
    with pytest.raises(TypeError):
        arena[0] = 1
    session.close()


def test_a_job_without_a_budget_has_no_arena_and_no_device_acquire(device_daemon):
    client = connect(device_daemon.socket)
    client.create_job("without-device", 1, mode="infinity", deepspeed_config_json=INFINITY)
    session = client.attach("without-device", 0)
    session.register_tensors([("w", 4096, 0)], [])
    with pytest.raises(StrataError) as e:
        session.device_arena()
    assert e.value.code == "FAILED_PRECONDITION"
    with pytest.raises(StrataError) as e:
        session.acquire_places([0], "device")
    assert e.value.code == "FAILED_PRECONDITION"
    assert "no device budget" in str(e.value)
    with pytest.raises(StrataError) as e:
        session.acquire_places([0], "tape")
    assert e.value.code == "INVALID_ARGUMENT"
    session.close()


def test_park_and_resume_name_the_job(device_daemon):
    client = connect(device_daemon.socket)
    with pytest.raises(StrataError) as e:
        client.park_job("no-such-job", "nvme")
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(StrataError) as e:
        client.resume_job("no-such-job")
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(StrataError) as e:
        client.park_job("no-such-job", "floppy")
    assert e.value.code == "INVALID_ARGUMENT"


class _Mlp(torch.nn.Module):
    """Three partitioned layers: 34 KiB of float32 params (36 KiB of 4 KiB device slots)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 64)
        self.b = torch.nn.Linear(64, 64)
        self.c = torch.nn.Linear(64, 8)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def _train_zero3(socket, device_budget_bytes, steps=4):
    import strata.torch as st
    torch.manual_seed(5)
    model = _Mlp()
    opt = st.Zero3AdamW(model, lr=1e-2, weight_decay=0.1, socket=socket, mode="infinity",
                        persistence_threshold=32, pinned_budget_bytes=16 << 10,
                        device_budget_bytes=device_budget_bytes)
    losses = []
    try:
        for step in range(steps):
            x = torch.randn(8, 64, generator=torch.Generator().manual_seed(step))
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
    finally:
        opt.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def test_zero3_on_the_device_tier_trains_the_same_bits(device_daemon):
    """Zero3AdamW(device_budget_bytes=24 KiB) reads its params from stratad's device arena (a
    budget below the 36 KiB its shards take there) and trains the same bits as the same job on
    the pinned window."""
    window_losses, window_params = _train_zero3(device_daemon.socket, 0)
    device_losses, device_params = _train_zero3(device_daemon.socket, 24 << 10)
    assert device_losses == window_losses
    for p, q in zip(device_params, window_params):
        assert torch.equal(p, q)
