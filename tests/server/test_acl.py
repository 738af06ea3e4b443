"""The access rules as a pure decision (tiered.acl.allowed), the rules file's format and its errors, the principal of
a certificate, and which refusals are logged (tiered.server.access.RefusalLog). The broker's side is
tests/server/test_access.py."""

from __future__ import annotations

import pytest

from tiered.acl import ANONYMOUS, Op, RulesError, RulesFile, allowed, parse_rules, principal_of
from tiered.server.access import RefusalLog

RULES = parse_rules('''
[[rule]]
principals = ["billing"]
operations = ["produce", "consume"]
topics = ["billing-*", "audit"]

[[rule]]
principals = ["*"]
operations = ["consume"]
topics = ["public-*"]

[[rule]]
principals = ["anonymous"]
operations = ["consume"]
topics = ["local"]

[[rule]]
principals = ["admin"]
operations = ["*"]
topics = ["*"]

[[rule]]
principals = ["ops"]
operations = ["create", "reload"]
topics = ["ops-*"]
''', "test")


@pytest.mark.parametrize("principal, op, topic, expected", [
    # a name and a prefix
    ("billing", Op.PRODUCE, "billing-eu", True),
    ("billing", Op.CONSUME, "billing-", True),  # the prefix alone is a name it covers
    ("billing", Op.PRODUCE, "audit", True),
    ("billing", Op.PRODUCE, "audit-2", False),  # an exact name is not a prefix
    ("billing", Op.PRODUCE, "billin", False),
    ("billing", Op.CREATE, "billing-eu", False),  # not an operation it was given
    ("billing", Op.RELOAD, "billing-eu", False),
    ("billing2", Op.PRODUCE, "billing-eu", False),  # principals match whole
    # the wildcard principal: any certificate, never anonymous
    ("billing", Op.CONSUME, "public-news", True),
    ("somebody", Op.CONSUME, "public-news", True),
    ("somebody", Op.PRODUCE, "public-news", False),
    (ANONYMOUS, Op.CONSUME, "public-news", False),
    # anonymous, named
    (ANONYMOUS, Op.CONSUME, "local", True),
    (ANONYMOUS, Op.PRODUCE, "local", False),
    # every operation on every topic
    ("admin", Op.CREATE, "anything", True),
    ("admin", Op.RELOAD, "x", True),
    ("admin", Op.PRODUCE, "billing-eu", True),
    # create and reload per prefix
    ("ops", Op.CREATE, "ops-new", True),
    ("ops", Op.RELOAD, "ops-new", True),
    ("ops", Op.CREATE, "billing-x", False),
    ("ops", Op.CONSUME, "ops-new", False),
])
def test_allowed(principal, op, topic, expected):
    assert allowed(RULES, principal, op, topic) is expected


def test_no_rules_allow_everything_and_empty_rules_nothing():
    for op in Op:
        assert allowed(None, ANONYMOUS, op, "t")
        assert not allowed(parse_rules("", "empty"), "admin", op, "t")


def test_operations_are_case_insensitive_and_names_trimmed():
    rules = parse_rules('[[rule]]\nprincipals = [" a "]\noperations = ["Produce"]\ntopics = ["t"]\n', "f")
    assert allowed(rules, "a", Op.PRODUCE, "t")


@pytest.mark.parametrize("text, says", [
    ("[[rule]\n", "not TOML"),
    ("allow = 1\n", "unknown key 'allow'"),
    ("rule = 1\n", "'rule' must be [[rule]] tables"),
    ('[[rule]]\nprincipals = ["a"]\noperations = ["produce"]\n', "rule 1: topics must be a non-empty list"),
    ('[[rule]]\nprincipals = []\noperations = ["produce"]\ntopics = ["t"]\n', "principals must be a non-empty list"),
    ('[[rule]]\nprincipals = "a"\noperations = ["produce"]\ntopics = ["t"]\n', "principals must be a non-empty list"),
    ('[[rule]]\nprincipals = ["a"]\noperations = ["write"]\ntopics = ["t"]\n', "unknown operation 'write'"),
    ('[[rule]]\nprincipals = ["a"]\noperations = ["produce"]\ntopics = ["a*b"]\n', "'*' may only end a pattern"),
    ('[[rule]]\nprincipals = ["bill*"]\noperations = ["produce"]\ntopics = ["t"]\n', "'*' stands alone"),
    ('[[rule]]\nprincipals = ["a"]\noperations = ["produce"]\ntopics = ["t"]\nuser = "x"\n', "unknown key 'user'"),
    ('[[rule]]\nprincipals = ["a"]\noperations = ["produce"]\ntopics = ["t"]\n[[rule]]\nprincipals = ["b"]\n',
     "rule 2: operations must be"),
])
def test_a_malformed_file_is_one_line_naming_the_file(text, says):
    with pytest.raises(RulesError) as bad:
        parse_rules(text, "/etc/tiered/acl.toml")
    message = str(bad.value)
    assert says in message and "/etc/tiered/acl.toml" in message and "\n" not in message


