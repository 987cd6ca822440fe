import pytest

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import BufferConfig
from tests import buffer_contract as contract


@pytest.fixture
def buf():
    return make_buffer(BufferConfig(type="memory"))


@pytest.mark.parametrize("check", [contract.check_fifo_and_payload, contract.check_put_many_writes_in_order,
                                   contract.check_get_respects_max_and_timeout,
                                   contract.check_get_with_zero_timeout_does_not_wait,
                                   contract.check_blocking_get_wakes_on_put, contract.check_ack_once,
                                   contract.check_entry_ids_lists_unconsumed])
def test_memory_buffer_contract(buf, check):
    check(buf)


def test_memory_buffer_redelivers_unacked():
    shared = make_buffer(BufferConfig(type="memory"))
    contract.check_unacked_entries_are_redelivered_not_lost(lambda: shared)


def test_redis_buffer_without_url_is_a_clear_error():
    with pytest.raises(ValueError, match="redis_url"):
        make_buffer(BufferConfig(type="redis"))


def test_memory_buffer_dead_letters(buf):
    contract.check_bad_payloads_are_handed_out_and_dead_lettered(buf, buf.put_raw)
