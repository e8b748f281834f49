"""DeepSpeed's own reading of a config: deepspeed.runtime.config.DeepSpeedConfig.

How it is called without a process group (documented in docs/DEEPSPEED_CONFIG.md):
- DS_ACCELERATOR=cpu, so importing DeepSpeed needs no GPU;
- DeepSpeedConfig(dict, mpu=...) asks dist.get_rank() first and, with no process
  group, falls back to world size 1 whatever mpu says. We patch get_rank to 0 for
  the call and pass an mpu whose get_data_parallel_world_size() returns the world
  size the case wants, so batch arithmetic is checked at that world size.
- The text is loaded as DeepSpeed loads a config file: hjson with
  dict_raise_error_on_duplicate_keys.
- "auto" in train_batch_size / train_micro_batch_size_per_gpu /
  gradient_accumulation_steps / gradient_clipping is what the Hugging Face
  integration fills in before DeepSpeed sees the config; we fill it the way
  transformers' HfTrainerDeepSpeedConfig does with TrainingArguments' defaults
  (micro batch 8, accumulation 1, max_grad_norm 1.0).
"""
import logging
import os
import pathlib
from unittest import mock

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import hjson  # noqa: E402  (DeepSpeed's own dependency)
from deepspeed.runtime import config as ds_config  # noqa: E402
from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys  # noqa: E402
from deepspeed.runtime.zero.offload_config import (  # noqa: E402
    DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig)
from deepspeed.utils import logger as ds_logger  # noqa: E402

ds_logger.setLevel(logging.CRITICAL)

DEEPSPEED_OPTIMIZERS = set(ds_config.DEEPSPEED_OPTIMIZERS)
HF_MICRO_BATCH = 8
HF_GRAD_ACCUM = 1
HF_MAX_GRAD_NORM = 1.0


class _Mpu:

    def __init__(self, world_size):
        self.world_size = world_size

    def get_data_parallel_world_size(self):
        return self.world_size


def load_text(text):
    """Parses config text as DeepSpeed parses a config file."""
    return hjson.loads(text, object_pairs_hook=dict_raise_error_on_duplicate_keys)


def fill_hf_auto(d):
    """Fills the top-level "auto" values as the Hugging Face Trainer does.

    The Trainer puts its own arguments in place of "auto" and refuses a config
    whose explicit batch numbers disagree with them, so a config it runs is one
    where the user's arguments fit: "auto" becomes the value that makes the
    batch equation hold at world size 1 where one exists, else the Trainer's
    default (micro batch 8, accumulation 1, max_grad_norm 1.0).
    """
    if not isinstance(d, dict):
        return d
    d = dict(d)

    def given(k):
        v = d.get(k)
        return v if type(v) is int and v > 0 else None

    tb = given("train_batch_size")
    if d.get("gradient_accumulation_steps") == "auto":
        mb = given("train_micro_batch_size_per_gpu")
        d["gradient_accumulation_steps"] = tb // mb if tb and mb and tb % mb == 0 else HF_GRAD_ACCUM
    if d.get("train_micro_batch_size_per_gpu") == "auto":
        gas = given("gradient_accumulation_steps") or HF_GRAD_ACCUM
        d["train_micro_batch_size_per_gpu"] = tb // gas if tb and tb % gas == 0 else HF_MICRO_BATCH
    if d.get("train_batch_size") == "auto":
        mb = d.get("train_micro_batch_size_per_gpu", HF_MICRO_BATCH)
        gas = d.get("gradient_accumulation_steps", HF_GRAD_ACCUM)
        try:
            d["train_batch_size"] = mb * gas
        except TypeError:
            d["train_batch_size"] = HF_MICRO_BATCH
    if d.get("gradient_clipping") == "auto":
        d["gradient_clipping"] = HF_MAX_GRAD_NORM
    return d


def world_size_for(d):
    """The world size that makes the three batch numbers consistent, else 1."""
    try:
        tb = d["train_batch_size"]
        mb = d["train_micro_batch_size_per_gpu"]
        gas = d["gradient_accumulation_steps"]
        if all(type(v) is int and v > 0 for v in (tb, mb, gas)) and tb % (mb * gas) == 0:
            return tb // (mb * gas)
    except (KeyError, TypeError):
        pass
    return 1


