"""ZeRO-3 and ZeRO-Infinity for a torch module, with the step in stratad.

Every trainable param is cut into world_size equal chunks (the last padded),
one per rank, as DeepSpeed's stage 3 cuts it; rank r's chunk of tensor t is
the daemon shard t of rank r (a trainer-supplied partition). The trainer does
not keep the params: each param's storage is an empty tensor except while a
module that owns it runs.

  forward pre-hook      Acquire the module's shards (infinity: the daemon
                        brings them from NVMe, usually already prefetched),
                        copy this rank's chunks out, Release, and all-gather
                        the chunks across ranks (torch.distributed);
  forward hook          free the gathered params again;
  backward pre-hook     gather them again (backward needs the weights);
  post-accumulate-grad  start the reduce-scatter of the param's gradient
                        (torch.distributed, asynchronous: backward goes on),
                        drop the full gradient, and free the module's params
                        once all their gradients are in; as each reduction
                        completes, its chunk is accumulated in the grad slot
                        (any number of backward passes per step) and, with
                        overlap_backward (the default), GradReady at the
                        gradient_accumulation_steps-th pass (a further pass
                        before step() is refused); without it, in step().

Params of at most `persistence_threshold` elements (DeepSpeed's
stage3_param_persistence_threshold) stay whole in the trainer: they are
gathered once after each step. step() waits for the daemon's step and marks
the iteration boundary, which is what the daemon's TracePredictor learns the
Acquire order from (it drives the prefetch).

Mode "offload" (offload_param cpu) keeps the params and optimizer state in
the daemon's host memory (a ZeRO-Offload job holding the per-tensor
partition); mode "infinity" (offload_param nvme) keeps them on NVMe and the
params' residency in host memory is bounded by the pinned budget. Both
register the same partition, so the two give the same bits.
"""
import os
import shutil
import warnings
import socket as _socket
import time
import types
import uuid

import torch
import torch.distributed as dist

from strata import client as strata_client
from strata.errors import StrataError
from strata.torch import optimizer as offload
from strata.torch._comm import Comm



