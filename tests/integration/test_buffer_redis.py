import pytest

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config import BufferConfig
from tests import buffer_contract as contract

pytestmark = pytest.mark.integration


def _factory(url, consumer="learner-0"):
    return lambda: make_buffer(BufferConfig(type="redis", redis_url=url), consumer=consumer)


@pytest.mark.parametrize("check", [contract.check_fifo_and_payload, contract.check_get_respects_max_and_timeout,
                                   contract.check_blocking_get_wakes_on_put, contract.check_ack_once,
                                   contract.check_entry_ids_lists_unconsumed])
def test_redis_buffer_contract(clean_redis, check):
    check(_factory(clean_redis)())


def test_redis_buffer_redelivers_unacked_after_restart(clean_redis):
    contract.check_unacked_entries_are_redelivered_not_lost(_factory(clean_redis))


def test_group_created_after_data_still_sees_it(clean_redis):
    writer = make_buffer(BufferConfig(type="redis", redis_url=clean_redis, consumer_group="early"))
    writer.put(contract.group(0))
    reader = make_buffer(BufferConfig(type="redis", redis_url=clean_redis, consumer_group="late"))
    assert [e.group.group_id for e in reader.get(5, timeout_s=1)] == ["g0"]


def test_redis_buffer_dead_letters(clean_redis):
    import redis

    buf = _factory(clean_redis)()
    client = redis.Redis.from_url(clean_redis)

    def put_raw(payload):
        fields = {b"other": b"x"} if payload is None else {b"g": payload}
        return client.xadd(buf.stream, fields).decode()

    contract.check_bad_payloads_are_handed_out_and_dead_lettered(buf, put_raw)
