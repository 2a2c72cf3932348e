"""trainer.usage: `--help` on train.py and every script in scripts/ prints
the usage and the flags with their help on stdout and exits 0, in real
processes started from another directory."""

import glob
import os
import subprocess
import sys

import pytest

from trainer import cli  # noqa: F401  Defines the flags listed.
from trainer.report import usage

import helpers

SCRIPTS = sorted(glob.glob(os.path.join(helpers.REPO_ROOT, "scripts", "*.py")))


def _commands():
  """(name, argv, what stdout must hold) for every entry point."""
  python = sys.executable
  commands = [
      ("train.py --help", [python, helpers.TRAIN_PY, "--help"],
       ["Usage:", "--gin_file:", "--model_dir:", "--[no]dry_run:"]),
      ("train.py -h", [python, helpers.TRAIN_PY, "-h",
                       "--gin_file=does/not/exist.gin"], ["--mode:"]),
      ("train.py --helpfull", [python, helpers.TRAIN_PY, "--helpfull"],
       ["--gin_param:", "--verbosity:"]),
      ("local_slurm.sh --help",
       ["bash", os.path.join(helpers.REPO_ROOT, "scripts", "local_slurm.sh"),
        "--help"], ["usage:", "start|stop|status DIR"]),
      ("train.sbatch --help",
       ["bash", os.path.join(helpers.REPO_ROOT, "scripts", "slurm",
                             "train.sbatch"), "--help"],
       ["sbatch scripts/slurm/train.sbatch"]),
      ("sweep.sbatch --help",
       ["bash", os.path.join(helpers.REPO_ROOT, "scripts", "slurm",
                             "sweep.sbatch"), "--help"],
       ["sbatch --array"]),
  ]
  for script in SCRIPTS:
    name = os.path.basename(script)
    commands.append((f"{name} --help", [python, script, "--help"],
                     ["usage" if name == "config_reference.py" else
                      "flags:"]))
  return commands


@pytest.mark.slow
def test_every_entry_point_has_help(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  # Started together: each spends its seconds importing TensorFlow.
  running = [(name, expected, subprocess.Popen(
      argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True)) for name, argv, expected in
             _commands()]
  for name, expected, process in running:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, (name, err[-2000:])
    for text in expected:
      assert text in out, (name, text, out[:3000])
  assert len(running) == 6 + len(SCRIPTS) >= 13


def test_help_lists_the_flags_a_program_takes():
  text = usage.text("Does things.", ["trainer.cli"], shared=["gin_file"])
  assert text.startswith("Does things.\n\nflags:\n  --gin_file: ")
  assert "--[no]full_traceback:" in text and "--model_dir:" in text
  assert text.endswith("--helpfull lists absl's and TensorFlow's flags "
                       "too.\n")


@pytest.mark.parametrize("argv,asked", [
    (["p", "--x=1", "-h"], "-h"),
    (["p", "--helpfull"], "--helpfull"),
    (["p", "--", "--help"], None),
    (["p", "--helpme"], None),
])
def test_help_is_asked_by_its_flags_only(argv, asked):
  assert usage.requested(argv) == asked
