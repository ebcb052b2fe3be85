"""What the server says about the policy it serves, so that the robot side can log which policy acted:
the weights' SHA-256 and the lineage from the folder's manifest, and the runtime spec (step rate,
windows, image size, conventions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from policypipe import __version__
from policypipe.atomic import MANIFEST
from policypipe.lineage.hashing import sha256_file
from policypipe.runtime.observation import field_names
from policypipe.serving.protocol import OPTION_FIELDS, PROTOCOL_VERSION

WEIGHTS_FILE = "model.safetensors"


def policy_metadata(folder: Path, runtime: dict[str, Any], max_request_bytes: int) -> dict[str, Any]:
    """`runtime`: the policy's RuntimeSpec.to_json(). Read after the policy was loaded, which
    checked every file against this manifest."""
    folder = Path(folder)
    manifest = json.loads((folder / MANIFEST).read_text())
    return {
        "server": "policypipe",
        "version": __version__,
        "protocol": PROTOCOL_VERSION,
        "policy": {
            "weights_sha256": manifest["files"][WEIGHTS_FILE],
            # The manifest names every file's SHA-256: its own is one name for the whole folder.
            "manifest_sha256": sha256_file(folder / MANIFEST),
            "files": manifest["files"],
            "lineage": manifest.get("lineage", {}),
        },
        "runtime": runtime,
        "request": {
            # Every camera's and gripper's; a camera k >= 1 left out is absent for the policy.
            "fields": field_names(runtime.get("grippers", [0]), runtime.get("cameras", [0])),
            "options": list(OPTION_FIELDS),
            "max_bytes": max_request_bytes,
        },
    }
