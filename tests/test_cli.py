"""The command line: gin files, bindings, overrides and one-line errors."""

import textwrap

import pytest

from trainer import cli
from trainer import errors

import helpers

DIGITS = "gin/digits.gin"


@pytest.mark.parametrize("files,params,message", [
    ([DIGITS], ["trainr.train_steps=5"],
     "--gin_param: No configurable matching 'trainr' "
     "(did you mean 'trainer'?)"),
    ([DIGITS], ["trainer.train_step=5"],
     "--gin_param: Configurable 'trainer' doesn't have a parameter named "
     "'train_step' (did you mean 'train_steps'?)"),
    ([DIGITS], ["DigitsClasification.learning_rate=0.1"],
     "--gin_param: No configurable matching 'DigitsClasification' "
     "(did you mean 'DigitsClassification'?)"),
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
    (["missing.gin"], [], "--gin_file: no such file: missing.gin"),
    ([], [], "no --gin_file given; try --gin_file=gin/digits.gin"),
])
def test_bad_configuration_is_one_clear_line(files, params, message):
  with pytest.raises(errors.ConfigError) as raised:
    cli.load_config(files, params)
  assert str(raised.value) == message


def test_gin_file_errors_name_file_and_line(tmp_path):
  bad_syntax = tmp_path / "bad.gin"
  bad_syntax.write_text("import tasks.digits\ntrainer.train_steps = = 3\n")
  with pytest.raises(errors.ConfigError,
                     match=f"^{bad_syntax}:2: gin syntax error: Unable to "
                     "parse value$"):
    cli.load_config([str(bad_syntax)], [])

  bad_import = tmp_path / "import.gin"
  bad_import.write_text("import no_such_module_xyz\n")
  with pytest.raises(errors.ConfigError,
                     match=f"^{bad_import}:1: cannot import: No module named "
                     "'no_such_module_xyz'$"):
    cli.load_config([str(bad_import)], [])

  no_task = tmp_path / "no_task.gin"
  no_task.write_text("trainer.train_steps = 3\n")
  with pytest.raises(errors.ConfigError, match="^no task configured"):
    cli.load_config([str(no_task)], [])


def test_overrides_and_stacked_files_apply_in_order(tmp_path):
  task, runtime, config = cli.load_config(
      [DIGITS, "gin/runtime/cpu_mirrored.gin"],
      ["trainer.train_steps=2000", 'runtime.num_cpu_devices=2',
       "DigitsClassification.learning_rate=3e-4"])
  assert config.train_steps == 2000
  assert config.steps_per_loop == 100  # From digits.gin.
  assert runtime.distribution_strategy == "mirrored"
  assert runtime.num_cpu_devices == 2
  assert task.learning_rate == 3e-4


def test_model_dir_checks(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("x")
  with pytest.raises(errors.ConfigError, match="is a file, not a directory"):
    cli._check_model_dir(str(a_file))
  assert cli._check_model_dir(str(tmp_path / "new" / "dir"))


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
    ("gin/runtime/tpu_bf16.gin", [],
     dict(distribution_strategy="tpu", mixed_precision_dtype="bfloat16")),
])
def test_runtime_files_stack_on_a_task_file(runtime_file, params, expected):
  _, runtime, config = cli.load_config([DIGITS, runtime_file], params)
  for name, value in expected.items():
    assert getattr(runtime, name) == value
  if runtime_file.endswith("tpu_bf16.gin"):
    assert config.global_batch_size == 4096
