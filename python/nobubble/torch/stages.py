"""From a model cut into chunks to this rank's ``PipelineStage`` objects for a plan.

A plan fixes how many stages there are and which rank runs which (linear: rank r runs
stage r; V: rank r runs stages r and 2p−1−r). The user's model is a list of chunks (or
of layers); these helpers cut it into the plan's stages and build the ``PipelineStage``
objects for ``plan.stages_of(rank)``, so the rest is PyTorch's own API.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from nobubble.torch._compat import PipelineStage


def split_layers(layers: Sequence[nn.Module], num_chunks: int) -> list[nn.Module]:
    """Cuts ``layers`` (run in sequence) into ``num_chunks`` contiguous chunks.

    When the counts are equal the layers are the chunks; otherwise each chunk is an
    ``nn.Sequential`` of neighbouring layers, the counts as equal as possible (earlier chunks
    get the extra layer). Balance by cost with :func:`nobubble.torch.profile` and your own
    cut if the layers differ much (an embedding or LM head is not a transformer block).
    """
    layer_list = list(layers)
    if num_chunks < 1:
        raise ValueError(f"num_chunks must be at least 1, got {num_chunks}")
    if len(layer_list) < num_chunks:
        raise ValueError(
            f"cannot cut {len(layer_list)} layers into {num_chunks} stages; give at least one "
            "layer per stage (use a plan with fewer stages or a finer list of layers)"
        )
    if len(layer_list) == num_chunks:
        return layer_list
    base, extra = divmod(len(layer_list), num_chunks)
    chunks: list[nn.Module] = []
    start = 0
    for k in range(num_chunks):
        size = base + (1 if k < extra else 0)
        chunks.append(nn.Sequential(*layer_list[start : start + size]))
        start += size
    return chunks


def stage_modules(
    chunks_or_layers: Sequence[nn.Module], plan: Any, rank: int | None = None
) -> dict[int, nn.Module]:
    """The modules ``rank`` must run under ``plan``: ``{stage_index: module}``.

    ``chunks_or_layers`` is the whole model in pipeline order: either ``plan.num_stages``
    chunks, or more layers, cut by :func:`split_layers` — or, when the planner chose the
    cut (``plan.layer_split``), the ``[embedding, *blocks, head]`` layers it was planned
    from (:func:`cut_by_layer_split`). ``rank`` defaults to this process's rank in the
    default process group.
    """
    if rank is None:
        rank = dist.get_rank() if dist.is_initialized() else 0
    if not 0 <= rank < plan.num_ranks:
        raise ValueError(f"rank {rank} is not a rank of the plan (it has {plan.num_ranks})")
    split = getattr(plan, "layer_split", None)
    if split is not None:
        chunks = cut_by_layer_split(chunks_or_layers, split)
    else:
        chunks = split_layers(chunks_or_layers, plan.num_stages)
    return {s: chunks[s] for s in plan.stages_of(rank)}


def cut_by_layer_split(layers: Sequence[nn.Module], split: Sequence[int]) -> list[nn.Module]:
    """Cuts ``[embedding, *blocks, head]`` as a plan's ``layer_split`` says.

    ``split[s]`` is the number of blocks of stage s; the embedding joins stage 0 and the
    head the last stage (a stage may then hold only the embedding or only the head).
    """
    layer_list = list(layers)
    if sum(split) != len(layer_list) - 2:
        raise ValueError(
            f"the plan's layer split {list(split)} places {sum(split)} blocks, but "
            f"{len(layer_list)} layers are {len(layer_list) - 2} blocks between an embedding "
            "and a head; pass the same layers that were profiled for the plan"
        )
    chunks: list[nn.Module] = []
    start = 1
    for s, blocks in enumerate(split):
        part = layer_list[start : start + blocks]
        start += blocks
        if s == 0:
            part.insert(0, layer_list[0])
        if s == len(split) - 1:
            part.append(layer_list[-1])
        chunks.append(nn.Sequential(*part))
    return chunks


def build_stages(
    chunks_or_layers: Sequence[nn.Module],
    plan: Any,
    *,
    device: torch.device | str | None = None,
    rank: int | None = None,
    group: dist.ProcessGroup | None = None,
) -> list[PipelineStage]:
    """This rank's ``PipelineStage`` objects for ``plan``, modules moved to ``device``.

    ``rank`` is the rank in ``group`` (default: this process's rank in it). Stage metadata
    (shapes) is inferred by PyTorch at the first step.
    """
    if rank is None:
        rank = dist.get_rank(group) if dist.is_initialized() else 0
    dev = torch.device(device) if device is not None else torch.device("cpu")
    modules = stage_modules(chunks_or_layers, plan, rank)
    return [
        PipelineStage(module.to(dev), stage, plan.num_stages, dev, group=group)
        for stage, module in sorted(modules.items())
    ]
