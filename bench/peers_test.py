"""Tests of the benches' Python peers and plot.py, run by ctest under the venv
(STRATA_PYTHON): adam_peers.py measures what it says and reports what it cannot
do; plot.py draws every bench's JSON."""
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def run_peer(peer, variants, python=sys.executable):
    out = subprocess.run([python, os.path.join(HERE, "adam_peers.py"), "--peer", peer, "--variants",
                          variants, "--size", "20000", "--threads", "1", "--warmup", "1", "--steps", "2"],
                         capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return out, [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]


def test_torch_fused_runs_every_adamw_variant_and_says_lion_is_missing():
    out, rows = run_peer("torch_fused", "adamw:fp32:none,adamw:fp16:fp16,adamw:bf16:bf16,lion:fp16:fp16")
    assert out.returncode == 0, out.stderr
    assert [r["variant"] for r in rows] == ["adamw:fp32:none", "adamw:fp16:fp16", "adamw:bf16:bf16",
                                            "lion:fp16:fp16"]
    for r in rows[:3]:
        assert r["min_step_s"] > 0 and r["elements_per_s"] == pytest.approx(20000 / r["min_step_s"])
        assert r["version"].startswith("torch 2.")
    assert "no lion" in rows[3]["unsupported"]


def test_fused_peer_steps_like_torch_adamw():
    # The peer's fp16 variant is upcast + fused step + downcast: its params
    # must match the unfused torch AdamW on the same inputs.
    import torch
    sys.path.insert(0, HERE)
    import adam_peers
    n = 1000
    p = torch.full((n,), 0.5)
    p.grad = torch.full((n,), 1e-3)
    ref = adam_peers.torch_optimizer("adamw", [p], "foreach")
    q = torch.full((n,), 0.5)
    q.grad = torch.full((n,), 1e-3)
    fused = adam_peers.torch_optimizer("adamw", [q], "fused")
    for _ in range(3):
        ref.step()
        fused.step()
    torch.testing.assert_close(p, q)


def test_bad_variant_is_an_error():
    out, _ = run_peer("torch_fused", "adamw:fp8:none")
    assert out.returncode != 0
    assert "bad variant" in out.stderr


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="no Debian python3")
def test_foreach_peer_under_debian_python_reports_its_torch_or_its_absence():
    out, rows = run_peer("torch_foreach", "adamw:fp32:none", python="/usr/bin/python3")
    if out.returncode == 3:  # no python3-torch: one error line naming the cause
        assert "cannot import torch" in rows[0]["error"]
    else:
        assert out.returncode == 0, out.stderr
        assert rows[0]["elements_per_s"] > 0


def plot(tmp_path, kind, j):
    src = tmp_path / f"{kind}.json"
    src.write_text(json.dumps(j))
    png = tmp_path / f"{kind}.png"
    out = subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), str(src), str(png)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert f"({kind})" in out.stdout  # detected from the JSON
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_adam(tmp_path):
    row = {"algo": "adamw", "grad_dtype": "fp16", "param_out": "fp16", "threads": 2, "elements": 1e8,
           "elements_per_s": 2.8e9, "limit_elements_per_s": 3.0e9, "speedup_vs_best_peer": 1.6,
           "peers": {"torch_fused": 1.7e9, "deepspeed": None, "torch_foreach": 0.4e9}}
    plot(tmp_path, "adam", {"kernel_target": "AVX3", "results": [row, dict(row, threads=1)]})


def test_plot_io(tmp_path):
    res = [{"engine": e, "op": op, "block_size": bs, "queue_depth": qd, "mbps": 2000.0, "fio_mbps": 1800.0,
            "fio_huge_mbps": 1900.0} for e in ("io_uring", "libaio") for op in ("read", "write")
           for bs in (1 << 20, 8 << 20) for qd in (1, 8)]
    ds = [{"op": op, "block_size": bs, "queue_depth": qd, "ours_mbps": 2000.0, "ds_io_mbps": 1900.0, "ratio": 1.05}
          for op in ("read", "write") for bs in (1 << 20, 8 << 20) for qd in (1, 8)]
    store = {"write_mbps": 2000, "read_mbps": 1900, "raw_write_mbps": 2050, "raw_read_mbps": 1950,
             "checksum": "xxh3"}
    plot(tmp_path, "io", {"results": res, "ds_io": ds, "extent_store": store,
                          "config": {"dir": "/x", "load_average_at_start": [1.0, 1.0, 1.0]}})


def test_plot_prefetch(tmp_path):
    rows = [{"trace": t, "capacity": c, "policy": p, "hit_rate": c, "stall_fraction": 1 - c}
            for t in ("dense", "moe") for p in ("lru", "predictor", "belady") for c in (0.25, 0.5, 0.75)]
    plot(tmp_path, "prefetch", {"mode": "simulated", "results": rows})


def test_plot_rpc(tmp_path):
    plot(tmp_path, "rpc", {"results": [{"call": "noop", "p50_us": 80, "p99_us": 260},
                                       {"call": "grad_ready", "p50_us": 90, "p99_us": 280}],
                           "handoff": {"bucket_bytes": 64 << 20, "memcpy_s": 0.01, "handoff_s": 0.012},
                           "handoff_vs_memcpy": 0.83})
