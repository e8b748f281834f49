"""Error cases (no daemon, bad config keys, unfillable "auto") and the
DeepSpeed-config pieces that need no daemon: batch-size defaults, "auto"
filled as Hugging Face fills it, and the schedules against DeepSpeed's own."""
import os
import socket as pysocket

import pytest
import torch
import torch.nn as nn

import strata
import strata.torch as st
from strata.torch import config as stconfig

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))


def test_no_daemon_names_the_socket_and_stratad(tmp_path):
    missing = str(tmp_path / "none.sock")
    with pytest.raises(strata.DaemonUnavailableError) as e:
        st.OffloadAdamW(_model().parameters(), socket=missing)
    assert missing in str(e.value) and "stratad --socket" in str(e.value) and "the socket argument" in str(e.value)


def test_stale_socket_file_is_unavailable(tmp_path, monkeypatch):
    path = str(tmp_path / "stale.sock")
    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(path)          # a socket file nobody listens on
    s.close()
    monkeypatch.setenv("STRATA_SOCKET", path)
    with pytest.raises(strata.DaemonUnavailableError) as e:
        strata.connect(rpc_timeout_s=2)
    assert path in str(e.value) and "$STRATA_SOCKET" in str(e.value)


def test_socket_resolution_order(monkeypatch):
    monkeypatch.setenv("STRATA_SOCKET", "/x/env.sock")
    assert strata.resolve_socket("/x/arg.sock") == ("/x/arg.sock", "the socket argument")
    assert strata.resolve_socket() == ("/x/env.sock", "$STRATA_SOCKET")
    monkeypatch.delenv("STRATA_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert strata.resolve_socket() == ("/run/user/7/strata/stratad.sock", "the default path")


BASE = {"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}


def _with(**kw):
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    cfg.update(kw)
    return cfg


def test_bad_config_key_is_named():
    with pytest.raises(ValueError, match="'zero_optimisation'"):
        st.initialize(_model(), config=_with(zero_optimisation={"stage": 2}))
    with pytest.raises(ValueError, match="optimizer.params.betaz"):
        st.initialize(_model(), config=_with(optimizer={"type": "AdamW", "params": {"betaz": [0.9, 0.9]}}))
    with pytest.raises(ValueError, match="optimizer.type 'SGD'"):
        st.initialize(_model(), config=_with(optimizer={"type": "SGD"}))
    with pytest.raises(ValueError, match="Either train_batch_size or train_micro_batch_size_per_gpu"):
        st.initialize(_model(), config={"optimizer": {"type": "AdamW"}})


def test_unknown_scheduler_is_named(stratad):
    with pytest.raises(ValueError, match="scheduler.type 'OneCycle'"):
        st.initialize(_model(), config=_with(scheduler={"type": "OneCycle"}), socket=stratad.socket)


def test_auto_is_filled_as_hugging_face_does_or_refused():
    args = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "max_grad_norm": 0.5,
            "learning_rate": 2e-4, "adam_beta1": 0.8, "adam_beta2": 0.95, "adam_epsilon": 1e-6,
            "weight_decay": 0.01, "warmup_steps": 7, "fp16": False, "bf16": False}
    cfg = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
           "train_batch_size": "auto", "gradient_clipping": "auto",
           "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                     "weight_decay": "auto"}},
           "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                             "warmup_num_steps": "auto", "total_num_steps": "auto"}},
           "fp16": {"enabled": "auto"}, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
    model = _model()
    model.hidden_size = 8
    out = stconfig.resolve_auto(cfg, args, num_training_steps=100, model=model, world_size=2)
    assert out["train_micro_batch_size_per_gpu"] == 3 and out["gradient_accumulation_steps"] == 2
    assert out["train_batch_size"] == 12 and out["gradient_clipping"] == 0.5
    assert out["optimizer"]["params"] == {"lr": 2e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.01}
    assert out["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 2e-4, "warmup_num_steps": 7,
                                          "total_num_steps": 100}
    assert out["fp16"]["enabled"] is False and out["zero_optimization"]["reduce_bucket_size"] == 64
    with pytest.raises(ValueError, match="optimizer.params.lr"):
        stconfig.resolve_auto({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})
    with pytest.raises(ValueError, match="scheduler.params.total_num_steps"):
        stconfig.resolve_auto({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto"}}},
                              args)
    with pytest.raises(ValueError, match="aio.block_size"):
        stconfig.resolve_auto({"aio": {"block_size": "auto"}}, args)


def test_batch_size_defaults_follow_deepspeed():
    assert stconfig._batch_sizes({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2) == (32, 4, 4)
    assert stconfig._batch_sizes({"train_batch_size": 32}, 2) == (32, 16, 1)
    assert stconfig._batch_sizes({"train_micro_batch_size_per_gpu": 4}, 2) == (8, 4, 1)
    assert stconfig._batch_sizes({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2) == (32, 8, 2)
    with pytest.raises(ValueError, match="train_batch_size 30 != "):
        stconfig._batch_sizes({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                               "gradient_accumulation_steps": 2}, 2)


@pytest.mark.parametrize("name,params", [
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3, "warmup_num_steps": 10, "warmup_type": "log"}),
    ("WarmupLR", {"warmup_num_steps": 10, "warmup_type": "linear"}),
    ("WarmupDecayLR", {"total_num_steps": 40, "warmup_max_lr": 1e-3, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 40, "warmup_num_steps": 10, "warmup_min_ratio": 0.1,
                        "cos_min_ratio": 0.01, "warmup_type": "linear"}),
])
def test_schedules_match_deepspeed(name, params):
    from deepspeed.runtime import lr_schedules
    ours_opt = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": 1e-3},
                                {"params": [torch.zeros(1)], "lr": 5e-4}], lr=1e-3)
    ds_opt = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": 1e-3},
                              {"params": [torch.zeros(1)], "lr": 5e-4}], lr=1e-3)
    ours = st.__dict__[name](ours_opt, **params)
    theirs = getattr(lr_schedules, name)(ds_opt, **params)
    for step in range(45):
        assert [g["lr"] for g in ours_opt.param_groups] == pytest.approx(
            [g["lr"] for g in ds_opt.param_groups], rel=1e-12, abs=1e-15), f"{name} iteration {step}"
        ours.step()
        theirs.step()
