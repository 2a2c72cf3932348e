"""`orbit_adapter`: a plain Orbit runner given the loop's capabilities, built
on its own `train` and output."""

import numpy as np
import orbit
import pytest
import tensorflow as tf

from trainer import errors
from trainer.loop.runner import orbit_adapter
from trainer.loop.runner import runners


class _Plain(orbit.runner.AbstractTrainer):
  """Returns `output` from each loop and records whether the adapter said
  it was in a loop meanwhile."""

  def __init__(self, step, output):
    self.step = step
    self.output = output
    self.adapter = None
    self.seen_in_loop = []

  def train(self, num_steps):
    self.seen_in_loop.append(self.adapter.in_loop)
    self.step.assign_add(tf.cast(num_steps, tf.int64))
    return self.output


class _Capable(_Plain):
  in_loop = False

  def loop_status(self):
    return runners.LoopStatus(0.25, -1, learning_rate=None, step=0)

  def discard_batch(self):
    pass

  def read_and_reset_metrics(self):
    return {}


def _adapted(output, step=0):
  global_step = tf.Variable(step, dtype=tf.int64)
  runner = _Plain(global_step, output)
  adapter = orbit_adapter.adapt(runner, global_step)
  runner.adapter = adapter
  return runner, adapter


def test_a_capable_runner_is_its_own_and_none_stays_none():
  step = tf.Variable(0, dtype=tf.int64)
  capable = _Capable(step, None)
  assert orbit_adapter.adapt(capable, step) is capable
  assert orbit_adapter.adapt(None, step) is None


def test_the_loop_status_is_the_outputs_loss():
  runner, adapter = _adapted({"loss": tf.constant(0.5), "accuracy": 0.75})
  assert isinstance(adapter, orbit_adapter.OrbitRunnerAdapter)
  assert adapter.train(tf.constant(3)) is runner.output
  assert runner.seen_in_loop == [True] and not adapter.in_loop
  assert adapter.loop_status() == runners.LoopStatus(
      0.5, -1, learning_rate=None, step=None)
  assert adapter.read_and_reset_metrics() == {"loss": np.float32(0.5),
                                              "accuracy": 0.75}


def test_no_loss_in_the_output_is_no_loop_loss():
  _, adapter = _adapted({"accuracy": tf.constant(0.5)})
  adapter.train(tf.constant(1))
  assert adapter.loop_status() == runners.LoopStatus(None, -1, None)
  _, adapter = _adapted(None)
  adapter.train(tf.constant(1))
  assert adapter.loop_status() == runners.LoopStatus(None, -1, None)
  assert adapter.read_and_reset_metrics() == {}


def test_a_non_finite_loss_is_reported_at_the_step_reached():
  _, adapter = _adapted({"loss": np.float32("nan")}, step=4)
  adapter.train(tf.constant(2))
  assert adapter.loop_status().nonfinite_step == 6


def test_a_runner_keeps_the_capabilities_it_has():

  class InLoopOnly(_Plain):
    in_loop = True

  step = tf.Variable(0, dtype=tf.int64)
  adapter = orbit_adapter.adapt(InLoopOnly(step, None), step)
  assert isinstance(adapter, orbit_adapter.OrbitRunnerAdapter)
  assert adapter.in_loop  # The runner's own word.


def test_a_runner_that_cannot_skip_a_batch_says_what_to_do():
  _, adapter = _adapted({"loss": 1.0})
  with pytest.raises(errors.ConfigError) as raised:
    adapter.discard_batch()
  assert str(raised.value) == (
      "_Plain cannot skip a batch after a rollback: give it a "
      "`discard_batch()` method, or stop on a non-finite loss "
      "(`trainer.on_nonfinite=\"stop\"`).")


def test_a_standard_trainer_skips_a_batch_of_its_own_input():

  class Standard(orbit.StandardTrainer):

    def __init__(self, step):
      self.step = step
      self.seen = []
      super().__init__(tf.data.Dataset.range(10),
                       options=orbit.StandardTrainerOptions(
                           use_tf_function=False, use_tf_while_loop=False))

    def train_step(self, iterator):
      self.seen.append(int(next(iterator)))
      self.step.assign_add(1)

  step = tf.Variable(0, dtype=tf.int64)
  runner = Standard(step)
  adapter = orbit_adapter.adapt(runner, step)
  adapter.discard_batch()
  adapter.train(tf.constant(2))
  assert runner.seen == [1, 2]
