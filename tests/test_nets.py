import pytest
import torch

from tensordict import TensorDict

from fnrl.nets import A3CConv, ActorCritic, NatureCNN, call, parameters
from fnrl.nets.core import Linear, NarrowLinear, Tanh, _chain


def test_functional_call_equals_module_call():
    net = ActorCritic((4,), 2, continuous=False)
    params = parameters(net)
    obs = torch.randn(5, 3, 4)
    logits, value = call(net, params, obs)
    ref_logits, ref_value = net(obs)
    torch.testing.assert_close(logits, ref_logits)
    assert logits.shape == (5, 3, 2) and value.shape == (5, 3)
    # parameters are a copy: changing them changes the functional output only
    params["actor", "4", "bias"] += 1.0
    assert not torch.allclose(call(net, params, obs)[0], ref_logits)


_TANH = torch.nn.Tanh()


@pytest.mark.parametrize("layers", [
    lambda: [Linear(4, 8), Tanh(), NarrowLinear(8, 2)],
    lambda: [torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Identity(), torch.nn.Linear(8, 3), torch.nn.Tanh()],
    lambda: [torch.nn.Linear(4, 8), _TANH, torch.nn.Linear(8, 8), _TANH],   # a layer used twice runs twice
])
def test_a_plain_mlp_runs_as_its_ops_with_the_modules_numbers_and_gradients(layers):
    """`call` runs a Sequential of linear layers and activations as its ops in eager mode: bit for bit
    the module's outputs and gradients; under vmap, each row the module's output to float tolerance."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*layers())
    assert _chain(net) is not None
    params = parameters(net)
    obs = torch.randn(5, 4)
    assert torch.equal(call(net, params, obs), net(obs))
    leaves = [p.detach().requires_grad_() for p in params.values(True, True)]
    tree = TensorDict(dict(zip(params.keys(True, True), leaves)), []).unflatten_keys(".")
    grads = torch.autograd.grad(call(net, parameters(net).update(tree), obs).square().sum(), leaves)
    net(obs).square().sum().backward()
    for g, ref in zip(grads, [net.get_parameter(".".join(k)).grad for k in params.keys(True, True)]):
        assert torch.equal(g, ref)
    stacked = torch.stack([params, params.apply(lambda x: x + 0.1)])
    out = torch.func.vmap(lambda p: call(net, p, obs))(stacked)
    for row in range(2):
        ref = torch.func.functional_call(net, stacked[row].flatten_keys(".").to_dict(), (obs,))
        torch.testing.assert_close(out[row], ref)


def test_modules_other_than_a_plain_mlp_are_called_with_their_tensors_swapped_in():
    """Any other layer, an in-place ReLU, a parametrized weight or a hook: the module itself runs
    (with `params`); a Sequential changed after a call gets its ops again."""
    seq = torch.nn.Sequential
    assert _chain(seq(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))) is None
    assert _chain(seq(torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True))) is None
    assert _chain(ActorCritic((4,), 2, continuous=False)) is None
    normed = seq(torch.nn.utils.parametrizations.weight_norm(torch.nn.Linear(4, 3)))
    assert _chain(normed) is None
    torch.testing.assert_close(call(normed, parameters(normed), torch.ones(2, 4)), normed(torch.ones(2, 4)))
    for register in ("register_forward_hook", "register_full_backward_hook"):
        net = seq(torch.nn.Linear(4, 3))
        seen = []
        getattr(net[0], register)(lambda module, args, out: seen.append(module))
        call(net, parameters(net), torch.randn(2, 4, requires_grad=True)).sum().backward()
        assert seen == [net[0]]
    net = seq(torch.nn.Linear(4, 3))
    call(net, parameters(net), torch.randn(2, 4))
    net.append(torch.nn.Linear(3, 2))
    assert call(net, parameters(net), torch.randn(2, 4)).shape == (2, 2)


def test_the_policy_without_its_value_is_the_same_distribution():
    """`actor_critic_policy`'s `policy(params, obs, value=False)`: the same action distribution, no value."""
    from fnrl.algos.common import actor_critic_policy
    from fnrl.envs import EnvSpec

    spec = EnvSpec("Toy-v0", 3, (4,), torch.float32, (), torch.int64, num_actions=2)
    build, policy = actor_critic_policy(spec)
    params = parameters(build())
    obs = torch.randn(3, 4)
    (logits,), value = policy(params, obs)
    (alone,), none = policy(params, obs, value=False)
    assert none is None and value.shape == (3,) and torch.equal(alone, logits)
    ref_logits, ref_value = call(build(), params, obs)
    assert torch.equal(logits, ref_logits) and torch.equal(value, ref_value)


def test_orthogonal_init_gains():
    net = ActorCritic((4,), 2, continuous=True, init_log_std=-0.5)
    w = net.actor[4].weight  # policy head: gain 0.01
    torch.testing.assert_close(w @ w.T, 1e-4 * torch.eye(2), atol=1e-6, rtol=0)
    assert torch.equal(net.log_std.data, torch.full((2,), -0.5))


