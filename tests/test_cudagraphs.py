"""fnrl.accel.cudagraphs: the graphed step's bookkeeping (with a stand-in graph on any machine), the
`--cuda-graphs` errors, and, on a CUDA machine, graphed learner steps equal to compiled ones."""
import contextlib
import dataclasses

import pytest
import torch
from tensordict import TensorDict

from fnrl import algos
from fnrl.accel import staged
from fnrl.accel.cudagraphs import GraphedStep, GraphInputsMoved, check_cuda_graphs
from fnrl.errors import ConfigError


class StandInGraph:
    """Records the step of its capture and runs it again at each replay (a CUDA graph replays
    the captured kernels on the same memory; a Python call on the same tensors does the same)."""

    def __init__(self):
        self.recorded = None
        self.replays = 0

    def replay(self):
        self.replays += 1
        self.recorded()


def stand_in_capture(step, args, captures):
    @contextlib.contextmanager
    def capture(graph):
        # a capture records without running: undo what the step wrote while it was recorded
        before = [t.clone() for t in (args[0]["w"], args[1])]
        captures.append(graph)
        yield
        args[0]["w"].copy_(before[0])
        args[1].copy_(before[1])
        graph.recorded = lambda: step(*args)
    return capture


def test_graphed_step_warms_up_captures_once_then_replays():
    state = TensorDict({"w": torch.zeros(3)}, [])
    lr = torch.tensor(0.5)
    calls = []

    def step(state, lr):   # a donated update: writes the new state into the old tensors
        calls.append(1)
        state["w"].add_(lr)
        return {"w_sum": state["w"].sum() * 1.0}

    captures = []
    graphed = GraphedStep(step, warmup=2, graph=StandInGraph, capture=stand_in_capture(step, (state, lr), captures))
    for _ in range(2):
        graphed(state, lr)
    assert len(calls) == 2 and graphed.graph is None and state["w"].tolist() == [1.0] * 3
    out = graphed(state, lr)   # captured, then replayed once: the step's effect, once
    assert len(captures) == 1 and graphed.graph.replays == 1
    assert state["w"].tolist() == [1.5] * 3 and out["w_sum"].item() == 4.5
    lr.fill_(1.0)              # a refilled 0-d input: read where it lies
    again = graphed(state, lr)
    assert len(captures) == 1 and graphed.graph.replays == 2
    assert state["w"].tolist() == [2.5] * 3
    assert again is out        # the graph's own outputs, rewritten by each replay


def test_graphed_step_refuses_tensors_that_moved():
    state, lr = TensorDict({"w": torch.zeros(3)}, []), torch.tensor(1.0)

    def step(state, lr):
        state["w"].add_(lr)

    graphed = GraphedStep(step, warmup=1, graph=StandInGraph, capture=stand_in_capture(step, (state, lr), []))
    graphed(state, lr)
    graphed(state, lr)
    with pytest.raises(GraphInputsMoved, match="other than the ones it captured"):
        graphed(TensorDict({"w": torch.zeros(3)}, []), lr)
    with pytest.raises(ValueError, match="warmup"):
        GraphedStep(step, warmup=0)


@pytest.mark.parametrize("kwargs, message", [
    (dict(device="cpu", compile=True, algo="dqn", off_policy=True), "add --device cuda"),
    (dict(device="cuda", compile=False, algo="dqn", off_policy=True), "drop --no-compile"),
    (dict(device="cuda", compile=True, algo="impala", off_policy=False, central=True), "actor processes"),
    (dict(device="cuda", compile=True, algo="ppo", off_policy=False, sampler="parallel"), "--sampler parallel"),
    (dict(device="cuda", compile=True, algo="ppo", off_policy=False, single=False), "one seed's ppo update"),
    (dict(device="cuda", compile=True, algo="sac", off_policy=True, sampler="async"), "--sampler async"),
    (dict(device="cuda", compile=True, algo="dqn", off_policy=True, fused_learner=False), "fused learner step"),
])
def test_cuda_graphs_where_they_do_not_apply_stop_with_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as e:
        check_cuda_graphs(True, **kwargs)
    assert "\n" not in str(e.value)
    check_cuda_graphs(False, **kwargs)   # off: nothing to check


