"""How fnrl's compiled steps run: one place for the speed plumbing.

- `fnrl.accel.options`: `AccelOptions`, the speed options a run passes to the loops (ahead-of-time
  models, skipped guards, the fused learner step), read from the environment when not given;
- `fnrl.accel.compiled`: the one compile wiring of an algorithm's `act` and `update`
  (`make_agent`, `compile_act`), and the guard-free stance of a warm training loop;
- `fnrl.accel.staged`: an update written as prepare -> a scan of minibatch steps -> finish, run
  eagerly, compiled, as a GPU loop or as one ahead-of-time model;
- `fnrl.accel.aot`: ahead-of-time (AOTInductor) acting and learner steps;
- `fnrl.accel.cudagraphs`: steps replayed from CUDA graphs (`--cuda-graphs`);
- `fnrl.accel.inductor`: `cpp_wrapper` compiles on the CPU, and the TorchInductor workaround that
  compiled steps need on some torch versions (`apply_workarounds`).

An algorithm says what its update computes; these modules decide how it runs. The reasons,
with their measurements, are in docs/decisions.md and docs/performance.md.
"""

from fnrl.accel.options import AccelOptions

__all__ = ["AccelOptions"]
