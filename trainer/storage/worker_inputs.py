"""Each worker's training input position, saved beside the chief's
checkpoint of the same step.

With several workers the chief's checkpoint holds the model once, but every
worker reads its own input pipeline: its iterator is its own. So before each
save every worker writes its iterator into
`<model_dir>/input/workers-<n>/worker-<i>/ckpt-<step>` (a plain
`tf.train.Checkpoint` of the iterator alone, a few kilobytes where the
pipeline stores positions only), and the workers meet at a barrier before the
chief's save: a checkpoint of step N is complete only once every worker's
position of step N is. A resume at step N restores each worker's own; where
one is missing (a save interrupted between the two, the worker count changed)
that worker skips the batches it trained on instead, as
`trainer.input_position = "skip"` does, and says so. A position is never
taken from another step than the model's.

TensorFlow has no such piece: `tf.train.Checkpoint` of a
`MultiWorkerMirroredStrategy` run writes one checkpoint, the chief's, and the
other workers' copies go to directories of their own that nobody keeps
(Model Garden and Orbit keep no input position at all).
"""

import os
import re
from typing import Callable, List, Optional

import tensorflow as tf

from trainer import console
from trainer.storage import checkpoints
from trainer.storage import files

# The folder of `model_dir` the positions are in.
FOLDER = "input"
_STEP = re.compile(r"^ckpt-(\d+)\.index$")


def directory(model_dir: str, num_workers: int, worker_index: int) -> str:
  """Where worker `worker_index` of `num_workers` keeps its positions."""
  return os.path.join(model_dir, FOLDER, f"workers-{num_workers}",
                      f"worker-{worker_index}")


def saved_steps(folder: str) -> List[int]:
  """The steps of the positions complete in `folder`, oldest first."""
  if not files.isdir(folder):
    return []
  return sorted(int(match.group(1)) for match in (
      _STEP.match(name) for name in files.listdir(folder)) if match)


class WorkerInputs:
  """This worker's saved input positions, one per checkpointed step."""

  def __init__(self, model_dir: str, num_workers: int, worker_index: int,
               iterator_fn: Callable[[], object],
               barrier_fn: Callable[[], None]):
    """Builds the positions.

    Args:
      model_dir: The run's model_dir (the chief's checkpoints), also for a
        worker that writes the rest into a directory of its own.
      num_workers: Workers reading the input.
      worker_index: This worker's index.
      iterator_fn: Returns the training iterator now read (a restore or a
        skip replaces it).
      barrier_fn: Returns once every worker has called it (a collective).
    """
    self._model_dir = model_dir
    self._num_workers = num_workers
    self._worker_index = worker_index
    self._folder = directory(model_dir, num_workers, worker_index)
    self._iterator_fn = iterator_fn
    self._barrier_fn = barrier_fn

  def _prefix(self, step: int) -> str:
    return os.path.join(self._folder, f"ckpt-{step}")

  def save(self, step: int) -> str:
    """Writes this worker's position of `step`, drops those of steps the
    chief no longer keeps, then waits for every worker to have written;
    returns the position's checkpoint prefix."""
    prefix = tf.train.Checkpoint(iterator=self._iterator_fn()).write(
        self._prefix(step))
    self._prune(step)
    self._barrier_fn()
    return prefix

  def _prune(self, step: int) -> None:
    """Removes the positions older than the chief's oldest kept checkpoint
    (what `max_to_keep` dropped), and leftovers of interrupted writes."""
    state = tf.train.get_checkpoint_state(self._model_dir)
    kept = {int(path.rsplit("-", 1)[1])
            for path in (state.all_model_checkpoint_paths if state else [])}
    oldest = min(kept | {step})
    for name in files.listdir(self._folder):
      found = re.match(r"^ckpt-(\d+)(?:\.|_temp)", name.rstrip("/"))
      if found and int(found.group(1)) < oldest:
        files.remove_any(os.path.join(self._folder, name))

  def restore(self, step: int) -> Optional[str]:
    """Restores this worker's position of `step` into the iterator; returns
    the `input |` line saying so, or None where none is saved (the caller
    then skips), after a line saying why."""
    if step in saved_steps(self._folder):
      prefix = self._prefix(step)
      tf.train.Checkpoint(iterator=self._iterator_fn()).read(
          prefix).assert_consumed()
      return (f"input | resuming: worker {self._worker_index} continues "
              f"from its position of step {step} ({prefix})")
    others = self._other_worker_counts(step)
    if not others and _holds_an_iterator(
        os.path.join(self._model_dir, f"ckpt-{step}")):
      others = [1]  # One worker's position is in the checkpoint itself.
    if others:
      console.info(
          f"input | step {step} was trained on {others[0]} worker(s), this "
          f"run has {self._num_workers}: the saved positions belong to the "
          "old shards, so each worker skips the batches of its new shard "
          "trained on (`skip`; the examples of the old shards are not "
          "matched: some of this epoch's may be read again or left out)")
    else:
      console.info(
          f"input | worker {self._worker_index} has no saved position of "
          f"step {step} (a save interrupted before it was written): it "
          "skips the batches trained on instead")
    return None

  def _other_worker_counts(self, step: int) -> List[int]:
    """The worker counts other than this run's with positions of `step`."""
    root = os.path.join(self._model_dir, FOLDER)
    if not files.isdir(root):
      return []
    counts = []
    for name in files.listdir(root):
      found = re.match(r"^workers-(\d+)$", name.rstrip("/"))
      if found and int(found.group(1)) != self._num_workers:
        count = int(found.group(1))
        if step in saved_steps(directory(self._model_dir, count, 0)):
          counts.append(count)
    return sorted(counts)


def _holds_an_iterator(prefix: str) -> bool:
  """Whether the checkpoint at `prefix` holds a one-worker run's iterator."""
  try:
    names = tf.compat.v1.train.NewCheckpointReader(
        prefix).get_variable_to_dtype_map()
  except (tf.errors.OpError, ValueError):
    return False
  return any(name.startswith(checkpoints.INPUT_POSITION + "/")
             for name in names)
