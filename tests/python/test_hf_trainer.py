"""strata's optimizers under a Hugging Face Trainer, against the Trainer with
torch.optim.AdamW on the same model, seed and data:

- a small MLP with a cosine schedule and gradient accumulation;
- transformers' GPT-2 (tiny config, random init, no dropout) with the Trainer's
  own clipping (max_grad_norm 1.0, its default, and 0) and accumulation 1 and 4:
  the Trainer clips .grad between backward and step() and accelerate runs the
  accumulation, so OffloadAdamW must take .grad at step(), not in backward;
- Zero3AdamW, which takes every gradient in backward: clipping is the
  optimizer's (max_norm), accumulation its gradient_accumulation_steps, and a
  backward pass more than that is refused, not dropped;
- a plain loop that scales, masks and replaces .grad before step()."""
import copy
import tempfile

import pytest
import torch
import torch.nn as nn

import strata
import strata.torch as st


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": nn.functional.cross_entropy(out, labels), "logits": out}


class _Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 16, generator=g)
        self.y = torch.randint(0, 4, (64,), generator=g)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def _run(socket):
    from transformers import Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    torch.manual_seed(0)
    model = _Model()
    groups = st.decay_groups(model, 0.01)
    if socket is None:
        opt = torch.optim.AdamW(groups, lr=1e-2)
    else:
        # Trainer clips with max_grad_norm itself when > 0; strata clips in the daemon (max_norm=).
        opt = st.OffloadAdamW(groups, lr=1e-2, socket=socket, gradient_accumulation_steps=2)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=8,
                                 gradient_accumulation_steps=2, max_grad_norm=0.0, report_to=[], use_cpu=True,
                                 save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=_Data(),
                          optimizers=(opt, get_cosine_schedule_with_warmup(opt, 2, 6)))
        trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if socket is not None:
        opt.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def test_trainer_with_offload_adamw(stratad):
    ref_losses, ref_params = _run(None)
    losses, params = _run(stratad.socket)
    assert len(losses) == 6
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (losses, ref_losses)
    for a, b in zip(params, ref_params):
        assert (a - b).abs().max().item() <= 1e-5


# ----- GPT-2 under the Trainer ----------------------------------------------------------------------

_STEPS, _BATCH, _SEQ, _VOCAB = 8, 4, 16, 128


class _Tokens(torch.utils.data.Dataset):
    """Random token windows (labels = inputs: GPT-2 shifts them itself)."""

    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, _VOCAB, (n, _SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _gpt2(tie=True):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=_VOCAB, n_positions=_SEQ, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=tie)
    return GPT2LMHeadModel(cfg)


def _train_gpt2(make_opt, accumulation, max_grad_norm, tie=True):
    """Trains GPT-2 _STEPS steps with the Trainer; returns (losses, grad norms, params, optimizer)."""
    from transformers import Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    model = _gpt2(tie)
    opt = make_opt(model)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=_STEPS, per_device_train_batch_size=_BATCH,
                                 gradient_accumulation_steps=accumulation, max_grad_norm=max_grad_norm,
                                 report_to=[], use_cpu=True, save_strategy="no", logging_steps=1, seed=0,
                                 disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=_Tokens(_STEPS * _BATCH * accumulation),
                          optimizers=(opt, get_cosine_schedule_with_warmup(opt, 1, _STEPS)))
        trainer.train()
    history = [h for h in trainer.state.log_history if "loss" in h]
    return ([h["loss"] for h in history], [h.get("grad_norm") for h in history],
            {n: p.detach().clone() for n, p in model.named_parameters()}, opt)


def _torch_adamw(model):
    return torch.optim.AdamW(st.decay_groups(model, 0.1), lr=3e-3)


def _comparable(name, p):
    """The param, less GPT-2's key biases (the middle third of c_attn.bias): their gradient is zero
    in exact arithmetic (softmax ignores a shift shared by every key), so Adam normalises rounding
    noise into lr-sized steps there and no two correct runs agree on them (docs/PYTHON.md, the tiny
    GPT has no such bias for the same reason); they do not change the loss."""
    if name.endswith("attn.c_attn.bias"):
        third = p.numel() // 3
        return torch.cat([p[:third], p[2 * third:]])
    return p


