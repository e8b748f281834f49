"""ZeRO-Offload as a torch.optim.Optimizer: the step runs in stratad.

Each rank owns a partition of the flat model (the daemon's stage-1/2 layout:
the trainable params concatenated in registration order, cut into world_size
equal parts and each part into sub-groups). Per step a rank

  1. hands its partition of the averaged gradient to the daemon: in step(),
     .grad as it is then (after the caller's clipping, scaling, masking and any
     number of backward passes, as torch.optim reads it); or, with
     overlap_backward=True, from post-accumulate-grad hooks, bucket by bucket
     while backward still runs (the optimizer then owns clipping, max_norm, and
     accumulation, gradient_accumulation_steps, and refuses a .grad changed
     after it was handed off);
  2. waits for the step (the daemon checks overflow, clips by the global
     norm across all ranks and runs the optimizer);
  3. copies its updated partition back into the params and all-gathers the
     rest from the other ranks with torch.distributed.

The optimizer state (fp32 masters, moments) never lives in this process.
state_dict() and load_state_dict() go through the daemon's checkpoint files.
"""
import json
import os
import shutil
import socket as _socket
import time
import uuid

import numpy
import torch

from strata import client as strata_client
from strata.errors import StrataError
from strata.torch._comm import Comm

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# DeepSpeed's defaults for fp16 dynamic loss scaling (runtime/constants.py).
_FP16_DEFAULTS = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                  "hysteresis": 2, "min_loss_scale": 1}
# The sub-group (daemon shard) size when the caller gives none. DeepSpeed's 1e9 makes a
# ~100M model one shard: the daemon could start its step only after the last gradient.
# At 4M elements (16 MB of fp32) the daemon steps each sub-group as soon as backward has
# handed it off (early apply: no loss scaling, no clipping) or at least checks it for
# overflow and its norm, and what is left after backward is about one sub-group's work.
DEFAULT_SUB_GROUP_NUMEL = 4_000_000


def state_checkpoint(client, job):
    """Saves `job` into a fresh directory beneath this user's checkpoint home on the daemon and
    returns its absolute path: how state_dict()/load_state_dict() reach the daemon's states.
    stratad writes checkpoints only beneath its --checkpoint_root, each non-admin user's in a home
    of its own that it alone can read (docs/SECURITY.md); this process reads them back from
    there. The caller removes the directory's parent when done."""
    directory = f"strata-state-{uuid.uuid4().hex}/ckpt"
    return client.save_checkpoint(job, directory)


def torch_numbering(param_groups):
    """{id(param): its index in a torch state dict}: the params' order across param_groups."""
    number = {}
    for group in param_groups:
        for p in group["params"]:
            number[id(p)] = len(number)
    return number


def torch_param_groups(param_groups, number):
    """A state dict's param_groups: each group's settings, its params as their `number`s."""
    groups = []
    for group in param_groups:
        g = {k: v for k, v in group.items() if k != "params"}
        g["params"] = [number[id(p)] for p in group["params"]]
        groups.append(g)
    return groups


def state_dict_index(param_groups, their_groups):
    """{id(param): its index in a state dict whose param_groups are `their_groups`}, after checking
    that the groups and their param counts match the optimizer's `param_groups`."""
    if len(their_groups) != len(param_groups):
        raise ValueError(f"the state dict has {len(their_groups)} param groups; this optimizer has "
                         f"{len(param_groups)}")
    index = {}
    for gi, group in enumerate(param_groups):
        if len(their_groups[gi]["params"]) != len(group["params"]):
            raise ValueError(f"param group {gi} has {len(group['params'])} params; the state dict's has "
                             f"{len(their_groups[gi]['params'])}")
        for j, p in enumerate(group["params"]):
            index[id(p)] = their_groups[gi]["params"][j]
    return index


class _Bucket:
    """Params whose gradients travel together (one all-reduce when reducing)."""

    def __init__(self, tensors):
        self.tensors = tensors      # registered tensor indices
        self.ready = set()          # of tensors, ready at this step's boundary
        self.launched = False


