"""The librdkafka suite harness's pure parts (labkit/rdkafka_suite.py): reading the suite's table of
tests, planning one process per test, and reading a test-runner's output and report. The texts are
in the shapes librdkafka 2.0.2's tests/test.c writes them."""

from __future__ import annotations

import pytest

from labkit.rdkafka_suite import (
    EXCLUDED,
    Invocation,
    SuiteTest,
    broker_errors,
    failure_reasons,
    outcomes_of,
    parse_test_table,
    plan,
    skip_reasons,
    summary_line,
)

TABLE = """
static int x;
struct test tests[] = {
    /* Special MAIN test to hold over-all timings, etc. */
    {.name = "<MAIN>", .flags = TEST_F_LOCAL},
    _TEST(0000_unittests,
          TEST_F_LOCAL,
          _THRES(.ucpu = 100.0, .scpu = 20.0, .rss = 900.0)),
    _TEST(0001_multiobj, 0),
    _TEST(0022_consume_batch, 0),
    _TEST(0022_consume_batch_local, TEST_F_LOCAL),
    _TEST(0028_long_topicnames,
          TEST_F_KNOWN_ISSUE,
          TEST_BRKVER(0, 9, 0, 0),
          .extra = "https://github.com/edenhill/librdkafka/issues/529"),
    _TEST(0045_subscribe_update, 0, TEST_BRKVER(0, 9, 0, 0)),
    _TEST(0045_subscribe_update_topic_remove,
          0,
          TEST_BRKVER(0, 9, 0, 0),
          .scenario = "noautocreate"),
#if WITH_SOCKEM
    _TEST(0049_consume_conn_close, TEST_F_SOCKEM, TEST_BRKVER(0, 9, 0, 0)),
#endif
    _TEST(0066_plugins,
          TEST_F_LOCAL | TEST_F_KNOWN_ISSUE_WIN32 | TEST_F_KNOWN_ISSUE_OSX,
          .extra =
              "dynamic loading of tests might not be fixed for this platform"),
    _TEST(0103_transactions,
          0,
          TEST_BRKVER(0, 11, 0, 0),
          .scenario = "default,ak23"),
    _TEST(0107_topic_recreate,
          0,
          TEST_BRKVER_TOPIC_ADMINAPI,
          .scenario = "noautocreate"),

    /* Manual tests */
    _TEST(8000_idle, TEST_F_MANUAL),

    {NULL}};
"""


def test_the_table_is_read_with_flags_and_scenarios() -> None:
    tests = {t.name: t for t in parse_test_table(TABLE)}
    assert list(tests)[:3] == ["0000_unittests", "0001_multiobj", "0022_consume_batch"]
    assert len(tests) == 12
    assert tests["0001_multiobj"].flags == frozenset()
    assert tests["0066_plugins"].flags == {
        "TEST_F_LOCAL",
        "TEST_F_KNOWN_ISSUE_WIN32",
        "TEST_F_KNOWN_ISSUE_OSX",
    }
    assert tests["0049_consume_conn_close"].flags == {"TEST_F_SOCKEM"}
    assert tests["0103_transactions"].scenarios == ("default", "ak23")
    assert tests["0103_transactions"].scenario == "default"
    assert tests["0107_topic_recreate"].scenario == "noautocreate"
    assert not tests["0000_unittests"].needs_broker
    assert not tests["8000_idle"].needs_broker
    assert tests["0049_consume_conn_close"].needs_broker
    assert tests["0022_consume_batch_local"].number == "0022"


def test_the_plan_runs_each_broker_test_alone_and_lists_the_excluded() -> None:
    invocations, left_out = plan(parse_test_table(TABLE))
    ran = {(i.number, i.scenario): [t.name for t in i.tests] for i in invocations}
    assert ran == {
        ("0001", "default"): ["0001_multiobj"],
        ("0022", "default"): ["0022_consume_batch"],
        ("0045", "default"): ["0045_subscribe_update"],
        ("0049", "default"): ["0049_consume_conn_close"],
        ("0103", "default"): ["0103_transactions"],
        ("0107", "noautocreate"): ["0107_topic_recreate"],
    }
    assert [(t.name, why) for t, why in left_out] == [
        ("0028_long_topicnames", EXCLUDED["0028_long_topicnames"]),
        ("0045_subscribe_update_topic_remove", EXCLUDED["0045_subscribe_update_topic_remove"]),
    ]


def test_a_plan_for_named_tests_runs_an_excluded_one_only_when_named_in_full() -> None:
    table = parse_test_table(TABLE)
    invocations, left_out = plan(table, ["0045"])
    assert [t.name for i in invocations for t in i.tests] == ["0045_subscribe_update"]
    assert [t.name for t, _ in left_out] == ["0045_subscribe_update_topic_remove"]
    invocations, left_out = plan(table, ["0028_long_topicnames", "0001"])
    assert [t.name for i in invocations for t in i.tests] == ["0001_multiobj", "0028_long_topicnames"]
    assert left_out == []


def test_two_tests_that_one_process_would_run_together_are_refused() -> None:
    table = [SuiteTest("0200_a", frozenset()), SuiteTest("0200_b", frozenset())]
    with pytest.raises(ValueError, match="0200 runs 2 tests"):
        plan(table)


FAILED_OUTPUT = (
    '\x1b[0m\x1b[36m[0001_multiobj               /  0.000s] Using topic "rdkafkatest_0001"\n'
    "\x1b[0m\x1b[36m[0001_multiobj               / 60.177s] TEST FAILURE\n"
    '\x1b[0m\x1b[31m### Test "0001_multiobj" failed at 0001-multiobj.c:94:main_0001_multiobj() '
    "at Sun Nov 29 10:31:19 2026: ###\n"
    "full create-produce-destroy cycle: expected duration 0 <= 30059 <= 999 ms\n"
    '\x1b[31m### Test "<MAIN>" failed at test.c:1917:main() at Sun Nov 29 10:31:19 2026: ###\n'
    "1 test(s) failed, see previous errors\n"
)


