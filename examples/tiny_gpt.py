"""A small GPT-style language model and the text it trains on, for strata's
Python tests and demo (scripts/train_gpt.sh). Nothing is downloaded: the text
is generated from a fixed seed.

    model = TinyGPT(vocab=len(VOCAB), dim=64, layers=2, heads=4, context=32)
    x, y = batch(tokens, step, rank, world, batch_size=8, context=32)
"""
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

_WORDS = ("the model reads a token and writes the next one while the daemon keeps its state on the host "
          "or on nvme and every rank sends its gradients then waits for the step to finish so that the "
          "loss goes down as training goes on").split()
VOCAB = sorted(set(" .".join(_WORDS) + " ."))


def make_text(n_chars=20000, seed=1234):
    """Sentences of words drawn with a fixed seed (a Markov chain over the word list)."""
    rng = random.Random(seed)
    out, size = [], 0
    while size < n_chars:
        length = rng.randint(4, 12)
        start = rng.randrange(len(_WORDS))
        words = [_WORDS[(start + i * rng.choice((1, 1, 1, 2))) % len(_WORDS)] for i in range(length)]
        sentence = " ".join(words) + ". "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)[:n_chars]


def encode(text):
    index = {c: i for i, c in enumerate(VOCAB)}
    return torch.tensor([index[c] for c in text], dtype=torch.long)


def batch(tokens, step, rank, world, batch_size, context, micro=0):
    """Rank `rank`'s micro-batch `micro` of `step`: deterministic windows of the text."""
    g = torch.Generator().manual_seed(((step * 1009 + micro) * 9176 + rank) & 0x7FFFFFFF)
    starts = torch.randint(0, tokens.numel() - context - 1, (batch_size,), generator=g)
    x = torch.stack([tokens[s:s + context] for s in starts.tolist()])
    y = torch.stack([tokens[s + 1:s + context + 1] for s in starts.tolist()])
    return x, y


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        # No bias: a key bias has an exactly zero gradient (softmax ignores a score shift shared by
        # all keys), so Adam would amplify its pure rounding noise into lr-sized steps and two
        # correct implementations could not be compared on it.
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab, dim=64, layers=2, heads=4, context=32, tie=False):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tie:
            # Tied embeddings, as GPT-2's and LLaMA's tie_word_embeddings: one param, two modules.
            self.head.weight = self.tok.weight
        self.hidden_size = dim

    def forward(self, x, y=None):
        t = x.shape[1]
        h = self.tok(x) + self.pos(torch.arange(t))
        for block in self.blocks:
            h = block(h)
        logits = self.head(self.ln(h))
        if y is None:
            return logits
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
