"""Transformers split into stages unmodified: optional forward arguments traced as their defaults, automatic
cuts between the blocks of a repeated block list, tied embeddings refused with strategy=ddp as the fix."""

import copy
import inspect
import logging
from typing import Iterator, List

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

from hpc_train.compute.parallel.staged_model import split_model
from hpc_train.compute.runtime.refusal import Refusal


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=10).eval()


def _chain(stages: List[nn.Module], x: torch.Tensor):
    with torch.no_grad():
        for stage in stages:
            x = stage(*x) if isinstance(x, tuple) else stage(x)
    return x


def _assert_chains_to(model: nn.Module, stages: List[nn.Module], x: torch.Tensor) -> None:
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(_chain(stages, x), expected, rtol=1e-5, atol=1e-5)


def _holds(stage: nn.Module, name: str) -> bool:
    return name in dict(stage.named_modules())


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def split_log() -> Iterator[List[str]]:
    """INFO messages of the hpc_train logger (attached directly: a run's logging setup may stop propagation)."""
    logger, handler = logging.getLogger("hpc_train"), _Messages()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.messages
    logger.removeHandler(handler)
    logger.setLevel(level)


# -- timm ViT: forward(x, attn_mask=None, is_causal=False) ------------------------------------
@pytest.mark.parametrize("batch", [2, 5])
def test_vit_split_at_named_block_equals_unsplit(batch):
    vit = _vit()
    stages = split_model(vit, 2, "params", ["blocks.6"])
    assert len(stages) == 2
    assert [len(inspect.signature(s.forward).parameters) for s in stages] == [1, 1]  # no attn_mask / is_causal input
    assert _holds(stages[0], "blocks.5") and not _holds(stages[0], "blocks.6") and _holds(stages[1], "blocks.6")
    torch.manual_seed(1)
    _assert_chains_to(vit, stages, torch.randn(batch, 3, 32, 32))


def test_vit_automatic_split_cuts_at_the_middle_block_and_says_so(split_log):
    vit = _vit()
    stages = split_model(vit, 2, "params")
    assert len(stages) == 2 and _holds(stages[1], "blocks.6") and not _holds(stages[0], "blocks.6")
    assert (
        "cutting VisionTransformer's block list 'blocks' (12 x Block) into 2 stages at blocks.6"
        " (balance=params: 6 + 6 blocks)" in split_log
    )
    assert _holds(stages[0], "patch_embed") and _holds(stages[1], "head")  # embeddings first, head last
    _assert_chains_to(vit, stages, torch.randn(5, 3, 32, 32))


def test_vit_explicit_block_counts(split_log):
    vit = _vit()
    stages = split_model(vit, 2, [3, 9])
    assert _holds(stages[0], "blocks.2") and not _holds(stages[0], "blocks.3") and _holds(stages[1], "blocks.3")
    assert any("at blocks.3 (balance=[3, 9]: 3 + 9 blocks)" in m for m in split_log), split_log
    _assert_chains_to(vit, stages, torch.randn(2, 3, 32, 32))


def test_vit_time_balanced_split():
    vit = _vit()
    x = torch.randn(4, 3, 32, 32)
    stages = split_model(vit, 2, "time", example=x[:2])
    assert len(stages) == 2
    _assert_chains_to(vit, stages, x)
    assert all(p.grad is None for p in vit.parameters())  # timed on copies
    assert not vit.training  # the capture forward restored every module's mode


def test_vit_three_stages(split_log):
    vit = _vit()
    stages = split_model(vit, 3, "params")
    assert len(stages) == 3 and any("at blocks.4, blocks.8 (balance=params: 4 + 4 + 4 blocks)" in m for m in split_log)
    _assert_chains_to(vit, stages, torch.randn(3, 3, 32, 32))


def test_vit_block_list_limits_are_refused():
    vit = _vit()
    with pytest.raises(Refusal, match=r"`strategy.stages`: VisionTransformer's block list 'blocks' has 12 blocks"):
        split_model(vit, 13, "params")
    with pytest.raises(Refusal, match=r"`strategy.balance`: \[3, 8\] must list 2 positive block counts summing to 12"):
        split_model(vit, 2, [3, 8])


