"""Fixtures for strata's Python tests: each test module gets a private stratad
(build/bin/stratad, or $STRATA_STRATAD) on a socket in a fresh temp directory,
stopped with SIGTERM afterwards; and a runner for N-rank gloo jobs."""
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))   # tiny_gpt
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _stratad_binary():
    path = os.environ.get("STRATA_STRATAD") or str(ROOT / "build" / "bin" / "stratad")
    if not os.access(path, os.X_OK):
        pytest.fail(f"stratad not found at {path}: build it (cmake --build build --target stratad) "
                    "or set STRATA_STRATAD")
    return path


# One checkpoint root for every daemon of the session: stratad saves
# checkpoints only beneath its --checkpoint_root. The tests that build paths
# beneath it themselves read it from $STRATA_CHECKPOINT_ROOT; the package
# needs no such setting (the daemon returns each checkpoint's path).
CHECKPOINT_ROOT = tempfile.mkdtemp(prefix="strata-ckpt-root-")
os.environ["STRATA_CHECKPOINT_ROOT"] = CHECKPOINT_ROOT


class Daemon:
    def __init__(self, directory, extra_args=(), checkpoint_root=CHECKPOINT_ROOT):
        self.dir = directory
        self.socket = os.path.join(directory, "s.sock")
        self.log = os.path.join(directory, "stratad.log")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [_stratad_binary(), "--socket", self.socket, "--device", "emulated", "--io_engine", "psync",
                 "--optimizer_threads", "1",
                 *(["--checkpoint_root", checkpoint_root] if checkpoint_root else []), *extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                break
            with open(self.log) as f:
                if "stratad ready" in f.read():
                    return
            time.sleep(0.05)
        self.stop()
        with open(self.log) as f:
            pytest.fail(f"stratad did not start:\n{f.read()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self):
        with open(self.log) as f:
            return f.read()


@pytest.fixture(scope="module")
def stratad():
    with tempfile.TemporaryDirectory(prefix="strata-py-") as d:
        daemon = Daemon(d)
        yield daemon
        daemon.stop()
        assert daemon.proc.returncode == 0, f"stratad exited {daemon.proc.returncode}:\n{daemon.log_text()}"


@pytest.fixture
def workdir():
    with tempfile.TemporaryDirectory(prefix="strata-pyw-") as d:
        yield d
