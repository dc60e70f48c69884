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
from typing import TYPE_CHECKING

from config.runtime import PREFECT_DEFAULTS
from flows.terminal import print_stderr

if TYPE_CHECKING:
    from prefect.settings.profiles import ProfilesCollection

PROFILE = "dupflow"
API_URL = "PREFECT_API_URL"
DEFAULT_PROFILE = "ephemeral"  # Prefect's, active while the user has chosen none
RECORD_TIMEOUT = 60.0
Recording = subprocess.Popen[str]


def start_recording(home: Path, api_url: str, environment: Mapping[str, str]) -> Recording | None:
    """Record ``api_url`` in the home's ``dupflow`` profile; None if it is there.

    Why: it imports Prefect (1.5 s), which a new server's start, migrating its database, hides.
    """
    if not {"PREFECT_PROFILE", "PREFECT_PROFILES_PATH"} & set(environment) and recorded(
        home, api_url
    ):
        return None
    env = PREFECT_DEFAULTS | {name: value for name, value in environment.items() if name != API_URL}
    env |= {"PREFECT_HOME": str(home)}
    command = [sys.executable, "-m", __name__, api_url]
    try:
        out, nothing = subprocess.PIPE, subprocess.DEVNULL
        return subprocess.Popen(command, env=env, stdin=nothing, stdout=out, stderr=out, text=True)
    except OSError as exc:
        print_stderr(f"warning: the Prefect profile {PROFILE!r} was not updated ({exc})")
        return None


def finish_recording(recording: Recording | None) -> None:
    """Wait for ``start_recording``'s process.

    Note: best effort; failing costs no job its run.
    """
    if recording is None:
        return
    try:
        out, err = recording.communicate(timeout=RECORD_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        recording.kill()
        recording.communicate()
        print_stderr(f"warning: the Prefect profile {PROFILE!r} was not updated ({exc})")
        return
    if recording.returncode != 0:
        why = (err.strip().splitlines() or [f"exit code {recording.returncode}"])[-1]
        print_stderr(f"warning: the Prefect profile {PROFILE!r} was not updated: {why}")
    elif said := out.strip():
        print_stderr(said)


def recorded(home: Path, api_url: str) -> bool:
    """Whether the active ``dupflow`` profile names ``api_url`` already.

    Why: then no Prefect import (1.5 s of CPU).
    """
    try:
        written = tomllib.loads((home / "profiles.toml").read_text())
    except (OSError, ValueError):  # TOMLDecodeError is a ValueError
        return False
    return (
        written.get("active") == PROFILE
        and written.get("profiles", {}).get(PROFILE, {}).get(API_URL) == api_url
    )


def update_profile(api_url: str) -> str | None:
    """Set the ``dupflow`` profile to ``api_url``; give what to tell the user, if any.

    Note: it is made active where the user chose none.
    """
    from prefect.context import get_settings_context
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ANALYTICS_ENABLED
    from prefect.settings.constants import DEFAULT_PROFILES_PATH
    from prefect.settings.profiles import load_profiles

    profiles = load_profiles()
    kept = profiles[PROFILE].settings if PROFILE in profiles.names else {}
    # analytics off unless the profile says otherwise (the merge keeps the rest as it is)
    settings = {PREFECT_SERVER_ANALYTICS_ENABLED: False, **kept, PREFECT_API_URL: api_url}
    profiles.update_profile(PROFILE, settings)
    active = get_settings_context().profile.name  # PREFECT_PROFILE, else the file's
    untouched = (
        active == DEFAULT_PROFILE and profiles[DEFAULT_PROFILE].source == DEFAULT_PROFILES_PATH
    )
    if switch := untouched and "PREFECT_PROFILE" not in os.environ:
        profiles.set_active(PROFILE)
    save_whole(profiles)
    if switch or active == PROFILE:
        return None
    return (
        f"`prefect` commands use the Prefect profile {active!r}, not this home's server: `uv run "
        f"prefect profile use {PROFILE}` points them at it"
    )


def save_whole(profiles: ProfilesCollection) -> None:
    """Prefect's ``save_profiles``, written under a temporary name and renamed.

    Why: Prefect empties the file, then writes it; a server or runner starting meanwhile could
    read it empty, and miss the user's own settings there (a database URL).
    """
    from prefect.settings import PREFECT_PROFILES_PATH, get_current_settings, temporary_settings
    from prefect.settings.profiles import save_profiles

    from tasks.streams.files import renamed_when_done

    with renamed_when_done(get_current_settings().profiles_path) as temporary:
        with temporary_settings({PREFECT_PROFILES_PATH: temporary}):
            save_profiles(profiles)


if __name__ == "__main__":
    if said := update_profile(sys.argv[1]):
        print(said)
