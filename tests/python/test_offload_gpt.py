"""(a) A tiny GPT, 2 ranks over gloo, 30 steps, two param groups (no decay on
biases and norms), warmup + cosine schedule, clipping and accumulation 2:
strata offload (its own hook-driven all-reduce; and under DDP; and through
st.initialize with a DeepSpeed config) against DDP + torch.optim.AdamW."""
import pytest
import torch

import train_gpt

MODES = ["offload", "offload-ddp", "ds-config"]


@pytest.fixture(scope="module")
def runs(stratad, tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("gpt"))
    cfg = dict(train_gpt.DEFAULTS)
    out = {"torch": train_gpt.run_mode("torch", cfg, stratad.socket, 2, workdir)}
    for mode in MODES:
        out[mode] = train_gpt.run_mode(mode, cfg, stratad.socket, 2, workdir)
    return out


def test_reference_trains(runs):
    losses = runs["torch"][0]["losses"]
    assert len(losses) == 30
    assert losses[-1] < losses[0] * 0.8, losses


@pytest.mark.parametrize("mode", MODES)
def test_losses_match_torch(runs, mode):
    ref = runs["torch"][0]["losses"]
    got = runs[mode][0]["losses"]
    for step, (a, b) in enumerate(zip(got, ref)):
        assert abs(a - b) <= 1e-5 * abs(b), f"{mode} step {step}: loss {a} vs torch {b}"


@pytest.mark.parametrize("mode", MODES)
def test_final_params_match_torch(runs, mode):
    for rank in range(2):
        ref = runs["torch"][rank]["params"]
        got = runs[mode][rank]["params"]
        assert got.keys() == ref.keys()
        for name in ref:
            assert got[name].dtype == torch.float32, f"{name} came back as {got[name].dtype}"
            diff = (got[name] - ref[name]).abs().max().item()
            assert diff <= 1e-5, f"{mode} rank {rank} {name}: max difference {diff}"


def test_ranks_hold_the_same_params(runs):
    for mode in MODES:
        a, b = runs[mode][0]["params"], runs[mode][1]["params"]
        for name in a:
            assert torch.equal(a[name], b[name]), f"{mode}: rank 0 and 1 differ in {name}"
