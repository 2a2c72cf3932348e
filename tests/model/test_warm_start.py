"""Warm start from another run's checkpoint: the whole model or named parts,
only when training starts from scratch, with named mismatches."""

import os
import re
import tempfile

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import gin

import trainer
from trainer import console
from trainer import experiment
from trainer.model import warm_start
from tasks import digits
from tasks import digits_gan
from tasks import digits_pipeline
from tasks import recommendation

import helpers
import ram_urls


class _BackboneHead(helpers.ConfiguredRegression):
  """A functional model with layers named `backbone` and `head`."""

  def __init__(self, head_units=1):
    super().__init__()
    self.head_units = head_units

  def build_model(self):
    inputs = tf_keras.Input((4,))
    hidden = tf_keras.layers.Dense(8, "tanh", name="backbone")(inputs)
    outputs = tf_keras.layers.Dense(self.head_units, name="head")(hidden)
    return tf_keras.Model(inputs, outputs)

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs[:, :1]), axis=-1)


class _Stem(tf_keras.layers.Layer):
  """A sub-module reached by attribute: `model.backbone.stem`."""

  def __init__(self):
    super().__init__()
    self.dense = tf_keras.layers.Dense(8, "tanh")

  def call(self, inputs):
    return self.dense(inputs)


class _Backbone(tf_keras.layers.Layer):

  def __init__(self):
    super().__init__()
    self.stem = _Stem()
    self.top = tf_keras.layers.Dense(8, "tanh")

  def call(self, inputs):
    return self.top(self.stem(inputs))


class _Subclassed(tf_keras.Model):

  def __init__(self):
    super().__init__()
    self.backbone = _Backbone()
    self.head = tf_keras.layers.Dense(1)

  def call(self, inputs):
    return self.head(self.backbone(inputs))


def _config(train_steps=20, **settings):
  return trainer.TrainerConfig(
      train_steps=train_steps, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=10, global_batch_size=32, **settings)


def _weights(model):
  return {v.name: v.numpy() for v in model.weights}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A trained `_BackboneHead` run's directory."""
  model_dir = str(tmp_path_factory.mktemp("source"))
  experiment.run(_BackboneHead(), "train", model_dir,
                 trainer.RuntimeConfig(seed=1), _config())
  return model_dir


def _source_model(source_dir):
  model = _BackboneHead().build_model()
  tf.train.Checkpoint(model=model).read(
      tf.train.latest_checkpoint(source_dir)).expect_partial()
  return _weights(model)


def test_whole_model_from_a_directory(source):
  trained = _source_model(source)
  model = _BackboneHead().build_model()
  restored = warm_start.restore(
      model, warm_start.WarmStartConfig(checkpoint=source))
  assert restored == tf.train.latest_checkpoint(source)
  for name, value in _weights(model).items():
    np.testing.assert_array_equal(value, trained[name])


def test_named_layers_only(source):
  trained = _source_model(source)
  tf_keras.utils.set_random_seed(7)
  model = _BackboneHead().build_model()
  initial = _weights(model)
  warm_start.restore(model, warm_start.WarmStartConfig(
      checkpoint=source, modules=["backbone"]))
  for name, value in _weights(model).items():
    expected = trained if name.startswith("backbone/") else initial
    np.testing.assert_array_equal(value, expected[name], err_msg=name)
  assert not np.array_equal(initial["head/kernel:0"], trained["head/kernel:0"])


def test_attribute_paths_of_a_subclassed_model(tmp_path):
  source = _Subclassed()
  source(tf.ones([1, 4]))
  tf.train.Checkpoint(model=source).write(str(tmp_path / "ckpt-1"))
  target = _Subclassed()
  target(tf.ones([1, 4]))
  head_before = target.head.kernel.numpy()
  warm_start.restore(target, warm_start.WarmStartConfig(
      checkpoint=str(tmp_path / "ckpt-1"), modules=["backbone.stem"]))
  np.testing.assert_array_equal(target.backbone.stem.dense.kernel.numpy(),
                                source.backbone.stem.dense.kernel.numpy())
  assert not np.array_equal(target.backbone.top.kernel.numpy(),
                            source.backbone.top.kernel.numpy())
  np.testing.assert_array_equal(target.head.kernel.numpy(), head_before)


