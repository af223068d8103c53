"""A held lease: its token, its deadlines, the heartbeat that extends it, its release.

A :class:`~django_tasklock.leases.lease.Lease` is one grant of a key, and the
process's one heartbeat refreshes every live lease in batches, declares a
loss at the lease's local deadline (the watchdog), and announces it (signals
and the log, off the heartbeat's thread). The telemetry hook (``observe``)
and the record of recent ticks live here too, and the reaping of this
machine's dead holders (``reaping``), which the heartbeat does between ticks.

May import: ``backends`` and the base modules. Never ``locking``, ``api`` or
anything above them: what a lease needs of a lock or of its options is a
``typing.Protocol`` here.
"""
