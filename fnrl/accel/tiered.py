"""Tiered execution: train at once on the eager steps while the compiled ones build out of the way.

    agent = TieredAgent(module, config, spec, accel)   # init, act, update as `module.make` gives them
    ...                                                # the loop trains with it as with any agent
    agent.tier                                         # "eager", then "compiled"
    agent.close()                                      # at the end (a builder still running goes on)
    agent.close(interrupted=True)                      # ... or, after a signal or an error, stops

At the first update the agent copies that update's arguments and the observations of the first
acting call. If an earlier run listed compiled models for exactly these steps (`_steps_key`: fnrl's
code, torch, the CPU, the algorithm, config, env spec, argument layouts and threads; the lists live in
`$FNRL_CACHE_DIR/aoti/tiers`), it loads them after that update. Otherwise, where the rest of the
run would last at least `MIN_EAGER_S` eagerly, it starts a builder process
(`python -m fnrl.accel.tiered FOLDER`, at a lower priority) that makes the compiled agent
(`fnrl.accel.compiled.make_agent`), calls its `act` and `update` once on those arguments so that
each is built as one AOTInductor model (or found in the on-disk cache, `fnrl.accel.aot.cache_dir`),
lists them under the steps' key and writes which package serves which call. After each update
the training process checks, without waiting, whether the builder is done; when it is, it loads
the packages (`fnrl.accel.aot.provided`: no tracing or compiling in the training process) and
trains on them from the next iteration on. The switch is at an iteration boundary (the update is
the last step of an on-policy iteration). A run that ends first leaves its builder to finish on
its own, so that the next run with these steps switches at its first update; a run stopped by a
signal or an error stops its builder too.

An off-policy run (DQN family, DDPG / TD3 / SAC) goes the same way with its replay: the loop
(`fnrl.loops.off_policy.ReplayLearner`) updates through `learner`'s steps and calls
`before_updates` before each iteration's updates. The first such call looks for listed models,
the second (one eager iteration later, for the pace) starts the builder on the state, the replay
buffer and the last rollout; the compiled tier is acting, the fused learner step (`fnrl.learner`:
replay draw, update and priorities in one model) and the replay write, three AOTInductor models,
and the switch comes before an iteration's updates.

The tiers compute the same functions: eager and compiled acting (and replay draws) take the same
random numbers (Inductor's `fallback_random`), the minibatch order comes from the seed and the env
steps, and the update is the same arithmetic up to float rounding (`tests/test_tiered.py`). A
builder that fails leaves the run on the eager tier with one warning. Tiering serves a run whose
every step is an ahead-of-time model (`applies`); others compile before their first step, as
`compile=True` does.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable

import torch

from fnrl.accel import aot
from fnrl.run.threads import intra_op_threads

MIN_EAGER_S = 5.0
"""A run whose eager remainder is shorter than this many seconds does not start a builder (a
listed build from an earlier run is still used)."""


def applies(module, config, spec, device, accel, *, single: bool, sampler: str, cuda_graphs: bool) -> bool:
    """Whether a run's steps can be tiered: one seed in one process (`single`), the serial or
    alternating sampler, a feed-forward policy on observations that are one tensor, on a device
    ahead-of-time models serve; and an on-policy algorithm whose whole update is one such model
    (`"compile" in SPEC.make_options`), or an off-policy one whose compiled learner step is the
    fused one (`fnrl.learner`: row replay, no frame-stacked Atari observations)."""
    if not (single and sampler in ("serial", "alternating") and not cuda_graphs and accel.ahead_of_time
            and getattr(config, "core", "none") == "none" and not isinstance(spec.obs_shape, dict)
            and aot.serves(torch.device(device))):
        return False
    if module.SPEC.off_policy:
        return accel.fused_learner and module.SPEC.replay == "row" and not spec.is_atari
    return "compile" in module.SPEC.make_options


class TieredAgent:
    """An agent (`init`, `act`, `update`) on the eager tier until its builder's models are ready.

    module, config, spec, accel: what `fnrl.accel.compiled.make_agent` takes, for both tiers.
    tier: "eager" or "compiled", what the next step runs; last_tier: what the last update ran on;
    switched_at: the env steps of the switch (None before it).

    An off-policy run's loop (`fnrl.loops.off_policy.ReplayLearner`) updates through `learner`'s
    `learn` instead of `update`, and calls `before_updates` before each iteration's updates: the
    compiled tier is then the compiled acting, the fused learner step (`fnrl.learner`) and the
    compiled replay write, and the switch comes before an iteration's updates."""

    def __init__(self, module, config, spec, accel):
        self._how = (module, config, spec, accel)
        eager = module.make(config, spec)
        self.init, self._act, self._update = eager.init, eager.act, eager.update
        self.tier, self.switched_at, self.last_tier = "eager", None, "eager"
        self._obs = None        # the first acting call's observations (their layout)
        self._example = None    # (state, rollout, obs) of the first update, until the switch
        self._key = None        # where the packages of this run's steps are listed, once built
        self._listing = None    # the packages an earlier run listed for these steps
        self._folder = None     # the builder's job, log and manifest
        self._builder = None    # its process, while it runs
        self._t_first = None    # when the first acting call came
        self._threads = [1, 1]  # torch's intra-op threads while acting and while updating (off-policy:
        #                         and while adding to replay)
        self._learn = None      # off-policy: the learner step of the tier that runs
        self._learner = None    # off-policy: (batch size, prioritized), as `learner` was given them
        self._first_updates = None   # off-policy: (time, env steps) at the first `before_updates`

    def act(self, state, obs, carry=None, explore: bool = True):
        if self._obs is None and carry is None and explore:
            self._obs = torch.empty_strided(obs.size(), obs.stride(), dtype=obs.dtype).copy_(obs)
            self._t_first, self._threads[0] = time.perf_counter(), torch.get_num_threads()
        return self._act(state, obs, carry, explore)

    def update(self, state, rollout, *args):
        if self._how[0].SPEC.off_policy:   # the loop updates through `learner`'s steps
            return self._update(state, rollout, *args)
        self.last_tier = self.tier
        first = self._example is None and self._obs is not None and self.tier == "eager"
        if first:
            self._threads[1] = torch.get_num_threads()
            self._example = (state.clone(), rollout.clone(), self._obs)
            self._key = _steps_key(self._how, {"state": state, "rollout": rollout}, self._obs, self._threads)
            self._listing = _listed(self._key)
        with self._beside_builder():
            out = self._update(state, rollout, *args)
        if first and self._listing is None and not (self._worth_building(out[0], rollout) and self._start(
                {"state": state, "rollout": rollout, "obs": self._obs})):
            self._example = ()   # nothing to build: the run stays eager
        if self._listing is not None or (self._builder is not None and self._builder.poll() is not None):
            self._switch(self._listing, out[0], self._load_update)
        return out

    def learner(self, batch_size: int, prioritized: bool) -> Callable:
        """Off-policy runs: `learn(state, buffer, beta) -> (state, buffer, metrics)` as
        `fnrl.learner.make_learner` makes it, on the tier that runs: the eager replay sample and
        update, after the switch the fused compiled step."""
        from fnrl import learner

        self._learner = (batch_size, prioritized)
        self._learn = learner.make_learner(self._update, batch_size, prioritized, fused=False)

        def learn(state, buffer, beta: float):
            self.last_tier = self.tier
            with self._beside_builder():
                return self._learn(state, buffer, beta)
        return learn

    def _beside_builder(self):
        """While the builder runs, the eager steps update on one intra-op thread, leaving it a core
        (the compiled steps get the loop's threads). On two cores, an eager DQN CartPole update on
        both took as long as on one, at twice the CPU time, and its builder beside it took twice as
        long as alone (`docs/decisions.md`)."""
        return intra_op_threads(1) if self._builder is not None and self._builder.poll() is None else _NO_CHANGE

    def before_updates(self, state, buffer, rollout, add_threads: int):
        """Off-policy runs: called before each iteration's updates with the replay `buffer` and the
        `rollout` last added to it (with `add_threads` intra-op threads). The first call switches to
        the steps an earlier run listed, if any, and notes the time; the second, one eager iteration
        later, starts the builder where the rest of the run would last `MIN_EAGER_S` at that pace;
        later ones switch once it is done. Returns the state to go on with: after the switch a copy
        (the compiled step writes into the state it is given, which must own its tensors)."""
        if self.tier != "eager" or self._obs is None or self._example == ():
            return state
        env_steps = int(state["env_steps"].reshape(-1)[0])
        if self._first_updates is None:
            self._first_updates = (time.perf_counter(), env_steps)
            self._threads = [self._threads[0], torch.get_num_threads(), add_threads]
            self._key = _steps_key(self._how, {"state": state, "rollout": rollout, "storage": buffer.storage,
                                               "rows": buffer.rows}, self._obs, self._threads)
            listing = _listed(self._key)
            return state if listing is None else self._switch_learner(listing, state, buffer, rollout)
        if self._builder is None:
            t, steps = self._first_updates
            remaining = (self._how[1].total_steps - env_steps) / max(env_steps - steps, 1) * (time.perf_counter() - t)
            job = {"state": state, "buffer": buffer, "rollout": rollout, "obs": self._obs, "learner": self._learner}
            if not (remaining >= MIN_EAGER_S and self._start(job)):
                self._example = ()   # nothing to build: the run stays eager
            return state
        return self._switch_learner(None, state, buffer, rollout) if self._builder.poll() is not None else state

    def close(self, interrupted: bool = False) -> None:
        """Remove the builder's folder. A builder that still runs is left to finish on its own (it
        lists its models for the next run with these steps, then removes the folder), unless the
        run was `interrupted` (a signal, an error): then it is stopped too."""
        if self._builder is not None and self._builder.poll() is None and interrupted:
            self._builder.kill()
            self._builder.wait()
        if self._builder is not None and self._builder.poll() is None:
            (self._folder / "detached").touch()
            _DETACHED.append(self._builder)   # kept: reaped when it ends, not reported as lost
        elif self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._builder = self._folder = None

    def _worth_building(self, state, rollout) -> bool:
        """Whether the rest of the run, at the first iteration's pace, lasts `MIN_EAGER_S`: a
        shorter one would end before its compiled steps were built."""
        remaining = self._how[1].total_steps - int(state["env_steps"].reshape(-1)[0])
        return remaining / max(rollout.numel(), 1) * (time.perf_counter() - self._t_first) >= MIN_EAGER_S

    def _start(self, example: dict) -> bool:
        """Start the builder on `example` (the arguments its steps are built for; False, with one
        warning, where it cannot be started)."""
        module, config, spec, accel = self._how
        try:
            self._folder = Path(tempfile.mkdtemp(prefix="fnrl-tier-"))
            torch.save({"module": module.__name__, "config": config, "spec": spec, "accel": accel, **example,
                        "key": self._key, "source": _source_digest(), "threads": self._threads},
                       self._folder / "job.pt")
            root = str(Path(__file__).resolve().parents[2])   # where this fnrl is imported from
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
            with open(self._folder / "log.txt", "wb") as log:
                self._builder = subprocess.Popen(_builder_command(self._folder), stdin=subprocess.DEVNULL,
                                                 stdout=log, stderr=subprocess.STDOUT, env=env)
        except Exception as e:   # noqa: BLE001 - no builder means: the eager tier
            _stays_eager(e)
            self.close()
            return False
        return True

    def _switch(self, packages: dict | None, state, load: Callable[[dict], None]) -> bool:
        """Load the models (`packages`, or the finished builder's) with `load` and run them from here
        on (False: on any failure, one warning and the eager tier for the rest of the run)."""
        try:
            if packages is None:
                code, self._builder = self._builder.returncode, None
                if code != 0:
                    raise RuntimeError(_last_line(self._folder / "log.txt") or f"exit status {code}")
                packages = json.loads((self._folder / "manifest.json").read_text())
            load(packages)
        except Exception as e:   # noqa: BLE001 - whatever stops the compiled tier leaves the run eager
            _unlist(self._key)
            _stays_eager(e)
            self._example = ()   # for good: no other builder
            return False
        finally:
            self._listing = None
            self.close()
        self._example = None
        self.tier, self.switched_at = "compiled", int(state["env_steps"].reshape(-1)[0])
        return True

    def _load_update(self, packages: dict) -> None:
        self._act, self._update = _loaded(self._how, packages, self._threads, *self._example)

    def _switch_learner(self, packages: dict | None, state, buffer, rollout):
        """`_switch` of an off-policy run: the state to go on with (a copy where it switched)."""
        def load(packages):
            self._act, self._learn = _loaded_learner(self._how, packages, self._threads, self._learner, state, buffer,
                                                     rollout, self._obs)
        return state.clone() if self._switch(packages, state, load) else state


