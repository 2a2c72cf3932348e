"""A resumed run honours the settings it is given, and says what changed.

Before the checkpoint is restored, `compare` reads the configuration the
checkpoint's run wrote (`operative_config.gin`) and compares it with this
run's (`trainer.report.config_changes`); what cannot take effect on a
resume is refused there, before anything is written. After the restore:

  the `resume |` line lists the bindings that differ (`old -> new`);
  the optimizers' hyperparameters are the configured ones, not the
    checkpoint's (`TrainState.assign_hyperparameters`, called by the
    controller after every restore);
  a changed `trainer.global_batch_size` skips the examples trained on
    before, in batches of the new size (`rebase_input`), in place of the
    checkpointed iterator, whose batches have the old shape;
  a changed mixture (`trainer.mixture`, `trainer.mixture_schedule`) skips
    the batches trained on before in a mixture rebuilt at the new rates
    (`remix_input`), in place of the checkpointed iterator, whose buffers
    (prefetched batches, a block of drawn sources) hold draws at the old
    rates, which went on for tens of steps (measured);
  a checkpoint that does not fit the model names the bindings that changed
    and the way out (`mismatch`).

What changes take effect without help: step counts and intervals, clipping
and micro-batches (options of the train step, built anew), schedules (they
take the restored step), evaluation and export settings.
"""

import dataclasses
from typing import Optional, Tuple, Union

from trainer import build
from trainer import errors
from trainer.report import config_changes
from trainer.storage import checkpoints

# The bindings whose change a checkpointed mixture's draws do not follow.
_MIXTURE = ("trainer.mixture", "trainer.mixture_schedule")

# Configurables whose bindings change how the run goes, never the shape of
# what a checkpoint holds: not suspects when a checkpoint does not fit.
_FRAMEWORK = ("trainer", "optimizer", "learning_rate", "runtime", "ema",
              "export", "best_checkpoint", "early_stopping", "warm_start")
# The framework's bindings (prefixes) that shape the training input pipeline.
_INPUT = ("trainer.mixture", "runtime.dataset_")


@dataclasses.dataclass(frozen=True)
class Resume:
  """A training run resuming from a checkpoint saved under another (or the
  same) configuration.

  Attributes:
    step: The step of the checkpoint resumed from.
    checkpoint: Its prefix.
    changes: The bindings that differ from its run's, sorted by name.
    recorded_batch_size: The global batch size the checkpoint's input was
      read in, as it records it; None for a checkpoint that does not.
    batch_size: This run's global batch size.
  """
  step: int
  checkpoint: str
  changes: Tuple[config_changes.Change, ...]
  recorded_batch_size: Optional[int] = None
  batch_size: Optional[int] = None

  @property
  def batch_sizes(self) -> Optional[Tuple[int, int]]:
    """`(old, new)` global batch size where it changed; None where it did
    not.

    The checkpoint's own record decides where it has one: the configuration
    the run before wrote may be a later run's, killed after its first loop
    and before its first save.
    """
    if self.recorded_batch_size is not None and self.batch_size is not None:
      if self.recorded_batch_size == self.batch_size:
        return None
      return self.recorded_batch_size, self.batch_size
    found = config_changes.named(self.changes, "trainer.global_batch_size")
    if not found or found[0].old is None or found[0].new is None:
      return None
    return int(found[0].old), int(found[0].new)

  def line(self) -> Optional[str]:
    """The `resume |` line; None where nothing changed."""
    return config_changes.line(self.step, self.changes)


