"""fnrl.accel.AccelOptions: the speed options a run passes down, read from the environment when
not given, and honoured by the compile wiring."""
from __future__ import annotations

import pytest

from fnrl import algos, envs
from fnrl.accel import AccelOptions, aot
from fnrl.accel.compiled import make_agent
from fnrl.accel.options import ENVIRON, resolve
from fnrl.errors import ConfigError


def test_defaults_are_all_on_and_the_environment_turns_each_off():
    assert AccelOptions() == AccelOptions(ahead_of_time=True, skip_guards=True, fused_learner=True)
    assert AccelOptions.from_environ({}) == AccelOptions()
    assert AccelOptions.from_environ({"FNRL_AHEAD_OF_TIME": "0"}) == AccelOptions(ahead_of_time=False)
    assert AccelOptions.from_environ({"FNRL_SKIP_GUARDS": "false", "FNRL_FUSED_LEARNER": "Off"}) == \
        AccelOptions(skip_guards=False, fused_learner=False)
    assert AccelOptions.from_environ({"FNRL_FUSED_LEARNER": "1", "FNRL_SKIP_GUARDS": ""}) == AccelOptions()
    assert set(ENVIRON) == {"ahead_of_time", "skip_guards", "fused_learner"}


def test_a_value_that_is_not_yes_or_no_is_one_config_error_line():
    with pytest.raises(ConfigError, match=r"\$FNRL_AHEAD_OF_TIME must be 0 or 1, got 'maybe'"):
        AccelOptions.from_environ({"FNRL_AHEAD_OF_TIME": "maybe"})


def test_resolve_reads_the_environment_only_when_nothing_is_passed(monkeypatch):
    monkeypatch.setenv("FNRL_SKIP_GUARDS", "0")
    assert resolve(None) == AccelOptions(skip_guards=False)
    assert resolve(AccelOptions()) == AccelOptions()   # a passed value wins over the environment
    with pytest.raises(TypeError, match="AccelOptions"):
        resolve({"skip_guards": False})


@pytest.mark.parametrize("ahead_of_time", [True, False])
def test_make_agent_acts_ahead_of_time_only_where_asked(ahead_of_time):
    config = algos.default_config("dqn")
    env = envs.make(config.env_id, 2, seed=0)
    try:
        agent = make_agent(algos.load("dqn"), config, env.spec, compile=True,
                           accel=AccelOptions(ahead_of_time=ahead_of_time))
    finally:
        env.close()
    assert isinstance(agent.act, aot.AotAct) == ahead_of_time
