"""Resumes with the settings given (real train.py processes): what changed
since the checkpoint is said, takes effect or is refused.

Exact resume after SIGKILL: a run killed at a random moment and restarted
ends with the same weights and optimizer state, bit for bit, as a run that
was never interrupted (`runtime.deterministic=True`): digits on one device
and 2 replicas, a model split over 2 devices, a Task with several models
and optimizers, a model pipelined over 2 devices. Real processes. (The tf.data service's batches come in no
reproducible order: its campaign, in test_data_service.py, checks the
resume step instead.)"""

import dataclasses
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from trainer import errors
from trainer import resume
from trainer.report import config_changes

import helpers


# The paths the campaign covers beside digits: a model split over 2 devices
# and a Task with three models and optimizers (the conditional GAN).
GIN_FILES = {"one_device": "gin/digits.gin", "mirrored": "gin/digits.gin",
             "split_model": "gin/split_digits.gin",
             "several_models": "gin/digits_gan.gin",
             "pipeline": "gin/digits_pipeline.gin"}


def _args(strategy, train_steps, model_dir):
  args = [f"--gin_file={GIN_FILES[strategy]}",
          "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=20",
          f"--gin_param=trainer.train_steps={train_steps}",
          "--mode=train", f"--model_dir={model_dir}"]
  if strategy == "mirrored":
    args.append("--gin_file=gin/runtime/cpu_mirrored.gin")
  return args


@pytest.mark.parametrize("strategy,seed", [
    pytest.param("one_device", 1, marks=pytest.mark.slow),
    pytest.param("mirrored", 1, marks=pytest.mark.slow),
    pytest.param("one_device", 2, marks=pytest.mark.slow),
    pytest.param("mirrored", 2, marks=pytest.mark.slow),
    pytest.param("one_device", 3, marks=pytest.mark.slow),
    pytest.param("split_model", 1, marks=pytest.mark.slow),
    pytest.param("split_model", 2, marks=pytest.mark.slow),
    pytest.param("several_models", 1, marks=pytest.mark.slow),
    pytest.param("several_models", 2, marks=pytest.mark.slow),
    pytest.param("pipeline", 1, marks=pytest.mark.slow),
])
def test_sigkill_at_a_random_moment_then_restart_is_exact(
    tmp_path, strategy, seed):
  model_dir = tmp_path / "killed"
  saved = helpers.kill_after_first_save(
      helpers.TrainProcess(_args(strategy, 100000, model_dir)),
      str(model_dir), seed, spread=1.5)

  final = saved + 40
  resumed = helpers.TrainProcess(_args(strategy, final, model_dir))
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {model_dir}/ckpt-{saved} at step {saved}" in (
      resumed.output)
  straight = helpers.TrainProcess(_args(strategy, final, tmp_path / "straight"))
  assert straight.finish() == 0, straight.stderr[-2000:]

  ours = helpers.checkpoint_numbers(str(model_dir))
  reference = helpers.checkpoint_numbers(str(tmp_path / "straight"))
  assert sorted(ours) == sorted(reference)
  # Adam's two slots per weight (`<weight>/.OPTIMIZER_SLOT/optimizer/m` and
  # `v`, or `.../optimizer/<model>/m` for several) are compared too.
  weights = [n for n in ours
             if n.startswith("model/") and ".OPTIMIZER_SLOT/" not in n]
  slots = [n for n in ours if ".OPTIMIZER_SLOT/optimizer/" in n]
  assert weights and len(slots) == 2 * len(weights), sorted(ours)
  for name in reference:
    if name == "save_counter/.ATTRIBUTES/VARIABLE_VALUE":
      continue  # Counts saves, which differ by design.
    np.testing.assert_array_equal(ours[name], reference[name], err_msg=name)


