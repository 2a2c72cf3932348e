"""`--help` for `train.py` and the scripts: usage and flags, exit code 0.

absl defines its help flags only inside `absl.app.run`, which our entry
points call after the flags and the configuration are checked (a bad one is
one line before TensorFlow starts its devices), and its help exits 1. So
every entry point asks here first: `-h`, `-?`, `--help` and `--helpshort`
print the program's docstring and its own flags, `--helpfull` every flag
absl knows (logging's and TensorFlow's too), on stdout.
"""

import sys
from typing import List, Optional, Sequence

from absl import flags

HELP_FLAGS = frozenset({"-h", "-?", "--help", "--helpshort", "--helpfull"})


def requested(argv: Sequence[str]) -> Optional[str]:
  """Returns the help flag in `argv[1:]` (before a `--`), else None."""
  for arg in argv[1:]:
    if arg == "--":
      return None
    if arg in HELP_FLAGS:
      return arg
  return None


def text(doc: str, modules: Sequence[str], full: bool = False,
         shared: Sequence[str] = ()) -> str:
  """Returns `doc` and the help of the program's flags: the flags named in
  `shared` and those defined in `modules` (absl's module names; a script's
  own flags are under its `sys.argv[0]`), or every flag when `full`."""
  values = flags.FLAGS
  if full:
    listed = values.get_help()
  else:
    defined = values.flags_by_module_dict()
    parts = [_render([values[name] for name in shared])] if shared else []
    parts += [_render(defined[module]) for module in dict.fromkeys(modules)
              if module in defined]
    listed = "\n".join(parts)
  lines: List[str] = [doc.strip(), "", "flags:", listed.rstrip()]
  if not full:
    lines += ["", "--helpfull lists absl's and TensorFlow's flags too."]
  return "\n".join(lines) + "\n"


def _render(flag_list) -> str:
  """absl's layout of each flag's help (name, help, default), by name."""
  return "\n".join(
      flags.text_wrap(f"--{'[no]' if flag.boolean else ''}{flag.name}: "
                      f"{flag.help}", indent="    ",
                      firstline_indent="  ") +
      ("" if flag.default in (None, [], "") else
       f"\n    (default: {flag.default_as_str})")
      for flag in sorted(flag_list, key=lambda flag: flag.name))


def exit_if_requested(argv: Sequence[str], doc: Optional[str],
                      shared: Sequence[str] = ()) -> None:
  """Prints the help and exits 0 if `argv` asks for it.

  Args:
    argv: The command line, program first.
    doc: The program's usage text (its module docstring).
    shared: Flags defined elsewhere that the program takes besides its own
      (`trainer.cli`'s `gin_file`, say).
  """
  asked = requested(argv)
  if asked is None:
    return
  sys.stdout.write(text(doc or "", [argv[0]], full=asked == "--helpfull",
                        shared=shared))
  sys.stdout.flush()
  sys.exit(0)
