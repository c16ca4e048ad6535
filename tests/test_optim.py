"""Tests for fnrl.optim: hand-computed steps, step-for-step agreement with torch.optim on an
MLP in float64, schedules, target updates, fixed state layout, vmap and one compiled step."""
import math

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictParams
from torch import nn

from fnrl.optim import (
    GradientTransformation,
    Layout,
    adam,
    adamw,
    apply_updates,
    chain,
    clip_by_global_norm,
    constant_schedule,
    cosine_schedule,
    global_norm,
    hard_update,
    linear_schedule,
    polyak,
    rmsprop,
    sgd,
)
from tests.helpers import leaves_only

F64 = torch.float64
STEPS = 100


def td(**leaves) -> TensorDict:
    return TensorDict({k: torch.as_tensor(v, dtype=F64) for k, v in leaves.items()}, batch_size=[])


def assert_td_close(actual: TensorDict, expected: TensorDict, **kwargs) -> None:
    torch.testing.assert_close(actual.flatten_keys(".").to_dict(), expected.flatten_keys(".").to_dict(), **kwargs)


def run(tx, params, grads_per_step):
    state = tx.init(params)
    for grads in grads_per_step:
        updates, state = tx.update(grads, state, params)
        params = apply_updates(params, updates)
    return params, state


# ---------------------------------------------------------------------------
# hand-computed steps
# ---------------------------------------------------------------------------


def test_sgd_momentum_hand_values():
    params, grad = td(w=1.0), td(w=0.5)
    # b1 = 0.5, b2 = 0.9 * 0.5 + 0.5 = 0.95; w = 1 - 0.1 * (0.5 + 0.95)
    new, _ = run(sgd(0.1, momentum=0.9), params, [grad, grad])
    torch.testing.assert_close(new["w"], torch.tensor(1.0 - 0.05 - 0.095, dtype=F64))
    # nesterov: step 1 uses g + 0.9 b1 = 0.95
    new, _ = run(sgd(0.1, momentum=0.9, nesterov=True), params, [grad])
    torch.testing.assert_close(new["w"], torch.tensor(1.0 - 0.095, dtype=F64))


def test_adam_first_step_is_lr_times_sign():
    # after one step m_hat = g and v_hat = g^2, so the update is -lr * g / (|g| + eps)
    new, state = run(adam(0.1), td(w=[1.0, 1.0]), [td(w=[2.0, -0.5])])
    expected = [1 - 0.1 * 2 / (2 + 1e-8), 1 + 0.1 * 0.5 / (0.5 + 1e-8)]
    torch.testing.assert_close(new["w"], torch.tensor(expected, dtype=F64))
    torch.testing.assert_close(state["1", "exp_avg", "w"], torch.tensor([0.2, -0.05], dtype=F64))
    torch.testing.assert_close(state["1", "exp_avg_sq", "w"], torch.tensor([0.004, 0.00025], dtype=F64))


def test_rmsprop_first_step_hand_values():
    # s = 0.01 * 2^2 = 0.04, update = -lr * 2 / (0.2 + eps)
    new, _ = run(rmsprop(0.01), td(w=0.0), [td(w=2.0)])
    torch.testing.assert_close(new["w"], torch.tensor(-0.01 * 2 / (0.2 + 1e-8), dtype=F64))
    # centered: a = 0.02, s - a^2 = 0.0396
    new, _ = run(rmsprop(0.01, centered=True), td(w=0.0), [td(w=2.0)])
    torch.testing.assert_close(new["w"], torch.tensor(-0.01 * 2 / (math.sqrt(0.0396) + 1e-8), dtype=F64))


def test_clip_by_global_norm_hand_values():
    grads = TensorDict({"a": torch.tensor([3.0, 0.0], dtype=F64), "b": {"c": torch.tensor([4.0], dtype=F64)}}, [])
    torch.testing.assert_close(global_norm(grads), torch.tensor(5.0, dtype=F64))
    clip = clip_by_global_norm(1.0)
    clipped, state = clip.update(grads, clip.init(grads))
    scale = 1.0 / (5.0 + 1e-6)
    torch.testing.assert_close(clipped["a"], torch.tensor([3 * scale, 0.0], dtype=F64))
    torch.testing.assert_close(clipped["b", "c"], torch.tensor([4 * scale], dtype=F64))
    unclipped, _ = clip_by_global_norm(10.0).update(grads, state)
    assert_td_close(unclipped, grads, rtol=0, atol=0)


