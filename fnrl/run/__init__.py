"""What every training loop shares, once.

- `fnrl.run.plan`: a run resolved and checked before any work (`make_plan`);
- `fnrl.run.folder`: the run folder and its `config.json`;
- `fnrl.run.checkpoint`: the checkpoint format, atomic save, load with one-line errors, restore;
- `fnrl.run.health`: NaN checks (`TrainingError`);
- `fnrl.run.progress`: episode statistics, progress.csv rows and the progress bar;
- `fnrl.run.threads`: the update's torch threads;
- `fnrl.run.result`: `TrainResult`.
"""
