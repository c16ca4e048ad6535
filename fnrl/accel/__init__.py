"""How fnrl's compiled steps run: one place for the speed plumbing.

- `fnrl.accel.compile`: the one compile wiring of an algorithm's `act` and `update`
  (`make_agent`), and the guard-free stance of a warm training loop;
- `fnrl.accel.aot`: ahead-of-time (AOTInductor) acting and learner steps;
- `fnrl.accel.cudagraphs`: steps replayed from CUDA graphs (`--cuda-graphs`);
- `fnrl.accel.inductor`: the TorchInductor settings compiled steps need on some torch versions.

An algorithm says what its update computes; these modules decide how it runs. The reasons,
with their measurements, are in docs/decisions.md and docs/performance.md.
"""
