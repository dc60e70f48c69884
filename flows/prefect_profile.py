"""This home's Prefect profile: ``prefect …`` commands typed in a shell reach this home's server.

Prefect takes its API from ``PREFECT_API_URL``, else from the active profile of the home's profiles file (what
``prefect profile`` and ``prefect config set`` edit); with neither, every ``prefect`` command starts a temporary
server of its own, which schedules nothing and has none of the server's work pools. So each start of the home's
server records its API URL in a profile of this home, ``dupflow``, by Prefect's own profile functions, with
``PREFECT_SERVER_ANALYTICS_ENABLED=false`` unless that profile sets it (a ``prefect server start`` in this home sends
no usage data either). The profile is made active when the active one is Prefect's untouched default
(``ephemeral``); a profile the user chose stays active, and the start says so in one line.

Run as ``python -m flows.prefect_profile API_URL`` in a process of its own: importing Prefect fixes its settings
for the importing process, and costs a second that a command line that finds its server running does not pay.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

from config.runtime import PREFECT_DEFAULTS

PROFILE = "dupflow"
API_URL = "PREFECT_API_URL"
DEFAULT_PROFILE = "ephemeral"  # Prefect's, active while the user has chosen none
RECORD_TIMEOUT = 60.0


def record_in_profile(home: Path, api_url: str, environment: Mapping[str, str]) -> None:
    """Record ``api_url`` in the ``dupflow`` profile of ``home`` (this module run with ``environment``, Prefect's
    settings of the caller); what it says (a profile of the user's stays active) goes to stderr. Best effort: a
    profile that cannot be written costs the ``prefect`` commands their server, not the job its run."""
    if not {"PREFECT_PROFILE", "PREFECT_PROFILES_PATH"} & set(environment) and recorded(home, api_url):
        return
    env = {name: value for name, value in environment.items() if name != "PREFECT_API_URL"}
    env = PREFECT_DEFAULTS | env | {"PREFECT_HOME": str(home)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, api_url],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RECORD_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        print(f"warning: the Prefect profile {PROFILE!r} was not updated ({exc})", file=sys.stderr)
        return
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        print(f"warning: the Prefect profile {PROFILE!r} was not updated: {why}", file=sys.stderr)
    elif said := done.stdout.strip():
        print(said, file=sys.stderr)


def recorded(home: Path, api_url: str) -> bool:
    """Whether the home's profiles file already has the ``dupflow`` profile active and naming ``api_url`` (a restart
    on the kept port): then the Prefect import of a recording is not paid (about 1.5 s of CPU)."""
    try:
        written = tomllib.loads((home / "profiles.toml").read_text())
    except (OSError, ValueError):  # TOMLDecodeError is a ValueError
        return False
    return written.get("active") == PROFILE and written.get("profiles", {}).get(PROFILE, {}).get(API_URL) == api_url


def update_profile(api_url: str) -> str | None:
    """The ``dupflow`` profile of the home's profiles file set to ``api_url``, made active where the user chose no
    profile; what to tell the user, if anything."""
    from prefect.context import get_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ANALYTICS_ENABLED
    from prefect.settings.profiles import DEFAULT_PROFILES_PATH, load_profiles, save_profiles

    profiles = load_profiles()
    kept = profiles[PROFILE].settings if PROFILE in profiles.names else {}
    analytics = {} if PREFECT_SERVER_ANALYTICS_ENABLED in kept else {PREFECT_SERVER_ANALYTICS_ENABLED: False}
    profiles.update_profile(PROFILE, {PREFECT_API_URL: api_url, **analytics})
    active = get_settings_context().profile.name  # PREFECT_PROFILE, else the file's
    untouched = active == DEFAULT_PROFILE and profiles[DEFAULT_PROFILE].source == DEFAULT_PROFILES_PATH
    if switch := untouched and "PREFECT_PROFILE" not in os.environ:
        profiles.set_active(PROFILE)
    save_profiles(profiles)
    if switch or active == PROFILE:
        return None
    return (
        f"`prefect` commands use the Prefect profile {active!r}, not this home's server: "
        f"`uv run prefect profile use {PROFILE}` points them at it"
    )


if __name__ == "__main__":
    if said := update_profile(sys.argv[1]):
        print(said)
