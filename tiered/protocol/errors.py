"""The one exception every decoder raises on bad bytes."""


class ProtocolError(ValueError):
    """Bytes that do not follow docs/protocol.md. The message names what was being read and where."""

    def __init__(self, what: str, position: int | None = None):
        self.what = what
        self.position = position
        super().__init__(what if position is None else f"{what} (at byte {position})")
