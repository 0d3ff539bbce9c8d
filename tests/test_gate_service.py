"""`shadow gate --url` against a real `shadow serve` on recorded evidence, beside
`shadow gate --db` on a copy of the same database: the same verdict, exit code, JSON
bytes and text; tokens and their roles; an unreachable service; the report's schema in
OpenAPI; and the report as a CI log, a job summary and a JUnit file read it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import httpx
import jsonschema
import pytest
import xmlschema

from shadow.gate.render import COLUMNS
from shadow.world.process import REPO, free_port
from tests.service_helpers import Server

OPERATOR = "operator-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
INGEST = "ingest-token-0123456789abcdef"
JUNIT_XSD = Path(__file__).parent / "data" / "junit.xsd"
#: br0 PASSes on the recorded evidence, random FAILs (brh-survival is MARGINAL: its
#: imbalance gain reaches the A/A floor there; tests/test_gate_e2e.py)
CASES = [("br0", "PASS", 0), ("random", "FAIL", 1)]


def write_tokens(path: Path) -> Path:
    entries = [("sources", INGEST, "ingest"), ("pipeline", OPERATOR, "operator"),
               ("dashboards", READ, "read")]  # fmt: skip
    path.write_text("".join(
        f'[[tokens]]\nname = "{n}"\ntoken = "{t}"\nroles = ["{r}"]\n' for n, t, r in entries
    ))  # fmt: skip
    return path


def serve_copy(gate_evidence: Path, root: Path) -> Server:
    """The service on a copy of the evidence, named `shadow.duckdb` in `root/served` (the
    report names the database as given: a pipeline's copy has the same name)."""
    (root / "served").mkdir()
    shutil.copy(gate_evidence, root / "served" / "shadow.duckdb")
    config = write_tokens(root / "service.toml")
    return Server(Path("shadow.duckdb"), config, cwd=root / "served").start()


@pytest.fixture(scope="module")
def served(gate_evidence, tmp_path_factory):
    """The service on one copy of the evidence; `db_copy` makes others for `--db`."""
    root = tmp_path_factory.mktemp("gate-service")
    server = serve_copy(gate_evidence, root)
    yield server, root
    server.stop()


def shadow(*args: str, token: str | None = None, cwd: Path = REPO):
    """The CLI as a pipeline runs it: a subprocess, stdout a pipe, COLUMNS unset."""
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "SHADOW_TOKEN")}
    environ["PYTHONPATH"] = str(REPO)
    if token is not None:
        environ["SHADOW_TOKEN"] = token
    command = [sys.executable, "-m", "shadow.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=environ,
                          timeout=600)  # fmt: skip


def db_copy(gate_evidence: Path, root: Path, name: str) -> Path:
    """A copy of the evidence as `root/name/shadow.duckdb`."""
    (root / name).mkdir()
    shutil.copy(gate_evidence, root / name / "shadow.duckdb")
    return root / name / "shadow.duckdb"


@pytest.mark.parametrize(("candidate", "verdict", "code"), CASES)
def test_url_gives_the_same_verdict_exit_json_and_text_as_db(
    served, gate_evidence, candidate, verdict, code
):
    server, root = served
    copy = db_copy(gate_evidence, root, f"file-{candidate}")
    by_file = shadow("gate", "--db", "shadow.duckdb", "--candidate", candidate,
                     "--format", "text", "--json", str(root / f"db-{candidate}.json"),
                     cwd=copy.parent)  # fmt: skip
    by_url = shadow("gate", "--url", server.url, "--candidate", candidate, "--format", "text",
                    "--json", str(root / f"url-{candidate}.json"), token=OPERATOR)  # fmt: skip
    assert by_file.returncode == by_url.returncode == code, (by_file.stderr, by_url.stderr)
    file_bytes = (root / f"db-{candidate}.json").read_bytes()
    assert (root / f"url-{candidate}.json").read_bytes() == file_bytes
    assert by_url.stdout == by_file.stdout
    report = json.loads(file_bytes)
    assert report["verdict"] == verdict and report["dry_run"] is False
    # the service's own answer is the same document plus the recorded run's id and time
    with httpx.Client(base_url=server.url, timeout=600) as client:
        headers = {"authorization": f"Bearer {OPERATOR}"}
        answer = client.post("/v1/fleets/default/gate", json={"candidate": candidate},
                             headers=headers).json()  # fmt: skip
        run = client.get(f"/v1/gate/runs/{answer['id']}", headers=headers).json()
    assert run["ts"] == answer["ts"] and run["verdict"] == verdict
    stripped = {k: v for k, v in answer.items() if k not in ("id", "ts")}
    assert (json.dumps(stripped, indent=2, sort_keys=True) + "\n").encode() == file_bytes
    assert re.search(r"recorded as gate run \d+", by_url.stderr)