def test_conv_torsos_take_uint8_frames_with_leading_dims():
    frames = torch.randint(0, 255, (2, 3, 4, 84, 84), dtype=torch.uint8)
    assert NatureCNN()(frames).shape == (2, 3, 512)
    assert A3CConv()(frames).shape == (2, 3, 256)
    logits, value = ActorCritic((4, 84, 84), 6, continuous=False)(frames)
    assert logits.shape == (2, 3, 6) and value.shape == (2, 3)


def test_conv_torso_under_vmap_equals_each_network_alone():
    """The channels-last frames the conv torsos make (with permutes) work under vmap: stacked
    parameters of 3 networks on 3 batches of frames give each network's own output."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    nets = [NatureCNN() for _ in range(3)]
    params, _ = stack_module_state(nets)
    frames = torch.randint(0, 256, (3, 5, 4, 84, 84), dtype=torch.uint8)
    out = vmap(lambda p, x: functional_call(nets[0], p, (x,)))(params, frames)
    with torch.no_grad():
        expected = torch.stack([net(x) for net, x in zip(nets, frames)])
    torch.testing.assert_close(out.detach(), expected, rtol=1e-5, atol=1e-5)


def test_linear_computes_few_rows_elementwise_when_compiling():
    """`Linear` traced as torch.compile traces it: a product of at most FEW_ROWS rows and
    FEW_ROWS_MACS multiply-adds (an acting step of a few envs) has no matrix product, with
    F.linear's values; more rows or a wider layer keep the GEMM, and so do few rows of a
    network vmapped over many (`vmapped_rows`); eager mode is F.linear."""
    from torch._export.utils import _compiling_state_context
    from torch.fx.experimental.proxy_tensor import make_fx

    from fnrl.nets import Linear
    from fnrl.nets.core import FEW_ROWS, FEW_ROWS_MACS, vmapped_rows

    torch.manual_seed(0)

    def traced_ops(layer, x):
        with _compiling_state_context():
            graph = make_fx(layer)(x)
        ops = {str(n.target) for n in graph.graph.nodes if n.op == "call_function"}
        return graph(x), any("mm" in op for op in ops)

    for rows, width, gemm in [(1, 120, False), (FEW_ROWS, 64, False), (FEW_ROWS + 1, 64, True),
                              (1, 512, True)]:
        layer = Linear(width, width)
        assert (rows * width * width > FEW_ROWS_MACS) == (width == 512)
        x = torch.randn(rows, width)
        got, has_mm = traced_ops(layer, x)
        assert has_mm == gemm, (rows, width)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    x = torch.randn(2, 3, 16)   # rows are every leading dimension
    assert not traced_ops(Linear(16, 4), x)[1] and traced_ops(Linear(16, 4), torch.randn(3, 3, 16))[1]
    assert torch.equal(layer(x := torch.randn(1, 512)), torch.nn.functional.linear(x, layer.weight, layer.bias))
    with vmapped_rows(FEW_ROWS):   # a vmap over FEW_ROWS rows: 2 rows seen are 2 x FEW_ROWS multiplied
        assert traced_ops(Linear(16, 16), torch.randn(2, 16))[1]
    assert not traced_ops(Linear(16, 16), torch.randn(2, 16))[1]


def test_narrow_linear_compiled_equals_linear_in_value_and_gradients():
    """`NarrowLinear` heads (elementwise under torch.compile) give nn.Linear's outputs and
    gradients, with nn.Linear's parameters and state dict, also under vmap (seeds)."""
    from fnrl.nets import NarrowLinear

    torch.manual_seed(0)
    wide, narrow = torch.nn.Linear(64, 2), NarrowLinear(64, 2)
    narrow.load_state_dict(wide.state_dict())
    assert list(narrow.state_dict()) == ["weight", "bias"]
    params = {k: v.detach() for k, v in wide.named_parameters()}
    x = torch.randn(3, 256, 64)

    def grads_and_loss(module, params, x):
        return torch.func.grad_and_value(lambda p: (torch.func.functional_call(module, p, (x,)) ** 2).sum())(params)

    def assert_close(got, want):
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
        for k in params:
            torch.testing.assert_close(got[0][k], want[0][k], rtol=1e-5, atol=1e-4)

    stacked = {k: v.expand(3, *v.shape).clone() for k, v in params.items()}
    rows = torch.compile(torch.func.vmap(lambda p, x: grads_and_loss(narrow, p, x)), fullgraph=True)(stacked, x)
    for i in range(3):
        assert_close(({k: g[i] for k, g in rows[0].items()}, rows[1][i]), grads_and_loss(wide, params, x[i]))
    assert torch.equal(narrow(x), torch.nn.functional.linear(x, narrow.weight, narrow.bias))   # eager: F.linear


def test_conv_torsos_fit_any_frame_size_and_refuse_too_small_frames():
    from fnrl.errors import ConfigError
    from fnrl.nets.core import encoder

    for shape in [(4, 84, 84), (3, 64, 48), (1, 36, 36)]:
        for conv in ("nature", "a3c"):
            torso, out_dim = encoder(shape, conv)
            assert torso(torch.zeros(2, *shape, dtype=torch.uint8)).shape == (2, out_dim)
    with pytest.raises(ConfigError, match="20x20 frames are too small for the conv torso"):
        encoder((3, 20, 20))
