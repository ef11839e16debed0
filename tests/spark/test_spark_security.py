"""The `ringlog` data source against a broker that requires TLS and SCRAM: the tls.* and sasl.*
options reach the driver and every executor (a write, a read, the group lag), a wrong password
fails the job saying which options to check, and the password never shows in a plan or a repr."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from broker.client import Admin, Security
from broker.spark import Broker, group_lag
from labkit.brokerproc import BrokerProcess
from labkit.securitylab import Pki, add_user

PASSWORD = "spark-secret-pw"


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, Pki]]:
    d = tmp_path_factory.mktemp("spark-secure")
    pki = Pki.make(d)
    add_user(d / "data", "etl", PASSWORD)
    flags = (*pki.serve_flags(), "--sasl-mechanisms", "SCRAM-SHA-512", "--super-users", "User:etl")
    b = BrokerProcess(d / "data", d / "broker.log", extra=flags).start()
    yield b, pki
    b.stop()


def options(broker: BrokerProcess, pki: Pki, password: str = PASSWORD) -> dict[str, str]:
    return {
        "bootstrap": broker.bootstrap,
        "tls.ca": str(pki.ca),
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "etl",
        "sasl.password": password,
    }


def test_write_read_and_lag_over_tls_and_scram(
    spark: SparkSession, secure: tuple[BrokerProcess, Pki]
) -> None:
    broker, pki = secure
    security = Security(
        tls=True, cafile=str(pki.ca), sasl_mechanism="SCRAM-SHA-512", username="etl", password=PASSWORD
    )
    with Admin(broker.bootstrap, security=security) as admin:
        admin.create_topic("secure-t", partitions=2)
    rows = [(f"v{i}".encode(), f"k{i}".encode()) for i in range(200)]
    df = spark.createDataFrame(rows, "value BINARY, key BINARY").repartition(2)
    df.write.format("ringlog").options(**options(broker, pki), topic="secure-t").mode("append").save()
    read = spark.read.format("ringlog").options(**options(broker, pki), topic="secure-t").load()
    assert sorted(r.value for r in read.select("value").collect()) == sorted(v for v, _ in rows)
    where = Broker(
        broker.bootstrap,
        tls_ca=str(pki.ca),
        tls=True,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="etl",
        sasl_password=PASSWORD,
    )
    assert group_lag(where, "secure-t", "nobody") == {0: None, 1: None}
    assert PASSWORD not in repr(where)


def test_a_wrong_password_fails_the_job_and_says_what_to_check(
    spark: SparkSession, secure: tuple[BrokerProcess, Pki]
) -> None:
    broker, pki = secure
    with pytest.raises(Exception, match="refused the login") as info:
        spark.read.format("ringlog").options(
            **options(broker, pki, "wrong"), topic="secure-t"
        ).load().collect()
    assert "sasl.password" in str(info.value)
    # without the TLS options the client cannot even connect (the broker serves TLS only)
    plain = {k: v for k, v in options(broker, pki).items() if not k.startswith("tls")}
    with pytest.raises(Exception, match="cannot reach the broker"):
        spark.read.format("ringlog").options(**plain, topic="secure-t").load().collect()
    assert PASSWORD not in broker.log() and "wrong" not in broker.log()


def test_options_that_do_not_go_together_fail_before_any_task() -> None:
    from broker.spark.source import broker_options

    with pytest.raises(Exception, match="needs a username"):
        broker_options({"bootstrap": "h:1", "sasl.mechanism": "SCRAM-SHA-512"})
    with pytest.raises(Exception, match="sasl_mechanism"):
        broker_options({"bootstrap": "h:1", "sasl.mechanism": "GSSAPI", "sasl.username": "u"})
    assert broker_options({"bootstrap": "h:1", "tls": "true"}).security() is not None
    assert broker_options({"bootstrap": "h:1"}).security() is None
