"""Every config in the shipped config dir (conf/) composes with Hydra's compose API, and unknown options/keys fail
there."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

from hpc_train.conf import CONFIG_DIR
from hpc_train.config import engine
from tests.support.paths import REPO

GROUPS = sorted(p.name for p in Path(CONFIG_DIR).iterdir() if p.is_dir() and not p.name.startswith("_"))


OPTIONS = [(group, f.stem) for group in GROUPS for f in sorted((Path(CONFIG_DIR) / group).glob("*.yaml"))]


# Values a user must give for some options (`???` in the YAML).
REQUIRED_VALUES = {
    "data=imagefolder": ["data.root=/data/imagenet", "data.num_classes=1000"],
    **{f"container={name}": ["container.image=/images/pytorch"] for name in ("apptainer", "pyxis", "oci")},
}


def test_config_dir_is_the_shipped_conf():
    assert Path(CONFIG_DIR) == REPO / "conf"
    assert {"strategy", "model", "data", "launcher", "cluster", "trainer", "resources"} <= set(GROUPS)


@pytest.mark.parametrize("group, option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes(group, option):
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        required = REQUIRED_VALUES.get(f"{group}={option}", [])
        cfg = compose(config_name="config", overrides=[f"{group}={option}", *required])
    container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    assert container[group] is not None
    assert cfg.strategy.name and cfg.model._target_ and cfg.data.train._target_
    engine.check_plain(engine.resolved(cfg))  # every resolved value passes its declaration (hpc_train/config/)


def test_unknown_group_option_fails_in_compose():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        with pytest.raises(MissingConfigException, match="strategy"):
            compose(config_name="config", overrides=["strategy=does_not_exist"])


def test_unknown_key_fails_in_compose():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        with pytest.raises(ConfigCompositionException, match="trainer.batchsize"):
            compose(config_name="config", overrides=["trainer.batchsize=3"])


def test_the_python_api_composes_a_mapping_given_whole():
    from hpc_train import api

    cfg = api.compose(
        [
            "launcher=slurm",
            "cluster.extra={exclusive:true}",
            "trainer.loss={_target_:torch.nn.CrossEntropyLoss,label_smoothing:0.1}",
        ]
    )
    assert cfg.cluster.extra == {"exclusive": True} and cfg.trainer.loss.label_smoothing == 0.1
