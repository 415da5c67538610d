"""Thrift's compact protocol, generic: what Parquet's footers, page indexes and bloom filter
headers are written in (`sinks.log.key_filter` reads a filter's header, `sinks.reading.
parquet_pages` rewrites a footer). A struct reads as a `Struct`; unknown fields are kept and
written back as read."""

from __future__ import annotations

from typing import Any

# Thrift compact protocol types.
TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)

Struct = dict[int, tuple[int, Any]]  # field id -> (thrift type, value)


def field(struct: Struct, field_id: int) -> Any:
    """The value of ``struct``'s field ``field_id``; raises `KeyError` when it is absent."""
    return struct[field_id][1]


def optional(struct: Struct, field_id: int, default: Any = None) -> Any:
    """The value of ``struct``'s field ``field_id``, or ``default`` when it is absent."""
    entry = struct.get(field_id)
    return default if entry is None else entry[1]


def elements(struct: Struct, field_id: int) -> list[Any]:
    """The elements of ``struct``'s list (or set) field ``field_id``; raises `KeyError`
    when it is absent."""
    return struct[field_id][1][1]


class Reader:
    """Thrift's compact protocol, generic: a struct is a `Struct`, a list or set
    (element type, [values]), a map (key type, value type, [(key, value)]), a binary
    bytes, a double its 8 bytes; unknown fields are kept and written back as read."""

    def __init__(self, data: bytes | memoryview, pos: int = 0) -> None:
        self.data, self.pos = bytes(data), pos

    def byte(self) -> int:
        try:
            b = self.data[self.pos]
        except IndexError:
            raise ValueError("truncated thrift data") from None
        self.pos += 1
        return b

    def varint(self) -> int:
        data, pos = self.data, self.pos
        shift = result = 0
        try:
            while True:
                b = data[pos]
                pos += 1
                result |= (b & 0x7F) << shift
                if b < 0x80:
                    self.pos = pos
                    return result
                shift += 7
                if shift > 70:
                    raise ValueError("varint too long")
        except IndexError:
            raise ValueError("truncated thrift data") from None

    def zigzag(self) -> int:
        z = self.varint()
        return (z >> 1) ^ -(z & 1)

    def value(self, kind: int) -> Any:
        if kind in (TRUE, FALSE):
            return self.byte()  # a bool inside a list: one byte, kept as read
        if kind == BYTE:
            return self.byte()
        if kind in (I16, I32, I64):
            return self.zigzag()
        if kind == DOUBLE:
            self.pos += 8
            return bytes(self.data[self.pos - 8 : self.pos])
        if kind == BINARY:
            size = self.varint()
            self.pos += size
            if self.pos > len(self.data):
                raise ValueError("truncated thrift binary")
            return bytes(self.data[self.pos - size : self.pos])
        if kind in (LIST, SET):
            head = self.byte()
            size = head >> 4 if head >> 4 != 15 else self.varint()
            element = head & 0x0F
            return (element, [self.value(element) for _ in range(size)])
        if kind == MAP:
            size = self.varint()
            if size == 0:
                return (0, 0, [])
            types = self.byte()
            k, v = types >> 4, types & 0x0F
            return (k, v, [(self.value(k), self.value(v)) for _ in range(size)])
        if kind == STRUCT:
            return self.struct()
        raise ValueError(f"unknown thrift type {kind}")

    def struct(self) -> Struct:
        fields: Struct = {}
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            delta, kind = head >> 4, head & 0x0F
            field_id = last + delta if delta else self.zigzag()
            if kind in (TRUE, FALSE):
                fields[field_id] = (TRUE, kind == TRUE)
            else:
                fields[field_id] = (kind, self.value(kind))
            last = field_id


def _varint(out: bytearray, n: int) -> None:
    while True:
        if n < 0x80:
            out.append(n)
            return
        out.append((n & 0x7F) | 0x80)
        n >>= 7


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) ^ (n >> 63) if n < 0 else n << 1)


def _write_value(out: bytearray, kind: int, value: Any) -> None:
    if kind in (TRUE, FALSE, BYTE):
        out.append(value & 0xFF)
    elif kind in (I16, I32, I64):
        _zigzag(out, value)
    elif kind == DOUBLE:
        out += value
    elif kind == BINARY:
        _varint(out, len(value))
        out += value
    elif kind in (LIST, SET):
        element, items = value
        if len(items) < 15:
            out.append((len(items) << 4) | element)
        else:
            out.append(0xF0 | element)
            _varint(out, len(items))
        for item in items:
            _write_value(out, element, item)
    elif kind == MAP:
        k, v, pairs = value
        _varint(out, len(pairs))
        if pairs:
            out.append((k << 4) | v)
            for key, item in pairs:
                _write_value(out, k, key)
                _write_value(out, v, item)
    elif kind == STRUCT:
        write_struct(out, value)
    else:
        raise ValueError(f"unknown thrift type {kind}")


def write_struct(out: bytearray, fields: Struct) -> None:
    """Append ``fields`` to ``out`` in Thrift's compact protocol, by ascending field id."""
    last = 0
    for field_id in sorted(fields):
        kind, value = fields[field_id]
        if kind in (TRUE, FALSE):
            kind = TRUE if value else FALSE
        delta = field_id - last
        if 0 < delta <= 15:
            out.append((delta << 4) | kind)
        else:
            out.append(kind)
            _zigzag(out, field_id)
        if kind not in (TRUE, FALSE):
            _write_value(out, kind, value)
        last = field_id
    out.append(0)


def read_struct(data: bytes | memoryview) -> Struct:
    """The Thrift compact struct at the start of ``data``. Raises `ValueError`."""
    return Reader(data).struct()
