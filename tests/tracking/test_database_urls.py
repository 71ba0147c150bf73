"""PostgreSQL and MySQL URLs: the installed driver named where SQLAlchemy's default is missing, the password masked,
one line for a missing driver or a database that does not answer (no server needed: tests/end_to_end/test_postgres.py
runs them against a real PostgreSQL)."""

from __future__ import annotations

import sys
from urllib.parse import quote

import pytest

from recipes.tracking import database_urls
from recipes.tracking.database_urls import (
    DatabaseUnavailable,
    check_database,
    credentials_problem,
    is_database_url,
    masked_url,
    usable_database_url,
    with_installed_driver,
)
from recipes.tracking.hidden_passwords import hide_passwords, password_forms, remember_password
from tests.postgres_server import free_port


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://bob:s3cret@db.example:5432/optuna", "postgresql://bob:***@db.example:5432/optuna"),
    ("postgresql+psycopg://bob:p%40ss@db/mlflow", "postgresql+psycopg://bob:***@db/mlflow"),
    ("mysql://bob@db/mlflow", "mysql://bob@db/mlflow"),
    ("sqlite:////tmp/x/optuna.db", "sqlite:////tmp/x/optuna.db"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
])
def test_the_password_is_masked_and_nothing_else_changes(url, shown):
    assert masked_url(url) == shown


def test_only_postgresql_and_mysql_urls_are_database_urls():
    assert is_database_url("postgresql://u@h/d") and is_database_url("postgresql+psycopg2://u@h/d")
    assert is_database_url("postgres://u@h/d") and is_database_url("mysql+pymysql://u@h/d")
    assert not any(map(is_database_url, ["sqlite:///x.db", "http://h:5000", "file:///tmp/mlruns", "databricks"]))


def test_a_url_without_driver_names_the_installed_one_where_sqlalchemys_default_is_missing(monkeypatch):
    # SQLAlchemy 2.0 uses psycopg2 for postgresql:// and mysqlclient for mysql://; loopwise's extras bring psycopg 3
    # and PyMySQL
    defaults = {"postgresql": "psycopg2", "mysql": "mysqldb"}
    monkeypatch.setattr(database_urls, "default_driver", defaults.__getitem__)
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # not installed
    monkeypatch.setitem(sys.modules, "MySQLdb", None)
    assert with_installed_driver("postgresql://u:pw@h:5432/db") == "postgresql+psycopg://u:pw@h:5432/db"
    assert with_installed_driver("postgres://u:pw@h/db") == "postgresql+psycopg://u:pw@h/db"
    assert with_installed_driver("mysql://u:pw@h/db") == "mysql+pymysql://u:pw@h/db"
    # a URL that names its driver, SQLite and servers are used as written
    for url in ("postgresql+psycopg2://u@h/db", "sqlite:///x.db", "http://127.0.0.1:5000"):
        assert with_installed_driver(url) == url


def test_a_url_whose_default_driver_is_installed_is_left_alone():
    installed = database_urls.default_driver("postgresql")  # psycopg under SQLAlchemy 2.1, with loopwise[postgres]
    if database_urls.driver_error("postgresql", installed) is not None:
        pytest.skip(f"SQLAlchemy's default PostgreSQL driver {installed} is not installed")
    assert with_installed_driver("postgresql://u:pw@h/db") == "postgresql://u:pw@h/db"


def test_no_driver_installed_is_one_line_saying_which_extra_to_install(monkeypatch):
    for module in ("psycopg", "psycopg2", "pg8000"):
        monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(DatabaseUnavailable) as err:
        usable_database_url("postgresql://bob:s3cret@127.0.0.1:5432/optuna", "sweep storage")
    text = str(err.value)
    assert "\n" not in text and "s3cret" not in text
    assert text.startswith("the sweep storage postgresql://bob:***@127.0.0.1:5432/optuna needs a database driver")
    assert "pip install 'loopwise[postgres]'" in text


def test_a_driver_the_url_names_that_is_not_installed_is_one_line():
    with pytest.raises(DatabaseUnavailable, match=r"postgresql\+nosuchdriver://bob:\*\*\*@h/db needs a database "
                       r"driver that is not installed .*SQLAlchemy knows no driver 'nosuchdriver'"):
        check_database("postgresql+nosuchdriver://bob:pw@h/db")


