"""Bytes written the way docs/protocol.md writes them: hex groups and 'quoted' ASCII, separated by spaces or `|`."""

import re

_TOKEN = re.compile(r"'([^']*)'|\"([^\"]*)\"|([0-9a-fA-F]+)|([\s|]+)")


def h(text: str) -> bytes:
    out = bytearray()
    position = 0
    while position < len(text):
        m = _TOKEN.match(text, position)
        if m is None:
            raise ValueError(f"cannot read {text[position:]!r}")
        single, double, hexdigits, _ = m.groups()
        if single is not None or double is not None:
            out += (single if single is not None else double).encode("ascii")
        elif hexdigits is not None:
            out += bytes.fromhex(hexdigits)
        position = m.end()
    return bytes(out)
