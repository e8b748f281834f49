"""Rank processes for test_checkpoint.py: a tiny GPT trained through stratad
whose global batch does not depend on the world size (it is cut into
SHARDS virtual shards; rank r of W takes shards [r*SHARDS/W, (r+1)*SHARDS/W)),
so runs at 1, 2 and 4 ranks train the same model on the same data."""
import os
import signal

import torch
import torch.distributed as dist

import tiny_gpt

CFG = dict(dim=64, layers=2, heads=4, context=32, micro_batch=4, shards=4, accumulation=2, lr=3e-3,
           weight_decay=0.1, warmup=2, steps=8, save_at=4, max_norm=1.0, seed=0, sub_group_size=8192)


def schedule(cfg):
    warmup = cfg["warmup"]
    return lambda step: min(1.0, (step + 1) / warmup) * (0.5 ** (step / cfg["steps"]))


def make_model(cfg):
    torch.manual_seed(cfg["seed"])
    return tiny_gpt.TinyGPT(len(tiny_gpt.VOCAB), cfg["dim"], cfg["layers"], cfg["heads"], cfg["context"])


def rank_batch(tokens, step, micro, rank, world, cfg):
    per = cfg["shards"] // world
    xs, ys = [], []
    for j in range(rank * per, (rank + 1) * per):
        x, y = tiny_gpt.batch(tokens, step, j, cfg["shards"], cfg["micro_batch"], cfg["context"], micro)
        xs.append(x)
        ys.append(y)
    return torch.cat(xs), torch.cat(ys)


def make_optimizer(model, cfg, socket, **kwargs):
    import strata.torch as st
    groups = st.decay_groups(model, cfg["weight_decay"])
    opt = st.OffloadAdamW(groups, lr=cfg["lr"], betas=(0.9, 0.999), eps=1e-8, socket=socket,
                          max_norm=cfg["max_norm"], gradient_accumulation_steps=cfg["accumulation"],
                          bucket_numel=20_000, sub_group_size=cfg["sub_group_size"], **kwargs)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    return opt, sched


def train_step(model, opt, sched, tokens, step, rank, world, cfg):
    total = torch.zeros(())
    for micro in range(cfg["accumulation"]):
        x, y = rank_batch(tokens, step, micro, rank, world, cfg)
        loss = model(x, y)
        total += loss.detach()
        (loss / cfg["accumulation"]).backward()
    opt.step()
    opt.zero_grad()
    if sched is not None:
        sched.step()
    dist.all_reduce(total)
    return total.item() / (cfg["accumulation"] * world)


