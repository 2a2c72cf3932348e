"""Training goes on with a new tf.data service job where the service lost
this run's.

A dispatcher restarted without a journal forgets every dataset and job: the
iterator fails with `NotFoundError`, after the steps the loop had trained.
The pipeline built again registers anew and reads a new job, from its first
batch (as a resumed run does). The first new job may fail too (measured: its
ids are the restarted dispatcher's first, which the workers still hold for
the lost job's tasks), so up to `data_service.NEW_JOBS` new jobs in a row
are tried. Orbit's trainer has no retry of its own: its `train` simply
raises.
"""

from typing import Any, Callable

import tensorflow as tf

from trainer import console
from trainer.data import service as data_service


def train_on_new_jobs(train_fn: Callable[[tf.Tensor], Any],
                      num_steps: tf.Tensor, step_fn: Callable[[], int],
                      new_pipeline_fn: Callable[[], None]) -> Any:
  """Trains `num_steps` steps on the tf.data service's batches, reading from
  a new job where the service lost this run's.

  Args:
    train_fn: Trains the given number of steps (Orbit's `train`).
    num_steps: The steps to train.
    step_fn: Reads the global step.
    new_pipeline_fn: Builds the input pipeline again and reads from it (a
      new job; the old pipeline names a dataset id the restarted dispatcher
      does not know, "Dataset id 1000 not found", measured).

  Returns:
    What `train_fn` returned.

  Raises:
    errors.RunError: If none of the new jobs yields a batch.
  """
  remaining = int(num_steps)
  failures = 0  # The job lost, then new jobs that yielded no batch.
  while True:
    start = step_fn()
    try:
      return train_fn(num_steps)
    except tf.errors.NotFoundError as e:
      trained = step_fn() - start
      remaining -= trained
      num_steps = tf.constant(remaining, tf.int32)
      if trained:
        failures = 0
      if not failures:
        console.warning(data_service.new_job_line(start + trained))
      failures += 1
      if failures > data_service.NEW_JOBS:
        raise data_service.lost_job(e, data_service.NEW_JOBS) from e
      new_pipeline_fn()
