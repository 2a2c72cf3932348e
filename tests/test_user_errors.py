"""Errors raised by a task's own code: one line with its file, line, hook."""

import importlib.util
import os
import textwrap

import pytest
import tensorflow as tf
import tf_keras

from trainer import user_errors
from trainer.model import task as task_lib

import helpers

# Hooks of a user's task, each with one mistake; `# NAME` marks its line.
USER_CODE = '''
import tensorflow as tf
import tf_keras


def helper_loss(labels, outputs):
  return tf.reduce_sum(outputs, -1) + tf.constant(1, tf.int32)  # HELPER


class Reshaper(tf_keras.layers.Layer):

  def call(self, x):
    return tf.reshape(x, [-1, 3])  # RESHAPE


class MyTask:

  def build_model(self):
    return {}["missing"]  # EAGER

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_sum(model_outputs, -1) + tf.constant(1, tf.int32)  # DTYPE

  def process_metrics(self, metrics, labels, model_outputs):
    return helper_loss(labels, model_outputs)

  def validation_step(self, labels, logits):
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits
    return loss(labels, logits)  # LABEL

  def train_step(self, model, features):
    return model(features)

  def parts(self, message):
    from trainer import user_errors
    return user_errors.at_caller(message)  # CALLER
'''


def _line(source: str, marker: str) -> int:
  """The number of the line of `source` ending in `# marker`."""
  lines = source.splitlines()
  return next(i + 1 for i, line in enumerate(lines)
              if line.endswith(f"# {marker}"))


