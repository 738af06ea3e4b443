"""`tiered topic config`'s edit of a configuration text: what it sets, removes and refuses."""

from __future__ import annotations

import pytest

from tiered.cli.common import UsageError
from tiered.cli.topic import changed_config
from tiered.storage.topic_config import ConfigError


def test_options_set_and_replace_keys_in_their_first_order():
    text = "produce.ack=durable\nlog.segment.bytes=1m\n"
    assert changed_config(text, ["log.segment.bytes=2m,remote.copy=false"], []) == (
        "produce.ack=durable\nlog.segment.bytes=2m\nremote.copy=false\n")


def test_unset_removes_a_key_and_keys_are_case_insensitive():
    assert changed_config("Produce.Ack=local\nlog.retention.secs=60\n", [], ["PRODUCE.ACK"]) == "log.retention.secs=60\n"
    assert changed_config("produce.ack=local\n", [], ["produce.ack"]) == ""


def test_comments_and_blank_lines_of_the_old_text_are_not_kept():
    assert changed_config("# made by hand\n\nproduce.ack=local  # fast\n", ["remote.copy=true"], []) == (
        "produce.ack=local\nremote.copy=true\n")


@pytest.mark.parametrize("options, unset, error, match", [
    (["log.retention.secs=soon"], [], ConfigError, "invalid value 'soon'"),
    (["no.such.key=1"], [], ConfigError, "unknown topic config key 'no.such.key'"),
    (["produce.ack"], [], UsageError, "want KEY=VALUE"),
    ([], ["log.segment.bytes"], UsageError, "does not set it"),
])
def test_what_the_broker_would_refuse_is_refused_with_the_reason(options, unset, error, match):
    with pytest.raises(error, match=match):
        changed_config("produce.ack=durable\n", options, unset)
