"""data.parquet.dense_transforms from the command line: one field of an entry, a whole entry or the
dict's entries, applied after the YAML and typed as the YAML's; a bad one is one line naming the
override and the fields, with the YAML as the alternative."""

from __future__ import annotations

import pytest

from dlrm.config import ConfigError, DenseTransformConfig
from dlrm.config.compose import compose, compose_job, hydra_session

PARQUET = ("data.source=parquet", "data.parquet.dense=[price,qty]")
KEY = "data.parquet.dense_transforms"


def transforms(*overrides: str) -> dict:
    return compose([*PARQUET, *overrides]).data.parquet.dense_transforms


def test_a_field_an_entry_and_the_dict_set_typed_transforms():
    assert transforms(f"{KEY}.price.log1p=true", f"+{KEY}.price.clip=[0,250]") == {
        "price": DenseTransformConfig(log1p=True, clip=[0.0, 250.0])
    }
    whole = transforms(f"{KEY}.price={{log1p:true,mean:1.5}}", f"{KEY}.price.std=2", f"{KEY}={{qty:{{std:3}}}}")
    assert whole == {
        "price": DenseTransformConfig(log1p=True, mean=1.5, std=2.0),
        "qty": DenseTransformConfig(std=3.0),
    }
    assert isinstance(whole["price"].mean, float)


def test_the_overrides_are_recorded_with_hydras():
    with hydra_session():
        composed = compose_job([*PARQUET, f"{KEY}.price.log1p=true", "trainer.max_steps=3"])
    assert f"{KEY}.price.log1p=true" in composed.hydra.overrides.task
    assert "trainer.max_steps=3" in composed.hydra.overrides.task


@pytest.mark.parametrize(
    "override, says",
    [
        (f"{KEY}.price.logp=true", "'logp' is not a field; the fields are ['log1p', 'mean'"),
        (f"{KEY}.price.mean=abc", "could not be converted to Float"),
        (f"{KEY}.price=3", "give {field: value, ...}"),
    ],
)
def test_a_bad_override_is_one_line_naming_it_and_the_yaml(override, says):
    with pytest.raises(ConfigError) as e:
        transforms(override)
    message = str(e.value)
    assert f"the override '{override}' is invalid" in message and says in message and "\n" not in message
    assert f"or set {KEY} in the data config's YAML file" in message
