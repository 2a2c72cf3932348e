"""Reading the user's TFRecord files: the schema, file and example sharding
over input pipelines, and training a shipped task from them."""

import os

import pytest
import tensorflow as tf

import trainer
from tasks import mnist
from tasks import tfrecord_inputs
from trainer import experiment
from trainer.storage import files

import helpers


def _source(pattern, **settings):
  return tfrecord_inputs.TFRecordSource(
      train_files=pattern, eval_files=pattern,
      schema={"image/encoded": "string", "image/class/label": "int64"},
      label_offset=-1, **settings)


def test_schema_parsing():
  features = tfrecord_inputs.parse_schema(
      {"a": "string", "b": "int64", "c": "float32[28, 28]"})
  assert features["a"] == tf.io.FixedLenFeature([], tf.string)
  assert features["c"] == tf.io.FixedLenFeature([28, 28], tf.float32)
  with pytest.raises(trainer.ConfigError, match=r"^`TFRecordSource.schema` "
                     r"entry 'x': 'int32' is not 'string', 'int64' or "
                     r"'float32'"):
    tfrecord_inputs.parse_schema({"x": "int32"})


def test_keys_default_to_the_first_string_and_int64_features(tmp_path):
  source = _source(helpers.write_image_records(str(tmp_path), 1, 4))
  assert (source.features_key, source.label_key) == ("image/encoded",
                                                     "image/class/label")
  with pytest.raises(trainer.ConfigError, match="'pixels' is not in the "
                     "schema"):
    _source("x", features_key="pixels")


def _read_all(source, training, context=None):
  return [(bytes(image), int(label)) for image, label in
          source.read(training, context).as_numpy_iterator()]


def test_files_at_a_url_are_matched_and_read_there(tmp_path, monkeypatch):
  """`train_files = 'gs://bucket/data-*.tfrecord'` (here `ram://`)."""
  local = helpers.write_image_records(str(tmp_path / "local"), 2, 3)
  (tmp_path / "cwd").mkdir()
  monkeypatch.chdir(tmp_path / "cwd")
  bucket = f"ram://{tmp_path.name}/data"
  for path in files.glob(local):
    files.copy(path, os.path.join(bucket, os.path.basename(path)))
  source = _source(os.path.join(bucket, "data-*.tfrecord"))
  assert _read_all(source, training=False) == _read_all(
      _source(local), training=False)
  with pytest.raises(trainer.ConfigError, match="no file matches"):
    _source(os.path.join(bucket, "none-*")).read(training=True)
  assert not os.listdir(tmp_path / "cwd")


@pytest.mark.parametrize("num_files", [4, 1])
def test_pipelines_read_disjoint_parts(tmp_path, num_files):
  # 4 files over 2 pipelines: by file; 1 file: by example.
  source = _source(helpers.write_image_records(str(tmp_path), num_files, 24 // num_files))
  everything = _read_all(source, training=False)
  assert len(everything) == 24
  assert sorted(label for _, label in everything) == sorted(
      [i % 10 for i in range(24)])  # 1-based labels, shifted.
  parts = [_read_all(source, True, tf.distribute.InputContext(
      num_input_pipelines=2, input_pipeline_id=i)) for i in range(2)]
  assert not set(parts[0]) & set(parts[1])
  assert sorted(parts[0] + parts[1]) == sorted(everything)


def test_no_matching_file_is_a_config_error(tmp_path):
  source = _source(str(tmp_path / "missing-*"))
  with pytest.raises(trainer.ConfigError, match=r"^`TFRecordSource.train_"
                     r"files`: no file matches '.*missing-\*'\.$"):
    source.read(True)


def test_mnist_trains_from_tfrecord_files(tmp_path):
  source = _source(helpers.write_image_records(str(tmp_path / "data"), 2, 32))
  task = mnist.MnistClassification(tfrecords=source)
  config = trainer.TrainerConfig(train_steps=8, steps_per_loop=4,
                                 summary_interval=4, checkpoint_interval=8,
                                 global_batch_size=16, eval_batch_size=16)
  output = experiment.run(task, "train_and_eval", str(tmp_path / "run"),
                          trainer.RuntimeConfig(seed=0), config)
  assert helpers.checkpoint_step(str(tmp_path / "run")) == 8
  assert 0.0 <= output["accuracy"] <= 1.0
