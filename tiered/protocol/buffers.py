"""The bytes a decoder reads: a frame payload as received, a slice of a segment file or an object, or a view of one
(no copy). Decoders only index, slice and measure it, so all three serve alike."""

BytesLike = bytes | bytearray | memoryview
