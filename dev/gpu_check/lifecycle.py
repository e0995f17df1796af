"""A run's life on the device: train (evaluations on the device, periodic checkpoints), resume it to more
steps, evaluate its last checkpoint resharded to another plan."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dev.gpu_check.runs import Step, finite, num, read_metrics, read_yaml

if TYPE_CHECKING:
    from dev.gpu_check.check import Check

REL_TOL = 1e-5  # eval_only reshard vs train's final evaluation: the same weights and eval data


def base(c: Check) -> list[str]:
    """The default model with train's batches, log, evaluation and checkpoint cadence, breakdown off."""
    s = c.sz
    return [
        *c.topology(),
        f"data.global_batch_size={s.batch}",
        f"data.eval_batches={s.eval_batches}",
        "trainer.progress=lines",
        f"trainer.log_every_steps={s.log_every}",
        f"trainer.eval_every_steps={s.eval_every}",
        *c.no_breakdown(),
        f"checkpoint.every_steps={s.ckpt_every}",
        "checkpoint.keep=100",  # eval_only_reshard loads train's last checkpoint after resume saved more
    ]


def train(c: Check, results: dict) -> dict[str, Any] | None:
    run_dir, s = c.work / "train", c.sz
    step = Step(
        "train",
        "default model, breakdown off: log steps, evaluations on the training device, periodic checkpoints",
        c.train_command(*base(c), f"trainer.max_steps={s.steps}", f"hydra.run.dir={run_dir}"),
        run_dir,
    )
    done = c.execute(step)
    if done is None:
        return None
    res, _ = done
    f, problems = res["figures"], []
    if f["steps"] != s.steps:
        problems.append(f"summary steps {f['steps']} != trainer.max_steps={s.steps}")
    if f["device"] != c.device:
        problems.append(f"trained on {f['device']}, not {c.device}")
    if f["log_records"] < s.steps // s.log_every:
        problems.append(f"{f['log_records']} log records, expected {s.steps // s.log_every}")
    if f["evaluations"] < s.steps // s.eval_every or not finite(f["eval_logloss"]) or f["eval_auc"] is None:
        problems.append(
            f"{f['evaluations']} evaluations (expected {s.steps // s.eval_every}), logloss {f['eval_logloss']}"
        )
    if f"step_{s.steps:08d}" not in f["checkpoints"]:
        problems.append(f"no checkpoint step_{s.steps:08d} (found {f['checkpoints']})")
    headline = f"{num(f['train_samples_per_s'])} samples/s, auc {num(f['eval_auc'], '.5f')}"
    c.judge(
        res, problems, f"{f['steps']} steps, {f['evaluations']} evaluations, checkpoints {f['checkpoints']}", headline
    )
    return res


def resume(c: Check, results: dict) -> dict[str, Any] | None:
    run_dir, s = c.work / "train", c.sz
    if not (results.get("train") or {}).get("passed"):
        c.skip(c.report.add({"name": "resume"}), "train did not pass")
        return None
    overrides = [*base(c), f"trainer.max_steps={s.resume_steps}", "trainer.resume=auto", f"hydra.run.dir={run_dir}"]
    done = c.execute(
        Step("resume", "train's run continued: trainer.resume=auto, more steps", c.train_command(*overrides), run_dir)
    )
    if done is None:
        return None
    res, text = done
    f, problems, want = res["figures"], [], f"at step {s.steps}"
    resumed = [line.strip() for line in text.splitlines() if "resumed from " in line and want in line]
    res["resumed_line"] = resumed[0] if resumed else None
    if not resumed:
        problems.append(f"the console never says 'resumed from ... {want}'")
    start = next((r for r in read_metrics(run_dir) if r.get("event") == "start"), {})
    res["start_event"] = start
    if start and not (start.get("resumed") and start.get("step") == s.steps):
        problems.append(f"metrics.jsonl start event {start} is not a resume at step {s.steps}")
    if f["steps"] != s.resume_steps:
        problems.append(f"summary steps {f['steps']} != trainer.max_steps={s.resume_steps}")
    c.judge(res, problems, f"resumed at step {s.steps} and reached {f['steps']}")
    return res


def eval_only_reshard(c: Check, results: dict) -> dict[str, Any] | None:
    """train's last checkpoint evaluated with sharding=row_wise (train planned table_wise): the same eval
    AUC and log loss within REL_TOL (the same data config and seed, so the same synthetic eval split)."""
    train_res = results.get("train") or {}
    if not train_res.get("passed"):
        c.skip(c.report.add({"name": "eval_only_reshard"}), "train did not pass")
        return None
    run_dir, s = c.work / "eval_only", c.sz
    src = c.work / "train" / "checkpoints" / f"step_{s.steps:08d}"
    overrides = [*c.topology(), f"data.global_batch_size={s.batch}", f"data.eval_batches={s.eval_batches}",
                 "trainer.progress=lines", "trainer.eval_only=true", f"trainer.resume={src}", "sharding=row_wise",
                 f"hydra.run.dir={run_dir}"]  # fmt: skip
    what = "train's last checkpoint evaluated only, resharded to row_wise (train planned table_wise)"
    done = c.execute(Step("eval_only_reshard", what, c.train_command(*overrides), run_dir))
    if done is None:
        return None
    res, text = done
    f, t, problems = res["figures"], train_res["figures"], []
    res.update(checkpoint=str(src), train_sharding_types=t["sharding_types"])
    if f["sharding_types"] != ["row_wise"] or f["sharding_types"] == t["sharding_types"]:
        problems.append(
            f"sharding types {f['sharding_types']} (train's {t['sharding_types']}): not a reshard to row_wise"
        )
    if not any("resumed from " in line and str(src) in line for line in text.splitlines()):
        problems.append(f"the console never says it loaded {src}")
    a, b = read_yaml(c.work / "train" / "config.yaml"), read_yaml(run_dir / "config.yaml")
    res["same_eval_data"] = (
        isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in ("data", "seed"))
    )
    if not res["same_eval_data"]:
        problems.append("the data config or seed differs from train's run: not the same eval data")
    rel = [
        abs(f[k] - t[k]) / max(abs(t[k]), 1e-30) for k in ("eval_auc", "eval_logloss") if finite(f[k]) and finite(t[k])
    ]
    res["max_rel_diff"] = max(rel) if len(rel) == 2 else None
    if res["max_rel_diff"] is None or res["max_rel_diff"] > REL_TOL:
        problems.append(
            f"eval auc/logloss {f['eval_auc']}/{f['eval_logloss']} != train's {t['eval_auc']}/{t['eval_logloss']}"
        )
    same = f"eval auc {num(f['eval_auc'], '.6f')} logloss {num(f['eval_logloss'], '.6f')} equal train's"
    c.judge(res, problems, f"{same} (max rel diff {num(res['max_rel_diff'], '.1e')})")
    return res


STEPS = {"train": train, "resume": resume, "eval_only_reshard": eval_only_reshard}
