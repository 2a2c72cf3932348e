"""Model parallelism by hand (`trainer.placement`): the shipped two-device
MLP on the 2 logical CPUs of the test session, its placement read back from
the variables and from the ops TensorFlow executed."""

import inspect

import pytest
import tensorflow as tf
import tf_keras

import helpers
import trainer
from tasks import split_digits
from trainer import errors
from trainer import experiment
from trainer import user_errors
from trainer.distribute import placement

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def test_parts_are_spread_over_the_devices_in_order():
  split = placement.configure(2)
  assert split == ["/device:CPU:0", "/device:CPU:1"]
  with placement.building(split):
    assert placement.devices(4) == ["/device:CPU:0", "/device:CPU:0",
                                    "/device:CPU:1", "/device:CPU:1"]
    assert placement.devices(3) == ["/device:CPU:0", "/device:CPU:0",
                                    "/device:CPU:1"]
  assert placement.devices(2) == [None, None]  # The build is over.
  assert placement.configure(0) == []
  with placement.building(placement.configure(0)):
    assert placement.devices(2) == [None, None]
  with pytest.raises(errors.ConfigError) as raised:
    line = inspect.currentframe().f_lineno + 1
    placement.devices(0)
  assert str(raised.value) == (
      "in test_parts_are_spread_over_the_devices_in_order "
      f"({user_errors.display_path(__file__)}:{line}): `num_parts` (0) must "
      "be positive.")


def test_a_staged_model_needs_a_layer_in_every_stage():
  for stages in ([], [[tf_keras.layers.Dense(1)], []]):
    with pytest.raises(errors.ConfigError) as raised:
      line = inspect.currentframe().f_lineno + 1
      placement.StagedModel(stages)
    assert str(raised.value) == (
        "in test_a_staged_model_needs_a_layer_in_every_stage "
        f"({user_errors.display_path(__file__)}:{line}): `stages` must be "
        "non-empty lists of layers.")


def test_a_split_the_session_cannot_make_is_one_line():
  # The conftest split the CPU into 2 devices; listing them starts
  # TensorFlow's devices, after which no other split can be made.
  assert len(tf.config.list_logical_devices("CPU")) == 2
  with pytest.raises(trainer.ConfigError,
                     match=r"^`runtime.model_parallel_devices` \(3\) cannot "
                     r"split the CPU: TensorFlow already initialised 2 CPU "
                     r"device\(s\)"):
    placement.configure(3)


def _train(model_dir, model_parallel_devices, dump_dir=None):
  runtime = trainer.RuntimeConfig(
      model_parallel_devices=model_parallel_devices, seed=3)
  config = trainer.TrainerConfig(
      train_steps=6, steps_per_loop=2, checkpoint_interval=6,
      summary_interval=6, global_batch_size=32)
  if dump_dir:
    tf.debugging.experimental.enable_dump_debug_info(
        str(dump_dir), tensor_debug_mode="NO_TENSOR",
        circular_buffer_size=-1)
  try:
    experiment.run(split_digits.SplitDigitsMLP(hidden_units=64), "train",
                   str(model_dir), runtime, config)
  finally:
    if dump_dir:
      tf.debugging.experimental.disable_dump_debug_info()


def test_the_split_model_runs_each_half_on_its_device_to_the_same_weights(
    tmp_path, capsys):
  _train(tmp_path / "split", 2, dump_dir=tmp_path / "dump")
  out = capsys.readouterr().out
  # Read back from the variables at start-up.
  assert ("placement | /device:CPU:0: 4 variable(s), 8,320 parameters "
          "(hidden1/kernel, hidden1/bias, hidden2/kernel, hidden2/bias)"
          in out), out
  assert ("placement | /device:CPU:1: 4 variable(s), 2,410 parameters "
          "(hidden3/kernel, hidden3/bias, logits/kernel, logits/bias)" in out)
  # Read back from the executed ops: per step, each half's 2 forward and 4
  # backward MatMuls (2 per layer; for hidden1 the gradient of the input
  # too, which `tf.gradients` computes and nothing uses) run on its device,
  # and so do its activations and their gradients.
  ops = helpers.executed_ops(tmp_path / "dump")
  steps = 6
  assert ops[("MatMul", CPU0)] == 6 * steps, ops
  assert ops[("MatMul", CPU1)] == 6 * steps, ops
  assert ops[("Relu", CPU0)] == ops[("ReluGrad", CPU0)] == 2 * steps, ops
  assert ops[("Relu", CPU1)] == ops[("ReluGrad", CPU1)] == steps, ops
  assert ops[("BiasAddGrad", CPU0)] == ops[("BiasAddGrad", CPU1)] == (
      2 * steps), ops

  _train(tmp_path / "whole", 0)
  split = helpers.checkpoint_weights(str(tmp_path / "split"))
  whole = helpers.checkpoint_weights(str(tmp_path / "whole"))
  assert sorted(split) == sorted(whole) and len(split) == 8
  assert helpers.max_weight_difference(split, whole) <= 1e-5
  assert helpers.checkpoint_step(str(tmp_path / "split")) == 6


