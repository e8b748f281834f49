"""(d) fp16 dynamic loss scaling skips and rescales as DeepSpeed's scaler does;
(e) state_dict() into torch.optim.AdamW and back continues identically.
One rank each (the multi-rank paths are test_offload_gpt's)."""
import copy
import os

import pytest
import torch
import torch.nn as nn

import strata
import strata.torch as st

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _mlp(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    return model.to(dtype)


def _data(step, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(8, 16, generator=g).to(dtype)
    y = torch.randint(0, 4, (8,), generator=g)
    return x, y


def _loss(model, step, dtype=torch.float32):
    x, y = _data(step, dtype)
    return nn.functional.cross_entropy(model(x).float(), y)


def test_fp16_loss_scaling_follows_deepspeed(stratad, monkeypatch):
    from deepspeed.runtime.fp16 import loss_scaler as ds_scaler

    class _OneRank:   # DeepSpeed's scaler logs with dist.get_rank()
        @staticmethod
        def get_rank():
            return 0
    monkeypatch.setattr(ds_scaler, "dist", _OneRank)
    fp16 = {"initial_scale_power": 24, "loss_scale_window": 3, "hysteresis": 2, "min_loss_scale": 1}
    reference = ds_scaler.DynamicLossScaler(init_scale=2.0 ** 24, scale_window=3, min_scale=1, delayed_shift=2,
                                            consecutive_hysteresis=False, dtype=torch.half)
    model = _mlp(torch.float16)
    # torch's AdamW on fp32 masters fed the unscaled fp16 gradients of the applied steps.
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, weight_decay=0.01, socket=stratad.socket, fp16=fp16)
    assert opt.loss_scale == 2.0 ** 24
    skipped, applied = 0, 0
    for step in range(24):
        before = [p.detach().clone() for p in model.parameters()]
        scale = opt.loss_scale
        assert scale == reference.cur_scale, f"step {step}: scale {scale}, DeepSpeed's {reference.cur_scale}"
        opt.backward(_loss(model, step, torch.float16))
        overflow = any(not torch.isfinite(p.grad).all() for p in model.parameters())
        grads = [p.grad.detach().float() / scale for p in model.parameters()]
        opt.step()
        opt.zero_grad()
        reference.update_scale(overflow)
        assert opt.last_step_skipped == overflow, f"step {step}: skipped {opt.last_step_skipped}, overflow {overflow}"
        after = list(model.parameters())
        if overflow:
            skipped += 1
            assert all(torch.equal(a, b) for a, b in zip(after, before)), f"step {step} skipped but params changed"
        else:
            applied += 1
            for m, g in zip(masters, grads):
                m.grad = g
            ref_opt.step()
            assert any(not torch.equal(a, b) for a, b in zip(after, before)), f"step {step} applied, no change"
        assert opt.loss_scale == reference.cur_scale, f"after step {step}"
    assert skipped >= 3 and applied >= 8, (skipped, applied)
    state = opt.state_dict()["state"]
    for i, m in enumerate(masters):
        assert float(state[i]["step"]) == applied
        assert torch.allclose(state[i]["fp32_master"], m.detach(), rtol=0, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            ref = ref_opt.state[m][key]
            diff = (state[i][key] - ref).abs().max().item()
            assert diff <= 1e-5 * ref.abs().max().item(), f"param {i} {key}: max difference {diff}"

        # The fp16 params are the masters rounded once.
        assert torch.equal(list(model.parameters())[i], m.detach().half())
    opt.close()


def _in_group_order(optimizer):
    return [p for g in optimizer.param_groups for p in g["params"]]


def _groups(model):
    return st.decay_groups(model, 0.05)


def _train(model, opt, steps, first):
    losses = []
    for step in range(first, first + steps):
        loss = _loss(model, step, next(model.parameters()).dtype)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def _close(a, b, what):
    for x, y in zip(a, b):
        assert abs(x - y) <= 1e-5 * abs(y), f"{what}: {a} vs {b}"


def test_state_dict_into_torch_and_back(stratad):
    model = _mlp()
    opt = st.OffloadAdamW(_groups(model), lr=2e-3, socket=stratad.socket)
    _train(model, opt, 5, 0)
    state = opt.state_dict()
    # torch's format: loads into torch.optim.AdamW as is.
    twin = copy.deepcopy(model)
    torch_opt = torch.optim.AdamW(_groups(twin), lr=2e-3)
    torch_opt.load_state_dict(state)
    for i, p in enumerate(_in_group_order(torch_opt)):
        assert torch.equal(torch_opt.state[p]["exp_avg"], state["state"][i]["exp_avg"])
    ours = _train(model, opt, 5, 5)
    theirs = _train(twin, torch_opt, 5, 5)
    _close(ours, theirs, "strata vs torch after loading strata's state into torch")
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-5

    # ...and back: torch's state (after 5 more torch steps) into strata.
    _train(twin, torch_opt, 3, 10)
    with torch.no_grad():
        for a, b in zip(model.parameters(), twin.parameters()):
            a.copy_(b)
    opt.load_state_dict(torch_opt.state_dict())
    back = opt.state_dict()
    for i, p in enumerate(_in_group_order(torch_opt)):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(back["state"][i][key], torch_opt.state[p][key]), key
        assert float(back["state"][i]["step"]) == float(torch_opt.state[p]["step"]) == 13
    ours = _train(model, opt, 5, 13)
    theirs = _train(twin, torch_opt, 5, 13)
    _close(ours, theirs, "strata vs torch after loading torch's state into strata")
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-5
    opt.close()


def test_state_dict_needs_no_setup(workdir, monkeypatch):
    """Issue 25 item 4: a daemon with its default checkpoint root (<nvme path>/checkpoints) and a
    trainer with no strata-specific environment: state_dict() and load_state_dict() work, and the
    temporary checkpoint they go through is removed."""
    from conftest import Daemon
    monkeypatch.delenv("STRATA_CHECKPOINT_ROOT", raising=False)
    nvme = os.path.join(workdir, "nvme")
    os.makedirs(nvme)
    daemon = Daemon(workdir, ["--nvme_path", nvme, "--nvme_capacity", "64MiB"], checkpoint_root=None)
    try:
        model = _mlp()
        opt = st.OffloadAdamW(_groups(model), lr=2e-3, socket=daemon.socket)
        _train(model, opt, 3, 0)
        state = opt.state_dict()
        assert float(state["state"][0]["step"]) == 3
        twin = copy.deepcopy(model)
        again = st.OffloadAdamW(_groups(twin), lr=2e-3, socket=daemon.socket)
        again.load_state_dict(state)
        _close(_train(twin, again, 3, 3), _train(model, opt, 3, 3), "resumed vs uninterrupted")
        home = opt._client.checkpoint_home()
        assert home == os.path.join(nvme, "checkpoints"), home
        assert not [n for n in os.listdir(home) if n.startswith("strata-state-")], os.listdir(home)
        opt.close()
        again.close()
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0, daemon.log_text()


def test_frozen_params_are_not_registered(stratad):
    model = _mlp()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, socket=stratad.socket)
    assert len(opt._params) == len(list(model.parameters())) - 1
    _train(model, opt, 2, 0)
    assert torch.equal(model[0].weight, frozen)
    assert len(opt.state_dict()["state"]) == len(opt._params)
    opt.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_params_come_back_in_the_model_dtype(stratad, dtype):
    model = _mlp(dtype)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-3, socket=stratad.socket)
    _train(model, opt, 2, 0)
    assert all(p.dtype == dtype for p in model.parameters())
    assert opt._session.param_dtype == {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    opt.close()


def test_trainer_supplied_partition(stratad):
    """A rank's own partition (as DeepSpeed or FSDP cut it) instead of the daemon's layout."""
    model = _mlp()
    twin = copy.deepcopy(model)
    # Tensors: 0 w 16x32, 1 b 32, 2 ln w 32, 3 ln b 32, 4 w 32x4, 5 b 4; two shards, out of order, padded.
    partition = [(0, 400, [(0, 256, 256, 0), (4, 0, 128, 256)]),
                 (1, 360, [(0, 0, 256, 0), (1, 0, 32, 256), (2, 0, 32, 288), (3, 0, 32, 320), (5, 0, 4, 352)])]
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket, partition=partition)
    got = [(s["index"], s["padded_numel"], [tuple(r) for r in s["ranges"]]) for s in opt._session.shards()]
    assert got == partition
    torch_opt = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    _close(_train(model, opt, 3, 0), _train(twin, torch_opt, 3, 0), "trainer partition vs torch")
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-6
    opt.close()


