import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import thunder_subclass  # noqa: E402,F401  (must come before thunder)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
