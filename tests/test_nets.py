import torch

from fnrl.nets import A3CConv, ActorCritic, NatureCNN, call, parameters


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
