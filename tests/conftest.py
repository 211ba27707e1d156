"""Shared fixtures. The end-to-end tests use the real thing: the pinned llama.cpp source from the
llama-cpp-python sdist on PyPI, a real CMake build for this machine (cached under DEVICELAB_HOME; the
first run on a clean machine compiles for ~7 minutes), and the real SmolLM2-135M model from PyPI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def source():
    from devicelab.build import source as s
    return s.resolve(None)


@pytest.fixture(scope="session")
def host_build(source):
    from devicelab.build import cache, targets
    return cache.ensure(source, targets.local_native())


@pytest.fixture(scope="session")
def smol_path():
    from devicelab.models import store
    return store.resolve(None)


def devicelab(*args, cwd=None, env=None, timeout=1800, check=False):
    """Run the real CLI as a user would."""
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([sys.executable, "-m", "devicelab.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"devicelab {' '.join(map(str, args))} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p
