import warnings

import pytest

warnings.filterwarnings("ignore", module="gymnasium")


@pytest.fixture(autouse=True, scope="session")
def _count_envs():
    from tests.helpers import register_count_envs

    register_count_envs()
