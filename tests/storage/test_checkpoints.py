"""Restoring with fallback past damaged checkpoints, and `_temp` cleanup,
on real checkpoints written by training runs."""

import os
import re

import pytest
import tensorflow as tf
import tf_keras

import trainer
from trainer import errors
from trainer import experiment
from trainer.storage import checkpoint_verify
from trainer.storage import checkpoints

from tasks import digits
from tasks import digits_pipeline

import helpers
import ram_urls


def _config(train_steps):
  return trainer.TrainerConfig(train_steps=train_steps, steps_per_loop=10,
                               summary_interval=10, checkpoint_interval=10,
                               global_batch_size=32, max_to_keep=5)


def _train(model_dir, train_steps, task=None):
  experiment.run(task or helpers.LinearRegression(), "train", model_dir,
                 trainer.RuntimeConfig(seed=0), _config(train_steps))


class _AdamRegression(helpers.LinearRegression):
  """Adam, whose slots a restore reads only when the first step makes
  them."""

  def create_optimizer(self, settings):
    del settings
    return tf_keras.optimizers.legacy.Adam(0.01)


def _truncate(prefix):
  path = prefix + ".data-00000-of-00001"
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _delete_data(prefix):
  os.remove(prefix + ".data-00000-of-00001")


def _flip_bytes(prefix):
  path = prefix + ".data-00000-of-00001"
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(0, len(data), 7):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


def _read(path):
  with open(path, "rb") as f:
    return f.read()


@pytest.mark.parametrize("damage", [_truncate, _delete_data, _flip_bytes])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path, capfd, damage):
  model_dir = str(tmp_path)
  _train(model_dir, 20)
  at_10 = helpers.checkpoint_numbers(os.path.join(model_dir, "ckpt-10"))
  damage(os.path.join(model_dir, "ckpt-20"))

  _train(model_dir, 30)
  out = capfd.readouterr().out
  assert f"checkpoint | cannot restore {model_dir}/ckpt-20" in out
  assert (f"checkpoint | restored {model_dir}/ckpt-10 instead of the damaged "
          "ckpt-20") in out
  assert "restored checkpoint" in out and "at step 10" in out
  # It resumed from step 10 (the weights there), retrained 20 and 30.
  assert helpers.checkpoint_step(model_dir) == 30
  assert at_10["global_step/.ATTRIBUTES/VARIABLE_VALUE"] == 10
  # The good checkpoint was not deleted.
  assert os.path.exists(os.path.join(model_dir, "ckpt-10.index"))


def test_resume_after_fallback_matches_an_undamaged_run(tmp_path):
  straight = str(tmp_path / "straight")
  _train(straight, 30)
  damaged = str(tmp_path / "damaged")
  _train(damaged, 20)
  _flip_bytes(os.path.join(damaged, "ckpt-20"))
  _train(damaged, 30)
  assert helpers.max_weight_difference(
      helpers.checkpoint_weights(damaged),
      helpers.checkpoint_weights(straight)) == 0.0


def _assert_fell_back(lines, model_dir, slot, shard_bytes, task_name):
  """`lines` (a run's output) begin with the run's header, resuming from
  ckpt-10, then the restore's lines: ckpt-20 is damaged at `slot`."""
  prefix = os.path.join(model_dir, "ckpt-20")
  header = [line for line in lines if line.startswith("run | ")]
  assert lines[:len(header)] == header, lines
  assert header[0] == (f"run | {task_name}, train in {model_dir}: resuming "
                       "from ckpt-10, step 10")
  lines = lines[len(header):]
  assert re.fullmatch(
      re.escape(f"checkpoint | cannot restore {prefix} (DataLossError: {slot} "
                f"in shard 0 ({shard_bytes} bytes): Checksum does not match: "
                "stored ")
      + r"\d+ vs\. calculated on the restored bytes \d+\)", lines[0]), lines
  assert lines[1:3] == [
      f"checkpoint | restored {model_dir}/ckpt-10 instead of the damaged "
      "ckpt-20 (kept as ckpt-20-damaged)",
      f"restored checkpoint {model_dir}/ckpt-10 at step 10"]


