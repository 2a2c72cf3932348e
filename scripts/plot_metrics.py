"""Plots the TensorBoard scalars of one or more runs into one PNG.

For each run directory it reads the event files under `train/` and `eval/`
(a named evaluation set's under `eval/<set>/`, plotted as `<set>/<metric>`)
and draws a grid of line plots against the global step, one panel per
metric: `loss`, `accuracy`, `learning_rate`, then every other metric found,
sorted (`steps_per_second` and `examples_per_second` only with `--all`).
Train curves are solid lines, eval curves dashed with markers, one colour
per run. `learning_rate` gets a log y axis when it spans more than two
orders of magnitude.

Usage, from the repository root:
  python scripts/plot_metrics.py MODEL_DIR [MODEL_DIR ...]
      [--output=metrics.png] [--all]

It prints `METRIC: N points in M run(s)` per panel, then `wrote PATH`. A
missing directory, a directory without event files or no scalar at all is
one line on stderr and exit code 2, with nothing written. Run directories
and `--output` may be URLs (`gs://...`).
"""

import io
import math
import os
import sys
from typing import Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO_ROOT = os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))  # local-path: the repository's own file
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
import matplotlib
matplotlib.use("Agg")  # Before pyplot: no display needed.
from matplotlib import pyplot as plt
import tensorflow as tf

from trainer import errors
from trainer.report import usage
from trainer.storage import files

FLAGS = flags.FLAGS
flags.DEFINE_string("output", "metrics.png", "Path of the PNG to write.")
flags.DEFINE_bool("all", False, "Also plot `steps_per_second` and "
                  "`examples_per_second`.")

SPLITS = ("train", "eval")
FIRST_METRICS = ("loss", "accuracy", "learning_rate")
THROUGHPUT_METRICS = ("steps_per_second", "examples_per_second")
# Each panel is PANEL_SIZE inches at DPI; at most MAX_COLUMNS panels a row.
PANEL_SIZE = (4.0, 3.0)
DPI = 100
MAX_COLUMNS = 3
USAGE_EXIT_CODE = 2

# {tag: [(step, value), ...]}, sorted by step.
Scalars = Dict[str, List[Tuple[int, float]]]


def _events(path: str):
  """Yields the events of one file, up to a truncated last record.

  A file still being written may end mid-record; as TensorBoard does, what
  was read so far is kept.
  """
  try:
    yield from tf.compat.v1.train.summary_iterator(path)
  except tf.errors.DataLossError:
    return


def read_scalars(log_dir: str) -> Scalars:
  """Returns the scalar summaries of every event file directly in `log_dir`.

  A step written twice (a run resumed from an earlier checkpoint) keeps the
  value written last. Non-scalar summaries (text, histograms) are skipped.
  """
  records = []  # (wall_time, read order, tag, step, value)
  pattern = os.path.join(log_dir, "events.out.tfevents.*")
  for path in files.glob(pattern):
    for event in _events(path):
      for value in event.summary.value:
        kind = value.WhichOneof("value")
        if kind == "simple_value":
          number = value.simple_value
        elif (kind == "tensor" and
              value.metadata.plugin_data.plugin_name == "scalars"):
          array = tf.make_ndarray(value.tensor)
          if array.size != 1 or array.dtype.kind not in "biuf":
            continue
          number = array.item()
        else:
          continue
        records.append((event.wall_time, len(records), value.tag,
                        int(event.step), float(number)))
  by_step: Dict[str, Dict[int, float]] = {}
  # Wall time, not file names, orders files from several hosts or restarts.
  for _, _, tag, step, number in sorted(records):
    by_step.setdefault(tag, {})[step] = number
  return {tag: sorted(points.items()) for tag, points in by_step.items()}


