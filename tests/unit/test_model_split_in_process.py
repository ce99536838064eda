"""Splitting a model into stages, in one process: split ResNets compute what the whole model computes, parameter
balance, layer timing leaves the model untouched, tied weights across stages refused."""

import copy

import pytest
import torch
import torchvision

from hpc_train.compute.parallel.partitioning import flatten_layers, layer_times, partition
from hpc_train.compute.parallel.staged_model import build_staged, split_model
from hpc_train.compute.runtime.refusal import Refusal
from tests.support.tied_net import TiedNet


def test_layer_times_leave_the_model_untouched():
    """balance=time runs each layer forward and backward on a copy: no batch-norm statistics or gradients change."""
    model = _resnet18().train()
    before = copy.deepcopy(model.state_dict())
    times = layer_times(flatten_layers(model), torch.randn(4, 3, 32, 32))
    assert len(times) == len(flatten_layers(model)) and min(times) > 0
    after = model.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)  # running_mean/var, num_batches_tracked too
    assert all(p.grad is None for p in model.parameters())


def test_tied_weights_split_across_stages_are_refused_naming_both_names():
    """One parameter in two layers cannot live on two devices or ranks: cut between its users, it is refused."""
    model = TiedNet(image_size=4, hidden=8, num_classes=3)
    with pytest.raises(Refusal, match=r"`strategy.balance`: 'mid.weight' and 'out.weight' are one parameter"):
        split_model(model, 2, "params", split_points=["out"])  # mid in stage 0, out in stage 1
    stages = split_model(model, 2, "params", split_points=["head"])  # both users in stage 0: fine
    assert len(stages) == 2
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    b.weight = a.weight
    chain = torch.nn.Sequential(a, torch.nn.Tanh(), torch.nn.Linear(4, 4), b)
    with pytest.raises(Refusal, match=r"'0.weight' and '3.weight' are one parameter .* stage 0 and stage 1"):
        split_model(chain, 2, [2, 2])


def _resnet18():
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10)


@pytest.mark.parametrize("stages, chunks", [(2, 1), (3, 1), (4, 1), (2, 4), (3, 2)])
def test_resnet18_split_outputs_equal_unsplit(stages, chunks):
    model = _resnet18().eval()
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        staged = build_staged(
            copy.deepcopy(model), [torch.device("cpu")], stages, "params", chunks, freeze_batchnorm=False
        ).eval()
        got = staged(x)
    assert len(staged.stages) == stages
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stages, chunks", [(2, 1), (3, 4)])
def test_resnet18_split_gradients_equal_with_frozen_batchnorm(stages, chunks):
    model = _resnet18()
    staged = build_staged(copy.deepcopy(model), [torch.device("cpu")], stages, "params", chunks, freeze_batchnorm=True)
    model.eval()  # frozen batch norm == running statistics
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.nn.functional.cross_entropy(staged(x), y).backward()
    split = [p.grad for p in staged.parameters()]
    assert len(split) == len(list(model.parameters()))
    for got, want in zip(split, [p.grad for p in model.parameters() if p.grad is not None]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_resnet50_param_balance(stages):
    model = torchvision.models.resnet50(num_classes=1000)
    layers = flatten_layers(model)
    weights = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    counts = partition(weights, stages)
    ideal = sum(weights) / stages
    start = 0
    for count in counts:
        assert sum(weights[start : start + count]) <= 1.5 * ideal
        start += count
    assert sum(counts) == len(layers)
