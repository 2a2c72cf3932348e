"""The default step's gradients: accumulation over micro-batches, the sum over
replicas, the global norm and clipping, checked against hand computations."""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import experiment
from trainer.model import gradients
from trainer.model import optimization

import helpers

SGD = optimization.OptimizerConfig(name="sgd", learning_rate=0.1)


def _runtime(strategy="one_device", **settings):
  return trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=3,
      num_cpu_devices=2 if strategy == "mirrored" else 0, **settings)


def _train(model_dir, runtime, train_steps=20, task=None, **settings):
  config = dict(train_steps=train_steps, steps_per_loop=10,
                summary_interval=10, checkpoint_interval=10,
                global_batch_size=32, optimizer=SGD)
  config.update(settings)
  experiment.run(task or helpers.ConfiguredRegression(), "train",
                 str(model_dir), runtime, trainer.TrainerConfig(**config))
  return helpers.checkpoint_weights(str(model_dir))


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_k_micro_batches_give_the_update_of_one_k_times_larger_batch(
    tmp_path, strategy):
  whole = _train(tmp_path / "whole", _runtime())
  accumulated = _train(tmp_path / "accumulated", _runtime(strategy),
                       gradient_accumulation_steps=4)
  # 4 micro-batches of 8 (4 per replica on 2) = one batch of 32, with SGD,
  # whose update shows any error in scaling the gradients.
  assert helpers.max_weight_difference(whole, accumulated) < 1e-6
  losses = [helpers.read_scalars(str(tmp_path / name / "train"))["loss"]
            for name in ("whole", "accumulated")]
  assert [v for _, v in losses[0]] == pytest.approx(
      [v for _, v in losses[1]], rel=1e-5)


@pytest.mark.parametrize("loss_scale", ["dynamic", 128.0])
def test_accumulation_with_float16_loss_scaling(tmp_path, loss_scale):
  float16 = _runtime(mixed_precision_dtype="float16", loss_scale=loss_scale)
  whole = _train(tmp_path / "whole", float16)
  accumulated = _train(tmp_path / "accumulated", float16,
                       gradient_accumulation_steps=2)
  scalars = helpers.read_scalars(str(tmp_path / "accumulated" / "train"))
  assert np.isfinite(scalars["loss"][-1][1])
  if loss_scale == "dynamic":
    # Overflows halve the scale from 2**15 and skip steps; micro-batches
    # overflow at other steps than whole batches, so only training is
    # checked here.
    assert 1 < scalars["loss_scale"][-1][1] < 2**15
    assert scalars["loss"][-1][1] < scalars["loss"][0][1]
  else:
    assert scalars["loss_scale"] == [(10, 128.0), (20, 128.0)]
    # float16 rounds each micro-batch's forward pass differently (measured
    # 1.8e-4 here; float16 against float32 differ by 2.5e-4).
    assert helpers.max_weight_difference(whole, accumulated) < 1e-3


def test_micro_batches_must_split_the_replica_batch(tmp_path):
  with pytest.raises(trainer.ConfigError, match=r"^`trainer.global_batch_"
                     r"size` gives 16 example\(s\) per replica, which do not "
                     r"split into `trainer.gradient_accumulation_steps` \(3\) "
                     r"equal micro-batches\.$"):
    _train(tmp_path, _runtime("mirrored"), gradient_accumulation_steps=3)


def test_a_task_overriding_train_step_cannot_accumulate(tmp_path):
  with pytest.raises(trainer.ConfigError, match="overrides `Task.train_step`"):
    _train(tmp_path, _runtime(), task=helpers.PerReplicaMeanLinearRegression(),
           gradient_accumulation_steps=2)


def _first_gradient(task):
  """The gradient of step 1's loss (the mean over the first batch of 32)."""
  tf.keras.utils.set_random_seed(3)
  model = task.build_model()
  features, labels = next(iter(task.build_inputs(True).batch(32)))
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(task.build_losses(labels, model(features)))
  return model, tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_clipping_by_global_norm_reports_the_norm_before_it(tmp_path,
                                                            strategy):
  task = helpers.ConfiguredRegression()
  model, grads = _first_gradient(task)
  norm = float(tf.linalg.global_norm(grads))
  clip = norm / 4
  start = {v.name: v.numpy() for v in model.trainable_variables}
  after = _train(tmp_path, _runtime(strategy), train_steps=1,
                 steps_per_loop=1, summary_interval=1, checkpoint_interval=1,
                 gradient_clip_norm=clip)
  reported = helpers.read_scalars(str(tmp_path / "train"))["gradient_norm"]
  assert reported == [(1, pytest.approx(norm, rel=1e-5))]
  # SGD moved each weight by lr * g * clip / norm.
  kernel = after["model/layer_with_weights-0/kernel/.ATTRIBUTES/"
                 "VARIABLE_VALUE"]
  np.testing.assert_allclose(
      kernel, start[model.trainable_variables[0].name] -
      0.1 * grads[0].numpy() * clip / norm, atol=1e-6)


def test_clipping_by_value_bounds_every_element(tmp_path):
  task = helpers.ConfiguredRegression()
  model, grads = _first_gradient(task)
  start = [v.numpy() for v in model.trainable_variables]
  after = _train(tmp_path, _runtime(), train_steps=1, steps_per_loop=1,
                 summary_interval=1, checkpoint_interval=1,
                 gradient_clip_value=0.05)
  names = ["model/layer_with_weights-0/kernel", "model/layer_with_weights-0/"
           "bias", "model/layer_with_weights-1/kernel",
           "model/layer_with_weights-1/bias"]
  for name, initial, grad in zip(names, start, grads):
    np.testing.assert_allclose(
        after[name + "/.ATTRIBUTES/VARIABLE_VALUE"],
        initial - 0.1 * np.clip(grad.numpy(), -0.05, 0.05), atol=1e-6)


