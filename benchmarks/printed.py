"""How a benchmark run as a script (``python -m feedline.benchmarks.X``) gives its result."""
from __future__ import annotations

import json


def print_result(result: dict, json_path: str | None) -> None:
    """``result`` printed as indented JSON, and written to ``json_path`` too where one is given."""
    text = json.dumps(result, indent=2)
    print(text)
    if json_path:
        with open(json_path, "w") as f:
            f.write(text + "\n")