class _OffloadOptimizer(torch.optim.Optimizer):
    """Base of OffloadAdamW, OffloadAdam, OffloadAdagrad, OffloadLion."""

    _kind = None            # the daemon's optimizer type
    _state_keys = ()        # torch's per-param state keys, in the daemon's stream order

    def __init__(self, params, defaults, *, socket=None, job_name=None, process_group=None,
                 reduce_gradients=None, max_norm=0.0, gradient_accumulation_steps=1, fp16=None,
                 bucket_numel=2_000_000, sub_group_size=None, stage=2, mode="offload",
                 extra_config=None, keep_job=False, rpc_timeout_s=30.0, step_timeout_s=300.0, partition=None,
                 resume=False, overlap_backward=False):
        super().__init__(params, defaults)
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        if max_norm is None or max_norm < 0:
            raise ValueError(f"max_norm must be 0 (no clipping) or positive, got {max_norm}")
        if mode != "offload":
            raise ValueError(f"mode '{mode}': strata.torch optimizers run ZeRO-Offload (mode 'offload')")
        if stage not in (1, 2):
            raise ValueError(f"stage {stage}: offload runs ZeRO stage 1 or 2")
        self._comm = Comm(process_group)
        self._gas = int(gradient_accumulation_steps)
        self._max_norm = float(max_norm)
        self._keep_job = keep_job
        # overlap_backward: hand each gradient off from backward's hooks at the
        # gradient_accumulation_steps-th backward pass (the daemon may step it at
        # once), so nothing may change .grad between backward and step(). Off,
        # step() hands off .grad as the caller left it, which is what torch.optim
        # reads: correct under any trainer (HF Trainer's clipping, accelerate's
        # accumulation), only without the overlap.
        self._overlap = bool(overlap_backward)
        if reduce_gradients is None:
            reduce_gradients = self._comm.distributed
        self._reduce = bool(reduce_gradients) and self._comm.distributed

        # The trainable params, in group order: the registration order.
        self._params = []
        self._group_of = []
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self._params.append(p)
                    self._group_of.append(gi)
        if not self._params:
            raise ValueError("no trainable params (every param has requires_grad=False)")
        dtypes = {p.dtype for p in self._params}
        if len(dtypes) != 1:
            names = ", ".join(sorted(str(d) for d in dtypes))
            raise ValueError(f"the trainable params mix dtypes ({names}); strata exchanges one dtype per job")
        self._dtype = self._params[0].dtype
        if self._dtype not in _DTYPE_NAMES:
            raise ValueError(f"param dtype {self._dtype}: strata exchanges float32, float16 or bfloat16")
        self._index = {id(p): i for i, p in enumerate(self._params)}
        self._numel = [p.numel() for p in self._params]
        self._flat_offset = [0] * len(self._params)
        for i in range(1, len(self._params)):
            self._flat_offset[i] = self._flat_offset[i - 1] + self._numel[i - 1]
        self._total = self._flat_offset[-1] + self._numel[-1]

        fp16_cfg = None
        if self._dtype == torch.float16:
            fp16_cfg = dict(_FP16_DEFAULTS)
            fp16_cfg.update(fp16 or {})
            fp16_cfg["enabled"] = True
        elif fp16:
            raise ValueError("fp16 loss scaling needs a float16 model (model.half()); "
                             f"the params are {self._dtype}")
        self._fp16 = fp16_cfg
        self._sub_group_size = DEFAULT_SUB_GROUP_NUMEL if sub_group_size is None else sub_group_size
        self._stage = stage
        self._extra_config = extra_config or {}
        # This rank's own partition (e.g. DeepSpeed's or FSDP's), instead of the daemon's
        # ZeRO layout: [(index, padded_numel, [(tensor, tensor_offset, numel, shard_offset)])].
        self._partition = list(partition or [])

        self._client = strata_client.connect(socket, rpc_timeout_s, step_timeout_s)
        self._find_daemons(strata_client.resolve_socket(socket)[0])
        self._job = self._comm.broadcast_object(job_name or f"torch-{uuid.uuid4().hex[:12]}")
        config = json.dumps(self._job_config())
        if self._is_leader and not resume:
            # One job per daemon; with several daemons each serves its own ranks
            # and the steps are agreed across them (PrepareStep/CommitStep).
            self._client.create_job(self._job, self._comm.world_size, mode="offload",
                                    deepspeed_config_json=config,
                                    param_dtype=_DTYPE_NAMES[self._dtype],
                                    grad_dtype=_DTYPE_NAMES[self._dtype],
                                    local_ranks=self._local_ranks if self._external else [],
                                    external_step_agreement=self._external)
        self._comm.barrier()
        # resume=True: re-attach to the daemon's job `job_name` after the ranks
        # died (it keeps masters, moments and params for its reattach timeout);
        # the params come back from the daemon and training goes on at next_step.
        self._attach(init_params=not resume)
        if resume:
            self._gather_params()

        self._buckets = self._make_buckets(int(bucket_numel))
        self._bucket_of = {}
        for b, bucket in enumerate(self._buckets):
            for t in bucket.tensors:
                self._bucket_of[t] = b
        self._micro = [0] * len(self._params)
        self._next_bucket = 0
        self._pending = []
        self._begun = None
        self._hooks = []
        # One rank, nothing to reduce: each gradient goes from its hook straight into
        # its slots (no bucket, no torch.cat copy), and a sub-group goes to the daemon
        # the moment its last element is in.
        self._direct = not self._comm.distributed
        self._handed = [False] * len(self._params)
        # With overlap_backward: {tensor: (its .grad, that tensor's _version)} as the
        # hooks read it; step() refuses a .grad replaced or changed in place since.
        self._taken = {}
        # Where the last step's trainer time went (seconds): handing gradients off
        # (in backward's hooks and in step()), waiting for the daemon, copying the
        # updated params back. strata bench train reports them.
        self.last_step_times = {}
        self._handoff_s = 0.0
        if self._overlap and (not self._comm.distributed or self._reduce):
            # Without DDP the hooks see this rank's own accumulated gradient: hand it
            # off as backward produces it. (DDP averages after the hooks run, so
            # with DDP the hand-off happens in step().)
            for i, p in enumerate(self._params):
                self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(i)))
        self.last_grad_norm = None
        self.last_step_skipped = False
        self.lr_scheduler = None    # st.initialize's: stepped after every applied step
        self.loss_divisor = 1       # backward(loss) divides by it (gradient accumulation)

    # ----- setup -------------------------------------------------------------------------------

    def _find_daemons(self, socket_path):
        """Ranks that reach the same stratad (host and socket) share its job: one daemon per node."""
        key = (_socket.gethostname(), os.path.realpath(socket_path))
        keys = self._comm.all_gather_object(key)
        nodes = []
        for k in keys:
            if k not in nodes:
                nodes.append(k)
        self._local_ranks = [r for r, k in enumerate(keys) if k == key]
        self._leaders = [keys.index(k) for k in nodes]   # lowest rank of each daemon, in node order
        self._is_leader = self._comm.rank == self._local_ranks[0]
        self._external = len(nodes) > 1

    def _group_hparams(self, group):
        raise NotImplementedError

    def _job_config(self):
        """The DeepSpeed JSON the daemon's job is created with."""
        h = self._group_hparams(self.param_groups[0])
        params = {"lr": h["lr"], "eps": h["eps"], "weight_decay": h["weight_decay"]}
        if self._kind != "adagrad":
            params["betas"] = [h["beta1"], h["beta2"]]
        else:
            params["lr_decay"] = h["lr_decay"]
            params["initial_accumulator_value"] = self.param_groups[0].get("initial_accumulator_value", 0.0)
        if self._kind in ("adam", "adamw"):
            params["amsgrad"] = bool(self.param_groups[0].get("amsgrad", False))
        if self._kind == "adam":
            params["adam_w_mode"] = False
        zero = {"stage": self._stage, "offload_optimizer": {"device": "cpu"}}
        if self._sub_group_size:
            zero["sub_group_size"] = int(self._sub_group_size)
        config = {"zero_optimization": zero,
                  "optimizer": {"type": {"adam": "Adam", "adamw": "AdamW", "adagrad": "Adagrad",
                                         "lion": "Lion"}[self._kind], "params": params},
                  "gradient_clipping": self._max_norm}
        if self._fp16 is not None:
            config["fp16"] = self._fp16
        elif self._dtype == torch.bfloat16:
            config["bf16"] = {"enabled": True}
        config.update(self._extra_config)
        return config

    def _attach(self, init_params):
        """Attaches this rank, registers the params and maps its shards."""
        self._session = self._client.attach(self._job, self._comm.rank)
        names = [(f"p{i}.{'x'.join(str(s) for s in p.shape) or 'scalar'}", p.numel(), self._group_of[i])
                 for i, p in enumerate(self._params)]
        self._session.register_tensors(names, self._partition)
        if self._session.stage not in (1, 2):
            raise StrataError(f"job '{self._job}' runs ZeRO stage {self._session.stage}; "
                              "strata.torch optimizers need stage 1 or 2", "FAILED_PRECONDITION")
        self._step_index = self._session.step
        gdt = _TORCH_DTYPES[self._session.grad_dtype]
        pdt = _TORCH_DTYPES[self._session.param_dtype]
        self._shards = []
        self._owned = [[] for _ in self._params]   # per tensor: (shard, tensor_offset, numel, shard_offset)
        self._owned_runs = []                     # (flat_offset, numel), in pack order
        for s, shard in enumerate(self._session.shards()):
            grad = torch.frombuffer(shard["grad"], dtype=gdt) if shard["padded_numel"] else torch.empty(0, dtype=gdt)
            param = torch.frombuffer(shard["param"], dtype=pdt) if shard["padded_numel"] else torch.empty(0, dtype=pdt)
            owned = 0
            for (t, t_off, n, s_off) in shard["ranges"]:
                self._owned[t].append((s, t_off, n, s_off))
                self._owned_runs.append((self._flat_offset[t] + t_off, n))
                owned += n
            self._shards.append({"index": shard["index"], "grad": grad, "param": param,
                                 "ranges": shard["ranges"], "owned": owned, "left": owned})
        # Every rank's owned runs, to unpack the all-gathered partitions.
        self._all_runs = self._comm.all_gather_object(self._owned_runs)
        self._pack_numel = max(sum(n for _, n in runs) for runs in self._all_runs)
        covered = sum(sum(n for _, n in runs) for runs in self._all_runs)
        if covered != self._total:
            raise StrataError(f"the daemon's partitions cover {covered} of the model's {self._total} "
                              "elements across the ranks", "FAILED_PRECONDITION")
        if init_params:
            with torch.no_grad():
                if self._comm.distributed:
                    # Every rank starts from rank 0's params, as DDP and DeepSpeed do.
                    for p in self._params:
                        torch.distributed.broadcast(p.data, src=self._comm._global(0), group=self._comm.group)
                for t, p in enumerate(self._params):
                    flat = p.detach().reshape(-1)
                    for (s, t_off, n, s_off) in self._owned[t]:
                        self._shards[s]["param"][s_off:s_off + n].copy_(flat[t_off:t_off + n])
            self._session.init_params()
            self._comm.barrier()

    def _make_buckets(self, bucket_numel):
        # Reverse registration order: roughly the order backward produces grads.
        buckets, current, size = [], [], 0
        for t in reversed(range(len(self._params))):
            current.append(t)
            size += self._numel[t]
            if size >= bucket_numel:
                buckets.append(_Bucket(current))
                current, size = [], 0
        if current:
            buckets.append(_Bucket(current))
        return buckets

    # ----- gradient hand-off -------------------------------------------------------------------

    def _make_hook(self, t):
        def hook(param):
            if self._micro[t] >= self._gas:
                # This param's gradient went to stratad at backward pass gas (the
                # daemon may have stepped it): a further pass would be dropped.
                raise StrataError(
                    f"backward pass {self._micro[t] + 1} before step() reached param {t} (shape "
                    f"{tuple(param.shape)}), but this optimizer has gradient_accumulation_steps={self._gas} "
                    "and overlap_backward=True: it handed that param's gradient to stratad at backward pass "
                    f"{self._gas} and would drop this one. Call step() after every {self._gas} backward "
                    "passes, pass gradient_accumulation_steps=<backward passes per step>, or "
                    "overlap_backward=False (step() then takes .grad after any number of passes).",
                    "FAILED_PRECONDITION")
            self._micro[t] += 1
            if self._micro[t] == self._gas:
                if self._direct:
                    self._hand_off(t)
                    return
                t0 = time.perf_counter()
                bucket = self._buckets[self._bucket_of[t]]
                bucket.ready.add(t)
                self._launch_ready()
                self._handoff_s += time.perf_counter() - t0
        return hook

    def _hand_off(self, t):
        """Copies tensor t's gradient (zeros if it has none) into its slots; GradReady
        for every sub-group this completes. Once per step: a later hook is ignored,
        as a launched bucket ignores one."""
        if self._handed[t]:
            return
        t0 = time.perf_counter()
        self._begin_step()
        self._handed[t] = True
        g = self._take_grad(t)
        flat = None if g is None else g.detach().reshape(-1)
        for (s, t_off, n, s_off) in self._owned[t]:
            shard = self._shards[s]
            if flat is None:
                shard["grad"][s_off:s_off + n].zero_()
            else:
                _copy(shard["grad"][s_off:s_off + n], flat[t_off:t_off + n])
            shard["left"] -= n
            if shard["left"] == 0:
                self._session.grad_ready(shard["index"], self._step_index)
        self._handoff_s += time.perf_counter() - t0

    def _launch_ready(self):
        # Buckets go out strictly in order, so every rank issues the same collectives.
        while self._next_bucket < len(self._buckets):
            bucket = self._buckets[self._next_bucket]
            if len(bucket.ready) < len(bucket.tensors):
                break
            self._launch(bucket)
        self._complete(wait=False)

    def _launch(self, bucket):
        self._begin_step()
        with torch.no_grad():
            flat = _flat_grads([self._params[t] for t in bucket.tensors], [self._take_grad(t) for t in bucket.tensors])
            work = None
            if self._reduce:
                flat.div_(self._comm.world_size)   # as DDP: average = sum of grad / world
                work = self._comm.all_reduce_sum_async(flat)
        bucket.launched = True
        self._next_bucket += 1
        self._pending.append((bucket, flat, work))

    def _complete(self, wait):
        while self._pending:
            bucket, flat, work = self._pending[0]
            if work is not None and not wait and not work.is_completed():
                return
            if work is not None:
                work.wait()
            self._pending.pop(0)
            base = 0
            for t in bucket.tensors:
                for (s, t_off, n, s_off) in self._owned[t]:
                    shard = self._shards[s]
                    _copy(shard["grad"][s_off:s_off + n], flat[base + t_off:base + t_off + n])
                    shard["left"] -= n
                    if shard["left"] == 0:
                        self._session.grad_ready(shard["index"], self._step_index)
                base += self._numel[t]

    def _take_grad(self, t):
        """Param t's .grad, as it is handed off; with overlap_backward it is remembered (tensor and
        version counter) so that step() can refuse one changed after the hooks took it."""
        g = self._params[t].grad
        if self._overlap:
            self._taken[t] = (g, None if g is None else g._version)
        return g

    def _check_grads_unchanged(self):
        """overlap_backward: refuses a step whose .grad changed after backward's hooks handed it off
        (clip_grad_norm_, scaling, masking, a new .grad): stratad has the old values, and may have
        stepped them already (a re-sent gradient of a stepped shard is ignored)."""
        for t, (g, version) in self._taken.items():
            now = self._params[t].grad
            if now is not g or (g is not None and g._version != version):
                raise StrataError(
                    f"param {t}'s .grad (shape {tuple(self._params[t].shape)}) changed between backward and "
                    "step() (clipping, scaling or masking it, or a new .grad), but overlap_backward=True handed "
                    "it to stratad in backward, which may have stepped it already. Clip with max_norm= and "
                    "accumulate with gradient_accumulation_steps= (the optimizer's own), or construct the "
                    "optimizer with overlap_backward=False so that step() takes .grad as you leave it (what a "
                    "Hugging Face Trainer needs: it clips between backward and step()).", "FAILED_PRECONDITION")

    def _begin_step(self):
        """Sends this step's per-group hyperparameters (once per step, before its first GradReady)."""
        if self._begun is not None:
            return
        self._begun = [self._group_hparams(g) for g in self.param_groups]
        self._session.begin_step(self._step_index, self._begun)

    def _check_hparams_unchanged(self):
        """Refuses a step whose groups' hyperparameters changed after its BeginStep went out."""
        now = [self._group_hparams(g) for g in self.param_groups]
        if self._begun is not None and now != self._begun:
            raise StrataError(
                "the param groups' hyperparameters changed between backward and step(): the gradients of this "
                "step already went to stratad with the earlier values. Step the LR scheduler after "
                "optimizer.step().", "FAILED_PRECONDITION")

    # ----- torch.optim.Optimizer ---------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_hparams_unchanged()
        if self._overlap:
            self._check_grads_unchanged()
        t0 = time.perf_counter()
        handoff_in_backward = self._handoff_s
        # Whatever backward did not hand off (all of it without overlap_backward;
        # else DDP, unused params, fewer backward passes than
        # gradient_accumulation_steps) goes now, in order.
        if self._direct:
            for t in range(len(self._params)):
                self._hand_off(t)
        else:
            while self._next_bucket < len(self._buckets):
                self._launch(self._buckets[self._next_bucket])
            self._complete(wait=True)
        for shard in self._shards:
            if shard["owned"] == 0:   # all padding: nothing to write, but the daemon waits for it
                self._session.grad_ready(shard["index"], self._step_index)
        if self._external:
            self._agree_step()
        t1 = time.perf_counter()
        result = self._session.wait_step(self._step_index)
        t2 = time.perf_counter()
        self.last_grad_norm = result["grad_norm"]
        self.last_step_skipped = result["skipped"]
        if self._fp16 is not None:
            self.loss_scale = result["loss_scale"]
        if not result["skipped"]:
            self._gather_params()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        t3 = time.perf_counter()
        self.last_step_times = {"handoff_in_backward_s": handoff_in_backward,
                                "handoff_in_step_s": t1 - t0, "wait_s": t2 - t1, "gather_s": t3 - t2}
        self._handoff_s = 0.0
        self._optimizer_steps = result["optimizer_steps"]
        self._step_index += 1
        self._reset_step()
        return loss

    def _agree_step(self):
        """Every daemon's overflow flag and squared norm, combined as one daemon
        holding every rank would (OR; pairwise sum in node order), handed back."""
        overflow, squared = self._session.prepare_step(self._step_index)
        mine = torch.tensor([1.0 if overflow else 0.0, squared], dtype=torch.float64, device=self._params[0].device)
        gathered = self._comm.all_gather(mine)
        shares = [gathered[r] for r in self._leaders]
        any_overflow = any(share[0].item() != 0.0 for share in shares)
        total = _pairwise_sum([share[1].item() for share in shares])
        self._session.commit_step(self._step_index, any_overflow, total)

    def _reset_step(self):
        for bucket in self._buckets:
            bucket.ready.clear()
            bucket.launched = False
        for shard in self._shards:
            shard["left"] = shard["owned"]
        self._micro = [0] * len(self._params)
        self._handed = [False] * len(self._params)
        self._taken = {}
        self._next_bucket = 0
        self._begun = None

    def _gather_params(self):
        if not self._comm.distributed:
            # One rank owns every element: copy its slots straight into the params
            # (no packed buffer, no second copy; strata bench train, docs/PYTHON.md).
            for t, p in enumerate(self._params):
                if not p.data.is_contiguous():
                    raise StrataError(f"param {t} is not contiguous", "FAILED_PRECONDITION")
            for shard in self._shards:
                for (t, t_off, n, s_off) in shard["ranges"]:
                    _copy(self._params[t].data.view(-1)[t_off:t_off + n], shard["param"][s_off:s_off + n])
            return
        # On the params' device: the collective runs where the model lives (NCCL needs the
        # GPU; gloo takes host or GPU tensors), and each run then lands without a second copy.
        pack = torch.zeros(self._pack_numel, dtype=self._dtype, device=self._params[0].device)
        pos = 0
        for s, shard in enumerate(self._shards):
            for (t, t_off, n, s_off) in shard["ranges"]:
                _copy(pack[pos:pos + n], shard["param"][s_off:s_off + n])
                pos += n
        packs = self._comm.all_gather(pack)
        flat_views = [p.data.reshape(-1) if p.data.is_contiguous() else None for p in self._params]
        for r, runs in enumerate(self._all_runs):
            pos = 0
            src = packs[r]
            for (flat_off, n) in runs:
                self._scatter_run(flat_off, n, src[pos:pos + n], flat_views)
                pos += n
        for t, p in enumerate(self._params):
            if flat_views[t] is None:
                raise StrataError(f"param {t} is not contiguous", "FAILED_PRECONDITION")

    def _scatter_run(self, flat_off, n, values, flat_views):
        # A run may span several tensors only if the daemon's ranges did; ours are per tensor.
        t = self._tensor_at(flat_off)
        t_off = flat_off - self._flat_offset[t]
        flat_views[t][t_off:t_off + n].copy_(values)    # values: on the params' device (the pack)

    def _tensor_at(self, flat_off):
        lo, hi = 0, len(self._flat_offset) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._flat_offset[mid] <= flat_off:
                lo = mid
            else:
                hi = mid - 1
        return lo

    # ----- fp16 loss scaling -------------------------------------------------------------------

    @property
    def loss_scale(self):
        if self._fp16 is None:
            return 1.0
        if not hasattr(self, "_loss_scale"):
            jobs = [j for j in self._client.list_jobs() if j["name"] == self._job]
            self._loss_scale = jobs[0]["loss_scale"] if jobs else 2.0 ** self._fp16["initial_scale_power"]
        return self._loss_scale

    @loss_scale.setter
    def loss_scale(self, value):
        self._loss_scale = value

    def scale_loss(self, loss):
        """loss / loss_divisor, times the current loss scale with fp16."""
        if self.loss_divisor != 1:
            loss = loss / self.loss_divisor
        if self._fp16 is None:
            return loss
        return loss.float() * self.loss_scale

    def backward(self, loss):
        """(loss x loss scale).backward(): use it instead of loss.backward() with fp16."""
        self.scale_loss(loss).backward()

    # ----- state_dict ----------------------------------------------------------------------------

    def _stream_names(self):
        return self._state_keys

    def state_dict(self):
        """torch's format: per param the daemon's moments and step (and, for
        16-bit models, the fp32 master as 'fp32_master'); the same dict on
        every rank."""
        directory = self._save_checkpoint()
        try:
            state = self._read_own_states(directory)
        finally:
            self._comm.barrier()
            if self._is_leader:
                shutil.rmtree(os.path.dirname(directory), ignore_errors=True)
        # Each rank filled only its own elements (the rest are zeros): a SUM
        # across ranks assembles every tensor exactly.
        for t in range(len(self._params)):
            for key in state[t]:
                if key != "step":
                    self._comm.all_reduce_sum(state[t][key])
        packed = {}
        global_index = torch_numbering(self.param_groups)
        for t, p in enumerate(self._params):
            entry = {"step": torch.tensor(float(state[t]["step"]))}
            for key in self._stream_names():
                entry[key] = state[t][key].reshape(p.shape)
            if self._dtype != torch.float32:
                entry["fp32_master"] = state[t]["master"].reshape(p.shape)
            packed[global_index[id(p)]] = entry
        return {"state": packed, "param_groups": torch_param_groups(self.param_groups, global_index)}

    def _save_checkpoint(self):
        """Each daemon's leader saves its job; every rank gets its daemon's directory."""
        directory = state_checkpoint(self._client, self._job) if self._is_leader else None
        return self._comm.all_gather_object(directory)[self._local_ranks[0]]

    def _shard_file(self, directory, index):
        return os.path.join(directory, f"rank{self._comm.rank}-shard{index}.bin")

    def _streams(self):
        return ["master"] + list(self._stream_names())

    def _read_own_states(self, directory):
        with open(os.path.join(directory, "manifest.json")) as f:
            manifest = json.load(f)
        steps = manifest["optimizer_steps"]
        streams = self._streams()
        state = [{"step": steps, **{k: torch.zeros(n, dtype=torch.float32) for k in streams}}
                 for n in self._numel]
        for shard in self._shards:
            padded = shard["grad"].numel()
            data = self._read_shard_file(directory, shard, padded, len(streams))
            for k, key in enumerate(streams):
                stream = data[k * padded:(k + 1) * padded]
                for (t, t_off, n, s_off) in shard["ranges"]:
                    state[t][key][t_off:t_off + n].copy_(stream[s_off:s_off + n])
        return state

    def _read_shard_file(self, directory, shard, padded, n_streams):
        path = self._shard_file(directory, shard["index"])
        psize = torch.empty(0, dtype=self._dtype).element_size()
        expected = n_streams * padded * 4 + padded * psize
        size = os.path.getsize(path)
        if size != expected:
            raise StrataError(f"{path} holds {size} bytes; expected {expected} ({n_streams} fp32 streams and the "
                              "params of an offload shard)", "DATA_LOSS")
        with open(path, "rb") as f:
            raw = bytearray(f.read(n_streams * padded * 4))
        return torch.frombuffer(raw, dtype=torch.float32) if raw else torch.empty(0)

    def load_state_dict(self, state_dict):
        """Loads torch's format (from this class or torch.optim of the same
        algorithm) into the daemon: moments, step and the fp32 masters (the
        'fp32_master' entry, else the param's current value)."""
        groups = state_dict["param_groups"]
        by_index = state_dict_index(self.param_groups, groups)
        states = state_dict["state"]
        steps = set()
        for t, p in enumerate(self._params):
            entry = states.get(by_index[id(p)])
            if entry is None:
                raise ValueError(f"the state dict has no state for trainable param {t} (shape {tuple(p.shape)}); "
                                 "take it after at least one step")
            steps.add(int(float(entry["step"])))
            for key in self._stream_names():
                if key not in entry:
                    raise ValueError(f"the state of param {t} lacks '{key}'")
        if len(steps) != 1:
            raise ValueError(f"the params' step counts differ ({sorted(steps)}); stratad keeps one per job")
        step = steps.pop()
        directory = self._save_checkpoint()
        try:
            self._write_own_states(directory, states, by_index)
            self._comm.barrier()
            if self._is_leader:
                manifest_path = os.path.join(directory, "manifest.json")
                with open(manifest_path) as f:
                    manifest = json.load(f)
                manifest["optimizer_steps"] = step
                with open(manifest_path, "w") as f:
                    json.dump(manifest, f, indent=2)
            # Re-create the job from the rewritten checkpoint, then re-attach.
            self._comm.barrier()
            self._detach()
            self._comm.barrier()
            if self._is_leader:
                self._client.delete_job(self._job)
                self._client.load_checkpoint(directory, self._job)
            self._comm.barrier()
            self._attach(init_params=False)
            self._gather_params()
        finally:
            self._comm.barrier()
            if self._is_leader:
                shutil.rmtree(os.path.dirname(directory), ignore_errors=True)
        for gi, group in enumerate(self.param_groups):
            for k, v in groups[gi].items():
                if k != "params" and k in group:
                    group[k] = v
        self._optimizer_steps = step
        self._reset_step()

    def _write_own_states(self, directory, states, by_index):
        streams = self._streams()
        psize = torch.empty(0, dtype=self._dtype).element_size()
        for shard in self._shards:
            padded = shard["grad"].numel()
            data = self._read_shard_file(directory, shard, padded, len(streams)).clone()
            params = torch.zeros(padded, dtype=self._dtype)
            for (t, t_off, n, s_off) in shard["ranges"]:
                p = self._params[t]
                entry = states[by_index[id(p)]]
                for k, key in enumerate(streams):
                    if key == "master":
                        src = entry.get("fp32_master", p.detach())
                    else:
                        src = entry[key]
                    src = src.detach().reshape(-1).to(torch.float32)
                    data[k * padded + s_off:k * padded + s_off + n].copy_(src[t_off:t_off + n])
                master = entry.get("fp32_master", p.detach()).detach().reshape(-1).to(torch.float32)
                params[s_off:s_off + n].copy_(master[t_off:t_off + n].to(self._dtype))
            path = self._shard_file(directory, shard["index"])
            with open(path, "wb") as f:
                f.write(data.numpy().tobytes() if data.numel() else b"")
                f.write(params.view(torch.uint8).numpy().tobytes() if psize and padded else b"")

    # ----- lifetime ------------------------------------------------------------------------------

    def _detach(self):
        self._shards = []
        self._session.close()
        self._session = None

    def close(self):
        """Detaches every rank and deletes the daemon's job (unless keep_job)."""
        if getattr(self, "_session", None) is None:
            return
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self._comm.barrier()
        self._detach()
        self._comm.barrier()
        if self._is_leader and not self._keep_job:
            self._client.delete_job(self._job)

    @property
    def next_step(self):
        """The daemon's step this optimizer hands its next gradients to (steps taken so far)."""
        return self._step_index

    @property
    def job_name(self):
        return self._job

    @property
    def client(self):
        return self._client

    def __repr__(self):
        return f"{type(self).__name__}(job={getattr(self, '_job', None)!r}, groups={len(self.param_groups)})"