@pytest.mark.slow
def test_the_documented_command_trains_resumes_unsplit_and_back_and_exports(
    tmp_path):
  # As a user: from another directory, a relative model_dir.
  common = ["--gin_file=gin/split_digits.gin", "--model_dir=runs/split"]
  first = helpers.run_cli(
      common + ["--gin_param=trainer.train_steps=600",
       "--gin_param=trainer.validation_interval=600"], cwd=str(tmp_path))
  assert first.returncode == 0, first.stderr[-3000:]
  assert "placement | /device:CPU:1: 4 variable(s), 34,186 parameters" in (
      first.stdout)
  assert helpers.checkpoint_step(str(tmp_path / "runs" / "split")) == 600

  # The split checkpoint resumes on one device, and exports.
  second = helpers.run_cli(
      common + ["--gin_param=runtime.model_parallel_devices=0",
                "--gin_param=trainer.train_steps=1000",
                "--gin_param=export.at_end=True"], cwd=str(tmp_path))
  assert second.returncode == 0, second.stderr[-3000:]
  assert "restored checkpoint runs/split/ckpt-600 at step 600" in (
      second.stdout)
  assert "placement |" not in second.stdout
  accuracy = helpers.final_accuracy(second.stdout)
  assert accuracy >= 0.95, second.stdout[-2000:]

  # And back: the unsplit checkpoint resumes split.
  third = helpers.run_cli(
      common + ["--gin_param=trainer.train_steps=1100",
                "--gin_param=trainer.validation_interval=1100"],
      cwd=str(tmp_path))
  assert third.returncode == 0, third.stderr[-3000:]
  assert "restored checkpoint runs/split/ckpt-1000 at step 1000" in (
      third.stdout)
  assert "placement | /device:CPU:1: 4 variable(s), 34,186 parameters" in (
      third.stdout)
  assert helpers.checkpoint_step(str(tmp_path / "runs" / "split")) == 1100

  # A SavedModel exported from the unsplit model serves on a plain host.
  export = tmp_path / "runs" / "split" / "export" / "1000"
  served = helpers.serve_digits_export(export)
  assert served.returncode == 0, served.stderr[-3000:]
  assert "devices 1" in served.stdout
  # The final eval line has 4 decimals.
  assert round(float(served.stdout.split("accuracy ")[1]), 4) == accuracy


@pytest.mark.slow
def test_a_split_export_serves_where_the_second_device_is_missing(tmp_path):
  run = helpers.run_cli(
      ["--gin_file=gin/split_digits.gin", f"--model_dir={tmp_path / 'run'}",
       "--gin_param=trainer.train_steps=200",
       "--gin_param=trainer.validation_interval=200",
       "--gin_param=trainer.checkpoint_interval=200",
       "--gin_param=export.at_end=True"])
  assert run.returncode == 0, run.stderr[-3000:]
  accuracy = helpers.final_accuracy(run.stdout)
  served = helpers.serve_digits_export(tmp_path / "run" / "export" / "200")
  assert served.returncode == 0, served.stderr[-3000:]
  # Its ops asked for CPU:1, which this process lacks: TensorFlow's soft
  # placement runs them on CPU:0.
  assert "devices 1" in served.stdout
  # The final eval line has 4 decimals.
  assert round(float(served.stdout.split("accuracy ")[1]), 4) == accuracy
  assert accuracy > 0.5
