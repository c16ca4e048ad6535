"""fnrl.accel.inductor: the torch-version rule for Inductor's loop reordering, and compiling with
`cpp_wrapper` on the CPU only."""
import torch
from tensordict import TensorDict

from fnrl.accel import inductor


def test_release_parses_torch_versions_and_the_rule_follows_it():
    assert inductor._release("2.11.0+cu130") == (2, 11)
    assert inductor._release("2.13.0+cpu") == (2, 13)
    assert inductor._release("2.12.0a0+git1234") == (2, 12)
    assert inductor.LOOP_ORDERING_BROKEN == (inductor._release(torch.__version__) < (2, 12))


def test_apply_workarounds_turns_loop_ordering_off_only_where_broken(monkeypatch):
    import torch._inductor.config as config

    with config.patch(loop_ordering_after_fusion=True):
        monkeypatch.setattr(inductor, "LOOP_ORDERING_BROKEN", False)
        inductor.apply_workarounds()
        assert config.loop_ordering_after_fusion is True
        monkeypatch.setattr(inductor, "LOOP_ORDERING_BROKEN", True)
        inductor.apply_workarounds()
        assert config.loop_ordering_after_fusion is False


def test_compile_with_cpp_wrapper_on_cpu_compiles_once_per_device_type(monkeypatch):
    made = []

    def fake_compile(fn, options=None, **kwargs):
        made.append((options, kwargs))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    call = inductor.compile_with_cpp_wrapper_on_cpu(lambda state, x: state["w"] + x, {"fallback_random": True},
                                                    fullgraph=True)
    state = TensorDict({"w": torch.ones(2)}, [])
    for _ in range(2):
        torch.testing.assert_close(call(state, torch.ones(2)), torch.full((2,), 2.0))
    assert made == [({"fallback_random": True, "cpp_wrapper": True}, {"fullgraph": True})]
    assert inductor.first_tensor(None, 3, state, torch.zeros(1)) is state["w"]
