"""TorchDynamo is imported only by a process that compiles (`fnrl._lazy_dynamo`), and then sees every mark
tensordict made and fnrl's settings; functions compiled at their first call are not compiled before.

Each check runs in a fresh interpreter: this one imported TorchDynamo long ago."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from fnrl.accel import inductor


def _python(code: str, tmp_path=None) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_an_eager_run_never_imports_dynamo(tmp_path):
    out = _python(f"""
        import sys
        from fnrl.cli import main
        code = main(["train", "ppo", "--no-compile", "--total-steps", "1024", "--eval-episodes", "2", "--quiet",
                     "--log-dir", {str(tmp_path / "run")!r}])
        print(code, "torch._dynamo" in sys.modules, "tensordict" in sys.modules)
    """, tmp_path)
    assert out.splitlines()[-1].split() == ["0", "False", "True"]


def test_dynamo_imported_later_gets_tensordicts_marks_and_fnrls_settings():
    out = _python("""
        import sys
        import fnrl.algos.ppo
        from fnrl import _lazy_dynamo as _dynamo
        import tensordict.base, tensordict.utils
        assert "torch._dynamo" not in sys.modules
        kept = list(_dynamo._kept)
        assert tensordict.base._foreach_copy_compiled in kept
        assert tensordict.utils._lock_warn._dynamo_marked_constant is True
        import torch.compiler
        assert torch.compiler.allow_in_graph is not _dynamo._keep   # tensordict's import left it as it was
        import torch._dynamo
        from torch._dynamo import trace_rules
        finder_left = not any(isinstance(f, _dynamo._Finder) for f in sys.meta_path)
        print(all(trace_rules.is_callable_allowed(fn) for fn in kept), _dynamo._kept == [],
              torch._dynamo.config.recompile_limit >= 64, finder_left)
    """)
    assert out.split() == ["True"] * 4


def test_dynamo_imported_first_gets_fnrls_settings():
    out = _python("""
        import torch._dynamo, fnrl.algos.ppo
        print(torch._dynamo.config.recompile_limit >= 64)
    """)
    assert out.split() == ["True"]


def test_compile_on_first_call_compiles_once_at_the_first_call(monkeypatch):
    made = []

    def fake_compile(fn, **kwargs):
        made.append(kwargs)
        return lambda x: fn(x) + 1

    monkeypatch.setattr(torch, "compile", fake_compile)
    call = inductor.compile_on_first_call(lambda x: 2 * x, fullgraph=True, dynamic=False)
    assert made == []
    assert [call(1), call(2)] == [3, 5]
    assert made == [{"fullgraph": True, "dynamic": False}]
