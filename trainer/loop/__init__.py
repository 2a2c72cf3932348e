"""The training loop: the controller, the runners that step a Task, loop
hooks, rollback, profiling windows, preemption and continuous evaluation."""
