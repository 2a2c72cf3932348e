"""`TaskEvaluator`: whole-set eval aggregation (Model Garden's contract) and
evaluation on EMA weights."""

import contextlib
import functools
import json

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import build
from trainer import experiment
from trainer.data import inputs as inputs_lib
from trainer.loop.runner import evaluator as evaluator_lib
from trainer.storage import evaluated
from trainer.model import ema as ema_lib
from trainer.model import optimization
from tasks import digits

import helpers


def _config(**overrides):
  settings = dict(train_steps=12, steps_per_loop=4, summary_interval=4,
                  global_batch_size=16, eval_batch_size=24)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_aggregate_logs_sees_every_eval_example_once(tmp_path, strategy):
  class Aggregating(helpers.LinearRegression):
    """Reports the largest absolute error over the whole eval set."""

    def validation_step(self, inputs, model, metrics=None):
      logs = super().validation_step(inputs, model, metrics)
      logs["errors"] = tf.abs(inputs[1] - model(inputs[0]))[:, 0]
      return logs

    def aggregate_logs(self, state, step_logs):  # Model Garden's contract.
      if state is None:
        state = []
      state.extend(t.numpy() for t in step_logs["errors"])
      return state

    def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
      errors = np.concatenate(aggregated_logs)
      return {"max_error": errors.max(), "count": float(errors.size)}

  task = Aggregating(num_examples=100)  # Eval batches of 24: partial last.
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0)
  output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                          _config())
  assert output["count"] == 100.0
  assert output["max_error"] >= output["mae"] > 0


class _ConfusionDigits(digits.DigitsClassification):
  """Digits with a confusion matrix over the whole eval set."""

  def validation_step(self, inputs, model, metrics=None):
    logs = super().validation_step(inputs, model, metrics)
    logs["labels"] = inputs[1]
    logs["predicted"] = tf.argmax(model(inputs[0], training=False), axis=-1)
    return logs

  def aggregate_logs(self, state, step_logs):  # Model Garden's contract.
    if state is None:
      state = np.zeros([10, 10], np.int64)
    for labels, predicted in zip(step_logs["labels"], step_logs["predicted"]):
      np.add.at(state, (labels.numpy(), predicted.numpy()), 1)
    return state

  def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
    return {"examples": float(aggregated_logs.sum()),
            "matrix_accuracy": float(np.trace(aggregated_logs) /
                                     aggregated_logs.sum())}


def test_a_confusion_matrix_over_the_whole_eval_set(tmp_path):
  # 360 eval images in batches of 128 over 2 replicas: the last batch is
  # partial and one replica's share of it is short.
  output = experiment.run(
      _ConfusionDigits(), "train_and_eval", str(tmp_path),
      trainer.RuntimeConfig(distribution_strategy="mirrored",
                            num_cpu_devices=2, seed=0),
      _config(train_steps=100, steps_per_loop=50, summary_interval=50,
              global_batch_size=64, eval_batch_size=128))
  assert output["examples"] == 360.0
  assert output["matrix_accuracy"] == pytest.approx(output["accuracy"])
  assert output["accuracy"] > 0.5


class _FirstDigits(digits.DigitsClassification):
  """Digits evaluated on the first `count` images of the validation split."""

  def __init__(self, count):
    super().__init__(filters=8, hidden_units=32)
    self.count = count

  def build_inputs(self, training, input_context=None):
    images, labels = digits.load_split(training)
    return tf.data.Dataset.from_tensor_slices((images[:self.count],
                                               labels[:self.count]))


class _FirstDigitsConfusion(_FirstDigits, _ConfusionDigits):
  """Those with the confusion matrix: a validation_step of its own."""


@functools.lru_cache(maxsize=None)
def _trained_weights():
  """The small digits CNN's weights after 2 epochs: ~0.9 accuracy, so
  that accuracy and the confusion matrix are not one class everywhere."""
  tf_keras.utils.set_random_seed(0)
  model = _FirstDigits(0).build_model()
  model.compile(optimizer=tf_keras.optimizers.Adam(0.01),
                loss=tf_keras.losses.SparseCategoricalCrossentropy(
                    from_logits=True))
  model.fit(*digits.load_split(True), batch_size=64, epochs=2, verbose=0)
  return model.get_weights()


