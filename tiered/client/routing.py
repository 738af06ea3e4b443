"""Several brokers as one service: the connection pool, the leader cache and the redirect and retry policy.

Each partition has one leader; any broker answers any request, for a partition led elsewhere with TANK's redirect,
0xfc + the leader's endpoint, or 0xfd when it has no leader (a takeover in progress, a broker shutting down: nothing
was stored, so asking again is safe). A request about several partitions is cut by partition (`route`): each group
of partitions is sent to the broker that should lead them (the leader cache, else the home broker), and each
partition's answer is one of three:

    final       kept (every status but these two)
    Redirect    0xfc: the partition is sent again to the leader named, which is remembered; at most HOP_LIMIT
                redirects in a row, then TankError (brokers that disagree on a leader would bounce it forever)
    NO_LEADER   0xfd: asked again of the same broker (it redirects once it knows the new leader) after a backoff
                of BACKOFF_FIRST_S, doubling up to BACKOFF_MAX_S, until `leader_wait_s` after the request began;
                then the partition's no-leader answer is final (the caller raises it as TANK's 0xfd)

Groups run concurrently: a redirected long-poll consume waits at the leader while the others' answers are kept.

A broker that cannot be reached (refused, reset, closed) before a request was written to it is forgotten, with every
cached leader pointing at it, and the request goes to another known broker (the bootstrap list and every leader ever
learned), which redirects; a redirect to a broker that failed in the same attempt counts as no leader yet (the
service has not noticed that broker is gone). When no known broker can be reached, Unreachable. A broker whose TLS
certificate does not verify (tiered.client.server_name says by which name) fails the request at once with
CertificateRefused: it is there, and would show the same certificate to every attempt. A request written
and then lost with its connection is sent again only when it is idempotent (consume, discover, status); a produce
raises ConnectionLost instead, since sending it again could store it twice.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import defaultdict
from dataclasses import dataclass
from typing import Awaitable, Callable, Generic, Hashable, NamedTuple, Sequence, TypeVar

from tiered.cancellation import cancel_requested, cancel_until_done
from tiered.client.connection import Connection, NotSent, reason
from tiered.client.errors import CertificateRefused, NotConfirmed, TankError, Unreachable
from tiered.client.server_name import check_server_name, server_name
from tiered.protocol.codes import Endpoint, ProduceStatus

HOP_LIMIT = 5
BACKOFF_FIRST_S = 0.05
# A handover moves a partition in well under a second: a backoff longer than a fifth of one would make the stall.
BACKOFF_MAX_S = 0.2

Key = Hashable  # what a request is cut by: (topic, partition)
K = TypeVar("K", bound=Key)
V = TypeVar("V")


@dataclass(frozen=True, slots=True)
class Redirect:
    """0xfc: the partition is led by `leader`."""

    leader: Endpoint


class _NoLeader:
    def __repr__(self) -> str:
        return "NO_LEADER"


NO_LEADER = _NoLeader()  # 0xfd: no leader yet


class Router:
    """Connections by endpoint (opened when first needed, kept, closed by `close`), the known brokers and the
    leader of each (topic, partition) learned from redirects."""

    def __init__(self, bootstrap: Sequence[Endpoint], *, connect_timeout_s: float, leader_wait_s: float,
                 ssl_context: ssl.SSLContext | None = None, tls_server_name: str = ""):
        if not bootstrap:
            raise ValueError("at least one broker endpoint is needed")
        if tls_server_name and ssl_context is None:
            raise ValueError("a TLS server name needs an ssl_context (TLS is off without one)")
        self.ssl_context = ssl_context  # every connection, those opened to follow a redirect too
        self.tls_server_name = check_server_name(tls_server_name) if tls_server_name else ""
        self.bootstrap_hosts = tuple(e.addr for e in bootstrap)  # whose first DNS name verifies redirects' brokers
        self.connect_timeout_s = connect_timeout_s
        self.leader_wait_s = leader_wait_s
        self.home = bootstrap[0]  # where requests go when no leader is known for them
        self.known: dict[Endpoint, None] = dict.fromkeys(bootstrap)  # in the order to try them
        self.leaders: dict[Key, Endpoint] = {}
        self._pool: dict[Endpoint, Connection] = {}
        self._opening: dict[Endpoint, asyncio.Task] = {}

    async def connection(self, endpoint: Endpoint) -> Connection:
        """The pooled connection to `endpoint`, opened when there is none alive. Raises NotSent. Returns without
        suspending when one is alive, so requests sent in turn are written in turn."""
        conn = self._pool.get(endpoint)
        if conn is not None and conn.alive:
            return conn
        task = self._opening.get(endpoint)
        if task is None:
            task = asyncio.ensure_future(self._open(endpoint))
            self._opening[endpoint] = task
            task.add_done_callback(lambda t: (self._opening.pop(endpoint, None), t.cancelled() or t.exception()))
        try:
            return await asyncio.shield(task)  # a caller cancelled does not cancel the others' open
        except asyncio.CancelledError:
            if task.cancelled() and not cancel_requested():  # the open was cancelled (`close`), not this caller
                raise NotSent(f"{endpoint}: the client closed") from None
            raise

    async def _open(self, endpoint: Endpoint) -> Connection:
        name = server_name(endpoint.addr, self.bootstrap_hosts, self.tls_server_name)
        conn = await Connection.open(endpoint, self.connect_timeout_s, self.ssl_context, name)
        stale = self._pool.get(endpoint)
        if stale is not None:
            stale.abort()
        self._pool[endpoint] = conn
        return conn

    async def connect_first(self) -> None:
        """Connects to the first reachable known broker, which becomes home. Raises Unreachable."""
        failures: dict[str, BaseException] = {}
        for endpoint in list(self.known):
            try:
                await self.connection(endpoint)
            except NotSent as exc:
                failures[str(endpoint)] = exc.__cause__ or exc
                continue
            self.home = endpoint
            return
        raise unreachable(failures)

    def target(self, key: Key) -> Endpoint:
        return self.leaders.get(key, self.home)

    def learn(self, key: Key, leader: Endpoint) -> None:
        self.leaders[key] = leader
        self.known.setdefault(leader, None)

    def unlearn(self, key: Key, endpoint: Endpoint) -> None:
        """`endpoint` answered 0xfd for `key`, or did not answer in time: it may not lead it (any more)."""
        if self.leaders.get(key) == endpoint:
            del self.leaders[key]

    def forget(self, endpoint: Endpoint) -> None:
        """`endpoint` could not be reached: its connection and every leadership it had are dropped, and it is tried
        last from now on."""
        conn = self._pool.pop(endpoint, None)
        if conn is not None:
            conn.abort()
        for key in [k for k, leader in self.leaders.items() if leader == endpoint]:
            del self.leaders[key]
        self.known.pop(endpoint, None)
        self.known[endpoint] = None
        if self.home == endpoint:
            self.home = next(iter(self.known))

    def fallback(self, failed: frozenset[Endpoint]) -> Endpoint | None:
        """Another known broker to ask: one with a live connection first, else the first not failed."""
        candidates = [e for e in self.known if e not in failed]
        live = [e for e in candidates if e in self._pool and self._pool[e].alive]
        return (live or candidates or [None])[0]

    async def close(self) -> None:
        await cancel_until_done(list(self._opening.values()))  # ended: none adds a connection to the pool after this
        pool, self._pool = self._pool, {}
        for conn in pool.values():
            await conn.close()

    async def call_any(self, send: Callable[[Connection], Awaitable[V]], *, idempotent: bool) -> V:
        """One request any broker answers (administration): to home, else to the other known brokers in turn."""
        failed: frozenset[Endpoint] = frozenset()
        failures: dict[str, BaseException] = {}
        endpoint: Endpoint | None = self.home
        while endpoint is not None:
            try:
                return await send(await self.connection(endpoint))
            except NotSent as exc:
                failures[str(endpoint)] = exc.__cause__ or exc
            except asyncio.TimeoutError:
                raise
            except (ConnectionError, OSError) as exc:
                if not idempotent:
                    raise
                failures[str(endpoint)] = exc
            self.forget(endpoint)
            failed |= {endpoint}
            endpoint = self.fallback(failed)
        raise unreachable(failures)


def unreachable(failures: dict[str, BaseException]) -> Unreachable:
    said = "; ".join(f"{where}: {reason(exc)}" for where, exc in failures.items())
    return Unreachable(f"no broker could be reached ({said})", failures)


class _Attempt(NamedTuple):
    """One partition group's way through the brokers: the endpoints redirected through (first: where it started),
    the brokers that failed meanwhile, and the next backoff."""

    path: tuple[Endpoint, ...]
    failed: frozenset[Endpoint] = frozenset()
    backoff_s: float = BACKOFF_FIRST_S

    def hop(self, leader: Endpoint) -> "_Attempt":
        return _Attempt(self.path + (leader,), self.failed, self.backoff_s)

    def lost(self, endpoint: Endpoint) -> "_Attempt":
        return _Attempt(self.path, self.failed | {endpoint}, self.backoff_s)

    def again(self, endpoint: Endpoint) -> "_Attempt":
        """A new attempt after a backoff: hops and failures start over."""
        return _Attempt((endpoint,), frozenset(), min(self.backoff_s * 2, BACKOFF_MAX_S))


Send = Callable[[Connection, list], Awaitable[dict]]
Lost = Callable[[Endpoint, list, BaseException], BaseException]


class _Routed(Generic[K, V]):
    """One routed request: what is known of each key so far."""

    def __init__(self, router: Router, send: Send, no_leader: Callable[[K], V], lost: Lost | None):
        self.router = router
        self.send = send  # (connection, keys) -> {key: final answer, Redirect or NO_LEADER} for every key
        self.no_leader = no_leader  # a key's final answer when its leader wait ends
        self.lost = lost  # not idempotent: the error for an answer lost with its connection
        self.deadline = asyncio.get_running_loop().time() + router.leader_wait_s
        self.results: dict[K, V] = {}
        self.errors: list[BaseException] = []
        self.failures: dict[Endpoint, BaseException] = {}  # why each broker could not be reached

    async def dispatch(self, endpoint: Endpoint, keys: list[K], attempt: _Attempt) -> None:
        try:
            try:
                answers = await self.send(await self.router.connection(endpoint), keys)
            except NotSent as exc:
                if isinstance(exc.__cause__, CertificateRefused):
                    raise exc.__cause__ from None  # the same broker, asked again, would show the same certificate
                await self._elsewhere(endpoint, keys, attempt, exc.__cause__ or exc)
                return
            except (asyncio.TimeoutError, NotConfirmed):
                # No answer in time (a produce's is NotConfirmed): the request may still be answered, so the broker
                # is not forgotten; but it may be a paused or cut-off leader: next time, ask who leads.
                for key in keys:
                    self.router.unlearn(key, endpoint)
                raise
            except (ConnectionError, OSError) as exc:
                if self.lost is not None:
                    self.router.forget(endpoint)
                    raise self.lost(endpoint, keys, exc) from exc
                await self._elsewhere(endpoint, keys, attempt, exc)
                return
            await self._settle(endpoint, answers, attempt)
        except Exception as exc:  # kept until every group is done, then raised
            self.errors.append(exc)

    async def settle_first(self, endpoint: Endpoint, answers: dict) -> None:
        try:
            await self._settle(endpoint, answers, _Attempt((endpoint,)))
        except Exception as exc:
            self.errors.append(exc)

    async def _elsewhere(self, endpoint: Endpoint, keys: list[K], attempt: _Attempt, exc: BaseException) -> None:
        self.router.forget(endpoint)
        self.failures[endpoint] = exc
        attempt = attempt.lost(endpoint)
        other = self.router.fallback(attempt.failed)
        if other is None:
            raise unreachable({str(e): self.failures[e] for e in attempt.failed})
        await self.dispatch(other, keys, _Attempt((other,), attempt.failed, attempt.backoff_s))

    async def _settle(self, endpoint: Endpoint, answers: dict, attempt: _Attempt) -> None:
        moves: dict[Endpoint, list[K]] = defaultdict(list)
        waiting: list[K] = []
        for key, answer in answers.items():
            if isinstance(answer, Redirect):
                leader = answer.leader
                if leader in attempt.failed:
                    waiting.append(key)  # named, but unreachable a moment ago: the service has not noticed yet
                    continue
                if len(attempt.path) > HOP_LIMIT:
                    via = " -> ".join(str(e) for e in attempt.path + (leader,))
                    raise TankError(f"{_name(key)}: still redirected after {HOP_LIMIT} hops ({via}); the brokers "
                                    "disagree on who leads it", ProduceStatus.OTHER_LEADER)
                self.router.learn(key, leader)
                moves[leader].append(key)
            elif answer is NO_LEADER:
                self.router.unlearn(key, endpoint)
                waiting.append(key)
            else:
                self.results[key] = answer
        steps = [self.dispatch(leader, keys, attempt.hop(leader)) for leader, keys in moves.items()]
        if waiting:
            steps.append(self._wait(endpoint, waiting, attempt))
        await _all(steps)

    async def _wait(self, endpoint: Endpoint, keys: list[K], attempt: _Attempt) -> None:
        loop = asyncio.get_running_loop()
        left = self.deadline - loop.time()
        if left <= 0:
            for key in keys:
                self.results[key] = self.no_leader(key)
            return
        await asyncio.sleep(min(attempt.backoff_s, left))
        groups: dict[Endpoint, list[K]] = defaultdict(list)
        for key in keys:  # a leader another request learned meanwhile, else the broker that answered
            groups[self.router.leaders.get(key, endpoint)].append(key)
        await _all([self.dispatch(e, ks, attempt.again(e)) for e, ks in groups.items()])


def _name(key: Key) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


async def route(router: Router, keys: Sequence[K], send: Send, *, no_leader: Callable[[K], V],
                lost: Lost | None = None,
                first: tuple[Endpoint, dict] | None = None) -> dict[K, V]:
    """Every key's final answer, following redirects and waiting for leaders as the module says. `lost`: for a
    request that must not be sent twice, the error to raise when its answer is lost with its connection. `first`:
    answers already received from one broker, settled before anything is sent. Raises the first error of any
    group once every group is done."""
    routed: _Routed = _Routed(router, send, no_leader, lost)
    steps = []
    if first is not None:
        steps.append(routed.settle_first(*first))
    groups: dict[Endpoint, list[K]] = defaultdict(list)
    for key in keys:
        groups[router.target(key)].append(key)
    steps += [routed.dispatch(e, ks, _Attempt((e,))) for e, ks in groups.items()]
    await _all(steps)
    if routed.errors:  # a produce whose outcome is unknown says so first
        raise next((e for e in routed.errors if isinstance(e, NotConfirmed)), routed.errors[0])
    return routed.results


async def _all(steps: list[Awaitable[None]]) -> None:
    """Runs the steps concurrently; one is awaited as it is (no task to create: the common case, one broker)."""
    if len(steps) == 1:
        await steps[0]
    elif steps:
        await asyncio.gather(*steps)
