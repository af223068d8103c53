"""The suite runs under the Django its tox environment names.

tox sets ``TASKLOCK_TEST_DJANGO`` (``4.2``, ``6.1``, ...) per environment, so
that a test dependency wanting a newer Django cannot upgrade it unnoticed.
"""

from __future__ import annotations

import os

import django
import pytest


def test_django_is_the_version_the_tox_environment_names() -> None:
    wanted = os.environ.get("TASKLOCK_TEST_DJANGO")
    if not wanted:
        pytest.skip("TASKLOCK_TEST_DJANGO is not set (tox sets it per environment)")
    assert f"{django.VERSION[0]}.{django.VERSION[1]}" == wanted
