"""st.initialize checks everything before it touches the model: a refused
call (stage 3 with fp16/bf16, a bad stage-3 option, a bad optimizer or
scheduler section, no daemon) leaves the model exactly as it was, dtype and
values; it used to convert it to fp16/bf16 first."""
import pytest
import torch
import torch.nn as nn

import strata
import strata.torch as st


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 8)
        self.norm = nn.BatchNorm1d(8)          # buffers too (running stats), converted by .half()
        self.out = nn.Linear(8, 2)


def _snapshot(model):
    return {k: (v.dtype, v.detach().clone()) for k, v in model.state_dict().items()}


def _same(model, before):
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, (dtype, value) in before.items():
        assert after[k].dtype == dtype, f"{k}: {after[k].dtype}, was {dtype}"
        assert torch.equal(after[k], value), f"{k} changed"


def _config(**extra):
    cfg = {"train_micro_batch_size_per_gpu": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
           "fp16": {"enabled": True}}
    cfg.update(extra)
    return cfg


REFUSED = {
    # Stage 3 takes fp16/bf16 models now: a stage-3 refusal with either enabled must still come
    # before the conversion.
    "stage 3 with fp16 and a bad stage-3 option": (
        _config(zero_optimization={"stage": 3, "stage3_param_persistence_threshold": -1}),
        "stage3_param_persistence_threshold"),
    "stage 3 with bf16 and a bad stage-3 option": (
        _config(fp16={"enabled": False}, bf16={"enabled": True},
                zero_optimization={"stage": 3, "offload_param": {"device": "gpu"}}), "offload_param.device"),
    "a bad stage-3 option": (_config(fp16={"enabled": False},
                                     zero_optimization={"stage": 3, "offload_param": {"device": "gpu"}}),
                             "offload_param.device"),
    "no optimizer section": ({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}}, "'optimizer'"),
    "an unknown optimizer": (_config(optimizer={"type": "SGD"}), "optimizer.type"),
    "an unknown optimizer option": (_config(optimizer={"type": "AdamW", "params": {"momentum": 0.9}}),
                                    "optimizer.params.momentum"),
    "a bad scheduler type": (_config(scheduler={"type": "StepLR"}), "scheduler.type"),
    "bad scheduler params": (_config(scheduler={"type": "WarmupLR", "params": {"warmup_num_steps": -3}}),
                             "warmup_num_steps"),
    "unknown scheduler params": (_config(scheduler={"type": "WarmupLR", "params": {"gamma": 0.5}}),
                                 "scheduler.params of WarmupLR"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_refused_initialize_leaves_the_model_as_it_was(case, tmp_path):
    config, named = REFUSED[case]
    model = _Net()
    before = _snapshot(model)
    with pytest.raises(ValueError) as e:
        st.initialize(model, config=config, socket=str(tmp_path / "never-reached.sock"))
    assert named in str(e.value), str(e.value)
    _same(model, before)


def test_no_daemon_after_the_checks_leaves_the_model_as_it_was(tmp_path):
    """Valid config, but no stratad: the optimizer fails after the conversion, and the model gets
    its own fp32 tensors back."""
    model = _Net()
    before = _snapshot(model)
    params = list(model.parameters())
    with pytest.raises(strata.DaemonUnavailableError):
        st.initialize(model, config=_config(), socket=str(tmp_path / "none.sock"))
    _same(model, before)
    assert all(a is b for a, b in zip(model.parameters(), params))   # the same param objects


def test_an_accepted_fp16_initialize_still_converts(stratad):
    model = _Net()
    model, opt = st.initialize(model, config=_config(), socket=stratad.socket)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    opt.close()
