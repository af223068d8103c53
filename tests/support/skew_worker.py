"""A worker whose clock is wrong: ``python -m tests.support.skew_worker ARGS`` under libfaketime.

ARGS is JSON: ``{"recipe": {...}, "key": ..., "action": "try" | "hold", "ttl": seconds}``.
``try`` prints whether it acquired the key; ``hold`` acquires it (no heartbeat),
prints ``acquired`` and waits to be killed, with a token that proves nothing
of this process (so that only the ttl frees the key).
"""

from __future__ import annotations

import json
import signal
import sys
from datetime import timedelta

from django_tasklock.api.service import new_token
from django_tasklock.testing import BackendRecipe


def main(spec: dict[str, object]) -> None:
    if spec["action"] == "hold":
        # A holder nobody can prove gone once killed (as on another machine):
        # only its lease's end, by the storage's clock, frees the key.
        from django_tasklock import processes

        processes.mark = lambda: ""
    recipe = BackendRecipe(**spec["recipe"])  # type: ignore[arg-type]
    backend = recipe.build()
    ttl = timedelta(seconds=float(spec["ttl"]))  # type: ignore[arg-type]
    acquired = backend.acquire(
        str(spec["key"]), new_token(), ttl=ttl, max_lifetime=timedelta(hours=1)
    )
    print("acquired" if acquired else "refused", flush=True)
    if spec["action"] == "hold" and acquired:
        signal.pause()  # no clock involved: faketime breaks sleeping on a clock set back


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
