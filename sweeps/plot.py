"""The metric against each swept binding: `sweep_dir/results.png`, one
panel per binding, a point per completed trial (log scale where the
binding was swept on one)."""

import os
from typing import Any, Dict, Optional, Sequence

import matplotlib
matplotlib.use("Agg")  # Before pyplot: no display needed.
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top

from sweeps import space as space_lib

PNG = "results.png"


def _numeric(values: Sequence[Any]) -> bool:
  return all(isinstance(value, (int, float)) and not isinstance(value, bool)
             for value in values)


def _log_scale(dimension: space_lib.Dimension, values: Sequence[Any]) -> bool:
  """A log axis for loguniform ranges and for lists of positive numbers
  spanning two orders of magnitude or more."""
  if dimension.kind == "loguniform":
    return True
  return (dimension.kind == "choice" and _numeric(values) and
          min(values) > 0 and max(values) / min(values) >= 100)


def write(sweep_dir: str, rows: Sequence[Dict[str, Any]],
          space: Sequence[space_lib.Dimension],
          metric: str) -> Optional[str]:
  """Plots the completed rows (`report.rows`); returns the PNG's path, or
  None when no trial has completed."""
  done = [row for row in rows
          if row["state"] == "COMPLETE" and row[metric] is not None]
  if not done:
    return None
  figure, axes = plt.subplots(1, len(space), squeeze=False,
                              figsize=(4.0 * len(space), 3.2))
  for axis, dimension in zip(axes[0], space):
    values = [row[dimension.binding] for row in done]
    if _numeric(values):
      axis.scatter(values, [row[metric] for row in done])
      if _log_scale(dimension, [space_lib.plain_value(choice) for choice in
                                dimension.choices] or values):
        axis.set_xscale("log")
    else:  # Gin text (`@Adam`, strings): one tick per listed value.
      names = [str(space_lib.plain_value(c)) for c in dimension.choices]
      axis.scatter([names.index(str(value)) for value in values],
                   [row[metric] for row in done])
      axis.set_xticks(range(len(names)), names)
    axis.set_xlabel(dimension.binding)
    axis.set_ylabel(metric)
  figure.tight_layout()
  path = os.path.join(sweep_dir, PNG)
  temporary = path + ".tmp"
  figure.savefig(temporary, format="png")
  plt.close(figure)
  os.replace(temporary, path)
  return path