def test_a_dry_run_needs_read_a_recorded_run_operator(served):
    server, root = served
    missing = shadow("gate", "--url", server.url, "--candidate", "random")
    assert missing.returncode == 2
    assert "needs a bearer token with role 'operator'" in missing.stderr
    assert "--token-file" in missing.stderr  # the way to give one
    read_only = shadow("gate", "--url", server.url, "--candidate", "random", token=READ)
    assert read_only.returncode == 2 and "lacks role 'operator'" in read_only.stderr
    token_file = root / "read.token"
    token_file.write_text(f"{READ}\n")
    dry = shadow("gate", "--url", server.url, "--candidate", "random", "--dry-run",
                 "--token-file", str(token_file), "--format", "json")  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    document = json.loads(dry.stdout)
    assert document["verdict"] == "FAIL" and document["dry_run"] is True
    ingest = shadow("gate", "--url", server.url, "--candidate", "random", "--dry-run",
                    token=INGEST)  # fmt: skip
    assert ingest.returncode == 2 and "lacks role 'read'" in ingest.stderr
    for token in (OPERATOR, READ, INGEST):
        assert token not in missing.stderr + read_only.stderr + dry.stderr + ingest.stderr


def test_thresholds_and_explain_reach_the_service(served, gate_evidence, tmp_path):
    server, _ = served
    strict = tmp_path / "strict.toml"
    strict.write_text("throughput_ratio_ci_low_min = 1.2\n")
    copy = db_copy(gate_evidence, tmp_path, "strict")
    by_file = shadow("gate", "--db", "shadow.duckdb", "--candidate", "brh-survival",
                     "--dry-run", "--thresholds", str(strict), "--format", "json",
                     cwd=copy.parent)  # fmt: skip
    by_url = shadow("gate", "--url", server.url, "--candidate", "brh-survival", "--dry-run",
                    "--thresholds", str(strict), "--format", "json", token=READ)  # fmt: skip
    assert by_file.returncode == by_url.returncode == 0, (by_file.stderr, by_url.stderr)
    assert by_url.stdout == by_file.stdout
    assert json.loads(by_url.stdout)["thresholds"]["throughput_ratio_ci_low_min"] == 1.2
    assert json.loads(by_url.stdout)["verdict"] != "PASS"
    explained = shadow("gate", "--url", server.url, "--candidate", "brh-survival",
                       "--explain", "throughput_ratio", token=READ)  # fmt: skip
    local = shadow("gate", "--db", str(copy), "--candidate", "brh-survival",
                   "--explain", "throughput_ratio")  # fmt: skip
    assert explained.returncode == 0 and explained.stdout == local.stdout
    unknown = shadow("gate", "--url", server.url, "--candidate", "brh-survival",
                     "--explain", "nope", token=READ)  # fmt: skip
    assert unknown.returncode == 2 and "unknown metric 'nope'" in unknown.stderr


def test_an_unreachable_service_is_error_5_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}"
    result = shadow("gate", "--url", url, "--candidate", "random", token=OPERATOR)
    assert result.returncode == 5
    assert result.stderr.startswith("ERROR service unreachable: POST") and url in result.stderr
    assert "\n" not in result.stderr.rstrip("\n")  # one line, whole


def test_the_endpoint_and_its_report_schema_are_in_openapi(served):
    server, _ = served
    headers = {"authorization": f"Bearer {READ}"}
    with httpx.Client(base_url=server.url, timeout=600, headers=headers) as client:
        spec = client.get("/openapi.json").json()
        answer = client.get("/v1/fleets/default/gate", params={"candidate": "random"}).json()
        flagger = client.post("/v1/fleets/default/gate/flagger?candidate=random", json={})
        bad = client.get("/v1/fleets/default/gate", params={"candidate": "nope"})
    operation = spec["paths"]["/v1/fleets/{fleet}/gate"]["get"]
    ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/GateReportDocument")
    schema = {"$ref": ref, "components": spec["components"]}
    jsonschema.validate(answer, schema)  # the real answer is what the schema says
    jsonschema.validate(flagger.json(), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**answer, "verdict": "MAYBE"}, schema)
    assert answer["dry_run"] is True and flagger.status_code == 412
    assert bad.status_code == 422 and "candidate: unknown policy 'nope'" in bad.text
    assert "412" in spec["paths"]["/v1/fleets/{fleet}/gate/flagger"]["post"]["responses"]


