"""Runs torch.optim on the cases torch_compare_test.cc writes, for comparison.

Usage: /usr/bin/python3 torch_reference.py DIR

For every DIR/case_K.txt (key value lines) it reads case_K.params0 (fp32) and
case_K.grads (`steps` gradients of `grad_dtype`), runs `steps` optimizer steps
with torch's own optimizer (Lion: lucidrains/lion-pytorch's update written
with torch ops), and writes case_K.torch_params and case_K.torch_<state> (fp32).
It also converts case_K.ours_params (our fp32 result) with torch's .half() and
.to(torch.bfloat16) into case_K.torch_fp16 / case_K.torch_bf16.
Exit status 3 when torch is missing, so the test can skip with a reason.
"""
import glob
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"torch_reference.py: {e}", file=sys.stderr)
    sys.exit(3)

DTYPES = {"fp32": (np.float32, torch.float32), "fp16": (np.float16, torch.float16),
          "bf16": (np.int16, torch.bfloat16)}


def read_config(path):
    config = {}
    with open(path) as f:
        for line in f:
            key, value = line.split()
            config[key] = value
    return config


def load_grads(path, dtype, steps, n):
    np_dtype, torch_dtype = DTYPES[dtype]
    raw = np.fromfile(path, dtype=np_dtype).reshape(steps, n)
    t = torch.from_numpy(raw.copy())
    if dtype == "bf16":
        t = t.view(torch.bfloat16)
    return t


def lion_step(param, grad, exp_avg, lr, wd, beta1, beta2, maximize):
    # lucidrains/lion-pytorch update_fn (Chen et al. 2023, Algorithm 2).
    if maximize:
        grad = -grad
    param.mul_(1 - lr * wd)
    update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
    param.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


def run_case(prefix, c):
    n, steps = int(c["n"]), int(c["steps"])
    lr, wd = float(c["lr"]), float(c["weight_decay"])
    beta1, beta2, eps = float(c["beta1"]), float(c["beta2"]), float(c["eps"])
    amsgrad, maximize = c["amsgrad"] == "1", c["maximize"] == "1"
    grad_scale = np.float32(float(c["grad_scale"]))
    foreach = c.get("foreach", "0") == "1"
    param = torch.from_numpy(np.fromfile(prefix + ".params0", dtype=np.float32).copy())
    param.requires_grad_(False)
    grads = load_grads(prefix + ".grads", c["grad_dtype"], steps, n)
    algo = c["algo"]
    states = {}
    if algo == "adam" or algo == "adamw":
        cls = torch.optim.Adam if algo == "adam" else torch.optim.AdamW
        opt = cls([param], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd,
                  amsgrad=amsgrad, maximize=maximize, foreach=foreach)
    elif algo == "adagrad":
        opt = torch.optim.Adagrad([param], lr=lr, lr_decay=float(c["lr_decay"]),
                                  weight_decay=wd, eps=eps,
                                  initial_accumulator_value=float(c["initial_accumulator_value"]),
                                  maximize=maximize, foreach=foreach)
    elif algo == "lion":
        opt = None
        states["exp_avg"] = torch.zeros_like(param)
    else:
        raise ValueError(algo)
    for step in range(steps):
        # The gradient as our kernel sees it: converted to fp32, times the scale
        # (one fp32 multiply, as in the kernel).
        g = grads[step].float() * torch.tensor(grad_scale)
        if opt is None:
            lion_step(param, g, states["exp_avg"], lr, wd, beta1, beta2, maximize)
        else:
            param.grad = g
            opt.step()
    if opt is not None:
        states = {k: v for k, v in opt.state[param].items() if k != "step"}
    param.numpy().astype(np.float32).tofile(prefix + ".torch_params")
    for name, t in states.items():
        t.numpy().astype(np.float32).tofile(prefix + ".torch_" + name)
    ours = torch.from_numpy(np.fromfile(prefix + ".ours_params", dtype=np.float32).copy())
    ours.half().view(torch.int16).numpy().tofile(prefix + ".torch_fp16")
    ours.to(torch.bfloat16).view(torch.int16).numpy().tofile(prefix + ".torch_bf16")


def main():
    torch.set_num_threads(1)
    directory = sys.argv[1]
    cases = sorted(glob.glob(os.path.join(directory, "case_*.txt")))
    for path in cases:
        run_case(path[:-4], read_config(path))
    # Conversions of edge values (written by the test as convert.f32).
    conv = os.path.join(directory, "convert.f32")
    if os.path.exists(conv):
        x = torch.from_numpy(np.fromfile(conv, dtype=np.float32).copy())
        x.half().view(torch.int16).numpy().tofile(conv + ".torch_fp16")
        x.to(torch.bfloat16).view(torch.int16).numpy().tofile(conv + ".torch_bf16")
    print(f"torch {torch.__version__}: {len(cases)} cases")


if __name__ == "__main__":
    main()
