"""trainer.named: several models and optimizers in one Task, shown on the
shipped conditional GAN (generator, discriminator, classifier): built and
checkpointed by name, resumed exactly, replica invariant, loss-scaled per
optimizer, exported by name; and its mistakes, one line each."""

import importlib.util
import os
import re

import gin
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import errors
from trainer import experiment
from tasks import digits_gan

import helpers

MODELS = ("classifier", "discriminator", "generator")


def _config(**overrides):
  settings = dict(train_steps=20, steps_per_loop=10, summary_interval=10,
                  global_batch_size=32, eval_batch_size=60,
                  checkpoint_interval=10, validation_steps=2)
  settings.update(overrides)
  return trainer.TrainerConfig(**settings)


def _run(model_dir, bindings=(), mode="train", runtime=None, task=None,
         **config):
  task = task or digits_gan.DigitsConditionalGan()
  gin.clear_config()
  gin.parse_config(["optimizer.name = 'adam'",
                    "optimizer.learning_rate = 0.0002", *bindings])
  if isinstance(task, digits_gan.DigitsConditionalGan):
    gin.parse_config("classifier/optimizer.learning_rate = 0.001")
  return experiment.run(task, mode,
                        str(model_dir),
                        runtime or trainer.RuntimeConfig(seed=0),
                        _config(**config))


def test_several_models_train_and_checkpoint_by_name(tmp_path):
  results = _run(tmp_path, mode="train_and_eval")
  assert {"classifier_accuracy", "real_accuracy", "loss"} <= set(results)
  names = tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map()
  for model in MODELS:
    assert any(n.startswith(f"model/{model}/") for n in names), model
    assert f"optimizer/{model}/iter/.ATTRIBUTES/VARIABLE_VALUE" in names
  scalars = helpers.read_scalars(str(tmp_path / "train"))
  for name in ("generator_loss", "discriminator_loss", "classifier_loss",
               "gradient_norm/generator", "gradient_norm/discriminator",
               "gradient_norm/classifier"):
    assert np.isfinite(scalars[name][-1][1]) and scalars[name][-1][1] > 0, name
  # Each optimizer's rate, from the bindings under its model's name.
  assert scalars["learning_rate/classifier"][-1][1] == pytest.approx(1e-3)
  assert scalars["learning_rate/generator"][-1][1] == pytest.approx(2e-4)
  assert helpers.checkpoint_step(str(tmp_path)) == 20
  # The sample grid: a PNG and an image summary per evaluation.
  png = tf.io.decode_png(tf.io.read_file(
      str(tmp_path / "eval" / "images" / "samples-20.png")))
  assert png.shape == (400, 400, 1)  # 10 x 10 framed digits, 4x
  # The frames are grey; a digit is the generator's sigmoid, in [0, 1].
  assert np.all(png[0, :, 0] == 128) and np.all(png[:, 0, 0] == 128)
  assert "samples" in helpers.read_tags(str(tmp_path / "eval"))


def _numbers(model_dir):
  return {name: value for name, value in
          helpers.checkpoint_numbers(str(model_dir)).items()
          if name.startswith(("model/", "optimizer/"))}


# Two trainings on two replicas (~9 s): with the slow tests; the rollback
# test below restores every model and optimizer in the default suite.
@pytest.mark.slow
def test_several_models_resume_exactly(tmp_path):
  _run(tmp_path / "straight", train_steps=20)
  _run(tmp_path / "resumed", train_steps=10)
  _run(tmp_path / "resumed", train_steps=20)
  straight, resumed = _numbers(tmp_path / "straight"), _numbers(
      tmp_path / "resumed")
  assert sorted(straight) == sorted(resumed)
  for name in straight:
    np.testing.assert_array_equal(straight[name], resumed[name], name)


