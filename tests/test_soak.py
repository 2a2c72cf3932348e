"""Soak: 20,000 short steps of train_and_eval in one `train.py` process, with
evaluations, checkpoints and summaries on the way; the process's resident
memory may grow by less than 10% after warm-up."""

import re
import time

import pytest

import helpers

STEPS = 20000


def _rss_mib(pid):
  """Resident memory of `pid` in MiB, or None once it has exited.

  A process that exits between `poll()` and this read is a zombie whose
  status has no VmRSS line (or, once reaped, no status file at all).
  """
  try:
    with open(f"/proc/{pid}/status") as f:
      match = re.search(r"VmRSS:\s+(\d+) kB", f.read())
  except FileNotFoundError:
    return None
  return int(match.group(1)) / 1024 if match else None


@pytest.mark.slow
def test_memory_is_flat_over_20000_steps(tmp_path):
  run = helpers.TrainProcess([
      "--gin_file=gin/digits.gin", f"--gin_param=trainer.train_steps={STEPS}",
      "--gin_param=trainer.steps_per_loop=10",
      "--gin_param=trainer.summary_interval=100",
      "--gin_param=trainer.validation_interval=1000",
      "--gin_param=trainer.checkpoint_interval=1000",
      "--gin_param=trainer.global_batch_size=16",
      f"--model_dir={tmp_path}"])
  samples = []  # (step, RSS MiB)
  try:
    deadline = time.time() + 1200
    while run.process.poll() is None:
      assert time.time() < deadline, "soak run did not finish in time"
      progress = [l for l in run.lines[-20:] if l.startswith("train | step")]
      if progress:
        step = int(re.match(r"train \| step\s+(\d+)/", progress[-1]).group(1))
        rss = _rss_mib(run.process.pid)
        if rss is not None:
          samples.append((step, rss))
      time.sleep(0.5)
    assert run.finish() == 0, run.stderr[-2000:]
  finally:
    run.close()
  warm = [rss for step, rss in samples if 2000 <= step < 3000]
  late = [rss for step, rss in samples if step >= STEPS - 2000]
  assert warm and late, samples[-5:]
  growth = max(late) / max(warm) - 1
  print(f"soak | RSS after warm-up {max(warm):.0f} MiB, at the end "
        f"{max(late):.0f} MiB: {100 * growth:+.1f}%")
  assert growth < 0.10
  assert helpers.checkpoint_step(str(tmp_path)) == STEPS
