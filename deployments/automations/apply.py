"""Apply the notification automations of ``notify.yaml`` (or another automation file) to the jobs' Prefect server.

    uv run python -m deployments.automations.apply [FILE]

Prefect's own ``prefect automation create --from-file`` wants the id of each action's notification block, which
differs from server to server; the shipped file names its block instead (``block_document_id: dupflow-notify``).
This command puts the id of the block of that name in its place, deletes the server's automations of the same names
(so applying again after an edit replaces them instead of notifying twice) and creates the file's automations. It
installs first, whatever the file, the automation that puts a local run paused for inspection back when the UI
resumes it (``flows.prefect_server.LOCAL_PAUSE_AUTOMATION``, which needs no block; the local server gets it when it
starts, any other server here), kept as it is when the server already has it. It talks to the server the jobs use:
``PREFECT_API_URL`` if set (it must answer), else the local server, started if need be. A server that does not
answer, a block that is missing or cannot notify, or an automation Prefect rejects is one line on stderr and exit
code 1; the file's automations change only once every one of them is valid.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import yaml

from config.runtime import apply_prefect_defaults
from flows.prefect_server import LOCAL_PAUSE_AUTOMATION, install_local_pause_automation, use_server
from tasks.core.errors import DupflowError

NOTIFY_FILE = Path(__file__).with_name("notify.yaml")
BLOCK_ACTIONS = ("send-notification",)


class AutomationFileError(DupflowError):
    """The automation file or a block it names is not usable; the message says which and why."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", nargs="?", type=Path, default=NOTIFY_FILE, help="automation file (YAML)")
    args = parser.parse_args(argv)
    try:
        automations = read_automations(args.file)
        apply_prefect_defaults()
        use_server()
        print_applied(LOCAL_PAUSE_AUTOMATION["name"], install_local_pause_guard())
        for name, automation_id in replace_automations(automations):
            print_applied(name, automation_id)
    except (DupflowError, OSError, ValueError, yaml.YAMLError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def read_automations(path: Path) -> list[dict[str, Any]]:
    """The automations of an automation file: a list under ``automations:``, a list, or one automation."""
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    automations = document.get("automations", [document]) if isinstance(document, dict) else document
    if not isinstance(automations, list) or not all(isinstance(item, dict) for item in automations):
        raise AutomationFileError(f"{path}: expected automations (a list of mappings under 'automations:')")
    return automations


def print_applied(name: str, automation_id: UUID | str) -> None:
    print(f"applied automation {name!r} ({automation_id})")


def install_local_pause_guard() -> str:
    """The id of the server's automation that puts a local paused run back when the UI resumes it (installed)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return install_local_pause_automation(client)


def replace_automations(automations: list[dict[str, Any]]) -> list[tuple[str, UUID]]:
    """Validate every automation with its block ids filled in, then replace the server's ones of the same names."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    with get_client(sync_client=True) as client:
        cores = [AutomationCore.model_validate(with_block_ids(client, automation)) for automation in automations]
        applied = []
        for core in cores:
            for existing in client.read_automations_by_name(core.name):
                client.delete_automation(existing.id)
            applied.append((core.name, client.create_automation(core)))
    return applied


def with_block_ids(client, automation: dict[str, Any]) -> dict[str, Any]:
    """``automation`` with each notification action's block name replaced by that block's id (ids stay)."""
    actions = [
        {**action, "block_document_id": block_id(client, action["block_document_id"])}
        if action.get("type") in BLOCK_ACTIONS and "block_document_id" in action
        else action
        for action in automation.get("actions", [])
    ]
    return {**automation, "actions": actions}


def block_id(client, name_or_id: str) -> str:
    """The id of the notification block named ``name_or_id`` (an id is returned as it is)."""
    try:
        return str(UUID(str(name_or_id)))
    except ValueError:
        pass
    response = client.request(
        "POST",
        "/block_documents/filter",
        json={"block_documents": {"name": {"any_": [name_or_id]}}, "include_secrets": False},
    )
    notifiers = [block for block in response.json() if "notify" in block["block_schema"]["capabilities"]]
    if len(notifiers) != 1:
        found = "no" if not notifiers else f"{len(notifiers)}"
        raise AutomationFileError(
            f"{found} notification block named {name_or_id!r} on the Prefect server: create one (a Slack, Microsoft "
            "Teams, email or custom webhook block, in the UI under Blocks) with that name, then apply again"
        )
    return notifiers[0]["id"]


if __name__ == "__main__":
    sys.exit(main())
