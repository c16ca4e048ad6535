"""fnrl.accel.aot.AotFunction: a function of tensors and TensorDicts, with a gradient inside and
in-place writes into its inputs, as one AOTInductor model that gives eager's results."""
import pytest
import torch
from tensordict import TensorDict

from fnrl.accel import aot


def sgd_step(state: TensorDict, x: torch.Tensor, lr: torch.Tensor):
    """One SGD step on a least-squares loss, written into `state` in place; returns metrics."""
    def loss_fn(params):
        return ((x @ params["w"] + params["b"]) ** 2).mean()

    grads, loss = torch.func.grad_and_value(loss_fn)(state["params"].to_dict())
    state["params"].update_({k: state["params", k] - lr * g for k, g in grads.items()})
    state["steps"].add_(1)
    return {"loss": loss, "w_norm": state["params", "w"].norm()}


def fresh_state() -> TensorDict:
    g = torch.Generator().manual_seed(0)
    return TensorDict({"params": {"w": torch.randn(3, 2, generator=g), "b": torch.zeros(2)},
                       "steps": torch.zeros((), dtype=torch.int64)}, batch_size=[])


def test_aot_function_equals_eager_and_writes_its_inputs_in_place():
    x, lr = torch.randn(5, 3, generator=torch.Generator().manual_seed(1)), torch.tensor(0.1)
    eager_state, aot_state = fresh_state(), fresh_state()
    w_tensor = aot_state["params", "w"]
    model = aot.AotFunction(sgd_step, (aot_state, x, lr))
    for step in range(3):
        expected = sgd_step(eager_state, x, lr)
        got = model(aot_state, x, lr)
        assert isinstance(got, TensorDict) and set(got.keys()) == {"loss", "w_norm"}
        torch.testing.assert_close(got.to_dict(), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(aot_state.to_dict(), eager_state.to_dict(), rtol=1e-6, atol=1e-6)
    assert aot_state["params", "w"] is w_tensor and int(aot_state["steps"]) == 3   # written in place
    matched, got = model.call_if_matches(aot_state, x, lr)
    assert matched and int(aot_state["steps"]) == 4 and set(got.keys()) == {"loss", "w_norm"}
    assert model.call_if_matches(aot_state, torch.randn(4, 3), lr) == (False, None)   # another shape: not run
    assert model.call_if_matches(aot_state, x) == (False, None) and int(aot_state["steps"]) == 4


def test_outputs_rebuilt_without_pytree_are_pytrees_unflatten():
    """A model's tuple of tensors and TensorDicts (nested, with batch sizes of their own) is rebuilt
    by `_rebuilder` as `pytree.tree_unflatten` builds it: the same structure around the same tensors."""
    from torch.utils import _pytree as pytree

    example = (TensorDict({"params": {"w": torch.ones(3)}, "critics": TensorDict({"q": torch.ones(2, 4)}, [2]),
                           "step": torch.zeros((), dtype=torch.int64)}, batch_size=[]),
               torch.zeros(5), TensorDict({"loss": torch.ones(7)}, batch_size=[7]))
    values, spec = pytree.tree_flatten(example)
    build = aot._rebuilder(pytree.tree_unflatten(values, spec), values, spec)
    fresh = [torch.randn(v.shape).to(v.dtype) for v in values]
    rebuilt, expected = build(fresh), pytree.tree_unflatten(fresh, spec)
    leaves, rebuilt_spec = pytree.tree_flatten(rebuilt)
    assert rebuilt_spec == spec and all(a is b for a, b in zip(leaves, fresh))
    assert rebuilt[0]["critics"].batch_size == torch.Size([2]) and rebuilt[2].batch_size == torch.Size([7])
    assert (rebuilt[0] == expected[0]).all() and (rebuilt[2] == expected[2]).all()
    with_dict = (torch.zeros(2), {"a": torch.ones(1)})   # a structure it does not build: pytree's unflatten
    values, spec = pytree.tree_flatten(with_dict)
    assert aot._rebuilder(with_dict, values, spec)(values)[1]["a"] is values[1]


def test_aot_function_refuses_inputs_that_share_memory_and_non_tensor_args():
    state = fresh_state()
    with pytest.raises(ValueError, match="share memory"):
        aot.AotFunction(sgd_step, (state, state["params", "w"].T, torch.tensor(0.1)))
    with pytest.raises(TypeError, match="tensors and TensorDicts"):
        aot.AotFunction(sgd_step, (state, torch.zeros(5, 3), 0.1))


def test_aot_functions_that_differ_only_inside_a_scan_body_are_different_models(monkeypatch, tmp_path):
    """The package cache tells programs apart by their subgraphs too: two scans whose bodies add
    different constants give their own results (not the first one's package)."""
    from fnrl.algos.common import scan_steps

    monkeypatch.setenv("FNRL_CACHE_DIR", str(tmp_path))

    def adding(c: float):
        def fn(x, xs):
            def step(carry, xi):
                (td,) = carry
                return (TensorDict({"s": td["s"] + c * xi}, []),), {"total": td["s"].sum()}

            (td,), _ = scan_steps(step, (TensorDict({"s": x}, []),), xs)
            return td["s"]
        return fn

    x, xs = torch.zeros(3), torch.ones(4, 3)
    for c in (1.0, 2.0):
        got = aot.AotFunction(adding(c), (x, xs))(x, xs)
        torch.testing.assert_close(got, torch.full((3,), 4 * c))
    assert len(list((tmp_path / "aoti").glob("*.pt2"))) == 2


def test_a_package_is_keyed_by_the_cpus_vector_isa(monkeypatch):
    """A package built for one vector ISA (AVX-512) must not load on a host without it (AVX2) that
    shares the cache folder: the ISA is part of the key."""
    program = torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))
    keys = set()
    for isa in ("AVX512", "AVX2", "AVX512"):
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda isa=isa: isa)
        keys.add(aot._package_key(program, {}))
    assert len(keys) == 2


def test_aot_serves_the_cpu_only(monkeypatch):
    """AOTInductor models serve CPU calls; CUDA calls go through torch.compile (a CUDA model's
    load crashed the process on an H200, and CUDA graphs do the models' job there)."""
    from fnrl.accel import aot

    assert aot.serves("cpu") and aot.serves(torch.device("cpu"))
    assert not aot.serves("cuda") and not aot.serves(torch.device("cuda", 0))
