"""The README's test command on a machine with no services: their tests skip, nothing fails.

``.ci/run`` runs the whole command that way (service URLs pointed at closed
ports, no Docker engine); these are the pieces that once made it fail.
"""

from __future__ import annotations

import gc
import warnings
from pathlib import Path

import pytest

from tests.support import services


@pytest.mark.parametrize("docker_host", [None, "unix:///nonexistent/docker.sock"])
def test_the_docker_probe_leaves_no_socket_open(
    docker_host: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no engine: none at the default socket, or a DOCKER_HOST that does not answer.
    if docker_host is None:
        monkeypatch.delenv("DOCKER_HOST", raising=False)
        if Path("/var/run/docker.sock").exists():
            pytest.skip("a Docker engine's socket is here: the probe would find it")
    else:
        monkeypatch.setenv("DOCKER_HOST", docker_host)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        gc.collect()  # what earlier tests of this process left: not the probe's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert services._docker_available() is False
        gc.collect()  # what the probe left open would be collected, and warned of, now
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