class _LinearSavingTheParam(torch.autograd.Function):
    """F.linear whose backward keeps the weight param itself, not torch's `weight.t()` view: a
    saved view would hold the gathered storage from forward until backward, so freeing the param
    after forward would free nothing (DeepSpeed's stage 3 swaps in a linear for the same reason).
    Backward reads the param after the backward pre-hook gathered it again."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = grad.matmul(weight)
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_w = g2.t().mm(x.reshape(-1, x.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = g2.sum(0)
        return grad_x, grad_w, grad_b


def _linear_forward(module, x):
    return _LinearSavingTheParam.apply(x, module.weight, module.bias)


class _Zero3Optimizer(torch.optim.Optimizer):
    """Base of Zero3AdamW, Zero3Adam, Zero3Adagrad, Zero3Lion."""

    _kind = None

    def __init__(self, model, params, defaults, *, mode="offload", socket=None, job_name=None,
                 process_group=None, max_norm=0.0, gradient_accumulation_steps=1, persistence_threshold=0,
                 pinned_budget_bytes=0, device_budget_bytes=0, nvme_path=None, keep_job=False,
                 rpc_timeout_s=30.0, step_timeout_s=300.0, overlap_backward=True, fp16=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError("ZeRO-3 partitions the params itself: pass the module, not a DDP wrapper")
        if params is None:
            params = [p for p in model.parameters() if p.requires_grad]
        super().__init__(params, defaults)
        if mode not in ("offload", "infinity"):
            raise ValueError(f"mode '{mode}': expected 'offload' (offload_param cpu) or 'infinity' "
                             "(offload_param nvme)")
        if gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
        if device_budget_bytes and mode != "infinity":
            raise ValueError("device_budget_bytes (params served from stratad's device tier) needs mode='infinity'")
        if max_norm is None or max_norm < 0:
            raise ValueError(f"max_norm must be 0 (no clipping) or positive, got {max_norm}")
        self._mode = mode
        self._device_budget = int(device_budget_bytes)
        self._comm = Comm(process_group)
        self._gas = int(gradient_accumulation_steps)
        self._max_norm = float(max_norm)
        # overlap_backward: GradReady from backward at the gradient_accumulation_steps-th pass, so
        # that the daemon steps shards while backward runs. Safe here as it is not for the
        # offload optimizer: the hooks consume each gradient (param.grad is None after
        # backward), so no caller code can change it before step(); the one thing that could
        # change the result, a further backward pass, is refused. Off: GradReady in step(),
        # after any number of passes (an Infinity window then holds every gradient until then).
        self._overlap = bool(overlap_backward)
        self._keep_job = keep_job
        self._nvme_path = nvme_path
        self._model = model

        # The trainable params, in group order: the registration order.
        self._params, self._group_of = [], []
        for gi, group in enumerate(self.param_groups):
            for p in group["params"]:
                if p.requires_grad:
                    self._params.append(p)
                    self._group_of.append(gi)
        if not self._params:
            raise ValueError("no trainable params (every param has requires_grad=False)")
        dtypes = {p.dtype for p in self._params}
        if len(dtypes) != 1 or next(iter(dtypes)) not in offload._DTYPE_NAMES:
            raise ValueError(f"ZeRO-3 in strata.torch exchanges one param dtype (float32, float16 or bfloat16); "
                             f"the params are {', '.join(sorted(str(d) for d in dtypes))}")
        # 16-bit params and gradients in the trainer, fp32 masters in the daemon (written back
        # as 16-bit params in the optimizer's pass), as DeepSpeed's fp16/bf16 optimizers keep
        # them. fp16: DeepSpeed's dynamic loss scaler, run by the daemon (an overflow skips the
        # step on every rank alike and lowers the scale).
        self._dtype = next(iter(dtypes))
        if self._dtype == torch.float16:
            self._fp16_config = dict(offload._FP16_DEFAULTS)
            self._fp16_config.update(fp16 or {})
            self._fp16_config["enabled"] = True
        elif fp16:
            raise ValueError(f"fp16 loss scaling needs a float16 model (model.half()); the params are {self._dtype}")
        else:
            self._fp16_config = None
        self._fp16 = self._fp16_config      # what the offload optimizer's loss-scale methods read
        # Where each param lives: gathered params, freed placeholders and the collectives'
        # buffers are made there (the daemon's slots are host memory; copy_ crosses over).
        self._device = [p.device for p in self._params]
        self._index = {id(p): t for t, p in enumerate(self._params)}
        if len(self._index) != len(self._params):
            raise ValueError("a param appears twice in the param groups")
        # The modules that hold each param: their hooks gather and free it. A param held by
        # several (tied weights: an LM's input embedding and its output projection) is gathered
        # while any of them runs, freed when none does, and its gradient, which autograd sums
        # over every use before the post-accumulate hook, is reduced once.
        self._modules = {}          # module -> [tensor indices]
        owner = {}                  # id(param) -> [modules]
        for m in model.modules():
            for _, p in m.named_parameters(recurse=False):
                if id(p) in self._index:
                    owner.setdefault(id(p), []).append(m)
                    self._modules.setdefault(m, []).append(self._index[id(p)])
        missing = [t for t, p in enumerate(self._params) if id(p) not in owner]
        if missing:
            raise ValueError(f"trainable param {missing[0]} (shape {tuple(self._params[missing[0]].shape)}) "
                             "is not a param of the model")

        world, rank = self._comm.world_size, self._comm.rank
        self._shape = [p.shape for p in self._params]
        self._numel = [p.numel() for p in self._params]
        self._chunk = [-(-n // world) for n in self._numel]                 # ceil(n / world)
        self._own = [max(0, min(c, n - rank * c)) for n, c in zip(self._numel, self._chunk)]
        self._resident = [n <= persistence_threshold for n in self._numel]
        partition = [(t, self._chunk[t], [(t, rank * self._chunk[t], self._own[t], 0)] if self._own[t] else [])
                     for t in range(len(self._params))]

        self._client = strata_client.connect(socket, rpc_timeout_s, step_timeout_s)
        socket_path = strata_client.resolve_socket(socket)[0]
        keys = self._comm.all_gather_object((_socket.gethostname(), os.path.realpath(socket_path)))
        if len(set(keys)) != 1:
            raise ValueError("ZeRO-3 in strata.torch runs every rank on one stratad; the ranks reach "
                             f"{len(set(keys))} daemons")
        self._is_leader = rank == 0
        self._job = self._comm.broadcast_object(job_name or f"torch-z3-{uuid.uuid4().hex[:12]}")
        if self._is_leader:
            import json
            self._client.create_job(self._job, world, mode=mode, deepspeed_config_json=json.dumps(self._job_config()),
                                    param_dtype=offload._DTYPE_NAMES[self._dtype],
                                    grad_dtype=offload._DTYPE_NAMES[self._dtype],
                                    pinned_budget_bytes=int(pinned_budget_bytes) if mode == "infinity" else 0,
                                    device_budget_bytes=self._device_budget)
        self._comm.barrier()
        self._partition = partition
        self._attach()

        with torch.no_grad():
            if self._comm.distributed:
                # Every rank starts from rank 0's params, as DDP and DeepSpeed do.
                for p in model.parameters():
                    dist.broadcast(p.data, src=self._comm._global(0), group=self._comm.group)
            # In batches the daemon's window has room for (init_batch_bytes,
            # ZeRO-Infinity with a pinned budget): the whole model never sits
            # in host memory at once.
            limit = self._session.init_batch_bytes
            batch, batch_bytes = [], 0
            for t, p in enumerate(self._params):
                if self._param_slot[t] is None:
                    continue
                nbytes = self._param_slot[t].numel() * self._param_slot[t].element_size()
                if limit and batch and batch_bytes + nbytes > limit:
                    self._session.init_params(batch)
                    batch, batch_bytes = [], 0
                own = self._own[t]
                if own:
                    start = rank * self._chunk[t]
                    self._param_slot[t][:own].copy_(p.detach().reshape(-1)[start:start + own])
                batch.append(t)
                batch_bytes += nbytes
        self._session.init_params(batch)
        self._comm.barrier()
        self._gathered = [True] * len(self._params)
        for t in range(len(self._params)):
            if not self._resident[t]:
                self._free(t)

        self._micro = [0] * len(self._params)
        self._pending = []          # (tensor, micro-batch, chunk, flat, work): reduce-scatters in flight
        self._ready = set()
        self._awaiting = {}
        self._begun = None
        self._hooks = []
        self._module_of = {}        # tensor -> the modules holding it
        # How many modules that hold each param are running (forward) or waiting for its
        # gradient (backward): it is freed when that drops to 0.
        self._uses = [0] * len(self._params)
        self._patched = []
        for m, ts in self._modules.items():
            for t in ts:
                self._module_of.setdefault(t, []).append(m)
            w = self._index.get(id(getattr(m, "weight", None)))
            if type(m) is torch.nn.Linear and "forward" not in vars(m) and w is not None and not self._resident[w]:
                m.forward = types.MethodType(_linear_forward, m)
                self._patched.append(m)
            self._hooks.append(m.register_forward_pre_hook(self._make_gather_hook(m)))
            self._hooks.append(m.register_forward_hook(self._make_free_hook(m)))
            self._hooks.append(m.register_full_backward_pre_hook(self._make_backward_gather_hook(m)))
        for t, p in enumerate(self._params):
            self._hooks.append(p.register_post_accumulate_grad_hook(self._make_grad_hook(t)))
        # model.state_dict() and model.load_state_dict() see whole params (a Hugging Face Trainer
        # saves and, on resume, loads the model through them; its placeholders are empty).
        self._hooks.append(model.register_state_dict_pre_hook(self._model_state_dict_hook))
        self._hooks.append(model.register_load_state_dict_pre_hook(self._model_load_pre_hook))
        self._hooks.append(model.register_load_state_dict_post_hook(self._model_load_post_hook))
        self.last_grad_norm = None
        self.last_step_times = {}
        self.last_step_skipped = False
        self.lr_scheduler = None
        self.loss_divisor = 1

    # ----- the job -------------------------------------------------------------------------------

    def _attach(self):
        """Attaches this rank to the daemon's job and registers its partition: the grad and param
        slots of its shards (and the device arena where the job has a device budget)."""
        self._session = self._client.attach(self._job, self._comm.rank)
        names = [(f"p{t}.{'x'.join(str(s) for s in shape) or 'scalar'}", n, self._group_of[t])
                 for t, (shape, n) in enumerate(zip(self._shape, self._numel))]
        self._session.register_tensors(names, self._partition)
        # With a device budget, acquired params are read from stratad's device
        # arena (mapped once by register_tensors; read-only).
        self._arena = self._session.device_arena() if self._device_budget else None
        self._step_index = self._session.step
        self._grad_slot, self._param_slot = [None] * len(self._params), [None] * len(self._params)
        for shard in self._session.shards():
            t = shard["index"]
            if shard["padded_numel"]:
                self._grad_slot[t] = torch.frombuffer(shard["grad"], dtype=self._dtype)
                self._param_slot[t] = torch.frombuffer(shard["param"], dtype=self._dtype)
            else:
                self._grad_slot[t] = self._param_slot[t] = torch.empty(0, dtype=self._dtype)

    def _job_config(self):
        """The offload optimizer's DeepSpeed JSON, with the stage the daemon's mode needs: an
        offload job holds the per-tensor partition at its stage 2 (it refuses stage 3, whose
        layout it does not build itself); an infinity job runs stage 3 on NVMe."""
        self._stage, self._sub_group_size, self._fp16, self._extra_config = 2, None, self._fp16_config, {}
        config = offload._OffloadOptimizer._job_config(self)
        if self._mode == "infinity":
            nvme = {"device": "nvme"}
            if self._nvme_path:
                nvme["nvme_path"] = self._nvme_path
            config["zero_optimization"] = {"stage": 3, "offload_param": dict(nvme), "offload_optimizer": dict(nvme)}
        return config

    @property
    def job_name(self):
        return self._job

    @property
    def client(self):
        return self._client

    @property
    def mode(self):
        return self._mode

    def is_resident(self, param):
        """True when `param` stays whole in this process (at most persistence_threshold elements)."""
        return self._resident[self._index[id(param)]]

    # ----- gathering and freeing -----------------------------------------------------------------

    def _free(self, t):
        self._params[t].data = torch.empty(0, dtype=self._dtype, device=self._device[t])
        self._gathered[t] = False

    def _acquire(self, indices):
        """Acquires shards `indices` (infinity) and returns where to read each: {t: tensor} for
        shards served from the device arena; the others are read from their param slots.
        Offload mode keeps every param slot current: its Acquire would be a no-op RPC."""
        if self._mode != "infinity" or not indices:
            return {}
        if self._arena is None:
            self._session.acquire(indices)
            return {}
        source = {}
        with warnings.catch_warnings():
            # The arena is read-only; these views are only read (copied from).
            warnings.simplefilter("ignore", UserWarning)
            for index, _tier, offset, nbytes in self._session.acquire_places(indices, "device"):
                source[index] = torch.frombuffer(self._arena, dtype=self._dtype,
                                                 count=nbytes // self._params[index].element_size(), offset=offset)
        return source

    def _fetch(self, ts):
        """Makes params `ts` whole: this rank's chunks from the daemon, the rest from the other ranks."""
        ts = [t for t in ts if not self._gathered[t]]
        if not ts:
            return
        total = sum(self._chunk[t] for t in ts)
        indices = [t for t in ts if self._own[t]]
        if not self._comm.distributed:
            # One rank owns every element: each param is a copy of its slot (one pass, no
            # zeroed staging buffer, no all-gather, no second copy).
            source = self._acquire(indices)
            try:
                for t in ts:
                    full = torch.empty(self._shape[t], dtype=self._dtype, device=self._device[t])
                    offload._copy(full.view(-1), source.get(t, self._param_slot[t])[:self._numel[t]])
                    self._params[t].data = full
                    self._gathered[t] = True
            finally:
                if self._mode == "infinity" and indices:
                    self._session.release(indices)
            return
        device = self._device[ts[0]]    # one module's params: one device (the all-gather's)
        mine = torch.zeros(total, dtype=self._dtype, device=device)
        source = self._acquire(indices)
        try:
            pos = 0
            for t in ts:
                mine[pos:pos + self._own[t]].copy_(source.get(t, self._param_slot[t])[:self._own[t]])
                pos += self._chunk[t]
        finally:
            if self._mode == "infinity" and indices:
                self._session.release(indices)
        if self._comm.distributed:
            everyone = torch.empty(total * self._comm.world_size, dtype=self._dtype, device=device)
            dist.all_gather_into_tensor(everyone, mine, group=self._comm.group)
        else:
            everyone = mine
        parts = everyone.view(self._comm.world_size, total)
        pos = 0
        for t in ts:
            c = self._chunk[t]
            full = parts[:, pos:pos + c].reshape(-1)[:self._numel[t]].to(self._device[t], copy=True)
            self._params[t].data = full.view(self._shape[t])
            self._gathered[t] = True
            pos += c

    def _partitioned(self, m):
        return [t for t in self._modules[m] if not self._resident[t]]

    def _use(self, m):
        ts = self._partitioned(m)
        for t in ts:
            self._uses[t] += 1
        self._fetch(ts)

    def _done_with(self, m):
        for t in self._partitioned(m):
            self._uses[t] = max(0, self._uses[t] - 1)
            if self._uses[t] == 0 and self._gathered[t]:
                self._free(t)

    def _make_gather_hook(self, m):
        def hook(module, args):
            self._use(m)
        return hook

    def _make_free_hook(self, m):
        def hook(module, args, output):
            self._done_with(m)
        return hook

    def _make_backward_gather_hook(self, m):
        def hook(module, grad_output):
            if m in self._awaiting:
                # Called twice in forward: one wait for its gradients (autograd sums the uses).
                self._fetch(self._partitioned(m))
                return
            self._awaiting[m] = set(self._modules[m])
            self._use(m)
        return hook

    def gather_params(self):
        """Makes every param whole with its current value (after training, to save or evaluate the
        model); the next forward frees the partitioned ones again."""
        with torch.no_grad():
            for m in self._modules:
                self._fetch(self._partitioned(m))

    def _whole_from_daemon(self):
        """Makes every param whole without a collective (the Trainer saves the model on rank 0
        only): the daemon holds every rank's shards, so this rank saves the job and reads the
        params from that checkpoint (its 16-bit params are its masters rounded once)."""
        from strata import checkpoint as ckpt
        missing = [t for t in range(len(self._params)) if not self._gathered[t]]
        if not missing:
            return
        directory = offload.state_checkpoint(self._client, self._job)
        try:
            params = ckpt.consolidate(directory)["params"]
        finally:
            shutil.rmtree(os.path.dirname(directory), ignore_errors=True)
        with torch.no_grad():
            for t in missing:
                self._params[t].data = params[t].to(dtype=self._dtype, device=self._device[t]).reshape(self._shape[t])
                self._gathered[t] = True

    def _model_state_dict_hook(self, module, prefix, keep_vars):
        if getattr(self, "_session", None) is not None:
            self._whole_from_daemon()

    def _model_load_pre_hook(self, module, state_dict, prefix, local_metadata, strict, missing_keys,
                             unexpected_keys, error_msgs):
        # Whole params, so that the loaded tensors' shapes match (their values are replaced).
        if getattr(self, "_session", None) is not None:
            self._whole_from_daemon()

    def _model_load_post_hook(self, module, incompatible_keys):
        """The loaded values become the daemon's params and masters (the moments and step stay):
        otherwise the next forward would fetch the old ones. Collective: every rank loads."""
        if getattr(self, "_session", None) is None:
            return
        state = self.state_dict()
        number = offload.torch_numbering(self.param_groups)
        for p in self._params:
            state["state"][number[id(p)]]["fp32_master"] = p.detach().to(torch.float32)
        self.load_state_dict(state)

    # ----- gradients -----------------------------------------------------------------------------

    def _make_grad_hook(self, t):
        def hook(param):
            with torch.no_grad():
                self._reduce_grad(t, param)
            for m in self._module_of[t]:
                waiting = self._awaiting.get(m)
                if waiting is not None:
                    waiting.discard(t)
                    if not waiting:
                        del self._awaiting[m]
                        self._done_with(m)
        return hook

    def _reduce_grad(self, t, param):
        """Starts the reduce-scatter of param t's gradient; its chunk lands in the grad slot when
        the collective completes (checked without waiting here, waited for in step())."""
        if self._overlap and self._micro[t] >= self._gas:
            # GradReady went out at pass gas (the daemon may have stepped the shard; a re-sent
            # gradient of a stepped shard is ignored): this pass would be dropped.
            raise StrataError(
                f"backward pass {self._micro[t] + 1} before step() reached param {t} (shape "
                f"{tuple(self._shape[t])}), but this optimizer has gradient_accumulation_steps={self._gas} "
                f"and overlap_backward=True: it handed that param's gradient to stratad at pass {self._gas} "
                f"and would drop this one. Call step() after every {self._gas} backward passes, pass "
                "gradient_accumulation_steps=<backward passes per step> (a Hugging Face Trainer's "
                "gradient_accumulation_steps), or overlap_backward=False (GradReady in step(), after any "
                "number of passes).", "FAILED_PRECONDITION")
        world, c = self._comm.world_size, self._chunk[t]
        work = None
        grad = param.grad
        if not self._comm.distributed:
            # One rank owns the whole tensor: its gradient goes to the slot as it is (no padded copy).
            flat = chunk = grad.reshape(-1)
            param.grad = None
        else:
            flat = torch.zeros(c * world, dtype=self._dtype, device=grad.device)
            flat[:self._numel[t]].copy_(grad.reshape(-1))
            param.grad = None
            flat.div_(world)   # as DDP: the average is the sum of grad / world
            chunk = torch.empty(c, dtype=self._dtype, device=grad.device)
            work = dist.reduce_scatter_tensor(chunk, flat, group=self._comm.group, async_op=True)
        self._micro[t] += 1
        # Collectives complete in the order they were issued: the queue is drained from the front.
        self._pending.append((t, self._micro[t], chunk, flat, work))
        self._complete(wait=False)

    def _complete(self, wait):
        while self._pending:
            t, micro, chunk, _, work = self._pending[0]
            if work is not None:
                if not wait and not work.is_completed():
                    return
                work.wait()
            self._pending.pop(0)
            own = self._own[t]
            slot = self._grad_slot[t]
            if micro == 1:
                # Infinity keeps the rank's gradients within its pinned budget: write_grad waits for
                # room first, then copies without a page fault per 4 KiB into a discarded slot.
                src = chunk[:own]
                if own and src.device.type == "cpu" and src.dtype == slot.dtype and src.is_contiguous():
                    self._session.write_grad(t, src.view(torch.uint8).numpy())
                else:
                    self._session.wait_grad_room(t)
                    offload._copy(slot[:own], src)
            else:
                # A later backward pass of the same step: accumulated, as .grad accumulates.
                slot[:own].add_(chunk[:own].to(slot.device))
            if self._overlap and micro == self._gas:
                self._begin_step()
                self._session.grad_ready(t, self._step_index)
                self._ready.add(t)

    # Per-step hyperparameters travel exactly as in the offload optimizer.
    _begin_step = offload._OffloadOptimizer._begin_step
    _check_hparams_unchanged = offload._OffloadOptimizer._check_hparams_unchanged

    # ----- torch.optim.Optimizer -----------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._check_hparams_unchanged()
        for t, p in enumerate(self._params):
            if p.grad is not None:
                # The hooks take every gradient in backward; one set afterwards is not seen.
                raise StrataError(
                    f"param {t} (shape {tuple(self._shape[t])}) has a .grad at step(): ZeRO-3 takes each "
                    "gradient in backward (param.grad is None afterwards), so one assigned or changed "
                    "between backward and step() would be ignored. Clip with max_norm= (the daemon clips "
                    "by the global norm); leave .grad alone otherwise.", "FAILED_PRECONDITION")
        t0 = time.perf_counter()
        self._complete(wait=True)
        self._begin_step()
        for t in range(len(self._params)):
            if t in self._ready:
                continue
            if self._micro[t] == 0:     # no gradient this step (an unused param): zeros, as DDP
                self._session.wait_grad_room(t)
                self._grad_slot[t][:self._own[t]].zero_()
            self._session.grad_ready(t, self._step_index)
        t1 = time.perf_counter()
        result = self._session.wait_step(self._step_index)
        t2 = time.perf_counter()
        self.last_grad_norm = result["grad_norm"]
        self.last_step_skipped = result["skipped"]
        if self._fp16 is not None:
            self.loss_scale = result["loss_scale"]
        for t in range(len(self._params)):
            # Whatever is gathered now is the old value: the next use fetches the new one.
            if self._gathered[t] and not self._resident[t]:
                self._free(t)
        if not result["skipped"]:
            resident = [t for t in range(len(self._params)) if self._resident[t]]
            for t in resident:
                self._gathered[t] = False
            self._fetch(resident)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
        if self._mode == "infinity":
            self._session.iteration_boundary()
        # Where step()'s time went (as the offload optimizer's last_step_times).
        self.last_step_times = {"handoff_in_step_s": t1 - t0, "wait_s": t2 - t1,
                                "gather_s": time.perf_counter() - t2}
        self._optimizer_steps = result["optimizer_steps"]
        self._step_index += 1
        self._micro = [0] * len(self._params)
        self._ready = set()
        self._awaiting = {}
        self._uses = [0] * len(self._params)
        self._begun = None
        return loss

    # fp16 loss scaling as the offload optimizer's: loss_scale is the daemon's (1.0 without
    # fp16); scale_loss divides by loss_divisor (st.initialize sets it to
    # gradient_accumulation_steps) and multiplies by the scale; backward runs it backward, as
    # DeepSpeed's engine.backward.
    loss_scale = offload._OffloadOptimizer.loss_scale
    scale_loss = offload._OffloadOptimizer.scale_loss
    backward = offload._OffloadOptimizer.backward

    def zero_grad(self, set_to_none=True):
        # The hooks already took every gradient (param.grad is None after backward).
        for p in self._params:
            p.grad = None

    # ----- state dicts: through the daemon's checkpoints --------------------------------------------

    def _save_checkpoint(self):
        """The leader saves the daemon's job (offload.state_checkpoint); every rank gets the path."""
        saved = []
        self._on_leader(lambda: saved.append(offload.state_checkpoint(self._client, self._job)))
        return self._comm.broadcast_object(saved[0] if saved else None)

    def _drop_checkpoint(self, directory):
        self._comm.barrier()
        if self._is_leader:
            shutil.rmtree(os.path.dirname(directory), ignore_errors=True)

    def _on_leader(self, fn):
        """Runs `fn` on the leader; what it raises is raised on every rank (the others with the
        leader's message), so no rank waits at a barrier the leader never reaches."""
        failure = None
        if self._is_leader:
            try:
                fn()
            except Exception as e:      # noqa: BLE001 -- re-raised below, on every rank
                failure = e
        message = self._comm.broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        if message is not None:
            raise StrataError(f"failed on rank 0: {message}", "INTERNAL")

    def state_dict(self):
        """torch's format, the same dict on every rank: per registered param its `step` and the
        daemon's moments (`exp_avg`, `exp_avg_sq` for Adam/AdamW, `sum` for Adagrad, `exp_avg`
        for Lion), `param_groups` as torch writes them. Read from a checkpoint of the daemon's job
        by each file's layout (strata.checkpoint, which `strata checkpoint export` uses: an
        Infinity job's NVMe tiles included). Call it between steps, on every rank."""
        from strata import checkpoint as ckpt
        directory = self._save_checkpoint()
        try:
            whole = ckpt.consolidate(directory)
        finally:
            self._drop_checkpoint(directory)
        state = whole["optimizer"]["state"]           # by registration index
        number = offload.torch_numbering(self.param_groups)
        packed = {}
        for t, p in enumerate(self._params):
            packed[number[id(p)]] = {k: v if k == "step" else v.reshape(self._shape[t]) for k, v in state[t].items()}
            # The daemon's masters: a resumed job takes them (with ZeRO-3 the trainer's params
            # are not whole when the Trainer saves or loads the model, nor are they the masters).
            packed[number[id(p)]]["fp32_master"] = whole["params"][t].reshape(self._shape[t])
        return {"state": packed, "param_groups": offload.torch_param_groups(self.param_groups, number)}

    def load_state_dict(self, state_dict):
        """Loads torch's format (this class's state_dict, or torch.optim's of the same algorithm)
        into the daemon's job: every registered param's moments and the step count, and the
        groups' hyperparameters. The params keep their values (load the model's weights before
        building the optimizer, as with DeepSpeed's ZeRO-3). The job is saved, its moments
        rewritten in the checkpoint (strata.checkpoint.write_optimizer_states), the job re-loaded
        from it under its name, and every rank re-attached. Call it between steps, on every rank."""
        from strata import checkpoint as ckpt
        groups = state_dict["param_groups"]
        theirs = offload.state_dict_index(self.param_groups, groups)
        keys = tuple(self._state_keys) + (("max_exp_avg_sq",) if self.defaults.get("amsgrad") else ())
        values, steps, masters = [], set(), {}
        for t, p in enumerate(self._params):
            entry = state_dict["state"].get(theirs[id(p)])
            if entry is None:
                raise ValueError(f"the state dict has no state for trainable param {t} (shape "
                                 f"{tuple(self._shape[t])}); take it after at least one step")
            steps.add(int(float(entry["step"])))
            values.append({})
            for key in keys:
                if key not in entry:
                    raise ValueError(f"the state of param {t} lacks '{key}'")
                v = torch.as_tensor(entry[key]).detach()
                if v.numel() != self._numel[t]:
                    raise ValueError(f"the state of param {t} has a '{key}' of {v.numel()} elements; the "
                                     f"param has {self._numel[t]}")
                values[t][key] = v.reshape(-1).to(torch.float32).contiguous()
            if "fp32_master" in entry:
                v = torch.as_tensor(entry["fp32_master"]).detach()
                if v.numel() != self._numel[t]:
                    raise ValueError(f"the fp32_master of param {t} has {v.numel()} elements; the param has "
                                     f"{self._numel[t]}")
                masters[t] = v.reshape(-1).to(torch.float32).contiguous()
        if masters and len(masters) != len(self._params):
            raise ValueError("the state dict has fp32_master for some params only; give it for all or none")
        if len(steps) != 1:
            raise ValueError(f"the params' step counts differ ({sorted(steps)}); stratad keeps one per job")
        step = steps.pop()
        directory = self._save_checkpoint()
        try:
            # The leader rewrites the files (one daemon holds every rank's), then re-creates the
            # job from them; an error in either is every rank's, so none waits at a barrier the
            # leader never reaches.
            def rewrite():
                m = ckpt.read_manifest(directory)
                names = ckpt._torch_keys(m["optimizer"], m["streams"])
                if tuple(names) != keys:
                    raise ValueError(f"the daemon's job keeps {names}; this optimizer expects {list(keys)}")
                states = {t: {s: values[t][k] for s, k in zip(m["streams"][1:], names)}
                          for t in range(len(values))}
                # With the masters (this class's state dicts), the params are theirs too.
                ckpt.write_optimizer_states(directory, states, step, masters=masters or None,
                                            param_dtype=self._dtype)

            def reload():
                self._client.delete_job(self._job)
                self._client.load_checkpoint(directory, self._job)

            self._on_leader(rewrite)
            self._session.close()
            self._session = None
            self._comm.barrier()
            self._on_leader(reload)
            self._attach()
            if masters:
                # What is gathered now predates the loaded params: the next use fetches them.
                for t in range(len(self._params)):
                    if self._gathered[t]:
                        self._free(t)
                resident = [t for t in range(len(self._params)) if self._resident[t]]
                self._fetch(resident)
        finally:
            self._drop_checkpoint(directory)
        for gi, group in enumerate(self.param_groups):
            for k, v in groups[gi].items():
                if k != "params" and k in group:
                    group[k] = v

    # ----- lifetime ------------------------------------------------------------------------------

    def close(self):
        """Leaves every param whole with its trained value, removes the hooks, detaches every rank
        and deletes the daemon's job (unless keep_job)."""
        if getattr(self, "_session", None) is None:
            return
        self.gather_params()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for m in self._patched:
            del m.forward       # the class's forward again
        self._patched = []
        self._comm.barrier()
        self._grad_slot, self._param_slot = [], []
        self._arena = None
        self._session.close()
        self._session = None
        self._comm.barrier()
        if self._is_leader and not self._keep_job:
            self._client.delete_job(self._job)

    def __repr__(self):
        return f"{type(self).__name__}(job={getattr(self, '_job', None)!r}, mode={self._mode!r})"


