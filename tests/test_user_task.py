"""A user's own Task, in a module outside the repository, run as
docs/writing-a-task.md tells: from its own directory, with a relative
model_dir, in every mode."""

import os
import re
import textwrap

import numpy as np
import pytest

import helpers

# The documented Task, with the Model Garden hooks a user brings: a complete
# `train_step` override returning an extra scalar, and whole-eval-set
# metrics through `aggregate_logs(state, step_logs)` with `state=None` first.
USER_TASK = textwrap.dedent('''
    import gin
    import numpy as np
    import tensorflow as tf
    import tf_keras
    import trainer


    @gin.configurable
    class Regression(trainer.Task):

      def __init__(self, hidden_units: int = 16, penalty: float = 1e-3):
        self.hidden_units = hidden_units
        self.penalty = penalty

      def build_model(self):
        return tf_keras.Sequential([
            tf_keras.Input((4,)),
            tf_keras.layers.Dense(self.hidden_units, "tanh"),
            tf_keras.layers.Dense(1)])

      def build_inputs(self, training, input_context=None):
        x = tf.random.stateless_normal([200, 4], seed=[0, int(training)])
        return tf.data.Dataset.from_tensor_slices(
            (x, tf.reduce_sum(x, 1, True)))

      def build_losses(self, labels, model_outputs, aux_losses=None):
        return tf.reduce_mean(tf.square(labels - model_outputs), axis=-1)

      def build_metrics(self, training=True):
        return [tf_keras.metrics.MeanAbsoluteError("mae")]

      def train_step(self, inputs, model, optimizer, metrics=None):
        features, labels = inputs
        with tf.GradientTape() as tape:
          outputs = trainer.float32_outputs(model(features, training=True))
          loss = tf.nn.compute_average_loss(
              self.build_losses(labels, outputs))
          penalty = self.penalty * tf.add_n(
              [tf.reduce_sum(tf.square(w)) for w in model.trainable_weights])
          loss += tf.nn.scale_regularization_loss(penalty)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        self.process_metrics(metrics, labels, outputs)
        return {"loss": loss, "penalty": penalty}

      def validation_step(self, inputs, model, metrics=None):
        logs = super().validation_step(inputs, model, metrics)
        logs["errors"] = tf.abs(inputs[1] - model(inputs[0]))[:, 0]
        return logs

      def aggregate_logs(self, state, step_logs):
        if state is None:
          state = []
        state.extend(t.numpy() for t in step_logs["errors"])
        return state

      def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
        errors = np.concatenate(aggregated_logs)
        return {"examples": float(errors.size),
                "median_error": float(np.median(errors))}
''')

USER_GIN = textwrap.dedent('''
    import my_task
    experiment.task = @Regression()
    trainer.train_steps = 40
    trainer.steps_per_loop = 10
    trainer.summary_interval = 10
    trainer.checkpoint_interval = 20
    trainer.global_batch_size = 16
    trainer.eval_batch_size = 32
    runtime.distribution_strategy = "mirrored"
    runtime.num_cpu_devices = 2
''')


@pytest.fixture(scope="module")
def user_project(tmp_path_factory):
  """A directory outside the repository with the user's module and gin."""
  project = tmp_path_factory.mktemp("project")
  (project / "my_task.py").write_text(USER_TASK)
  (project / "my.gin").write_text(USER_GIN)
  return project


def _run(project, model_dir, *args):
  result = helpers.run_cli(["--gin_file=my.gin", f"--model_dir={model_dir}",
                            *args], cwd=str(project))
  assert result.returncode == 0, result.stdout[-2000:] + result.stderr
  return result.stdout


def _final_eval(stdout):
  line = [l for l in stdout.splitlines() if l.startswith("final eval |")][-1]
  fields = [f.split() for f in line.split(" | ")[1:]]
  return {name: float(value) for name, value in fields}


