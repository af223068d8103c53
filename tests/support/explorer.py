"""The generative fault explorer's world: a faulty storage, virtual time, holders and the model.

``tests/faults/test_explorer.py`` drives it with Hypothesis. Each worker is a
holder that follows the rules of ``docs/protocol.md`` for what it believes:

* granted: local deadline ``asked_at + min(ttl, max_lifetime)``, cap
  ``asked_at + max_lifetime``; with fencing, the fence is asked next (None or
  an error: released by the token, not granted); an acquisition that raises is
  released by the token;
* a heartbeat tick: past the local deadline, lost (no refresh sent); else the
  storage's clock is read and compared with the previous reading (a step
  brings the deadlines forward), then the refresh: True moves the local
  deadline to when it was *sent* + ttl (never past the cap), False is a loss;
* the release, read by when it was sent (``RELEASED``, ``GONE``, ``LOST``);
* ``lost`` is True once declared, or from the local deadline on.

Time passes by steps of a virtual clock: the holders' clock moves ahead and
every stored time moves back by as much (:class:`~tests.support.clock_step.SteppedClock`),
so a pause past the ttl costs no real time. A storage clock step moves only
the stored times.

The history it keeps is checked after every operation (:meth:`World.check`):

1. never two workers that believe they hold one key with ``lost`` False at
   the same instant (but for the documented windows: a lease force-released,
   or ended by a storage clock step, until its holder's next tick);
2. fences strictly increase per key, in the order they are answered;
3. no lease that nobody holds outlives its bound (the protocol page's: a
   ``min_hold`` cut ends at acquisition + ``min_hold``; a late acquisition
   writes nothing while the token's Redis tombstone lives; otherwise the last
   acquisition or refresh of that token that arrived, + its ttl);
4. no loss "taken" or "released_by_operator" unless someone else ended the
   lease (a force release, a storage clock step);
5. every loss declared within its bound: a holder that believes it holds
   (``lost`` False) finds its lease in the storage, lasting at least until
   its local deadline.

With a ``limit`` (:attr:`World.limit`), the workers take permits of every key
(``acquire_permit``) and each holder refreshes, fences, releases and is
force-released by its permit's name; an acquisition that raised is released
by the token on each permit's name in turn, until one is (as the lock's
``discard_permit`` does). A worker may also ask a limited key as a mutex
(``acquire(mutex=True)``): ``LimitMismatch`` is a refusal. Check 1 is then
per permit's name (and the key's own, a mutex's), and per key:

6. never more than ``limit`` workers that believe they hold one of the key's
   permits with ``lost`` False at the same instant, nor one that believes it
   holds the key as a mutex beside them (in the same windows as check 1); no
   permit given outside the key's ``limit`` names, and none stored past them;

check 2 is per key, across its permits (one counter), and checks 3 to 5 are
per permit's name.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django_tasklock.backends.base import (
    BaseBackend,
    HeldLock,
    Refresh,
    Released,
    lease_id,
    limited_key,
    permit_key,
    storage_key,
)
from django_tasklock.exceptions import LimitMismatch
from django_tasklock.testing.delegate import DelegatingBackend
from django_tasklock.testing.proxy import FaultProxy

T = TypeVar("T")

TTL = 30.0
REFRESH_INTERVAL = 10.0
MIN_HOLD = 20.0
#: Seconds a stored time may differ from the holder's reading of the same moment:
#: the round trips of the calls around it, on a loaded machine.
SLACK = 1.0
#: The tombstone's floor (docs/protocol.md, "Tombstoned"), by real time: virtual
#: time does not move it.
TOMBSTONE = 60.0

NONE, ERROR_BEFORE, ERROR_AFTER, DROP_REPLY, LATE, RESENT_LATER = (
    "none",
    "error before",
    "error after",
    "reply dropped",
    "late copy",
    "release re-sent later",
)
#: Faults any backend can meet: the call fails before it ran, or after (its reply lost).
LOCAL_FAULTS = (NONE, ERROR_BEFORE, ERROR_AFTER)
#: And those of a storage across a network (through a FaultProxy).
WIRE_FAULTS = (*LOCAL_FAULTS, DROP_REPLY, LATE)


#: The kinds of violation, by the check of the module's docstring they break.
KINDS = (
    "two holders",
    "fence",
    "orphan",
    "min_hold",
    "false loss",
    "late loss",
    "over limit",
)


class StorageFault(ConnectionError):
    """What the caller sees of an injected fault."""


class Violation(AssertionError):
    """The history broke the model."""


class MemoryClock:
    """The memory backend's clock: this process's, plus the time made to pass."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


