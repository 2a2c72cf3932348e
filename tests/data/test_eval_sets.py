"""The rules of named evaluation sets: names, result names, the settings
that choose, count and judge them."""

import pytest

from trainer import errors
from trainer.data import eval_sets


@pytest.mark.parametrize("name", ["clean", "noisy_2", "out-of-domain", "v1.2",
                                  "0", "Test"])
def test_a_name_that_can_be_a_tensorboard_run_passes(name):
  eval_sets.check_name(name)


@pytest.mark.parametrize("name", ["a/b", "", ".", "..", "two words", "-x",
                                  "_x", "a\\b", "é", 3, None])
def test_a_name_that_cannot_be_a_tensorboard_run_is_one_line(name):
  with pytest.raises(errors.ConfigError) as caught:
    eval_sets.check_name(name)
  assert str(caught.value) == (
      f"the evaluation set name {name!r} cannot be a TensorBoard run name "
      f"(`eval/{name}`): use letters, digits, `_`, `-` and `.`, starting "
      "with a letter or a digit.")
  assert "\n" not in str(caught.value)


def test_result_names():
  assert eval_sets.result_name(None, "accuracy") == "accuracy"
  assert eval_sets.result_name("clean", "accuracy") == "clean/accuracy"
  assert eval_sets.set_of("clean/accuracy") == "clean"
  assert eval_sets.set_of("clean/top/5") == "clean"
  assert eval_sets.set_of("accuracy") is None


def test_steps_one_count_for_every_set_or_counts_by_name():
  assert eval_sets.steps_for(7, None) == 7
  assert eval_sets.steps_for(7, "noisy") == 7
  assert eval_sets.steps_for({"clean": 3}, "clean") == 3
  assert eval_sets.steps_for({"clean": 3}, "noisy") == -1  # A full pass.
  eval_sets.check_steps(-1)
  eval_sets.check_steps({"clean": 3, "noisy": -1})


@pytest.mark.parametrize("steps,message", [
    (0, "`trainer.validation_steps` (0) must be positive, or -1 for a full "
        "pass."),
    ({"clean": -2}, "`trainer.validation_steps['clean']` (-2) must be "
                    "positive, or -1 for a full pass."),
    ({"clean": 1.5}, "`trainer.validation_steps['clean']` (1.5) must be an "
                     "integer."),
    (True, "`trainer.validation_steps` (True) must be an integer."),
])
def test_bad_steps(steps, message):
  with pytest.raises(errors.ConfigError) as caught:
    eval_sets.check_steps(steps)
  assert str(caught.value) == message


def test_a_held_out_sets_result_is_never_judged():
  eval_sets.check_judged("best_checkpoint.metric", "clean/accuracy",
                         ("test",))
  eval_sets.check_judged("best_checkpoint.metric", None, ("test",))
  eval_sets.check_judged("best_checkpoint.metric", "accuracy", ())
  with pytest.raises(errors.ConfigError) as caught:
    eval_sets.check_judged("early_stopping.metric", "test/accuracy",
                           ("test",))
  assert str(caught.value) == (
      "`early_stopping.metric` ('test/accuracy') is a result of the held-out "
      "set 'test' (`trainer.held_out_sets`), which is evaluated and "
      "reported but never judged: judge by another set's result.")


def test_a_judged_metric_must_name_a_set():
  eval_sets.check_metric("best_checkpoint.metric", "noisy/accuracy",
                         ["clean", "noisy"])
  eval_sets.check_metric("best_checkpoint.metric", None, ["clean"])
  # The unnamed set's results are checked at the first evaluation.
  eval_sets.check_metric("best_checkpoint.metric", "anything", [None])
  for metric in ("accuracy", "dirty/accuracy"):
    with pytest.raises(errors.ConfigError) as caught:
      eval_sets.check_metric("best_checkpoint.metric", metric,
                             ["clean", "noisy"])
    assert str(caught.value) == (
        f"`best_checkpoint.metric` ({metric!r}) names no evaluation set: "
        "results are named `<set>/<metric>` (e.g. 'clean/accuracy'), and "
        "the sets are: clean, noisy.")
  with pytest.raises(errors.ConfigError, match=r"\(e.g. 'clean/mae'\)"):
    eval_sets.check_metric("best_checkpoint.metric", "mae", ["clean"])


def test_a_judged_metric_must_be_of_a_set_evaluated():
  eval_sets.check_metric("best_checkpoint.metric", "clean/accuracy",
                         ["clean", "noisy"], chosen=("clean",))
  with pytest.raises(errors.ConfigError) as caught:
    eval_sets.check_names(
        ["clean", "noisy"], (), ("noisy",), -1,
        judged={"best_checkpoint.metric": "clean/accuracy",
                "early_stopping.metric": None})
  assert str(caught.value) == (
      "`best_checkpoint.metric` ('clean/accuracy') is a result of the set "
      "'clean', which `trainer.eval_sets` (noisy) leaves out: evaluate it "
      "too, or judge by a set evaluated.")
  with pytest.raises(errors.ConfigError, match="names no evaluation set"):
    eval_sets.check_names(["clean"], (), None, -1,
                          judged={"early_stopping.metric": "loss"})


@pytest.mark.parametrize("names,held_out,chosen,steps,message", [
    ([], (), None, -1,
     "`build_inputs(training=False)` returned no evaluation set (an empty "
     "dict): return a dataset, or a dict of datasets by name."),
    (["clean", "a b"], (), None, -1,
     "the evaluation set name 'a b' cannot be a TensorBoard run name "
     "(`eval/a b`): use letters, digits, `_`, `-` and `.`, starting with a "
     "letter or a digit."),
    (["clean", "noisy"], ("tset",), None, -1,
     "`trainer.held_out_sets` names 'tset', which is not an evaluation set "
     "of the Task; its sets are: clean, noisy."),
    (["clean", "noisy"], (), ("nosiy",), -1,
     "`trainer.eval_sets` names 'nosiy', which is not an evaluation set of "
     "the Task; its sets are: clean, noisy."),
    (["clean", "noisy"], (), None, {"cleen": 3},
     "`trainer.validation_steps` names 'cleen', which is not an evaluation "
     "set of the Task; its sets are: clean, noisy."),
    ([None], ("test",), None, -1,
     "`trainer.held_out_sets` names evaluation sets (test), but "
     "`build_inputs(training=False)` returns one unnamed dataset; return a "
     "dict of datasets by name."),
])
def test_the_tasks_sets_against_the_settings(names, held_out, chosen, steps,
                                             message):
  with pytest.raises(errors.ConfigError) as caught:
    eval_sets.check_names(names, held_out, chosen, steps)
  assert str(caught.value) == message


def test_the_sets_evaluated_keep_the_tasks_order():
  eval_sets.check_names(["clean", "noisy", "test"], ("test",),
                        ("test", "clean"), {"noisy": 2})
  assert eval_sets.chosen_names(["clean", "noisy", "test"],
                                ("test", "clean")) == ("clean", "test")
  assert eval_sets.chosen_names(["clean", "noisy"], None) == ("clean",
                                                               "noisy")
  assert eval_sets.chosen_names([None], None) == (None,)
