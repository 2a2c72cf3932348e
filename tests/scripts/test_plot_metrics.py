"""scripts/plot_metrics.py: event files read back, panels, PNG, CLI errors."""

import importlib.util
import os
import subprocess
import sys

from matplotlib import image as mpimg
import pytest
import tensorflow as tf

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "scripts", "plot_metrics.py")

_spec = importlib.util.spec_from_file_location("plot_metrics", SCRIPT)
plot_metrics = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot_metrics)

# Powers of two survive the float32 of the event files exactly.
ALPHA_TRAIN = {
    "loss": [(10, 2.0), (20, 1.5), (30, 1.25)],
    "accuracy": [(10, 0.25), (20, 0.5), (30, 0.75)],
    "learning_rate": [(10, 0.5), (20, 0.25), (30, 0.125)],
    "steps_per_second": [(10, 64.0), (20, 128.0), (30, 128.0)],
}
ALPHA_EVAL = {
    "loss": [(20, 1.75), (30, 1.375)],
    "accuracy": [(20, 0.375), (30, 0.625)],
}
BETA_TRAIN = {"loss": [(10, 3.0), (20, 2.5)]}


def write_events(log_dir, scalars):
  """Writes `{tag: [(step, value), ...]}` and a text summary to `log_dir`."""
  writer = tf.summary.create_file_writer(log_dir)
  with writer.as_default():
    tf.summary.text("operative_config", "    trainer.train_steps = 30", step=0)
    for tag, points in scalars.items():
      for step, value in points:
        tf.summary.scalar(tag, value, step=step)
  writer.close()


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
  """Two runs: `alpha` with train and eval, `beta` with train loss only."""
  root = tmp_path_factory.mktemp("runs")
  write_events(str(root / "alpha" / "train"), ALPHA_TRAIN)
  write_events(str(root / "alpha" / "eval"), ALPHA_EVAL)
  write_events(str(root / "beta" / "train"), BETA_TRAIN)
  return root


def run_script(*args):
  return subprocess.run([sys.executable, SCRIPT, *args], cwd=REPO_ROOT,
                        capture_output=True, text=True, timeout=120)


def test_read_run_exact_points(runs_dir):
  assert plot_metrics.read_run(str(runs_dir / "alpha")) == {
      "train": ALPHA_TRAIN, "eval": ALPHA_EVAL}
  assert plot_metrics.read_run(str(runs_dir / "beta")) == {
      "train": BETA_TRAIN, "eval": {}}


def test_read_run_resumed_step_keeps_last_value(tmp_path):
  # A restart from the step-20 checkpoint writes step 30 again, to a new file.
  write_events(str(tmp_path / "train"), {"loss": [(20, 1.0), (30, 0.5)]})
  write_events(str(tmp_path / "train"), {"loss": [(30, 0.25), (40, 0.125)]})
  assert plot_metrics.read_run(str(tmp_path))["train"] == {
      "loss": [(20, 1.0), (30, 0.25), (40, 0.125)]}


def test_read_run_keeps_what_precedes_a_truncated_record(tmp_path):
  # As a file still being written may end.
  write_events(str(tmp_path / "train"), {"loss": [(1, 1.0), (2, 0.5)]})
  (path,) = (tmp_path / "train").iterdir()
  path.write_bytes(path.read_bytes()[:-7])
  assert plot_metrics.read_run(str(tmp_path))["train"] == {"loss": [(1, 1.0)]}


def test_read_run_errors(tmp_path):
  with pytest.raises(ValueError, match="no such directory: .*missing"):
    plot_metrics.read_run(str(tmp_path / "missing"))
  (tmp_path / "train").mkdir()
  with pytest.raises(ValueError, match="no event files under .*train"):
    plot_metrics.read_run(str(tmp_path))


def test_named_eval_sets_are_read_as_set_and_metric(tmp_path):
  # Each named evaluation set is a run of its own under eval/.
  write_events(str(tmp_path / "train"), BETA_TRAIN)
  write_events(str(tmp_path / "eval" / "clean"), ALPHA_EVAL)
  write_events(str(tmp_path / "eval" / "noisy"), {"accuracy": [(20, 0.25)]})
  write_events(str(tmp_path / "eval"), {"steps_per_second": [(20, 4.0)]})
  (tmp_path / "eval" / "images").mkdir()  # PNGs, no event file.
  run = plot_metrics.read_run(str(tmp_path))
  assert run["eval"] == {"steps_per_second": [(20, 4.0)],
                         "clean/loss": ALPHA_EVAL["loss"],
                         "clean/accuracy": ALPHA_EVAL["accuracy"],
                         "noisy/accuracy": [(20, 0.25)]}
  assert plot_metrics.panel_names({"run": run}) == [
      "loss", "clean/accuracy", "clean/loss", "noisy/accuracy"]
  # A run with named sets only has event files under eval/<set>/.
  only_sets = tmp_path / "only_sets"
  write_events(str(only_sets / "eval" / "clean"), ALPHA_EVAL)
  assert plot_metrics.read_run(str(only_sets))["eval"]["clean/loss"] == (
      ALPHA_EVAL["loss"])


