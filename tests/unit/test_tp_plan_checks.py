"""What a tensor-parallel plan cannot do to a model is refused at the rank's start, naming the module and the fix
(check_plan reads the model only: no process group)."""

from __future__ import annotations

import pytest
import torch.nn as nn

from hpc_train.compute.parallel.tensor_parallel import check_plan, matches
from hpc_train.compute.runtime.refusal import Refusal


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, fused: bool = False) -> None:
        super().__init__()
        self.n_heads = n_heads
        if fused:
            self.c_attn = nn.Linear(dim, 3 * dim)
        else:
            self.wq, self.wk, self.wv = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.wo = nn.Linear(dim, dim)


class Decoder(nn.Module):
    def __init__(self, dim: int = 12, n_heads: int = 4, fused: bool = False) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(10, dim)
        self.layers = nn.ModuleList([nn.ModuleDict({"attn": Attention(dim, n_heads, fused)}) for _ in range(2)])
        self.norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, 10)


PLAN = {"layers.*.attn.w[qkv]": "colwise", "layers.*.attn.wo": "rowwise", "output": "colwise_gather"}


def refusal(model: nn.Module, plan: dict, tp: int) -> str:
    with pytest.raises(Refusal) as err:
        check_plan(model, plan, tp)
    return str(err.value)


def test_patterns_match_module_names_with_fnmatch():
    found = matches(Decoder(), PLAN)
    assert found["layers.*.attn.w[qkv]"] == [f"layers.{i}.attn.w{x}" for i in range(2) for x in "qkv"]
    check_plan(Decoder(), PLAN, 2)  # a plan this model takes: nothing refused


def test_a_pattern_that_matches_nothing_is_refused_with_the_models_names():
    message = refusal(Decoder(), {**PLAN, "layers.*.attention.wq": "colwise"}, 2)
    assert "`strategy.tp_plan`" in message and "'layers.*.attention.wq' matches no module" in message
    assert "'tok_embeddings'" in message and "Fix:" in message


def test_heads_the_tp_degree_does_not_divide_are_refused():
    message = refusal(Decoder(dim=12, n_heads=3), PLAN, 2)
    assert "`strategy.tp`" in message and "n_heads=3" in message and "1.5 heads" in message


def test_a_width_the_tp_degree_does_not_divide_is_refused():
    message = refusal(Decoder(dim=12, n_heads=3), {"output": "colwise_gather"}, 4)
    assert "'output' has 10 output features, which tp=4 does not divide" in message


def test_attention_with_q_k_v_in_one_linear_is_refused_naming_the_module_and_the_fix():
    message = refusal(Decoder(fused=True), {"layers.*.attn.c_attn": "colwise"}, 2)
    assert "'layers.0.attn.c_attn' holds q, k and v in one nn.Linear" in message
    assert "split it into three Linear layers" in message


def test_a_style_on_a_module_that_is_not_linear_or_embedding_is_refused():
    message = refusal(Decoder(), {"norm": "rowwise"}, 2)
    assert "'norm' is a LayerNorm" in message and "_target_" in message
