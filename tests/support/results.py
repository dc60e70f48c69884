"""Result records as Prefect's result store writes a step's (JSON serializer), for tests of what reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.job.result_records import RESULT_SERIALIZER


def write_step_record(path: Path, data: dict[str, Any]) -> str:
    """A ``StepResult`` of ``data`` at ``path``, written as Prefect writes it; its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    result = json.dumps({"__class__": "tasks.job.contract.StepResult", "data": data})
    metadata = {"storage_key": str(path), "serializer": RESULT_SERIALIZER}
    path.write_text(json.dumps({"metadata": metadata, "result": result}))
    return str(path)
