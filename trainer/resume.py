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
  a checkpoint that does not fit the model names the bindings that changed
    and the way out (`mismatch`).

What changes take effect without help: step counts and intervals, clipping
and micro-batches (options of the train step, built anew), schedules (they
take the restored step), evaluation and export settings.
"""

import dataclasses
from typing import Optional, Tuple

from trainer import build
from trainer import errors
from trainer.report import config_changes
from trainer.storage import checkpoints

# Configurables whose bindings change how the run goes, never the shape of
# what a checkpoint holds: not suspects when a checkpoint does not fit.
_FRAMEWORK = ("trainer", "optimizer", "learning_rate", "runtime", "ema",
              "export", "best_checkpoint", "early_stopping", "warm_start")


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
  recorded = _recorded_batch_size(found[0])
  if old is None and recorded is None:
    return None
  resume = Resume(
      step, found[0],
      config_changes.changes(old, config_changes.operative())
      if old is not None else (),
      recorded_batch_size=recorded,
      batch_size=parts.config.global_batch_size)
  for change in config_changes.named(resume.changes, "optimizer.name"):
    raise errors.ConfigError(
        f"`{change.binding}` changed since step {step} ({change.old} -> "
        f"{change.new}): an optimizer of another kind cannot continue from "
        f"the checkpoint's (its slots differ); set it back to {change.old}, "
        "or train in a new --model_dir starting from the weights: "
        f"`warm_start.checkpoint = '{resume.checkpoint}'`.")
  return resume


def _recorded_batch_size(path: str) -> Optional[int]:
  """The batch size checkpoint `path` records; None where it records none
  or cannot be read (a damaged one, which the restore passes over)."""
  try:
    return checkpoints.recorded_batch_size(path)
  except Exception:  # pylint: disable=broad-except
    return None


def mismatch(error: errors.CheckpointMismatch,
             resume: Optional[Resume]) -> errors.ConfigError:
  """`error` (a checkpoint that does not fit the model), with the bindings
  of the model that changed since it was saved and the way out (unless it
  says one already: a model added since the checkpoint)."""
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
