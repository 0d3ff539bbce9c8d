"""Provisioning: push the dashboards into a Grafana folder with grafana-client, with an
optional Prometheus datasource preselected."""

from __future__ import annotations

import copy
import re
from typing import Any

from shadow.dashboards.catalog import build_dashboards

DATASOURCE_NAME = "shadow-prometheus"
DEFAULT_FOLDER = "balanceroute-shadow"


class ProvisionError(RuntimeError):
    """Provisioning failed for a reason a person can act on (the message says which)."""


def _folder_uid(title: str) -> str:
    """A stable folder uid from its title, so reruns find the folder they created."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")
    return slug or "balanceroute-shadow"


def _with_datasource(model: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    """Preselect the provisioned datasource in the `datasource` variable."""
    model = copy.deepcopy(model)
    for variable in model["templating"]["list"]:
        if variable["name"] == "datasource":
            variable["current"] = {"selected": True, "text": name, "value": uid}
    return model


def _grafana_api(url: str, token: str) -> Any:
    from grafana_client import GrafanaApi

    base = url.rstrip("/")
    if re.match(r"^https?://[^/]+/.+", base):
        base += "/"  # grafana-client appends "api" to the path prefix verbatim
    return GrafanaApi.from_url(base, credential=token, timeout=10.0)


def _find_folder(api: Any, title: str, uid: str) -> dict[str, Any] | None:
    hits = api.search.search_dashboards(query=title, type_="dash-folder")
    for hit in hits or []:
        if hit.get("uid") == uid or hit.get("title") == title:
            return {"uid": hit["uid"], "title": hit.get("title", title)}
    return None


def _ensure_folder(api: Any, title: str) -> dict[str, Any]:
    from grafana_client.client import GrafanaClientError

    uid = _folder_uid(title)
    found = _find_folder(api, title, uid)
    if found is not None:
        return found | {"action": "reused"}
    try:
        created = api.folder.create_folder(title, uid=uid)
    except GrafanaClientError as error:
        if error.status_code not in (409, 412):  # created concurrently: look again
            raise
        found = _find_folder(api, title, uid)
        if found is None:
            raise
        return found | {"action": "reused"}
    return {"uid": created["uid"], "title": created.get("title", title), "action": "created"}


def _ensure_datasource(api: Any, url: str) -> dict[str, Any]:
    from grafana_client.client import GrafanaClientError

    wanted = {"type": "prometheus", "access": "proxy", "url": url}
    try:
        existing = api.datasource.get_datasource_by_name(DATASOURCE_NAME)
    except GrafanaClientError as error:
        if error.status_code != 404:
            raise
        existing = None
    if existing is None:
        body = {
            "name": DATASOURCE_NAME,
            "uid": DATASOURCE_NAME,
            "isDefault": False,
            "jsonData": {"httpMethod": "POST"},
        } | wanted
        created = api.datasource.create_datasource(body)
        source = created.get("datasource", {})
        return {
            "name": DATASOURCE_NAME,
            "uid": source.get("uid", DATASOURCE_NAME),
            "url": url,
            "action": "created",
        }
    uid = existing.get("uid", DATASOURCE_NAME)
    if all(existing.get(key) == value for key, value in wanted.items()):
        return {"name": DATASOURCE_NAME, "uid": uid, "url": url, "action": "unchanged"}
    keep = (
        "name",
        "uid",
        "type",
        "access",
        "url",
        "isDefault",
        "jsonData",
        "basicAuth",
        "basicAuthUser",
        "withCredentials",
        "version",
    )
    body = {key: existing[key] for key in keep if key in existing} | wanted
    api.datasource.update_datasource_by_uid(uid, body)
    return {"name": DATASOURCE_NAME, "uid": uid, "url": url, "action": "updated"}


def provision(
    url: str,
    token: str,
    *,
    folder: str = DEFAULT_FOLDER,
    datasource_url: str | None = None,
) -> dict[str, Any]:
    """Push the dashboards into Grafana at `url`; safe to rerun (folder and datasource are
    reused, dashboards overwritten by uid). With `datasource_url`, a Prometheus datasource
    named `shadow-prometheus` is created or pointed there and preselected in the dashboards.

    Returns what was done: `{"grafana", "folder", "datasource", "dashboards"}`; raises
    `ProvisionError` with a readable message on refused connections, bad tokens and
    Grafana errors.
    """
    import niquests
    from grafana_client.client import (
        GrafanaClientError,
        GrafanaException,
        GrafanaTimeoutError,
        GrafanaUnauthorizedError,
    )

    api = _grafana_api(url, token)
    try:
        folder_info = _ensure_folder(api, folder)
        source = None
        if datasource_url is not None:
            source = _ensure_datasource(api, datasource_url)
        results = []
        for _, model in sorted(build_dashboards().items()):
            if source is not None:
                model = _with_datasource(model, source["name"], source["uid"])
            answer = api.dashboard.update_dashboard(
                {
                    "dashboard": model,
                    "folderUid": folder_info["uid"],
                    "overwrite": True,
                    "message": "provisioned by `shadow dashboards provision`",
                }
            )
            version = answer.get("version")
            results.append(
                {
                    "uid": answer.get("uid", model["uid"]),
                    "title": model["title"],
                    "url": answer.get("url"),
                    "version": version,
                    "action": "created" if version == 1 else "updated",
                }
            )
    except GrafanaUnauthorizedError as error:
        raise ProvisionError(
            f"Grafana at {url} rejected the token (401 Unauthorized): check --token "
            "(a service account token with the Editor or Admin role)"
        ) from error
    except GrafanaTimeoutError as error:
        raise ProvisionError(f"Grafana at {url} did not answer in time: {error}") from error
    except GrafanaClientError as error:
        hint = " (the token lacks permission: Editor or Admin needed)"
        raise ProvisionError(
            f"Grafana at {url} refused a request: {error.message}"
            f"{hint if error.status_code == 403 else ''}"
        ) from error
    except GrafanaException as error:
        raise ProvisionError(f"Grafana at {url} failed: {error.message}") from error
    except niquests.exceptions.ConnectionError as error:
        raise ProvisionError(
            f"cannot connect to Grafana at {url} (connection refused or host unreachable)"
        ) from error
    except (niquests.exceptions.RequestException, ValueError) as error:
        raise ProvisionError(f"talking to Grafana at {url} failed: {error}") from error
    return {"grafana": url, "folder": folder_info, "datasource": source, "dashboards": results}
