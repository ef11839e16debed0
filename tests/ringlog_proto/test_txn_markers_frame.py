"""Our between-cores transaction messages (WRITE_TXN_MARKERS, FIND_HELD_TXNS): bodies read back as written."""

from __future__ import annotations

from ringlog_proto import messages as m


def test_write_txn_markers_round_trip() -> None:
    req = m.WriteTxnMarkersRequest(
        producer_id=2**40 + 7,
        producer_epoch=32766,
        coordinator_epoch=3,
        commit=True,
        partitions=((1, 0), (2**31, 5)),
        groups=("g", "grüppe"),
        txn_id="tx-1",
    )
    assert m.decode_request(m.request_frame(req, 9)) == req
    empty = m.WriteTxnMarkersRequest(txn_id="tx-2")
    assert m.decode_request(m.request_frame(empty)) == empty


def test_write_txn_markers_is_one_of_ours() -> None:
    assert m.ApiKey.WRITE_TXN_MARKERS == 19
    assert m.SUPPORTED_VERSIONS[m.ApiKey.WRITE_TXN_MARKERS] == (1, 1)
    assert m.RESPONSE_TYPES[m.ApiKey.WRITE_TXN_MARKERS] is m.WriteTxnMarkersResponse


def test_find_held_txns_round_trip() -> None:
    req = m.FindHeldTxnsRequest(((2**40 + 7, 1, 0), (5, 2**31, 49)))
    assert m.decode_request(m.request_frame(req, 3)) == req
    assert m.decode_request(m.request_frame(m.FindHeldTxnsRequest())) == m.FindHeldTxnsRequest()
    assert m.ApiKey.FIND_HELD_TXNS == 25
    assert m.SUPPORTED_VERSIONS[m.ApiKey.FIND_HELD_TXNS] == (1, 1)
    assert m.RESPONSE_TYPES[m.ApiKey.FIND_HELD_TXNS] is m.FindHeldTxnsResponse
