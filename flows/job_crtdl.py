"""The job's CRTDL: found in the input, read, enriched, its group names checked.

Import-light as ``flows.jobs``, which plans a new job with it.
"""

import json
from pathlib import Path
from typing import NamedTuple

from config.settings import Settings
from tasks.core.errors import JobError
from tasks.core.json_shapes import JsonObject
from tasks.core.jsonfile import JsonFileError, parse_json_document, read_limited
from tasks.core.names import show_text
from tasks.job.layout import is_crtdl_file

CRTDL_NAME = "crtdl.json"
ENRICHED_CRTDL_NAME = "enriched-crtdl.json"
# a large real CRTDL is under 1 MB; more is a wrong file (or /dev/zero)
MAX_CRTDL_BYTES = 16 * 1024 * 1024


def crtdl_input(steps: list[str], job_input: str | None) -> Path | None:
    """The CRTDL input: the extractor's unless a URL, other import steps' if ``.json``."""
    if (
        job_input
        and "://" not in job_input
        and (steps[0] == "extractor" or is_crtdl_file(job_input))
    ):
        return Path(job_input)
    return None


def no_crtdl_message(job_input: str | None) -> str:
    """Say why a flattening job has no CRTDL.

    Note: a given INPUT is named with what it was taken for (``query.crtdl`` is no CRTDL, and being
    told to give one as INPUT would mislead).
    """
    message = (
        "the flattening step needs a CRTDL: give the CRTDL file as INPUT (with local_import: "
        "start CONFIG CRTDL --dir DATA; with extractor: start CONFIG CRTDL)"
    )
    if not job_input or "://" in job_input:
        return message
    if Path(job_input).is_dir():
        return (
            f"{message}; INPUT {show_text(job_input, None)} is a directory, taken as the data to "
            "import"
        )
    return (
        f"{message}; INPUT {show_text(job_input, None)} is no CRTDL: a CRTDL file's name ends in "
        ".json"
    )


class EffectiveCrtdl(NamedTuple):
    source: Path
    name: str
    data: bytes
    warnings: list[str]


def effective_crtdl(source: Path, settings: Settings) -> EffectiveCrtdl:
    """Spec procedure step 1: the CRTDL as given, or enriched by preprocessing rules."""
    from tasks.job.crtdl_enrichment import EnrichmentError, enrich_crtdl
    from tasks.sof.crtdl_views import with_group_ids

    parsed, data = read_crtdl(source)
    preprocessing = settings.services.crtdl_preprocessing
    rules = preprocessing.rules if preprocessing.enabled else []
    enriched, warnings = parsed, list[str]()
    if rules:
        try:
            enriched, warnings = enrich_crtdl(parsed, rules)
        except EnrichmentError as exc:
            raise JobError(f"{source}: {exc}") from exc
    enriched = with_group_ids(enriched)
    if "flattening" in settings.pipeline.enabled_steps:
        refuse_unusable_group_names(source, enriched)
    if enriched is parsed:
        return EffectiveCrtdl(source, CRTDL_NAME, data, [])
    name = ENRICHED_CRTDL_NAME if rules else CRTDL_NAME
    return EffectiveCrtdl(source, name, (json.dumps(enriched, indent=2) + "\n").encode(), warnings)


def read_crtdl(source: Path) -> tuple[JsonObject, bytes]:
    if not source.is_file():
        problem = (
            "is a directory"
            if source.is_dir()
            else "is no regular file"
            if source.exists()
            else "not found"
        )
        raise JobError(f"CRTDL {source} {problem}; give the CRTDL JSON file as the job input")
    try:
        data = read_limited(source, MAX_CRTDL_BYTES, f"CRTDL {source}")
    except JsonFileError as exc:
        raise JobError(f"{exc}; give the CRTDL JSON file as the job input") from None
    try:
        parsed = parse_json_document(data, f"CRTDL {source}")
    except JsonFileError as exc:
        raise JobError(f"invalid {exc}; nothing was submitted") from None
    if not isinstance(parsed, dict):
        raise JobError(f"invalid CRTDL {source}: expected a JSON object; nothing was submitted")
    return parsed, data


def refuse_unusable_group_names(source: Path, crtdl: JsonObject) -> None:
    """Refuse group names that cannot be, or would collide as, file names and S3 keys.

    Note: a group name becomes a CSV, a ViewDefinition file name and an S3 key; refused before the
    job exists.
    """
    from tasks.sof.crtdl_views import group_name_problems

    try:
        problems = group_name_problems(crtdl)
    except ValueError as exc:
        raise JobError(f"invalid CRTDL {source} for the flattening step: {exc}") from None
    if problems:
        raise JobError(f"CRTDL {source}: {'; '.join(problems)}")