# --------------------------------------------------------------------------- output


@pytest.fixture(scope="module")
def outputs(gate_evidence, tmp_path_factory):
    """Each format of one FAIL run (random), and its JSON, from the CLI in a pipe."""
    root = tmp_path_factory.mktemp("gate-formats")
    db = db_copy(gate_evidence, root, "formats")
    found = {}
    for fmt in (None, "text", "markdown", "junit"):
        args = ["gate", "--db", str(db), "--candidate", "random", "--dry-run"]
        result = shadow(*args, *(["--format", fmt] if fmt else []),
                        "--json", str(root / "report.json"))  # fmt: skip
        assert result.returncode == 0, result.stderr
        found[fmt] = result.stdout
    return found, json.loads((root / "report.json").read_text())


def test_the_text_report_never_splits_a_word_and_ends_with_the_deciding_rule(outputs):
    found, report = outputs
    text = found[None]
    assert text == found["text"]  # no terminal: the plain layout is the default
    lines = text.splitlines()
    assert lines[-1] == report["deciding_rule"]
    rows = report["rows"]
    assert len(rows) >= 8
    header = lines[1].split()
    assert header[:6] == ["metric", "role", "n", "incumbent", "candidate", "ratio"]
    for row in rows:
        mine = [line for line in lines if line.startswith(row["metric"] + " ")]
        assert len(mine) == 1, row["metric"]  # one line per metric
        line = mine[0]
        # the whole rule and margin on that line: nothing wrapped onto the next one
        assert line.endswith(" ".join(row["rule"].split())), line
        assert f" {row['margin']} " in line and f" {row['label']} " in line
    # every word of the document's sentences appears whole in the output
    words = {w for row in rows for w in row["rule"].split()} | set(report["deciding_rule"].split())
    tokens = set(text.split())
    assert words <= tokens, words - tokens
    expected = 2 + len(rows) + (1 + len(report["disagreements"]) if report["disagreements"]
                                else 0) + 1  # fmt: skip
    assert len(lines) == expected


def _md_cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [cell.strip().replace("\\|", "|").replace("\\\\", "\\") for cell in cells]


def test_the_markdown_is_a_table_with_one_row_per_rule(outputs):
    found, report = outputs
    lines = found["markdown"].splitlines()
    assert lines[0].startswith("### Gate: random vs jsq") and "**FAIL**" in lines[0]
    table = [line for line in lines if line.startswith("|")]
    assert _md_cells(table[0]) == list(COLUMNS)
    assert all(re.fullmatch(r"-{3,}", cell) for cell in _md_cells(table[1]))
    body = [_md_cells(line) for line in table[2:]]
    assert [cells[0] for cells in body] == [row["metric"] for row in report["rows"]]
    for cells, row in zip(body, report["rows"], strict=True):
        assert len(cells) == len(COLUMNS)
        assert cells[8] == row["label"] and cells[9] == " ".join(row["rule"].split())
    assert lines[-1] == f"**{report['deciding_rule']}**"


def test_the_junit_validates_and_lists_each_rule_fail_rules_as_failures(outputs):
    found, report = outputs
    xml = found["junit"]
    xmlschema.XMLSchema(str(JUNIT_XSD)).validate(xml)
    suite = ElementTree.fromstring(xml).find("testsuite")
    cases = suite.findall("testcase")
    assert [case.get("name") for case in cases] == [row["metric"] for row in report["rows"]]
    failed = {case.get("name") for case in cases if case.find("failure") is not None}
    assert failed == {row["metric"] for row in report["rows"] if row["label"] == "fail"}
    assert "tpot_p95_ratio" in failed  # random's TPOT P95 ratio: 1.12 [1.09, 1.14]
    assert int(suite.get("failures")) == len(failed)
    passed = {case.get("name") for case in cases if len(case) == 0}
    assert passed == {row["metric"] for row in report["rows"] if row["label"] == "pass"}
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert properties["verdict"] == "FAIL"
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        xmlschema.XMLSchema(str(JUNIT_XSD)).validate(xml.replace('tests="', 'tests="x', 1))