def test_several_models_are_replica_invariant(tmp_path):
  # Plain SGD, which keeps a wrong loss scaling visible in the weights.
  sgd = ["optimizer.name = 'sgd'", "optimizer.learning_rate = 0.05",
         "classifier/optimizer.learning_rate = 0.05"]
  _run(tmp_path / "one", sgd)
  _run(tmp_path / "two", sgd, runtime=trainer.RuntimeConfig(
      seed=0, distribution_strategy="mirrored", num_cpu_devices=2))
  one, two = _numbers(tmp_path / "one"), _numbers(tmp_path / "two")
  assert max(float(np.max(np.abs(one[k] - two[k]))) for k in one) < 1e-5


def test_each_optimizer_has_its_own_float16_loss_scale(tmp_path):
  _run(tmp_path, runtime=trainer.RuntimeConfig(
      seed=0, mixed_precision_dtype="float16"))
  tags = helpers.read_tags(str(tmp_path / "train"))
  assert {f"loss_scale/{m}" for m in MODELS} <= tags
  names = tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map()
  for model in MODELS:
    assert any(n.startswith(f"optimizer/{model}/loss_scale/") for n in names)


def test_the_chosen_model_is_exported_and_serves(tmp_path):
  _run(tmp_path, ["export.at_end = True", "export.model = 'generator'"],
       export=trainer.experiment.config_lib.exports.ExportConfig(
           at_end=True, model="generator"))
  served = tf.saved_model.load(str(tmp_path / "export" / "20"))
  images = served.signatures["serving_default"](
      label=tf.constant([3, 7]), noise=tf.zeros([2, 32]))["image"]
  assert images.shape == (2, 8, 8, 1)


class _SharedLayer(digits_gan.DigitsConditionalGan):

  def build_model(self):
    models = super().build_model()
    shared = models["generator"].get_layer("g_dense0")
    models["critic"] = tf_keras.Sequential([tf_keras.Input((48,)), shared])
    return models


class _NoOverride(trainer.Task):

  def build_model(self):
    return {"a": tf_keras.Sequential([tf_keras.Input((64,)),
                                      tf_keras.layers.Dense(1)])}

  build_inputs = digits_gan.DigitsConditionalGan.build_inputs
  shuffle_seed = 0

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.zeros_like(labels, tf.float32)


class _SkipsTheDiscriminator(digits_gan.DigitsConditionalGan):

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    with tf.GradientTape() as tape:
      fake = model["generator"]([features["noise"], labels], training=True)
      loss = tf.nn.compute_average_loss(tf.reduce_mean(
          tf.square(fake), axis=[1, 2, 3]))
    trainer.minimize(tape, loss, model["generator"].trainable_variables,
                     optimizer["generator"])
    return {"loss": loss}


@pytest.mark.parametrize("bindings, task, settings, message", [
    (["discriminatr/optimizer.learning_rate = 0.1"], None, {},
     r"^gin binds settings under `discriminatr/` \(`optimizer.\*`, "
     r"`learning_rate.\*` or `trainer.\*`\), but no trained model is named "
     r"'discriminatr'; the trained models are generator, discriminator, "
     r"classifier\.$"),
    ([], _SharedLayer(), {},
     r"^models 'generator' and 'critic' of _SharedLayer share the trainable "
     r"variable g_dense0/kernel: two optimizers cannot own one variable"),
    ([], _NoOverride(), {},
     r"^_NoOverride builds several models \(a\): it must override "
     r"`train_step`, which gets them and their optimizers by name\.$"),
    ([], None, dict(export=trainer.experiment.config_lib.exports.ExportConfig(
        at_end=True, model="critic")),
     r"^`export.model` \('critic'\) names no model of the Task; its models "
     r"are generator, discriminator, classifier\.$"),
    ([], None, dict(export=trainer.experiment.config_lib.exports.ExportConfig(
        at_end=True)),
     r"^the Task builds several models \(generator, discriminator, "
     r"classifier\): set `export.model` to the one it applies to\.$"),
    (["ema.decay = 0.99"], None, {},
     r"^the Task builds several models \(generator, discriminator, "
     r"classifier\): set `ema.model` to the one it applies to\.$"),
    ([], _SkipsTheDiscriminator(), {},
     r"^_SkipsTheDiscriminator.train_step applied no gradients with the "
     r"optimizer of 'classifier', 'discriminator'"),
])
def test_mistakes_with_several_models_are_one_line(tmp_path, bindings, task,
                                                   settings, message):
  if "ema.decay = 0.99" in bindings:
    settings = dict(ema=trainer.experiment.config_lib.ema_lib.EmaConfig(
        decay=0.99))
  with pytest.raises(errors.ConfigError, match=message):
    _run(tmp_path, bindings, task=task, **settings)
  assert not os.path.exists(tmp_path / "checkpoint")


