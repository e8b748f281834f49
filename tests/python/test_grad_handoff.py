"""When the offload optimizers take .grad: at step() by default (so any number
of backward passes accumulate, as torch's do), from backward's hooks with
overlap_backward=True (a pass more than gradient_accumulation_steps is then
refused by name, not dropped). 1 and 2 ranks, the latter with a param that
never gets a gradient in a bucket with one that does. And the copies between
host slots and tensors on another device."""
import copy
import os
import uuid

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn as nn

import grad_worker
import strata
import strata.torch as st
from strata.torch import optimizer as offload


def _spawn(phase, workdir, **task):
    task = dict(task, phase=phase)
    store = os.path.join(workdir, f"store-{phase}-{uuid.uuid4().hex[:6]}")
    mp.spawn(grad_worker.run, args=(2, store, workdir, task), nprocs=2, join=True)
    return [torch.load(os.path.join(workdir, f"{phase}-{r}.pt")) for r in range(2)]


def _mlp():
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))


def _loss(model, step, micro):
    g = torch.Generator().manual_seed(step * 17 + micro)
    return (model(torch.randn(5, 6, generator=g)) ** 2).mean()


@pytest.mark.parametrize("bucket_numel", [None, 1])
def test_more_backward_passes_than_accumulation_steps_accumulate_as_torch(stratad, bucket_numel):
    """gradient_accumulation_steps=2 and 3 backward passes per step: all three count (they used
    to: the third was dropped, the hooks had handed the gradient off at the second)."""
    model = _mlp()
    twin = copy.deepcopy(model)
    kw = {} if bucket_numel is None else {"bucket_numel": bucket_numel}
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket, gradient_accumulation_steps=2, **kw)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for step in range(3):
        for m, o in ((model, opt), (twin, ref)):
            for micro in range(3):
                _loss(m, step, micro).backward()
            o.step()
            o.zero_grad()
    opt.close()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert diff <= 1e-6, diff


def test_overlap_backward_refuses_a_pass_more_than_accumulation_steps(stratad):
    model = _mlp()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket, gradient_accumulation_steps=2,
                          overlap_backward=True)
    _loss(model, 0, 0).backward()
    _loss(model, 0, 1).backward()
    with pytest.raises(strata.StrataError) as e:
        _loss(model, 0, 2).backward()
    message = str(e.value)
    assert "gradient_accumulation_steps=2" in message and "overlap_backward=False" in message, message
    opt.close()


def test_overlap_backward_steps_as_torch_when_left_alone(stratad):
    """The hooks' hand-off (overlap_backward=True, 2 passes, gradient_accumulation_steps 2, the
    optimizer's max_norm) gives torch's result: nothing touched .grad."""
    model = _mlp()
    twin = copy.deepcopy(model)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket, gradient_accumulation_steps=2,
                          max_norm=0.05, overlap_backward=True)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for step in range(3):
        for micro in range(2):
            _loss(model, step, micro).backward()
            _loss(twin, step, micro).backward()
        torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.05)
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    opt.close()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert diff <= 1e-6, diff


def test_two_ranks_accumulate_and_zero_fill_like_torch(stratad, workdir):
    """2 ranks, own all-reduce, 3 passes with gradient_accumulation_steps 2, a param with no
    gradient bucketed with one that has: torch's AdamW on the averaged grads (zeros for it)."""
    results = _spawn("accumulate", workdir, socket=stratad.socket, gas=2, passes=3)
    for r in results:
        assert r["diff"] <= 1e-6, results
        assert r["moved"] > 0, results      # weight decay moved the gradient-less param, as in torch


def test_two_ranks_overlap_backward_refuses_an_extra_pass(stratad, workdir):
    results = _spawn("overlap_extra", workdir, socket=stratad.socket)
    for r in results:
        assert r["message"] and "gradient_accumulation_steps=2" in r["message"], results


def test_copies_work_for_tensors_off_the_host():
    """The single-threaded memcpy is for host tensors only; a tensor on another device (here
    `meta`, the one a CPU machine has; on a GPU, CUDA) goes through copy_, and a bucket's zeros
    for a param without a gradient are made on the gradients' device (it used to cat host zeros
    with device gradients)."""
    dst, src = torch.empty(8, device="meta"), torch.empty(8, device="meta")
    offload._copy(dst, src)                            # used to call .numpy() on it
    host = torch.zeros(8)
    offload._copy(host, torch.arange(8.0))
    assert torch.equal(host, torch.arange(8.0))
    params = [torch.empty(3, device="meta"), torch.empty(2, 2, device="meta")]
    flat = offload._flat_grads(params, [None, torch.empty(2, 2, device="meta")])
    assert flat.device.type == "meta" and flat.shape == (7,)
    flat = offload._flat_grads([torch.empty(3), torch.empty(2)], [torch.ones(3), None])
    assert torch.equal(flat, torch.tensor([1.0, 1, 1, 0, 0]))


def test_lr_changed_between_backward_and_step_is_used_as_torch_uses_it(stratad):
    """By default the hyperparameters go out with the gradients at step(), so an LR set between
    backward and step() is the one the step uses, as with torch.optim (with overlap_backward=True
    that is refused: the gradients left with the earlier LR)."""
    model = _mlp()
    twin = copy.deepcopy(model)
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for step in range(3):
        for m, o in ((model, opt), (twin, ref)):
            _loss(m, step, 0).backward()
            o.param_groups[0]["lr"] = 1e-2 / (step + 2)
            o.step()
            o.zero_grad()
    opt.close()
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert diff <= 1e-6, diff


_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@_cuda
def test_cuda_model_one_rank_offload_matches_torch(stratad):
    """A CUDA model: grads copied to the host slots and params back with copy_ (the host memcpy
    would call .numpy() on a CUDA tensor); an unused layer's zeros; against torch on the GPU."""
    model, twin = grad_worker.Net().cuda(), grad_worker.Net().cuda()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, socket=stratad.socket)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(3):
        for m in (model, twin):
            grad_worker.loss_of(m, step, 0, 0).backward()
        for p in twin.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    opt.close()
    assert all(p.is_cuda for p in model.parameters())
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert diff <= 1e-5, diff


@_cuda
def test_cuda_model_two_ranks_offload_matches_torch(stratad, workdir):
    """2 ranks over gloo with CUDA tensors: the bucket's zeros for the gradient-less param are made
    on the GPU (they used to be host zeros concatenated with GPU grads)."""
    for r in _spawn("accumulate", workdir, socket=stratad.socket, gas=2, passes=3, device="cuda"):
        assert r["diff"] <= 1e-5 and r["moved"] > 0, r


@_cuda
def test_cuda_model_zero3_matches_torch(stratad):
    model, twin = _mlp().cuda(), _mlp().cuda()
    opt = st.Zero3AdamW(model, lr=1e-2, socket=stratad.socket)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for step in range(3):
        for m in (model, twin):
            _loss_on(m, step, "cuda").backward()
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    opt.close()
    assert all(p.is_cuda for p in model.parameters())
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters()))
    assert diff <= 1e-5, diff


def _loss_on(model, step, device):
    g = torch.Generator().manual_seed(step * 17)
    return (model(torch.randn(5, 6, generator=g).to(device)) ** 2).mean()
