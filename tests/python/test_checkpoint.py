"""(e) Checkpoints: `strata checkpoint export` writes the daemon's checkpoint
as one torch state dict that plain torch loads (torch.optim.AdamW included)
and that equals the live state; a job saved at 2 ranks resumes at 1 and 4
ranks from it; ranks killed mid-step re-attach to the daemon's job and the
run goes on with unchanged losses. Plus hostile checkpoint files. And a
ZeRO-Infinity job's checkpoint (Zero3AdamW, mode infinity; states on NVMe,
written tile by tile): its export equals the trainer's params and
torch.optim.AdamW's state, loads into torch.optim.AdamW, resumes as a ZeRO-2
offload job, and a shard of several NVMe tiles is read back in place."""
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


# ----- a ZeRO-Infinity job's checkpoint ----------------------------------------------------------

class _TorchReference:
    """The same model, data, groups, schedule, clipping and accumulation in one process with
    plain torch.optim.AdamW (rank_batch at world size 1 is the whole global batch)."""

    def __init__(self, cfg):
        import strata.torch as st
        import tiny_gpt
        self.cfg = cfg
        self.tokens = tiny_gpt.encode(tiny_gpt.make_text())
        self.model = ckpt_worker.make_model(cfg)
        self.opt = torch.optim.AdamW(st.decay_groups(self.model, cfg["weight_decay"]), lr=cfg["lr"],
                                     betas=(0.9, 0.999), eps=1e-8)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, ckpt_worker.schedule(cfg))
        self.params = [p for g in self.opt.param_groups for p in g["params"]]   # registration order
        self.steps = 0

    def grads(self):
        """Step `steps`'s clipped gradients, left in .grad."""
        cfg = self.cfg
        for micro in range(cfg["accumulation"]):
            x, y = ckpt_worker.rank_batch(self.tokens, self.steps, micro, 0, 1, cfg)
            (self.model(x, y) / cfg["accumulation"]).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg["max_norm"])

    def step(self):
        self.grads()
        self.opt.step()
        self.opt.zero_grad()
        self.sched.step()
        self.steps += 1


@contextlib.contextmanager
def _nvme_stratad(capacity, *extra):
    """A stratad of its own with an NVMe tier in a fresh temp directory (as test_zero3_gpt's)."""
    from conftest import Daemon
    with tempfile.TemporaryDirectory(prefix="strata-py-ckpt-nvme-") as d:
        daemon = Daemon(d, ["--nvme_path", d, "--nvme_capacity", capacity, *extra])
        try:
            yield daemon
        finally:
            daemon.stop()
        assert daemon.proc.returncode == 0, f"stratad exited {daemon.proc.returncode}:\n{daemon.log_text()}"


def _moment_differences(exported, ref_opt):
    """Max |exported - torch| of every param's exp_avg and exp_avg_sq (and the largest
    |exp_avg|, |exp_avg_sq| of torch's, for scale); checks steps and shapes on the way."""
    state, ref = exported["optimizer"]["state"], ref_opt.state_dict()["state"]
    assert state.keys() == ref.keys()
    worst = {"exp_avg": 0.0, "exp_avg_sq": 0.0, "max|exp_avg|": 0.0, "max|exp_avg_sq|": 0.0}
    for i in state:
        assert set(state[i]) == {"step", "exp_avg", "exp_avg_sq"}
        assert state[i]["step"].item() == ref[i]["step"].item() == exported["step"], i
        for key in ("exp_avg", "exp_avg_sq"):
            got, want = state[i][key], ref[i][key]
            assert got.shape == want.shape, (i, key, got.shape, want.shape)
            worst[key] = max(worst[key], (got - want).abs().max().item())
            worst[f"max|{key}|"] = max(worst[f"max|{key}|"], want.abs().max().item())
    return worst


@pytest.fixture(scope="module")
def infinity_saved(tmp_path_factory):
    """2 ranks train through a ZeRO-Infinity job (Zero3AdamW, mode infinity, a quarter of the
    params' bytes as host budget) on a stratad with an NVMe tier; rank 0 checkpoints the job
    after save_at steps and the CLI exports it."""
    if not os.access(STRATA_CLI, os.X_OK):
        pytest.fail(f"the strata CLI is not at {STRATA_CLI}: build it or set STRATA_CLI")
    workdir = str(tmp_path_factory.mktemp("ckpt-inf"))
    checkpoint = os.path.join(os.environ["STRATA_CHECKPOINT_ROOT"], f"inf-{uuid.uuid4().hex[:8]}")
    with _nvme_stratad("256MiB") as daemon:
        try:
            run = _spawn("infinity", 2, workdir, socket=daemon.socket, checkpoint=checkpoint)
            export = os.path.join(workdir, "inf.pt")
            print(_export([checkpoint], export).stdout.strip())
            yield {"workdir": workdir, "checkpoint": checkpoint, "export": export, "run": run,
                   "socket": daemon.socket}
        finally:
            shutil.rmtree(checkpoint, ignore_errors=True)


