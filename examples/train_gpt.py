"""Train a small GPT-style model as N ranks (torch.distributed over gloo)
through stratad, next to the same run with DDP + torch.optim.AdamW in-process.

    python examples/train_gpt.py --socket /path/stratad.sock [--steps 30] [--ranks 2] [--modes ...]

Modes (--modes, comma-separated):
  torch        DDP + torch.optim.AdamW (the reference, no strata)
  offload      strata.torch.OffloadAdamW, gradients all-reduced by strata's own
               backward hooks while backward runs
  offload-ddp  DDP averages the gradients, OffloadAdamW hands each rank's partition over
  ds-config    st.initialize(model, config=<a DeepSpeed JSON: ZeRO-2, offload_optimizer cpu,
               WarmupCosineLR, clipping, accumulation>)
  zero3        the same config at ZeRO stage 3 with offload_param cpu: module hooks gather each
               layer's params from stratad and all-gather them across ranks
  infinity     stage 3 with params and optimizer state on NVMe (stratad needs --nvme_path), the
               host-memory budget for params a quarter of the model's
Every mode uses two param groups (no weight decay on biases and norms), a
warmup + cosine schedule, gradient clipping at 1.0 and 2 accumulation steps.
Prints the per-step losses side by side and the largest differences.
"""
import argparse
import math
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_gpt  # noqa: E402

DEFAULTS = dict(steps=30, dim=64, layers=2, heads=4, context=32, batch_size=8, accumulation=2, lr=3e-3,
                weight_decay=0.1, warmup=5, max_norm=1.0, seed=0, tie=False)


def schedule(cfg):
    """DeepSpeed's WarmupCosineLR (linear warmup from 0.1x, cosine down to 0.1x) as a torch
    LambdaLR factor: DeepSpeed's lr of step k is its ratio at iteration k-1 (0 before the first)."""
    warmup, total, low = cfg["warmup"], cfg["steps"], 0.1

    def ratio(i):
        if i < 0:
            return 0.0
        if i < warmup:
            return low + (1.0 - low) * i / warmup
        progress = min(1.0, (i - warmup + 1) / max(1, total - warmup))
        return max(0.0, low + (1.0 - low) * (1 + math.cos(math.pi * progress)) / 2)
    return lambda step: ratio(step - 1)


def ds_config(cfg, zero=None):
    return {
        "train_micro_batch_size_per_gpu": cfg["batch_size"],
        "gradient_accumulation_steps": cfg["accumulation"],
        "gradient_clipping": cfg["max_norm"],
        "zero_optimization": zero or {"stage": 2, "offload_optimizer": {"device": "cpu"}},
        "optimizer": {"type": "AdamW", "params": {"lr": cfg["lr"], "betas": [0.9, 0.999], "eps": 1e-8,
                                                   "weight_decay": cfg["weight_decay"]}},
        "scheduler": {"type": "WarmupCosineLR",
                      "params": {"total_num_steps": cfg["steps"], "warmup_num_steps": cfg["warmup"],
                                 "warmup_type": "linear", "warmup_min_ratio": 0.1,
                                 "cos_min_ratio": 0.1}},
    }


