"""st.initialize: a DeepSpeed config (JSON file or dict) -> (model, optimizer).

Reads zero_optimization, optimizer, scheduler, fp16/bf16, gradient_clipping,
gradient_accumulation_steps, train_micro_batch_size_per_gpu and
train_batch_size with DeepSpeed's defaults. "auto" values are filled as
Hugging Face's Trainer fills them (from `args`, a TrainingArguments or a dict
with the same names, `num_training_steps` and the model's config.hidden_size);
an "auto" that cannot be filled is refused naming its key.
"""
import copy
import json
import os

import torch

from strata.torch import optimizer as opt_mod
from strata.torch.schedulers import SCHEDULERS

# DeepSpeed's optimizer names -> (class, defaults of DeepSpeed's CPU optimizers).
_OPTIMIZERS = {
    "adam": (opt_mod.OffloadAdamW, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    "adamw": (opt_mod.OffloadAdamW, dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)),
    "adagrad": (opt_mod.OffloadAdagrad, dict(lr=1e-2, eps=1e-10, weight_decay=0.0)),
    "lion": (opt_mod.OffloadLion, dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0)),
}
_FP16_KEYS = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
              "min_loss_scale", "auto_cast", "consecutive_hysteresis", "fp16_master_weights_and_grads", "type"}


def _arg(args, name, key):
    if args is None:
        raise ValueError(f"{key} is \"auto\": pass args= (TrainingArguments or a dict with '{name}') to fill it, "
                         "or give a value")
    value = args.get(name) if isinstance(args, dict) else getattr(args, name, None)
    if value is None:
        raise ValueError(f"{key} is \"auto\" but args has no '{name}' to fill it from")
    return value


def _load(config):
    if isinstance(config, (str, os.PathLike)):
        try:
            with open(config) as f:
                return json.load(f)
        except OSError as e:
            raise ValueError(f"DeepSpeed config '{config}' cannot be read: {e.strerror}") from e
        except json.JSONDecodeError as e:
            raise ValueError(f"DeepSpeed config '{config}' is not valid JSON: {e}") from e
    if isinstance(config, dict):
        return copy.deepcopy(config)
    raise TypeError(f"config must be a path or a dict, got {type(config).__name__}")


def _get(d, path):
    node = d
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _set(d, path, value):
    parts = path.split(".")
    node = d
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value


def resolve_auto(config, args=None, num_training_steps=None, model=None, world_size=1):
    """Fills "auto" as Hugging Face's HfTrainerDeepSpeedConfig does; returns the config."""
    def hidden_size():
        cfg = getattr(model, "config", None)
        size = getattr(cfg, "hidden_size", None)
        if size is None and getattr(cfg, "hidden_sizes", None):
            size = max(cfg.hidden_sizes)
        if size is None:
            size = getattr(model, "hidden_size", None)
        return size

    fills = {
        "train_micro_batch_size_per_gpu": lambda k: _arg(args, "per_device_train_batch_size", k),
        "gradient_accumulation_steps": lambda k: _arg(args, "gradient_accumulation_steps", k),
        "train_batch_size": lambda k: (world_size * _arg(args, "per_device_train_batch_size", k)
                                       * _arg(args, "gradient_accumulation_steps", k)),
        "gradient_clipping": lambda k: _arg(args, "max_grad_norm", k),
        "optimizer.params.lr": lambda k: _arg(args, "learning_rate", k),
        "optimizer.params.betas": lambda k: [_arg(args, "adam_beta1", k), _arg(args, "adam_beta2", k)],
        "optimizer.params.eps": lambda k: _arg(args, "adam_epsilon", k),
        "optimizer.params.weight_decay": lambda k: _arg(args, "weight_decay", k),
        "scheduler.params.warmup_min_lr": lambda k: 0,
        "scheduler.params.warmup_max_lr": lambda k: _arg(args, "learning_rate", k),
        "scheduler.params.total_num_steps": lambda k: _steps(num_training_steps, k),
        "scheduler.params.warmup_num_steps": lambda k: max(1, _warmup_steps(args, num_training_steps, k)),
        "fp16.enabled": lambda k: bool(_arg(args, "fp16", k)),
        "bf16.enabled": lambda k: bool(_arg(args, "bf16", k)),
        "zero_optimization.reduce_bucket_size": lambda k: _hidden(hidden_size(), k) ** 2,
        "zero_optimization.stage3_prefetch_bucket_size": lambda k: int(0.9 * _hidden(hidden_size(), k) ** 2),
        "zero_optimization.stage3_param_persistence_threshold": lambda k: 10 * _hidden(hidden_size(), k),
    }
    for key, fill in fills.items():
        if _get(config, key) == "auto":
            _set(config, key, fill(key))
    left = _find_auto(config)
    if left:
        raise ValueError(f"{left} is \"auto\", which strata cannot fill (Hugging Face fills no such key); "
                         "give a value")
    return config


