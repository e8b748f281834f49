"""The generated half of the conformance corpus.

Every field of DeepSpeed's own pydantic models for the sections strata reads
(read from the models themselves, so a field DeepSpeed adds is covered the day
the venv moves), under its name and its alias, each given every value of one
palette (right and wrong types, boundaries, pydantic's coercions, "auto",
null); the stage x offload-device matrix; legacy forms; every top-level key
DeepSpeed reads, each given an object, an array, null, a string, a number;
removed keys; optimizer names in several cases; batch-size combinations;
nesting; numbers beyond a double. Each case carries tags that the allow-list
in test_conformance.py may name; a case's tags never decide agreement.
"""
import json

from deepspeed.runtime.config_utils import DeepSpeedConfigModel
from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
from deepspeed.runtime.tensor_parallel.config import TPTrainingConfig
from deepspeed.runtime.config import HybridEngineConfig
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.offload_config import (DeepSpeedZeroOffloadOptimizerConfig,
                                                   DeepSpeedZeroOffloadParamConfig)

# gradient_clipping is given so that the generated cases vary it explicitly;
# the cases that leave it out (batch sizes, hand-written configs) check
# DeepSpeed's default of 1.0.
BASE = {"train_batch_size": 8, "gradient_clipping": 0.5}

PALETTE = [
    True, False, 0, 1, 2, -1, 7, 2.5, 1.0, 5e8, 1e20, 9.3e18, 0.5, "7", "5e8", "5.0", "1_000", " 3 ", "yes", "off",
    "YES", "", "x", "auto", None, [], [1], {}, "cpu", "nvme", "none", "CPU", "0.5", "nan", "inf", "/tmp/p", 5e9,
    -5e9
]

# Fields whose strata type is narrower than a Python int (the "int-range"
# difference): path -> (min, max).
NARROW = {
    "zero_optimization.offload_optimizer.buffer_count": (0, 2**32 - 1),
    "zero_optimization.offload_param.buffer_count": (0, 2**32 - 1),
    "tensor_parallel.autotp_size": (0, 2**32 - 1),
    "fp16.initial_scale_power": (-1074, 1023),
    "fp16.loss_scale_window": (0, 2**32 - 1),
    "fp16.hysteresis": (0, 2**32 - 1),
}
UNVALIDATED_SUBMODELS = {"zenflow", "leaf_module"}


def py_int(v):
    """pydantic's lax int of v, or None."""
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v.is_integer() and abs(v) < 2**63 else None
    if isinstance(v, str):
        s = v.strip()
        if s.endswith(".0"):
            s = s[:-2]
        try:
            return int(s)
        except ValueError:
            return None
    return None


def case(name, config, tags=(), text=None):
    return {"name": name, "text": text if text is not None else json.dumps(config), "tags": sorted(set(tags))}


def nested(path, value, stage=None):
    cfg = json.loads(json.dumps(BASE))
    parts = path.split(".")
    d = cfg
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value
    if stage is not None:
        cfg.setdefault("zero_optimization", {})["stage"] = stage
    return cfg


def field_names(model):
    out = []
    for name, f in model.model_fields.items():
        out.append((name, f.alias))
    return out


def model_cases(section, model, stage=None, skip=()):
    cases = []
    for name, alias in field_names(model):
        if name in skip:
            continue
        for key in [name] + ([alias] if alias and alias != name else []):
            path = f"{section}.{key}"
            for i, v in enumerate(PALETTE):
                tags = []
                if name in UNVALIDATED_SUBMODELS:
                    tags.append(f"unvalidated:{section}.{name}")
                narrow = NARROW.get(f"{section}.{name}")
                p = py_int(v)
                if narrow and p is not None and not narrow[0] <= p <= narrow[1]:
                    tags.append("int-range")
                cases.append(case(f"{path}={json.dumps(v)}", nested(path, v, stage), tags))
        if alias and alias != name:
            both = nested(f"{section}.{name}", 1, stage)
            both[section][alias] = 2
            cases.append(case(f"{section}.{name}+{alias}", both))
    return cases


def stage_matrix():
    cases = []
    devices = [None, {"device": "none"}, {"device": "cpu"}, {"device": "nvme", "nvme_path": "/nvme"},
               {"device": "nvme"}]
    for stage in range(4):
        for oo in devices:
            for op in devices:
                z = {"stage": stage}
                if oo is not None:
                    z["offload_optimizer"] = oo
                if op is not None:
                    z["offload_param"] = op
                cases.append(case(f"matrix stage={stage} oo={oo} op={op}", dict(BASE, zero_optimization=z)))
        for ratio in (0.0, 0.3, 1.0):
            z = {"stage": stage, "offload_optimizer": {"device": "cpu", "ratio": ratio}}
            cases.append(case(f"ratio {ratio} stage {stage}", dict(BASE, zero_optimization=z)))
        for key in ("offload_optimizer", "offload_param"):
            for v in PALETTE:
                cases.append(case(f"zero stage {stage} {key}={json.dumps(v)}",
                                  dict(BASE, zero_optimization={"stage": stage, key: v})))
        cases.append(case(f"compute_grad_norm false stage {stage}",
                          dict(BASE, zero_optimization={"stage": stage, "compute_grad_norm": False})))
    return cases


