"""The build layer: what a checkpoint holds, the parts of a mode and the
controller's actions, built as `train.py` builds them."""

import json
import types

import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import actions
from trainer import build
from trainer import errors
from trainer.storage import checkpoints
from trainer.storage import exports

import helpers
import ram_urls


def _parts(mode, **settings):
  config = trainer.TrainerConfig(**dict(
      dict(train_steps=4, steps_per_loop=2, summary_interval=2,
           global_batch_size=16, eval_batch_size=32, checkpoint_interval=2),
      **settings))
  setup = build.process(trainer.RuntimeConfig(
      distribution_strategy="one_device"))
  return build.parts(helpers.LinearRegression(), mode, setup, config)


def test_checkpoint_items_hold_the_state_and_a_trainers_counters():
  parts = _parts("train")
  state = parts.state
  assert sorted(build.checkpoint_items(state)) == ["global_step", "model",
                                                   "optimizer"]
  evaluated = _parts("eval").state
  assert evaluated.optimizer is None
  assert sorted(build.checkpoint_items(evaluated)) == ["global_step",
                                                       "model"]
  items = build.checkpoint_items(state, parts.trainer, with_input=True)
  assert sorted(items) == sorted(["discarded_batches", "global_step", "model",
                                  "optimizer", checkpoints.INPUT_POSITION,
                                  checkpoints.BATCH_SIZE])
  assert items[checkpoints.INPUT_POSITION] is parts.trainer.train_iterator
  assert items["discarded_batches"] is parts.trainer.discarded_batches
  assert int(items[checkpoints.BATCH_SIZE].numpy()) == (
      parts.config.global_batch_size)
  assert checkpoints.INPUT_POSITION not in build.checkpoint_items(
      state, parts.trainer)


def _names(checkpoint):
  """The names of what `checkpoint` holds, sorted."""
  return sorted(checkpoint._trackable_children())  # pylint: disable=protected-access


def test_parts_checkpoint_what_checkpoint_items_name():
  parts = _parts("train")
  # An in-memory dataset's iterator can be saved: the input position too.
  assert _names(parts.checkpoint) == sorted(build.checkpoint_items(
      parts.state, parts.trainer, with_input=True))
  assert parts.training and not parts.evaluating and parts.evaluator is None
  evaluated = _parts("eval")
  assert evaluated.trainer is None and evaluated.evaluator is not None
  assert _names(evaluated.checkpoint) == ["global_step", "model"]


def test_the_controller_gets_the_eval_actions_of_the_mode(tmp_path):
  parts = _parts("train_and_eval", early_stopping=actions.EarlyStoppingConfig(
      metric="mae", higher_is_better=False))
  stopper = build.early_stopping(parts, str(tmp_path))
  controller = build.controller(parts, str(tmp_path), stopper=stopper)
  assert [type(a) for a in controller.eval_actions] == [
      actions.EarlyStopping, actions.EvalImagesWriter,
      actions.EvaluatedStepRecorder, actions.MetricsCsv]
  assert controller.eval_actions[0] is stopper
  # The Keras callbacks come last, where a training mode has some.
  with_callbacks = _parts("train_and_eval", callbacks=(
      tf_keras.callbacks.LambdaCallback(),))
  callbacks = build.keras_callbacks(with_callbacks)
  assert [type(a) for a in build.controller(
      with_callbacks, str(tmp_path / "callbacks"),
      callbacks=callbacks).eval_actions][-2:] == [actions.MetricsCsv,
                                                  actions.KerasCallbacks]
  assert build.keras_callbacks(_parts("eval", callbacks=(
      tf_keras.callbacks.LambdaCallback(),))) is None
  evaluated = _parts("eval")
  assert build.early_stopping(evaluated, str(tmp_path)) is None
  assert [type(a) for a in build.controller(
      evaluated, str(tmp_path)).eval_actions] == [actions.EvalImagesWriter]


def test_a_controller_without_saves_writes_no_checkpoint(tmp_path):
  parts = _parts("train")
  controller = build.controller(parts, str(tmp_path), saves=False)
  controller.train(4)
  assert parts.state.step() == 4
  assert tf.train.latest_checkpoint(str(tmp_path)) is None
  saving = _parts("train")
  (tmp_path / "saved").mkdir()  # As `model_dir.write_directory` makes it.
  build.controller(saving, str(tmp_path / "saved")).train(4)
  assert helpers.checkpoint_step(str(tmp_path / "saved")) == 4


def test_keras_callbacks_need_one_model():
  parts = _parts("train", callbacks=(tf_keras.callbacks.LambdaCallback(),))
  model = parts.state.model
  parts.state = types.SimpleNamespace(model={"generator": model,
                                             "critic": model},
                                      step=parts.state.step)
  with pytest.raises(errors.ConfigError) as raised:
    build.keras_callbacks(parts)
  assert str(raised.value) == (
      "`trainer.callbacks` needs a Task with one model: a Keras callback "
      "gets one `model`, and this Task builds 2 (generator, critic).")


def test_a_url_write_dir_holds_the_best_checkpoint_and_its_export(
    tmp_path, monkeypatch):
  """(The copy of a restored checkpoint, `save_best`'s other way, is
  `checkpoints.copy`, tested on a URL in test_checkpoints: a restore from
  `ram://` fails, which takes a checkpoint's prefix for a folder.)"""
  write_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  parts = _parts("train_and_eval", validation_interval=2,
                 best_checkpoint=actions.BestCheckpointConfig(
                     metric="loss", higher_is_better=False),
                 export=exports.ExportConfig(best=True))
  build.controller(parts, write_dir).train_and_evaluate(4, eval_interval=2)
  record = json.loads(tf.io.gfile.GFile(
      f"{write_dir}/best/{actions.BEST_RECORD}").read())
  names = ram_urls.names(f"{write_dir}/best")
  assert [name for name in names if name.startswith("ckpt-")] == [
      f"{record['checkpoint']}.data-00000-of-00001",
      f"{record['checkpoint']}.index"]
  assert f"{record['export']}/.complete" in names
  tf.saved_model.load(f"{write_dir}/best/{record['export']}")
  assert {"metrics.csv", "eval/evaluated.json"} <= set(
      ram_urls.names(write_dir))
  assert ram_urls.nothing_local(tmp_path)
