"""(e) Checkpoints: `strata checkpoint export` writes the daemon's checkpoint
as one torch state dict that plain torch loads (torch.optim.AdamW included)
and that equals the live state; a job saved at 2 ranks resumes at 1 and 4
ranks from it; ranks killed mid-step re-attach to the daemon's job and the
run goes on with unchanged losses. Plus hostile checkpoint files."""
import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest
import torch
import torch.multiprocessing as mp

import ckpt_worker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATA_CLI = os.environ.get("STRATA_CLI") or os.path.join(ROOT, "build", "bin", "strata")


def _spawn(phase, world, workdir, **task):
    task = dict(task, phase=phase, out=workdir)
    store = os.path.join(workdir, f"store-{phase}-{world}-{uuid.uuid4().hex[:6]}")
    mp.spawn(ckpt_worker.run, args=(world, store, workdir, task), nprocs=world, join=True)
    return [torch.load(os.path.join(workdir, f"{phase}-{world}-{r}.pt")) for r in range(world)]


def _export(dirs, to, check=True):
    proc = subprocess.run([STRATA_CLI, "checkpoint", "export", *dirs, "--to", to],
                          capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def saved(stratad, tmp_path_factory):
    if not os.access(STRATA_CLI, os.X_OK):
        pytest.fail(f"the strata CLI is not at {STRATA_CLI}: build it or set STRATA_CLI")
    workdir = str(tmp_path_factory.mktemp("ckpt"))
    # conftest points STRATA_CHECKPOINT_ROOT at the daemons' --checkpoint_root.
    checkpoint = os.path.join(os.environ["STRATA_CHECKPOINT_ROOT"], f"gpt-{uuid.uuid4().hex[:8]}")
    first = _spawn("first", 2, workdir, socket=stratad.socket, checkpoint=checkpoint)
    export = os.path.join(workdir, "gpt.pt")
    _export([checkpoint], export)
    yield {"workdir": workdir, "checkpoint": checkpoint, "export": export, "first": first,
           "socket": stratad.socket}
    shutil.rmtree(checkpoint, ignore_errors=True)


def test_export_equals_the_live_state(saved):
    exported = torch.load(saved["export"], weights_only=True)
    live = saved["first"][0]["live_state"]
    assert exported["format"] == "strata-consolidated-v1"
    assert exported["optimizer_type"] == "AdamW"
    assert exported["step"] == ckpt_worker.CFG["save_at"]
    assert exported["world_size"] == 2
    state = exported["optimizer"]["state"]
    assert state.keys() == live["state"].keys()
    for i in state:
        assert set(state[i]) == {"step", "exp_avg", "exp_avg_sq"}
        assert state[i]["step"].item() == live["state"][i]["step"].item() == ckpt_worker.CFG["save_at"]
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[i][key], live["state"][i][key]), f"param {i} {key}"
    live_params = saved["first"][0]["live_params"]
    groups = exported["optimizer"]["param_groups"]
    assert [len(g["params"]) for g in groups] == [len(g["params"]) for g in live["param_groups"]]
    for g, lg in zip(groups, live["param_groups"]):
        for key in ("betas", "eps", "weight_decay"):
            assert g[key] == pytest.approx(lg[key], rel=1e-12), key
        # The daemon records the lr its last step ran with (the scheduler has
        # moved the live group's on since).
        cfg = ckpt_worker.CFG
        assert g["lr"] == pytest.approx(cfg["lr"] * ckpt_worker.schedule(cfg)(cfg["save_at"] - 1), rel=1e-12)
    # Registration order is the param groups' order, as torch numbers a state dict's params.
    order = [i for g in live["param_groups"] for i in g["params"]]
    assert order == list(range(len(exported["params"])))
    for i, p in enumerate(exported["params"]):
        assert p.dtype == torch.float32
        assert torch.equal(p, live_params[i]), f"param {i}"


def test_export_loads_into_torch_adamw_without_strata(saved):
    # -I: no PYTHONPATH, no user site; the venv's torch only.
    code = f"""
import importlib.util, sys, torch
assert importlib.util.find_spec("strata") is None, "strata is importable"
d = torch.load({saved['export']!r}, weights_only=True)
params = [torch.nn.Parameter(p.clone()) for p in d["params"]]
groups = [dict(g, params=[params[i] for i in g["params"]]) for g in d["optimizer"]["param_groups"]]
opt = torch.optim.AdamW(groups)
opt.load_state_dict(d["optimizer"])
for p in params:
    p.grad = torch.ones_like(p)
opt.step()
s = opt.state_dict()["state"]
print(len(s), float(s[0]["step"]))
"""
    proc = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120,
                          cwd="/")
    assert proc.returncode == 0, proc.stderr
    n, step = proc.stdout.split()
    assert int(n) == len(saved["first"][0]["live_state"]["state"])
    assert float(step) == ckpt_worker.CFG["save_at"] + 1


@pytest.mark.parametrize("world", [1, 4])
def test_resume_at_another_world_size(saved, world):
    got = _spawn("resume", world, saved["workdir"], socket=saved["socket"], export=saved["export"])
    ref = saved["first"][0]
    start = ckpt_worker.CFG["save_at"]
    assert len(got[0]["losses"]) == ckpt_worker.CFG["steps"] - start
    for k, (a, b) in enumerate(zip(got[0]["losses"], ref["losses"][start:])):
        assert abs(a - b) <= 1e-5 * abs(b), f"world {world}, step {start + k}: loss {a} vs 2 ranks {b}"
    for name, p in ref["params"].items():
        for r in range(world):
            diff = (got[r]["params"][name] - p).abs().max().item()
            assert diff <= 1e-5, f"world {world} rank {r} {name}: max difference {diff}"


