"""Checkpoint manager creation and restore-or-initialise."""

from typing import Callable, Optional

import tensorflow as tf


def create_manager(checkpoint: tf.train.Checkpoint, directory: str,
                   max_to_keep: int, global_step: tf.Variable,
                   init_fn: Optional[Callable[[], None]] = None
                   ) -> tf.train.CheckpointManager:
  """Returns a manager saving `checkpoint` as `directory/ckpt-<step>`.

  Args:
    checkpoint: What to save (model, optimizer, global step, iterator...).
    directory: The run's `model_dir`.
    max_to_keep: Newest checkpoints kept; older ones are deleted.
    global_step: Numbers the checkpoints.
    init_fn: Called instead of a restore when there is no checkpoint yet.
  """
  return tf.train.CheckpointManager(
      checkpoint, directory=directory, max_to_keep=max_to_keep,
      step_counter=global_step, init_fn=init_fn)


def restore(manager: tf.train.CheckpointManager,
            path: Optional[str] = None, partial: bool = False
            ) -> Optional[str]:
  """Restores `path` (default: the newest checkpoint) or initialises.

  Args:
    manager: Owns the checkpoint object and its directory.
    path: A checkpoint prefix; None for the newest in the directory.
    partial: Expect the checkpoint to hold more than this run built (eval
      modes build no optimizer); otherwise every object built must match.

  Returns:
    The restored prefix, or None when there was nothing to restore and
    `init_fn` ran instead.
  """
  path = path or manager.latest_checkpoint
  if path is None:
    return manager.restore_or_initialize()
  status = manager.checkpoint.restore(path)
  if partial:
    status.expect_partial()
  else:
    # Everything built must match; optimizer slots not built yet are filled
    # when the first step creates them (deferred restoration).
    status.assert_existing_objects_matched().expect_partial()
  return path