def test_a_training_run_warm_starts_only_from_scratch(source, tmp_path,
                                                      capsys):
  config = _config(train_steps=10,
                   warm_start=warm_start.WarmStartConfig(checkpoint=source))
  experiment.run(_BackboneHead(), "train_and_eval", str(tmp_path),
                 trainer.RuntimeConfig(seed=5), config)
  out = capsys.readouterr().out
  assert (f"warm start | the whole model from "
          f"{tf.train.latest_checkpoint(source)}") in out
  # The source had trained 20 steps: 10 more from there beat the source's
  # own loss at step 10 (a start from scratch would not).
  ours = helpers.read_scalars(str(tmp_path / "train"))["loss"]
  theirs = helpers.read_scalars(source + "/train")["loss"]
  assert ours[0][1] < theirs[0][1]
  experiment.run(_BackboneHead(), "train", str(tmp_path),
                 trainer.RuntimeConfig(seed=5), _config(
                     train_steps=20, warm_start=config.warm_start))
  assert "warm start |" not in capsys.readouterr().out


@pytest.mark.parametrize("settings,message", [
    (dict(modules=["backbone", "neck"]),
     "`warm_start.modules`: 'neck' names nothing in the model (at 'neck'; "
     "layers with weights there: backbone, head)."),
    (dict(checkpoint="/nonexistent/run"),
     "`warm_start.checkpoint` (/nonexistent/run) names no checkpoint."),
])
def test_bad_settings_are_named(source, settings, message):
  settings = dict(dict(checkpoint=source), **settings)
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(_BackboneHead().build_model(),
                       warm_start.WarmStartConfig(**settings))
  assert str(raised.value) == message


def test_a_shape_mismatch_names_the_variable(source):
  with pytest.raises(trainer.ConfigError, match=r"variable head/bias has "
                     r"shape \(3,\) in this model but \(1,\) in the "
                     r"checkpoint\.$"):
    warm_start.restore(_BackboneHead(head_units=3).build_model(),
                       warm_start.WarmStartConfig(checkpoint=source))


def _recommendation_checkpoint(directory):
  """A recommendation model's checkpoint, as its run saves it."""
  return tf.train.Checkpoint(
      model=recommendation.HashedRecommendation().build_model()).write(
          os.path.join(directory, "ckpt-10"))


# Issue 30: keys are positional, so the first layer at the same place with
# another shape was named, as if the teacher's conv2/bias were there.
_OTHER_MODEL = (
    "`model` there holds a different model than model 'teacher': their "
    "variables and shapes do not line up (the checkpoint's 5: "
    "layer_with_weights-0/embeddings (65536, 16), layer_with_weights-1/bias "
    "(32,), layer_with_weights-1/kernel (48, 32), ...; this model's 8: "
    "conv1/kernel (3, 3, 1, 32), conv1/bias (32,), conv2/kernel "
    "(3, 3, 32, 64), ...).")


def test_a_checkpoint_of_another_model_is_said_to_be_one(tmp_path):
  prefix = _recommendation_checkpoint(str(tmp_path))
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(digits.DigitsClassification().build_model(),
                       warm_start.WarmStartConfig(checkpoint=prefix,
                                                  model="teacher"))
  assert str(raised.value) == f"warm start from {prefix}: {_OTHER_MODEL}"


def test_train_py_says_the_teacher_checkpoint_holds_another_model(tmp_path):
  prefix = _recommendation_checkpoint(str(tmp_path))
  result = helpers.run_cli([
      "--gin_file=gin/digits_distillation.gin",
      f"--model_dir={tmp_path / 'distillation'}",
      f"--gin_param=TEACHER_CHECKPOINT='{prefix}'"])
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"train.py: error: warm start from {prefix}: {_OTHER_MODEL}")


def _convolutions_refused(checkpoint):
  """The error line of a warm start of the digits CNN's conv1 and conv2 (as
  gin/features/warm_start.gin binds it) from `checkpoint`."""
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(digits.DigitsClassification().build_model(),
                       warm_start.WarmStartConfig(
                           checkpoint=checkpoint, modules=["conv1", "conv2"]))
  return str(raised.value)