def legacy_cases():
    z = "zero_optimization"
    out = [
        case("zero true", dict(BASE, zero_optimization=True)),
        case("zero false", dict(BASE, zero_optimization=False)),
        case("zero true allgather_size", dict(BASE, zero_optimization=True, allgather_size=1e8)),
        case("zero true allgather_size bad", dict(BASE, zero_optimization=True, allgather_size="x")),
        case("zero 1", dict(BASE, zero_optimization=1)),
        case("zero null", dict(BASE, zero_optimization=None)),
        case("zero auto", dict(BASE, zero_optimization="auto")),
        case("zero list", dict(BASE, zero_optimization=[])),
        case("bfloat16", dict(BASE, bfloat16={"enabled": True})),
        case("bf16 wins over bfloat16", dict(BASE, bf16={"enabled": False}, bfloat16={"enabled": True})),
        case("bf16 null then bfloat16", dict(BASE, bf16=None, bfloat16={"enabled": True})),
        case("bfloat16 null", dict(BASE, bfloat16=None)),
        case("bf16 bad, bfloat16 ignored", dict(BASE, bf16={"enabled": True}, bfloat16=[1])),
        case("fp16 and bf16", dict(BASE, fp16={"enabled": True}, bf16={"enabled": True})),
        case("fp16 and bfloat16", dict(BASE, fp16={"enabled": True}, bfloat16={"enabled": True})),
        case("fp16 dynamic window 0", dict(BASE, fp16={"enabled": True, "loss_scale_window": 0})),
        case("fp16 static window 0", dict(BASE, fp16={"enabled": True, "loss_scale": 128, "loss_scale_window": 0})),
        case("fp16 dynamic min 0", dict(BASE, fp16={"enabled": True, "min_loss_scale": 0})),
        case("fp16 window str float", dict(BASE, fp16={"loss_scale_window": "10.0"})),
        case("fp16 master stage 0", dict(BASE, fp16={"fp16_master_weights_and_grads": True})),
        case("fp16 master stage 2", dict(BASE, fp16={"fp16_master_weights_and_grads": True},
                                         zero_optimization={"stage": 2})),
        case("bf16 master stage 0", dict(BASE, bf16={"bf16_master_weights_and_grads": True})),
        case("bf16 states no master", dict(BASE, bf16={"bf16_optimizer_states": True},
                                           zero_optimization={"stage": 2})),
        case("bf16 states master", dict(BASE, bf16={"bf16_optimizer_states": True, "bf16_master_weights_and_grads": True},
                                        zero_optimization={"stage": 1})),
    ]
    for old, new, newval in (("cpu_offload", "offload_optimizer", {"device": "cpu"}),
                             ("cpu_offload_param", "offload_param", {"device": "cpu"}),
                             ("stage3_gather_fp16_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
                              True), ("stage3_gather_fp16_weights_on_model_save", "gather_16bit_weights_on_model_save",
                                      True)):
        for v in (True, False, None, "auto"):
            out.append(case(f"{old}={v}", dict(BASE, zero_optimization={"stage": 3, old: v})))
            out.append(case(f"{old}={v} with {new}", dict(BASE, zero_optimization={"stage": 3, old: v, new: newval})))
    for plural in ("cpu_offload_params", "cpu_offload_use_pin_memory"):
        out.append(case(plural, dict(BASE, zero_optimization={"stage": 3, plural: True})))
    return out


# Top-level keys DeepSpeedConfig reads but strata does not check in depth:
# their inner validation is the "unvalidated section" difference.
UNVALIDATED_TOP = {
    "activation_checkpointing", "autotuning", "comet", "comms_logger", "compile", "csv_monitor", "data_efficiency",
    "datastates_ckpt", "expert_parallel", "flops_profiler", "tensorboard", "timers", "wandb", "weight_quantization",
    "checkpoint", "pipeline", "scheduler", "data_types", "torch_autocast"
}
TOP_KEYS = sorted([
    "activation_checkpointing", "aio", "autotuning", "bf16", "bfloat16", "checkpoint", "comet", "comms_logger",
    "communication_data_type", "compile", "csv_monitor", "data_efficiency", "data_types", "dataloader_drop_last",
    "datastates_ckpt", "disable_allgather", "disable_python_gc", "dump_state", "expert_parallel", "flops_profiler",
    "fp16", "gradient_allreduce_op", "gradient_clipping", "gradient_predivide_factor", "hybrid_engine", "log_level",
    "managed_gradient_accumulation", "memory_breakdown", "optimizer", "pipeline", "prescale_gradients", "scheduler",
    "seq_parallel_communication_data_type", "steps_per_print", "tensor_parallel", "tensorboard", "timers",
    "torch_autocast", "use_data_before_expert_parallelism", "vocabulary_size", "wall_clock_breakdown", "wandb",
    "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "my_own_key"
])
TOP_VALUES = [{}, [], None, "x", 1, True, {"enabled": True}, {"bogus": 1}, "fp16", "SUM", "mean", 1e400]
REMOVED = ["nebula", "compression_training", "amp", "quantize_training", "sparse_gradients", "eigenvalue",
           "sparse_attention", "elasticity", "graph_harvesting", "curriculum_learning", "progressive_layer_drop"]