def run_rank(rank, world, mode, cfg, socket, store, out):
    torch.set_num_threads(1)
    if isinstance(socket, (list, tuple)):
        # One daemon per "node": rank r is on node r // (world / nodes).
        socket = socket[rank * len(socket) // world]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = _train(rank, world, mode, cfg, socket)
        torch.save(result, os.path.join(out, f"{mode}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _train(rank, world, mode, cfg, socket):
    import strata.torch as st

    torch.manual_seed(cfg["seed"])
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = tiny_gpt.TinyGPT(len(tiny_gpt.VOCAB), cfg["dim"], cfg["layers"], cfg["heads"], cfg["context"],
                             tie=cfg.get("tie", False))
    groups = st.decay_groups(model, cfg["weight_decay"])
    sched = None
    runner = model
    if mode == "torch":
        runner = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(groups, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    elif mode == "offload":
        opt = st.OffloadAdamW(groups, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8, socket=socket,
                              max_norm=cfg["max_norm"], gradient_accumulation_steps=cfg["accumulation"],
                              bucket_numel=20_000,
                              # The optimizer owns clipping and accumulation and this loop leaves
                              # .grad alone: gradients go to stratad during backward.
                              overlap_backward=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    elif mode == "offload-ddp":
        runner = torch.nn.parallel.DistributedDataParallel(model)
        opt = st.OffloadAdamW(groups, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8, socket=socket,
                              max_norm=cfg["max_norm"], reduce_gradients=False)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    elif mode == "ds-config":
        runner, opt = st.initialize(model, config=ds_config(cfg), model_parameters=groups, socket=socket)
    elif mode in ("zero3", "infinity"):
        # Params of at most 256 elements (norms, biases) stay whole in every rank.
        zero = {"stage": 3, "stage3_param_persistence_threshold": 256,
                "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
        if mode == "infinity":
            quarter = sum(p.numel() for p in model.parameters()) // 4
            zero["offload_param"] = {"device": "nvme", "nvme_path": "/local_nvme", "max_in_cpu": quarter}
            zero["offload_optimizer"] = {"device": "nvme", "nvme_path": "/local_nvme"}
        runner, opt = st.initialize(model, config=ds_config(cfg, zero), model_parameters=groups, socket=socket)
    else:
        raise ValueError(f"unknown mode {mode}")

    losses = []
    for step in range(cfg["steps"]):
        total = torch.zeros(())
        for micro in range(cfg["accumulation"]):
            x, y = tiny_gpt.batch(tokens, step, rank, world, cfg["batch_size"], cfg["context"], micro)
            loss = runner(x, y)
            total += loss.detach()
            if mode in ("ds-config", "zero3", "infinity"):
                opt.backward(loss)          # divides by gradient_accumulation_steps, as DeepSpeed's engine
            else:
                (loss / cfg["accumulation"]).backward()
        if mode == "torch":
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["max_norm"])
        opt.step()
        opt.zero_grad()
        if sched is not None:
            sched.step()
        dist.all_reduce(total)
        losses.append(total.item() / (cfg["accumulation"] * world))
    extra = {}
    if mode in ("zero3", "infinity"):
        # Between steps the trainer holds only the resident (tiny) params whole.
        extra["held_between_steps"] = sum(p.numel() for p in model.parameters())
        extra["daemon_stats"] = [line for line in opt.client.stats_text().splitlines()
                                 if opt.job_name in line]
    if mode != "torch":
        opt.close()     # ZeRO-3: leaves every param whole with its trained value
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "params": params, **extra}


def run_mode(mode, cfg, socket, world, workdir):
    os.makedirs(workdir, exist_ok=True)
    store = os.path.join(workdir, f"store-{mode}")
    mp.spawn(run_rank, args=(world, mode, cfg, socket, store, workdir), nprocs=world, join=True)
    return [torch.load(os.path.join(workdir, f"{mode}-{r}.pt")) for r in range(world)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--socket", default=None,
                        help="stratad's socket (else $STRATA_SOCKET, else the default); comma-separated sockets "
                             "put the ranks on that many daemons (\"nodes\"), in contiguous runs")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"])
    parser.add_argument("--modes", default="torch,offload,offload-ddp,ds-config,infinity",
                        help="infinity needs a stratad with --nvme_path (scripts/train_gpt.sh starts one)")
    args = parser.parse_args()
    cfg = dict(DEFAULTS, steps=args.steps)
    modes = args.modes.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="strata-gpt-") as workdir:
        for mode in modes:
            sockets = args.socket.split(",") if args.socket and "," in args.socket else args.socket
            results[mode] = run_mode(mode, cfg, sockets, args.ranks, workdir)
    n_params = sum(p.numel() for p in results[modes[0]][0]["params"].values())
    print(f"tiny GPT: {cfg['layers']} layers, dim {cfg['dim']}, {n_params} params; {args.ranks} ranks (gloo), "
          f"{cfg['steps']} steps, accumulation {cfg['accumulation']}, clipping {cfg['max_norm']}, "
          "warmup + cosine, 2 param groups")
    print("step " + " ".join(f"{m:>12}" for m in modes))
    for s in range(cfg["steps"]):
        print(f"{s:4d} " + " ".join(f"{results[m][0]['losses'][s]:12.6f}" for m in modes))
    ref = modes[0]
    ok = True
    for m in modes[1:]:
        rel = max(abs(a - b) / abs(b) for a, b in zip(results[m][0]["losses"], results[ref][0]["losses"]))
        dp = max((results[m][0]["params"][k] - results[ref][0]["params"][k]).abs().max().item()
                 for k in results[ref][0]["params"])
        print(f"{m} vs {ref}: max relative loss difference {rel:.2e}, max param difference {dp:.2e}")
        ok = ok and rel <= 1e-5 and dp <= 1e-5
    for m in modes:
        if m in ("zero3", "infinity"):
            held = results[m][0]["held_between_steps"]
            print(f"{m}: each rank held {held} of {n_params} param elements between steps; stratad: "
                  + " ".join(" ".join(results[m][0]["daemon_stats"]).split()))
    print("losses and params agree within 1e-5" if ok else "DIFFERENCE above 1e-5")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