def _stays_eager(error: Exception) -> None:
    """The one warning of a run whose compiled steps cannot be built (the update's caller's line)."""
    warnings.warn(f"the compiled steps could not be built ({type(error).__name__}: {str(error)[:200]}); "
                  f"the run goes on with the eager ones", stacklevel=5)


def _builder_command(folder: Path) -> list[str]:
    """The builder's command line: this Python, without the working directory on its path (`-P`:
    the fnrl it imports is this one, put first on PYTHONPATH)."""
    return [sys.executable, "-P", "-m", "fnrl.accel.tiered", str(folder)]


_NO_CHANGE = contextlib.nullcontext()

_DETACHED: list = []
"""Builders whose runs have ended, still running (kept so that they are reaped when they end)."""


@functools.cache
def _source_digest() -> str:
    """A digest of fnrl's own code: listed packages belong to the code that built them."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + path.read_bytes())
    return h.hexdigest()


def _run_key(how) -> str | None:
    """What a run's compiled steps depend on before any argument is seen: fnrl's code, torch, the
    CPU, the algorithm, its config, the env's spec and the options. None where the policy is the
    user's code (`conv="module:name"`), which this digest does not see."""
    module, config, spec, accel = how
    if ":" in str(getattr(config, "conv", "")):
        return None
    cpu = f"{platform.machine()}|{torch.backends.cpu.get_cpu_capability()}"
    text = f"{_source_digest()}|{torch.__version__}|{cpu}|{module.__name__}|{config!r}|{spec!r}|{accel!r}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _steps_key(how, arguments: dict, obs, threads) -> str | None:
    """`_run_key`, the layout of the first update's arguments (TensorDicts by name: the state, the
    rollout, a replay buffer's) and the threads of acting, of the update and of adding to replay
    (the models are built for them), as "RUNKEY-STEPSKEY"."""
    run = _run_key(how)
    if run is None:
        return None
    leaves = {f"{name}/{key}": (tuple(t.shape), t.stride(), str(t.dtype))
              for name, td in arguments.items() for key, t in td.items(include_nested=True, leaves_only=True)}
    text = f"{sorted(leaves.items())}|{tuple(obs.shape)}|{obs.stride()}|{obs.dtype}|threads {list(threads)}"
    return f"{run}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _listed(key: str | None) -> dict | None:
    """The packages listed for `key` by an earlier run, where every one is still on disk."""
    if key is None:
        return None
    try:
        packages = json.loads((aot.cache_dir() / "tiers" / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return packages if all(Path(p).exists() for p in packages.values()) else None


def _unlist(key: str | None) -> None:
    if key is not None:
        (aot.cache_dir() / "tiers" / f"{key}.json").unlink(missing_ok=True)


def _list(key: str | None, packages: dict) -> None:
    """Note `packages` under `key`, so that the next run with these steps switches at its first update."""
    if key is None:
        return
    folder = aot.cache_dir() / "tiers"
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(packages, f)
    os.replace(tmp, folder / f"{key}.json")


def _loaded(how, packages: dict, threads, state, rollout, obs):
    """(act, update) of the compiled agent, their models loaded from `packages` by one call of
    each on copies of the first iteration's arguments (which also checks that they run), with
    `threads` (acting's, the update's)."""
    from fnrl.accel.compiled import make_agent

    module, config, spec, accel = how
    # the run's random numbers are left as they are (making an agent may draw); nothing is traced
    # or compiled here (strict), each model is loaded with the threads it was built for
    with torch.random.fork_rng(devices=[]), aot.provided(packages, strict=True), aot.recording() as used:
        agent = make_agent(module, config, spec, True, accel=accel)
        with intra_op_threads(threads[0]):
            agent.act(state, obs, None, True)
        with intra_op_threads(threads[1]):
            agent.update(state.clone(), rollout.clone())
    if set(used) != set(packages):
        raise RuntimeError("the builder's models are not the ones the training process asks for")
    return agent.act, agent.update


def _loaded_learner(how, packages: dict, threads, learner_args, state, buffer, rollout, obs):
    """(act, learn) of an off-policy run's compiled tier, their models loaded from `packages`:
    acting once on the state, the fused learner step once on copies of the state and the replay
    `buffer`, and the compiled replay write of `rollout` made ready for `buffer` (nothing written),
    each with its `threads` (acting's, the update's, adding's)."""
    from fnrl import replay
    from fnrl.accel.compiled import make_agent

    module, config, spec, accel = how
    with torch.random.fork_rng(devices=[]), aot.provided(packages, strict=True), aot.recording() as used:
        agent = make_agent(module, config, spec, True, update_compiled_by_learner=True, accel=accel)
        learn = _compiled_learner(agent, learner_args)
        with intra_op_threads(threads[0]):
            agent.act(state, obs, None, True)
        with intra_op_threads(threads[1]):
            learn(state.clone(), replay.clone(buffer), 1.0)
        with intra_op_threads(threads[2]):
            replay.prepare_write(buffer, rollout)
    if set(used) != set(packages):
        raise RuntimeError("the builder's models are not the ones the training process asks for")
    return agent.act, learn


def _compiled_learner(agent, learner_args) -> Callable:
    """The off-policy compiled tier's `learn`: the fused learner step of `agent.update` as one
    ahead-of-time model (`fnrl.learner.make_learner`), for `learner_args` (batch size, prioritized)."""
    from fnrl import learner

    return learner.make_learner(agent.update, *learner_args, fused=True, ahead_of_time=True)


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def build(folder: Path) -> None:
    """The builder: the compiled agent's models for the job in `folder`, listed for the job's key
    and written to `manifest.json` (call signature -> package) once every one is built. A builder
    whose run has ended removes the folder when it stops."""
    try:
        os.nice(5)
    except OSError:
        pass
    try:
        _build(folder)
    finally:
        if (folder / "detached").exists():   # the run has ended: nobody reads the manifest or the log
            shutil.rmtree(folder, ignore_errors=True)


def _build(folder: Path) -> None:
    import importlib

    from fnrl.accel.compiled import make_agent

    job = torch.load(folder / "job.pt", weights_only=False)   # written by the training process that started this one
    (folder / "job.pt").unlink()
    if job["source"] != _source_digest():
        raise SystemExit("the builder imported another fnrl than the training process")
    off_policy = "buffer" in job
    agent = make_agent(importlib.import_module(job["module"]), job["config"], job["spec"], True,
                       update_compiled_by_learner=off_policy, accel=job["accel"])
    threads = job["threads"]
    with aot.recording() as acting, torch.random.fork_rng(devices=[]), intra_op_threads(threads[0]):
        agent.act(job["state"], job["obs"], None, True)
    with aot.recording() as updating, intra_op_threads(threads[1]):
        if off_policy:
            from fnrl import replay

            _compiled_learner(agent, job["learner"])(job["state"].clone(), replay.clone(job["buffer"]), 1.0)
        else:
            agent.update(job["state"], job["rollout"])
    writing = {}
    if off_policy:   # the compiled replay write, where the run's adds have one
        from fnrl import replay

        with aot.recording() as writing, intra_op_threads(threads[2]):
            replay.prepare_write(job["buffer"], job["rollout"])
    if len(acting) != 1 or len(updating) != 1:
        raise SystemExit("acting or the update is not one ahead-of-time model (see the warning above)")
    packages = {**acting, **updating, **writing}
    _list(job["key"], packages)
    tmp = folder / "manifest.json.tmp"
    tmp.write_text(json.dumps(packages))
    os.replace(tmp, folder / "manifest.json")


if __name__ == "__main__":
    build(Path(sys.argv[1]))