def test_run_labels():
  assert plot_metrics.run_labels(["runs/a", "old/a/", "runs/b"]) == [
      "runs/a", "old/a", "b"]


def test_wants_log_scale():
  assert plot_metrics.wants_log_scale([0.1, 0.05, 0.0004])  # 250x.
  assert not plot_metrics.wants_log_scale([0.1, 0.002])  # 50x.
  assert not plot_metrics.wants_log_scale([0.1, 0.0, 1e-5])
  assert not plot_metrics.wants_log_scale([])


def test_plot_panels_and_image_size(runs_dir, tmp_path):
  runs = {name: plot_metrics.read_run(str(runs_dir / name))
          for name in ("alpha", "beta")}
  width, height = plot_metrics.PANEL_SIZE
  dpi = plot_metrics.DPI

  output = str(tmp_path / "metrics.png")
  assert plot_metrics.plot(runs, output) == [
      "loss", "accuracy", "learning_rate"]
  # One row of three panels.
  assert mpimg.imread(output).shape[:2] == (height * dpi, 3 * width * dpi)

  output_all = str(tmp_path / "sub" / "all.png")
  assert plot_metrics.plot(runs, output_all, include_all=True) == [
      "loss", "accuracy", "learning_rate", "steps_per_second"]
  # Four panels: two rows of three, the last two cells left blank.
  assert mpimg.imread(output_all).shape[:2] == (2 * height * dpi,
                                                3 * width * dpi)

  with pytest.raises(ValueError, match="no scalar"):
    plot_metrics.plot({"empty": {"train": {}, "eval": {}}},
                      str(tmp_path / "empty.png"))
  assert not os.path.exists(tmp_path / "empty.png")


# A plot_metrics.py process (~7 s); test_cloud_storage runs the script
# too, the functions it calls are tested in-process above.
@pytest.mark.slow
def test_script_writes_png(runs_dir, tmp_path):
  output = str(tmp_path / "metrics.png")
  result = run_script(str(runs_dir / "alpha"), str(runs_dir / "beta"),
                      f"--output={output}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "loss: 7 points in 2 run(s)",
      "accuracy: 5 points in 1 run(s)",
      "learning_rate: 3 points in 1 run(s)",
      f"wrote {output}",
  ]
  assert mpimg.imread(output).shape[:2] == (300, 1200)


@pytest.mark.slow  # A process loading TensorFlow for one line: 5 s.
def test_script_missing_directory(runs_dir, tmp_path):
  missing = str(tmp_path / "no_such_run")
  output = tmp_path / "metrics.png"
  result = run_script(str(runs_dir / "alpha"), missing, f"--output={output}")
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1, result.stderr
  assert lines[0].startswith("plot_metrics.py: error: ")
  assert missing in lines[0]
  assert not output.exists()


def test_runs_and_output_at_a_url(tmp_path, monkeypatch):
  # TensorFlow's in-process `ram://` stands for gs://: the runs are read and
  # the PNG written there, nothing in the working directory.
  monkeypatch.chdir(tmp_path)
  root = f"ram://{tmp_path.name}"
  write_events(f"{root}/alpha/train", ALPHA_TRAIN)
  write_events(f"{root}/alpha/eval/clean", ALPHA_EVAL)
  run = plot_metrics.read_run(f"{root}/alpha")
  assert run == {"train": ALPHA_TRAIN,
                 "eval": {f"clean/{tag}": points
                          for tag, points in ALPHA_EVAL.items()}}
  output = f"{root}/plots/metrics.png"
  assert plot_metrics.plot({"alpha": run}, output) == [
      "loss", "accuracy", "learning_rate", "clean/accuracy", "clean/loss"]
  with tf.io.gfile.GFile(output, "rb") as f:
    assert mpimg.imread(f, format="png").shape[:2] == (600, 1200)
  with pytest.raises(ValueError, match=f"no such directory: {root}/beta"):
    plot_metrics.read_run(f"{root}/beta")
  assert not os.listdir(tmp_path)
