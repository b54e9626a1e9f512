"""The environment the host's kernel holds for the task: only the allowlisted keys, never the
launcher's secret, and exactly the values [environment.set] names."""

from __future__ import annotations

from sandbox_conformance.conformance.plan import Task
from sandbox_conformance.conformance.plugin import Settings
from sandbox_conformance.conformance.profile import expand

# The autouse fixture that names the running witness for _task_view: pytest finds a fixture among a
# module's own names, so every module of the suite imports it.
from sandbox_conformance.conformance.witnesses._common import _current as _current
from sandbox_conformance.conformance.witnesses._common import (
    _seen,
    _task_view,
    witness,
)

# ---- environment: the environment the host's kernel holds for the task --------------------------------


def _host_environ(task: Task) -> dict[str, str]:
    if _task_view(task):
        inside = task.get("environment")
        assert isinstance(inside, dict), f"the task could not read its environment: {inside}"
        return dict(inside)
    env = _seen(task).environ
    assert not isinstance(env, str), f"cannot tell: the host's /proc/PID/environ gave {env}"
    return dict(env)


@witness("environment")
def test_only_allowlisted_environment_keys_arrive(sbxc_task: Task, sbxc_settings: Settings) -> None:
    env = _host_environ(sbxc_task)
    extra = sorted(set(env) - set(sbxc_settings.profile.environment.allow or ()))
    assert not extra, f"keys outside the allowlist arrived: {extra}"


@witness("environment")
def test_the_launchers_secret_does_not_reach_the_task(sbxc_task: Task) -> None:
    env = _host_environ(sbxc_task)
    key, secret = sbxc_task.host.secret_key, sbxc_task.host.secret_value
    assert key not in env, f"{key} reached the task"
    # Under any name: a launcher that renames it, or passes it as an allowlisted key's value.
    carriers = sorted(k for k, v in env.items() if secret in v or secret in k)
    assert not carriers, f"the launcher's secret value reached the task in {carriers}"


@witness("environment_set")
def test_the_environment_set_by_the_profile_is_exactly_that(sbxc_task: Task, sbxc_settings: Settings) -> None:
    wanted = {k: expand(v, sbxc_task.values) for k, v in sbxc_settings.profile.environment.set.items()}
    env = _host_environ(sbxc_task)
    wrong = {k: env.get(k) for k, v in wanted.items() if env.get(k) != v}
    assert not wrong, f"environment values differ from the profile's [environment.set]: {wrong}"
