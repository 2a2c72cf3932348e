"""KerasModelTask: a Keras model, its data and loss trained as `fit` trains
them, checked against tf_keras's `Model.fit` on the digits; Keras 3 models
and files refused in one line naming the route that works, and that route
checked."""

import os
import zipfile

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import tf_keras

import trainer
from tasks import digits
from tasks import keras_digits
from tasks import keras_model
from trainer import errors
from trainer import experiment
from trainer import gin_config
from trainer.model import optimization
from trainer.storage import files

import helpers

TASK = "KerasModelTask"


def _data(arrays):
  return lambda: tf.data.Dataset.from_tensor_slices(arrays)


def digits_examples(training, count=None):
  """A `fit` user's data function: one for both sets, the split chosen by
  `training` (bound per set in gin), the first `count` examples."""
  images, labels = digits.load_split(training)
  return tf.data.Dataset.from_tensor_slices((images[:count], labels[:count]))


gin.external_configurable(digits_examples, "digits_examples")


def _task(**overrides) -> keras_model.KerasModelTask:
  settings = dict(model=keras_digits.digits_keras_model,
                  loss="sparse_categorical_crossentropy", from_logits=True,
                  metrics=["accuracy"],
                  train_data=keras_digits.digits_train_examples,
                  eval_data=keras_digits.digits_eval_examples)
  settings.update(overrides)
  return keras_model.KerasModelTask(**settings)


def _config(steps: int, batch: int, optimizer: str, learning_rate: float,
            **overrides) -> trainer.TrainerConfig:
  return trainer.TrainerConfig(
      train_steps=steps, steps_per_loop=steps, summary_interval=steps,
      checkpoint_interval=steps, global_batch_size=batch, eval_batch_size=128,
      optimizer=optimization.OptimizerConfig(name=optimizer,
                                             learning_rate=learning_rate),
      **overrides)


def _saved_initial_model(path: str, seed: int) -> tf_keras.Model:
  """The digits CNN, seeded, saved to `path`: where both sides start."""
  tf_keras.utils.set_random_seed(seed)
  model = keras_digits.digits_keras_model()
  model.save(path)
  return model


def _in_layer_order(model_dir: str):
  """The checkpoint's model weights, in the model's `weights` order."""
  saved = helpers.checkpoint_weights(model_dir)
  by_layer = sorted(
      (name for name in saved if name.startswith("model/")),
      key=lambda n: (int(n.split("/")[1].split("-")[1]), "bias" in n))
  return [saved[name] for name in by_layer]


# tf.keras after `import trainer`.


def test_tf_keras_is_tf_keras_after_import_trainer():
  # The conftest imports trainer first, as train.py does.
  assert tf.keras.Sequential is tf_keras.Sequential
  assert tf.keras.layers.Dense is tf_keras.layers.Dense
  model = keras_digits.digits_keras_model()  # Written with `tf.keras`.
  assert isinstance(model, tf_keras.Model)
  assert _task().build_model().count_params() == model.count_params()


# The peer checks against `fit`.