# The in-process test above checks each message; from the command line
# (each case a train.py process, ~5 s) the default suite keeps two, the slow
# stage runs the rest.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize("params, message", [
    (["discriminatr/optimizer.learning_rate = 0.1"],
     "gin binds settings under `discriminatr/` (`optimizer.*`, "
     "`learning_rate.*` or `trainer.*`), but no trained model is named "
     "'discriminatr'; the trained models are generator, discriminator, "
     "classifier."),
    pytest.param(
        ["export.at_end = True", "export.model = 'critic'"],
        "`export.model` ('critic') names no model of the Task; its models are "
        "generator, discriminator, classifier.", marks=_SLOW),
    pytest.param(
        ["ema.decay = 0.999"],
        "the Task builds several models (generator, discriminator, "
        "classifier): set `ema.model` to the one it applies to.", marks=_SLOW),
    # Export off: a bound name is checked all the same.
    pytest.param(
        ["export.model = 'generatr'"],
        "`export.model` ('generatr') names no model of the Task; its models "
        "are generator, discriminator, classifier.", marks=_SLOW),
    # A model's own optimizer setting is named with its scope.
    (["generator/optimizer.name = 'adamm'"],
     "`generator/optimizer.name` ('adamm') must be one of: sgd, adam, "
     "adamw, lamb, lars, rmsprop, adagrad."),
    pytest.param(
        ["generator/optimizer.learning_rate = -1.0"],
        "`generator/optimizer.learning_rate` (-1.0) must be a positive "
        "number.", marks=_SLOW),
])
def test_mistakes_with_several_models_are_one_line_from_the_cli(
    tmp_path, params, message):
  # As a user meets them: from their own directory, a relative model_dir.
  result = helpers.run_cli(
      [f"--gin_file={helpers.REPO_ROOT}/gin/digits_gan.gin",
       "--gin_param=trainer.train_steps=100",
       *[f"--gin_param={p}" for p in params], "--model_dir=runs/gan"],
      cwd=str(tmp_path))
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.splitlines() == [f"train.py: error: {message}"]
  assert not os.path.exists(tmp_path / "runs" / "gan" / "checkpoint")


WRITING_A_TASK = os.path.join(helpers.REPO_ROOT, "docs", "writing-a-task.md")


def _docs_block(first_line):
  """The fenced block of docs/writing-a-task.md whose first line is
  `first_line`."""
  text = open(WRITING_A_TASK).read()
  for block in text.split("```")[1::2]:
    body = block.split("\n", 1)[1] if "\n" in block else ""
    if body.startswith(first_line):
      return body
  raise AssertionError(f"no block of {WRITING_A_TASK} starts with "
                       f"{first_line!r}")