def test_global_norm_under_compile_is_sums_of_squares_inductor_can_fuse():
    """Under compile the global norm (TensorDict and leaf-list forms) is per-leaf sums of squares, not
    `_foreach_norm` (no Inductor lowering: AOTInductor calls it through its proxy fallback), with the same value."""
    from torch._dynamo.testing import EagerAndRecordGraphs

    from fnrl.optim import _clip_leaves

    grads = TensorDict({"a": torch.tensor([3.0, 0.0], dtype=F64), "b": {"c": torch.tensor([4.0], dtype=F64)}}, [])
    backend = EagerAndRecordGraphs()
    norm = torch.compile(global_norm, backend=backend, fullgraph=True)(grads)
    clipped = torch.compile(_clip_leaves, backend=backend, fullgraph=True)([grads["a"], grads["b", "c"]], 1.0)
    torch.testing.assert_close(norm, torch.tensor(5.0, dtype=F64), rtol=0, atol=0)
    for got, want in zip(clipped, _clip_leaves([grads["a"], grads["b", "c"]], 1.0)):
        torch.testing.assert_close(got, want)
    targets = {node.target for graph in backend.graphs for node in graph.graph.nodes}
    assert len(backend.graphs) == 2 and torch._foreach_norm not in targets


def test_polyak_and_hard_update_hand_values():
    target = TensorDict({"w": torch.tensor([0.0, 10.0]), "net": {"b": torch.tensor(4.0)}}, [])
    online = TensorDict({"w": torch.tensor([1.0, 0.0]), "net": {"b": torch.tensor(0.0)}}, [])
    new = polyak(target, online, 0.1)  # 0.9 * target + 0.1 * online
    torch.testing.assert_close(new["w"], torch.tensor([0.1, 9.0]))
    torch.testing.assert_close(new["net", "b"], torch.tensor(3.6))
    assert target["w"][1] == 10.0, "polyak must not write into the target"
    torch.testing.assert_close(polyak(target, online, torch.tensor(0.5))["w"], torch.tensor([0.5, 5.0]))
    copied = hard_update(target, online)
    assert_td_close(copied, online, rtol=0, atol=0)
    assert copied["w"].data_ptr() != online["w"].data_ptr()


def test_polyak_with_a_tensor_weight_reads_no_number_off_the_device_on_a_gpu(monkeypatch):
    """A 0-d tensor tau gives what the same float gives (exactly the start at 0, the end at 1),
    in the CPU's number form and in a GPU's tensor form, and the compiled tensor form reads no
    number off the device (`_local_scalar_dense`: a sync per update on a GPU, and no CUDA
    graph capture), where the number form does."""
    import fnrl.optim as optim
    from torch._dynamo.backends.common import aot_autograd

    target = TensorDict({"w": torch.randn(3), "net": {"b": torch.randn(2, 2)}}, [])
    online = TensorDict({"w": torch.randn(3), "net": {"b": torch.randn(2, 2)}}, [])
    reads = {}
    for on_gpu in (False, True):
        monkeypatch.setattr(optim, "weight_as_number", lambda tau: not on_gpu)
        for tau in (0.0, 0.3, 1.0):
            assert_td_close(polyak(target, online, torch.tensor(tau)), polyak(target, online, tau), rtol=0, atol=0)
        assert_td_close(polyak(target, online, torch.tensor(1.0)), online, rtol=0, atol=0)
        graphs = []

        def record(gm, example_inputs):
            graphs.append(gm)
            return gm

        torch._dynamo.reset()
        compiled = torch.compile(lambda t, o, w: polyak(t, o, w * 0.5), backend=aot_autograd(fw_compiler=record),
                                 fullgraph=True)
        assert_td_close(compiled(target, online, torch.tensor(0.6)), polyak(target, online, 0.3))
        reads[on_gpu] = any("_local_scalar_dense" in str(n.target) for g in graphs for n in g.graph.nodes)
    assert reads == {False: True, True: False}