@pytest.mark.slow  # 132 steps of each, and fit's evaluation: over 10 s.
def test_same_order_and_sgd_end_with_fit_s_weights_and_evaluation(tmp_path):
  # 1,408 digits = 44 batches of 32, so that fit's epochs and our repeated
  # input cut the same batches; 3 epochs, no shuffle, SGD, deterministic
  # ops. The data come as a user binds them: one function, the split chosen
  # per set by scoped gin bindings. Measured here: max |difference| 0.0
  # (bit-identical) over the 8 weight tensors, accuracy 0.9 on both sides;
  # 0.8636 where the input context went to `training` (truthy: the
  # training split was evaluated).
  batch, epochs, rate = 32, 3, 0.05
  images, labels = digits.load_split(True)
  images, labels = images[:1408], labels[:1408]
  eval_images, eval_labels = digits.load_split(False)
  path = str(tmp_path / "initial.h5")
  model = _saved_initial_model(path, seed=0)
  tf.config.experimental.enable_op_determinism()
  model.compile(
      optimizer=tf_keras.optimizers.legacy.SGD(rate),
      loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
      metrics=["accuracy"])
  model.fit(tf.data.Dataset.from_tensor_slices((images, labels)).batch(batch),
            epochs=epochs, shuffle=False, verbose=0)
  fit_results = model.evaluate(eval_images, eval_labels, batch_size=128,
                               verbose=0, return_dict=True)

  gin.parse_config([
      f"KerasModelTask.model_file = '{path}'",
      "KerasModelTask.loss = 'sparse_categorical_crossentropy'",
      "KerasModelTask.from_logits = True",
      "KerasModelTask.metrics = ['accuracy']",
      "KerasModelTask.train_data = @train/digits_examples",
      "KerasModelTask.eval_data = @eval/digits_examples",
      "train/digits_examples.training = True",
      "train/digits_examples.count = 1408",
      "eval/digits_examples.training = False"])
  task = keras_model.KerasModelTask()
  steps = epochs * len(labels) // batch
  results = experiment.run(
      task, "train_and_eval", str(tmp_path / "ours"),
      trainer.RuntimeConfig(deterministic=True, seed=0),
      _config(steps, batch, "sgd", rate))
  ours = _in_layer_order(str(tmp_path / "ours"))
  assert [w.shape for w in ours] == [tuple(w.shape) for w in model.weights]
  difference = max(float(np.abs(a - b.numpy()).max())
                   for a, b in zip(ours, model.weights))
  assert difference <= 1e-6, difference
  assert float(results["accuracy"]) == pytest.approx(
      fit_results["accuracy"], abs=1e-7)
  assert float(results["loss"]) == pytest.approx(fit_results["loss"],
                                                 rel=1e-5)
  assert fit_results["accuracy"] > 0.8  # It learned.