def compare(parts: build.Parts, restore_dir: str) -> Optional[Resume]:
  """Compares this run's configuration with that of the checkpoint's run,
  for a training run that resumes; None otherwise, or where the run before
  wrote no configuration (it stopped before its first loop ended) and the
  checkpoint records no batch size.

  Call once the parts are built (every configurable has been called) and
  before the restore and the first loop (which writes this run's).

  Raises:
    errors.ConfigError: For a change that cannot take effect on a resume,
      naming the binding and the way out.
  """
  if not parts.training:
    return None
  found = checkpoints.candidates(restore_dir)
  step = checkpoints.newest_step(restore_dir)
  if not found or not step:
    return None
  old = config_changes.read(restore_dir)
  changes = (config_changes.changes(old, config_changes.operative())
             if old is not None else ())
  # Read from the checkpoint, which decides (the configuration in model_dir
  # may be a later run's, killed before its first save).
  _refuse_other_wrappers(parts, found[0], step, changes)
  recorded = _recorded_batch_size(found[0])
  if old is None and recorded is None:
    return None
  resume = Resume(step, found[0], changes, recorded_batch_size=recorded,
                  batch_size=parts.config.global_batch_size)
  for change in config_changes.named(resume.changes, "optimizer.name"):
    raise errors.ConfigError(
        f"`{change.binding}` changed since step {step} ({change.old} -> "
        f"{change.new}): an optimizer of another kind cannot continue from "
        f"the checkpoint's (its slots differ); set it back to {change.old}, "
        "or train in a new --model_dir starting from the weights: "
        f"`warm_start.checkpoint = '{resume.checkpoint}'`.")
  return resume


def _refuse_other_wrappers(parts: build.Parts, path: str, step: int,
                           changes: Tuple[config_changes.Change, ...]
                           ) -> None:
  """Refuses EMA turned on or off since checkpoint `path` (of `step`), and
  a dynamic loss scale (float16) turned on: each wraps the optimizer, whose
  state the checkpoint holds under other keys, or without the loss scale.
  (A loss scale turned off is dropped: the rest restores.)

  Raises:
    errors.ConfigError: Naming the binding and the ways on.
  """
  saved = checkpoints.saved_keys(path)
  if saved is None:
    return  # Damaged: the restore passes over it.
  weights = ("train in a new --model_dir starting from the weights: "
             f"`warm_start.checkpoint = '{path}'`")
  averaged = checkpoints.holds(saved, checkpoints.EMA)
  if checkpoints.tracks(parts.checkpoint, checkpoints.EMA) != averaged:
    head, back = _changed(changes, ("ema.decay",), step,
                          parts.config.ema.decay)
    raise errors.ConfigError(
        f"{head}: checkpoint {path} was saved "
        f"{'with' if averaged else 'without'} EMA, which wraps the "
        f"optimizer, and EMA cannot be turned on or off on a resume; {back}"
        f"{weights}.")
  if (checkpoints.tracks(parts.checkpoint, checkpoints.LOSS_SCALE) and
      not checkpoints.holds(saved, checkpoints.LOSS_SCALE)):
    head, back = _changed(
        changes, ("runtime.mixed_precision_dtype", "runtime.loss_scale"),
        step, parts.runtime.mixed_precision_dtype)
    raise errors.ConfigError(
        f"{head}: checkpoint {path} holds no dynamic loss scale, which "
        f"float16 keeps in the optimizer's state; {back}keep float16 with a "
        "fixed scale, which has no state (`runtime.loss_scale = 1024`), or "
        f"{weights}.")


def _changed(changes: Tuple[config_changes.Change, ...],
             bindings: Tuple[str, ...], step: int, value
             ) -> Tuple[str, str]:
  """`(what changed, the way back)` for the first of `bindings` that
  changed since `step`, else for the first, at this run's `value` (the
  configuration of the checkpoint's run is not known)."""
  for binding in bindings:
    for change in config_changes.named(changes, binding):
      return (f"`{change.binding}` changed since step {step} ({change.old} "
              f"-> {change.new})", f"set it back to {change.old}, or ")
  return f"`{bindings[0]}` is {value!r} in this run", ""


def _recorded_batch_size(path: str) -> Optional[int]:
  """The batch size checkpoint `path` records; None where it records none
  or cannot be read (a damaged one, which the restore passes over)."""
  try:
    return checkpoints.recorded_batch_size(path)
  except Exception:  # pylint: disable=broad-except
    return None


