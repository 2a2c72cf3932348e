"""Pipeline parallelism (`pipeline.*`): a deep MLP cut into stages on the
logical CPUs, trained to the unpipelined weights, its placement read back
from the variables and the executed ops, and the bad settings refused in one
line."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import helpers
import trainer
from tasks import digits_pipeline
from tasks import split_digits
from trainer import errors
from trainer import experiment
from trainer import gin_config
from trainer.distribute import pipeline
from trainer.distribute import placement
from trainer.model import ema
from trainer.model import optimization

CPU0 = "/job:localhost/replica:0/task:0/device:CPU:0"
CPU1 = "/job:localhost/replica:0/task:0/device:CPU:1"


def _train(model_dir, steps=20, dump_dir=None, task=None, runtime=None,
           accumulation_steps=1, steps_per_loop=None, mode="train",
           extra=None, **pipeline_args):
  """Trains the MLP with SGD for `steps` steps in one loop (or loops of
  `steps_per_loop`); `extra` adds `TrainerConfig` fields."""
  steps_per_loop = steps_per_loop or steps
  fields = dict(
      train_steps=steps, steps_per_loop=steps_per_loop,
      checkpoint_interval=steps_per_loop, summary_interval=steps_per_loop,
      global_batch_size=32, gradient_accumulation_steps=accumulation_steps,
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      pipeline=pipeline.PipelineConfig(**pipeline_args))
  config = trainer.TrainerConfig(**dict(fields, **(extra or {})))
  if dump_dir:
    tf.debugging.experimental.enable_dump_debug_info(
        str(dump_dir), tensor_debug_mode="NO_TENSOR",
        circular_buffer_size=-1)
  try:
    experiment.run(task or digits_pipeline.DigitsPipelineMLP(hidden_units=32),
                   mode, str(model_dir),
                   runtime or trainer.RuntimeConfig(seed=3), config)
  finally:
    if dump_dir:
      tf.debugging.experimental.disable_dump_debug_info()
  return helpers.checkpoint_weights(str(model_dir))


def relative_difference(a, b) -> float:
  """The largest relative difference of two checkpoints' tensors."""
  assert sorted(a) == sorted(b)
  return max(float(np.linalg.norm(a[k] - b[k]) /
                   max(np.linalg.norm(b[k]), 1e-12)) for k in a)


def test_the_pipelined_step_equals_the_unpipelined_one(tmp_path, capsys):
  whole = _train(tmp_path / "whole")
  assert len(whole) == 10
  for num_microbatches in (1, 2, 4):
    piped = _train(tmp_path / f"m{num_microbatches}",
                   boundaries=["hidden2"], num_microbatches=num_microbatches)
    assert relative_difference(piped, whole) <= 1e-6, num_microbatches
  out = capsys.readouterr().out
  assert ("pipeline | 2 stages: flatten..hidden2 on /device:CPU:0 | "
          "hidden3..logits on /device:CPU:1; 4 micro-batch(es)") in out, out
  assert ("placement | /device:CPU:0: 4 variable(s), 3,136 parameters "
          "(hidden1/kernel, hidden1/bias, hidden2/kernel, hidden2/bias)"
          in out), out
  assert ("placement | /device:CPU:1: 6 variable(s), 2,442 parameters "
          "(hidden3/kernel, hidden3/bias, hidden4/kernel, hidden4/bias, ...)"
          in out), out


def test_a_staged_model_is_pipelined_in_its_own_stages(tmp_path, capsys):
  task = split_digits.SplitDigitsMLP(hidden_units=32)
  whole = _train(tmp_path / "whole", task=task)
  piped = _train(tmp_path / "piped", task=task, task_stages=True,
                 num_microbatches=4)
  assert len(whole) == 8
  assert relative_difference(piped, whole) <= 1e-6
  out = capsys.readouterr().out
  assert ("pipeline | 2 stages: flatten..hidden2 on /device:CPU:0 | "
          "hidden3..logits on /device:CPU:1; 4 micro-batch(es)") in out, out
  assert ("placement | /device:CPU:1: 4 variable(s), 698 parameters "
          "(hidden3/kernel, hidden3/bias, logits/kernel, logits/bias)"
          in out), out


