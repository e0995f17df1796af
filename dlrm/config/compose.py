"""Hydra composition in one place: where the config groups live, and overrides -> a typed `Config`.

`check_overrides` refuses an unknown key or group option before Hydra runs, with a "did you mean";
`compose` turns Hydra's and OmegaConf's refusals into a ConfigError naming the key and the reason.

`CONF_DIR` is `conf/` of a source checkout (editable install) or `dlrm/conf/` of an installed wheel,
so every command finds the same files however dlrm was installed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import sys
from argparse import Namespace
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from dlrm.common.errors import UsageError
from dlrm.config import Config, ConfigError, register_configs, to_config, typed_dict_overrides
from dlrm.config.hydra_internals import args_parser, prepend_config_dir


def _conf_dir() -> Path:
    package = Path(__file__).resolve().parents[1]  # dlrm/
    installed = package / "conf"  # a wheel: conf/ packaged inside dlrm/
    return installed if (installed / "config.yaml").is_file() else package.parent / "conf"


CONF_DIR = _conf_dir()


def _schema_keys(cls: type = Config, prefix: str = "") -> dict[str, object]:
    """Every dotted key of the schema -> its dataclass type, 'dict' or 'list' (open containers), or None."""
    keys: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys[key] = type(default)
            keys.update(_schema_keys(type(default), key + "."))
        else:
            keys[key] = "dict" if isinstance(default, dict) else "list" if isinstance(default, list) else None
    return keys


def config_dirs(extra: str | None = None) -> list[Path]:
    """Where the config groups are found: conf/, then `extra` (a user's directory: `-cd DIR`)."""
    return [CONF_DIR, *([Path(extra).absolute()] if extra else [])]


def group_options(group: str, dirs: Sequence[Path] = (CONF_DIR,)) -> list[str]:
    """The options of a config group: the names of <dir>/<group>/*.yaml in any of `dirs`."""
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f"did you mean '{close[0]}'?" if close else ""


def check_overrides(overrides: Sequence[str], dirs: Sequence[Path] = (CONF_DIR,)) -> None:
    """Refuse an unknown key or group option among Hydra overrides, with a "did you mean"; the
    groups and their options are those of the config directories `dirs`.

    Hydra would refuse them too, but advises `+key=value`, which the closed schema refuses in turn.
    Keys under hydra, `~key` deletions and dict entries (sharding.per_table.NAME) are left to Hydra.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, parsed = OverridesParser.create(), []
    for text in overrides:
        try:
            parsed += parser.parse_overrides([text])
        except OverrideParseException as e:
            lines = str(e).strip().splitlines() or [type(e).__name__]
            reason = lines[1] if len(lines) > 1 and text in lines[0] else lines[0]  # skip "Error parsing 'x'"
            raise ConfigError(
                f"cannot parse the override '{text}' ({reason}); overrides look like key=value "
                "(e.g. trainer.max_steps=50; quote values with spaces or brackets)"
            ) from None
    keys = _schema_keys()
    groups = sorted({p.name for d in dirs for p in d.iterdir() if p.is_dir()})
    for o in parsed:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")) or o.is_delete() or o.package is not None:
            continue
        if key in groups:
            value = o.value()
            if value is None or not isinstance(value, str):  # experiment=null; a list is Hydra's business
                continue
            choices = group_options(key, dirs)
            if value not in choices:
                hint = _did_you_mean(value, choices)
                places = " or ".join(f"{'conf' if d == CONF_DIR else d}/{key}/" for d in dirs)
                raise ConfigError(
                    f"unknown option '{value}' for config group '{key}'; "
                    + (hint + " " if hint else "")
                    + f"choose one of: {', '.join(choices)} (files in {places})"
                )
            continue
        parent = key.rpartition(".")[0]
        prefixes = [key[:i] for i, c in enumerate(key) if c == "."]
        if key in keys or any(keys.get(p) in ("dict", "list") for p in prefixes):
            continue  # entries of open dicts and lists are Hydra's to check
        siblings = sorted(k.rpartition(".")[2] for k in keys if k.rpartition(".")[0] == parent)
        if parent in keys:  # a known section: suggest among its keys only
            close = difflib.get_close_matches(key.rpartition(".")[2], siblings, n=1, cutoff=0.7)
            fix = (
                f"did you mean '{parent}.{close[0]}'?"
                if close
                else f"the keys under '{parent}' are: {', '.join(siblings)}"
            )
        else:
            close = difflib.get_close_matches(key, list(keys) + groups, n=1, cutoff=0.8)
            fix = f"did you mean '{close[0]}'?" if close else "see `python -m dlrm.train --cfg job` for every key"
        raise ConfigError(f"unknown config key '{key}'; {fix}")


def override_value(overrides: Sequence[str], key: str) -> str | None:
    """The value Hydra gives `key` from these overrides, else None.

    The last one wins; `+`/`++` and quotes are read as Hydra reads them; a `~key` deletion is no value.

    Raises:
        ConfigError: an override Hydra cannot parse.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    value = None
    parser = OverridesParser.create()
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except OverrideParseException:
            raise ConfigError(f"cannot parse the override '{text}'; overrides look like key=value") from None
        if o.key_or_group == key and not o.is_delete():
            value = o.value()
    return None if value is None else str(value)


def _composition_error(e: Exception) -> ConfigError:
    """A ConfigError naming the key and the reason of Hydra's or OmegaConf's refusal."""
    from omegaconf.errors import OmegaConfBaseException

    cause = e
    while cause.__cause__ is not None and not isinstance(cause, OmegaConfBaseException):
        cause = cause.__cause__
    key = getattr(cause, "full_key", None)
    reason = (getattr(cause, "msg", None) or str(cause)).strip().splitlines()[0]
    if key and "not in struct" in reason:  # a new entry of an open dict (sharding.per_table.NAME)
        return ConfigError(f"config key '{key}' does not exist yet; add it with '+{key}=VALUE'")
    choice = re.fullmatch(r"Invalid value '(.*)', expected one of \[(.*)\]", reason)
    if key and choice:  # a value outside an enum of dlrm.config.choices
        return ConfigError(f"config key '{key}' = '{choice[1]}' is invalid: choose one of {choice[2]}")
    if key:
        return ConfigError(f"config key '{key}' is invalid: {reason}; fix its override or YAML value")
    return ConfigError(f"cannot compose the config: {str(e).strip().splitlines()[0]}")


def compose(overrides: Sequence[str], config_dir: str | None = None, config_name: str | None = None) -> Config:
    """The typed Config for these Hydra overrides, composed from conf/ as a training run is. Does not `validate`.

    Args:
        overrides: Hydra overrides.
        config_dir: `-cd DIR`, a directory of config groups and primary configs added to conf/.
        config_name: `-cn NAME`, the primary config.

    Raises:
        ConfigError: an unknown key or option (with a "did you mean"), a value of the wrong type, or
            anything else Hydra refuses.
    """
    with hydra_session():
        return to_config(compose_job(overrides, False, config_dir, config_name or "config"))


@contextmanager
def hydra_session() -> Iterator[None]:
    """Hydra initialized on conf/ for the block, as `@hydra.main` initializes it."""
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="train"):
        yield


