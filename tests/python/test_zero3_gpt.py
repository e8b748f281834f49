"""(b) ZeRO-3 from Python: the tiny GPT of (a), 2 ranks over gloo, 30 steps,
two param groups, warmup + cosine, clipping and accumulation 2, through
st.initialize at ZeRO stage 3 -- offload_param cpu (zero3) and NVMe with a
host budget of a quarter of the params (infinity) -- against DDP +
torch.optim.AdamW and strata's ZeRO-2 offload run, and against each other
bit for bit."""
import re
import tempfile

import pytest
import torch

import train_gpt
from conftest import Daemon
from strata.torch import zero3

ZERO3 = ["zero3", "infinity"]


@pytest.fixture(scope="module")
def nvme_stratad():
    with tempfile.TemporaryDirectory(prefix="strata-py-z3-") as d:
        daemon = Daemon(d, ["--nvme_path", d, "--nvme_capacity", "256MiB"])
        yield daemon
        daemon.stop()
        assert daemon.proc.returncode == 0, f"stratad exited {daemon.proc.returncode}:\n{daemon.log_text()}"


@pytest.fixture(scope="module")
def runs(nvme_stratad, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("gpt3"))
    cfg = dict(train_gpt.DEFAULTS)
    return {mode: train_gpt.run_mode(mode, cfg, nvme_stratad.socket, 2, workdir)
            for mode in ["torch", "ds-config"] + ZERO3}


@pytest.mark.parametrize("ref", ["torch", "ds-config"])
@pytest.mark.parametrize("mode", ZERO3)
def test_losses_and_params_match(runs, mode, ref):
    assert len(runs[mode][0]["losses"]) == 30
    for step, (a, b) in enumerate(zip(runs[mode][0]["losses"], runs[ref][0]["losses"])):
        assert abs(a - b) <= 1e-5 * abs(b), f"{mode} step {step}: loss {a} vs {ref} {b}"
    for rank in range(2):
        want, got = runs[ref][rank]["params"], runs[mode][rank]["params"]
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].shape == want[name].shape, f"{mode} {name}: shape {got[name].shape}"
            diff = (got[name] - want[name]).abs().max().item()
            assert diff <= 1e-5, f"{mode} rank {rank} {name}: max difference {diff} from {ref}"


def test_tied_embeddings_train_as_torch(nvme_stratad, tmp_path_factory):
    """Issue 25 item 3: the tiny GPT with its output projection tied to its token embedding (one
    param held by two modules, as GPT-2's and LLaMA's tie_word_embeddings), 2 ranks at stage 3 on
    NVMe: gathered for both modules, its gradient summed over both uses and reduced once, equal to
    DDP + torch.optim.AdamW."""
    workdir = str(tmp_path_factory.mktemp("gpt3-tied"))
    cfg = dict(train_gpt.DEFAULTS, tie=True, steps=10)
    ref = train_gpt.run_mode("torch", cfg, nvme_stratad.socket, 2, workdir)
    got = train_gpt.run_mode("infinity", cfg, nvme_stratad.socket, 2, workdir)
    assert "head.weight" not in ref[0]["params"]       # one param: named once
    for step, (a, b) in enumerate(zip(got[0]["losses"], ref[0]["losses"])):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: loss {a} vs torch {b}"
    for rank in range(2):
        for name, want in ref[rank]["params"].items():
            diff = (got[rank]["params"][name] - want).abs().max().item()
            assert diff <= 1e-5, f"rank {rank} {name}: max difference {diff} from torch"


def test_offload_and_infinity_agree_bit_for_bit(runs):
    assert runs["zero3"][0]["losses"] == runs["infinity"][0]["losses"]
    for rank in range(2):
        for name, value in runs["zero3"][rank]["params"].items():
            assert torch.equal(value, runs["infinity"][rank]["params"][name]), f"rank {rank} {name}"


def test_ranks_hold_the_same_params(runs):
    for mode in ZERO3:
        a, b = runs[mode][0]["params"], runs[mode][1]["params"]
        for name in a:
            assert torch.equal(a[name], b[name]), f"{mode}: rank 0 and 1 differ in {name}"


