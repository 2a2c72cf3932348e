"""`model_dir/metrics.csv`: every train summary and every evaluation, one
row each, written as the run goes; an eval action and a loop hook.

The format is wide, as Keras's `CSVLogger` writes and as pandas and
spreadsheets read it at once (`pd.read_csv(path)`):

    step,wall_time,split,loss,accuracy,learning_rate,...
    100,1795860000.123,train,0.41,0.88,0.01,...
    100,1795860001.456,eval,0.37,0.9,,...

`split` is `train` (a train summary: the loss and metrics averaged over
the summary window, the learning rate, steps/s and the rest of the train
scalars), `eval` (an evaluation of the Task's one unnamed set) or
`eval/<set>` (one row per named evaluation set, its metric names without
the `<set>/` prefix), so one column holds one metric for every split
(`df[df.split == "eval"].plot(x="step", y="accuracy")`). `wall_time` is
Unix seconds, as TensorBoard's. A metric that first appears later (a
named set's, an evaluation's after train rows) adds a column: the file is
then rewritten once, atomically, with the grown header and empty cells
where a row has no value; otherwise a row is appended.

A resumed run continues the file with no duplicate or contradicting rows:
rows past the restored step (written by a run killed after its last
checkpoint, steps that run again now) are dropped when training resumes
(`restarted`) and after a rollback; a row for a step and split already
there (an evaluation made again after a restart) replaces it. A last row
cut short by a crash mid-write is dropped when the file is read.

The writer holds every row (those it read at start, those it wrote since):
a file deleted during the run is written again whole at the next row, with
a warning. A `metrics.csv` of another program (its header not ours) is
refused before training, not written over.
"""

import csv
import dataclasses
import io
import math
import os
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from trainer import console
from trainer import errors
from trainer.data import eval_sets
from trainer.loop.control import hooks as loop_hooks
from trainer.storage import files

METRICS_CSV = "metrics.csv"
# The columns of every row, before the metrics.
KEYS = ("step", "wall_time", "split")
# The columns of another program's header that its refusal shows.
_SHOWN_COLUMNS = 4