def test_schedules_hand_values():
    steps = torch.tensor([0, 5, 10, 15])
    linear = linear_schedule(1.0, 0.2, 10)
    torch.testing.assert_close(linear(steps), torch.tensor([1.0, 0.6, 0.2, 0.2], dtype=F64))
    torch.testing.assert_close(linear(torch.tensor(5)), torch.tensor(0.6, dtype=F64))
    # init * ((1 - alpha) * (1 + cos(pi * t / T)) / 2 + alpha) with init 2, alpha 0.1
    cosine = cosine_schedule(2.0, 10, alpha=0.1)
    torch.testing.assert_close(cosine(steps), torch.tensor([2.0, 1.1, 0.2, 0.2], dtype=F64))
    at_2 = 2 * (0.9 * (1 + math.cos(0.2 * math.pi)) / 2 + 0.1)
    torch.testing.assert_close(cosine(torch.tensor(2)), torch.tensor(at_2, dtype=F64))
    torch.testing.assert_close(constant_schedule(0.3)(steps), torch.full((4,), 0.3, dtype=F64))


def test_argument_errors():
    params = td(w=1.0)
    with pytest.raises(ValueError, match="params"):
        adamw(0.1).update(params, adamw(0.1).init(params))
    with pytest.raises(ValueError, match="nesterov"):
        sgd(0.1, nesterov=True)
    with pytest.raises(ValueError, match="steps"):
        linear_schedule(1.0, 0.0, 0)


# ---------------------------------------------------------------------------
# step for step against torch.optim on an MLP
# ---------------------------------------------------------------------------


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 3)).to(F64)


def make_batches(steps: int):
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(8, 4, generator=generator, dtype=F64), torch.randn(8, 3, generator=generator, dtype=F64))
        for _ in range(steps)
    ]


def mlp_loss(net: nn.Module, params: TensorDict, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    prediction = torch.func.functional_call(net, params.flatten_keys(".").to_dict(), (x,))
    return (prediction - y).square().mean()


def torch_trajectory(make_torch_opt, lr_lambda=None, clip=None):
    net = make_mlp()
    optimizer = make_torch_opt(net.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda) if lr_lambda else None
    snapshots, clipped_steps = [], 0
    for x, y in make_batches(STEPS):
        optimizer.zero_grad()
        (net(x) - y).square().mean().backward()
        if clip is not None:
            clipped_steps += int(torch.nn.utils.clip_grad_norm_(net.parameters(), clip) > clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        snapshots.append(TensorDict.from_module(net).detach().clone())
    return snapshots, clipped_steps


def functional_trajectory(tx):
    net = make_mlp()
    params = TensorDict.from_module(net).detach().clone()
    state = tx.init(params)
    grad_fn = torch.func.grad(lambda p, x, y: mlp_loss(net, p, x, y))
    snapshots = []
    for x, y in make_batches(STEPS):
        updates, state = tx.update(grad_fn(params, x, y), state, params)
        params = apply_updates(params, updates)
        snapshots.append(params)
    return snapshots


def lr_lambda_of(schedule):
    return lambda k: schedule(torch.tensor(k)).item()


LINEAR = linear_schedule(1e-2, 1e-3, 60)
COSINE = cosine_schedule(0.05, 80, alpha=0.1)

# name -> (functional transformation, torch.optim constructor, LambdaLR lambda or None)
MATCHES = {
    "sgd": (sgd(0.05), lambda p: torch.optim.SGD(p, lr=0.05), None),
    "sgd_momentum": (sgd(0.05, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), None),
    "sgd_nesterov": (
        sgd(0.05, momentum=0.9, nesterov=True),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        None,
    ),
    "adam": (adam(1e-2), lambda p: torch.optim.Adam(p, lr=1e-2), None),
    "adam_betas_eps": (
        adam(3e-3, b1=0.8, b2=0.99, eps=1e-5),
        lambda p: torch.optim.Adam(p, lr=3e-3, betas=(0.8, 0.99), eps=1e-5),
        None,
    ),
    "adam_l2": (adam(1e-2, weight_decay=0.1), lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1), None),
    "adam_tensor_lr": (adam(torch.tensor(1e-2, dtype=F64)), lambda p: torch.optim.Adam(p, lr=1e-2), None),
    "adamw": (adamw(1e-2, weight_decay=0.1), lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1), None),
    "rmsprop": (rmsprop(1e-3), lambda p: torch.optim.RMSprop(p, lr=1e-3), None),
    "rmsprop_centered": (
        rmsprop(1e-3, alpha=0.95, eps=1e-6, centered=True),
        lambda p: torch.optim.RMSprop(p, lr=1e-3, alpha=0.95, eps=1e-6, centered=True),
        None,
    ),
    "rmsprop_momentum": (
        rmsprop(1e-3, momentum=0.9),
        lambda p: torch.optim.RMSprop(p, lr=1e-3, momentum=0.9),
        None,
    ),
    "rmsprop_centered_momentum": (
        rmsprop(1e-3, centered=True, momentum=0.9),
        lambda p: torch.optim.RMSprop(p, lr=1e-3, centered=True, momentum=0.9),
        None,
    ),
    "adam_linear_schedule": (adam(LINEAR), lambda p: torch.optim.Adam(p, lr=1.0), lr_lambda_of(LINEAR)),
    "sgd_cosine_schedule": (
        sgd(COSINE, momentum=0.9),
        lambda p: torch.optim.SGD(p, lr=1.0, momentum=0.9),
        lr_lambda_of(COSINE),
    ),
    "adamw_cosine_schedule": (
        adamw(COSINE, weight_decay=0.1),
        lambda p: torch.optim.AdamW(p, lr=1.0, weight_decay=0.1),
        lr_lambda_of(COSINE),
    ),
}