def _worst(losses, ref_losses, params, ref_params):
    """(largest relative loss difference, largest relative param-tensor difference)."""
    assert len(losses) == len(ref_losses) == _STEPS
    loss_rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
    assert params.keys() == ref_params.keys()
    param_rel = 0.0
    for n in ref_params:
        a, b = _comparable(n, params[n]), _comparable(n, ref_params[n])
        param_rel = max(param_rel, ((a - b).norm() / b.norm()).item())
    return loss_rel, param_rel


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_gpt2_trainer_offload_adamw_equals_torch(stratad, accumulation, max_grad_norm):
    """OffloadAdamW built as a user would (no strata-specific settings) and handed to the Trainer,
    which clips (max_grad_norm) and accumulates (through accelerate) itself."""
    ref_losses, ref_norms, ref_params, _ = _train_gpt2(_torch_adamw, accumulation, max_grad_norm)
    losses, norms, params, opt = _train_gpt2(
        lambda m: st.OffloadAdamW(st.decay_groups(m, 0.1), lr=3e-3, socket=stratad.socket),
        accumulation, max_grad_norm)
    opt.close()
    if max_grad_norm:
        assert ref_norms[0] > max_grad_norm, ref_norms   # the clipping is real
    loss_rel, param_rel = _worst(losses, ref_losses, params, ref_params)
    print(f"accumulation {accumulation}, max_grad_norm {max_grad_norm}: losses {loss_rel:.2e}, "
          f"params {param_rel:.2e} relative")
    assert loss_rel <= 1e-5, (losses, ref_losses)
    assert param_rel <= 1e-5
    for a, b in zip(norms, ref_norms):     # the Trainer saw the same gradients
        assert abs(a - b) <= 1e-5 * abs(b), (norms, ref_norms)


@pytest.mark.parametrize("accumulation", [1, 4])
@pytest.mark.parametrize("tie", [False, True])
def test_gpt2_trainer_zero3_adamw_equals_torch(stratad, accumulation, tie):
    """Zero3AdamW under the Trainer: it takes the gradients in backward (no .grad survives for the
    Trainer to clip), so clipping is max_norm= and accumulation gradient_accumulation_steps=;
    the Trainer's max_grad_norm is 0. Equal to the Trainer clipping torch's AdamW at 1.0. With
    tie_word_embeddings (GPT-2's default: wte and lm_head share one param, which two modules
    gather; issue 25 item 3) as without."""
    ref_losses, _, ref_params, _ = _train_gpt2(_torch_adamw, accumulation, 1.0, tie=tie)
    losses, _, params, opt = _train_gpt2(
        lambda m: st.Zero3AdamW(m, st.decay_groups(m, 0.1), lr=3e-3, socket=stratad.socket, max_norm=1.0,
                                gradient_accumulation_steps=accumulation),
        accumulation, 0.0, tie=tie)
    if tie:
        assert opt._model.lm_head.weight is opt._model.transformer.wte.weight
    opt.gather_params()
    params = {n: p.detach().clone() for n, p in opt._model.named_parameters()}
    opt.close()
    loss_rel, param_rel = _worst(losses, ref_losses, params, ref_params)
    print(f"zero3, accumulation {accumulation}, tie {tie}: losses {loss_rel:.2e}, params {param_rel:.2e} relative")
    assert loss_rel <= 1e-5, (losses, ref_losses)
    assert param_rel <= 1e-5


def test_gpt2_trainer_zero3_refuses_more_passes_than_its_accumulation(stratad):
    """Zero3AdamW (gradient_accumulation_steps 1) under a Trainer accumulating 2: the second backward
    pass of a step is refused by name, not dropped (it used to overwrite the first pass's gradient
    after the daemon had it)."""
    opts = []

    def make(m):
        opts.append(st.Zero3AdamW(m, st.decay_groups(m, 0.1), lr=3e-3, socket=stratad.socket))
        return opts[0]

    with pytest.raises(strata.StrataError) as e:
        _train_gpt2(make, 2, 0.0, tie=False)
    assert "gradient_accumulation_steps=1" in str(e.value)
    assert "overlap_backward=False" in str(e.value)
    opts[0].close()


# ----- a plain loop that changes .grad before step() --------------------------------------------------

def _mlp():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 2))


def _loss(model, step, micro=0):
    g = torch.Generator().manual_seed(100 * step + micro)
    x = torch.randn(8, 8, generator=g)
    return (model(x) ** 2).mean()


def _edit_grads(model, step):
    """What user code does between backward and step(): scale, mask, replace, clip."""
    first, second, last = model[0], model[2], model[4]
    first.weight.grad.mul_(0.5)                                   # scale in place
    mask = torch.arange(second.weight.numel()).reshape(second.weight.shape) % 3 == step % 3
    second.weight.grad[mask] = 0.0                                # mask in place
    last.weight.grad = last.weight.grad * -2.0                    # a new .grad tensor
    second.bias.grad.data.mul_(3.0)                               # through .data: no version bump
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)


