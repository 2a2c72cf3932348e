"""The lines that open and close a run: what it is, and what it left.

The header (before the first step) says what a run is, so that a mirrored
run does not look like a one-device run:

  run | DigitsClassification, train_and_eval in runs/d: new
  run | mirrored, 2 replicas (CPU:0, CPU:1) | batch 64, 32 per replica | float32
  run | to step 1000, evaluating every 500 steps and at the end | tensorboard --logdir runs/d

The closing block (after the last step and evaluation) what it left:

  train | finished at step 1000 | 1000 steps in 6.1 s | weights fingerprint 9e052896d4df49f4
  saved | checkpoint runs/d/ckpt-1000 | export runs/d/export/1000
  best eval | accuracy 0.9917 at step 1000, in runs/d/best
  final eval | accuracy 0.9917 | loss 0.0191
"""

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from trainer import console


def format_value(value: Any) -> str:
  """A result as the summary shows it: 4 decimals, or a tensor's shape."""
  array = np.asarray(value)
  if array.size == 1 and array.dtype.kind in "biuf":
    number = float(array.reshape(()))
    return f"{number:.4f}" if np.isfinite(number) else str(number)
  return f"[{'x'.join(str(d) for d in array.shape)}]"


# Orbit's evaluation speed, which the eval summaries keep: not a result.
_NOT_RESULTS = frozenset({"steps_per_second"})


# Follows each result of a set never judged (`trainer.held_out_sets`).
HELD_OUT_MARK = " (held out)"


def format_results(results: Mapping[str, Any],
                   held_out: Sequence[str] = ()) -> str:
  """Evaluation results as `name value | ...`, in name order (Orbit's
  `steps_per_second` left out); a result of a set in `held_out` (the named
  sets never judged) is marked `(held out)`."""
  held_out = tuple(held_out)
  return " | ".join(
      f"{name} {format_value(value)}"
      f"{HELD_OUT_MARK if name.partition('/')[0] in held_out else ''}"
      for name, value in sorted(results.items())
      if name not in _NOT_RESULTS)


def _device_names(strategy: tf.distribute.Strategy) -> str:
  """`CPU:0, CPU:1` for this worker's replicas; '' where not listed."""
  try:
    devices = strategy.extended.worker_devices
  except (AttributeError, NotImplementedError, RuntimeError, ValueError):
    return ""
  short = [d.split("device:")[-1] for d in devices]
  if len(short) > 4:
    short = short[:2] + ["..."] + short[-1:]
  return ", ".join(short)


def _precision(runtime) -> str:
  dtype = runtime.mixed_precision_dtype
  if dtype == "float16":
    scale = ("dynamic" if runtime.loss_scale == "dynamic" else
             f"{runtime.loss_scale:g}")
    return f"mixed float16 ({scale} loss scale)"
  return "mixed bfloat16" if dtype == "bfloat16" else "float32"


def _origin(restored_path: Optional[str], step: int, training: bool) -> str:
  """Where the run starts: new, resumed, or the checkpoint evaluated."""
  if restored_path and not training:
    return f"evaluating {os.path.basename(restored_path)}"
  if restored_path:
    return f"resuming from {os.path.basename(restored_path)}, step {step}"
  if training:
    return "new" if step == 0 else f"at step {step}"
  return "no checkpoint yet"


def _where(strategy: tf.distribute.Strategy, runtime,
           num_workers: int) -> str:
  """The strategy and where its replicas are: `mirrored, 2 replicas
  (CPU:0, CPU:1)`."""
  replicas = strategy.num_replicas_in_sync
  where = f"{replicas} replica{'s' if replicas != 1 else ''}"
  if num_workers > 1:
    where += f" on {num_workers} workers"
  devices = _device_names(strategy)
  if devices and num_workers == 1:
    where += f" ({devices})"
  name = runtime.distribution_strategy
  if name == "default":  # TensorFlow's no-op strategy: its default device.
    name = "default strategy"
    gpus = tf.config.list_logical_devices("GPU")
    where += f" ({'GPU:0' if gpus else 'CPU'})"
  return f"{name}, {where}"


def _setup(strategy: tf.distribute.Strategy, runtime, config,
           num_workers: int, training: bool) -> List[str]:
  """How the run computes: strategy and replicas, batch, precision."""
  parts = [_where(strategy, runtime, num_workers)]
  if training:
    batch = config.global_batch_size
    replicas = max(strategy.num_replicas_in_sync, 1)
    batch_text = f"batch {batch}, {batch // replicas} per replica"
    if config.gradient_accumulation_steps > 1:
      batch_text += (f" in {config.gradient_accumulation_steps} "
                     "micro-batches")
    parts.append(batch_text)
  parts.append(_precision(runtime))
  if runtime.enable_xla:
    parts.append("XLA")
  if runtime.run_eagerly:
    parts.append("eager")
  return parts


