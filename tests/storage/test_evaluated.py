"""The record of evaluated steps (`trainer.storage.evaluated`)."""

import os

from trainer.storage import evaluated

import ram_urls


def test_the_record_is_read_back_by_step_and_metric(tmp_path):
  model_dir = str(tmp_path)
  assert evaluated.steps(model_dir) == set()
  assert evaluated.metric_by_step(model_dir, "accuracy") == {}
  record = evaluated.EvaluatedRecord(model_dir)
  record.add(20, {"accuracy": 0.5, "loss": 1.25})
  record.add(10, {"loss": 2.0})
  # Another reader (a sweep, a restarted run) sees every write.
  assert evaluated.steps(model_dir) == {10, 20}
  assert evaluated.metric_by_step(model_dir, "accuracy") == {20: 0.5}
  assert evaluated.metric_by_step(model_dir, "loss") == {10: 2.0, 20: 1.25}
  assert evaluated.EvaluatedRecord(model_dir).results == {
      10: {"loss": 2.0}, 20: {"accuracy": 0.5, "loss": 1.25}}


def test_a_record_that_is_not_json_reads_as_empty(tmp_path):
  os.makedirs(tmp_path / "eval")
  (tmp_path / evaluated.RECORD).write_text('{"steps": [1')
  assert evaluated.steps(str(tmp_path)) == set()
  assert evaluated.metric_by_step(str(tmp_path), "loss") == {}


def test_the_record_of_a_url_model_dir_is_kept_there(tmp_path, monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  evaluated.EvaluatedRecord(model_dir).add(20, {"loss": 1.25})
  assert evaluated.metric_by_step(model_dir, "loss") == {20: 1.25}
  assert ram_urls.names(model_dir) == [".identity", evaluated.RECORD]
  assert ram_urls.nothing_local(tmp_path)
