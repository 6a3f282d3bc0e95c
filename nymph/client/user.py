"""The user routes of the queue API (:class:`UserClient`): providers, modes, secrets,
launches, instances, stops, logs, results, probes, tasks and daemons, one typed async method
per route (see ``nymph/queue/openapi.yaml``). The ``list_*`` methods return the whole list,
following its pages; the ``*_page`` methods (:mod:`nymph.client.paging`) return one page.

Failures raise :class:`nymph.client.errors.QueueError` subclasses carrying the HTTP status and
the server's ``detail``. Following a log (:mod:`nymph.client.logs`) and downloading result files
(:mod:`nymph.client.results`) go through the paths named here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from nymph.client.paging import Paging
from nymph.client.transport import seg
from nymph.protocol import DaemonJSON, InstanceJSON, LaunchAccepted, TaskStatusJSON


class UserClient(Paging):
    """The user routes, in the client's control-plane namespace unless a call names another."""

    # --- providers and modes --------------------------------------------------------------

    async def create_provider(
        self,
        *,
        name: str,
        kwargs: Mapping[str, Any],
        launcher: str = "Kube",
        dispatch: str | None = None,
        replace: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Create (or with ``replace``, replace) a provider; ``dispatch=None`` takes the queue's
        default (``direct``)."""
        body: dict[str, Any] = {"name": name, "launcher": launcher, "kwargs": dict(kwargs)}
        if dispatch is not None:
            body["dispatch"] = dispatch
        if replace:
            path = f"{self._ns(namespace)}/providers/{seg(name)}"
            return cast(dict[str, Any], await self.request("PUT", path, json=body))
        return cast(dict[str, Any], await self.request("POST", f"{self._ns(namespace)}/providers", json=body))

    async def list_providers(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        return await self.every(f"{self._ns(namespace)}/providers")

    async def get_provider(self, *, name: str, namespace: str | None = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/providers/{seg(name)}"))

    async def delete_provider(self, *, name: str, namespace: str | None = None) -> None:
        await self.request("DELETE", f"{self._ns(namespace)}/providers/{seg(name)}")

    # quotas (setting one, or listing every namespace's, takes an admin token)

    async def get_quota(self, *, namespace: str | None = None) -> dict[str, Any]:
        """A namespace's scheduling settings and what its running launches hold now."""
        return cast(dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/quota"))

    async def set_quota(self, settings: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Change a namespace's settings: keys left out stay, ``None`` removes a limit."""
        return cast(
            dict[str, Any], await self.request("PUT", f"{self._ns(namespace)}/quota", json=dict(settings))
        )

    async def list_quotas(self) -> list[dict[str, Any]]:
        answer = cast(dict[str, Any], await self.request("GET", "/v1/quotas"))
        return list(answer["items"])

    async def create_mode(
        self,
        *,
        name: str,
        provider: str | None,
        fields: Mapping[str, Any],
        replace: bool = False,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        body = {"name": name, "provider": provider, "fields": dict(fields)}
        if replace:
            path = f"{self._ns(namespace)}/modes/{seg(name)}"
            return cast(dict[str, Any], await self.request("PUT", path, json=body))
        return cast(dict[str, Any], await self.request("POST", f"{self._ns(namespace)}/modes", json=body))

    async def list_modes(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        return await self.every(f"{self._ns(namespace)}/modes")

    async def get_mode(self, *, name: str, namespace: str | None = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/modes/{seg(name)}"))

    async def delete_mode(self, *, name: str, namespace: str | None = None) -> None:
        await self.request("DELETE", f"{self._ns(namespace)}/modes/{seg(name)}")

    # --- secrets --------------------------------------------------------------------------

    def _secrets(self, namespace: str | None, name: str | None = None) -> str:
        base = f"{self._ns(namespace)}/secrets"
        return base if name is None else f"{base}/{seg(name)}"

    async def set_secret(self, *, name: str, value: str, namespace: str | None = None) -> None:
        """Store (or replace) secret ``name``; the queue keeps it encrypted and never answers it back."""
        await self.request("PUT", self._secrets(namespace, name), json={"value": value})

    async def list_secrets(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        """Names and dates only (every page; one page: :meth:`secrets_page`)."""
        return await self.every(self._secrets(namespace))

    async def delete_secret(self, *, name: str, namespace: str | None = None) -> None:
        await self.request("DELETE", self._secrets(namespace, name))

    # --- launches and instances -----------------------------------------------------------

    async def launch(
        self,
        *,
        provider: str,
        mode: str,
        script: str,
        tags: Mapping[str, Any] | None = None,
        env: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        retries: int = 0,
        namespace: str | None = None,
        priority: int | None = None,
    ) -> LaunchAccepted:
        """Queue a launch (``priority``: this launch's, over the mode's). With an
        ``idempotency_key``, ``retries`` re-sends it after a lost answer."""
        body: dict[str, Any] = {"mode": mode, "script": script}
        for key, value in (("tags", tags), ("env", env), ("fields", fields)):
            if value:
                body[key] = dict(value)
        if priority is not None:
            body["priority"] = priority
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/launch"
        return cast(
            LaunchAccepted, await self.send_once(path, body, idempotency_key=idempotency_key, retries=retries)
        )

    async def launch_dockyard(
        self,
        *,
        provider: str,
        recipe: Mapping[str, Any],
        infra: Mapping[str, Any] | None = None,
        overrides: Sequence[str] = (),
        idempotency_key: str | None = None,
        retries: int = 0,
        namespace: str | None = None,
    ) -> LaunchAccepted:
        """Queue a dockyard launch (recipe + infra, rendered and applied by a daemon). With an
        ``idempotency_key``, ``retries`` re-sends it after a lost answer."""
        body: dict[str, Any] = {"recipe": dict(recipe)}
        if infra:
            body["infra"] = dict(infra)
        if overrides:
            body["overrides"] = list(overrides)
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/dockyard"
        return cast(
            LaunchAccepted, await self.send_once(path, body, idempotency_key=idempotency_key, retries=retries)
        )

    async def launch_group(
        self,
        *,
        provider: str,
        body: Mapping[str, Any],
        idempotency_key: str | None = None,
        retries: int = 0,
        namespace: str | None = None,
    ) -> dict[str, Any]:
        """Queue a launch group (``{"mode", "script", "count"}`` or ``{"items": [...]}``, see
        :mod:`nymph.launch.groups`): ``{groupId, total, instances}``."""
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/launches"
        return cast(
            dict[str, Any],
            await self.send_once(path, dict(body), idempotency_key=idempotency_key, retries=retries),
        )

    async def get_group(self, *, group_id: str, namespace: str | None = None) -> dict[str, Any]:
        """The group with its members counted by state and reason."""
        return cast(
            dict[str, Any], await self.request("GET", f"{self._ns(namespace)}/groups/{seg(group_id)}")
        )

    async def group_instances(self, *, group_id: str, namespace: str | None = None) -> list[InstanceJSON]:
        """Every instance of the group, by place in it, then attempt."""
        return cast(
            list[InstanceJSON], await self.every(f"{self._ns(namespace)}/groups/{seg(group_id)}/instances")
        )

    async def stop_group(self, *, group_id: str, namespace: str | None = None) -> None:
        await self.request("DELETE", f"{self._ns(namespace)}/groups/{seg(group_id)}")

    async def list_instances(
        self, *, provider: str, state: str | None = None, namespace: str | None = None
    ) -> list[InstanceJSON]:
        """Every instance of the provider, oldest first (one page: :meth:`instances_page`)."""
        params = {"state": state} if state else None
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/instances"
        return cast(list[InstanceJSON], await self.every(path, params=params))

    async def get_instance(
        self,
        *,
        provider: str,
        instance_id: str,
        after: int | None = None,
        wait: float | None = None,
        namespace: str | None = None,
    ) -> InstanceJSON:
        """The instance; with ``after`` and ``wait``, held until its version exceeds ``after``."""
        params: dict[str, str] = {}
        if after is not None:
            params["after"] = str(after)
        if wait is not None:
            params["wait"] = f"{wait:g}"
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/instances/{seg(instance_id)}"
        timeout = self.timeout + (wait or 0.0)
        return cast(InstanceJSON, await self.request("GET", path, params=params or None, timeout=timeout))

    async def stop(
        self,
        *,
        provider: str,
        instance_id: str,
        grace_period_seconds: int | None = None,
        namespace: str | None = None,
    ) -> None:
        params = None if grace_period_seconds is None else {"gracePeriodSeconds": str(grace_period_seconds)}
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/instances/{seg(instance_id)}"
        await self.request("DELETE", path, params=params)

    def logs_path(self, *, provider: str, instance_id: str, namespace: str | None = None) -> str:
        return f"{self._ns(namespace)}/providers/{seg(provider)}/instances/{seg(instance_id)}/logs"

    async def get_logs(self, *, provider: str, instance_id: str, namespace: str | None = None) -> str | None:
        body = await self.request(
            "GET", self.logs_path(provider=provider, instance_id=instance_id, namespace=namespace)
        )
        logs = body.get("logs")
        return None if logs is None else str(logs)

    def results_path(
        self, *, provider: str, instance_id: str, path: str | None = None, namespace: str | None = None
    ) -> str:
        """The route of an instance's result files, or with ``path`` of one of them."""
        base = f"{self._ns(namespace)}/providers/{seg(provider)}/instances/{seg(instance_id)}/results"
        return base if path is None else base + "/" + "/".join(seg(p) for p in path.split("/"))

    async def test_provider(
        self, *, provider: str, mode: str | None = None, namespace: str | None = None
    ) -> str:
        """Queue a probe task; returns its task id (poll it with :meth:`get_task`)."""
        body = {"mode": mode} if mode else {}
        path = f"{self._ns(namespace)}/providers/{seg(provider)}/test"
        return str((await self.request("POST", path, json=body))["taskId"])

    async def get_task(self, *, task_id: str, namespace: str | None = None) -> TaskStatusJSON:
        return cast(TaskStatusJSON, await self.request("GET", f"{self._ns(namespace)}/tasks/{seg(task_id)}"))

    async def list_daemons(self, *, namespace: str | None = None) -> list[DaemonJSON]:
        return cast(list[DaemonJSON], await self.every(f"{self._ns(namespace)}/daemons"))