def test_fused_learner_step_keeps_its_tensors_where_a_graph_reads_them(monkeypatch):
    """What a CUDA graph of the learner step needs, checked on the CPU: every tensor the step
    reads (the donated state, the buffer's storage, tree and rows, max priority, beta) lies at
    the same address at every update, replay writes in between included; and the step routed
    through the graph wrapper gives the parameters of the plain fused learner."""
    import fnrl.accel.cudagraphs as cudagraphs
    from fnrl import replay
    from fnrl.algos import dqn
    from fnrl.learner import make_learner
    from tests.test_learner import B, SPEC, buffer, rollout

    addresses = []

    class Recorder:   # stands in for GraphedStep: calls the step, notes where its tensors are
        def __init__(self, step):
            self.step = step

        def __call__(self, *args):
            addresses.append([t.data_ptr() for t in cudagraphs.leaves(args)])
            return self.step(*args)

    monkeypatch.setattr(cudagraphs, "GraphedStep", Recorder)
    config = dataclasses.replace(dqn.Config(), **{**dqn.VARIANTS["rainbow"], **dict(
        hidden=(16,), num_envs=B, batch_size=16, buffer_size=64, learning_starts=0, num_atoms=11,
        target_update_interval=2)})
    agent = dqn.make(config, SPEC)
    runs = {}
    for graph in (False, True):
        learn = make_learner(agent.update, config.batch_size, True, fused=True, cuda_graph=graph)
        state, buf = agent.init(0), buffer(config)
        for i in range(3):
            torch.manual_seed(10 + i)
            state, buf, _ = learn(state, buf, 0.4 + 0.1 * i)
            buf = replay.add(buf, rollout(20 + i))
        runs[graph] = state
    assert len(addresses) == 3 and addresses[1] == addresses[0] and addresses[2] == addresses[0]
    torch.testing.assert_close(runs[True]["params"], runs[False]["params"], rtol=0, atol=0)


def test_train_with_cuda_graphs_on_the_cpu_stops_before_work(tmp_path):
    from fnrl.train import train

    with pytest.raises(ConfigError, match="--cuda-graphs captures CUDA work"):
        train("dqn", seed=0, log_dir=tmp_path, cuda_graphs=True, quiet=True)
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
@pytest.mark.parametrize("name", ["dqn", "sac", "ppo", "a2c"])
def test_graphed_runs_equal_compiled_ones_on_cuda(tmp_path, name):
    """Runs whose steps replay from CUDA graphs (the fused learner step; PPO's / A2C's update
    and acting step) end with the parameters of the same run's steps called compiled, after a
    few updates from the same seed (the same random draws)."""
    from fnrl.train import train

    on_policy = algos.default_config(name)
    iterations = 5 * getattr(on_policy, "num_envs", 1) * getattr(on_policy, "num_steps", 1)   # capture at the 3rd
    # about a dozen updates: the graph replays many times, and last-bit differences (graphed SAC
    # ended 1e-3 away from compiled SAC after 600 updates, `benchmarks/gpu_graphs.md`; the warm-up
    # and capture run on other streams) have few updates to grow over
    small = {"dqn": dict(total_steps=448, learning_starts=400, hidden=(32,), batch_size=32),
             "sac": dict(env_id="Pendulum-v1", total_steps=348, learning_starts=300, hidden=(32, 32),
                         batch_size=32),
             "ppo": dict(total_steps=iterations), "a2c": dict(total_steps=iterations)}[name]
    config = dataclasses.replace(algos.default_config(name), **small)
    states = [train(name, config, seed=1, device="cuda", cuda_graphs=graphs, quiet=True, tensorboard=False,
                    plot=False, log_dir=tmp_path / str(graphs)).state for graphs in (False, True)]
    torch.testing.assert_close(states[1]["params"], states[0]["params"])


def undoing_capture(graphed, args_of):
    """A stand-in for `torch.cuda.graph` around `graphed` (a GraphedStep): the capturing call
    runs the step, then its writes are undone (a capture records without running) and the
    graph's replay runs the step again on the arguments `args_of()` returns."""
    from fnrl.accel.cudagraphs import leaves

    @contextlib.contextmanager
    def capture(graph):
        args = args_of()
        before, rng = [t.clone() for t in leaves(args)], torch.get_rng_state()
        yield
        for t, b in zip(leaves(args), before):
            t.copy_(b)
        torch.set_rng_state(rng)   # nor does it draw: a replay advances the generator

        def replay():   # writes where the captured call's outputs lie, as a CUDA graph does
            fresh = graphed().step(*args)
            for mine, new in zip(outputs(graphed().out), outputs(fresh)):
                mine.copy_(new)
        graph.recorded = replay
    return capture


def outputs(out) -> list[torch.Tensor]:
    if isinstance(out, dict):
        out = TensorDict(out, [])
    return list(out.values(True, True)) if out is not None else []


def test_graphed_ppo_update_donates_the_state_and_refills_the_minibatch_order():
    """GraphedUpdate (stand-in graph, eager PPO on the CPU): the same parameters as plain
    updates, written into the state passed in; one capture, then replays; the minibatch order
    of each iteration copied into one fixed tensor."""
    from fnrl.algos import ppo
    from fnrl.accel.cudagraphs import GraphedUpdate
    from tests.test_ppo import SMALL, rollout_for

    agent, state, _, (rollout,) = rollout_for(SMALL)
    plain = state.clone()
    graphed_state = state.clone()
    graphed = GraphedUpdate(agent.update, graph=StandInGraph,
                            capture=undoing_capture(lambda: graphed.graphed, lambda: (graphed_state, rollout,
                                                                                     graphed.perms)))
    leaves_before = [t.data_ptr() for t in graphed_state.values(True, True)]
    for i in range(4):
        plain, _ = agent.update(plain, rollout)
        out, metrics = graphed(graphed_state, rollout)
        assert out is graphed_state
        torch.testing.assert_close(out["params"], plain["params"], rtol=0, atol=0)
        torch.testing.assert_close(graphed.perms, agent.update.minibatch_order(graphed_state, "cpu"))
        perms_at = graphed.perms.data_ptr()
        for s in (plain, graphed_state):
            s["env_steps"].add_(SMALL.num_envs * SMALL.num_steps)   # a new iteration: a new minibatch order
    assert graphed.perms.data_ptr() == perms_at
    assert [t.data_ptr() for t in graphed_state.values(True, True)] == leaves_before
    assert graphed.graphed.graph.replays == 2 and isinstance(metrics, TensorDict)
    assert staged.scan_on(torch.device("cpu")) and not staged.scan_on(torch.device("cuda"))


