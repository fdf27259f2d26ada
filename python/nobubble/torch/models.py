"""A small byte-level GPT or Llama cut into layers, for tests, benchmarks and trying things out.

Deterministic from a seed, no downloads, no dropout (so pipelined and unpipelined runs can
be compared bit for bit). ``gpt_layers`` returns the model as a list of layers in order
(embedding, blocks, head) to cut with :func:`nobubble.torch.split_layers`. With
``arch="llama"`` the blocks are Llama's (RMSNorm, rotary positions, SwiGLU, grouped-query
attention, no biases), the shape of nobubble's ``train --arch llama``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    hidden: int = 64
    heads: int = 4
    blocks: int = 4
    seq_len: int = 32
    #: "gpt" or "llama".
    arch: str = "gpt"
    #: Llama: K/V heads (None: half the heads, as nobubble's default).
    kv_heads: int | None = None
    #: Llama: rotary base.
    rope_theta: float = 10_000.0

    @property
    def ffn(self) -> int:
        """MLP width: 4h for GPT; 8h/3 rounded up to 32 for Llama (nobubble's default)."""
        if self.arch == "llama":
            thirds = (8 * self.hidden + 2) // 3  # ⌈8h/3⌉
            return (thirds + 31) // 32 * 32
        return 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or (self.heads // 2 if self.heads % 2 == 0 else self.heads)


class Embedding(nn.Module):
    """Token plus (GPT) learned position embedding: byte ids (B, S) → activations (B, S, H)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq_len, cfg.hidden) if cfg.arch == "gpt" else None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.pos is None:
            return self.tok(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions, pairs (j, j + d/2) of each head (transformers' rotate_half)."""
    lo, hi = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-hi, lo), dim=-1) * sin


class LlamaBlock(nn.Module):
    """Llama block: RMSNorm, rotary grouped-query attention, SwiGLU MLP, no biases."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        h, d = cfg.hidden, cfg.hidden // cfg.heads
        self.heads, self.kv = cfg.heads, cfg.kv
        self.ln1 = nn.RMSNorm(h, eps=1e-5)
        self.qkv = nn.Linear(h, (cfg.heads + 2 * cfg.kv) * d, bias=False)
        self.proj = nn.Linear(h, h, bias=False)
        self.ln2 = nn.RMSNorm(h, eps=1e-5)
        self.gate_up = nn.Linear(h, 2 * cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, h, bias=False)
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2).float() / d)
        angles = torch.outer(torch.arange(cfg.seq_len).float(), inv).repeat(1, 2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(self.ln1(x)).split([h, self.kv * d, self.kv * d], dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k, v = (t.view(b, s, self.kv, d).transpose(1, 2) for t in (k, v))
        cos, sin = self.cos[:s], self.sin[:s]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        gate, up = self.gate_up(self.ln2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4× GELU MLP."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.up = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.down = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Head(nn.Module):
    """Final norm and LM head: activations → logits over the byte vocabulary."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln = (
            nn.LayerNorm(cfg.hidden) if cfg.arch == "gpt" else nn.RMSNorm(cfg.hidden, eps=1e-5)
        )
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt_layers(cfg: GPTConfig, seed: int = 0) -> list[nn.Module]:
    """[Embedding, Block × cfg.blocks, Head], initialised from ``seed``."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        layers: list[nn.Module] = [Embedding(cfg)]
        block = LlamaBlock if cfg.arch == "llama" else Block
        layers += [block(cfg) for _ in range(cfg.blocks)]
        layers.append(Head(cfg))
    finally:
        torch.random.set_rng_state(generator_state)
    return layers


def gpt_chunks(cfg: GPTConfig, num_chunks: int, seed: int = 0) -> list[nn.Module]:
    """The GPT cut into ``num_chunks`` chunks for a pipeline.

    The embedding joins the first block and the head the last (they are too small to be
    stages of their own in a small model); the blocks are spread as evenly as possible.
    Needs ``cfg.blocks >= num_chunks``.
    """
    if cfg.blocks < num_chunks:
        raise ValueError(f"{cfg.blocks} blocks cannot fill {num_chunks} chunks")
    layers = gpt_layers(cfg, seed)
    embed, blocks, head = layers[0], layers[1:-1], layers[-1]
    base, extra = divmod(len(blocks), num_chunks)
    chunks: list[nn.Module] = []
    start = 0
    for k in range(num_chunks):
        size = base + (1 if k < extra else 0)
        part: list[nn.Module] = list(blocks[start : start + size])
        start += size
        if k == 0:
            part.insert(0, embed)
        if k == num_chunks - 1:
            part.append(head)
        chunks.append(nn.Sequential(*part))
    return chunks


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy."""
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def byte_batches(
    text: bytes, batch: int, seq_len: int, steps: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` random (inputs, next-byte targets) batches of ``batch`` windows of ``text``."""
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    if data.numel() <= seq_len + 1:
        raise ValueError(f"text of {data.numel()} bytes is too short for windows of {seq_len}")
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, data.numel() - seq_len - 1, (batch,), generator=g)
        windows = torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])
        out.append((windows[:, :-1].contiguous(), windows[:, 1:].contiguous()))
    return out


SAMPLE_TEXT = (
    b"In the beginning God created the heaven and the earth. And the earth was without form, "
    b"and void; and darkness was upon the face of the deep. And the Spirit of God moved upon "
    b"the face of the waters. And God said, Let there be light: and there was light. And God "
    b"saw the light, that it was good: and God divided the light from the darkness. And God "
    b"called the light Day, and the darkness he called Night. And the evening and the morning "
    b"were the first day. And God said, Let there be a firmament in the midst of the waters, "
    b"and let it divide the waters from the waters. "
) * 4
