"""The eval metric an action judges by: its direction and its value."""

from typing import Any, Dict, Optional

from trainer import checks
from trainer import errors


def check_direction(prefix: str, name: Optional[str],
                    higher_is_better: Optional[bool]) -> None:
  """Checks that a config naming a metric says which way is better."""
  checks.require(
      name is None or isinstance(higher_is_better, bool),
      f"`{prefix}.higher_is_better` must be True or False for metric "
      f"{name!r}.")


def value(prefix: str, name: str, output: Dict[str, Any]) -> float:
  """Returns eval result `name` of `output`, or names the results there are."""
  if name not in output:
    raise errors.ConfigError(
        f"`{prefix}.metric` ({name!r}) is not an eval result; the results "
        f"are: {', '.join(sorted(output))}.")
  return float(output[name])