@pytest.mark.slow
def test_shuffled_accuracy_is_within_001_of_fit_s_over_3_seeds(tmp_path):
  # Adam 1e-3, batch 64, 10 epochs on each side: fit(x, y, shuffle=True)
  # against a shuffle buffer of the whole split. Measured here, fit / ours:
  # seed 0 0.9861 / 0.9861, seed 1 0.9778 / 0.9917, seed 2 0.9917 /
  # 0.9806; means 0.9852 / 0.9861. One seed's accuracy moves by about
  # 0.01 with the order alone, so the mean is what is held to 0.01.
  batch, epochs = 64, 10
  images, labels = digits.load_split(True)
  eval_images, eval_labels = digits.load_split(False)
  fit_accuracies, our_accuracies = [], []
  for seed in range(3):
    path = str(tmp_path / f"initial{seed}.keras")
    model = _saved_initial_model(path, seed)
    model.compile(
        optimizer=tf_keras.optimizers.legacy.Adam(1e-3),
        loss=tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    model.fit(images, labels, batch_size=batch, epochs=epochs, shuffle=True,
              verbose=0)
    fit_accuracies.append(model.evaluate(
        eval_images, eval_labels, batch_size=128, verbose=0,
        return_dict=True)["accuracy"])
    task = _task(model=None, model_file=path, shuffle_buffer=len(labels),
                 shuffle_seed=seed)
    results = experiment.run(
        task, "train_and_eval", str(tmp_path / f"ours{seed}"),
        trainer.RuntimeConfig(seed=seed),
        _config(epochs * len(labels) // batch, batch, "adam", 1e-3))
    our_accuracies.append(float(results["accuracy"]))
  assert min(fit_accuracies + our_accuracies) > 0.96
  assert abs(np.mean(our_accuracies) - np.mean(fit_accuracies)) <= 0.01, (
      fit_accuracies, our_accuracies)


# Data, loss and metrics as `compile` and `fit` take them.


def test_sample_weights_weigh_the_loss_and_weighted_metrics_as_fit_does():
  task = _task(metrics=["accuracy"], weighted_metrics=["accuracy"])
  labels = tf.constant([0, 1, 2, 3])
  logits = tf.one_hot([0, 1, 0, 0], 10) * 5.0
  weights = tf.constant([1.0, 0.5, 0.0, 2.0])
  plain = task.build_losses(labels, logits)
  weighted = task.build_losses(keras_model.Weighted(labels, weights), logits)
  np.testing.assert_allclose(weighted.numpy(), plain.numpy() * weights.numpy(),
                             rtol=1e-6)
  metrics = task.build_metrics()
  assert [m.name for m in metrics] == ["accuracy", "weighted_accuracy"]
  task.process_metrics(metrics, keras_model.Weighted(labels, weights), logits)
  # Right on examples 0 and 1: 2 of 4; weighted (1 and 0.5 of 3.5).
  assert float(metrics[0].result()) == 0.5
  assert float(metrics[1].result()) == pytest.approx(1.5 / 3.5)
  # `fit`'s own weighted loss on the same batch, for the mean.
  fit_loss = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
      labels, logits, sample_weight=weights)
  assert float(tf.reduce_mean(weighted)) == pytest.approx(float(fit_loss))


def test_triples_become_weighted_labels_and_other_elements_are_refused():
  images, labels = digits.load_split(False)
  weights = np.ones(len(labels), np.float32)
  task = _task(eval_data=_data((images, labels, weights)))
  _, label = next(iter(task.build_inputs(False)))
  assert isinstance(label, keras_model.Weighted)
  task = _task(eval_data=_data(images))
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.eval_data` \(<lambda>\) gives elements of single "
      r"tensors: give \(x, y\) examples, or \(x, y, sample_weight\).$")):
    task.build_inputs(False)
  task = _task(train_data=lambda: _data((images, labels))().batch(32))
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.train_data` \(<lambda>\) returns batches \(every "
      r"element has a leading dimension of unknown size\): return single "
      r"examples, without `.batch\(...\)`")):
    task.build_inputs(True)
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.eval_data` is not set, and this run evaluates")):
    _task(eval_data=None).build_inputs(False)


def test_a_data_function_without_a_context_is_sharded_per_worker():
  def examples(context):
    return [int(label) for _, label in _task(
        train_data=_data((np.zeros([10, 1]), np.arange(10)))).build_inputs(
            True, context).as_numpy_iterator()]

  assert examples(None) == list(range(10))
  shards = [examples(tf.distribute.InputContext(2, index, 2))
            for index in range(2)]
  assert shards == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]


@pytest.mark.slow
def test_one_device_and_mirrored_end_with_the_same_weights(tmp_path):
  # 10 SGD steps (the digits CNN's ReLUs part longer runs; see
  # tests/tasks/test_digits.py).
  weights = []
  for strategy, devices in (("one_device", 0), ("mirrored", 2)):
    experiment.run(_task(), "train", str(tmp_path / strategy),
                   trainer.RuntimeConfig(distribution_strategy=strategy,
                                         num_cpu_devices=devices, seed=0),
                   _config(10, 32, "sgd", 0.05))
    weights.append(helpers.checkpoint_weights(str(tmp_path / strategy)))
  assert helpers.max_weight_difference(*weights) < 1e-6


@pytest.mark.parametrize("name,metric_type,value", [
    ("accuracy", "MeanMetricWrapper", 0.5),
    ("acc", "MeanMetricWrapper", 0.5),
    ("sparse_categorical_accuracy", "MeanMetricWrapper", 0.5),
    ("SparseCategoricalAccuracy", "SparseCategoricalAccuracy", 0.5),
    ("sparsecategoricalaccuracy", "SparseCategoricalAccuracy", 0.5),
])
def test_metrics_by_name_are_compile_s(name, metric_type, value):
  metric = _task(metrics=[name]).build_metrics()[0]
  assert type(metric).__name__ == metric_type
  metric.update_state(tf.constant([1, 2]), tf.one_hot([1, 0], 3))
  assert float(metric.result()) == value


def test_accuracy_follows_the_shapes_as_compile_s_does():
  binary = _task(metrics=["accuracy"]).build_metrics()[0]
  binary.update_state(tf.constant([[1.0], [0.0]]), tf.constant([[0.9], [0.8]]))
  assert float(binary.result()) == 0.5  # Thresholded at 0.5: binary.
  one_hot = _task(metrics=["accuracy"]).build_metrics()[0]
  one_hot.update_state(tf.one_hot([1, 2], 3), tf.one_hot([1, 0], 3))
  assert float(one_hot.result()) == 0.5  # Categorical.


def test_losses_by_name_class_object_and_function_agree():
  labels = tf.constant([0, 3])
  logits = tf.random.stateless_normal([2, 10], seed=[1, 2])
  want = tf_keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True).numpy()
  given = [
      dict(loss="sparse_categorical_crossentropy", from_logits=True),
      dict(loss="SparseCategoricalCrossentropy", from_logits=True),
      dict(loss=tf_keras.losses.SparseCategoricalCrossentropy(
          from_logits=True), from_logits=None),
      dict(loss=lambda y, p: tf_keras.losses.sparse_categorical_crossentropy(
          y, p, from_logits=True), from_logits=None),
  ]
  for settings in given:
    got = _task(**settings).build_losses(labels, logits).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=str(settings))


@pytest.mark.slow
def test_gin_example_trains_with_named_eval_sets(tmp_path):
  task, runtime, config = gin_config.load_config(
      ["gin/keras_model.gin"],
      ["trainer.train_steps=20", "trainer.steps_per_loop=10",
       "trainer.summary_interval=10", "trainer.validation_interval=20",
       "trainer.checkpoint_interval=20",
       "KerasModelTask.eval_data = {'clean': @digits_eval_examples, "
       "'again': @digits_eval_examples}"])
  results = experiment.run(task, "train_and_eval", str(tmp_path), runtime,
                           config)
  assert helpers.checkpoint_step(str(tmp_path)) == 20
  assert float(results["clean/accuracy"]) == float(results["again/accuracy"])
  assert float(results["clean/accuracy"]) > 0.5  # 20 steps of Adam.
  evals = helpers.read_scalars(str(tmp_path / "eval" / "clean"))
  assert [step for step, _ in evals["accuracy"]] == [20]


def test_tfds_name_and_splits_train_on_mock_data(tmp_path):
  def model():
    return tf_keras.Sequential([
        tf_keras.Input((28, 28, 1)), tf_keras.layers.Rescaling(1 / 255),
        tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])

  task = _task(model=model, train_data=None, eval_data=None,
               tfds_name="mnist", eval_split={"test": "test"},
               shuffle_buffer=16)
  with tfds.testing.mock_data(num_examples=64):
    results = experiment.run(
        task, "train_and_eval", str(tmp_path), trainer.RuntimeConfig(seed=0),
        _config(4, 16, "sgd", 0.01))
  assert helpers.checkpoint_step(str(tmp_path)) == 4
  assert 0.0 <= float(results["test/accuracy"]) <= 1.0


@pytest.mark.slow
def test_a_resumed_run_ends_as_one_run_would(tmp_path):
  # Shuffled through a buffer (which the checkpoint holds with the input's
  # position): 10 steps, a new run to 20, against 20 at once.
  def run(model_dir, steps):
    return experiment.run(
        _task(shuffle_buffer=1437), "train", str(model_dir),
        trainer.RuntimeConfig(seed=0),
        trainer.TrainerConfig(train_steps=steps, steps_per_loop=10,
                              summary_interval=10, checkpoint_interval=10,
                              global_batch_size=32))

  run(tmp_path / "once", 20)
  run(tmp_path / "twice", 10)
  run(tmp_path / "twice", 20)
  once = helpers.checkpoint_weights(str(tmp_path / "once"))
  twice = helpers.checkpoint_weights(str(tmp_path / "twice"))
  assert helpers.max_weight_difference(once, twice) == 0.0


# A user's data function outside the repository, through train.py.

_USER_DATA = """
import gin
import tensorflow as tf
from tasks import digits

def digits_examples(training):
  with open("calls.txt", "a") as f:
    f.write(f"{training!r}\\n")
  return tf.data.Dataset.from_tensor_slices(digits.load_split(training))

gin.external_configurable(digits_examples)
"""

_USER_GIN = """
include "gin/keras_model.gin"
import my_data
KerasModelTask.train_data = @train/digits_examples
KerasModelTask.eval_data = @eval/digits_examples
train/digits_examples.training = True
eval/digits_examples.training = False
trainer.train_steps = 1
trainer.steps_per_loop = 1
trainer.summary_interval = 1
trainer.validation_interval = 1
trainer.checkpoint_interval = 1
"""


@pytest.mark.slow  # One train.py run to its evaluation: over 10 s here.
def test_train_py_evaluates_the_split_gin_binds_for_eval(tmp_path):
  # The user: one function, `training` bound per set. The
  # InputContext went to `training` (truthy): both sets were the training
  # split, the eval accuracy 0.737 where fit gave 0.693 on the eval split.
  (tmp_path / "my_data.py").write_text(_USER_DATA)
  (tmp_path / "my.gin").write_text(_USER_GIN)
  result = helpers.run_cli(["--gin_file=my.gin", "--model_dir=run"],
                           cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-2000:]
  assert (tmp_path / "calls.txt").read_text().splitlines() == [
      "True", "False"]
  # The final eval line is what the checkpoint's weights give on the eval
  # split (printed to 4 decimals).
  model = keras_digits.digits_keras_model()
  model.set_weights(_in_layer_order(str(tmp_path / "run")))
  images, labels = digits.load_split(False)
  logits = model(images)
  accuracy = float(np.mean(np.argmax(logits, -1) == labels))
  loss = float(tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(
      labels, logits, from_logits=True)))
  line = result.stdout.split("final eval | ")[1].splitlines()[0]
  printed = dict(item.split() for item in line.split(" | "))
  assert float(printed["accuracy"]) == pytest.approx(accuracy, abs=5.1e-5)
  assert float(printed["loss"]) == pytest.approx(loss, abs=5.1e-5)


# Bad input: one line each, before anything is written.


@pytest.mark.slow
@pytest.mark.parametrize("binding,line", [
    ("KerasModelTask.model_file = '{keras3}'",
     "`KerasModelTask.model_file` ({keras3}) was saved by Keras 3."),
    ("KerasModelTask.metrics = ['acuracy']",
     "`KerasModelTask.metrics[0]` ('acuracy') is no Keras metric (did you "
     "mean 'accuracy'?)"),
], ids=["keras3_file", "metric_typo"])
def test_train_py_says_one_line_and_writes_nothing(keras3, tmp_path, binding,
                                                   line):
  model_dir = tmp_path / "run"
  result = helpers.run_cli([
      "--gin_file=gin/keras_model.gin",
      "--gin_param=KerasModelTask.model = None" if "model_file" in binding
      else "--gin_param=trainer.train_steps = 10",
      "--gin_param=" + binding.format(keras3=keras3["keras"]),
      f"--model_dir={model_dir}"])
  assert result.returncode == 2, result.stderr[-2000:]
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1
  assert lines[0].startswith("train.py: error: " +
                             line.format(keras3=keras3["keras"]))
  assert not model_dir.exists()



def _configured(tmp_path, *bindings: str):
  gin.clear_config(clear_constants=True)  # One test may load several.
  return gin_config.load_config(
      ["gin/keras_model.gin"],
      ["KerasModelTask.model = None"] + list(bindings))


def test_a_model_file_that_does_not_exist(tmp_path):
  missing = tmp_path / "missing.keras"
  with pytest.raises(errors.ConfigError, match=(
      rf"^`KerasModelTask.model_file` \({missing}\) does not exist.$")):
    _configured(tmp_path, f"KerasModelTask.model_file = '{missing}'")


def test_a_model_file_that_holds_no_model(tmp_path):
  text = tmp_path / "notes.keras"
  text.write_text("not a model")
  weights = str(tmp_path / "only.weights.h5")
  keras_digits.digits_keras_model().save_weights(weights)
  for path, reason in [(text, "file signature not found"),
                       (weights, "No model config found")]:
    task = _configured(tmp_path, f"KerasModelTask.model_file = '{path}'")[0]
    with pytest.raises(errors.ConfigError, match=(
        rf"^`KerasModelTask.model_file` \({path}\) holds no model tf_keras "
        rf"can load: .*{reason}")):
      task.build_model()


def _damaged_copy(path: str, member: str) -> str:
  """A copy of the `.keras` file at `path` with 4 bytes flipped in the
  middle of `member`'s stored bytes (the archive stores them as they are)."""
  with zipfile.ZipFile(path) as archive:
    info = archive.getinfo(member)
  assert info.compress_type == zipfile.ZIP_STORED
  data = bytearray(open(path, "rb").read())
  # The local header: 30 bytes, the name and the extra field.
  start = (info.header_offset + 30 + len(info.filename.encode()) +
           int.from_bytes(data[info.header_offset + 28:
                               info.header_offset + 30], "little"))
  middle = start + info.compress_size // 2
  data[middle:middle + 4] = bytes(b ^ 0xFF for b in data[middle:middle + 4])
  damaged = path.replace(".keras", f"_{member.split('.')[0]}.keras")
  with open(damaged, "wb") as f:
    f.write(data)
  return damaged


@pytest.mark.slow  # train.py up to the model's build: about 8 s here.
def test_a_damaged_model_file_is_one_line_exit_2(tmp_path):
  # Before: exit 1 with `train.py: error: in h5py.h5fd.H5FD_fileobj_get_eof
  # (h5py/h5fd.pyx:151, called from build_model): BadZipFile: Bad CRC-32
  # for file 'model.weights.h5'`.
  path = str(tmp_path / "model.keras")
  keras_digits.digits_keras_model().save(path)
  damaged = _damaged_copy(path, "model.weights.h5")
  result = helpers.run_cli([
      "--gin_file=gin/keras_model.gin",
      "--gin_param=KerasModelTask.model = None",
      f"--gin_param=KerasModelTask.model_file = '{damaged}'",
      f"--model_dir={tmp_path / 'run'}"])
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines() == [
      f"train.py: error: `KerasModelTask.model_file` ({damaged}) is damaged "
      "(Bad CRC-32 for file 'model.weights.h5': its bytes changed after it "
      "was saved): save the model again, or give an intact copy."]
  assert not (tmp_path / "run").exists()


def test_damaged_model_and_weights_files_are_one_line(tmp_path):
  path = str(tmp_path / "model.keras")
  keras_digits.digits_keras_model().save(path)
  damaged = _damaged_copy(path, "config.json")
  with pytest.raises(errors.ConfigError) as raised:
    _task(model=None, model_file=damaged).build_model()
  assert str(raised.value) == (
      f"`KerasModelTask.model_file` ({damaged}) is damaged (Bad CRC-32 for "
      "file 'config.json': its bytes changed after it was saved): save the "
      "model again, or give an intact copy.")
  damaged = _damaged_copy(path, "model.weights.h5")
  task = _task(initial_weights=damaged)
  with pytest.raises(errors.ConfigError) as raised:
    task.initialize(task.build_model())
  assert str(raised.value) == (
      f"`KerasModelTask.initial_weights` ({damaged}) is damaged (Bad CRC-32 "
      "for file 'model.weights.h5': its bytes changed after it was saved): "
      "save the model again, or give an intact copy.")


@pytest.mark.parametrize("binding,line", [
    ("KerasModelTask.loss = 'sparse_categorical_crossentropyy'",
     "`KerasModelTask.loss` ('sparse_categorical_crossentropyy') is no Keras "
     "loss (did you mean 'sparse_categorical_crossentropy'?): name one of "
     "`tf_keras.losses` or give a tf_keras object."),
    ("KerasModelTask.metrics = ['accuracy', 'acuracy']",
     "`KerasModelTask.metrics[1]` ('acuracy') is no Keras metric (did you "
     "mean 'accuracy'?): name one of `tf_keras.metrics` or give a tf_keras "
     "object."),
    ("KerasModelTask.loss = 'mse'",
     "`KerasModelTask.from_logits` does not apply to the loss "
     "'mean_squared_error', which takes no logits."),
], ids=["loss_typo", "metric_typo", "logits_of_mse"])
def test_unknown_names_are_one_line_with_the_closest(tmp_path, binding, line):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config(["gin/keras_model.gin"], [binding])
  assert str(raised.value) == line


def test_a_model_given_in_place_of_its_function_is_refused():
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.model` is a Sequential, not a function: pass the "
      r"function that builds the model \(gin: `@my_model`, without "
      r"parentheses\)")):
    _task(model=keras_digits.digits_keras_model())


# Keras 3.


@pytest.fixture(scope="module")
def keras3(tmp_path_factory):
  """A Keras 3 model saved as `.keras`, `.h5` and an exported SavedModel,
  and its outputs on a probe batch."""
  import keras  # pylint: disable=g-import-not-at-top
  assert keras.__version__.startswith("3.")
  directory = tmp_path_factory.mktemp("keras3")
  model = keras.Sequential([
      keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3, activation="relu"),
      keras.layers.Flatten(), keras.layers.Dense(10)])
  paths = {kind: str(directory / name) for kind, name in [
      ("keras", "model.keras"), ("h5", "model.h5")]}
  model.save(paths["keras"])
  model.save(paths["h5"])
  probe = digits.load_split(False)[0][:16]
  return dict(paths, module=keras, model=model, probe=probe,
              outputs=np.asarray(model(probe)))


def _tf_keras_twin() -> tf_keras.Model:
  """The Keras 3 fixture's architecture, built with tf_keras."""
  return tf_keras.Sequential([
      tf_keras.Input((8, 8, 1)),
      tf_keras.layers.Conv2D(4, 3, activation="relu"),
      tf_keras.layers.Flatten(), tf_keras.layers.Dense(10)])


def test_keras3_files_are_refused_naming_the_route(keras3, tmp_path):
  for kind in ("keras", "h5"):
    with pytest.raises(errors.ConfigError) as raised:
      _configured(tmp_path, f"KerasModelTask.model_file = '{keras3[kind]}'")
    assert str(raised.value) == (
        f"`KerasModelTask.model_file` ({keras3[kind]}) was saved by Keras "
        f"{keras3['module'].__version__} (Keras 3), which tf_keras cannot "
        "load: build the same architecture with tf_keras in a model function "
        "(`KerasModelTask.model = @my_model`: `import tf_keras as keras`, or "
        "`tf.keras` after `import trainer`) and start from its weights with "
        f"`KerasModelTask.initial_weights = \"{keras3[kind]}\"`.")