def compose_job(
    overrides: Sequence[str], with_hydra: bool = True, config_dir: str | None = None, config_name: str = "config"
) -> DictConfig:
    """The composed config for these overrides; call inside `hydra_session`.

    Args:
        overrides: Hydra overrides.
        with_hydra: keep Hydra's node (run dir, job, overrides); with it, hydra.job.chdir=true is refused.
        config_dir: `-cd DIR`, a directory of config groups and primary configs, added where Hydra's
            `--config-dir` puts it.
        config_name: `-cn NAME`, the primary config.

    Raises:
        ConfigError: as `compose`.
    """
    from hydra import compose as hydra_compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    dirs = config_dirs(config_dir)
    if config_dir is not None and not dirs[-1].is_dir():
        raise ConfigError(
            f"config directory {dirs[-1]} (-cd/--config-dir) not found: give a directory of config groups"
        )
    check_overrides(overrides, dirs)
    overrides = list(overrides)
    if config_dir is not None:
        if override_value(overrides, "hydra.searchpath") is not None:
            raise ConfigError("give either -cd/--config-dir or hydra.searchpath, not both: -cd DIR adds DIR")
        prepend_config_dir(dirs[-1])
    register_configs()
    overrides, entries = typed_dict_overrides.split(overrides)
    try:
        composed = hydra_compose(config_name=config_name, overrides=overrides, return_hydra_config=with_hydra)
    except (HydraException, OmegaConfBaseException) as e:
        raise _composition_error(e) from None
    if entries:  # after Hydra's, in the order given among themselves; recorded with Hydra's
        typed_dict_overrides.apply(composed, entries)
        if with_hydra:
            with open_dict(composed), read_write(composed):
                composed.hydra.overrides.task.extend([e.text for e in entries])
    if with_hydra and composed.hydra.job.chdir:  # the run's relative paths are read from where it starts
        raise ConfigError(
            "hydra.job.chdir=true is not supported: dlrm.train reads relative paths (data, "
            "checkpoint.dir, trainer.resume) from the directory it starts in; leave it false"
        )
    return composed