CERT = {"subject": ((("organizationName", "acme"),), (("commonName", "billing"),)),
        "subjectAltName": (("DNS", "billing.svc"), ("URI", "spiffe://acme/billing"))}


@pytest.mark.parametrize("peercert, principal", [
    (None, ANONYMOUS),  # plaintext
    ({}, ANONYMOUS),  # TLS without a client certificate asked for
    (CERT, "billing"),  # the CN wins over the SANs
    ({**CERT, "subject": ((("organizationName", "acme"),),)}, "billing.svc"),  # no CN: the first DNS SAN
    ({"subject": (), "subjectAltName": (("IP Address", "10.0.0.1"), ("URI", "spiffe://acme/x"))}, "spiffe://acme/x"),
    ({"subject": (), "subjectAltName": (("IP Address", "10.0.0.1"),)}, ANONYMOUS),
])
def test_principal_of_a_certificate(peercert, principal):
    assert principal_of(peercert) == principal


def test_the_rules_file_reloads_when_it_changes_and_keeps_its_rules_when_the_new_file_is_bad(tmp_path):
    import os

    path = tmp_path / "acl.toml"
    path.write_text('[[rule]]\nprincipals = ["a"]\noperations = ["produce"]\ntopics = ["t"]\n')
    rules = RulesFile(str(path), now=100.0, interval_s=5.0)
    assert allowed(rules.rules, "a", Op.PRODUCE, "t")
    assert rules.check(105.0) == (False, None)  # unchanged
    path.write_text('[[rule]]\nprincipals = ["b"]\noperations = ["produce"]\ntopics = ["t"]\n')
    os.utime(path, ns=(1, 1))
    assert rules.check(107.0) == (False, None)  # too soon after the last look
    assert rules.check(110.0) == (True, None)
    assert allowed(rules.rules, "b", Op.PRODUCE, "t") and not allowed(rules.rules, "a", Op.PRODUCE, "t")
    path.write_text("not = [toml\n")
    os.utime(path, ns=(2, 2))
    reloaded, error = rules.check(115.0)
    assert not reloaded and "not TOML" in str(error)
    assert allowed(rules.rules, "b", Op.PRODUCE, "t")  # kept
    assert rules.check(120.0) == (False, None)  # reported once per change
    path.unlink()
    reloaded, error = rules.check(125.0)
    assert not reloaded and "no such file" in str(error) and allowed(rules.rules, "b", Op.PRODUCE, "t")


def test_a_missing_rules_file_does_not_start():
    with pytest.raises(RulesError, match="no such file"):
        RulesFile("/nonexistent/acl.toml", now=0.0)


def test_refusals_are_logged_once_per_key_and_at_most_n_lines_per_window():
    refusals = RefusalLog(window_s=10.0, max_lines=3)
    key = ("p", "produce", "t")
    assert refusals.note(key, 0.0) == (True, 0)
    assert refusals.note(key, 1.0) == (False, 0)  # the same refusal in a loop
    assert refusals.note(("p", "produce", "u"), 2.0) == (True, 0)
    assert refusals.note(("p", "consume", "u"), 3.0) == (True, 0)
    assert refusals.note(("q", "consume", "u"), 4.0) == (False, 0)  # past the lines of this window
    assert refusals.note(key, 10.0) == (True, 2)  # a new window: said again, with what was left out
    assert refusals.note(key, 11.0) == (False, 0)
    assert refusals.note(key, 25.0) == (True, 1)
