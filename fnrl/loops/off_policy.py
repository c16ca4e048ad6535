"""The off-policy half of the serial loop: rollouts into replay, then the updates they paid for.

    learner = ReplayLearner(plan, agent, env.spec, fused=True)
    learner.add(rollout)                                  # every collect
    state, metrics, n = learner.learn(state, env_steps)   # the updates due, n of them

Updates accrue at `config.replay_ratio` per env step once `learning_starts` env steps are in, and
run while the buffer can fill a batch; each draws from replay and updates (`fnrl.learner`), with
the prioritized replay's exponent beta annealed linearly from `priority_beta` to 1 over the run.
The replay is a row buffer (`fnrl.replay`), a sequence buffer for `SPEC.replay == "sequence"`
algorithms (R2D1, `fnrl.replay.sequence`), or one of either per vmapped row (`fnrl.replay.multi`).
A tiered agent (`fnrl.accel.tiered.TieredAgent`) gives the learner step of the tier that runs, and
switches tiers before an iteration's updates.
"""
from __future__ import annotations

import torch

from fnrl import learner as learner_steps
from fnrl.accel.tiered import TieredAgent
from fnrl.run.checkpoint import replay_to_save, resumed_replay


class ReplayLearner:
    """The replay buffer and learner step of one serial run (`plan`: `fnrl.run.plan.Plan`) of
    `agent`. A resumed run starts from its checkpoint's buffer and update credit where it holds them."""

    def __init__(self, plan, agent, spec, fused: bool, ahead_of_time: bool = True):
        from fnrl import replay
        from fnrl.replay import multi, sequence

        self.plan, self.config, self.spec = plan, plan.config, spec
        self.replay = multi if plan.rows else (sequence if plan.sequence_replay else replay)
        self.buffer, self.credit = (resumed_replay(plan.ckpt, plan.resume, plan.device) if plan.ckpt is not None
                                    else (None, 0.0))
        self.tiered = agent if isinstance(agent, TieredAgent) else None
        self._last = (None, 1)   # a tiered run's: the last rollout added, and the threads that added it
        if self.tiered is not None:
            self._learn = self.tiered.learner(self.config.batch_size, self.config.prioritized)
            return
        self._learn = learner_steps.make_learner(
            agent.update, self.config.batch_size, self.config.prioritized, fused=fused,
            ahead_of_time=fused and ahead_of_time and plan.accel.ahead_of_time, replay=self.replay,
            sample_options={} if plan.sequence_replay else {"compiled": plan.compile}, rows=bool(plan.rows),
            cuda_graph=plan.cuda_graphs)

    def add(self, rollout) -> None:
        """Put a collected rollout [T, width * B] into replay (made on the first call)."""
        plan = self.plan
        if plan.sequence_replay:
            if plan.rows:
                from fnrl import seeds as vmapped

                data, priority = vmapped.sequence_input(plan.module, plan.rows, rollout)
            else:
                data, priority = plan.module.sequence_input(self.config, rollout)
            if self.buffer is None:
                self.buffer = init_sequence_replay(self.config, data, self.spec, plan.device, plan.rows)
            self.buffer = self.replay.add(self.buffer, data, priority)
            return
        if self.buffer is None:
            self.buffer = init_replay(self.config, rollout, self.spec, plan.device, plan.rows)
        compiled = plan.compile and (self.tiered is None or self.tiered.tier == "compiled")
        self.buffer = self.replay.add(self.buffer, rollout, compiled=compiled, ahead_of_time=plan.accel.ahead_of_time)
        if self.tiered is not None:
            self._last = (rollout, torch.get_num_threads())

    def learn(self, state, env_steps: int, collected: int):
        """Run the updates due after `collected` more env steps (this rank's count now `env_steps`):
        (state, the last update's metrics or None, the number of updates)."""
        config, metrics, n = self.config, None, 0
        if env_steps < config.learning_starts:
            return state, metrics, n
        if self.tiered is not None:
            state = self.tiered.before_updates(state, self.buffer, *self._last)
        self.credit += collected * config.replay_ratio
        beta = config.priority_beta + (1.0 - config.priority_beta) * env_steps / config.total_steps
        while self.credit >= 1.0 and self.replay.can_sample(self.buffer, config.batch_size):
            state, self.buffer, metrics = self._learn(state, self.buffer, beta)
            self.credit -= 1.0
            n += 1
        return state, metrics, n

    def checkpoint_entries(self, keep_buffer: bool) -> dict:
        """What a checkpoint holds of the learner: the buffer (`keep_buffer`, and if not too large)
        and the update credit."""
        return {"replay": replay_to_save(self.buffer) if keep_buffer else None, "update_credit": self.credit}


def init_replay(config, rollout, spec, device, rows=None):
    """The replay buffer; for the rows of a vmapped run, one buffer per row with the row's gamma."""
    from fnrl import replay

    options = dict(n_step=config.n_step, prioritized=config.prioritized, alpha=config.priority_alpha,
                   frame_dedup=spec.is_atari, device=device)
    if rows:
        from fnrl.replay import multi

        return multi.init(rollout, config.buffer_size, num_rows=len(rows), gamma=[row.config.gamma for row in rows],
                          **options)
    return replay.init(rollout, config.buffer_size, gamma=config.gamma, **options)


def init_sequence_replay(config, rollout, spec, device, seed_rows=None):
    """Sequence replay for algorithms that declare `replay="sequence"` (R2D1): sequences of
    burn_in + seq_len + n_step rows starting every carry_interval rows; for the rows of a
    vmapped run, one such buffer per row (fnrl.replay.multi.init_sequence)."""
    from fnrl.replay import multi, sequence

    rows = config.buffer_size // config.num_envs // config.carry_interval * config.carry_interval
    options = dict(burn_in=config.burn_in, seq_len=config.seq_len, n_step=config.n_step,
                   carry_interval=config.carry_interval, prioritized=config.prioritized,
                   alpha=config.priority_alpha, frame_dedup=spec.is_atari, device=device)
    if seed_rows:
        return multi.init_sequence(rollout, rows * config.num_envs, num_rows=len(seed_rows), **options)
    return sequence.init(rollout, rows * config.num_envs, **options)
