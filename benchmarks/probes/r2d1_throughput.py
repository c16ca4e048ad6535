"""R2D1 throughput with the Atari network: update steps/s (compiled vs eager) and Pong env steps/s.

Three measurements, one after the other (one heavy process at a time), one torch thread:

1. updates/s of R2D1 with rlpyt's Atari settings (`experiments/r2d1_atari.py`: Nature CNN +
   fc 512, LSTM 512, dueling head 512; 64 sequences of burn-in 40 + 80 trained + 5 bootstrap
   rows), eager and `torch.compile(fullgraph=True)`. Each measurement runs in a subprocess
   with a fresh inductor cache (a cold compile, as a first run sees it), on a sequence replay
   filled by the agent acting in Pong-v5 (32 envs x 40 steps per collect); one timed update is
   sample + update + update_priorities, as the training loop does. The compiled run gets
   `--compile-timeout` seconds; when the full-length compile cannot finish in that time, the
   table says so and compiled vs eager is compared at the shorter `--short` sequence.
2. env steps/s of `fnrl.train.train("r2d1", ...)` on Pong-v5 with the Atari config, reduced
   where the full one cannot run here: learning_starts and buffer_size smaller (see the table),
   a few collects past learning_starts, compiled only if the full-length compile fit in (1).
3. (`--cartpole`) R2D1's default Config on fnrl/CartPoleNoVel-v1, 200k steps, stop_return 450:
   the env step at which return_mean first reaches 400 and 450 (subprocess, `--cartpole-timeout`).

    python benchmarks/probes/r2d1_throughput.py [--batch 64] [--short 10,20] [--compile-timeout 480]
        [--pong-updates 4] [--cartpole]

Writes benchmarks/probes/r2d1_throughput.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/: machine
from machine import cpu_model  # noqa: E402

OUTPUT = Path(__file__).with_suffix(".md")
GAME = "Pong"
RLPYT_SPS = 16_000


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    import envpool
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU only)"
    return (f"nproc={os.cpu_count()}, CPU: {cpu_model()}, GPU: {gpu}, torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op thread), envpool {envpool.__version__}, "
            f"Python {platform.python_version()}")


def atari(**overrides):
    from experiments.r2d1_atari import atari_config

    return atari_config(GAME, **overrides)


def trained_samples_per_env_step(config) -> float:
    """rlpyt's replay ratio: trained (non-burn-in) rows replayed per env step generated."""
    return config.replay_ratio * config.batch_size * config.seq_len


# ---------------------------------------------------------------------------
# 1. updates per second (worker: one process per measurement)
# ---------------------------------------------------------------------------


def update_worker(burn_in: int, seq_len: int, batch: int, compiled: bool, updates: int) -> dict:
    """Fill a sequence replay by acting in Pong, then time sample + update + update_priorities."""
    import torch

    from fnrl import envs
    from fnrl.algos import r2d1
    from fnrl.replay import sequence
    from fnrl.samplers import SerialSampler
    from fnrl.loops.off_policy import init_sequence_replay

    torch.set_num_threads(1)
    cfg = atari(burn_in=burn_in, seq_len=seq_len, batch_size=batch, buffer_size=32 * 400, learning_starts=0)
    env = envs.make(cfg.env_id, cfg.num_envs, seed=0)
    agent = r2d1.make(cfg, env.spec)
    state = agent.init(0)
    sampler = SerialSampler(env, agent.act, cfg.num_steps)
    buffer = None
    while buffer is None or not sequence.can_sample(buffer, batch):
        rollout = sampler.collect(state)
        data, priority = r2d1.sequence_input(cfg, rollout)
        buffer = buffer or init_sequence_replay(cfg, data, env.spec, "cpu")
        buffer = sequence.add(buffer, data, priority)
    env.close()
    update = torch.compile(agent.update, fullgraph=True) if compiled else agent.update

    def one(state, buffer):
        batch_td = sequence.sample(buffer, batch, beta=cfg.priority_beta)
        state, metrics = update(state, batch_td)
        buffer = sequence.update_priorities(buffer, batch_td["index"][0], metrics["priority"])
        float(metrics["loss/q"])
        return state, buffer

    start = time.perf_counter()
    state, buffer = one(state, buffer)                    # compile (or eager warm-up) + first update
    first = time.perf_counter() - start
    times = []
    for _ in range(updates):
        start = time.perf_counter()
        state, buffer = one(state, buffer)
        times.append(time.perf_counter() - start)
    return {"first_s": first, "update_s": sum(times) / len(times), "times": times}


