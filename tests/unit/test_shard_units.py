"""Which modules FSDP2 shards one by one (hpc_train.compute.parallel.sharding.shard_units) when the model's block
list holds few of its parameters (a small Llama-style model beside a large vocabulary), and when it has none. FSDP2
refuses a container without a forward (nn.ModuleList), and activation checkpointing would wrap a forward that never
runs: the units are blocks, never a list."""

from __future__ import annotations

import torch.nn as nn

from hpc_train.compute.parallel.sharding import shard_units


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.mix = nn.Linear(width, width)

    def forward(self, x):
        return x + self.mix(x)


class Gate(Block):
    """A block of another class: a list holding a Block and a Gate is no repeated block list."""


class WideVocabulary(nn.Module):
    """Embedding and head of 1000 x 8 around two blocks of 8 x 8: the blocks hold 7 % of the parameters; the
    forward reads the position table's weight itself, as the Llama example does (it must stay with the root)."""

    def __init__(self, layers: nn.ModuleList) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 8)
        self.positions = nn.Embedding(16, 8)
        self.layers = layers
        self.extra = nn.ModuleDict({"gate": nn.Linear(8, 8)})
        self.act = nn.ReLU()  # no parameters: no unit
        self.head = nn.Linear(8, 1000)

    def forward(self, ids):
        x = self.embed(ids) + self.positions.weight[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.head(self.extra["gate"](self.act(x)))


def test_a_block_list_holding_few_of_the_parameters_still_gives_the_units():
    model = WideVocabulary(nn.ModuleList([Block(8), Block(8)]))
    assert shard_units(model) == [model.layers[0], model.layers[1]]  # the rest (embeddings, head) with the root


def test_without_a_block_list_the_units_are_the_children_with_a_containers_members_not_the_container():
    model = WideVocabulary(nn.ModuleList([Block(8), Gate(8)]))
    units = shard_units(model)
    assert units == [model.embed, model.positions, model.layers[0], model.layers[1], model.extra["gate"], model.head]
    assert not any(isinstance(unit, (nn.ModuleList, nn.ModuleDict)) for unit in units)
