"""Synchronous data-parallel training (fnrl.distributed): gradient all-reduce, launch, CLI.

Every test that starts processes gives each join a timeout and kills what is left."""
import csv
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from fnrl.algos import a2c, dqn, ppo
from fnrl.cli import main
from fnrl.envs.spec import EnvSpec
from tests.processes import descendants, run_ranks

ROOT = Path(__file__).resolve().parents[1]
T, B, WORLD = 8, 4, 2       # per-rank rollout [T, B]; the reference update sees [T, WORLD * B]
SPEC = None


def _spec() -> EnvSpec:
    from fnrl import envs

    env = envs.make("CartPole-v1", 1, seed=0)
    spec = env.spec
    env.close()
    return spec


# one update with the settings under which the concatenated-batch equality is exact: one minibatch,
# one epoch, no per-minibatch advantage normalization, every step valid (equal counts on each rank)
PPO = ppo.Config(num_envs=B, num_steps=T, total_steps=4096, num_minibatches=1, update_epochs=1, norm_adv=False)
A2C = a2c.Config(num_envs=B, num_steps=T, total_steps=4096)
# Adam's first step is lr * g / (|g| + eps): with eps 1e-8 it turns the rounding of near-zero gradients
# (summed in another order) into parameter differences up to ~1e-6; eps 1e-5 (PPO's) keeps them at 1e-8
DQN = dqn.Config(num_envs=B, batch_size=16, optimizer_eps=1e-5)


def _on_policy_rollout(agent, state, envs_, seed):
    """A synthetic [T, envs_] rollout of `agent`'s own policy on random observations, all valid."""
    g = torch.Generator().manual_seed(seed)
    obs_all = torch.randn(T + 1, envs_, 4, generator=g)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        action, extras, _ = agent.act(state, obs_all[:-1].reshape(-1, 4), None, True)
    term = torch.rand(T, envs_, generator=g) < 0.1
    trunc = (torch.rand(T, envs_, generator=g) < 0.05) & ~term
    fields = {"obs": obs_all[:-1], "next_obs": obs_all[1:], "action": action.view(T, envs_),
              "reward": torch.rand(T, envs_, generator=g), "terminated": term, "truncated": trunc,
              "done": term | trunc, "valid": torch.ones(T, envs_, dtype=torch.bool)}
    fields.update({k: v.view(T, envs_) for k, v in extras.items()})
    return TensorDict(fields, batch_size=[T, envs_])


def _dqn_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"obs": torch.randn(n, 4, generator=g), "next_obs": torch.randn(n, 4, generator=g),
                       "action": torch.randint(0, 2, (n,), generator=g), "reward": torch.rand(n, generator=g),
                       "discount": 0.99 * (torch.rand(n, generator=g) > 0.1).float(),
                       "weight": torch.ones(n)}, batch_size=[n])


def _cases(spec):
    """(name, per-rank config, whole-batch config, per-rank batches, whole batch, compile)."""
    out = []
    for name, module, cfg, compile in (("ppo", ppo, PPO, False), ("a2c", a2c, A2C, False)):
        whole = dataclasses.replace(cfg, num_envs=WORLD * B, total_steps=WORLD * cfg.total_steps)
        agent = _make(name, whole, spec, False)
        state = agent.init(0)
        parts = [_on_policy_rollout(agent, state, B, seed=10 + r) for r in range(WORLD)]
        out.append((name, cfg, whole, parts, torch.cat(parts, dim=1), compile))
    parts = [_dqn_batch(DQN.batch_size, seed=20 + r) for r in range(WORLD)]
    out.append(("dqn", DQN, dataclasses.replace(DQN, batch_size=WORLD * DQN.batch_size), parts,
                torch.cat(parts), False))
    return out


def _make(name, config, spec, compile):
    """The agent as the training loop builds it (compiled or not)."""
    from fnrl import algos
    from fnrl.accel.compiled import make_agent

    return make_agent(algos.load(name), config, spec, compile)


