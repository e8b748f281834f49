"""Rank processes for test_grad_handoff.py: 2 ranks over gloo, OffloadAdamW
with its own bucketed all-reduce, against torch.optim.AdamW given the average
of the ranks' gradients (zeros for a param that got none, as DDP gives)."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.a = nn.Linear(6, 12)
        self.unused = nn.Linear(2, 2)       # never in forward: no .grad, ever
        self.b = nn.Linear(12, 2)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def loss_of(model, step, micro, rank):
    g = torch.Generator().manual_seed(((step * 31 + micro) * 7 + rank) & 0x7FFFFFFF)
    x = torch.randn(5, 6, generator=g).to(next(model.parameters()).device)
    return (model(x) ** 2).mean()


def run(rank, world, store, out, task):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = globals()["_" + task["phase"]](rank, world, task)
        torch.save(result, os.path.join(out, f"{task['phase']}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _accumulate(rank, world, task):
    """passes backward passes per step, the optimizer told gradient_accumulation_steps=gas:
    whatever .grad holds at step() is stepped, as torch steps it."""
    import strata.torch as st
    device = torch.device(task.get("device", "cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(0)
    model, twin = Net().to(device), Net().to(device)
    # bucket_numel 20, buckets in reverse registration order: [b.bias, b.weight] (ready in
    # backward) and [unused.bias, unused.weight, a.bias, a.weight] (`unused`: no grad, bucketed
    # with a's grads; this bucket waits for step()).
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, socket=task["socket"],
                          gradient_accumulation_steps=task["gas"], bucket_numel=20)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(3):
        for m in (model, twin):
            for micro in range(task["passes"]):
                loss_of(m, step, micro, rank).backward()
        for p in twin.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)
            p.grad /= world
        assert model.unused.weight.grad is None
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
    opt.close()
    assert all(p.device.type == device.type for p in model.parameters())
    return {"diff": max((a - b).abs().max().item() for a, b in zip(model.parameters(), twin.parameters())),
            "moved": (model.unused.weight.cpu() - Net().unused.weight).abs().max().item()}


def _overlap_extra(rank, world, task):
    """overlap_backward=True, gradient_accumulation_steps 2, a third backward pass: refused."""
    import strata
    import strata.torch as st
    model = Net()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=task["socket"], gradient_accumulation_steps=2,
                          bucket_numel=20, overlap_backward=True)
    message = None
    try:
        for micro in range(3):
            loss_of(model, 0, micro, rank).backward()
    except strata.StrataError as e:
        message = str(e)
    opt.close()
    return {"message": message}