def test_infinity_export_equals_the_trainer_and_torch_adamw(infinity_saved):
    cfg, k = ckpt_worker.CFG, ckpt_worker.CFG["save_at"]
    with open(os.path.join(infinity_saved["checkpoint"], "manifest.json")) as f:
        manifest = json.load(f)
    assert manifest["settings"]["mode"] == "MODE_INFINITY", manifest["settings"].get("mode")
    # stratad's NVMe tile is min(64 MiB, the job's largest shard) (daemon/job_layout.cc; no flag sets
    # it), so every shard of this job is one tile; the manifest says so.
    for entry in manifest["files"]:
        assert entry["tile_numel"] == entry["padded_numel"] > 0, entry
    exported = torch.load(infinity_saved["export"], weights_only=True)
    assert exported["format"] == "strata-consolidated-v1"
    assert exported["optimizer_type"] == "AdamW"
    assert exported["step"] == k
    assert exported["world_size"] == 2
    # The trainer's whole params after step k (both ranks gathered the same), bit for bit.
    run = infinity_saved["run"]
    trainer = run[0]["saved_params"]
    assert len(exported["params"]) == len(trainer)
    for i, (p, q) in enumerate(zip(exported["params"], trainer)):
        assert p.dtype == torch.float32 and p.shape == q.shape, (i, p.shape, q.shape)
        assert torch.equal(p, q), f"param {i}: max difference {(p - q).abs().max().item()}"
        assert torch.equal(q, run[1]["saved_params"][i]), f"ranks differ in param {i}"
    # Plain torch.optim.AdamW, the same k steps in one process.
    ref = _TorchReference(cfg)
    for _ in range(k):
        ref.step()
    ref_state = ref.opt.state_dict()
    groups = exported["optimizer"]["param_groups"]
    assert [g["params"] for g in groups] == [g["params"] for g in ref_state["param_groups"]]
    for g, rg in zip(groups, ref_state["param_groups"]):
        assert tuple(g["betas"]) == tuple(rg["betas"]) and g["eps"] == rg["eps"], (g, rg)
        assert g["weight_decay"] == rg["weight_decay"], (g, rg)
        # The lr of the job's last step (the reference's scheduler has moved on since).
        assert g["lr"] == pytest.approx(cfg["lr"] * ckpt_worker.schedule(cfg)(k - 1), rel=1e-12)
    worst = _moment_differences(exported, ref.opt)
    worst["param"] = max((p - q.detach()).abs().max().item() for p, q in zip(exported["params"], ref.params))
    print(f"infinity export vs torch.optim.AdamW after {k} steps, max differences: {worst}")
    # Measured: params 1.0e-6, exp_avg 3.7e-9 (of at most 0.04), exp_avg_sq 7.3e-12 (of at most 6.1e-5).
    assert worst["param"] <= 1e-5, worst
    assert worst["exp_avg"] <= 5e-8, worst
    assert worst["exp_avg_sq"] <= 1e-10, worst
    # Plain torch loads it, and one more step with the reference's next gradients and lr lands
    # where the reference's own next step does.
    params = [torch.nn.Parameter(p.clone()) for p in exported["params"]]
    loaded = torch.optim.AdamW([dict(g, params=[params[i] for i in g["params"]]) for g in groups])
    loaded.load_state_dict(exported["optimizer"])
    ref.grads()
    for p, q in zip(params, ref.params):
        p.grad = q.grad.clone()
    for g, rg in zip(loaded.param_groups, ref.opt.param_groups):
        g["lr"] = rg["lr"]
    loaded.step()
    ref.opt.step()
    after = max((p - q).abs().max().item() for p, q in zip(params, ref.params))
    print(f"one more step from the loaded export vs the reference's: max param difference {after}")
    assert after <= 1e-5
    assert all(s["step"].item() == k + 1 for s in loaded.state_dict()["state"].values())