@pytest.mark.parametrize("name", list(MATCHES))
def test_matches_torch_optim_step_for_step(name):
    tx, make_torch_opt, lr_lambda = MATCHES[name]
    expected, _ = torch_trajectory(make_torch_opt, lr_lambda)
    got = functional_trajectory(tx)
    for step, (g, e) in enumerate(zip(got, expected)):
        assert_td_close(g, e, rtol=1e-9, atol=1e-12, msg=lambda m: f"{name}, step {step + 1}: {m}")
    assert not torch.allclose(got[-1]["0", "weight"], make_mlp()[0].weight), "parameters should have moved"


def test_clip_then_adam_matches_clip_grad_norm_and_adam():
    max_norm = 0.3
    expected, clipped_steps = torch_trajectory(lambda p: torch.optim.Adam(p, lr=1e-2), clip=max_norm)
    assert 0 < clipped_steps, "the clip should be active on some steps"
    got = functional_trajectory(chain(clip_by_global_norm(max_norm), adam(1e-2)))
    for g, e in zip(got, expected):
        assert_td_close(g, e, rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------------------
# state layout, vmap
# ---------------------------------------------------------------------------


def layout(state: TensorDict) -> dict:
    return {key: (tuple(value.shape), value.dtype) for key, value in state.flatten_keys(".").items()}


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "adamw", "rmsprop_centered_momentum", "adam_linear_schedule"])
def test_state_layout_is_fixed_and_steps_count(name):
    tx = MATCHES[name][0]
    net = make_mlp()
    params = TensorDict.from_module(net).detach().clone()
    grads = params.apply(torch.randn_like)
    initial = tx.init(params)
    state = initial
    for _ in range(3):
        _, state = tx.update(grads, state, params)
    assert layout(state) == layout(initial)
    counters = [value for key, value in state.flatten_keys(".").items() if key.endswith("step")]
    assert counters and all(c.dtype == torch.int64 and c.ndim == 0 and c.item() == 3 for c in counters)
    assert all(v.item() == 0 for k, v in initial.flatten_keys(".").items() if k.endswith("step"))


def test_layout_lists_the_leaves_in_the_tensordicts_order_with_nested_batch_sizes():
    params = TensorDict({"actor": TensorDict.from_module(make_mlp()).detach(),
                         "q": {"w": torch.zeros(2, 3, 3), "b": torch.zeros(2, 3)}}, batch_size=[])
    params["q"].batch_size = [2]
    layout = Layout.of(params)
    assert layout.keys == [k if isinstance(k, tuple) else (k,) for k in params.keys(True, True)]
    assert layout.sizes == {("q",): torch.Size([2])}
    assert Layout.of(params.clone()) is layout   # one Layout per structure
    rebuilt = layout.tree(layout.leaves(params))
    assert rebuilt["q"].batch_size == (2,)
    assert all(a is b for a, b in zip(layout.leaves(rebuilt), layout.leaves(params)))
    wrapped = TensorDictParams(params, no_convert=True)   # not a plain TensorDict: walked and read through its API
    assert Layout.of(wrapped) is layout
    assert all(a is b for a, b in zip(layout.leaves(wrapped), layout.leaves(params)))