def test_a_damaged_optimizer_slot_falls_back_at_restore(tmp_path, capfd):
  # The slot is read only when the first step makes it: the restore must
  # check it first, or the step fails on every run.
  straight = str(tmp_path / "straight")
  _train(straight, 30, _AdamRegression())
  model_dir = str(tmp_path / "damaged")
  _train(model_dir, 20, _AdamRegression())
  slot = "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/optimizer/m"
  prefix = os.path.join(model_dir, "ckpt-20")
  index = _read(prefix + ".index")
  damaged = helpers.flip_tensor(prefix, slot + "/.ATTRIBUTES/VARIABLE_VALUE")
  capfd.readouterr()

  _train(model_dir, 30, _AdamRegression())
  _assert_fell_back(capfd.readouterr().out.splitlines(), model_dir, slot,
                    128, "_AdamRegression")
  # It trained on from step 10, as if nothing had happened: every weight
  # and slot.
  assert helpers.max_weight_difference(
      helpers.checkpoint_numbers(os.path.join(model_dir, "ckpt-30")),
      helpers.checkpoint_numbers(os.path.join(straight, "ckpt-30"))) == 0.0
  # The damaged files are kept as they were, out of the way of the new save
  # of step 20.
  assert _read(prefix + "-damaged.data-00000-of-00001") == damaged
  assert _read(prefix + "-damaged.index") == index
  assert helpers.checkpoint_step(prefix) == 20


def test_verify_reads_only_what_a_restore_of_its_roots_reads(tmp_path):
  model_dir = str(tmp_path)
  _train(model_dir, 20, _AdamRegression())
  prefix = os.path.join(model_dir, "ckpt-20")
  helpers.flip_tensor(prefix,
                     "model/layer_with_weights-0/kernel/.OPTIMIZER_SLOT/"
                     "optimizer/v/.ATTRIBUTES/VARIABLE_VALUE")
  # An evaluation restores no optimizer, so reads none of its slots.
  checkpoint_verify.verify(prefix, {"model", "global_step"})
  with pytest.raises(tf.errors.DataLossError,
                     match=r"^model/layer_with_weights-0/kernel/"
                     r"\.OPTIMIZER_SLOT/optimizer/v in shard 0 \(128 bytes\): "
                     r"Checksum does not match"):
    checkpoint_verify.verify(prefix, {"model", "global_step", "optimizer"})
  with pytest.raises(tf.errors.DataLossError, match="OPTIMIZER_SLOT"):
    checkpoint_verify.verify(prefix)


def test_no_restorable_checkpoint_is_one_error_and_deletes_nothing(tmp_path):
  model_dir = str(tmp_path)
  _train(model_dir, 20)
  for prefix in ("ckpt-10", "ckpt-20"):
    _delete_data(os.path.join(model_dir, prefix))
  before = helpers.snapshot(model_dir)
  with pytest.raises(trainer.ConfigError,
                     match=r"^no checkpoint in \S+ can be restored \(tried "
                     r"ckpt-20, ckpt-10\)\.$"):
    _train(model_dir, 30)
  assert helpers.snapshot(model_dir) == before


def test_lost_peers_are_named_and_no_older_checkpoint_is_blamed(
    tmp_path, monkeypatch, capfd):
  """What a worker whose chief is gone sees: TensorFlow's collectives
  aborted. It is said once; older, sound checkpoints are not tried, and
  nothing is set aside as damaged."""
  model_dir = str(tmp_path)
  _train(model_dir, 20)
  tried = []

  def peers_gone(checkpoint, path, *args):
    del checkpoint, args
    tried.append(os.path.basename(path))
    raise tf.errors.UnavailableError(
        None, None, "Collective ops is aborted by: Socket closed\n"
        "Additional GRPC error information ...")

  monkeypatch.setattr(checkpoints, "_restore_one", peers_gone)
  before = helpers.snapshot(model_dir)
  with pytest.raises(trainer.RunError) as raised:
    _train(model_dir, 30)
  message = str(raised.value)
  assert "\n" not in message
  assert re.match(
      r"the other workers of this cluster are gone while restoring \S+/"
      r"ckpt-20 \(UnavailableError: Collective ops is aborted by: Socket "
      r"closed\): the checkpoint is not blamed", message), message
  assert tried == ["ckpt-20"]
  assert helpers.snapshot(model_dir) == before
  assert "cannot restore" not in capfd.readouterr().out