def test_layers_a_checkpoint_lacks_are_named_absent_not_of_another_shape(
    tmp_path):
  # Issue 38: gin/features/warm_start.gin (conv1, conv2) from a run of the
  # pipeline MLP said "variable conv1/bias has shape (32,) in this model but
  # (128,) in the checkpoint": its hidden1/bias sits at conv1/bias's place.
  prefix = tf.train.Checkpoint(
      model=digits_pipeline.DigitsPipelineMLP().build_model()).write(
          str(tmp_path / "ckpt-1"))
  assert _convolutions_refused(prefix) == (
      f"warm start from {prefix}: the checkpoint has no conv1, conv2 (by the "
      "names saved with its variables, `model` there holds hidden1, hidden2, "
      "hidden3, hidden4, logits).")


def test_a_gan_checkpoint_names_the_key_of_the_model_it_holds(gan_run):
  # Issue 38: the same warm start from a GAN run named the variables
  # missing under `model`, with no word of `model/<name>`.
  assert _convolutions_refused(gan_run) == (
      f"warm start from {tf.train.latest_checkpoint(gan_run)}: 4 variable(s) "
      "of conv1, conv2 have no value under `model` there: conv1/bias (32,), "
      "conv1/kernel (3, 3, 1, 32), conv2/bias (64,), conv2/kernel "
      "(3, 3, 32, 64); `model` there holds several models (classifier, "
      "discriminator, generator), and the variables of this model are at "
      "`model/classifier`: set `warm_start.checkpoint_key` to "
      "'model/classifier'.")
  # As the line says.
  model = digits.DigitsClassification().build_model()
  warm_start.restore(model, warm_start.WarmStartConfig(
      checkpoint=gan_run, modules=["conv1", "conv2"],
      checkpoint_key="model/classifier"))
  expected = _classifier_of(gan_run)
  restored = _checkpointed(model)
  for name in ("layer_with_weights-0/kernel", "layer_with_weights-1/bias"):
    key = f"model/{name}/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(restored[key], expected[key], name)


def test_variables_missing_from_the_checkpoint_are_named(source):
  inputs = tf_keras.Input((4,))
  hidden = tf_keras.layers.Dense(8, "tanh", name="backbone")(inputs)
  hidden = tf_keras.layers.Dense(1, name="head")(hidden)
  outputs = tf_keras.layers.Dense(2, name="extra")(hidden)
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(tf_keras.Model(inputs, outputs),
                       warm_start.WarmStartConfig(checkpoint=source))
  assert str(raised.value) == (
      f"warm start from {tf.train.latest_checkpoint(source)}: 2 variable(s) "
      "of the whole model have no value under `model` there: extra/bias (2,), "
      "extra/kernel (1, 2).")


def test_modules_need_a_checkpoint():
  with pytest.raises(trainer.ConfigError,
                     match=r"^`warm_start.modules` needs `warm_start.check"):
    warm_start.WarmStartConfig(modules=["backbone"])


@pytest.fixture(scope="module")
def gan_run(tmp_path_factory):
  """A 10-step run of the shipped GAN: a checkpoint of several models."""
  model_dir = str(tmp_path_factory.mktemp("gan"))
  gin.clear_config()
  gin.parse_config(["optimizer.name = 'adam'"])
  experiment.run(digits_gan.DigitsConditionalGan(), "train", model_dir,
                 trainer.RuntimeConfig(seed=0), _config(train_steps=10))
  gin.clear_config()
  return model_dir


def _classifier_of(run_dir):
  """The GAN run's classifier weights, as a one-model checkpoint names
  them."""
  reader = tf.train.load_checkpoint(run_dir)
  return {name: reader.get_tensor(f"model/classifier/{name[len('model/'):]}")
          for name, _ in tf.train.list_variables(_one_model_layout())
          if name.startswith("model/")}


def _one_model_layout():
  path = os.path.join(tempfile.mkdtemp(), "ckpt")
  return tf.train.Checkpoint(
      model=digits.DigitsClassification().build_model()).write(path)


