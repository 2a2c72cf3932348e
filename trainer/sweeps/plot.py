"""The metric against each swept binding: `sweep_dir/results.png`, one
panel per binding, a point per completed trial, the best one marked.

A list (`[32, 64]`, `['adam', 'sgd']`) is a choice of categories: one tick
per listed value, evenly spaced, numbers in increasing order. A range
spans its whole interval, `loguniform` on a log axis whose only labels are
the major ticks', so that they never print over each other.
"""

import io
import math
import os
from typing import Any, Dict, List, Optional, Sequence

import matplotlib
matplotlib.use("Agg")  # Before pyplot: no display needed.
# pylint: disable=g-import-not-at-top
from matplotlib import figure as figure_lib
from matplotlib import pyplot as plt
from matplotlib import ticker

from trainer.storage import files
from trainer.sweeps import space as space_lib

PNG = "results.png"
BEST = dict(marker="*", s=220, color="tab:red", edgecolors="black",
            linewidths=0.6, zorder=3)


def _numeric(values: Sequence[Any]) -> bool:
  return all(isinstance(value, (int, float)) and not isinstance(value, bool)
             for value in values)


def categories(dimension: space_lib.Dimension) -> List[Any]:
  """A choice's values in the order of its axis: numbers increasing, other
  gin text as listed."""
  values = [space_lib.plain_value(choice) for choice in dimension.choices]
  return sorted(values) if _numeric(values) else values


def _range_axis(axis, dimension: space_lib.Dimension) -> None:
  """Limits a range's axis to its interval (a little beyond, so points at
  its ends show whole); a loguniform one is a log axis."""
  low, high = dimension.low, dimension.high
  if dimension.kind == "loguniform":
    axis.set_xscale("log")
    margin = (high / low) ** 0.04
    axis.set_xlim(low / margin, high * margin)
    decades = math.log10(high / low)
    # Under two decades the powers of ten alone leave too few labels:
    # label 1, 2 and 5 of each, which still never touch.
    axis.xaxis.set_major_locator(ticker.LogLocator(
        base=10, subs=(1.0,) if decades >= 2 else (1.0, 2.0, 5.0)))
    # Every major tick labelled (its own thresholds would drop the 5s).
    axis.xaxis.set_major_formatter(ticker.LogFormatterSciNotation(
        labelOnlyBase=False, minor_thresholds=(math.inf, math.inf)))
    # Matplotlib labels minor ticks when few major ones show, at sizes
    # that overlap (`3×10⁻⁴4×10⁻⁴6×10⁻⁴`): they stay unlabelled.
    axis.xaxis.set_minor_formatter(ticker.NullFormatter())
    return
  margin = (high - low) * 0.04
  axis.set_xlim(low - margin, high + margin)
  axis.xaxis.set_major_locator(ticker.MaxNLocator(
      nbins=5, integer=dimension.kind == "int"))


def _x(dimension: space_lib.Dimension, value: Any,
       listed: Sequence[Any]) -> float:
  """Where a trial's value sits on its binding's axis."""
  if dimension.kind == "choice":  # Both are `plain_value`s of gin text.
    return float(listed.index(value))
  return float(value)


def figure(rows: Sequence[Dict[str, Any]],
           space: Sequence[space_lib.Dimension],
           metric: str) -> Optional[figure_lib.Figure]:
  """The figure of the completed rows (`report.rows`, best first); None
  when no trial has completed. The caller closes it."""
  done = [row for row in rows
          if row["state"] == "COMPLETE" and row[metric] is not None]
  if not done:
    return None
  best = done[0]
  drawn, axes = plt.subplots(1, len(space), squeeze=False,
                             figsize=(4.0 * len(space), 3.2))
  for axis, dimension in zip(axes[0], space):
    listed = categories(dimension) if dimension.kind == "choice" else []
    others = done[1:]
    if others:
      axis.scatter([_x(dimension, row[dimension.binding], listed)
                    for row in others], [row[metric] for row in others],
                   color="tab:blue", label="other completed trials")
    axis.scatter([_x(dimension, best[dimension.binding], listed)],
                 [best[metric]], label=f"best: trial {best['trial']}",
                 **BEST)
    if dimension.kind == "choice":
      axis.set_xticks(range(len(listed)), [str(value) for value in listed])
      axis.set_xlim(-0.5, len(listed) - 0.5)
    else:
      _range_axis(axis, dimension)
    axis.set_xlabel(dimension.binding)
    axis.set_ylabel(metric)
  axes[0][0].legend(loc="best", fontsize="small")
  drawn.tight_layout()
  return drawn


def write(sweep_dir: str, rows: Sequence[Dict[str, Any]],
          space: Sequence[space_lib.Dimension],
          metric: str) -> Optional[str]:
  """Plots the completed rows (`report.rows`, best first); returns the
  PNG's path, or None when no trial has completed. Written whole
  (`files.write_bytes`), at a URL too."""
  drawn = figure(rows, space, metric)
  if drawn is None:
    return None
  png = io.BytesIO()
  drawn.savefig(png, format="png")
  plt.close(drawn)
  path = os.path.join(sweep_dir, PNG)
  files.write_bytes(path, png.getvalue())
  return path