def top_level_cases():
    out = []
    for key in TOP_KEYS:
        for v in TOP_VALUES:
            tags = [f"unvalidated:{key}"] if key in UNVALIDATED_TOP else []
            if key == "gradient_clipping":
                tags.append("unchecked:gradient_clipping")
            if key == "aio" and isinstance(v, dict) and v.get("enabled") is None and v:
                pass
            text = None
            if v == 1e400:
                text = json.dumps(dict(BASE, **{key: 0})).replace(": 0}", ": 1e400}")
                # hjson (DeepSpeed's file loader) refuses it: both refuse.
            out.append(case(f"top {key}={json.dumps(v) if v != 1e400 else '1e400'}", dict(BASE, **{key: v}), tags,
                            text))
    for key in REMOVED:
        out.append(case(f"removed {key}", dict(BASE, **{key: {"enabled": False}})))
    for key in ("mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"):
        out.append(case(f"removed zero {key}", dict(BASE, zero_optimization={"stage": 3, key: 1})))
    out.append(case("aio use_gds", dict(BASE, aio={"use_gds": True}), ["accelerator"]))
    out.append(case("aio values", dict(BASE, aio={"block_size": 262144, "queue_depth": 32, "intra_op_parallelism": 4,
                                                  "single_submit": True, "overlap_events": False,
                                                  "thread_count": 3})))
    out.append(case("allreduce sum stage 3", dict(BASE, gradient_allreduce_op="sum", zero_optimization={"stage": 3})))
    out.append(case("allreduce Sum stage 2", dict(BASE, gradient_allreduce_op="Sum", zero_optimization={"stage": 2})))
    for v in ("warn", "IGNORE", "fail", "x", 1):
        out.append(case(f"tag_validation {v}", dict(BASE, checkpoint={"tag_validation": v})))
    for v in (True, 0, 1.0, 2, "true"):
        out.append(case(f"pipeline_stage {v}", dict(BASE, checkpoint={"parallel_write": {"pipeline_stage": v}})))
    for v in ("auto", ["a"], [1], "x", None):
        out.append(case(f"keep_in_fp32 {v}", dict(BASE, data_types={"keep_in_fp32_modules": v})))
    for v in ("bfloat16", "torch.float16", "half", "float64", 5):
        out.append(case(f"autocast dtype {v}", dict(BASE, torch_autocast={"enabled": True, "dtype": v})))
    for v in (["torch.nn.Linear"], "abc", {"a": 1}, [1], 5, None):
        out.append(case(f"autocast modules {v}",
                        dict(BASE, torch_autocast={"enabled": True, "lower_precision_safe_modules": v})))
    return out


OPTIMIZER_NAMES = ["Adam", "adam", "ADAM", "AdamW", "adamw", "Adagrad", "Lamb", "lamb", "LAMB", "Lion", "OneBitAdam",
                   "OneBitLamb", "ZeroOneAdam", "MuAdam", "MuAdamW", "MuSGD", "musgd", "Muon", "SGD", "sgd", "RMSprop",
                   "Adafactor", "LBFGS", "NAdam", "FooBar", ""]


