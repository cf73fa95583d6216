"""Megatron-shaped models for the refit tests and benchmark, and their expected weights.

A model is a stack of blocks, each Megatron's own ``ColumnParallelLinear`` (``fc1``) and
``RowParallelLinear`` (``fc2``), built on the CPU (``use_cpu_initialization=True``) over gloo
groups, held by the ranks a :class:`Layout` names. The weights a test expects are computed
here from the layout alone (:func:`global_weight`, :func:`expected_shard`), never from what
Megatron's planner or executor did: a source shard is filled from the global tensor, and a
destination shard must equal the global tensor cut by the destination's layout.

Needs torch.distributed initialized (gloo) and megatron-core importable; every rank of the
world builds every layout's groups together (``torch.distributed.new_group`` is collective).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

# Which dimension each parameter is cut along by tensor parallelism (None: replicated). The
# layers' own partition_dim attributes must agree (checked by check_partition_dims).
PARTITION_DIM: Dict[str, Optional[int]] = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None}


@dataclass(frozen=True)
class Layout:
    """A model's parallel layout: ``ranks`` (global ranks holding it, in Megatron's order:
    tensor-parallel fastest, then data-parallel, then pipeline stage), ``tp`` and ``pp``
    (data-parallel size: what remains)."""

    ranks: Tuple[int, ...]
    tp: int = 1
    pp: int = 1

    @property
    def dp(self) -> int:
        return len(self.ranks) // (self.tp * self.pp)

    def position(self, rank: int) -> Optional[Tuple[int, int, int]]:
        """(tp rank, dp rank, pipeline stage) of a global rank, None if it holds no part."""
        if rank not in self.ranks:
            return None
        i = self.ranks.index(rank)
        return i % self.tp, (i // self.tp) % self.dp, i // (self.tp * self.dp)

    def groups(self) -> Dict[str, List[List[int]]]:
        """Every tp, dp and pp group of this layout, as lists of global ranks."""
        found: Dict[str, List[List[int]]] = {"tp": [], "dp": [], "pp": []}
        keyed: Dict[Tuple[str, Tuple[int, int]], List[int]] = {}
        for rank in self.ranks:
            tp, dp, pp = self.position(rank)  # type: ignore[misc]
            for kind, key in (("tp", (dp, pp)), ("dp", (tp, pp)), ("pp", (tp, dp))):
                keyed.setdefault((kind, key), []).append(rank)
        for (kind, _), members in keyed.items():
            found[kind].append(members)
        return found


def global_weight(layer: int, name: str, hidden: int, ffn: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The full (unsharded) value of parameter ``name`` of global layer ``layer``: distinct
    integers, exact in float32 and (for small sizes) in bfloat16's 8 bits of mantissa only
    modulo rounding -- tests use float32."""
    shape = {"fc1.weight": (ffn, hidden), "fc1.bias": (ffn,), "fc2.weight": (hidden, ffn), "fc2.bias": (hidden,)}[name]
    offset = (layer * 4 + sorted(PARTITION_DIM).index(name)) * 100_000
    count = 1
    for size in shape:
        count *= size
    return (torch.arange(count, dtype=torch.float64) + offset).reshape(shape).to(dtype)