def test_train_resume_eval_dry_run_on_a_relative_model_dir(user_project):
  out = _run(user_project, "runs/r")
  assert "restored" not in out
  first = _final_eval(out)
  # Whole-eval-set aggregation on 2 replicas: every example once.
  assert first["examples"] == 200.0 and first["median_error"] > 0
  assert helpers.checkpoint_step(str(user_project / "runs" / "r")) == 40

  out = _run(user_project, "runs/r", "--gin_param=trainer.train_steps=60")
  assert out.count("restored") == 1, out  # One line, not two wordings.
  assert "restored checkpoint runs/r/ckpt-40 at step 40" in out
  # The run's header first: what the restore says follows it.
  assert out.splitlines()[0].startswith("run | "), out
  assert helpers.checkpoint_step(str(user_project / "runs" / "r")) == 60

  out = _run(user_project, "runs/r", "--mode=eval",
             "--gin_param=trainer.train_steps=60")
  assert _final_eval(out)["examples"] == 200.0
  out = _run(user_project, "runs/r", "--dry_run",
             "--gin_param=trainer.train_steps=60")
  assert "dry run | ok: one train step (from the checkpoint at step 60 in " \
      "runs/r)" in out
  out = _run(user_project, "runs/r", "--mode=continuous_eval",
             "--gin_param=trainer.train_steps=60",
             "--gin_param=trainer.continuous_eval_timeout=5")
  assert _final_eval(out)["examples"] == 200.0

  # The override's extra scalar is a train summary, replica-averaged.
  scalars = helpers.read_scalars(str(user_project / "runs" / "r" / "train"))
  penalties = [value for _, value in scalars["penalty"]]
  assert len(penalties) == 6 and all(0 < p < 1 for p in penalties)
  assert "gradient_norm" not in scalars  # The override returns none.
  # Written like the checkpoints beside them (0644 under umask 022).
  config = user_project / "runs" / "r" / "operative_config.gin"
  ckpt = user_project / "runs" / "r" / "ckpt-60.index"
  assert (os.stat(config).st_mode & 0o777) == (os.stat(ckpt).st_mode & 0o777)


@pytest.mark.slow
@pytest.mark.parametrize("form", ["./runs/dot", "runs/slash/", "link"])
def test_other_relative_model_dir_forms_resume(user_project, form):
  if form == "link":
    (user_project / "target").mkdir()
    os.symlink("target", user_project / "link")
  _run(user_project, form, "--gin_param=trainer.train_steps=20")
  out = _run(user_project, form, "--gin_param=trainer.train_steps=30")
  assert "at step 20" in out
  out = _run(user_project, form, "--mode=eval",
             "--gin_param=trainer.train_steps=30")
  assert _final_eval(out)["examples"] == 200.0
  directory = user_project / ("target" if form == "link" else form)
  assert helpers.checkpoint_step(str(directory)) == 30


