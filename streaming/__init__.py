"""What sits around a streaming query: input shapes, decoding, progress and the job entry points."""

__all__: list[str] = []
