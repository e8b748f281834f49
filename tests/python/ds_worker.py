"""Rank processes for test_deepspeed_peer.py: DeepSpeed itself (its engine,
ZeRO-2 with offload_optimizer cpu -> DeepSpeedCPUAdam; or ZeRO-3 with params
and optimizer states on NVMe) training examples/train_gpt.py's tiny GPT on
the same data, with the same DeepSpeed config as train_gpt's ds-config mode
(two param groups, WarmupCosineLR, clipping, accumulation 2). Needs
DS_ACCELERATOR=cpu on a machine without a GPU; the process group is gloo."""
import os

import torch
import torch.distributed as dist

import tiny_gpt
import train_gpt


def config(cfg, variant, nvme_dir=None):
    c = train_gpt.ds_config(cfg)
    if variant == "zero2-offload":
        c["zero_optimization"] = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    elif variant == "zero3-infinity":
        c["zero_optimization"] = {
            "stage": 3,
            "offload_param": {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": False},
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme_dir, "pin_memory": False},
            # Tiny tensors stay resident below this; 0 sends every param to NVMe.
            "stage3_param_persistence_threshold": 0,
        }
        c["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True,
                    "use_gds": False}
    else:
        raise ValueError(variant)
    return c


def run(rank, world, store, out, cfg, variant, nvme_dir):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    torch.set_num_threads(1)
    # DeepSpeed finds the process group we made (gloo) and keeps it.
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        torch.manual_seed(cfg["seed"])
        tokens = tiny_gpt.encode(tiny_gpt.make_text())
        model = tiny_gpt.TinyGPT(len(tiny_gpt.VOCAB), cfg["dim"], cfg["layers"], cfg["heads"], cfg["context"])
        import strata.torch as st
        groups = st.decay_groups(model, cfg["weight_decay"])
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups,
                                               config=config(cfg, variant, nvme_dir))
        losses = []
        for step in range(cfg["steps"]):
            total = torch.zeros(())
            for micro in range(cfg["accumulation"]):
                x, y = tiny_gpt.batch(tokens, step, rank, world, cfg["batch_size"], cfg["context"], micro)
                loss = engine(x, y)
                total += loss.detach().float()
                engine.backward(loss)
                engine.step()
            dist.all_reduce(total)
            losses.append(total.item() / (cfg["accumulation"] * world))
        if variant == "zero3-infinity":
            with deepspeed.zero.GatheredParameters(list(model.parameters())):
                params = {n: p.detach().clone().float() for n, p in model.named_parameters()}
        else:
            params = {n: p.detach().clone().float() for n, p in model.named_parameters()}
        torch.save({"losses": losses, "params": params}, os.path.join(out, f"ds-{variant}-{rank}.pt"))
    finally:
        dist.destroy_process_group()