def test_infinity_export_resumes_as_an_offload_job(infinity_saved):
    """The export of the 2-rank Infinity job loads into OffloadAdamW at 1 rank (a ZeRO-2 offload
    job: load_state_dict re-partitions) and the run goes on as the uninterrupted Infinity run."""
    got = _spawn("resume", 1, infinity_saved["workdir"], socket=infinity_saved["socket"],
                 export=infinity_saved["export"])
    ref = infinity_saved["run"][0]
    start = ckpt_worker.CFG["save_at"]
    assert len(got[0]["losses"]) == ckpt_worker.CFG["steps"] - start
    worst_loss = max(abs(a - b) / abs(b) for a, b in zip(got[0]["losses"], ref["losses"][start:]))
    worst_param = max((got[0]["params"][name] - p).abs().max().item() for name, p in ref["params"].items())
    print(f"resumed as offload at 1 rank vs the uninterrupted infinity run: max loss difference "
          f"{worst_loss} (relative), max param difference {worst_param}")
    assert worst_loss <= 1e-5
    assert worst_param <= 1e-5


class _Wide(torch.nn.Module):
    """One weight of 2^24 + 4096 elements, past stratad's largest NVMe tile (64 MiB of fp32), and a
    bias."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4097, 4096)

    def forward(self, x):
        return self.fc(x)


def test_infinity_export_of_a_shard_of_several_tiles(tmp_path):
    """stratad tiles an Infinity shard's states by min(64 MiB, its largest shard), so only a
    shard past 64 MiB is cut: one rank, a 2^24 + 4096-element weight (tiles of 2^24 and 4096
    elements, the states written tile by tile) and a one-tile bias. The export equals the
    trainer's params bit for bit and torch.optim.AdamW's moments."""
    import strata.torch as st
    torch.manual_seed(5)
    model, ref = _Wide(), _Wide()
    ref.load_state_dict(model.state_dict())
    checkpoint = os.path.join(os.environ["STRATA_CHECKPOINT_ROOT"], f"wide-{uuid.uuid4().hex[:8]}")
    # The job's staging (3 sets x 3 streams x a 64 MiB tile) and window need more than the
    # default 1 GiB of pinned host memory.
    with _nvme_stratad("1GiB", "--pinned_capacity", "2GiB") as daemon:
        nbytes = 4 * sum(p.numel() for p in model.parameters())
        opt = st.Zero3AdamW(model, st.decay_groups(model, 0.1), lr=1e-3, socket=daemon.socket, mode="infinity",
                            pinned_budget_bytes=nbytes // 4)
        ref_opt = torch.optim.AdamW(st.decay_groups(ref, 0.1), lr=1e-3)
        try:
            for step in range(2):
                x = torch.randn(8, 4097, generator=torch.Generator().manual_seed(step))
                model(x).square().mean().backward()
                ref(x).square().mean().backward()
                for o in (opt, ref_opt):
                    o.step()
                    o.zero_grad()
            opt.client.save_checkpoint(opt.job_name, checkpoint)
            opt.gather_params()
            live = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
        finally:
            opt.close()
    try:
        with open(os.path.join(checkpoint, "manifest.json")) as f:
            files = {e["file"]: (e["padded_numel"], e["tile_numel"]) for e in json.load(f)["files"]}
        assert files == {"rank0-shard0.bin": ((1 << 24) + 4096, 1 << 24), "rank0-shard1.bin": (4096, 4096)}, files
        export = str(tmp_path / "wide.pt")
        _export([checkpoint], export)
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    exported = torch.load(export, weights_only=True)
    os.unlink(export)   # 200 MB
    assert exported["step"] == 2 and exported["world_size"] == 1
    for i, (p, q) in enumerate(zip(exported["params"], live)):
        assert p.shape == q.shape and torch.equal(p, q), f"param {i}"
    worst = _moment_differences(exported, ref_opt)
    ref_params = [p for g in ref_opt.param_groups for p in g["params"]]
    worst["param"] = max((p - q.detach()).abs().max().item() for p, q in zip(exported["params"], ref_params))
    print(f"several tiles: export vs torch.optim.AdamW after 2 steps, max differences: {worst}")
    # Measured: params 1.5e-7, exp_avg 1.5e-11 (of at most 1.0e-4), exp_avg_sq 1.7e-16 (of at most 8.3e-10).
    assert worst["param"] <= 1e-5, worst
    assert worst["exp_avg"] <= 2e-10, worst
    assert worst["exp_avg_sq"] <= 2e-15, worst


def _retile(src, dst, tile):
    """A copy of checkpoint `src` at `dst` whose shard files interleave their streams by tiles of
    `tile` elements (the manifest's tile_numel says so), as a daemon of another NVMe tile writes."""
    os.mkdir(dst)
    with open(os.path.join(src, "manifest.json")) as f:
        manifest = json.load(f)
    n_streams, psize = len(manifest["streams"]), manifest["param_bytes"]
    for e in manifest["files"]:
        padded, old = e["padded_numel"], e["tile_numel"]
        with open(os.path.join(src, e["file"]), "rb") as f:
            raw = f.read()
        floats = torch.frombuffer(bytearray(raw[:n_streams * padded * 4]), dtype=torch.float32)
        streams = [[] for _ in range(n_streams)]
        for begin in range(0, padded, old):          # un-interleave the file's own tiling
            count = min(old, padded - begin)
            for k in range(n_streams):
                at = begin * n_streams + k * count
                streams[k].append(floats[at:at + count])
        streams = [torch.cat(s) for s in streams]
        new = min(tile, padded)
        out = [streams[k][b:b + new] for b in range(0, padded, new) for k in range(n_streams)]
        with open(os.path.join(dst, e["file"]), "wb") as f:
            f.write(torch.cat(out).numpy().tobytes())
            f.write(raw[n_streams * padded * 4:])
        assert os.path.getsize(os.path.join(dst, e["file"])) == padded * (n_streams * 4 + psize)
        e["tile_numel"] = new
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    return manifest


def test_a_checkpoint_of_another_tiling_loads_the_same_states(infinity_saved):
    """LoadCheckpoint reads each shard file by the tiling its manifest lists, not by the loading
    daemon's own NVMe tile: the Infinity checkpoint re-interleaved by 1000-element tiles loads,
    and saving the loaded job again gives back the original files byte for byte. A manifest
    whose tile or size disagrees with its file is refused by name, and loads nothing."""
    from strata import client as strata_client
    from strata.errors import StrataError
    root = os.environ["STRATA_CHECKPOINT_ROOT"]
    src = infinity_saved["checkpoint"]
    tag = uuid.uuid4().hex[:8]
    retiled, again = os.path.join(root, f"retiled-{tag}"), os.path.join(root, f"again-{tag}")
    bad_tile, bad_size = os.path.join(root, f"badtile-{tag}"), os.path.join(root, f"badsize-{tag}")
    client = strata_client.connect(infinity_saved["socket"])
    try:
        manifest = _retile(src, retiled, 1000)
        assert any(e["padded_numel"] > 1000 for e in manifest["files"]), "no shard spans two tiles"
        client.load_checkpoint(retiled, f"retiled-{tag}")
        client.save_checkpoint(f"retiled-{tag}", again)
        client.delete_job(f"retiled-{tag}")
        for e in manifest["files"]:
            with open(os.path.join(src, e["file"]), "rb") as a, open(os.path.join(again, e["file"]), "rb") as b:
                assert a.read() == b.read(), f"{e['file']} differs after loading it re-tiled and saving it again"
        # Hostile: a tile of 0 elements, and a file a float short of its layout.
        manifest = _retile(src, bad_tile, 1000)
        manifest["files"][0]["tile_numel"] = 0
        with open(os.path.join(bad_tile, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        with pytest.raises(StrataError, match="tile_numel is 0"):
            client.load_checkpoint(bad_tile, f"badtile-{tag}")
        manifest = _retile(src, bad_size, 1000)
        victim = os.path.join(bad_size, manifest["files"][-1]["file"])
        os.truncate(victim, os.path.getsize(victim) - 4)
        with pytest.raises(StrataError, match="holds .* bytes; its layout says"):
            client.load_checkpoint(bad_size, f"badsize-{tag}")
        names = [j["name"] for j in client.list_jobs()]
        assert not any(tag in n for n in names), names
    finally:
        for d in (retiled, again, bad_tile, bad_size):
            shutil.rmtree(d, ignore_errors=True)


def test_a_zero3_leader_that_fails_fails_every_rank(stratad, tmp_path):
    """ZeRO-3's state dicts run the daemon calls on rank 0 only; when rank 0 fails (here: no
    its save raises there), rank 1 raises the leader's error instead of waiting at a
    barrier forever, and both ranks train on."""
    got = _spawn("leader_fails", 2, str(tmp_path), socket=stratad.socket)
    assert got[0]["raised"].startswith("RuntimeError: injected: the leader's save was refused"), got[0]
    assert got[1]["raised"].startswith("StrataError: failed on rank 0: RuntimeError: injected"), got[1]