def parse(d):
    """Returns (DeepSpeedConfig or None, error string or None)."""
    if not isinstance(d, dict):
        # A config file whose top level is not an object. DeepSpeedConfig must
        # not be handed it: it takes an int for a path and os.path.exists(5)
        # checks file descriptor 5, which it then opens and closes.
        return None, f"TypeError: a config must be a JSON object, not {type(d).__name__}"
    world = world_size_for(d)
    try:
        with mock.patch.object(ds_config.dist, "get_rank", lambda *a, **k: 0):
            return ds_config.DeepSpeedConfig(d, mpu=_Mpu(world)), None
    except RecursionError:
        return None, "RecursionError"
    except Exception as e:  # DeepSpeed refuses with many exception types
        return None, f"{type(e).__name__}: {str(e)[:300]}"


def _path(p):
    return "" if p is None else str(p)


def offload_view(model, defaults, stage, kind):
    """What DeepSpeed runs for one offload section at this stage."""
    m = model if model is not None else defaults
    device = m.device if model is not None else "none"
    view = {k: getattr(m, k) for k in type(defaults).model_fields if k not in ("device", "nvme_path")}
    view["nvme_path"] = _path(m.nvme_path)
    ignored = False
    nvme_as_cpu = False
    if kind == "param" and device != "none" and stage != 3:
        device, ignored = "none", True
    if kind == "optimizer" and device != "none" and stage == 0:
        device, ignored = "none", True
    if kind == "optimizer" and device == "nvme" and stage in (1, 2):
        device, nvme_as_cpu = "cpu", True
    view["device"] = device
    view["ignored"] = ignored
    if kind == "optimizer":
        view["nvme_ran_as_cpu"] = nvme_as_cpu
    return view


def view(c, raw):
    """The values strata must read equal, from DeepSpeed's parsed config."""
    z = c.zero_config
    stage = int(z.stage)
    v = {
        "zero": {
            "stage": stage,
            "offload_optimizer": offload_view(z.offload_optimizer, DeepSpeedZeroOffloadOptimizerConfig(), stage,
                                              "optimizer"),
            "offload_param": offload_view(z.offload_param, DeepSpeedZeroOffloadParamConfig(), stage, "param"),
            "sub_group_size": z.sub_group_size,
            "prefetch_bucket_size": z.prefetch_bucket_size,
            "max_live_parameters": z.max_live_parameters,
            "max_reuse_distance": z.max_reuse_distance,
            "param_persistence_threshold": z.param_persistence_threshold,
            "model_persistence_threshold": z.model_persistence_threshold,
            "gather_16bit_weights_on_model_save": z.gather_16bit_weights_on_model_save,
            "overlap_comm": z.overlap_comm,
            "contiguous_gradients": z.contiguous_gradients,
            "reduce_bucket_size": z.reduce_bucket_size,
            "reduce_scatter": z.reduce_scatter,
            "allgather_partitions": z.allgather_partitions,
            "allgather_bucket_size": z.allgather_bucket_size,
            "round_robin_gradients": z.round_robin_gradients,
            "zero_hpz_partition_size": z.zero_hpz_partition_size,
            "compute_grad_norm": z.compute_grad_norm,
        },
        "fp16": {
            k: getattr(c.float16_config, k)
            for k in ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                      "min_loss_scale", "consecutive_hysteresis", "auto_cast", "fp16_master_weights_and_grads")
        },
        "bf16_enabled": c.bfloat16_config.enabled,
        "gradient_clipping": c.gradient_clipping,
        "train_batch_size": c.train_batch_size,
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "tensor_parallel_autotp_size": c.tensor_parallel_config.autotp_size,
        "optimizer_name": c.optimizer_name,
        "optimizer_params": c.optimizer_params,
        "aio": dict(c.aio_config),
    }
    return v


def same_path(a, b):
    if a == b:
        return True
    return pathlib.PurePosixPath(a or ".") == pathlib.PurePosixPath(b or ".")