def _evaluate(task, strategy, weights, run_eagerly=False):
  """`task`'s model holding `weights` evaluated in eval batches of 64."""
  with strategy.scope():
    model = task.build_model()
    model.set_weights(weights)
    step = tf.Variable(0, dtype=tf.int64)
  eval_input = inputs_lib.DistributedInput(
      strategy, lambda context: task.build_inputs(False, context), 64,
      training=False)
  evaluator = evaluator_lib.TaskEvaluator(task, model, strategy, eval_input,
                                          step, run_eagerly=run_eagerly)
  return evaluator.evaluate(tf.constant(-1))


# 201 examples end in a batch of 9 (5 + 4 over the replicas); 129 in a
# batch of 1, as does a set of 1: a replica gets no example, which a Conv2D
# model on oneDNN cannot be called on.
@pytest.mark.parametrize("count, run_eagerly", [(201, False), (129, False),
                                                (1, False), (1, True)])
def test_a_cnn_on_two_replicas_equals_one_device_for_any_set_size(
    count, run_eagerly):
  task = _FirstDigitsConfusion(count)
  weights = _trained_weights()
  one = _evaluate(task, tf.distribute.OneDeviceStrategy("/cpu:0"), weights)
  two = _evaluate(task, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                  weights, run_eagerly)
  assert one["examples"] == two["examples"] == float(count)
  assert one["accuracy"] > (0.8 if count > 1 else 0.5)
  assert two["accuracy"] == one["accuracy"]
  assert two["matrix_accuracy"] == one["matrix_accuracy"]
  assert two["loss"] == pytest.approx(one["loss"], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("count", [201, 1])
def test_the_default_validation_step_on_an_empty_replica(count):
  # Without `aggregate_logs` the replicas return no logs.
  task = _FirstDigits(count)
  weights = _trained_weights()
  one = _evaluate(task, tf.distribute.OneDeviceStrategy("/cpu:0"), weights)
  two = _evaluate(task, tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
                  weights)
  assert sorted(two) == ["accuracy", "loss"]
  assert two["accuracy"] == one["accuracy"]
  assert two["loss"] == pytest.approx(one["loss"], rel=1e-6, abs=1e-6)


def test_a_validation_step_that_synchronises_replicas_is_refused():
  class Synchronising(_FirstDigits):

    def validation_step(self, inputs, model, metrics=None):
      logs = super().validation_step(inputs, model, metrics)
      logs["total"] = tf.distribute.get_replica_context().all_reduce(
          "sum", tf.reduce_sum(logs["loss"]))
      return logs

  # Its all-reduce without collective ops: a collective's instance keys
  # restart with every strategy, and one left in this process by a
  # different shape aborted later tests' collectives ("Shape mismatch in
  # the collective instance 100").
  mirrored = tf.distribute.MirroredStrategy(
      ["/cpu:0", "/cpu:1"],
      cross_device_ops=tf.distribute.ReductionToOneDevice())
  # 201 examples: a last batch of 9 gives both replicas examples, so the
  # step runs unguarded and may synchronise them.
  assert sorted(_evaluate(Synchronising(201), mirrored,
                          _trained_weights())) == ["accuracy", "loss"]
  # 129: a last batch of 1 leaves a replica empty.
  with pytest.raises(trainer.ConfigError) as raised:
    _evaluate(Synchronising(129), mirrored, _trained_weights())
  assert str(raised.value) == (
      "Synchronising.validation_step synchronises the replicas (an "
      "all-reduce, say), which this evaluation set cannot allow: its last "
      "batch leaves a replica without examples (or its size is unknown), "
      "and that replica skips the step. Return per-example values and "
      "reduce them in `aggregate_logs`, or use a metric.")


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_evaluation_uses_the_ema_weights(tmp_path, strategy):
  task = helpers.ConfiguredRegression()
  sgd = optimization.OptimizerConfig(name="sgd", learning_rate=0.1)
  ema = ema_lib.EmaConfig(decay=0.9)
  runtime = trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0)
  output = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                          _config(optimizer=sgd, ema=ema))
  # The same checkpoint evaluated again, in eval mode (which builds the
  # optimizer to restore the averages), and without EMA.
  again = experiment.run(task, "eval", str(tmp_path), runtime,
                         _config(optimizer=sgd, ema=ema))
  raw = experiment.run(task, "eval", str(tmp_path), runtime,
                       _config(optimizer=sgd))
  assert again["loss"] == pytest.approx(output["loss"], rel=1e-6)
  # By hand: the averaged weights of the checkpoint on the eval set.
  model = task.build_model()
  reader = tf.train.load_checkpoint(str(tmp_path))
  for index, layer in enumerate(model.layers):
    for name in ("kernel", "bias"):
      getattr(layer, name).assign(reader.get_tensor(
          f"model/layer_with_weights-{index}/{name}/.OPTIMIZER_SLOT/"
          "optimizer/average/.ATTRIBUTES/VARIABLE_VALUE"))
  features, labels = next(iter(task.build_inputs(False).batch(1000)))
  by_hand = float(tf.reduce_mean(task.build_losses(labels, model(features))))
  assert output["loss"] == pytest.approx(by_hand, rel=1e-5)
  assert abs(raw["loss"] - output["loss"]) > 1e-3


