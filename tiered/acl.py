"""Who may do what on the TANK listener: the access rules file (`--acl FILE`, docs/operations.md "Access rules").

The decision is `allowed(rules, principal, op, topic)`, a pure function; reading the file (`RulesFile`) and refusing
requests (`tiered.server.access`) happen at the edges.

- The **principal** of a connection is the common name (CN) of its client certificate's subject; a certificate
  without one is named by its first DNS subjectAltName, else its first URI subjectAltName (a SPIFFE id). A
  connection without a verified client certificate (a plaintext listener, or TLS without `--tls-client-ca`) is
  `anonymous`.
- The file holds only allow rules: what no rule allows is refused. Without a file everything is allowed (TANK's
  behaviour). A rule's principal `*` is any principal with a certificate, never `anonymous`, which a rule must name.
- A topic pattern is a name (`orders`), a prefix ending in `*` (`orders-*`), or `*` (every topic).

The file is TOML:

    [[rule]]
    principals = ["billing", "billing-replay"]
    operations = ["produce", "consume"]      # produce, consume, create, reload, or "*"
    topics = ["billing-*", "audit"]
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

ANONYMOUS = "anonymous"  # the principal of a connection without a verified client certificate
ANY = "*"
RELOAD_INTERVAL_S = 5.0  # the rules file's mtime is looked at at most this often


class Op(str, Enum):
    PRODUCE = "produce"
    CONSUME = "consume"
    CREATE = "create"  # CreateTopic
    RELOAD = "reload"  # ReloadConf


class RulesError(ValueError):
    """A rules file that cannot be used, in one line naming the file and what is wrong."""


@dataclass(frozen=True, slots=True)
class Rule:
    principals: frozenset[str]  # names, or "*" for any principal with a certificate
    operations: frozenset[Op]
    topics: tuple[str, ...]  # names, prefixes ending in "*", or "*"

    def matches(self, principal: str, op: Op, topic: str) -> bool:
        if op not in self.operations:
            return False
        if principal not in self.principals and not (ANY in self.principals and principal != ANONYMOUS):
            return False
        return any(topic == p or p.endswith(ANY) and topic.startswith(p[:-1]) for p in self.topics)


@dataclass(frozen=True, slots=True)
class Rules:
    rules: tuple[Rule, ...]


def allowed(rules: Rules | None, principal: str, op: Op, topic: str) -> bool:
    """None (no rules file): everything is allowed. Otherwise only what a rule allows."""
    if rules is None:
        return True
    return any(rule.matches(principal, op, topic) for rule in rules.rules)


def principal_of(peercert: Mapping[str, Any] | None) -> str:
    """The principal of a verified client certificate as `ssl.SSLObject.getpeercert()` gives it (an empty dict or None
    when the client sent none): its subject's CN, else its first DNS subjectAltName, else its first URI one."""
    if not peercert:
        return ANONYMOUS
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value:
                return str(value)
    names = peercert.get("subjectAltName", ())
    for kind in ("DNS", "URI"):
        for key, value in names:
            if key == kind and value:
                return str(value)
    return ANONYMOUS


_RULE_KEYS = ("principals", "operations", "topics")


def parse_rules(text: str, source: str) -> Rules:
    """The rules a file's text holds; raises RulesError (one line, naming `source`) for anything else."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RulesError(f"access rules {source}: not TOML: {exc}") from None
    unknown = sorted(set(document) - {"rule"})
    if unknown:
        raise RulesError(f"access rules {source}: unknown key {unknown[0]!r} (want [[rule]] tables)")
    tables = document.get("rule", [])
    if not isinstance(tables, list):
        raise RulesError(f"access rules {source}: 'rule' must be [[rule]] tables")
    return Rules(tuple(_rule(table, f"access rules {source}: rule {n}") for n, table in enumerate(tables, 1)))


def _rule(table: Any, where: str) -> Rule:
    if not isinstance(table, dict):
        raise RulesError(f"{where}: not a table")
    extra = sorted(set(table) - set(_RULE_KEYS))
    if extra:
        raise RulesError(f"{where}: unknown key {extra[0]!r} (a rule has {', '.join(_RULE_KEYS)})")
    values = {}
    for key in _RULE_KEYS:
        got = table.get(key)
        if not isinstance(got, list) or not got or not all(isinstance(v, str) and v.strip() for v in got):
            raise RulesError(f"{where}: {key} must be a non-empty list of strings")
        values[key] = [v.strip() for v in got]
    ops: set[Op] = set()
    for name in values["operations"]:
        if name == ANY:
            ops.update(Op)
        elif name.lower() in Op._value2member_map_:
            ops.add(Op(name.lower()))
        else:
            raise RulesError(f"{where}: unknown operation {name!r} (want {', '.join(o.value for o in Op)} or *)")
    for pattern in values["topics"]:
        if ANY in pattern[:-1]:
            raise RulesError(f"{where}: topic pattern {pattern!r}: '*' may only end a pattern")
    for name in values["principals"]:
        if ANY in name and name != ANY:
            raise RulesError(f"{where}: principal {name!r}: '*' stands alone (any principal with a certificate)")
    return Rule(frozenset(values["principals"]), frozenset(ops), tuple(values["topics"]))


def load_rules(path: str) -> Rules:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise RulesError(f"access rules: no such file {path!r}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesError(f"access rules {path}: cannot be read: {exc}") from None
    return parse_rules(text, path)


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


class RulesFile:
    """The one owner of the rules in force. `check` (called with the broker's clock) loads the file again when its
    mtime changed, at most every `interval_s`; a file that does not load keeps the rules in force (the caller logs
    the returned error once per change)."""

    def __init__(self, path: str, now: float, interval_s: float = RELOAD_INTERVAL_S):
        self.path = path
        self.interval_s = interval_s
        self._seen = _mtime(path)
        self.rules = load_rules(path)  # raises RulesError: a broker does not start with a bad file
        self._checked_at = now

    def check(self, now: float) -> tuple[bool, RulesError | None]:
        """(reloaded, error): whether new rules are in force, and why a changed file was not taken."""
        if now - self._checked_at < self.interval_s:
            return False, None
        self._checked_at = now
        seen = _mtime(self.path)
        if seen == self._seen:
            return False, None
        self._seen = seen  # a bad file is reported once, not on every check, until it changes again
        try:
            self.rules = load_rules(self.path)
        except RulesError as exc:
            return False, exc
        return True, None
