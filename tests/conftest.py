"""Test session setup: offline, deterministic; nothing here reaches the network."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