@pytest.fixture(name="user")
def fixture_user(tmp_path, monkeypatch):
  """The user's module, imported from a file outside the repository; the
  working directory is its folder, so lines name it `user_code.py`."""
  path = tmp_path / "user_code.py"
  path.write_text(USER_CODE)
  monkeypatch.chdir(tmp_path)
  spec = importlib.util.spec_from_file_location(
      f"user_code_{id(path)}", str(path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _raised(function, *args) -> BaseException:
  with pytest.raises(Exception) as raised:
    function(*args)
  return raised.value


def test_error_while_tracing_names_the_hook_and_its_line(user):
  error = _raised(tf.function(user.MyTask().build_losses),
                  tf.zeros([2]), tf.zeros([2, 3]))
  assert user_errors.describe(error) == (
      f"in MyTask.build_losses (user_code.py:{_line(USER_CODE, 'DTYPE')}): "
      "TypeError: Input 'y' of 'AddV2' Op has type int32 that does not match "
      "type float32 of argument 'x'.")


def test_error_while_running_names_the_line_that_defined_the_op(user):
  step = tf.function(user.MyTask().validation_step)
  error = _raised(step, tf.constant([3, 10]), tf.zeros([2, 10]))
  assert isinstance(error, tf.errors.InvalidArgumentError)
  assert str(error).startswith("Graph execution error:")
  assert user_errors.describe(error) == (
      f"in MyTask.validation_step (user_code.py:{_line(USER_CODE, 'LABEL')}):"
      " InvalidArgumentError: Received a label value of 10 which is outside "
      "the valid range of [0, 10). Label values: 3 10")


def test_long_cause_is_cut_at_a_word():
  step = tf.function(tf.nn.sparse_softmax_cross_entropy_with_logits)
  error = _raised(step, tf.range(1000), tf.zeros([1000, 10]))
  line = user_errors.cause(error)
  assert line.startswith("InvalidArgumentError: Received a label value of "
                         "999 which is outside the valid range of [0, 10). "
                         "Label values: 0 1 2 3")
  assert line.endswith(" ...") and len(line) < 350
  assert "\n" not in line


def test_error_in_a_layer_names_the_layer_and_the_calling_hook(user):
  model = tf_keras.Sequential([tf_keras.Input((4,)), user.Reshaper()])
  error = _raised(tf.function(user.MyTask().train_step), model,
                  tf.zeros([2, 4]))
  assert user_errors.describe(error) == (
      f"in Reshaper.call (user_code.py:{_line(USER_CODE, 'RESHAPE')}, called "
      "from train_step): ValueError: in layer 'reshaper' (type Reshaper): "
      "Dimension size must be evenly divisible by 3 but is 8 with input "
      "shapes: [2,4], [2] and with input tensors computed as partial shapes: "
      "input[1] = [?,3].")


def test_error_in_a_helper_names_the_hook_that_called_it(user):
  error = _raised(tf.function(user.MyTask().process_metrics), [],
                  tf.zeros([2]), tf.zeros([2, 3]))
  assert user_errors.describe(error).startswith(
      f"in helper_loss (user_code.py:{_line(USER_CODE, 'HELPER')}, called "
      "from process_metrics): TypeError: Input 'y' of 'AddV2' Op")


def test_eager_error_names_the_hook(user):
  error = _raised(user.MyTask().build_model)
  assert user_errors.describe(error) == (
      f"in MyTask.build_model (user_code.py:{_line(USER_CODE, 'EAGER')}): "
      "KeyError: 'missing'")


def test_file_outside_the_working_directory_keeps_its_full_path(
    user, tmp_path_factory, monkeypatch):
  # A sibling of the user's folder: it cannot contain the user's file
  # (the repository's parent can, when pytest's temp is under it).
  monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
  error = _raised(user.MyTask().build_model)
  assert f"({user.__file__}:{_line(USER_CODE, 'EAGER')})" in (
      user_errors.describe(error))


def test_at_caller_names_the_users_code_that_called(user):
  assert user.MyTask().parts("`num_parts` (0) must be positive.") == (
      f"in MyTask.parts (user_code.py:{_line(USER_CODE, 'CALLER')}): "
      "`num_parts` (0) must be positive.")


def test_at_caller_without_users_code_is_the_message(user, monkeypatch):
  monkeypatch.setattr(user_errors, "is_user_file", lambda filename: False)
  assert user.MyTask().parts("`stages` must be non-empty lists of layers.") == (
      "`stages` must be non-empty lists of layers.")


def test_without_user_code_the_default_hook_or_only_the_cause():
  tf_file = os.path.join(os.path.dirname(tf.__file__), "ops", "math_ops.py")
  task_file = os.path.join(os.path.dirname(task_lib.__file__), "task.py")
  message = textwrap.dedent(f'''\
      Graph execution error:

      Detected at node while/Mul defined at (most recent call last):
        File "{task_file}", line 199, in compute_gradients

        File "{tf_file}", line 1000, in multiply

      2 root error(s) found.
        (0) INVALID_ARGUMENT:  Incompatible shapes: [8,4] vs. [8,3]
      \t [[{{{{node while/Mul}}}}]]
        (1) INVALID_ARGUMENT:  Incompatible shapes: [8,4] vs. [8,3]
      \t [[{{{{node while/Mul}}}}]]
      0 successful operations.
      0 derived errors ignored. [Op:__inference_loop_718]''')
  error = tf.errors.InvalidArgumentError(None, None, message)
  assert user_errors.describe(error) == (
      "in Task.compute_gradients: InvalidArgumentError: Incompatible shapes: "
      "[8,4] vs. [8,3]")
  assert user_errors.describe(RuntimeError("lost\n  device")) == (
      "RuntimeError: lost device")


def test_which_files_are_the_users(tmp_path):
  assert user_errors.is_user_file(str(tmp_path / "my_task.py"))
  assert user_errors.is_user_file(os.path.join(helpers.REPO_ROOT, "tasks",
                                               "digits.py"))
  assert not any(user_errors.is_user_file(path) for path in [
      task_lib.__file__, helpers.TRAIN_PY, tf.__file__, tf_keras.__file__,
      os.__file__, "/tmp/__autograph_generated_fileab12cd.py", "<string>"])


def test_hooks_are_the_task_methods():
  public = {name for name, value in vars(task_lib.Task).items()
            if callable(value) and not name.startswith("_")}
  assert user_errors.HOOKS == public


@pytest.mark.parametrize("value,requested", [
    (None, False), ("", False), ("0", False), ("false", False), ("1", True),
    ("true", True), ("yes", True)])
def test_full_traceback_environment_variable(monkeypatch, value, requested):
  if value is None:
    monkeypatch.delenv(user_errors.FULL_TRACEBACK_ENV, raising=False)
  else:
    monkeypatch.setenv(user_errors.FULL_TRACEBACK_ENV, value)
  assert user_errors.full_traceback_requested() == requested


# A task run by `train.py` from its own folder; each subclass has a mistake.
MY_TASK = '''
import gin
import numpy as np
import tensorflow as tf
import tf_keras
import trainer
from trainer.distribute import placement


class Classifier(trainer.Task):

  def build_model(self):
    return tf_keras.Sequential([tf_keras.Input((4,)),
                                tf_keras.layers.Dense(10)])

  def build_inputs(self, training, input_context=None):
    features = np.ones([32, 4], np.float32)
    labels = np.arange(32) % 11  # 10 is one label too many.
    return tf.data.Dataset.from_tensor_slices((features, labels))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    loss = tf_keras.losses.sparse_categorical_crossentropy
    return loss(labels, model_outputs, from_logits=True)  # LABEL


@gin.configurable
class DtypeMismatch(Classifier):

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_sum(model_outputs, -1) + tf.constant(1, tf.int32)  # DTYPE


@gin.configurable
class WrongShape(Classifier):

  def build_model(self):
    def reshape(x):
      return tf.reshape(x, [-1, 3])  # SHAPE
    inputs = tf_keras.Input((4,))
    return tf_keras.Model(inputs, tf_keras.layers.Lambda(reshape)(inputs))


@gin.configurable
class LabelOutOfRange(Classifier):
  pass


@gin.configurable
class EmptyStage(Classifier):

  def build_model(self):
    return placement.StagedModel([[tf_keras.layers.Dense(10)], []])  # STAGES


@gin.configurable
class ListInputs(Classifier):

  def build_inputs(self, training, input_context=None):
    return [1, 2]
'''

MY_GIN = '''
import my_task
trainer.train_steps = 4
trainer.steps_per_loop = 2
trainer.summary_interval = 2
trainer.global_batch_size = 8
trainer.eval_batch_size = 8
'''

CLI_CASES = {
    "DtypeMismatch": (
        "in DtypeMismatch.build_losses", "DTYPE",
        "TypeError: Input 'y' of 'AddV2' Op has type int32 that does not "
        "match type float32 of argument 'x'."),
    "WrongShape": (
        "in WrongShape.build_model", "SHAPE",
        "ValueError: in layer 'lambda' (type Lambda): Dimension size must be "
        "evenly divisible by 3 but is 32 with input shapes: [8,4]"),
    "LabelOutOfRange": (
        "in Classifier.build_losses", "LABEL",
        "InvalidArgumentError: Received a label value of 10 which is outside "
        "the valid range of [0, 10)."),
}


@pytest.fixture(name="task_dir", scope="module")
def fixture_task_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("user")
  (directory / "my_task.py").write_text(MY_TASK)
  (directory / "my.gin").write_text(MY_GIN)
  return directory


def _train(task_dir, name, *args, env=None):
  return helpers.run_cli(
      ["--gin_file=my.gin", f"--gin_param=experiment.task=@{name}()",
       f"--model_dir=run_{name}", *args], cwd=str(task_dir), env=env,
      timeout=120)


# Each case below is a train.py process (~5 s); the in-process tests above
# check each kind of error. The default suite keeps one case of each test,
# the slow stage runs them all.
def _slow_but(names, kept):
  return [name if name == kept else pytest.param(name, marks=pytest.mark.slow)
          for name in sorted(names)]


@pytest.mark.parametrize("name", _slow_but(CLI_CASES, "DtypeMismatch"))
def test_train_py_reports_a_task_error_in_one_line(task_dir, name):
  place, marker, cause = CLI_CASES[name]
  result = _train(task_dir, name)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1, result.stderr[-3000:]
  assert lines[-1].startswith(f"train.py: error: {place} "
                              f"(my_task.py:{_line(MY_TASK, marker)}): "
                              f"{cause}")
  # The one line and TensorFlow's CUDA line: no frames.
  assert len(lines) <= 3, result.stderr
  assert "File " not in result.stderr and "in user code" not in result.stderr


# A mistake the framework names (a typed error): exit code 2, one line.
CONFIG_CASES = {
    "EmptyStage": lambda: (
        "in EmptyStage.build_model "
        f"(my_task.py:{_line(MY_TASK, 'STAGES')}): `stages` must be "
        "non-empty lists of layers."),
    "ListInputs": lambda: (
        "`build_inputs` must return a `tf.data.Dataset`, got list."),
}


@pytest.mark.parametrize("name", _slow_but(CONFIG_CASES, "ListInputs"))
def test_train_py_reports_a_task_mistake_the_framework_names_as_usage(
    task_dir, name):
  result = _train(task_dir, name)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr[-3000:]
  assert lines[-1] == f"train.py: error: {CONFIG_CASES[name]()}"
  assert "File " not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("name,args,env,shown", [
    pytest.param("DtypeMismatch", [], {user_errors.FULL_TRACEBACK_ENV: "1"},
                 "in user code:", marks=pytest.mark.slow),
    ("LabelOutOfRange", ["--full_traceback"], {},
     "Detected at node"),
])
def test_full_traceback_on_request(task_dir, name, args, env, shown):
  place, marker, cause = CLI_CASES[name]
  result = _train(task_dir, name, *args, env=env)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1, result.stderr[-3000:]
  assert "Traceback (most recent call last):" in result.stderr
  assert shown in result.stderr
  assert f'my_task.py", line {_line(MY_TASK, marker)}' in result.stderr
  # TensorFlow's own frames are kept, unfiltered.
  assert "tensorflow/python/eager" in result.stderr
  assert lines[-1].startswith(f"train.py: error: {place} "
                              f"(my_task.py:{_line(MY_TASK, marker)}): "
                              f"{cause}")
