"""The job in the Prefect UI: its record card, step file tables, result summary.

Note: only a picture of the job: the job's state is its flow run's.
"""

import html
import re
from collections.abc import Sequence
from typing import Any

from prefect import get_run_logger, runtime
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactUpdate
from prefect.client.schemas import filters
from prefect.exceptions import ExternalSignal
from prefect.settings import get_current_settings

from config.settings import STEP_NAMES
from flows.jobs import Job
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JsonObject
from tasks.core.readable import (
    CAUSE_CHARS,
    counted,
    duration_text,
    readable_lines,
    size_text,
    truncate,
)
from tasks.core.redaction import redact, redact_strings
from tasks.job.contract import StepResult
from tasks.job.layout import artifact_key, step_artifact_key
from tasks.job.record import RUNNING, FileEntry, counts_text, read_record

STEP_NAMES_IN_KEYS = "|".join(step.replace("_", "-") for step in STEP_NAMES)
STEP_TABLE_ROWS = 1000
# a step's key after job-<id>-
STEP_KEY = re.compile(rf"(?P<number>\d+)-(?:{STEP_NAMES_IN_KEYS})(?:-(?P<label>.*))?")


def publish_step_table(job: Job, result: StepResult) -> None:
    rows = step_table_rows(result.files)
    create_table_artifact(
        key=step_artifact_key(job.job_id, result.position, result.step),
        table=rows or [{"name": "(no files)", "size": 0, "contents": ""}],
        description=f"Job {job.job_id}, step {result.position + 1} `{result.step}`: files in "
        f"`{result.folder}`",
    )


def step_table_rows(files: Sequence[FileEntry]) -> list[JsonObject]:
    """Return the table's rows: the first ``STEP_TABLE_ROWS`` files, then one more.

    Why: a row per file made a 10,000-file step's table 1 MB of JSON for the flow to build and
    the server to keep.
    """
    shown, rest = files[:STEP_TABLE_ROWS], files[STEP_TABLE_ROWS:]
    rows = [{"name": f.name, "size": f.size, "contents": counts_text([f])} for f in shown]
    if rest:
        more = f"… {counted(len(rest), 'more file')}"
        rows.append(
            {"name": more, "size": sum(f.size for f in rest), "contents": counts_text(rest)}
        )
    return rows


class JobRecordCard:
    """The job-record artifact (key ``job-<id>``): one version per flow run.

    Note: updated in place at every step boundary and state change, so the key's page keeps one
    version per run as the job's history.
    """

    def __init__(self, job: Job):
        self._job = job
        self._artifact_id: Any = None
        self._results: list[StepResult] = []
        self._failed: BaseException | None = None
        self._state, self._message = RUNNING, ""

    def set_state(self, state: str, message: str) -> None:
        """The job's state (and its message, redacted already), published now."""
        self._state, self._message = state, message
        self.refresh()

    def note(self, results: list[StepResult], failed: BaseException | None = None) -> None:
        """These steps and the next one's failure, if any, shown at the next ``refresh``."""
        self._results, self._failed = list(results), failed

    def refresh(self) -> None:
        """Publish the record as it stands.

        Note: one that cannot be published (the API may be what failed) is logged, never put in
        place of the job's own outcome (a finished job stays Completed).
        """
        try:
            markdown = self.markdown()
            key = artifact_key(self._job.job_id)
            self._artifact_id = self._artifact_id or this_runs_artifact_id(key)
            if self._artifact_id is None:
                self._artifact_id = create_markdown_artifact(
                    key=key, markdown=markdown, description="Job record"
                )
            else:
                with get_client(sync_client=True) as client:
                    client.update_artifact(self._artifact_id, ArtifactUpdate(data=markdown))
        except Exception as publish_error:
            get_run_logger().warning(
                "the job record could not be updated: %s", one_line(publish_error)
            )

    def markdown(self) -> str:
        """The job record: state, flow run, steps with artifact links, inspections, facts."""
        job, results = self._job, self._results
        # empty: links relative to the UI's own origin
        base = (get_current_settings().ui_url or "").rstrip("/")
        links = artifact_links(job.job_id, base)
        record = read_record(job.paths.job_dir)  # the facts as the steps recorded them so far
        message = f" — {one_line_text(self._message)}" if self._message else ""
        lines = [f"# dupflow job `{job.job_id}`", "", f"**State: {self._state}**{message}", ""]
        lines += [f"Job directory: `{job.paths.job_dir}`", ""]
        if runtime.flow_run.id:
            lines += [
                "Latest flow run: "
                f"[{runtime.flow_run.name}]({base}/runs/flow-run/{runtime.flow_run.id})",
                "",
            ]
        lines += self.step_table(links, base)
        lines += ["", step_time_text(results)]
        if others := links.pop(None, []):
            lines += ["", f"Other artifacts: {' · '.join(others)}"]
        if inspections := inspection_lines(results):
            lines += ["", "## Inspections", "", *inspections]
        # an older record's may hold a secret
        if facts := redact_strings(dict(sorted(record.facts.items()))):
            lines += ["", "## Facts", "", *markdown_list(facts)]
        return "\n".join(lines)

    def step_table(self, links: dict[int | None, list[str]], base: str) -> list[str]:
        """Return the steps' markdown table: done, failed, running (linked), not run yet."""
        lines = [
            "| # | step | state | folder | files | contents | size | time | artifacts |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in self._results:
            state = "awaiting inspection" if r.awaiting else "done (cached)" if r.cached else "done"
            took = "" if r.seconds is None else duration_text(r.seconds)
            lines.append(
                f"| {r.position + 1} | {r.step} | {state} | `{r.folder}` | {len(r.files)} | "
                f"{counts_text(r.files)} | {size_text(r.size)} | {took} | "
                f"{step_links(links, r.position)} |"
            )
        pending = list(enumerate(self._job.settings.pipeline.enabled_steps))[len(self._results) :]
        if self._failed is not None and pending:
            (position, step), *pending = pending
            cause = one_line(self._failed)
            lines.append(
                f"| {position + 1} | {step} | failed: {cause} | | | | | | "
                f"{step_links(links, position)} |"
            )
        # the step at work: a link to its live progress
        if self._failed is None and pending and self._state == RUNNING:
            (position, step), *pending = pending
            key = step_artifact_key(self._job.job_id, position, step, "progress")
            progress = f"[progress]({base}/artifacts/key/{key})"
            lines.append(f"| {position + 1} | {step} | running | | | | | | {progress} |")
        lines += [
            f"| {position + 1} | {step} | not run yet | | | | | | |" for position, step in pending
        ]
        return lines


def this_runs_artifact_id(key: str) -> Any:
    this_run = filters.ArtifactFilterFlowRunId(any_=[runtime.flow_run.id])
    by_key = filters.ArtifactFilter(key=filters.ArtifactFilterKey(any_=[key]), flow_run_id=this_run)
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=by_key, limit=1)
    return found[0].id if found else None