class Zero3AdamW(_Zero3Optimizer):
    """torch.optim.AdamW over a ZeRO-3 partitioned module, the step in stratad."""

    _kind = "adamw"
    _group_hparams = offload.OffloadAdamW._group_hparams
    _state_keys = offload.OffloadAdamW._state_keys

    def __init__(self, model, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, **kwargs):
        defaults = dict(lr=lr, betas=offload._betas(betas), eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=False, foreach=None, capturable=False, differentiable=False, fused=None)
        super().__init__(model, params, defaults, **kwargs)


class Zero3Adam(Zero3AdamW):
    """torch.optim.Adam (L2 weight decay) over a ZeRO-3 partitioned module."""

    _kind = "adam"

    def __init__(self, model, params=None, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, **kwargs):
        super().__init__(model, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         **kwargs)


class Zero3Adagrad(_Zero3Optimizer):
    """torch.optim.Adagrad over a ZeRO-3 partitioned module."""

    _kind = "adagrad"
    _group_hparams = offload.OffloadAdagrad._group_hparams
    _state_keys = offload.OffloadAdagrad._state_keys

    def __init__(self, model, params=None, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0,
                 eps=1e-10, **kwargs):
        defaults = dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, eps=eps, maximize=False,
                        foreach=None, differentiable=False, fused=None)
        super().__init__(model, params, defaults, **kwargs)