def _checkpointed(model):
  path = os.path.join(tempfile.mkdtemp(), "ckpt")
  reader = tf.train.load_checkpoint(tf.train.Checkpoint(model=model).write(
      path))
  return {name: reader.get_tensor(name)
          for name, _ in tf.train.list_variables(path)
          if name.startswith("model/")}


def test_a_model_of_a_several_model_run_is_named_by_its_key(gan_run,
                                                           capsys):
  # A distillation's teacher (the digits CNN) from a GAN run's classifier.
  teacher = digits.DigitsClassification().build_model()
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(teacher, warm_start.WarmStartConfig(
        checkpoint=gan_run, model="teacher"))
  # The classifier holds the teacher's variables by name.
  assert str(raised.value).endswith(
      "; `model` there holds several models (classifier, discriminator, "
      "generator), and the variables of model 'teacher' are at "
      "`model/classifier`: set `warm_start.checkpoint_key` to "
      "'model/classifier'.")
  warm_start.restore(teacher, warm_start.WarmStartConfig(
      checkpoint=gan_run, model="teacher", checkpoint_key="model/classifier"))
  assert (f"warm start | model 'teacher': the whole model from "
          f"{tf.train.latest_checkpoint(gan_run)} (`model/classifier`)"
          ) in capsys.readouterr().out
  expected = _classifier_of(gan_run)
  restored = _checkpointed(teacher)
  assert sorted(restored) == sorted(expected)
  for name, value in restored.items():
    np.testing.assert_array_equal(value, expected[name], name)


def test_a_model_of_the_same_name_is_found_in_a_several_model_run(gan_run):
  # A GAN with a model added since: its classifier from the old run, with
  # `warm_start.model` alone, as the refused restore's line advises.
  classifier = digits.DigitsClassification().build_model()
  warm_start.restore(classifier, warm_start.WarmStartConfig(
      checkpoint=gan_run, model="classifier"))
  expected = _classifier_of(gan_run)
  for name, value in _checkpointed(classifier).items():
    np.testing.assert_array_equal(value, expected[name], name)


@pytest.mark.parametrize("settings, message", [
    (dict(model=[]),
     "`warm_start.model` ([]) must be a model's name or a list of them."),
    (dict(model=3),
     "`warm_start.model` (3) must be a model's name or a list of them."),
    (dict(model=["student", "teacher"], checkpoint_key="model/classifier"),
     "`warm_start.checkpoint_key` ('model/classifier') is one model's place "
     "in the checkpoint, but `warm_start.model` names 2: leave the key at "
     "'model', where each is read at `model/<name>`."),
])
def test_bad_model_choices_are_one_line(settings, message):
  # (Gin appends the configurable it called; the CLI prints the first line.)
  with pytest.raises(trainer.ConfigError, match=f"^{re.escape(message)}\n"):
    warm_start.WarmStartConfig(checkpoint="runs/x", **settings)


def test_one_model_in_a_list_is_that_model():
  config = warm_start.WarmStartConfig(checkpoint="runs/x", model=["teacher"])
  assert config.model == "teacher" and config.models == ("teacher",)


def _save_weights(tmp_path):
  """A digits model of weights 0.1 to 0.2 in size, either sign (no zeros),
  saved by tf_keras's `model.save_weights(prefix)` (the model is the
  checkpoint's root, read with `warm_start.checkpoint_key = ''`)."""
  saved = digits.DigitsClassification().build_model()
  rng = np.random.default_rng(0)
  for variable in saved.weights:
    variable.assign(rng.uniform(0.1, 0.2, variable.shape) *
                    rng.choice([-1, 1], variable.shape))
  prefix = str(tmp_path / "weights")
  saved.save_weights(prefix)
  return saved, prefix


@pytest.mark.parametrize("modules", [(), ("conv1", "conv2")])
def test_a_save_weights_checkpoint_is_read_at_its_root(tmp_path, modules):
  saved, prefix = _save_weights(tmp_path)
  model = digits.DigitsClassification().build_model()
  initial = _weights(model)
  assert warm_start.restore(model, warm_start.WarmStartConfig(
      checkpoint=prefix, modules=modules, checkpoint_key="")) == prefix
  theirs = _weights(saved)
  for name, value in _weights(model).items():
    taken = not modules or name.split("/")[0] in modules
    np.testing.assert_array_equal(
        value, (theirs if taken else initial)[name], err_msg=name)
    assert taken or not np.array_equal(value, theirs[name])