def updates_per_second(burn_in, seq_len, batch, compiled, updates, timeout) -> dict:
    """Run `update_worker` in a subprocess with a fresh inductor cache; {"timeout": True} if it ran out."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp(prefix="r2d1_inductor_"))
    args = [sys.executable, __file__, "--update-worker", str(burn_in), str(seq_len), str(batch),
            str(int(compiled)), str(updates)]
    row = {"burn_in": burn_in, "seq_len": seq_len, "batch": batch, "compiled": compiled, "load": load()}
    start = time.perf_counter()
    try:
        out = subprocess.run(args, capture_output=True, text=True, check=True, timeout=timeout, env=env)
        row.update(json.loads(out.stdout.strip().splitlines()[-1]))
    except subprocess.TimeoutExpired:
        row["timeout"] = True
    row["wall_s"] = time.perf_counter() - start
    row["load_end"] = load()
    print(json.dumps(row), flush=True)
    return row


# ---------------------------------------------------------------------------
# 2. env steps per second of the training loop on Pong
# ---------------------------------------------------------------------------


def pong_training(updates: int, compiled: bool) -> dict:
    import torch

    from fnrl.train import train

    collect = 32 * 40
    learning_starts = 5 * collect      # 200 rows per env: 64 sampleable sequences (starts 0 and 40)
    cfg = atari(learning_starts=learning_starts, total_steps=learning_starts + (updates - 1) * collect,
                buffer_size=32 * 400)
    load_start = load()
    result = train("r2d1", cfg, seed=0, compile=compiled, quiet=True, log_dir=tempfile.mkdtemp() + "/run",
                   log_interval=collect, tensorboard=False, plot=False, threads=1)
    rows = result.history
    acting = [r for r in rows if collect < r["env_steps"] < learning_starts]    # first collect: env start-up
    learning = [r for r in rows if r["env_steps"] >= learning_starts]
    if compiled:
        learning = learning[1:]                                                # first update: compilation
    rate = lambda rs: len(rs) * collect / sum(collect / r["sps"] for r in rs)  # noqa: E731
    return {"config": cfg, "threads": torch.get_num_threads(), "acting_sps": rate(acting),
            "training_sps": rate(learning), "learning_collects": len(learning), "updates": rows[-1]["updates"],
            "load": load_start, "load_end": load()}


# ---------------------------------------------------------------------------
# 3. CartPoleNoVel (subprocess, so a timeout keeps the rows logged so far)
# ---------------------------------------------------------------------------


def cartpole_worker(log_dir: str) -> None:
    import dataclasses

    from fnrl.algos import r2d1
    from fnrl.train import train

    cfg = dataclasses.replace(r2d1.Config(), env_id="fnrl/CartPoleNoVel-v1", total_steps=200_000)
    train("r2d1", cfg, seed=0, quiet=True, log_dir=log_dir, tensorboard=False, plot=False, stop_return=450)


def cartpole(timeout: int) -> dict:
    log_dir = tempfile.mkdtemp() + "/run"
    load_start, start = load(), time.perf_counter()
    try:
        subprocess.run([sys.executable, __file__, "--cartpole-worker", log_dir], check=True, timeout=timeout,
                       capture_output=True, text=True)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    wall = time.perf_counter() - start
    with open(Path(log_dir) / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    first = lambda x: next((int(r["env_steps"]) for r in rows if float(r["return_mean"]) >= x), None)  # noqa: E731
    return {"reach_400": first(400), "reach_450": first(450), "last_step": int(rows[-1]["env_steps"]),
            "last_return": float(rows[-1]["return_mean"]), "wall_s": wall, "timed_out": timed_out,
            "load": load_start, "load_end": load()}


# ---------------------------------------------------------------------------


def cartpole_section(cart: dict) -> list[str]:
    """Markdown lines of part 3 from `cartpole()`'s result."""
    reach = lambda s: f"{s:,}" if s is not None else "not reached"  # noqa: E731
    return [
        "",
        "## 3. R2D1 on fnrl/CartPoleNoVel-v1 (default Config)",
        "",
        "| run | first step with return_mean >= 400 | >= 450 | last step | last return_mean | wall (s) "
        "| load avg (start; end) |",
        "|---|---:|---:|---:|---:|---:|---|",
        f"| `train(\"r2d1\", Config(env_id=\"fnrl/CartPoleNoVel-v1\", total_steps=200_000), seed=0, "
        f"stop_return=450)`, compiled | {reach(cart['reach_400'])} | {reach(cart['reach_450'])} "
        f"| {cart['last_step']:,} | {cart['last_return']:.1f} | {cart['wall_s']:.0f}"
        f"{' (timeout)' if cart['timed_out'] else ''} | {cart['load']}; {cart['load_end']} |",
        "",
        "return_mean is the mean return of the training episodes ending in each 2,000-step log "
        "interval (with exploration epsilon), one seed.",
    ]


