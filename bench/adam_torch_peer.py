"""The peer of `strata bench adam`: torch.optim.AdamW on CPU, timed per step.

Usage: /usr/bin/python3 adam_torch_peer.py --size N --threads T --foreach 0|1
           [--tensors 10] [--warmup 2] [--steps 5]

Holds N fp32 elements as --tensors equal tensors (params, grads; AdamW adds
exp_avg and exp_avg_sq on its first step). Every tensor is written before the
clock starts (torch.full touches every page), and the warmup steps create the
optimizer state and let the allocator settle. Prints one JSON line with the
median and the fastest step time (strata bench adam uses the fastest, as for
its own kernels). The caller sets OMP_NUM_THREADS and the malloc environment.
"""
import argparse
import json
import statistics
import sys
import time

try:
    import torch
except ImportError as e:  # pragma: no cover
    print(json.dumps({"error": f"cannot import torch: {e}"}))
    sys.exit(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--foreach", type=int, required=True)
    ap.add_argument("--tensors", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    sizes = [args.size // args.tensors] * args.tensors
    sizes[-1] += args.size - sum(sizes)
    params = [torch.full((n,), 0.5, dtype=torch.float32) for n in sizes]
    grads = [torch.full((n,), 1e-3, dtype=torch.float32) for n in sizes]
    for p, g in zip(params, grads):
        p.grad = g
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01, foreach=bool(args.foreach))
    for _ in range(args.warmup):
        opt.step()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
    # CPU time over wall time x threads: below 1 when other processes took the cores.
    cpu_share = (time.process_time() - cpu0) / ((time.perf_counter() - wall0) * args.threads)
    median = statistics.median(times)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "foreach": bool(args.foreach), "size": args.size,
                      "median_step_s": median, "min_step_s": min(times),
                      "elements_per_s": args.size / median, "cpu_share": cpu_share}))


if __name__ == "__main__":
    main()