def test_recomputed_stages_train_to_the_same_weights(tmp_path, capsys):
  whole = _train(tmp_path / "whole")
  piped = _train(tmp_path / "piped", boundaries=["hidden2"],
                 num_microbatches=2, recompute=True)
  assert relative_difference(piped, whole) <= 1e-6
  assert "2 micro-batch(es), recomputed" in capsys.readouterr().out


def test_batch_norm_normalises_each_micro_batch(tmp_path):
  # As GPipe does: the pipelined step equals the unpipelined one that cuts
  # the batch into as many micro-batches (`trainer.gradient_accumulation_
  # steps`), statistics and moving averages included, and differs from
  # normalising the whole batch at once.
  task = digits_pipeline.DigitsPipelineMLP(hidden_units=32, batch_norm=True)
  accumulated = _train(tmp_path / "accumulated", task=task,
                       accumulation_steps=2)
  whole = _train(tmp_path / "whole", task=task)
  piped = _train(tmp_path / "piped", task=task, boundaries=["batch_norm2"],
                 num_microbatches=2)
  assert len(piped) == 26  # 5 dense, 4 batch norms with moving averages.
  assert relative_difference(piped, accumulated) <= 1e-6
  assert relative_difference(piped, whole) > 1e-3


@pytest.mark.slow  # Three pipelined train.py runs: 9 s.
def test_a_resumed_pipelined_run_is_bit_identical(tmp_path):
  # With clipping and EMA (its averages evaluated and saved): 10 steps, a
  # new run resuming to 20, against 20 steps in one run.
  extra = dict(gradient_clip_norm=0.5, ema=ema.EmaConfig(decay=0.9))
  common = dict(steps_per_loop=5, mode="train_and_eval", extra=extra,
                boundaries=["hidden2"], num_microbatches=4,
                runtime=trainer.RuntimeConfig(seed=3, deterministic=True))
  _train(tmp_path / "resumed", steps=10, **common)
  _train(tmp_path / "resumed", steps=20, **common)
  _train(tmp_path / "straight", steps=20, **common)
  resumed = helpers.checkpoint_numbers(
      tf.train.latest_checkpoint(str(tmp_path / "resumed")))
  straight = helpers.checkpoint_numbers(
      tf.train.latest_checkpoint(str(tmp_path / "straight")))
  assert sorted(resumed) == sorted(straight)
  assert len([k for k in resumed if "average" in k]) == 10, sorted(resumed)
  for key, value in resumed.items():
    assert np.array_equal(value, straight[key]), key


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_mixed_precision_trains_pipelined(tmp_path, precision, capsys):
  weights = _train(tmp_path / "run", steps=5, boundaries=["hidden2"],
                   num_microbatches=2, runtime=trainer.RuntimeConfig(
                       seed=3, mixed_precision_dtype=precision))
  assert len(weights) == 10
  # Variables stay float32; the computation ran in `precision`.
  assert all(w.dtype == np.float32 and np.isfinite(w).all()
             for w in weights.values())
  assert "pipeline | 2 stages" in capsys.readouterr().out
  # float16 scales the loss, and the scale is summarised; bfloat16 does not.
  tags = helpers.read_tags(str(tmp_path / "run" / "train"))
  assert ("loss_scale" in tags) == (precision == "float16"), tags


def test_the_nonfinite_guard_stops_a_pipelined_run(tmp_path):
  with pytest.raises(errors.NonFiniteError) as raised:
    _train(tmp_path / "run", steps=20, steps_per_loop=5,
           boundaries=["hidden2"], num_microbatches=2,
           extra=dict(optimizer=optimization.OptimizerConfig(
               name="sgd", learning_rate=1e30)))
  assert str(raised.value) == (
      "the training loss is not finite at step 2; no checkpoint was saved "
      "before it.")
  assert raised.value.step == 2


def test_each_stage_runs_its_forward_and_backward_pass_on_its_device(
    tmp_path):
  steps, num_microbatches = 2, 4
  _train(tmp_path / "run", steps=steps, dump_dir=tmp_path / "dump",
         boundaries=["hidden2"], num_microbatches=num_microbatches)
  ops = helpers.executed_ops(tmp_path / "dump")
  runs = steps * num_microbatches
  # Per micro-batch: stage 0's 2 forward and 4 backward MatMuls (for hidden1
  # the gradient of the input too, which `tf.gradients` computes and
  # nothing uses), stage 1's 3 and 6; their activations likewise.
  assert ops[("MatMul", CPU0)] == 6 * runs, ops
  assert ops[("MatMul", CPU1)] == 9 * runs, ops
  assert ops[("Relu", CPU0)] == ops[("ReluGrad", CPU0)] == 2 * runs, ops
  assert ops[("Relu", CPU1)] == ops[("ReluGrad", CPU1)] == 2 * runs, ops
  assert ops[("BiasAddGrad", CPU0)] == 2 * runs, ops
  assert ops[("BiasAddGrad", CPU1)] == 3 * runs, ops


