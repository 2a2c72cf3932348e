"""`model_dir/metrics.csv`: rows appended as the run goes, a header that
grows, named sets, and a resume that neither duplicates nor contradicts a
row; the file read back with `csv` as pandas would read it."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf

import trainer
from trainer.actions import metrics_csv

import helpers
import ram_urls


class _Clock:
  """Unix seconds that advance by one at every read."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    self.now += 1.0
    return self.now


def _rows(model_dir):
  with open(os.path.join(model_dir, metrics_csv.METRICS_CSV),
            newline="") as f:
    return list(csv.reader(f))


def _csv(model_dir, step=0, set_names=()):
  steps = {"step": step}
  writer = metrics_csv.MetricsCsv(str(model_dir), lambda: steps["step"],
                                  set_names=set_names, clock=_Clock())
  return writer, steps


def test_train_and_eval_rows_share_metric_columns(tmp_path):
  writer, steps = _csv(tmp_path)
  writer.train_summary(100, {"loss": 0.5, "accuracy": 0.75,
                             "learning_rate": np.float32(0.125)})
  steps["step"] = 100
  writer({"loss": tf.constant(0.25), "accuracy": np.float64(0.875)})
  writer.train_summary(200, {"loss": 0.375, "accuracy": 0.8125,
                             "learning_rate": 0.0625})
  assert _rows(tmp_path) == [
      ["step", "wall_time", "split", "loss", "accuracy", "learning_rate"],
      ["100", "1001.000", "train", "0.5", "0.75", "0.125"],
      ["100", "1002.000", "eval", "0.25", "0.875", ""],
      ["200", "1003.000", "train", "0.375", "0.8125", "0.0625"]]


def test_a_new_metric_grows_the_header_and_keeps_the_rows(tmp_path):
  writer, steps = _csv(tmp_path, set_names=("clean", "noisy"))
  writer.train_summary(10, {"loss": 1.0})
  steps["step"] = 10
  # Named sets: one row each, the metric names without the set's prefix;
  # a result of no known set stays in the `eval` row.
  writer({"clean/loss": 0.5, "clean/accuracy": 0.9, "noisy/loss": 2.0,
          "other": 3.0, "image": np.zeros((2, 2))})
  writer.train_summary(20, {"loss": float("nan"), "steps_per_second": 4.0})
  assert _rows(tmp_path) == [
      ["step", "wall_time", "split", "loss", "other", "accuracy",
       "steps_per_second"],
      ["10", "1001.000", "train", "1.0", "", "", ""],
      ["10", "1002.000", "eval", "", "3.0", "", ""],
      ["10", "1003.000", "eval/clean", "0.5", "", "0.9", ""],
      ["10", "1004.000", "eval/noisy", "2.0", "", "", ""],
      ["20", "1005.000", "train", "nan", "", "", "4.0"]]


def test_a_resume_drops_the_rows_past_the_restored_step(tmp_path):
  writer, steps = _csv(tmp_path)
  for step in (100, 200, 300):  # Killed after 300's rows, saved at 200.
    writer.train_summary(step, {"loss": step / 1000})
    steps["step"] = step
    writer({"loss": step / 100})
  resumed, steps = _csv(tmp_path, step=200)
  resumed.restarted(200)
  assert [row[:3] for row in _rows(tmp_path)[1:]] == [
      ["100", "1001.000", "train"], ["100", "1002.000", "eval"],
      ["200", "1003.000", "train"], ["200", "1004.000", "eval"]]
  resumed.train_summary(300, {"loss": 0.25})
  # 200's evaluation made again (it was not recorded): it replaces the row.
  steps["step"] = 200
  resumed({"loss": 1.5})
  assert [(row[0], row[2], row[3]) for row in _rows(tmp_path)[1:]] == [
      ("100", "train", "0.1"), ("100", "eval", "1.0"),
      ("200", "train", "0.2"), ("200", "eval", "1.5"),
      ("300", "train", "0.25")]


def test_a_rollback_drops_the_rows_of_the_steps_undone(tmp_path):
  writer, _ = _csv(tmp_path)
  for step in (10, 20, 30):
    writer.train_summary(step, {"loss": 1.0})
  writer.after_rollback(10)
  assert [row[0] for row in _rows(tmp_path)[1:]] == ["10"]


def test_a_row_torn_by_a_crash_is_dropped_when_read(tmp_path):
  writer, _ = _csv(tmp_path)
  writer.train_summary(10, {"loss": 1.0, "accuracy": 0.5})
  with open(writer.path, "a") as f:
    f.write("20,1002.0,tra")  # Killed mid-write.
  resumed, _ = _csv(tmp_path)
  resumed.train_summary(20, {"loss": 0.5, "accuracy": 0.75})
  assert _rows(tmp_path)[1:] == [["10", "1001.000", "train", "1.0", "0.5"],
                                 ["20", "1001.000", "train", "0.5", "0.75"]]


