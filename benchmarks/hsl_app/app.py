"""Minimal plain Hydra app for the hydra-submitit-launcher side of the sweep-submission benchmark.

    python benchmarks/hsl_app/app.py -m strategy=single,dp,ddp,model_parallel 'seed=range(0,8)'

Each job trains a toy MLP for a couple of steps on random data (torch is imported inside the
task, as hpc-train's login side does not import it either). The benchmark submits the jobs held
(`--hold`) and cancels them, so the task never runs there.
"""

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def train(cfg: DictConfig) -> float:
    import torch

    torch.manual_seed(cfg.seed)
    features = 3 * cfg.image_size * cfg.image_size
    model = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(features, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.tensor(0.0)
    for _ in range(cfg.max_steps):
        images, labels = (
            torch.randn(cfg.batch_size, 3, cfg.image_size, cfg.image_size),
            torch.randint(0, 10, (cfg.batch_size,)),
        )
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    print(f"strategy={cfg.strategy.name} seed={cfg.seed} loss={loss.item():.4f}")
    return loss.item()


if __name__ == "__main__":
    train()
