"""Command-line overrides of the entries of a dict of dataclasses (data.parquet.dense_transforms), which
OmegaConf refuses from an override (a dict is not a DenseTransformConfig).

`data.parquet.dense_transforms.price.log1p=true` sets one field of column price's transform (made
from the defaults when the YAML has none); `data.parquet.dense_transforms.price={log1p:true,std:2}`
replaces the whole entry; a leading `+` or `++` is accepted. They are taken out of Hydra's overrides
(`split`) and applied to the composed config, entry by entry from the dataclass (`apply`), so a
field's type is checked as the YAML's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from dlrm.config.checks import ConfigError
from dlrm.config.data import DenseTransformConfig

TYPED_DICTS: dict[str, type] = {"data.parquet.dense_transforms": DenseTransformConfig}


class EntryOverride(NamedTuple):
    """One override of a typed dict's entry: the dict's key, the entry, the field (None: all of it)."""

    text: str
    parent: str
    entry: str
    field: str | None
    value: Any


def split(overrides: Sequence[str]) -> tuple[list[str], list[EntryOverride]]:
    """(the overrides for Hydra, the overrides of typed dicts' entries), each in its given order;
    a deletion (`~key`) stays Hydra's."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, rest, entries = OverridesParser.create(), [], []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except OverrideParseException:
            rest.append(text)  # Hydra names the problem
            continue
        key, value = o.key_or_group, o.value()
        if key in TYPED_DICTS and not o.is_delete() and isinstance(value, dict) and value:
            entries += [EntryOverride(text, key, str(k), None, v) for k, v in value.items()]  # entry by entry
            continue
        parent = next((p for p in TYPED_DICTS if key.startswith(p + ".")), None)
        if parent is None or o.is_delete() or o.package is not None:
            rest.append(text)
            continue
        entry, _, field = key[len(parent) + 1 :].partition(".")
        entries.append(EntryOverride(text, parent, entry, field or None, value))
    return rest, entries


def apply(composed: DictConfig, entries: Sequence[EntryOverride]) -> None:
    """Set each entry (or one field of it) in the composed config; ConfigError naming the override,
    the entry's fields and the YAML alternative for a value of the wrong type or an unknown field."""
    for e in entries:
        cls = TYPED_DICTS[e.parent]
        fields = [f.name for f in dataclasses.fields(cls)]
        node = OmegaConf.select(composed, e.parent)
        try:
            _set(node, e, cls, fields)
        except (OmegaConfBaseException, ValueError) as err:
            reason = (getattr(err, "msg", None) or str(err)).strip().splitlines()[0]
            raise ConfigError(
                f"the override '{e.text}' is invalid: {reason}; or set {e.parent} in the data config's YAML file"
            ) from None


def _set(node: DictConfig, e: EntryOverride, cls: type, fields: list[str]) -> None:
    """Set entry override `e` in the typed dict `node` of dataclass `cls` (whose fields are `fields`)."""
    with open_dict(node):
        if e.field is None:
            if not isinstance(e.value, dict):
                raise ValueError(f"give {{field: value, ...}} of {fields}")
            node[e.entry] = OmegaConf.merge(OmegaConf.structured(cls), e.value)
            return
        if e.field not in fields:
            raise ValueError(f"{e.field!r} is not a field; the fields are {fields}")
        if e.entry not in node:
            node[e.entry] = OmegaConf.structured(cls)
        node[e.entry][e.field] = e.value
