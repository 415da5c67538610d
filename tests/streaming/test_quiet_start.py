"""Which log4j configuration a local session's JVM starts with (`streaming.jobs.session`).

The session starts its JVM logging errors only, unless the user configures log4j: the
variable, a log4j option among the Java options, or a log4j2 file in Spark's configuration
directory. Spark ships a `log4j2.properties.template` there, which configures nothing. What
the terminal shows is asserted in tests/cli/test_first_hour.py.
"""

from __future__ import annotations

import os

import pytest

from streaming.jobs.session import LOG4J_ENV, _own_log4j, _quiet_start

# What a user's environment may configure log4j with, cleared for each test.
USER_ENV = (
    LOG4J_ENV,
    "PYSPARK_SUBMIT_ARGS",
    "SPARK_SUBMIT_OPTS",
    "JAVA_TOOL_OPTIONS",
    "SPARK_HOME",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in USER_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    return tmp_path


def test_no_user_configuration_starts_quiet_for_that_launch_only(clean_env):
    assert not _own_log4j({})
    with _quiet_start({}):
        path = os.environ[LOG4J_ENV]
        assert "rootLogger.level = error" in open(path).read()
    assert LOG4J_ENV not in os.environ


def test_spark_shipped_template_is_not_a_user_configuration(clean_env):
    (clean_env / "log4j2.properties.template").write_text("rootLogger.level = info\n")
    assert not _own_log4j({})


@pytest.mark.parametrize(
    "given",
    [
        "file",
        "defaults",
        "java-options",
        "submit-args",
        "variable",
    ],
)
def test_a_user_configuration_is_left_alone(clean_env, monkeypatch, given):
    settings: dict[str, str] = {}
    if given == "file":
        (clean_env / "log4j2.properties").write_text("rootLogger.level = info\n")
    elif given == "defaults":
        (clean_env / "spark-defaults.conf").write_text(
            "spark.driver.extraJavaOptions -Dlog4j2.configurationFile=/etc/spark/log4j2.xml\n"
        )
    elif given == "java-options":
        settings["spark.driver.extraJavaOptions"] = "-Dlog4j2.configurationFile=/x.properties"
    elif given == "submit-args":
        monkeypatch.setenv(
            "PYSPARK_SUBMIT_ARGS", "--driver-java-options -Dlog4j2.debug pyspark-shell"
        )
    else:
        monkeypatch.setenv(LOG4J_ENV, "/etc/spark/log4j2.xml")
    assert _own_log4j(settings)
    with _quiet_start(settings):
        assert os.environ.get(LOG4J_ENV) in (None, "/etc/spark/log4j2.xml")
