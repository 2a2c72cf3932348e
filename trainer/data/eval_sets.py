"""Named evaluation sets: their names, the names of their results, and the
settings that choose, count and judge them.

A Task's `build_inputs(training=False)` returns one dataset (the unnamed
set, evaluated as ever: results `loss`, `accuracy`, summaries in `eval/`)
or a dict of datasets by name. Every evaluation then evaluates each set
with its own fresh metrics, and names its results `<set>/<metric>`
(`clean/accuracy`) wherever a result is named: `best_checkpoint.metric`,
`early_stopping.metric`, a sweep's `--metric`, the `eval |` line, the
closing block, `eval/evaluated.json`. Each set's summaries go to its own
TensorBoard run, `eval/<set>`, under the metric's own tag, so one chart
shows one curve per set.

`trainer.held_out_sets` names sets that are evaluated and reported but
never judged (a test set): a judged metric of one of them is refused.

Nothing here builds a dataset: this module is the rules, checked where the
settings are loaded (`trainer.config`) and where the Task's sets are first
known (`trainer.data.inputs.for_mode`).
"""

import re
from typing import Mapping, Optional, Sequence, Tuple, Union

from trainer import errors

# A TensorBoard run is a directory under the log directory: one path
# component, no '/' (which would nest runs and make `<set>/<metric>`
# ambiguous), no '.' or '..', nothing a shell or another OS would mangle.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")

# `trainer.validation_steps`: one count for every set, or counts by name.
Steps = Union[int, Mapping[str, int]]


def check_name(name) -> None:
  """Raises unless `name` can be a set's name and its TensorBoard run.

  Raises:
    errors.ConfigError: Naming the set and the rule.
  """
  if not isinstance(name, str) or not _NAME.match(name):
    raise errors.ConfigError(
        f"the evaluation set name {name!r} cannot be a TensorBoard run name "
        f"(`eval/{name}`): use letters, digits, `_`, `-` and `.`, starting "
        "with a letter or a digit.")


def result_name(set_name: Optional[str], metric: str) -> str:
  """`<set>/<metric>`; the metric's own name for the unnamed set."""
  return metric if set_name is None else f"{set_name}/{metric}"


def set_of(result: str) -> Optional[str]:
  """The set a result name `<set>/<metric>` names; None without a `/`."""
  return result.split("/", 1)[0] if "/" in result else None


def check_steps(steps: Steps) -> None:
  """Checks `trainer.validation_steps`: a count, or counts by set name;
  each an integer, positive or -1 for a full pass."""
  counts = steps.items() if isinstance(steps, Mapping) else [(None, steps)]
  for name, count in counts:
    setting = ("`trainer.validation_steps`" if name is None else
               f"`trainer.validation_steps[{name!r}]`")
    if isinstance(count, bool) or not isinstance(count, int):
      raise errors.ConfigError(f"{setting} ({count!r}) must be an integer.")
    if not (count > 0 or count == -1):
      raise errors.ConfigError(
          f"{setting} ({count}) must be positive, or -1 for a full pass.")


def steps_for(steps: Steps, set_name: Optional[str]) -> int:
  """The batches `set_name` is evaluated on: its own count, the one count
  for every set, or -1 (a full pass) for a set the counts do not name."""
  if isinstance(steps, Mapping):
    return steps.get(set_name, -1)
  return steps


def check_judged(setting: str, metric: Optional[str],
                 held_out: Sequence[str]) -> None:
  """Raises if `metric`, what `setting` judges by, is a held-out set's.

  Raises:
    errors.ConfigError: Naming the setting, the metric and the set.
  """
  if metric is not None and set_of(metric) in tuple(held_out):
    raise errors.ConfigError(
        f"`{setting}` ({metric!r}) is a result of the held-out set "
        f"{set_of(metric)!r} (`trainer.held_out_sets`), which is evaluated "
        "and reported but never judged: judge by another set's result.")


def check_names(names: Sequence[str], held_out: Sequence[str],
                chosen: Optional[Sequence[str]], steps: Steps,
                judged: Optional[Mapping[str, Optional[str]]] = None) -> None:
  """Checks the sets a Task returned against the settings naming sets.

  Args:
    names: The Task's set names, or `[None]` for its one unnamed set.
    held_out: `trainer.held_out_sets`.
    chosen: `trainer.eval_sets`, None for every set.
    steps: `trainer.validation_steps`.
    judged: The metrics a run is judged by, by setting
      (`{"best_checkpoint.metric": "noisy/accuracy"}`); None set: none.

  Raises:
    errors.ConfigError: For an empty dict of sets, a name that cannot be a
      run name, a setting naming a set the Task does not return, or a
      judged metric of no set, or of a set not evaluated.
  """
  if not names:
    raise errors.ConfigError(
        "`build_inputs(training=False)` returned no evaluation set (an "
        "empty dict): return a dataset, or a dict of datasets by name.")
  named = list(names) != [None]
  for name in names if named else ():
    check_name(name)
  settings = [("trainer.held_out_sets", tuple(held_out)),
              ("trainer.eval_sets", tuple(chosen or ()))]
  if isinstance(steps, Mapping):
    settings.append(("trainer.validation_steps", tuple(steps)))
  for setting, given in settings:
    unknown = [name for name in given if name not in names]
    if not unknown:
      continue
    if not named:
      raise errors.ConfigError(
          f"`{setting}` names evaluation sets ({', '.join(map(str, given))})"
          ", but `build_inputs(training=False)` returns one unnamed dataset; "
          "return a dict of datasets by name.")
    raise errors.ConfigError(
        f"`{setting}` names {unknown[0]!r}, which is not an evaluation set "
        f"of the Task; its sets are: {', '.join(names)}.")
  for setting, metric in (judged or {}).items():
    check_metric(setting, metric, names, chosen)


def check_metric(setting: str, metric: Optional[str],
                 names: Sequence[str],
                 chosen: Optional[Sequence[str]] = None) -> None:
  """With named sets, a metric judged by must be `<set>/<metric>` of a set
  evaluated.

  The unnamed set's results are checked at the first evaluation, as ever.

  Args:
    setting: What judges by `metric` (`best_checkpoint.metric`).
    metric: The result judged by; None: nothing is.
    names: The Task's set names, or `[None]` for its one unnamed set.
    chosen: `trainer.eval_sets`, None for every set.

  Raises:
    errors.ConfigError: Naming the setting, the metric and the sets.
  """
  if metric is None or list(names) == [None]:
    return
  set_name = set_of(metric)
  if set_name not in names:
    raise errors.ConfigError(
        f"`{setting}` ({metric!r}) names no evaluation set: results are "
        f"named `<set>/<metric>` (e.g. "
        f"'{names[0]}/{metric.rsplit('/', 1)[-1]}'), and the sets are: "
        f"{', '.join(names)}.")
  if chosen is not None and set_name not in tuple(chosen):
    raise errors.ConfigError(
        f"`{setting}` ({metric!r}) is a result of the set {set_name!r}, "
        f"which `trainer.eval_sets` ({', '.join(chosen)}) leaves out: "
        "evaluate it too, or judge by a set evaluated.")


def chosen_names(names: Sequence[Optional[str]],
                 chosen: Optional[Sequence[str]]) -> Tuple[Optional[str], ...]:
  """The sets evaluated: those of `trainer.eval_sets` in the Task's order,
  or all of them."""
  if chosen is None:
    return tuple(names)
  return tuple(name for name in names if name in tuple(chosen))
