"""The Python client's way to pull a whole index: opensearch-py's
helpers.scan (scroll, one stream), each hit written as a JSON line.

    python3 scan_opensearchpy.py URL INDEX PAGE_DOCS OUT_FILE

Prints one JSON line: docs, seconds. `sluice bench export` runs it.
"""

import json
import sys
import time

from opensearchpy import OpenSearch, helpers


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    url, index, page_docs, out_path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    client = OpenSearch(hosts=[url], timeout=120)
    start = time.monotonic()
    docs = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for hit in helpers.scan(client, index=index, size=page_docs, scroll="5m"):
            out.write(json.dumps({"_id": hit["_id"], "_source": hit["_source"]}))
            out.write("\n")
            docs += 1
    print(json.dumps({"docs": docs, "seconds": time.monotonic() - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