def _rank_main(rank, store, cases, spec, out_dir):
    """One rank: join the gloo group, run one update of each case on this rank's batch."""
    import torch.distributed as dist

    from fnrl.distributed import ProcessGroupWorld

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    world = ProcessGroupWorld("cpu")                      # installs the gradient all-reduce
    results = {}
    for name, cfg, _, parts, _, compile in cases:
        agent = _make(name, cfg, spec, compile)
        torch.manual_seed(100 + rank)                       # ranks' RNGs differ; the params must not
        state = world.broadcast_state(agent.init(0))
        new_state, _ = agent.update(state, parts[rank])
        results[name] = new_state["params"].clone()
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    world.close()
    dist.destroy_process_group()


def test_one_update_equals_single_process_update_on_concatenated_batch(tmp_path):
    """gloo, 2 processes: after one update (PPO, A2C and DQN, eager) both ranks hold identical parameters,
    equal to one process's update on the concatenated batch."""
    spec = _spec()
    cases = _cases(spec)
    run_ranks(_rank_main, WORLD, (str(tmp_path / "store"), cases, spec, str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)    # as the ranks: another thread count rounds the matmuls differently
    try:
        _compare(cases, spec, ranks)
    finally:
        torch.set_num_threads(threads)


def _compare(cases, spec, ranks):
    for name, _, whole, _, batch, _ in cases:
        agent = _make(name, whole, spec, False)
        reference, _ = agent.update(agent.init(0), batch)
        before = agent.init(0)["params"]
        for key in reference["params"].keys(include_nested=True, leaves_only=True):
            r0, r1, ref = ranks[0][name].get(key), ranks[1][name].get(key), reference["params"].get(key)
            assert torch.equal(r0, r1), (name, key)
            torch.testing.assert_close(r0, ref, rtol=1e-5, atol=1e-6, msg=f"{name} {key}")
        moved = sum((reference["params"].get(k) - before.get(k)).abs().sum()
                    for k in before.keys(include_nested=True, leaves_only=True))
        assert moved > 0, name


@pytest.mark.parametrize("argv, message", [
    (["--num-minibatches", "3"], "does not divide"),
    (["--env", "CartPol-v1"], "unknown env id"),
    (["--nproc", "0"], "--nproc must be a positive integer"),
    (["--device", "cuda"], "no CUDA device"),
    (["--log-dir", "/nonexistent-parent/run"], "log dir parent"),
])
def test_bad_option_with_nproc_is_one_line_before_any_process_starts(argv, message, capsys, monkeypatch):
    import multiprocessing.context as context

    def no_start(*args, **kwargs):
        raise AssertionError("processes were started")

    monkeypatch.setattr(context.SpawnProcess, "start", no_start)
    args = ["train", "ppo", "--nproc", "2", *argv] if "--nproc" not in argv else ["train", "ppo", *argv]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow   # two 2-process launches
def test_resume_needs_the_same_number_of_processes(tmp_path):
    """A 2-process run checkpoints once (rank 0); resuming it with 2 processes continues it, and with
    one process is refused."""
    from fnrl.errors import ConfigError
    from fnrl.train import load_checkpoint, train

    run = tmp_path / "run"
    tiny = dataclasses.replace(ppo.Config(), num_envs=4, num_steps=32, total_steps=1024, update_epochs=1)
    first = train("ppo", tiny, nproc=2, log_dir=run, compile=False, quiet=True, tensorboard=False, plot=False)
    assert [r["env_steps"] for r in first.history][-1] == 1024
    ckpt = load_checkpoint(run)
    assert ckpt["world_size"] == 2 and ckpt["counters"]["env_steps"] == 512 and ckpt["config"]["total_steps"] == 1024
    again = train("ppo", None, nproc=2, resume=run, compile=False, quiet=True, tensorboard=False, plot=False)
    assert again.history[-1]["env_steps"] == 1024       # already complete
    with pytest.raises(ConfigError, match="--nproc 2"):
        train("ppo", None, resume=run, compile=False, quiet=True)


def _nproc_2_run(tmp_path, total_steps: int) -> list[dict]:
    """`fnrl train ppo --nproc 2` with the CartPole preset's per-rank settings (8 envs x 32 steps per
    rank; eager: compiled == eager is tested for the update and acting elsewhere) for `total_steps`
    global env steps; asserts that rank 0 alone writes the run folder and logs global steps, and
    returns progress.csv's rows."""
    cmd = [sys.executable, "-m", "fnrl", "train", "ppo", "--env", "CartPole-v1", "--nproc", "2", "--seed", "1",
           "--total-steps", str(total_steps), "--quiet", "--log-dir", "run", "--no-compile"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]          # no rank wrote elsewhere
    run = tmp_path / "run"
    names = sorted(p.name for p in run.iterdir())
    assert names[:4] == ["checkpoint.pt", "config.json", "curve.png", "events.out.tfevents." + names[3][20:]]
    assert names[4:] == ["progress.csv"]                                 # one writer: no second events file
    rows = list(csv.DictReader(open(run / "progress.csv")))
    steps = [int(float(r["env_steps"])) for r in rows]
    assert steps == sorted(set(steps)) and all(s % 512 == 0 for s in steps)   # global steps, one row each
    assert steps[-1] >= total_steps and rows[-1]["eval_return_mean"] != ""
    ckpt = torch.load(run / "checkpoint.pt", weights_only=False)
    assert ckpt["world_size"] == 2 and 2 * ckpt["counters"]["env_steps"] == steps[-1]
    return rows


def test_cli_nproc_2_writes_one_run_folder_from_rank_0(tmp_path):
    _nproc_2_run(tmp_path, 4096)


@pytest.mark.slow
@pytest.mark.matrix   # two eager ranks for about 2.5 minutes: CI's time goes to the other tests
def test_cli_nproc_2_solves_cartpole(tmp_path):
    """A global 200k env steps (each rank's schedule is the single-process 100k one): the final
    evaluation (rank 0's, 10 episodes without exploration) is >= 450."""
    rows = _nproc_2_run(tmp_path, 200_000)
    assert float(rows[-1]["eval_return_mean"]) >= 450


def _listening(pids) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* write them) of the TCP sockets in LISTEN state
    that processes `pids` hold."""
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    out = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                out.append(fields[1])
    return out


def _loopback(local: str) -> bool:
    address = bytes.fromhex(local.split(":")[0])
    if len(address) == 4:   # IPv4, little-endian words
        return address[::-1][0] == 127
    words = b"".join(address[i:i + 4][::-1] for i in range(0, 16, 4))
    return words == bytes(15) + b"\x01" or (words[:12] == bytes(10) + b"\xff\xff" and words[12] == 127)


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads sockets from Linux's /proc")
def test_nproc_listens_on_loopback_only_and_leaves_no_process_behind(tmp_path):
    """`--nproc 2` meets through a private FileStore and connects its ranks over loopback: while it
    trains, none of its processes listens on another interface; SIGTERM to the command stops them all,
