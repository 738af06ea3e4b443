"""The bytes a decoder reads: a frame payload as received, a slice of a segment file or an object, or a view of one
(no copy). Decoders only index, slice and measure it, so all three serve alike.

`receive_buffer(size)`: a bytearray for bytes about to be received, every byte of which is written before any is
read; natively its contents are left unset (bytearray(size) zeroes them: a pass over every byte of a big frame),
else it is a zeroed bytearray."""

from collections.abc import Callable

BytesLike = bytes | bytearray | memoryview

receive_buffer: Callable[[int], bytearray]
try:
    from tiered.protocol._bundlescan import receive_buffer
except ImportError:  # the extension is optional
    receive_buffer = bytearray