def test_killed_ranks_reattach_and_the_losses_are_unchanged(saved):
    workdir = saved["workdir"]
    job = f"doomed-{uuid.uuid4().hex[:8]}"
    kill_at = 5
    task = dict(phase="doomed", out=workdir, socket=saved["socket"], job=job, kill_at=kill_at)
    store = os.path.join(workdir, f"store-doomed-{uuid.uuid4().hex[:6]}")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=ckpt_worker.run, args=(r, 2, store, workdir, task)) for r in range(2)]
    for p in procs:
        p.start()
    procs[1].join(timeout=240)
    assert procs[1].exitcode == -9, f"rank 1 was to SIGKILL itself at step {kill_at}; exit {procs[1].exitcode}"
    # As a launcher does when a worker dies: the other ranks go too.
    procs[0].kill()
    procs[0].join()
    assert torch.load(os.path.join(workdir, "doomed-1-at")) == kill_at - 1
    # The daemon keeps the job (masters, moments, params, the half-handed step).
    time.sleep(0.5)
    got = _spawn("reattach", 2, workdir, socket=saved["socket"], job=job)
    ref = saved["first"][0]
    assert got[0]["start"] == kill_at
    assert got[0]["losses"] == ref["losses"][kill_at:]
    for name, p in ref["params"].items():
        for r in range(2):
            assert torch.equal(got[r]["params"][name], p), f"rank {r} {name}"


# ----- hostile checkpoints ---------------------------------------------------------------------

def _copy(saved, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(saved["checkpoint"], d)
    return d


def _edit_manifest(d, fn):
    path = d / "manifest.json"
    m = json.loads(path.read_text())
    fn(m)
    path.write_text(json.dumps(m))


def _fails(saved, d, tmp_path, needle):
    proc = _export([str(d)], str(tmp_path / "out.pt"), check=False)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert needle in proc.stderr, proc.stderr
    assert not (tmp_path / "out.pt").exists()


def test_hostile_truncated_shard(saved, tmp_path):
    d = _copy(saved, tmp_path)
    shard = d / "rank1-shard0.bin"
    shard.write_bytes(shard.read_bytes()[:-4])
    _fails(saved, d, tmp_path, "rank1-shard0.bin holds")


def test_hostile_range_outside_its_tensor(saved, tmp_path):
    d = _copy(saved, tmp_path)
    _edit_manifest(d, lambda m: m["files"][0]["ranges"][0].__setitem__(1, 1 << 40))
    _fails(saved, d, tmp_path, "lie outside tensor")


def test_hostile_missing_rank_and_overlap(saved, tmp_path):
    d = _copy(saved, tmp_path)
    _edit_manifest(d, lambda m: m.__setitem__("files", [f for f in m["files"] if f["rank"] == 0]))
    _fails(saved, d, tmp_path, "needs every daemon's directory")
    d2 = tmp_path / "ck2"
    shutil.copytree(saved["checkpoint"], d2)
    _edit_manifest(d2, lambda m: m["files"][1]["ranges"].__setitem__(
        slice(None), [list(r) for r in m["files"][0]["ranges"]]))
    _fails(saved, d2, tmp_path, "owned twice")


def test_hostile_file_names_links_and_sizes(saved, tmp_path):
    d = _copy(saved, tmp_path)
    _edit_manifest(d, lambda m: m["files"][0].__setitem__("file", "../../etc/passwd"))
    _fails(saved, d, tmp_path, "is not 'rank0-shard0.bin'")
    d = tmp_path / "ck3"
    shutil.copytree(saved["checkpoint"], d)
    (d / "rank0-shard0.bin").unlink()
    os.symlink("/etc/passwd", d / "rank0-shard0.bin")
    _fails(saved, d, tmp_path, "symbolic link")
    d = tmp_path / "ck4"
    shutil.copytree(saved["checkpoint"], d)
    _edit_manifest(d, lambda m: m["files"][0].__setitem__("padded_numel", -1))
    _fails(saved, d, tmp_path, "padded_numel is -1")
    d = tmp_path / "ck5"
    shutil.copytree(saved["checkpoint"], d)
    (d / "manifest.json").write_text("{not json")
    _fails(saved, d, tmp_path, "not valid JSON")
    d = tmp_path / "ck6"
    shutil.copytree(saved["checkpoint"], d)
    _edit_manifest(d, lambda m: m["tensors"][0].__setitem__("numel", "12"))
    _fails(saved, d, tmp_path, "numel is '12'")


def test_export_refuses_to_replace_a_file(saved, tmp_path):
    target = tmp_path / "exists.pt"
    target.write_text("keep me")
    proc = _export([saved["checkpoint"]], str(target), check=False)
    assert proc.returncode == 1 and "exists" in proc.stderr
    assert target.read_text() == "keep me"
    usage = subprocess.run([STRATA_CLI, "checkpoint", "export", saved["checkpoint"]], capture_output=True,
                           text=True)
    assert usage.returncode == 2 and "--to" in usage.stderr