def test_interrupted_save_folders_are_removed(tmp_path):
  model_dir = str(tmp_path)
  _train(model_dir, 10)
  # What a save killed midway leaves: TensorFlow writes shards into
  # `<prefix>_temp/` and renames them when the save completes.
  leftover = tmp_path / "ckpt-20_temp"
  leftover.mkdir()
  (leftover / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"x")
  assert checkpoints.remove_interrupted_saves(
      model_dir, [checkpoints.SAVES]) == [str(leftover)]
  assert not leftover.exists()
  assert os.path.exists(os.path.join(model_dir, "ckpt-10.index"))
  # A training run cleans up on start.
  leftover.mkdir()
  _train(model_dir, 20)
  assert not leftover.exists()


def test_each_role_removes_the_leftovers_of_its_own_writes(tmp_path):
  model_dir = str(tmp_path)
  _train(model_dir, 10)
  trainers = [tmp_path / "ckpt-20_temp",
              tmp_path / "export" / ".tmp-1500-0a1b2c3d",
              tmp_path / ".tmp-operative_config.gin-abc.part"]
  evaluators = [tmp_path / "best" / "ckpt-500_temp",
                tmp_path / "best" / "export" / ".tmp-300-0a1b2c3d",
                tmp_path / "best" / "export" / ".tmp-300-0a1b2c3d.old",
                tmp_path / "best" / ".tmp-best.json-y.part",
                tmp_path / "eval" / ".tmp-evaluated.json-x.part",
                tmp_path / ".tmp-early_stopping.json-z.part"]
  for path in trainers + evaluators:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".part"):
      path.write_text("{")
    else:
      path.mkdir()
      (path / "data").write_bytes(b"x")
  kept = [tmp_path / "best" / "ckpt-400.index", tmp_path / "best" / "best.json",
          tmp_path / "export" / "1000" / "saved_model.pb"]
  for path in kept:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("kept")
  # A trainer beside a running evaluator leaves the evaluator's writes alone.
  removed = checkpoints.remove_interrupted_saves(
      model_dir, [checkpoints.SAVES, "operative_config.gin", "export"])
  assert sorted(removed) == sorted(str(p) for p in trainers)
  assert all(path.exists() for path in evaluators)
  removed = checkpoints.remove_interrupted_saves(
      model_dir, ["best", "eval", "early_stopping.json"])
  assert sorted(removed) == sorted(str(p) for p in evaluators)
  assert all(path.exists() for path in kept)
  assert os.path.exists(os.path.join(model_dir, "ckpt-10.index"))


def test_a_checkpoint_without_input_position_restores_the_rest(tmp_path,
                                                               capsys):
  # Saved as a parameter-server chief saves: no iterator.
  weights = tf.Variable([1.0, 2.0])
  step = tf.Variable(7, dtype=tf.int64)
  tf.train.CheckpointManager(
      tf.train.Checkpoint(model=weights, global_step=step), str(tmp_path),
      3).save(checkpoint_number=7)
  # Restored by a run that saves its iterator.
  restored_weights = tf.Variable([0.0, 0.0])
  restored_step = tf.Variable(0, dtype=tf.int64)
  iterator = iter(tf.data.Dataset.range(5))
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=restored_weights, global_step=restored_step,
                          **{checkpoints.INPUT_POSITION: iterator}),
      str(tmp_path), 3)
  assert checkpoints.restore(manager) == str(tmp_path / "ckpt-7")
  assert restored_weights.numpy().tolist() == [1.0, 2.0]
  assert int(restored_step.numpy()) == 7
  assert int(next(iterator).numpy()) == 0  # From the start.
  # A run resumed with "skip" saves none either: the line says so.
  assert ("input | ckpt-7 holds no input position (its run checkpointed "
          "none: parameter servers, several workers, the tf.data service, "
          "`trainer.input_position` \"skip\" or \"restart\"): the training "
          "input starts from its first batch; `trainer.input_position = "
          "\"skip\"` skips the batches trained on instead"
          in capsys.readouterr().out.splitlines())
  # Anything else missing is still a model mismatch.
  other = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=restored_weights, global_step=restored_step,
                          head=tf.Variable(0.0)), str(tmp_path), 3)
  with pytest.raises(trainer.ConfigError, match="does not fit this model"):
    checkpoints.restore(other)


