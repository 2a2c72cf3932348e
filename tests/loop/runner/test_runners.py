"""`TaskTrainer`: eager execution, XLA, the stateful random ops check, and
the global step's count inside a loop."""

import collections
import threading
import time

import numpy as np
import orbit
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import experiment
from trainer.data import inputs as inputs_lib
from trainer.loop.runner import replica_step
from trainer.loop.runner import runners
from trainer.model import gradients

import helpers


def _config(**overrides):
  settings = dict(train_steps=12, steps_per_loop=4, summary_interval=4,
                  global_batch_size=16, eval_batch_size=24)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def test_run_eagerly_runs_python_every_step_with_the_same_result(tmp_path):
  class Recording(helpers.LinearRegression):
    calls = []

    def train_step(self, inputs, model, optimizer, metrics=None):
      Recording.calls.append(tf.executing_eagerly())
      return super().train_step(inputs, model, optimizer, metrics)

  experiment.run(Recording(), "train", str(tmp_path / "eager"),
                 trainer.RuntimeConfig(run_eagerly=True, seed=0), _config())
  assert Recording.calls == [True] * 12
  Recording.calls.clear()
  experiment.run(Recording(), "train", str(tmp_path / "graph"),
                 trainer.RuntimeConfig(seed=0), _config())
  # Traced (once or twice: autograph may trace the loop body twice), not run.
  assert 1 <= len(Recording.calls) <= 2 and not any(Recording.calls)
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "eager")),
      helpers.checkpoint_weights(str(tmp_path / "graph"))) < 1e-5


@pytest.mark.parametrize("strategy",
                         ["one_device", "mirrored", "central_storage"])
def test_enable_xla_matches_the_default_run(tmp_path, strategy):
  for name, xla in (("xla", True), ("plain", False)):
    experiment.run(
        helpers.LinearRegression(), "train", str(tmp_path / name),
        trainer.RuntimeConfig(
            distribution_strategy=strategy, enable_xla=xla, seed=0,
            num_cpu_devices=2 if strategy == "mirrored" else 0), _config())
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "xla")),
      helpers.checkpoint_weights(str(tmp_path / "plain"))) < 1e-5


def test_xla_on_several_replicas_refuses_a_custom_train_step(tmp_path):
  with pytest.raises(trainer.ConfigError,
                     match="^PerReplicaMeanLinearRegression overrides "
                     "`Task.train_step`, which then does its own gradient "
                     "handling: .* `runtime.enable_xla` on several replicas "
                     "need the default step.$"):
    experiment.run(helpers.PerReplicaMeanLinearRegression(), "train",
                   str(tmp_path),
                   trainer.RuntimeConfig(distribution_strategy="mirrored",
                                         num_cpu_devices=2, enable_xla=True),
                   _config())


class _WithDropout(helpers.LinearRegression):
  """tf_keras `Dropout`: a stateful random op no checkpoint holds."""

  def build_model(self):
    import tf_keras  # pylint: disable=g-import-not-at-top
    return tf_keras.Sequential([tf_keras.Input((4,)),
                                tf_keras.layers.Dense(8, "tanh"),
                                tf_keras.layers.Dropout(0.5),
                                tf_keras.layers.Dense(1)])