def test_graphed_act_copies_the_observation_in_and_passes_other_calls_on():
    from fnrl.accel.cudagraphs import GraphedAct
    from tests.test_ppo import SMALL, rollout_for

    agent, state, _, (rollout,) = rollout_for(SMALL)
    obs = rollout["obs"]
    graphed = GraphedAct(agent.act, ("params", "obs_rms"), graph=StandInGraph,
                         capture=undoing_capture(lambda: graphed.graphed,
                                                 lambda: (state.select("params", "obs_rms", strict=False),
                                                          graphed.obs)))
    for t in range(4):
        torch.manual_seed(t)
        action, extras, carry = agent.act(state, obs[t], None, True)
        torch.manual_seed(t)
        g_action, g_extras, g_carry = graphed(state, obs[t], None, True)
        assert carry is None and g_carry is None
        torch.testing.assert_close(g_action, action)
        torch.testing.assert_close(g_extras["logp"], extras["logp"])
        torch.testing.assert_close(graphed.obs, obs[t])
    assert graphed.graphed.graph.replays == 2
    mode, _, _ = graphed(state, obs[0], None, False)   # greedy: not the graph's call
    torch.testing.assert_close(mode, agent.act(state, obs[0], None, False)[0])
    assert graphed.graphed.graph.replays == 2


def test_graphed_on_policy_graphs_a_feed_forward_act_and_every_update():
    from fnrl.algos.common import Agent
    from fnrl.accel.cudagraphs import GraphedAct, GraphedUpdate, graphed_on_policy

    agent = Agent(init=None, act=lambda *a: None, update=lambda *a: None)
    feed_forward = graphed_on_policy(agent, ("params",), recurrent=False)
    assert isinstance(feed_forward.update, GraphedUpdate) and isinstance(feed_forward.act, GraphedAct)
    assert feed_forward.act.keys == ("params",)
    recurrent = graphed_on_policy(agent, None, recurrent=True)   # a carry per call: acting stays as it is
    assert isinstance(recurrent.update, GraphedUpdate) and recurrent.act is agent.act


@pytest.mark.parametrize("name", ["ppo", "a2c", "rainbow", "sac", "td3"])
def test_compiled_steps_of_a_run_read_no_number_off_the_device(monkeypatch, tmp_path, name):
    """What a GPU needs of every compiled step of a training run (act, update, learner step,
    replay write), checked on the CPU in the ATen graphs Inductor would compile, with the device
    rules set as on a GPU (`switch` takes both branches, `polyak` keeps its weight a tensor): no
    `.item()` (on a GPU a sync per call, which also forbids capturing the step in a CUDA graph)
    and no `cond` (Inductor reads a cond's predicate on the host). The first GPU run of the
    off-policy learner step failed on one such `.item()` (`benchmarks/gpu_graphs.md`)."""
    from torch._dynamo.backends.common import aot_autograd

    from fnrl import optim
    from fnrl.accel import AccelOptions
    from fnrl.algos import common
    from fnrl.train import train

    graphs = []
    real_compile = torch.compile

    def record(gm, example_inputs):   # the ATen graph Inductor would get, run as it is
        graphs.append(gm)
        return gm

    def compile_recording(fn, options=None, **kwargs):
        return real_compile(fn, backend=aot_autograd(fw_compiler=record),
                            **{k: v for k, v in kwargs.items() if k in ("fullgraph", "dynamic")})

    monkeypatch.setattr(torch, "compile", compile_recording)
    monkeypatch.setattr(common, "takes_both_branches", lambda pred: True)
    monkeypatch.setattr(optim, "weight_as_number", lambda tau: False)
    torch._dynamo.reset()
    config = algos.default_config(name)
    off_policy = hasattr(config, "learning_starts")
    steps = dict(learning_starts=64, batch_size=16) if off_policy else dict(num_steps=4)
    config = dataclasses.replace(config, total_steps=128, hidden=(16, 16), **steps)
    result = train(name, config, seed=0, quiet=True, tensorboard=False, plot=False, log_dir=tmp_path,
                   accel=AccelOptions(ahead_of_time=False))   # every step through torch.compile, as on a GPU
    calls = {str(n.target).split(".")[-2 if str(n.target).count(".") > 1 else -1]
             for g in graphs for m in g.modules() if isinstance(m, torch.fx.GraphModule)
             for n in m.graph.nodes if n.op == "call_function"}
    assert result.history[-1]["updates"] >= 2 and "addcmul" in calls   # the optimizer step (Adam, RMSprop) was traced
    assert not calls & {"_local_scalar_dense", "cond"}, calls