class Faulty(DelegatingBackend):
    """``inner`` with one fault armed at a time, for the next call that takes a key.

    ``resends``: the client sends a call again when its reply is late (a
    redis-py client with retries); otherwise the late call raises to the
    caller. Either way its first copy is kept in :attr:`late` and arrives when
    the explorer says (:meth:`deliver`). ``proxy``: where a reply is dropped on
    the wire, so that the backend's or client's own re-send runs.
    """

    def __init__(
        self,
        inner: BaseBackend,
        *,
        clock: Callable[[], float | None],
        proxy: FaultProxy | None,
        resends: bool,
        errors: tuple[type[BaseException], ...],
        on_error: Callable[[], None],
    ) -> None:
        super().__init__(inner)
        self.armed = NONE
        self.proxy = proxy
        self.resends = resends
        self.errors = errors
        self.on_error = on_error
        self._clock = clock
        self.late: list[tuple[str, str, Callable[[], Any]]] = []  # (what, token, the copy)
        self.injected: Counter[str] = Counter()
        self.calls = 0

    def storage_time(self) -> float | None:
        return self._clock()

    def _call(self, what: str, key: str, token: str, run: Callable[[], T]) -> T:
        fault, self.armed = self.armed, NONE
        self.calls += 1
        if fault != NONE:
            self.injected[fault] += 1
        if fault == ERROR_BEFORE:
            raise StorageFault(f"{what}: not sent")
        if fault == LATE:
            self.late.append((what, token, run))
            if not self.resends:
                raise StorageFault(f"{what}: timed out (a copy is on its way)")
        try:
            if fault == DROP_REPLY:
                assert self.proxy is not None
                # A permit's requests name its limited key (Redis: the hash; a
                # database: its row's prefix).
                self.proxy.drop_reply(match=storage_key(limited_key(key)[0]).encode())
            answer = run()
        except self.errors as error:
            self.on_error()
            raise StorageFault(f"{what}: {error!r}") from error
        finally:
            if self.proxy is not None:
                self.proxy.heal()
        if fault == ERROR_AFTER:
            raise StorageFault(f"{what}: reply lost")
        return answer

    def acquire(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self._call(
            "acquire",
            key,
            token,
            lambda: self.inner.acquire(key, token, ttl=ttl, max_lifetime=max_lifetime),
        )

    def acquire_permit(
        self, key: str, token: str, *, limit: int, ttl: timedelta, max_lifetime: timedelta
    ) -> str | None:
        return self._call(
            "acquire_permit",
            key,
            token,
            lambda: self.inner.acquire_permit(
                key, token, limit=limit, ttl=ttl, max_lifetime=max_lifetime
            ),
        )

    def refresh(self, key: str, token: str, *, ttl: timedelta, max_lifetime: timedelta) -> bool:
        return self._call(
            "refresh",
            key,
            token,
            lambda: self.inner.refresh(key, token, ttl=ttl, max_lifetime=max_lifetime),
        )

    def refresh_one(self, item: Refresh) -> bool:
        """``refresh_many`` of one lease: the heartbeat's call."""
        return self._call(
            "refresh_many", item.key, item.token, lambda: self.inner.refresh_many([item])
        )[0]

    def release_outcome(
        self, key: str, token: str, *, min_hold: timedelta | None = None
    ) -> Released:
        def run() -> Released:
            if min_hold is None:
                return self.inner.release_outcome(key, token)
            return self.inner.release_outcome(key, token, min_hold=min_hold)

        return self._call("release", key, token, run)

    def release_resent(
        self, key: str, token: str, min_hold: timedelta | None
    ) -> Callable[[], Released]:
        """Run the release once, its reply lost; return the re-send, to send later.

        The database backend sends it again on a new connection, told that it
        is a re-send; a redis-py client sends the same script again.
        """
        self.injected[RESENT_LATER] += 1
        self.calls += 1
        inner = self.inner
        try:
            if min_hold is None:
                inner.release_outcome(key, token)
            else:
                inner.release_outcome(key, token, min_hold=min_hold)
        except self.errors as error:
            self.on_error()
            raise StorageFault(f"release: {error!r}") from error
        if hasattr(inner, "_send_release"):
            return lambda: inner._send_release(storage_key(key), token, min_hold, [None])
        if min_hold is None:
            return lambda: inner.release_outcome(key, token)
        return lambda: inner.release_outcome(key, token, min_hold=min_hold)

    def fence(self, key: str, token: str) -> int | None:
        return self._call("fence", key, token, lambda: self.inner.fence(key, token))

    def force_release(self, key: str, lease: str | None = None) -> HeldLock | None:
        if self.armed == LATE:  # its DELETE is bound to the lease seen: not replayed here
            self.armed = ERROR_AFTER
        return self._call("force_release", key, "", lambda: self.inner.force_release(key, lease))


@dataclasses.dataclass
class Held:
    """What one worker believes of the lease it asked for."""

    worker: int
    key: str
    token: str
    ttl: float
    max_lifetime: float
    min_hold: float | None
    asked_at: float
    valid_until: float
    deadline: float
    declared: str | None = None
    fence: int | None = None
    #: In the documented window of two holders after a force release: until a
    #: refresh is answered.
    excused: str | None = None
    #: In the documented window after a storage clock step: until the next clock
    #: check (or, where the storage's clock cannot be read, a refresh answered).
    stepped: bool = False
    #: The lease's name in the storage: the key, or the permit's name (``permit_key``).
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or self.key

    def lost(self, now: float) -> bool:
        return self.declared is not None or now >= self.valid_until


@dataclasses.dataclass
class Token:
    """What the storage may hold for one token: the model's side of a lease."""

    key: str
    ttl: float
    max_lifetime: float
    min_hold: float | None = None
    owned: bool = True
    cut: bool = False  # a min_hold release answered RELEASED
    tombstone_at: float | None = None  # by real time (Redis)
    ended_by_other: str | None = None
    writes_until: float = 0.0  # the latest end an arrived acquisition or refresh may give
    last_write: str = "acquire"  # the last call of the token that reached the storage


class World:
    """The storage under test, the workers, the virtual clock and the history."""

    def __init__(
        self,
        name: str,
        faulty: Faulty,
        direct: BaseBackend,
        step_storage: Callable[[float], None] | None,
        pass_storage: Callable[[float], None],
        keys: list[str],
        workers: int,
        seed: int,
        limit: int | None = None,
    ) -> None:
        self.name = name
        #: None: every key is a mutex's. Else the limit of every key: the workers
        #: take its permits (``acquire_permit``).
        self.limit = limit
        self.backend = faulty
        self.direct = direct
        self.step_storage = step_storage
        self.pass_storage = pass_storage
        self.keys = keys
        self.offset = 0.0
        self.holding: dict[int, Held | None] = dict.fromkeys(range(workers))
        self.readings: dict[int, tuple[float, float, float] | None] = dict.fromkeys(range(workers))
        self.tokens: dict[str, Token] = {}
        self.by_lease: dict[str, str] = {}
        self.fences: dict[str, int] = {}
        #: Releases whose re-send is on its way: (the lease, when sent, the re-send).
        self.pending: dict[int, tuple[Held, float, Callable[[], Released]]] = {}
        self.history: list[str] = []
        self.operations = 0
        self.steps = 0
        self.random = random.Random(seed)
        self.redis = name == "redis"
        #: Told of each violation (its kind, its message), before it is raised.
        self.on_violation: Callable[[str, str], None] | None = None
        #: Kinds of violation noted but not raised (to look for the others).
        self.ignore: frozenset[str] = frozenset()

    # -- time ----------------------------------------------------------------

    def now(self) -> float:
        """The holders' clock: monotonic, plus the time made to pass."""
        return time.monotonic() + self.offset

    def note(self, line: str) -> None:
        self.history.append(f"{self.now() - self.offset:9.3f} +{self.offset:7.1f} {line}")

    def pass_time(self, seconds: float, paused: int | None = None) -> None:
        """``seconds`` pass for everyone; every holder but ``paused`` ticks on time."""
        left = seconds
        while left > 0:
            chunk = min(left, REFRESH_INTERVAL / 2)
            self.pass_storage(chunk)
            self.offset += chunk
            left -= chunk
            for worker in self.holding:
                if worker != paused:
                    self.tick(worker, quiet=True)
        self.note(
            f"{seconds:.1f} s pass" + (f", worker {paused} paused" if paused is not None else "")
        )

    def storage_step(self, seconds: float) -> None:
        """The storage's clock jumps ``seconds`` ahead: every live lease there may end."""
        assert self.step_storage is not None
        self.step_storage(seconds)
        self.steps += 1
        for held in self.holding.values():
            if held is not None:
                held.stepped = True
                self.tokens[held.token].ended_by_other = "storage clock step"
        self.note(f"storage clock steps +{seconds:.1f} s")

    def until_free(self, key: str) -> float | None:
        """None if the storage has ``key`` free (a permit of it); else seconds until it frees."""
        seen = [self.direct.peek(name) for name in self.permits(key)]
        if any(lease is None for lease in seen):
            return None
        return min(lease.seconds_left for lease in seen if lease is not None)

    # -- a worker's calls ----------------------------------------------------

    def acquire(
        self,
        worker: int,
        key: str,
        *,
        fencing: bool,
        min_hold: float | None,
        max_lifetime: float,
        mutex: bool = False,
    ) -> None:
        """``mutex``: with a limit, a caller that asks the key as a mutex (limit 1)."""
        if self.holding[worker] is not None or worker in self.pending:
            return
        token = f"explorer:{worker}:{self.random.getrandbits(64):016x}"
        self.tokens[token] = Token(key, TTL, max_lifetime, min_hold)
        self.by_lease[lease_id(token)] = token
        self.by_lease[lease_id(token + "~released")] = (
            token  # a database row a min_hold release cut
        )
        asked_at = self.now()
        ttl, cap = timedelta(seconds=TTL), timedelta(seconds=max_lifetime)
        try:
            if self.limit is None or mutex:
                granted = self.backend.acquire(key, token, ttl=ttl, max_lifetime=cap)
                name = key
            else:
                permit = self.backend.acquire_permit(
                    key, token, limit=self.limit, ttl=ttl, max_lifetime=cap
                )
                granted, name = permit is not None, permit or key
        except StorageFault as error:
            self.note(f"w{worker} acquire {key} {token[-6:]}: {error}; released by the token")
            self._arrived(token, "acquire")
            self._undo(token, key if self.limit is None or mutex else None)
            return
        except LimitMismatch as error:  # nothing written
            self.tokens[token].owned = False
            self.note(f"w{worker} acquire {key} {token[-6:]}: refused, {error}")
            return
        self._arrived(token, "acquire")
        if not granted:
            self.tokens[token].owned = False
            self.note(f"w{worker} acquire {key} {token[-6:]}: refused")
            return
        if self.limit is not None and not mutex and name not in self.permits(key):
            self.fail("over limit", f"w{worker} was given {name!r}, not one of {key}'s permits")
        lease_seconds = min(TTL, max_lifetime)
        held = Held(
            worker, key, token, TTL, max_lifetime, min_hold, asked_at,
            asked_at + lease_seconds, asked_at + max_lifetime, name=name,
        )  # fmt: skip
        if fencing:
            try:
                fence = self.backend.fence(name, token)
            except StorageFault as error:
                fence = None
                self.note(f"w{worker} fence {name}: {error}")
            if fence is None:
                self.note(
                    f"w{worker} acquire {name} {token[-6:]}: no fence; released by the token"
                )
                self._undo(token, name)
                return
            self._fenced(held, fence)
        self.holding[worker] = held
        self._read_clock(worker, first=True)
        self.note(f"w{worker} acquire {name} {token[-6:]}: granted, fence {held.fence}")

    def permits(self, key: str) -> list[str]:
        """The names of ``key``'s leases: itself (a mutex), or each of its permits."""
        if self.limit is None:
            return [key]
        return [permit_key(key, slot) for slot in range(self.limit)]

    def _fenced(self, held: Held, fence: int) -> None:
        last = self.fences.get(held.key)
        if last is not None and fence <= last:
            self.fail("fence", f"fence of {held.key} went from {last} to {fence} (w{held.worker})")
        self.fences[held.key] = fence
        held.fence = fence

    def _undo(self, token: str, name: str | None = None) -> None:
        """The lock's release by the token after an acquisition that failed.

        Of a permit whose name is unknown (its request raised): each permit's
        name in turn, until one is released (``discard_permit``).
        """
        state = self.tokens[token]
        state.owned = False
        for each in [name] if name is not None else self.permits(state.key):
            try:
                answer = self.direct.release_outcome(each, token)
            except Exception as error:  # the lease then runs out by itself
                self.note(f"  release by the token failed: {error!r}")
                return
            self._released(token, answer, None)
            if answer is Released.RELEASED:
                return

    def _arrived(self, token: str, what: str) -> None:
        """A write of ``token`` reached the storage: the end it may give the lease."""
        state = self.tokens[token]
        state.last_write = what
        tombstone = state.tombstone_at
        refused = tombstone is not None and time.monotonic() - tombstone < TOMBSTONE - SLACK
        if what.endswith("acquire") and self.redis and refused:
            return  # the tombstone refuses it (docs/protocol.md, "Tombstoned")
        ttl = min(state.ttl, state.max_lifetime) if what.endswith("acquire") else state.ttl
        state.writes_until = max(state.writes_until, self.now() + ttl)

    def _released(self, token: str, answer: Released, min_hold: float | None) -> None:
        state = self.tokens[token]
        if answer is Released.RELEASED and min_hold is not None:
            state.cut = True
        if self.redis and answer in (Released.RELEASED, Released.GONE):
            state.tombstone_at = time.monotonic()

    def _read_clock(self, worker: int, *, first: bool = False) -> bool:
        """The heartbeat's clock check (docs/protocol.md, "A storage clock that steps").

        True if the storage's clock was read and compared.
        """
        sent = self.now()
        try:
            reading = self.backend.storage_time()
        except Exception:
            return False
        received = self.now()
        if reading is None:
            return False
        previous = self.readings[worker]
        self.readings[worker] = (sent, received, reading)
        if first or previous is None:
            return True
        previous_sent, previous_received, previous_reading = previous
        most = received - previous_sent
        advanced = reading - previous_reading
        if advanced > most + 0.25 + 0.001 * most:
            step = advanced - max(0.0, sent - previous_received)
            held = self.holding[worker]
            if held is not None:
                held.valid_until -= step
                held.deadline -= step
                self.note(f"w{worker} clock check: storage stepped, deadlines -{step:.1f} s")
        return True

    def tick(self, worker: int, *, many: bool = False, quiet: bool = False) -> None:
        """The heartbeat's tick for ``worker``'s lease."""
        held = self.holding[worker]
        if held is None or held.declared is not None:
            return
        if self._read_clock(worker):
            held.stepped = False  # the documented window ends at the clock check
        now = self.now()
        if now >= held.valid_until:
            self._declare(held, "max_lifetime" if held.valid_until >= held.deadline else "expired")
            return
        sent = self.now()
        ttl, cap = timedelta(seconds=held.ttl), timedelta(seconds=held.max_lifetime)
        try:
            if many:
                answer = self.backend.refresh_one(Refresh(held.name, held.token, ttl, cap))
            else:
                answer = self.backend.refresh(held.name, held.token, ttl=ttl, max_lifetime=cap)
        except StorageFault as error:
            self._arrived(held.token, "refresh")
            if not quiet:
                self.note(f"w{worker} refresh {held.name}: {error}")
            return
        self._arrived(held.token, "refresh")
        held.excused = None  # a refresh answered: the window after a force release ends
        held.stepped = False
        if answer:
            held.valid_until = max(held.valid_until, min(sent + held.ttl, held.deadline))
        elif sent < held.valid_until:
            self._declare(held, self._not_ours(held))
        else:
            self._declare(held, "expired")
        if not quiet:
            self.note(f"w{worker} refresh {held.name}: {answer}")

    def _not_ours(self, held: Held) -> str:
        """Found not ours before the local deadline: "taken" or "released_by_operator"."""
        try:
            seen = self.direct.peek(held.name)
        except Exception:
            seen = None
        reason = "taken" if seen is not None else "released_by_operator"
        why = self.tokens[held.token].ended_by_other
        if why is None:
            self.fail(
                "false loss",
                f"w{held.worker} told {reason!r} about {held.name}, but nothing ended its lease",
            )
        return reason

    def _declare(self, held: Held, reason: str) -> None:
        if held.declared is None:
            held.declared = reason
            self.note(f"w{held.worker} lost {held.name}: {reason}")

    def release(self, worker: int, *, resent_later: bool = False) -> None:
        """The work ends: the lease leaves the heartbeat and the release is sent.

        ``resent_later``: its first copy ends the lease and its reply is lost;
        the worker waits for the re-send's answer (:meth:`answer`) while the
        others go on.
        """
        held = self.holding[worker]
        if held is None or worker in self.pending:
            return
        self.holding[worker] = None
        self.readings[worker] = None
        self.tokens[held.token].owned = False
        sent = self.now()
        if sent >= held.valid_until:  # left the heartbeat past its deadline
            self._declare(held, "max_lifetime" if held.valid_until >= held.deadline else "expired")
        min_hold = None if held.min_hold is None else timedelta(seconds=held.min_hold)
        if resent_later:
            try:
                self.pending[worker] = (
                    held,
                    sent,
                    self.backend.release_resent(held.name, held.token, min_hold),
                )
            except StorageFault as error:
                self.note(f"w{worker} release {held.name}: {error}; the lease runs out")
                return
            self.note(f"w{worker} release {held.name}: ran, its reply lost; the re-send waits")
            return
        try:
            answer = self.backend.release_outcome(held.name, held.token, min_hold=min_hold)
        except StorageFault as error:
            self.note(f"w{worker} release {held.name}: {error}; the lease runs out")
            return
        self._read_release(held, sent, answer)

    def answer(self, worker: int) -> None:
        """The re-sent release of ``worker`` arrives and is answered."""
        held, sent, resend = self.pending.pop(worker)
        try:
            answer = resend()
        except Exception as error:
            self.note(f"w{worker} re-sent release {held.name}: {error!r}; the lease runs out")
            return
        self.note(f"w{worker} re-sent release {held.name}:")
        self._read_release(held, sent, answer)

    def _read_release(self, held: Held, sent: float, answer: Released) -> None:
        """The answer read by when the release was sent (docs/protocol.md, "Released")."""
        self._released(held.token, answer, held.min_hold)
        if answer is Released.LOST or (answer is Released.GONE and sent >= held.valid_until):
            if sent < held.valid_until:
                self._declare(held, self._not_ours(held))
            else:
                self._declare(held, "expired")
        self.note(f"w{held.worker} release {held.name}: {answer.name}, lost={held.declared}")

    def force_release(self, key: str) -> None:
        try:
            ended = self.backend.force_release(key)
        except StorageFault as error:
            # It may have run: every holder of the key may have lost its lease.
            ended = None
            for held in self.holding.values():
                if held is not None and held.name == key:
                    held.excused = "force release (its reply lost)"
                    self.tokens[held.token].ended_by_other = "force release"
            self.note(f"operator force-releases {key}: {error}")
            return
        if ended is not None:
            token = self.by_lease.get(ended.lease)
            if token is not None:
                self.tokens[token].ended_by_other = "force release"
                for held in self.holding.values():
                    if held is not None and held.token == token:
                        held.excused = "force-released"
        self.note(f"operator force-releases {key}: {ended.lease if ended else None}")

    def deliver_of(self, token: str) -> None:
        """Every late copy of ``token``'s calls reaches the storage, in the order sent."""
        while True:
            mine = [i for i, (_, late, _) in enumerate(self.backend.late) if late == token]
            if not mine:
                return
            self.deliver(mine[0])

    def deliver(self, index: int) -> None:
        """The first copy of a late call reaches the storage; nobody reads its reply."""
        what, token, copy = self.backend.late.pop(index % len(self.backend.late))
        try:
            copy()
        except Exception as error:
            self.note(f"late {what} of {token[-6:]} arrives: {error!r}")
            return
        if token and what != "fence" and what != "release":
            late = "late acquire" if what.startswith("acquire") else "late refresh"
            self._arrived(token, late)
        self.note(f"late {what} of {token[-6:]} arrives")

    # -- the model -----------------------------------------------------------

    def fail(self, kind: str, message: str, cause: str | None = None) -> None:
        """A violation of ``kind`` (one of :data:`KINDS`): raised, unless ignored.

        ``cause``: what wrote the lease last, where that tells two defects apart.
        """
        if self.on_violation is not None:
            self.on_violation(kind if cause is None else f"{kind} ({cause})", message)
        if kind in self.ignore:
            self.note(f"ignored violation ({kind}): {message}")
            return
        tail = "\n".join(self.history[-40:])
        raise Violation(f"{self.name}: {kind}: {message}\n-- the last operations:\n{tail}")

    def check(self) -> None:
        """The model's checks, at this instant."""
        self.operations += 1
        now = self.now()
        believers: dict[str, list[Held]] = {}  # by the lease's name (a mutex's: its key)
        for held in self.holding.values():
            if held is not None and not held.lost(now) and not (held.excused or held.stepped):
                believers.setdefault(held.name, []).append(held)
        for name, holders in believers.items():
            if len(holders) > 1:
                names = ", ".join(f"w{h.worker}" for h in holders)
                self.fail("two holders", f"two holders of {name} with lost=False: {names}")
        for key in self.keys:
            if self.limit is not None:
                self._check_limit(key, believers)
                self._check_lease(key, believers.get(key, []))  # a mutex's lease of it
            for name in self.permits(key):
                self._check_lease(name, believers.get(name, []))

    def _check_limit(self, key: str, believers: dict[str, list[Held]]) -> None:
        """At most ``limit`` believers of ``key``'s permits; no permit past its last."""
        assert self.limit is not None
        holders = [held for name in self.permits(key) for held in believers.get(name, [])]
        if len(holders) > self.limit:
            names = ", ".join(f"w{h.worker} ({h.name[-1]})" for h in holders)
            self.fail(
                "over limit",
                f"{len(holders)} holders of {key}'s {self.limit} permits with lost=False: {names}",
            )
        mutexes = believers.get(key, [])
        if mutexes and holders:
            self.fail(
                "two holders",
                f"w{mutexes[0].worker} holds {key} as a mutex while "
                + ", ".join(f"w{h.worker}" for h in holders)
                + " hold its permits, all with lost=False",
            )
        beyond = self.direct.peek(permit_key(key, self.limit))
        if beyond is not None:
            self.fail("over limit", f"{key} has a permit past its limit {self.limit}: {beyond}")

    def _check_lease(self, key: str, believers: list[Held]) -> None:
        """The checks of one lease (a mutex's key, or a permit's name) and its believers."""
        seen = self.direct.peek(key)
        after = self.now()
        for held in believers:
            if seen is None and held.valid_until <= after:
                # The local deadline passed during the look (a loaded machine's
                # slow peek): the storage may have ended the lease after it.
                continue
            if seen is None or seen.lease != lease_id(held.token):
                self.fail(
                    "late loss",
                    f"w{held.worker} believes it holds {key} (lost=False, "
                    f"{held.valid_until - after:.1f} s left) but the storage has {seen}",
                )
                continue
            if after + seen.seconds_left < held.valid_until - SLACK:
                self.fail(
                    "late loss",
                    f"w{held.worker}'s lease of {key} ends {after + seen.seconds_left:.1f} "
                    f"by the storage, before its local deadline {held.valid_until:.1f}",
                )
        if seen is None:
            return
        token = self.by_lease.get(seen.lease)
        if token is None:
            self.fail("orphan", f"{key} is held by a lease nobody asked for: {seen}")
            return
        state = self.tokens[token]
        if state.owned:
            return
        if state.cut and state.min_hold is not None:
            held_for = (seen.expires_at - seen.acquired_at).total_seconds()
            if held_for > state.min_hold + SLACK:
                self.fail(
                    "min_hold",
                    f"{key}: a lease cut by its min_hold release ({state.min_hold:.0f} s) "
                    f"now ends {held_for:.1f} s after its acquisition ({token[-6:]})",
                    state.last_write,
                )
            return
        if after + seen.seconds_left > state.writes_until + SLACK:
            self.fail(
                "orphan",
                f"{key}: a lease nobody holds ({token[-6:]}) lasts "
                f"{seen.seconds_left:.1f} s more, beyond its bound "
                f"({state.writes_until - after:.1f} s)",
                state.last_write,
            )