def markdown_list(value: Any) -> list[str]:
    """``value`` as a nested markdown list of ``key: value`` items, never a dict."""
    lines = []
    for depth, label, text in readable_lines(value):
        parts = [f"**{markdown_text(label)}**"] if label is not None else []
        parts += [code_span(text)] if text is not None else []
        lines.append("  " * depth + "- " + ": ".join(parts))
    return lines


def inspection_lines(results: list[StepResult]) -> list[str]:
    """One line per gate the job reached: released (with its form's note) or awaiting."""
    lines = []
    for r in (r for r in results if r.step == "wait"):
        note = str(r.summary.get("inspection note") or "")
        state = (
            "awaiting inspection"
            if r.awaiting
            else "released" + (f": {markdown_text(note)}" if note else "")
        )
        lines.append(f"- step {r.position + 1} ({r.step}): {state}")
    return lines


# within a line (a list item's text): no . - + # !
_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()|~:])")


def markdown_text(text: str) -> str:
    """Show text as itself: ``& < >`` as entities, markdown's punctuation escaped.

    Note: ``:`` too, so no ``javascript:`` link is made.
    """
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def step_links(links: dict[int | None, list[str]], position: int) -> str:
    return " · ".join(links.pop(position, []))


def step_time_text(results: list[StepResult]) -> str:
    """The step time so far; the part served from the cache is what earlier runs spent."""
    total = sum(r.seconds or 0.0 for r in results)
    cached = sum(r.seconds or 0.0 for r in results if r.cached)
    text = f"**Step time so far**: {duration_text(total)}"
    return text + (
        f" ({duration_text(cached)} of it in earlier runs, served from the cache)" if cached else ""
    )


def one_line(exc: BaseException) -> str:
    """A failure's cause for a table cell: its first line, no pipes, redacted."""
    if isinstance(exc, KeyboardInterrupt | ExternalSignal):
        return "interrupted"
    return one_line_text(
        exc.message if isinstance(exc, DupflowError) else f"{type(exc).__name__}: {exc}"
    )


def one_line_text(message: str) -> str:
    """A message on one line, cut at ``CAUSE_CHARS``, as itself, secrets redacted.

    Note: no pipe ends a table cell, no link is made of a service's words.
    """
    return markdown_text(truncate(" ".join(redact(message).split()), CAUSE_CHARS))


def code_span(text: str) -> str:
    """A code span whose fence outruns any run of backticks in ``text`` (CommonMark)."""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    padding = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def artifact_links(job_id: str, base: str) -> dict[int | None, list[str]]:
    """Links to the latest version of each of the job's artifacts, by step position.

    Why: ``/artifacts/key/<key>`` would list every version.
    Note: position None holds those of no single step, e.g. the inspection note.
    """
    prefix = f"{artifact_key(job_id)}-"
    by_key = filters.ArtifactCollectionFilter(key=filters.ArtifactCollectionFilterKey(like_=prefix))
    with get_client(sync_client=True) as client:
        found = client.read_latest_artifacts(artifact_filter=by_key)
    links: dict[int | None, list[str]] = {}
    for artifact in sorted(
        (a for a in found if a.key and a.key.startswith(prefix)), key=lambda a: a.key or ""
    ):
        position, label = artifact_label(artifact.key.removeprefix(prefix))
        links.setdefault(position, []).append(
            f"[{label}]({base}/artifacts/artifact/{artifact.latest_id})"
        )
    return links


def artifact_label(rest: str) -> tuple[int | None, str]:
    """Label an artifact: ``04-pseudonymizer-report`` → (3, ``report``).

    Note: ``04-pseudonymizer`` (its file table) → (3, ``files``);
    Note: ``inspection`` → (None, ``inspection``).
    """
    if match := STEP_KEY.fullmatch(rest):
        return int(match["number"]) - 1, match["label"] or "files"
    return None, rest