def _copy(dst, src):
    """dst.copy_(src); between two contiguous host tensors of one dtype, one single-threaded memcpy.

    torch's copy_ splits a copy across its intra-op (OpenMP) threads; each of the ~200
    per-tensor copies of a hand-off or copy-back then waits on a barrier, and on a busy
    machine (more runnable threads than cores) those waits cost 5-10x the copy itself
    (strata bench train: 400 MB copied back in 0.4-1.3 s with 2 threads, 0.1 s with one).
    A copy is bound by memory bandwidth, not by cores: one thread does it. A tensor on any
    other device (a GPU model's grads and params against the host slots) goes through copy_,
    which moves it between devices."""
    if (dst.device.type != "cpu" or src.device.type != "cpu" or dst.dtype != src.dtype
            or not dst.is_contiguous() or not src.is_contiguous() or dst.numel() != src.numel()):
        dst.copy_(src)
        return
    if dst.numel():
        numpy.copyto(dst.view(torch.uint8).numpy(), src.view(torch.uint8).numpy())


def _flat_grads(params, grads):
    """The bucket's gradients as one flat tensor (a new one: it is reduced in place), on the
    gradients' device; a param without a gradient contributes zeros there (as DDP's unused
    params), in the param's dtype."""
    device = next((g.device for g in grads if g is not None), params[0].device)
    parts = [torch.zeros(p.numel(), dtype=p.dtype, device=device) if g is None else g.detach().reshape(-1)
             for p, g in zip(params, grads)]
    return torch.cat(parts) if len(parts) > 1 else parts[0].clone()