def _plain_loop(model, opt, steps, passes=1):
    losses = []
    for step in range(steps):
        for micro in range(passes):
            loss = _loss(model, step, micro)
            loss.backward()
        _edit_grads(model, step)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("bucket_numel", [None, 1])
def test_grads_changed_before_step_are_what_is_stepped(stratad, bucket_numel):
    """One rank (hooks off by default): scaled, masked, replaced and clipped grads are what the
    daemon steps, as torch.optim.AdamW steps them; bucket_numel=1 runs the bucketed hand-off."""
    model = _mlp()
    twin = copy.deepcopy(model)
    kw = {} if bucket_numel is None else {"bucket_numel": bucket_numel}
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, weight_decay=0.1, socket=stratad.socket, **kw)
    ref = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1)
    losses = _plain_loop(model, opt, 4)
    ref_losses = _plain_loop(twin, ref, 4)
    opt.close()
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-6 * abs(b), (losses, ref_losses)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert (a - b).abs().max().item() <= 1e-6


def test_overlap_backward_refuses_grads_changed_before_step(stratad):
    """overlap_backward=True hands each gradient off in backward; a .grad clipped afterwards is
    refused by name at step() instead of silently not counting."""
    model = _mlp()
    opt = st.OffloadAdamW(model.parameters(), lr=1e-2, socket=stratad.socket, overlap_backward=True)
    _loss(model, 0).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
    with pytest.raises(strata.StrataError) as e:
        opt.step()
    assert "changed between backward and step()" in str(e.value)
    assert "overlap_backward=False" in str(e.value)
    opt.close()


@pytest.mark.parametrize("optimizer", ["offload", "zero3"])
def test_gpt2_trainer_saves_and_resumes_as_the_uninterrupted_run(stratad, optimizer):
    """Issue 25 item 4: the Trainer's save_steps (optimizer.state_dict(), torch.save) and
    resume_from_checkpoint (load_state_dict) through stratad with no strata-specific setting
    (no STRATA_CHECKPOINT_ROOT): a run saved at step 4, resumed by a new Trainer, model and
    optimizer, ends as the uninterrupted 8-step run."""
    import os
    from transformers import Trainer, TrainingArguments, get_cosine_schedule_with_warmup

    saved_env = os.environ.pop("STRATA_CHECKPOINT_ROOT", None)

    def make(m):
        if optimizer == "offload":
            return st.OffloadAdamW(st.decay_groups(m, 0.1), lr=3e-3, socket=stratad.socket)
        return st.Zero3AdamW(m, st.decay_groups(m, 0.1), lr=3e-3, socket=stratad.socket, max_norm=1.0)

    def train(out, max_steps, resume):
        model = _gpt2(tie=True)
        opt = make(model)
        args = TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=_BATCH,
                                 max_grad_norm=1.0 if optimizer == "offload" else 0.0, report_to=[],
                                 use_cpu=True, save_strategy="steps", save_steps=4, logging_steps=1, seed=0,
                                 disable_tqdm=True, dataloader_num_workers=0)
        trainer = Trainer(model=model, args=args, train_dataset=_Tokens(8 * _BATCH),
                          optimizers=(opt, get_cosine_schedule_with_warmup(opt, 1, 8)))
        trainer.train(resume_from_checkpoint=resume)
        losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
        if optimizer == "zero3":
            opt.gather_params()
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.close()
        return losses, params

    try:
        with tempfile.TemporaryDirectory() as whole, tempfile.TemporaryDirectory() as cut:
            ref_losses, ref_params = train(whole, 8, None)
            first, first_params = train(cut, 4, None)
            assert os.path.exists(os.path.join(cut, "checkpoint-4", "optimizer.pt"))
            # The saved model is the trained one (with ZeRO-3 the trainer's params are empty
            # placeholders between steps: the Trainer used to save those).
            from transformers import GPT2LMHeadModel
            saved = GPT2LMHeadModel.from_pretrained(os.path.join(cut, "checkpoint-4"))
            for n, p in saved.named_parameters():
                assert torch.equal(p.detach(), first_params[n]), n
            losses, params = train(cut, 8, os.path.join(cut, "checkpoint-4"))
    finally:
        if saved_env is not None:
            os.environ["STRATA_CHECKPOINT_ROOT"] = saved_env
    for step in range(1, 5):
        assert first[step] == pytest.approx(ref_losses[step], rel=1e-6), (step, first, ref_losses)
    for step in range(5, 9):
        assert losses[step] == pytest.approx(ref_losses[step], rel=1e-5), (step, losses, ref_losses)
    for n, want in ref_params.items():
        a, b = _comparable(n, params[n]), _comparable(n, want)
        assert ((a - b).norm() / b.norm()).item() <= 1e-5, n