def test_trainer_holds_only_the_tiny_params_between_steps(runs):
    total = sum(p.numel() for p in runs["torch"][0]["params"].values())
    tiny = sum(p.numel() for p in runs["torch"][0]["params"].values() if p.numel() <= 256)
    for mode in ZERO3:
        for rank in range(2):
            assert runs[mode][rank]["held_between_steps"] == tiny, (mode, rank, tiny, total)
    assert tiny < total / 20


def test_infinity_pages_params_from_nvme(runs):
    # With a host budget of a quarter of the params, every step reads params back from NVMe:
    # far more than the params' own size over 30 steps.
    total_bytes = 4 * sum(p.numel() for p in runs["torch"][0]["params"].values())
    (line,) = runs["infinity"][0]["daemon_stats"]
    read = int(re.search(r"nvme read (\d+) B", line).group(1))
    assert read > 10 * total_bytes, line
    (line,) = runs["zero3"][0]["daemon_stats"]
    assert int(re.search(r"nvme read (\d+) B", line).group(1)) == 0, line


def test_deepspeed_stage3_options():
    assert zero3.options_from_config({"stage": 3}) == {"mode": "offload", "persistence_threshold": 100_000}
    got = zero3.options_from_config({"stage": 3, "stage3_param_persistence_threshold": 0,
                                     "offload_param": {"device": "nvme", "nvme_path": "/n", "max_in_cpu": 1000}})
    assert got == {"mode": "infinity", "persistence_threshold": 0, "pinned_budget_bytes": 4000, "nvme_path": "/n"}
    with pytest.raises(ValueError, match="offload_param.device 'gpu'"):
        zero3.options_from_config({"stage": 3, "offload_param": {"device": "gpu"}})
    with pytest.raises(ValueError, match="stage3_param_persistence_threshold"):
        zero3.options_from_config({"stage": 3, "stage3_param_persistence_threshold": -1})
    with pytest.raises(ValueError, match="max_in_cpu"):
        zero3.options_from_config({"stage": 3, "offload_param": {"device": "nvme", "max_in_cpu": 0}})


def test_stage3_takes_16bit_models_from_the_config(stratad):
    """st.initialize at stage 3 with fp16 (its loss-scaler options passed on) and with bf16: the
    model comes back 16-bit and trains (the bits are test_fp16_and_state's)."""
    import strata.torch as st
    for section, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
        cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3},
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
               section: {"enabled": True, **({"initial_scale_power": 8} if section == "fp16" else {})}}
        model, opt = st.initialize(model, config=cfg, socket=stratad.socket)
        assert {p.dtype for p in model.parameters()} == {dtype}
        assert opt.loss_scale == (2.0 ** 8 if section == "fp16" else 1.0)
        opt.backward(model(torch.randn(2, 8, dtype=dtype)).float().pow(2).mean())
        opt.step()
        assert not opt.last_step_skipped
        opt.close()


