"""scripts/sweep.py: real Optuna journal storage in a temporary directory,
real train.py processes on digits with short runs.

The space parser, the report's order and the study's identity are tested
in-process; bad input as the user meets it (one line, exit 2, nothing
written); whole sweeps (grid, kill and resume, parallel workers, a
diverging trial, pruning, HParams) in the slow tests.
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from matplotlib import image as mpimg
from matplotlib import pyplot as matplotlib_pyplot
import optuna
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import api_pb2
from tensorboard.plugins.hparams import metadata as hparams_metadata

from trainer.sweeps import checks
from trainer.sweeps import hparams
from trainer.sweeps import plot
from trainer.sweeps import report
from trainer.sweeps import space as space_lib
from trainer.sweeps import study as study_lib
from trainer.sweeps import trial_run
from trainer.sweeps import warm
from trainer import errors

import helpers

SWEEP_PY = os.path.join(helpers.REPO_ROOT, "scripts", "sweep.py")
DIGITS = "gin/digits.gin"
# About 5 s a trial on 2 cores: an evaluation every 20 steps.
SHORT = ["--gin_param=trainer.train_steps=40",
         "--gin_param=trainer.steps_per_loop=10",
         "--gin_param=trainer.summary_interval=10",
         "--gin_param=trainer.validation_interval=20",
         "--gin_param=trainer.checkpoint_interval=20"]
GRID = ["--space=optimizer.learning_rate=[0.01, 0.001]",
        "--space=trainer.global_batch_size=[32, 64]",
        "--sampler=grid", "--n_trials=4", "--metric=accuracy"]


def sweep_args(sweep_dir, *args, short=True):
  return [f"--gin_file={DIGITS}", f"--sweep_dir={sweep_dir}",
          "--poll_seconds=0.2", *(SHORT if short else []), *args]


def run_sweep(args, timeout=600):
  return subprocess.run(
      [sys.executable, SWEEP_PY, *args], cwd=helpers.REPO_ROOT,
      capture_output=True, text=True, timeout=timeout,
      env=dict(os.environ, PYTHONUNBUFFERED="1"))


def read_csv(sweep_dir):
  with open(os.path.join(sweep_dir, report.CSV)) as f:
    return list(csv.DictReader(f))


def final_metric(model_dir, metric="accuracy"):
  """The last evaluation's metric, read back from the eval event files."""
  return max(helpers.read_scalars(os.path.join(model_dir, "eval"))[metric])[1]


