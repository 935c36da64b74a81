"""Test session setup: offline, deterministic; nothing here reaches the network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)

from .wheel_utils import InstalledWheel, build_and_install


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """The package built as a wheel and installed (not editable) into a folder of its own, once per session."""
    return build_and_install(tmp_path_factory.mktemp("wheel"))