# Named evaluation sets.


class _FakeSetEvaluator:
  """A set's evaluator: fixed results, the steps it was asked for."""

  def __init__(self, results, images=None, fails=False):
    self.results = results
    self.images = images or {}
    self.fails = fails
    self.asked = []

  def evaluate(self, num_steps):
    self.asked.append(int(num_steps))
    if self.fails:
      raise trainer.RunError("an input file of this set is damaged")
    return dict(self.results)


def test_every_set_is_evaluated_and_its_results_named_by_it():
  clean = _FakeSetEvaluator({"accuracy": 0.75, "loss": 0.5},
                            images={"worst": np.zeros([2, 2, 1])})
  noisy = _FakeSetEvaluator({"accuracy": 0.25, "loss": 2.0})
  entered = []

  @contextlib.contextmanager
  def weights():
    entered.append("in")
    yield
    entered.append("out")

  sets = evaluator_lib.SetsEvaluator({"clean": clean, "noisy": noisy},
                                     steps=7, weights=weights)
  assert sets.evaluate(tf.constant(7)) == {
      "clean/accuracy": 0.75, "clean/loss": 0.5,
      "noisy/accuracy": 0.25, "noisy/loss": 2.0}
  assert (clean.asked, noisy.asked) == ([7], [7])
  assert entered == ["in", "out"]  # Once around all the sets.
  assert list(sets.images) == ["clean/worst"]


def test_steps_counted_by_set_and_a_full_pass_for_the_others():
  clean, noisy = _FakeSetEvaluator({"loss": 1.0}), _FakeSetEvaluator({})
  sets = evaluator_lib.SetsEvaluator({"clean": clean, "noisy": noisy},
                                     steps={"clean": 3})
  sets.evaluate(tf.constant(-1))  # What the controller asks: -1.
  assert (clean.asked, noisy.asked) == ([3], [-1])


def test_a_set_that_fails_gives_no_results_for_the_sets_before():
  clean = _FakeSetEvaluator({"loss": 1.0})
  noisy = _FakeSetEvaluator({}, fails=True)
  sets = evaluator_lib.SetsEvaluator({"clean": clean, "noisy": noisy})
  with pytest.raises(trainer.RunError):
    sets.evaluate(tf.constant(-1))
  assert clean.asked == [-1]  # Evaluated, but nothing is recorded.