def _pairwise_sum(values):
    """The daemon's PairwiseSum: halves (the first one larger), recursively."""
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    half = (len(values) + 1) // 2
    return _pairwise_sum(values[:half]) + _pairwise_sum(values[half:])


def _betas(betas):
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas}")
    return (float(betas[0]), float(betas[1]))


class OffloadAdamW(_OffloadOptimizer):
    """torch.optim.AdamW whose step runs in stratad (ZeRO-Offload)."""

    _kind = "adamw"
    _state_keys = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, **kwargs):
        if amsgrad:
            self._state_keys = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        defaults = dict(lr=lr, betas=_betas(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=False, foreach=None, capturable=False, differentiable=False, fused=None)
        super().__init__(params, defaults, **kwargs)

    def _group_hparams(self, group):
        for key in ("lr", "eps", "weight_decay"):
            if isinstance(group[key], torch.Tensor):
                group[key] = float(group[key])
        if group.get("amsgrad", False) != self.defaults["amsgrad"]:
            raise ValueError("amsgrad is job-wide in stratad: every param group must use the same value")
        if group.get("maximize", False):
            raise ValueError("maximize=True is not supported by strata's optimizers")
        b1, b2 = _betas(group["betas"])
        return {"lr": float(group["lr"]), "beta1": b1, "beta2": b2, "eps": float(group["eps"]),
                "weight_decay": float(group["weight_decay"]), "lr_decay": 0.0}


class OffloadAdam(OffloadAdamW):
    """torch.optim.Adam (L2 weight decay added to the gradient) in stratad."""

    _kind = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, **kwargs)