class MetricsCsv(loop_hooks.LoopHook):
  """`model_dir/metrics.csv`, kept by the training process.

  A train row comes from the reporter (`train_summary`, given to it as a
  summary function), an eval row from the eval action (`__call__`); as a
  loop hook it only drops the rows a rollback undid.
  """

  def __init__(self, model_dir: str, step_fn: Callable[[], int],
               set_names: Sequence[str] = (),
               clock: Callable[[], float] = time.time):
    """Reads the rows already in `model_dir/metrics.csv`, if any.

    Args:
      model_dir: Where the file is.
      step_fn: Returns the global step, for the eval rows.
      set_names: The named evaluation sets (() for the unnamed set).
      clock: Unix seconds, for `wall_time`; injectable for tests.
    """
    self._model_dir = model_dir
    self.path = os.path.join(model_dir, METRICS_CSV)
    self._step_fn = step_fn
    self._set_names = frozenset(set_names)
    self._clock = clock
    self._columns: List[str] = list(KEYS)
    self._rows: List[Dict[str, str]] = []
    # Whether the file should be there: read at start, or written since.
    self._on_disk = False
    torn = self._read()
    if torn:
      self._rewrite()

  def _read(self) -> bool:
    """Loads the file's header and rows; returns whether a row was torn (a
    crash mid-write) and dropped.

    Raises:
      errors.ConfigError: If the file is another program's.
    """
    found = read(self.path)
    if found.foreign_header is not None:
      # Refused rather than set aside under another name: the program that
      # wrote it (a Keras `CSVLogger`, a script) may still be writing it,
      # and a rename would move its file from under it. Refusing writes
      # nothing, loses nothing, and the way out is one `mv`.
      header = ",".join(found.foreign_header[:_SHOWN_COLUMNS]) + (
          ",..." if len(found.foreign_header) > _SHOWN_COLUMNS else "")
      raise errors.ConfigError(
          f"{self.path} is not this framework's (its header is "
          f"`{header}`, not `{','.join(KEYS)},...`), and "
          "training writes its own there: move it away, or train in another "
          "--model_dir.")
    if found.columns:
      self._on_disk = True
      self._columns = found.columns
    self._rows = found.rows
    return found.torn

  def restarted(self, step: int) -> None:
    """Drops the rows past `step`, where training (re)starts: their steps
    are trained again, and written again."""
    kept = [row for row in self._rows if int(row["step"]) <= step]
    if len(kept) != len(self._rows):
      self._rows = kept
      self._rewrite()

  def after_rollback(self, step: int) -> None:
    """The steps past `step` are gone: so are their rows."""
    self.restarted(step)

  def train_summary(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Adds the train row of `step` (the reporter's summary scalars)."""
    self._add(step, "train", scalars)

  def __call__(self, output: Mapping[str, Any]) -> None:
    """Eval action: adds the evaluation's rows, one a named set."""
    step = self._step_fn()
    by_split: Dict[str, Dict[str, Any]] = {}
    for name, value in output.items():
      set_name = eval_sets.set_of(name)
      if set_name in self._set_names:
        split, name = f"eval/{set_name}", name[len(set_name) + 1:]
      else:
        split = "eval"
      by_split.setdefault(split, {})[name] = value
    for split in sorted(by_split):
      self._add(step, split, by_split[split])

  def _add(self, step: int, split: str, values: Mapping[str, Any]) -> None:
    row = {"step": str(step), "wall_time": f"{self._clock():.3f}",
           "split": split}
    for name, number in scalars(values).items():
      # Python's shortest round-trip text; `nan`, `inf` as such.
      row[name] = repr(number) if math.isfinite(number) else str(number)
    new_columns = [name for name in row if name not in self._columns]
    replaced = [i for i, old in enumerate(self._rows)
                if (old["step"], old["split"]) == (row["step"], split)]
    if replaced:  # The same evaluation again, after a restart.
      self._rows[replaced[0]] = row
    else:
      self._rows.append(row)
    self._columns.extend(new_columns)
    if files.directory_gone(self._model_dir):
      # `model_dir` deleted under the run: the next save says so, and
      # nothing here makes it again.
      return
    if not (new_columns or replaced) and self._append(row):
      return
    lost = self._lost() if self._on_disk else None
    if self._rewrite() and lost:
      steps = [int(old["step"]) for old in self._rows]
      console.warning(
          f"{self.path} was {lost} during the run: written again whole "
          f"({len(self._rows)} rows, steps {min(steps)} to {max(steps)})")

  def _append(self, row: Mapping[str, str]) -> bool:
    """Appends `row` to the file; returns False, writing nothing, where
    there is no file or an empty one (the first row, a file deleted): the
    whole file is written then, through an atomic rewrite.

    On a URL the object is written anew whole (an object store cannot
    append): the old rows or the new, never half a row.
    """
    if files.is_url(self.path):
      if self._lost():
        return False
      line = io.StringIO()
      csv.writer(line).writerow(self._cells(row))
      files.append_text(self.path, line.getvalue())
      return True
    try:
      # Not "a": it would make a deleted file again, holding one row.
      with files.open_file(self.path, "r+") as f:
        if f.seek(0, os.SEEK_END) == 0:
          return False
        csv.writer(f).writerow(self._cells(row))
    except FileNotFoundError:
      return False
    return True

  def _lost(self) -> Optional[str]:
    """What became of the file's rows: `deleted`, `emptied`, or None
    where they are there."""
    if not files.isfile(self.path):
      return "deleted"
    return "emptied" if files.size(self.path) == 0 else None

  def _cells(self, row: Mapping[str, str]) -> List[str]:
    return [row.get(column, "") for column in self._columns]

  def _rewrite(self) -> bool:
    """Writes the whole file, atomically; returns whether it was written
    (False only where `model_dir` is gone)."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(self._columns)
    writer.writerows(self._cells(row) for row in self._rows)
    written = files.write_text(self.path, text.getvalue(),
                               root=self._model_dir)
    self._on_disk = self._on_disk or written
    return written


@dataclasses.dataclass
class Rows:
  """What `read` found in a metrics CSV.

  Attributes:
    columns: Its header; empty where the file is missing or not ours.
    rows: Its whole rows, each column's text by name.
    torn: Whether a row cut short (a crash mid-write) was dropped.
    foreign_header: The header of a file that is not ours (another
      program's CSV; `["<not UTF-8 text>"]` for a binary file); None for
      ours, an empty file or none.
  """
  columns: List[str]
  rows: List[Dict[str, str]]
  torn: bool
  foreign_header: Optional[List[str]] = None


def read(path: str) -> Rows:
  """The rows of the metrics CSV at `path`, read without writing (another
  process, a sweep, reads a running trial's file)."""
  try:
    text = files.read_text(path)
  except UnicodeDecodeError:
    return Rows([], [], False, foreign_header=["<not UTF-8 text>"])
  if text is None:
    return Rows([], [], False)
  lines = list(csv.reader(io.StringIO(text, newline="")))
  if not lines:
    return Rows([], [], False)  # Empty: nothing to keep.
  if tuple(lines[0][:len(KEYS)]) != KEYS:
    return Rows([], [], False, foreign_header=lines[0])
  columns, rows, torn = lines[0], [], False
  for cells in lines[1:]:
    if len(cells) != len(columns) or not cells[0].isdigit():
      torn = True
      continue
    rows.append(dict(zip(columns, cells)))
  return Rows(columns, rows, torn)


def last_step(model_dir: str) -> Optional[int]:
  """The last step with a row in `model_dir/metrics.csv` (how far the run
  got, by its summaries and evaluations); None before the first row."""
  steps = [int(row["step"])
           for row in read(os.path.join(model_dir, METRICS_CSV)).rows]
  return max(steps) if steps else None


def scalars(values: Mapping[str, Any]) -> Dict[str, float]:
  """The values of `values` that are one number (a Python or NumPy number,
  a scalar tensor), as floats; the rest (an image, a string) left out."""
  found = {}
  for name, value in values.items():
    array = np.asarray(value)
    if array.size == 1 and np.issubdtype(array.dtype, np.number):
      found[name] = float(array.reshape(()))
  return found
