"""The training loop, in two rooms: `control` decides when (the controller,
its saves, rollback, hooks, continuous evaluation) and `runner` does the
steps (the runners that step a Task, the evaluator); control imports the
runner, never the other way. Signals are the process's
(`trainer.preemption`): the controller knows the watcher it is given only
by `control.watcher.Watcher`."""
