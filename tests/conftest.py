"""Shared pytest fixtures."""
import pytest
import torch

import gencomm  # noqa: F401  (registers the GenComm link, as the tools do)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only contend on the shared CPU (restored afterwards)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
