"""Grafana dashboards for the shadow service, built from code and provisioned over HTTP.

The dashboards are written with grafana-foundation-sdk builders so a panel is reviewed as
code, and exported to `dashboards/*.json` so the committed JSON is never edited by hand
(`tests/test_dashboards.py` rebuilds it and compares). Every query uses only the metric
names of `shadow/service/metrics.py`, every panel reads the `${datasource}` variable, and
`provision` pushes the same models into a Grafana folder with grafana-client.

`panels` holds what the dashboards share, one module each builds a dashboard
(`overview`, `per_worker`, `decisions`, `integrity`), `catalog` turns them into the
committed JSON, and `provisioning` talks to Grafana.
"""

from shadow.dashboards.catalog import (
    BUILDERS,
    build_dashboards,
    export,
    iter_panels,
    promql_expressions,
    render,
)
from shadow.dashboards.panels import DATASOURCE, TAG
from shadow.dashboards.provisioning import (
    DATASOURCE_NAME,
    DEFAULT_FOLDER,
    ProvisionError,
    provision,
)

__all__ = [
    "BUILDERS",
    "DATASOURCE",
    "DATASOURCE_NAME",
    "DEFAULT_FOLDER",
    "TAG",
    "ProvisionError",
    "build_dashboards",
    "export",
    "iter_panels",
    "promql_expressions",
    "provision",
    "render",
]
