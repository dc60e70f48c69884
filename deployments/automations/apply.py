"""Apply the notification automations of notify.yaml (or FILE) to the jobs' server.

    uv run python -m deployments.automations.apply [FILE]

A notification names its block (``dupflow-notify``), not its id (docs/operations.md).
"""

from __future__ import annotations

import argparse
import sys
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import httpx

from config.errors import ConfigError
from config.runtime import apply_process_defaults
from config.yaml_file import parse_yaml_file
from flows.prefect_server import use_server
from tasks.core.errors import DupflowError
from tasks.core.json_shapes import JsonObject

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.events.schemas.automations import AutomationCore

NOTIFY_FILE = Path(__file__).with_name("notify.yaml")


def main(argv: list[str] | None = None) -> int:
    """Apply them all once all are valid; a failure: one line on stderr, exit 1."""
    apply_process_defaults()  # before anything imports Prefect: it decides telemetry at import
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "file", nargs="?", type=Path, default=NOTIFY_FILE, help="automation file (YAML)"
    )
    args = parser.parse_args(argv)
    try:
        automations = read_automations(args.file)
        use_server()
        from prefect.client.orchestration import get_client
        from prefect.events.schemas.automations import AutomationCore

        with get_client(sync_client=True) as client:
            cores = [
                AutomationCore.model_validate(with_block_ids(client, automation))
                for automation in automations
            ]
            for core in cores:
                print(f"applied automation {core.name!r} ({replace_automation(client, core)})")
    except (DupflowError, OSError, ValueError, httpx.HTTPError) as exc:
        # a ConfigError: the file's problems alone
        said = "; ".join(exc.problems) if isinstance(exc, ConfigError) else exc
        print(f"error: {said}", file=sys.stderr)
        return 1
    return 0


def replace_automation(client: SyncPrefectClient, core: AutomationCore) -> UUID:
    """Replace the automations of ``core``'s name by it.

    Note: of two applies at once, both keep the newest (404s ignored).
    """
    from prefect.exceptions import PrefectHTTPStatusError

    created = client.create_automation(core)
    for existing in client.read_automations_by_name(core.name)[1:]:  # newest first
        try:
            client.delete_automation(existing.id)
        except PrefectHTTPStatusError as exc:
            if exc.response.status_code != 404:
                raise
    return created


def read_automations(path: Path) -> list[JsonObject]:
    """The automations of a file: a list under ``automations:``, a list, or one."""
    document = parse_yaml_file(path)
    automations = (
        document.get("automations", [document]) if isinstance(document, dict) else document
    )
    if not isinstance(automations, list) or not all(isinstance(item, dict) for item in automations):
        raise DupflowError(
            f"{path}: expected automations (a list of mappings under 'automations:')"
        )
    return automations


def with_block_ids(client: SyncPrefectClient, automation: JsonObject) -> JsonObject:
    """``automation`` with each notification action's block name replaced by its id."""
    for action in automation.get("actions", []):
        if action.get("type") == "send-notification" and "block_document_id" in action:
            action["block_document_id"] = block_id(client, action["block_document_id"])
    return automation


def block_id(client: SyncPrefectClient, name_or_id: str) -> str:
    """The id of the notification block named ``name_or_id`` (an id as it is)."""
    with suppress(ValueError):
        return str(UUID(str(name_or_id)))
    with_name = {"block_documents": {"name": {"any_": [name_or_id]}}, "include_secrets": False}
    found = client.request("POST", "/block_documents/filter", json=with_name).json()
    notifiers = [block for block in found if "notify" in block["block_schema"]["capabilities"]]
    if len(notifiers) != 1:
        raise DupflowError(
            f"{len(notifiers) or 'no'} notification block named {name_or_id!r} on the Prefect "
            "server: create one (a Slack, Microsoft Teams, email or custom webhook block, in the "
            "UI under Blocks) with that name, then apply again"
        )
    return str(notifiers[0]["id"])


if __name__ == "__main__":
    sys.exit(main())
