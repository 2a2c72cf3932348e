"""The trainer of a parameter-server cluster's chief: a `TaskTrainer` whose
steps a `ClusterCoordinator` schedules on the workers."""

import math

import tensorflow as tf

from trainer import console
from trainer.distribute import cluster
from trainer.loop.runner import runners
from trainer.report import tf_logs


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
    tf_logs.condense_coordinator_logs()
    self._num_workers = cluster.num_tasks("worker")
    console.info(f"cluster | coordinator schedules steps on "
                 f"{self._num_workers} worker(s); variables on "
                 f"{cluster.num_tasks('ps')} ps")
    if self._num_workers > 1:
      console.info(f"input | worker i of {self._num_workers} reads examples "
                   f"i, i + {self._num_workers}, ... of the task's training "
                   "data")
    # Its loop schedules single steps; the loss-scaling check needs the
    # replicas of one step side by side.
    options["check_loss_scaling"] = False
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
    console.info("input | parameter_server: the input position is not "
                 "checkpointed; a restarted run reads each worker's shard "
                 "from its start")
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
      reached = int(self.global_step.numpy())
      first = reached - len(values) + 1
      self._status.assign(tf.stack([
          tf.constant(sum(values) / len(values), tf.float64),
          tf.constant(first + bad[0] if bad else -1, tf.float64),
          self._scheduled_rate(), tf.constant(reached, tf.float64)]))

    return loop