@pytest.mark.parametrize("params", [
    TensorDict({"w": torch.zeros(3)}, batch_size=[3]),                      # a batch size
    TensorDict({"w": torch.zeros(3), "n": torch.zeros(3, dtype=torch.long)}, batch_size=[]),   # not floating point
    TensorDict({"w": torch.zeros(3), "empty": {"inner": {}}}, batch_size=[]),   # a nested TensorDict without leaves
], ids=["batched", "integer-leaf", "empty-node"])
def test_layout_of_is_none_where_the_list_form_does_not_apply(params):
    assert Layout.of(params) is None


def test_vmap_over_seeds_with_per_seed_learning_rate():
    torch.manual_seed(2)
    seeds = 3
    params = TensorDict({"w": torch.randn(seeds, 5), "layer": {"b": torch.randn(seeds, 2)}}, batch_size=[seeds])
    grads = [params.apply(torch.randn_like) for _ in range(3)]
    lrs = torch.tensor([0.1, 0.01, 0.001])

    def train(params, g0, g1, g2, lr):
        return run(chain(clip_by_global_norm(1.0), adam(lr)), params, [g0, g1, g2])[0]

    batched = torch.func.vmap(train)(params, *grads, lrs)
    for seed in range(seeds):
        expected = train(params[seed], *(g[seed] for g in grads), lrs[seed].item())
        assert_td_close(batched[seed], expected)


# ---------------------------------------------------------------------------
# one compiled train step
# ---------------------------------------------------------------------------