class _StatelessDropout(helpers.LinearRegression):
  """Dropout from `tf.random.stateless_uniform`, seeded by the step."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    seed = tf.stack([tf.cast(optimizer.iterations, tf.int32), 7])
    keep = tf.random.stateless_uniform(tf.shape(features), seed) > 0.1
    return super().train_step((tf.where(keep, features, 0.0), labels),
                              model, optimizer, metrics)


def test_deterministic_warns_about_stateful_random_ops(tmp_path, capsys):
  runtime = trainer.RuntimeConfig(deterministic=True)
  experiment.run(_WithDropout(), "train", str(tmp_path / "a"), runtime,
                 _config())
  out = capsys.readouterr().out
  assert ("warning | runtime.deterministic: the train step uses stateful "
          "random ops (RandomUniform (") in out
  experiment.run(_StatelessDropout(), "train", str(tmp_path / "b"), runtime,
                 _config())
  assert "stateful random ops" not in capsys.readouterr().out


def test_deterministic_seeds_with_zero_by_default(tmp_path):
  for name in ("a", "b"):
    experiment.run(helpers.LinearRegression(), "train", str(tmp_path / name),
                   trainer.RuntimeConfig(deterministic=True), _config())
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(str(tmp_path / "a")),
      helpers.checkpoint_weights(str(tmp_path / "b"))) == 0.0


def test_a_step_is_counted_once_its_batch_has_come_and_while_a_loop_runs():
  # The tf.data service's stall warning reads the global step from another
  # thread while a loop runs: it must move inside the loop, and only for
  # batches that came (nothing else orders the increment after `next`).
  gate, batch_size = threading.Event(), 16

  def examples():
    for i in range(20 * batch_size):
      if i == 3 * batch_size:
        gate.wait(60)  # Three batches come; the fourth waits.
      yield np.ones(4, np.float32), np.ones(1, np.float32)

  task = helpers.LinearRegression()
  strategy = tf.distribute.get_strategy()
  train_input = inputs_lib.DistributedInput(
      strategy, lambda ctx: tf.data.Dataset.from_generator(
          examples, output_signature=(tf.TensorSpec([4], tf.float32),
                                      tf.TensorSpec([1], tf.float32))),
      batch_size, training=True)
  model = task.build_model()
  global_step = orbit.utils.create_global_step()
  optimizer = tf_keras.optimizers.SGD(0.01)
  task_trainer = runners.TaskTrainer(task, model, optimizer, strategy,
                                     train_input, global_step)
  loop = threading.Thread(target=task_trainer.train,
                          args=(tf.constant(10),))
  loop.start()
  deadline = time.monotonic() + 60
  while global_step.numpy() < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
  time.sleep(1.0)  # Time enough to count a step that has no batch.
  blocked_at = int(global_step.numpy())
  gate.set()
  loop.join(60)
  assert (blocked_at, int(global_step.numpy())) == (3, 10)


def _loop_and_bare_body_ops():
  """The ops a step of the runner's compiled loop runs, and those of a bare
  loop (`for _ in tf.range(n): strategy.run(step, ...)`, as
  scripts/benchmark.py's `bare`) over the same per-replica step."""
  task, strategy = helpers.LinearRegression(), tf.distribute.get_strategy()
  train_input = inputs_lib.DistributedInput(
      strategy, lambda ctx: task.build_inputs(True).repeat(), 16,
      training=True)
  model = task.build_model()
  optimizer = tf_keras.optimizers.SGD(0.01)
  task_trainer = runners.TaskTrainer(task, model, optimizer, strategy,
                                     train_input,
                                     orbit.utils.create_global_step())
  task_trainer.train(tf.constant(4))
  step = replica_step.build(
      task, model, optimizer, task_trainer.metrics, gradients.StepOptions(),
      per_replica_batch_size=16, num_replicas=1, enable_xla=False)

  @tf.function
  def bare(iterator, num_steps):
    for _ in tf.range(num_steps):
      strategy.run(step, args=(next(iterator),))

  iterator = iter(train_input.dataset)
  bare(iterator, tf.constant(4))
  return (helpers.while_body_ops(task_trainer.traced_loop()),
          helpers.while_body_ops(bare.get_concrete_function(
              iterator, tf.TensorSpec([], tf.int32))))


def test_a_step_of_the_loop_runs_only_the_ops_every_step_needs():
  # What the runner's loop adds to a bare loop's step, op for op: the input
  # wait's two timestamps, the step's row of the summary window's sums (its
  # loss, count, gradient norm and whether that is finite, the wait), the
  # global step, the guard's finite check in the loop's condition. Not in
  # a step: a branch (`If`: a `break` makes one, with its loop variables),
  # a write to the window's variable (it is carried and written once a
  # loop). Anything new here costs every step of every run: measure it
  # (scripts/benchmark.py at steps_per_loop=100) before pinning it.
  ours, bare = _loop_and_bare_body_ops()
  added = ours - bare
  assert not {"If", "StatelessIf", "Case"} & set(ours)
  assert added == collections.Counter({
      "Timestamp": 2, "Sub": 1,  # The input wait.
      "Cast": 3, "IsFinite": 1, "SelectV2": 1, "Pack": 1, "AddV2": 1,
      "Const": 5, "Identity": 2,  # The window's row, added to the carried.
      "AssignAddVariableOp": 1,  # The global step.
  }) + collections.Counter({"IsFinite": 1}), added  # The guard's.
  assert not bare - ours


def test_the_loop_carries_the_windows_sums_to_the_same_bits_as_each_step():
  # The compiled loop adds its steps to the window once a loop; the train
  # summaries must read what adding each step to the window's variable
  # gives (the parameter-server loop still does), bit for bit.
  task, strategy = helpers.LinearRegression(), tf.distribute.get_strategy()

  def build():
    tf_keras.utils.set_random_seed(0)
    train_input = inputs_lib.DistributedInput(
        strategy, lambda ctx: task.build_inputs(True).repeat(), 16,
        training=True)
    return runners.TaskTrainer(task, task.build_model(),
                               tf_keras.optimizers.SGD(0.01), strategy,
                               train_input, orbit.utils.create_global_step())

  looped, stepped = build(), build()
  for num_steps in (3, 1, 4, 2):  # 10 steps in the window.
    looped.train(tf.constant(num_steps))
  step = tf.function(stepped.train_step)
  for _ in range(10):
    step(stepped.train_iterator)
  read = [runner.read_and_reset_metrics() for runner in (looped, stepped)]
  for results in read:
    assert results.pop("input_wait_seconds") >= 0.0
  assert read[0] == read[1] and set(read[0]) == {
      "loss", "gradient_norm", "mae", "learning_rate"}
  assert looped.global_step.numpy() == stepped.global_step.numpy() == 10