_THREE_STAGES = """
import os, sys, json
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.join(sys.argv[1], "tests"))
import trainer
from trainer.distribute import devices
devices.split_cpu(3, "test")
from distribute import test_pipeline
whole = test_pipeline._train(sys.argv[2] + "/whole")
found = {}
for m in (1, 2, 4):
  piped = test_pipeline._train(sys.argv[2] + f"/m{m}",
                               boundaries=["hidden1", "hidden3"],
                               num_microbatches=m)
  found[m] = test_pipeline.relative_difference(piped, whole)
print("RESULT", json.dumps(found))
"""


@pytest.mark.slow  # Two stages are in the default suite.
def test_three_stages_train_to_the_unpipelined_weights(tmp_path):
  # Three stages need three devices: a process of its own, split in three.
  run = subprocess.run(
      [sys.executable, "-c", _THREE_STAGES, helpers.REPO_ROOT,
       str(tmp_path)], capture_output=True, text=True, timeout=300,
      env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))
  assert run.returncode == 0, run.stderr[-3000:]
  assert ("pipeline | 3 stages: flatten..hidden1 on /device:CPU:0 | "
          "hidden2..hidden3 on /device:CPU:1 | hidden4..logits on "
          "/device:CPU:2; 4 micro-batch(es)") in run.stdout
  found = eval(run.stdout.split("RESULT ")[1])  # pylint: disable=eval-used
  assert sorted(found) == ["1", "2", "4"]
  assert max(found.values()) <= 1e-6, found


@pytest.mark.parametrize("settings, line", [
    (dict(boundaries=["hidden2"], num_microbatches=3),
     "`pipeline.num_microbatches` (3) does not divide the 32 example(s) of "
     "each step (`trainer.global_batch_size` per replica and accumulation "
     "step) into equal micro-batches."),
    (dict(boundaries=["hiden2"]),
     "`pipeline.boundaries` names 'hiden2', which is not a layer of "
     "digits_pipeline_mlp (its layers: flatten, hidden1, hidden2, hidden3, "
     "hidden4, logits)."),
    (dict(boundaries=["hidden1", "hidden2", "hidden3"]),
     "the pipeline has 4 stages, more than the 2 CPU device(s) TensorFlow "
     "had already made: cut the model into fewer stages, or start a new "
     "process."),
    (dict(boundaries=["hidden2"], devices=["/device:CPU:0"]),
     "the pipeline has 2 stages, more than its 1 `pipeline.devices`: give "
     "each stage a device, or cut the model into fewer stages."),
    (dict(boundaries=["hidden2"], devices=["/device:CPU:0", "/device:GPU:0"]),
     "`pipeline.devices` names /device:GPU:0, which this host does not have "
     "(it has /device:CPU:0, /device:CPU:1)."),
    (dict(boundaries=["flatten"]),
     "pipeline stage 0 (flatten) has no trainable variables: move a "
     "boundary so that every stage holds weights."),
    (dict(boundaries=["logits"]),
     "`pipeline.boundaries` ends a stage at 'logits', the last layer of "
     "digits_pipeline_mlp: the stage after it would be empty."),
    (dict(task_stages=True),
     "`pipeline.task_stages` pipelines the stages of a "
     "`placement.StagedModel`; the Task's `build_model` returned a "
     "Sequential: cut it with `pipeline.boundaries`."),
])
def test_bad_settings_are_one_line(tmp_path, settings, line):
  with pytest.raises(errors.ConfigError) as raised:
    _train(tmp_path / "run", steps=1, **settings)
  assert str(raised.value) == line


def test_boundaries_out_of_order_are_one_line():
  model = digits_pipeline.DigitsPipelineMLP().build_model()
  with pytest.raises(errors.ConfigError) as raised:
    pipeline.build(model, pipeline.PipelineConfig(
        boundaries=["hidden3", "hidden1"]), lambda unused_model: None)
  assert str(raised.value) == (
      "`pipeline.boundaries` (hidden3, hidden1) must follow the model's "
      "layer order (flatten, hidden1, hidden2, hidden3, hidden4, logits).")


