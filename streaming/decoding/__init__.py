"""Decoding Kafka values: Confluent's Avro wire format and the schemas it names.

`avro`: the decoder and the hook in front of the sink; `avro_types`: Avro schemas
as Spark types; `schema_registry`: the writer and reader schemas, by id and subject.
"""

from sinks.errors import SchemaNotFoundError
from streaming.decoding.avro import ConfluentAvroDecoder, DecodingHook
from streaming.decoding.avro_types import avro_to_spark
from streaming.decoding.schema_registry import SchemaStore

__all__ = [
    "ConfluentAvroDecoder",
    "DecodingHook",
    "SchemaNotFoundError",
    "SchemaStore",
    "avro_to_spark",
]