class OffloadAdagrad(_OffloadOptimizer):
    """torch.optim.Adagrad in stratad (state 'sum')."""

    _kind = "adagrad"
    _state_keys = ("sum",)

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                 **kwargs):
        defaults = dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=False,
                        foreach=None, differentiable=False, fused=None)
        super().__init__(params, defaults, **kwargs)

    def _group_hparams(self, group):
        if group.get("initial_accumulator_value", 0.0) != self.defaults["initial_accumulator_value"]:
            raise ValueError("initial_accumulator_value is job-wide in stratad: every group must use the same")
        return {"lr": float(group["lr"]), "beta1": 0.0, "beta2": 0.0, "eps": float(group["eps"]),
                "weight_decay": float(group["weight_decay"]), "lr_decay": float(group["lr_decay"])}


class OffloadLion(_OffloadOptimizer):
    """Lion (Chen et al. 2023) in stratad (state 'exp_avg')."""

    _kind = "lion"
    _state_keys = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **kwargs):
        defaults = dict(lr=lr, betas=_betas(betas), weight_decay=weight_decay)
        super().__init__(params, defaults, **kwargs)

    def _group_hparams(self, group):
        b1, b2 = _betas(group["betas"])
        return {"lr": float(group["lr"]), "beta1": b1, "beta2": b2, "eps": 0.0,
                "weight_decay": float(group["weight_decay"]), "lr_decay": 0.0}

