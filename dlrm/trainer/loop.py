"""The training loop: a built trainer's steps, each periodic component acting when it says it is `due`
(local SGD's averaging, the log window, evaluation, checkpoints, embedding deltas), then the summary."""

from __future__ import annotations

import itertools
import logging
import math
import signal
from collections.abc import Iterator

from dlrm.checkpoint import latest_checkpoint
from dlrm.common.errors import UserError
from dlrm.distributed.sharding import describe_plan
from dlrm.models.vocabulary import vocabulary_metrics
from dlrm.optim.optimizers import lr_factor
from dlrm.trainer.reporter import global_mean_and_signal
from dlrm.trainer.stop import TrainingStopped
from dlrm.trainer.trainer import Trainer

log = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Training produced a NaN or infinite loss; the message names the steps and the last checkpoint."""

    same_on_all_ranks = True  # the loss is the global mean


def train(t: Trainer) -> dict:
    """Train for `total_steps`. Each component acts at its own cadence, and at the last step:
    the log window (trainer.log_every_steps), evaluation (trainer.eval_every_steps), checkpoints
    (checkpoint.every_steps), the step profiler; the throughput clock pauses while they work.
    With trainer.eval_only, evaluate the resumed model instead. Returns the summary."""
    t.reporter.announce(describe_plan(t.plan), t.dense_params, t.total_steps, t.eval_batches())
    t.reporter.open(t.step, t.total_steps)
    if t.cfg.trainer.eval_only:
        evaluation = t.evaluate()
        t.reporter.evaluation(t.step, evaluation)
        return _end(t, evaluation, None)
    batches = t.batches("train", t.step, t.total_steps - t.step)
    if t.deltas is not None:  # the ids of each batch taken: the rows its step changes
        t.deltas.start(t.step)
        batches = t.deltas.tracker.watch(batches, t.step)
    t.model.train()
    t.stop.install(t.state)
    try:
        return _loop(t, batches)
    finally:
        t.stop.uninstall()


def _loop(t: Trainer, batches: Iterator) -> dict:
    """The steps of `train`, from t.step to total_steps (or a stop: target AUC, a signal).

    A step with no log, evaluation or checkpoint due never waits for the device: the clock is
    paused (a wait) only around an evaluation or a save that is due. The pipeline is fed up to
    the next evaluation's step only, so it has trained every batch it took (none queued, no
    embedding prefetched) when the evaluation detaches the model; it is re-attached after."""
    report, evaluation = t.reporter, {}
    first_step = t.step
    feed = _until_next_eval(t, batches)
    while t.step < t.total_steps:
        last = t.step + 1 == t.total_steps
        with t.profiler.step(t.step + 1, last, report.paused):
            loss = t.step_once(feed)
        report.add(loss)
        t.step += 1
        if t.local_sgd is not None and t.local_sgd.due(t.step, last):
            t.local_sgd.average()  # the run's model: the ranks' average
        if report.due(t.step, last):
            _log_window(t, last, first_step)
        reached = False
        if t.evaluator.due(t.step, last):
            with report.paused():
                evaluation = t.evaluate()
                t.reporter.evaluation(t.step, evaluation)
                reached = _reached_target(t, evaluation)
            feed = _until_next_eval(t, batches)
        if reached and not last:  # the run ends here: close the log window as at the last step
            last = True
            if report.due(t.step, last):
                _log_window(t, last, first_step)
        if t.checkpointer is not None and t.checkpointer.due(t.step, last):
            with report.paused():
                path = t.save_checkpoint(background=not last)
                in_flight = t.checkpointer.in_flight
                t.reporter.message(f"checkpoint: {path}{' (writing in the background)' if in_flight else ''}")
        if t.deltas is not None and t.deltas.due(t.step, last):
            with report.paused():
                published = t.deltas.publish(t.step, t.model)
                if published is not None:
                    t.reporter.message(f"delta: {published}")
        if reached:
            t.profiler.stop_trace()
            break
    if first_step >= t.total_steps:  # resumed at the end: nothing to train, still report the model
        evaluation = t.evaluate()
    return _end(t, evaluation, t.profiler.run_record())


def _until_next_eval(t: Trainer, batches: Iterator) -> Iterator:
    """`batches` up to the step of the next evaluation (or the last step): the training
    pipeline runs out of batches there, trains those it holds, and is empty."""
    n, steps = t.evaluator.every.n, t.total_steps
    end = min(steps, (t.step // n + 1) * n) if n > 0 else steps
    return itertools.islice(batches, end - t.step)


def _reached_target(t: Trainer, evaluation: dict) -> bool:
    """Whether the run ends at this evaluation: trainer.target_auc reached, or trainer.patience
    evaluations without a better trainer.select_metric."""
    if t.evaluator.stalled(evaluation, t.step):
        best_step, best = t.evaluator.best or (0, math.nan)
        t.reporter.message(
            f"{t.cfg.trainer.select_metric} has not improved on {best:.5f} (step {best_step}) in "
            f"{t.cfg.trainer.patience} evaluation(s): stopping at step {t.step}"
        )
        return True
    if not t.evaluator.reached_target(evaluation, t.step):
        return False
    samples = t.step * t.cfg.data.global_batch_size
    t.reporter.message(
        f"target AUC {t.cfg.trainer.target_auc} reached at step {t.step} ({samples:,} samples): "
        f"auc {evaluation['auc']:.5f}; stopping"
    )
    return True


def _log_window(t: Trainer, last: bool, first_step: int) -> None:
    """Close the log window: its global mean loss (a NaN or inf stops the run), throughput and
    step breakdown, reported; a stop signal that any rank got ends the run here. A collective."""
    losses, steps, seconds = t.reporter.window.close()
    mean_loss, signum = global_mean_and_signal(losses, t.stop.signum, t.pg, t.world.world_size)
    if not math.isfinite(mean_loss):
        latest = latest_checkpoint(t.checkpointer.root) if t.checkpointer else None
        raise NonFiniteLossError(
            f"loss is {mean_loss} in steps {t.step - len(losses) + 1}..{t.step}; "
            f"last good checkpoint: {latest or 'none'}. Either the training diverged (lower "
            "optim.embedding.lr / optim.dense.lr and resume from it with trainer.resume=auto) or "
            "the input holds NaN/inf values (check the data files; a Criteo loader refuses them "
            "when it verifies them); trainer.log_every_steps=1 stops sooner"
        )
    lr = lr_factor(t.step - 1 - t.schedule_origin, t.cfg.optim.schedule) * t.cfg.optim.dense.lr
    warm_up = t.step - first_step <= t.cfg.trainer.log_every_steps
    phases, vocabulary = t.profiler.window_record(warm_up, last), vocabulary_metrics(t.model)
    t.reporter.window_record(t.step, mean_loss, len(losses), seconds, lr, phases, vocabulary)
    if signum is not None:
        _stop(t, signum)


def _stop(t: Trainer, signum: int) -> None:
    """End the run at this log step because some rank got `signum` (dlrm.trainer.stop): every rank is
    here at the same step. Save a checkpoint with checkpoint.on_signal (or where one is due), close
    the logs, raise TrainingStopped naming the step, the last checkpoint and how to continue."""
    t.stop.stopping = True
    ck = t.cfg.checkpoint
    if t.checkpointer is not None and (ck.on_signal or t.checkpointer.due(t.step, False)):
        t.reporter.message(f"checkpoint: {t.save_checkpoint()}")
    if t.checkpointer is not None:
        t.checkpointer.wait()  # a background save completes before the run ends
    t.profiler.stop_trace()
    t.reporter.close(t.step, None)
    latest = latest_checkpoint(t.checkpointer.root) if t.checkpointer is not None else None
    where = f" run.name={t.cfg.run.name}" if t.cfg.run.name else ""
    if not where and t.run_dir is not None:
        where = f" hydra.run.dir={t.run_dir}"
    hint = "" if latest or ck.on_signal else " (checkpoint.on_signal=true saves one at a stop)"
    raise TrainingStopped(
        f"by {signal.Signals(signum).name} at step {t.step} of {t.total_steps}; last checkpoint: "
        f"{latest or 'none'}{hint}; continue with the same command and{where} trainer.resume=auto",
        signum,
    )


def _end(t: Trainer, evaluation: dict, breakdown: dict | None) -> dict:
    """Close the records; the summary (summary.json on rank 0, the closing console lines)."""
    if t.checkpointer is not None:
        t.checkpointer.wait()  # a background save completes before the run ends
    t.reporter.close(t.step, breakdown)
    fields = {"sharding_plan": describe_plan(t.plan), **t.evaluator.summary_fields({}), **_data_counts(t.source)}
    if breakdown is not None:
        fields["step_breakdown"] = breakdown
    return t.reporter.summary(t.step, evaluation, t.skipped_steps, fields, t.summary_parts)


def _data_counts(source) -> dict:
    """{"data_counts": ...}: the values the source's reader changed on this rank (folded ids, ...),
    logged as a warning; {} when it changed none or does not count."""
    counts = getattr(source, "data_counts", None)
    if counts is None or not any(counts().values()):
        return {}
    log.warning("data (this rank's reads): %s", ", ".join(f"{k} {v:,}" for k, v in counts().items()))
    return {"data_counts": counts()}