with a checkpoint."""
    cmd = [sys.executable, "-m", "fnrl", "train", "ppo", "--env", "CartPole-v1", "--nproc", "2", "--total-steps",
           "2000000", "--num-envs", "4", "--num-steps", "32", "--quiet", "--log-dir", "run", "--no-compile"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        progress = tmp_path / "run" / "progress.csv"
        while not (progress.exists() and len(progress.read_text().splitlines()) > 1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.5)
        workers = descendants(proc.pid)
        assert len(workers) >= 2
        listening = _listening([proc.pid, *workers])
        assert all(_loopback(a) for a in listening), listening
    finally:
        proc.send_signal(signal.SIGTERM)   # to the command only: it forwards the stop to its ranks
        err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 128 + signal.SIGTERM and "fnrl: stopped by SIGTERM at env step" in err, err[-2000:]
    time.sleep(1)
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                and "zombie" not in Path(f"/proc/{pid}/status").read_text()]


def test_loopback_addresses_are_read_as_proc_net_writes_them():
    assert _loopback("0100007F:1F90") and not _loopback("00000000:1F90") and not _loopback("0A00020F:0050")
    assert _loopback("00000000000000000000000001000000:1F90")          # ::1
    assert not _loopback("00000000000000000000000000000000:1F90")      # ::
    assert _loopback("0000000000000000FFFF00000100007F:1F90")          # ::ffff:127.0.0.1