def test_a_gin_file_imports_the_module_beside_it_from_another_directory(
    user_project, tmp_path):
  result = helpers.run_cli(
      [f"--gin_file={user_project / 'my.gin'}", "--model_dir=elsewhere",
       "--gin_param=trainer.train_steps=10"], cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert helpers.checkpoint_step(str(tmp_path / "elsewhere")) == 10


def test_final_evaluation_failure_keeps_the_trained_steps(user_project):
  (user_project / "failing_eval.py").write_text(textwrap.dedent('''
      import gin
      import my_task

      @gin.configurable
      class FailingEval(my_task.Regression):
        def reduce_aggregated_logs(self, aggregated_logs, global_step=None):
          raise RuntimeError("the evaluation broke")
  '''))
  (user_project / "failing.gin").write_text(
      "import failing_eval\n" + USER_GIN.replace("@Regression()",
                                                 "@FailingEval()"))
  result = helpers.run_cli(["--gin_file=failing.gin", "--model_dir=runs/f",
                            "--gin_param=trainer.train_steps=30"],
                           cwd=str(user_project))
  assert result.returncode == 1
  assert "the evaluation broke" in result.stderr.strip().splitlines()[-1]
  assert helpers.checkpoint_step(str(user_project / "runs" / "f")) == 30
  assert np.isfinite(list(helpers.checkpoint_weights(
      str(user_project / "runs" / "f")).values())[0]).all()


MISTAKES_MODULE = textwrap.dedent('''
    import gin
    import tensorflow as tf
    import my_task


    @gin.configurable
    class Mistaken(my_task.Regression):

      def __init__(self, mistake):
        super().__init__()
        self.mistake = mistake

      def build_inputs(self, training, input_context=None):
        dataset = super().build_inputs(training, input_context)
        if self.mistake == "batch":
          return dataset.batch(16)
        if self.mistake == "fixed_batch":
          return dataset.batch(4, drop_remainder=True)
        if self.mistake == "few_batches":
          return dataset.batch(16, drop_remainder=True)
        return dataset

      def build_losses(self, labels, model_outputs, aux_losses=None):
        losses = super().build_losses(labels, model_outputs)
        return tf.reduce_mean(losses) if self.mistake == "scalar" else losses
''')

# (name, gin lines after `import mistakes`, exit code, the error line).
MISTAKES = [
    ("batched inputs", ["experiment.task = @Mistaken()",
                        "Mistaken.mistake = 'batch'"], 2,
     "`build_inputs` returns batched data (every element has a leading "
     "dimension of unknown size: (None, 4), (None, 1)): return single "
     "examples and let the framework batch them (remove `.batch(...)`;"),
    ("inputs batched to a fixed size", ["experiment.task = @Mistaken()",
                                        "Mistaken.mistake = 'fixed_batch'"],
     2, "`build_inputs` returns batched data: the model takes inputs of "
     "shape (None, 4) but each example has shape (4, 4): return single "
     "examples"),
    ("fewer batches than a batch", ["experiment.task = @Mistaken()",
                                    "Mistaken.mistake = 'few_batches'"], 2,
     "the training dataset has 12 example(s), fewer than one batch (16); "
     "lower the batch size (its elements look like batches of 16: "
     "`build_inputs` must return single examples)."),
    ("a scalar loss", ["experiment.task = @Mistaken()",
                       "Mistaken.mistake = 'scalar'"], 2,
     "Mistaken.build_losses returned a scalar: return per-example losses, "
     "shape [batch] (drop the final mean; the framework averages over the "
     "global batch)."),
    ("a class, not an instance", ["experiment.task = @Regression"], 2,
     "`experiment.task = @Regression` passes the class; write "
     "`@Regression()` to pass an instance."),
    ("a call without @", ["experiment.task = Regression()"], 2,
     ":2: gin syntax error: `Regression` is not a value: write "
     "`@Regression()` for an instance of a configurable, or quote a string"),
]


# Each case is a train.py process (~4 s): the default suite keeps one of
# each kind (the input, the loss, the gin line), the slow stage the rest.
_SLOW_MISTAKES = {"inputs batched to a fixed size",
                  "fewer batches than a batch", "a class, not an instance"}


@pytest.mark.parametrize(
    "name,lines,code,message",
    [pytest.param(*row, marks=pytest.mark.slow) if row[0] in _SLOW_MISTAKES
     else row for row in MISTAKES], ids=[row[0] for row in MISTAKES])
def test_mistakes_in_a_users_task_are_one_line(user_project, tmp_path, name,
                                               lines, code, message):
  del name  # The test id.
  (user_project / "mistakes.py").write_text(MISTAKES_MODULE)
  gin_file = tmp_path / "mistake.gin"
  gin_file.write_text("\n".join(["import mistakes"] + lines + [
      USER_GIN.replace("experiment.task = @Regression()", "")]))
  # Run from elsewhere: the modules are found beside `my.gin`'s directory
  # only through PYTHONPATH here, the gin file being in another directory.
  result = helpers.run_cli([f"--gin_file={gin_file}", "--model_dir=run"],
                           cwd=str(tmp_path),
                           env={"PYTHONPATH": str(user_project)})
  errors = result.stderr.strip().splitlines()
  assert result.returncode == code, result.stderr[-3000:]
  assert errors[-1].startswith("train.py: error: ")
  assert message in errors[-1]
  assert "Traceback" not in result.stderr
  # Nothing written: no model_dir, or (a mistake found while tracing the
  # first step) an empty one.
  assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


def test_a_module_that_cannot_be_found_names_where_it_was_looked_for(
    user_project, tmp_path):
  gin_file = tmp_path / "typo.gin"
  gin_file.write_text("import my_taks\n")
  result = helpers.run_cli([f"--gin_file={gin_file}", "--model_dir=run"],
                           cwd=str(user_project))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"train.py: error: {gin_file}:1: cannot import: No module named "
      f"'my_taks' (looked in the working directory and beside the gin files: "
      f"{user_project}, {tmp_path}; or add its directory to PYTHONPATH)"]
  assert not (user_project / "run").exists()


_IMPORT_TYPO = ("import os\nimport numpyy\n", 2,
                "ModuleNotFoundError: No module named 'numpyy'")
_NAME_ERROR = ("import gin\n\nSTEPS = undefined_name\n", 3,
               "NameError: name 'undefined_name' is not defined")


# A train.py process each (~4 s): two of the four in the default suite.
@pytest.mark.parametrize("source,line,cause,full", [
    (*_IMPORT_TYPO, False),
    pytest.param(*_IMPORT_TYPO, True, marks=pytest.mark.slow),
    pytest.param(*_NAME_ERROR, False, marks=pytest.mark.slow),
    (*_NAME_ERROR, True),
], ids=["line-import_typo", "traceback-import_typo", "line-name_error",
        "traceback-name_error"])
