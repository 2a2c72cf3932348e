"""Runs a Task for a mode: the process's role, the contexts around the run,
the header and the closing block.

`run` picks this process's role, has `trainer.build` make the parts (the
strategy, the inputs, the training state, the Orbit trainer and evaluator)
and the controller (the checkpoint manager, the hooks and the actions
between loops), then runs the mode inside the contexts that surround the
whole run: the write directory's lease, the signal watch, the tf.data
service's stall watch. Each feature lives in its own module; this one only
connects them.
"""

import contextlib
import dataclasses
import os
import time
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from trainer import actions
from trainer import build
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import model_dir as model_dir_lib
from trainer import model_garden
from trainer import preemption
from trainer import resume as resume_lib
from trainer import runtime as runtime_lib
from trainer import state as state_lib
from trainer.actions import keras_callbacks
from trainer.data import stall_watch
from trainer.distribute import cluster
from trainer.distribute import ps_errors
from trainer.distribute import roles
from trainer.loop.control import continuous_eval
from trainer.loop.control import controller as controller_lib
from trainer.model import task as task_lib
from trainer.report import run_report
from trainer.storage import evaluated
from trainer.storage import files

MODES = ("train", "eval", "train_and_eval", "continuous_eval")


@errors.raised_as_is()
def run(task: task_lib.Task, mode: str, model_dir: str,
        runtime: Optional[runtime_lib.RuntimeConfig] = None,
        config: Optional[config_lib.TrainerConfig] = None,
        restore_dir: Optional[str] = None,
        receiver: Optional[preemption.Receiver] = None,
        dry_run: bool = False) -> Dict[str, Any]:
  """Trains and/or evaluates `task` in `model_dir`.

  Args:
    task: What to train.
    mode: One of `MODES`.
    model_dir: Checkpoints, `train/` and `eval/` summaries,
      `operative_config.gin`, `best/` and `export/` go here.
    runtime: Devices, strategy and precision; defaults if None.
    config: Loop settings; defaults if None.
    restore_dir: Where to look for the checkpoint to start from, if not in
      `model_dir` (`--dry_run` starts from the real run's checkpoint but
      writes elsewhere); it is only read.
    receiver: The process's signal receiver (`train.py`'s); None: a
      signal is caught by Python handlers while training.
    dry_run: Whether `model_dir` is `--dry_run`'s temporary directory, as
      the run's header says.

  Returns:
    The last evaluation's results (name -> NumPy value), or {} if none ran.

  Raises:
    errors.ConfigError: For an unknown mode, `eval` without a checkpoint, and
      settings that do not fit the task or the strategy.
  """
  started = time.perf_counter()
  runtime = runtime or runtime_lib.RuntimeConfig()
  config = config or config_lib.TrainerConfig()
  # A Model Garden experiment's settings (settled once, by the gin config).
  runtime, config = model_garden.settle(task, runtime, config, model_dir)
  if mode not in MODES:
    raise errors.ConfigError(
        f"`mode` ({mode!r}) must be one of: {', '.join(MODES)}.")
  membership = build.set_up(runtime)
  if runtime.distribution_strategy == "parameter_server":
    runtime, mode = roles.role_runtime(runtime, mode, config.on_nonfinite,
                                       membership)
    if runtime is None:
      return {}  # This process served as a worker or ps until stopped.
  elif (runtime.distribution_strategy == "multi_worker_mirrored" and
        roles.task_role()[0] == "evaluator"):
    runtime, mode = roles.evaluator_role(runtime, mode, membership)
  restore_dir = restore_dir or model_dir
  if mode == "eval" and tf.train.latest_checkpoint(restore_dir) is None:
    raise errors.ConfigError(
        f"no checkpoint to evaluate in `model_dir` ({restore_dir}).")
  # A parameter server lost between loops (a save, the metrics read) is
  # named as one lost in a loop is.
  with (ps_errors.naming_lost_ps()
        if runtime.distribution_strategy == "parameter_server"
        else contextlib.nullcontext()):
    return _build_and_run(task, mode, model_dir, runtime, config,
                          restore_dir, started, membership, receiver, dry_run)


