"""This home's Prefect profile: ``prefect …`` in a shell reaches the home's server.

See docs/development.md#the-prefect-profile.
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
    """Record ``api_url`` in ``home``'s ``dupflow`` profile; best effort: failing costs no job its run."""
    if not {"PREFECT_PROFILE", "PREFECT_PROFILES_PATH"} & set(environment) and recorded(home, api_url):
        return
    env = PREFECT_DEFAULTS | {name: value for name, value in environment.items() if name != API_URL}
    env |= {"PREFECT_HOME": str(home)}
    try:
        command = [sys.executable, "-m", __name__, api_url]
        done = subprocess.run(
            command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=RECORD_TIMEOUT
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
    """Whether the active ``dupflow`` profile names ``api_url`` already.

    Why: then no Prefect import (1.5 s of CPU).
    """
    try:
        written = tomllib.loads((home / "profiles.toml").read_text())
    except (OSError, ValueError):  # TOMLDecodeError is a ValueError
        return False
    return written.get("active") == PROFILE and written.get("profiles", {}).get(PROFILE, {}).get(API_URL) == api_url


def update_profile(api_url: str) -> str | None:
    """Set the ``dupflow`` profile to ``api_url``; give what to tell the user, if any.

    Note: it is made active where the user chose none.
    """
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