def expected_shard(layout: Layout, rank: int, layer: int, name: str, hidden: int, ffn: int,
                   dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """What rank ``rank`` holds of ``name`` of global layer ``layer`` in ``layout``."""
    full = global_weight(layer, name, hidden, ffn, dtype)
    position = layout.position(rank)
    assert position is not None
    tp_rank = position[0]
    dim = PARTITION_DIM[name]
    if dim is None or layout.tp == 1:
        return full
    return full.chunk(layout.tp, dim=dim)[tp_rank].clone()


def layers_of_stage(layout: Layout, stage: int, num_layers: int) -> range:
    per_stage = num_layers // layout.pp
    return range(stage * per_stage, (stage + 1) * per_stage)


class Block(torch.nn.Module):
    """One layer: Megatron's ColumnParallelLinear then RowParallelLinear."""

    def __init__(self, layer_number: int, hidden: int, ffn: int, config: Any, tp_group: Any) -> None:
        super().__init__()
        from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

        self.layer_number = layer_number  # global, 1-indexed: what the planner's PP renaming reads
        init = torch.nn.init.zeros_
        self.fc1 = ColumnParallelLinear(hidden, ffn, config=config, init_method=init, bias=True,
                                        gather_output=False, tp_group=tp_group)
        self.fc2 = RowParallelLinear(ffn, hidden, config=config, init_method=init, bias=True,
                                     input_is_parallel=True, skip_bias_add=False, tp_group=tp_group)


class Decoder(torch.nn.Module):
    def __init__(self, blocks: List[Block]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(blocks)


class StackModel(torch.nn.Module):
    """``decoder.layers.<local index>.fc{1,2}.{weight,bias}``, with the ``pg_collection`` and
    ``config`` Megatron's planner and ``swap_model_weights`` read."""

    def __init__(self, blocks: List[Block], pg_collection: Any, config: Any) -> None:
        super().__init__()
        self.decoder = Decoder(blocks)
        self.pg_collection = pg_collection
        self.config = config


def build_groups(layouts: List[Layout]) -> List[Dict[str, Dict[Tuple[int, ...], Any]]]:
    """Every layout's gloo groups, made in the same order on every rank (collective)."""
    made = []
    for layout in layouts:
        groups: Dict[str, Dict[Tuple[int, ...], Any]] = {}
        for kind, members_list in layout.groups().items():
            for members in members_list:
                groups.setdefault(kind, {})[tuple(members)] = dist.new_group(members, backend="gloo")
        made.append(groups)
    return made


def build_model(layout: Layout, groups: Dict[str, Dict[Tuple[int, ...], Any]], num_layers: int, hidden: int,
                ffn: int, dtype: torch.dtype = torch.float32, fill: Optional[float] = None) -> StackModel:
    """This rank's part of a model in ``layout`` (no parameters on a rank outside it): the
    global weights' shards (``fill`` None), or every element ``fill``."""
    from megatron.core.model_parallel_config import ModelParallelConfig
    from megatron.core.process_groups_config import ProcessGroupCollection

    rank = dist.get_rank()
    config = ModelParallelConfig(tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
                                 use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype)
    config.num_moe_experts = None  # what swap_model_weights reads of a language model's config
    position = layout.position(rank)
    if position is None:
        return StackModel([], ProcessGroupCollection(), config)

    def mine(kind: str) -> Any:
        return next(group for members, group in groups[kind].items() if rank in members)

    pg_collection = ProcessGroupCollection(tp=mine("tp"), dp=mine("dp"), pp=mine("pp"))
    stage = position[2]
    blocks = [Block(layer + 1, hidden, ffn, config, pg_collection.tp)
              for layer in layers_of_stage(layout, stage, num_layers)]
    model = StackModel(blocks, pg_collection, config)
    with torch.no_grad():
        for local, layer in enumerate(layers_of_stage(layout, stage, num_layers)):
            for name in PARTITION_DIM:
                param = model.get_parameter(f"decoder.layers.{local}.{name}")
                if fill is None:
                    param.copy_(expected_shard(layout, rank, layer, name, hidden, ffn, dtype))
                else:
                    param.fill_(fill)
    return model


def check_partition_dims(model: StackModel) -> None:
    """The layers' own tensor-parallel attributes agree with PARTITION_DIM."""
    for name, param in model.named_parameters():
        short = ".".join(name.split(".")[-2:])
        dim = PARTITION_DIM[short]
        if dim is None:
            assert not getattr(param, "tensor_model_parallel", False), name
        else:
            assert getattr(param, "tensor_model_parallel", False) and param.partition_dim == dim, name


def mismatches(model: StackModel, layout: Layout, num_layers: int, hidden: int, ffn: int,
               dtype: torch.dtype = torch.float32) -> List[str]:
    """The parameters of this rank's part of ``model`` that differ from the expected shards."""
    rank = dist.get_rank()
    position = layout.position(rank)
    if position is None:
        return []
    wrong = []
    for local, layer in enumerate(layers_of_stage(layout, position[2], num_layers)):
        for name in PARTITION_DIM:
            got = model.get_parameter(f"decoder.layers.{local}.{name}").detach()
            want = expected_shard(layout, rank, layer, name, hidden, ffn, dtype)
            if got.shape != want.shape or not torch.equal(got, want):
                wrong.append(f"rank {rank} layer {layer} {name}")
    return wrong


#: The test scenarios: (source layout, destination layout, layers) by name and world size.
def scenario(name: str, world: int) -> Tuple[Layout, Layout, int]:
    everyone = tuple(range(world))
    if name == "tp2_to_tp1":  # colocated: the destination (TP1, replicated) on every rank
        return Layout(everyone, tp=2), Layout(everyone, tp=1), 2
    if name == "tp2_to_tp1_apart":  # not colocated: source on ranks 0-1, destination on the rest
        return Layout((0, 1), tp=2), Layout(tuple(range(2, world)), tp=1), 2
    if name == "tp2pp2_to_tp1dp4":  # colocated, 4 ranks
        return Layout(everyone, tp=2, pp=2), Layout(everyone, tp=1), 4
    if name == "tp1_to_tp1":  # one process: every op is a same-rank copy
        return Layout(everyone), Layout(everyone), 2
    if name == "tp1_to_tp1_apart":  # 2 ranks, not colocated: rank 0's model into rank 1's
        return Layout((0,)), Layout((1,)), 2
    raise ValueError(f"unknown scenario {name!r}")