def test_model_files_at_a_url_are_checked_there(keras3, tmp_path,
                                               monkeypatch):
  """A Keras 3 file in a bucket (here `ram://`) is told by its bytes there;
  a missing one is named; nothing local is looked at or made."""
  monkeypatch.chdir(tmp_path)
  bucket = f"ram://{tmp_path.name}/models"
  for kind in ("keras", "h5"):
    path = f"{bucket}/model.{kind}"
    files.copy(keras3[kind], path)
    with pytest.raises(errors.ConfigError, match=(
        rf"^`KerasModelTask.model_file` \({path}\) was saved by Keras 3\.")):
      _configured(tmp_path, f"KerasModelTask.model_file = '{path}'")
  gin.clear_config(clear_constants=True)
  with pytest.raises(errors.ConfigError, match=(
      rf"^`KerasModelTask.initial_weights` \({bucket}/missing.keras\) does "
      "not exist.")):
    _task(initial_weights=f"{bucket}/missing.keras")
  assert not os.listdir(tmp_path)


@pytest.mark.slow
def test_a_keras3_export_is_refused(keras3, tmp_path):
  exported = str(tmp_path / "export")
  keras3["model"].export(exported, verbose=False)
  with pytest.raises(errors.ConfigError, match=(
      rf"^`KerasModelTask.model_file` \({exported}\) is a SavedModel with no "
      r"Keras model in it \(no keras_metadata.pb: written by Keras 3's "
      r"`model.export`")):
    _configured(tmp_path, f"KerasModelTask.model_file = '{exported}'")