def _saved_with_input(directory, dataset, steps):
  """Saves `ckpt-<step>` for each of `steps`, with an iterator of
  `dataset` read one element further each time."""
  iterator = iter(dataset)
  step = tf.Variable(0, dtype=tf.int64)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(global_step=step,
                          **{checkpoints.INPUT_POSITION: iterator}),
      directory, 5)
  for number in steps:
    next(iterator)
    step.assign(number)
    manager.save(checkpoint_number=number)


def _manager_with_input(directory, dataset):
  return tf.train.CheckpointManager(
      tf.train.Checkpoint(global_step=tf.Variable(0, dtype=tf.int64),
                          **{checkpoints.INPUT_POSITION: iter(dataset)}),
      directory, 5)


def test_an_input_position_of_another_pipeline_is_one_error_not_damage(
    tmp_path, capsys):
  directory = str(tmp_path)
  _saved_with_input(directory, tf.data.Dataset.range(10).shuffle(4, seed=1),
                    (10, 20))
  before = helpers.snapshot(directory)
  # The same elements through another pipeline: no shuffle.
  with pytest.raises(errors.InputMismatch) as raised:
    checkpoints.restore(_manager_with_input(directory,
                                            tf.data.Dataset.range(10)))
  assert str(raised.value) == (
      f"checkpoint {directory}/ckpt-20 holds the position of another "
      "training input pipeline (TensorFlow cannot restore its iterator into "
      "this run's: it fails at Iterator::Root::Prefetch::Range): resume "
      "without that position, with `trainer.input_position = \"skip\"` (this "
      "input read anew, past the batches trained on; keep it for later "
      "resumes of this run) or `\"restart\"` (this input from its first "
      "batch).")
  # Not tried as damage: no older checkpoint, nothing renamed.
  assert "cannot restore" not in capsys.readouterr().out
  assert helpers.snapshot(directory) == before
  # Still restorable by the pipeline it was saved from.
  assert checkpoints.restore(_manager_with_input(
      directory, tf.data.Dataset.range(10).shuffle(4, seed=1))) == (
          f"{directory}/ckpt-20")


def test_a_damaged_input_position_still_falls_back(tmp_path, capsys):
  directory = str(tmp_path)
  dataset = tf.data.Dataset.range(10).shuffle(4, seed=1)
  _saved_with_input(directory, dataset, (10, 20))
  _flip_bytes(os.path.join(directory, "ckpt-20"))
  assert checkpoints.restore(_manager_with_input(directory, dataset)) == (
      f"{directory}/ckpt-10")
  assert (f"checkpoint | restored {directory}/ckpt-10 instead of the "
          "damaged ckpt-20 (kept as ckpt-20-damaged)"
          in capsys.readouterr().out)


def test_the_optimizer_wrappers_a_checkpoint_holds_are_read_off_its_keys():
  keys = ["optimizer/ema_base_optimizer/beta_1",
          "model/dense/kernel/.OPTIMIZER_SLOT/optimizer/average",
          "optimizer/loss_scale/good_steps"]
  assert checkpoints.holds(keys, checkpoints.EMA)
  assert checkpoints.holds(keys[2:], checkpoints.LOSS_SCALE)
  assert not checkpoints.holds(keys[1:], checkpoints.EMA)
  assert not checkpoints.holds(["optimizer/loss_scales/x"],
                               checkpoints.LOSS_SCALE)


def test_an_evaluation_with_ema_refuses_a_checkpoint_without_averages(
    tmp_path):
  directory = str(tmp_path)
  weights = tf.Variable([1.0, 2.0])
  tf.train.CheckpointManager(tf.train.Checkpoint(model=weights), directory,
                             3).save(checkpoint_number=7)
  # An evaluation's EMA optimizer has made no variable yet.
  averaging = tf.train.Checkpoint(
      model=tf.Variable([0.0, 0.0]),
      optimizer=tf.train.Checkpoint(**{checkpoints.EMA: tf.train.Checkpoint()}))
  assert checkpoints.tracks(averaging, checkpoints.EMA)
  assert not checkpoints.tracks(averaging, checkpoints.LOSS_SCALE)
  with pytest.raises(trainer.ConfigError) as raised:
    checkpoints.restore(tf.train.CheckpointManager(averaging, directory, 3),
                        partial=True)
  assert str(raised.value) == (
      f"checkpoint {directory}/ckpt-7 holds no weight averages (saved "
      "without EMA), which this evaluation, with `ema.decay` set, evaluates: "
      "they would be the weights the model was built with; evaluate it "
      "without `ema.decay`.")
  # Without EMA it evaluates the weights.
  plain = tf.Variable([0.0, 0.0])
  assert checkpoints.restore(tf.train.CheckpointManager(
      tf.train.Checkpoint(model=plain), directory, 3), partial=True) == (
          f"{directory}/ckpt-7")
  assert plain.numpy().tolist() == [1.0, 2.0]