def _build_and_run(task: task_lib.Task, mode: str, model_dir: str,
                   runtime: runtime_lib.RuntimeConfig,
                   config: config_lib.TrainerConfig,
                   restore_dir: str, started: float,
                   membership: cluster.Membership,
                   receiver: Optional[preemption.Receiver],
                   dry_run: bool) -> Dict[str, Any]:
  """Builds the parts and the controller, then runs `mode`; see `run`.

  What building says (optimizers, placement, the restore) follows the
  header, which says what the build found.
  """
  with console.held() as release:
    parts = build.parts(task, mode, build.process(runtime, membership),
                        config)
    # Before `model_dir` is written: a Task it cannot run is one line.
    callbacks = build.keras_callbacks(parts)
    # Read before this run writes its own configuration over the old one.
    resume = resume_lib.compare(parts, restore_dir)
    controller = None  # Built below, given the watcher.

    def progress() -> Optional[preemption.Progress]:
      return None if controller is None else controller.progress()

    watcher = (preemption.PreemptionWatcher(config.preemption_exit_code,
                                            parts.worker.num_workers,
                                            parts.worker.is_chief,
                                            progress_fn=progress,
                                            receiver=receiver)
               if parts.training else None)
    with (model_dir_lib.write_directory(model_dir, parts.worker, mode,
                                        parts.config) as write_dir,
          watcher or contextlib.nullcontext()):
      # As the run took it: one deleted or replaced from here on (while
      # the checkpoint is restored) stops the first save.
      identity = files.directory_identity(write_dir)
      early_stopping = build.early_stopping(parts, write_dir)
      try:
        controller = build.controller(
            parts, write_dir, restore_dir=restore_dir, watcher=watcher,
            stopper=early_stopping, callbacks=callbacks,
            input_stale_until=(resume.step if resume and resume.batch_sizes
                               else -1),
            directory_identity=identity)
      except (errors.CheckpointMismatch, errors.InputMismatch) as e:
        raise resume_lib.mismatch(e, resume) from e
      release(run_report.header(
          task_name=type(task).__name__, mode=mode, model_dir=model_dir,
          strategy=parts.state.strategy, runtime=parts.runtime,
          config=parts.config, num_workers=parts.worker.num_workers,
          restored_path=controller.restored_path, step=controller.step,
          training=parts.training, evaluating=parts.evaluating,
          # A Model Garden Task's step is scaled by its adapter.
          unchecked_train_step=(
              task_lib.overrides(task, "train_step") and
              not isinstance(task, model_garden.ModelGardenTask) and
              not (parts.trainer and parts.trainer.checks_loss_scaling)),
          dry_run=dry_run))
      if controller.step:
        _resume(parts, controller.step, resume)
      with _stall_watch(parts, controller, watcher):
        return _run_mode(parts, controller, mode, model_dir, write_dir,
                         early_stopping, started, callbacks)


def _stall_watch(parts: build.Parts, controller: controller_lib.Controller,
                 watcher: Optional[preemption.PreemptionWatcher]):
  """Returns the tf.data service's stall watch where training reads from
  it, else a context that does nothing.

  Its timeout and a signal end a loop that waits for a batch the same way:
  the step reached is saved while the loop waits, and the process exits.
  """
  if not (parts.training and parts.runtime.data_service):
    return contextlib.nullcontext()

  def saving_first(end: Callable[[int, float, str, str], bool]):
    def on_stall(step: int, waited: float, why: str) -> bool:
      saved = controller.save_while_waiting()
      if saved is None:  # A batch came during the save.
        return False
      return end(step, waited, why, saved)
    return on_stall

  def timed_out(step: int, waited: float, why: str, saved: str) -> bool:
    watcher.end_process(stall_watch.timeout_line(
        parts.runtime, step, waited, why, saved))
    return True

  def signalled(unused_step: int, waited: float, why: str,
                unused_saved: str) -> bool:
    # The receiver's line says what is saved, as at the grace period's end.
    return watcher.end_waiting(stall_watch.signal_reason(waited, why))

  # The variable, not `controller.step`: that moves only between loops, and
  # a loop of slow steps is no stall.
  return stall_watch.StallWatch(
      parts.runtime,
      lambda: parts.state.step() if parts.trainer.in_loop else None,
      saving_first(timed_out),
      signalled_fn=lambda: watcher is not None and watcher.received,
      on_signal=saving_first(signalled))


