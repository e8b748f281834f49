"""OffloadAdamW as the optimizer of a Hugging Face Trainer (with its cosine
schedule and gradient accumulation): the same losses and params as the
Trainer with torch.optim.AdamW."""
import tempfile

import torch
import torch.nn as nn

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