def params_of(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def run(rank, world, store, out, task):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = globals()["_" + task["phase"]](rank, world, task)
        if result is not None:
            torch.save(result, os.path.join(out, f"{task['phase']}-{world}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _first(rank, world, task):
    """Trains save_at steps, checkpoints the daemon's job (and takes state_dict()),
    then goes on to the end: the uninterrupted reference."""
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    opt, sched = make_optimizer(model, cfg, task["socket"])
    losses = []
    for step in range(cfg["save_at"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    if rank == 0:
        opt.client.save_checkpoint(opt.job_name, task["checkpoint"])
    dist.barrier()
    live_state = opt.state_dict()
    live_params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]   # state-dict order
    for step in range(cfg["save_at"], cfg["steps"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    opt.close()
    return {"losses": losses, "params": params_of(model), "live_state": live_state, "live_params": live_params}


def _resume(rank, world, task):
    """A new job at this world size from the exported state dict: params and
    optimizer state loaded, the schedule advanced to the saved step."""
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    exported = torch.load(task["export"], weights_only=True)
    import strata.torch as st
    with torch.no_grad():
        trainable = [p for g in st.decay_groups(model, cfg["weight_decay"]) for p in g["params"]]
        assert len(trainable) == len(exported["params"])
        for p, saved in zip(trainable, exported["params"]):
            p.copy_(saved)
    opt, sched = make_optimizer(model, cfg, task["socket"])
    opt.load_state_dict(exported["optimizer"])
    for _ in range(exported["step"]):
        sched.step()
    losses = []
    for step in range(exported["step"], cfg["steps"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    opt.close()
    return {"losses": losses, "params": params_of(model)}


def _doomed(rank, world, task):
    """Trains with a kept job until step kill_at, where rank 1 SIGKILLs itself
    after handing over part of its gradient (its 2nd GradReady); the test then
    kills rank 0, as a launcher does when one of its workers dies."""
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    opt, sched = make_optimizer(model, cfg, task["socket"], job_name=task["job"], keep_job=True)
    for step in range(cfg["steps"]):
        if step == task["kill_at"] and rank == 1:
            session = opt._session
            calls = [0]
            real = session.grad_ready

            def grad_ready(index, step_index):
                real(index, step_index)
                calls[0] += 1
                if calls[0] == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
            opt._session = _Wrapped(session, grad_ready)
        train_step(model, opt, sched, tokens, step, rank, world, cfg)
        torch.save(step, os.path.join(task["out"], f"doomed-{rank}-at"))
    return None


class _Wrapped:
    """A session whose grad_ready is replaced; everything else is the session's."""

    def __init__(self, session, grad_ready):
        self._s = session
        self.grad_ready = grad_ready

    def __getattr__(self, name):
        return getattr(self._s, name)


def _reattach(rank, world, task):
    """Fresh rank processes re-attach to the kept job and finish the run."""
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    opt, sched = make_optimizer(model, cfg, task["socket"], job_name=task["job"], resume=True)
    start = opt.next_step
    for _ in range(start):
        sched.step()
    losses = []
    for step in range(start, cfg["steps"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    opt.close()
    return {"start": start, "losses": losses, "params": params_of(model)}


def make_infinity_optimizer(model, cfg, socket):
    """Zero3AdamW in mode infinity (params and states on the daemon's NVMe) with the schedule,
    groups, clipping and accumulation of make_optimizer; the host budget is a quarter of the
    params' bytes (the daemon raises it to what its largest shard needs)."""
    import strata.torch as st
    params_bytes = 4 * sum(p.numel() for p in model.parameters())
    opt = st.Zero3AdamW(model, st.decay_groups(model, cfg["weight_decay"]), lr=cfg["lr"], betas=(0.9, 0.999),
                        eps=1e-8, socket=socket, mode="infinity", pinned_budget_bytes=params_bytes // 4,
                        persistence_threshold=256, max_norm=cfg["max_norm"],
                        gradient_accumulation_steps=cfg["accumulation"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(cfg))
    return opt, sched


def _infinity(rank, world, task):
    """As _first, through a ZeRO-Infinity job (Zero3AdamW, mode infinity): trains save_at steps,
    rank 0 checkpoints the daemon's job, every rank gathers the whole params (what the export
    must hold), then trains on to the end (the uninterrupted run a resume is compared with)."""
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    opt, sched = make_infinity_optimizer(model, cfg, task["socket"])
    assert opt.mode == "infinity"
    losses = []
    for step in range(cfg["save_at"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    if rank == 0:
        opt.client.save_checkpoint(opt.job_name, task["checkpoint"])
    dist.barrier()
    opt.gather_params()
    saved_params = [p.detach().clone() for g in opt.param_groups for p in g["params"]]   # registration order
    for step in range(cfg["save_at"], cfg["steps"]):
        losses.append(train_step(model, opt, sched, tokens, step, rank, world, cfg))
    opt.close()
    return {"losses": losses, "saved_params": saved_params, "params": params_of(model)}


def _leader_fails(rank, world, task):
    """A ZeRO-3 state_dict() whose leader cannot save (its save fails on rank 0 only):
    every rank must raise, none wait at a barrier; then both go on training."""
    import strata.torch as st
    cfg = CFG
    tokens = tiny_gpt.encode(tiny_gpt.make_text())
    model = make_model(cfg)
    opt = st.Zero3AdamW(model, st.decay_groups(model, cfg["weight_decay"]), lr=cfg["lr"], socket=task["socket"],
                        gradient_accumulation_steps=cfg["accumulation"])
    raised = None
    try:
        train_step(model, opt, None, tokens, 0, rank, world, cfg)
        if rank == 0:
            # The leader's save fails (as a daemon that refuses it would make it).
            import strata.torch.optimizer as offload

            def refused(client, job):
                raise RuntimeError("injected: the leader's save was refused")
            offload.state_checkpoint = refused
        try:
            opt.state_dict()
        except Exception as e:      # noqa: BLE001 -- reported to the test
            raised = f"{type(e).__name__}: {e}"
        train_step(model, opt, None, tokens, 1, rank, world, cfg)
    finally:
        opt.close()
    return {"raised": raised}