def test_a_failure_is_read_as_file_line_and_message() -> None:
    assert failure_reasons(FAILED_OUTPUT) == {
        "0001_multiobj": "0001-multiobj.c:94: "
        "full create-produce-destroy cycle: expected duration 0 <= 30059 <= 999 ms",
        "<MAIN>": "test.c:1917: 1 test(s) failed, see previous errors",
    }


def test_a_subtest_failure_names_the_subtest_and_only_the_first_counts() -> None:
    output = (
        '### Test "0081_admin (do_test_CreatePartitions:1234: ...)" failed at 0081-admin.c:420:'
        "do_test_CreatePartitions() at Sun Nov 29 10:31:19 2026: ###\n"
        "Expected NO_ERROR, not Broker: Invalid request\n"
        '### Test "0081_admin" failed at 0081-admin.c:500:main() at Sun Nov 29 10:31:20 2026: ###\n'
        "second\n"
    )
    assert failure_reasons(output) == {
        "0081_admin": "[do_test_CreatePartitions:1234: ...] 0081-admin.c:420: "
        "Expected NO_ERROR, not Broker: Invalid request"
    }


def test_a_skip_is_read_from_its_warning() -> None:
    output = (
        "\x1b[33m[0097_ssl_verify             /  0.001s] WARN: SKIPPING TEST: "
        "Test requires SSL_* env-vars set up by trivup\n\x1b[0m"
    )
    assert skip_reasons(output) == {"0097_ssl_verify": "Test requires SSL_* env-vars set up by trivup"}


INV = Invocation("0001", "default", (SuiteTest("0001_multiobj", frozenset()),))


def report(state: str) -> dict:
    return {"tests": {"0001_multiobj": {"name": "0001_multiobj", "state": state, "duration": 60.2}}}


def test_outcomes_come_from_the_report_with_the_output_s_reason() -> None:
    (o,) = outcomes_of(INV, report("FAILED"), FAILED_OUTPUT, 61.0, "")
    assert (o.state, o.seconds) == ("failed", 61.0)
    assert o.reason.startswith("0001-multiobj.c:94: full create-produce-destroy")
    (o,) = outcomes_of(INV, report("PASSED"), "", 3.0, "")
    assert (o.state, o.reason) == ("passed", "")


def test_a_process_killed_or_without_a_report_fails_its_test_with_what_happened() -> None:
    output = "line one\n\x1b[36m[0001_multiobj / 9.0s] waiting\x1b[0m\n"
    (o,) = outcomes_of(INV, None, output, 600.0, "killed")
    assert o.state == "failed"
    assert o.reason == "killed; last line: [0001_multiobj / 9.0s] waiting"
    (o,) = outcomes_of(INV, report("PASSED"), FAILED_OUTPUT, 600.0, "killed")
    assert o.state == "failed"
    assert o.reason.startswith("killed; first failure 0001-multiobj.c:94:")
    (o,) = outcomes_of(INV, {"tests": {}}, "", 1.0, "")
    assert o.reason == "the runner wrote no result for it; last line: (no output)"


def test_broker_errors_are_one_line_each() -> None:
    log = (
        'ts=2026-11-29T10:29:53.510Z level=info pid=1 logger=x msg="fine"\n'
        "ts=2026-11-29T10:29:53.510Z level=error pid=1 core=0 logger=broker.kafka msg="
        '"Kafka request failed\\nTraceback (most recent call last):\\n  File \\"a.py\\"\\nKeyError: \'t\'"\n'
        'ts=2026-11-29T10:29:54.000Z level=error pid=1 logger=y msg="plain error"\n'
    )
    assert broker_errors(log) == ["Kafka request failed ... KeyError: 't'", "plain error"]


def test_the_summary_line_counts_each_state() -> None:
    (passed,) = outcomes_of(INV, report("PASSED"), "", 1.0, "")
    (failed,) = outcomes_of(INV, report("FAILED"), FAILED_OUTPUT, 1.0, "")
    (skipped,) = outcomes_of(INV, report("SKIPPED"), "", 1.0, "")
    assert summary_line([passed, failed, failed, skipped], 0) == "1 passed, 2 failed, 1 skipped of 4"
    assert summary_line([passed], 9) == "1 passed, 0 failed, 0 skipped of 1 (9 excluded)"


def test_a_timeout_says_what_the_test_said_last() -> None:
    output = (
        "\x1b[36m[0002_unkpart                /  9.069s] metadata(rdkafkatest_0002) returned Broker: "
        "Unknown topic or partition: retrying\n"
        "\x1b[0m\x1b[36m[<MAIN>                      / 10.0s] 1 test(s) running: 0002_unkpart\n"
        "\x1b[0m\x1b[36m[0002_unkpart                / 10.172s] # Test report written to r.json\n"
        "\x1b[0m\x1b[36m[0002_unkpart                / 10.172s] TEST FAILURE\n"
        '\x1b[0m\x1b[31m### Test "0002_unkpart" failed at test.c:1216:check_test_timeouts() at Sun Nov 29 '
        "10:42:05 2026: ###\nTest 0002_unkpart timed out (timeout set to 10 seconds)\n"
    )
    assert failure_reasons(output) == {
        "0002_unkpart": "test.c:1216: Test 0002_unkpart timed out (timeout set to 10 seconds); last said: "
        "metadata(rdkafkatest_0002) returned Broker: Unknown topic or partition: retrying"
    }
