"""Driving Ansible from the fleet tests: the collection installed from the checkout into a temp dir, a
controller environment built from an allowlist, playbooks and inventories written as JSON (which is
YAML), and the fleet table read back by its columns.

Ansible comes from the `dev` extra (ansible-core, and the `ansible` package for community.docker's
`docker` connection); without it the tests that need it skip with that reason."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sandbox_conformance.processes.children import Completed, run

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's bin: ansible-playbook, ansible-galaxy, sandbox-conformance
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing() -> str | None:
    """Why the Ansible tests cannot run here, or None."""
    for tool in ("ansible-playbook", "ansible-galaxy", "ansible-doc"):
        if not (BIN / tool).exists():
            return f"no {tool} in {BIN}: pip install -e '.[dev]' (ansible-core and ansible)"
    docker_connection = Path(sys.prefix).glob(
        "lib/python3*/site-packages/ansible_collections/community/docker/plugins/connection/docker.py")
    if not any(docker_connection):
        return "no community.docker collection: pip install -e '.[dev]' (the `ansible` package ships it)"
    return None


@dataclasses.dataclass(frozen=True)
class Controller:
    """An Ansible controller confined to one temp dir: its home, its collections, its config."""

    root: Path

    @property
    def collections(self) -> Path:
        return self.root / "collections"

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        # Built from nothing, not from os.environ: SANDBOX_CONFORMANCE_REQUIRE (set by .ci/run) or a
        # DOCKER_HOST must not leak into the `local` host's witness run or the docker connection.
        env = {
            "PATH": f"{BIN}:{BASE_PATH}",
            "LANG": "C.UTF-8",  # ansible-core refuses a non-UTF-8 locale
            "HOME": str(self.root / "home"),
            "ANSIBLE_HOME": str(self.root / "home" / ".ansible"),
            "ANSIBLE_CONFIG": str(self.root / "ansible.cfg"),  # never an ansible.cfg from the cwd
            "ANSIBLE_COLLECTIONS_PATH": str(self.collections),
            "ANSIBLE_LOCAL_TEMP": str(self.root / "local-tmp"),
            # Where modules are staged on a target: for this host (`local`, and the controller's own
            # tasks) a dir of ours, not /root/.ansible/tmp; in a container it goes with the container.
            "ANSIBLE_REMOTE_TEMP": str(self.root / "remote-tmp"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_HOST_KEY_CHECKING": "False",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            # No ControlPersist master left behind by the ssh host (it daemonises out of our group).
            "ANSIBLE_SSH_ARGS": "-o ControlMaster=no",
        }
        env.update(extra or {})
        return env

    def install_collection(self) -> Completed:
        """`ansible-galaxy collection install` from the checkout, as docs/many-hosts.md says."""
        for d in ("home", "local-tmp"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "ansible.cfg").write_text("[defaults]\n")
        return run([str(BIN / "ansible-galaxy"), "collection", "install", "--force",
                    "--collections-path", str(self.collections), str(REPO / "fleet")],
                   timeout=300, env=self.env(), cwd=str(REPO))

    def playbook(self, playbook: str | Path, inventory: Path, *extra: str, timeout: float = 900,
                 env: Mapping[str, str] | None = None, forks: int = 10) -> Completed:
        return run([str(BIN / "ansible-playbook"), "--inventory", str(inventory), "--forks", str(forks),
                    *extra, str(playbook)], timeout=timeout, env=self.env(env), cwd=str(REPO))


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def sections(table: str) -> dict[str, list[dict[str, str]]]:
    """The text table's sections by title, each a list of rows keyed by column header. Columns are
    found by where the header's words start (cells are left-aligned; a header word like `NOT TESTED`
    has one space, columns are two apart)."""
    out: dict[str, list[dict[str, str]]] = {}
    for block in table.strip().split("\n\n")[1:]:
        title, header, *rows = block.splitlines()
        spans = [(m.start(), m.group()) for m in re.finditer(r"\S+(?: \S+)*", header)]
        starts = [s for s, _ in spans] + [None]
        out[title.split("  ")[0]] = [
            {name: row[start:end].strip() for (start, name), end in zip(spans, starts[1:], strict=True)}
            for row in rows
        ]
    return out


def by(rows: Sequence[dict[str, str]], key: str) -> dict[str, dict[str, str]]:
    return {r[key]: r for r in rows}
