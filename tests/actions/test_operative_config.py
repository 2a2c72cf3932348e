"""`model_dir/operative_config.gin`, written once after the first loop; a
`model_dir` deleted under the run is not made again (the next checkpoint
save says it is gone)."""

import os
import shutil

import gin
import pytest
import tensorflow as tf

from trainer.actions import operative_config
from trainer.report import summaries

import ram_urls


@gin.configurable("operative_probe")
def _probe(value=1):
  return value


@pytest.fixture(autouse=True)
def _probe_bound_and_used():
  gin.parse_config("operative_probe.value = 7")
  assert _probe() == 7  # Used: now in the operative config.
  yield
  gin.clear_config()


def _written(model_dir):
  with open(os.path.join(model_dir, summaries.OPERATIVE_CONFIG_FILE)) as f:
    return f.read()


def test_it_is_written_once_after_the_first_loop(tmp_path):
  action = operative_config.OperativeConfigWriter(str(tmp_path), None)
  action(None)
  assert "operative_probe.value = 7" in _written(tmp_path)
  gin.parse_config("operative_probe.value = 8")
  action(None)  # A later loop: the file stays as the first loop left it.
  assert "operative_probe.value = 7" in _written(tmp_path)


def test_a_model_dir_deleted_before_is_not_made_again(tmp_path):
  model_dir = tmp_path / "run"
  action = operative_config.OperativeConfigWriter(str(model_dir), None)
  action(None)
  assert not model_dir.exists()


def test_a_model_dir_deleted_during_the_write_is_not_an_error(tmp_path,
                                                             monkeypatch):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  replace = os.replace

  def delete_then_replace(source, target):
    shutil.rmtree(model_dir)  # As the user's `rm -r` lands mid-write.
    replace(source, target)

  monkeypatch.setattr(os, "replace", delete_then_replace)
  operative_config.OperativeConfigWriter(str(model_dir), None)(None)
  assert not model_dir.exists()


def test_a_failed_write_into_an_existing_model_dir_is_raised(tmp_path,
                                                             monkeypatch):
  def missing(source, target):
    raise FileNotFoundError(2, "No such file or directory", source)

  monkeypatch.setattr(os, "replace", missing)
  with pytest.raises(FileNotFoundError):
    operative_config.OperativeConfigWriter(str(tmp_path), None)(None)


def test_it_is_written_into_a_url_model_dir(tmp_path, monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  operative_config.OperativeConfigWriter(model_dir, None)(None)
  with tf.io.gfile.GFile(
      f"{model_dir}/{summaries.OPERATIVE_CONFIG_FILE}") as f:
    assert "operative_probe.value = 7" in f.read()
  assert ram_urls.nothing_local(tmp_path)


def test_a_url_model_dir_deleted_before_is_not_made_again(tmp_path,
                                                         monkeypatch):
  # Never taken by the run (no identity): as if deleted under it.
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch, mark=False)
  operative_config.OperativeConfigWriter(model_dir, None)(None)
  assert not tf.io.gfile.exists(model_dir)
  assert ram_urls.nothing_local(tmp_path)
