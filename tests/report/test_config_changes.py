"""`config_changes`: the bindings of two operative configs, compared."""

import os

import gin

from trainer.report import config_changes
from trainer.report import summaries
from trainer.storage import files

_OLD = """import tasks.digits

# Parameters for experiment:
# ==============================================================================
experiment.task = @DigitsClassification()

# Parameters for optimizer:
# ==============================================================================
optimizer.learning_rate = 0.001
optimizer.name = 'adam'
generator/optimizer.learning_rate = 0.0002

# Parameters for trainer:
# ==============================================================================
trainer.optimizer_parts = \\
    {'backbone': 'conv', 'head': 'dense'}
trainer.train_steps = 100
trainer.profile_steps = %PROFILE
"""


def test_bindings_keep_values_as_gin_writes_them():
  assert config_changes.bindings(_OLD) == {
      "experiment.task": "@DigitsClassification()",
      "optimizer.learning_rate": "0.001",
      "optimizer.name": "'adam'",
      "generator/optimizer.learning_rate": "0.0002",
      "trainer.optimizer_parts": "{'backbone': 'conv', 'head': 'dense'}",
      "trainer.train_steps": "100",
      "trainer.profile_steps": "%PROFILE",
  }


def test_the_resume_line_lists_what_changed_in_name_order():
  new = _OLD.replace("0.001", "1e-12").replace("= 100", "= 200").replace(
      "generator/optimizer.learning_rate = 0.0002\n", "")
  found = config_changes.changes(config_changes.bindings(_OLD),
                                 config_changes.bindings(new))
  assert config_changes.line(100, found) == (
      "resume | changed since step 100: generator/optimizer.learning_rate "
      "0.0002 -> (unused), optimizer.learning_rate 0.001 -> 1e-12, "
      "trainer.train_steps 100 -> 200")
  assert [c.binding for c in config_changes.named(
      found, "optimizer.learning_rate")] == [
          "generator/optimizer.learning_rate", "optimizer.learning_rate"]


def test_nothing_changed_is_no_line():
  same = config_changes.bindings(_OLD)
  assert config_changes.changes(same, dict(same)) == ()
  assert config_changes.line(100, ()) is None


def test_the_operative_config_written_reads_back(tmp_path):
  @gin.configurable("changes_probe")
  def probe(rate=0.5, name="x"):
    return rate, name

  gin.parse_config("changes_probe.rate = 1e-12")
  probe()
  summaries.write_operative_config(str(tmp_path), None, step=0)
  assert config_changes.read(str(tmp_path)) == {
      "changes_probe.rate": "1e-12", "changes_probe.name": "'x'"}
  assert config_changes.operative() == config_changes.read(str(tmp_path))
  assert config_changes.read(str(tmp_path / "none")) is None


def test_the_config_is_read_from_a_url(tmp_path, monkeypatch):
  """From a `gs://` model_dir (here `ram://`), not a local `gs:` folder."""
  monkeypatch.chdir(tmp_path)
  model_dir, damaged = (f"ram://{tmp_path.name}/{name}"
                        for name in ("run", "damaged"))
  assert config_changes.read(model_dir) is None
  files.write_text(os.path.join(model_dir, summaries.OPERATIVE_CONFIG_FILE),
                   _OLD)
  files.write_bytes(os.path.join(damaged, summaries.OPERATIVE_CONFIG_FILE),
                    b"\xff not text")
  assert config_changes.read(model_dir) == config_changes.bindings(_OLD)
  assert config_changes.read(damaged) is None
  assert not os.listdir(tmp_path)