def test_a_save_weights_checkpoint_of_another_model_is_said_to_be_one(
    tmp_path):
  other = tf_keras.Sequential([tf_keras.Input((4,)),
                               tf_keras.layers.Dense(3)])
  prefix = str(tmp_path / "other")
  other.save_weights(prefix)
  with pytest.raises(trainer.ConfigError) as raised:
    warm_start.restore(digits.DigitsClassification().build_model(),
                       warm_start.WarmStartConfig(checkpoint=prefix,
                                                  checkpoint_key=""))
  assert str(raised.value) == (
      f"warm start from {prefix}: its root holds a different model than "
      "this one: their variables and shapes do not line up (the "
      "checkpoint's 2: layer_with_weights-0/bias (3,), "
      "layer_with_weights-0/kernel (4, 3); this model's 8: conv1/kernel "
      "(3, 3, 1, 32), conv1/bias (32,), conv2/kernel (3, 3, 32, 64), ...).")


@pytest.mark.slow  # About 12 s: a train.py run.
def test_train_py_warm_starts_from_a_save_weights_checkpoint(tmp_path):
  saved, prefix = _save_weights(tmp_path)
  # One step at a rate too small to change a float32 weight of 0.1 or
  # more: the checkpoint after it holds the weights the warm start set.
  model_dir = tmp_path / "run"
  result = helpers.run_cli([
      "--gin_file=gin/digits.gin", f"--model_dir={model_dir}",
      "--mode=train", "--gin_param=trainer.train_steps=1",
      "--gin_param=trainer.steps_per_loop=1",
      "--gin_param=trainer.summary_interval=1",
      "--gin_param=trainer.checkpoint_interval=1",
      "--gin_param=optimizer.learning_rate=1e-30",
      f"--gin_param=warm_start.checkpoint='{prefix}'",
      "--gin_param=warm_start.checkpoint_key=''"])
  assert result.returncode == 0, result.stderr[-2000:]
  assert (f"warm start | the whole model from {prefix} (its root)"
          in result.stdout.splitlines())
  trained = digits.DigitsClassification().build_model()
  tf.train.Checkpoint(model=trained).read(
      str(model_dir / "ckpt-1")).expect_partial()
  assert [v.name for v in trained.weights] == [v.name for v in saved.weights]
  for ours, theirs in zip(trained.weights, saved.weights):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy(),
                                  err_msg=ours.name)


def test_a_checkpoint_in_a_url_directory_is_found_there(source, tmp_path,
                                                        monkeypatch):
  directory = ram_urls.model_dir(tmp_path, monkeypatch, mark=False)
  tf.io.gfile.makedirs(directory)
  prefix = tf.train.latest_checkpoint(source)
  for path in tf.io.gfile.glob(prefix + ".*"):
    tf.io.gfile.copy(path, f"{directory}/{os.path.basename(path)}")
  tf.compat.v1.train.update_checkpoint_state(
      directory, os.path.join(directory, os.path.basename(prefix)))
  url_prefix = f"{directory}/{os.path.basename(prefix)}"
  assert warm_start.resolve_checkpoint(directory) == url_prefix
  # (A prefix itself is not tried: `ram://` takes it for a folder, as a
  # bucket does not.)
  with pytest.raises(trainer.ConfigError, match=re.escape(
      f"`warm_start.checkpoint` ({directory}/ckpt-7) names no checkpoint.")):
    warm_start.resolve_checkpoint(f"{directory}/ckpt-7")
  model = _BackboneHead().build_model()
  warm_start.restore(model, warm_start.WarmStartConfig(checkpoint=directory))
  trained = _source_model(source)
  for name, value in _weights(model).items():
    np.testing.assert_array_equal(value, trained[name])
  assert ram_urls.nothing_local(tmp_path)
