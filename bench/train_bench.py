"""`strata bench train`: training iterations of a GPT on the same data, with

  torch-fused         torch.optim.AdamW(fused=True) in the trainer process
  deepspeed-offload   DeepSpeed's engine, ZeRO-2, offload_optimizer cpu (DeepSpeedCPUAdam)
  deepspeed-zero3     DeepSpeed's engine, ZeRO-3, offload_param cpu and offload_optimizer cpu
  deepspeed-infinity  DeepSpeed's engine, ZeRO-3, params and optimizer states on NVMe (aio)
  strata-offload      st.initialize at stage 2 (ZeRO-Offload): the step runs in a private stratad
  strata-zero3        st.initialize at stage 3, offload_param cpu: params partitioned into stratad's
                      host memory
  strata-infinity     st.initialize at stage 3, offload_param nvme: params and optimizer states on
                      the daemon's NVMe tier (a file under the run's temporary directory), at most
                      --infinity_budget of the params in its host memory (max_in_cpu)

The model (--model): tiny = examples/tiny_gpt.py's model (default: dim 768, 14 layers, 99M
params, its character data); gpt2 = transformers' GPT2LMHeadModel and llama = LlamaForCausalLM,
built from their config classes with random weights (nothing downloads), --dim wide, --layers
deep, heads of 64 (dim % 64 == 0, else the tiny model's rule), vocabulary --vocab, context --seq,
on random tokens from a fixed seed. --dtype fp32|bf16|fp16 is the DeepSpeed config's "bf16" /
"fp16" section; every DeepSpeed and strata variant gets the same config (DeepSpeed's engine
and st.initialize convert the model themselves), torch-fused runs the model in that dtype with
no fp32 master. A combination DeepSpeed's engine refuses (fp16 on a CPU without mkldnn fp16,
say) is reported as "refused by DeepSpeed: <its message>".

Each variant runs in its own process (one rank; the process group, where
DeepSpeed needs one, is gloo) for --steps iterations; the first --warmup are
not timed. Reported per variant: the median iteration (forward + backward +
optimizer step) and the median of the optimizer's part (engine.step() /
opt.step(), after backward), the peak resident memory (VmHWM) of the trainer
and of the daemon, the CPU the trainer used, and the losses (every variant
must see the same first loss: same model, same data). Prints a table with
ratios to DeepSpeed's offload step and to each strata variant's DeepSpeed peer,
and writes --json FILE (with the model, dtype, ISA and load average).

Like with like: no gradient clipping (gradient_clipping 0: DeepSpeed 0.19.8 clips
at 1.0 when the key is absent), AdamW with the same hyperparameters and the same
two param groups; the ZeRO-3 variants keep params of at most 1e5 elements whole in
the trainer (DeepSpeed's stage3_param_persistence_threshold default). For the
strata variants the trainer's hand-off/wait/copy-back split of step() is reported too.

    strata bench train [--json FILE] [--steps 6] [--variants a,b] [--model llama --dtype bf16]
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

VARIANTS = ["torch-fused", "deepspeed-offload", "deepspeed-zero3", "deepspeed-infinity", "strata-offload",
            "strata-zero3", "strata-infinity"]
MODELS = ["tiny", "gpt2", "llama"]
DTYPES = ["fp32", "bf16", "fp16"]
PERSISTENCE = 100_000   # DeepSpeed 0.19.8's stage3_param_persistence_threshold default
MODEL = dict(model="tiny", dtype="fp32", dim=768, layers=14, heads=12, context=128, vocab=8192, batch=4, lr=3e-4,
             weight_decay=0.1)


def heads_for(model, dim):
    """Heads of 64 for the HF models (GPT-2's and LLaMA's own width per head); the tiny
    model's rule (12 when they divide the width, else 4) otherwise."""
    if model != "tiny" and dim % 64 == 0:
        return dim // 64
    return 12 if dim % 12 == 0 else 4


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