def read_run(model_dir: str) -> Dict[str, Scalars]:
  """Reads the train and eval scalars of a run.

  Named evaluation sets write their summaries to runs of their own,
  `eval/<set>/`: their scalars are read as `<set>/<tag>` (`clean/accuracy`),
  as the run's results name them.

  Args:
    model_dir: A run directory, with event files under `train/`, `eval/`
      (or `eval/<set>/`) or both.

  Returns:
    `{"train": {tag: [(step, value), ...]}, "eval": {...}}`, each list
    sorted by step; a split without event files maps to `{}`.

  Raises:
    ValueError: `model_dir` is not a directory, or has no event files under
      `train/` or `eval/`.
  """
  if not files.isdir(model_dir):
    raise ValueError(f"no such directory: {model_dir}")
  log_dirs = {split: os.path.join(model_dir, split) for split in SPLITS}
  set_dirs = _set_dirs(log_dirs["eval"])
  if not any(_has_events(log_dir)
             for log_dir in list(log_dirs.values()) + list(set_dirs.values())):
    raise ValueError(f"no event files under {log_dirs['train']} or "
                     f"{log_dirs['eval']}")
  run = {split: read_scalars(log_dir) for split, log_dir in log_dirs.items()}
  for name, log_dir in set_dirs.items():
    run["eval"].update({f"{name}/{tag}": points
                        for tag, points in read_scalars(log_dir).items()})
  return run


def _has_events(log_dir: str) -> bool:
  return bool(files.glob(os.path.join(log_dir, "events.out.tfevents.*")))


def _set_dirs(eval_dir: str) -> Dict[str, str]:
  """`{set: eval_dir/set}` of each named evaluation set's run (a
  subdirectory holding event files), in name order."""
  found = {}
  for name in files.listdir(eval_dir):
    path = os.path.join(eval_dir, name)
    if files.isdir(path) and _has_events(path):
      found[name] = path
  return found


def panel_names(runs: Dict[str, Dict[str, Scalars]],
                include_all: bool = False) -> List[str]:
  """Returns the metrics to plot, in panel order.

  Args:
    runs: `{label: read_run(...)}`.
    include_all: Whether to keep `steps_per_second` and
      `examples_per_second`.
  """
  found = {tag for run in runs.values() for split in SPLITS
           for tag, points in run.get(split, {}).items() if points}
  if not include_all:
    found -= set(THROUGHPUT_METRICS)
  first = [name for name in FIRST_METRICS if name in found]
  return first + sorted(found - set(FIRST_METRICS))


def wants_log_scale(values: Sequence[float]) -> bool:
  """Whether positive `values` span more than two orders of magnitude."""
  finite = [v for v in values if math.isfinite(v)]
  return (bool(finite) and min(finite) > 0 and
          max(finite) / min(finite) > 100)


def draw_panel(ax, name: str, runs: Dict[str, Dict[str, Scalars]]) -> None:
  """Draws metric `name` of every run and split on the axes `ax`: train
  solid, eval dashed with markers, one colour per run."""
  values = []
  for run_index, (label, run) in enumerate(runs.items()):
    color = f"C{run_index % 10}"
    for split in SPLITS:
      points = run.get(split, {}).get(name)
      if not points:
        continue
      steps, split_values = zip(*points)
      values.extend(split_values)
      if split == "train":
        # A lone point needs a marker to show at all.
        style = dict(linestyle="-", marker="." if len(points) == 1 else "")
      else:
        style = dict(linestyle="--", marker="o", markersize=3)
      ax.plot(steps, split_values, color=color, label=f"{label} {split}",
              **style)
  if name == "learning_rate" and wants_log_scale(values):
    ax.set_yscale("log")
  ax.set_title(name)
  ax.set_xlabel("step")
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize="small")