def task_part(composed: DictConfig) -> DictConfig:
    """A composed config without Hydra's node: what the job sees (`to_config` makes it typed)."""
    return OmegaConf.masked_copy(composed, [str(k) for k in composed if k != "hydra"])


def command_line(argv: list[str]) -> Namespace:
    """The training command's `argv` parsed as Hydra's `@main` reads it (overrides and flags in any order).

    Raises:
        UsageError: a bad flag, or a Hydra flag the command does not take.
    """
    parser = args_parser()

    def refuse(message: str) -> NoReturn:
        raise UsageError(f"{message.strip()} (see python -m dlrm.train --help)")

    parser.error = refuse  # type: ignore[method-assign]  # one error line, not argparse's usage + exit
    args = parser.parse_intermixed_args(argv)
    if args.multirun:
        raise UsageError(
            "dlrm.train runs one training per command; -m/--multirun (a Hydra sweep) is not supported: "
            "run one command per setting (e.g. a shell loop over the values)"
        )
    if args.experimental_rerun is not None:
        raise UsageError(
            "dlrm.train does not rerun from a pickled config (--experimental-rerun: loading it can run code); "
            "rerun with the overrides in RUN_DIR/.hydra/overrides.yaml, or continue a named run with "
            "run.name=NAME trainer.resume=auto"
        )
    if args.config_path is not None:
        raise UsageError(
            f"-cp/--config-path {args.config_path}: dlrm.train composes its own conf/; add your config "
            "groups with -cd DIR (--config-dir) instead"
        )
    return args


def show_config(composed: DictConfig, args: Namespace) -> None:
    """--cfg job|hydra|all [--package P] [--resolve]: print the composed config as Hydra's would."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(composed)  # for ${hydra:...} when resolving
    OmegaConf.set_readonly(composed.hydra, None)  # as Hydra's own --cfg: resolving writes into it
    shown = {"job": task_part(composed), "hydra": OmegaConf.masked_copy(composed, ["hydra"]), "all": composed}[args.cfg]
    package = None if args.package in (None, "_global_") else args.package
    if package is not None:
        shown = OmegaConf.select(shown, package)
        if shown is None:
            raise UsageError(f"--package {package}: no such key in the {args.cfg} config")
        print(f"# @package {package}")
    if not isinstance(shown, DictConfig | ListConfig):
        print(shown)
        return
    if args.resolve:
        OmegaConf.resolve(shown)
    sys.stdout.write(OmegaConf.to_yaml(shown))
