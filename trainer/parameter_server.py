"""Parameter-server training, in one place: what each role runs, the
coordinator, and the trainer that schedules steps on the workers.

It runs on TensorFlow's own machinery. TF_CONFIG names chief, worker and ps
tasks (and optionally an `evaluator`). Workers and parameter servers start a
`tf.distribute.Server` and serve until stopped (`cluster.serve_forever`);
the chief builds a `ParameterServerStrategy` and a `ClusterCoordinator`,
which schedules each step on a free worker; the evaluator task evaluates the
chief's checkpoints as a sidecar (`--mode=continuous_eval`, no strategy).
"""

import dataclasses
import math
from typing import Optional

from absl import logging
import tensorflow as tf

from trainer import cluster
from trainer import config as config_lib
from trainer import console
from trainer import errors
from trainer import runners
from trainer import runtime as runtime_lib


def uses(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` trains on a parameter-server cluster."""
  return isinstance(strategy,
                    tf.distribute.experimental.ParameterServerStrategy)


def role_runtime(runtime: runtime_lib.RuntimeConfig, mode: str,
                 config: config_lib.TrainerConfig
                 ) -> Optional[runtime_lib.RuntimeConfig]:
  """Acts on this process's role in the cluster.

  Returns:
    None after serving as a worker or ps (until stopped); otherwise the
    runtime to train (chief) or evaluate (evaluator, on no strategy) with.

  Raises:
    errors.ConfigError: If the role cannot run `mode`, or for settings
      parameter servers do not support.
  """
  if config.on_nonfinite == "rollback":
    raise errors.ConfigError(
        "`trainer.on_nonfinite='rollback'` is not supported with "
        "'parameter_server': use 'stop' and restart.")
  role, index = cluster.task_role()
  if role in ("worker", "ps"):
    cluster.serve_forever(role, index)
    return None
  if role == "evaluator":
    # The sidecar evaluator reads the chief's checkpoints on its own.
    if mode not in ("eval", "continuous_eval"):
      raise errors.ConfigError(
          "the evaluator task runs --mode=continuous_eval (or eval).")
    return dataclasses.replace(runtime, distribution_strategy="default")
  if mode != "train":
    raise errors.ConfigError(
        "with 'parameter_server' the chief runs --mode=train; evaluation "
        "runs in an `evaluator` task (--mode=continuous_eval).")
  return runtime


class ScheduledTaskTrainer(runners.TaskTrainer):
  """A `TaskTrainer` whose steps a `ClusterCoordinator` schedules on the
  parameter-server cluster's workers.

  Steps run asynchronously; a loop waits for all of its steps (`join`), so
  the step count is exact when it returns. Each worker reads its own shard
  of a per-worker dataset, which cannot be checkpointed.
  """

  def __init__(self, task, model, optimizer,
               strategy: tf.distribute.Strategy, train_input, global_step,
               **options):
    """Builds the coordinator and the trainer; see `TaskTrainer`."""
    self._coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    self._num_workers = cluster.num_tasks("worker")
    console.info(f"cluster | coordinator schedules steps on "
                 f"{self._num_workers} worker(s); variables on "
                 f"{cluster.num_tasks('ps')} ps")
    if self._num_workers > 1:
      console.info(f"input | worker i of {self._num_workers} reads examples "
                   f"i, i + {self._num_workers}, ... of the task's training "
                   "data")
    super().__init__(task, model, optimizer, strategy, train_input,
                     global_step, **options)

  def _host_scope(self):
    # Workers only reach variables created in the strategy scope.
    return self.strategy.scope()

  def _train_dataset(self):
    # Per-worker iterators cannot be checkpointed; Orbit makes one.
    self.train_iterator = None
    return self._coordinator.create_per_worker_dataset(
        self._input.per_worker_dataset_fn(self._num_workers))

  def input_resumption(self, input_position: str, num_workers: int) -> str:
    del input_position, num_workers  # Steps run in no fixed order.
    logging.warning("parameter_server: the input position is not "
                    "checkpointed; a restarted run reads each worker's "
                    "shard from its start.")
    return "restart"

  def _measures_input_wait(self) -> bool:
    return False  # Workers have no chief variable to add to.

  def create_train_loop_fn(self):
    """Returns a loop that schedules each step on a free worker."""
    step = tf.function(self.train_step)

    def loop(iterator, num_steps):
      losses = [self._coordinator.schedule(step, args=(iterator,))
                for _ in range(int(num_steps))]
      self._coordinator.join()
      values = [float(loss.fetch()) for loss in losses]
      # Steps ran asynchronously: the first scheduled non-finite one counts.
      bad = [i for i, value in enumerate(values) if not math.isfinite(value)]
      first = int(self.global_step.numpy()) - len(values) + 1
      self._status.assign(tf.stack([
          tf.constant(sum(values) / len(values), tf.float64),
          tf.constant(first + bad[0] if bad else -1, tf.float64),
          self._scheduled_rate()]))

    return loop
