"""The device tier through the Python binding (strata._native): a job with a
device budget maps the daemon's emulated arena read-only, acquire_places
refuses a job without a budget, and park_job / resume_job check the job."""
import os
import tempfile

import pytest

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
    assert arena.nbytes == 256 << 10
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
