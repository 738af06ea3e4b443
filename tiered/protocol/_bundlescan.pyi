"""What the native module built from _bundlescan.c exports, for the type checker (a compiled module has no
annotations of its own). Every function takes positional arguments only (METH_FASTCALL, METH_O). The result types are the
NamedTuple classes given to `register`, which bundle.py and requests.py call once, at import."""

from typing import overload

from typing_extensions import Buffer

from tiered.protocol.bundle import BundleFacts, Message
from tiered.protocol.errors import ProtocolError
from tiered.protocol.requests import ProducePartition, ProduceRequest, ProduceTopic

def scan_bundle(bundle: Buffer, strict: bool = True, /) -> BundleFacts:
    """bundle.py's `_validate_bundle_py`, natively: the facts of one bundle validated completely, or ProtocolError.
    RuntimeError until BundleFacts is registered."""

def scan_produce(payload: Buffer, with_seqnum: bool, /) -> tuple[ProduceRequest, list[BundleFacts]] | None:
    """requests.py's read_checked_produce, natively: the request and the facts of each bundle in request order;
    None when the framing does not parse (the reference reader then names the fault), ProtocolError for a bad
    bundle. RuntimeError until the four classes are registered."""

def read_chunk(chunk: Buffer, base_seq: int | None, requested_seq: int, hwmark: int, /,
               ) -> tuple[list[Message], int, int] | None:
    """chunk.py's `_read_chunk_py`, natively: (messages, first_seq, need_bytes), the same messages and the same
    ProtocolError; None when a seq or an argument passes 64 bits (the reference reads that chunk). RuntimeError
    until Message is registered."""

def scan_chunk(chunk: Buffer, base_seq: int | None, requested_seq: int, hwmark: int, /,
               ) -> tuple[int, int, int, int, int, int, bool] | None:
    """read_chunk without the messages: (first_seq, need_bytes, messages, first, last, value_bytes, ascending) of
    the messages read_chunk would return, each read and checked as read_chunk reads it; None as read_chunk."""

def register_message(message: type[Message], /) -> None: ...

def receive_buffer(size: int, /) -> bytearray:
    """A bytearray of `size` bytes whose contents are not set: every byte must be written before any is read."""

@overload
def register(facts: type[BundleFacts], /) -> None: ...
@overload
def register(facts: type[BundleFacts], request: type[ProduceRequest], topic: type[ProduceTopic],
             partition: type[ProducePartition], /) -> None: ...

def cut_payloads(buf: Buffer, start: int, end: int, big_bytes: int, /,
                 ) -> tuple[list[tuple[int, bytes]], int, int, tuple[int, int] | None, ProtocolError | None]:
    """frame.py's `_cut_payloads_py`, natively: (frames, rest, payload_bytes, big, error) of buf[start:end], each
    frame's payload copied out as bytes; ValueError for positions outside the buffer."""

def produce_codes_frame(request_id: int, codes: Buffer, /) -> bytes | None:
    """responses.py's `_produce_codes_frame_py`, natively: the whole frame of a one-topic produce answer whose codes
    are all plain, or None."""