# -- a nanoGPT-shaped language model: tied token embedding and output layer ----------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim), heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(dim), CausalSelfAttention(dim, heads), nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, block_size: int = 16, dim: int = 32, heads: int = 2, tie: bool = True) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab, dim),
                wpe=nn.Embedding(block_size, dim),
                h=nn.ModuleList([Block(dim, heads) for _ in range(4)]),
                ln_f=nn.LayerNorm(dim),
            )
        )
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.transformer.wte.weight

    def forward(self, idx: torch.Tensor, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def test_language_model_with_tied_embedding_is_refused_naming_the_tie_and_ddp():
    torch.manual_seed(0)
    with pytest.raises(Refusal) as refused:
        split_model(TinyGPT(tie=True), 2, "params")
    message = str(refused.value)
    assert "'transformer.wte.weight' and 'lm_head.weight' are one parameter" in message
    assert "`strategy.balance`" in message and "Fix:" in message and "strategy=ddp" in message


def test_language_model_without_tie_splits_between_blocks(split_log):
    """targets=None is traced as its default: one token input, (logits, None) out of the last stage."""
    torch.manual_seed(0)
    gpt = TinyGPT(tie=False).eval()
    stages = split_model(gpt, 2, "params")
    assert any(
        "TinyGPT's block list 'transformer.h' (4 x Block) into 2 stages at transformer.h.2" in m for m in split_log
    )
    idx = torch.randint(0, 64, (3, 16))
    logits, loss = _chain(stages, idx)
    with torch.no_grad():
        torch.testing.assert_close(logits, gpt(idx)[0], rtol=1e-5, atol=1e-5)
    assert loss is None


# -- refusals ------------------------------------------------------------------------------------
class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) * mask
        return x


def test_forward_with_two_required_inputs_is_refused_naming_both():
    with pytest.raises(Refusal) as refused:
        split_model(TwoInputs(), 2, "params")
    message = str(refused.value)
    assert "`strategy.split_points`" in message and "2 required inputs (x, mask)" in message
    assert "Fix:" in message and "forward(self, x, mask=None)" in message and "strategy=ddp" in message


class OptionalExtras(TwoInputs):
    def forward(self, x: torch.Tensor, mask=None, scale: float = 1.0, *args, **kwargs) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) * scale
        return x


def test_optional_arguments_and_varargs_do_not_count_as_inputs():
    torch.manual_seed(0)
    model = OptionalExtras()
    stages = split_model(model, 3, "params")
    assert len(stages) == 3 and all(len(inspect.signature(s.forward).parameters) == 1 for s in stages)
    _assert_chains_to(model, stages, torch.randn(2, 4))


class NoBlockList(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_model_without_a_repeated_block_list_is_refused():
    with pytest.raises(Refusal, match=r"`strategy.split_points`: NoBlockList is neither .* repeated block list.*Fix:"):
        split_model(NoBlockList(), 2, "params")


class MostlyEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 16)
        self.blocks = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 16)])

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return x


def test_block_list_holding_less_than_half_the_parameters_is_refused():
    with pytest.raises(Refusal) as refused:
        split_model(MostlyEmbedding(), 2, "params")
    message = str(refused.value)
    assert "`strategy.split_points`" in message and "'blocks' (2 x Linear), holds only 3% of them" in message
    assert "Fix:" in message


# -- unchanged: nn.Sequential and torchvision ResNet ---------------------------------------------
def test_sequential_and_resnet_split_as_before():
    torch.manual_seed(0)
    chain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    stages = split_model(copy.deepcopy(chain), 2, "params")
    assert len(stages) == 2 and all(isinstance(s, nn.Sequential) for s in stages)
    _assert_chains_to(chain, stages, torch.randn(3, 4))
    resnet = torchvision.models.resnet18(num_classes=10).eval()
    stages = split_model(copy.deepcopy(resnet), 2, "params")
    assert len(stages) == 2 and all(isinstance(s, nn.Sequential) for s in stages)
    _assert_chains_to(resnet, stages, torch.randn(2, 3, 32, 32))