def test_a_checkpoint_saved_before_batch_sizes_were_recorded_restores(
    tmp_path):
  weights = tf.Variable([1.0, 2.0])
  tf.train.CheckpointManager(tf.train.Checkpoint(model=weights),
                             str(tmp_path), 3).save(checkpoint_number=3)
  assert checkpoints.recorded_batch_size(str(tmp_path / "ckpt-3")) is None
  restored = tf.Variable([0.0, 0.0])
  batch_size = tf.Variable(128, dtype=tf.int64)
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=restored,
                          **{checkpoints.BATCH_SIZE: batch_size}),
      str(tmp_path), 3)
  assert checkpoints.restore(manager) == str(tmp_path / "ckpt-3")
  assert restored.numpy().tolist() == [1.0, 2.0]
  assert int(batch_size.numpy()) == 128  # Left as it was.
  manager.save(checkpoint_number=4)
  assert checkpoints.recorded_batch_size(str(tmp_path / "ckpt-4")) == 128


def test_a_checkpoint_without_this_models_layers_names_them(tmp_path):
  # Issue 38: a CNN's model_dir resumed with the pipelined task said
  # "variable hidden1/bias has shape (128,) in this model but (32,) in the
  # checkpoint", of a checkpoint that has no hidden1 (its conv1 sits there).
  saved = tf.train.Checkpoint(model=digits.DigitsClassification(
  ).build_model()).write(str(tmp_path / "ckpt-10"))
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=digits_pipeline.DigitsPipelineMLP(
      ).build_model()), str(tmp_path), 3)
  with pytest.raises(trainer.ConfigError) as raised:
    checkpoints.restore(manager, saved)
  assert str(raised.value) == (
      f"checkpoint {saved} does not fit this model: it has no hidden1, "
      "hidden2, hidden3, hidden4 (by the names saved with its variables, "
      "`model` there holds conv1, conv2, hidden, logits).")
  # Where the checkpoint has the variable by its name, its shapes are said.
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=digits.DigitsClassification(
          filters=16).build_model()), str(tmp_path), 3)
  with pytest.raises(trainer.ConfigError) as raised:
    checkpoints.restore(manager, saved)
  assert str(raised.value) == (
      f"checkpoint {saved} does not fit this model: variable conv1/bias has "
      "shape (16,) in this model but (32,) in the checkpoint.")


@pytest.mark.slow  # Two train.py runs: 64 s measured on 2 busy cores.
def test_train_py_falls_back_from_a_damaged_optimizer_slot(tmp_path):
  # Issue 30: the first step failed with "the input data is damaged:
  # TensorBundle at .../ckpt-20 ...", exit 1, on every run.
  model_dir = str(tmp_path / "digits")
  args = ["--gin_file=gin/digits.gin", f"--model_dir={model_dir}",
          "--mode=train", "--gin_param=trainer.steps_per_loop=10",
          "--gin_param=trainer.summary_interval=10",
          "--gin_param=trainer.checkpoint_interval=10"]
  first = helpers.run_cli(args + ["--gin_param=trainer.train_steps=20"])
  assert first.returncode == 0, first.stderr[-2000:]
  slot = "model/layer_with_weights-2/kernel/.OPTIMIZER_SLOT/optimizer/m"
  prefix = os.path.join(model_dir, "ckpt-20")
  index = _read(prefix + ".index")
  damaged = helpers.flip_tensor(prefix, slot + "/.ATTRIBUTES/VARIABLE_VALUE")

  second = helpers.run_cli(args + ["--gin_param=trainer.train_steps=30"])
  assert second.returncode == 0, second.stderr[-2000:]
  _assert_fell_back(second.stdout.splitlines(), model_dir, slot, 294912,
                    "DigitsClassification")
  assert "train.py: error" not in second.stderr
  assert helpers.checkpoint_step(model_dir) == 30
  assert _read(prefix + "-damaged.data-00000-of-00001") == damaged
  assert _read(prefix + "-damaged.index") == index



