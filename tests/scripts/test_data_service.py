"""scripts/data_service.py: a dispatcher's journal at a URL."""

import os
import sys

import pytest

from trainer import errors
from trainer.storage import files

import helpers

sys.path.insert(0, os.path.join(helpers.REPO_ROOT, "scripts"))
import data_service  # noqa: E402  pylint: disable=g-import-not-at-top


def test_a_dispatcher_keeps_its_journal_at_a_url(tmp_path, monkeypatch):
  """`--work_dir=gs://...` (here `ram://`): TensorFlow writes it there."""
  monkeypatch.chdir(tmp_path)
  work_dir = f"ram://{tmp_path.name}/journal"
  _, line = data_service.start_server(0, None, "localhost", work_dir)
  assert line.endswith(f" (journal in {work_dir})")
  assert "tf_data_dispatcher_journal" in files.listdir(work_dir)
  assert not os.listdir(tmp_path)


def test_a_journal_url_with_one_slash_is_refused_before_serving():
  with pytest.raises(errors.ConfigError) as raised:
    data_service.start_server(0, None, "localhost", "gs:/bucket/journal")
  assert str(raised.value) == ("--work_dir (gs:/bucket/journal) has one "
                               "slash after `gs:`: write gs://bucket/journal")