def test_clip_keeps_a_non_finite_norm_visible():
  options = gradients.StepOptions(clip_norm=1.0)
  clipped = gradients.clip([tf.constant([3.0, 4.0]), None],
                           tf.constant(5.0), options)
  np.testing.assert_allclose(clipped[0].numpy(), [0.6, 0.8])
  assert clipped[1] is None
  # An infinite norm must not turn into zero gradients (dynamic loss scaling
  # would then not see the overflow): every element becomes NaN.
  clipped = gradients.clip([tf.constant([1.0, float("inf")])],
                           tf.constant(float("inf")), options)
  assert np.all(np.isnan(clipped[0].numpy()))


def test_minimize_clips_with_the_options_that_come_with_the_optimizer():
  # Gradient 3 of loss 3 * w at w = 0, one SGD step of rate 1: clipped to
  # norm 1 only where the options say so, with the optimizer or as an
  # argument (which wins).
  clip = gradients.StepOptions(clip_norm=1.0)

  def step(with_optimizer=None, options=None):
    weight = tf.Variable(0.0)
    optimizer = tf_keras.optimizers.SGD(1.0)
    if with_optimizer is not None:
      optimizer = gradients.OptimizerWithOptions(optimizer, with_optimizer)
      assert optimizer.iterations is optimizer.optimizer.iterations
    with tf.GradientTape() as tape:
      loss = 3.0 * weight
    norm = gradients.minimize(tape, loss, [weight], optimizer, options)
    return float(norm), float(weight.numpy())

  assert step() == (3.0, -3.0)
  assert step(with_optimizer=clip) == (3.0, -1.0)
  assert step(options=clip) == (3.0, -1.0)
  assert step(with_optimizer=clip,
              options=gradients.StepOptions()) == (3.0, -3.0)


def test_minimize_reports_to_the_record_that_comes_with_the_optimizer():
  weight = tf.Variable(0.0)
  sgd = tf_keras.optimizers.SGD(1.0)

  def minimize(record):
    with tf.GradientTape() as tape:
      loss = 3.0 * weight
    gradients.minimize(tape, loss, [weight], gradients.OptimizerWithOptions(
        sgd, gradients.StepOptions(), record))

  applied = gradients.StepRecord()
  minimize(applied)
  assert float(weight.numpy()) == -3.0
  assert {key: float(norm) for key, norm in applied.norms.items()} == {
      id(sgd): 3.0}
  # Under micro-batches the update is kept, not applied.
  kept = gradients.StepRecord(updates=[])
  minimize(kept)
  assert float(weight.numpy()) == -3.0 and not kept.norms
  [update] = kept.updates
  assert update.optimizer is sgd and float(update.grads[0]) == 3.0


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_per_example_values_are_gathered_in_the_examples_order(
    micro_batches):
  # What `on_outputs` returns for each micro-batch (the default step: its
  # per-example losses) comes back in the order of the replica's examples,
  # beside the averaged loss and gradient.
  inputs = (tf.range(8.0), tf.range(8.0) * 10)

  def gradient_fn(batch, model, optimizer):
    del model, optimizer
    return tf.reduce_sum(batch[0]), [tf.reduce_sum(batch[1])], batch[1] + 1

  loss, grads, gathered = tf.function(lambda: gradients.accumulate(
      gradient_fn, inputs, None, None, micro_batches,
      lambda batch, outputs: outputs))()
  np.testing.assert_array_equal(gathered, np.arange(8.0) * 10 + 1)
  assert (float(loss), float(grads[0])) == (28.0 / micro_batches,
                                            280.0 / micro_batches)
  _, _, nothing = gradients.accumulate(gradient_fn, inputs, None, None,
                                       micro_batches, lambda *_: None)
  assert nothing is None


def test_a_step_of_several_models_gets_its_per_example_losses_gathered():
  # Under micro-batches the framework runs such a step per micro-batch:
  # its floating logs are averaged, its per-example losses put together.
  def step(batch, record):
    del record
    return {"loss": tf.reduce_mean(batch), "per_example_loss": batch * 2}

  logs, norms = tf.function(lambda: gradients.accumulate_updates(
      step, tf.range(8.0), 4))()
  np.testing.assert_array_equal(logs["per_example_loss"], np.arange(8.0) * 2)
  assert float(logs["loss"]) == 3.5 and norms == {}


def test_the_default_step_returns_per_example_losses_only_when_asked():
  task = helpers.LinearRegression()
  model = task.build_model()
  features, labels = next(iter(task.build_inputs(True).batch(8)))
  expected = task.build_losses(labels, model(features))
  for micro_batches in (1, 2):
    logs = task.train_step(
        (features, labels), model, tf_keras.optimizers.SGD(0.0),
        options=gradients.StepOptions(accumulation_steps=micro_batches,
                                      report_per_example_loss=True))
    np.testing.assert_allclose(logs["per_example_loss"], expected, rtol=1e-6)
    assert float(logs["loss"]) == pytest.approx(float(np.mean(expected)))
  assert set(task.train_step((features, labels), model,
                             tf_keras.optimizers.SGD(0.0))) == {
                                 "loss", "gradient_norm"}
