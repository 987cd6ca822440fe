import pytest

from asyncrl.core.buffer import make_buffer
from asyncrl.core.config.schema import BufferConfig
from tests import buffer_contract as contract

pytestmark = pytest.mark.integration


def _factory(url, consumer="learner-0"):
    return lambda: make_buffer(BufferConfig(type="redis", redis_url=url), consumer=consumer)


@pytest.mark.parametrize("check", [contract.check_fifo_and_payload, contract.check_put_many_writes_in_order,
                                   contract.check_get_respects_max_and_timeout,
                                   contract.check_get_with_zero_timeout_does_not_wait,
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


def test_a_redis_restart_on_its_append_only_file_loses_nothing_and_stops_nobody(tmp_path):
    """kill -9 redis-server mid-use, start it again on the same port and directory: the clients reconnect by
    themselves, a read blocked across the outage returns, a write issued during it lands, and every entry and
    the pending list are still there."""
    import threading
    import time

    from asyncrl.tools.processes import ProcessGroup
    from asyncrl.tools.redis_local import start_local_redis

    group = ProcessGroup(tmp_path / "logs")
    url = start_local_redis(group, tmp_path / "data")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        writer = make_buffer(BufferConfig(type="redis", redis_url=url, retry_s=20))
        reader = make_buffer(BufferConfig(type="redis", redis_url=url, retry_s=20))
        written = [writer.put(contract.group(i)) for i in range(3)]
        assert [e.entry_id for e in reader.get(2, timeout_s=1)] == written[:2]  # 2 pending, 1 undelivered
        [redis_child] = [c for c in group.children if c.name == "redis"]
        redis_child.proc.kill()
        redis_child.proc.wait()
        during: list[str] = []
        late_writer = threading.Thread(target=lambda: during.append(writer.put(contract.group(3))))
        late_writer.start()
        time.sleep(1.0)
        start_local_redis(group, tmp_path / "data", port=port)
        late_writer.join(30)
        assert during, "the write issued while Redis was down never landed"
        got = reader.get(10, timeout_s=2)
        assert [e.entry_id for e in got] == [written[2], during[0]]
        assert {e.entry_id for e in reader.all_pending()} == {*written, during[0]}
        assert reader.ack(written) == 3 and reader.pending() == 1
    finally:
        group.stop_all()


class ReplyEater:
    """A TCP relay in front of Redis that can lose one reply on the way back (`eat_next`): the command reaches
    Redis and is done there, its answer never comes, as over a link cut right after the request went out."""

    def __init__(self, url: str):
        import socket
        import threading

        host_port = url.split("//", 1)[1].split("/", 1)[0]
        self.target = (host_port.rsplit(":", 1)[0], int(host_port.rsplit(":", 1)[1]))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"redis://127.0.0.1:{self.listener.getsockname()[1]}/0"
        self.eat_next = threading.Event()
        self.eaten = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            client, _ = self.listener.accept()
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source, sink, replies: bool):
        try:
            while chunk := source.recv(1 << 16):
                if replies and self.eat_next.is_set():
                    self.eat_next.clear()
                    self.eaten += 1
                    continue
                sink.sendall(chunk)
        except OSError:
            pass


def test_a_read_whose_reply_was_lost_on_the_way_hands_out_its_entries_once(clean_redis):
    """Redis delivered three entries to a read whose reply never came: they are pending under the learner's
    consumer, and a read of new entries never returns them. The read times out, is retried, and hands them
    out from the pending list; nothing twice, nothing left behind."""
    writer = make_buffer(BufferConfig(type="redis", redis_url=clean_redis), consumer="writer")
    relay = ReplyEater(clean_redis)
    reader = make_buffer(BufferConfig(type="redis", redis_url=relay.url, socket_timeout_s=2.0, retry_s=10))
    held = [writer.put(contract.group(0))]
    assert [e.entry_id for e in reader.get(1, timeout_s=0)] == held  # in hand, not acknowledged yet
    written = [writer.put(contract.group(i)) for i in (1, 2, 3)]
    relay.eat_next.set()
    got = reader.get(8, timeout_s=0)
    assert relay.eaten == 1
    assert [e.entry_id for e in got] == written  # not the one in hand a second time
    assert reader.get(8, timeout_s=0) == []
    assert reader.ack(held + written) == 4 and reader.pending() == 0
