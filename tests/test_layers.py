"""trainer/'s packages keep the layer order of .importlinter, and its other
contracts (the loop's control room above its runner room; preemption
knows no scheduler) hold."""

import os
import subprocess
import sys

import helpers


def test_the_import_layers_hold():
  lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
  result = subprocess.run([lint, "--no-cache"], cwd=helpers.REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert "Contracts: 3 kept, 0 broken." in result.stdout
