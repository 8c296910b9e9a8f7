"""Time each step of indexer-driven sparse attention at decode (one query, 46K context) on the
GPU: the indexer, the position selection (and torch.topk inside it, sorted and not), and the
attention, each replayed in a CUDA graph, to see where a decode step's attention time goes.

    python scripts/time_attention_steps.py [--context 46000]
"""

from __future__ import annotations

import argparse

import torch
import triton.testing

from kernels.attention import VARIANTS
from workbench.presets import get_preset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--context", type=int, default=46_000)
    args = parser.parse_args()
    s = get_preset("dsv4-flash-tp2").rank_shapes()
    dev, length = torch.device("cuda"), args.context
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.bfloat16)

    q_idx, w = randn(1, s.index_heads, s.index_dim), randn(1, s.index_heads).float()
    k_idx, kv, q = (
        randn(length, s.index_dim),
        randn(length, s.head_dim),
        randn(1, s.q_heads, s.head_dim),
    )
    pos = torch.tensor([length - 1], device=dev)
    v = VARIANTS["triton"]
    scores = v.indexer_scores(q_idx, w, k_idx, pos)
    index = v.select_positions(scores, pos, s.index_topk, s.window)
    steps = {
        "indexer": lambda: v.indexer_scores(q_idx, w, k_idx, pos),
        "select_positions": lambda: v.select_positions(scores, pos, s.index_topk, s.window),
        "topk sorted": lambda: scores.topk(s.index_topk, dim=-1),
        "topk unsorted": lambda: scores.topk(s.index_topk, dim=-1, sorted=False),
        "sparse_attention": lambda: v.attend(q, kv, index),
    }
    for name, fn in steps.items():
        us = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
        print(f"{name:>18}: {us:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