def optimizer_cases():
    out = []
    for name in OPTIMIZER_NAMES:
        out.append(case(f"optimizer {name}", dict(BASE, optimizer={"type": name, "params": {"lr": 0.01}})))
    params = [{"lr": 3e-5, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.1},
              {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}, {"lr": "x"}, {"lr": None},
              {"betas": [0.9]}, {"betas": "x"}, {"amsgrad": True}, {"amsgrad": "yes"}, {"adam_w_mode": False},
              {"max_grad_norm": 1.0}, {"max_grad_norm": "1"}, {"max_grad_norm": None}, {"max_grad_norm": True},
              {"lr_decay": 0.1, "initial_accumulator_value": 0.2}, {"torch_adam": True, "bias_correction": False},
              {"lr": -1}, {"lr": True}, {"unknown_param": 1}]
    for p in params:
        for name in ("AdamW", "Adam", "Adagrad"):
            out.append(case(f"optimizer {name} params {json.dumps(p)}", dict(BASE, optimizer={"type": name, "params": p})))
    for opt in ({}, {"type": None}, {"type": None, "params": [1]}, {"type": 5}, {"type": True}, {"type": ["Adam"]},
                {"params": {"lr": 1}}, {"type": "Adam", "params": None}, {"type": "Adam", "params": []},
                {"type": "Adam", "params": "x"}, {"type": "Adam", "legacy_fusion": True},
                {"type": "Adam", "bogus": 1}):
        out.append(case(f"optimizer {json.dumps(opt)}", dict(BASE, optimizer=opt)))
    for s in ({}, {"type": "WarmupLR"}, None, [], "x"):
        out.append(case(f"scheduler {json.dumps(s)}", dict(BASE, scheduler=s)))
    return out


def batch_cases():
    out = []
    absent = object()
    for tb in (absent, 8, 10, 64, "auto", 0, 2.5, "8", True, None, 16.0):
        for mb in (absent, 2, 4, "auto", 0, 2.5):
            for gas in (absent, 1, 2, "auto", 0):
                cfg = {}
                for k, v in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                             ("gradient_accumulation_steps", gas)):
                    if v is not absent:
                        cfg[k] = v
                tags = []
                if any(isinstance(v, bool) or (isinstance(v, float) and not v.is_integer()) for v in (tb, mb, gas)):
                    tags.append("unchecked:batch")
                out.append(case(f"batch {json.dumps(cfg)}", cfg, tags))
    for clip in (0, -1, 0.5, 1, "auto", None, "1.0", True, [1]):
        out.append(case(f"clip {json.dumps(clip)}", dict(BASE, gradient_clipping=clip), ["unchecked:gradient_clipping"]))
    return out


def shape_cases():
    out = []
    for depth in (10, 50, 99):
        text = json.dumps(dict(BASE)).rstrip("}") + ', "deep": ' + "[" * depth + "]" * depth + "}"
        out.append(case(f"nesting {depth}", None, [], text))
    text = json.dumps(dict(BASE)).rstrip("}") + ', "deep": ' + "[" * 150 + "]" * 150 + "}"
    out.append(case("nesting 150", None, ["depth"], text))
    text = json.dumps(dict(BASE)).rstrip("}") + ', "deep": ' + "[" * 5000 + "]" * 5000 + "}"
    out.append(case("nesting 5000", None, ["depth"], text))
    out.append(case("duplicate key", None, [], '{"train_batch_size": 8, "train_batch_size": 8}'))
    out.append(case("top-level array", None, [], "[1, 2]"))
    out.append(case("top-level number", None, [], "5"))
    out.append(case("empty object", {}))
    out.append(case("1e400 in zero", None, [],
                    '{"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1e400}}'))
    out.append(case("1e400 in unknown key", None, [], '{"train_batch_size": 8, "foo": [1e400, -1e400]}'))
    out.append(case("2^64 as an int", None, ["int-range"],
                    '{"train_batch_size": 8, "zero_optimization": {"sub_group_size": 18446744073709551616}}'))
    out.append(case("2^63 as an int", None, ["int-range"],
                    '{"train_batch_size": 8, "zero_optimization": {"sub_group_size": 9223372036854775808}}'))
    return out


def generate():
    cases = []
    cases += model_cases("zero_optimization", DeepSpeedZeroConfig, skip=("offload_param", "offload_optimizer"))
    cases += model_cases("zero_optimization.offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig, stage=3)
    cases += model_cases("zero_optimization.offload_param", DeepSpeedZeroOffloadParamConfig, stage=3)
    cases += model_cases("fp16", DeepSpeedFP16Config)
    # The fp16 fields again with fp16 enabled, where the dynamic-loss-scale
    # checks apply.
    for name, _ in field_names(DeepSpeedFP16Config):
        for v in PALETTE:
            cfg = nested(f"fp16.{name}", v)
            cfg["fp16"]["enabled"] = True if name != "enabled" else v
            tags = []
            narrow = NARROW.get(f"fp16.{name}")
            p = py_int(v)
            if narrow and p is not None and not narrow[0] <= p <= narrow[1]:
                tags.append("int-range")
            cases.append(case(f"fp16 enabled {name}={json.dumps(v)}", cfg, tags))
    cases += model_cases("bf16", DeepSpeedBF16Config)
    cases += model_cases("tensor_parallel", TPTrainingConfig)
    cases += model_cases("hybrid_engine", HybridEngineConfig)
    cases += stage_matrix()
    cases += legacy_cases()
    cases += top_level_cases()
    cases += optimizer_cases()
    cases += batch_cases()
    cases += shape_cases()
    return cases
