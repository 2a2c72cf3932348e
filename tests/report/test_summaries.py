"""Summary helpers: scalars, images and the operative config, read back."""

import os

import gin
import numpy as np
import tensorflow as tf

from trainer.report import summaries
from trainer.storage import files

import helpers


def test_write_scalars_reads_back(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  scalars = summaries.ScalarWriter(writer)
  scalars.write({"loss": 0.5, "accuracy": tf.constant(0.25)}, step=7)
  # The same names at another step: the traced function takes the step
  # and the values as they are now.
  scalars.write({"loss": 0.375, "accuracy": 1.0}, step=9)
  scalars.write({"learning_rate": 0.125}, step=9)
  assert helpers.read_scalars(str(tmp_path)) == {
      "loss": [(7, 0.5), (9, 0.375)], "accuracy": [(7, 0.25), (9, 1.0)],
      "learning_rate": [(9, 0.125)]}


def test_a_lazy_writer_makes_its_file_at_the_first_scalars(tmp_path):
  writer = summaries.LazyWriter(str(tmp_path / "train"))
  scalars = summaries.ScalarWriter(writer)
  assert not (tmp_path / "train").exists()
  scalars.write({"loss": 0.5}, step=3)
  assert helpers.read_scalars(str(tmp_path / "train")) == {"loss": [(3, 0.5)]}


def test_each_named_set_is_a_run_of_its_own(tmp_path):
  assert summaries.by_run(
      {"clean/accuracy": 0.5, "noisy/accuracy": 0.25, "clean/loss": 1.0,
       "steps_per_second": 9.0, "other/x": 2.0}, ("clean", "noisy")) == {
           "clean": {"accuracy": 0.5, "loss": 1.0},
           "noisy": {"accuracy": 0.25}, "steps_per_second": 9.0,
           "other/x": 2.0}
  step = tf.Variable(12, dtype=tf.int64)
  manager = summaries.RunsSummaryManager(str(tmp_path), ("clean", "noisy"),
                                         step)
  manager.write_summaries({"clean/accuracy": 0.5, "noisy/accuracy": 0.25,
                           "steps_per_second": 9.0})
  manager.flush()
  assert helpers.read_scalars(str(tmp_path / "clean")) == {
      "accuracy": [(12, 0.5)]}
  assert helpers.read_scalars(str(tmp_path / "noisy")) == {
      "accuracy": [(12, 0.25)]}
  assert helpers.read_scalars(str(tmp_path)) == {"steps_per_second":
                                                 [(12, 9.0)]}


def test_operative_config_file_and_text_summary(tmp_path):
  @gin.configurable("probe")
  def probe(value=1):
    return value

  gin.parse_config("probe.value = 42")
  assert probe() == 42
  writer = tf.summary.create_file_writer(str(tmp_path / "train"))
  path = summaries.write_operative_config(str(tmp_path), writer, step=0)
  with open(path) as f:
    assert "probe.value = 42" in f.read()
  assert "operative_config" in helpers.read_tags(str(tmp_path / "train"))


def test_named_sets_leave_no_empty_event_file_in_the_root(tmp_path):
  step = tf.Variable(3, dtype=tf.int64)
  manager = summaries.RunsSummaryManager(str(tmp_path), ("clean",), step)
  with manager.summary_writer().as_default():  # As an evaluation runs.
    manager.summary_writer("clean")
  manager.write_summaries({"clean/accuracy": 0.75})
  manager.flush()
  assert sorted(p.name for p in tmp_path.iterdir()) == ["clean"]
  assert helpers.read_scalars(str(tmp_path / "clean")) == {
      "accuracy": [(3, 0.75)]}


def test_a_writer_first_used_after_model_dir_is_deleted_makes_nothing(
    tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  writer = summaries.LazyWriter(str(model_dir / "train"), str(model_dir))
  model_dir.rmdir()  # Deleted under the run, before the first summary.
  summaries.ScalarWriter(writer).write({"loss": 0.5}, step=3)
  assert not model_dir.exists()
  # Given no model_dir, the writer makes its folders as before.
  other = summaries.LazyWriter(str(model_dir / "train"))
  summaries.ScalarWriter(other).write({"loss": 0.5}, step=3)
  assert helpers.read_scalars(str(model_dir / "train")) == {
      "loss": [(3, 0.5)]}


def test_eval_summaries_without_named_sets_are_lazy_and_keep_a_tasks_own(
    tmp_path):
  """No named sets: every result, and a summary the Task writes itself in
  `validation_step`, go to the root run, made at the first of them."""
  step = tf.Variable(5, dtype=tf.int64)
  manager = summaries.RunsSummaryManager(str(tmp_path / "eval"), (), step,
                                         model_dir=str(tmp_path))
  assert not (tmp_path / "eval").exists()
  with manager.summary_writer().as_default():  # As an evaluation runs.
    tf.summary.scalar("own", 2.0, step=5)
  manager.write_summaries({"loss": 0.25})
  manager.flush()
  assert helpers.read_scalars(str(tmp_path / "eval")) == {
      "own": [(5, 2.0)], "loss": [(5, 0.25)]}


def test_eval_summaries_after_model_dir_is_deleted_make_nothing(tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  step = tf.Variable(5, dtype=tf.int64)
  for runs in ((), ("clean",)):
    manager = summaries.RunsSummaryManager(
        str(model_dir / "eval"), runs, step, model_dir=str(model_dir))
    if model_dir.exists():
      model_dir.rmdir()
    manager.write_summaries({"clean/accuracy": 0.5, "steps_per_second": 9.0})
    manager.flush()
    summaries.write_images(str(model_dir / "eval"),
                           {"digit": np.full((2, 2, 1), 0.5, np.float32)},
                           step=5, model_dir=str(model_dir))
    assert not model_dir.exists(), runs


def test_the_operative_config_and_images_land_under_a_url(tmp_path,
                                                          monkeypatch):
  """A `gs://` model_dir (here `ram://`) holds them; nothing is local."""
  monkeypatch.chdir(tmp_path)
  model_dir = f"ram://{tmp_path.name}/run"
  files.mark_directory(model_dir)  # As `model_dir` takes a URL folder.

  @gin.configurable("url_probe")
  def probe(value=1):
    return value

  gin.parse_config("url_probe.value = 7")
  assert probe() == 7
  writer = summaries.LazyWriter(os.path.join(model_dir, "train"), model_dir)
  path = summaries.write_operative_config(model_dir, writer, step=0)
  summaries.write_images(os.path.join(model_dir, "eval"),
                         {"a/digit": np.full((2, 2, 1), 0.5, np.float32)},
                         step=5, model_dir=model_dir)
  assert path == f"{model_dir}/operative_config.gin"
  assert "url_probe.value = 7" in files.read_text(path)
  assert files.listdir(os.path.join(model_dir, "eval", "images")) == [
      "a_digit-5.png"]
  assert files.glob(os.path.join(model_dir, "train", "events.out.*"))
  assert not os.listdir(tmp_path)