def fmt_rate(row) -> str:
    return "did not finish" if row.get("timeout") else f"{1 / row['update_s']:.3f}"


def fmt_first(row, timeout) -> str:
    return f"> {timeout:.0f} (killed)" if row.get("timeout") else f"{row['first_s']:.0f}"


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64, help="sequences per update (rlpyt: 64)")
    parser.add_argument("--short", default="10,20", help="burn_in,seq_len of the shorter sequence")
    parser.add_argument("--updates", type=int, default=2, help="timed updates per measurement")
    parser.add_argument("--compile-timeout", type=int, default=480, help="seconds for a compiled measurement")
    parser.add_argument("--pong-updates", type=int, default=4, help="collects (one update each) past learning_starts")
    parser.add_argument("--cartpole", action="store_true", help="also run R2D1 on fnrl/CartPoleNoVel-v1")
    parser.add_argument("--cartpole-timeout", type=int, default=360)
    parser.add_argument("--out", default=str(OUTPUT))
    parser.add_argument("--update-worker", nargs=5, type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cartpole-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.update_worker:
        burn, T, N, compiled, n = args.update_worker
        print(json.dumps(update_worker(burn, T, N, bool(compiled), n)))
        return
    if args.cartpole_worker:
        cartpole_worker(args.cartpole_worker)
        return

    import torch

    torch.set_num_threads(1)
    where, started, load_start = machine(), time.strftime("%Y-%m-%d %H:%M"), load()
    full = atari()
    short_burn, short_T = (int(x) for x in args.short.split(","))
    eager_full = updates_per_second(full.burn_in, full.seq_len, args.batch, False, args.updates, None)
    compiled_full = updates_per_second(full.burn_in, full.seq_len, args.batch, True, args.updates,
                                       args.compile_timeout)
    short_rows = []
    if compiled_full.get("timeout"):
        short_rows = [updates_per_second(short_burn, short_T, args.batch, c, args.updates,
                                         args.compile_timeout if c else None) for c in (False, True)]
    pong = pong_training(args.pong_updates, compiled=not compiled_full.get("timeout"))
    cart = cartpole(args.cartpole_timeout) if args.cartpole else None

    cfg = pong["config"]
    ratio = trained_samples_per_env_step(cfg)
    lines = [
        "# R2D1 throughput with the Atari network (Pong-v5)",
        "",
        f"Machine: {where}. Measured {started}; load average (1/5/15 min) {load_start} at the start. "
        "Timings were taken on a **shared 2-core machine** with other jobs running (see the load "
        "columns), one torch thread, one run each: expect noise of tens of percent.",
        "",
        "Network and algorithm settings: rlpyt's R2D1 Atari config (`experiments/r2d1_atari.py`): "
        "Nature CNN + fc 512, LSTM 512, dueling head of 512 per stream, 5-step double-Q targets under "
        "value rescaling, prioritized sequence replay (alpha 0.9, eta 0.9), Adam with grad-norm "
        f"clip 80, batch {args.batch} sequences (rlpyt's 64). An update = replay sample + "
        "`agent.update` + `update_priorities`, as the training loop runs it; `update` unrolls the "
        "online network over all rows (burn-in without gradient) and the target network over all "
        "rows.",
        "",
        "## 1. Update steps per second, eager vs `torch.compile(fullgraph=True)`",
        "",
        "| sequence (burn-in + trained + n-step rows) | mode | first call incl. compile (s) "
        "| steady update (s) | updates/s | trained samples/s | load avg (start; end) |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for row in [eager_full, compiled_full, *short_rows]:
        seq = f"{row['burn_in']} + {row['seq_len']} + {full.n_step}"
        steady = "-" if row.get("timeout") else f"{row['update_s']:.1f}"
        samples = "-" if row.get("timeout") else f"{row['batch'] * row['seq_len'] / row['update_s']:.0f}"
        lines.append(f"| {seq} | {'compiled' if row['compiled'] else 'eager'} "
                     f"| {fmt_first(row, args.compile_timeout)} | {steady} | {fmt_rate(row)} | {samples} "
                     f"| {row['load']}; {row['load_end']} |")
    lines += [
        "",
        f"Steady update = mean of {args.updates} updates after the first call. The compiled runs start "
        "from an empty inductor cache (a cold compile). `first call` of an eager run is one update "
        "plus warm-up; of a compiled run it is the compile time plus one update.",
    ]
    if compiled_full.get("timeout"):
        lines += [
            "",
            f"**The full-length compile (burn-in {full.burn_in} + {full.seq_len} + {full.n_step} rows) did "
            f"not finish within {args.compile_timeout} s on this machine** and was killed: `update` traces "
            "both networks' "
            f"{full.burn_in + full.seq_len + full.n_step}-step Python unrolls plus the backward of the "
            f"{full.seq_len + full.n_step} trained steps, and Dynamo/inductor time grows with the unroll. "
            f"Compiled vs eager is therefore compared at the shorter sequence burn-in {short_burn} + "
            f"{short_T} trained + {full.n_step} n-step rows (same network, same batch); the full length "
            "is measured eager only.",
        ]
    lines += [
        "",
        "## 2. Env steps per second of R2D1 training on Pong-v5",
        "",
        "| run | hardware | env steps/s | replay ratio (trained samples / env step) | updates / env step |",
        "|---|---|---:|---:|---:|",
        f"| fnrl `train(\"r2d1\")`, Atari config, past learning_starts "
        f"({'compiled' if not compiled_full.get('timeout') else 'eager'}) "
        f"| this machine (2 shared cores, 1 torch thread, no GPU) | {pong['training_sps']:.0f} | {ratio:g} "
        f"| 1/{1 / cfg.replay_ratio:.0f} |",
        f"| fnrl, acting + env + replay only (before learning_starts) | same | {pong['acting_sps']:.0f} | - | - |",
        f"| rlpyt R2D1 (reported) | 24 CPUs, 3 GPUs, asynchronous sampler/optimizer | {RLPYT_SPS:,} "
        "| 4 (`atari_r2d1.py` config `r2d1`); 1 in its long-run / async configs | 1/1280 at 4 |",
        "",
        f"fnrl run: `train(\"r2d1\", atari_config(\"Pong\", learning_starts={cfg.learning_starts}, "
        f"total_steps={cfg.total_steps}, buffer_size={cfg.buffer_size}), threads=1, "
        f"compile={not compiled_full.get('timeout')})`: everything else is the Atari config ({cfg.num_envs} "
        f"envs x {cfg.num_steps} steps per collect, batch {cfg.batch_size} x ({cfg.burn_in} + {cfg.seq_len} + "
        f"{cfg.n_step}) rows, replay_ratio 1/{1 / cfg.replay_ratio:.0f} = one update per collect). Reduced: "
        f"learning_starts {cfg.learning_starts} instead of 100,000 (the smallest with {cfg.batch_size} "
        f"sampleable sequences) and buffer_size {cfg.buffer_size} instead of 998,400 (a throughput run "
        f"never fills it). Timed: the {pong['learning_collects']} collects past learning_starts "
        f"({pong['learning_collects'] * cfg.num_envs * cfg.num_steps} env steps, {pong['updates']} updates); "
        f"load average {pong['load']} at the start, {pong['load_end']} at the end. At this replay ratio one "
        "update per 1,280 env steps dominates: the training rate is about 1,280 / (collect time + one "
        "update time).",
        "",
        f"rlpyt's figure is its reported R2D1 rate with 24 CPU cores and 3 GPUs (asynchronous mode: "
        "sampler and optimizer run in parallel on separate GPUs). rlpyt's replay ratio counts trained "
        "samples (batch_B x batch_T, burn-in excluded) per env step; fnrl's `replay_ratio` counts updates "
        f"per env step, so fnrl's {ratio:g} = {cfg.batch_size} x {cfg.seq_len} x 1/{1 / cfg.replay_ratio:.0f}. "
        f"At replay ratio 4, {RLPYT_SPS:,} env steps/s means {RLPYT_SPS * 4 / (cfg.batch_size * cfg.seq_len):.1f} "
        f"updates/s of batch {cfg.batch_size}; at 1 it means {RLPYT_SPS / (cfg.batch_size * cfg.seq_len):.1f}. "
        "rlpyt's configs set replay_ratio 4 for `r2d1` and 1 for `r2d1_long` / `async_gpu*` (its long "
        "runs); which one the 16,000 figure used is not stated in the sources checked here.",
    ]
    if cart is not None:
        lines += cartpole_section(cart)
    lines += [
        "",
        f"Reproduce: `python benchmarks/probes/r2d1_throughput.py --batch {args.batch} --short {args.short} "
        f"--compile-timeout {args.compile_timeout} --pong-updates {args.pong_updates}"
        f"{' --cartpole' if args.cartpole else ''}`.",
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
