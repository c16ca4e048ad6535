"""fnrl: functional deep reinforcement learning for PyTorch."""
from fnrl import _lazy_dynamo

__version__ = "0.1.0"

_lazy_dynamo.install()   # TorchDynamo imported only when something compiles