def test_an_error_importing_the_users_module_names_its_type_and_line(
    tmp_path, source, line, cause, full):
  project = tmp_path / "project"
  project.mkdir()
  (project / "bad_mod.py").write_text(source)
  (project / "my.gin").write_text("import bad_mod\n")
  result = helpers.run_cli(
      ["--gin_file=my.gin", "--model_dir=run"] +
      (["--full_traceback"] if full else []), cwd=str(project))
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1] == (f"train.py: error: my.gin:1: in bad_mod (bad_mod.py:"
                       f"{line}, at import): {cause}")
  if full:  # Python's traceback first, down to the user's line.
    assert lines[0] == "Traceback (most recent call last):"
    assert f'bad_mod.py", line {line}, in <module>' in result.stderr
  else:
    assert len(lines) == 1, result.stderr
  assert not (project / "run").exists()


@pytest.mark.parametrize("source,line,cause", [
    ("import gin\nSTEPS = [1, 2\n", 2, "'[' was never closed"),
    pytest.param("import gin\n  STEPS = 1\n", 2, "unexpected indent",
                 marks=pytest.mark.slow),  # A second train.py process.
], ids=["unclosed", "indent"])
def test_a_syntax_error_in_the_users_module_is_pythons_not_gins(
    tmp_path, source, line, cause):
  project = tmp_path / "project"
  project.mkdir()
  (project / "bad_mod.py").write_text(source)
  (project / "my.gin").write_text("import bad_mod\n")
  result = helpers.run_cli(["--gin_file=my.gin", "--model_dir=run"],
                           cwd=str(project))
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      f"train.py: error: in bad_mod (bad_mod.py:{line}, at import): Python "
      f"syntax error: {cause}"]
  assert not (project / "run").exists()


def _run_with_mistake(tmp_path, correct, mistaken):
  """Trains the documented Task with `correct` replaced by `mistaken`, in
  a new project directory; returns it and the finished run."""
  project = tmp_path / "project"
  project.mkdir()
  source = USER_TASK.replace(correct, mistaken)
  assert source != USER_TASK
  (project / "my_task.py").write_text(source)
  (project / "my.gin").write_text(USER_GIN)
  return project, helpers.run_cli(["--gin_file=my.gin", "--model_dir=run"],
                                  cwd=str(project))


# A train.py process (~6 s); tests/model/test_task.py checks it
# in-process.
@pytest.mark.slow
def test_labels_that_broadcast_against_the_outputs_are_one_line(tmp_path):
  # The README's Task with labels of shape [batch] (`reduce_sum(x, 1)`)
  # against outputs [batch, 1]: `labels - outputs` is [batch, batch].
  project, result = _run_with_mistake(tmp_path, "tf.reduce_sum(x, 1, True)",
                                      "tf.reduce_sum(x, 1)")
  assert result.returncode == 2, result.stderr[-3000:]
  assert result.stderr.strip().splitlines() == [
      "train.py: error: Regression.build_losses: labels of shape [8] and "
      "outputs of shape [8, 1] broadcast into a [batch, batch] loss (each "
      "example's loss mixes every label): give the labels the outputs' "
      "shape (`labels = tf.reshape(labels, tf.shape(model_outputs))`) or "
      "drop the outputs' last axis of 1."]
  # Stopped before anything was written: no model_dir left behind, as
  # after a configuration error.
  assert not (project / "run").exists()


# A train.py process (~6 s); tests/model/test_loss_scaling.py checks it
# in-process.
@pytest.mark.slow
def test_a_loss_averaged_per_replica_is_one_line_at_the_first_step(
    tmp_path):
  # The documented Task with `tf.reduce_mean` for `compute_average_loss`,
  # on the 2 replicas of its gin file.
  project, result = _run_with_mistake(
      tmp_path, "loss = tf.nn.compute_average_loss(", "loss = tf.reduce_mean(")
  assert result.returncode == 2, result.stderr[-3000:]
  [line] = result.stderr.strip().splitlines()
  assert re.fullmatch(
      r"train.py: error: Regression.train_step's loss on the first step, "
      r"summed over 2 replicas, is [\d.]+: 2\.0\d times the global-batch mean "
      r"of build_losses on the same batch \([\d.]+\), so it is averaged over "
      r"each replica's batch and every gradient is 2 times too large; "
      r"average over the GLOBAL batch: tf.nn.compute_average_loss\("
      r"per_example_losses\) \(`trainer.check_loss_scaling=False` skips this "
      r"check\).", line), line
  assert "is your own" not in result.stdout  # Checked, so no hint.
  assert not (project / "run").exists()