def build_model(m):
    """(model, batch(step) -> inputs, loss(module_or_engine, inputs) -> loss), fp32 with the
    seed already set: every variant starts from the same weights."""
    import torch
    if m["model"] == "tiny":
        import tiny_gpt
        tokens = tiny_gpt.encode(tiny_gpt.make_text())
        model = tiny_gpt.TinyGPT(len(tiny_gpt.VOCAB), m["dim"], m["layers"], m["heads"], m["context"])
        return (model, lambda step: tiny_gpt.batch(tokens, step, 0, 1, m["batch"], m["context"]),
                lambda f, xy: f(*xy))
    import transformers
    # No dropout: the same loss from every variant, step by step (as the tiny model).
    if m["model"] == "gpt2":
        config = transformers.GPT2Config(vocab_size=m["vocab"], n_positions=m["context"], n_embd=m["dim"],
                                         n_layer=m["layers"], n_head=m["heads"], resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config)
    else:
        # LLaMA's MLP width: 8/3 of the model's, rounded up to a multiple of 64 (as LLaMA rounds it).
        hidden = -(-(8 * m["dim"] // 3) // 64) * 64
        config = transformers.LlamaConfig(vocab_size=m["vocab"], hidden_size=m["dim"], intermediate_size=hidden,
                                          num_hidden_layers=m["layers"], num_attention_heads=m["heads"],
                                          num_key_value_heads=m["heads"], max_position_embeddings=m["context"],
                                          attention_dropout=0.0)
        model = transformers.LlamaForCausalLM(config)

    def batch(step):
        g = torch.Generator().manual_seed(1000 + step)
        return torch.randint(0, m["vocab"], (m["batch"], m["context"]), generator=g)

    return model, batch, lambda f, x: f(input_ids=x, labels=x).loss


def ds_config(variant, m, nvme, n_params, infinity_budget):
    """The DeepSpeed config of a DeepSpeed variant and of its strata peer (the same dict)."""
    kind = variant.split("-", 1)[1]
    if kind == "offload":
        zero = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    elif kind == "zero3":
        zero = {"stage": 3, "stage3_param_persistence_threshold": PERSISTENCE,
                "offload_param": {"device": "cpu", "pin_memory": False},
                "offload_optimizer": {"device": "cpu", "pin_memory": False}}
    else:
        # max_in_cpu bounds the params either engine keeps in host memory (DeepSpeed's default, 1e9
        # elements, would keep all of them there).
        zero = {"stage": 3, "stage3_param_persistence_threshold": PERSISTENCE,
                "offload_param": {"device": "nvme", "nvme_path": nvme, "pin_memory": False,
                                  "max_in_cpu": max(1, int(infinity_budget * n_params))},
                "offload_optimizer": {"device": "nvme", "nvme_path": nvme, "pin_memory": False}}
    config = {"train_micro_batch_size_per_gpu": m["batch"], "gradient_accumulation_steps": 1,
              "gradient_clipping": 0.0, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": m["lr"], "betas": [0.9, 0.999], "eps": 1e-8,
                                                       "weight_decay": m["weight_decay"]}}}
    if m["dtype"] == "bf16":
        config["bf16"] = {"enabled": True}
    elif m["dtype"] == "fp16":
        config["fp16"] = {"enabled": True}   # dynamic loss scale, DeepSpeed's defaults
    if kind == "infinity":
        config["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True}
    return config


def child(variant, steps, warmup, threads, socket, nvme, store, infinity_budget):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    m = MODEL
    model, make_batch, loss_of = build_model(m)
    n_params = sum(p.numel() for p in model.parameters())
    groups = decay_groups(model, m["weight_decay"])
    engine = None
    opt = None
    if variant.startswith("deepspeed"):
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        config = ds_config(variant, m, nvme, n_params, infinity_budget)
        try:
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)
        except Exception as e:   # DeepSpeed's own refusal of this dtype/stage on this machine: say so
            print(json.dumps({"variant": variant, "params": n_params,
                              "refused": f"refused by DeepSpeed: {type(e).__name__}: {e}"}), flush=True)
            return
    elif variant == "torch-fused":
        model.to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[m["dtype"]])
        opt = torch.optim.AdamW(groups, lr=m["lr"], betas=(0.9, 0.999), eps=1e-8, fused=True)
    elif variant.startswith("strata"):
        import strata.torch as st
        # The DeepSpeed peer's config, as a user passes it. st.initialize hands gradients off in
        # backward (overlap_backward=True), as DeepSpeed's engine does; the loop leaves .grad alone.
        config = ds_config(variant, m, nvme, n_params, infinity_budget)
        model, opt = st.initialize(model, config=config, model_parameters=groups, socket=socket)
    else:
        raise ValueError(variant)
    iters, step_parts, losses, parts = [], [], [], []
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    for step in range(steps):
        inputs = make_batch(step)
        t0 = time.perf_counter()
        if engine is not None:
            loss = loss_of(engine, inputs)
            engine.backward(loss)
            t1 = time.perf_counter()
            engine.step()
        else:
            loss = loss_of(model, inputs)
            if hasattr(opt, "backward"):
                opt.backward(loss)     # fp16: the daemon's loss scale, as engine.backward
            else:
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
    present = set(flags.split(":", 1)[-1].split())
    # The vector extensions stratad's kernels dispatch on (AVX-512, AVX2, F16C for fp16/bf16 moments).
    isa = "+".join(name for flag, name in (("avx512f", "AVX-512F"), ("avx2", "AVX2"), ("f16c", "F16C"))
                   if flag in present) or "none of avx512f/avx2/f16c"
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
               "--model", args.model, "--dtype", args.dtype, "--dim", str(args.dim), "--layers", str(args.layers),
               "--seq", str(args.seq), "--vocab", str(args.vocab),
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
        if "refused" in result:
            result["loadavg"] = [load0, os.getloadavg()[0]]
            return result
        result["daemon"] = daemon_mem
        result["daemon_cpu_s"] = daemon_cpu
        result["loadavg"] = [load0, os.getloadavg()[0]]
        return result