class _Net(torch.nn.Module):
    """Two used layers, a norm and an unused layer (its params get no gradient)."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.b = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


@pytest.mark.parametrize("mode", ["offload", "infinity"])
def test_one_process_with_an_unused_layer_and_eval(nvme_stratad, mode):
    """Zero3AdamW built directly, without torch.distributed: every step equals torch.optim.AdamW
    given zero gradients for the unused layer (what the optimizer hands the daemon for it); a
    forward under no_grad gathers and frees as well; close() leaves the trained params whole."""
    import strata.torch as st
    torch.manual_seed(3)
    model = _Net()
    ref = _Net()
    ref.load_state_dict(model.state_dict())
    opt = st.Zero3AdamW(model, lr=1e-2, weight_decay=0.1, socket=nvme_stratad.socket, mode=mode,
                        persistence_threshold=32, pinned_budget_bytes=8 << 10)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    try:
        assert model.a.weight.numel() == 0 and model.norm.weight.numel() == 32   # partitioned vs resident
        # Infinity's params came in batches of the window's room (the budget, at least the largest
        # shard here), not all at once; offload keeps every param in host memory anyway.
        batch = opt._session.init_batch_bytes
        assert (batch > 0) == (mode == "infinity"), batch
        partitioned = [model.a.weight, model.a.bias, model.b.weight, model.b.bias]
        views = []

        def pack(t):
            # A saved view of a gathered param would keep it alive from forward to backward.
            if any(t._base is p for p in partitioned):
                views.append(tuple(t.shape))
            return t

        for step in range(4):
            x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step), requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(x)
            assert not views, f"autograd saved views of gathered params: {views}"
            out.square().mean().backward()
            ref(x).square().mean().backward()
            x = x.detach()
            for p in ref.unused.parameters():
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad()
            ref_opt.step()
            ref_opt.zero_grad()
            with torch.no_grad():
                got, want = model(x), ref(x)
            assert torch.allclose(got, want, rtol=0, atol=1e-6), f"step {step}: {(got - want).abs().max()}"
            assert model.b.weight.numel() == 0
    finally:
        opt.close()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert p.shape == q.shape and torch.allclose(p, q, rtol=0, atol=1e-6), name


def test_session_init_batches_and_write_grad(nvme_stratad):
    """The session calls under Zero3AdamW, as a trainer of its own would use them: init_params in the
    batches the daemon names (the list checked), write_grad (the bytes land; a bad index, size or buffer
    is refused, naming it)."""
    import json
    import numpy
    import strata
    from strata import client as strata_client
    c = strata_client.connect(nvme_stratad.socket)
    cfg = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"},
                                 "offload_optimizer": {"device": "nvme"}},
           "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}}
    numel, shards = 4096, 6
    c.create_job("py-session-calls", 1, mode="infinity", deepspeed_config_json=json.dumps(cfg),
                 pinned_budget_bytes=3 * 4 * numel)
    s = c.attach("py-session-calls", 0)
    s.register_tensors([(f"w{i}", numel, 0) for i in range(shards)])
    assert s.init_batch_bytes == 3 * 4 * numel
    with pytest.raises(strata.StrataError, match="out of range") as e:
        s.init_params([0, shards])
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(strata.StrataError, match="listed twice"):
        s.init_params([1, 1])
    slots = {sh["index"]: sh for sh in s.shards()}
    batch = []
    for i in range(shards):
        numpy.frombuffer(slots[i]["param"], dtype=numpy.float32)[:] = i + 0.5
        batch.append(i)
        if len(batch) * 4 * numel == s.init_batch_bytes:
            s.init_params(batch)
            batch = []
    assert not batch
    grad = numpy.arange(numel, dtype=numpy.float32) / numel
    for i in range(shards):
        s.write_grad(i, grad.view(numpy.uint8))
        assert numpy.array_equal(numpy.frombuffer(slots[i]["grad"], dtype=numpy.float32), grad)
        s.grad_ready(i, 0)
    assert not s.wait_step(0)["skipped"]
    with pytest.raises(strata.StrataError, match="out of range"):
        s.write_grad(shards, grad.view(numpy.uint8))
    with pytest.raises(strata.StrataError, match="do not fit"):
        s.write_grad(0, grad.view(numpy.uint8), offset=8)
    with pytest.raises(ValueError, match="contiguous"):
        s.write_grad(0, grad.view(numpy.uint8)[::2])
    s.close()
    c.delete_job("py-session-calls")


def _train(model, opt, steps, first, extra_zero_grads=()):
    """`steps` steps of the _Net task from step `first` on (fixed data per step)."""
    for step in range(first, first + steps):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(100 + step))
        model(x).square().mean().backward()
        for p in extra_zero_grads:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad()


@pytest.mark.parametrize("mode", ["offload", "infinity"])
def test_state_dict_and_load_state_dict(nvme_stratad, mode):
    """Zero3AdamW.state_dict() is torch.optim.AdamW's state after the same steps (numbering, step,
    moments) and loads into it; a new Zero3AdamW over the trained params that loads it continues
    bit for bit as the optimizer it came from, and one that loads torch's own state dict continues
    as torch does."""
    import strata.torch as st
    torch.manual_seed(7)
    model, ref = _Net(), _Net()
    ref.load_state_dict(model.state_dict())
    kw = dict(lr=1e-2, weight_decay=0.1, socket=nvme_stratad.socket, mode=mode, persistence_threshold=32,
              pinned_budget_bytes=8 << 10)
    opt = st.Zero3AdamW(model, st.decay_groups(model, 0.1), **kw)
    ref_opt = torch.optim.AdamW(st.decay_groups(ref, 0.1), lr=1e-2)
    try:
        _train(model, opt, 3, 0)
        _train(ref, ref_opt, 3, 0, extra_zero_grads=list(ref.unused.parameters()))
        sd = opt.state_dict()
        want = ref_opt.state_dict()
        assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in want["param_groups"]]
        assert sd["state"].keys() == want["state"].keys()
        for i, entry in sd["state"].items():
            # fp32_master: the daemon's masters, which a resume takes (torch's AdamW ignores it).
            assert set(entry) == {"step", "exp_avg", "exp_avg_sq", "fp32_master"}, entry.keys()
            assert entry["step"].item() == want["state"][i]["step"].item() == 3
            for key in ("exp_avg", "exp_avg_sq"):
                assert entry[key].shape == want["state"][i][key].shape, (i, key)
                assert torch.allclose(entry[key], want["state"][i][key], rtol=1e-5, atol=1e-9), (i, key)
        torch.optim.AdamW(st.decay_groups(_Net(), 0.1)).load_state_dict(sd)
        opt.gather_params()
        trained = {name: p.detach().clone() for name, p in model.named_parameters()}
        _train(model, opt, 2, 3)
        opt.gather_params()
        continued = {name: p.detach().clone() for name, p in model.named_parameters()}
        number = {id(p): i for i, p in enumerate(q for g in opt.param_groups for q in g["params"])}
        for name, p in model.named_parameters():
            if id(p) in number:
                assert torch.equal(sd["state"][number[id(p)]]["fp32_master"], trained[name]), name
    finally:
        opt.close()
    # Resumed from its own state dict: bit for bit; from torch's: as torch continues.
    for source, expect_exact in ((sd, True), (want, False)):
        resumed = _Net()
        resumed.load_state_dict(trained)
        opt2 = st.Zero3AdamW(resumed, st.decay_groups(resumed, 0.1), **kw)
        try:
            opt2.load_state_dict(source)
            assert opt2.state_dict()["state"][0]["step"].item() == 3
            _train(resumed, opt2, 2, 3)
            opt2.gather_params()
            got = {name: p.detach().clone() for name, p in resumed.named_parameters()}
        finally:
            opt2.close()
        if expect_exact:
            for name, value in continued.items():
                assert torch.equal(got[name], value), f"{name}: {(got[name] - value).abs().max().item()}"
    _train(ref, ref_opt, 2, 3, extra_zero_grads=list(ref.unused.parameters()))
    for (name, p), q in zip(resumed.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=0, atol=1e-6), f"{name}: {(p - q).abs().max().item()}"


def test_load_state_dict_refuses_a_mismatched_dict(nvme_stratad):
    import strata.torch as st
    model = _Net()
    opt = st.Zero3AdamW(model, st.decay_groups(model, 0.1), lr=1e-2, socket=nvme_stratad.socket,
                        persistence_threshold=32)
    try:
        _train(model, opt, 1, 0)
        sd = opt.state_dict()
        with pytest.raises(ValueError, match="param groups"):
            opt.load_state_dict({"state": sd["state"], "param_groups": sd["param_groups"][:1]})
        short = {i: dict(e) for i, e in sd["state"].items()}
        short[0]["exp_avg"] = short[0]["exp_avg"].reshape(-1)[:-1]
        with pytest.raises(ValueError, match="elements"):
            opt.load_state_dict({"state": short, "param_groups": sd["param_groups"]})
        del short[0]["exp_avg"]
        with pytest.raises(ValueError, match="lacks 'exp_avg'"):
            opt.load_state_dict({"state": short, "param_groups": sd["param_groups"]})
        _train(model, opt, 1, 1)         # still trains after the refusals
    finally:
        opt.close()