def mismatch(error: Union[errors.CheckpointMismatch, errors.InputMismatch],
             resume: Optional[Resume]) -> errors.ConfigError:
  """`error` (a checkpoint that does not fit the model, or its input position
  the input pipeline), with the bindings of the model (or the input) that
  changed since it was saved and the way out (unless it says one already: a
  model added since the checkpoint)."""
  if isinstance(error, errors.InputMismatch):
    return _input_mismatch(error, resume)
  if resume is None or error.names_way_out:
    return error
  suspects = [str(change) for change in resume.changes
              if change.unscoped.split(".")[0] not in _FRAMEWORK]
  changed = (f"; changed since step {resume.step}: {', '.join(suspects)}"
             if suspects else "")
  # Without a suspect binding, the Task's code changed the model.
  back = "set them back, or train" if suspects else "train"
  return errors.ConfigError(
      f"{str(error).rstrip('.')}{changed}: a model of another shape cannot "
      f"resume this run; {back} in a new --model_dir starting from the "
      f"weights that fit: `warm_start.checkpoint = '{resume.checkpoint}'` "
      "(and `warm_start.modules`).")


def _input_mismatch(error: errors.InputMismatch,
                    resume: Optional[Resume]) -> errors.ConfigError:
  """`error`, with the bindings that may have changed the input pipeline
  since the checkpoint: the Task's and the mixture's."""
  suspects = [str(change) for change in (resume.changes if resume else ())
              if change.unscoped.split(".")[0] not in _FRAMEWORK or
              change.unscoped.startswith(_INPUT)]
  if not suspects:
    return error
  return errors.ConfigError(
      f"{error.cause}; changed since step {resume.step}: "
      f"{', '.join(suspects)}: set them back, or {error.way_out}.")


def rebase_input(parts: build.Parts, resume: Optional[Resume]
                 ) -> Optional[str]:
  """Where `trainer.global_batch_size` changed, skips the examples trained
  on before in batches of the new size; returns the `input |` line saying
  so, or None where the batch size did not change or the input restarts
  anyway (it says so itself)."""
  if resume is None or resume.batch_sizes is None or parts.restarts_input:
    return None
  old, new = resume.batch_sizes
  batches, examples = parts.trainer.rebase_input(resume.step, old, new)
  again = examples - batches * new
  return (f"input | resuming with global batch {new} ({old} before): skips "
          f"{batches} batch(es) of {new}, the {examples} examples trained on "
          "before" + (f" but the last {again}, read again" if again else ""))


def remix_input(parts: build.Parts, resume: Optional[Resume]
                ) -> Optional[str]:
  """Where the mixture's rates changed and the input was restored from the
  checkpoint, reads a mixture rebuilt at the new rates, skipped by the
  batches trained on before, so the new rates hold from the resumed step
  on; returns the `input |` line saying so, else None.

  The checkpointed iterator holds batches prefetched and sources drawn at
  the old rates (tf.data saves its buffers), and symbolic checkpointing,
  which saves none, made the shipped mixture's pipeline 20-40 times slower
  (measured): so the position is found as `trainer.input_position="skip"`
  finds it. Each source's place is then where the new rates would have
  put it, not the old run's (no run at both rates could be matched).
  """
  if (resume is None or parts.resume_input_fn is not None or
      parts.restarts_input or resume.batch_sizes is not None):
    return None  # The input is rebuilt anyway, at the new rates.
  changed = [change for binding in _MIXTURE
             for change in config_changes.named(resume.changes, binding)
             if change.new is not None]
  if not changed:
    return None
  skipped = parts.trainer.skip_input(resume.step)
  return (f"input | resuming with the mixture changed ("
          f"{', '.join(change.unscoped for change in changed)}): the new rates "
          f"hold from step {resume.step + 1}; skips the {skipped} batch(es) "
          "trained on before in a mixture rebuilt at them, in place of the "
          "checkpoint's, whose buffered draws are at the old rates")
