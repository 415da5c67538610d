"""Binary keys and values on a command line: text in, text out, never a Python repr.

Every log fed by Kafka or the ``files`` source keys its records by bytes (Spark's Kafka
source gives ``key`` and ``value`` as BINARY). A shell has only text, so:

- **in** (`key_bytes`): a KEY argument for a binary key column is encoded as
  ``--key-encoding`` says: ``utf8`` (the default: ``user-24`` is the bytes
  ``b"user-24"``, as Kafka's console producer sends a key typed at it), ``hex``
  (``75736572``) or ``base64`` (``dXNlcg==``);
- **out** (`as_text`, `jsonable`): a binary value is written as its text when its bytes
  are valid UTF-8, else as base64. Text output marks base64 with a ``base64:`` prefix;
  JSON output names how each binary value of a record was written in the record's
  ``_encoding`` object (column path -> ``"utf8"`` or ``"base64"``), so a reader never
  guesses whether ``"dXNlcg=="`` is text or bytes.

Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from typing import Any, Literal

KeyEncoding = Literal["utf8", "hex", "base64"]
KEY_ENCODINGS: tuple[KeyEncoding, ...] = ("utf8", "hex", "base64")
ENCODING_FIELD = "_encoding"
"""The JSON field that names how each binary value of a record was written."""
BASE64_PREFIX = "base64:"


def key_bytes(text: str, encoding: KeyEncoding) -> bytes:
    """The bytes of a key typed as ``text`` in ``encoding``; `ValueError` naming both when
    ``text`` is not valid ``hex`` or ``base64``."""
    if encoding == "utf8":
        return text.encode("utf-8")
    try:
        if encoding == "hex":
            return bytes.fromhex(text)
        return base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error) as e:
        raise ValueError(f"key {text!r} is not valid {encoding} (--key-encoding): {e}") from None


def decoded(data: bytes) -> tuple[str, Literal["utf8", "base64"]]:
    """``data`` as text: its UTF-8 decoding when valid, else its base64; and which."""
    try:
        return data.decode("utf-8"), "utf8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def as_text(value: Any) -> str:
    """A value for a text line: text as it is, bytes as UTF-8 text (else ``base64:...``),
    anything else as JSON (bytes inside it as `jsonable` writes them)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        text, encoding = decoded(value)
        return text if encoding == "utf8" else BASE64_PREFIX + text
    return json.dumps(jsonable(value, "", {}), default=str, ensure_ascii=False)


def jsonable(value: Any, path: str, encodings: dict[str, str]) -> Any:
    """``value`` with every bytes value inside it as text (`decoded`), recording in
    ``encodings`` the path of each (``value``, ``value.name``, ``headers[0].value``) and
    how it was written; other values as they are (JSON's ``default=str`` prints the rest)."""
    if isinstance(value, bytes):
        text, encoding = decoded(value)
        encodings[path] = encoding
        return text
    if isinstance(value, dict):
        return {
            k: jsonable(v, f"{path}.{k}" if path else str(k), encodings) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [jsonable(v, f"{path}[{i}]", encodings) for i, v in enumerate(value)]
    if isinstance(value, dt.datetime | dt.date):
        return str(value)
    return value


def json_record(row: dict[str, Any]) -> str:
    """One record as a JSON line: binary values as text (`jsonable`), with an
    ``_encoding`` object when the record holds any."""
    encodings: dict[str, str] = {}
    record = jsonable(row, "", encodings)
    if encodings:
        record[ENCODING_FIELD] = encodings
    return json.dumps(record, default=str, ensure_ascii=False)