def test_compiled_train_step_equals_eager_and_does_not_recompile():
    net = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    tx = chain(clip_by_global_norm(0.5), adam(linear_schedule(3e-3, 1e-3, 4)))

    def train_step(params, state, x, y):
        grads, loss = torch.func.grad_and_value(lambda p: mlp_loss(net, p, x, y))(params)
        updates, state = tx.update(grads, state, params)
        return apply_updates(params, updates), state, loss

    compiled = torch.compile(train_step, fullgraph=True)
    torch.manual_seed(3)
    batches = [(torch.randn(16, 4), torch.randn(16, 2)) for _ in range(5)]
    params_eager = TensorDict.from_module(net).detach().clone()
    params_compiled = params_eager.clone()
    state_eager, state_compiled = tx.init(params_eager), tx.init(params_compiled)
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for i, (x, y) in enumerate(batches):
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            params_compiled, state_compiled, loss_compiled = compiled(params_compiled, state_compiled, x, y)
        params_eager, state_eager, loss_eager = train_step(params_eager, state_eager, x, y)
        torch.testing.assert_close(loss_compiled, loss_eager, rtol=1e-5, atol=1e-6)
        assert_td_close(params_compiled, params_eager, rtol=1e-5, atol=1e-6)
        assert_td_close(state_compiled, state_eager, rtol=1e-5, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before == 1
    assert layout(state_compiled) == layout(tx.init(params_eager))


def test_zero_dim_parameters_keep_their_dtype():
    from tensordict import TensorDict

    from fnrl import optim

    params = TensorDict({"log_alpha": torch.zeros((), dtype=torch.float32), "w": torch.zeros(3)}, batch_size=[])
    opt = optim.adam(optim.linear_schedule(1e-2, 0.0, 10))
    state = opt.init(params)
    for _ in range(3):
        grads = params.apply(torch.ones_like)
        updates, state = opt.update(grads, state, params)
        params = optim.apply_updates(params, updates)
    assert params["log_alpha"].dtype == torch.float32 and params["log_alpha"].item() < 0


def eager_steps(tx, net, steps=STEPS):
    """(params, state, last loss) after `steps` plain eager `gradient_step`s of `tx` on the MLP."""
    from fnrl.algos.common import gradient_step

    params = TensorDict.from_module(net).detach().clone()
    state, dtype = tx.init(params), params["0", "weight"].dtype
    for x, y in make_batches(steps):
        x, y = x.to(dtype), y.to(dtype)
        params, state, metrics = gradient_step(lambda p: (mlp_loss(net, p, x, y), {}), params, tx, state)
    return params, state, metrics["loss"]


@pytest.mark.parametrize("name", [*MATCHES, "clip_adam"])
def test_eager_gradient_step_on_leaves_equals_the_tensordict_update(name):
    """`gradient_step` in plain eager mode runs `update_leaves` (`Layout`): the same parameters
    and optimizer state, bit for bit, as the TensorDict `update` (Adam's fused `apply_leaves` left out)."""
    tx = chain(clip_by_global_norm(0.3), adam(1e-2)) if name == "clip_adam" else MATCHES[name][0]
    assert tx.update_leaves is not None
    net = make_mlp()
    params, state, loss = eager_steps(GradientTransformation(tx.init, tx.update, tx.update_leaves), net)
    expected_params, expected_state, expected_loss = eager_steps(GradientTransformation(tx.init, tx.update), net)
    assert (params == expected_params).all() and (state == expected_state).all() and torch.equal(loss, expected_loss)
    assert list(params.keys(True, True)) == list(expected_params.keys(True, True))
    assert list(state.keys(True)) == list(expected_state.keys(True))


@pytest.mark.parametrize("name", [*MATCHES, "clip_adam"])
def test_vmapped_gradient_step_runs_the_leaves_one_by_one_and_equals_each_row(name):
    """Under torch.func.vmap `gradient_step` runs `update_leaves` leaf by leaf (no `_foreach_*` op
    has a batching rule): each row ends where its own plain eager steps with the TensorDict
    `update` do, to float rounding."""
    from fnrl.algos.common import gradient_step

    tx = chain(clip_by_global_norm(0.3), adam(1e-2)) if name == "clip_adam" else MATCHES[name][0]
    net, rows = make_mlp(), 3
    torch.manual_seed(4)
    start = TensorDict.from_module(net).detach().clone()
    start = torch.stack([start.apply(lambda p: p + 0.1 * torch.randn_like(p)) for _ in range(rows)])
    batches = make_batches(STEPS)

    def steps(params, tx):
        state = tx.init(params)
        for x, y in batches:
            params, state, _ = gradient_step(lambda p: (mlp_loss(net, p, x, y), {}), params, tx, state)
        return params, state

    params, state = torch.func.vmap(lambda p: steps(p, leaves_only(tx)))(start)
    for row in range(rows):
        expected_params, expected_state = steps(start[row], GradientTransformation(tx.init, tx.update))
        assert_td_close(params[row], expected_params, rtol=1e-12, atol=1e-12)
        assert_td_close(state[row], expected_state, rtol=1e-12, atol=1e-12)


def test_compiled_gradient_steps_in_a_scan_run_the_leaves_and_equal_eager():
    """Traced inside one compiled `scan_steps` (a `torch._higher_order_ops.scan` body), the
    leaf-by-leaf `update_leaves` of clip + Adam with a schedule (all out of place: Inductor cannot
    lower in-place `_foreach_*` ops there) equals plain eager steps, and a second call with new
    values does not recompile."""
    from fnrl.algos.common import gradient_step, scan_steps

    net = make_mlp().float()
    tx = chain(clip_by_global_norm(0.3), adam(linear_schedule(1e-2, 1e-3, 40)))
    xs, ys = (torch.stack(t).float() for t in zip(*make_batches(20)))

    def training(opt):
        def train(params, state, xs, ys):
            def step(carry, xy):
                params, state = carry
                params, state, metrics = gradient_step(lambda p: (mlp_loss(net, p, xy[:, :4], xy[:, 4:]), {}), params,
                                                       opt, state)
                return (params, state), metrics

            return scan_steps(step, (params, state), torch.cat([xs, ys], -1))

        return train

    params = TensorDict.from_module(net).detach().clone()
    state = tx.init(params)
    compiled, eager = torch.compile(training(leaves_only(tx)), fullgraph=True), training(tx)   # eager: fused Adam
    for call in range(2):
        with torch._dynamo.config.patch(error_on_recompile=call > 0):
            (params_compiled, state_compiled), losses_compiled = compiled(params, state, xs, ys)
        (params_eager, state_eager), losses_eager = eager(params, state, xs, ys)
        torch.testing.assert_close(losses_compiled["loss"], losses_eager["loss"], rtol=1e-5, atol=1e-6)
        assert_td_close(params_compiled, params_eager, rtol=1e-5, atol=1e-6)
        assert_td_close(state_compiled, state_eager, rtol=1e-5, atol=1e-6)
        params, state = params_eager, state_eager


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["adam", "clip_adam", "stored_rate"])
def test_fused_adam_equals_the_unfused_step(name, dtype):
    """A chain of [clip], Adam and a learning rate (nested chains and pass-through stages too) has
    `apply_leaves`, torch's fused Adam kernel, which plain eager `gradient_step` runs: the same
    parameters and state as the TensorDict `update` up to float rounding, the same layout."""
    from fnrl.optim import scale_by_adam, scale_by_stored_learning_rate

    tx = {"adam": adam(1e-2, b2=0.99, eps=1e-6),
          "clip_adam": chain(clip_by_global_norm(0.3), adam(linear_schedule(1e-2, 1e-3, 50))),
          "stored_rate": chain(clip_by_global_norm(0.5), scale_by_adam(eps=1e-5),
                               scale_by_stored_learning_rate(1e-2, linear_schedule(1.0, 0.0, 80)))}[name]
    assert tx.apply_leaves is not None
    net = make_mlp().to(dtype)
    params, state, _ = eager_steps(tx, net)
    expected_params, expected_state, _ = eager_steps(GradientTransformation(tx.init, tx.update), net)
    tol = {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 2e-6}
    assert_td_close(params, expected_params, **tol)
    assert_td_close(state, expected_state, **tol)
    assert list(state.keys(True)) == list(expected_state.keys(True))
    assert not torch.equal(params["0", "weight"], TensorDict.from_module(net)["0", "weight"])