class _DigitSets(digits.DigitsClassification):
  """Digits evaluated on the clean validation split and on a noisy copy of
  250 of its images; `single` returns that one set alone, unnamed."""

  def __init__(self, single=None):
    super().__init__(filters=8, hidden_units=32)
    self.single = single

  def build_inputs(self, training, input_context=None):
    if training:
      return super().build_inputs(training, input_context)
    images, labels = digits.load_split(False)
    noise = np.random.RandomState(1).normal(0.0, 0.3, images.shape)
    noisy = np.clip(images + noise.astype(np.float32), 0.0, 1.0)
    sets = {"clean": tf.data.Dataset.from_tensor_slices((images, labels)),
            "noisy": tf.data.Dataset.from_tensor_slices((noisy[:250],
                                                         labels[:250]))}
    return sets[self.single] if self.single else sets


def test_named_sets_on_two_replicas_equal_one_set_runs(tmp_path):
  # Eval batches of 64 over 2 replicas: 360 and 250 examples end in partial
  # batches (40 and 58) that both replicas share.
  runtime = trainer.RuntimeConfig(distribution_strategy="mirrored",
                                  num_cpu_devices=2, seed=0)
  config = _config(train_steps=20, steps_per_loop=10, summary_interval=10,
                   checkpoint_interval=10, validation_interval=10,
                   global_batch_size=32, eval_batch_size=64,
                   best_checkpoint=trainer.actions.BestCheckpointConfig(
                       metric="noisy/accuracy", higher_is_better=True))
  run_dir = tmp_path / "run"
  output = experiment.run(_DigitSets(), "train_and_eval", str(run_dir),
                          runtime, config)
  assert sorted(output) == ["clean/accuracy", "clean/loss",
                            "noisy/accuracy", "noisy/loss"]
  record = evaluated.EvaluatedRecord(str(run_dir)).results
  assert sorted(record) == [10, 20] and record[20] == output
  # One TensorBoard run a set, the same tags in each.
  for name in ("clean", "noisy"):
    scalars = helpers.read_scalars(str(run_dir / "eval" / name))
    assert scalars["accuracy"] == [
        (step, pytest.approx(record[step][f"{name}/accuracy"]))
        for step in (10, 20)]
    assert [step for step, _ in scalars["loss"]] == [10, 20]
  assert "accuracy" not in helpers.read_tags(str(run_dir / "eval"))
  # The best checkpoint follows the noisy set.
  noisy = {step: results["noisy/accuracy"] for step, results in record.items()}
  best_step = max(sorted(noisy), key=lambda step: noisy[step])
  with open(run_dir / "best" / "best.json") as f:
    best = json.load(f)
  assert (best["metric"], best["step"], best["value"]) == (
      "noisy/accuracy", best_step, noisy[best_step])
  # Each set alone, unnamed, on the same checkpoint: the same numbers.
  for name in ("clean", "noisy"):
    alone = experiment.run(_DigitSets(single=name), "eval",
                           str(tmp_path / f"alone_{name}"), runtime,
                           _config(eval_batch_size=64),
                           restore_dir=str(run_dir))
    assert alone == {"accuracy": output[f"{name}/accuracy"],
                     "loss": pytest.approx(output[f"{name}/loss"],
                                           rel=1e-6)}
  # What a run builds: each set's input by name, 6 and 4 batches.
  parts = build.parts(_DigitSets(), "eval", build.process(runtime),
                      _config(eval_batch_size=64))
  assert parts.eval_set_names == ("clean", "noisy")
  assert {name: int(found.dataset.cardinality())
          for name, found in parts.eval_inputs.items()} == {"clean": 6,
                                                            "noisy": 4}
  # --mode=eval with one named set, its 4 batches counted by name.
  chosen = experiment.run(_DigitSets(), "eval", str(tmp_path / "chosen"),
                          runtime, _config(eval_batch_size=64,
                                           eval_sets=("noisy",),
                                           validation_steps={"noisy": 4}),
                          restore_dir=str(run_dir))
  assert chosen == {"noisy/accuracy": output["noisy/accuracy"],
                    "noisy/loss": pytest.approx(output["noisy/loss"],
                                                rel=1e-6)}