def plot(runs: Dict[str, Dict[str, Scalars]], output_path: str,
         include_all: bool = False) -> List[str]:
  """Draws one panel per metric and saves the grid as a PNG.

  The image is `columns * PANEL_SIZE[0] * DPI` by `rows * PANEL_SIZE[1] *
  DPI` pixels, with `columns = min(panels, MAX_COLUMNS)`.

  Args:
    runs: `{label: read_run(...)}`, in legend order.
    output_path: Where to write the PNG (whole: `files.write_bytes`); its
      directory is created if needed.
    include_all: Whether to plot `steps_per_second` and
      `examples_per_second` too.

  Returns:
    The metric of each panel, in order.

  Raises:
    ValueError: No metric to plot.
  """
  names = panel_names(runs, include_all)
  if not names:
    raise ValueError("no scalar summaries to plot")
  columns = min(len(names), MAX_COLUMNS)
  rows = math.ceil(len(names) / columns)
  figure, axes = plt.subplots(
      rows, columns, squeeze=False, dpi=DPI,
      figsize=(columns * PANEL_SIZE[0], rows * PANEL_SIZE[1]))
  try:
    for index, name in enumerate(names):
      draw_panel(axes[index // columns][index % columns], name, runs)
    for index in range(len(names), rows * columns):
      axes[index // columns][index % columns].set_visible(False)
    figure.tight_layout()
    png = io.BytesIO()
    figure.savefig(png, dpi=DPI, format="png")
  finally:
    plt.close(figure)
  files.write_bytes(output_path, png.getvalue())
  return names


def run_labels(model_dirs: Sequence[str]) -> List[str]:
  """Returns each run's basename, or its path where basenames collide."""
  paths = [model_dir.rstrip("/") or model_dir for model_dir in model_dirs]
  basenames = [os.path.basename(path) for path in paths]
  return [path if basenames.count(name) > 1 else name
          for path, name in zip(paths, basenames)]


# Not `trainer.cli`'s: importing it would add train.py's flags to this tool.
def _fail(message: str) -> None:
  print(f"plot_metrics.py: error: {message}", file=sys.stderr, flush=True)
  sys.exit(USAGE_EXIT_CODE)


def parse_flags(argv: List[str]) -> List[str]:
  """Parses flags; a bad flag is one line on stderr and exit code 2."""
  usage.exit_if_requested(argv, __doc__)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).splitlines()[0])


def load_runs(model_dirs: Sequence[str]) -> Dict[str, Dict[str, Scalars]]:
  """Returns `{label: read_run(model_dir)}`, labels from `run_labels`."""
  return {label: read_run(model_dir)
          for label, model_dir in zip(run_labels(model_dirs), model_dirs)}


def main(argv: List[str]) -> None:
  """Plots the runs named in `argv[1:]` (flags already parsed) to `--output`.

  Unlike `scripts/benchmark.py` it does not go through `absl.app.run`, whose
  start-up initialises TensorFlow's devices (and, on machines without a GPU,
  prints a CUDA error line): reading event files needs no device, and an
  error stays the only line on stderr.
  """
  # Drops repeats, keeps order.
  model_dirs = list(dict.fromkeys(arg.rstrip("/") or arg for arg in argv[1:]))
  if not model_dirs:
    _fail("no MODEL_DIR given; usage: plot_metrics.py MODEL_DIR "
          "[MODEL_DIR ...] [--output=metrics.png] [--all]")
  # Hides summary_iterator's deprecation warning.
  tf.get_logger().setLevel("ERROR")
  try:
    for model_dir in model_dirs:
      files.check_path(model_dir, "MODEL_DIR")
    files.check_path(FLAGS.output, "--output")
    runs = load_runs(model_dirs)
  except (ValueError, errors.ConfigError) as e:
    _fail(str(e))
  except tf.errors.OpError as e:  # An unreadable event file.
    _fail(f"{type(e).__name__}: {e.message.strip().splitlines()[0]}")
  names = panel_names(runs, FLAGS.all)
  if not names:
    if panel_names(runs, include_all=True):
      _fail("only steps_per_second and examples_per_second found; pass --all "
            "to plot them")
    _fail("no scalar summaries under " + ", ".join(model_dirs))
  try:
    plot(runs, FLAGS.output, include_all=FLAGS.all)
  except OSError as e:
    _fail(f"cannot write {FLAGS.output}: {e.strerror or e}")
  except tf.errors.OpError as e:  # A URL it cannot write.
    _fail(f"cannot write {FLAGS.output}: "
          f"{e.message.strip().splitlines()[0]}")
  for name in names:
    counts = [sum(len(run[split].get(name, ())) for split in SPLITS)
              for run in runs.values()]
    print(f"{name}: {sum(counts)} points in "
          f"{sum(1 for count in counts if count)} run(s)")
  print(f"wrote {FLAGS.output}")


if __name__ == "__main__":
  main(parse_flags(sys.argv))