def test_a_port_where_nothing_listens_is_one_line_within_seconds():
    pytest.importorskip("psycopg")
    port = free_port()
    with pytest.raises(DatabaseUnavailable) as err:
        check_database(f"postgresql://bob:s3cret@127.0.0.1:{port}/optuna", "tracking store")
    assert str(err.value) == (
        f"the tracking store postgresql://bob:***@127.0.0.1:{port}/optuna does not answer (Connection refused): start "
        "the database server, or fix the host and port in the URL"
    )


def test_mysql_on_a_port_where_nothing_listens_is_one_line():
    pytest.importorskip("pymysql")
    port = free_port()
    url = with_installed_driver(f"mysql://bob:s3cret@127.0.0.1:{port}/optuna")
    with pytest.raises(DatabaseUnavailable) as err:
        check_database(url, "sweep storage", shown=f"mysql://bob:s3cret@127.0.0.1:{port}/optuna")
    text = str(err.value)
    assert text.startswith(f"the sweep storage mysql://bob:***@127.0.0.1:{port}/optuna does not answer (")
    assert "Connection refused" in text and "\n" not in text and "s3cret" not in text


PASSWORD = "Zq9/x#y?w@Secret"  # as pasted from a password manager
SLASHED = "Zq9/Secret/x"  # a raw '/' only: SQLAlchemy reads it, urllib does not


def test_the_masked_forms_of_urls():
    encoded = quote(PASSWORD, safe="")
    assert masked_url(f"postgresql://team:{encoded}@db.example:5432/mlflow") == \
        "postgresql://team:***@db.example:5432/mlflow"
    assert masked_url(f"postgresql+psycopg://team:{SLASHED}@db:5432/m") == "postgresql+psycopg://team:***@db:5432/m"
    assert masked_url(f"mysql+pymysql://team:{encoded}@db/m?charset=utf8mb4") == \
        "mysql+pymysql://team:***@db/m?charset=utf8mb4"
    assert masked_url(f"https://team:{encoded}@mlflow.example/path") == "https://team:***@mlflow.example/path"
    assert masked_url(f"postgresql://team:{PASSWORD}@db/m") == "postgresql://***@..."  # SQLAlchemy: team:***@Secret@db
    assert masked_url("sqlite:////tmp/mlflow.db") == "sqlite:////tmp/mlflow.db"
    assert masked_url("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert masked_url("http://token@127.0.0.1:5000") == "http://token@127.0.0.1:5000"  # a user, no password
    assert credentials_problem(f"postgresql://team:{PASSWORD}@db/m") == "more than one '@'"
    assert credentials_problem("postgresql://team:a#b@db/m") == "a raw '#' in it"
    assert credentials_problem("http://team:a/b?c@db/m") == "a raw '?' and '/' in it"
    assert credentials_problem(f"postgresql://team:{SLASHED}@db/m") is None
    assert credentials_problem("postgresql://db/m?sslmode=require") is None


def test_hidden_forms_of_a_password():
    assert password_forms(f"postgresql://team:{quote(PASSWORD, safe='')}@db/m") == {
        PASSWORD, quote(PASSWORD, safe="")}
    assert password_forms(f"postgresql://team:{PASSWORD}@db/m") >= {PASSWORD, "Secret"}  # after the raw '@' too
    assert password_forms("postgresql://team@db/m") == set() and password_forms("sqlite:///x.db") == set()
    remember_password("http://u:Tok3n-value@h")
    assert hide_passwords("failed for http://u:Tok3n-value@h: Tok3n-value") == "failed for http://u:***@h: ***"


def test_the_lines_about_a_server_mask_its_password():
    from recipes.tracking.catch_up import CatchUpResult, caught_up_message
    from recipes.tracking.failures import store_failure_message

    uri = f"http://team:{quote(PASSWORD, safe='')}@127.0.0.1:5000"
    lines = [caught_up_message(uri, CatchUpResult(away_s=3.0)),
             store_failure_message(uri, ConnectionError("Connection refused"), "j.jsonl", catches_up=True),
             store_failure_message(uri, ConnectionError("Connection refused"), "j.jsonl")]
    for line in lines:
        assert "http://team:***@127.0.0.1:5000" in line and "Zq9" not in line and "Secret" not in line, line
