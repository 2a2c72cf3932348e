"""SavedModel exports: written when training ends, loadable with
`tf.saved_model.load`, and serving the same outputs as the model."""

import os

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import errors
from trainer import experiment
from trainer.model import ema as ema_lib
from trainer.model import optimization
from trainer.storage import exports

import helpers
import ram_urls


def _config(**settings):
  return trainer.TrainerConfig(
      train_steps=20, steps_per_loop=10, summary_interval=10,
      checkpoint_interval=10, global_batch_size=32,
      export=exports.ExportConfig(at_end=True),
      optimizer=optimization.OptimizerConfig(name="sgd", learning_rate=0.1),
      **settings)


def _restored_model(model_dir, task, averaged=False):
  """The model of the newest checkpoint; its EMA averages if `averaged`."""
  model = task.build_model()
  reader = tf.train.load_checkpoint(model_dir)
  layers = [layer for layer in model.layers if layer.weights]
  for index, layer in enumerate(layers):
    for name in ("kernel", "bias"):
      key = f"model/layer_with_weights-{index}/{name}/"
      if averaged:
        key += ".OPTIMIZER_SLOT/optimizer/average/"
      getattr(layer, name).assign(
          reader.get_tensor(key + ".ATTRIBUTES/VARIABLE_VALUE"))
  return model


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_export_at_the_end_serves_the_models_outputs(tmp_path, strategy,
                                                    capsys):
  task = helpers.ConfiguredRegression()
  experiment.run(task, "train", str(tmp_path), trainer.RuntimeConfig(
      distribution_strategy=strategy, seed=0,
      num_cpu_devices=2 if strategy == "mirrored" else 0), _config())
  directory = os.path.join(tmp_path, "export", "20")
  assert f"export | SavedModel of step 20 in {directory}" in (
      capsys.readouterr().out)
  assert sorted(os.listdir(tmp_path / "export")) == ["20"]
  loaded = tf.saved_model.load(directory)
  serve = loaded.signatures["serving_default"]
  assert list(serve.structured_input_signature[1]) == ["features"]
  features = next(iter(task.build_inputs(False).batch(64)))[0]
  served = serve(features=features)["outputs"].numpy()
  expected = _restored_model(str(tmp_path), task)(features).numpy()
  np.testing.assert_allclose(served, expected, rtol=1e-6, atol=1e-6)


def test_export_holds_the_averaged_weights_with_ema(tmp_path):
  task = helpers.ConfiguredRegression()
  experiment.run(task, "train", str(tmp_path), trainer.RuntimeConfig(seed=0),
                 _config(ema=ema_lib.EmaConfig(decay=0.9)))
  serve = tf.saved_model.load(
      str(tmp_path / "export" / "20")).signatures["serving_default"]
  features = next(iter(task.build_inputs(False).batch(64)))[0]
  served = serve(features=features)["outputs"].numpy()
  averaged = _restored_model(str(tmp_path), task, averaged=True)
  raw = _restored_model(str(tmp_path), task)
  np.testing.assert_allclose(served, averaged(features).numpy(), rtol=1e-6,
                             atol=1e-6)
  assert np.abs(served - raw(features).numpy()).max() > 1e-3


def test_dict_features_get_one_named_input_each(tmp_path):
  inputs = {"a": tf_keras.Input((2,), name="a"),
            "b": tf_keras.Input((3,), name="b")}
  model = tf_keras.Model(inputs, tf_keras.layers.Dense(1)(
      tf_keras.layers.Concatenate()([inputs["a"], inputs["b"]])))
  signatures = exports.default_signatures(
      model, {"a": tf.TensorSpec([None, 2]), "b": tf.TensorSpec([None, 3])})
  exports.export(model, signatures, str(tmp_path / "1"))
  serve = tf.saved_model.load(str(tmp_path / "1")).signatures[
      "serving_default"]
  a, b = tf.ones([5, 2]), tf.fill([5, 3], 2.0)
  np.testing.assert_allclose(serve(a=a, b=b)["outputs"].numpy(),
                             model({"a": a, "b": b}).numpy(), rtol=1e-6)


def test_other_features_need_a_task_signature():
  model = tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])
  features = (tf.TensorSpec([None, 2]), tf.TensorSpec([None, 2]))
  with pytest.raises(errors.ConfigTypeError) as raised:
    exports.default_signatures(model, features)
  assert str(raised.value) == (
      "the default serving signature takes a tensor or a dict of tensors; "
      f"these features are {features}: override `Task.export_signatures`.")
  # A Task's `export_signatures` that caught the `TypeError` still does.
  assert isinstance(raised.value, TypeError)


def test_keep_newest(tmp_path):
  for step in (5, 10, 20):
    (tmp_path / str(step)).mkdir()
  exports.keep_newest(str(tmp_path), 1)
  assert os.listdir(tmp_path) == ["20"]
  exports.keep_newest(str(tmp_path), 0)
  assert os.listdir(tmp_path) == []


def _model():
  return tf_keras.Sequential([tf_keras.Input((2,)), tf_keras.layers.Dense(1)])


def test_an_export_to_a_url_is_written_there_whole_and_loads(tmp_path,
                                                             monkeypatch):
  base = ram_urls.model_dir(tmp_path, monkeypatch) + "/export"
  model = _model()
  signatures = exports.default_signatures(model, tf.TensorSpec([None, 2]))
  assert exports.export(model, signatures, base + "/20") == base + "/20"
  # Written in place, the marker last: nothing named `.tmp-*`.
  assert ram_urls.names(base) == [
      "20/.complete", "20/fingerprint.pb", "20/saved_model.pb",
      "20/variables/variables.data-00000-of-00001",
      "20/variables/variables.index"]
  serve = tf.saved_model.load(base + "/20").signatures["serving_default"]
  features = tf.ones([3, 2])
  np.testing.assert_allclose(serve(features=features)["outputs"].numpy(),
                             model(features).numpy(), rtol=1e-6)
  assert ram_urls.nothing_local(tmp_path)


def test_keep_newest_on_a_url_counts_only_complete_exports(tmp_path,
                                                          monkeypatch):
  base = ram_urls.model_dir(tmp_path, monkeypatch) + "/export"
  model = _model()
  signatures = exports.default_signatures(model, tf.TensorSpec([None, 2]))
  for step in (5, 10):
    exports.export(model, signatures, f"{base}/{step}")
  # What a crash during the export of step 20 left: no `.complete`.
  tf.io.gfile.makedirs(f"{base}/20")
  with tf.io.gfile.GFile(f"{base}/20/saved_model.pb", "wb") as f:
    f.write(b"cut short")
  exports.keep_newest(base, 1)
  assert tf.io.gfile.listdir(base) == ["10"]
  exports.keep_newest(base, 0)
  assert not tf.io.gfile.exists(f"{base}/10")
  assert ram_urls.nothing_local(tmp_path)