_DIGITS = ["--gin_file=gin/digits.gin", "--mode=train",
           "--gin_param=trainer.steps_per_loop=10",
           "--gin_param=trainer.summary_interval=10",
           "--gin_param=trainer.checkpoint_interval=10"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A digits run of 20 steps at Adam's 0.001, batch 64: its model_dir."""
  model_dir = str(tmp_path_factory.mktemp("trained") / "run")
  finished = helpers.run_cli(_DIGITS + [
      f"--model_dir={model_dir}", "--gin_param=trainer.train_steps=20"])
  assert finished.returncode == 0, finished.stderr[-2000:]
  return model_dir


def _resume(trained, tmp_path, *params):
  """Copies `trained` and resumes it with `params`; returns the process and
  the copy."""
  model_dir = str(tmp_path / "run")
  shutil.copytree(trained, model_dir)
  return helpers.run_cli(_DIGITS + [f"--model_dir={model_dir}"] + [
      f"--gin_param={param}" for param in params]), model_dir


def _lines(finished, start):
  return [line for line in finished.stdout.splitlines()
          if line.startswith(start)]


def test_a_resume_takes_a_new_rate_and_batch_and_says_so(trained, tmp_path):
  before = helpers.checkpoint_weights(trained)
  finished, model_dir = _resume(
      trained, tmp_path, "trainer.train_steps=40",
      "optimizer.learning_rate=1e-12", "trainer.global_batch_size=128")
  assert finished.returncode == 0, finished.stderr[-2000:]
  assert _lines(finished, "resume |") == [
      "resume | changed since step 20: optimizer.learning_rate 0.001 -> "
      "1e-12, trainer.global_batch_size 64 -> 128, trainer.train_steps 20 "
      "-> 40"]
  assert _lines(finished, "input |") == [
      "input | resuming with global batch 128 (64 before): skips 10 "
      "batch(es) of 128, the 1280 examples trained on before"]
  # At the checkpoint's 0.001, 20 steps move a weight by about 0.05.
  assert helpers.max_weight_difference(
      before, helpers.checkpoint_weights(model_dir)) < 1e-9
  reader = tf.train.load_checkpoint(model_dir)
  assert reader.get_tensor("optimizer/learning_rate/.ATTRIBUTES/"
                           "VARIABLE_VALUE") == np.float32(1e-12)
  with open(os.path.join(model_dir, "operative_config.gin")) as f:
    written = f.read().splitlines()
  assert "optimizer.learning_rate = 1e-12" in written
  assert "trainer.global_batch_size = 128" in written

  # Resumed again as it was: nothing to say, the input position restored.
  again = helpers.run_cli(_DIGITS + [
      f"--model_dir={model_dir}", "--gin_param=trainer.train_steps=60",
      "--gin_param=optimizer.learning_rate=1e-12",
      "--gin_param=trainer.global_batch_size=128"])
  assert again.returncode == 0, again.stderr[-2000:]
  assert _lines(again, "resume |") == [
      "resume | changed since step 40: trainer.train_steps 40 -> 60"]
  assert _lines(again, "input |") == []
  assert helpers.checkpoint_step(model_dir) == 60


# Two train.py runs (~8 s): the resume with a new batch size above keeps
# the path in the default suite.
@pytest.mark.slow
def test_the_checkpoint_s_batch_size_decides_not_a_later_run_s_config(
    trained, tmp_path):
  # A run at batch 128 wrote its configuration after its first loop and was
  # killed before its first save: the checkpoint is still the batch-64 one.
  model_dir = str(tmp_path / "run")
  shutil.copytree(trained, model_dir)
  config = os.path.join(model_dir, "operative_config.gin")
  with open(config) as f:
    text = f.read()
  assert "trainer.global_batch_size = 64" in text
  with open(config, "w") as f:
    f.write(text.replace("trainer.global_batch_size = 64",
                         "trainer.global_batch_size = 128"))
  assert tf.train.load_checkpoint(model_dir).get_tensor(
      "global_batch_size/.ATTRIBUTES/VARIABLE_VALUE") == 64

  finished = helpers.run_cli(_DIGITS + [
      f"--model_dir={model_dir}", "--gin_param=trainer.train_steps=40",
      "--gin_param=trainer.global_batch_size=128"])
  assert finished.returncode == 0, finished.stderr[-2000:]
  assert _lines(finished, "resume |") == [
      "resume | changed since step 20: trainer.train_steps 20 -> 40"]
  assert _lines(finished, "input |") == [
      "input | resuming with global batch 128 (64 before): skips 10 "
      "batch(es) of 128, the 1280 examples trained on before"]
  assert tf.train.load_checkpoint(model_dir).get_tensor(
      "global_batch_size/.ATTRIBUTES/VARIABLE_VALUE") == 128


@pytest.mark.slow
@pytest.mark.parametrize("param, line", [
    ('optimizer.name="sgd"',
     "`optimizer.name` changed since step 20 ('adam' -> 'sgd'): an "
     "optimizer of another kind cannot continue from the checkpoint's (its "
     "slots differ); set it back to 'adam', or train in a new --model_dir "
     "starting from the weights: `warm_start.checkpoint = '{dir}/ckpt-20'`."),
    ("DigitsClassification.hidden_units=64",
     "checkpoint {dir}/ckpt-20 does not fit this model: variable "
     "hidden/bias has shape (64,) in this model but (128,) in the "
     "checkpoint; changed since step 20: DigitsClassification.hidden_units "
     "128 -> 64: a model of another shape cannot resume this run; set them "
     "back, or train in a new --model_dir starting from the weights that "
     "fit: `warm_start.checkpoint = '{dir}/ckpt-20'` (and "
     "`warm_start.modules`)."),
])
def test_a_change_that_cannot_take_effect_is_refused(trained, tmp_path,
                                                     param, line):
  snapshot = helpers.snapshot(trained)
  finished, model_dir = _resume(trained, tmp_path, "trainer.train_steps=40",
                                param)
  assert finished.returncode == 2, finished.stderr[-2000:]
  assert finished.stderr.strip().splitlines()[-1] == (
      "train.py: error: " + line.format(dir=model_dir))
  assert helpers.snapshot(model_dir) == snapshot  # Nothing written.


def _resumed_with(**changed):
  """A `Resume` at step 100 of ckpt-100 with `changed` as `(old, new)`."""
  return resume.Resume(100, "run/ckpt-100", tuple(
      config_changes.Change(name.replace("__", "."), *values)
      for name, values in sorted(changed.items())))


def test_the_batch_sizes_are_read_only_where_they_changed():
  assert _resumed_with(trainer__global_batch_size=("64", "128")
                       ).batch_sizes == (64, 128)
  assert _resumed_with(trainer__train_steps=("100", "200")
                       ).batch_sizes is None
  assert _resumed_with().line() is None
  # The checkpoint's own record decides over the configuration files.
  recorded = _resumed_with(trainer__global_batch_size=("64", "128"))
  assert dataclasses.replace(recorded, recorded_batch_size=128,
                             batch_size=128).batch_sizes is None
  assert dataclasses.replace(_resumed_with(), recorded_batch_size=64,
                             batch_size=128).batch_sizes == (64, 128)


def test_a_checkpoint_of_another_model_names_the_models_bindings():
  error = errors.CheckpointMismatch(
      "checkpoint run/ckpt-100 does not fit this model: variable x has "
      "shape (2,) in this model but (3,) in the checkpoint.")
  found = resume.mismatch(error, _resumed_with(
      trainer__train_steps=("100", "200"), Net__units=("3", "2")))
  assert str(found) == (
      "checkpoint run/ckpt-100 does not fit this model: variable x has "
      "shape (2,) in this model but (3,) in the checkpoint; changed since "
      "step 100: Net.units 3 -> 2: a model of another shape cannot resume "
      "this run; set them back, or train in a new --model_dir starting from "
      "the weights that fit: `warm_start.checkpoint = 'run/ckpt-100'` (and "
      "`warm_start.modules`).")
  assert isinstance(found, errors.ConfigError)
  assert resume.mismatch(error, None) is error  # Not a resume.
  # Nothing of the model changed in gin: the Task's code did.
  assert str(resume.mismatch(error, _resumed_with())).endswith(
      "in the checkpoint: a model of another shape cannot resume this run; "
      "train in a new --model_dir starting from the weights that fit: "
      "`warm_start.checkpoint = 'run/ckpt-100'` (and `warm_start.modules`).")


def test_an_input_mismatch_names_the_input_s_bindings_that_changed():
  error = errors.InputMismatch("checkpoint run/ckpt-100 holds the position "
                               "of another training input pipeline (...)",
                               "resume without that position (...)")
  found = resume.mismatch(error, _resumed_with(
      trainer__train_steps=("100", "200"), optimizer__learning_rate=(
          "0.1", "0.2"), trainer__mixture_exhausted=("'repeat'", "'end'"),
      Noisy__noise=("0.1", "0.2")))
  assert str(found) == (
      "checkpoint run/ckpt-100 holds the position of another training input "
      "pipeline (...); changed since step 100: Noisy.noise 0.1 -> 0.2, "
      "trainer.mixture_exhausted 'repeat' -> 'end': set them back, or resume "
      "without that position (...).")
  assert isinstance(found, errors.ConfigError)
  # Nothing of the input changed in gin, or nothing to compare with.
  assert resume.mismatch(error, _resumed_with(
      trainer__train_steps=("100", "200"))) is error
  assert resume.mismatch(error, None) is error
  assert str(error) == ("checkpoint run/ckpt-100 holds the position of "
                        "another training input pipeline (...): resume "
                        "without that position (...).")


_WARM_START = ("train in a new --model_dir starting from the weights: "
               "`warm_start.checkpoint = '{dir}/ckpt-{step}'`.")


@pytest.mark.parametrize("args, line", [
    # A one-dataset checkpoint resumed by the mixture Task.
    (["--gin_file=gin/digits_mixture.gin"],
     "checkpoint {dir}/ckpt-20 holds the position of another training input "
     "pipeline (TensorFlow cannot restore its iterator into this run's: it "
     "fails at Iterator::Root::Prefetch::BatchV2::ForeverRepeat); changed "
     "since step 20: DigitsMixture.noise (unused) -> 0.2, experiment.task "
     "@DigitsClassification() -> @DigitsMixture(), trainer.mixture None -> "
     "{{'clean': 0.7, 'perturbed': 0.3}}: set them back, or resume without "
     "that position, with `trainer.input_position = \"skip\"` (this input "
     "read anew, past the batches trained on; keep it for later resumes of "
     "this run) or `\"restart\"` (this input from its first batch)."),
    # A train.py process each (~5 s): these two with the slow tests.
    pytest.param(
        ["--gin_file=gin/features/ema.gin"],
        "`ema.decay` changed since step 20 (None -> 0.99): checkpoint "
        "{dir}/ckpt-20 was saved without EMA, which wraps the optimizer, and "
        "EMA cannot be turned on or off on a resume; set it back to None, or "
        + _WARM_START, marks=pytest.mark.slow),
    pytest.param(
        ["--gin_param=runtime.mixed_precision_dtype='float16'"],
        "`runtime.mixed_precision_dtype` changed since step 20 ('float32' -> "
        "'float16'): checkpoint {dir}/ckpt-20 holds no dynamic loss scale, "
        "which float16 keeps in the optimizer's state; set it back to "
        "'float32', or keep float16 with a fixed scale, which has no state "
        "(`runtime.loss_scale = 1024`), or " + _WARM_START,
        marks=pytest.mark.slow),
])
def test_a_change_of_input_ema_or_float16_is_named(trained, tmp_path, args,
                                                   line):
  snapshot = helpers.snapshot(trained)
  model_dir = str(tmp_path / "run")
  shutil.copytree(trained, model_dir)
  finished = helpers.run_cli(_DIGITS + args + [
      f"--model_dir={model_dir}", "--gin_param=trainer.train_steps=30"])
  assert finished.returncode == 2, finished.stderr[-2000:]
  assert finished.stderr.strip().splitlines()[-1] == (
      "train.py: error: " + line.format(dir=model_dir, step=20))
  assert "checkpoint | cannot restore" not in finished.stdout
  assert helpers.snapshot(model_dir) == snapshot  # Nothing written.


# A train.py process (~5 s); its kind of refusal is tested above.
@pytest.mark.slow
def test_an_evaluation_with_ema_of_a_checkpoint_without_is_refused(trained):
  # It evaluated averages left at the initial weights: accuracy 0.0977.
  finished = helpers.run_cli([
      "--gin_file=gin/digits.gin", "--gin_file=gin/features/ema.gin",
      "--mode=eval", "--gin_param=trainer.validation_steps=1",
      f"--model_dir={trained}"])
  assert finished.returncode == 2, finished.stderr[-2000:]
  assert finished.stderr.strip().splitlines()[-1] == (
      f"train.py: error: checkpoint {trained}/ckpt-20 holds no weight "
      "averages (saved without EMA), which this evaluation, with "
      "`ema.decay` set, evaluates: they would be the weights the model was "
      "built with; evaluate it without `ema.decay`.")
  assert "eval |" not in finished.stdout


@pytest.fixture(scope="module")
def mixed_with_ema(tmp_path_factory):
  """A 10-step run of the digits mixture with EMA: its model_dir."""
  model_dir = str(tmp_path_factory.mktemp("mixed") / "run")
  finished = helpers.run_cli(_DIGITS + _MIXED_WITH_EMA + [
      f"--model_dir={model_dir}", "--gin_param=trainer.train_steps=10"])
  assert finished.returncode == 0, finished.stderr[-2000:]
  return model_dir


_MIXED_WITH_EMA = ["--gin_file=gin/digits_mixture.gin",
                   "--gin_file=gin/features/ema.gin"]


@pytest.mark.slow
def test_a_changed_mixture_or_ema_turned_off_is_named_and_keeps_the_run(
    mixed_with_ema, tmp_path):
  snapshot = helpers.snapshot(mixed_with_ema)
  model_dir = str(tmp_path / "run")
  shutil.copytree(mixed_with_ema, model_dir)

  def resumed(*args, train_steps=20):
    return helpers.run_cli(_DIGITS + list(args) + [
        f"--model_dir={model_dir}",
        f"--gin_param=trainer.train_steps={train_steps}"])

  exhausted = resumed(*_MIXED_WITH_EMA,
                      "--gin_param=trainer.mixture_exhausted='end'")
  assert exhausted.returncode == 2, exhausted.stderr[-2000:]
  assert exhausted.stderr.strip().splitlines()[-1] == (
      f"train.py: error: checkpoint {model_dir}/ckpt-10 holds the position "
      "of another training input pipeline (TensorFlow cannot restore its "
      "iterator into this run's: it fails at Iterator::Root::Prefetch::"
      "BatchV2::ForeverRepeat[0]::Zip[0]::DirectedInterleave[0]::Shuffle); "
      "changed since step 10: trainer.mixture_exhausted 'repeat' -> 'end': "
      "set them back, or resume without that position, with "
      "`trainer.input_position = \"skip\"` (this input read anew, past the "
      "batches trained on; keep it for later resumes of this run) or "
      "`\"restart\"` (this input from its first batch).")
  assert "checkpoint | cannot restore" not in exhausted.stdout

  without_ema = resumed("--gin_file=gin/digits_mixture.gin")
  assert without_ema.returncode == 2, without_ema.stderr[-2000:]
  assert without_ema.stderr.strip().splitlines()[-1] == (
      "train.py: error: `ema.decay` changed since step 10 (0.99 -> None): "
      f"checkpoint {model_dir}/ckpt-10 was saved with EMA, which wraps the "
      "optimizer, and EMA cannot be turned on or off on a resume; set it "
      "back to 0.99, or " + _WARM_START.format(dir=model_dir, step=10))
  assert helpers.snapshot(model_dir) == snapshot  # Nothing written.

  # It restores with its own settings (at its last step: nothing to train).
  again = resumed(*_MIXED_WITH_EMA, train_steps=10)
  assert again.returncode == 0, again.stderr[-2000:]
  assert f"restored checkpoint {model_dir}/ckpt-10 at step 10" in (
      again.stdout.splitlines())