# A whole train.py run of the docs' task (~8 s); the several-model tests
# above train the same kind of task in-process.
@pytest.mark.slow
def test_the_documented_two_optimizer_task_trains_as_written(tmp_path):
  # As a user copies it: the module and the gin file in their own folder,
  # train.py run from there with a relative model_dir.
  (tmp_path / "my_gan.py").write_text(_docs_block("# my_gan.py"))
  (tmp_path / "my_gan.gin").write_text(_docs_block("# my_gan.gin"))
  result = helpers.run_cli(["--gin_file=my_gan.gin", "--model_dir=runs/gan"],
                           cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  assert "optimizer | critic: 4 variable(s), 57 parameters, Adam, rate 0.001" \
      in result.stdout
  assert "optimizer | generator: 4 variable(s), 49 parameters, Adam, rate " \
      "0.01" in result.stdout
  names = tf.train.load_checkpoint(str(tmp_path / "runs" / "gan")
                                   ).get_variable_to_shape_map()
  assert {n.split("/")[1] for n in names if n.startswith("optimizer/")} == {
      "critic", "generator"}
  # The generator learnt the regression: eval loss far below the labels'
  # variance (about 14).
  loss = helpers.read_scalars(str(tmp_path / "runs" / "gan" / "eval"))["loss"]
  assert loss[-1][1] < 2.0, loss


# A user's module: the GAN with a model added since its checkpoints were
# saved (frozen: the GAN's step trains only its own three).
_GAN_WITH_CRITIC = """
import gin
import tf_keras
from tasks import digits_gan


@gin.configurable
class GanWithCritic(digits_gan.DigitsConditionalGan):

  def build_model(self):
    models = super().build_model()
    models["critic"] = tf_keras.Sequential(
        [tf_keras.Input((8, 8, 1)), tf_keras.layers.Flatten(),
         tf_keras.layers.Dense(1)])
    models["critic"].trainable = False
    return models
"""


def _with_critic(directory):
  """Writes `_GAN_WITH_CRITIC` as `my_gan.py` in `directory` and returns
  its Task class, imported from there."""
  directory.mkdir()
  path = directory / "my_gan.py"
  path.write_text(_GAN_WITH_CRITIC)
  spec = importlib.util.spec_from_file_location("my_gan", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.GanWithCritic


def test_a_checkpoint_from_before_a_model_was_added_is_one_line(tmp_path,
                                                                capsys):
  _run(tmp_path, train_steps=10)
  with_critic = _with_critic(tmp_path / "user")
  before = helpers.snapshot(str(tmp_path))
  old = str(tmp_path / "ckpt-10")
  with pytest.raises(errors.ConfigError) as raised:
    _run(tmp_path, task=with_critic(), train_steps=20)
  assert str(raised.value) == (
      f"checkpoint {old} does not fit this model: it holds nothing of "
      "model(s) critic (added to the Task since it was saved? it holds "
      "classifier, discriminator, generator): train in a new --model_dir, "
      f"starting the models it holds from it: `warm_start.checkpoint = "
      f"'{old}'`, `warm_start.model = ['classifier', 'discriminator', "
      "'generator']`.")
  assert helpers.snapshot(str(tmp_path)) == before  # Nothing lost.

  # As the line advises: the three models start where they were, the
  # critic from its initialisers.
  warm = trainer.experiment.config_lib.warm_start_lib.WarmStartConfig(
      checkpoint=old, model=["classifier", "discriminator", "generator"])
  task = with_critic()
  models = task.build_model()
  task.initialize(models, warm)
  saved = tf.train.load_checkpoint(old)
  for name in ("classifier", "discriminator", "generator"):
    for variable in models[name].weights:
      key = next(k for k in saved.get_variable_to_shape_map()
                 if k.startswith(f"model/{name}/") and
                 k.endswith(".ATTRIBUTES/VARIABLE_VALUE") and
                 "OPTIMIZER_SLOT" not in k and
                 saved.get_variable_to_shape_map()[k] == variable.shape and
                 np.array_equal(saved.get_tensor(k), variable.numpy()))
      assert key, (name, variable.name)
  capsys.readouterr()
  _run(tmp_path / "new", task=task, train_steps=10, warm_start=warm)
  out = capsys.readouterr().out
  for name in ("classifier", "discriminator", "generator"):
    assert (f"warm start | model '{name}': the whole model from {old} "
            f"(`model/{name}`)") in out
  assert helpers.checkpoint_step(str(tmp_path / "new")) == 10




@pytest.mark.slow
def test_a_model_added_since_the_checkpoint_through_the_cli(tmp_path):
  # A user's Task outside the repository adds a model to the shipped GAN
  # and points train.py at the GAN's run: one line, which says how to go on.
  (tmp_path / "my_gan.py").write_text(_GAN_WITH_CRITIC)
  short = ["--mode=train", "--gin_param=trainer.train_steps=20",
           "--gin_param=trainer.steps_per_loop=10",
           "--gin_param=trainer.checkpoint_interval=10",
           "--gin_param=trainer.summary_interval=10"]
  gan = f"--gin_file={helpers.REPO_ROOT}/gin/digits_gan.gin"
  first = helpers.run_cli([gan, *short, "--model_dir=runs/gan"],
                          cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  before = helpers.snapshot(str(tmp_path / "runs" / "gan"))
  mine = [gan, "--gin_param=import my_gan",
          "--gin_param=experiment.task = @GanWithCritic()", *short]
  refused = helpers.run_cli([*mine, "--model_dir=runs/gan"],
                            cwd=str(tmp_path))
  assert refused.returncode == 2, refused.stderr[-3000:]
  [line] = refused.stderr.splitlines()
  assert line.startswith("train.py: error: checkpoint runs/gan/ckpt-20 does "
                         "not fit this model: it holds nothing of model(s) "
                         "critic"), line
  assert helpers.snapshot(str(tmp_path / "runs" / "gan")) == before
  advice = re.search(r"`(warm_start.checkpoint = .*)`, `(warm_start.model = "
                     r".*)`\.$", line).groups()
  resumed = helpers.run_cli(
      [*mine, *[f"--gin_param={binding}" for binding in advice],
       "--model_dir=runs/critic"], cwd=str(tmp_path))
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert resumed.stdout.count("warm start | model ") == 3, resumed.stdout


def test_ema_averages_the_model_it_names(tmp_path):
  ema = trainer.experiment.config_lib.ema_lib.EmaConfig(decay=0.9,
                                                         model="generator")
  _run(tmp_path, mode="train_and_eval", ema=ema,
       on_nonfinite="rollback")  # Rollback: every optimizer's slots first.
  reader = tf.train.load_checkpoint(str(tmp_path))
  averages = {n.split("/")[1] for n in reader.get_variable_to_shape_map()
              if n.endswith("/.OPTIMIZER_SLOT/optimizer/generator/average/"
                            ".ATTRIBUTES/VARIABLE_VALUE")}
  assert averages == {"generator"}
  kernel = "model/generator/layer_with_weights-1/kernel/"
  average = reader.get_tensor(kernel + ".OPTIMIZER_SLOT/optimizer/generator/"
                              "average/.ATTRIBUTES/VARIABLE_VALUE")
  assert np.abs(average - reader.get_tensor(
      kernel + ".ATTRIBUTES/VARIABLE_VALUE")).max() > 0


def test_clipping_is_bound_per_model(tmp_path):
  # SGD: an update is the rate times the (clipped) gradient.
  sgd = ["optimizer.name = 'sgd'", "optimizer.learning_rate = 0.1",
         "classifier/optimizer.learning_rate = 0.1",
         "discriminator/trainer.gradient_clip_norm = 0.001"]
  _run(tmp_path, sgd, train_steps=2, steps_per_loop=1, summary_interval=1,
       checkpoint_interval=1)
  # The second step's update: from ckpt-1 to ckpt-2.
  start = helpers.checkpoint_numbers(str(tmp_path / "ckpt-1"))
  step = helpers.checkpoint_numbers(str(tmp_path / "ckpt-2"))

  def update_norm(model):
    return float(np.sqrt(sum(
        np.sum(np.square(step[name] - start[name])) for name in start
        if name.startswith(f"model/{model}/") and "OPTIMIZER" not in name)))

  assert update_norm("discriminator") == pytest.approx(0.1 * 0.001, rel=1e-3)
  assert update_norm("generator") > 10 * 0.1 * 0.001  # Not clipped.
  scalars = helpers.read_scalars(str(tmp_path / "train"))
  assert scalars["gradient_norm/discriminator"][-1][1] > 0.001  # Before.


@pytest.mark.slow  # Micro-batches of one model: tests/model/test_gradients.py.
def test_accumulated_micro_batches_give_one_large_batchs_update(tmp_path):
  # Plain SGD: two micro-batches of 16 must update every model as one batch
  # of 32 does, on one device and on 2 replicas (8 examples per micro-batch).
  sgd = ["optimizer.name = 'sgd'", "optimizer.learning_rate = 0.05",
         "classifier/optimizer.learning_rate = 0.05",
         "discriminator/trainer.gradient_clip_norm = 0.5"]
  _run(tmp_path / "whole", sgd)
  _run(tmp_path / "micro", sgd, gradient_accumulation_steps=2)
  _run(tmp_path / "micro2", sgd, gradient_accumulation_steps=2,
       runtime=trainer.RuntimeConfig(seed=0, distribution_strategy="mirrored",
                                     num_cpu_devices=2))
  whole = _numbers(tmp_path / "whole")
  for run in ("micro", "micro2"):
    micro = _numbers(tmp_path / run)
    assert sorted(micro) == sorted(whole)
    assert max(float(np.max(np.abs(whole[k] - micro[k])))
               for k in whole) < 1e-5, run
  # The losses and each model's norm are the applied step's, as one batch's.
  one = helpers.read_scalars(str(tmp_path / "whole" / "train"))
  two = helpers.read_scalars(str(tmp_path / "micro" / "train"))
  for name in ("loss", "generator_loss", "gradient_norm/discriminator",
               "gradient_norm/classifier"):
    assert two[name][-1][1] == pytest.approx(one[name][-1][1], rel=1e-4), name


@pytest.mark.slow  # float16 is emulated on CPU: ~25 s.
def test_accumulation_keeps_each_optimizers_float16_loss_scale(tmp_path):
  _run(tmp_path, gradient_accumulation_steps=2, runtime=trainer.RuntimeConfig(
      seed=0, mixed_precision_dtype="float16"))
  scalars = helpers.read_scalars(str(tmp_path / "train"))
  for model in MODELS:
    assert np.isfinite(scalars[f"gradient_norm/{model}"][-1][1]), model
    assert scalars[f"loss_scale/{model}"][-1][1] > 1, model
  reader = tf.train.load_checkpoint(str(tmp_path))
  for model in MODELS:  # Every step applied: 20 updates each.
    assert reader.get_tensor(
        f"optimizer/{model}/iter/.ATTRIBUTES/VARIABLE_VALUE") == 20, model


def test_a_micro_batch_count_per_model_is_one_line(tmp_path):
  with pytest.raises(errors.ConfigError,
                     match=r"^`generator/trainer.gradient_accumulation_steps`"
                     r": micro-batches cut the step's batch for every model "
                     r"at once; bind `trainer.gradient_accumulation_steps` "
                     r"without a model's name\."):
    _run(tmp_path, ["generator/trainer.gradient_accumulation_steps = 2"])


class _MinimizesOnlyOnce(digits_gan.DigitsConditionalGan):
  """Trains the classifier only the first time its step is traced."""

  traced = 0

  def train_step(self, inputs, model, optimizer, metrics=None):
    type(self).traced += 1
    if type(self).traced > 1:
      features, labels = inputs
      with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(self.build_losses(
            labels, model["classifier"](features["image"], training=True)))
      return {"loss": loss}
    return super().train_step(inputs, model, optimizer, metrics)


def test_a_step_that_minimizes_differently_per_micro_batch_is_one_line(
    tmp_path):
  with pytest.raises(errors.ConfigError,
                     match=r"^train_step called `trainer.minimize` with other "
                     r"optimizers on another micro-batch"):
    _run(tmp_path, task=_MinimizesOnlyOnce(), gradient_accumulation_steps=2)


class _PoisonedBatch(digits_gan.DigitsConditionalGan):
  """The batch of step 13 (batch 12) has NaN noise: every loss is NaN."""

  def preprocess_batch(self, batch, training, seed):
    features, labels = super().preprocess_batch(batch, training, seed)
    poison = tf.where(seed[1] == 12, float("nan"), 1.0)
    return dict(features, noise=features["noise"] * poison), labels


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_rollback_restores_every_model_and_optimizer(tmp_path, capsys,
                                                     micro_batches):
  _run(tmp_path, task=_PoisonedBatch(), train_steps=30, steps_per_loop=5,
       checkpoint_interval=5, summary_interval=5, on_nonfinite="rollback",
       gradient_accumulation_steps=micro_batches)
  out = capsys.readouterr().out
  assert ("train | non-finite loss at step 13: rolled back to step 10, "
          "skipping that step's batch (rollback 1 of 3)") in out
  numbers = helpers.checkpoint_numbers(str(tmp_path))
  assert numbers["discarded_batches/.ATTRIBUTES/VARIABLE_VALUE"] == 1
  for name, value in numbers.items():
    assert np.isfinite(value).all(), name
  # Each optimizer went back to step 10 with its model: 30 updates in all.
  for model in MODELS:
    assert numbers[f"optimizer/{model}/iter/.ATTRIBUTES/VARIABLE_VALUE"] == (
        30), model


class _DiscriminatorBlowsUp(digits_gan.DigitsConditionalGan):
  """A discriminator whose weights become NaN at its 15th step."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    logs = super().train_step(inputs, model, optimizer, metrics)
    steps = optimizer["discriminator"].iterations
    kernel = model["discriminator"].get_layer("d_logit").kernel
    kernel.assign(tf.where(steps == 15, kernel * float("nan"), kernel))
    return logs


def test_the_nan_guard_watches_every_model(tmp_path):
  # Step 15's loss is finite (the weights went bad after it): the check of
  # every model's variables before the save at step 15 stops the run.
  with pytest.raises(errors.NonFiniteError) as error:
    _run(tmp_path, task=_DiscriminatorBlowsUp(), train_steps=30,
         steps_per_loop=5, checkpoint_interval=5, summary_interval=5)
  assert str(error.value) == ("variables are not finite at step 15; not "
                              "saved (the newest checkpoint is step 10).")
  # The checkpoints saved are the finite ones, every model in them.
  assert helpers.checkpoint_step(str(tmp_path)) == 10
  for name, value in _numbers(tmp_path).items():
    assert np.isfinite(value).all(), name


class _ClassifierGradientBlowsUp(digits_gan.DigitsConditionalGan):
  """At its 7th step, the classifier's gradient is NaN; the loss the step
  returns does not show it."""

  def train_step(self, inputs, model, optimizer, metrics=None):
    features, labels = inputs
    steps = optimizer["classifier"].iterations
    with tf.GradientTape(persistent=True) as tape:
      logits = model["classifier"](features["image"], training=True)
      loss = tf.nn.compute_average_loss(self.build_losses(labels, logits))
      poisoned = loss * tf.where(steps == 6, float("nan"), 1.0)
      # The other two models' updates: gradients of zero.
      fake = model["generator"]([features["noise"], labels], training=True)
      judged = model["discriminator"]([fake, labels], training=True)
      zero = tf.nn.compute_average_loss(0.0 * judged[:, 0])
    trainer.minimize(tape, poisoned, model["classifier"].trainable_variables,
                     optimizer["classifier"])
    for name in ("generator", "discriminator"):
      trainer.minimize(tape, zero, model[name].trainable_variables,
                       optimizer[name])
    return {"loss": loss}


def test_a_non_finite_gradient_stops_at_its_step(tmp_path):
  with pytest.raises(errors.NonFiniteError) as error:
    _run(tmp_path, task=_ClassifierGradientBlowsUp(), train_steps=20)
  assert error.value.step == 7, str(error.value)
