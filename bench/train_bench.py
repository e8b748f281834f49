"""`strata bench train`: one training iteration of a ~100M-param GPT
(examples/tiny_gpt.py's model at dim 768, 14 layers: 99M) on the same data, with

  torch-fused         torch.optim.AdamW(fused=True) in the trainer process
  deepspeed-offload   DeepSpeed's engine, ZeRO-2, offload_optimizer cpu (DeepSpeedCPUAdam)
  deepspeed-infinity  DeepSpeed's engine, ZeRO-3, params and optimizer states on NVMe (aio)
  strata-offload      strata.torch.OffloadAdamW: the step runs in a private stratad
  strata-infinity     strata.torch.Zero3AdamW(mode="infinity"): ZeRO-3, params and optimizer
                      states on the daemon's NVMe tier (a file under the run's temporary
                      directory), at most --infinity_budget of the params in its host memory

Each variant runs in its own process (one rank; the process group, where
DeepSpeed needs one, is gloo) for --steps iterations; the first --warmup are
not timed. Reported per variant: the median iteration (forward + backward +
optimizer step) and the median of the optimizer's part (engine.step() /
opt.step(), after backward), the peak resident memory (VmHWM) of the trainer
and of the daemon, the CPU the trainer used, and the losses (every variant
must see the same first loss: same model, same data). Prints a table with
ratios to DeepSpeed's offload step and writes --json FILE.

Like with like: every variant is fp32 (no loss scaling) without gradient
clipping, AdamW with the same hyperparameters and the same two param groups;
the two ZeRO-3 variants keep params of at most 1e5 elements whole in the trainer
(DeepSpeed's stage3_param_persistence_threshold default). For the strata variants
the trainer's hand-off/wait/copy-back split of step() is reported too.

    strata bench train [--json FILE] [--steps 6] [--variants a,b]   # runs this script in the venv
"""
import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "examples"))

VARIANTS = ["torch-fused", "deepspeed-offload", "deepspeed-infinity", "strata-offload", "strata-infinity"]
PERSISTENCE = 100_000   # DeepSpeed 0.19.8's stage3_param_persistence_threshold default
MODEL = dict(dim=768, layers=14, heads=12, context=128, batch=4, lr=3e-4, weight_decay=0.1)


