"""Put pyspark's own zips last on the path of every Python process the tests' Spark starts.

Spark puts ``pyspark/python/lib/pyspark.zip`` and py4j's source zip first on its Python
processes' path (the worker daemon and its forks, a Connect server's ``foreachBatch`` workers,
a streaming data source's runner). Python cannot cache bytecode for a zip, so each of those
processes compiled pyspark's modules from source: importing ``pyspark.daemon`` cost 1.2-1.5
CPU-seconds from the zip against 0.3 from the installed package beside it. These zips hold the
same files as that package (they ship inside it), so loading from the package runs the same code.
`tests/conftest.py` puts this directory on ``PYTHONPATH``, which Spark appends to its own.
"""

import os
import sys

_LIB = os.path.join("pyspark", "python", "lib")
for _zip in [p for p in sys.path if p.endswith(".zip") and os.path.dirname(p).endswith(_LIB)]:
    sys.path.remove(_zip)
    sys.path.append(_zip)
