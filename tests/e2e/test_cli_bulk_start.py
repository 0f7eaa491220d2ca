"""`pgflow-gen start FLOW --inputs FILE` against the real engine: one run per JSON line, every
line checked before anything starts, idempotency keys from line numbers, and a resume hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.harness import Db, run_cli


def jsonl(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def runs(db: Db) -> list[tuple[str, str | None]]:
    rows = db.conn.execute(
        "select input ->> 'name', idempotency_key from pgflow.runs order by input ->> 'name'"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def test_each_line_starts_a_run(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}', "", '{"name": "Grace"}', '{"name": "Linus"}')

    code, out, err = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path, "--chunk", "2")

    assert (code, err) == (0, "")
    assert out.startswith("started 3 runs of e2ePlain from 3 lines in ")
    assert runs(plain) == [("Ada", None), ("Grace", None), ("Linus", None)]
    queued = plain.conn.execute("select count(*) from pgmq.q_e2eplain").fetchone()
    assert queued == (3,)


def test_a_key_prefix_makes_starting_the_file_again_start_only_what_is_missing(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = jsonl(tmp_path, '{"name": "Ada"}', '{"name": "Grace"}')
    code, _, _ = run_cli(
        capsys, db_url, "start", "e2ePlain", "--inputs", first, "--key-prefix", "b1"
    )
    assert code == 0
    more = jsonl(tmp_path, '{"name": "Ada"}', '{"name": "Grace"}', '{"name": "Linus"}')

    code, out, _ = run_cli(
        capsys, db_url, "start", "e2ePlain", "--inputs", more, "--key-prefix", "b1",
        "--format", "json",
    )  # fmt: skip

    assert code == 0
    document = json.loads(out)
    assert (document["started"], document["existing"]) == (1, 2)
    assert [(r["line"], r["created"]) for r in document["runs"]] == [
        (1, False),
        (2, False),
        (3, True),
    ]
    assert runs(plain) == [("Ada", "b1:1"), ("Grace", "b1:2"), ("Linus", "b1:3")]


def test_bad_lines_are_listed_with_their_numbers_and_nothing_starts(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}', '{"name": 7}', "not json", '{"name": "Linus"}')
    code, out, err = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path)
    assert (code, out) == (2, "")
    assert "1 line is not JSON; nothing was started" in err
    assert "line 3: Expecting value (column 1)" in err

    path = jsonl(tmp_path, '{"name": "Ada"}', '{"name": 7}', "{}")
    code, out, err = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path)
    assert (code, out) == (2, "")
    assert "2 of 3 inputs do not fit flow e2ePlain; nothing was started" in err
    assert "line 2: " in err
    assert "line 3: " in err
    assert "Traceback" not in err
    assert runs(plain) == []


def test_skip_resumes_after_the_lines_already_started(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}', '{"name": "Grace"}', '{"name": "Linus"}')
    code, out, _ = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path, "--skip", "2")
    assert code == 0
    assert out.startswith("started 1 run of e2ePlain from 1 line (skipped the first 2")
    assert runs(plain) == [("Linus", None)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--input", '{"name": "Ada"}'], "--input starts one run; --inputs starts one per line"),
        (["--wait"], "--wait starts one run"),
        (["--chunk", "0"], "--chunk must be at least 1"),
    ],
)
def test_options_that_do_not_go_with_inputs_are_refused(
    plain: Db,
    db_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}')
    code, out, err = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path, *extra)
    assert (code, out) == (2, "")
    assert message in err
    assert runs(plain) == []


def test_a_missing_file_is_one_line_of_error(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, db_url, "start", "e2ePlain", "--inputs", str(tmp_path / "none.jsonl")
    )
    assert (code, out) == (1, "")
    assert err.startswith("error: No such file or directory: ")
    assert len(err.splitlines()) == 1


def test_priority_goes_with_one_run_and_with_a_file_of_runs(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}', '{"name": "Grace"}')
    code, _, err = run_cli(capsys, db_url, "start", "e2ePlain", "--inputs", path, "--priority", "4")
    assert (code, err) == (0, "")
    code, _, err = run_cli(
        capsys, db_url, "start", "e2ePlain", "--input", '{"name": "Linus"}', "--priority", "9"
    )
    assert (code, err) == (0, "")
    rows = plain.conn.execute(
        "select input ->> 'name', priority, run_id from pgflow.runs order by input ->> 'name'"
    ).fetchall()
    assert [tuple(r[:2]) for r in rows] == [("Ada", 4), ("Grace", 4), ("Linus", 9)]
    linus = str(rows[2][2])
    code, out, _ = run_cli(capsys, db_url, "status", linus)
    assert code == 0
    assert "\npriority: 9\n" in out
    code, out, _ = run_cli(capsys, db_url, "status", linus, "--format", "json")
    assert json.loads(out)["run"]["priority"] == 9


def test_a_priority_out_of_range_starts_nothing_and_says_why(
    plain: Db, db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path, '{"name": "Ada"}')
    for extra in (["--inputs", path], ["--input", '{"name": "Ada"}']):
        code, out, err = run_cli(capsys, db_url, "start", "e2ePlain", *extra, "--priority", "1001")
        assert (code, out) == (2, "")
        assert err.startswith(
            "error: A run's priority must be a whole number from 0 to 1000, got 1001.\n"
        )
        assert "HINT: 0 is the default and the lowest" in err
        assert "Traceback" not in err
    assert runs(plain) == []
