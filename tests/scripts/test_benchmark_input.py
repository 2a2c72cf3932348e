"""scripts/benchmark_input.py: the pipeline alone against training on it and
on cached batches, on fake CIFAR-10 files, in a real process; the first
test runs the command docs/precision-and-performance.md shows, the second
docs/tools.md's with the tf.data service (their blocks are marked as run
here), with shorter rounds."""

import json
import statistics
import subprocess
import sys

import pytest

import helpers


@pytest.mark.slow
def test_reports_pipeline_training_and_cached_rates():
  command = helpers.page_command("precision-and-performance.md",
                                 "benchmark_input.py")
  assert command == ["scripts/benchmark_input.py", "gin/cifar10.gin",
                     "--fake_data=5000"]
  result = subprocess.run(
      [sys.executable, *command, "--steps=20", "--rounds=2",
       "--cached_batches=4", "--gin_param=trainer.global_batch_size=32"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-2000:]
  lines = result.stdout.strip().splitlines()[-7:]
  assert lines[0].startswith("Cifar10Classification: global batch 32, 1 "
                             "replica(s), 2 round(s) of 20 steps each")
  assert lines[1].split() == ["examples/s", "input", "wait"]
  assert [line.split()[0] for line in lines[2:5]] == [
      "pipeline", "training", "training,"]
  figures = json.loads(lines[6].removeprefix("JSON "))
  for name in ("pipeline_examples_per_second",
               "training_examples_per_second", "cached_examples_per_second"):
    assert figures[name] > 0, name
  assert 0 <= figures["input_wait"] < 1
  assert len(figures["round_ratios"]) == 2
  assert all(ratio > 0 for ratio in figures["round_ratios"])
  assert figures["step_time_ratio"] == statistics.median(
      figures["round_ratios"])
  verdict = "PASS" if figures["step_time_ratio"] <= 1.05 else "FAIL"
  assert lines[5].startswith("step time, real pipeline / cached batches: "
                             f"{figures['step_time_ratio']:.3f}x (target <= "
                             f"1.05x: {verdict}); bottleneck: the ")


@pytest.mark.slow
def test_times_the_tf_data_service_beside_local_input():
  command = helpers.page_command("tools.md", "benchmark_input.py",
                                 "--data_service_workers")
  assert command == ["scripts/benchmark_input.py", "gin/cifar10.gin",
                     "--fake_data=1000", "--data_service_workers=2"]
  # In a session of its own, which its servers share: the check below
  # looks for them only, not for another test's.
  benchmark = subprocess.Popen(
      [sys.executable, *command, "--steps=10", "--rounds=2",
       "--cached_batches=4", "--gin_param=trainer.global_batch_size=32",
       "--gin_param=Cifar10Classification.heavy_augmentation=True"],
      cwd=helpers.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, start_new_session=True)
  try:
    stdout, stderr = benchmark.communicate(timeout=600)
  finally:
    if benchmark.poll() is None:
      benchmark.kill()
  assert benchmark.returncode == 0, stderr[-2000:]
  lines = stdout.strip().splitlines()[-10:]
  assert [line.rsplit(None, 2)[0] for line in lines[3:7]] == [
      "training", "training, cached", "service, 1 worker",
      "service, 2 workers"]
  figures = json.loads(lines[-1].removeprefix("JSON "))
  service = figures["data_service"]
  assert sorted(service) == ["1", "2"]
  for workers in ("1", "2"):
    assert service[workers]["examples_per_second"] > 0
    assert len(service[workers]["round_ratios"]) == 2
    assert service[workers]["step_time_vs_local"] == statistics.median(
        service[workers]["round_ratios"])
  assert lines[-2] == (
      "step time over the local pipeline's: service, 1 worker "
      f"{service['1']['step_time_vs_local']:.3f}x; service, 2 workers "
      f"{service['2']['step_time_vs_local']:.3f}x")
  # The servers it started are gone.
  listed = subprocess.run(["ps", "-eo", "sid=,args="], capture_output=True,
                          text=True, check=True).stdout.splitlines()
  assert not [line for line in listed if "data_service.py" in line and
              line.split()[0] == str(benchmark.pid)], listed


# A script process (~5 s); its sibling below keeps the bad-flag path.
@pytest.mark.slow
def test_needs_a_gin_file():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_input.py"], cwd=helpers.REPO_ROOT,
      capture_output=True, text=True, timeout=60)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "benchmark_input.py: error: give a task's gin file, e.g. "
      "gin/cifar10.gin"]


def test_a_bad_flag_names_this_script():
  result = subprocess.run(
      [sys.executable, "scripts/benchmark_input.py", "gin/mnist.gin",
       "--no_such_flag"], cwd=helpers.REPO_ROOT, capture_output=True,
      text=True, timeout=60)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "benchmark_input.py: error: Unknown command line flag 'no_such_flag'"]
