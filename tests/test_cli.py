"""The command line: gin files, bindings, overrides and one-line errors."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from trainer import cli
from trainer import errors
from trainer import gin_config

import helpers

DIGITS = "gin/digits.gin"


@pytest.mark.parametrize("files,params,message", [
    ([DIGITS], ["trainr.train_steps=5"],
     "--gin_param: No configurable matching 'trainr' "
     "(did you mean 'trainer'?)"),
    ([DIGITS], ["trainer.train_step=5"],
     "--gin_param: Configurable 'trainer' doesn't have a parameter named "
     "'train_step' (did you mean 'train_steps'?)"),
    ([DIGITS], ["DigitsClasification.filters=8"],
     "--gin_param: No configurable matching 'DigitsClasification' "
     "(did you mean 'DigitsClassification'?)"),
    ([DIGITS], ["experiment.task=@DigitsClasification()"],
     "--gin_param: No configurable matching reference "
     "'@DigitsClasification()' (did you mean 'DigitsClassification'?)"),
    ([DIGITS], ["trainer.train_steps="],
     "--gin_param: gin syntax error: Unable to parse value"),
    ([DIGITS], ['trainer.train_steps="abc"'],
     "`trainer.train_steps` ('abc') must be an integer."),
    ([DIGITS], ['runtime.distribution_strategy="mirored"'],
     "`runtime.distribution_strategy` ('mirored') must be one of: default, "
     "one_device, mirrored, multi_worker_mirrored, parameter_server, "
     "central_storage, tpu."),
    ([DIGITS], ['runtime.mixed_precision_dtype="float64"'],
     "`runtime.mixed_precision_dtype` ('float64') must be one of: float32, "
     "float16, bfloat16."),
    ([DIGITS], ["runtime.loss_scale=-1"],
     "`runtime.loss_scale` (-1) must be 'dynamic' or a positive number."),
    ([DIGITS], ["experiment.task=3"],
     "`experiment.task` must be a trainer.Task, got int."),
    ([DIGITS], ["trainer.callbacks=[@CSVLogger(), @ReduceLROnPlateau()]",
                "CSVLogger.filename='log.csv'"],
     "`trainer.callbacks`: ReduceLROnPlateau cannot work here: it sets "
     "`model.optimizer.lr`, and the optimizer is the trainer's, not the "
     "model's; use a `learning_rate.*` schedule."),
    (["missing.gin"], [], "--gin_file: no such file: missing.gin"),
    ([], [], "no --gin_file given; try --gin_file=gin/digits.gin"),
])
def test_bad_configuration_is_one_clear_line(files, params, message):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config(files, params)
  assert str(raised.value) == message


def test_a_gin_file_that_is_a_directory_is_named_so(tmp_path):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([str(tmp_path)], [])
  assert str(raised.value) == (f"--gin_file: {tmp_path} is a directory, not "
                               "a gin file.")


def test_gin_file_errors_name_file_and_line(tmp_path):
  bad_syntax = tmp_path / "bad.gin"
  bad_syntax.write_text("import tasks.digits\ntrainer.train_steps = = 3\n")
  with pytest.raises(errors.ConfigError,
                     match=f"^{bad_syntax}:2: gin syntax error: Unable to "
                     "parse value$"):
    gin_config.load_config([str(bad_syntax)], [])

  bad_import = tmp_path / "import.gin"
  bad_import.write_text("import no_such_module_xyz\n")
  with pytest.raises(errors.ConfigError,
                     match=f"^{bad_import}:1: cannot import: No module named "
                     "'no_such_module_xyz' \\(looked in the working directory "
                     f"and beside the gin files: .*, {tmp_path}; or add its "
                     "directory to PYTHONPATH\\)$"):
    gin_config.load_config([str(bad_import)], [])

  no_task = tmp_path / "no_task.gin"
  no_task.write_text("trainer.train_steps = 3\n")
  with pytest.raises(errors.ConfigError, match="^no task configured"):
    gin_config.load_config([str(no_task)], [])


def test_overrides_and_stacked_files_apply_in_order(tmp_path):
  task, runtime, config = gin_config.load_config(
      [DIGITS, "gin/runtime/cpu_mirrored.gin"],
      ["trainer.train_steps=2000", 'runtime.num_cpu_devices=2',
       "optimizer.learning_rate=3e-4", "DigitsClassification.filters=8"])
  assert config.train_steps == 2000
  assert config.steps_per_loop == 100  # From digits.gin.
  assert runtime.distribution_strategy == "mirrored"
  assert runtime.num_cpu_devices == 2
  assert task.filters == 8
  assert config.optimizer.learning_rate == 3e-4


def test_model_dir_checks(tmp_path, monkeypatch):
  a_file = tmp_path / "file"
  a_file.write_text("x")
  with pytest.raises(errors.ConfigError, match="is a file, not a directory"):
    cli._check_model_dir(str(a_file))
  with pytest.raises(errors.ConfigError) as raised:
    cli._check_model_dir(str(a_file / "run"))
  assert str(raised.value) == (f"--model_dir ({a_file}/run) cannot be "
                               f"created: {a_file} is a file.")
  assert cli._check_model_dir(str(tmp_path / "new" / "dir"))
  os.symlink(tmp_path / "gone", tmp_path / "dangling")
  for form in ("dangling", "dangling/"):
    with pytest.raises(errors.ConfigError) as raised:
      cli._check_model_dir(str(tmp_path / form))
    assert str(raised.value) == (
        f"--model_dir ({tmp_path / form}) is a symlink to {tmp_path}/gone, "
        "which does not exist.")
  # Root may write anywhere, so permissions are simulated: `os.access` is
  # what the check asks.
  monkeypatch.setattr(cli.os, "access", lambda path, mode: False)
  with pytest.raises(errors.ConfigError) as raised:
    cli._check_model_dir(str(tmp_path / "new" / "dir"))
  assert str(raised.value) == (
      f"--model_dir ({tmp_path}/new/dir) is not writable: no write "
      f"permission on {tmp_path}.")


def test_cli_error_exits_2_with_one_line_and_creates_nothing(tmp_path):
  model_dir = tmp_path / "run"
  result = helpers.run_cli([f"--gin_file={DIGITS}",
                            "--gin_param=trainer.train_step=5",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "train.py: error: --gin_param: Configurable 'trainer' doesn't have a "
      "parameter named 'train_step' (did you mean 'train_steps'?)"]
  assert not model_dir.exists()


# A train.py process (~5 s): each bad input above leaves a finished
# model_dir unchanged in the default suite.
@pytest.mark.slow
def test_cli_error_leaves_an_existing_model_dir_unchanged(tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  (model_dir / "checkpoint").write_text("keep me")
  before = helpers.snapshot(str(model_dir))
  result = helpers.run_cli([f"--gin_file={DIGITS}", "--mode=trian",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and "--mode" in lines[0] and "trian" in lines[0]
  assert helpers.snapshot(str(model_dir)) == before


# A train.py run (~7 s); test_user_task.py runs a user's module outside
# the repository from another directory in the default suite.
@pytest.mark.slow
def test_user_task_outside_the_repo_via_gin_import(tmp_path):
  (tmp_path / "my_task.py").write_text(textwrap.dedent('''
      import gin
      import tensorflow as tf
      import tf_keras
      import trainer

      @gin.configurable
      class Constant(trainer.Task):
        def build_model(self):
          return tf_keras.Sequential([tf_keras.Input((1,)),
                                      tf_keras.layers.Dense(1)])
        def build_inputs(self, training, input_context=None):
          return tf.data.Dataset.from_tensor_slices(
              (tf.ones([16, 1]), 3.0 * tf.ones([16, 1])))
        def build_losses(self, labels, model_outputs, aux_losses=None):
          return tf.reduce_mean(tf.square(labels - model_outputs), -1)
  '''))
  (tmp_path / "my.gin").write_text(textwrap.dedent('''
      import my_task
      experiment.task = @Constant()
      trainer.train_steps = 20
      trainer.steps_per_loop = 10
      trainer.summary_interval = 10
      trainer.global_batch_size = 8
      trainer.eval_batch_size = 8
  '''))
  result = helpers.run_cli(["--gin_file=my.gin",
                            "--gin_param=trainer.train_steps=30",
                            "--model_dir=run"], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 30
  assert "final eval | loss " in result.stdout
  with open(tmp_path / "run" / "operative_config.gin") as f:
    assert "trainer.train_steps = 30" in f.read()


def test_named_eval_sets_bad_input_is_one_line_exit_2_nothing_written(
    tmp_path):
  (tmp_path / "sets_task.py").write_text(textwrap.dedent('''
      import gin
      import tensorflow as tf
      import tf_keras
      import trainer

      @gin.configurable
      class TwoSets(trainer.Task):
        def build_model(self):
          return tf_keras.Sequential([tf_keras.Input((1,)),
                                      tf_keras.layers.Dense(1)])
        def build_inputs(self, training, input_context=None):
          data = tf.data.Dataset.from_tensor_slices(
              (tf.ones([16, 1]), 3.0 * tf.ones([16, 1])))
          return data if training else {"clean": data, "test": data}
        def build_losses(self, labels, model_outputs, aux_losses=None):
          return tf.reduce_mean(tf.square(labels - model_outputs), -1)
  '''))
  (tmp_path / "sets.gin").write_text(textwrap.dedent('''
      import sets_task
      experiment.task = @TwoSets()
      trainer.train_steps = 20
      trainer.steps_per_loop = 10
      trainer.summary_interval = 10
      trainer.global_batch_size = 8
      trainer.eval_batch_size = 8
      trainer.held_out_sets = ("test",)
      best_checkpoint.higher_is_better = False
  '''))
  cases = {
      "names no set": (
          "best_checkpoint.metric='loss'",
          "train.py: error: `best_checkpoint.metric` ('loss') names no "
          "evaluation set: results are named `<set>/<metric>` (e.g. "
          "'clean/loss'), and the sets are: clean, test."),
      "held out": (
          "best_checkpoint.metric='test/loss'",
          "train.py: error: `best_checkpoint.metric` ('test/loss') is a "
          "result of the held-out set 'test' (`trainer.held_out_sets`), "
          "which is evaluated and reported but never judged: judge by "
          "another set's result."),
  }
  # Started together: each spends its seconds importing TensorFlow.
  running = {
      name: subprocess.Popen(
          [sys.executable, os.path.join(helpers.REPO_ROOT, "train.py"),
           "--gin_file=sets.gin", f"--gin_param={binding}",
           f"--model_dir={name.replace(' ', '_')}"],
          cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
          text=True)
      for name, (binding, _) in cases.items()}
  for name, process in running.items():
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, (name, stderr[-2000:])
    assert stderr.strip().splitlines() == [cases[name][1]], name
    assert not (tmp_path / name.replace(" ", "_")).exists()


@pytest.mark.parametrize("runtime_file,params,expected", [
    ("gin/runtime/cpu.gin", [], dict(distribution_strategy="one_device")),
    ("gin/runtime/cpu_mirrored.gin", [],
     dict(distribution_strategy="mirrored", num_cpu_devices=2)),
    ("gin/runtime/gpu_mirrored_fp16.gin", ["runtime.num_gpus=8"],
     dict(distribution_strategy="mirrored", num_gpus=8,
          mixed_precision_dtype="float16", loss_scale="dynamic")),
    ("gin/runtime/multi_worker.gin",
     ['runtime.worker_hosts="10.0.0.1:2222,10.0.0.2:2222"',
      "runtime.task_index=1"],
     dict(distribution_strategy="multi_worker_mirrored", task_index=1,
          all_reduce_alg="ring")),
    ("gin/runtime/parameter_server.gin", [],
     dict(distribution_strategy="parameter_server")),
    ("gin/runtime/parameter_server_sharded.gin", [],
     dict(distribution_strategy="parameter_server",
          variable_partitioner="min_size",
          variable_partitioner_args={"min_shard_bytes": 262144,
                                     "max_shards": 2})),
    ("gin/runtime/tpu_bf16.gin", [],
     dict(distribution_strategy="tpu", mixed_precision_dtype="bfloat16")),
])
def test_runtime_files_stack_on_a_task_file(runtime_file, params, expected):
  _, runtime, config = gin_config.load_config([DIGITS, runtime_file], params)
  for name, value in expected.items():
    assert getattr(runtime, name) == value
  if runtime_file.endswith("tpu_bf16.gin"):
    assert config.global_batch_size == 4096


def test_runtime_files_load_quietly_from_another_directory(tmp_path,
                                                          monkeypatch, caplog):
  # gin tries `gin/runtime/x.gin` as the Python package `gin.runtime` first
  # and logs "ERROR:root:Path not found" for it, and for the files it
  # includes, before it finds them in this repository.
  monkeypatch.chdir(tmp_path)
  _, runtime, _ = gin_config.load_config(
      ["gin/digits.gin", "gin/runtime/parameter_server_sharded.gin"], [])
  assert runtime.variable_partitioner == "min_size"
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]


_BAD_DATA_TASK = '''
import gin
import numpy as np
import tensorflow as tf
import tf_keras
import trainer

@gin.configurable
class BadData(trainer.Task):
  """Linear regression whose data is fine, holds a NaN, or is empty."""

  def __init__(self, data="ok"):
    self.data = data

  def build_model(self):
    return tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])

  def build_inputs(self, training, input_context=None):
    x = np.random.RandomState(0).normal(size=(64, 2)).astype(np.float32)
    if self.data == "nan":
      x[::8, 1] = np.nan  # One in every batch.
    if self.data == "empty":
      x = x[:0]
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))

  def build_losses(self, labels, model_outputs, aux_losses=None):
    return tf.reduce_mean(tf.square(labels - model_outputs), -1)
'''

_BAD_DATA_GIN = '''
import bad_data
experiment.task = @BadData()
trainer.train_steps = 10
trainer.steps_per_loop = 10
trainer.summary_interval = 10
trainer.checkpoint_interval = 10
trainer.global_batch_size = 8
trainer.eval_batch_size = 8
'''


@pytest.fixture(scope="module")
def trained_dirs(tmp_path_factory):
  """Model dirs holding a finished run: of digits, and of `BadData`."""
  base = tmp_path_factory.mktemp("trained")
  (base / "bad_data.py").write_text(_BAD_DATA_TASK)
  (base / "bad_data.gin").write_text(_BAD_DATA_GIN)
  digits = helpers.run_cli([f"--gin_file={DIGITS}", "--mode=train",
                            "--gin_param=trainer.train_steps=100",
                            f"--model_dir={base / 'digits'}"])
  assert digits.returncode == 0, digits.stderr[-2000:]
  data = helpers.run_cli([f"--gin_file={base / 'bad_data.gin'}",
                          f"--model_dir={base / 'bad_data'}"], cwd=str(base))
  assert data.returncode == 0, data.stderr[-2000:]
  return base


_HOSTS = 'runtime.worker_hosts="127.0.0.1:1,127.0.0.1:2"'
_MW = 'runtime.distribution_strategy="multi_worker_mirrored"'

# (name, run, extra args, extra environment, exit code, the error line).
# `run` is the finished run whose model_dir the bad command is pointed at.
BAD_INPUTS = [
    ("gin syntax", "digits", ["--gin_param=trainer.train_steps = = 3"], {}, 2,
     "--gin_param: gin syntax error: Unable to parse value"),
    ("unknown configurable", "digits", ["--gin_param=trainr.train_steps=5"],
     {}, 2, "No configurable matching 'trainr' (did you mean 'trainer'?)"),
    ("misspelled parameter", "digits", ["--gin_param=trainer.train_step=5"],
     {}, 2, "doesn't have a parameter named 'train_step' (did you mean "
     "'train_steps'?)"),
    ("wrong type", "digits", ['--gin_param=trainer.train_steps="abc"'], {}, 2,
     "`trainer.train_steps` ('abc') must be an integer."),
    ("unknown strategy", "digits",
     ['--gin_param=runtime.distribution_strategy="mirored"'], {}, 2,
     "`runtime.distribution_strategy` ('mirored') must be one of"),
    ("unknown precision", "digits",
     ['--gin_param=runtime.mixed_precision_dtype="float64"'], {}, 2,
     "`runtime.mixed_precision_dtype` ('float64') must be one of"),
    ("batch not divisible", "digits",
     ["--gin_file=gin/runtime/cpu_mirrored.gin",
      "--gin_param=trainer.global_batch_size=33"], {}, 2,
     "`trainer.global_batch_size` (33) must be divisible by the number of "
     "replicas (2)."),
    ("checkpoint_interval vs steps_per_loop", "digits",
     ["--gin_param=trainer.checkpoint_interval=150"], {}, 2,
     "`trainer.checkpoint_interval` (150) must be a multiple of "
     "`trainer.steps_per_loop` (100)."),
    ("summary_interval vs steps_per_loop", "digits",
     ["--gin_param=trainer.summary_interval=30"], {}, 2,
     "`trainer.summary_interval` (30) must be a multiple of "
     "`trainer.steps_per_loop` (100)."),
    ("validation_interval vs steps_per_loop", "digits",
     ["--gin_param=trainer.steps_per_loop=50",
      "--gin_param=trainer.validation_interval=120"], {}, 2,
     "`trainer.validation_interval` (120) must be a multiple of "
     "`trainer.steps_per_loop` (50)."),
    ("missing dataset", "digits",
     ["--gin_file=gin/mnist.gin",
      "--gin_param=MnistClassification.data_dir='/nonexistent/tfds'"], {}, 2,
     "tfds dataset 'mnist' is not prepared in data_dir (/nonexistent/tfds)"),
    ("another model's checkpoint", "digits",
     ["--gin_param=DigitsClassification.hidden_units=64"], {}, 2,
     "does not fit this model: variable hidden/bias has shape (64,) in this "
     "model but (128,) in the checkpoint; changed since step 100: "
     "DigitsClassification.hidden_units 128 -> 64: a model of another shape "
     "cannot resume this run; set them back, or train in a new --model_dir "
     "starting from the weights that fit: `warm_start.checkpoint = '"),
    ("malformed TF_CONFIG", "digits", [f"--gin_param={_MW}"],
     {"TF_CONFIG": "{not json"}, 2, "TF_CONFIG is not valid JSON"),
    ("task_index out of range", "digits",
     [f"--gin_param={_MW}", f"--gin_param={_HOSTS}",
      "--gin_param=runtime.task_index=5"], {}, 2,
     "`runtime.task_index` (5) must be in [0, 2)"),
    ("malformed worker_hosts", "digits",
     [f"--gin_param={_MW}", "--gin_param=runtime.worker_hosts='a:1,b'",
      "--gin_param=runtime.task_index=0"], {}, 2,
     "`runtime.worker_hosts` entry 'b' is not `host:port`."),
    ("TF_CONFIG task outside its cluster", "digits", [f"--gin_param={_MW}"],
     {"TF_CONFIG": '{"cluster": {"worker": ["127.0.0.1:1"]}, '
                   '"task": {"type": "worker", "index": 3}}'}, 2,
     "TF_CONFIG task {'type': 'worker', 'index': 3} does not name a member "
     "of its cluster (worker)."),
    ("unknown mode", "digits", ["--mode=trian"], {}, 2, "--mode"),
    # Resumed at step 10, every batch holding a NaN. The first batches may
    # still be clean ones: the restored input position includes the batches
    # the finished run had prefetched, from its clean data (how many varies
    # with timing: 1 in each of 3 runs here, 7 or more in a CI run that reached
    # step 20).
    ("NaN in the data", "bad_data", ["--gin_param=BadData.data='nan'",
                                     "--gin_param=trainer.train_steps=40"],
     {}, 1, "the training loss is not finite at step "),
    ("empty dataset", "bad_data", ["--gin_param=BadData.data='empty'",
                                   "--gin_param=trainer.train_steps=20"],
     {}, 2, "the training dataset is empty."),
]


# Each case is a train.py process (~5 s): these, whose messages are checked
# in-process too (tests/test_config.py, test_runtime.py, test_gin_config.py,
# distribute/test_strategy.py, test_cluster.py), run with the slow tests;
# the default suite keeps one of each kind.
_SLOW_BAD_INPUTS = {
    "unknown configurable", "misspelled parameter", "unknown strategy",
    "unknown precision", "summary_interval vs steps_per_loop",
    "validation_interval vs steps_per_loop", "task_index out of range",
    "malformed worker_hosts", "TF_CONFIG task outside its cluster",
    "wrong type", "checkpoint_interval vs steps_per_loop",
    "malformed TF_CONFIG"}


@pytest.mark.parametrize(
    "name,run,args,env,code,message",
    [pytest.param(*row, marks=pytest.mark.slow) if row[0] in _SLOW_BAD_INPUTS
     else row for row in BAD_INPUTS], ids=[row[0] for row in BAD_INPUTS])
def test_bad_input_is_one_line_and_leaves_model_dir_unchanged(
    trained_dirs, tmp_path, name, run, args, env, code, message):
  del name  # The test id.
  model_dir = tmp_path / "run"
  shutil.copytree(trained_dirs / run, model_dir)
  before = helpers.snapshot(str(model_dir))
  gin_file = (DIGITS if run == "digits" else
              str(trained_dirs / "bad_data.gin"))
  result = helpers.run_cli(
      [f"--gin_file={gin_file}", *args, f"--model_dir={model_dir}"],
      cwd=str(trained_dirs), env=env)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == code, result.stderr[-2000:]
  assert lines[-1].startswith("train.py: error: ")
  assert message in lines[-1]
  assert helpers.snapshot(str(model_dir)) == before


def test_model_dir_that_is_a_file_is_one_line(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("keep")
  result = helpers.run_cli([f"--gin_file={DIGITS}", f"--model_dir={a_file}"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"train.py: error: --model_dir ({a_file}) is a file, not a directory."]
  # Below a file: the same check, in-process (a second process costs 4 s).
  with pytest.raises(errors.ConfigError) as raised:
    cli._check_model_dir(f"{a_file}/run")  # pylint: disable=protected-access
  assert str(raised.value) == (f"--model_dir ({a_file}/run) cannot be "
                               f"created: {a_file} is a file.")
  assert a_file.read_text() == "keep"


def test_dry_run_checks_everything_and_touches_nothing(trained_dirs,
                                                        tmp_path):
  model_dir = tmp_path / "run"
  shutil.copytree(trained_dirs / "digits", model_dir)
  before = helpers.snapshot(str(model_dir))
  result = helpers.run_cli([f"--gin_file={DIGITS}", "--dry_run",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 0, result.stderr[-2000:]
  assert "dry run | resolved configuration:" in result.stdout
  assert "trainer.train_steps = 1000" in result.stdout  # The real value.
  assert "runtime.distribution_strategy = 'default'" in result.stdout
  assert (f"dry run | ok: one train step (from the checkpoint at step 100 in "
          f"{model_dir}) and one eval step ran") in result.stdout
  assert "steps_per_second" not in result.stdout  # Orbit's, not a result.
  # Its one save says what the input costs in a checkpoint (the digits'
  # whole-set shuffle buffer of 1437 examples, and prefetched batches).
  assert re.search(r"^input state \| \d+ KB in \S+/dry_run-\w+/ckpt-101 "
                   r"\(the training iterator's position and buffers\)$",
                   result.stdout, re.MULTILINE), result.stdout[-3000:]
  assert helpers.snapshot(str(model_dir)) == before

  # The configured model must fit the checkpoint it would resume from.
  result = helpers.run_cli([f"--gin_file={DIGITS}", "--dry_run",
                            "--gin_param=DigitsClassification.hidden_units=64",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].endswith(
      "does not fit this model: variable hidden/bias has shape (64,) in this "
      "model but (128,) in the checkpoint; changed since step 100: "
      "DigitsClassification.hidden_units 128 -> 64: a model of another shape "
      "cannot resume this run; set them back, or train in a new --model_dir "
      "starting from the weights that fit: `warm_start.checkpoint = "
      f"'{model_dir}/ckpt-100'` (and `warm_start.modules`).")
  assert helpers.snapshot(str(model_dir)) == before

  # An error a real run would hit only after building: first error, exit 2.
  result = helpers.run_cli([f"--gin_file={DIGITS}", "--dry_run",
                            "--gin_file=gin/runtime/cpu_mirrored.gin",
                            "--gin_param=trainer.global_batch_size=33",
                            f"--model_dir={tmp_path / 'new'}"])
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      "train.py: error: `trainer.global_batch_size` (33) must be divisible "
      "by the number of replicas (2).")
  assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("feature_file,params,expected", [
    ("sgd_cosine_warmup.gin", [],
     dict(optimizer=("sgd", 0.4, 0.9), schedule=("cosine", 100))),
    ("adamw.gin", [], dict(optimizer=("adamw", 0.002, None),
                           schedule=("linear", 100))),
    ("stepwise.gin", [], dict(optimizer=("sgd", 0.1, 0.9),
                              schedule=("stepwise", 0))),
    ("ema.gin", [], dict(ema=0.99)),
    ("gradient_accumulation.gin", [], dict(accumulation=4, clip=1.0)),
    ("best_checkpoint.gin", [], dict(best="accuracy", export=(True, True))),
    ("early_stopping.gin", [], dict(early=("accuracy", 3))),
    ("warm_start.gin", ['INIT_CHECKPOINT="runs/pretrained"'],
     dict(warm_start=("runs/pretrained", ("conv1", "conv2")))),
    ("continuous_eval.gin", [], dict(keep=True)),
    ("profile.gin", [], dict(profile=(200, 220))),
    ("optimizer_parts.gin", [],
     dict(parts=(("backbone", "head"), {"backbone": 0.1}))),
])
def test_feature_files_stack_on_a_task_file(feature_file, params, expected):
  _, _, config = gin_config.load_config([DIGITS, f"gin/features/{feature_file}"],
                                 params)
  checks = {
      "optimizer": lambda: (config.optimizer.name,
                            config.optimizer.learning_rate,
                            config.optimizer.momentum),
      "schedule": lambda: (config.learning_rate.schedule,
                           config.learning_rate.warmup_steps),
      "ema": lambda: config.ema.decay,
      "accumulation": lambda: config.gradient_accumulation_steps,
      "clip": lambda: config.gradient_clip_norm,
      "best": lambda: config.best_checkpoint.metric,
      "export": lambda: (config.export.at_end, config.export.best),
      "early": lambda: (config.early_stopping.metric,
                        config.early_stopping.patience),
      "warm_start": lambda: (config.warm_start.checkpoint,
                             config.warm_start.modules),
      "keep": lambda: config.keep_until_evaluated,
      "profile": lambda: config.profile_steps,
      "parts": lambda: (tuple(config.optimizer_parts),
                        config.learning_rate_multipliers),
  }
  for name, value in expected.items():
    assert checks[name]() == value, name


def test_warm_start_file_requires_its_checkpoint():
  with pytest.raises(errors.ConfigError, match="INIT_CHECKPOINT"):
    gin_config.load_config([DIGITS, "gin/features/warm_start.gin"], [])


@pytest.mark.slow
def test_features_together_through_the_command_line(tmp_path):
  result = helpers.run_cli([
      f"--gin_file={DIGITS}", "--gin_file=gin/features/sgd_cosine_warmup.gin",
      "--gin_file=gin/features/ema.gin",
      "--gin_file=gin/features/gradient_accumulation.gin",
      "--gin_file=gin/features/best_checkpoint.gin",
      "--gin_file=gin/features/early_stopping.gin",
      "--gin_param=trainer.train_steps=600",
      "--gin_param=trainer.validation_interval=200",
      f"--model_dir={tmp_path}"])
  assert result.returncode == 0, result.stderr[-2000:]
  final = dict(item.split() for item in result.stdout.strip().splitlines()[
      -1].removeprefix("final eval | ").split(" | "))
  assert float(final["accuracy"]) >= 0.95
  with open(tmp_path / "best" / "best.json") as f:
    best = json.load(f)
  assert best["metric"] == "accuracy" and best["value"] >= 0.95
  assert os.path.isdir(tmp_path / "best" / "export" / str(best["step"]))
  assert os.listdir(tmp_path / "export") == ["600"]
  train = helpers.read_scalars(str(tmp_path / "train"))
  # Warm-up then cosine decay: the peak (0.4 x 64 / 256) at step 100.
  rates = dict(train["learning_rate"])
  assert rates[100] == pytest.approx(0.1)
  assert rates[600] == pytest.approx(0.0, abs=1e-7)
  assert all(norm > 0 for _, norm in train["gradient_norm"])


# A train.py process under RLIMIT_FSIZE (~7 s): a fault drill.
@pytest.mark.slow
def test_a_save_over_the_file_size_limit_is_not_reported_as_empty_input(
    tmp_path):
  import resource  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top

  def limit_file_size():  # Summaries fit; the checkpoint does not.
    resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))

  result = subprocess.run(
      [sys.executable, helpers.TRAIN_PY, f"--gin_file={DIGITS}",
       f"--model_dir={tmp_path / 'run'}", "--gin_param=trainer.train_steps=100"],
      cwd=helpers.REPO_ROOT, preexec_fn=limit_file_size, capture_output=True,
      text=True, timeout=300)
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == 1
  assert last.startswith("train.py: error: OutOfRangeError: ")
  assert last.endswith("File too large"), last
  assert "yields no batch" not in result.stderr


@pytest.mark.slow  # A train.py fault drill (~8 s).
def test_an_os_error_in_the_frameworks_own_writes_is_one_line(tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  (model_dir / "best").write_text("a file where best/ should be")
  result = helpers.run_cli(
      [f"--gin_file={DIGITS}", f"--model_dir={model_dir}",
       "--gin_param=trainer.train_steps=20",
       "--gin_param=best_checkpoint.metric='accuracy'",
       "--gin_param=best_checkpoint.higher_is_better=True"])
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 1
  assert lines[-1] == (f"train.py: error: NotADirectoryError: [Errno 20] Not "
                       f"a directory: '{model_dir}/best/best.json'")
  assert "Traceback" not in result.stderr


_URLS_THAT_CANNOT_WORK = [
    ("s3://bucket/run",
     "--model_dir (s3://bucket/run): TensorFlow 2.20 has no s3:// file "
     "system (tensorflow-io's plugins do not load on it): mount the bucket "
     "(s3fs, mountpoint-s3) and pass the local path, or use gs://."),
    ("gs:/bucket/run", "--model_dir (gs:/bucket/run) has one slash after "
     "`gs:`: write gs://bucket/run"),
    ("hdfs3://host/run",
     "--model_dir (hdfs3://host/run): TensorFlow has no file system for "
     "`hdfs3://`; the schemes that work are a local path, gs:// and ram://."),
]


@pytest.mark.parametrize("model_dir,line", _URLS_THAT_CANNOT_WORK)
def test_a_model_dir_url_that_cannot_work_is_named(tmp_path, monkeypatch,
                                                   model_dir, line):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(errors.ConfigError) as raised:
    cli._check_model_dir(model_dir)  # pylint: disable=protected-access
  assert str(raised.value) == line
  assert os.listdir(tmp_path) == []


# From the command line (a train.py process each, ~6 s): one in the default
# suite, the others with the slow tests.
@pytest.mark.parametrize("model_dir,line", [
    _URLS_THAT_CANNOT_WORK[0],
    *(pytest.param(*case, marks=pytest.mark.slow)
      for case in _URLS_THAT_CANNOT_WORK[1:])])
def test_a_model_dir_url_that_cannot_work_is_one_line_and_writes_nothing(
    tmp_path, model_dir, line):
  """Before this, each was a local folder (`./s3:/bucket/run/`) holding the
  operative config, then a failure at the first checkpoint."""
  result = helpers.run_cli(
      [f"--gin_file={os.path.join(helpers.REPO_ROOT, DIGITS)}",
       f"--model_dir={model_dir}"], cwd=str(tmp_path))
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == f"train.py: error: {line}"
  assert os.listdir(tmp_path) == []
