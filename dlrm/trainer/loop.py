"""The training loop: a built trainer's steps, each periodic component acting when it says it is `due`
(local SGD's averaging, the log window, evaluation, checkpoints, embedding deltas), then the summary."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

from dlrm.checkpoint import latest_checkpoint
from dlrm.distributed.sharding import describe_plan
from dlrm.models.vocabulary import vocabulary_metrics
from dlrm.optim.optimizers import lr_factor
from dlrm.trainer.reporter import NonFiniteLossError, global_mean_and_signal
from dlrm.trainer.stop import TrainingStopped
from dlrm.trainer.trainer import Trainer


def train(t: Trainer) -> dict:
    """Train for `total_steps`. Each component acts at its own cadence, and at the last step:
    the log window (trainer.log_every_steps), evaluation (trainer.eval_every_steps), checkpoints
    (checkpoint.every_steps), the step profiler; the throughput clock pauses while they work.
    With trainer.eval_only, evaluate the resumed model instead. Returns the summary."""
    t.reporter.announce(describe_plan(t.plan), t.dense_params, t.total_steps, t.eval_batches())
    t.reporter.open(t.step, t.total_steps)
    if t.settings.trainer.eval_only:
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
    the next evaluation's step only (`feed`), so it has trained every batch it took (none queued, no
    embedding prefetched) when the evaluation detaches the model; it is re-attached after."""
    report, evaluation = t.reporter, {}
    first_step = t.step
    feed = itertools.islice(batches, t.evaluator.steps_to_next(t.step, t.total_steps))
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
        reason = None
        if t.evaluator.due(t.step, last):
            with report.paused():
                evaluation = t.evaluate()
                report.evaluation(t.step, evaluation)
                reason = t.evaluator.stop_reason(evaluation, t.step)  # target AUC, or patience run out
                if reason is not None:
                    report.message(reason)
            feed = itertools.islice(batches, t.evaluator.steps_to_next(t.step, t.total_steps))
        if reason is not None and not last:  # the run ends here: close the log window as at the last step
            last = True
            if report.due(t.step, last):
                _log_window(t, last, first_step)
        if t.checkpointer is not None and t.checkpointer.due(t.step, last):
            with report.paused():
                path = t.save_checkpoint(background=not last)
                in_flight = t.checkpointer.in_flight
                report.message(f"checkpoint: {path}{' (writing in the background)' if in_flight else ''}")
        if t.deltas is not None and t.deltas.due(t.step, last):
            with report.paused():
                published = t.deltas.publish(t.step, t.model)
                if published is not None:
                    report.message(f"delta: {published}")
        if reason is not None:
            t.profiler.stop_trace()
            break
    if first_step >= t.total_steps:  # resumed at the end: nothing to train, still report the model
        evaluation = t.evaluate()
    return _end(t, evaluation, t.profiler.run_record())


def _log_window(t: Trainer, last: bool, first_step: int) -> None:
    """Close the log window: its global mean loss (a NaN or inf stops the run), throughput and
    step breakdown, reported; a stop signal that any rank got ends the run here. A collective."""
    losses, steps, seconds = t.reporter.window.close()
    mean_loss, signum = global_mean_and_signal(losses, t.stop.signum, t.pg, t.world.world_size)
    if not math.isfinite(mean_loss):
        latest = latest_checkpoint(t.checkpointer.root) if t.checkpointer else None
        raise NonFiniteLossError.of_window(mean_loss, t.step - len(losses) + 1, t.step, latest)
    lr = lr_factor(t.step - 1 - t.schedule_origin, t.settings.optim.schedule) * t.settings.optim.dense.lr
    warm_up = t.step - first_step <= t.settings.trainer.log_every_steps
    phases, vocabulary = t.profiler.window_record(warm_up, last), vocabulary_metrics(t.model)
    t.reporter.window_record(t.step, mean_loss, len(losses), seconds, lr, phases, vocabulary)
    if signum is not None:
        _stop(t, signum)


def _stop(t: Trainer, signum: int) -> None:
    """End the run at this log step because some rank got stop signal `signum`: every rank is here at
    the same step. Save a checkpoint with checkpoint.on_signal (or where one is due), close
    the logs, raise TrainingStopped naming the step, the last checkpoint and how to continue."""
    t.stop.stopping = True
    on_signal = t.settings.checkpoint.on_signal
    if t.checkpointer is not None and (on_signal or t.checkpointer.due(t.step, False)):
        t.reporter.message(f"checkpoint: {t.save_checkpoint()}")
    if t.checkpointer is not None:
        t.checkpointer.wait()  # a background save completes before the run ends
    t.profiler.stop_trace()
    t.reporter.close(t.step, None)
    latest = latest_checkpoint(t.checkpointer.root) if t.checkpointer is not None else None
    where = f" run.name={t.settings.run_name}" if t.settings.run_name else ""
    if not where and t.run_dir is not None:
        where = f" hydra.run.dir={t.run_dir}"
    raise TrainingStopped.at_log_step(signum, t.step, t.total_steps, latest, on_signal, where)


def _end(t: Trainer, evaluation: dict, breakdown: dict | None) -> dict:
    """Close the records; the summary (summary.json on rank 0, the closing console lines): the
    trainer's own entries, the step breakdown, then those of `t.summary_parts`."""
    if t.checkpointer is not None:
        t.checkpointer.wait()  # a background save completes before the run ends
    t.reporter.close(t.step, breakdown)
    fields = {**t.summary_fields(), **({"step_breakdown": breakdown} if breakdown is not None else {})}
    return t.reporter.summary(t.step, evaluation, t.skipped_steps, fields, t.summary_parts)