def _steps(n, key):
    if n is None:
        raise ValueError(f"{key} is \"auto\": pass num_training_steps= to fill it")
    return int(n)


def _warmup_steps(args, n, key):
    if args is not None and hasattr(args, "get_warmup_steps"):
        return args.get_warmup_steps(_steps(n, key))
    steps = args.get("warmup_steps", 0) if isinstance(args, dict) else getattr(args, "warmup_steps", 0)
    ratio = args.get("warmup_ratio", 0) if isinstance(args, dict) else getattr(args, "warmup_ratio", 0)
    if args is None:
        raise ValueError(f"{key} is \"auto\": pass args= with warmup_steps or warmup_ratio")
    return steps if steps and steps > 0 else int(ratio * _steps(n, key) + 0.999999)


def _hidden(size, key):
    if size is None:
        raise ValueError(f"{key} is \"auto\" but the model has no config.hidden_size to fill it from")
    return int(size)


def _find_auto(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            found = _find_auto(v, f"{prefix}{k}.")
            if found:
                return found
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found = _find_auto(v, f"{prefix}{i}.")
            if found:
                return found
    elif node == "auto":
        return prefix[:-1]
    return None


def _batch_sizes(config, world_size):
    """DeepSpeed's train_batch_size = micro * gas * world, filling the missing ones."""
    tbs = config.get("train_batch_size")
    micro = config.get("train_micro_batch_size_per_gpu")
    gas = config.get("gradient_accumulation_steps")
    for name, v in (("train_batch_size", tbs), ("train_micro_batch_size_per_gpu", micro),
                    ("gradient_accumulation_steps", gas)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if tbs is not None and micro is not None and gas is not None:
        if tbs != micro * gas * world_size:
            raise ValueError(f"train_batch_size {tbs} != train_micro_batch_size_per_gpu {micro} x "
                             f"gradient_accumulation_steps {gas} x world size {world_size}")
    elif tbs is not None and micro is not None:
        gas = tbs // (micro * world_size)
    elif tbs is not None and gas is not None:
        micro = tbs // (gas * world_size)
    elif micro is not None:
        gas = gas or 1
        tbs = micro * gas * world_size
    elif tbs is not None:
        gas = 1
        micro = tbs // world_size
    else:
        raise ValueError("Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided "
                         "(as DeepSpeed requires)")
    if micro < 1 or gas < 1:
        raise ValueError(f"train_batch_size {tbs} is too small for world size {world_size}")
    tbs = micro * gas * world_size
    return tbs, micro, gas


_TOP_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "zero_optimization", "optimizer", "scheduler", "fp16", "bf16", "gradient_clipping",
             "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
             "zero_force_ds_cpu_optimizer", "aio", "activation_checkpointing", "flops_profiler", "tensorboard",
             "wandb", "csv_monitor", "comms_logger", "communication_data_type", "prescale_gradients",
             "gradient_predivide_factor", "sparse_gradients", "amp", "data_types", "dump_state",
             "memory_breakdown", "checkpoint", "elasticity", "autotuning", "compression_training",
             "data_efficiency", "pipeline", "torch_autocast", "timers", "monitor_config"}


def initialize(model, config, model_parameters=None, optimizer=None, args=None, num_training_steps=None,
               socket=None, job_name=None, process_group=None, **optimizer_kwargs):
    """Returns (model, optimizer) for a DeepSpeed config: ZeRO stage 0-2 run
    as ZeRO-Offload in stratad; stage 3 installs the module hooks of
    strata.torch.zero3 (offload_param cpu: ZeRO-3 offload; nvme: Infinity).

    The model comes back converted to fp16/bf16 when the config enables it,
    not wrapped: the optimizer averages gradients across ranks itself (a DDP
    model is accepted as is). A configured scheduler is the optimizer's
    `lr_scheduler` and steps after every applied (not skipped) step, as
    DeepSpeed's engine steps it. Use optimizer.backward(loss) to get
    DeepSpeed's loss scaling (fp16) and 1/gradient_accumulation_steps.

    As DeepSpeed's engine, the optimizer owns clipping (gradient_clipping) and
    accumulation (gradient_accumulation_steps): it hands gradients to stratad
    from backward (overlap_backward=True) and refuses a .grad changed before
    step() or a backward pass more than gradient_accumulation_steps; pass
    overlap_backward=False to hand them off in step() instead.

    Everything is checked before the model is touched: a refused call (or one
    whose optimizer cannot be built, e.g. no daemon) leaves the model as it
    was, dtype and values.
    """
    from strata.torch._comm import Comm
    comm = Comm(process_group)
    cfg = resolve_auto(_load(config), args, num_training_steps, model, comm.world_size)
    unknown = sorted(set(cfg) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"DeepSpeed config key '{unknown[0]}' is not one strata knows "
                         "(check its spelling against DeepSpeed's config reference)")
    _, micro, gas = _batch_sizes(cfg, comm.world_size)
    zero = cfg.get("zero_optimization", {}) or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    if stage == 3 and isinstance(model, torch.nn.parallel.DistributedDataParallel):
        raise ValueError("zero_optimization.stage 3 partitions the params itself: pass the module, not a DDP "
                         "wrapper")
    fp16 = dict(cfg.get("fp16", {}) or {})
    bf16 = dict(cfg.get("bf16", {}) or {})
    for k in fp16:
        if k not in _FP16_KEYS:
            raise ValueError(f"fp16.{k} is not a DeepSpeed fp16 option")
    fp16_on = bool(fp16.get("enabled", False))
    bf16_on = bool(bf16.get("enabled", False))
    if fp16_on and bf16_on:
        raise ValueError("fp16.enabled and bf16.enabled are both true; enable at most one")
    # DeepSpeed 0.19.8 clips at 1.0 when the key is absent (GRADIENT_CLIPPING_DEFAULT).
    clip = cfg.get("gradient_clipping", 1.0)
    if not isinstance(clip, (int, float)) or clip < 0:
        raise ValueError(f"gradient_clipping must be 0 (off) or a positive number, got {clip!r}")

    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    module = model.module if ddp else model

    if optimizer is not None:
        raise ValueError("optimizer=: pass the optimizer's settings in the config's 'optimizer' section "
                         "(strata runs the step in stratad)")
    section = cfg.get("optimizer")
    if section is None:
        raise ValueError("the config has no 'optimizer' section; add one (type Adam, AdamW, Adagrad or Lion)")
    kind = str(section.get("type", "")).lower()
    if kind not in _OPTIMIZERS:
        raise ValueError(f"optimizer.type '{section.get('type')}': expected one of Adam, AdamW, Adagrad, Lion")
    cls, defaults = _OPTIMIZERS[kind]
    params = dict(section.get("params", {}) or {})
    kwargs = dict(defaults)
    allowed = {"lr", "betas", "eps", "weight_decay", "amsgrad", "adam_w_mode", "lr_decay",
               "initial_accumulator_value", "torch_adam", "bias_correction", "fused", "foreach",
               "capturable", "maximize", "differentiable"}
    for k, v in params.items():
        if k not in allowed:
            raise ValueError(f"optimizer.params.{k} is not an option of DeepSpeed's {section.get('type')}")
        if k in ("lr", "betas", "eps", "weight_decay", "amsgrad", "lr_decay", "initial_accumulator_value"):
            kwargs[k] = tuple(v) if k == "betas" else v
    if params.get("bias_correction", True) is False:
        raise ValueError("optimizer.params.bias_correction false is not supported by strata.torch")
    if kind == "adam" and params.get("adam_w_mode", True) is False:
        cls = opt_mod.OffloadAdam
    if kind in ("adagrad",):
        kwargs.pop("betas", None)
    sched = cfg.get("scheduler")
    if sched is not None and sched.get("type") not in SCHEDULERS:
        raise ValueError(f"scheduler.type '{sched.get('type')}': expected one of {', '.join(SCHEDULERS)}")
    if model_parameters is None:
        model_parameters = [p for p in module.parameters() if p.requires_grad]
    else:
        model_parameters = list(model_parameters)   # a generator is read twice below
    bucket = zero.get("reduce_bucket_size", 500_000_000)
    zero3_options = None
    if stage == 3:
        from strata.torch import zero3
        zero3_options = zero3.options_from_config(zero)
        if fp16_on:
            # DeepSpeed's dynamic loss scaler, run by the daemon (as at stage 2).
            zero3_options["fp16"] = {k: v for k, v in fp16.items() if k not in ("enabled", "auto_cast", "type")}
    if sched is not None:
        # The schedule's parameters, checked against a stand-in with the optimizer's param groups.
        _check_scheduler(sched, model_parameters, kwargs.get("lr"))
    # As DeepSpeed's engine, the optimizer owns clipping and accumulation: gradients go to the
    # daemon from backward (a .grad changed before step() is refused), unless the caller says not.
    optimizer_kwargs = dict(optimizer_kwargs)
    optimizer_kwargs.setdefault("overlap_backward", True)

    # Everything is checked: only now is the model touched (a refused call leaves it as it was).
    restore = _convert(module, torch.float16 if fp16_on else torch.bfloat16 if bf16_on else None)
    try:
        if stage == 3:
            opt = zero3.ZERO3_OF[cls](module, model_parameters, **kwargs, socket=socket, job_name=job_name,
                                      process_group=process_group, max_norm=float(clip),
                                      gradient_accumulation_steps=gas, **zero3_options, **optimizer_kwargs)
        else:
            opt = _offload_optimizer(cls, model_parameters, kwargs, socket, job_name, process_group, ddp, clip,
                                     gas, fp16_on, fp16, bucket, zero, stage, optimizer_kwargs)
    except BaseException:
        restore()
        raise
    opt.loss_divisor = gas
    opt.train_micro_batch_size_per_gpu = micro
    opt.gradient_accumulation_steps = gas
    if sched is not None:
        try:
            opt.lr_scheduler = SCHEDULERS[sched["type"]](opt, **(sched.get("params", {}) or {}))
        except (TypeError, ValueError) as e:
            opt.close()
            restore()
            raise ValueError(f"scheduler.params of {sched['type']}: {e}") from e
    return model, opt


class _StandIn:
    """What a schedule reads of an optimizer (its param groups' lr), to check its parameters
    before anything is built."""

    def __init__(self, groups):
        self.param_groups = groups


def _check_scheduler(sched, model_parameters, default_lr):
    groups = [{"lr": g.get("lr", default_lr)} for g in model_parameters if isinstance(g, dict)]
    if not groups:
        groups = [{"lr": default_lr}]
    try:
        SCHEDULERS[sched["type"]](_StandIn(groups), **(sched.get("params", {}) or {}))
    except (TypeError, ValueError) as e:
        raise ValueError(f"scheduler.params of {sched['type']}: {e}") from e


def _convert(module, dtype):
    """module.to(dtype) (fp16: .half(), as DeepSpeed; bf16) when dtype is given; returns a function
    that puts back the very tensors the module had (params, their grads, buffers), for a call that
    fails after the conversion. Until then the old tensors stay referenced (the model's memory
    once more, at most, while the optimizer is built)."""
    if dtype is None:
        return lambda: None
    # .half() swaps a grad's .data in place, so its old data is kept apart from the grad.
    params = [(p, p.data, p.grad, None if p.grad is None else p.grad.data) for p in module.parameters()]
    buffers = [(m, name, b) for m in module.modules() for name, b in m._buffers.items() if b is not None]
    if dtype == torch.float16:
        module.half()
    else:
        module.to(dtype)

    def restore():
        with torch.no_grad():
            for p, data, grad, grad_data in params:
                p.data = data
                if grad is not None:
                    grad.data = grad_data
                p.grad = grad
            for m, name, b in buffers:
                m._buffers[name] = b
    return restore


def _offload_optimizer(cls, model_parameters, kwargs, socket, job_name, process_group, ddp, clip, gas, fp16_on,
                       fp16, bucket, zero, stage, optimizer_kwargs):
    return cls(model_parameters, **kwargs, socket=socket, job_name=job_name, process_group=process_group,
               reduce_gradients=False if ddp else None, max_norm=float(clip), gradient_accumulation_steps=gas,
               fp16={k: v for k, v in fp16.items() if k not in ("enabled", "auto_cast", "type")} if fp16_on else None,
               bucket_numel=int(bucket), sub_group_size=zero.get("sub_group_size"), stage=stage or 2,
               **optimizer_kwargs)