class Zero3Lion(_Zero3Optimizer):
    """Lion over a ZeRO-3 partitioned module."""

    _kind = "lion"
    _group_hparams = offload.OffloadLion._group_hparams
    _state_keys = offload.OffloadLion._state_keys

    def __init__(self, model, params=None, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, **kwargs):
        defaults = dict(lr=lr, betas=offload._betas(betas), weight_decay=weight_decay)
        super().__init__(model, params, defaults, **kwargs)


# The offload optimizer class st.initialize picked -> its ZeRO-3 counterpart.
ZERO3_OF = {offload.OffloadAdamW: Zero3AdamW, offload.OffloadAdam: Zero3Adam,
            offload.OffloadAdagrad: Zero3Adagrad, offload.OffloadLion: Zero3Lion}

# DeepSpeed 0.19.8's defaults (runtime/zero/config.py, offload_config.py).
_PERSISTENCE_DEFAULT = 100_000
_MAX_IN_CPU_DEFAULT = 1_000_000_000


def options_from_config(zero):
    """A DeepSpeed `zero_optimization` section (stage 3) -> the ZeRO-3 optimizer's keyword arguments.

    offload_param.device "nvme" -> mode infinity, its max_in_cpu (param elements kept in host memory)
    -> the pinned budget; "cpu" or none -> mode offload (the params' home is the daemon's host
    memory either way: a CPU trainer has no GPU to keep them on). The optimizer state follows the
    params (an infinity job keeps both on NVMe; offload_optimizer is not read).
    stage3_param_persistence_threshold
    -> the params that stay whole in the trainer."""
    param = zero.get("offload_param") or {}
    device = str(param.get("device", "none")).lower()
    if device not in ("none", "cpu", "nvme"):
        raise ValueError(f"zero_optimization.offload_param.device '{param.get('device')}': expected none, cpu "
                         "or nvme")
    threshold = zero.get("stage3_param_persistence_threshold", _PERSISTENCE_DEFAULT)
    if not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 0:
        raise ValueError(f"zero_optimization.stage3_param_persistence_threshold must be a non-negative integer, "
                         f"got {threshold!r}")
    options = {"mode": "infinity" if device == "nvme" else "offload", "persistence_threshold": threshold}
    if device == "nvme":
        max_in_cpu = param.get("max_in_cpu", _MAX_IN_CPU_DEFAULT)
        if not isinstance(max_in_cpu, (int, float)) or isinstance(max_in_cpu, bool) or max_in_cpu < 1:
            raise ValueError(f"zero_optimization.offload_param.max_in_cpu must be a positive number of "
                             f"elements, got {max_in_cpu!r}")
        options["pinned_budget_bytes"] = int(max_in_cpu) * 4    # float32 params
        options["nvme_path"] = param.get("nvme_path")
    return options