def _plan(config, training: bool, evaluating: bool) -> List[str]:
  """What the run will do."""
  plan = []
  if training:
    plan.append(f"to step {config.train_steps}")
    if evaluating and 0 < config.validation_interval < config.train_steps:
      plan[-1] += (f", evaluating every {config.validation_interval} steps "
                   "and at the end")
    elif evaluating:
      plan[-1] += ", evaluating at the end"
  return plan


def header(*, task_name: str, mode: str, model_dir: str,
           strategy: tf.distribute.Strategy, runtime, config,
           num_workers: int, restored_path: Optional[str], step: int,
           training: bool, evaluating: bool,
           unchecked_train_step: bool = False,
           dry_run: bool = False) -> List[str]:
  """Returns the header lines of a run.

  Args:
    task_name: The Task's class name.
    mode: The mode run.
    model_dir: As the user gave it.
    strategy: The strategy built.
    runtime: The `trainer.RuntimeConfig`.
    config: The `trainer.TrainerConfig`, batches rescaled.
    num_workers: Processes that train in sync (1 on one machine).
    restored_path: The checkpoint the run starts from, or None.
    step: The step it starts from.
    training: Whether the mode trains.
    evaluating: Whether it evaluates.
    unchecked_train_step: Whether the Task overrides `train_step` and the
      run does not check its loss scaling (`trainer.model.loss_scaling`): a new
      run on several replicas then says how to check it (a loss averaged
      over the replica's batch trains, on N replicas, with N times the
      gradient).
    dry_run: Whether `model_dir` is a dry run's temporary directory,
      deleted after it: named as such, with no TensorBoard command for it.
  """
  place = ("a temporary directory (a dry run: deleted after)" if dry_run
           else model_dir)
  plan = _plan(config, training, evaluating)
  if not dry_run:
    plan.append(f"tensorboard --logdir {model_dir}")
  lines = [f"run | {task_name}, {mode} in {place}: "
           f"{_origin(restored_path, step, training)}",
           "run | " + " | ".join(_setup(strategy, runtime, config,
                                        num_workers, training)),
           "run | " + " | ".join(plan)]
  replicas = strategy.num_replicas_in_sync
  if (unchecked_train_step and training and replicas > 1 and
      not restored_path):
    lines.append(
        f"run | {task_name}.train_step is your own: on {replicas} replicas "
        "its loss must be this replica's share of the global-batch mean "
        "(tf.nn.compute_average_loss); scripts/check_task.py with these gin "
        "files checks it against one device")
  return lines


def closing(*, step: int, start_step: int, seconds: float, fingerprint: str,
            results: Optional[Dict[str, Any]], best: Optional[Dict[str, Any]],
            best_dir: Optional[str], checkpoint: Optional[str],
            export: Optional[str], held_out: Sequence[str] = ()
            ) -> List[str]:
  """Returns the closing lines of a run that trained.

  Args:
    step: The step reached.
    start_step: The step the run started from.
    seconds: The run's wall time, evaluations and saves included.
    fingerprint: `state.weights_fingerprint` of the final weights.
    results: The last evaluation's results, or None.
    best: `best_checkpoint`'s record (`metric`, `value`, `step`), or None.
    best_dir: Where the best checkpoint is.
    checkpoint: The newest checkpoint's path, or None.
    export: The SavedModel exported at the end, or None.
    held_out: The named sets never judged, marked in the results.
  """
  lines = [f"train | finished at step {step} | {step - start_step} steps in "
           f"{seconds:.1f} s | weights fingerprint {fingerprint}"]
  saved = []
  if checkpoint:
    saved.append(f"checkpoint {checkpoint}")
  if export:
    saved.append(f"export {export}")
  if saved:
    lines.append("saved | " + " | ".join(saved))
  if best:
    lines.append(f"best eval | {best['metric']} "
                 f"{format_value(best['value'])} at step {best['step']}, in "
                 f"{best_dir}")
  # Last, as scripts reading a run's results expect.
  if results:
    lines.append(f"final eval | {format_results(results, held_out)}")
  return lines


def print_lines(lines: List[str]) -> None:
  """Prints each line (`console.info`)."""
  for line in lines:
    console.info(line)
