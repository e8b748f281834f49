"""The peers of `strata bench adam`, each doing a variant its best way.

Usage: PYTHON adam_peers.py --peer torch_fused|deepspeed|torch_foreach
           --variants adamw:fp32:none,adamw:fp16:fp16,... --size N --threads T
           [--warmup 2] [--steps 5] [--no-build]

A variant is ALGO:GRAD:OUT as strata bench adam names it (algo adamw, adagrad or
lion; grad fp32/fp16/bf16; out none/fp16/bf16). Every peer keeps fp32 master
params and fp32 states in one flat tensor of N elements (what ZeRO-Offload
hands the CPU optimizer) and runs the same hyperparameters as ours (weight
decay 0.01; Lion lr 1e-4, betas 0.9/0.99). None of the peers takes a 16-bit
gradient or writes a 16-bit param copy in its step (DeepSpeed 0.19 removed the
fused fp16 copy), so a 16-bit variant is timed as the three passes a user
writes: upcast the gradient into the fp32 grad, step, downcast the params into
the 16-bit copy.

  torch_fused    torch.optim.AdamW/Adagrad(fused=True) (torch >= 2.4, the venv)
  deepspeed      DeepSpeedCPUAdam / DeepSpeedCPUAdagrad / DeepSpeedCPULion,
                 JIT-built with DS_ACCELERATOR=cpu (cached in ~/.cache/torch_extensions)
  torch_foreach  torch.optim.AdamW/Adagrad(foreach=True) (Debian's torch 1.13)

Prints one JSON line per variant: {"peer", "variant", "min_step_s", ...} or
{"peer", "variant", "unsupported": why} when the peer has no such optimizer.
Exit status 3 when the peer cannot be imported or built at all (one JSON line
with "error"). The caller sets OMP_NUM_THREADS and the malloc environment.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(json.dumps({"error": f"cannot import torch with {sys.executable}: {e}"}))
    sys.exit(3)

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LION = dict(lr=1e-4, betas=(0.9, 0.99))


class Unsupported(Exception):
    pass


def torch_optimizer(algo, params, how):
    kw = {how: True}
    if algo == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                 weight_decay=0.01, **kw)
    if algo == "adagrad":
        try:
            return torch.optim.Adagrad(params, lr=1e-2, eps=1e-10, weight_decay=0.01, **kw)
        except (TypeError, RuntimeError) as e:
            raise Unsupported(f"torch {torch.__version__} Adagrad({how}=True): {e}")
    raise Unsupported(f"torch {torch.__version__} has no {algo} optimizer")


def require_built(builder_cls):
    """With --no-build, a DeepSpeed op that is not in the JIT cache yet is
    reported instead of built (a first build takes minutes on 2 busy cores)."""
    if not NO_BUILD:
        return
    from torch.utils.cpp_extension import _get_build_directory
    name = builder_cls().name
    directory = _get_build_directory(name, verbose=False)
    if not os.path.exists(os.path.join(directory, f"{name}.so")):
        raise Unsupported(f"DeepSpeed's {name} op is not built yet (--no-build; {directory})")


NO_BUILD = False


def deepspeed_optimizer(algo, params):
    from deepspeed.ops.op_builder import CPUAdagradBuilder, CPUAdamBuilder, CPULionBuilder
    require_built({"adamw": CPUAdamBuilder, "adagrad": CPUAdagradBuilder}.get(algo, CPULionBuilder))
    if algo == "adamw":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                adamw_mode=True)
    if algo == "adagrad":
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        return DeepSpeedCPUAdagrad(params, lr=1e-2, eps=1e-10, weight_decay=0.01)
    if algo == "lion":
        from deepspeed.ops.lion import DeepSpeedCPULion
        return DeepSpeedCPULion(params, weight_decay=0.01, **LION)
    raise Unsupported(f"DeepSpeed has no CPU {algo}")


def make_optimizer(peer, algo, params):
    if peer == "torch_fused":
        return torch_optimizer(algo, params, "fused")
    if peer == "torch_foreach":
        return torch_optimizer(algo, params, "foreach")
    return deepspeed_optimizer(algo, params)


def measure(peer, variant, n, threads, warmup, steps):
    algo, grad, out = variant.split(":")
    if grad not in DTYPES or out not in ("none", "fp16", "bf16"):
        raise SystemExit(f"bad variant '{variant}': use ALGO:fp32|fp16|bf16:none|fp16|bf16")
    # Values that keep the arithmetic normal, as ours (no denormals, infs).
    p = torch.full((n,), 0.5, dtype=torch.float32)
    g32 = torch.full((n,), 1e-3, dtype=torch.float32)
    p.grad = g32
    g16 = g32.to(DTYPES[grad]) if grad != "fp32" else None
    p16 = torch.zeros(n, dtype=DTYPES[out]) if out != "none" else None
    opt = make_optimizer(peer, algo, [p])

    def step():
        if g16 is not None:
            g32.copy_(g16)  # upcast
        opt.step()
        if p16 is not None:
            p16.copy_(p)  # downcast

    for _ in range(warmup):
        step()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    # CPU time over wall time x threads: below 1 when other processes took the cores.
    cpu_share = (time.process_time() - cpu0) / ((time.perf_counter() - wall0) * threads)
    return {"min_step_s": min(times), "median_step_s": statistics.median(times),
            "elements_per_s": n / min(times), "cpu_share": cpu_share}


def version(peer):
    if peer == "deepspeed":
        import deepspeed
        return f"deepspeed {deepspeed.__version__} (torch {torch.__version__})"
    return f"torch {torch.__version__}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", required=True, choices=["torch_fused", "deepspeed", "torch_foreach"])
    ap.add_argument("--variants", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-build", action="store_true",
                    help="deepspeed: skip ops not JIT-built yet instead of building them")
    args = ap.parse_args()
    global NO_BUILD
    NO_BUILD = args.no_build
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    try:
        ver = version(args.peer)
    except Exception as e:  # noqa: BLE001 -- any import failure means "no such peer here"
        print(json.dumps({"peer": args.peer, "error": f"cannot import {args.peer} with {sys.executable}: {e}"}))
        sys.exit(3)
    for variant in args.variants.split(","):
        row = {"peer": args.peer, "variant": variant, "threads": args.threads, "size": args.size,
               "version": ver}
        try:
            row.update(measure(args.peer, variant, args.size, args.threads, args.warmup, args.steps))
        except Unsupported as e:
            row["unsupported"] = str(e)
        except Exception as e:  # noqa: BLE001 -- a failed JIT build or load, reported per variant
            row["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
