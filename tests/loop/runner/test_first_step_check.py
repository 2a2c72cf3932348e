"""`first_step_check`: a new run's first loop runs its first step alone,
reports the whole loop as one, and checks the recorded losses."""

import math

import pytest
import tensorflow as tf

from trainer import errors
from trainer.loop.runner import first_step_check

import helpers


class _TwoReplicas:
  """What the check asks of a strategy, as on two replicas whose values
  are already reduced."""

  num_replicas_in_sync = 2

  def experimental_local_results(self, value):
    return (value,)

  def reduce(self, unused_op, value, axis=None):
    del axis
    return value


def _check(enabled=True, status=None):
  if status is None:
    status = tf.Variable([0.0, -1.0, float("nan"), 0.0], tf.float64)
  return first_step_check.FirstStepCheck(
      helpers.PerReplicaMeanLinearRegression(), object(), object(),
      _TwoReplicas(), status, enabled)


def _reference(total, count):
  """`loss_scaling.reference_losses`: the sum and count of the losses."""
  return tf.constant(total, tf.float64), tf.constant(count, tf.float64)


def test_only_a_new_runs_first_loop_is_checked():
  check = _check()
  assert check.pending
  assert not check.starts(tf.Variable(5))  # Resumed: checked when new.
  assert not check.pending
  check = _check()
  assert check.starts(tf.Variable(0))
  assert not check.starts(tf.Variable(0))  # Once.
  assert not _check(enabled=False).pending


def test_the_first_loop_reports_its_steps_as_one_loop():
  status = tf.Variable([0.0, -1.0, float("nan"), 0.0], tf.float64)
  calls = []

  def loop_fn(iterator, num_steps, check_first_step=False):
    calls.append((iterator, int(num_steps), check_first_step))
    if check_first_step:
      status.assign([2.0, -1.0, 0.5, 1.0])
      return "first batch"
    status.assign([4.0, -1.0, 0.25, 4.0])  # The mean of steps 2 to 4.
    return None

  check = _check(status=status)
  check.first_loop(loop_fn)("iterator", tf.constant(4))
  assert calls == [("iterator", 4, True), ("iterator", 3, False)]
  assert status.numpy().tolist() == [3.5, -1.0, 0.25, 4.0]


def test_a_nonfinite_first_step_ends_the_first_loop():
  status = tf.Variable([0.0, -1.0, float("nan"), 0.0], tf.float64)
  calls = []

  def loop_fn(iterator, num_steps, check_first_step=False):
    calls.append(check_first_step)
    status.assign([0.0, 0.0, float("nan"), 1.0])

  _check(status=status).first_loop(loop_fn)("iterator", tf.constant(4))
  assert calls == [True]


def test_a_loss_averaged_per_replica_is_refused_after_the_first_loop():
  check = _check()
  # The step's loss, summed over 2 replicas: 4.0; the reference's global
  # mean: 4.0 / 2 examples.
  assert check.record(tf.constant(4.0), {"loss": tf.constant(4.0)}, None,
                      _reference(4.0, 2.0)) is None
  with pytest.raises(errors.ConfigError,
                     match=r"^PerReplicaMeanLinearRegression\.train_step's "
                     r"loss on the first step, summed over 2 replicas, is 4: "
                     r"2\.00 times the global-batch mean"):
    check.check()


def test_a_loss_scaled_by_the_global_batch_passes():
  check = _check()
  check.record(tf.constant(2.0), {"loss": tf.constant(2.0)}, None,
               _reference(4.0, 2.0))
  check.check()


def test_with_several_models_the_first_replicas_batch_and_loss_are_kept():
  check = first_step_check.FirstStepCheck(
      helpers.PerReplicaMeanLinearRegression(), {"a": object()}, {},
      _TwoReplicas(), tf.Variable([0.0, -1.0, math.nan, 0.0], tf.float64),
      enabled=False)
  batch = check.record(tf.constant(3.0), {"loss": tf.constant(1.5)},
                       "first replica's batch", None)
  assert batch == "first replica's batch"
  # The check's figures: the global loss, the first replica's, 0.
  # pylint: disable-next=protected-access
  assert check._losses.numpy().tolist() == [3.0, 1.5, 0.0]
