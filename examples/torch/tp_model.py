"""A small GPT-style transformer whose layers are tensor- and sequence-
parallel through mc2.nn, or plain torch when no group is given.

With a tensor-parallel group of p ranks (sequence parallelism, as
Megatron-LM): every activation between the attention and MLP blocks is this
rank's shard of the sequence, [s, batch, hidden] with s = S / p (the first
S % p ranks one row more); LayerNorm, residuals, the embedding and the
output head run on that shard; each block's first projection
(ColumnParallelLinear) gathers the sequence while it multiplies, and its
second (RowParallelLinear) multiplies while it reduce-scatters back to
shards. Attention heads are split over the ranks (heads % p == 0): the QKV
weight is laid out head by head, so a rank's block of QKV columns is its
heads' queries, keys and values.

Without a group the same model, with the same weights for the same seed,
runs in one process with torch.nn.Linear layers: the reference the
parallel model is checked and timed against. Parameters that see only a
sequence shard (embeddings, LayerNorms, the head) need their gradients
summed over the TP group after backward: `sequence_parallel_params()`
lists them for mc2.nn.allreduce_grads.

The forward's torch computation between the fused operators (embedding,
LayerNorms, attention, GELU, head) is recorded as compute spans for
mc2.trace (when it records; the backward's is not: autograd runs it).
"""

import math

import torch
import torch.nn.functional as F

import mc2.nn as mnn
from mc2.trace import span


def _linear(kind, full, tp, opts):
    """A layer computing `full` (a torch.nn.Linear): itself without a
    group, else this rank's column- or row-parallel block of it."""
    if tp is None:
        return full
    cls = mnn.ColumnParallelLinear if kind == "column" else mnn.RowParallelLinear
    return cls.from_linear(full, group=tp, **opts)


class Block(torch.nn.Module):
    """Pre-LayerNorm attention (causal) and GELU MLP, each with a residual."""

    def __init__(self, hidden, heads, ffn, tp=None, tp_size=1, **opts):
        super().__init__()
        if hidden % heads or heads % tp_size:
            raise ValueError(f"hidden {hidden} must divide by heads {heads}, and heads by the "
                             f"TP size {tp_size}")
        self.heads_local, self.head_dim = heads // tp_size, hidden // heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(hidden), torch.nn.LayerNorm(hidden)
        # Every full layer is made (same RNG draws in every mode), then sharded.
        self.qkv = _linear("column", torch.nn.Linear(hidden, 3 * hidden), tp, opts)
        self.proj = _linear("row", torch.nn.Linear(hidden, hidden), tp, opts)
        self.fc1 = _linear("column", torch.nn.Linear(hidden, ffn), tp, opts)
        self.fc2 = _linear("row", torch.nn.Linear(ffn, hidden), tp, opts)

    def attention(self, qkv):
        seq, batch = qkv.shape[0], qkv.shape[1]
        # [S, batch, heads, 3, dh] -> three [batch, heads, S, dh]
        qkv = qkv.reshape(seq, batch, self.heads_local, 3, self.head_dim)
        q, k, v = (qkv[:, :, :, i].permute(1, 2, 0, 3) for i in range(3))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        causal = torch.ones(seq, seq, dtype=torch.bool).triu(1)
        probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
        ctx = torch.matmul(probs, v)  # [batch, heads, S, dh]
        return ctx.permute(2, 0, 1, 3).reshape(seq, batch, self.heads_local * self.head_dim)

    def forward(self, x):
        with span("layernorm"):
            h = self.ln1(x)
        h = self.qkv(h)
        with span("attention"):
            h = self.attention(h)
        x = x + self.proj(h)
        with span("layernorm"):
            h = self.ln2(x)
        h = self.fc1(h)
        with span("gelu"):
            h = F.gelu(h)
        return x + self.fc2(h)


class TinyGPT(torch.nn.Module):
    """Token embedding + positions, `layers` Blocks, LayerNorm, vocabulary head.

    forward(tokens [S or s, batch]) -> logits [S or s, batch, vocab]: with a
    group, tokens and logits are this rank's sequence shard (`first` is
    its first position, for the position embedding)."""

    def __init__(self, vocab, hidden, heads, ffn, layers, max_seq, tp=None, tp_size=1, **opts):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Embedding(max_seq, hidden)
        self.blocks = torch.nn.ModuleList(
            Block(hidden, heads, ffn, tp, tp_size, **opts) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, tokens, first=0):
        with span("embedding"):
            positions = torch.arange(first, first + tokens.shape[0])
            x = self.tok(tokens) + self.pos(positions)[:, None, :]
        for block in self.blocks:
            x = block(x)
        with span("head"):
            return self.head(self.ln(x))

    def sequence_parallel_params(self):
        """The parameters that see only this rank's sequence shard."""
        skip = (mnn.ColumnParallelLinear, mnn.RowParallelLinear)
        out = []
        for module in self.modules():
            if not isinstance(module, skip):
                out.extend(module.parameters(recurse=False))
        return out