# A Python process importing the framework (~6 s).
@pytest.mark.slow
def test_the_framework_does_not_import_optuna():
  # Optuna is an extra: train.py must run without it. Only the sweeps, the
  # top layer, import it (and nothing below them imports the sweeps).
  found = []
  sweeps_dir = os.path.join(helpers.REPO_ROOT, "trainer", "sweeps")
  for directory, _, names in os.walk(os.path.join(helpers.REPO_ROOT,
                                                  "trainer")):
    if directory.startswith(sweeps_dir):
      continue
    for name in names:
      if name.endswith(".py"):
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as f:
          if re.search(r"^\s*(import|from) (optuna|trainer\.sweeps)\b"
                       r"|^\s*from trainer import sweeps\b", f.read(), re.M):
            found.append(os.path.relpath(path, helpers.REPO_ROOT))
  assert not found
  # train.py's whole stack loads without it.
  loaded = subprocess.run(
      [sys.executable, "-c", "import sys; from trainer import cli; "
       "print(sorted(m for m in sys.modules if m.startswith(('optuna', "
       "'trainer.sweeps'))))"],
      cwd=helpers.REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert loaded.stdout.split() == ["[]"], loaded.stderr[-2000:]


# The space.


@pytest.mark.parametrize("flag, dimension", [
    ("optimizer.learning_rate=[0.001, 0.01]",
     space_lib.Dimension("optimizer.learning_rate", "choice",
                         ("0.001", "0.01"))),
    ("optimizer.name=['adam', \"a, b\", @Adam]",
     space_lib.Dimension("optimizer.name", "choice",
                         ("'adam'", '"a, b"', "@Adam"))),
    ("optimizer.learning_rate=loguniform(1e-4, 1e-1)",
     space_lib.Dimension("optimizer.learning_rate", "loguniform",
                         low=1e-4, high=0.1)),
    ("trainer.global_batch_size=int(16, 128)",
     space_lib.Dimension("trainer.global_batch_size", "int", low=16,
                         high=128)),
    ("scope/model.dropout=uniform(0, 0.5)",
     space_lib.Dimension("scope/model.dropout", "uniform", low=0, high=0.5)),
])
def test_parse_dimension(flag, dimension):
  assert space_lib.parse_dimension(flag) == dimension


@pytest.mark.parametrize("flag, message", [
    ("optimizer.learning_rate",
     "`--space=optimizer.learning_rate` must be BINDING=VALUES, e.g. "
     "--space='optimizer.learning_rate=[0.001, 0.01]'."),
    ("learning_rate=[1, 2]", "`--space=learning_rate=[1, 2]`: "
     "`learning_rate` is not a gin binding (configurable.parameter)."),
    ("a.b=loguniform(1e-4)",
     "`--space=a.b=loguniform(1e-4)`: `loguniform` takes two numbers, low "
     "and high."),
    ("a.b=loguniform(0, 1)", "`--space=a.b=loguniform(0, 1)`: `loguniform` "
     "needs a positive low, not 0."),
    ("a.b=uniform(1, x)", "`--space=a.b=uniform(1, x)`: `x` is not a "
     "number."),
    ("a.b=uniform(2, 1)", "`--space=a.b=uniform(2, 1)`: low (2) must be "
     "below high (1)."),
    ("a.b=int(1.5, 4)", "`--space=a.b=int(1.5, 4)`: `int` takes whole "
     "numbers."),
    ("a.b=normal(0, 1)", "`--space=a.b=normal(0, 1)`: unknown range "
     "`normal`; give a list [a, b, ...], loguniform(a, b), uniform(a, b) or "
     "int(a, b)."),
    ("a.b=0.1..0.2", "`--space=a.b=0.1..0.2`: cannot parse `0.1..0.2`; give "
     "a list [a, b, ...], loguniform(a, b), uniform(a, b) or int(a, b)."),
    ("a.b=[]", "`--space=a.b=[]`: the list is empty."),
    ("a.b=[1, 1]", "`--space=a.b=[1, 1]`: the list repeats a value."),
])
def test_parse_dimension_errors(flag, message):
  with pytest.raises(errors.ConfigError) as raised:
    space_lib.parse_dimension(flag)
  assert str(raised.value) == message


def test_space_errors():
  with pytest.raises(errors.ConfigError, match="sweeps `a.b` twice"):
    space_lib.parse_space(["a.b=[1, 2]", "a.b=[3]"])
  with pytest.raises(errors.ConfigError,
                     match=r"--sampler=grid needs lists; `--space=a.b="
                     r"uniform\(0, 1\)` is a range"):
    space_lib.grid(space_lib.parse_space(["a.b=uniform(0, 1)"]))
  grid = space_lib.parse_space(["a.b=[1, 2, 3]", "c.d=['x', 'y']"])
  assert space_lib.grid_size(grid) == 6
  assert space_lib.gin_params({"a.b": "2", "c.d": "'y'", "e.f": 0.5}) == [
      "a.b=2", "c.d='y'", "e.f=0.5"]


def test_a_bad_binding_is_blamed_on_its_own_flag():
  # The typo is in the second flag: the first one's values load without it.
  space = space_lib.parse_space([
      "optimizer.learning_rate=[0.001, 0.01]",
      "DigitsClassification.hiden_units=[64, 128]"])
  with pytest.raises(errors.ConfigError) as raised:
    checks.load_trial_configs([DIGITS], [], space)
  assert str(raised.value) == (
      "`--space=DigitsClassification.hiden_units=[64, 128]`: "
      "DigitsClassification.hiden_units=64: --gin_param: Configurable "
      "'DigitsClassification' doesn't have a parameter named 'hiden_units' "
      "(did you mean 'hidden_units'?)")


# The study and the report.


def test_a_warm_python_that_could_not_load_says_why_in_the_log(
    tmp_path, monkeypatch):
  # A repository whose framework cannot be imported: the import fails
  # before the command comes, and the reason goes where the run's output
  # goes.
  (tmp_path / "trainer").mkdir()
  (tmp_path / "trainer" / "__init__.py").write_text(
      "raise ImportError('a broken install')\n")
  monkeypatch.setattr(warm, "REPO_ROOT", str(tmp_path))
  log = tmp_path / "sweep.log"
  process = warm.WarmPython(trial=True).run(["train.py"], log=str(log))
  assert process.wait(timeout=60) == 1
  assert log.read_text().splitlines()[-1] == "ImportError: a broken install"


@pytest.mark.slow  # Loads TensorFlow in a process: seconds, more under load.
def test_a_warm_python_runs_a_script_with_tensorflow_loaded(tmp_path):
  script = tmp_path / "show.py"
  script.write_text("import sys\n"
                    "print(sys.argv[1:], 'tensorflow' in sys.modules)\n")
  process = warm.WarmPython().run([str(script), "--a=1", "b"])
  output, _ = process.communicate(timeout=120)
  assert process.returncode == 0, output
  assert output.splitlines()[-1] == "['--a=1', 'b'] True"
  unused = warm.WarmPython()
  unused.close()
  assert unused._process.returncode is not None  # pylint: disable=protected-access
  assert warm.start(["sweep.py", "--sweep_dir=x", "--report"]) is None
  assert warm.start(["sweep.py", "--launcher=srun -n2"]) is None
  # A new sweep's dry run gets one.
  ahead = warm.start(["sweep.py", f"--sweep_dir={tmp_path / 'new'}"])
  assert ahead.dry_run.alive
  ahead.close()
  assert not ahead.dry_run.alive


def test_a_sweep_that_has_its_journal_starts_no_dry_run_process(tmp_path):
  # A rerun or a joining worker: its study had its dry run. The study's own
  # file name, as Optuna's storage writes it, decides.
  wanted = study_lib.identity(space_lib.parse_space(["a.b=[1, 2]"]),
                              "accuracy", "maximize", [DIGITS], [],
                              "train_and_eval")
  study_lib.open_study(str(tmp_path), None, wanted,
                       optuna.samplers.RandomSampler(),
                       optuna.pruners.NopPruner())
  assert os.path.isfile(tmp_path / warm.JOURNAL)
  for argv in (["sweep.py", f"--sweep_dir={tmp_path}", "--metric=accuracy"],
               ["sweep.py", "--sweep_dir", str(tmp_path), "--n_trials=2"]):
    ahead = warm.start(argv)
    assert ahead is not None and ahead.dry_run is None, argv
    ahead.close()
  # Where it cannot tell (another storage, a directory without a journal,
  # no --sweep_dir), the sweep counts as new, and its dry run's process
  # starts ahead (`test_a_warm_python_runs_a_script_with_tensorflow_loaded`).
  # pylint: disable=protected-access
  assert not warm._has_journal(["sweep.py", f"--sweep_dir={tmp_path}",
                                "--storage=sqlite:///x.db"])
  assert not warm._has_journal(["sweep.py",
                                f"--sweep_dir={tmp_path / 'new'}"])
  assert not warm._has_journal(["sweep.py", "--sweep_dir"])
  assert not warm._has_journal(["sweep.py", "--metric=accuracy"])


def test_trials_left_counts_those_to_run_and_to_resume():
  study = optuna.create_study()
  for state in ("COMPLETE", "PRUNED", "FAIL"):
    study.add_trial(optuna.trial.create_trial(
        state=getattr(optuna.trial.TrialState, state),
        value=1.0 if state == "COMPLETE" else None,
        intermediate_values={1: 1.0} if state == "PRUNED" else None))
  assert study_lib.trials_left(study, 3) == 0  # A sweep all done.
  assert study_lib.trials_left(study, 5) == 2
  # One a dead worker left RUNNING is resumed: it is left too.
  study.add_trial(optuna.trial.create_trial(
      state=optuna.trial.TrialState.RUNNING))
  assert study_lib.trials_left(study, 4) == 1


@pytest.mark.parametrize("url", [None, "sqlite:///{}/sweep.db"])
def test_a_study_refuses_another_space_or_metric(tmp_path, url):
  url = url and url.format(tmp_path)
  space = space_lib.parse_space(["a.b=[1, 2]"])
  wanted = study_lib.identity(space, "accuracy", "maximize", [DIGITS], [],
                              "train_and_eval")
  assert not study_lib.exists(str(tmp_path), url)
  study_lib.open_study(str(tmp_path), url, wanted,
                       optuna.samplers.RandomSampler(),
                       optuna.pruners.NopPruner())
  assert study_lib.exists(str(tmp_path), url)
  assert os.path.exists(tmp_path / ("sweep.db" if url else "study.journal"))
  other = dict(wanted, space=["a.b=[1, 3]"])
  with pytest.raises(errors.ConfigError) as raised:
    study_lib.open_study(str(tmp_path), url, other,
                         optuna.samplers.RandomSampler(),
                         optuna.pruners.NopPruner())
  assert str(raised.value) == (
      f"the sweep in {tmp_path} has --space ['a.b=[1, 2]'], not "
      "['a.b=[1, 3]']: rerun it with its own flags, or give a new "
      "--sweep_dir.")
  with pytest.raises(errors.ConfigError, match="has --metric accuracy, not "
                     "loss"):
    study_lib.open_study(str(tmp_path), url, dict(wanted, metric="loss"),
                         optuna.samplers.RandomSampler(),
                         optuna.pruners.NopPruner())


def test_report_orders_by_metric_and_names_causes(tmp_path):
  space = space_lib.parse_space(["a.b=[1, 2, 3, 4]"])
  study = optuna.create_study(direction="maximize")
  distributions = {"a.b": space[0].distribution()}
  for value, state, cause in [(0.5, "COMPLETE", ""), (None, "FAIL", "boom"),
                              (0.9, "COMPLETE", ""), (0.2, "PRUNED",
                                                      "pruned at step 20")]:
    trial = study.ask(distributions)
    trial.set_user_attr("steps", 40)
    if cause:
      trial.set_user_attr("cause", cause)
    if state == "PRUNED":
      trial.report(value, 20)
    study.tell(trial, value if state == "COMPLETE" else None,
               state=getattr(optuna.trial.TrialState, state))
  said = report.lines(study.get_trials(), space, "accuracy", "maximize",
                      [DIGITS], [], "train_and_eval", str(tmp_path))
  numbers = [int(line.split()[0]) for line in said[2:6]]
  assert numbers == [2, 0, 3, 1]
  assert said[0] == ("sweep | 4 trials: 2 COMPLETE, 1 FAIL, 1 PRUNED | "
                     "accuracy, maximize")
  assert "sweep | trial 3 PRUNED: pruned at step 20" in said
  assert said[6] == ("sweep | PRUNED trials rank after COMPLETE ones, by "
                     "their accuracy at the step they were pruned at")
  assert "sweep | trial 1 FAIL: boom" in said
  best = study.trials[2].params["a.b"]
  assert said[-1] == (
      f"best | trial 2 | accuracy 0.9000 | python train.py "
      f"--gin_file={DIGITS} --gin_param=a.b={best} --mode=train_and_eval "
      f"--model_dir={tmp_path}/trial-2")
  assert [row["trial"] for row in read_csv(str(tmp_path))] == [
      "2", "0", "3", "1"]
  # The metric against the binding: one panel, the two completed trials.
  assert said[-2] == (f"sweep | accuracy against each binding in "
                      f"{tmp_path}/results.png")
  assert mpimg.imread(str(tmp_path / "results.png")).shape[:2] == (320, 400)


# A stand-in for train.py: prints its progress to 200 steps, writes its
# evaluations record at once, then waits for the sweep's SIGTERM (answering
# as train.py does) or, with `finish`, exits 0 after a moment.
FAKE_TRAIN = """
import json, os, signal, sys, time
model_dir, reached, evaluated, finish = sys.argv[1:5]
def stop(*_):
  if reached == "200":
    print("train.py: error: preempted at step 200, the last: checkpoint "
          "saved; training is over, and only its final evaluation is left: "
          "run the same command again to make it (exit code 42)", flush=True)
  else:
    print("train.py: error: preempted at step " + reached + ": checkpoint "
          "saved; run the same command again to resume (exit code 42)",
          flush=True)
  os._exit(42)
signal.signal(signal.SIGTERM, stop)
for step in range(50, int(reached) + 1, 50):
  print(f"train | step {step:3d}/200 | 100.0 steps/s", flush=True)
losses = {"50": 0.4082, "100": 0.3, "150": 0.28, "200": 0.2561}
os.makedirs(os.path.join(model_dir, "eval"))
with open(os.path.join(model_dir, "eval", "evaluated.json.tmp"), "w") as f:
  json.dump({"results": {step: {"loss": losses[step]} for step in
                         evaluated.split(",")}}, f)
os.replace(os.path.join(model_dir, "eval", "evaluated.json.tmp"),
           os.path.join(model_dir, "eval", "evaluated.json"))
time.sleep(1.0 if finish == "1" else 60)
print("train | finished at step 200", flush=True)
"""


@pytest.mark.parametrize(
    "reached, evaluated, finish, state, value, step, cause, sweep_line", [
        # SIGTERM in the last loop: train.py's line offers the final
        # evaluation, which the sweep's line says will not come.
        ("200", "50,100,150", "0", "PRUNED", 0.4082, 200,
         "pruned at step 50, where its loss was 0.4082",
         "sweep | pruned at step 50, where its loss was 0.4082: the SIGTERM "
         "was the pruner's; the trial is over."),
        # Stopped midway: the value is still the pruned step's, not 0.3.
        ("100", "50,100", "0", "PRUNED", 0.4082, 100,
         "pruned at step 50, where its loss was 0.4082", None),
        # The final evaluation already made: no SIGTERM, complete.
        ("200", "50,100,150,200", "1", "COMPLETE", 0.2561, 200,
         "the pruner's stop at step 50 came after its final evaluation",
         None),
    ])
def test_a_pruned_trial_quotes_the_value_the_pruner_judged(
    tmp_path, reached, evaluated, finish, state, value, step, cause,
    sweep_line):
  script = tmp_path / "fake_train.py"
  script.write_text(FAKE_TRAIN)
  model_dir = tmp_path / "trial-0"
  process = trial_run.TrialProcess(
      ["python", str(script), str(model_dir), reached, evaluated, finish],
      str(model_dir), "loss", launcher=("env",))
  judged = []

  def report_fn(at, loss):
    judged.append((at, loss))
    return at == 50  # The pruner stops it at its first evaluation.

  outcome = process.run(report_fn, threading.Event(), poll_seconds=0.05)
  assert (outcome.state, outcome.value, outcome.step, outcome.cause) == (
      state, value, step, cause)
  assert judged[0] == (50, 0.4082)
  last = (model_dir / trial_run.LOG).read_text().splitlines()[-1]
  if sweep_line:
    assert last == sweep_line
  else:
    assert not last.startswith("sweep | ")


def _shown_labels(axis):
  """The x tick labels with text, major and minor, whose ticks are in view
  (after a draw)."""
  low, high = axis.get_xlim()
  return [label for label in (axis.xaxis.get_majorticklabels() +
                              axis.xaxis.get_minorticklabels())
          if label.get_text() and low <= label.get_position()[0] <= high]


def assert_apart(labels):
  """No two of the drawn `labels` touch."""
  boxes = [label.get_window_extent() for label in labels]
  assert not any(a.overlaps(b) for i, a in enumerate(boxes)
                 for b in boxes[i + 1:])


def test_results_png_has_category_axes_readable_ticks_and_the_best_marked():
  # The TPE sweep of the report: its rates fell within one decade, where
  # matplotlib labels the minor ticks, over each other.
  space = space_lib.parse_space(
      ["optimizer.learning_rate=loguniform(1e-4, 3e-2)",
       "trainer.global_batch_size=[64, 32]"])
  found = [{"trial": number, "state": "COMPLETE", "accuracy": accuracy,
            "optimizer.learning_rate": rate,
            "trainer.global_batch_size": batch}
           for number, accuracy, rate, batch in [
               (3, 0.96, 6.1e-4, 64), (0, 0.93, 4.2e-4, 32),
               (1, 0.9, 3.3e-4, 64), (2, 0.81, 2.2e-4, 32)]]
  drawn = plot.figure(found, space, "accuracy")
  drawn.canvas.draw()
  rate, batch = drawn.axes
  # The batch size is a choice: one tick per value, in order, no 30-65.
  assert [label.get_text() for label in _shown_labels(batch)] == ["32", "64"]
  assert batch.get_xlim() == (-0.5, 1.5)
  assert [list(points) for points in batch.collections[0].get_offsets()] == [
      [0.0, 0.93], [1.0, 0.9], [0.0, 0.81]]
  # The rate spans its range; only the powers of ten are labelled, apart.
  assert rate.get_xscale() == "log"
  low, high = rate.get_xlim()
  assert low < 1e-4 and 3e-2 < high < 4e-2
  shown = _shown_labels(rate)
  assert [label.get_text() for label in shown] == [
      r"$\mathdefault{10^{-4}}$", r"$\mathdefault{10^{-3}}$",
      r"$\mathdefault{10^{-2}}$"]
  assert_apart(shown)
  # The best trial: its own marker, named in the legend.
  best = batch.collections[1]
  assert best.get_offsets().tolist() == [[1.0, 0.96]]
  assert rate.collections[1].get_offsets().tolist() == [[6.1e-4, 0.96]]
  assert best.get_paths()[0] != batch.collections[0].get_paths()[0]
  assert [text.get_text() for text in rate.get_legend().get_texts()] == [
      "other completed trials", "best: trial 3"]
  matplotlib_pyplot.close(drawn)


def test_a_short_loguniform_range_still_has_readable_labels():
  space = space_lib.parse_space(["optimizer.learning_rate=loguniform(1e-3, "
                                 "5e-3)"])
  drawn = plot.figure([{"trial": 0, "state": "COMPLETE", "accuracy": 0.9,
                        "optimizer.learning_rate": 2e-3}], space, "accuracy")
  drawn.canvas.draw()
  shown = _shown_labels(drawn.axes[0])
  assert [label.get_text() for label in shown] == [
      r"$\mathdefault{10^{-3}}$", r"$\mathdefault{2\times10^{-3}}$",
      r"$\mathdefault{5\times10^{-3}}$"]
  assert_apart(shown)
  matplotlib_pyplot.close(drawn)


def test_optuna_dashboard_serves_the_sweep_journal(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  study = optuna.create_study(
      study_name=study_lib.name(sweep_dir), direction="maximize",
      storage=study_lib.open_storage(sweep_dir, None))
  for value in (0.5, 0.9):
    trial = study.ask({"a.b": optuna.distributions.FloatDistribution(0, 1)})
    study.tell(trial, value)
  port, = helpers.free_ports(1)
  # The docs' command, as the user runs it.
  server = subprocess.Popen(
      [os.path.join(os.path.dirname(sys.executable), "optuna-dashboard"),
       os.path.join(sweep_dir, study_lib.JOURNAL), f"--port={port}",
       "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)

  def get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/{path}",
                                timeout=5) as response:
      return json.load(response)

  try:
    deadline = time.time() + 60
    while True:
      try:
        studies = get("studies")["study_summaries"]
        break
      except OSError:
        assert server.poll() is None, server.communicate()[0][-2000:]
        assert time.time() < deadline, "optuna-dashboard never answered"
        time.sleep(0.2)
    assert [s["study_name"] for s in studies] == ["sweep"]
    detail = get(f"studies/{studies[0]['study_id']}")
  finally:
    server.terminate()
    server.communicate(timeout=30)
  assert [t["values"] for t in detail["trials"]] == [[0.5], [0.9]]
  assert [t["values"] for t in detail["best_trials"]] == [[0.9]]


def _hparams_content(log_dir, tag):
  accumulator = event_accumulator.EventAccumulator(log_dir)
  accumulator.Reload()
  return accumulator.PluginTagToContent(hparams_metadata.PLUGIN_NAME)[tag]


def read_experiment(log_dir):
  """The HParams experiment in `log_dir`, read by TensorBoard's reader."""
  return hparams_metadata.parse_experiment_plugin_data(
      _hparams_content(log_dir, hparams_metadata.EXPERIMENT_TAG))


def read_session(log_dir):
  """The HParams session in `log_dir`, read by TensorBoard's reader."""
  return hparams_metadata.parse_session_start_info_plugin_data(
      _hparams_content(log_dir, hparams_metadata.SESSION_START_INFO_TAG))


def test_hparams_experiment_and_sessions(tmp_path):
  space = space_lib.parse_space(["optimizer.learning_rate=[0.01, 0.001]",
                                 "model.dropout=uniform(0, 0.5)"])
  hparams.write_experiment(str(tmp_path), space, "accuracy")
  hparams.write_session(str(tmp_path / "trial-0"), "trial-0", space,
                        {"optimizer.learning_rate": "0.01",
                         "model.dropout": 0.25})
  experiment = read_experiment(str(tmp_path))
  assert [h.name for h in experiment.hparam_infos] == [
      "optimizer.learning_rate", "model.dropout"]
  assert [v.number_value for v in experiment.hparam_infos[0].domain_discrete
          .values] == [0.001, 0.01]  # TensorBoard sorts them.
  assert experiment.metric_infos[0].name.tag == "accuracy"
  assert experiment.metric_infos[0].name.group == "eval"
  session = read_session(str(tmp_path / "trial-0"))
  assert session.group_name == "trial-0"
  assert session.hparams["optimizer.learning_rate"].number_value == 0.01
  assert session.hparams["model.dropout"].number_value == 0.25


def test_an_integer_range_stays_integers_where_its_values_fit_an_axis(
    tmp_path):
  space = space_lib.parse_space(["model.layers=int(1, 8)",
                                 "trainer.global_batch_size=int(16, 512)"])
  hparams.write_experiment(str(tmp_path), space, "accuracy")
  hparams.write_session(str(tmp_path / "trial-0"), "trial-0", space,
                        {"model.layers": 3, "trainer.global_batch_size": 64})
  infos = {info.name: info for info in read_experiment(
      str(tmp_path)).hparam_infos}
  # Eight values: listed as integers, in order, one category each.
  assert infos["model.layers"].type == api_pb2.DATA_TYPE_STRING
  assert [value.string_value for value in
          infos["model.layers"].domain_discrete.values] == [
              "1", "2", "3", "4", "5", "6", "7", "8"]
  # 497 values: TensorBoard's one number type (it has no integer type).
  assert infos["trainer.global_batch_size"].type == (
      api_pb2.DATA_TYPE_FLOAT64)
  assert (infos["trainer.global_batch_size"].domain_interval.min_value,
          infos["trainer.global_batch_size"].domain_interval.max_value) == (
              16, 512)
  session = read_session(str(tmp_path / "trial-0"))
  assert session.hparams["model.layers"].string_value == "3"
  assert session.hparams["trainer.global_batch_size"].number_value == 64


def _tensorboard_hparams(log_dir):
  """The HParams experiment and session groups of `log_dir`, asked over
  HTTP of a real `tensorboard` as its dashboard asks."""
  port, = helpers.free_ports(1)
  server = subprocess.Popen(
      [os.path.join(os.path.dirname(sys.executable), "tensorboard"),
       f"--logdir={log_dir}", f"--port={port}", "--host=127.0.0.1"],
      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

  def post(path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/data/plugin/hparams/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
      return json.load(response)

  try:
    deadline = time.time() + 120
    while True:
      try:
        experiment = post("experiment", {"experimentName": ""})
        break
      except OSError:
        assert server.poll() is None, server.communicate()[0][-2000:]
        assert time.time() < deadline, "tensorboard never answered"
        time.sleep(0.5)
    groups = post("session_groups", {
        "experimentName": "", "allowedStatuses": [
            "STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE",
            "STATUS_RUNNING"],
        "colParams": [], "startIndex": 0, "sliceSize": 10})
  finally:
    server.terminate()
    server.communicate(timeout=30)
  return experiment, groups


@pytest.mark.slow  # Starts TensorBoard: seconds, more under load.
def test_tensorboard_tells_trials_apart_by_status_and_keeps_integers(
    tmp_path):
  space = space_lib.parse_space(["optimizer.learning_rate=[0.01, 0.001]",
                                 "trainer.global_batch_size=[32, 64, 128]"])
  hparams.write_experiment(str(tmp_path), space, "accuracy")
  ends = {0: ("COMPLETE", 1000.5), 1: ("FAIL", 1001.5),
          2: ("PRUNED", 1002.5), 3: None}  # Trial 3 still runs.
  for number, end in ends.items():
    model_dir = str(tmp_path / f"trial-{number}")
    hparams.write_session(model_dir, f"trial-{number}", space, {
        "optimizer.learning_rate": "0.01",
        "trainer.global_batch_size": ["32", "64", "128", "64"][number]})
    if end:
      hparams.write_session_end(model_dir, *end)
  experiment, groups = _tensorboard_hparams(str(tmp_path))
  infos = {info["name"]: info for info in experiment["hparamInfos"]}
  assert infos["trainer.global_batch_size"]["type"] == "DATA_TYPE_STRING"
  assert infos["trainer.global_batch_size"]["domainDiscrete"] == [
      "32", "64", "128"]
  assert infos["optimizer.learning_rate"]["type"] == "DATA_TYPE_FLOAT64"
  sessions = {session["name"]: (session["status"], session["endTimeSecs"],
                                group["hparams"]["trainer.global_batch_size"])
              for group in groups["sessionGroups"]
              for session in group["sessions"]}
  assert sessions == {"trial-0": ("STATUS_SUCCESS", 1000.5, "32"),
                      "trial-1": ("STATUS_FAILURE", 1001.5, "64"),
                      "trial-2": ("STATUS_UNKNOWN", 1002.5, "128"),
                      "trial-3": ("STATUS_UNKNOWN", 0.0, "64")}


# Bad input: one line, exit 2, nothing written.


# Sweep flags a user gets wrong, and the one line each gets (exit 2).
BAD_INPUTS = {
    "names nothing": (
        ["--space=optimizer.learnin_rate=[0.01, 0.001]",
         "--metric=accuracy"],
        "sweep.py: error: `--space=optimizer.learnin_rate=[0.01, 0.001]`: "
        "optimizer.learnin_rate=0.01: --gin_param: Configurable "
        "'optimizer' doesn't have a parameter named 'learnin_rate' (did "
        "you mean 'learning_rate'?)"),
    "value refused": (
        ["--space=trainer.global_batch_size=[32, 0]", "--metric=accuracy"],
        "sweep.py: error: `--space=trainer.global_batch_size=[32, 0]`: "
        "trainer.global_batch_size=0: `trainer.global_batch_size` (0) "
        "must be positive."),
    "unparsable range": (
        ["--space=optimizer.learning_rate=loguniform(1e-4)",
         "--metric=accuracy"],
        "sweep.py: error: `--space=optimizer.learning_rate=loguniform("
        "1e-4)`: `loguniform` takes two numbers, low and high."),
    "grid too large": (
        ["--space=optimizer.learning_rate=[0.01, 0.001, 0.003]",
         "--sampler=grid", "--n_trials=2", "--metric=accuracy"],
        "sweep.py: error: the grid has 3 points, more than --n_trials=2: "
        "raise --n_trials, sample it with --sampler=random or tpe, or run "
        "--n_trials of its points with --partial_grid."),
    "launcher not found": (
        ["--space=optimizer.learning_rate=[0.01, 0.001]",
         "--metric=accuracy", "--launcher=no-such-launcher -n2"],
        "sweep.py: error: --launcher='no-such-launcher -n2': "
        "no-such-launcher is not a program on PATH."),
    "held-out metric": (
        ["--space=optimizer.learning_rate=[0.01, 0.001]",
         "--metric=test/accuracy",
         "--gin_param=trainer.held_out_sets=('test',)"],
        "sweep.py: error: `--metric` ('test/accuracy') is a result of the "
        "held-out set 'test' (`trainer.held_out_sets`), which is evaluated "
        "and reported but never judged: judge by another set's result."),
    "metric not produced": (
        ["--space=optimizer.learning_rate=[0.01, 0.001]", "--metric=f1"],
        "sweep.py: error: --metric=f1 is not a result of the task's "
        "evaluation, which gives: accuracy, loss."),
}
# In the default suite: a typo in a binding, checked with the task's gin
# configuration, and a launcher, checked before any process starts ahead.
# The others load TensorFlow in three processes each (the sweep and the two
# it starts ahead), so they run with the slow tests; the range and binding
# messages are also checked in-process above (test_parse_dimension_errors,
# test_a_bad_binding_is_blamed_on_its_own_flag).
DEFAULT_BAD_INPUTS = ("names nothing",)


def _check_bad_inputs(tmp_path, names):
  # Started together: each spends its seconds importing TensorFlow.
  running = {
      name: subprocess.Popen(
          [sys.executable, SWEEP_PY,
           *sweep_args(tmp_path / name.replace(" ", "_"),
                       *BAD_INPUTS[name][0])],
          cwd=helpers.REPO_ROOT, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True)
      for name in names}
  for name, process in running.items():
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 2, (name, stderr[-2000:])
    assert stderr.strip().splitlines() == [BAD_INPUTS[name][1]], name
  assert not list(tmp_path.iterdir())


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
  _check_bad_inputs(tmp_path, DEFAULT_BAD_INPUTS)


@pytest.mark.slow
def test_more_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path):
  _check_bad_inputs(tmp_path, [name for name in BAD_INPUTS
                               if name not in DEFAULT_BAD_INPUTS])


# Whole sweeps.


@pytest.mark.slow
def test_grid_completes_best_from_event_files_and_hparams(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  result = run_sweep(sweep_args(sweep_dir, *GRID))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = result.stdout.splitlines()
  assert sum(bool(re.match(r"sweep \| trial \d start \| ", line))
             for line in lines) == 4
  ends = [line for line in lines
          if re.match(r"sweep \| trial \d COMPLETE \| accuracy 0\.\d{4} \| "
                      r"step 40 \| [\d.]+ s \| optimizer.learning_rate=",
                      line)]
  assert len(ends) == 4
  rows = read_csv(sweep_dir)
  assert [row["state"] for row in rows] == ["COMPLETE"] * 4
  assert sorted((row["optimizer.learning_rate"],
                 row["trainer.global_batch_size"]) for row in rows) == [
                     ("0.001", "32"), ("0.001", "64"), ("0.01", "32"),
                     ("0.01", "64")]
  from_events = {int(row["trial"]): final_metric(row["model_dir"])
                 for row in rows}
  for row in rows:
    assert float(row["accuracy"]) == pytest.approx(
        from_events[int(row["trial"])], abs=1e-6)
  best = max(from_events, key=from_events.get)
  assert rows[0]["trial"] == str(best)
  assert lines[-1].startswith(f"best | trial {best} | accuracy ")
  assert lines[-1].endswith(f"--model_dir={sweep_dir}/trial-{best}")
  # The best trial's command, run again, finds its run done.
  command = lines[-1].split(" | ", 3)[3].split()
  rerun = helpers.run_cli(command[2:])
  assert rerun.returncode == 0, rerun.stderr[-2000:]
  assert "resuming from ckpt-40, step 40" in rerun.stdout
  # HParams: the experiment at the top, a session per trial.
  experiment = read_experiment(sweep_dir)
  assert [h.name for h in experiment.hparam_infos] == [
      "optimizer.learning_rate", "trainer.global_batch_size"]
  for row in rows:
    session = read_session(row["model_dir"])
    assert session.group_name == f"trial-{row['trial']}"
    # A choice of integers is text, so the dashboard shows `32`, not
    # `32.000`.
    assert session.hparams["trainer.global_batch_size"].string_value == (
        row["trainer.global_batch_size"])
  # `--report` alone, and a rerun that finds nothing left to do.
  alone = run_sweep([f"--sweep_dir={sweep_dir}", "--report"])
  assert alone.returncode == 0, alone.stderr[-2000:]
  assert alone.stdout.splitlines() == lines[-9:]
  again = run_sweep(sweep_args(sweep_dir, *GRID))
  assert again.returncode == 0, again.stderr[-2000:]
  assert " start | " not in again.stdout
  assert f"sweep | {sweep_dir}: 4 of 4 trials done" in again.stdout
  # The same sweep_dir with another metric: one line, exit 2.
  before = helpers.snapshot(sweep_dir)
  other = run_sweep(sweep_args(sweep_dir, *GRID[:-1], "--metric=loss",
                               "--direction=minimize"))
  assert other.returncode == 2, other.stderr[-2000:]
  assert other.stderr.strip().splitlines() == [
      f"sweep.py: error: the sweep in {sweep_dir} has --metric accuracy, "
      "not loss: rerun it with its own flags, or give a new --sweep_dir."]
  assert helpers.snapshot(sweep_dir) == before


@pytest.mark.slow
def test_killed_sweep_resumes_the_interrupted_trial(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  # Two trials (GRID's four ran 2 more 600-step runs): trial 0 killed and
  # resumed, trial 1 run by the rerun alone.
  grid = ["--space=optimizer.learning_rate=[0.01, 0.001]", "--sampler=grid",
          "--n_trials=2", "--metric=accuracy"]
  args = sweep_args(sweep_dir, *grid, "--gin_param=trainer.train_steps=600",
                    "--gin_param=trainer.checkpoint_interval=100",
                    "--gin_param=trainer.validation_interval=200")
  first = subprocess.Popen([sys.executable, SWEEP_PY, *args],
                           cwd=helpers.REPO_ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
  log = os.path.join(sweep_dir, "trial-0", "sweep.log")
  deadline = time.time() + 180
  while time.time() < deadline:
    if os.path.exists(log) and "ckpt-100" in open(log).read():
      break
    time.sleep(0.1)
  first.send_signal(signal.SIGKILL)
  first.communicate()
  assert "finished at step" not in open(log).read()
  result = run_sweep(args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "sweep | trial 0 resume | " in result.stdout
  assert "sweep | trial 1 start | " in result.stdout
  rows = read_csv(sweep_dir)
  assert sorted(row["trial"] for row in rows) == ["0", "1"]
  assert [row["state"] for row in rows] == ["COMPLETE"] * 2
  text = open(log).read()
  assert re.search(r"resuming from ckpt-[1-9]\d*, step [1-9]", text), text
  assert text.count(": new\n") == 1
  assert text.count("finished at step 600") == 1


@pytest.mark.slow
def test_parallel_workers_run_no_trial_twice(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  result = run_sweep(sweep_args(sweep_dir, *GRID, "--parallel=2"))
  assert result.returncode == 0, result.stderr[-3000:]
  events = [re.match(r"sweep \| trial (\d) (start|COMPLETE)", line)
            for line in result.stdout.splitlines()]
  events = [(m.group(2), m.group(1)) for m in events if m]
  assert [kind for kind, _ in events[:2]] == ["start", "start"]
  assert sorted(n for kind, n in events if kind == "start") == list("0123")
  rows = read_csv(sweep_dir)
  assert [row["state"] for row in rows] == ["COMPLETE"] * 4
  assert len({(row["optimizer.learning_rate"],
               row["trainer.global_batch_size"]) for row in rows}) == 4
  for row in rows:
    text = open(os.path.join(row["model_dir"], "sweep.log")).read()
    assert text.count("run | DigitsClassification") == 1


@pytest.mark.slow
def test_two_sweep_processes_share_the_study(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  # The second starts once the first has made the study: both then run.
  first = subprocess.Popen(
      [sys.executable, SWEEP_PY, *sweep_args(sweep_dir, *GRID)],
      cwd=helpers.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  deadline = time.time() + 120
  while not os.path.exists(os.path.join(sweep_dir, "trial-0")):
    assert time.time() < deadline and first.poll() is None
    time.sleep(0.1)
  second = run_sweep(sweep_args(sweep_dir, *GRID))
  out, err = first.communicate(timeout=600)
  assert first.returncode == 0 and second.returncode == 0, (err, second.stderr)
  started = [re.findall(r"sweep \| trial (\d) start", text)
             for text in (out, second.stdout)]
  assert all(started), started
  assert sorted(started[0] + started[1]) == list("0123")
  rows = read_csv(sweep_dir)
  assert [row["state"] for row in rows] == ["COMPLETE"] * 4


@pytest.mark.slow
def test_a_diverging_trial_fails_with_its_line_and_the_sweep_goes_on(
    tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  result = run_sweep(sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.01, 1e12]",
      "--sampler=grid", "--n_trials=2", "--metric=accuracy"))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {row["optimizer.learning_rate"]: row for row in read_csv(sweep_dir)}
  assert rows["0.01"]["state"] == "COMPLETE"
  assert rows["1000000000000.0"]["state"] == "FAIL"
  cause = ("error: the training loss is not finite at step 2; no checkpoint "
           "was saved before it.")
  assert rows["1000000000000.0"]["cause"] == cause
  assert (f"sweep | trial {rows['1000000000000.0']['trial']} FAIL: {cause}"
          in result.stdout)


@pytest.mark.slow
def test_a_partial_grid_runs_n_trials_of_its_points(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  args = sweep_args(sweep_dir,
                    "--space=optimizer.learning_rate=[0.01, 0.003, 0.001]",
                    "--sampler=grid", "--n_trials=2", "--partial_grid",
                    "--metric=accuracy")
  result = run_sweep(args)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"sweep | {sweep_dir}: 0 of 2 trials done" in result.stdout
  rows = read_csv(sweep_dir)
  assert [row["state"] for row in rows] == ["COMPLETE"] * 2
  rates = {row["optimizer.learning_rate"] for row in rows}
  assert len(rates) == 2 and rates < {"0.01", "0.003", "0.001"}
  again = run_sweep(args)
  assert again.returncode == 0, again.stderr[-2000:]
  assert f"sweep | {sweep_dir}: 2 of 2 trials done" in again.stdout


@pytest.mark.slow
def test_every_trial_failing_stops_with_the_first_cause(tmp_path):
  result = run_sweep(sweep_args(
      tmp_path / "sweep", "--space=optimizer.learning_rate=[1e12, 1e13]",
      "--n_trials=5", "--stop_after_failures=2", "--metric=accuracy",
      "--sampler=random"))
  assert result.returncode == 1, result.stderr[-3000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "sweep.py: error: the first 2 trials failed; trial 0: error: the "
      "training loss is not finite at step 2; no checkpoint was saved "
      "before it.")
  assert len(read_csv(tmp_path / "sweep")) == 2


@pytest.mark.slow
def test_median_pruning_stops_a_bad_trial_early(tmp_path):
  sweep_dir = str(tmp_path / "sweep")
  # GridSampler, seed 1, takes 0.01 first: the median pruner (one trial to
  # start with) then has a curve to compare 1e-6 against.
  result = run_sweep(sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.01, 1e-06]",
      "--sampler=grid", "--seed=1", "--n_trials=2", "--metric=accuracy",
      "--pruner=median", "--pruner_startup_trials=1",
      "--gin_param=trainer.train_steps=1000",
      "--gin_param=trainer.steps_per_loop=10",
      "--gin_param=trainer.summary_interval=10",
      "--gin_param=trainer.validation_interval=100",
      "--gin_param=trainer.checkpoint_interval=100", short=False))
  assert result.returncode == 0, result.stderr[-3000:]
  rows = {row["optimizer.learning_rate"]: row for row in read_csv(sweep_dir)}
  assert rows["0.01"]["trial"] == "0", "the grid's order changed"
  assert rows["0.01"]["state"] == "COMPLETE"
  bad = rows["1e-06"]
  assert bad["state"] == "PRUNED"
  # The record, the live line and the CSV quote the value pruned at.
  judged = json.load(open(os.path.join(bad["model_dir"], "eval",
                                       "evaluated.json")))["results"]["100"]
  assert float(bad["accuracy"]) == judged["accuracy"]
  assert bad["cause"] == (f"pruned at step 100, where its accuracy was "
                          f"{judged['accuracy']:.4f}")
  assert re.search(rf"sweep \| trial 1 PRUNED \| accuracy "
                   rf"{judged['accuracy']:.4f} \| step \d+ \|",
                   result.stdout), result.stdout
  assert int(bad["steps"]) < 1000
  assert helpers.latest_step(bad["model_dir"]) >= 100


# A SLURM job array on the one-node cluster of scripts/local_slurm.sh.

SWEEP_SBATCH = os.path.join(helpers.REPO_ROOT, "scripts", "slurm",
                            "sweep.sbatch")


def _queued(env, job):
  """squeue's `STATE REASON` of `job` ('' once it has left the queue)."""
  for _ in range(30):
    listed = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"],
                            env=env, capture_output=True, text=True,
                            timeout=30)
    if listed.returncode == 0:
      return listed.stdout.strip()
    time.sleep(1)
  raise AssertionError(f"squeue failed 30 times: {listed.stderr}")


def _release_until_done(env, jobs, timeout):
  """Waits for `jobs` to leave the queue, starting a requeued one at once
  (SLURM holds it back for its begin time; 2 s after the requeue, as
  tests/distribute/test_slurm.py explains)."""
  deadline = time.time() + timeout
  for job in jobs:
    while True:
      state = _queued(env, job)
      if not state:
        break
      assert time.time() < deadline, f"job {job} still {state}"
      if state == "PENDING BeginTime":
        time.sleep(2)
        subprocess.run(["scontrol", "update", f"jobid={job}",
                        "StartTime=now"], env=env, check=True, timeout=30)
      time.sleep(0.5)


@pytest.mark.slow
@pytest.mark.serial  # The one local SLURM cluster.
def test_a_slurm_array_shares_the_sweep_and_interrupted_tasks_resume(
    slurm_env, tmp_path):
  # Task 0 is requeued (SIGTERM: preemption, `scontrol requeue`); task 1
  # gets SLURM's time-limit warning (SIGUSR1, sent the way `--signal=USR1@90`
  # sends it: to the step's processes), so its trial saves and requeues the
  # task itself. Both trials resume from their checkpoints.
  sweep_dir = tmp_path / "sweep"
  args = sweep_args(sweep_dir, *GRID, "--gin_param=trainer.train_steps=600",
                    "--gin_param=trainer.checkpoint_interval=100",
                    "--gin_param=trainer.validation_interval=200")
  submitted = subprocess.run(
      ["sbatch", "--parsable", "--array=0-1",
       f"--output={tmp_path}/task-%a.out", SWEEP_SBATCH, *args],
      cwd=helpers.REPO_ROOT, env=slurm_env, capture_output=True, text=True,
      timeout=60, check=True)
  job = submitted.stdout.strip().split(";")[0]
  outputs = [tmp_path / f"task-{task}.out" for task in (0, 1)]
  interrupted = [_trial_past_a_checkpoint(sweep_dir, output)
                 for output in outputs]
  subprocess.run(["scontrol", "requeue", f"{job}_0"], env=slurm_env,
                 check=True, timeout=30)
  subprocess.run(["scancel", "--signal=USR1", f"{job}_1"], env=slurm_env,
                 check=True, timeout=30)
  _release_until_done(slurm_env, [f"{job}_0", f"{job}_1"], timeout=400)
  texts = [output.read_text() for output in outputs]
  rows = read_csv(sweep_dir)
  assert sorted(row["trial"] for row in rows) == ["0", "1", "2", "3"], (
      "".join(texts)[-3000:])
  assert [row["state"] for row in rows] == ["COMPLETE"] * 4
  for task, number in enumerate(interrupted):
    assert f"sweep | trial {number} resume | " in "".join(texts)
    assert re.search(rf"sweep task \d+_{task} run 2 on ", texts[task])
    text = (sweep_dir / f"trial-{number}" / "sweep.log").read_text()
    assert re.search(r"resuming from ckpt-[1-9]\d*, step [1-9]", text), text
    assert text.count(": new\n") == 1
    assert text.count("finished at step 600") == 1
  time_limit = (sweep_dir / f"trial-{interrupted[1]}" / "sweep.log"
                ).read_text()
  assert re.search(r"preempted at step \d+ by SIGUSR1 \(the time limit is "
                   rf"near\): checkpoint saved; SLURM job {job}_1 requeued",
                   time_limit), time_limit[-3000:]


def _trial_past_a_checkpoint(sweep_dir, output, timeout=240) -> str:
  """Waits for a trial of the array task writing `output` to save its first
  checkpoint, unfinished; returns its number."""
  deadline = time.time() + timeout
  while True:
    assert time.time() < deadline, (
        output.read_text() if output.exists() else "no output")
    for number in re.findall(r"sweep \| trial (\d) start",
                             output.read_text() if output.exists() else ""):
      log = sweep_dir / f"trial-{number}" / "sweep.log"
      text = log.read_text() if log.exists() else ""
      if "ckpt-100" in text and "finished at step" not in text:
        return number
    time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.serial  # The one local SLURM cluster.
def test_a_trial_runs_multi_worker_under_srun(slurm_env, tmp_path):
  # One array task of 2 SLURM tasks: the sweep is one of them, each trial
  # a step of 2 workers (`--launcher`), as docs/sweeps.md shows.
  sweep_dir = tmp_path / "sweep"
  args = sweep_args(
      sweep_dir, "--space=optimizer.learning_rate=[0.01]", "--n_trials=1",
      "--metric=accuracy", "--launcher=srun --ntasks=2 --overlap",
      "--gin_param=runtime.distribution_strategy='multi_worker_mirrored'")
  output = tmp_path / "task.out"
  submitted = subprocess.run(
      ["sbatch", "--parsable", "--ntasks=2", f"--output={output}",
       SWEEP_SBATCH, *args], cwd=helpers.REPO_ROOT, env=slurm_env,
      capture_output=True, text=True, timeout=60, check=True)
  job = submitted.stdout.strip().split(";")[0]
  _release_until_done(slurm_env, [job], timeout=300)
  text = output.read_text()
  rows = read_csv(sweep_dir)
  assert [row["state"] for row in rows] == ["COMPLETE"], text[-3000:]
  log = (sweep_dir / "trial-0" / "sweep.log").read_text()
  assert sorted(re.findall(r"2 workers on \S+, this is worker (\d)", log)) == [
      "0", "1"], log[-3000:]
  assert "multi_worker_mirrored, 2 replicas on 2 workers" in log
  assert float(rows[0]["accuracy"]) == pytest.approx(
      final_metric(sweep_dir / "trial-0"), abs=1e-6)
  assert re.search(r"^best \| trial 0 \| accuracy [\d.]+ \| srun --ntasks=2 "
                   r"--overlap \S*python\S* train.py ", text, re.MULTILINE), (
                       text[-2000:])
