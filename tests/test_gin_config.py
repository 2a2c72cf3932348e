"""`gin_config`: gin files found locally, in this repository, or at a URL."""

import os

import pytest

from trainer import errors
from trainer import gin_config
from trainer.storage import files


def test_a_gin_file_at_a_url_is_read_there_with_its_includes(
    tmp_path, monkeypatch):
  """`--gin_file=gs://...` (here `ram://`): no local `gs:` folder looked in
  or made."""
  monkeypatch.chdir(tmp_path)
  bucket = f"ram://{tmp_path.name}/configs"
  files.write_text(f"{bucket}/base.gin", "include 'gin/digits.gin'\n"
                   "trainer.train_steps = 7\n")
  files.write_text(f"{bucket}/exp.gin", f"include '{bucket}/base.gin'\n"
                   "DigitsClassification.filters = 4\n")
  task, _, config = gin_config.load_config(
      [f"{bucket}/exp.gin"], ["trainer.steps_per_loop=20"])
  assert (task.filters, config.train_steps, config.steps_per_loop) == (
      4, 7, 20)
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize("where,steps", [("url", 9), ("local", 11)])
def test_an_include_is_found_beside_its_gin_file(where, steps, tmp_path,
                                                 monkeypatch):
  """`include 'base.gin'` in `gs://b/configs/exp.gin` (here `ram://`) or a
  local folder: found beside it from another working directory, and not
  beside an earlier config of the process (the two write other steps)."""
  monkeypatch.chdir(tmp_path)
  folder = (f"ram://{tmp_path.name}/configs" if where == "url" else
            str(tmp_path / "cfg"))
  files.write_text(f"{folder}/base.gin", "include 'gin/digits.gin'\n"
                   f"trainer.train_steps = {steps}\n")
  files.write_text(f"{folder}/exp.gin", "include 'base.gin'\n"
                   "DigitsClassification.filters = 3\n")
  task, _, config = gin_config.load_config([f"{folder}/exp.gin"], [])
  assert (task.filters, config.train_steps) == (3, steps)
  assert os.listdir(tmp_path) == ([] if where == "url" else ["cfg"])


def test_gin_errors_at_a_url_name_its_file_and_line(tmp_path):
  path = f"ram://{tmp_path.name}/bad.gin"
  files.write_text(path, "import tasks.digits\ntrainer.train_steps = = 3\n")
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([path], [])
  assert str(raised.value) == (
      f"{path}:2: gin syntax error: Unable to parse value")


@pytest.mark.parametrize("path,message", [
    ("ram://missing/exp.gin",
     "--gin_file: no such file: ram://missing/exp.gin"),
    ("gs:/bucket/exp.gin", "--gin_file (gs:/bucket/exp.gin) has one slash "
     "after `gs:`: write gs://bucket/exp.gin"),
])
def test_a_gin_file_url_that_cannot_be_read_is_one_line(path, message):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([path], [])
  assert str(raised.value) == message


def test_a_gin_file_url_that_is_a_folder_is_named_so(tmp_path):
  folder = f"ram://{tmp_path.name}/configs"
  files.write_text(f"{folder}/exp.gin", "")
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config([folder], [])
  assert str(raised.value) == (f"--gin_file: {folder} is a directory, not a "
                               "gin file.")


@pytest.mark.parametrize("binding,line", [
    ("trainr.train_steps=5", "--gin_param: No configurable matching 'trainr' "
     "(did you mean 'trainer'?)"),
    ("trainer.train_step=5", "--gin_param: Configurable 'trainer' doesn't "
     "have a parameter named 'train_step' (did you mean 'train_steps'?)"),
])
def test_a_misspelled_binding_is_one_line_with_the_name_meant(binding, line):
  with pytest.raises(errors.ConfigError) as raised:
    gin_config.load_config(["gin/digits.gin"], [binding])
  assert str(raised.value).startswith(line)
