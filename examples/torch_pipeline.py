"""Train a small byte-level GPT with PyTorch's pipeline runtime under a nobubble plan.

    torchrun --nproc-per-node 2 examples/torch_pipeline.py [--steps 6] [--trace trace.json]
        [--timeline-svg last-step.svg]

Runs on CPU with gloo (one thread per rank). Every rank builds the whole (small) model cut
into 2p chunks, profiles the chunks (F, I, W times and activation memory), and rank 0 plans
``zb-auto`` on the averaged profile: both the linear layout (pairs of chunks per rank) and
the V layout (one chunk per stage) are planned and the faster kept. Each rank then builds
the ``PipelineStage`` objects the plan gives it and trains; the last step's measured
timeline is compared with the plan's prediction.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nobubble.torch as nbt
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Embed(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(seq_len, hidden)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
        self.up, self.down = (
            nn.Linear(hidden, 4 * hidden),
            nn.Linear(4 * hidden, hidden),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Head(nn.Module):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.ln, self.out = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def gpt_chunks(
    num_chunks: int, blocks: int, hidden: int, heads: int, seq_len: int
) -> list[nn.Module]:
    """The GPT cut into ``num_chunks`` chunks: the embedding rides with the first blocks and
    the LM head with the last ones; every rank builds the same initial weights."""
    torch.manual_seed(0)
    vocab = 256  # bytes
    layers = [Block(hidden, heads) for _ in range(blocks)]
    sizes = [
        blocks // num_chunks + (k < blocks % num_chunks) for k in range(num_chunks)
    ]
    chunks: list[nn.Module] = []
    for k, size in enumerate(sizes):
        part: list[nn.Module] = [layers.pop(0) for _ in range(size)]
        if k == 0:
            part.insert(0, Embed(vocab, hidden, seq_len))
        if k == num_chunks - 1:
            part.append(Head(hidden, vocab))
        chunks.append(nn.Sequential(*part))
    return chunks


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), target.flatten())


def batches(
    batch: int, seq_len: int, steps: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random windows of this script's own source: text to learn, no download."""
    data = torch.tensor(list(Path(__file__).read_bytes()), dtype=torch.long)
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(steps):
        starts = torch.randint(
            0, data.numel() - seq_len - 1, (batch,), generator=g
        ).tolist()
        w = torch.stack([data[s : s + seq_len + 1] for s in starts])
        out.append((w[:, :-1], w[:, 1:]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--blocks", type=int, default=4, help="at least 2p")
    parser.add_argument("--schedule", default="zb-auto")
    parser.add_argument(
        "--mem-limit",
        default=None,
        help="e.g. 2.0 (× M_B), 64MiB, or 'free': within what each rank's device has free",
    )
    parser.add_argument(
        "--trace", type=Path, default=None, help="write a Perfetto trace"
    )
    parser.add_argument(
        "--timeline-svg",
        type=Path,
        default=None,
        help="draw the last step as measured above the plan (an SVG picture)",
    )
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    m, mb = args.microbatches, args.microbatch_size
    say = print if rank == 0 else (lambda *a, **k: None)

    # The model, cut into 2p chunks (the V layout's stages; the linear layout pairs them).
    chunks = gpt_chunks(
        2 * world, max(args.blocks, 2 * world), args.hidden, 4, args.seq_len
    )
    data = batches(m * mb, args.seq_len, args.steps)
    x0, y0 = data[0]

    # 1. Profile every chunk on this rank's device, 2. plan on rank 0 for everyone.
    prof = nbt.profile(chunks, (x0[:mb], y0[:mb]), loss_fn)
    mem_limit = None if args.mem_limit is None else _limit(args.mem_limit)
    if mem_limit == "free":
        # Each rank will add AdamW's two moments and the gradients of its share of the
        # weights (about 1/world of them) beside the activations.
        weights = sum(
            p.numel() * p.element_size() for c in chunks for p in c.parameters()
        )
        mem_limit = nbt.FreeMemory(reserve=3 * weights // world)
    plan = nbt.agreed_plan(
        args.schedule, microbatches=m, costs=prof, mem_limit=mem_limit
    )
    say(
        f"profile of {len(chunks)} chunks (microbatch {mb}×{args.seq_len} bytes):\n{prof.summary()}"
    )
    say(
        f"plan {plan.schedule}: {plan.num_stages} stages on {world} ranks "
        f"(rank 0 runs stages {plan.stages_of(0)}), predicted step {plan.makespan:.1f} ms, "
        f"bubble rate {100 * (plan.bubble_rate or 0):.1f}%"
    )

    # 3. This rank's stages, the schedule, the optimizer: PyTorch from here on.
    stages = nbt.build_stages(chunks, plan, device="cpu")
    schedule = nbt.PlannedSchedule(
        stages, m, loss_fn, plan=plan, measure=True, replan_after=2
    )
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-3)
    has_first = any(s.is_first for s in stages)
    has_last = any(s.is_last for s in stages)

    for step, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        schedule.step(
            *((x,) if has_first else ()),
            target=y if has_last else None,
            losses=losses,
            return_outputs=False,  # the logits are not needed, only the losses
        )
        opt.step()
        loss = torch.stack(losses).detach().mean() if losses else torch.tensor(0.0)
        dist.all_reduce(loss)  # only the rank with the last stage has a loss
        measured = schedule.measurements[-1]
        say(
            f"step {step + 1}/{args.steps}  loss {loss.item():.4f}  "
            f"{m * mb * args.seq_len / measured.step_ms * 1e3:8.0f} tok/s  "
            f"step {measured.step_ms:.1f} ms (planned {plan.makespan:.1f} ms)"
        )

        # The re-plan comes after step 2's measurement: steps 3.. run the new plan.
        if step + 1 == 2 and schedule.replanned is not None:
            new = schedule.replanned
            say(
                "re-planned on the measured pass times, the runtime's time between passes "
                f"({new.inputs['overhead']:.3f} ms) and the link's latency beyond it "
                f"({new.inputs.get('comm', 0.0):.3f} ms): predicted step {new.makespan:.1f} ms"
            )
            plan = new

    last = schedule.measurements[-1]
    say(f"last step: {last.summary()}")
    if args.trace is not None and rank == 0:
        nbt.write_trace(args.trace, schedule.measurements[1:])
        say(f"wrote the measured timeline of steps 2..{args.steps} to {args.trace}")
    if args.timeline_svg is not None and rank == 0:
        args.timeline_svg.write_text(schedule.timeline_svg())
        say(f"drew the last step against the plan in {args.timeline_svg}")
    dist.destroy_process_group()


def _limit(text: str) -> float | int | str:
    try:
        return float(text)
    except ValueError:
        return text


if __name__ == "__main__":
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    main()