# Each strata variant against its DeepSpeed peer (issue 9's targets).
PEERS = {"strata-offload": "deepspeed-offload", "strata-zero3": "deepspeed-zero3",
         "strata-infinity": "deepspeed-infinity"}
NAMES = {"torch-fused": "torch AdamW fused, in-process", "deepspeed-offload": "DeepSpeed ZeRO-2 + CPU offload",
         "deepspeed-zero3": "DeepSpeed ZeRO-3 + CPU offload", "deepspeed-infinity": "DeepSpeed ZeRO-3 Infinity (NVMe)",
         "strata-offload": "strata offload (stage 2)", "strata-zero3": "strata ZeRO-3 offload",
         "strata-infinity": "strata infinity"}


def total_mib(r):
    return r["trainer"]["VmHWM"] + (r["daemon"]["VmHWM"] if r.get("daemon") else 0.0)


def usable(r):
    return "error" not in r and "refused" not in r


def print_table(results, info):
    name = {"tiny": "tiny GPT", "gpt2": "GPT-2 (transformers)", "llama": "LLaMA (transformers)"}[MODEL["model"]]
    vocab = f", vocab {MODEL['vocab']}" if MODEL["model"] != "tiny" else ""
    print(f"strata bench train: {name}, {MODEL['dtype']}, {info['params'] / 1e6:.1f}M params (dim {MODEL['dim']}, "
          f"{MODEL['layers']} layers, {MODEL['heads']} heads, context {MODEL['context']}{vocab}, batch "
          f"{MODEL['batch']}), 1 rank, {info['threads']} threads, {info['steps']} iterations ({info['warmup']} "
          f"untimed)")
    print(f"machine: {info['machine']['cpu']} ({info['machine']['isa']}), {info['machine']['cores']} cores, "
          f"load average {info['loadavg'][0]:.1f} at start, {info['loadavg'][1]:.1f} at end")
    ok = {r["variant"]: r for r in results if usable(r)}
    ds = ok.get("deepspeed-offload")
    head = (f"{'variant':<20} {'iter s':>8} {'step() s':>9} {'step/DS':>8} {'iter/DS':>8} {'vs peer':>8} "
            f"{'trainer MiB':>12} {'(anon+shm)':>14} {'daemon MiB':>11} {'total MiB':>10} {'cpu%':>5} {'load':>10}")
    print(head)
    for r in results:
        if "error" in r:
            print(f"{r['variant']:<20} failed: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        if "refused" in r:
            print(f"{r['variant']:<20} {r['refused']}")
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
    firsts = {r["variant"]: r["losses"][0] for r in results if usable(r)}
    print("first loss per variant (same model and data): " +
          ", ".join(f"{k} {v:.6f}" for k, v in firsts.items()))
    print("trainer MiB is the process's peak (VmHWM); (anon+shm) its anonymous and shared memory at the end "
          "(strata's shared exchange slots are the shm part, also mapped by the daemon)")
    for r in results:
        if not usable(r) or not r.get("step_parts"):
            continue
        med = {k: statistics.median(p[k] for p in r["step_parts"]) for k in r["step_parts"][0]}
        print(f"{r['variant']}: trainer's share of an iteration (medians, s): " +
              ", ".join(f"{k[:-2]} {v:.3f}" for k, v in med.items()))
    print("markdown (docs/PYTHON.md):")
    print("| variant | iteration s | step() s | step / DeepSpeed peer | iteration / DeepSpeed peer | "
          "trainer peak MiB (anon + shm at end) | daemon peak MiB | total MiB | first loss |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        label = NAMES[r["variant"]]
        if not usable(r):
            text = r.get("refused") or "failed: " + (r["error"].splitlines()[-1] if r["error"] else "")
            print(f"| {label} | {text.replace('|', '/')} | | | | | | | |")
            continue
        peer = ok.get(PEERS.get(r["variant"], ""))
        own = r["variant"].startswith("deepspeed")
        t, d = r["trainer"], r["daemon"]["VmHWM"] if r.get("daemon") else None
        step_ratio = "1.00x" if own else f"**{r['step_s'] / peer['step_s']:.2f}x**" if peer else "–"
        iter_ratio = "1.00x" if own else f"{r['iter_s'] / peer['iter_s']:.2f}x" if peer else "–"
        print(f"| {label} | {r['iter_s']:.2f} | {r['step_s']:.2f} | {step_ratio} | {iter_ratio} | "
              f"{t['VmHWM']:.0f} ({t['RssAnon']:.0f} + {t['RssShmem']:.0f}) | "
              f"{'–' if d is None else f'{d:.0f}'} | {total_mib(r):.0f} | {r['losses'][0]:.4f} |")
    print("targets (issue 9):")
    for variant, peer_name in PEERS.items():
        r, peer = ok.get(variant), ok.get(peer_name)
        if r is None or peer is None:
            print(f"  {variant} step <= 0.8x {peer_name}'s: not measured")
            continue
        ratio = r["step_s"] / peer["step_s"]
        line = (f"  {variant} step <= 0.8x {peer_name}'s: {ratio:.2f}x "
                f"({'met' if ratio <= 0.8 else 'missed'})")
        if variant != "strata-offload":
            line += (f"; memory (trainer + daemon peak) {total_mib(r):.0f} MiB vs {total_mib(peer):.0f} MiB "
                     f"({'met' if total_mib(r) <= total_mib(peer) else 'missed'})")
        print(line)
    r, torch_r = ok.get("strata-offload"), ok.get("torch-fused")
    if r is not None:
        n = info["params"]
        width = 4 if MODEL["dtype"] == "fp32" else 2    # bytes of a param, a grad and (torch's) a moment
        # What the trainer may hold: the model's params, its grads and the activations.
        # torch's in-process run holds those plus two moments: its anon memory less the moments.
        budget = f"{torch_r['trainer']['RssAnon'] - 2 * n * width / 2**20:.0f} MiB" if torch_r else "-"
        print(f"  strata-offload's trainer holds no optimizer state: anon {r['trainer']['RssAnon']:.0f} MiB "
              f"+ shared slots {r['trainer']['RssShmem']:.0f} MiB; params {n * width / 2**20:.0f} MiB, grads "
              f"{n * width / 2**20:.0f} MiB; torch-fused's anon less its moments {budget}")


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
    ap.add_argument("--model", default="tiny", choices=MODELS,
                    help="tiny: examples/tiny_gpt.py's model; gpt2 / llama: transformers' GPT2LMHeadModel / "
                         "LlamaForCausalLM from their configs, random weights")
    ap.add_argument("--dtype", default="fp32", choices=DTYPES,
                    help="the DeepSpeed config's bf16/fp16 section, the same for DeepSpeed and strata")
    ap.add_argument("--seq", type=int, default=MODEL["context"], help="context (tokens per sample)")
    ap.add_argument("--vocab", type=int, default=MODEL["vocab"], help="vocabulary of gpt2 / llama")
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
    if args.model == "tiny" and args.vocab != MODEL["vocab"]:
        ap.error("--vocab is for --model gpt2 / llama (the tiny model's vocabulary is its character set)")
    MODEL.update(model=args.model, dtype=args.dtype, dim=args.dim, layers=args.layers, context=args.seq,
                 vocab=args.vocab, heads=heads_for(args.model, args.dim))
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
    start = info["machine"]["loadavg"]
    results = []
    for v in variants:
        print(f"running {v} ...", file=sys.stderr, flush=True)
        results.append(run_variant(v, args, args.stratad))
    info["loadavg"] = [start, os.getloadavg()[0]]   # 1-minute load average at start and end
    info["params"] = next((r["params"] for r in results if "params" in r), 0)
    ok = [r for r in results if "error" not in r]
    print_table(results, info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=2)
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