def _write_url(path, data):
  with tf.io.gfile.GFile(path, "wb") as f:
    f.write(data)


def _manager(directory, value=0.0, **kwargs):
  """A manager of a weight and the step, saving in `directory`."""
  step = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(model=tf.Variable(value), global_step=step)
  return checkpoints.create_manager(checkpoint, directory, global_step=step,
                                    **kwargs), step


def _restored_weight(prefix):
  """The weight saved at `prefix` (read by a restore: `ram://` takes a
  checkpoint's prefix for a folder, so `tf.train.load_checkpoint` cannot
  read one there)."""
  weight = tf.Variable(0.0)
  tf.train.Checkpoint(model=weight).restore(prefix).expect_partial()
  return float(weight.numpy())


def test_interrupted_saves_on_a_url_are_removed_there(tmp_path, monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  manager, _ = _manager(model_dir, max_to_keep=3)
  manager.save(checkpoint_number=10)
  leftovers = [f"{model_dir}/best/ckpt-30_temp", f"{model_dir}/ckpt-20_temp"]
  for leftover in leftovers:
    tf.io.gfile.makedirs(leftover)
    _write_url(f"{leftover}/part-00000-of-00001.data-00000-of-00001", b"x")
  assert checkpoints.remove_interrupted_saves(
      model_dir, [checkpoints.SAVES, "best"]) == leftovers
  assert ram_urls.names(model_dir) == [
      ".identity", "checkpoint", "ckpt-10.data-00000-of-00001",
      "ckpt-10.index"]
  assert ram_urls.nothing_local(tmp_path)


@pytest.mark.parametrize("where", ["url", "relative"])
def test_held_checkpoints_are_trimmed_and_copied_in_place(tmp_path,
                                                          monkeypatch, where):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  if where == "relative":
    model_dir = "run"
  evaluated = {10}
  manager, step = _manager(model_dir, value=3.0, max_to_keep=1,
                           evaluated_fn=lambda: evaluated)
  for step_number in (10, 20, 30):
    step.assign(step_number)
    manager.save(checkpoint_number=step_number)
  # ckpt-10 was evaluated and goes; ckpt-20 waits for its evaluation.
  assert checkpoints.candidates(model_dir) == [
      os.path.join(model_dir, "ckpt-30"), os.path.join(model_dir, "ckpt-20")]
  evaluated.add(20)
  assert checkpoints.trim(model_dir, 1, evaluated) == [
      os.path.join(model_dir, "ckpt-20")]
  # The state file names it as `CheckpointManager` does (not `../ckpt-30`).
  assert checkpoints.candidates(model_dir) == [
      os.path.join(model_dir, "ckpt-30")]
  assert not tf.io.gfile.glob(os.path.join(model_dir, "ckpt-[12]0*"))
  # The best checkpoint's copy (`build.save_best`), into `best/` made first.
  best = os.path.join(model_dir, "best", "ckpt-30")
  tf.io.gfile.makedirs(os.path.dirname(best))
  checkpoints.copy(os.path.join(model_dir, "ckpt-30"), best)
  assert _restored_weight(best) == 3.0
  assert ram_urls.nothing_local(tmp_path)


def test_a_damaged_checkpoint_on_a_url_is_set_aside_there(tmp_path,
                                                          monkeypatch):
  model_dir = ram_urls.model_dir(tmp_path, monkeypatch)
  manager, _ = _manager(model_dir, value=2.0, max_to_keep=3)
  prefix = manager.save(checkpoint_number=20)
  assert checkpoint_verify.set_aside(prefix) == prefix + "-damaged"
  assert ram_urls.names(model_dir) == [
      ".identity", "checkpoint", "ckpt-20-damaged.data-00000-of-00001",
      "ckpt-20-damaged.index"]
  assert _restored_weight(prefix + "-damaged") == 2.0
  # Set aside once: a second damaged save of the step keeps its own files.
  manager.save(checkpoint_number=20)
  assert checkpoint_verify.set_aside(prefix) is None
  assert ram_urls.nothing_local(tmp_path)