def test_fused_adam_applies_only_to_adam_with_a_rate():
    from fnrl.optim import scale_by_adam, trace

    assert sgd(1e-2, momentum=0.9).apply_leaves is None and rmsprop(1e-2).apply_leaves is None
    assert adamw(1e-2).apply_leaves is None                       # decoupled decay between Adam and the rate
    assert adam(1e-2, weight_decay=1e-4).apply_leaves is None     # an L2 term before Adam
    assert chain(scale_by_adam(), trace(0.9), sgd(1e-2)).apply_leaves is None
    assert chain(trace(0.0), adam(1e-2)).apply_leaves is not None


def test_fused_adam_falls_back_to_the_leaf_lists_for_mixed_dtypes():
    """Leaves of two dtypes (one kernel call takes one): `apply_leaves` runs `update_leaves`, bit for bit."""
    tx = chain(clip_by_global_norm(1.0), adam(1e-2))
    params = TensorDict({"w": torch.ones(3, dtype=torch.float32), "b": torch.ones(2, dtype=F64)}, batch_size=[])
    grads = [torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, -3.0], dtype=F64)]
    layout = Layout.of(params)
    values = layout.leaves(params)
    new, state = tx.apply_leaves(grads, tx.init(params), values, layout)
    updates, expected_state = tx.update_leaves(grads, tx.init(params), values, layout)
    assert all(torch.equal(a, p + u) for a, p, u in zip(new, values, updates))
    assert (state == expected_state).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_adam_is_torch_fused_adam_bit_for_bit(dtype):
    """`adam(lr)`'s `apply_leaves` is `torch.optim.Adam(fused=True)` (its rate a tensor of the
    parameters' dtype, as the chain's stored rate is) on the same gradients, bit for bit, step after step."""
    tx = adam(1e-2, b2=0.99, eps=1e-6)
    g = torch.Generator().manual_seed(0)
    params = TensorDict({"w": torch.randn(5, 3, generator=g, dtype=dtype),
                         "b": torch.randn(3, generator=g, dtype=dtype)}, batch_size=[])
    layout = Layout.of(params)
    values, state = layout.leaves(params), tx.init(params)
    reference = [v.clone().requires_grad_() for v in values]
    torch_adam = torch.optim.Adam(reference, lr=torch.tensor(1e-2, dtype=dtype), betas=(0.9, 0.99), eps=1e-6,
                                  fused=True)
    for _ in range(20):
        grads = [torch.randn(v.shape, generator=g, dtype=dtype) for v in values]
        values, state = tx.apply_leaves(grads, state, values, layout)
        for p, grad in zip(reference, grads):
            p.grad = grad.clone()
        torch_adam.step()
    assert all(torch.equal(v, p.detach()) for v, p in zip(values, reference))
    moments = [torch_adam.state[p] for p in reference]
    for key in ("exp_avg", "exp_avg_sq"):
        assert all(torch.equal(m, s[key]) for m, s in zip(layout.leaves(state["1"][key]), moments))
