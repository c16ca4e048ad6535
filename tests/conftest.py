import os
import warnings

import pytest

warnings.filterwarnings("ignore", module="gymnasium")


def pytest_configure(config):
    """Under pytest-xdist, pin each worker to its own share of the cores (as `fnrl launch` pins its
    slots). The training loop gives an update every core it may use (`fnrl.run.threads.update_threads_for`),
    so unpinned workers' updates fought over the same cores: on 2 cores the full suite took 29 min
    unpinned and 12.6 min pinned, the DQN-family learning tests 3-6x their time alone."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and 1 < count <= len(cores):
        import torch

        share = cores[int(worker.removeprefix("gw")) % count::count]
        os.sched_setaffinity(0, share)
        torch.set_num_threads(len(share))


def pytest_collection_modifyitems(config, items):
    """The `slow` tests first, in their collected order, then the rest. pytest-xdist's worksteal hands
    each worker a contiguous share and an idle worker takes the back half of a busy one's queue, so the
    last tests to run are short ones: a learning test collected late (tests/test_learning_qpg.py) no
    longer runs alone at the end while the other worker idles."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True, scope="session")
def _count_envs():
    from tests.helpers import register_count_envs

    register_count_envs()
