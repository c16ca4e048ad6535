"""fnrl.presets: tuned settings per (algorithm, env), applied unless turned off, overridden by options."""
import dataclasses
import json

import pytest

from fnrl import algos, presets
from fnrl.cli import main
from fnrl.errors import ConfigError

TINY = ["--total-steps", "256", "--num-envs", "4", "--num-steps", "32", "--update-epochs", "1", "--no-compile",
        "--quiet", "--eval-episodes", "1"]


@pytest.mark.parametrize("algo", sorted(p.stem for p in presets.FOLDER.glob("*.toml")))
def test_every_preset_names_its_source_and_builds_a_valid_config(algo):
    assert algo in algos.ALGOS
    for env_id, entries in presets.table(algo).items():
        assert entries["source"]
        config, name = presets.configure(algo, env_id)
        assert name == f"{algo}/{env_id}" and config.env_id == env_id
        for field, value in presets.settings(algo, env_id).items():
            assert getattr(config, field) == value
        algos.load(algo).validate(config)


def test_explicit_fields_override_the_preset_and_none_keeps_the_defaults():
    config, name = presets.configure("ppo", "Acrobot-v1", learning_rate=1e-4)
    assert name == "ppo/Acrobot-v1" and config.learning_rate == 1e-4 and config.num_envs == 16
    bare, none = presets.configure("ppo", "Acrobot-v1", preset="none")
    assert none is None and bare == dataclasses.replace(algos.default_config("ppo"), env_id="Acrobot-v1")
    assert presets.configure("ppo", "MountainCar-v0")[1] is None      # no preset for this env
    with pytest.raises(ConfigError, match="--preset must be one of auto, none"):
        presets.configure("ppo", preset="zoo")


def test_a_preset_with_an_unknown_field_or_no_source_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setattr(presets, "FOLDER", tmp_path)
    presets.table.cache_clear()
    try:
        (tmp_path / "ppo.toml").write_text('["CartPole-v1"]\nsource = "x"\nlearning_rat = 1e-3\n')
        with pytest.raises(ConfigError, match="learning_rat is not a field of ppo's Config"):
            presets.configure("ppo")
        presets.table.cache_clear()
        (tmp_path / "ppo.toml").write_text('["CartPole-v1"]\nlearning_rate = 1e-3\n')
        with pytest.raises(ConfigError, match="needs a `source`"):
            presets.configure("ppo")
    finally:
        presets.table.cache_clear()


def test_the_command_says_which_preset_it_uses_and_records_it(tmp_path, capsys):
    assert main(["train", "ppo", "--log-dir", str(tmp_path / "a"), "--learning-rate", "5e-4", *TINY]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("fnrl: preset ppo/CartPole-v1 (rl-baselines3-zoo")
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["preset"] == "ppo/CartPole-v1" and saved["config"]["learning_rate"] == 5e-4
    assert saved["config"]["gamma"] == 0.98 and saved["config"]["total_steps"] == 256   # preset, then options

    assert main(["train", "ppo", "--log-dir", str(tmp_path / "b"), "--preset", "none", *TINY]) == 0
    assert "preset" not in capsys.readouterr().out
    assert json.loads((tmp_path / "b" / "config.json").read_text())["preset"] is None

    assert main(["train", "ppo", "--preset", "zoo", *TINY]) == 2
    err = capsys.readouterr().err
    assert "--preset" in err and err.count("\n") == 1
