"""fnrl.cudagraphs: the graphed step's bookkeeping (with a stand-in graph on any machine), the
`--cuda-graphs` errors, and, on a CUDA machine, graphed learner steps equal to compiled ones."""
import contextlib
import dataclasses

import pytest
import torch
from tensordict import TensorDict

from fnrl import algos
from fnrl.cudagraphs import GraphedStep, GraphInputsMoved, check_cuda_graphs
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
    (dict(device="cuda", compile=True, algo="ppo", off_policy=False), "ppo's update runs compiled without it"),
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
    import fnrl.cudagraphs as cudagraphs
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
@pytest.mark.parametrize("name", ["dqn", "sac"])
def test_graphed_learner_steps_equal_compiled_ones_on_cuda(tmp_path, name):
    """The fused learner step replayed from a CUDA graph gives the parameters of the same step
    called compiled, after a few updates from the same seed (the same random draws)."""
    from fnrl.train import train

    small = {"dqn": dict(total_steps=1_200, learning_starts=400, hidden=(32,), batch_size=32),
             "sac": dict(env_id="Pendulum-v1", total_steps=900, learning_starts=300, hidden=(32, 32),
                         batch_size=32)}[name]
    config = dataclasses.replace(algos.default_config(name), **small)
    states = [train(name, config, seed=1, device="cuda", cuda_graphs=graphs, quiet=True, tensorboard=False,
                    plot=False, log_dir=tmp_path / str(graphs)).state for graphs in (False, True)]
    torch.testing.assert_close(states[1]["params"], states[0]["params"])