def test_a_pipeline_under_a_data_parallel_strategy_is_one_line(tmp_path):
  with pytest.raises(errors.ConfigError) as raised:
    _train(tmp_path / "run", steps=1, boundaries=["hidden2"],
           runtime=trainer.RuntimeConfig(distribution_strategy="mirrored",
                                         num_cpu_devices=2))
  assert str(raised.value) == (
      "a pipeline (`pipeline.boundaries`/`task_stages`) needs `runtime."
      "distribution_strategy='default'`, not 'mirrored': it places each "
      "stage on its own device, which a strategy's replicas would not keep.")
  assert not os.path.exists(tmp_path / "run")


def test_a_strategy_keeps_no_stage_weight_on_its_stage_device():
  # Why a pipeline refuses data parallelism: a strategy makes each weight's
  # copies on its replicas' devices, whatever device the stage names.
  strategy = tf.distribute.MirroredStrategy(["/device:CPU:0"])
  with strategy.scope(), tf.device("/device:CPU:1"):
    layer = tf_keras.layers.Dense(3)
    layer.build([None, 2])
  assert [placement.short_device(v.device)
          for v in layer.kernel.values] == ["/device:CPU:0"]


def test_settings_are_checked_on_construction():
  with pytest.raises(errors.ConfigError) as raised:
    pipeline.PipelineConfig(boundaries=["a"], num_microbatches=0)
  # gin adds a line naming the configurable.
  assert str(raised.value).splitlines()[0] == (
      "`pipeline.num_microbatches` (0) must be a positive integer.")
  with pytest.raises(errors.ConfigError) as raised:
    pipeline.PipelineConfig(num_microbatches=4)
  assert str(raised.value).splitlines()[0] == (
      "`pipeline.num_microbatches` needs `pipeline.boundaries` or "
      "`pipeline.task_stages`: there is no pipeline without stages.")
  assert pipeline.PipelineConfig(boundaries=["a", "b"]).boundaries == (
      "a", "b")
  assert not pipeline.PipelineConfig().enabled


def test_the_gpu_file_stacks_on_the_pipelined_task_file():
  _, runtime, config = gin_config.load_config(
      ["gin/digits_pipeline.gin", "gin/runtime/gpu_pipeline.gin"], [])
  assert runtime.distribution_strategy == "default"
  assert config.pipeline.boundaries == ("hidden2",)
  assert config.pipeline.num_microbatches == 4
  assert config.pipeline.devices == ("/device:GPU:0", "/device:GPU:1")


def _cli_args(train_steps, model_dir):
  return ["--gin_file=gin/digits_pipeline.gin",
          "--gin_param=runtime.deterministic=True",
          "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=20",
          f"--gin_param=trainer.train_steps={train_steps}",
          "--mode=train", f"--model_dir={model_dir}"]


@pytest.mark.slow
def test_sigterm_saves_a_pipelined_run_that_resumes_exactly(tmp_path):
  model_dir = tmp_path / "stopped"
  stopped = helpers.TrainProcess(_cli_args(100000, model_dir))
  try:
    stopped.wait_for(r"saved checkpoint .*ckpt-20$", timeout=120)
    stopped.process.send_signal(signal.SIGTERM)
    assert stopped.finish() == 42, stopped.stderr[-2000:]
  finally:
    stopped.close()
  saved = helpers.checkpoint_step(str(model_dir))
  assert saved >= 20 and saved % 10 == 0

  final = saved + 30
  resumed = helpers.TrainProcess(_cli_args(final, model_dir))
  assert resumed.finish() == 0, resumed.stderr[-2000:]
  assert f"restored checkpoint {model_dir}/ckpt-{saved} at step {saved}" in (
      resumed.output)
  straight = helpers.TrainProcess(_cli_args(final, tmp_path / "straight"))
  assert straight.finish() == 0, straight.stderr[-2000:]
  ours = helpers.checkpoint_numbers(str(model_dir))
  reference = helpers.checkpoint_numbers(str(tmp_path / "straight"))
  assert sorted(ours) == sorted(reference)
  for name in reference:
    if name != "save_counter/.ATTRIBUTES/VARIABLE_VALUE":
      np.testing.assert_array_equal(ours[name], reference[name],
                                    err_msg=name)
