"""Parquet's Thrift field ids by name: the structs of a file's footer, offset index and
bloom filter header that `sinks.reading.parquet_pages` and `sinks.log.key_filter` read
and write through `sinks.log.thrift_compact`.

The ids are those of ``src/main/thrift/parquet.thrift`` in apache/parquet-format, where a
field, once numbered, keeps its number; each class is one struct, each constant one of its
fields, under the field's own name in capitals.
"""

from __future__ import annotations


class FileMetaData:
    """The footer."""

    VERSION = 1
    SCHEMA = 2  # list<SchemaElement>, depth first, the root first
    NUM_ROWS = 3
    ROW_GROUPS = 4  # list<RowGroup>
    KEY_VALUE_METADATA = 5
    CREATED_BY = 6
    COLUMN_ORDERS = 7  # list<ColumnOrder>, one per leaf column
    ENCRYPTION_ALGORITHM = 8  # set only in an encrypted file with a plaintext footer
    FOOTER_SIGNING_KEY_METADATA = 9


class SchemaElement:
    TYPE = 1
    TYPE_LENGTH = 2
    REPETITION_TYPE = 3  # a FieldRepetitionType
    NAME = 4
    NUM_CHILDREN = 5  # set for a group, absent (or 0) for a leaf
    CONVERTED_TYPE = 6
    SCALE = 7
    PRECISION = 8
    FIELD_ID = 9
    LOGICAL_TYPE = 10


class FieldRepetitionType:
    """An enum's values, not field ids."""

    REQUIRED = 0
    OPTIONAL = 1
    REPEATED = 2


class RowGroup:
    COLUMNS = 1  # list<ColumnChunk>, one per leaf column
    TOTAL_BYTE_SIZE = 2
    NUM_ROWS = 3
    SORTING_COLUMNS = 4
    FILE_OFFSET = 5
    TOTAL_COMPRESSED_SIZE = 6
    ORDINAL = 7


class ColumnChunk:
    FILE_PATH = 1  # set when the chunk lives in another file
    FILE_OFFSET = 2
    META_DATA = 3  # a ColumnMetaData
    OFFSET_INDEX_OFFSET = 4
    OFFSET_INDEX_LENGTH = 5
    COLUMN_INDEX_OFFSET = 6
    COLUMN_INDEX_LENGTH = 7
    CRYPTO_METADATA = 8
    ENCRYPTED_COLUMN_METADATA = 9


class ColumnMetaData:
    TYPE = 1
    ENCODINGS = 2
    PATH_IN_SCHEMA = 3
    CODEC = 4
    NUM_VALUES = 5
    TOTAL_UNCOMPRESSED_SIZE = 6
    TOTAL_COMPRESSED_SIZE = 7  # every page of the chunk, the dictionary page too
    KEY_VALUE_METADATA = 8
    DATA_PAGE_OFFSET = 9
    INDEX_PAGE_OFFSET = 10
    DICTIONARY_PAGE_OFFSET = 11
    STATISTICS = 12
    ENCODING_STATS = 13
    BLOOM_FILTER_OFFSET = 14
    BLOOM_FILTER_LENGTH = 15
    SIZE_STATISTICS = 16
    GEOSPATIAL_STATISTICS = 17


class OffsetIndex:
    PAGE_LOCATIONS = 1  # list<PageLocation>
    UNENCODED_BYTE_ARRAY_DATA_BYTES = 2


class PageLocation:
    OFFSET = 1
    COMPRESSED_PAGE_SIZE = 2
    FIRST_ROW_INDEX = 3


class BloomFilterHeader:
    NUM_BYTES = 1
    ALGORITHM = 2  # a union: BLOCK = 1, the split-block algorithm
    HASH = 3  # a union: XXHASH = 1
    COMPRESSION = 4  # a union: UNCOMPRESSED = 1


UNION_FIRST = 1
"""The field id of a union's first (in a bloom filter header, only) member."""
