"""Shared pytest fixtures, and the import path of the tests.

The tests live in folders that mirror the packages (tests/opencood_ext/<subpackage>/, tests/gencomm/,
tests/experiments/, tests/tools/, ...); shared builders (tiny runs, toy training, reference key lists,
a fake CARLA server) are modules in tests/helpers/. A test imports a helper, or another test module's
builder, by its module name (``from tiny_runs import tiny_config``, ``from test_seeds import _records``),
so every test folder is put on the import path here, before any test module is collected. The
checkout goes in front of them: tests/opencood_ext/, tests/gencomm/ and tests/experiments/ are folders
without an ``__init__``, and with tests/ on the path (pytest puts the conftest's folder there) they would
otherwise be found first as namespace packages of the same names."""
import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for _folder in sorted({p.parent for p in _TESTS.rglob("*.py") if "assets" not in p.relative_to(_TESTS).parts}):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
sys.path.insert(0, str(_TESTS.parent))

import pytest  # noqa: E402
import torch  # noqa: E402

import gencomm  # noqa: F401  (registers the GenComm link, as the tools do)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only contend on the shared CPU (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