def proc_status(pid="self"):
    """VmHWM, VmRSS, RssAnon, RssShmem in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssShmem", "RssFile"):
                out[key] = int(value.split()[0]) / 1024.0
    return out


def proc_cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick


def decay_groups(model, weight_decay):
    decay, rest = [], []
    for name, p in model.named_parameters():
        (rest if p.ndim < 2 or "bias" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


# ----- one variant, in its own process --------------------------------------------------------

def child(variant, steps, warmup, threads, socket, nvme, store, infinity_budget):
    import torch
    import torch.distributed as dist
    import tiny_gpt

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    m = MODEL
    model = tiny_gpt.TinyGPT(len(tiny_gpt.VOCAB), m["dim"], m["layers"], m["heads"], m["context"])
    n_params = sum(p.numel() for p in model.parameters())
    groups = decay_groups(model, m["weight_decay"])
    engine = None
    opt = None
    if variant.startswith("deepspeed"):
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
        if variant == "deepspeed-infinity":
            zero = {"stage": 3, "stage3_param_persistence_threshold": PERSISTENCE,
                    "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False},
                    "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False}}
        config = {"train_micro_batch_size_per_gpu": m["batch"], "gradient_accumulation_steps": 1,
                  "zero_optimization": zero,
                  "optimizer": {"type": "AdamW", "params": {"lr": m["lr"], "betas": [0.9, 0.999], "eps": 1e-8,
                                                           "weight_decay": m["weight_decay"]}}}
        if variant == "deepspeed-infinity":
            config["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False,
                             "overlap_events": True}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
    elif variant == "torch-fused":
        opt = torch.optim.AdamW(groups, lr=m["lr"], betas=(0.9, 0.999), eps=1e-8, fused=True)
    elif variant == "strata-offload":
        import strata.torch as st
        # The loop leaves .grad alone: the hooks may hand gradients off in backward, as DeepSpeed's engine does.
        opt = st.OffloadAdamW(groups, lr=m["lr"], betas=(0.9, 0.999), eps=1e-8, socket=socket, overlap_backward=True)
    elif variant == "strata-infinity":
        import strata.torch as st
        opt = st.Zero3AdamW(model, groups, lr=m["lr"], betas=(0.9, 0.999), eps=1e-8, socket=socket,
                            mode="infinity", persistence_threshold=PERSISTENCE,
                            pinned_budget_bytes=int(infinity_budget * n_params) * 4)
    else:
        raise ValueError(variant)
    iters, step_parts, losses, parts = [], [], [], []
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    for step in range(steps):
        x, y = tiny_gpt.batch(tokens, step, 0, 1, m["batch"], m["context"])
        t0 = time.perf_counter()
        if engine is not None:
            loss = engine(x, y)
            engine.backward(loss)
            t1 = time.perf_counter()
            engine.step()
        else:
            loss = model(x, y)
            loss.backward()
            t1 = time.perf_counter()
            opt.step()
            opt.zero_grad()
        t2 = time.perf_counter()
        losses.append(float(loss.detach().float()))
        if step >= warmup:
            iters.append(t2 - t0)
            step_parts.append(t2 - t1)
            if getattr(opt, "last_step_times", None):
                parts.append(dict(opt.last_step_times))
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    mem = proc_status()
    if opt is not None and hasattr(opt, "close"):
        opt.close()
    print(json.dumps({"variant": variant, "params": n_params, "iter_s": statistics.median(iters),
                      "step_s": statistics.median(step_parts), "iters": iters, "steps": step_parts,
                      "step_parts": parts, "losses": losses,
                      "trainer_cpu_pct": 100.0 * cpu / wall, "trainer": mem}), flush=True)


# ----- the parent: daemons, table, JSON --------------------------------------------------------

def start_daemon(stratad, directory, threads, pinned, io_engine, fsync, nvme=None):
    sock = os.path.join(directory, "s.sock")
    log = open(os.path.join(directory, "stratad.log"), "w")
    extra = ["--nvme_path", nvme, "--nvme_capacity", "4GiB", "--fsync_policy", fsync] if nvme else []
    proc = subprocess.Popen([stratad, "--socket", sock, "--device", "emulated", "--io_engine", io_engine,
                             "--optimizer_threads", str(threads), "--pinned_capacity", pinned, *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            break
        with open(log.name) as f:
            if "stratad ready" in f.read():
                return proc, sock, log
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"stratad did not start; see {log.name}")


def machine():
    flags = ""
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags") and not flags:
                flags = line
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].strip()
    isa = "AVX-512" if " avx512f" in flags else "AVX2+F16C" if " avx2" in flags and " f16c" in flags else "other"
    return {"cpu": model, "isa": isa, "cores": os.cpu_count(), "loadavg": os.getloadavg()[0]}


def run_variant(variant, args, stratad):
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    with tempfile.TemporaryDirectory(prefix="strata-bench-train-") as d:
        daemon = log = None
        socket = ""
        nvme = os.path.join(d, "nvme")
        os.makedirs(nvme)
        if variant.startswith("strata"):
            daemon, socket, log = start_daemon(stratad, d, args.threads, args.pinned_capacity, args.io_engine,
                                               args.fsync_policy,
                                               nvme if variant == "strata-infinity" else None)
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--steps", str(args.steps),
               "--dim", str(args.dim), "--layers", str(args.layers),
               "--warmup", str(args.warmup), "--threads", str(args.threads), "--socket", socket,
               "--nvme", nvme, "--store", os.path.join(d, "store"),
               "--infinity_budget", str(args.infinity_budget)]
        load0 = os.getloadavg()[0]
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            return {"variant": variant, "error": f"timed out after {args.timeout} s"}
        finally:
            daemon_mem = daemon_cpu = None
            if daemon is not None:
                if daemon.poll() is None:
                    daemon_mem = proc_status(daemon.pid)
                    daemon_cpu = proc_cpu_s(daemon.pid)
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()
                log.close()
        result = None
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
        if proc.returncode != 0 or result is None:
            return {"variant": variant, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
        result["daemon"] = daemon_mem
        result["daemon_cpu_s"] = daemon_cpu
        result["loadavg"] = [load0, os.getloadavg()[0]]
        return result


# Each strata variant against its DeepSpeed peer (issue 9's targets).
PEERS = {"strata-offload": "deepspeed-offload", "strata-infinity": "deepspeed-infinity"}


def total_mib(r):
    return r["trainer"]["VmHWM"] + (r["daemon"]["VmHWM"] if r.get("daemon") else 0.0)


def print_table(results, info):
    print(f"strata bench train: GPT {info['params'] / 1e6:.1f}M params (dim {MODEL['dim']}, {MODEL['layers']} "
          f"layers, context {MODEL['context']}, batch {MODEL['batch']}), 1 rank, {info['threads']} threads, "
          f"{info['steps']} iterations ({info['warmup']} untimed)")
    print(f"machine: {info['machine']['cpu']} ({info['machine']['isa']}), {info['machine']['cores']} cores, "
          f"load average {info['machine']['loadavg']:.1f} at start")
    ok = {r["variant"]: r for r in results if "error" not in r}
    ds = ok.get("deepspeed-offload")
    head = (f"{'variant':<20} {'iter s':>8} {'step() s':>9} {'step/DS':>8} {'iter/DS':>8} {'vs peer':>8} "
            f"{'trainer MiB':>12} {'(anon+shm)':>14} {'daemon MiB':>11} {'total MiB':>10} {'cpu%':>5} {'load':>10}")
    print(head)
    for r in results:
        if "error" in r:
            print(f"{r['variant']:<20} failed: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        t = r["trainer"]
        dmem = r["daemon"]["VmHWM"] if r.get("daemon") else 0.0
        ratio_step = f"{r['step_s'] / ds['step_s']:.2f}x" if ds else "-"
        ratio_iter = f"{r['iter_s'] / ds['iter_s']:.2f}x" if ds else "-"
        peer = ok.get(PEERS.get(r["variant"], ""))
        vs_peer = f"{r['step_s'] / peer['step_s']:.2f}x" if peer else "-"
        print(f"{r['variant']:<20} {r['iter_s']:8.2f} {r['step_s']:9.2f} {ratio_step:>8} {ratio_iter:>8} "
              f"{vs_peer:>8} {t['VmHWM']:12.0f} {t['RssAnon']:7.0f}+{t['RssShmem']:<6.0f} {dmem:11.0f} "
              f"{t['VmHWM'] + dmem:10.0f} {r['trainer_cpu_pct']:5.0f} {r['loadavg'][0]:4.1f}-{r['loadavg'][1]:<4.1f}")
    firsts = {r["variant"]: r["losses"][0] for r in results if "error" not in r}
    print("first loss per variant (same model and data): " +
          ", ".join(f"{k} {v:.6f}" for k, v in firsts.items()))
    print("trainer MiB is the process's peak (VmHWM); (anon+shm) its anonymous and shared memory at the end "
          "(strata's shared exchange slots are the shm part, also mapped by the daemon)")
    for r in results:
        if "error" in r or not r.get("step_parts"):
            continue
        med = {k: statistics.median(p[k] for p in r["step_parts"]) for k in r["step_parts"][0]}
        print(f"{r['variant']}: trainer's share of an iteration (medians, s): " +
              ", ".join(f"{k[:-2]} {v:.3f}" for k, v in med.items()))
    print("targets (issue 9):")
    for variant, peer_name in PEERS.items():
        r, peer = ok.get(variant), ok.get(peer_name)
        if r is None or peer is None:
            print(f"  {variant} step <= 0.8x {peer_name}'s: not measured")
            continue
        ratio = r["step_s"] / peer["step_s"]
        line = (f"  {variant} step <= 0.8x {peer_name}'s: {ratio:.2f}x "
                f"({'met' if ratio <= 0.8 else 'missed'})")
        if variant == "strata-infinity":
            line += (f"; memory (trainer + daemon peak) {total_mib(r):.0f} MiB vs {total_mib(peer):.0f} MiB "
                     f"({'met' if total_mib(r) <= total_mib(peer) else 'missed'})")
        print(line)
    r, torch_r = ok.get("strata-offload"), ok.get("torch-fused")
    if r is not None:
        n = info["params"]
        # What the trainer may hold: the model (fp32 params), its grads and the activations.
        # torch's in-process run holds those plus two fp32 moments: its anon memory less the moments.
        budget = f"{torch_r['trainer']['RssAnon'] - 2 * n * 4 / 2**20:.0f} MiB" if torch_r else "-"
        print(f"  strata-offload's trainer holds no optimizer state: anon {r['trainer']['RssAnon']:.0f} MiB "
              f"+ shared slots {r['trainer']['RssShmem']:.0f} MiB; params {n * 4 / 2**20:.0f} MiB, grads "
              f"{n * 4 / 2**20:.0f} MiB; torch-fused's anon less its moments {budget}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count()),
                    help="torch threads of every trainer and stratad's optimizer threads")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--stratad", default=os.path.join(HERE, "..", "build", "bin", "stratad"))
    ap.add_argument("--pinned_capacity", default="8GiB",
                    help="stratad's pinned host tier (the offload job's masters, moments and slots live there)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per variant")
    ap.add_argument("--dim", type=int, default=MODEL["dim"], help="model width (a quick try: --dim 64 --layers 2)")
    ap.add_argument("--layers", type=int, default=MODEL["layers"])
    ap.add_argument("--io_engine", default="auto",
                    help="stratad's NVMe engine (auto, io_uring, libaio, psync); DeepSpeed's peer uses libaio")
    ap.add_argument("--fsync_policy", default="never",
                    help="stratad's NVMe fsync policy for strata-infinity (DeepSpeed's swap files are never "
                         "fsynced: 'never' compares like with like; batched is stratad's default)")
    ap.add_argument("--infinity_budget", type=float, default=0.25,
                    help="strata-infinity: the fraction of the params stratad may keep in host memory")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--nvme", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args()
    MODEL.update(dim=args.dim, layers=args.layers, heads=12 if args.dim % 12 == 0 else 4)
    if args.child:
        child(args.child, args.steps, args.warmup, args.threads, args.socket, args.nvme, args.store,
              args.infinity_budget)
        return 0
    if args.steps <= args.warmup:
        ap.error(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"unknown variant '{v}'; the variants are {', '.join(VARIANTS)}")
    if any(v.startswith("strata") for v in variants) and not os.access(args.stratad, os.X_OK):
        ap.error(f"stratad is not at {args.stratad}; pass --stratad")
    info = {"machine": machine(), "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
            "model": MODEL}
    results = []
    for v in variants:
        print(f"running {v} ...", file=sys.stderr, flush=True)
        results.append(run_variant(v, args, args.stratad))
    ok = [r for r in results if "error" not in r]
    info["params"] = ok[0]["params"] if ok else 0
    print_table(results, info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=2)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