class _LionReference(torch.optim.Optimizer):
    """Lion as lucidrains/lion-pytorch's update_fn, written with torch ops."""

    def __init__(self, params, lr, betas, weight_decay):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_((m * b1 + p.grad * (1 - b1)).sign(), alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


@pytest.mark.parametrize("name", ["adam", "adagrad", "lion"])
def test_other_algorithms_match_torch(stratad, name):
    model = _mlp()
    twin = copy.deepcopy(model)
    if name == "adam":
        ours = st.OffloadAdam(_groups(model), lr=3e-3, socket=stratad.socket)
        theirs = torch.optim.Adam(_groups(twin), lr=3e-3)
    elif name == "adagrad":
        ours = st.OffloadAdagrad(_groups(model), lr=3e-2, lr_decay=0.01, initial_accumulator_value=0.1,
                                 socket=stratad.socket)
        theirs = torch.optim.Adagrad(_groups(twin), lr=3e-2, lr_decay=0.01, initial_accumulator_value=0.1)
    else:
        ours = st.OffloadLion(_groups(model), lr=1e-3, socket=stratad.socket)
        theirs = _LionReference(_groups(twin), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    _close(_train(model, ours, 4, 0), _train(twin, theirs, 4, 0), name)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-5, name
    state = ours.state_dict()["state"][0]
    assert set(state) == {"step", *ours._state_keys}
    ours.close()


def test_step_with_closure(stratad):
    model = _mlp()
    twin = copy.deepcopy(model)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for step in range(3):
        def closure(m=model):
            opt.zero_grad()
            loss = _loss(m, step)
            loss.backward()
            return loss
        def ref_closure(m=twin):
            ref.zero_grad()
            loss = _loss(m, step)
            loss.backward()
            return loss
        assert abs(opt.step(closure).item() - ref.step(ref_closure).item()) <= 1e-6
    opt.close()


def test_hyperparameters_changed_between_backward_and_step_are_refused(stratad):
    """The LR a step uses goes to stratad with the step's first gradient bucket (during backward);
    a scheduler stepped between backward and step() would silently not apply, so step() refuses,
    and after the fix the run continues exactly as torch's."""
    model = _mlp()
    twin = copy.deepcopy(model)
    # overlap_backward: the hooks hand the buckets off in backward (the default takes .grad in step()).
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, bucket_numel=1, socket=stratad.socket,  # a bucket per tensor
                          overlap_backward=True)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    assert _train(model, opt, 1, 0) == pytest.approx(_train(twin, ref, 1, 0), rel=1e-6)
    loss = _loss(model, 1)
    loss.backward()                       # buckets went out with lr 1e-2
    opt.param_groups[0]["lr"] = 5e-3      # e.g. sched.step() before opt.step()
    with pytest.raises(strata.StrataError) as e:
        opt.step()
    assert "changed between backward and step()" in str(e.value)
    assert "Step the LR scheduler after optimizer.step()" in str(e.value)
    opt.param_groups[0]["lr"] = 1e-2      # put it back: the step goes through with what was sent
    opt.step()
    opt.zero_grad()
    ref_loss = _loss(twin, 1)
    ref_loss.backward()
    ref.step()
    ref.zero_grad()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)
    _close(_train(model, opt, 2, 2), _train(twin, ref, 2, 2), "after the refused step")
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-5
    opt.close()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_zero3_16bit_params_with_fp32_masters_follow_deepspeed(stratad, monkeypatch, dtype):
    """Issue 25 item 2: ZeRO-3 with a float16 or bfloat16 model: 16-bit params and gradients in the
    trainer, fp32 masters in the daemon written back as 16-bit params in the optimizer's pass, as
    DeepSpeed's fp16/bf16 optimizers do; fp16 with DeepSpeed's dynamic loss scaler (the same steps
    skipped, the same scales). The reference: torch AdamW on fp32 masters fed the unscaled 16-bit
    gradients of a twin whose params are the masters rounded once."""
    from deepspeed.runtime.fp16 import loss_scaler as ds_scaler

    class _OneRank:   # DeepSpeed's scaler logs with dist.get_rank()
        @staticmethod
        def get_rank():
            return 0
    monkeypatch.setattr(ds_scaler, "dist", _OneRank)
    half = dtype == torch.float16
    reference = ds_scaler.DynamicLossScaler(init_scale=2.0 ** 24, scale_window=3, min_scale=1, delayed_shift=2,
                                            consecutive_hysteresis=False, dtype=dtype) if half else None
    model = _mlp(dtype)
    twin = copy.deepcopy(model)
    masters = [p.detach().float().clone().requires_grad_(True) for p in model.parameters()]
    ref_opt = torch.optim.AdamW(masters, lr=1e-3, weight_decay=0.01)
    fp16 = {"initial_scale_power": 24, "loss_scale_window": 3, "hysteresis": 2, "min_loss_scale": 1} if half else None
    opt = st.Zero3AdamW(model, lr=1e-3, weight_decay=0.01, socket=stratad.socket, fp16=fp16)
    skipped = applied = 0
    for step in range(24 if half else 10):
        scale = opt.loss_scale
        if half:
            assert scale == reference.cur_scale, f"step {step}: scale {scale}, DeepSpeed's {reference.cur_scale}"
        else:
            assert scale == 1.0
        opt.backward(_loss(model, step, dtype))
        for p in twin.parameters():
            p.grad = None
        (_loss(twin, step, dtype).float() * scale).backward()
        overflow = any(not torch.isfinite(p.grad).all() for p in twin.parameters())
        opt.step()
        if half:
            reference.update_scale(overflow)
        assert opt.last_step_skipped == overflow, f"step {step}: skipped {opt.last_step_skipped}, overflow {overflow}"
        if overflow:
            skipped += 1
            continue
        applied += 1
        for m, p in zip(masters, twin.parameters()):
            m.grad = p.grad.detach().float() / scale
        ref_opt.step()
        with torch.no_grad():
            for m, p in zip(masters, twin.parameters()):
                p.copy_(m.detach().to(dtype))
    if half:
        assert skipped >= 3 and applied >= 8, (skipped, applied)
    else:
        assert skipped == 0
    state = opt.state_dict()["state"]
    opt.gather_params()
    for i, (m, p) in enumerate(zip(masters, model.parameters())):
        assert p.dtype == dtype
        assert float(state[i]["step"]) == applied
        diff = (state[i]["fp32_master"] - m.detach()).abs().max().item()
        assert diff <= 1e-6 * max(1.0, m.detach().abs().max().item()), f"param {i} master: {diff}"
        for key in ("exp_avg", "exp_avg_sq"):
            ref = ref_opt.state[m][key]
            d = (state[i][key] - ref).abs().max().item()
            assert d <= 1e-5 * ref.abs().max().item(), f"param {i} {key}: max difference {d}"
        # The 16-bit params are the daemon's masters rounded once.
        assert torch.equal(p.detach(), state[i]["fp32_master"].to(dtype)), f"param {i}"
    opt.close()
