"""What a batched run keeps while its op pattern repeats (_pattern), in one process."""

from __future__ import annotations

import numpy as np
import pytest

from tensorxfer.resharding.copy_services import TaskMismatchError
from tensorxfer.resharding.copy_services.planning import matching
from tensorxfer.resharding.copy_services._shm_plan import FLAG_IN_SEND_BUFFER
from tensorxfer.resharding.copy_services._pattern import pattern_for
from tensorxfer.resharding.copy_services._queue import Columns


def columns(ids, ranks):
    return Columns(list(ids), [None] * len(ids), list(ranks), None)


def test_a_pattern_is_reused_only_for_the_same_ids_and_ranks_in_order():
    sends, recvs = columns([5, 6, 7], [1, 0, 2]), columns([8, 6], [2, 0])
    first = pattern_for(None, "B", 0, sends, recvs)
    assert pattern_for(first, "B", 0, columns([5, 6, 7], [1, 0, 2]), columns([8, 6], [2, 0])) is first
    for other_sends, other_recvs in [
        (columns([5, 6, 7], [1, 0, 1]), recvs),  # a rank
        (columns([5, 6, 9], [1, 0, 2]), recvs),  # a task id
        (columns([6, 5, 7], [0, 1, 2]), recvs),  # the order
        (sends, columns([8, 6, 9], [2, 0, 1])),  # one more receive
        (sends, columns([8, None], [2, 0])),  # an untagged op
    ]:
        assert pattern_for(first, "B", 0, other_sends, other_recvs) is not first


def test_same_rank_pairs_and_their_sizes_are_checked_every_run():
    pattern = pattern_for(None, "B", 1, columns([5, 6, 7], [1, 0, 1]), columns([7, 5], [1, 1]))
    assert pattern.match_error is None
    assert [rows.tolist() for rows in pattern.pairs] == [[2, 0], [0, 1]]  # receive order
    assert pattern.local_error(np.array([4, 9, 3]), np.array([3, 4])) is None
    error = pattern.local_error(np.array([4, 9, 3]), np.array([3, 5]))
    assert isinstance(error, TaskMismatchError)
    assert str(error) == "B: size mismatch for task_id=5 on rank 1: the local send has 4 bytes, the local recv 5 bytes"
    unpaired = pattern_for(None, "B", 1, columns([5], [1]), columns([6], [1]))
    assert str(unpaired.local_error(np.array([1]), np.array([1]))) == "B: missing local send for task_id=6 on rank 1"


def test_tables_cover_the_remote_ops_and_change_with_their_sizes():
    pattern = pattern_for(None, "B", 0, columns([5, 6, 7], [1, 0, 2]), columns([8, 6], [2, 0]))
    send_table, recv_table, digest = pattern.tables(np.array([10, 20, 30]), np.array([40, 20]))
    assert send_table[:, matching.KEY_A].tolist() == [5, 7]
    assert send_table[:, matching.DST].tolist() == [1, 2] and send_table[:, matching.NBYTES].tolist() == [10, 30]
    assert send_table[:, matching.LOCAL_INDEX].tolist() == [0, 1]  # positions among the remote ops
    assert recv_table[:, matching.KEY_A].tolist() == [8] and recv_table[:, matching.SRC].tolist() == [2]
    again = pattern.tables(np.array([10, 99, 30]), np.array([40, 77]))  # only same-rank sizes changed
    assert again[2] == digest
    changed = pattern.tables(np.array([10, 20, 31]), np.array([40, 20]))
    assert changed[2] != digest and changed[0][:, matching.NBYTES].tolist() == [10, 31]
    tensors = ["a", "b", "c"]
    spans = pattern.sends.remote_part(tensors, _tensors_spans(3))
    assert spans[0] == ["a", "c"] and spans[1].nbytes.tolist() == [0, 2]


def _tensors_spans(count):
    from tensorxfer.resharding.copy_services._tensors import Spans

    return Spans(np.arange(count, dtype=np.uint64), np.arange(count, dtype=np.int64), np.ones(count, bool),
                 np.ones(count, bool))


@pytest.mark.parametrize("ids", [[1, None, 2], [None, None]])
def test_untagged_remote_ops_get_keys_by_pair_and_order(ids):
    pattern = pattern_for(None, "B", 0, columns(ids, [1] * len(ids)), columns([], []))
    table = pattern.tables(np.ones(len(ids), np.int64), np.zeros(0, np.int64))[0]
    anonymous = table[table[:, matching.ANON] == 1]
    assert anonymous[:, matching.KEY_B].tolist() == list(range(ids.count(None)))


def test_send_flags_are_part_of_the_tables_every_run():
    """The shm backend flags sends whose source lies in its send buffer: where a tensor
    lies can change between runs of one pattern, and the digest must follow."""
    pattern = pattern_for(None, "B", 0, columns([5, 6], [1, 1]), columns([], []))
    nbytes, none = np.array([8, 8]), np.zeros(0, np.int64)
    plain = pattern.tables(nbytes, none)
    assert pattern.tables(nbytes, none, np.zeros(2, np.int64))[2] == plain[2]  # no flags = zero flags
    flagged = pattern.tables(nbytes, none, np.array([0, FLAG_IN_SEND_BUFFER]))
    assert flagged[2] != plain[2] and flagged[0][:, matching.FLAGS].tolist() == [0, 1]
    assert pattern.tables(nbytes, none)[2] == plain[2]  # and back
