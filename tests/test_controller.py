"""The controller's own behaviour: progress lines, summary and checkpoint
cadence, restore."""

import os
import re

import pytest
import tensorflow as tf

import trainer
from trainer import experiment

import helpers


def _run(model_dir, **overrides):
  settings = dict(train_steps=20, steps_per_loop=5, summary_interval=10,
                  global_batch_size=16, checkpoint_interval=10, max_to_keep=10)
  settings.update(overrides)
  return experiment.run(helpers.LinearRegression(), "train", model_dir,
                        trainer.RuntimeConfig(seed=0),
                        trainer.TrainerConfig(**settings))


def test_one_progress_line_per_loop(tmp_path, capsys):
  _run(str(tmp_path))
  lines = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("train | step ")]
  assert [int(re.match(r"train \| step\s+(\d+)/20", l).group(1))
          for l in lines] == [5, 10, 15, 20]
  assert lines[0].endswith("ETA ?")  # The first loop includes tracing.
  assert all(re.search(r"\| loss \d+\.\d{4} \| ETA \d+s$", l)
             for l in lines[1:])


def test_summaries_only_every_summary_interval(tmp_path):
  _run(str(tmp_path), train_steps=25)
  scalars = helpers.read_scalars(os.path.join(str(tmp_path), "train"))
  # Every 10 steps, and at the final step.
  assert [step for step, _ in scalars["loss"]] == [10, 20, 25]
  assert [step for step, _ in scalars["mae"]] == [10, 20, 25]


def test_checkpoints_at_interval_multiples_and_the_end(tmp_path):
  _run(str(tmp_path), train_steps=25, steps_per_loop=5)
  state = tf.train.get_checkpoint_state(str(tmp_path))
  assert [p.rsplit("-", 1)[1] for p in state.all_model_checkpoint_paths] == [
      "10", "20", "25"]


def test_initialize_runs_only_when_starting_from_scratch(tmp_path):
  calls = []

  class Counting(helpers.LinearRegression):

    def initialize(self, model):
      calls.append(model.name)

  config = trainer.TrainerConfig(train_steps=10, steps_per_loop=5,
                                 summary_interval=5, global_batch_size=16)
  experiment.run(Counting(), "train", str(tmp_path), None, config)
  assert len(calls) == 1
  experiment.run(Counting(), "train", str(tmp_path), None,
                 trainer.TrainerConfig(train_steps=20, steps_per_loop=5,
                                       summary_interval=5,
                                       global_batch_size=16))
  assert len(calls) == 1
  assert helpers.checkpoint_step(str(tmp_path)) == 20


def test_restoring_a_different_model_names_the_variable(tmp_path):
  _run(str(tmp_path))

  class Wider(helpers.LinearRegression):

    def build_model(self):
      import tf_keras  # pylint: disable=g-import-not-at-top
      return tf_keras.Sequential([tf_keras.Input((4,)),
                                  tf_keras.layers.Dense(16, "tanh"),
                                  tf_keras.layers.Dense(1)])

  with pytest.raises(ValueError, match=r"incompatible tensor with shape \(8,\) "
                     r"when attempting to restore variable with shape \(16,\) "
                     r"and name dense_\d+/bias"):
    experiment.run(Wider(), "train", str(tmp_path), None,
                   trainer.TrainerConfig(train_steps=40, steps_per_loop=5,
                                         summary_interval=5,
                                         global_batch_size=16))
