"""strata.torch: PyTorch optimizers whose step runs in stratad (ZeRO-Offload;
ZeRO-3 and Infinity with module hooks), and st.initialize for DeepSpeed configs.

    import strata.torch as st
    opt = st.OffloadAdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    model, opt = st.initialize(model, config="ds_config.json")
"""
from strata.torch.optimizer import OffloadAdagrad, OffloadAdam, OffloadAdamW, OffloadLion
from strata.torch.config import initialize, resolve_auto
from strata.torch.schedulers import WarmupCosineLR, WarmupDecayLR, WarmupLR
from strata.torch.zero3 import Zero3Adagrad, Zero3Adam, Zero3AdamW, Zero3Lion


def decay_groups(model, weight_decay, no_decay=("bias",)):
    """The usual two param groups: weight decay on matrices, none on biases,
    norms and other 1-d params (or names containing a `no_decay` entry)."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim < 2 or any(n in name for n in no_decay):
            rest.append(p)
        else:
            decay.append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


__all__ = ["OffloadAdamW", "OffloadAdam", "OffloadAdagrad", "OffloadLion", "initialize", "resolve_auto",
           "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "decay_groups",
           "Zero3AdamW", "Zero3Adam", "Zero3Adagrad", "Zero3Lion"]