def test_a_file_deleted_during_the_run_is_written_again_whole(tmp_path,
                                                               capsys):
  writer, steps = _csv(tmp_path)
  writer.train_summary(10, {"loss": 1.0})
  resumed, steps = _csv(tmp_path, step=10)  # Rows read at start, kept too.
  for step in (20, 30):
    resumed.train_summary(step, {"loss": step / 100})
    steps["step"] = step
    resumed({"loss": step / 10})
  os.remove(resumed.path)
  resumed.train_summary(40, {"loss": 0.25})
  assert [row[:4] for row in _rows(tmp_path)] == [
      ["step", "wall_time", "split", "loss"],
      ["10", "1001.000", "train", "1.0"],
      ["20", "1001.000", "train", "0.2"], ["20", "1002.000", "eval", "2.0"],
      ["30", "1003.000", "train", "0.3"], ["30", "1004.000", "eval", "3.0"],
      ["40", "1005.000", "train", "0.25"]]
  # Deleted again before a row that adds a column: the same, once each.
  os.remove(resumed.path)
  resumed.train_summary(50, {"loss": 0.125, "accuracy": 0.5})
  resumed.train_summary(60, {"loss": 0.0625, "accuracy": 0.75})
  assert [row[0] for row in _rows(tmp_path)[1:]] == [
      "10", "20", "20", "30", "30", "40", "50", "60"]
  open(resumed.path, "w").close()  # Emptied.
  resumed.train_summary(70, {"loss": 0.03125, "accuracy": 0.875})
  assert [row[0] for row in _rows(tmp_path)[1:]] == [
      "10", "20", "20", "30", "30", "40", "50", "60", "70"]
  assert [line for line in capsys.readouterr().out.splitlines()
          if line.startswith("warning | ")] == [
              f"warning | {resumed.path} was deleted during the run: written "
              "again whole (6 rows, steps 10 to 40)",
              f"warning | {resumed.path} was deleted during the run: written "
              "again whole (7 rows, steps 10 to 50)",
              f"warning | {resumed.path} was emptied during the run: written "
              "again whole (9 rows, steps 10 to 70)"]


def test_a_first_row_writes_no_warning(tmp_path, capsys):
  writer, _ = _csv(tmp_path)
  writer.train_summary(10, {"loss": 1.0})
  writer.train_summary(20, {"loss": 0.5})
  assert [row[0] for row in _rows(tmp_path)[1:]] == ["10", "20"]
  assert "warning" not in capsys.readouterr().out


# Keras's `CSVLogger`'s, say.
_FOREIGN = "epoch,loss,val_loss\n0,0.9,1.1\n1,0.5,0.7\n"


def test_a_long_foreign_header_is_shown_by_its_first_columns(tmp_path):
  (tmp_path / "metrics.csv").write_text("epoch,a,b,c,d,e\n0,1,2,3,4,5\n")
  with pytest.raises(trainer.ConfigError,
                     match=r"its header is `epoch,a,b,c,\.\.\.`, not "):
    _csv(tmp_path)


@pytest.mark.parametrize("content, header", [
    (_FOREIGN.encode(), "epoch,loss,val_loss"),
    # Not UTF-8 text (a spreadsheet saved over it, say): refused like another
    # program's CSV, not a UnicodeDecodeError.
    (b"\xff\xfe\x00s\x00t\x00e\x00p", "<not UTF-8 text>"),
], ids=["another program's", "not text"])
def test_a_metrics_csv_that_is_not_ours_is_refused_and_kept(
    tmp_path, content, header):
  path = tmp_path / "metrics.csv"
  path.write_bytes(content)
  with pytest.raises(trainer.ConfigError) as raised:
    _csv(tmp_path)
  assert str(raised.value) == (
      f"{path} is not this framework's (its header is `{header}`, "
      "not `step,wall_time,split,...`), and training writes its own there: "
      "move it away, or train in another --model_dir.")
  assert path.read_bytes() == content


def test_a_metrics_csv_that_is_not_ours_stops_train_py_before_training(
    tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  (model_dir / "metrics.csv").write_text(_FOREIGN)
  before = helpers.snapshot(str(model_dir))
  result = helpers.run_cli(["--gin_file=gin/digits.gin",
                            "--gin_param=trainer.train_steps=10",
                            f"--model_dir={model_dir}"])
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      f"train.py: error: {model_dir}/metrics.csv is not this framework's "
      "(its header is `epoch,loss,val_loss`, not `step,wall_time,split,...`)"
      ", and training writes its own there: move it away, or train in "
      "another --model_dir.")
  assert "train | " not in result.stdout
  assert helpers.snapshot(str(model_dir)) == before


def _url_rows(model_dir):
  with tf.io.gfile.GFile(f"{model_dir}/{metrics_csv.METRICS_CSV}") as f:
    return list(csv.reader(f.read().splitlines()))


def test_the_rows_of_a_url_model_dir_are_kept_there_across_a_resume(
    tmp_path, monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  writer, steps = _csv(model_dir)
  for step in (100, 200, 300):  # Killed after 300's rows, saved at 200.
    writer.train_summary(step, {"loss": step / 1000})
    steps["step"] = step
    writer({"loss": step / 2000})
  resumed, steps = _csv(model_dir, step=200)
  resumed.restarted(200)
  resumed.train_summary(300, {"loss": 0.25})  # Appended: the object anew.
  assert _url_rows(model_dir) == [
      ["step", "wall_time", "split", "loss"],
      ["100", "1001.000", "train", "0.1"],
      ["100", "1002.000", "eval", "0.05"],
      ["200", "1003.000", "train", "0.2"],
      ["200", "1004.000", "eval", "0.1"],
      ["300", "1001.000", "train", "0.25"]]
  assert metrics_csv.last_step(model_dir) == 300
  # Deleted during the run: written again whole.
  tf.io.gfile.remove(f"{model_dir}/{metrics_csv.METRICS_CSV}")
  steps["step"] = 300
  resumed({"loss": 0.125})
  assert len(_url_rows(model_dir)) == 7
  assert ram_urls.names(model_dir) == [".identity", metrics_csv.METRICS_CSV]
  assert ram_urls.nothing_local(tmp_path)