def test_a_keras3_model_from_the_function_is_refused(keras3):
  keras = keras3["module"]
  task = _task(model=lambda: keras.Sequential([keras.Input((8, 8, 1)),
                                               keras.layers.Flatten(),
                                               keras.layers.Dense(10)]))
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.model` \(<lambda>\) gave a Keras 3 model "
      r"\(keras.src.models.sequential.Sequential\), which this framework "
      r"\(tf_keras, Keras 2\) cannot train: save it with Keras 3 "
      r"\(`model.save\(\"model.keras\"\)`\), then build the same "
      r"architecture with tf_keras")):
    task.build_model()


def test_keras3_losses_and_metrics_are_refused(keras3):
  keras = keras3["module"]
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.loss` is Keras 3 \(keras.src.losses.losses."
      r"SparseCategoricalCrossentropy\), which this framework \(tf_keras, "
      r"Keras 2\) cannot train: name it as a string")):
    _task(loss=keras.losses.SparseCategoricalCrossentropy(), from_logits=None)
  with pytest.raises(errors.ConfigError, match=(
      r"^`KerasModelTask.metrics` is Keras 3 \(keras.src.metrics")):
    _task(metrics=[keras.metrics.SparseCategoricalAccuracy()])


def test_the_route_starts_from_the_keras3_weights(keras3, tmp_path):
  # Keras 3 reads its file; the weights go in order into the tf_keras twin,
  # built in the strategy's scope as a run builds it: outputs identical
  # (measured: max |difference| 0.0, one device and mirrored).
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  for kind in ("h5", "keras"):
    task = _task(model=_tf_keras_twin, initial_weights=keras3[kind])
    with strategy.scope():
      model = task.build_model()
      task.initialize(model)
    np.testing.assert_array_equal(model(keras3["probe"]).numpy(),
                                  keras3["outputs"])


@pytest.mark.slow
def test_a_run_starts_from_the_keras3_weights(keras3, tmp_path):
  # A learning rate too small to move them in 2 steps.
  task = _task(model=_tf_keras_twin, initial_weights=keras3["keras"])
  experiment.run(task, "train", str(tmp_path), trainer.RuntimeConfig(seed=0),
                 _config(2, 16, "sgd", 1e-12))
  for saved, weight in zip(_in_layer_order(str(tmp_path)),
                           keras3["model"].get_weights()):
    np.testing.assert_allclose(saved, weight, atol=1e-9)


def test_initial_weights_that_do_not_fit_are_one_line(keras3):
  task = _task(initial_weights=keras3["keras"])  # The digits CNN: not it.
  model = task.build_model()
  with pytest.raises(errors.ConfigError, match=(
      rf"^`KerasModelTask.initial_weights` \({keras3['keras']}\) does not "
      r"fit the model: it holds 4 weights \(Keras 3.\d+.\d+\), the model 8$")):
    task.initialize(model)
