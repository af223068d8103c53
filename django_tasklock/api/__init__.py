"""What callers use: ``run_exclusive``, ``lock()``, ``@exclusive``, ``unique_on``, ``Leadership``,
``release_on_sigterm()``.

The top wing of the lock itself. It turns a call, a decorated function or a
task's enqueue into one :class:`~django_tasklock.locking.lock.Lock` and says
what happened when the key was held (the skip report).

May import: ``locking``, ``leases``, ``backends`` and the package's base
modules (``conf``, ``durations``, ``exceptions``, ``holders``, ``models``,
``notifier``, ``processes``, ``reasons``, ``signals``). Never ``ops``, ``admin``,
``management``, ``contrib`` or ``testing``.
"""
