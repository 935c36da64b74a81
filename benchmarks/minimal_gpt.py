"""A minimal pure-PyTorch GPT: the floor that framework overhead is measured against.

Pre-norm blocks, one fused QKV projection, `F.scaled_dot_product_attention(is_causal=True)`, learned positions, a
final LayerNorm and an output head tied to the token embedding. No config object, no masks, no output classes: the
fewest operations that compute the same function as the Turner and GPT-2 language models at the same shapes.
Greedy decoding with a plain key/value cache is included so that generation has the same floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class MinimalGPTConfig:
    vocab_size: int = 65
    context: int = 64
    layers: int = 4
    heads: int = 4
    features: int = 128
    bias: bool = True
    dropout: float = 0.0
    eps: float = 1e-5


KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class Block(nn.Module):
    """x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: MinimalGPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.features, eps=cfg.eps, bias=cfg.bias)
        self.qkv = nn.Linear(cfg.features, 3 * cfg.features, bias=cfg.bias)
        self.proj = nn.Linear(cfg.features, cfg.features, bias=cfg.bias)
        self.ln2 = nn.LayerNorm(cfg.features, eps=cfg.eps, bias=cfg.bias)
        self.up = nn.Linear(cfg.features, 4 * cfg.features, bias=cfg.bias)
        self.down = nn.Linear(4 * cfg.features, cfg.features, bias=cfg.bias)
        self.dropout = cfg.dropout

    def attend(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        # A new token attends to every cached one; only a multi-token chunk without a cache needs the causal mask.
        causal = cache is None and n > 1
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        y = y.transpose(1, 2).reshape(b, n, d)
        return F.dropout(self.proj(y), p, self.training), (k, v)

    def forward(
        self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        a, kv = self.attend(self.ln1(x), cache)
        x = x + a
        h = self.down(F.gelu(self.up(self.ln2(x))))
        x = x + F.dropout(h, self.dropout if self.training else 0.0, self.training)
        return x, kv


class MinimalGPT(nn.Module):
    """Token + position embeddings, `layers` blocks, a final LayerNorm, a tied head."""

    def __init__(self, cfg: MinimalGPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.features)
        self.wpe = nn.Embedding(cfg.context, cfg.features)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.features, eps=cfg.eps, bias=cfg.bias)
        self.head = nn.Linear(cfg.features, cfg.vocab_size, bias=False)
        self.head.weight = self.wte.weight
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, KVCache]:
        """Logits for every position, the mean cross-entropy against `targets` (already shifted), the new cache."""
        start = 0 if cache is None else cache[0][0].shape[2]
        pos = torch.arange(start, start + idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if cache is None else cache[i])
            new_cache.append(kv)
        x = self.ln_f(x)
        if targets is None:
            return self.head(x[:, -1:]), None, new_cache
        logits = self.head(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss, new_cache

    @torch.no_grad()
    def generate_greedy(self, idx: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy decoding with a key/value cache: one full pass over the prompt, then one token at a time."""
        logits, _, cache = self(idx)
        out = [idx]
        for step in range(max_new_tokens):
            token = logits[:, -1].argmax(dim=-1, keepdim=True)
            out.append(token)
            if step + 1 < max_new_tokens:
                logits, _, cache = self(token, cache=cache)
        return torch.cat(out, dim=1)
