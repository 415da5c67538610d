"""Avro schemas by Confluent schema id and subject: the Schema Registry, as a client sees it.

`SchemaStore` answers the two questions a Confluent deserializer asks: the writer
schema of an id (``GET /schemas/ids/<id>``) and a subject's newest schema
(``GET /subjects/<s>/versions/latest``). It looks in local schemas first (a
directory of ``<id>.avsc`` files, a JSON file, or schemas passed in), then in a
registry over HTTP, and caches what it finds. Ids only grow, as in a registry.
Lookups happen on the driver only; `streaming.decoding.avro` ships the schemas to the executors.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sinks.errors import SchemaNotFoundError


class SchemaStore:
    """Writer schemas by Confluent schema id: local ones first, then a registry, cached.

    ``directory`` holds ``<id>.avsc`` (or ``<id>.json``) files; ``file`` is one JSON
    object mapping ids to schemas; ``registry_url`` is a Confluent-compatible
    schema registry (``GET /schemas/ids/<id>``, ``GET /subjects/<s>/versions/latest``).
    ``subjects`` maps a subject to its schema ids, oldest version first (what
    `register` records). Lookups happen on the driver only.
    """

    def __init__(
        self,
        schemas: Mapping[int, Any] | None = None,
        *,
        subjects: Mapping[str, Sequence[int]] | None = None,
        registry_url: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._schemas = {int(k): as_schema(v) for k, v in (schemas or {}).items()}
        self._subjects = {name: [int(i) for i in ids] for name, ids in (subjects or {}).items()}
        for name, ids in self._subjects.items():
            missing = [i for i in ids if i not in self._schemas]
            if missing:
                raise SchemaNotFoundError(
                    f"subject {name!r} lists schema ids {missing} that the store does not hold; "
                    "pass their schemas too"
                )
        self.registry_url = registry_url.rstrip("/") if registry_url else None
        self.timeout_s = timeout_s

    @classmethod
    def from_path(cls, path: str | Path, *, registry_url: str | None = None) -> SchemaStore:
        """Schemas from a directory of ``<id>.avsc`` files, or a JSON file of ``{id: schema}``."""
        source = Path(path)
        if source.is_dir():
            schemas = {}
            for file in sorted(source.iterdir()):
                if file.suffix in (".avsc", ".json") and file.stem.isdigit():
                    schemas[int(file.stem)] = json.loads(file.read_text())
            return cls(schemas, registry_url=registry_url)
        if source.is_file():
            return cls(json.loads(source.read_text()), registry_url=registry_url)
        raise SchemaNotFoundError(f"no schema directory or file at {path}")

    @property
    def ids(self) -> list[int]:
        return sorted(self._schemas)

    def get(self, schema_id: int) -> dict | None:
        """The writer schema with this id; None when neither files nor registry know it."""
        if schema_id not in self._schemas and self.registry_url:
            found = self._fetch(f"/schemas/ids/{schema_id}", missing_ok=True)
            if found is not None:
                self._schemas[schema_id] = as_schema(found["schema"])
        return self._schemas.get(schema_id)

    def register(self, subject: str, schema: Any) -> int:
        """The id of ``schema`` as the subject's newest version, as a registry's POST answers.

        Idempotent: a schema the store already holds keeps its id (and is not a new
        version when it is already the subject's newest). Local only, never the registry.
        """
        schema = as_schema(schema)
        schema_id = next((i for i, s in self._schemas.items() if s == schema), None)
        if schema_id is None:
            schema_id = max(self._schemas, default=0) + 1
            self._schemas[schema_id] = schema
        versions = self._subjects.setdefault(subject, [])
        if not versions or versions[-1] != schema_id:
            versions.append(schema_id)
        return schema_id

    def latest(self, subject: str | None = None) -> dict:
        """A reader schema: the newest of the subject (see `latest_id`)."""
        return self._schemas[self.latest_id(subject)]

    def latest_id(self, subject: str | None = None) -> int:
        """The id of the subject's newest schema: local versions, else the registry's latest.

        Without a subject, the highest id the store knows (ids only grow in a registry,
        and the writer ids of the batches seen so far are known): right when the store
        holds one subject's schemas, so give ``subject`` when it holds several.
        Asked again for every batch, so a version registered meanwhile is found.
        """
        if subject is not None:
            local = self._subjects.get(subject)
            if self.registry_url:
                found = self._fetch(f"/subjects/{subject}/versions/latest", missing_ok=bool(local))
                if found is not None:
                    self._schemas[int(found["id"])] = as_schema(found["schema"])
                    return int(found["id"])
            if not local:
                raise SchemaNotFoundError(
                    f"subject {subject!r} is not in the store and there is no registry_url; "
                    f"register it or give a registry_url (local subjects: {sorted(self._subjects)})"
                )
            return local[-1]
        if not self._schemas:
            raise SchemaNotFoundError(
                "no schema to read with: the store holds none yet; give a subject, "
                "a reader_schema, or local schema files"
            )
        return max(self._schemas)

    def _fetch(self, path: str, *, missing_ok: bool = False) -> dict | None:
        request = urllib.request.Request(
            f"{self.registry_url}{path}",
            headers={"Accept": "application/vnd.schemaregistry.v1+json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404 and missing_ok:
                return None
            raise SchemaNotFoundError(f"schema registry {self.registry_url}{path}: {e}") from e
        except OSError as e:
            raise SchemaNotFoundError(f"schema registry {self.registry_url}{path}: {e}") from e


def as_schema(value: Any) -> Any:
    """A schema given as JSON text or as parsed JSON, parsed."""
    return json.loads(value) if isinstance(value, str) else value
