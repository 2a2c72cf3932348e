"""Summary helpers: scalars, operative config, the progress line."""

import gin
import tensorflow as tf

from trainer import summaries

import helpers


def test_format_duration():
  assert summaries.format_duration(3.4) == "3s"
  assert summaries.format_duration(123) == "2m03s"
  assert summaries.format_duration(3723) == "1h02m03s"


def test_progress_line():
  line = summaries.progress_line(300, 1000, 250.04, 16002.6, 0.12345, 2.8)
  assert line == ("train | step  300/1000 |   250.0 steps/s |    16003 "
                  "examples/s | loss 0.1235 | ETA 3s")
  assert summaries.progress_line(1, 10, 1.0, 1.0, float("nan"),
                                 None).endswith("loss nan | ETA ?")


def test_write_scalars_reads_back(tmp_path):
  writer = tf.summary.create_file_writer(str(tmp_path))
  summaries.write_scalars(writer, {"loss": 0.5, "accuracy": tf.constant(0.25)},
                          step=7)
  assert helpers.read_scalars(str(tmp_path)) == {"loss": [(7, 0.5)],
                                                 "accuracy": [(7, 0.25)]}


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
