"""The Redis backend: one string key per lease, every decision in a Lua script.

``backend`` (the backend class), ``scripts`` (its Lua), ``releases`` (the
release and its tombstone), ``connections``
(making its connection, from a URL or a django-redis cache), ``urls`` (clients
from ``TASKLOCK_REDIS_URL``, Sentinel included) and ``checks`` (its system
check). redis-py is imported only when a connection is made, so this package
imports without the ``[redis]`` extra.
"""

from django_tasklock.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