def _resume(parts: build.Parts, step: int,
            resume: Optional[resume_lib.Resume]) -> None:
  """Says what changed since the checkpoint (the chief), and puts the
  training input where a run resumed at `step` left it, where the iterator
  is not in the checkpoint or its batches have another size."""
  if resume is not None and resume.step != step:
    # An older checkpoint, restored in place of a damaged one.
    resume = dataclasses.replace(resume, step=step)
  line = resume.line() if resume else None
  if line and parts.worker.is_chief:
    console.info(line)
  rebased = (resume_lib.rebase_input(parts, resume) or
             resume_lib.remix_input(parts, resume))
  if rebased:
    console.info(rebased)
  elif parts.resume_input_fn is not None:
    # Several workers' positions are saved beside the checkpoint (some
    # pipelines cannot be saved at all: what was consumed is skipped).
    console.info(parts.resume_input_fn(step))
  elif parts.restarts_input:
    console.info("input | resuming: the training input starts again from "
                 "its first batch (its position is not in the checkpoint)")


def _run_mode(parts: build.Parts, controller: controller_lib.Controller,
              mode: str, model_dir: str, write_dir: str,
              early_stopping: Optional[actions.EarlyStopping],
              started: float,
              callbacks: Optional[keras_callbacks.KerasCallbacks] = None
              ) -> Dict[str, Any]:
  """Runs `mode` with the built controller; returns the last eval results.

  A mode that trains ends with the closing block (`trainer.report.run_report`);
  the Keras callbacks' `on_train_begin` and `on_train_end` surround its
  training and evaluations (not called when it ends with an error).
  """
  config = parts.config
  start_step = controller.step
  if mode == "eval":
    return controller.evaluate(config.eval_steps)
  if mode == "continuous_eval":
    return _evaluate_continuously(controller, model_dir, config,
                                  early_stopping)
  output = {}
  if callbacks is not None:
    callbacks.train_begin(controller.step)
  if mode == "train":
    controller.train(config.train_steps)
  else:
    caught_up = None
    if _evaluation_missed(controller.step, config, write_dir):
      # Stopped between saving this step and evaluating it: the
      # evaluation (and a best checkpoint it may make) is not lost.
      console.info(f"eval | step {controller.step} was saved but not "
                   "evaluated: evaluating it first")
      caught_up = controller.evaluate(config.eval_steps)
    output = controller.train_and_evaluate(
        config.train_steps, config.eval_steps,
        eval_interval=config.validation_interval or None)
    if output is None:  # Nothing (more) trained: the last evaluation.
      output = caught_up or controller.evaluate(config.eval_steps)
  if callbacks is not None:
    callbacks.train_end()
  directory = None
  if config.export.at_end:
    directory = os.path.join(write_dir, "export", str(controller.step))
    parts.export(directory)
    console.info(
        f"export | SavedModel of step {controller.step} in {directory}")
  best = next((action for action in controller.eval_actions
               if isinstance(action, actions.BestCheckpoint)), None)
  run_report.print_lines(run_report.closing(
      step=controller.step, start_step=start_step,
      seconds=time.perf_counter() - started,
      fingerprint=state_lib.weights_fingerprint(parts.state.model),
      results=output, best=best.record if best else None,
      best_dir=best.directory if best else None,
      checkpoint=(tf.train.latest_checkpoint(write_dir)
                  if parts.worker.is_chief else None),
      export=directory, held_out=config.held_out_sets))
  return output


def _evaluation_missed(step: int, config: config_lib.TrainerConfig,
                       write_dir: str) -> bool:
  """Whether `train_and_eval` was due to evaluate `step` (the restored one,
  below `train_steps`) but has no record of it."""
  due = config.validation_interval and step % config.validation_interval == 0
  return (0 < step < config.train_steps and bool(due) and
          step not in evaluated.steps(write_dir))


def _evaluate_continuously(
    controller: controller_lib.Controller, model_dir: str,
    config: config_lib.TrainerConfig,
    early_stopping: Optional[actions.EarlyStopping]) -> Dict[str, Any]:
  """Evaluates every checkpoint of `model_dir` once, in step order, until the
  one at `train_steps` (see `trainer.loop.control.continuous_eval`)."""

  def evaluate(prefix: str):
    controller.restore_checkpoint(prefix)
    return controller.step, controller.evaluate(config.eval_steps)

  return continuous_eval.run(
      model_dir, evaluate, config.train_steps,
      timeout=config.continuous_eval_timeout,
      stop_fn=early_stopping.stop_reason if early_stopping else None,
      max_to_keep=config.max_to_keep if config.keep_until_evaluated else None)
