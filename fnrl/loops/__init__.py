"""The training loops, one per runtime; each receives a checked `fnrl.run.plan.Plan`.

- `fnrl.loops.serial`: collect -> update (on-policy) or collect -> replay -> updates (off-policy),
  in one process, for one seed, vmapped seeds or one rank of a data-parallel run;
- `fnrl.train_async`: off-policy sampling in its own process (`--sampler async`);
- `fnrl.train_central`: actor processes with central inference (IMPALA).

`fnrl.train.train` resolves a run into a plan and hands it to the loop of its runtime.
"""
